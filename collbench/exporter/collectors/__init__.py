"""Collectors: one source each, run at scrape time, isolated from each other.

Each collector's `collect()` returns metric families; raising `NoData` (nothing to report on this
host: no RDMA devices, no ethtool) or any other exception marks only that collector failed.
`CollectorSet` runs them all and adds `collbench_collector_success{collector}` and
`collbench_collector_duration_seconds{collector}`, the node_exporter way: a failing collector
never breaks the scrape.
"""

import logging
import re
import threading
import time

from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger("collbench.exporter")


class NoData(Exception):
    """The source does not exist on this host. Success 0, logged once, not an error."""


class LogOnce:
    """Log each distinct message once: a missing file must not write a line per scrape."""

    def __init__(self, logger=log):
        self.logger = logger
        self._seen = set()
        self._lock = threading.Lock()

    def __call__(self, level, msg, *args):
        text = msg % args if args else msg
        with self._lock:
            if text in self._seen:
                return
            if len(self._seen) < 1000:
                self._seen.add(text)
        self.logger.log(level, "%s", text)


class DeviceFilter:
    """device_include / device_exclude regexes, matched against the whole name."""

    def __init__(self, include=None, exclude=None):
        self.include = re.compile(include) if include else None
        self.exclude = re.compile(exclude) if exclude else None

    def __call__(self, name):
        if self.include is not None and not self.include.fullmatch(name):
            return False
        return not (self.exclude is not None and self.exclude.fullmatch(name))


class Collector:
    name = "base"

    def collect(self):
        raise NotImplementedError


class CollectorSet:
    """The one collector registered with prometheus_client: runs each source, times it, and
    reports its success. Families of a failed collector are discarded whole (no partial set)."""

    def __init__(self, collectors):
        self.collectors = list(collectors)
        self._log_once = LogOnce()

    def collect(self):
        success = GaugeMetricFamily("collbench_collector_success",
                                    "1 if the collector read its source on this scrape, else 0.",
                                    labels=["collector"])
        duration = GaugeMetricFamily("collbench_collector_duration_seconds",
                                     "Time the collector took on this scrape.", labels=["collector"])
        for c in self.collectors:
            start = time.perf_counter()
            ok = 1
            try:
                families = list(c.collect())
            except NoData as e:
                families, ok = [], 0
                self._log_once(logging.INFO, "collector %s: no data: %s", c.name, e)
            except Exception as e:   # noqa: BLE001 -- one source's bug must not fail the scrape
                families, ok = [], 0
                log.error("collector %s failed: %s: %s", c.name, type(e).__name__, e,
                          exc_info=log.isEnabledFor(logging.DEBUG))
            yield from families
            success.add_metric([c.name], ok)
            duration.add_metric([c.name], time.perf_counter() - start)
        yield success
        yield duration

    def describe(self):
        # Scrape-time collectors: no describe, so registering does not run them.
        return []
