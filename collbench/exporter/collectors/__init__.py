"""Collectors: one source each, one file each, run at scrape time, isolated from each other.

A collector file registers itself, as node_exporter's do (`registerCollector` in each file's
init): a module-level factory decorated with `@register(name, ...)`. Every module of this package
is imported by `registered()`, so a new source is one new file here, and nothing else to edit
(to be on by default its name also goes in config/schema.py's `exporter.collectors` default).

Each collector's `collect()` returns metric families; raising `NoData` (nothing to report on this
host: no RDMA devices, no ethtool) or any other exception marks only that collector failed.
`CollectorSet` runs them all, each in a worker thread of its own with a deadline (a sysfs read of a
NIC whose firmware stopped answering blocks in the kernel for tens of seconds; node_exporter met
the same with stuck NFS mounts), and adds, the node_exporter way:

  collbench_collector_success{collector}           1 if it answered within its deadline, else 0
  collbench_collector_duration_seconds{collector}  its time on this scrape (so far, when late)
  collbench_collector_timeouts_total{collector}    collections it did not answer in time
  collbench_collector_errors_total{collector,reason}  input it refused and survived (counted)

A collector still running from an earlier collection is not started again until it returns, so
a stuck read costs one parked thread, never one more per scrape; the scrape answers on time with
the others. A failing collector never breaks the scrape.
"""

import importlib
import logging
import pkgutil
import threading
import time
from typing import Callable, NamedTuple, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("collbench.exporter")

DEFAULT_TIMEOUT = 3.0     # seconds a collector has per collection (exporter.collector_timeout)
# reasons of collbench_collector_errors_total: a fixed set, so the label cannot grow
ERROR_REASONS = ("not_regular_file", "too_large", "unreadable", "duplicate_series", "command_timeout",
                 "command_output_too_large")


def file_error_reason(err):
    """The collbench_collector_errors_total reason of a bounded_file.UntrustedFileError."""
    text = str(err)
    if "not a regular file" in text:
        return "not_regular_file"
    if "larger than" in text:
        return "too_large"
    return "unreadable"


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


def compile_device_regex(pattern, where="exporter.device_include"):
    """An operator's device regex, compiled by RE2 (google-re2): matching takes time linear in the
    name, whatever the pattern (`(a+)+` against `aaaa...a!` backtracks for hours in Python's re,
    holding the GIL, so not even SIGTERM is answered). RE2 is the syntax node_exporter's and
    Prometheus' own regexes use; a pattern it refuses (backreferences, lookaround) is a ValueError
    naming it."""
    import re2
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        msg = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(f"{where}: {pattern!r} is not a valid RE2 regular expression ({msg})") from None


class DeviceFilter:
    """device_include / device_exclude regexes (RE2), matched against the whole name."""

    def __init__(self, include=None, exclude=None):
        self.include = compile_device_regex(include, "exporter.device_include") if include else None
        self.exclude = compile_device_regex(exclude, "exporter.device_exclude") if exclude else None

    def __call__(self, name):
        if self.include is not None and not self.include.fullmatch(name):
            return False
        return not (self.exclude is not None and self.exclude.fullmatch(name))


class Collector:
    name = "base"
    reading = None      # what the collection in progress is reading now (a path, a command): for /health

    def count_error(self, reason, n=1):
        """Count input refused and survived (ERROR_REASONS): collbench_collector_errors_total."""
        if reason not in ERROR_REASONS:     # the label's values are a fixed set
            raise ValueError(f"unknown error reason {reason!r}")
        errors = self.__dict__.setdefault("errors", {})
        errors[reason] = errors.get(reason, 0) + n

    def collect(self):
        raise NotImplementedError

    def close(self):
        """The exporter stops: end what the collector started (a command's process group)."""


# ------------------------------------------------------------------ registration

class Registration(NamedTuple):
    name: str
    factory: Callable              # (exporter, device filter) -> Collector
    counters: bool                 # reads only this host's counters: served by --counters-only
    enabled_by: Optional[str]      # None: chosen by exporter.collectors; else the setting that turns it on


_REGISTRY = {}


def register(name, counters=False, enabled_by=None):
    """Decorator of a collector file's factory(exporter, device_filter) -> Collector."""
    def wrap(factory):
        known = _REGISTRY.get(name)
        if known is not None and known.factory is not factory:
            raise RuntimeError(f"two collectors named {name!r}")
        _REGISTRY[name] = Registration(name, factory, counters, enabled_by)
        return factory
    return wrap


def registered():
    """{name: Registration} of every collector file of this package, in name order."""
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
    return dict(sorted(_REGISTRY.items()))


def selectable():
    """Names exporter.collectors / --collectors may list."""
    return [n for n, r in registered().items() if r.enabled_by is None]


def counters_collectors():
    """The collectors of --counters-only: the host's counters, no results log."""
    return [n for n, r in registered().items() if r.counters and r.enabled_by is None]


# ------------------------------------------------------------------ running with deadlines

class _Worker:
    """Runs one collector, each collection in a daemon thread of its own (one that ends with the
    collection: nothing is left holding the collector). request() starts a collection unless one
    is in flight: a recent one is shared, a stuck one (past its deadline) is neither joined nor
    followed by another, so a stuck read never piles up threads."""

    def __init__(self, collector):
        self.collector = collector
        self._cond = threading.Condition()
        self._started = 0
        self._done = 0
        self._result = None          # (families, ok, no-data text, seconds)
        self.busy_since = None       # monotonic start of the collection in progress

    def request(self, timeout):
        """The number of the collection to wait for: a new one, or the one in flight when it
        started less than `timeout` s ago (a concurrent scrape's: shared); None when the one in
        flight is older (stuck): nothing is started and nothing is waited for."""
        with self._cond:
            if self.busy_since is not None:
                return self._started if time.monotonic() - self.busy_since < timeout else None
            self.busy_since = time.monotonic()
            self._started += 1
            number = self._started
        threading.Thread(target=self._collect, args=(number,), name=f"collector-{self.collector.name}",
                         daemon=True).start()
        return number

    def wait(self, number, deadline):
        """The result of collection `number`, or None if it is not done by `deadline` (monotonic)."""
        with self._cond:
            while self._done < number:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._result

    def _collect(self, number):
        result = _run(self.collector)
        with self._cond:
            self._result = result
            self._done = number
            self.busy_since = None
            self._cond.notify_all()


def _run(c):
    start = time.perf_counter()
    try:
        return list(c.collect()), 1, None, time.perf_counter() - start
    except NoData as e:
        return [], 0, f"no data: {e}", time.perf_counter() - start
    except Exception as e:   # noqa: BLE001 -- one source's bug must not fail the scrape
        log.error("collector %s failed: %s: %s", c.name, type(e).__name__, e,
                  exc_info=log.isEnabledFor(logging.DEBUG))
        return [], 0, None, time.perf_counter() - start


class CollectorSet:
    """The one collector registered with prometheus_client: runs each source in its worker with
    a deadline, times it, and reports its success. Families of a failed or late collector are
    discarded whole (no partial set)."""

    def __init__(self, collectors, timeout=DEFAULT_TIMEOUT):
        self.collectors = list(collectors)
        self.timeout = timeout
        self._workers = [_Worker(c) for c in self.collectors]
        self._timeouts = {c.name: 0 for c in self.collectors}
        self._log_once = LogOnce()

    def collect(self):
        success = GaugeMetricFamily("collbench_collector_success",
                                    "1 if the collector read its source within its deadline on this scrape, else 0.",
                                    labels=["collector"])
        duration = GaugeMetricFamily("collbench_collector_duration_seconds",
                                     "Time the collector took on this scrape (so far, when it did not answer "
                                     "in time).", labels=["collector"])
        timeouts = CounterMetricFamily("collbench_collector_timeouts",
                                       "Collections the collector did not answer within its deadline "
                                       "(exporter.collector_timeout); a stuck one is not started again "
                                       "until it returns.", labels=["collector"])
        errors = CounterMetricFamily("collbench_collector_errors",
                                     "Input the collector refused and survived: a file that is not a regular "
                                     "file or too large, a duplicate series, a command that timed out.",
                                     labels=["collector", "reason"])
        started = [(w, w.request(self.timeout)) for w in self._workers]
        deadline = time.monotonic() + self.timeout
        for w, number in started:
            c = w.collector
            result = w.wait(number, deadline) if number is not None else None
            if result is None:
                self._timeouts[c.name] += 1
                self._log_once(logging.WARNING, "collector %s: no answer within %g s (counted in "
                               "collbench_collector_timeouts_total; not started again until it returns)",
                               c.name, self.timeout)
                families, ok = [], 0
                busy = w.busy_since
                seconds = time.monotonic() - busy if busy is not None else self.timeout
            else:
                families, ok, nodata, seconds = result
                if nodata:
                    self._log_once(logging.INFO, "collector %s: %s", c.name, nodata)
            yield from families
            success.add_metric([c.name], ok)
            duration.add_metric([c.name], seconds)
            timeouts.add_metric([c.name], self._timeouts[c.name])
            for reason, n in sorted(dict(getattr(c, "errors", {})).items()):
                errors.add_metric([c.name, reason], n)
        yield success
        yield duration
        yield timeouts
        yield errors

    def stuck(self):
        """{collector name: {"seconds": s, "reading": what}} of the collectors whose collection has
        run past its deadline; `reading` is what it was reading when last told (a file, a command)."""
        now = time.monotonic()
        out = {}
        for w in self._workers:
            busy = w.busy_since
            if busy is not None and now - busy > self.timeout:
                reading = getattr(w.collector, "reading", None)
                out[w.collector.name] = {"seconds": round(now - busy, 3),
                                         "reading": None if reading is None else str(reading)}
        return out

    def close(self):
        for c in self.collectors:
            try:
                c.close()
            except Exception:   # noqa: BLE001 -- stopping: each collector's own
                log.debug("closing collector %s failed", c.name, exc_info=True)

    def describe(self):
        # Scrape-time collectors: no describe, so registering does not run them.
        return []
