"""A persistent latency shift per op and size, tested online as results arrive (change_point:
a one-sided CUSUM on a robust scale; a one-step spike is not a shift, a shift that persists is).

    collbench_latency_shift{op,size}                1 while a persistent upward shift of at least
                                                    alerts.shift_ratio is on, else 0
    collbench_latency_shift_cusum{op,size}          the CUSUM statistic (fires above ..._threshold)
    collbench_latency_shift_threshold               the statistic's threshold (change_point.H)
    collbench_latency_shift_reference_seconds{op,size}  the in-control median the test compares with
    collbench_latency_shift_ratio{op,size}          the latest steps' median over that reference
    collbench_latency_shift_min_ratio               alerts.shift_ratio: the smallest ratio that is a shift

The results state feeds each new result (tailing, oldest first) to `observe`; records the exporter
reads back at start-up are not replayed (the test needs them in order), so a series is judged
after WARMUP new steps. Several node/rank counts of one op and size are tested apart and exported
as one series (one whose flag is on, else the largest statistic). The table of series is bounded (MAX_SERIES); a series with no result
for exporter.max_age is not exported, as the latency series are not.
The alert CollbenchLatencyShift (monitoring/rules.py) joins the flag with
collbench_step_congestion_top to name the top suspect host.
"""

import threading
import time

from prometheus_client.core import GaugeMetricFamily

from collbench.change_point import H, MIN_RATIO, ShiftDetector
from collbench.exporter.collectors import Collector, register

MAX_SERIES = 4096


class LatencyShiftCollector(Collector):
    name = "latency_shift"

    def __init__(self, state=None, clock=time.time, min_ratio=MIN_RATIO):
        self.min_ratio = min_ratio
        self._lock = threading.Lock()
        self._detectors = {}      # Series.key -> [op, size, ShiftDetector, ts of its latest result]
        self.dropped = 0
        self.clock = clock
        # a series with no result for max_age is not exported (as the latency series): a stopped
        # stress loop must not hold the shift alert on forever
        self.max_age = getattr(state, "max_age", None)
        if state is not None:
            state.observers.append(self.observe)

    def observe(self, ser):
        """One new result (results_state.Series), in log order."""
        with self._lock:
            entry = self._detectors.get(ser.key)
            if entry is None:
                if len(self._detectors) >= MAX_SERIES:
                    self.dropped += 1
                    return
                entry = self._detectors[ser.key] = [ser.op, ser.size, ShiftDetector(self.min_ratio), ser.ts]
            entry[2].add(ser.avg_s)
            entry[3] = ser.ts

    def collect(self):
        horizon = None if self.max_age is None else self.clock() - self.max_age
        with self._lock:
            rows = {}
            for op, size, det, ts in self._detectors.values():
                if not det.ready or (horizon is not None and ts < horizon):
                    continue
                cur = rows.get((op, size))
                # a shift of any node/rank count wins over a larger statistic without one (a
                # change of level too small to be a shift)
                if cur is None or (det.shift, det.statistic) > (cur[1], cur[0]):
                    rows[(op, size)] = (det.statistic, det.shift, det.median, det.ratio)
        shift = GaugeMetricFamily("collbench_latency_shift",
                                  "1 while the latency of this op and size has shifted up and stayed up (a CUSUM "
                                  "over robust z-scores above its threshold: a one-step spike never sets it) by at "
                                  "least collbench_latency_shift_min_ratio, else 0.",
                                  labels=["op", "size"])
        stat = GaugeMetricFamily("collbench_latency_shift_cusum",
                                 "The CUSUM statistic of the latency shift test (0 in control; the flag is set above "
                                 "collbench_latency_shift_threshold).", labels=["op", "size"])
        ref = GaugeMetricFamily("collbench_latency_shift_reference_seconds",
                                "The in-control median latency the shift test compares each new step with.",
                                labels=["op", "size"])
        ratio = GaugeMetricFamily("collbench_latency_shift_ratio",
                                  "The median of the latest steps (of the current excursion, if any) over the "
                                  "reference: how big the shift is.", labels=["op", "size"])
        for (op, size), (s, on, median, r) in sorted(rows.items()):
            shift.add_metric([op, size], 1.0 if on else 0.0)
            stat.add_metric([op, size], s)
            ref.add_metric([op, size], median)
            ratio.add_metric([op, size], r)
        yield shift
        yield stat
        yield ref
        yield ratio
        yield GaugeMetricFamily("collbench_latency_shift_min_ratio",
                                "The smallest ratio to the reference that collbench_latency_shift calls a shift "
                                "(alerts.shift_ratio).", value=self.min_ratio)
        yield GaugeMetricFamily("collbench_latency_shift_threshold",
                                "The CUSUM statistic above which collbench_latency_shift is 1.", value=H)


@register("latency_shift")
def _latency_shift(ex, _device_filter):
    return LatencyShiftCollector(ex.state, ex.clock, ex.setting("shift_ratio"))
