"""The report's figures (chart.Figure), one per op, from the aggregated points: latency vs size
with the per-rank spread as a band (and p99 dashed when sweep measured it), busbw vs size with
the point-to-point peak as a line; barrier (no size, no bandwidth) as one bar per series."""

from collbench.ops import get_op
from collbench.report.chart import Figure, Line, Panel, format_us
from collbench.sizes import format_size

PEAK_COLOR = "#444"


def point_tooltip(line_label, p):
    size = format_size(p.size_bytes) if p.size_bytes else "-"
    parts = [line_label, f"{p.op} {size}" + (f" ({p.datatype})" if p.datatype else "") + f" · n={p.n}",
             f"avg {format_us(p.latency_avg_us)}"]
    if p.latency_min_us is not None and p.latency_max_us is not None:
        parts[-1] += f" (ranks {format_us(p.latency_min_us)} – {format_us(p.latency_max_us)})"
    if p.p99_us is not None:
        parts.append(f"p50 {format_us(p.p50_us or p.latency_avg_us)} · p99 {format_us(p.p99_us)}")
    if p.busbw:
        bw = f"busbw {p.busbw / 1e9:.3g} GB/s"
        if p.pct_of_peak is not None:
            bw += f" ({p.pct_of_peak:.0f}% of peak)"
        parts.append(bw)
    if p.stragglers:
        rank, times = p.stragglers[0]
        parts.append(f"slowest rank {rank} ({times} of {p.n})")
    return "\n".join(parts)


def line_labels(lines):
    """Legend label per (series, datatype): the datatype only when an op has several per series."""
    per_series = {}
    for s, dt, _ in lines:
        per_series.setdefault(s.index, set()).add(dt)
    return [f"#{s.index + 1} {s.label}" + (f" · {dt}" if len(per_series[s.index]) > 1 and dt else "")
            for s, dt, _ in lines]


def op_figure(data, op_name, peak_bps, ident):
    op = get_op(op_name)
    lines = data.lines(op_name)
    labels = line_labels(lines)
    legend = [(label, s.color, s.marker, False) for (s, _, _), label in zip(lines, labels)]
    title = f"{op.title}"
    if not op.has_size:
        bars = []
        for (s, dt, pts), label in zip(lines, labels):
            p = pts[0]
            bars.append((f"#{s.index + 1}", p.latency_avg_us, p.latency_min_us, p.latency_max_us, s.color,
                         point_tooltip(label, p)))
        panel = Panel(title="Latency per series",
                      x_label="series (bar: average over ranks; whiskers: fastest – slowest rank)",
                      y_label="latency", x_kind="category", y_kind="us",
                      bars=bars, note="no results")
        legend = [(label, s.color, None, False) for (s, _, _), label in zip(lines, labels)]
        return Figure(ident=ident, title=title, panels=[panel], legend=legend)

    lat = Panel(title="Latency vs size", x_label="message size (bytes per rank)",
                y_label="latency (average over ranks)", x_kind="bytes", y_kind="us", note="no results")
    bw = Panel(title="Bus bandwidth vs size", x_label="message size (bytes per rank)", y_label="busbw (GB/s)",
               x_kind="bytes", y_kind="gbps", note="no results")
    any_p99 = any_band = False
    for (s, dt, pts), label in zip(lines, labels):
        pts = [p for p in pts if p.size_bytes > 0]
        if not pts:
            continue
        band = [(p.size_bytes, p.latency_min_us, p.latency_max_us) for p in pts
                if p.latency_min_us and p.latency_max_us and p.latency_max_us > p.latency_min_us]
        any_band = any_band or bool(band)
        lat.lines.append(Line(label, s.color, s.marker,
                              [(p.size_bytes, p.latency_avg_us, point_tooltip(label, p)) for p in pts],
                              band=band if len(band) == len(pts) else None))
        p99 = [(p.size_bytes, p.p99_us, "") for p in pts if p.p99_us]
        if p99:
            any_p99 = True
            lat.lines.append(Line(label + " p99", s.color, s.marker, p99, dashed=True, legend=False))
        bws = [(p.size_bytes, p.busbw / 1e9, point_tooltip(label, p)) for p in pts if p.busbw]
        if bws:
            bw.lines.append(Line(label, s.color, s.marker, bws))
    if peak_bps:
        bw.hlines.append((peak_bps / 1e9, f"point-to-point peak {peak_bps / 1e9:.3g} GB/s", PEAK_COLOR))
    if any_band:
        legend.append(("shaded: fastest – slowest rank", "#bbb", None, False))
    if any_p99:
        legend.append(("dashed: p99 latency", "#666", None, True))
    return Figure(ident=ident, title=title, panels=[lat, bw], legend=legend)


def all_figures(data, peak_bps):
    """[(op name, Figure)] in op-table order."""
    return [(op, op_figure(data, op, peak_bps, f"fig-{op}")) for op in data.ops()
            if data.lines(op)]
