"""`report --markdown FILE`: the results as the all-gather microbenchmark guide's "Expected
Results" table (one row per series, op and size), ready to paste into a README or a runbook.

That guide's columns are kept where MPI has the same thing: Topology (here nodes x ranks per
node), Number of Elements (per rank, of the datatype), Achieved Bandwidth (busbw, GB/s) and
Transferred Data (GB, the bytes S that define algbw, as the TSV's data_GB). Its Input/Output
Shape columns are XLA array shapes with no MPI counterpart; the datatype, size and latency
are given instead, and % of peak when a peak is known.
"""

from collbench.ops import DATATYPES, get_op
from collbench.sizes import format_size
from collbench.tables import Column, markdown_lines


def topology(attrs):
    nodes, ranks = attrs.get("nodes") or 1, attrs.get("ranks")
    if ranks is None:
        return f"{nodes} node(s)"
    return f"{nodes}x{ranks // nodes}" if ranks % nodes == 0 else f"{ranks} ranks on {nodes} nodes"


def render_markdown(data, peak, title=None):
    multi = len(data.series) > 1
    headers = (["Series"] if multi else []) + [
        "Topology", "Op", "Size", "Number of Elements", "Datatype", "Achieved Bandwidth (GB/s)",
        "Transferred Data (GB)", "Latency (µs)"] + (["% of Peak"] if peak.bytes_per_s else [])
    rows = []
    for op_name in data.ops():
        op = get_op(op_name)
        for s, dt, pts in data.lines(op_name):
            for p in pts:
                ranks = s.attrs.get("ranks") or 1
                elements = p.size_bytes // DATATYPES.get(dt, 1) if op.has_size and p.size_bytes else "-"
                data_gb = f"{op.data_bytes(p.size_bytes, ranks) / 1e9:.9g}" if op.has_size else "-"
                row = ([f"#{s.index + 1} {s.label}"] if multi else []) + [
                    topology(s.attrs), op.name, format_size(p.size_bytes) if op.has_size else "-", elements,
                    dt or "-", f"{p.busbw / 1e9:.7g}" if p.busbw else "-", data_gb,
                    f"{p.latency_avg_us:.7g}"]
                if peak.bytes_per_s:
                    row.append(f"{p.pct_of_peak:.1f}" if p.pct_of_peak is not None else "-")
                rows.append(row)
    lines = []
    if title:
        lines += [f"## {title}", ""]
    lines += markdown_lines([Column(i, h, align="left") for i, h in enumerate(headers)],
                            [dict(enumerate(r)) for r in rows])
    lines.append("")
    lines.append(f"Achieved Bandwidth is the bus bandwidth (busbw), the median of each point's measurements; "
                 f"Latency is the average over ranks, in µs. Peak: {peak.text}.")
    return "\n".join(lines) + "\n"
