"""Benchmark results from the results log, plus the stress daemon's status from its state dir."""

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from collbench.exporter.collectors import Collector, register
from collbench.results.state_dir import RUNNING, StatePaths, daemon_status

SERIES_LABELS = ["op", "size", "size_bytes", "nodes", "ranks"]


def series_labels(s):
    return [s.op, s.size, str(s.size_bytes), str(s.nodes), str(s.ranks)]


def stress_status(state_dir, last_iteration=None):
    """(running, iteration) of the stress daemon in `state_dir`, checked at every scrape.

    Running means the daemon's process is alive *now* and is the one that wrote the state
    (collbench.results.state_dir tells a live daemon from a stale pid file or a recycled pid), so a
    stopped or crashed daemon reads 0 at the next scrape, never a stale 1. The iteration is
    `last_iteration` (that of the newest record read) when known, else the state file's.
    """
    running, iteration = 0, None
    if state_dir:
        status = daemon_status(StatePaths(state_dir))
        running = 1 if status.state == RUNNING else 0
        iteration = status.info.get("iteration")
        if not isinstance(iteration, int) or isinstance(iteration, bool):
            iteration = None
    return running, iteration if last_iteration is None else last_iteration


class ResultsCollector(Collector):
    name = "results"

    def __init__(self, state, state_dir=None, clock=time.time):
        self.state = state
        self.state_dir = state_dir
        self.clock = clock

    def collect(self):
        now = self.clock()
        series = self.state.fresh_series(now)
        snap = self.state.snapshot()
        fams = {
            "avg": GaugeMetricFamily("collbench_latency_avg_seconds",
                                     "Average latency of the collective: the mean over ranks of each rank's average per call.",
                                     labels=SERIES_LABELS, unit="seconds"),
            "min": GaugeMetricFamily("collbench_latency_min_seconds",
                                     "Minimum latency of the collective over the ranks.",
                                     labels=SERIES_LABELS, unit="seconds"),
            "max": GaugeMetricFamily("collbench_latency_max_seconds",
                                     "Maximum latency of the collective over the ranks.",
                                     labels=SERIES_LABELS, unit="seconds"),
            "algbw": GaugeMetricFamily("collbench_algbw_bytes_per_second",
                                       "Algorithm bandwidth: bytes of the collective / average latency.",
                                       labels=SERIES_LABELS),
            "busbw": GaugeMetricFamily("collbench_busbw_bytes_per_second",
                                       "Bus bandwidth: algbw x the op's factor (nccl-tests), "
                                       "comparable with the link speed.", labels=SERIES_LABELS),
            "ts": GaugeMetricFamily("collbench_result_timestamp_seconds",
                                    "Unix time the result was measured.", labels=SERIES_LABELS,
                                    unit="seconds"),
        }
        for s in sorted(series, key=lambda s: s.key):
            labels = series_labels(s)
            fams["avg"].add_metric(labels, s.avg_s)
            fams["min"].add_metric(labels, s.min_s)
            fams["max"].add_metric(labels, s.max_s)
            if s.algbw is not None:
                fams["algbw"].add_metric(labels, s.algbw)
            if s.busbw is not None:
                fams["busbw"].add_metric(labels, s.busbw)
            fams["ts"].add_metric(labels, s.ts)
        yield from fams.values()

        last = GaugeMetricFamily("collbench_last_update_timestamp_seconds",
                                 "Unix time of the newest result in the log.", unit="seconds")
        age = GaugeMetricFamily("collbench_results_age_seconds",
                                "Seconds since the newest result in the log was measured.", unit="seconds")
        if snap["last_update"] is not None:
            last.add_metric([], snap["last_update"])
            age.add_metric([], max(0.0, now - snap["last_update"]))
        yield last
        yield age

        running, iteration = stress_status(self.state_dir, snap["last_iteration"])
        yield GaugeMetricFamily("collbench_stress_running",
                                "1 if the stress daemon's process is alive now, else 0.", value=running)
        it = GaugeMetricFamily("collbench_stress_iteration",
                               "Plan pass of the stress daemon's newest record (from 1).")
        if iteration is not None:
            it.add_metric([], iteration)
        yield it
        ok = GaugeMetricFamily("collbench_last_run_success",
                               "1 if the newest result/failure record is a passing result, 0 if it is a failure.")
        if snap["last_success"] is not None:
            ok.add_metric([], 1 if snap["last_success"][0] else 0)
        yield ok

        fail = CounterMetricFamily("collbench_benchmark_failures",
                                   "Failure records read since the exporter started, by op "
                                   "(op=\"none\": the whole job failed).", labels=["op"])
        for op, n in snap["failures"].items():
            fail.add_metric([op], n)
        yield fail
        yield CounterMetricFamily("collbench_results_parse_errors",
                                  "Lines of the results log that were not valid records, since the exporter started.",
                                  value=snap["parse_errors"])
        yield CounterMetricFamily("collbench_exporter_poll_errors",
                                  "Polls of the results log that failed (unreadable log, internal error), "
                                  "since the exporter started; polling goes on.",
                                  value=snap["poll_errors"])
        yield CounterMetricFamily("collbench_exporter_series_dropped",
                                  "Results not kept because exporter.max_series distinct result series "
                                  "were already held, since the exporter started.",
                                  value=snap["series_dropped"])
        recs = CounterMetricFamily("collbench_results_records",
                                   "Records read from the results log since the exporter started, by type.",
                                   labels=["type"])
        for t, n in snap["records"].items():
            recs.add_metric([t], n)
        yield recs


@register("results")
def _results(ex, _device_filter):
    return ResultsCollector(ex.state, ex.settings.state_dir, ex.clock)
