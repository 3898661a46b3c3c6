"""The heat-map picture of a matrix (PNG or SVG), written atomically.

Colours run the same way for both metrics: light = fast (low latency, high bandwidth), dark =
slow, on a log scale when the values span more than 20x (a rack structure stays readable next
to a slow link). The diagonal is grey. Outliers, when given, are marked: a red square around
each slow link, slow hosts' names in red.
"""

import io
import os

from collbench.atomic_file import write_atomic
from collbench.errors import UserError

FORMATS = ("png", "svg")
MAX_TICK_LABELS = 64


def picture_format(path, fmt=None):
    fmt = (fmt or os.path.splitext(path)[1].lstrip(".")).lower()
    if fmt not in FORMATS:
        raise UserError(f"{path}: picture format {fmt or '(none)'!r}, expected .png or .svg")
    return fmt


def render(matrix, fmt="png", title=None, outliers=None):
    """The picture as bytes (PNG) or str (SVG)."""
    import matplotlib
    matplotlib.use("Agg", force=True)        # no display: files only
    from matplotlib import colors
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    p = matrix.size
    nan = float("nan")
    data = [[nan if v is None else v for v in row] for row in matrix.values]
    finite = [v for row in matrix.values for v in row if v is not None]
    lo, hi = min(finite), max(finite)
    norm = colors.LogNorm(vmin=lo, vmax=hi) if hi / lo > 20 else colors.Normalize(vmin=lo, vmax=hi)
    cmap = matplotlib.colormaps["viridis" if matrix.metric.higher_is_better else "viridis_r"]
    cmap = cmap.with_extremes(bad="#bbbbbb")

    side = min(16.0, max(5.0, 3.0 + p * 0.18))
    fig = Figure(figsize=(side + 1.5, side))
    ax = fig.add_subplot(1, 1, 1)
    img = ax.imshow(data, cmap=cmap, norm=norm, interpolation="nearest")
    bar = fig.colorbar(img, ax=ax, fraction=0.046, pad=0.04)
    bar.set_label(f"{matrix.metric.name} ({matrix.metric.unit})")
    slow_hosts = set()
    if outliers is not None:
        slow_hosts = {h.host for h in outliers.hosts}
        index = {lb: i for i, lb in enumerate(matrix.labels)}
        for lk in outliers.links:
            i, j = index.get(lk.a), index.get(lk.b)
            if i is None or j is None:
                continue
            for r, c in ((i, j), (j, i)):
                ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
    if p <= MAX_TICK_LABELS:
        ax.set_xticks(range(p))
        ax.set_yticks(range(p))
        fs = 8 if p <= 24 else 6 if p <= 48 else 5
        ax.set_xticklabels(matrix.labels, rotation=90, fontsize=fs)
        ax.set_yticklabels(matrix.labels, fontsize=fs)
        for lab in list(ax.get_xticklabels()) + list(ax.get_yticklabels()):
            if lab.get_text() in slow_hosts:
                lab.set_color("red")
                lab.set_fontweight("bold")
    else:
        ax.set_xlabel("rank (to)")
        ax.set_ylabel("rank (from)")
    ax.set_title(title or f"{matrix.metric.name} between {p} ranks ({os.path.basename(matrix.source)})",
                 fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=100)
    out = buf.getvalue()
    return out.decode("utf-8") if fmt == "svg" else out


def write_heatmap(matrix, path, fmt=None, title=None, outliers=None):
    """Write the picture to path (format from the extension, or fmt); the absolute path."""
    fmt = picture_format(path, fmt)
    content = render(matrix, fmt, title, outliers)
    try:
        return write_atomic(path, [content])
    except OSError as e:
        raise UserError(f"{path}: cannot write the heat map: {e.strerror}") from None
