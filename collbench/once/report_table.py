"""The console table `collbench once` prints: one table per op, one row per size.

Latencies carry their unit (us below 1 ms, ms below 1 s, then s), sizes their binary unit
(B / KB / MB), bandwidth is GB/s (10^9 bytes/s, as nccl-tests); "slowest" is the straggler,
the rank whose mean time was the max (unknown, "-", with OSU). A failed step is a FAILED row
with its error; a planned step that produced no record at all is NOT RUN.
"""

from collbench.ops import get_op
from collbench.sizes import format_size

COLUMNS = ("size", "avg", "min", "max", "slowest", "algbw GB/s", "busbw GB/s", "valid", "verdict")
RIGHT = {"avg", "min", "max", "slowest", "algbw GB/s", "busbw GB/s", "size"}


def format_latency(us):
    """12.34 us / 5.87 ms / 1.20 s: the unit is chosen per value."""
    if us is None:
        return "-"
    if us < 1000:
        return f"{us:.2f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"


def format_gbps(bytes_per_s):
    if bytes_per_s is None:
        return "-"
    gb = bytes_per_s / 1e9
    return f"{gb:.2f}" if gb >= 0.1 else f"{gb:.4f}"


def size_text(op, size_bytes):
    return format_size(size_bytes) if op.has_size and size_bytes else "-"


def _row(rec):
    op = get_op(rec["op"])
    size = size_text(op, rec.get("size_bytes"))
    if rec.get("type") == "failure":
        return [size, f"FAILED: {rec.get('error') or 'unknown error'}"]
    return [size, format_latency(rec.get("latency_avg_us")), format_latency(rec.get("latency_min_us")),
            format_latency(rec.get("latency_max_us")),
            "-" if rec.get("straggler_rank") is None else f"rank {rec['straggler_rank']}",
            format_gbps(rec.get("algbw_bytes_per_s")),
            format_gbps(rec.get("busbw_bytes_per_s")), rec.get("validation") or "off",
            rec.get("verdict") or "-"]


def _render(title, rows):
    """Aligned text; a row shorter than the header (FAILED, NOT RUN) spans the remaining columns."""
    widths = [len(c) for c in COLUMNS]
    for r in rows:
        if len(r) == len(COLUMNS):
            widths = [max(w, len(v)) for w, v in zip(widths, r)]
    widths[0] = max([widths[0]] + [len(r[0]) for r in rows])

    def fmt(cells):
        if len(cells) < len(COLUMNS):
            return "  " + "  ".join([cells[0].rjust(widths[0])] + cells[1:])
        out = [v.rjust(w) if name in RIGHT else v.ljust(w) for name, w, v in zip(COLUMNS, widths, cells)]
        return "  " + "  ".join(out).rstrip()

    lines = [title, fmt(list(COLUMNS)), "  " + "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows]
    return "\n".join(lines)


def render_tables(records, steps=(), ranks=None, nodes=None):
    """One table per op, ops in plan order, sizes ascending. steps: the plan, to show NOT RUN rows."""
    by_op = {s.op: [] for s in steps}          # op -> [(size_bytes, record)]
    for rec in records:
        if rec.get("type") in ("result", "failure") and rec.get("op"):
            by_op.setdefault(get_op(rec["op"]).name, []).append((rec.get("size_bytes") or 0, rec))
    tables = []
    for op_name, recs in by_op.items():
        op = get_op(op_name)
        rows = [(size, _row(rec)) for size, rec in recs]
        measured = {size for size, _ in recs}
        rows += [(s.size_bytes, [size_text(op, s.size_bytes), "NOT RUN (the job ended before this step)"])
                 for s in steps if s.op == op_name and s.size_bytes not in measured]
        rows.sort(key=lambda r: r[0])
        datatypes = sorted({rec.get("datatype") for _, rec in recs if rec.get("datatype")}
                           | {s.datatype for s in steps if s.op == op_name})
        where = f", {ranks} ranks" if ranks else ""
        where += f" on {nodes} node{'s' if nodes != 1 else ''}" if nodes else ""
        title = f"{op.title} ({'/'.join(datatypes) or '-'}{where})"
        tables.append(_render(title, [r for _, r in rows]))
    return "\n\n".join(tables)


def render_other_failures(records):
    """Failures not tied to one op (a job that died before its first step): one line each."""
    lines = [f"FAILED: {r.get('error')}" for r in records
             if r.get("type") == "failure" and not r.get("op")]
    return "\n".join(lines)
