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
each at 1 - 5 %/tries, table.annotate). Both intervals are collbench/stats.py's (shared with
`topo compare`); this module is the choice made with them.

Choice. At a size the file forces the algorithm whose interval lies wholly above 1 + margin (the
highest lower end when several do); where none does it keeps the library's own choice (the
`default` row is the chosen one). MPICH's env file forces one algorithm for every size of an op,
so there an algorithm is forced only when it is proven at some size and, at every other measured
size, its interval lies above 1 - margin (never slower by more than the margin, proven).
"""

import math

# the speed-up and its intervals are the shared statistics module's (collbench/stats.py)
from collbench.stats import CONFIDENCE, bootstrap_speedup, geometric_mean, rank_cut, speedup_interval  # noqa: F401

DEFAULT_MARGIN = 0.05
MIN_BLOCKS = 5           # adaptive: never stop before this many blocks (fewer rarely reach 95 %)
MAX_BLOCKS = 100


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
