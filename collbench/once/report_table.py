"""The console table `collbench once` prints: one table per op, one row per size.

Latencies carry their unit (us below 1 ms, ms below 1 s, then s), sizes their binary unit
(B / KB / MB), bandwidth is GB/s (10^9 bytes/s, as nccl-tests); "slowest" is the rank whose
mean time per call was the max (`straggler_rank`; unknown, "-", with OSU): the rank that waited
longest inside the calls, often for a late peer rather than the cause (the rank the others waited
for is `offcpu_rank`, docs/DIAGNOSIS.md). A failed step is a FAILED row
with its error; a planned step that produced no record at all is NOT RUN.
"""

from collbench.congestion import attribution
from collbench.ops import get_op
from collbench.sizes import format_size
from collbench.tables import Column, Span, format_gb_per_s, format_us, table_lines

COLUMNS = (Column("size"), Column("avg", fmt=format_us), Column("min", fmt=format_us),
           Column("max", fmt=format_us), Column("slowest"), Column("algbw", "algbw GB/s", fmt=format_gb_per_s),
           Column("busbw", "busbw GB/s", fmt=format_gb_per_s), Column("valid", align="left"),
           Column("verdict", align="left"))


def size_text(op, size_bytes):
    return format_size(size_bytes) if op.has_size and size_bytes else "-"


def _row(rec):
    op = get_op(rec["op"])
    size = size_text(op, rec.get("size_bytes"))
    if rec.get("type") == "failure":
        return Span({"size": size}, f"FAILED: {rec.get('error') or 'unknown error'}")
    return {"size": size, "avg": rec.get("latency_avg_us"), "min": rec.get("latency_min_us"),
            "max": rec.get("latency_max_us"),
            "slowest": "-" if rec.get("straggler_rank") is None else f"rank {rec['straggler_rank']}",
            "algbw": rec.get("algbw_bytes_per_s"), "busbw": rec.get("busbw_bytes_per_s"),
            "valid": rec.get("validation") or "off", "verdict": rec.get("verdict") or "-",
            attribution.COLUMN_KEY: attribution.cell(rec)}


def _render(title, rows, columns=COLUMNS):
    """Aligned text; a FAILED or NOT RUN row spans the columns after its size."""
    return "\n".join([title] + table_lines(columns, rows, indent="  "))


def render_tables(records, steps=(), ranks=None, nodes=None):
    """One table per op, ops in plan order, sizes ascending. steps: the plan, to show NOT RUN rows."""
    by_op = {s.op: [] for s in steps}          # op -> [(size_bytes, record)]
    for rec in records:
        if rec.get("type") in ("result", "failure") and rec.get("op"):
            by_op.setdefault(get_op(rec["op"]).name, []).append((rec.get("size_bytes") or 0, rec))
    tables = []
    congested = attribution.table_column(records)   # the host whose counters moved most, when any did
    columns = COLUMNS + (congested,) if congested else COLUMNS
    for op_name, recs in by_op.items():
        op = get_op(op_name)
        rows = [(size, _row(rec)) for size, rec in recs]
        measured = {size for size, _ in recs}
        rows += [(s.size_bytes, Span({"size": size_text(op, s.size_bytes)}, "NOT RUN (the job ended before this step)"))
                 for s in steps if s.op == op_name and s.size_bytes not in measured]
        rows.sort(key=lambda r: r[0])
        datatypes = sorted({rec.get("datatype") for _, rec in recs if rec.get("datatype")}
                           | {s.datatype for s in steps if s.op == op_name})
        where = f", {ranks} ranks" if ranks else ""
        where += f" on {nodes} node{'s' if nodes != 1 else ''}" if nodes else ""
        title = f"{op.title} ({'/'.join(datatypes) or '-'}{where})"
        tables.append(_render(title, [r for _, r in rows], columns))
    return "\n\n".join(tables)


def render_other_failures(records):
    """Failures not tied to one op (a job that died before its first step): one line each."""
    lines = [f"FAILED: {r.get('error')}" for r in records
             if r.get("type") == "failure" and not r.get("op")]
    return "\n".join(lines)
