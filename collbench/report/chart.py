"""Plots as data, and their SVG: one Figure per op holds its panels (latency vs size, busbw vs
size, log-log) and a legend. The same Figure is drawn by matplotlib for `--png`
(chart_png.py), so the PNG and the page show the same thing.

The SVG is written by hand rather than by matplotlib's SVG backend: ~100x faster (a report of
a 100,000-record log builds in about a second), a few KB per plot, ids unique per page, no
URL of any kind in the output (not even XML namespace URIs: inline SVG in HTML needs none),
and a hover tooltip (<title>) on every point, with no script.
"""

import html
import math
from dataclasses import dataclass, field

from collbench import tables
from collbench.sizes import format_size

FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif"


@dataclass
class Line:
    label: str
    color: str
    marker: str                  # circle, square, triangle, diamond
    points: list                 # [(x, y, tooltip)]
    band: list = None            # [(x, low, high)]: a shaded range (per-rank min..max)
    dashed: bool = False
    legend: bool = True


@dataclass
class Panel:
    title: str
    x_label: str
    y_label: str
    x_kind: str                  # "bytes" (log2 ticks, size labels) or "category"
    y_kind: str                  # "us" (latency) or "gbps"
    lines: list = field(default_factory=list)
    hlines: list = field(default_factory=list)   # [(y, label, color)]
    bars: list = None            # category panels: [(label, value, low, high, color, tooltip)]
    note: str = ""               # shown when there is nothing to plot


@dataclass
class Figure:
    ident: str                   # unique on the page (ids inside the SVG derive from it)
    title: str
    panels: list
    legend: list                 # [(label, color, marker, dashed)]


# ------------------------------------------------------------------ ticks

def _log_range(values, pad_decades=0.08):
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    if hi / lo < 1.5:          # one value (or nearly): show a factor ~3 around it
        lo, hi = lo / 1.8, hi * 1.8
    span = math.log10(hi / lo)
    f = 10 ** (span * pad_decades)
    return lo / f, hi * f


def size_ticks(lo, hi, max_ticks=8):
    """Powers of two inside [lo, hi], every k-th so there are at most max_ticks; (value, label)."""
    a, b = math.ceil(math.log2(lo) - 1e-9), math.floor(math.log2(hi) + 1e-9)
    exps = list(range(max(a, 0), b + 1)) or [max(0, round(math.log2(math.sqrt(lo * hi))))]
    step = 1
    while len(exps[::step]) > max_ticks:
        step += 1
    if step > 1:   # align to multiples of the step so 1KB/1MB land on ticks when possible
        start = next((e for e in exps if e % step == 0), exps[0])
        exps = [e for e in exps if e >= start][::step]
    return [(2 ** e, format_size(2 ** e)) for e in exps]


def _decade_ticks(lo, hi, max_ticks=8):
    """1-2-5 ticks when the range is narrow, decades (every k-th) when it is wide."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mults in ((1, 2, 5), (1, 3), (1,)):
        vals = [m * 10 ** e for e in range(a, b + 1) for m in mults if lo <= m * 10 ** e <= hi]
        if 2 <= len(vals) <= max_ticks:
            return vals
    vals = [10 ** e for e in range(a, b + 1) if lo <= 10 ** e <= hi]
    step = 1
    while len(vals[::step]) > max_ticks:
        step += 1
    return vals[::step] or [10 ** round(math.log10(math.sqrt(lo * hi)))]


def format_us(us):
    """1 µs, 250 µs, 1.5 ms, 2 s: a latency tick or value with its unit (collbench.tables)."""
    return tables.format_us(us, significant=3, micro="µs")


def format_gbps(gbps):
    """A bandwidth tick, given in GB/s."""
    return tables.format_gb_per_s(gbps * 1e9, significant=3)


def y_ticks(kind, lo, hi):
    vals = _decade_ticks(lo, hi)
    fmt = format_us if kind == "us" else format_gbps
    return [(v, fmt(v)) for v in vals]


# ------------------------------------------------------------------ SVG

PANEL_W, PANEL_H = 540, 330
MARGIN = {"left": 72, "right": 16, "top": 34, "bottom": 48}
GAP = 24
LEGEND_ROW = 20


def _esc(text):
    # also defuse "//": no text taken from records can read as a URL in the file
    return html.escape(str(text), quote=True).replace("//", "&#47;&#47;")


def _marker(kind, x, y, color, tooltip=None):
    """A whole marker element, with a hover tooltip when given."""
    tag = {"square": "rect", "triangle": "polygon", "diamond": "polygon"}.get(kind, "circle")
    inner = f"<title>{_esc(tooltip)}</title>" if tooltip else ""
    return _marker_svg(kind, x, y, color) + f">{inner}</{tag}>"


def _marker_svg(kind, x, y, color, r=3.6):
    if kind == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" fill="{color}"'
    if kind == "triangle":
        pts = f"{x:.1f},{y - r * 1.2:.1f} {x - r * 1.1:.1f},{y + r * 0.9:.1f} {x + r * 1.1:.1f},{y + r * 0.9:.1f}"
        return f'<polygon points="{pts}" fill="{color}"'
    if kind == "diamond":
        r *= 1.25
        pts = f"{x:.1f},{y - r:.1f} {x + r:.1f},{y:.1f} {x:.1f},{y + r:.1f} {x - r:.1f},{y:.1f}"
        return f'<polygon points="{pts}" fill="{color}"'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{color}"'


class _Scale:
    def __init__(self, lo, hi, a, b):
        self.l0, self.l1, self.a, self.b = math.log10(lo), math.log10(hi), a, b

    def __call__(self, v):
        return self.a + (math.log10(v) - self.l0) / (self.l1 - self.l0) * (self.b - self.a)


def panel_ranges(panel):
    """((x_lo, x_hi), (y_lo, y_hi)) in data units for a log-log panel, or None when empty."""
    xs = [x for ln in panel.lines for x, _, _ in ln.points]
    ys = [y for ln in panel.lines for _, y, _ in ln.points]
    for ln in panel.lines:
        for _, lo, hi in ln.band or ():
            ys += [lo, hi]
    ys += [y for y, _, _ in panel.hlines]
    xr, yr = _log_range(xs, 0.04), _log_range(ys)
    if xr is None or yr is None:
        return None
    return xr, yr


def _panel_svg(panel, ox, oy, uid):
    out = []
    x0, x1 = ox + MARGIN["left"], ox + PANEL_W - MARGIN["right"]
    y0, y1 = oy + PANEL_H - MARGIN["bottom"], oy + MARGIN["top"]
    out.append(f'<text x="{(x0 + x1) / 2:.0f}" y="{oy + 20}" text-anchor="middle" font-size="14" '
               f'font-weight="600">{_esc(panel.title)}</text>')
    out.append(f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="#fff" stroke="#999"/>')
    out.append(f'<text x="{(x0 + x1) / 2:.0f}" y="{y0 + 38}" text-anchor="middle" font-size="12">'
               f'{_esc(panel.x_label)}</text>')
    out.append(f'<text transform="translate({ox + 16},{(y0 + y1) / 2:.0f}) rotate(-90)" text-anchor="middle" '
               f'font-size="12">{_esc(panel.y_label)}</text>')
    if panel.bars is not None:
        out.append(_bars_svg(panel, x0, x1, y0, y1))
        return "".join(out)
    ranges = panel_ranges(panel)
    if ranges is None:
        out.append(f'<text x="{(x0 + x1) / 2:.0f}" y="{(y0 + y1) / 2:.0f}" text-anchor="middle" font-size="13" '
                   f'fill="#666">{_esc(panel.note or "no data")}</text>')
        return "".join(out)
    (xlo, xhi), (ylo, yhi) = ranges
    sx, sy = _Scale(xlo, xhi, x0, x1), _Scale(ylo, yhi, y0, y1)
    for v, label in size_ticks(xlo, xhi):
        x = sx(v)
        out.append(f'<line x1="{x:.1f}" y1="{y1}" x2="{x:.1f}" y2="{y0}" stroke="#e5e5e5"/>'
                   f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 5}" stroke="#666"/>'
                   f'<text x="{x:.1f}" y="{y0 + 18}" text-anchor="middle" font-size="11">{_esc(label)}</text>')
    for v, label in y_ticks(panel.y_kind, ylo, yhi):
        y = sy(v)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                   f'<line x1="{x0 - 5}" y1="{y:.1f}" x2="{x0}" y2="{y:.1f}" stroke="#666"/>'
                   f'<text x="{x0 - 8}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{_esc(label)}</text>')
    clip = f"{uid}-clip"
    out.append(f'<clipPath id="{clip}"><rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}"/></clipPath>')
    out.append(f'<g clip-path="url(#{clip})">')
    for y, label, color in panel.hlines:
        yy = sy(y)
        out.append(f'<line x1="{x0}" y1="{yy:.1f}" x2="{x1}" y2="{yy:.1f}" stroke="{color}" stroke-width="1.5" '
                   f'stroke-dasharray="6 4"/><text x="{x1 - 6}" y="{yy - 5:.1f}" text-anchor="end" '
                   f'font-size="11" fill="{color}">{_esc(label)}</text>')
    for ln in panel.lines:
        if ln.band:
            upper = [(sx(x), sy(hi)) for x, _, hi in ln.band]
            lower = [(sx(x), sy(lo)) for x, lo, _ in reversed(ln.band)]
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in upper + lower)
            out.append(f'<polygon points="{pts}" fill="{ln.color}" fill-opacity="0.14" stroke="none"/>')
    for ln in panel.lines:
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in ln.points)
        dash = ' stroke-dasharray="5 3"' if ln.dashed else ""
        out.append(f'<polyline points="{pts}" fill="none" stroke="{ln.color}" stroke-width="1.8"{dash}/>')
        if not ln.dashed:
            out.extend(_marker(ln.marker, sx(x), sy(y), ln.color, tip) for x, y, tip in ln.points)
    out.append("</g>")
    return "".join(out)


def _bars_svg(panel, x0, x1, y0, y1):
    """Category panel (barrier: one latency per series): a bar per series, whiskers min..max."""
    out = []
    values = [v for b in panel.bars for v in (b[1], b[2], b[3]) if v]
    rng = _log_range(values)
    if rng is None:
        return f'<text x="{(x0 + x1) / 2:.0f}" y="{(y0 + y1) / 2:.0f}" text-anchor="middle">no data</text>'
    ylo, yhi = rng
    sy = _Scale(ylo, yhi, y0, y1)
    for v, label in y_ticks(panel.y_kind, ylo, yhi):
        y = sy(v)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                   f'<text x="{x0 - 8}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{_esc(label)}</text>')
    n = len(panel.bars)
    slot = (x1 - x0) / n
    width = min(48, slot * 0.6)
    for i, (label, value, lo, hi, color, tip) in enumerate(panel.bars):
        cx = x0 + slot * (i + 0.5)
        top = sy(value)
        out.append(f'<rect x="{cx - width / 2:.1f}" y="{top:.1f}" width="{width:.1f}" height="{y0 - top:.1f}" '
                   f'fill="{color}" fill-opacity="0.85"><title>{_esc(tip)}</title></rect>')
        if lo and hi:
            out.append(f'<line x1="{cx:.1f}" y1="{sy(lo):.1f}" x2="{cx:.1f}" y2="{sy(hi):.1f}" stroke="#333"/>'
                       f'<line x1="{cx - 6:.1f}" y1="{sy(hi):.1f}" x2="{cx + 6:.1f}" y2="{sy(hi):.1f}" stroke="#333"/>'
                       f'<line x1="{cx - 6:.1f}" y1="{sy(lo):.1f}" x2="{cx + 6:.1f}" y2="{sy(lo):.1f}" stroke="#333"/>')
        out.append(f'<text x="{cx:.1f}" y="{y0 + 16}" text-anchor="middle" font-size="11">{_esc(label)}</text>')
    return "".join(out)


def _legend_rows(legend, width):
    """Wrap legend entries into rows that fit width: [[(x, entry)]]."""
    rows, row, x = [], [], 0
    for entry in legend:
        w = 34 + 7.2 * len(entry[0])
        if row and x + w > width:
            rows.append(row)
            row, x = [], 0
        row.append((x, entry))
        x += w + 14
    if row:
        rows.append(row)
    return rows


def figure_svg(fig):
    """The figure as one inline <svg> element (no XML prolog, no namespace URIs)."""
    width = len(fig.panels) * PANEL_W + (len(fig.panels) - 1) * GAP
    rows = _legend_rows(fig.legend, width - 40)
    height = PANEL_H + 10 + LEGEND_ROW * len(rows) + 6
    out = [f'<svg class="plot" id="{fig.ident}" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img" style="{FONT};max-width:{width}px" font-size="12">',
           f'<title>{_esc(fig.title)}</title>',
           f'<rect width="{width}" height="{height}" fill="#fff"/>']
    for i, panel in enumerate(fig.panels):
        out.append(_panel_svg(panel, i * (PANEL_W + GAP), 0, f"{fig.ident}-p{i}"))
    y = PANEL_H + 14
    for row in rows:
        for x, (label, color, marker, dashed) in row:
            lx = 20 + x
            dash = ' stroke-dasharray="5 3"' if dashed else ""
            out.append(f'<line x1="{lx:.1f}" y1="{y:.1f}" x2="{lx + 24:.1f}" y2="{y:.1f}" stroke="{color}" '
                       f'stroke-width="2"{dash}/>')
            if marker:
                out.append(_marker(marker, lx + 12, y, color))
            out.append(f'<text x="{lx + 30:.1f}" y="{y + 4:.1f}" font-size="12">{_esc(label)}</text>')
        y += LEGEND_ROW
    out.append("</svg>")
    return "".join(out)
