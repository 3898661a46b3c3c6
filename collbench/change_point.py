"""A persistent shift, not a spike: a one-sided CUSUM on a robust scale, per series of step
latencies. Shared by `collbench diagnose` (offline, over a results log) and the exporter's
latency_shift collector (online, one observation per new step).

The reference is the median m of recent in-control latencies and its robust sigma
s = max(1.4826 x MAD, REL_FLOOR x m) (the floor keeps a very steady series from calling a 2 %
wobble a shift). Each observation x adds z = min((x - m) / s, Z_CAP) - DRIFT to S (S >= 0). A
shift is on while S > H. Because one observation adds at most Z_CAP - DRIFT = 3 < H = 10, a
single spike (or three in a row) never fires: the latency must stay high for at least four steps.
S is capped at 2 H so the flag clears within ~10 steps of the latency coming back.

A shift must also be big enough to matter: the flag needs the median of the excursion's latest
RECENT steps at least min_ratio x m (MIN_RATIO, the regression threshold `diagnose` and `baseline`
use; the exporter takes alerts.shift_ratio). A smaller, lasting change of level (a machine's load,
a firmware's few per cent) is not a shift: the reference follows it as it follows slow drift.
"""

import statistics
from collections import deque

from collbench.baselines.comparison import DEFAULT_THRESHOLD

WARMUP = 12          # observations before the reference is trusted
WINDOW = 50          # in-control observations the reference is taken from
REL_FLOOR = 0.05     # sigma is at least 5 % of the median
Z_CAP = 4.0
DRIFT = 1.0
H = 10.0
RECENT = 8           # latest steps of an excursion its size is judged on
MIN_RATIO = DEFAULT_THRESHOLD   # a shift is at least this x the reference (1.2: +20 %)


def robust_reference(values):
    """(median, robust sigma with the floor) of a list of latencies."""
    m = statistics.median(values)
    mad = statistics.median(abs(v - m) for v in values)
    return m, max(1.4826 * mad, REL_FLOOR * abs(m), 1e-9)


class ShiftDetector:
    """Feed latencies one at a time (add); `shift` says whether a persistent shift is on,
    `statistic` is S, `change_index` the observation where the current excursion began, `ratio`
    the median of the excursion's latest RECENT steps (the latest RECENT in control) over the
    reference median."""

    __slots__ = ("window", "count", "statistic", "shift", "change_index", "median", "sigma", "_stale",
                 "recent", "ratio", "min_ratio")

    def __init__(self, min_ratio=MIN_RATIO):
        self.min_ratio = min_ratio
        self.recent = deque(maxlen=RECENT)
        self.ratio = None
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
                self.recent.extend(list(self.window)[-RECENT:])
                self.ratio = self._ratio(self.recent)
            return None
        z = min((x - self.median) / self.sigma, Z_CAP)
        before = self.statistic
        self.statistic = min(max(0.0, before + z - DRIFT), 2 * H)
        if before == 0.0 and self.statistic > 0.0:
            self.change_index = i
        elif self.statistic == 0.0:
            self.change_index = None
        self.recent.append(x)
        n = RECENT if self.change_index is None else min(RECENT, i - self.change_index + 1)
        self.ratio = self._ratio(list(self.recent)[-n:])
        big = self.ratio >= self.min_ratio
        self.shift = self.statistic > H and big
        if not self.shift and (self.statistic < H / 2 or not big):
            # in control: the reference follows slow drift and small changes of level, never a
            # shift in progress
            self.window.append(x)
            self._stale = True
            if i % 10 == 0:
                self._refresh()
        return z

    def _ratio(self, values):
        """The median of `values` over the reference median."""
        return statistics.median(values) / self.median if self.median > 0 else 1.0

    def _refresh(self):
        if self._stale and len(self.window) >= WARMUP:
            self.median, self.sigma = robust_reference(list(self.window))
            self._stale = False
