"""The all-gather microbenchmark guide's pair of files from a sweep's records (docs/REPORTS.md, "Sweeps").

* `metrics_report.jsonl`: one line per measured (op, size), `{"metadata": {...}, "metrics": {...}}`.
  Metric keys are named as that guide's (`achieved_bw (GB/s)_max`): `<quantity> (<unit>)_<stat>`.
  The file is appended to (each line carries its run_id), atomically.
* `t_<op>_<RUNID>.tsv`: this run's rows for one op, the same fields as columns (metadata first,
  then the metrics, then status and error; failed sizes are rows with status `failed`).

Latency: `_avg` / `_min` / `_max` are OSU's (the mean, the fastest and the slowest of the ranks'
average per call); `_p50` / `_p90` / `_p99` / `_pmax` are percentiles of the per-iteration time
of the slowest rank (per iteration, the max over ranks), null with the OSU engine (no
per-iteration samples). Bandwidths in GB/s (10^9 B/s): `_avg` from the average latency (the
record's), `_max` from the fastest rank's average, `_min` from the slowest's; null for barrier.
"""

import json
import math
import os

from collbench.atomic_file import write_atomic
from collbench.ops import DATATYPES, get_op
from collbench.sizes import format_size
from collbench.tables import cell_text

REPORT_NAME = "metrics_report.jsonl"
MAX_SAMPLES = 1 << 20     # the engine keeps the first 2^20 iterations' times (collbench_engine.c)

LAT = "latency (us)"
ALGBW = "algbw (GB/s)"
BUSBW = "busbw (GB/s)"
TRANSFERRED = "transferred_data (bytes)"

METADATA_KEYS = ("run_id", "time", "op", "ranks", "nodes", "hosts", "dtype", "count", "size", "size_bytes",
                 "iterations", "warmup", "samples", "transport", "engine", "algorithm", "timing", "mpi",
                 "validation", "verdict")
METRIC_KEYS = tuple(f"{LAT}_{s}" for s in ("avg", "p50", "p90", "p99", "pmax", "min", "max")) + \
    tuple(f"{bw}_{s}" for bw in (ALGBW, BUSBW) for s in ("avg", "max", "min")) + \
    (TRANSFERRED, "straggler_rank")
TSV_COLUMNS = METADATA_KEYS + METRIC_KEYS + ("status", "error")


def _gb(bytes_per_s):
    return None if bytes_per_s is None else float(f"{bytes_per_s / 1e9:.9g}")


def count_of(op, size_bytes, datatype):
    """Elements of the datatype in one rank's send buffer (the `count` OSU and MPI pass)."""
    if not op.has_size or not size_bytes:
        return 0
    return size_bytes // DATATYPES.get(datatype, 1)


def report_line(rec):
    """{"metadata", "metrics"} of one result record."""
    op = get_op(rec["op"])
    ranks, size = rec["ranks"], rec["size_bytes"]
    pct = {k: rec.get(f"latency_{k}_us") for k in ("p50", "p90", "p99", "pmax")}
    samples = min(rec["iterations"], MAX_SAMPLES) if pct["p50"] is not None else 0
    metadata = {
        "run_id": rec.get("run_id"), "time": rec.get("time"), "op": op.name, "ranks": ranks,
        "nodes": rec.get("nodes"), "hosts": list(rec.get("hosts") or []), "dtype": rec.get("datatype"),
        "count": count_of(op, size, rec.get("datatype")), "size": rec.get("size"), "size_bytes": size,
        "iterations": rec["iterations"], "warmup": rec.get("warmup"), "samples": samples,
        "transport": rec.get("transport"), "engine": rec.get("engine"), "algorithm": rec.get("algorithm"),
        "timing": rec.get("timing", "osu"), "mpi": rec.get("mpi"), "validation": rec.get("validation"),
        "verdict": rec.get("verdict"),
    }
    lat_min, lat_max = rec.get("latency_min_us"), rec.get("latency_max_us")
    bw_max = op.bandwidth(size, ranks, lat_min) if lat_min else (None, None)    # fastest rank
    bw_min = op.bandwidth(size, ranks, lat_max) if lat_max else (None, None)    # slowest rank
    metrics = {
        f"{LAT}_avg": rec["latency_avg_us"],
        f"{LAT}_p50": pct["p50"], f"{LAT}_p90": pct["p90"], f"{LAT}_p99": pct["p99"],
        f"{LAT}_pmax": pct["pmax"],
        f"{LAT}_min": lat_min, f"{LAT}_max": lat_max,
        f"{ALGBW}_avg": _gb(rec.get("algbw_bytes_per_s")), f"{ALGBW}_max": _gb(bw_max[0]),
        f"{ALGBW}_min": _gb(bw_min[0]),
        f"{BUSBW}_avg": _gb(rec.get("busbw_bytes_per_s")), f"{BUSBW}_max": _gb(bw_max[1]),
        f"{BUSBW}_min": _gb(bw_min[1]),
        TRANSFERRED: op.data_bytes(size, ranks) if op.has_size else None,
        "straggler_rank": rec.get("straggler_rank"),
    }
    return {"metadata": metadata, "metrics": metrics}


def dumps_line(line):
    """One report line as JSON (no newline); a non-finite number is written as null."""
    def finite(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        return v
    return json.dumps(finite(line), separators=(",", ":"), ensure_ascii=False)


def report_lines(records):
    return [report_line(r) for r in records if r.get("type") == "result"]


def table_row(rec):
    """The TSV/CSV row of one result or failure record: {column: value}."""
    if rec.get("type") == "result":
        line = report_line(rec)
        return {**line["metadata"], **line["metrics"], "status": "ok", "error": None}
    op = get_op(rec["op"]) if rec.get("op") else None
    size = rec.get("size_bytes")
    row = dict.fromkeys(TSV_COLUMNS)
    row.update({"run_id": rec.get("run_id"), "time": rec.get("time"), "op": rec.get("op"), "ranks": rec.get("ranks"),
                "nodes": rec.get("nodes"), "hosts": rec.get("hosts"), "transport": rec.get("transport"),
                "engine": rec.get("engine"), "mpi": rec.get("mpi"), "size_bytes": size,
                "size": (format_size(size) if op is not None and op.has_size and size else "-") if op else None,
                "status": "failed", "error": rec.get("error")})
    return row


def tsv_text(records):
    lines = ["\t".join(TSV_COLUMNS)]
    for rec in records:
        if rec.get("type") in ("result", "failure"):
            row = table_row(rec)
            lines.append("\t".join(cell_text(row.get(c)) for c in TSV_COLUMNS))
    return "\n".join(lines) + "\n"


def tsv_name(op_name, run_id):
    return f"t_{op_name}_{run_id}.tsv"


def records_by_op(records, op_names):
    """{op: [its result and failure records]} in op_names' order; a failure of the whole job
    (no op) goes to every op's file."""
    out = {name: [] for name in op_names}
    for rec in records:
        if rec.get("type") not in ("result", "failure"):
            continue
        if rec.get("op"):
            out.setdefault(get_op(rec["op"]).name, []).append(rec)
        else:
            for recs in out.values():
                recs.append(rec)
    return out


def output_files(out_dir, run_id, records, op_names):
    """[(what, path, write())] for the report and each op's TSV; each write() is atomic and
    raises OSError if its file cannot be written (the caller goes on with the others)."""
    report = os.path.join(out_dir, REPORT_NAME)

    def write_report():
        os.makedirs(out_dir, exist_ok=True)
        # appended in place (atomic_file): a 1 GB report is never read or rewritten; a failed
        # append is cut back to the old size
        write_atomic(report, (dumps_line(line) + "\n" for line in report_lines(records)), keep_existing=True)
    files = [("metrics report", report, write_report)]
    for op_name, recs in records_by_op(records, op_names).items():
        path = os.path.join(out_dir, tsv_name(op_name, run_id))

        def write_tsv(path=path, recs=recs):
            os.makedirs(out_dir, exist_ok=True)
            write_atomic(path, [tsv_text(recs)])
        files.append((f"{op_name} table", path, write_tsv))
    return files
