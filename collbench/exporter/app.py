"""The exporter's parts wired together: results log tailer -> results state -> collectors -> registry,
and the poll thread that feeds the state.

Start-up on a huge log: position the tailer at the end, then read backwards from that point
(at most `backfill_bytes`, and no further than records older than max_age) to recover the
latest value of each series. Everything after that point is read by the tailer, so no record
is lost between the two and none is counted twice.

The poll thread never dies: a failed poll (an unreadable log, a bug) is counted in
`collbench_exporter_poll_errors_total`, logged (the first time, when the error changes, and
once a minute while it lasts), and polling goes on. /health turns 503, with the reason, when no
poll has completed for STALL_POLLS poll intervals (at least STALL_MIN_SECONDS): a poller that
is stuck or keeps failing is reported, not hidden behind frozen values.

Counters only (`settings.counters_only`, `collbench exporter --counters-only`): the per-host
exporter. No results log is opened, no poller runs; the collectors read at scrape time, and
/health is ok once started.
"""

import logging
import os
import threading
import time

from prometheus_client import CollectorRegistry

from collbench.config import ALERTS_SCHEMA, EXPORTER_SCHEMA
from collbench.exporter.collectors import CollectorSet, DeviceFilter, registered
from collbench.exporter.results_state import ResultsState
from collbench.results.lines import read_lines_backwards
from collbench.results.tailer import LogTailer

log = logging.getLogger("collbench.exporter")

# A setting left out of `settings` (tests build them by hand) has the config schema's default:
# the one place a default is written.
DEFAULTS = {**{key: default for key, (_, default) in EXPORTER_SCHEMA.items()},
            "shift_ratio": ALERTS_SCHEMA["shift_ratio"][1]}
BACKFILL_BYTES = 8 << 20    # ~14000 records: 15 min of a busy plan is ~700
STALL_POLLS = 5             # /health: unhealthy after this many poll intervals without a poll
STALL_MIN_SECONDS = 10.0
ERROR_LOG_EVERY = 60.0      # seconds between log lines of a poll error that persists


class Exporter:
    """`settings`: results_log, state_dir, max_age, poll_interval, legacy_metrics, collectors,
    sysfs_root, procfs_root, ethtool, netdevs, device_include, device_exclude, backfill_bytes,
    max_series, counters_only, collector_timeout, ... (exporter.* of the config; see setting())."""

    def __init__(self, settings, clock=time.time):
        self.settings = settings
        self.clock = clock
        self.state = ResultsState(settings.max_age, clock=clock, max_series=self.setting("max_series"))
        self.counters_only = bool(getattr(settings, "counters_only", False))
        self.tailer = None if self.counters_only else LogTailer(settings.results_log, on_bad_line=self.state.bad_line)
        self.collectors = CollectorSet(self.build_collectors(), timeout=self.setting("collector_timeout"))
        # /health turns 503 when a /metrics collection runs this long (collectors are cut at their
        # deadline, so only a fault of the exporter itself gets there)
        self.metrics_stall_seconds = 2 * self.collectors.timeout + 5.0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collectors)
        self._stop = threading.Event()
        self._thread = None
        self.last_poll = None        # monotonic time of the last poll that completed
        self.poll_error = None       # text of the newest failure, None after a good poll
        self._started_at = None
        self._error_logged = (None, float("-inf"))   # (text, monotonic time) of the last error logged
        self.startup_seconds = None
        self.backfilled = 0

    def setting(self, key):
        """settings.<key>, or the config schema's default when it is absent or None."""
        value = getattr(self.settings, key, None)
        return DEFAULTS.get(key) if value is None else value

    def build_collectors(self):
        """The collectors `settings` asks for, each built by the factory its file registered:
        those named in settings.collectors, in that order, then those a setting of their own
        turns on (legacy_metrics, baseline)."""
        regs = registered()
        dev_filter = DeviceFilter(self.settings.device_include, self.settings.device_exclude)
        chosen = [regs[name] for name in self.settings.collectors]
        chosen += [r for r in regs.values() if r.enabled_by and getattr(self.settings, r.enabled_by, None)]
        return [r.factory(self, dev_filter) for r in chosen]

    # -------------------------------------------------------------- start-up

    def start(self):
        t0 = time.perf_counter()
        self._started_at = time.monotonic()
        if self.counters_only:   # nothing to read ahead of the scrapes
            self.startup_seconds = time.perf_counter() - t0
            return
        try:
            self.backfill()
        except Exception as e:   # noqa: BLE001 -- a start-up read must never stop the exporter
            self._poll_failed("start-up read", e)
        self.startup_seconds = time.perf_counter() - t0
        log.info("results log %s: recovered %d recent records in %.3f s; tailing from byte %d",
                 self.settings.results_log, self.backfilled, self.startup_seconds, self.tailer.offset)
        self._thread = threading.Thread(target=self._poll_loop, name="results-poller", daemon=True)
        self._thread.start()

    def backfill(self):
        try:
            end = self.tailer.seek_end()
        except OSError as e:
            self._poll_failed("start-up read", e)
            return
        budget = getattr(self.settings, "backfill_bytes", None) or BACKFILL_BYTES   # settings only (tests)
        path = self.settings.results_log
        lines = read_lines_backwards(path, budget, end=end)
        self.backfilled = self.state.backfill(lines)
        # Just rotated: the current file holds little, the latest values are in the previous one.
        if end < budget and os.path.exists(path + ".1"):
            self.backfilled += self.state.backfill(read_lines_backwards(path + ".1", budget - end))

    # -------------------------------------------------------------- polling

    def poll_once(self):
        for line in self.tailer.poll():
            try:
                self.state.ingest(line)
            except Exception as e:   # noqa: BLE001 -- a bug on one line: count it, keep the rest
                self.state.bad_line(f"internal error: {type(e).__name__}")
                self._poll_failed("a line", e)
        self.last_poll = time.monotonic()

    def _poll_loop(self):
        while not self._stop.is_set():
            try:
                self.poll_once()
                self.poll_error = None
            except Exception as e:   # noqa: BLE001 -- the poller must outlive any fault
                self._poll_failed("poll", e)
            self._stop.wait(self.settings.poll_interval)

    def _poll_failed(self, what, e):
        """Count and log a failure of the poller; the log line is rate-limited per error text."""
        self.state.poll_failed()
        if isinstance(e, OSError):
            text = f"{self.settings.results_log}: {e.strerror or e}"
        else:
            text = f"{what}: internal error: {type(e).__name__}: {str(e)[:200]}"
        self.poll_error = text
        now = time.monotonic()
        last_text, last_time = self._error_logged
        if text != last_text or now - last_time >= ERROR_LOG_EVERY:
            self._error_logged = (text, now)
            log.error("results log: %s (counted in collbench_exporter_poll_errors_total; polling goes on)",
                      text, exc_info=not isinstance(e, OSError) and text != last_text)

    def stop(self, join_timeout=0.5):
        """Stop polling and end what the collectors started. Quick whatever a collector or the
        poller is blocked on (their threads are daemons: a read the kernel never completes is
        left to the process's exit): the exporter answers SIGTERM within a second."""
        self._stop.set()
        self.collectors.close()
        if self._thread is not None:
            self._thread.join(timeout=join_timeout)
        if self.tailer is not None:
            self.tailer.close()

    # -------------------------------------------------------------- status

    def health(self):
        """(ok, detail): ok while the poll thread runs and completed a poll recently; else the
        detail's `reason` says what is wrong. A collector stuck past its deadline does not make
        the exporter unhealthy (/metrics answers on time without it; restarting would not unstick
        a driver) but is named in `stuck_collectors` and `status` is "degraded"."""
        ok, detail = self._poll_health()
        stuck = self.collectors.stuck()
        detail["stuck_collectors"] = stuck
        if ok and stuck:
            detail["status"] = "degraded"
            detail["reason"] = "; ".join(
                f"collector {name} has not returned for {s['seconds']:.1f} s"
                + (f" (reading {s['reading']})" if s["reading"] else "")
                + ": its source does not answer (counted in collbench_collector_timeouts_total)"
                for name, s in sorted(stuck.items()))
        return ok, detail

    def _poll_health(self):
        now = time.monotonic()
        if self.counters_only:
            ok = self._started_at is not None
            return ok, {"status": "ok" if ok else "unhealthy", "reason": None if ok else "not started",
                        "counters_only": True, "collectors": list(self.settings.collectors)}
        limit = (getattr(self.settings, "stall_seconds", None)     # settings only (tests): no config key
                 or max(STALL_MIN_SECONDS, STALL_POLLS * self.settings.poll_interval))
        since = self.last_poll if self.last_poll is not None else self._started_at
        age = None if since is None else now - since
        reason = None
        if self._thread is None:
            reason = "the results poller has not started"
        elif not self._thread.is_alive():
            reason = "the results poller has stopped"
        elif self.last_poll is None or age >= limit:
            if self.last_poll is None and age < limit:
                reason = "starting: no poll of the results log has completed yet"
            else:
                reason = f"no poll of the results log has completed for {age:.1f} s (limit {limit:g} s)"
            if self.poll_error:
                reason += f"; last error: {self.poll_error}"
        ok = reason is None
        return ok, {
            "status": "ok" if ok else "unhealthy",
            "reason": reason,
            "results_log": self.settings.results_log,
            "results_log_exists": os.path.exists(self.settings.results_log),
            "poll_error": self.poll_error,
            "last_poll_age_seconds": None if self.last_poll is None else round(now - self.last_poll, 3),
            "poll_errors": self.state.poll_errors,
        }

    def describe(self):
        s = self.settings
        if self.counters_only:
            return {"mode": "counters only (no results log)", "collectors": ", ".join(s.collectors)}
        return {
            "results log": s.results_log,
            "state dir": s.state_dir or "-",
            "max age": f"{s.max_age:g} s",
            "collectors": ", ".join(c.name for c in self.collectors.collectors),
        }
