"""The exporter's parts wired together: results log tailer -> results state -> collectors -> registry,
and the poll thread that feeds the state.

Start-up on a huge log: position the tailer at the end, then read backwards from that point
(at most `backfill_bytes`, and no further than records older than max_age) to recover the
latest value of each series. Everything after that point is read by the tailer, so no record
is lost between the two and none is counted twice.
"""

import logging
import os
import threading
import time

from prometheus_client import CollectorRegistry

from collbench.exporter.collectors import CollectorSet, DeviceFilter
from collbench.exporter.collectors.ethtool import EthtoolCollector
from collbench.exporter.collectors.legacy import LegacyCollector
from collbench.exporter.collectors.netstat import NetstatCollector
from collbench.exporter.collectors.rdma_sysfs import RdmaSysfsCollector
from collbench.exporter.collectors.results import ResultsCollector
from collbench.exporter.results_state import ResultsState
from collbench.exporter.tailer import LogTailer, read_lines_backwards

log = logging.getLogger("collbench.exporter")

# name (as in exporter.collectors) -> factory(exporter, device filter). A new source is one row here.
COLLECTORS = {
    "results": lambda ex, _: ResultsCollector(ex.state, ex.settings.state_dir, ex.clock),
    "rdma_sysfs": lambda ex, dev_filter: RdmaSysfsCollector(ex.settings.sysfs_root, dev_filter),
    "ethtool": lambda ex, dev_filter: EthtoolCollector(ex.settings.ethtool, ex.settings.netdevs,
                                                       ex.settings.sysfs_root, dev_filter),
    "netstat": lambda ex, _: NetstatCollector(ex.settings.procfs_root),
}
BACKFILL_BYTES = 8 << 20    # ~14000 records: 15 min of a busy plan is ~700


class Exporter:
    """`settings`: results_log, state_dir, max_age, poll_interval, legacy_metrics, collectors,
    sysfs_root, procfs_root, ethtool, netdevs, device_include, device_exclude, backfill_bytes."""

    def __init__(self, settings, clock=time.time):
        self.settings = settings
        self.clock = clock
        self.state = ResultsState(settings.max_age, clock=clock)
        self.tailer = LogTailer(settings.results_log, on_bad_line=self.state.bad_line)
        dev_filter = DeviceFilter(settings.device_include, settings.device_exclude)
        built = [COLLECTORS[name](self, dev_filter) for name in settings.collectors]
        if settings.legacy_metrics:
            built.append(LegacyCollector(self.state, settings.state_dir, clock))
        self.collectors = CollectorSet(built)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collectors)
        self._stop = threading.Event()
        self._thread = None
        self.last_poll = None        # monotonic time of the last poll that completed
        self.poll_error = None
        self.startup_seconds = None
        self.backfilled = 0

    # -------------------------------------------------------------- start-up

    def start(self):
        t0 = time.perf_counter()
        self.backfill()
        self.startup_seconds = time.perf_counter() - t0
        log.info("results log %s: recovered %d recent records in %.3f s; tailing from byte %d",
                 self.settings.results_log, self.backfilled, self.startup_seconds, self.tailer.offset)
        self._thread = threading.Thread(target=self._poll_loop, name="results-poller", daemon=True)
        self._thread.start()

    def backfill(self):
        try:
            end = self.tailer.seek_end()
        except OSError as e:
            self.poll_error = f"{self.settings.results_log}: {e.strerror}"
            log.error("cannot read the results log %s", self.poll_error)
            return
        budget = getattr(self.settings, "backfill_bytes", None) or BACKFILL_BYTES
        path = self.settings.results_log
        lines = read_lines_backwards(path, budget, end=end)
        self.backfilled = self.state.backfill(lines)
        # Just rotated: the current file holds little, the latest values are in the previous one.
        if end < budget and os.path.exists(path + ".1"):
            self.backfilled += self.state.backfill(read_lines_backwards(path + ".1", budget - end))

    # -------------------------------------------------------------- polling

    def poll_once(self):
        for line in self.tailer.poll():
            self.state.ingest(line)
        self.last_poll = time.monotonic()

    def _poll_loop(self):
        while not self._stop.is_set():
            try:
                self.poll_once()
                self.poll_error = None
            except OSError as e:
                if self.poll_error is None:
                    log.error("results log %s: %s", self.settings.results_log, e.strerror or e)
                self.poll_error = str(e.strerror or e)
            self._stop.wait(self.settings.poll_interval)

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.tailer.close()

    # -------------------------------------------------------------- status

    def health(self):
        """(ok, detail): ok while the poll thread runs and polled recently."""
        alive = self._thread is not None and self._thread.is_alive()
        recent = (self.last_poll is not None
                  and time.monotonic() - self.last_poll < max(10.0, 5 * self.settings.poll_interval))
        ok = alive and recent
        return ok, {
            "status": "ok" if ok else "unhealthy",
            "results_log": self.settings.results_log,
            "results_log_exists": os.path.exists(self.settings.results_log),
            "poll_error": self.poll_error,
        }

    def describe(self):
        s = self.settings
        return {
            "results log": s.results_log,
            "state dir": s.state_dir or "-",
            "max age": f"{s.max_age:g} s",
            "collectors": ", ".join(list(s.collectors) + (["legacy"] if s.legacy_metrics else [])),
        }
