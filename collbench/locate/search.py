"""Find one slow host or link with few probes, whatever runs the probes (a real MPI job, or a
simulated fabric): group testing by bisection, then every pair inside the suspect group.

1. Bisection. The hosts still suspected are split in two halves and the collective runs on each
   half (one probe each). A slow host or link slows every collective it takes part in, so the
   half that is slower than the other by `ratio` or more holds it; the other half is cleared and
   its hosts become references. With no half slower beyond `ratio` at the first split, nothing
   is slower than its peers beyond the noise: nothing is named. Deeper down, halves alike mean
   the slowness lies between them (a link across): the group is kept whole.
2. Pairs. One job measures every pair of the suspect group plus up to two cleared references
   (topo measure's `--pairs` machinery). A host whose pairs are all `ratio` times slower than the
   pairs without it is named; else a single pair that is `ratio` times slower than the others is
   named as a link; else nothing (the groups' slowness did not show between pairs).

A bisection takes 2 log2(P / 3) collective probes and the pairs phase at most 10 pair
measurements: ~30 at P = 1024 where a full matrix measures P (P - 1) / 2 = 523,776 pairs.
"""

import math
import statistics
import time
from dataclasses import dataclass, field

DEFAULT_RATIO = 2.0
PAIR_GROUP = 3          # bisect while more hosts than this are suspected
REFERENCES = 2          # cleared hosts measured beside the suspects


class ProbeFailed(Exception):
    """A probe job failed (a rank died, a host unreachable): its reason."""


@dataclass
class Result:
    culprit: dict = None                  # None, or {"host": h} / {"link": [a, b]} with "evidence"
    probes: list = field(default_factory=list)
    seconds: float = 0.0
    verdict: str = ""                     # one line: why this culprit, or why none

    @property
    def measurements(self):
        """Collective runs plus pairs measured: what a full pairwise matrix's P(P-1)/2 compares to."""
        return sum(1 if p["kind"] == "group" else len(p.get("pairs") or ()) for p in self.probes)

    def to_dict(self):
        return {"culprit": self.culprit, "probes": self.probes, "measurements": self.measurements,
                "seconds": round(self.seconds, 3), "verdict": self.verdict}


def _halves(hosts):
    mid = len(hosts) // 2
    return hosts[:mid], hosts[mid:]


def locate(hosts, prober, ratio=DEFAULT_RATIO, confirm=True, clock=time.monotonic):
    """Result for `hosts` (names, at least 3). prober.group(hosts) -> the collective's time (a
    number, larger is slower; ProbeFailed when the job fails); prober.pairs(hosts) -> {(a, b):
    cost} for every pair (larger is slower). confirm: a slower half, and a named host or link,
    is measured again before it counts (the faster of the two runs is kept)."""
    t0 = clock()
    res = Result()
    suspects, cleared, level, trail = list(hosts), [], 0, []
    while len(suspects) > PAIR_GROUP:
        a, b = _halves(suspects)
        ta, tb = _group(prober, a, res), _group(prober, b, res)
        if _factor(ta, tb) >= ratio and confirm:
            # contention only ever slows a probe: the two halves again, each keeping its faster
            # run, so a half stays slower only when it is slower every time
            ta, tb = min(ta, _group(prober, a, res)), min(tb, _group(prober, b, res))
        slow, fast, ts, tf = (a, b, ta, tb) if ta >= tb else (b, a, tb, ta)
        factor = _factor(ts, tf)
        trail.append({"slow": list(slow), "fast": list(fast), "slow_value": _round(ts), "fast_value": _round(tf),
                      "factor": _round(factor)})
        if factor < ratio:
            if level == 0:
                res.seconds = clock() - t0
                res.verdict = (f"no host or link slower than its peers beyond the noise: the halves' "
                               f"{ts:.4g} and {tf:.4g} differ by {factor:.2f}x (< {ratio:g}x)")
                return res
            break                          # the slowness lies across these halves: keep the group whole
        cleared = list(fast) + cleared
        suspects = list(slow)
        level += 1
    refs = [h for h in cleared if h not in suspects][:REFERENCES]
    group = suspects + refs
    costs = _pairs(prober, group, res, clock, t0)
    res.culprit, res.verdict = judge_pairs(group, costs, ratio, trail)
    if res.culprit is not None and confirm:
        # named once: measured again, and named only when the second run alone names the same
        # host or link (a busy host slows all its pairs in one run, rarely in two); the evidence
        # is each pair's faster run
        again = _pairs(prober, group, res, clock, t0)
        second, _ = judge_pairs(group, again, ratio, trail)
        first = res.culprit
        costs = {k: min(v, again.get(k, v)) for k, v in costs.items()}
        res.culprit, res.verdict = judge_pairs(group, costs, ratio, trail)
        if _name(second) != _name(first) or _name(res.culprit) != _name(first):
            res.culprit = None
            res.verdict = (f"not confirmed: the first pairs run named {_name(first)}, the second "
                           f"{_name(second) or 'nothing'}: slower than its peers only while the machine was busy")
    res.seconds = clock() - t0
    return res


def _name(culprit):
    if culprit is None:
        return None
    return f"host {culprit['host']}" if "host" in culprit else f"link {culprit['link'][0]}-{culprit['link'][1]}"


def _factor(slow, fast):
    slow, fast = max(slow, fast), min(slow, fast)
    return math.inf if fast <= 0 or math.isinf(slow) else slow / fast


def _pairs(prober, group, res, clock, t0):
    try:
        costs = prober.pairs(group)
    except ProbeFailed as e:
        res.probes.append({"kind": "pairs", "hosts": list(group), "failed": str(e)[:300]})
        res.seconds = clock() - t0
        res.verdict = f"the pairs probe of {', '.join(group)} failed: {e}"
        raise LocateFailed(res, str(e)) from None
    res.probes.append({"kind": "pairs", "hosts": list(group),
                       "pairs": [{"a": x, "b": y, "cost": _round(c)} for (x, y), c in sorted(costs.items())]})
    return costs


class LocateFailed(Exception):
    def __init__(self, result, message):
        super().__init__(message)
        self.result = result


def _group(prober, hosts, res):
    try:
        v = float(prober.group(hosts))
        res.probes.append({"kind": "group", "hosts": list(hosts), "value": _round(v)})
    except ProbeFailed as e:
        v = math.inf                       # a job that cannot finish is the slowest of all
        res.probes.append({"kind": "group", "hosts": list(hosts), "value": None, "failed": str(e)[:300]})
    return v


def _round(v):
    return None if v is None or math.isinf(v) else round(v, 6)


def judge_pairs(group, costs, ratio, trail=()):
    """(culprit or None, verdict line) from every pair's cost in `group`."""
    def cost(x, y):
        return costs.get((x, y), costs.get((y, x)))
    pairs = [(x, y) for i, x in enumerate(group) for y in group[i + 1:] if cost(x, y) is not None]
    if len(pairs) < 3:
        return None, "too few pairs measured to compare"
    best = None
    for h in group:
        mine = [cost(x, y) for x, y in pairs if h in (x, y)]
        others = [cost(x, y) for x, y in pairs if h not in (x, y)]
        if not mine or not others:
            continue
        factor = min(mine) / statistics.median(others)
        if factor >= ratio and (best is None or factor > best[1]):
            best = (h, factor, mine, others)
    if best:
        h, factor, mine, others = best
        ev = {"slowest_of_its_pairs_vs_others": round(factor, 3), "its_pairs": len(mine),
              "its_fastest_pair_cost": round(min(mine), 6), "other_pairs_median_cost": round(statistics.median(others), 6),
              "bisection": list(trail)}
        return ({"host": h, "evidence": ev},
                f"host {h}: even its fastest pair is {factor:.1f}x slower than the median pair without it "
                f"(>= {ratio:g}x), after {len(trail)} bisection step(s)")
    ranked = sorted(pairs, key=lambda p: cost(*p), reverse=True)
    top = ranked[0]
    rest = statistics.median(cost(*p) for p in ranked[1:])
    factor = cost(*top) / rest if rest > 0 else math.inf
    second = cost(*ranked[1]) / rest if rest > 0 else math.inf
    if factor >= ratio and second < ratio:
        ev = {"pair_vs_other_pairs": _round(factor), "pair_cost": round(cost(*top), 6),
              "other_pairs_median_cost": round(rest, 6), "bisection": list(trail)}
        return ({"link": list(top), "evidence": ev},
                f"link {top[0]}-{top[1]}: {factor:.1f}x slower than the other pairs (>= {ratio:g}x), its hosts' "
                "other pairs are not")
    return None, (f"no host or link slower than its peers beyond the noise among {', '.join(group)} "
                  f"(slowest pair {factor:.2f}x the others, < {ratio:g}x)"
                  + (f"; the bisection's slower half was {trail[-1]['factor']}x" if trail else ""))
