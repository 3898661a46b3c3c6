"""`report --png DIR`: the report's figures drawn by matplotlib (Agg), one PNG per op, with the
same data, ticks, colours and legend as the page's SVG (chart.py)."""

from collbench.report.chart import panel_ranges, size_ticks, y_ticks, _log_range

_MARKERS = {"circle": "o", "square": "s", "triangle": "^", "diamond": "D"}


def figure_png(fig, dpi=110):
    """One chart.Figure drawn as a PNG: its bytes (the caller writes them, with the report's other
    files, as one set: atomic_file.FileSet)."""
    import io
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FixedFormatter, NullLocator

    n = len(fig.panels)
    ncol = 3 if n > 1 else 2
    rows = max(1, (len(fig.legend) + ncol - 1) // ncol)
    mfig = Figure(figsize=(max(5.6 * n, 9.0), 3.9 + 0.25 * rows), dpi=dpi)
    FigureCanvasAgg(mfig)
    axes = mfig.subplots(1, n, squeeze=False)[0]
    for ax, panel in zip(axes, fig.panels):
        ax.set_title(panel.title, fontsize=11, fontweight="bold")
        ax.set_xlabel(panel.x_label, fontsize=9)
        ax.set_ylabel(panel.y_label, fontsize=9)
        if panel.bars is not None:
            _bars(ax, panel, FixedLocator, FixedFormatter, NullLocator)
            continue
        ranges = panel_ranges(panel)
        if ranges is None:
            ax.text(0.5, 0.5, panel.note or "no data", ha="center", va="center", transform=ax.transAxes,
                    color="#666")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        (xlo, xhi), (ylo, yhi) = ranges
        ax.set_xscale("log")
        ax.set_yscale("log")
        for ln in panel.lines:
            if ln.band:
                ax.fill_between([b[0] for b in ln.band], [b[1] for b in ln.band], [b[2] for b in ln.band],
                                color=ln.color, alpha=0.14, linewidth=0)
        for ln in panel.lines:
            xs, ys = [p[0] for p in ln.points], [p[1] for p in ln.points]
            ax.plot(xs, ys, color=ln.color, linewidth=1.6, linestyle="--" if ln.dashed else "-",
                    marker=None if ln.dashed else _MARKERS.get(ln.marker, "o"), markersize=4)
        for y, label, color in panel.hlines:
            ax.axhline(y, color=color, linestyle="--", linewidth=1.2)
            ax.text(0.98, y, label, color=color, ha="right", va="bottom", fontsize=8,
                    transform=ax.get_yaxis_transform())
        ax.set_xlim(xlo, xhi)
        ax.set_ylim(ylo, yhi)
        xt = size_ticks(xlo, xhi)
        yt = y_ticks(panel.y_kind, ylo, yhi)
        ax.xaxis.set_major_locator(FixedLocator([v for v, _ in xt]))
        ax.xaxis.set_major_formatter(FixedFormatter([t for _, t in xt]))
        ax.yaxis.set_major_locator(FixedLocator([v for v, _ in yt]))
        ax.yaxis.set_major_formatter(FixedFormatter([t for _, t in yt]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_locator(NullLocator())
        ax.tick_params(labelsize=8)
        ax.grid(True, color="#e5e5e5")
    handles = []
    for label, color, marker, dashed in fig.legend:
        from matplotlib.lines import Line2D
        handles.append(Line2D([], [], color=color, linestyle="--" if dashed else "-",
                              marker=_MARKERS.get(marker) if marker else None, markersize=4, label=label))
    if handles:
        mfig.legend(handles=handles, loc="lower center", ncol=min(ncol, len(handles)), fontsize=8, frameon=False)
    mfig.suptitle(fig.title, fontsize=12, fontweight="bold")
    legend_h = (0.25 * rows + 0.1) / (3.9 + 0.25 * rows) if handles else 0
    mfig.tight_layout(rect=(0, legend_h, 1, 0.97))
    buf = io.BytesIO()
    mfig.savefig(buf, format="png")
    return buf.getvalue()


def _bars(ax, panel, FixedLocator, FixedFormatter, NullLocator):
    rng = _log_range([v for b in panel.bars for v in (b[1], b[2], b[3]) if v])
    if rng is None:
        return
    ax.set_yscale("log")
    xs = list(range(len(panel.bars)))
    for x, (label, value, lo, hi, color, _) in zip(xs, panel.bars):
        ax.bar(x, value, color=color, alpha=0.85, width=0.6)
        if lo and hi:
            ax.errorbar([x], [value], yerr=[[max(0.0, value - lo)], [max(0.0, hi - value)]], color="#333", capsize=5)
    ax.set_ylim(*rng)
    ax.set_xticks(xs)
    ax.set_xticklabels([b[0] for b in panel.bars], fontsize=8)
    yt = y_ticks(panel.y_kind, *rng)
    ax.yaxis.set_major_locator(FixedLocator([v for v, _ in yt]))
    ax.yaxis.set_major_formatter(FixedFormatter([t for _, t in yt]))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.grid(True, axis="y", color="#e5e5e5")
