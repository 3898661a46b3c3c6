"""The sweep's console output: `--format table` (one aligned table per op), `csv` (the TSV's
columns, comma-separated) or `json` (a list of rows with those columns, typed values).

Table columns: avg / min / max are OSU's (mean, fastest and slowest rank's average per call);
p50 / p90 / p99 / pmax are percentiles of the per-iteration time of the slowest rank, empty
when the engine has no per-iteration samples (`--engine osu`).
"""

import csv
import io
import json

from collbench.ops import get_op
from collbench.once.report_table import format_gbps, format_latency
from collbench.sizes import format_size
from collbench.sweep.metrics_report import TSV_COLUMNS, _cell, table_row

COLUMNS = ("size", "count", "iters", "avg", "p50", "p90", "p99", "pmax", "min", "max", "algbw GB/s",
           "busbw GB/s", "valid", "verdict")
LEFT = {"valid", "verdict"}
NOTE = ("avg/min/max: OSU's mean, fastest and slowest rank's average per call; p50/p90/p99/pmax: "
        "percentiles of the per-iteration time of the slowest rank")


def without_samples(records):
    """Results that carry no per-iteration percentiles (the OSU engine prints only averages)."""
    return [r for r in records if r.get("type") == "result" and r.get("latency_p50_us") is None]


def no_samples_note(engine):
    return (f"engine {engine}: no per-iteration samples, so the p50/p90/p99/pmax columns are empty "
            "(the OSU binaries print only averages)")


def _pct(us):
    return "" if us is None else format_latency(us)


def _result_cells(rec):
    op = get_op(rec["op"])
    row = table_row(rec)
    return [row["size"] if op.has_size else "-", str(row["count"]) if op.has_size else "-", str(rec["iterations"]),
            format_latency(rec.get("latency_avg_us")),
            _pct(rec.get("latency_p50_us")), _pct(rec.get("latency_p90_us")), _pct(rec.get("latency_p99_us")),
            _pct(rec.get("latency_pmax_us")),
            format_latency(rec.get("latency_min_us")), format_latency(rec.get("latency_max_us")),
            format_gbps(rec.get("algbw_bytes_per_s")), format_gbps(rec.get("busbw_bytes_per_s")),
            rec.get("validation") or "off", rec.get("verdict") or "-"]


def _render(title, rows):
    widths = [len(c) for c in COLUMNS]
    for r in rows:
        if len(r) == len(COLUMNS):
            widths = [max(w, len(v)) for w, v in zip(widths, r)]
    widths[0] = max([widths[0]] + [len(r[0]) for r in rows])

    def fmt(cells):
        if len(cells) < len(COLUMNS):     # FAILED / NOT RUN: the message spans the row
            return ("  " + "  ".join([cells[0].rjust(widths[0])] + cells[1:])).rstrip()
        return ("  " + "  ".join(v.ljust(w) if c in LEFT else v.rjust(w)
                                 for c, w, v in zip(COLUMNS, widths, cells))).rstrip()

    return "\n".join([title, fmt(list(COLUMNS)), "  " + "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows])


def render_table(records, steps, ranks, nodes, engine):
    """One table per op (ops in plan order, sizes ascending), then the columns' meaning."""
    tables = []
    for op_name in dict.fromkeys(s.op for s in steps):
        op = get_op(op_name)
        recs = [r for r in records if r.get("type") in ("result", "failure") and r.get("op") == op_name]
        rows = []
        for r in recs:
            size = r.get("size_bytes") or 0
            if r["type"] == "result":
                rows.append((size, _result_cells(r)))
            else:
                rows.append((size, [format_size(size) if op.has_size and size else "-",
                                    f"FAILED: {r.get('error') or 'unknown error'}"]))
        measured = {r.get("size_bytes") or 0 for r in recs}
        rows += [(s.size_bytes, [format_size(s.size_bytes) if op.has_size else "-",
                                 "NOT RUN (the job ended before this step)"])
                 for s in steps if s.op == op_name and s.size_bytes not in measured]
        rows.sort(key=lambda r: r[0])
        datatypes = "/".join(sorted({s.datatype for s in steps if s.op == op_name}))
        title = f"{op.title} ({datatypes}, {ranks} ranks on {nodes} node{'s' if nodes != 1 else ''})"
        tables.append(_render(title, [r for _, r in rows]))
    notes = [NOTE] + ([no_samples_note(engine)] if without_samples(records) else [])
    job_failures = [f"FAILED: {r.get('error')}" for r in records if r.get("type") == "failure" and not r.get("op")]
    return "\n\n".join(tables + ["\n".join(job_failures)] * bool(job_failures) + ["\n".join(notes)]) + "\n"


def rows(records):
    return [table_row(r) for r in records if r.get("type") in ("result", "failure")]


def render_csv(records):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(TSV_COLUMNS)
    for row in rows(records):
        w.writerow([_cell(row.get(c)) for c in TSV_COLUMNS])
    return buf.getvalue()


def render_json(records):
    return json.dumps([{c: row.get(c) for c in TSV_COLUMNS} for row in rows(records)], indent=1,
                      ensure_ascii=False) + "\n"
