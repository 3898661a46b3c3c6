"""A persistent shift, not a spike: a one-sided CUSUM on a robust scale, per series of step
latencies. Shared by `collbench diagnose` (offline, over a results log) and the exporter's
latency_shift collector (online, one observation per new step).

The reference is the median m of recent in-control latencies and its robust sigma
s = max(1.4826 x MAD, REL_FLOOR x m) (the floor keeps a very steady series from calling a 2 %
wobble a shift). Each observation x adds z = min((x - m) / s, Z_CAP) - DRIFT to S (S >= 0). A
shift is on while S > H. Because one observation adds at most Z_CAP - DRIFT = 3 < H = 10, a
single spike (or three in a row) never fires: the latency must stay high for at least four steps.
S is capped at 2 H so the flag clears within ~10 steps of the latency coming back.
"""

import statistics
from collections import deque

WARMUP = 12          # observations before the reference is trusted
WINDOW = 50          # in-control observations the reference is taken from
REL_FLOOR = 0.05     # sigma is at least 5 % of the median
Z_CAP = 4.0
DRIFT = 1.0
H = 10.0


def robust_reference(values):
    """(median, robust sigma with the floor) of a list of latencies."""
    m = statistics.median(values)
    mad = statistics.median(abs(v - m) for v in values)
    return m, max(1.4826 * mad, REL_FLOOR * abs(m), 1e-9)


class ShiftDetector:
    """Feed latencies one at a time (add); `shift` says whether a persistent shift is on,
    `statistic` is S, `change_index` the observation where the current excursion began."""

    __slots__ = ("window", "count", "statistic", "shift", "change_index", "median", "sigma", "_stale")

    def __init__(self):
        self.window = deque(maxlen=WINDOW)
        self.count = 0
        self.statistic = 0.0
        self.shift = False
        self.change_index = None
        self.median = self.sigma = None
        self._stale = True

    @property
    def ready(self):
        return self.median is not None

    def add(self, x):
        """One observation; returns the z it contributed (None during the warm-up)."""
        i = self.count
        self.count += 1
        if self.median is None:
            self.window.append(x)
            if len(self.window) >= WARMUP:
                self.median, self.sigma = robust_reference(list(self.window))
                self._stale = False
            return None
        z = min((x - self.median) / self.sigma, Z_CAP)
        before = self.statistic
        self.statistic = min(max(0.0, before + z - DRIFT), 2 * H)
        if before == 0.0 and self.statistic > 0.0:
            self.change_index = i
        elif self.statistic == 0.0:
            self.change_index = None
        self.shift = self.statistic > H
        if self.statistic < H / 2 and not self.shift:
            # in control: the reference follows slow drift, never a shift in progress
            self.window.append(x)
            self._stale = True
            if i % 10 == 0:
                self._refresh()
        return z

    def _refresh(self):
        if self._stale and len(self.window) >= WARMUP:
            self.median, self.sigma = robust_reference(list(self.window))
            self._stale = False
