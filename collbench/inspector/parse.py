"""One NCCL Inspector JSON line, or one Prometheus textfile, into typed tuples; anything else is
a FormatError whose text says which key and what was expected (the caller counts it).

The shapes (docs/INSPECTOR.md; read from plugins/profiler/inspector of NVIDIA/nccl):

    {"header":{"id","comm_name"(2.30+),"rank","n_ranks","nnodes"},
     "metadata":{"inspector_output_format_version","git_rev","rec_mechanism","dump_timestamp_us",
                 "hostname","pid"},
     "coll_perf":{"coll","coll_sn","coll_msg_size_bytes","coll_exec_time_us",
                  "coll_timing_source"(2.28.x later builds+),"coll_algobw_gbs","coll_busbw_gbs",
                  "event_trace_sn","event_trace_ts" (verbose)}}
     or "p2p_perf":{"p2p","p2p_sn","p2p_peer","p2p_msg_size_bytes",...} (2.30+)

Prometheus textfiles: 2.29.3/2.29.7 write three samples per communicator's latest collective
(labels comm_id, hostname, rank, ..., coll_sn, timestamp, message_size "2.00GB"); 2.30+ write two
per bucket (labels version, slurm_job_id, node, gpu, comm_name, n_nodes, nranks, collective,
message_size "8-9KB", algo_proto; p2p: p2p_operation), means over the dump interval.
"""

import json
import math
import re
from typing import NamedTuple

from collbench.text_numbers import finite_nonnegative

# the Inspector's collective names -> collbench's op (collbench/ops.py); the rest have no op here
OPS = {"AllReduce": "allreduce", "AllGather": "allgather", "Broadcast": "bcast", "Reduce": "reduce",
       "ReduceScatter": "reduce_scatter", "All2All": "alltoall"}
FUNCS = set(OPS) | {"SendRecv", "Send", "Recv", "AllGatherV", "Invalid"}
TIMING_SOURCES = ("kernel_gpu", "kernel_cpu", "collective_cpu")
MAX_LINE = 256 << 10          # a verbose record with 64 channels is ~15 KB
MAX_RANKS = 1 << 24
MAX_BYTES = 1 << 50
MAX_US = 10 ** 12             # ~11 days
UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
_HOST = re.compile(r"[A-Za-z0-9_.:\-\[\]]{1,255}")
_COMM_ID = re.compile(r"0x[0-9a-f]{1,16}")


class FormatError(ValueError):
    """Not an Inspector record: str() says which key and what was expected."""


class InspectorOp(NamedTuple):
    """One rank's record of one collective or point-to-point op."""
    comm_id: str
    comm_name: str            # None before 2.30.3 (the writer had no comm_name)
    rank: int
    n_ranks: int
    nnodes: int
    version: str              # inspector_output_format_version
    git_rev: str
    dump_us: int              # when the dump thread wrote it (not when the op ran)
    hostname: str
    pid: int
    kind: str                 # "coll" or "p2p"
    func: str                 # AllReduce, ..., Send, Recv
    sn: int
    msg_bytes: int
    exec_us: int
    timing_source: str        # None: a 2.28 build that did not write it
    algbw_gbs: float          # None: "nan"
    busbw_gbs: float
    peer: int = None          # p2p only
    start_us: int = None      # verbose: coll_start_ts / p2p_start_ts (CPU gettimeofday)
    stop_us: int = None
    kernel_start_us: int = None   # verbose: the earliest kernel_start_ts over channels
    kernel_stop_us: int = None    # ... the latest kernel_stop_ts
    channels: int = None          # verbose: kernel events

    @property
    def op(self):
        """collbench's op name, or None (p2p, SendRecv, AllGatherV: collbench has no such op)."""
        return OPS.get(self.func) if self.kind == "coll" else None


def _obj(parent, key, where):
    v = parent.get(key)
    if not isinstance(v, dict):
        raise FormatError(f"{where}{key}: expected an object, got {_what(v)}")
    return v


def _what(v):
    if v is None:
        return "nothing"
    if isinstance(v, str):
        return f"the string {v[:40]!r}"
    if isinstance(v, bool):
        return f"{v}".lower()
    if isinstance(v, (int, float)):
        return f"{v!r}"[:40]
    return f"a{'n' if type(v).__name__[0] in 'aeiou' else ''} {type(v).__name__}"


def _int(d, key, where, lo=0, hi=MAX_BYTES):
    v = d.get(key)
    if type(v) is not int or not lo <= v <= hi:
        raise FormatError(f"{where}.{key}: expected a whole number {lo}..{hi}, got {_what(v)}")
    return v


_CHECKED = set()      # (key, value) of strings already checked: hosts, ids, names repeat on every line
MAX_CHECKED = 1 << 16


def _str(d, key, where, pattern=None, maxlen=256, optional=False):
    v = d.get(key)
    if v is None and optional:
        return None
    if type(v) is str and (key, v) in _CHECKED:
        return v
    if not isinstance(v, str) or len(v) > maxlen or not v.isprintable() or \
            (pattern is not None and not pattern.fullmatch(v)):
        raise FormatError(f"{where}.{key}: expected {'a ' + pattern.pattern if pattern else 'a short string'}, "
                          f"got {_what(v)}")
    if len(_CHECKED) >= MAX_CHECKED:
        _CHECKED.clear()
    _CHECKED.add((key, v))
    return v


def _gbs(d, key, where):
    v = d.get(key)
    if v == "nan" or v is None:        # the writer prints NaN as the string "nan"
        return None
    if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
        raise FormatError(f"{where}.{key}: expected a bandwidth in GB/s >= 0, got {_what(v)}")
    return float(v)


def _trace(perf, prefix, where):
    """(start, stop, kernel start, kernel stop, channels) from a verbose event_trace_ts, or Nones."""
    ts = perf.get("event_trace_ts")
    if ts is None:
        return None, None, None, None, None
    if not isinstance(ts, dict):
        raise FormatError(f"{where}.event_trace_ts: expected an object, got {_what(ts)}")
    w = f"{where}.event_trace_ts"
    start = _int(ts, f"{prefix}_start_ts", w, hi=1 << 62)
    stop = _int(ts, f"{prefix}_stop_ts", w, hi=1 << 62)
    events = ts.get("kernel_events", [])
    if not isinstance(events, list) or len(events) > 1024:
        raise FormatError(f"{w}.kernel_events: expected a list of at most 1024 channels, got {_what(events)}")
    k_start = k_stop = None
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise FormatError(f"{w}.kernel_events[{i}]: expected an object, got {_what(e)}")
        a = _int(e, "kernel_start_ts", f"{w}.kernel_events[{i}]", hi=1 << 62)
        b = _int(e, "kernel_stop_ts", f"{w}.kernel_events[{i}]", hi=1 << 62)
        k_start = a if k_start is None else min(k_start, a)
        k_stop = b if k_stop is None else max(k_stop, b)
    return start, stop, k_start, k_stop, len(events)


def parse_line(line):
    """The InspectorOp of one JSON line (str or bytes); FormatError saying what is wrong."""
    if len(line) > MAX_LINE:
        raise FormatError(f"a line of {len(line)} bytes (at most {MAX_LINE} expected)")
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise FormatError(f"not JSON ({str(e)[:80]})") from None
    if not isinstance(doc, dict):
        raise FormatError(f"expected a JSON object, got {_what(doc)}")
    header = _obj(doc, "header", "")
    meta = _obj(doc, "metadata", "")
    if "coll_perf" in doc:
        kind, perf, p = "coll", _obj(doc, "coll_perf", ""), "coll"
    elif "p2p_perf" in doc:
        kind, perf, p = "p2p", _obj(doc, "p2p_perf", ""), "p2p"
    else:
        raise FormatError("expected a coll_perf or p2p_perf object, found neither")
    n_ranks = _int(header, "n_ranks", "header", 1, MAX_RANKS)
    rank = _int(header, "rank", "header", 0, n_ranks - 1)
    nnodes = _int(header, "nnodes", "header", 1, n_ranks)
    where = f"{p}_perf"
    func = _str(perf, p, where, maxlen=32)
    if func not in FUNCS or (kind == "p2p" and func not in ("Send", "Recv")):
        raise FormatError(f"{where}.{p}: expected one of {', '.join(sorted(FUNCS))}, got {func[:40]!r}")
    timing = perf.get(f"{p}_timing_source")
    if timing is not None and timing not in TIMING_SOURCES:
        raise FormatError(f"{where}.{p}_timing_source: expected one of {', '.join(TIMING_SOURCES)}, "
                          f"got {_what(timing)}")
    comm_name = _str(header, "comm_name", "header", maxlen=256, optional=True)
    return InspectorOp(
        _str(header, "id", "header", _COMM_ID), comm_name, rank, n_ranks, nnodes,
        _str(meta, "inspector_output_format_version", "metadata", maxlen=32),
        _str(meta, "git_rev", "metadata", maxlen=128), _int(meta, "dump_timestamp_us", "metadata", hi=1 << 62),
        _str(meta, "hostname", "metadata", _HOST), _int(meta, "pid", "metadata", hi=1 << 32),
        kind, func, _int(perf, f"{p}_sn", where, hi=1 << 62), _int(perf, f"{p}_msg_size_bytes", where),
        _int(perf, f"{p}_exec_time_us", where, hi=MAX_US), timing, _gbs(perf, f"{p}_algobw_gbs", where),
        _gbs(perf, f"{p}_busbw_gbs", where), _int(perf, "p2p_peer", where, 0, MAX_RANKS) if kind == "p2p" else None,
        *_trace(perf, p, where))


# ------------------------------------------------------------------ Prometheus textfiles

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}\s+(\S+)(?:\s+-?\d+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_SIZE_229 = re.compile(r"(\d+)B|(\d+\.\d{2})(KB|MB|GB|TB)")
_SIZE_230 = re.compile(r"0B|(\d+)-(\d+)(B|KB|MB|GB|TB)")
PROM_COLL_229 = {"nccl_algorithm_bandwidth_gbs": "algbw", "nccl_bus_bandwidth_gbs": "busbw",
                 "nccl_collective_exec_time_microseconds": "exec_us"}
PROM_230 = {"nccl_bus_bandwidth_gbs": ("coll", "busbw"), "nccl_collective_exec_time_microseconds": ("coll", "exec_us"),
            "nccl_p2p_bus_bandwidth_gbs": ("p2p", "busbw"), "nccl_p2p_exec_time_microseconds": ("p2p", "exec_us")}
MAX_PROM_SAMPLES = 1 << 20
# the RCCL port's fork (ravel7525/rocm-systems) adds these opt-in counters beside the samples: known, not read
PROM_COUNTERS_RCCL = {"nccl_collectives_total", "nccl_collectives_dropped_total", "nccl_p2p_total",
                      "nccl_p2p_dropped_total"}


class PromCollective(NamedTuple):
    """2.29's per-collective sample set: one rank's latest collective of one communicator."""
    comm_id: str
    hostname: str
    rank: int
    n_ranks: int
    nnodes: int
    func: str
    sn: int
    msg_bytes: int            # from "%.2f<unit>": exact below 1 KiB, else to 0.5 % (size_exact False)
    size_exact: bool
    exec_us: float
    algbw_gbs: float
    busbw_gbs: float
    job_id: str
    timestamp: str            # the dump's UTC time


class PromBucket(NamedTuple):
    """2.30's bucket: the mean over the ops of one interval of one GPU with these labels."""
    kind: str                 # coll or p2p
    func: str
    node: str
    gpu: str
    comm_name: str
    n_ranks: int
    nnodes: int
    size_low: int             # the message_size label's lower bound, bytes
    size_high: int            # its upper bound (exclusive)
    size_label: str
    algo_proto: str
    exec_us: float            # arithmetic mean
    busbw_gbs: float          # geometric mean of the ops' busbw > 0
    job_id: str
    version: str


def _labels(text, where):
    out, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m or m.end() == pos:
            raise FormatError(f"{where}: labels not in name=\"value\" form near {text[pos:pos + 40]!r}")
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\\\", "\\")
        pos = m.end()
    return out


def _label_int(labels, key, where, lo=0, hi=MAX_RANKS):
    v = labels.get(key, "")
    if not v.isdigit() or not lo <= int(v) <= hi:
        raise FormatError(f"{where}: label {key}: expected a whole number {lo}..{hi}, got {v[:40]!r}")
    return int(v)


def size_229(text):
    """(bytes, exact) of a 2.29 message_size label ("512B", "2.00GB"); FormatError."""
    m = _SIZE_229.fullmatch(text)
    if not m:
        raise FormatError(f"label message_size: expected e.g. 512B or 2.00GB, got {text[:40]!r}")
    if m.group(1) is not None:
        return int(m.group(1)), True
    return round(float(m.group(2)) * UNITS[m.group(3)]), False


def size_230(text):
    """(low, high) bytes of a 2.30 message_size label ("8-9KB", "0B"); FormatError."""
    m = _SIZE_230.fullmatch(text)
    if not m or (m.group(1) is not None and int(m.group(2)) != int(m.group(1)) + 1):
        raise FormatError(f"label message_size: expected e.g. 8-9KB or 0B, got {text[:40]!r}")
    if m.group(1) is None:
        return 0, 1
    unit = UNITS[m.group(3)]
    return int(m.group(1)) * unit, int(m.group(2)) * unit


def size_bucket_label(nbytes):
    """The 2.30 plugin's message_size label of a byte count (what its writer prints)."""
    if nbytes <= 0:
        return "0B"
    value, unit = float(nbytes), 0
    names = ("B", "KB", "MB", "GB", "TB")
    while value >= 1024 and unit < len(names) - 1:
        value /= 1024
        unit += 1
    low = max(1, int(value))
    return f"{low}-{low + 1}{names[unit]}"


def _value(text, where):
    try:
        return finite_nonnegative(text, "value")
    except ValueError as e:
        raise FormatError(f"{where}: {e}") from None


def parse_prom(text):
    """(form, [PromCollective] or [PromBucket], [(line number, reason)]) of one textfile; form is
    "prom-2.29", "prom-2.30" or None (no Inspector sample in it)."""
    bad, per229, per230 = [], {}, {}
    samples = 0
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        samples += 1
        if samples > MAX_PROM_SAMPLES:
            bad.append((n, f"more than {MAX_PROM_SAMPLES} samples: the rest not read"))
            break
        m = _SAMPLE.match(line)
        if not m:
            bad.append((n, "not a `name{labels} value` sample"))
            continue
        name, where = m.group(1), f"line {n}"
        if name in PROM_COUNTERS_RCCL:
            continue
        try:
            labels = _labels(m.group(2), where)
            value = _value(m.group(3), where)
            if "coll_sn" in labels and name in PROM_COLL_229:
                key = (labels.get("comm_id"), labels.get("hostname"), labels.get("rank"), labels.get("collective"),
                       labels.get("coll_sn"))
                per229.setdefault(key, [labels, {}])[1][PROM_COLL_229[name]] = value
            elif "version" in labels and name in PROM_230:
                kind, field = PROM_230[name]
                key = (kind,) + tuple(sorted(labels.items()))
                per230.setdefault(key, [labels, {}])[1][field] = value
            else:
                bad.append((n, f"{name}: not an Inspector sample"))
        except FormatError as e:
            bad.append((n, str(e)))
    out229, out230 = [], []
    for (_, _, _, _, _), (labels, vals) in per229.items():
        try:
            out229.append(_coll_229(labels, vals))
        except FormatError as e:
            bad.append((0, str(e)))
    for key, (labels, vals) in per230.items():
        try:
            out230.append(_bucket_230(key[0], labels, vals))
        except FormatError as e:
            bad.append((0, str(e)))
    if out230 and not out229:
        return "prom-2.30", out230, bad
    if out229:
        return "prom-2.29", out229, bad + [(0, f"{len(out230)} 2.30 bucket(s) beside 2.29 samples ignored")] * bool(out230)
    return None, [], bad


def _coll_229(labels, vals):
    where = f"comm {labels.get('comm_id', '?')[:20]} rank {labels.get('rank', '?')[:8]}"
    if "exec_us" not in vals:
        raise FormatError(f"{where}: no nccl_collective_exec_time_microseconds sample")
    func = labels.get("collective", "")
    if func not in FUNCS:
        raise FormatError(f"{where}: label collective: expected one of {', '.join(sorted(FUNCS))}, got {func[:40]!r}")
    # the code writes nranks; the README's example prints n_ranks: both are read
    n_ranks = _label_int(labels, "nranks" if "nranks" in labels else "n_ranks", where, 1)
    size, exact = size_229(labels.get("message_size", ""))
    host = labels.get("hostname", "")
    if not _HOST.fullmatch(host):
        raise FormatError(f"{where}: label hostname: expected a host name, got {host[:40]!r}")
    comm = labels.get("comm_id", "")
    if not _COMM_ID.fullmatch(comm):
        raise FormatError(f"{where}: label comm_id: expected 0x and hex digits, got {comm[:40]!r}")
    return PromCollective(comm, host, _label_int(labels, "rank", where, 0, n_ranks - 1), n_ranks,
                          _label_int(labels, "n_nodes", where, 1, n_ranks), func,
                          _label_int(labels, "coll_sn", where, 0, 1 << 62), size, exact, vals["exec_us"],
                          vals.get("algbw"), vals.get("busbw"), _job(labels.get("slurm_job_id")),
                          labels.get("timestamp", "")[:32])


def _bucket_230(kind, labels, vals):
    where = f"bucket {labels.get('collective', labels.get('p2p_operation', '?'))[:20]} {labels.get('message_size', '?')[:20]}"
    if "exec_us" not in vals:
        raise FormatError(f"{where}: no exec time sample")
    func = labels.get("collective" if kind == "coll" else "p2p_operation", "")
    if func not in FUNCS:
        raise FormatError(f"{where}: expected a collective in {', '.join(sorted(FUNCS))}, got {func[:40]!r}")
    low, high = size_230(labels.get("message_size", ""))
    n_ranks = _label_int(labels, "nranks", where, 1)
    return PromBucket(kind, func, labels.get("node", "")[:255], labels.get("gpu", "")[:32],
                      labels.get("comm_name", "unknown")[:256], n_ranks,
                      _label_int(labels, "n_nodes", where, 1, n_ranks), low, high, labels["message_size"],
                      labels.get("algo_proto", "")[:64], vals["exec_us"], vals.get("busbw"),
                      _job(labels.get("slurm_job_id")), labels.get("version", "")[:16])


def _job(v):
    return v if v and v != "unknown" and len(v) <= 32 and v.isprintable() else None
