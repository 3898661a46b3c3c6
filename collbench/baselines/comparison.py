"""Current latency against a baseline: ratio and a verdict that accounts for the noise.

For each key, with m the baseline median, s its robust sigma (1.4826 x MAD of the baseline
runs), w its slowest run, c the current median, T the threshold (default 1.2) and k the noise
factor (default 3):

    upper bound  U = max(T x m, m + k x s, SLOWEST_MARGIN x w)
    regression   c > U             slower by more than T and outside the baseline's noise
    noisy        T x m < c <= U    slower by more than T, but the baseline itself varied that much
    improved     c < min(m / T, m - k x s)
    ok           otherwise
    new          a current key the baseline does not have
    missing      a baseline key with no current measurement

Only `regression` fails (exit 1); `missing` too with --fail-on-missing.

Why the slowest run: the MAD ignores a baseline's rare slow runs by design, yet they are the
machine's own noise. On the 2-core namespace testbed a whole quiet run is now and then 1.8-3.3x
slower in every series at once (bench/quiet_false_alarms.py): against max(T x m, m + k x s)
alone 40-55 % of quiet `once` runs came out regressions. A baseline that saw such a run has
measured that noise, and a current median inside it is `noisy`, not a regression.

The CollbenchLatencyRegression rule uses max(T x m, m + k x s) on the exporter's baseline series
(collbench_baseline_latency_seconds and _sigma_seconds); a single slow scrape is kept from it by
its `for:` (2m), which a one-shot comparison has no equivalent of.
"""

from dataclasses import dataclass

DEFAULT_THRESHOLD = 1.2
DEFAULT_K = 3.0
# A regression is slower than the baseline's slowest run by more than this: its own worst is noise
# it has measured (module doc), and 10 % past it leaves the verdict to what the runs never did.
SLOWEST_MARGIN = 1.1

REGRESSION, NOISY, OK, IMPROVED, NEW, MISSING = "regression", "noisy", "ok", "improved", "new", "missing"
VERDICT_ORDER = (REGRESSION, NOISY, MISSING, NEW, IMPROVED, OK)


def regression_bound_us(median_us, sigma_us, threshold=DEFAULT_THRESHOLD, k=DEFAULT_K, slowest_us=None):
    """The latency above which a current median is a regression: max(T*m, m + k*s), and past
    SLOWEST_MARGIN x the baseline's slowest run when it is given (module doc)."""
    bound = max(threshold * median_us, median_us + k * sigma_us)
    return bound if slowest_us is None else max(bound, SLOWEST_MARGIN * slowest_us)


def improvement_bound_us(median_us, sigma_us, threshold=DEFAULT_THRESHOLD, k=DEFAULT_K):
    return min(median_us / threshold, median_us - k * sigma_us)


def verdict(median_us, sigma_us, current_us, threshold=DEFAULT_THRESHOLD, k=DEFAULT_K, slowest_us=None):
    """(verdict, upper bound) for one key (see the module doc)."""
    upper = regression_bound_us(median_us, sigma_us, threshold, k, slowest_us)
    if current_us > upper:
        return REGRESSION, upper
    if current_us > threshold * median_us:
        return NOISY, upper
    if current_us < improvement_bound_us(median_us, sigma_us, threshold, k):
        return IMPROVED, upper
    return OK, upper


@dataclass
class Comparison:
    key: object                   # BaselineKey
    baseline: object              # Entry or None
    current: dict                 # stats.summarize of current latency_avg_us, or None
    ratio: float
    bound_us: float
    verdict: str

    def as_dict(self):
        k = self.key
        b, c = self.baseline, self.current
        return {"op": k.op, "size": k.size, "size_bytes": k.size_bytes, "ranks": k.ranks, "nodes": k.nodes,
                "transport": k.transport, "engine": k.engine, "algorithm": k.algorithm, "variant": k.variant,
                "baseline_median_us": b.median_us if b else None, "baseline_sigma_us": b.sigma_us if b else None,
                "baseline_n": b.n if b else None,
                "current_median_us": c["median"] if c else None, "current_n": c["n"] if c else None,
                "ratio": self.ratio, "bound_us": self.bound_us, "verdict": self.verdict}


def compare(baseline, current, threshold=DEFAULT_THRESHOLD, k=DEFAULT_K):
    """[Comparison] for every key in the baseline or in current ({BaselineKey: summarize(...)})."""
    out = []
    for key in set(baseline.entries) | set(current):
        entry, cur = baseline.entries.get(key), current.get(key)
        if entry is None:
            out.append(Comparison(key, None, cur, None, None, NEW))
        elif cur is None:
            out.append(Comparison(key, entry, None, None, entry.regression_bound_us(threshold, k), MISSING))
        else:
            v, bound = verdict(entry.median_us, entry.sigma_us, cur["median"], threshold, k, entry.slowest_us)
            out.append(Comparison(key, entry, cur, cur["median"] / entry.median_us, bound, v))
    out.sort(key=lambda c: c.key.sort_key())
    return out


def counts(comparisons):
    out = {v: 0 for v in VERDICT_ORDER}
    for c in comparisons:
        out[c.verdict] += 1
    return out
