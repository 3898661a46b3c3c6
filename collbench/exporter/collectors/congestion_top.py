"""Which hosts' congestion counters moved most during the latest step of each op and size, from
the results log's `congestion` fields (docs/METRICS.md, "Congestion attribution").

    collbench_step_congestion_top{op,size,rank,host,counter}        the leading counter's delta
    collbench_step_congestion_top_share{op,size,rank,host,counter}  its share of that counter's
                                                                    movement over all hosts (0..1]

rank 1 is the host whose counters moved most (collbench/congestion/attribution.py, the choice
every view makes). Per (op, size) the newest fresh result decides (several node/rank counts:
the newest); a step where no congestion signal moved has no series, so removing the cause
clears them at the next step. At most k hosts per op and size: the series grow with
ops x sizes x k (exporter.congestion_top_k), never with the number of hosts.
"""

import time

from prometheus_client.core import GaugeMetricFamily

from collbench.exporter.collectors import Collector, register

LABELS = ["op", "size", "rank", "host", "counter"]
DEFAULT_K = 3


class CongestionTopCollector(Collector):
    name = "congestion_top"

    def __init__(self, state, k=DEFAULT_K, clock=time.time):
        self.state = state
        self.k = k
        self.clock = clock

    def collect(self):
        latest = {}
        for s in self.state.fresh_series(self.clock()):
            cur = latest.get((s.op, s.size_bytes))
            if cur is None or (s.ts, s.key) > (cur.ts, cur.key):
                latest[(s.op, s.size_bytes)] = s
        delta = GaugeMetricFamily(
            "collbench_step_congestion_top",
            "Delta, during the latest step of this op and size, of the leading congestion counter of "
            "the host ranked `rank` by how much its counters moved (rank 1: most; the counter is "
            "'<name>@<where>'; docs/CONGESTION.md says on which side of a flow it counts).", labels=LABELS)
        share = GaugeMetricFamily(
            "collbench_step_congestion_top_share",
            "That counter's share (0..1] of its movement over all hosts during the step: 1 = only this "
            "host's counter moved.", labels=LABELS)
        for (op, _), s in sorted(latest.items()):
            for rank, row in enumerate(s.congestion_top[:self.k], 1):
                labels = [op, s.size, str(rank), row.host, row.counter]
                delta.add_metric(labels, row.delta)
                share.add_metric(labels, row.share)
        yield delta
        yield share


@register("congestion_top")
def _congestion_top(ex, _device_filter):
    return CongestionTopCollector(ex.state, ex.setting("congestion_top_k"), ex.clock)
