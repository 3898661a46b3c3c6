"""Current latency against a baseline: ratio and a verdict that accounts for the noise.

For each key, with m the baseline median, s its robust sigma (1.4826 x MAD of the baseline
runs), c the current median, T the threshold (default 1.2) and k the noise factor (default 3):

    upper bound  U = max(T x m, m + k x s)
    regression   c > U             slower by more than T and outside the baseline's noise
    noisy        T x m < c <= U    slower by more than T, but the baseline itself varied that much
    improved     c < min(m / T, m - k x s)
    ok           otherwise
    new          a current key the baseline does not have
    missing      a baseline key with no current measurement

Only `regression` fails (exit 1); `missing` too with --fail-on-missing. The same bound U is
what the exporter's baseline series and the CollbenchLatencyRegression rule use
(`regression_bound_us`), so the CLI and the alert agree.
"""

from dataclasses import dataclass

DEFAULT_THRESHOLD = 1.2
DEFAULT_K = 3.0

REGRESSION, NOISY, OK, IMPROVED, NEW, MISSING = "regression", "noisy", "ok", "improved", "new", "missing"
VERDICT_ORDER = (REGRESSION, NOISY, MISSING, NEW, IMPROVED, OK)


def regression_bound_us(median_us, sigma_us, threshold=DEFAULT_THRESHOLD, k=DEFAULT_K):
    """The latency above which a current median is a regression: max(T*m, m + k*s)."""
    return max(threshold * median_us, median_us + k * sigma_us)


def improvement_bound_us(median_us, sigma_us, threshold=DEFAULT_THRESHOLD, k=DEFAULT_K):
    return min(median_us / threshold, median_us - k * sigma_us)


def verdict(median_us, sigma_us, current_us, threshold=DEFAULT_THRESHOLD, k=DEFAULT_K):
    """(verdict, upper bound) for one key (see the module doc)."""
    upper = regression_bound_us(median_us, sigma_us, threshold, k)
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
            out.append(Comparison(key, entry, None, None,
                                  regression_bound_us(entry.median_us, entry.sigma_us, threshold, k), MISSING))
        else:
            v, bound = verdict(entry.median_us, entry.sigma_us, cur["median"], threshold, k)
            out.append(Comparison(key, entry, cur, cur["median"] / entry.median_us, bound, v))
    out.sort(key=lambda c: c.key.sort_key())
    return out


def counts(comparisons):
    out = {v: 0 for v in VERDICT_ORDER}
    for c in comparisons:
        out[c.verdict] += 1
    return out
