"""Read JSONL results files (`once --results`, the stress daemon's results.jsonl and its
rotations, sweep/compare output) as untrusted input, for the report and for baselines.

Every line is a stranger's: any type in any field, any size, any nesting. A line that is not a
usable record is counted with its reason (per file, with the first examples' line numbers) and
skipped; nothing in a file can crash the reader or make it hold more than one line (1 MB at
most) in memory at a time. Records are streamed to the caller, who aggregates: a stress log of
a million records never sits in memory as dicts.

Validation is the project's one record check, `collbench.results.record_parser.parse_record`;
`slim_record` makes host lists hashable and checks the fields topo compare adds, which that
parser passes through unchecked.
"""

import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field

from collbench.bounded_repr import bounded_repr, shown_path
from collbench.errors import UserError
from collbench.results.lines import LineSplitter
from collbench.results.record_parser import ParseError, is_record, parse_record

MAX_EXAMPLES = 20            # bad lines remembered per file (line number + reason)
_LABEL_CHARS = 200           # extra label fields (algorithm, order) are cut here


class BadRecord(ValueError):
    """A line that is not a usable record; the message says which field and why."""


# ------------------------------------------------------------------ record check

def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _kind(v):
    """A short, safe description of a bad value (never the whole value: it may be huge)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean {v}".lower()
    if isinstance(v, (int, float)):
        return f"number {repr(v)[:30]}"
    if isinstance(v, str):
        return f"string {v[:30]!r}" + ("..." if len(v) > 30 else "")
    if isinstance(v, list):
        return f"a list of {len(v)}"
    if isinstance(v, dict):
        return f"an object of {len(v)} keys"
    return type(v).__name__


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _label(v, key):
    if isinstance(v, str) and v and not _CONTROL.search(v):
        return v[:_LABEL_CHARS]
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    raise BadRecord(f"{key}: expected a name, got {_kind(v)}")


def _order(v, key):
    """A rank order (topo compare): a name, or a list of ranks/hosts; kept as a short label."""
    if isinstance(v, list) and v and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v):
        text = ",".join(str(x) for x in v)
        if _CONTROL.search(text):
            raise BadRecord(f"{key}: control character in a rank order")
        return text if len(text) <= _LABEL_CHARS else text[:_LABEL_CHARS - 3] + "..."
    return _label(v, key)


# Fields the shared parser does not know yet (it passes unknown fields through unchecked) but the
# report reads: topo compare's rank order and pattern. A bad one is dropped and counted; the
# record stays. (algorithm, timing, inplace, root and the sweep percentiles are documented
# optional fields: the shared parser checks them.)
EXTRA_FIELDS = (("order", _order), ("pattern", _label))
_HOSTS_CACHE = {}


def slim_record(rec):
    """(record, problems) from a record the shared parser validated, changed in place: `hosts`
    a tuple (one shared copy per distinct list: it keys the report's series), the extra fields
    checked (a bad one removed and named in problems). A result with a zero latency has no
    place on a log scale: BadRecord."""
    t = rec["type"]
    if t == "result" and not rec["latency_avg_us"] > 0:
        raise BadRecord("latency_avg_us: 0 (no time measured)")
    problems = []
    if t != "event":
        if "hosts" in rec:      # absent in a log from a writer that leaves it out
            h = tuple(rec["hosts"])
            rec["hosts"] = _HOSTS_CACHE.setdefault(h, h) if len(_HOSTS_CACHE) < 10_000 else h
        for key, check in EXTRA_FIELDS:
            v = rec.get(key)
            if v is not None:
                try:
                    rec[key] = check(v, key)
                except BadRecord as e:
                    del rec[key]
                    problems.append(str(e))
    return rec, problems


def check_line(line):
    """(record, problems) of one line; BadRecord with the reason when it is not a record.
    Validation is the shared one (collbench.results.record_parser); the slimming and extras are ours."""
    rec = parse_record(line)
    if not is_record(rec):
        raise BadRecord(rec.reason)
    return slim_record(rec)


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

    def merge(self, other):
        """Add the counts of another part of the same file (parallel reading)."""
        self.lines += other.lines
        self.records.update(other.records)
        self.bad += other.bad
        self.reasons.update(other.reasons)
        self.examples = sorted(self.examples + other.examples)[:MAX_EXAMPLES]
        self.field_problems += other.field_problems
        self.field_reasons.update(other.field_reasons)
        self.filtered += other.filtered
        self.incomplete_tail = self.incomplete_tail or other.incomplete_tail

    def as_dict(self):
        return {"path": self.path, "lines": self.lines, "records": dict(self.records), "bad_lines": self.bad,
                "bad_reasons": dict(self.reasons.most_common()),
                "examples": [{"line": n, "reason": r} for n, r in self.examples],
                "field_problems": self.field_problems, "field_reasons": dict(self.field_reasons.most_common()),
                "filtered": self.filtered, "incomplete_tail": self.incomplete_tail}


_NUM_RE = re.compile(r"(?<![\w-])\d+(?:\.\d+)?")


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
                raise UserError(f"{flag} {shown_path(p)}: directory has no results.jsonl (expected a results file "
                                "or a stress state directory)")
            files = [os.path.join(p, n) for n in names]
        elif os.path.exists(p):
            files = [p]
        else:
            raise UserError(f"{flag} {shown_path(p)}: no such file")
        for f in files:
            try:
                st = os.stat(f)
            except OSError as e:
                raise UserError(f"{flag} {shown_path(f)}: cannot read: {e.strerror}") from None
            if not os.path.isfile(f):
                raise UserError(f"{flag} {shown_path(f)}: not a regular file")
            if not os.access(f, os.R_OK):
                raise UserError(f"{flag} {shown_path(f)}: not readable")
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            out.append(f)
    return out


def read_file(path, stats, since=None, start=0, end=None, first_lineno=1):
    """Yield the usable records of one file (see check_line); stats counts everything else.

    since: keep only records with ts >= since (others are counted in stats.filtered).
    start, end: a byte range whose start is a line start (parallel reading); a line that starts
    before `end` is read whole. first_lineno: the line number at `start`.
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UserError(f"{shown_path(path)}: cannot read: {e.strerror}") from None
    with f:
        if start:
            f.seek(start)
        splitter = LineSplitter(start)
        lineno = first_lineno - 1
        while True:
            try:
                data = f.read(_CHUNK)
            except OSError as e:
                stats.bad_line(lineno + 1, f"read error: {e.strerror}")
                return
            if not data:
                break
            for offset, line in splitter.feed(data):
                if end is not None and offset >= end:
                    return
                lineno += 1
                stats.lines += 1
                if isinstance(line, ParseError):      # over-long: its bytes were never held
                    stats.bad_line(lineno, line.reason)
                    continue
                got = _usable(path, line, lineno, stats, since)
                if got is not None:
                    yield got
            if end is not None and splitter.offset >= end and (not splitter.pending or splitter.pending_offset >= end):
                return
        if splitter.pending and (end is None or splitter.pending_offset < end):
            # the last line without its newline is still being written (LOG_FORMAT.md)
            stats.lines += 1
            stats.incomplete_tail = True
            stats.bad_line(lineno + 1, "incomplete last line (still being written?)")


def _usable(path, line, lineno, stats, since):
    """The record of one complete line if it is usable and within --since; stats counts the rest."""
    try:
        rec, problems = check_line(line)
    except BadRecord as e:
        stats.bad_line(lineno, str(e))
        return None
    if problems:
        stats.field_problems += 1
        for p in problems:
            stats.field_reasons[_reason_class(p)] += 1
        if len(stats.examples) < MAX_EXAMPLES:
            stats.examples.append((lineno, "field dropped: " + "; ".join(problems)[:200]))
    if since is not None and rec.get("ts", -1.0) < since:
        stats.filtered += 1
        return None
    stats.records[rec["type"]] += 1
    rec["_file"] = path
    return rec


# Parallel reading: the shared record check costs ~30 us a line, so a 100,000-record log is CPU
# bound; byte ranges of the files go to one process per core. Below this size a process pool
# costs more than it saves.
PARALLEL_MIN_BYTES = 4 << 20
_CHUNK = 1 << 20


def _align(f, offset, size):
    """The first line start at or after offset."""
    if offset <= 0:
        return 0
    f.seek(offset - 1)
    if f.read(1) == b"\n":
        return offset
    pos = offset
    while pos < size:
        chunk = f.read(_CHUNK)
        if not chunk:
            break
        i = chunk.find(b"\n")
        if i >= 0:
            return pos + i + 1
        pos += len(chunk)
    return size


def _ranges(path, parts):
    """[(start, end, first line number)] splitting a file into about `parts` ranges at line starts."""
    size = os.path.getsize(path)
    if parts <= 1 or size < 2 * _CHUNK:
        return [(0, None, 1)]
    with open(path, "rb") as f:
        cuts = sorted({_align(f, size * k // parts, size) for k in range(1, parts)} - {0, size})
        bounds = [0] + cuts + [None]
        out, lineno, pos = [], 1, 0
        f.seek(0)
        for a, b in zip(bounds, bounds[1:]):
            while pos < a:   # count the lines before this range's start
                chunk = f.read(min(_CHUNK, a - pos))
                if not chunk:
                    break
                lineno += chunk.count(b"\n")
                pos += len(chunk)
            out.append((a, b, lineno))
    return out


def _read_part(path, start, end, first_lineno, since, make_consumer):
    consumer, stats = make_consumer(), FileStats(path)
    for rec in read_file(path, stats, since, start, end, first_lineno):
        consumer.add(rec)
    return consumer, stats


class ResultsInput:
    """Several input files; `stats` has one FileStats per file, in order, once read."""

    def __init__(self, paths, since=None, flag="RESULTS"):
        self.paths = expand_inputs(paths, flag)
        self.since = since
        self.stats = []

    def __iter__(self):
        for path in self.paths:
            stats = FileStats(path)
            self.stats.append(stats)
            yield from read_file(path, stats, self.since)

    def consume(self, make_consumer, workers=None, min_bytes=PARALLEL_MIN_BYTES):
        """Read everything into make_consumer() objects (with add(record) and merge(other)) and
        return one, merged. Inputs of min_bytes or more are read by a process per core (or
        `workers`) over byte ranges."""
        workers = workers or os.cpu_count() or 1
        total = sum(os.path.getsize(p) for p in self.paths)
        if workers < 2 or total < min_bytes:
            consumer = make_consumer()
            for rec in self:
                consumer.add(rec)
            return consumer
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        parts = []
        for path in self.paths:
            share = max(1, round(2 * workers * os.path.getsize(path) / total))
            parts += [(path, a, b, n) for a, b, n in _ranges(path, share)]
        with ProcessPoolExecutor(max_workers=min(workers, len(parts)),
                                 mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(_read_part, path, a, b, n, self.since, make_consumer)
                       for path, a, b, n in parts]
            results = [f.result() for f in futures]
        merged = make_consumer()
        by_path = {p: FileStats(p) for p in self.paths}
        for consumer, stats in results:
            merged.merge(consumer)
            by_path[stats.path].merge(stats)
        self.stats = [by_path[p] for p in self.paths]
        return merged

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


# ASCII digits only (\\d takes '٣'), a bounded count of them (float('9' * 10**6) is slow)
_DURATION_RE = re.compile(r"^\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*(s|m|h|d|w)\s*$")
_DURATION_MULT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(value, now):
    """--since: a duration back from now (30m, 2h, 7d) or an RFC 3339 / ISO time -> Unix seconds.
    UserError (exit 2) for anything else, an empty value, or a duration reaching before 1970."""
    from datetime import datetime, timezone
    expected = "expected a duration (30m, 2h, 7d) or a time (2026-11-22T15:00:00Z)"
    m = _DURATION_RE.match(value)
    if m:
        since = now - float(m.group(1)) * _DURATION_MULT[m.group(2)]
        if not since >= 0:
            raise UserError(f"--since {bounded_repr(value)}: reaches back before 1970 ({expected}, at most "
                            f"{int(now // 86400)}d)")
        return since
    try:
        if len(value) > 64:
            raise ValueError(value)
        dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return dt.timestamp()
    except (ValueError, OverflowError, OSError):
        raise UserError(f"--since {bounded_repr(value)}: {expected}") from None
