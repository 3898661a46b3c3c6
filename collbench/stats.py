"""Statistics of repeated measurements, for every verb: robust summaries (median, quartiles, MAD,
the robust sigma) and the speed-up of one set of latencies over another with its interval.

Benchmarks repeat: a stress log holds the same (op, size) thousands of times, a baseline N runs.
The median and the median absolute deviation (MAD) do not move when one run hit a noisy
neighbour; 1.4826 x MAD estimates the standard deviation of normally distributed noise.

Speed-up: median(baseline) / median(candidate) (latencies: > 1 is faster). Its interval:
speedup_interval, the distribution-free Mann-Whitney (Hodges-Lehmann) interval of the ratio, cut at
the exact rank-sum quantiles (`compare`: with few samples it is wide or absent, so one lucky job
proves nothing); bootstrap_speedup, a percentile bootstrap of the ratio of medians (`topo
compare`), narrower with few samples (compare/stats.py says by how much).
"""

import math
import random
import statistics

MAD_TO_SIGMA = 1.4826
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 13
CONFIDENCE = 0.95


def quantile(sorted_values, q):
    """The q-quantile (0..1) of an ascending sequence, linear between closest ranks; None if empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    pos = (n - 1) * q
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def median(values):
    return quantile(sorted(values), 0.5)


def summarize(values):
    """{n, median, q1, q3, mad, sigma, min, max} of a sequence of numbers; None if empty."""
    s = sorted(values)
    if not s:
        return None
    med = quantile(s, 0.5)
    mad = quantile(sorted(abs(v - med) for v in s), 0.5)
    return {"n": len(s), "median": med, "q1": quantile(s, 0.25), "q3": quantile(s, 0.75),
            "mad": mad, "sigma": MAD_TO_SIGMA * mad, "min": s[0], "max": s[-1]}


def speedup_interval(baseline, candidate, confidence=CONFIDENCE):
    """(speed-up, low, high): median(baseline) / median(candidate) (latencies: > 1 is faster) and
    the distribution-free interval of the ratio (Mann-Whitney, as Hodges-Lehmann's: the order
    statistics of every baseline/candidate ratio of samples, cut where the exact rank-sum
    distribution puts (1 - confidence)/2 on each side). low/high None when the samples are too
    few for that confidence (3 blocks a side cannot reach 95 %: a win is then never proven)."""
    baseline = [x for x in baseline if _positive(x)]
    candidate = [x for x in candidate if _positive(x)]
    if not baseline or not candidate:
        return None, None, None
    point = statistics.median(baseline) / statistics.median(candidate)
    k = rank_cut(len(baseline), len(candidate), (1.0 - confidence) / 2.0)
    if k is None:
        return point, None, None
    ratios = sorted(math.log(b) - math.log(c) for b in baseline for c in candidate)
    return point, math.exp(ratios[k - 1]), math.exp(ratios[len(ratios) - k])


def bootstrap_speedup(baseline, candidate, samples=BOOTSTRAP_SAMPLES, confidence=CONFIDENCE, seed=BOOTSTRAP_SEED):
    """(speed-up, low, high) with a percentile-bootstrap interval of the ratio of medians (`topo
    compare`'s method: both sides resampled with replacement, fixed seed so the same data give the
    same interval). With a few blocks it is too narrow (noise-only fakes,
    5 algorithms at 3 sizes, Bonferroni-adjusted: 'proven' wins for 2.0 % of the algorithms at 3
    blocks, 0.6 % at 4, 0.13 % at 6; the rank interval: none of 15,000 at 3 and 4 blocks), so
    `compare`'s choice uses speedup_interval."""
    baseline = [x for x in baseline if _positive(x)]
    candidate = [x for x in candidate if _positive(x)]
    if not baseline or not candidate:
        return None, None, None
    point = statistics.median(baseline) / statistics.median(candidate)
    if len(baseline) < 2 or len(candidate) < 2:
        return point, None, None
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(baseline, k=len(baseline)))
                    / statistics.median(rng.choices(candidate, k=len(candidate))) for _ in range(samples))
    tail = (1.0 - confidence) / 2.0
    lo = ratios[int(math.floor(tail * samples))]
    hi = ratios[min(samples - 1, int(math.ceil((1.0 - tail) * samples)) - 1)]
    return point, lo, hi


_U_COUNTS = {}
EXACT_LIMIT = 400          # m * n up to this: the exact rank-sum distribution; above: the normal one


def _u_counts(m, n):
    """How many of the C(m+n, m) orderings give each Mann-Whitney U (0 .. m*n)."""
    key = (min(m, n), max(m, n))
    if key in _U_COUNTS:
        return _U_COUNTS[key]
    m, n = key
    # f[j][u]: orderings of i baseline and j candidate samples with U = u, built up over i
    f = [[1] + [0] * (m * n) for _ in range(n + 1)]        # i = 0: U = 0 whatever j
    for i in range(1, m + 1):
        g = [[0] * (m * n + 1) for _ in range(n + 1)]
        g[0][0] = 1
        for j in range(1, n + 1):
            for u in range(i * j + 1):
                # the largest of the i + j samples is a baseline one (it beats all j) or a candidate one
                g[j][u] = (f[j][u - j] if u >= j else 0) + g[j - 1][u]
        f = g
    _U_COUNTS[key] = f[n]
    return f[n]


def rank_cut(m, n, tail):
    """k (1-based) such that the k-th smallest and k-th largest of the m*n pairwise differences
    bound an interval with at most `tail` outside on each side; None if even k = 1 cannot."""
    if m * n <= EXACT_LIMIT:
        counts = _u_counts(m, n)
        total = math.comb(m + n, m)
        below, k = 0, 0
        for u, c in enumerate(counts):
            below += c
            if below / total > tail:
                break
            k = u + 1             # P(U <= u) <= tail: the (u+1)-th difference may bound the interval
        return k or None
    z = statistics.NormalDist().inv_cdf(1.0 - tail)
    k = int(math.floor(m * n / 2.0 - z * math.sqrt(m * n * (m + n + 1) / 12.0)))
    return k if k >= 1 else None


def _positive(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def geometric_mean(values):
    values = [v for v in values if _positive(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))
