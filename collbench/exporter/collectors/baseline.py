"""The saved baseline (`collbench baseline save`) beside the live results, for `live / baseline`.

Series carry the live result series' labels (op, size, size_bytes, nodes, ranks) and nothing
else, so `collbench_latency_avg_seconds / collbench_baseline_latency_seconds` matches one to one
(the CollbenchLatencyRegression rule, the dashboard's "vs baseline" panel). The live series are
not split by transport, engine or algorithm; where the baseline holds several entries for one
label set, the one of the exporter's own transport and engine, plain (OSU timing, no forced
algorithm: what the stress daemon measures), is served; else a plain one, then the one with the
most runs, then the newest.

The file is read through collbench.baseline's loader (untrusted input) and re-read when it
changes (`baseline save --force` takes effect at the next scrape). A missing or malformed file
is this collector's failure (collbench_collector_success{collector="baseline"} 0, logged once
per distinct problem), never a failed scrape; the previous file's series are not served then.
"""

import logging
import os
import stat

from prometheus_client.core import GaugeMetricFamily

from collbench.errors import UserError
from collbench.exporter.collectors import Collector, LogOnce, NoData, register

LABELS = ["op", "size", "size_bytes", "nodes", "ranks"]


def series_key(entry):
    labels = entry.key.labels()
    return tuple(labels[k] for k in LABELS)


def choose_entries(baseline, transport=None, engine=None):
    """{label tuple: Entry}: one entry per live label set (see the module doc); entries without
    a node count (no live series can match them) are left out."""
    chosen = {}

    def rank(e):
        k = e.key
        plain = not k.algorithm and not getattr(k, "variant", "")   # OSU timing, the MPI's own algorithm
        return (plain and k.transport == transport and k.engine == engine, plain, e.n, e.last_ts or 0.0)
    for e in baseline.sorted_entries():
        if e.key.nodes is None:
            continue
        key = series_key(e)
        if key not in chosen or rank(e) > rank(chosen[key]):
            chosen[key] = e
    return chosen


class BaselineCollector(Collector):
    name = "baseline"

    def __init__(self, name_or_path, state_dir, transport=None, engine=None, max_series=10000, logger=None):
        from collbench.baselines.baseline_file import resolve_path
        self.spec = name_or_path
        self.state_dir = state_dir
        self.path = resolve_path(name_or_path, state_dir)   # UserError for a bad name: at start-up
        self.transport = transport
        self.engine = engine
        self.max_series = max_series
        self._log_once = LogOnce(logger or logging.getLogger("collbench.exporter"))
        self._cache = None            # (file identity, baseline, chosen entries)

    def _identity(self):
        st = os.stat(self.path)
        if not stat.S_ISREG(st.st_mode):   # a FIFO would block the loader's open(), a directory fail it
            raise OSError(0, "not a regular file")
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def load(self):
        """(baseline, chosen entries), re-read only when the file changed; NoData if unusable."""
        from collbench.baselines import load_baseline
        try:
            ident = self._identity()
        except OSError as e:
            self._cache = None
            self._fail(f"baseline {self.path}: {e.strerror or e}")
        if self._cache is not None and self._cache[0] == ident:
            return self._cache[1], self._cache[2]
        try:
            baseline = load_baseline(self.path, self.state_dir)
        except UserError as e:
            self._cache = None
            self._fail(str(e))
        chosen = choose_entries(baseline, self.transport, self.engine)
        if len(chosen) > self.max_series:   # exporter.max_series bounds every family, this one too
            self._log_once(logging.WARNING, "baseline %s: %d series, serving the first %d (exporter.max_series)",
                           self.path, len(chosen), self.max_series)
            chosen = {k: chosen[k] for k in sorted(chosen)[:self.max_series]}
        self._cache = (ident, baseline, chosen)
        self._log_once(logging.INFO, "baseline %s (%s): %d entries, %d series", baseline.name, self.path,
                       len(baseline.entries), len(chosen))
        return baseline, chosen

    def _fail(self, message):
        self._log_once(logging.WARNING, "collector baseline: %s", message)
        raise NoData(message)

    def collect(self):
        baseline, chosen = self.load()
        median = GaugeMetricFamily("collbench_baseline_latency_seconds",
                                   "Baseline latency: the median of the baseline runs' average latency "
                                   "(collbench baseline save).", labels=LABELS, unit="seconds")
        sigma = GaugeMetricFamily("collbench_baseline_latency_sigma_seconds",
                                  "Robust standard deviation of the baseline runs' latency (1.4826 x MAD).",
                                  labels=LABELS, unit="seconds")
        busbw = GaugeMetricFamily("collbench_baseline_busbw_bytes_per_second",
                                  "Baseline bus bandwidth: the median of the baseline runs'.", labels=LABELS)
        runs = GaugeMetricFamily("collbench_baseline_runs",
                                 "Runs (measurements) behind the baseline entry.", labels=LABELS)
        for key in sorted(chosen):
            e = chosen[key]
            labels = list(key)
            median.add_metric(labels, e.median_us / 1e6)
            sigma.add_metric(labels, e.sigma_us / 1e6)
            runs.add_metric(labels, e.n)
            if e.busbw and e.busbw.get("median") is not None:
                busbw.add_metric(labels, e.busbw["median"])
        created = GaugeMetricFamily("collbench_baseline_created_timestamp_seconds",
                                    "Unix time the served baseline was saved.", unit="seconds")
        if baseline.created_ts is not None:
            created.add_metric([], baseline.created_ts)
        info = GaugeMetricFamily("collbench_baseline_info", "The served baseline's name (always 1).",
                                  labels=["baseline"])
        info.add_metric([baseline.name], 1)
        return [median, sigma, busbw, runs, created, info]


@register("baseline", enabled_by="baseline")   # exporter.baseline / --baseline
def _baseline(ex, _device_filter):
    s = ex.settings
    return BaselineCollector(s.baseline, s.state_dir, getattr(s, "transport", None), getattr(s, "engine", None),
                             ex.setting("max_series"))
