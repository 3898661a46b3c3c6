"""Read JSONL results files (`once --results`, the stress daemon's results.jsonl and its
rotations, sweep/compare output) as untrusted input, for the report and for baselines.

Every line is a stranger's: any type in any field, any size, any nesting. A line that is not a
usable record is counted with its reason (per file, with the first examples' line numbers) and
skipped; nothing in a file can crash the reader or make it hold more than one line (1 MB at
most) in memory at a time. Records are streamed to the caller, who aggregates: a stress log of
a million records never sits in memory as dicts.

The record check is one function, `check_record`, chosen in one line below.
"""

import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field

from collbench.errors import UserError
from collbench.ops import get_op

MAX_LINE_BYTES = 1 << 20     # a record is well under 4 KB; a longer line is not one
MAX_EXAMPLES = 20            # bad lines remembered per file (line number + reason)
_LABEL_CHARS = 200           # label-like strings (run id, host, transport) are cut here
_TEXT_CHARS = 2000           # error messages
_TAIL_CHARS = 8000           # stderr tails
_MAX_HOSTS = 100_000


class BadRecord(ValueError):
    """A line that is not a usable record; the message says which field and why."""


# ------------------------------------------------------------------ field checks

def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _label(v, key, limit=_LABEL_CHARS):
    if isinstance(v, str):
        return v[:limit]
    raise BadRecord(f"{key}: expected a string, got {_kind(v)}")


def _kind(v):
    """A short, safe description of a bad value (never the whole value: it may be huge)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean {v}".lower()
    if isinstance(v, (int, float)):
        text = repr(v)
        return f"number {text[:30]}"
    if isinstance(v, str):
        return f"string {v[:30]!r}" + ("..." if len(v) > 30 else "")
    if isinstance(v, list):
        return f"a list of {len(v)}"
    if isinstance(v, dict):
        return f"an object of {len(v)} keys"
    return type(v).__name__


def _positive(v, key):
    if not _is_num(v) or v <= 0:
        raise BadRecord(f"{key}: expected a number > 0, got {_kind(v)}")
    return float(v)


def _nonneg(v, key):
    if not _is_num(v) or v < 0:
        raise BadRecord(f"{key}: expected a number >= 0, got {_kind(v)}")
    return float(v)


def _count(v, key, minimum=0):
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum or v > 1 << 62:
        raise BadRecord(f"{key}: expected a whole number >= {minimum}, got {_kind(v)}")
    return v


def _signed_int(v, key):
    if isinstance(v, bool) or not isinstance(v, int) or abs(v) > 1 << 31:
        raise BadRecord(f"{key}: expected a whole number, got {_kind(v)}")
    return v


_HOSTS_CACHE = {}


def _hosts(v, key="hosts"):
    if not isinstance(v, list) or not v or len(v) > _MAX_HOSTS or not all(isinstance(h, str) for h in v):
        raise BadRecord(f"{key}: expected a non-empty list of host names, got {_kind(v)}")
    t = tuple(h[:_LABEL_CHARS] for h in v)
    # the same host list repeats in every record of a run: keep one copy
    return _HOSTS_CACHE.setdefault(t, t) if len(_HOSTS_CACHE) < 10_000 else t


def _order(v, key="order"):
    """A rank order (topo compare): a name, or a list of ranks/hosts; kept as a short label."""
    if isinstance(v, str):
        return v[:_LABEL_CHARS]
    if _is_num(v):
        return str(v)
    if isinstance(v, list) and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v):
        text = ",".join(str(x) for x in v)
        return text if len(text) <= _LABEL_CHARS else text[:_LABEL_CHARS - 3] + "..."
    raise BadRecord(f"{key}: expected a name or a list of ranks, got {_kind(v)}")


def _algorithm(v, key="algorithm"):
    if isinstance(v, str):
        return v[:_LABEL_CHARS]
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    raise BadRecord(f"{key}: expected an algorithm name, got {_kind(v)}")


# Optional fields: (key, checker). A bad value drops the field and is counted, the record stays.
_RUN_FIELDS = (
    ("run_id", _label), ("hosts", _hosts), ("nodes", lambda v, k: _count(v, k, 1)),
    ("engine", _label), ("mpi", _label), ("transport", _label),
    ("algorithm", _algorithm), ("order", _order), ("pattern", _label),
    ("time", _label), ("seq", _count), ("iteration", _count),
)
_RESULT_FIELDS = _RUN_FIELDS + (
    ("datatype", _label), ("size", _label),
    ("latency_min_us", _nonneg), ("latency_max_us", _nonneg),
    ("latency_p50_us", _nonneg), ("latency_p90_us", _nonneg), ("latency_p99_us", _nonneg),
    ("iterations", _count), ("warmup", _count),
    ("algbw_bytes_per_s", _nonneg), ("busbw_bytes_per_s", _nonneg),
    ("validation", _label), ("straggler_rank", _count), ("verdict", _label),
)
_FAILURE_FIELDS = _RUN_FIELDS + (
    ("error", lambda v, k: _label(v, k, _TEXT_CHARS)),
    ("stderr_tail", lambda v, k: _label(v, k, _TAIL_CHARS)),
    ("size_bytes", _count), ("exit_code", _signed_int),
)
_EVENT_FIELDS = (("run_id", _label), ("event", _label), ("detail", lambda v, k: _label(v, k, _TEXT_CHARS)))


def _optional(obj, out, fields, problems):
    for key, check in fields:
        v = obj.get(key)
        if v is None:
            continue
        try:
            out[key] = check(v, key)
        except BadRecord as e:
            problems.append(str(e))


def _op_name(v):
    try:
        return get_op(v).name if isinstance(v, str) else None
    except KeyError:
        return None


def _check_record(obj):
    """(record, field problems) from one parsed JSON value; BadRecord when it is not usable.

    The record is a new dict holding only checked fields with the types LOG_FORMAT.md gives
    (`hosts` a tuple). Fatal: not an object, an unknown `type`, a result without a known op,
    size, positive latency or rank count. A bad optional field is dropped and named in problems.
    Records of other types (`event`, future ones) are returned with `type` only, for counting.
    """
    if not isinstance(obj, dict):
        raise BadRecord(f"not a JSON object but {_kind(obj)}")
    rtype = obj.get("type")
    if not isinstance(rtype, str):
        raise BadRecord(f"type: expected a string, got {_kind(rtype)}")
    problems = []
    out = {"type": rtype[:40]}
    ts = obj.get("ts")
    if ts is not None:
        if _is_num(ts) and ts >= 0:
            out["ts"] = float(ts)
        else:
            problems.append(f"ts: expected Unix seconds, got {_kind(ts)}")
    if rtype == "result":
        op = _op_name(obj.get("op"))
        if op is None:
            raise BadRecord(f"op: expected a known op, got {_kind(obj.get('op'))}")
        out["op"] = op
        out["size_bytes"] = _count(obj.get("size_bytes"), "size_bytes")
        out["latency_avg_us"] = _positive(obj.get("latency_avg_us"), "latency_avg_us")
        out["ranks"] = _count(obj.get("ranks"), "ranks", 1)
        _optional(obj, out, _RESULT_FIELDS, problems)
    elif rtype == "failure":
        op = obj.get("op")
        if op is not None:
            name = _op_name(op)
            if name is None:
                problems.append(f"op: expected a known op or null, got {_kind(op)}")
            else:
                out["op"] = name
        ranks = obj.get("ranks")
        if ranks is not None:
            try:
                out["ranks"] = _count(ranks, "ranks", 1)
            except BadRecord as e:
                problems.append(str(e))
        _optional(obj, out, _FAILURE_FIELDS, problems)
    elif rtype == "event":
        _optional(obj, out, _EVENT_FIELDS, problems)
    return out, problems


# The one place the record check is chosen: when the shared check (collbench/record_parser.py)
# lands, this becomes `from collbench.record_parser import <its check> as check_record` (or a
# two-line adapter to the (record, problems) / BadRecord contract above).
check_record = _check_record


# ------------------------------------------------------------------ reading files

def _reject_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def parse_line(line):
    """One line (bytes, newline stripped) -> the parsed JSON value; BadRecord if not JSON."""
    if not line.strip():
        raise BadRecord("blank line")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRecord("not UTF-8") from None
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise BadRecord("not JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, NaN/Infinity, an integer too long to convert
        raise BadRecord(f"not JSON: {str(e)[:80]}") from None


@dataclass
class FileStats:
    """What one input file held: how many lines, of which kind, and why some were skipped."""
    path: str
    lines: int = 0
    records: Counter = field(default_factory=Counter)    # type -> usable records
    bad: int = 0                                          # lines skipped
    reasons: Counter = field(default_factory=Counter)     # reason -> lines
    examples: list = field(default_factory=list)          # (line number, reason), first few
    field_problems: int = 0                               # records kept with a field dropped
    field_reasons: Counter = field(default_factory=Counter)
    filtered: int = 0                                     # usable but outside --since
    incomplete_tail: bool = False                         # last line without its newline

    def bad_line(self, lineno, reason):
        self.bad += 1
        self.reasons[_reason_class(reason)] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append((lineno, reason))

    def as_dict(self):
        return {"path": self.path, "lines": self.lines, "records": dict(self.records), "bad_lines": self.bad,
                "bad_reasons": dict(self.reasons.most_common()),
                "examples": [{"line": n, "reason": r} for n, r in self.examples],
                "field_problems": self.field_problems, "field_reasons": dict(self.field_reasons.most_common()),
                "filtered": self.filtered, "incomplete_tail": self.incomplete_tail}


_NUM_RE = re.compile(r"(?<![A-Za-z])\d+")


def _reason_class(reason):
    """Group reasons that differ only in values ("column 17" / "column 18"): the counts stay few."""
    head = reason.split(", got ")[0]
    return _NUM_RE.sub("N", head)[:120]


def expand_inputs(paths, flag="RESULTS"):
    """The files to read: each path as given, a directory as its results.jsonl and rotations
    (.1, .2 ... newest first). The same file named twice (or via a link) is read once.
    UserError (exit 2) for a path that does not exist or is not readable."""
    out, seen = [], set()
    for p in paths:
        if os.path.isdir(p):
            names = sorted((n for n in os.listdir(p) if re.fullmatch(r"results\.jsonl(\.\d+)?", n)),
                           key=lambda n: int(n.rsplit(".", 1)[1]) if n[-1].isdigit() else 0)
            if not names:
                raise UserError(f"{flag} {p}: directory has no results.jsonl (expected a results file "
                                "or a stress state directory)")
            files = [os.path.join(p, n) for n in names]
        elif os.path.exists(p):
            files = [p]
        else:
            raise UserError(f"{flag} {p}: no such file")
        for f in files:
            try:
                st = os.stat(f)
            except OSError as e:
                raise UserError(f"{flag} {f}: cannot read: {e.strerror}") from None
            if not os.path.isfile(f):
                raise UserError(f"{flag} {f}: not a regular file")
            if not os.access(f, os.R_OK):
                raise UserError(f"{flag} {f}: not readable")
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            out.append(f)
    return out


def read_file(path, stats, since=None):
    """Yield the usable records of one file (see check_record); stats counts everything else.

    since: keep only records with ts >= since (others are counted in stats.filtered).
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    with f:
        lineno = 0
        while True:
            try:
                line = f.readline(MAX_LINE_BYTES + 1)
            except OSError as e:
                stats.bad_line(lineno + 1, f"read error: {e.strerror}")
                return
            if not line:
                return
            lineno += 1
            stats.lines += 1
            if not line.endswith(b"\n"):
                if len(line) > MAX_LINE_BYTES:
                    while True:   # skip the rest of an oversized line without holding it
                        rest = f.readline(MAX_LINE_BYTES)
                        if not rest or rest.endswith(b"\n"):
                            break
                    stats.bad_line(lineno, f"line longer than {MAX_LINE_BYTES} bytes")
                    continue
                # the last line without its newline is still being written (LOG_FORMAT.md)
                stats.incomplete_tail = True
                stats.bad_line(lineno, "incomplete last line (still being written?)")
                return
            try:
                rec, problems = check_record(parse_line(line[:-1]))
            except BadRecord as e:
                stats.bad_line(lineno, str(e))
                continue
            if problems:
                stats.field_problems += 1
                for p in problems:
                    stats.field_reasons[_reason_class(p)] += 1
                if len(stats.examples) < MAX_EXAMPLES:
                    stats.examples.append((lineno, "field dropped: " + "; ".join(problems)[:200]))
            if since is not None and rec.get("ts", -1.0) < since:
                stats.filtered += 1
                continue
            stats.records[rec["type"]] += 1
            rec["_file"] = path
            yield rec


class ResultsInput:
    """Several input files read in turn; `stats` has one FileStats per file, in order."""

    def __init__(self, paths, since=None, flag="RESULTS"):
        self.paths = expand_inputs(paths, flag)
        self.since = since
        self.stats = []

    def __iter__(self):
        for path in self.paths:
            stats = FileStats(path)
            self.stats.append(stats)
            yield from read_file(path, stats, self.since)

    @property
    def bad_lines(self):
        return sum(s.bad for s in self.stats)

    def summary_line(self):
        """One line for stderr: files, records, skipped lines."""
        lines = sum(s.lines for s in self.stats)
        recs = sum(sum(s.records.values()) for s in self.stats)
        text = f"read {len(self.stats)} file(s), {lines} line(s), {recs} record(s)"
        if self.bad_lines:
            text += f", {self.bad_lines} bad line(s) skipped"
        fields = sum(s.field_problems for s in self.stats)
        if fields:
            text += f", {fields} record(s) with a bad field dropped"
        filtered = sum(s.filtered for s in self.stats)
        if filtered:
            text += f", {filtered} older than --since"
        return text


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_DURATION_MULT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(value, now):
    """--since: a duration back from now (30m, 2h, 7d) or an RFC 3339 / ISO time -> Unix seconds."""
    from datetime import datetime, timezone
    m = _DURATION_RE.match(value)
    if m:
        return now - float(m.group(1)) * _DURATION_MULT[m.group(2)]
    try:
        dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"--since {value!r}: expected a duration (30m, 2h, 7d) or a time "
                        "(2026-11-22T15:00:00Z)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
