"""How sure a speed-up is, and which algorithm the tuning file may force.

Samples. Every (op, algorithm, size) is measured once per block (one MPI job per algorithm per
block, the algorithms in a rotated order each block), so each block gives one sample: that job's
average latency at that size. Jobs, not iterations, are the unit: on a shared machine the time
moves from one job to the next (placement, load), far more than between iterations of one job.

Speed-up. median(default's block samples) / median(the algorithm's), with a 95 % interval that
assumes nothing about the distribution of job times: the Mann-Whitney (Hodges-Lehmann) interval
of the ratio, from the ratios of every default sample to every algorithm sample, cut at the exact
rank-sum quantiles. A percentile bootstrap of the medians (`topo compare`'s method,
bootstrap_speedup) was tried first and is too narrow with few blocks: on noise-only fakes it
"proved" wins several times as often as its 5 % promise. With few blocks the rank interval is
wide or absent (3 blocks a side cannot reach 95 %): one lucky job cannot prove a win. At one size
every forced algorithm is a try at a win, so the intervals there are simultaneous (Bonferroni:
each at 1 - 5 %/tries, table.annotate).

Choice. At a size the file forces the algorithm whose interval lies wholly above 1 + margin (the
highest lower end when several do); where none does it keeps the library's own choice (the
`default` row is the chosen one). MPICH's env file forces one algorithm for every size of an op,
so there an algorithm is forced only when it is proven at some size and, at every other measured
size, its interval lies above 1 - margin (never slower by more than the margin, proven).
"""

import math
import random
import statistics

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 13
CONFIDENCE = 0.95
DEFAULT_MARGIN = 0.05
MIN_BLOCKS = 5           # adaptive: never stop before this many blocks (fewer rarely reach 95 %)
MAX_BLOCKS = 100


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
    compare`'s method), kept for comparison: with a few blocks it is too narrow (noise-only fakes,
    5 algorithms at 3 sizes, Bonferroni-adjusted: 'proven' wins for 2.0 % of the algorithms at 3
    blocks, 0.6 % at 4, 0.13 % at 6; the rank interval: none of 15,000 at 3 and 4 blocks), so the
    choice uses speedup_interval."""
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


def proven(row, margin):
    """The row's speed-up interval lies wholly above 1 + margin."""
    return row.get("ci_low") is not None and row["ci_low"] > 1.0 + margin


def win(row):
    """The row is faster than default beyond noise: its interval lies wholly above 1."""
    return row.get("ci_low") is not None and row["ci_low"] > 1.0


def settled(row, margin, width):
    """More blocks would not change this row's part in the choice: its interval lies wholly on one
    side of 1 + margin, or is at most `width` wide (relative to the speed-up)."""
    lo, hi, s = row.get("ci_low"), row.get("ci_high"), row.get("speedup")
    if lo is None or hi is None or not s:
        return False
    threshold = 1.0 + margin
    return lo > threshold or hi < threshold or (hi - lo) / s <= width


def choose(group, margin, candidate):
    """The chosen row of one (op, size) group: the candidate (a usable forced algorithm) proven
    above 1 + margin with the highest interval low end, else the default row (None if absent)."""
    wins = [r for r in group if candidate(r) and proven(r, margin)]
    if wins:
        return max(wins, key=lambda r: (r["ci_low"], r["speedup"]))
    return next((r for r in group if r["algorithm"] == "default"), None)


def mpich_choice(rows_by_size, margin):
    """MPICH's one algorithm for all sizes of an op, or None (keep the library's choice).

    rows_by_size: {size: {algorithm: row}} of usable forced rows with intervals. An algorithm
    qualifies when it is proven (above 1 + margin) at one size at least and its interval's low
    end is at least 1 - margin at every measured size; of those, the one proven at the most sizes
    (then the highest geometric mean speed-up)."""
    sizes = list(rows_by_size)
    names = {a for by_alg in rows_by_size.values() for a in by_alg}
    best, best_key = None, None
    for name in sorted(names):
        rows = [rows_by_size[s].get(name) for s in sizes]
        if any(r is None or r.get("ci_low") is None for r in rows):
            continue            # not measured (or not usable) at every size: cannot force it for all
        if any(r["ci_low"] < 1.0 - margin for r in rows):
            continue
        n_proven = sum(1 for r in rows if proven(r, margin))
        if not n_proven:
            continue
        geo = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
        key = (n_proven, geo)
        if best_key is None or key > best_key:
            best, best_key = name, key
    return best


def geometric_mean(values):
    values = [v for v in values if _positive(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))
