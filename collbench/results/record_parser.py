"""The one validator of results-log lines (docs/LOG_FORMAT.md, "Validation"): every reader of the
log -- the exporter, `stress log|status`, the daemon's start-up `seq` scan, `ctl servers` --
turns a raw line into a record here and nowhere else.

A line is untrusted input: whoever can write the log (or a disk fault, or a torn write) can put
anything in it. `parse_record(line)` returns the record (a dict) when the line is exactly one of
the documented shapes -- `result`, `failure` or `event`, with the fields readers need (SHAPES:
required) and every known field present of its documented type and range; a documented field
that is absent (a log written before it existed, a writer that leaves it out) is simply absent
-- and a `ParseError` with a short reason for anything else. It never raises
(but TypeError for a non-bytes/str argument, a caller's bug); its cost is bounded by the line
length:

- at most MAX_LINE_BYTES (1 MiB, the tailer's cap too), strict UTF-8, no lone surrogates;
- at most MAX_CONTAINERS arrays/objects per line, counted on the text *before* json.loads, so
  200,000 `[` cost one regex pass, never a RecursionError;
- integers of at most 19 digits (|n| < 2**63), floats finite (`1e400`, `NaN`, `Infinity` are
  rejected), duplicate keys rejected (JSON parsers disagree on which one wins);
- strings bounded per field; identifiers single-line, without control characters.

Unknown extra fields are allowed (the format only ever adds fields) and kept in the dict, but
no reader interprets them; the readers' JSON output passes them through.
"""

import json
import re
import sys

from collbench.ops import ALL_OPS, DATATYPES
from collbench.sizes import format_size

MAX_LINE_BYTES = 1 << 20
MAX_CONTAINERS = 64            # arrays + objects in one line (a record has 2)
MAX_INT_DIGITS = 19
MAX_INT = (1 << 63) - 1
MAX_SEQ = 1 << 53              # exact in a float, so every JSON reader agrees on it
MAX_TS = float(1 << 34)        # Unix seconds, year 2514
MAX_HOSTS = 65536

SCHEMA_VERSION = 1
RECORD_TYPES = ("result", "failure", "event")

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)   # unrolled: linear, never backtracks
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z")
_EVENT_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


class ParseError:
    """Why a line is not a record: `reason`, short and safe to log (no large or raw values)."""

    __slots__ = ("reason",)

    def __init__(self, reason):
        self.reason = reason

    def __str__(self):
        return self.reason

    def __repr__(self):
        return f"ParseError({self.reason!r})"

    def __eq__(self, other):
        return isinstance(other, ParseError) and other.reason == self.reason

    __hash__ = None


class _Reject(ValueError):
    """Raised inside the validation; becomes a ParseError."""


def parse_record(line):
    """The validated record (dict) of one results-log line (bytes or str, with or without its
    newline), or a ParseError saying why it is not one."""
    if not isinstance(line, (bytes, bytearray, memoryview, str)):
        raise TypeError(f"parse_record: expected bytes or str, got {type(line).__name__}")
    try:
        return _parse(line)
    except _Reject as e:
        return ParseError(str(e))
    except ValueError as e:      # json's own errors
        return ParseError(f"not JSON: {_short(str(e), 80)}")
    except Exception as e:       # noqa: BLE001 -- a line must never stop a reader, even through a bug here
        return ParseError(f"not a valid record ({type(e).__name__} in the validator)")


def is_record(value):
    """True for what parse_record returns for a valid line."""
    return isinstance(value, dict)


# ------------------------------------------------------------------ the line

def _parse(line):
    if isinstance(line, (bytes, bytearray, memoryview)):
        if len(line) > MAX_LINE_BYTES:
            raise _Reject(f"line longer than {MAX_LINE_BYTES} bytes")
        try:
            text = bytes(line).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Reject(f"not UTF-8 (byte {e.start})") from None
    else:
        if len(line) > MAX_LINE_BYTES:
            raise _Reject(f"line longer than {MAX_LINE_BYTES} bytes")
        text = line
        if not text.isascii() and _SURROGATE.search(text):
            raise _Reject("not UTF-8 (a lone surrogate)")
    text = text.rstrip("\r\n")
    if not text.strip():
        raise _Reject("empty line")
    if not text.lstrip().startswith("{"):
        raise _Reject("not a JSON object")
    _check_containers(text)
    # C-speed parsing first; a line with a number out of range (an overflowing float became inf,
    # an integer past 2**63) is parsed again by the hooked decoder, which says exactly why.
    rec = _FAST_DECODER.decode(text)
    if _has_wild_number(rec):
        rec = _DECODER.decode(text)
    if not isinstance(rec, dict):
        raise _Reject("not a JSON object")
    if "\\u" in text:          # escapes can spell lone surrogates, which cannot be printed
        _check_surrogates(rec)
    _validate(rec)
    return rec


def _check_containers(text):
    """Bound nesting before parsing: count [ and { outside strings (cheap C-speed passes)."""
    if text.count("[") + text.count("{") <= MAX_CONTAINERS:
        return
    bare = _STRING.sub("", text)
    if bare.count("[") + bare.count("{") > MAX_CONTAINERS:
        raise _Reject(f"more than {MAX_CONTAINERS} arrays/objects (nesting too deep or too many)")


def _object(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise _Reject(f"duplicate key {_short(k)}")
            seen.add(k)
    return out


def _int_literal(s):
    if len(s) > MAX_INT_DIGITS - 1:     # the common case stays one len() and one int()
        digits = len(s.lstrip("-"))
        if digits > MAX_INT_DIGITS:
            raise _Reject(f"integer of {digits} digits (at most {MAX_INT_DIGITS})")
        if abs(int(s)) > MAX_INT:
            raise _Reject(f"integer {s} out of range (|n| < 2**63)")
    return int(s)


def _float_literal(s):
    v = float(s)
    if v - v != 0.0:                     # inf - inf is nan; 1e400 parses to inf
        raise _Reject(f"number {_short(s, 24)} out of range (not a finite double)")
    return v


def _constant(name):
    raise _Reject(f"{name} is not a number (non-finite values are written as null)")


# The careful decoder: every literal passes through these hooks as it is parsed.
_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_int=_int_literal,
                            parse_float=_float_literal, parse_constant=_constant)
# Numbers parsed by the C scanner (constants still refused); _has_wild_number() checks them after.
_FAST_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_constant)


def _has_wild_number(value):
    """A non-finite float or an integer beyond 2**63 anywhere in value (depth bounded by
    MAX_CONTAINERS, checked before parsing)."""
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, list):
        value = (value,)
    for v in value:
        t = type(v)
        if t is float:
            if v - v != 0.0:
                return True
        elif t is int:
            if not -MAX_INT <= v <= MAX_INT:
                return True
        elif t is dict or t is list:
            if _has_wild_number(v):
                return True
    return False


def _check_surrogates(value):
    """Recursion is bounded: at most MAX_CONTAINERS levels (checked before parsing)."""
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise _Reject("a string holds a lone surrogate (\\ud800-\\udfff)")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_surrogates(k)
            _check_surrogates(v)
    elif isinstance(value, list):
        for v in value:
            _check_surrogates(v)


# ------------------------------------------------------------------ field checks

def _short(value, n=40):
    text = value if isinstance(value, str) else str(value)
    return repr(text[:n] + "..." if len(text) > n else text)


def _what(v):
    """A short description of a JSON value for an error message."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return _short(repr(v), 24)[1:-1]
    if isinstance(v, str):
        return "string " + _short(v)
    return "an array" if isinstance(v, list) else "an object"


def _string(maxlen, line=True):
    def check(key, v):
        if not isinstance(v, str):
            raise _Reject(f"{key}: expected a string, got {_what(v)}")
        if len(v) > maxlen:
            raise _Reject(f"{key}: string of {len(v)} characters (at most {maxlen})")
        if line and _CONTROL.search(v):
            raise _Reject(f"{key}: control character in {_short(v)}")
    return check


def _choice(*values):
    def check(key, v):
        if not isinstance(v, str) or v not in values:
            raise _Reject(f"{key}: expected one of {', '.join(values)}, got {_what(v)}")
    return check


def _integer(lo, hi=MAX_INT):
    def check(key, v):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Reject(f"{key}: expected an integer, got {_what(v)}")
        if not lo <= v <= hi:
            raise _Reject(f"{key}: {v} out of range {lo}..{hi}")
    return check


def _number(lo, hi=float(MAX_INT)):
    def check(key, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Reject(f"{key}: expected a number, got {_what(v)}")
        if not lo <= v <= hi:     # finite already: literals are checked while parsing
            raise _Reject(f"{key}: {_what(v)} out of range {lo:g}..{hi:g}")
    return check


def _boolean(key, v):
    if not isinstance(v, bool):
        raise _Reject(f"{key}: expected true or false, got {_what(v)}")


def _nullable(check):
    def nullable(key, v):
        if v is not None:
            check(key, v)
    return nullable


def _time(key, v):
    if not isinstance(v, str) or len(v) > 40 or not _TIME.fullmatch(v):
        raise _Reject(f"{key}: expected RFC 3339 UTC time (2026-11-22T15:58:48.134Z), got {_what(v)}")


_HOST_NAME = _string(1024)
_hosts_seen = {}   # host lists already validated (a log repeats the same few); bounded below


def _hosts(key, v):
    if not isinstance(v, list):
        raise _Reject(f"{key}: expected an array of host names, got {_what(v)}")
    if len(v) > MAX_HOSTS:
        raise _Reject(f"{key}: {len(v)} hosts (at most {MAX_HOSTS})")
    try:
        seen_key = tuple(v)
        if seen_key in _hosts_seen:
            return
    except TypeError:          # an unhashable entry: not a host name, reported below
        seen_key = None
    for i, h in enumerate(v):
        _HOST_NAME(f"{key}[{i}]", h)
    if seen_key is not None and len(seen_key) <= 4096:
        if len(_hosts_seen) >= 256:
            _hosts_seen.clear()
        _hosts_seen[seen_key] = True


def _event_name(key, v):
    if not isinstance(v, str) or not _EVENT_NAME.fullmatch(v):
        raise _Reject(f"{key}: expected an event name ([a-z][a-z0-9_]*, up to 64), got {_what(v)}")


_OP = _choice(*ALL_OPS)   # imported ops (sendrecv, ...) are records too
_ID = _string(256)
_COUNT = _integer(0)
# any finite value >= 0 (docs/LOG_FORMAT.md): a latency of 1e308 is a (hopeless) measurement, not a bad line
_LATENCY = _number(0.0, sys.float_info.max)
_BANDWIDTH = _nullable(_number(0.0, sys.float_info.max))
_UNIX = _number(0.0, MAX_TS)

# What every reader needs of every record, and what it may use when present.
COMMON = {"schema": _integer(SCHEMA_VERSION, SCHEMA_VERSION), "type": _choice(*RECORD_TYPES), "ts": _UNIX}
COMMON_OPTIONAL = {"time": _time, "seq": _integer(1, MAX_SEQ)}
RUN = {"run_id": _ID, "hosts": _hosts, "nodes": _integer(1), "ranks": _integer(1),
       "engine": _string(64), "mpi": _string(1024), "transport": _string(64),
       "launcher": _string(64), "slurm_job_id": _string(32)}   # the last two: later, optional

# type -> (required fields, optional fields): docs/LOG_FORMAT.md. Required is only what the
# readers need to use a record at all (a result: which op, size and setup, and its time; an
# event: its name); every other documented field is checked when present and absent otherwise,
# so a log from before a field existed, or from a writer that leaves one out, stays readable.
SHAPES = {
    "result": ({**COMMON, "op": _OP, "size_bytes": _COUNT, "latency_avg_us": _LATENCY,
                "ranks": RUN["ranks"], "nodes": RUN["nodes"]},
               {**COMMON_OPTIONAL, **{k: v for k, v in RUN.items() if k not in ("ranks", "nodes")},
                "datatype": _choice(*DATATYPES), "size": _string(32),
                "latency_min_us": _nullable(_LATENCY), "latency_max_us": _nullable(_LATENCY),   # OSU without -f: null
                "iterations": _COUNT, "warmup": _COUNT,
                "algbw_bytes_per_s": _BANDWIDTH, "busbw_bytes_per_s": _BANDWIDTH,
                "validation": _choice("pass", "fail", "off"),
                "straggler_rank": _nullable(_COUNT),
                "verdict": _nullable(_choice("Good", "Warning", "Critical")),
                "status": _choice("ok"),
                "iteration": _integer(1), "t_start": _UNIX, "t_end": _UNIX,
                # set only by runs that use them (records.OPTIONAL_RESULT_FIELDS)
                "algorithm": _string(128), "inplace": _boolean, "root": _COUNT,
                "timing": _choice("osu", "sustained"),
                "latency_p50_us": _LATENCY, "latency_p90_us": _LATENCY, "latency_p99_us": _LATENCY,
                "latency_pmax_us": _LATENCY}),
    # topo compare's `order` and `pattern` are labels: readers that use them check them themselves
    # (collbench/report drops a bad one and counts it, keeping the measurement)
    "failure": ({**COMMON},
                {**COMMON_OPTIONAL, **RUN,
                 "status": _choice("failed"), "error": _string(65536, line=False),
                 "stderr_tail": _string(262144, line=False), "op": _nullable(_OP),
                 "size_bytes": _nullable(_COUNT), "exit_code": _nullable(_integer(-(1 << 31), 1 << 31)),
                 "iteration": _integer(1)}),
    "event": ({**COMMON, "event": _event_name},
              {**COMMON_OPTIONAL, "pid": _nullable(_integer(1)), "detail": _nullable(_string(65536, line=False)),
               "run_id": _nullable(_ID),
               # per-event fields (start, backoff, relaunch, stop); other events may add their own
               "mode": _string(64), "steps": _COUNT, "config": _string(4096),
               "delay_s": _number(0.0), "failures": _COUNT, "attempt": _COUNT,
               "iterations": _COUNT, "records": _COUNT}),
}


def _congestion(key, v):
    """The step's congestion counters: the field's one validator (collbench/congestion)."""
    from collbench.congestion.record_field import validate
    try:
        validate(v, key)
    except ValueError as e:
        raise _Reject(str(e)) from None


# results and failures may carry the congestion counters of their step (docs/LOG_FORMAT.md)
SHAPES["result"][1]["congestion"] = SHAPES["failure"][1]["congestion"] = _congestion


def _validate(rec):
    t = rec.get("type")
    if not isinstance(t, str) or t not in SHAPES:
        raise _Reject(f"type: expected one of {', '.join(RECORD_TYPES)}, got {_what(t)}")
    schema = rec.get("schema")
    if schema != SCHEMA_VERSION or isinstance(schema, bool):
        raise _Reject(f"schema: expected {SCHEMA_VERSION}, got {_what(schema)}")
    required, optional = SHAPES[t]
    for key, check in required.items():
        if key not in rec:
            raise _Reject(f"{key}: missing from a {t} record")
        check(key, rec[key])
    for key, check in optional.items():
        if key in rec:
            check(key, rec[key])
    if t == "result":
        op = ALL_OPS[rec["op"]]
        want = format_size(rec["size_bytes"]) if op.has_size else "-"
        if not op.has_size and rec["size_bytes"] != 0:
            raise _Reject(f"size_bytes: expected 0 for {op.name}, got {rec['size_bytes']}")
        if "size" in rec and rec["size"] != want:
            raise _Reject(f"size: expected {want!r} for size_bytes {rec['size_bytes']}, got {_what(rec['size'])}")
