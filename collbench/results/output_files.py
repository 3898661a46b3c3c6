"""The result files of `collbench once`: JSON Lines records and a TSV table (atomic_file's writer).

* JSONL (`--results`) is a history: this run's records are appended in place after what is there
  (each record carries its run_id); the old content is never read or rewritten, a torn last line
  is ended first, and a failed append (a full disk) is cut back to the old size.
* TSV (`--tsv`) is this run's table (like the all-gather microbenchmark guide's `t_<op>_<id>.tsv`): replaced atomically each
  run (a temporary file in the target's directory, fsync'd, renamed over it).

A character device or FIFO is written through, a symlink's target is written (atomic_file).
"""

from collbench.atomic_file import write_atomic
from collbench.results.records import dumps

TSV_COLUMNS = (
    ("run_id", "run_id"), ("time", "time"), ("op", "op"), ("size", "size"), ("size_bytes", "size_bytes"),
    ("datatype", "datatype"), ("ranks", "ranks"), ("nodes", "nodes"), ("engine", "engine"),
    ("iterations", "iterations"), ("latency_avg_us", "latency_avg_us"),
    ("latency_min_us", "latency_min_us"), ("latency_max_us", "latency_max_us"),
    ("algbw_GBps", "algbw_bytes_per_s"), ("busbw_GBps", "busbw_bytes_per_s"),
    ("data_GB", None), ("validation", "validation"), ("straggler_rank", "straggler_rank"),
    ("verdict", "verdict"), ("status", "status"), ("error", "error"),
)


def write_jsonl(path, records):
    """Add records to path (kept if it exists), one JSON object per line."""
    return write_atomic(path, (dumps(r) + "\n" for r in records), keep_existing=True)


def _tsv_value(rec, key, header):
    if header == "data_GB":
        from collbench.ops import get_op
        if rec.get("type") != "result" or not rec.get("op"):
            return ""
        op = get_op(rec["op"])
        if not op.has_size:
            return ""
        return f"{op.data_bytes(rec['size_bytes'], rec['ranks']) / 1e9:.9g}"
    v = rec.get(key)
    if header == "size" and v is None and rec.get("size_bytes"):
        from collbench.sizes import format_size
        v = format_size(rec["size_bytes"])  # failure records carry only size_bytes
    if v is None:
        return ""
    if header.endswith("_GBps"):
        return f"{v / 1e9:.6g}"
    if isinstance(v, float):
        return f"{v:.6g}"
    # a field never holds a tab or newline in the TSV (errors can)
    return " ".join(str(v).split())


def tsv_lines(records):
    yield "\t".join(h for h, _ in TSV_COLUMNS) + "\n"
    for rec in records:
        if rec.get("type") not in ("result", "failure"):
            continue
        yield "\t".join(_tsv_value(rec, key, h) for h, key in TSV_COLUMNS) + "\n"


def write_tsv(path, records):
    """Replace path with this run's table: a header line, then one line per (op, size)."""
    return write_atomic(path, tsv_lines(list(records)), keep_existing=False)
