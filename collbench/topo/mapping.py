"""Rank mapping methods and `map_order`, the one entry point (`topo map`, later `topo compare`).

An order is a list: order[new rank] = rank in the matrix file (the original order, whose own
order is the identity). Every method's order is judged by the same cost model (patterns.py), so
their predicted costs compare directly:

| method    | what                                                                          |
|-----------|-------------------------------------------------------------------------------|
| identity  | the matrix's own order (the scheduler's), the baseline of every ratio         |
| greedy    | the topology-aware collectives report's greedy heuristic, as written there    |
| heuristic | greedy starts + local search on the cost model (any P; P = 1024 in seconds)    |
| exact     | the optimum, P <= 16 (ring: Held–Karp; recursive doubling: branch and bound)   |
| auto      | exact when P <= 16, else heuristic; the best order computed in any case       |
"""

import sys
import time

from collbench.errors import UserError
from collbench.topo import exact as exact_mod
from collbench.topo import local_search
from collbench.topo.outliers import host_groups, snap_noise
from collbench.topo.patterns import (PATTERNS, algorithm_name, bottleneck, evaluate, evaluate_shared,
                                     is_power_of_two, round_maxima, rounds)
from collbench.topo.greedy import greedy_recursive_doubling, greedy_ring

METHODS = ("greedy", "exact", "heuristic", "auto")
# older method names still accepted (with a warning naming the new one): `seed` named the greedy
# heuristic after the prototype's scripts it came from
METHOD_ALIASES = {"seed": "greedy"}


def method_arg(text):
    """--method's value (argparse type): an older name becomes the new one, with a warning on stderr."""
    new = METHOD_ALIASES.get(text)
    if new is None:
        return text
    print(f"collbench: warning: --method {text} is deprecated, use --method {new}", file=sys.stderr)
    return new
EXACT_MAX = exact_mod.EXACT_RING_MAX
# preference on equal cost: a proven optimum, then the search, then the report's greedy order, then no change
_PREFERENCE = ("exact", "heuristic", "greedy", "identity")


class MethodResult:
    """One method's order and its predicted cost.

    order: list, order[new rank] = matrix rank. primary/secondary: the cost model's two numbers
    (primary: predicted time in the metric's cost unit, us or us per MB of block). worst_cost: the
    slowest pair's cost, worst_pair: its two new ranks. optimal: True when proven optimal, False
    when an exact search stopped at its limit, None for heuristics.
    """

    def __init__(self, method, order, value, worst, seconds, optimal=None, note=""):
        self.method = method
        self.order = list(order)
        self.primary, self.secondary = value
        self.worst_cost, wa, wb = worst
        self.worst_pair = (wa, wb)
        self.seconds = seconds
        self.optimal = optimal
        self.note = note
        self.shared = None              # cost under the shared-uplink model (bandwidth, racks found)


class MapResult:
    """All methods' results for one (matrix, pattern, metric); `chosen` names the order to use."""

    def __init__(self, matrix, pattern, rnds, results, chosen, groups=None):
        self.matrix = matrix
        self.pattern = pattern
        self.metric = matrix.metric
        self.rounds = rnds
        self.results = results          # {method name: MethodResult}, identity first
        self.chosen = chosen
        self.groups = groups            # group index per matrix rank when the shared model applies
        self.cost = None                # the cost matrix the orders were judged by (map_order sets it)
        self.snapped = 0                # pairs counted at their class median (measurement noise)

    @property
    def order(self):
        return self.results[self.chosen].order

    @property
    def labels(self):
        """The matrix labels in new rank order: rank r runs on labels[r]."""
        return [self.matrix.labels[i] for i in self.order]

    @property
    def algorithm(self):
        return algorithm_name(self.pattern, self.matrix.size)

    def ratio(self, method):
        """Predicted cost relative to the identity order (< 1: faster)."""
        base = self.results["identity"].primary
        return self.results[method].primary / base if base > 0 else 1.0

    def speedup(self, method):
        """Predicted speed-up over the identity order (identity cost / method cost)."""
        r = self.ratio(method)
        return 1.0 / r if r > 0 else 1.0

    def shared_speedup(self, method):
        """Predicted speed-up over the identity order if the racks' links share one uplink (None
        when the model does not apply: latency metric, or no rack structure found)."""
        mine, base = self.results[method].shared, self.results["identity"].shared
        if mine is None or base is None or mine <= 0:
            return None
        return base / mine

    def worst_value(self, method):
        """The slowest pair in the metric's own unit (us, or GB/s for bandwidth)."""
        return self.metric.value_of_cost(self.results[method].worst_cost)

    def rows(self):
        """One dict per method, identity first: the table / CSV / JSON rows."""
        out = []
        labels = self.matrix.labels
        for name, r in self.results.items():
            a, b = r.worst_pair
            out.append({
                "method": name,
                "chosen": name == self.chosen,
                "cost": r.primary,
                "cost_unit": self.metric.cost_unit,
                "vs_identity": self.ratio(name),
                "speedup": self.speedup(name),
                "worst_pair": [labels[r.order[a]], labels[r.order[b]]] if a is not None else None,
                "worst_value": self.worst_value(name) if a is not None else None,
                "worst_unit": self.metric.unit,
                "tie_break_sum": r.secondary,
                "shared_cost": r.shared,
                "shared_speedup": self.shared_speedup(name),
                "seconds": r.seconds,
                "optimal": r.optimal,
                "note": r.note,
            })
        return out

    def to_dict(self):
        """The whole result as JSON-ready data (`topo map --format json`, mapping.json)."""
        return {
            "pattern": self.pattern,
            "algorithm": self.algorithm,
            "metric": self.metric.name,
            "matrix": self.matrix.source,
            "ranks": self.matrix.size,
            "chosen": self.chosen,
            "order": self.order,
            "hosts_order": self.labels,
            "methods": self.rows(),
            "groups": None if self.groups is None else
            [[self.matrix.labels[h] for h in range(self.matrix.size) if self.groups[h] == g]
             for g in range(max(self.groups) + 1)],
            "rounds": [{"weight": w, "worst_cost": c} for w, c, _ in
                       round_maxima(self.order, self.cost, self.rounds)],
            "pairs_at_class_median": self.snapped,
        }


def effective_cost(matrix, raw_costs=False):
    """(cost matrix the methods judge orders by, pairs snapped): the measured costs with the noise
    of tight classes taken out (outliers.snap_noise), or as measured with raw_costs."""
    cost = matrix.cost()
    return (cost, 0) if raw_costs else snap_noise(matrix, cost)


def predict(matrix, pattern, order, cost=None, groups=None, raw_costs=False):
    """The cost model for one order (for `topo compare`): {'cost', 'tie_break_sum', 'worst_cost',
    'cost_unit', 'shared_cost'}; cost is the predicted time in us (latency) or us per MB of block
    (bandwidth); shared_cost the shared-uplink model's when groups (outliers.host_groups) are given.
    cost: the matrix to judge by (default: effective_cost(matrix, raw_costs), as map_order)."""
    cost = cost if cost is not None else effective_cost(matrix, raw_costs)[0]
    rnds = rounds(pattern, matrix.size, matrix.metric.name)
    prim, sec = evaluate(order, cost, rnds)
    return {"cost": prim, "tie_break_sum": sec, "worst_cost": bottleneck(order, cost, rnds)[0],
            "cost_unit": matrix.metric.cost_unit,
            "shared_cost": None if groups is None else evaluate_shared(order, cost, rnds, groups)}


def _check_order(order, p):
    if sorted(order) != list(range(p)):
        raise AssertionError(f"internal error: not a permutation of {p} ranks: {order}")


def map_order(matrix, pattern, method="auto", time_limit=None, exact_time_limit=30.0, raw_costs=False):
    """Compute the orders for one pattern; returns a MapResult.

    method picks `chosen` (see the module doc); every method that applies is computed so the
    table can compare them. The orders are judged by effective_cost(matrix, raw_costs).
    time_limit: seconds for the heuristic's local search (default 0.5 + P/250, 4 s at most).
    exact_time_limit: the recursive-doubling branch and bound's budget.
    """
    if pattern not in PATTERNS:
        raise UserError(f"--pattern: got {pattern!r}, expected one of {', '.join(PATTERNS)}")
    if method not in METHODS:
        raise UserError(f"--method: got {method!r}, expected one of {', '.join(METHODS)}")
    p = matrix.size
    if method == "exact" and p > EXACT_MAX:
        raise UserError(f"--method exact: {p} ranks; the exact search is limited to {EXACT_MAX} "
                        f"(use heuristic or auto)")
    cost, snapped = effective_cost(matrix, raw_costs)
    rnds = rounds(pattern, p, matrix.metric.name)
    if time_limit is None:
        time_limit = min(4.0, 0.5 + p / 250.0)
    results = {}

    def record(name, fn, optimal=None, note=""):
        t0 = time.perf_counter()
        out = fn()
        order, opt = out if isinstance(out, tuple) else (out, optimal)
        secs = time.perf_counter() - t0
        _check_order(order, p)
        results[name] = MethodResult(name, order, evaluate(order, cost, rnds), bottleneck(order, cost, rnds),
                                     secs, opt, note)

    record("identity", lambda: list(range(p)))
    if pattern == "ring":
        record("greedy", lambda: greedy_ring(cost), note="nearest neighbour from rank 0")
        starts = [results["greedy"].order, results["identity"].order]
        record("heuristic", lambda: local_search.improve_ring(cost, starts, rnds, time_limit))
        if p <= EXACT_MAX:
            record("exact", lambda: exact_mod.exact_ring(cost), optimal=True, note="Held-Karp")
    else:
        note = "" if is_power_of_two(p) else "P not a power of two: judged as Bruck"
        record("greedy", lambda: greedy_recursive_doubling(cost), note=note)
        starts = [results["greedy"].order, results["identity"].order]
        record("heuristic", lambda: local_search.improve_rounds(cost, starts, rnds, time_limit), note=note)
        if p <= EXACT_MAX:
            equal_weights = len({rd.weight for rd in rnds}) <= 1
            best_known = min((results[m] for m in ("heuristic", "greedy")),
                             key=lambda r: (r.primary, r.secondary)).order
            record("exact", lambda: exact_mod.exact_rounds(
                cost, rnds, upper=best_known, time_limit=exact_time_limit,
                dims_symmetric=equal_weights and is_power_of_two(p), power_of_two=is_power_of_two(p)),
                note="branch and bound")
            ex = results["exact"]
            # the search proves the predicted time; among equally fast orders polish the tie-break
            t0 = time.perf_counter()
            polished = local_search.improve_rounds(cost, [ex.order], rnds, time_limit=1.0, kicks=0)
            _check_order(polished, p)
            results["exact"] = MethodResult("exact", polished, evaluate(polished, cost, rnds),
                                            bottleneck(polished, cost, rnds),
                                            ex.seconds + time.perf_counter() - t0, ex.optimal,
                                            "branch and bound (time proven optimal, tie-break "
                                            "sum by local search)")
            if not ex.optimal:
                results["exact"].note = (f"branch and bound stopped at its limit "
                                         f"({exact_time_limit:g} s): best found, not proven")
    groups = None
    if matrix.metric.higher_is_better:
        found = host_groups(matrix)
        if max(found) > 0:
            groups = found
            for r in results.values():
                r.shared = evaluate_shared(r.order, cost, rnds, groups)
    if method == "auto":
        chosen = min(results, key=lambda m: (results[m].primary, results[m].secondary, _PREFERENCE.index(m)))
        # a strictly-better-by-rounding order does not displace a proven optimum
        if "exact" in results and results["exact"].optimal:
            ex = results["exact"]
            best = results[chosen]
            if ex.primary <= best.primary * (1 + 1e-9) and ex.secondary <= best.secondary * (1 + 1e-9):
                chosen = "exact"
    else:
        chosen = method
    res = MapResult(matrix, pattern, rnds, results, chosen, groups)
    res.cost = cost
    res.snapped = snapped
    return res
