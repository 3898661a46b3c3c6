"""What the exporter knows from the results log: the latest value of each series, and counters.

Memory is bounded by the number of distinct series (op, size, nodes, ranks), never by the log:
each record replaces the previous value of its series. Series whose result is older than
`max_age` are dropped when read, so a stopped stress test makes its latencies disappear
instead of turning into zeros (0 would read as a perfect network).

Counters (records, failures, parse errors) count what was read since the exporter started;
the start-up backfill only recovers latest values and does not count.

Every line goes through collbench.results.record_parser: a line that is not a documented record is
counted once in `parse_errors` and changes nothing else. The series table holds at most
`max_series` keys; results of further series are counted in `series_dropped` and not kept (a
log with 50,000 distinct sizes cannot grow memory or scrape time without bound). Stale series
are swept first, so the table refills as old series age out.
"""

import logging
import re
import threading
import time
from dataclasses import dataclass

from collbench.congestion.attribution import MAX_K, ranked
from collbench.ops import ALL_OPS, OPS
from collbench.sizes import format_size
from collbench.results.record_parser import RECORD_TYPES, ParseError, parse_record

log = logging.getLogger("collbench.exporter")

NO_OP = "none"   # failures[op] for a failure not tied to one op (the whole MPI job)
DEFAULT_MAX_SERIES = 10000   # exporter.max_series: distinct (op, size, nodes, ranks) kept
_PRUNE_EVERY = 1.0           # seconds between stale-series sweeps forced by a full table


# type, ts, op, size_bytes, nodes, ranks as the JSON text has them (backfill fast path only)
_QUICK = [re.compile(rb'"%s":\s*%s' % (k, v)) for k, v in (
    (b"type", rb'"(\w+)"'), (b"ts", rb"([0-9.eE+-]+)"), (b"op", rb'"(\w+)"'),
    (b"size_bytes", rb"(\d+)"), (b"nodes", rb"(\d+)"), (b"ranks", rb"(\d+)"))]


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
    # the hosts whose congestion counters moved most during the step, best first (at most
    # attribution.MAX_K: bounded whatever the number of hosts); collectors/congestion_top.py
    congestion_top: tuple = ()

    @property
    def key(self):
        return (self.op, self.size_bytes, self.nodes, self.ranks)


def series_from_record(rec):
    """A Series from a result record validated by collbench.results.record_parser (every field
    present is of its documented type; the optional ones may be absent: older logs, other writers)."""
    avg = float(rec["latency_avg_us"])
    low, high = rec.get("latency_min_us"), rec.get("latency_max_us")
    algbw, busbw = rec.get("algbw_bytes_per_s"), rec.get("busbw_bytes_per_s")
    size = rec.get("size")
    if size is None:
        size = format_size(rec["size_bytes"]) if ALL_OPS[rec["op"]].has_size else "-"
    return Series(
        op=rec["op"], size=size, size_bytes=rec["size_bytes"], nodes=rec["nodes"], ranks=rec["ranks"],
        avg_s=avg / 1e6,
        min_s=(avg if low is None else float(low)) / 1e6,     # OSU without -f has no min/max
        max_s=(avg if high is None else float(high)) / 1e6,
        algbw=None if algbw is None else float(algbw),
        busbw=None if busbw is None else float(busbw),
        ts=float(rec["ts"]),
        congestion_top=tuple(ranked(rec.get("congestion"), MAX_K)))


def _success(rec):
    """Did this result/failure record end well? (a result that failed validation did not)"""
    return rec["type"] == "result" and rec.get("status", "ok") == "ok" and rec.get("validation") != "fail"


class ResultsState:
    """Thread-safe: the poller writes, scrapes read."""

    def __init__(self, max_age, clock=time.time, max_series=DEFAULT_MAX_SERIES):
        self.max_age = max_age
        self.clock = clock
        self.max_series = max_series
        self._lock = threading.Lock()
        self._series = {}
        self.failures = {name: 0 for name in OPS}
        self.failures[NO_OP] = 0
        self.records = {t: 0 for t in RECORD_TYPES}
        self.parse_errors = 0
        self.series_dropped = 0      # results not kept: the table was full (max_series)
        self.poll_errors = 0         # polls of the log that failed (counted by the exporter's poller)
        self.last_update = None      # ts of the newest result
        self.last_success = None     # (ok, ts) of the newest result or failure
        self.last_iteration = None   # `iteration` of the newest record that has one
        self._logged_bad = 0
        self._logged_dropped = False
        self._last_prune = float("-inf")
        self.observers = []          # called with each new result's Series, in log order (latency_shift)

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

    def poll_failed(self):
        with self._lock:
            self.poll_errors += 1

    def ingest(self, line):
        """One line appended to the log since the exporter started."""
        rec = parse_record(line)
        if isinstance(rec, ParseError):
            self.bad_line(rec.reason)
            return
        ser = series_from_record(rec) if rec["type"] == "result" else None
        with self._lock:
            self.records[rec["type"]] += 1
            if rec["type"] == "failure":
                op = rec.get("op") or NO_OP
                self.failures[op] = self.failures.get(op, 0) + 1   # an imported op's counter starts here
            self._apply(rec, ser, newest_first=False)
            for observe in self.observers if ser is not None else ():
                observe(ser)

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
                rec = parse_record(line)
                if isinstance(rec, ParseError):
                    continue          # not counted: the backfill recovers values, counts nothing
                ser = series_from_record(rec) if rec["type"] == "result" else None
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
            known = ser.key in self._series
            if not known and not self._room_for_one():
                self._drop(ser)
            elif not (newest_first and known):
                self._series[ser.key] = ser
            if not (newest_first and self.last_update is not None):
                self.last_update = ser.ts
        if rec["type"] in ("result", "failure") and not (newest_first and self.last_success is not None):
            self.last_success = (_success(rec), rec["ts"])
        it = rec.get("iteration")
        if it is not None and not (newest_first and self.last_iteration is not None):
            self.last_iteration = it

    def _room_for_one(self):
        """Is there room for one more series? A full table is swept of stale series first, at
        most once a second (a sweep is a pass over the whole table)."""
        if len(self._series) < self.max_series:
            return True
        now = self.clock()
        if now - self._last_prune >= _PRUNE_EVERY:
            self._last_prune = now
            self._prune(now - self.max_age)
        return len(self._series) < self.max_series

    def _prune(self, horizon):
        for k in [k for k, s in self._series.items() if s.ts < horizon]:
            del self._series[k]

    def _drop(self, ser):
        self.series_dropped += 1
        if not self._logged_dropped:
            self._logged_dropped = True
            log.warning("results log: more than exporter.max_series=%d distinct series (op, size, "
                        "nodes, ranks); results of new series are dropped and counted in "
                        "collbench_exporter_series_dropped_total (first: %s %s nodes=%d ranks=%d)",
                        self.max_series, ser.op, ser.size, ser.nodes, ser.ranks)

    # -------------------------------------------------------------- reading

    def fresh_series(self, now=None):
        """The series measured within max_age, dropping the others from memory."""
        now = self.clock() if now is None else now
        horizon = now - self.max_age
        with self._lock:
            self._prune(horizon)
            return list(self._series.values())

    def snapshot(self):
        with self._lock:
            return {
                "failures": dict(self.failures),
                "records": dict(self.records),
                "parse_errors": self.parse_errors,
                "series_dropped": self.series_dropped,
                "poll_errors": self.poll_errors,
                "last_update": self.last_update,
                "last_success": self.last_success,
                "last_iteration": self.last_iteration,
            }
