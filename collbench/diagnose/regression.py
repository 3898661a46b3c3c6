"""Which series regressed, and which of their steps were the slow ones.

With a baseline: a series regressed when its median latency is above the baseline's bound
(baselines.comparison.regression_bound_us: the same bound as `baseline compare`, past the
baseline's slowest run too); its slow steps are those above the bound, the good ones the rest.
Without one: a persistent shift within the series itself (change_point.ShiftDetector: a spike is
not a shift); an excursion fires only when its latest steps reach `threshold` times the reference
(the exporter's alerts.shift_ratio gate). The good steps are those of no fired excursion; the slow
ones those of the fired excursions -- their upper level when they hold two (_upper_level), so a
milder change of level in a long log, on its own or running into the shift, never dilutes a real
shift's evidence. The slow steps' median must be at least
`threshold` times the good steps'.

The counters' normal of a shift (Regression.normal) is its good steps before the onset: a fault
does not slow every step it touches (a lossy link slowed 86 of 482 steps of the stress loop's
allreduce here, through retransmission timeouts), and the good steps after the onset carry its
counters too -- taken as the normal they made the lossy path's own loss read as 0.44x normal.
The onset is where the series first left its level (_first_departure): a fault's first steps
often stay under the alert's gate, and the reference follows them.
"""

import math
from dataclasses import dataclass, field

from collbench.baselines.comparison import DEFAULT_K, DEFAULT_THRESHOLD
from collbench.change_point import DRIFT, MIN_RATIO, WARMUP, ShiftDetector
from collbench.stats import median

SHIFT_STEPS = 4                   # a shift shows in four steps at least (change_point)
MIN_SHIFT_STEPS = WARMUP + SHIFT_STEPS   # ... after the warm-up
MIN_NORMAL_STEPS = WARMUP         # good steps before the onset a counter normal needs (as many as the
                                  # shift test's own reference); fewer: every good step is the normal


@dataclass
class Regression:
    key: object                    # BaselineKey
    method: str                    # "baseline" or "shift"
    reference_us: float            # the baseline median, or the good steps' median
    current_us: float              # the slow steps' median
    bound_us: float                # what "slow" meant
    slow: list                     # indices of the slow steps
    good: list                     # indices of the good steps
    steps: int
    first_slow_ts: float = None
    notes: list = field(default_factory=list)
    normal: list = None            # indices of the steps the counters are weighed against (None: good)
    onset_ts: float = None         # when the series left its level: the normal is the good steps before it

    @property
    def normal_steps(self):
        return self.good if self.normal is None else self.normal

    @property
    def ratio(self):
        return self.current_us / self.reference_us if self.reference_us > 0 else float("inf")


def against_baseline(key, steps, entry, threshold=DEFAULT_THRESHOLD, k=DEFAULT_K):
    """A Regression when the series' median is above the baseline entry's bound, else None."""
    bound = entry.regression_bound_us(threshold, k)
    lat = [s.latency_us for s in steps]
    if not lat or median(lat) <= bound:
        return None
    slow = [i for i, x in enumerate(lat) if x > bound]
    good = [i for i, x in enumerate(lat) if x <= bound]
    return Regression(key, "baseline", entry.median_us, median(lat[i] for i in slow), bound,
                      slow, good, len(steps), steps[slow[0]].ts)


def shift(key, steps, threshold=DEFAULT_THRESHOLD):
    """A Regression when the series holds a persistent shift upward, else None."""
    det = ShiftDetector(min_ratio=threshold)
    slow, excursion, fired = [], [], False
    for i, s in enumerate(steps):
        z = det.add(s.latency_us)
        if z is None:
            continue
        if det.statistic > 0:
            if z > DRIFT:              # the steps that pushed the statistic up
                excursion.append(i)
            fired = fired or det.shift
        if det.statistic == 0 or i == len(steps) - 1:
            if fired:
                slow += excursion
            excursion, fired = [], False
    if not slow:
        return None
    in_fired = set(slow)
    good = [i for i in range(len(steps)) if i not in in_fired]
    if not good:
        return None
    ref = median(steps[i].latency_us for i in good)
    slow = _upper_level(slow, [steps[i].latency_us for i in slow], threshold)
    cur = median(steps[i].latency_us for i in slow)
    if cur < threshold * ref:
        return None
    reg = Regression(key, "shift", ref, cur, min(steps[i].latency_us for i in slow), slow, good, len(steps),
                     steps[slow[0]].ts)
    for onset in (_first_departure(steps, slow[0]), slow[0]):
        before = [i for i in good if i < onset]
        if len(before) >= MIN_NORMAL_STEPS:
            reg.normal, reg.onset_ts = before, steps[onset].ts
            break
    return reg


def _first_departure(steps, first_slow):
    """Where the series first left its level before the shift: the start of its first
    excursion that fired at the smallest shift's gate (MIN_RATIO), else first_slow. A 1 % lossy
    link in the stress loop slowed its steps under the alert's 2.0x gate for 25-80 s before any
    crossed it, so the shift test's reference followed them; they carried the link's loss, and
    as the normal they made it read 0.3-0.4x normal. Chosen from latency alone, never from the
    counters the normal is for, so it cannot pick a stretch because its counters were quiet."""
    det = ShiftDetector(min_ratio=MIN_RATIO)
    for s in steps[:first_slow + 1]:
        det.add(s.latency_us)
        if det.shift:
            return det.change_index
    return first_slow


def _upper_level(indices, latencies, threshold):
    """The fired steps that are the shift. When they hold two levels -- a milder change of level
    that ran into the shift or fired on its own, and the shift -- the upper one, so the milder
    one's counters never dilute the shift's evidence: the best split in two (least squares over
    log latency) whose upper part has at least SHIFT_STEPS steps and a median at least `threshold`
    times the lower part's. Otherwise all of them."""
    order = sorted(range(len(indices)), key=lambda j: latencies[j])
    logs = [math.log(max(latencies[j], 1e-9)) for j in order]
    n = len(logs)
    total, total_sq = sum(logs), sum(x * x for x in logs)
    best, best_k, low, low_sq = None, None, 0.0, 0.0
    for k in range(1, n - SHIFT_STEPS + 1):       # lower part logs[:k], upper part logs[k:]
        low += logs[k - 1]
        low_sq += logs[k - 1] ** 2
        high, high_sq = total - low, total_sq - low_sq
        sse = (low_sq - low * low / k) + (high_sq - high * high / (n - k))
        if best is None or sse < best:
            best, best_k = sse, k
    if best_k is None:
        return indices
    lower = [latencies[j] for j in order[:best_k]]
    upper = [latencies[j] for j in order[best_k:]]
    if median(upper) < threshold * median(lower):
        return indices
    return sorted(indices[j] for j in order[best_k:])


def detect(series, baseline=None, threshold=DEFAULT_THRESHOLD, k=DEFAULT_K, shift_ratio=None):
    """(regressions, notes): every series checked against the baseline (a key it lacks is noted),
    or for a shift when there is none (a series too short for one is noted). shift_ratio: the
    shift test's size gate (the config's alerts.shift_ratio: the gate of the alert that sent the
    operator here); None: threshold."""
    found, short, unmatched = [], 0, 0
    for key in sorted(series, key=lambda k: k.sort_key()):
        steps = series[key]
        if baseline is not None:
            entry = baseline.entries.get(key)
            if entry is None:
                unmatched += 1
                continue
            r = against_baseline(key, steps, entry, threshold, k)
        elif len(steps) < MIN_SHIFT_STEPS:
            short += 1
            continue
        else:
            r = shift(key, steps, shift_ratio or threshold)
        if r is not None:
            found.append(r)
    notes = []
    if short:
        notes.append(f"{short} series had fewer than {MIN_SHIFT_STEPS} steps: too few for a shift test "
                     "without a baseline (--baseline NAME)")
    if unmatched:
        notes.append(f"{unmatched} series have no entry in the baseline (new op, size, ranks or transport)")
    return found, notes
