"""The sweep's console output: `--format table` (one aligned table per op), `csv` (the TSV's
columns, comma-separated) or `json` (a list of rows with those columns, typed values).

Table columns: avg / min / max are OSU's (mean, fastest and slowest rank's average per call);
p50 / p90 / p99 / pmax are percentiles of the per-iteration time of the slowest rank, empty
when the engine has no per-iteration samples (`--engine osu`).
"""

from collbench.congestion import attribution
from collbench.ops import get_op
from collbench.sizes import format_size
from collbench.sweep.metrics_report import TSV_COLUMNS, table_row
from collbench.tables import Column, Span, csv_text, format_gb_per_s, format_us, json_text, table_lines


def _pct(us):
    return "" if us is None else format_us(us)


COLUMNS = (Column("size"), Column("count"), Column("iters"), Column("avg", fmt=format_us),
           Column("p50", fmt=_pct), Column("p90", fmt=_pct), Column("p99", fmt=_pct), Column("pmax", fmt=_pct),
           Column("min", fmt=format_us), Column("max", fmt=format_us),
           Column("algbw", "algbw GB/s", fmt=format_gb_per_s), Column("busbw", "busbw GB/s", fmt=format_gb_per_s),
           Column("valid", align="left"), Column("verdict", align="left"))
FILE_COLUMNS = tuple(Column(c) for c in TSV_COLUMNS)      # csv and json: the TSV's columns
NOTE = ("avg/min/max: OSU's mean, fastest and slowest rank's average per call; p50/p90/p99/pmax: "
        "percentiles of the per-iteration time of the slowest rank")


def without_samples(records):
    """Results that carry no per-iteration percentiles (the OSU engine prints only averages)."""
    return [r for r in records if r.get("type") == "result" and r.get("latency_p50_us") is None]


def no_samples_note(engine):
    return (f"engine {engine}: no per-iteration samples, so the p50/p90/p99/pmax columns are empty "
            "(the OSU binaries print only averages)")


def _result_row(rec):
    op = get_op(rec["op"])
    row = table_row(rec)
    return {"size": row["size"] if op.has_size else "-", "count": str(row["count"]) if op.has_size else "-",
            "iters": str(rec["iterations"]), "avg": rec.get("latency_avg_us"), "p50": rec.get("latency_p50_us"),
            "p90": rec.get("latency_p90_us"), "p99": rec.get("latency_p99_us"), "pmax": rec.get("latency_pmax_us"),
            "min": rec.get("latency_min_us"), "max": rec.get("latency_max_us"),
            "algbw": rec.get("algbw_bytes_per_s"), "busbw": rec.get("busbw_bytes_per_s"),
            "valid": rec.get("validation") or "off", "verdict": rec.get("verdict") or "-",
            attribution.COLUMN_KEY: attribution.cell(rec)}


def _render(title, rows, columns=COLUMNS):
    return "\n".join([title] + table_lines(columns, rows, indent="  "))


def render_table(records, steps, ranks, nodes, engine):
    """One table per op (ops in plan order, sizes ascending), then the columns' meaning."""
    tables = []
    congested = attribution.table_column(records)   # the host whose counters moved most, when any did
    columns = COLUMNS + (congested,) if congested else COLUMNS
    for op_name in dict.fromkeys(s.op for s in steps):
        op = get_op(op_name)
        recs = [r for r in records if r.get("type") in ("result", "failure") and r.get("op") == op_name]
        rows = []
        for r in recs:
            size = r.get("size_bytes") or 0
            if r["type"] == "result":
                rows.append((size, _result_row(r)))
            else:
                rows.append((size, Span({"size": format_size(size) if op.has_size and size else "-"},
                                        f"FAILED: {r.get('error') or 'unknown error'}")))
        measured = {r.get("size_bytes") or 0 for r in recs}
        rows += [(s.size_bytes, Span({"size": format_size(s.size_bytes) if op.has_size else "-"},
                                     "NOT RUN (the job ended before this step)"))
                 for s in steps if s.op == op_name and s.size_bytes not in measured]
        rows.sort(key=lambda r: r[0])
        datatypes = "/".join(sorted({s.datatype for s in steps if s.op == op_name}))
        title = f"{op.title} ({datatypes}, {ranks} ranks on {nodes} node{'s' if nodes != 1 else ''})"
        tables.append(_render(title, [r for _, r in rows], columns))
    notes = [NOTE] + ([no_samples_note(engine)] if without_samples(records) else [])
    notes += [attribution.COLUMN_NOTE] if congested else []
    job_failures = [f"FAILED: {r.get('error')}" for r in records if r.get("type") == "failure" and not r.get("op")]
    return "\n\n".join(tables + ["\n".join(job_failures)] * bool(job_failures) + ["\n".join(notes)]) + "\n"


def rows(records):
    return [table_row(r) for r in records if r.get("type") in ("result", "failure")]


def render_csv(records):
    return csv_text(FILE_COLUMNS, rows(records))


def render_json(records):
    return json_text(FILE_COLUMNS, rows(records))
