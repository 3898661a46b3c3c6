"""The prototype's metric names (`exporter.legacy_metrics: true`), so dashboards built on
the prototype keep working: mpi_<op>_latency_us{size, nodes}, mpi_stress_test_running,
mpi_stress_test_iteration, mpi_benchmark_last_update_timestamp.

Same data and the same staleness as the results collector: a series older than max_age is
absent, never 0. The prototype had no ranks label; when several rank counts ran at one
(op, size, nodes), the newest result is shown.
"""

import time

from prometheus_client.core import GaugeMetricFamily

from collbench.exporter.collectors import Collector, register
from collbench.exporter.collectors.results import stress_status
from collbench.ops import OPS

LEGACY_OPS = [op for op in OPS.values() if op.legacy_name]


class LegacyCollector(Collector):
    name = "legacy"

    def __init__(self, state, state_dir=None, clock=time.time):
        self.state = state
        self.state_dir = state_dir
        self.clock = clock

    def collect(self):
        newest = {}
        for s in self.state.fresh_series(self.clock()):
            key = (s.op, s.size, s.nodes)
            if key not in newest or s.ts > newest[key].ts:
                newest[key] = s
        for op in LEGACY_OPS:
            fam = GaugeMetricFamily(f"mpi_{op.legacy_name}_latency_us",
                                    f"{op.title} average latency in microseconds (prototype name; "
                                    f"see collbench_latency_avg_seconds).", labels=["size", "nodes"])
            for (name, size, nodes), s in sorted(newest.items(), key=lambda kv: (kv[1].size_bytes, kv[1].nodes)):
                if name == op.name:
                    fam.add_metric([size, str(nodes)], round(s.avg_s * 1e6, 3))
            yield fam
        snap = self.state.snapshot()
        running, iteration = stress_status(self.state_dir, snap["last_iteration"])
        yield GaugeMetricFamily("mpi_stress_test_running",
                                "1 if the stress test is running (prototype name).", value=running)
        it = GaugeMetricFamily("mpi_stress_test_iteration", "Stress test iteration (prototype name).")
        if iteration is not None:
            it.add_metric([], iteration)
        yield it
        last = GaugeMetricFamily("mpi_benchmark_last_update_timestamp",
                                 "Unix time of the newest result (prototype name).")
        if snap["last_update"] is not None:
            last.add_metric([], int(snap["last_update"]))
        yield last


@register("legacy", enabled_by="legacy_metrics")
def _legacy(ex, _device_filter):
    return LegacyCollector(ex.state, ex.settings.state_dir, ex.clock)
