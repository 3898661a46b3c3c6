"""What the exporter knows from the results log: the latest value of each series, and counters.

Memory is bounded by the number of distinct series (op, size, nodes, ranks), never by the log:
each record replaces the previous value of its series. Series whose result is older than
`max_age` are dropped when read, so a stopped stress test makes its latencies disappear
instead of turning into zeros (0 would read as a perfect network).

Counters (records, failures, parse errors) count what was read since the exporter started;
the start-up backfill only recovers latest values and does not count.
"""

import json
import logging
import math
import re
import threading
import time
from dataclasses import dataclass

from collbench.ops import OPS

log = logging.getLogger("collbench.exporter")

RECORD_TYPES = ("result", "failure", "event")
NO_OP = "none"   # failures[op] for a failure not tied to one op (the whole MPI job)


# type, ts, op, size_bytes, nodes, ranks as the JSON text has them (backfill fast path only)
_QUICK = [re.compile(rb'"%s":\s*%s' % (k, v)) for k, v in (
    (b"type", rb'"(\w+)"'), (b"ts", rb"([0-9.eE+-]+)"), (b"op", rb'"(\w+)"'),
    (b"size_bytes", rb"(\d+)"), (b"nodes", rb"(\d+)"), (b"ranks", rb"(\d+)"))]


class BadRecord(ValueError):
    """A line that is not a valid results record."""


@dataclass
class Series:
    op: str
    size: str
    size_bytes: int
    nodes: int
    ranks: int
    avg_s: float
    min_s: float
    max_s: float
    algbw: float     # bytes/s, None when the op has no bandwidth (barrier)
    busbw: float
    ts: float        # when it was measured (record `ts`)

    @property
    def key(self):
        return (self.op, self.size_bytes, self.nodes, self.ranks)


def _num(rec, key, required=True):
    v = rec.get(key)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadRecord(f"{key}: expected a finite number, got {v!r}")
    return v


def _int(rec, key):
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadRecord(f"{key}: expected a whole number >= 0, got {v!r}")
    return v


def parse_record(line):
    """The record dict of one log line; BadRecord when it is not one."""
    try:
        rec = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRecord(f"not JSON: {e}") from None
    if not isinstance(rec, dict):
        raise BadRecord("not a JSON object")
    if rec.get("type") not in RECORD_TYPES:
        raise BadRecord(f"type: expected one of {', '.join(RECORD_TYPES)}, got {rec.get('type')!r}")
    _num(rec, "ts")
    return rec


def series_from_record(rec):
    """A Series from a result record; BadRecord when a field is missing or wrong."""
    op = rec.get("op")
    if op not in OPS:
        raise BadRecord(f"op: expected one of {', '.join(OPS)}, got {op!r}")
    size = rec.get("size")
    if not isinstance(size, str) or not size:
        raise BadRecord(f"size: expected a size label, got {size!r}")
    avg = _num(rec, "latency_avg_us")
    return Series(
        op=op, size=size, size_bytes=_int(rec, "size_bytes"),
        nodes=_int(rec, "nodes"), ranks=_int(rec, "ranks"),
        avg_s=avg / 1e6,
        min_s=_num(rec, "latency_min_us", required=False) / 1e6
        if rec.get("latency_min_us") is not None else avg / 1e6,
        max_s=_num(rec, "latency_max_us", required=False) / 1e6
        if rec.get("latency_max_us") is not None else avg / 1e6,
        algbw=_num(rec, "algbw_bytes_per_s", required=False),
        busbw=_num(rec, "busbw_bytes_per_s", required=False),
        ts=_num(rec, "ts"))


def _success(rec):
    """Did this result/failure record end well? (a result that failed validation did not)"""
    return rec["type"] == "result" and rec.get("status", "ok") == "ok" and rec.get("validation") != "fail"


class ResultsState:
    """Thread-safe: the poller writes, scrapes read."""

    def __init__(self, max_age, clock=time.time):
        self.max_age = max_age
        self.clock = clock
        self._lock = threading.Lock()
        self._series = {}
        self.failures = {name: 0 for name in OPS}
        self.failures[NO_OP] = 0
        self.records = {t: 0 for t in RECORD_TYPES}
        self.parse_errors = 0
        self.last_update = None      # ts of the newest result
        self.last_success = None     # (ok, ts) of the newest result or failure
        self.last_iteration = None   # `iteration` of the newest record that has one
        self._logged_bad = 0

    # -------------------------------------------------------------- writing

    def bad_line(self, reason):
        with self._lock:
            self.parse_errors += 1
            self._log_bad(reason)

    def _log_bad(self, reason):
        # The first few are worth a line each; a flood of garbage must not flood the journal.
        self._logged_bad += 1
        if self._logged_bad <= 5:
            log.warning("results log: skipped a bad line (%s)%s", reason,
                        "; further bad lines are only counted" if self._logged_bad == 5 else "")

    def ingest(self, line):
        """One line appended to the log since the exporter started."""
        try:
            rec = parse_record(line)
            ser = series_from_record(rec) if rec["type"] == "result" else None
        except BadRecord as e:
            self.bad_line(str(e))
            return
        with self._lock:
            self.records[rec["type"]] += 1
            if rec["type"] == "failure":
                op = rec.get("op")
                op = op if op in OPS else NO_OP
                self.failures[op] += 1
            self._apply(rec, ser, newest_first=False)

    def backfill(self, lines, now=None):
        """Recover latest values from lines given newest first (the end of the log, read
        backwards). Stops once records are older than max_age and the status is known.
        Returns the number of records used."""
        now = self.clock() if now is None else now
        horizon = now - self.max_age
        used = 0
        with self._lock:
            for line in lines:
                if self._skippable(line, horizon):
                    continue
                try:
                    rec = parse_record(line)
                    ser = series_from_record(rec) if rec["type"] == "result" else None
                except BadRecord:
                    continue
                if rec["ts"] < horizon and self.last_update is not None and self.last_success is not None:
                    break
                used += 1
                self._apply(rec, ser, newest_first=True)
        return used

    def _skippable(self, line, horizon):
        """Backfill fast path: a recent result of a series already filled, once the status is
        known, cannot change anything; tell so from a few fields without parsing the JSON."""
        if self.last_update is None or self.last_success is None:
            return False
        if self.last_iteration is None and b'"iteration"' in line:
            return False
        fields = [rx.search(line) for rx in _QUICK]
        if not all(fields) or fields[0].group(1) != b"result":
            return False
        try:
            ts = float(fields[1].group(1))
            key = (fields[2].group(1).decode(), int(fields[3].group(1)), int(fields[4].group(1)),
                   int(fields[5].group(1)))
        except ValueError:
            return False
        return ts >= horizon and key in self._series

    def _apply(self, rec, ser, newest_first):
        """Record `rec` in the state. Tailing sees records oldest first and always overwrites;
        the backfill sees them newest first and only fills what is still unknown."""
        if ser is not None:
            if not (newest_first and ser.key in self._series):
                self._series[ser.key] = ser
            if not (newest_first and self.last_update is not None):
                self.last_update = ser.ts
        if rec["type"] in ("result", "failure") and not (newest_first and self.last_success is not None):
            self.last_success = (_success(rec), rec["ts"])
        it = rec.get("iteration")
        if isinstance(it, int) and not isinstance(it, bool) and not (newest_first and self.last_iteration is not None):
            self.last_iteration = it

    # -------------------------------------------------------------- reading

    def fresh_series(self, now=None):
        """The series measured within max_age, dropping the others from memory."""
        now = self.clock() if now is None else now
        horizon = now - self.max_age
        with self._lock:
            stale = [k for k, s in self._series.items() if s.ts < horizon]
            for k in stale:
                del self._series[k]
            return list(self._series.values())

    def snapshot(self):
        with self._lock:
            return {
                "failures": dict(self.failures),
                "records": dict(self.records),
                "parse_errors": self.parse_errors,
                "last_update": self.last_update,
                "last_success": self.last_success,
                "last_iteration": self.last_iteration,
            }
