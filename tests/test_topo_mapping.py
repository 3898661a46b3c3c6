"""Rank mapping: the cost model, the report's greedy heuristics step by step, the exact searches against brute
force, the local search's guarantees, and map_order's method table."""

import random

import pytest

from collbench.errors import UserError
from collbench.topo import exact, local_search
from collbench.topo.mapping import map_order, predict
from collbench.topo.patterns import bottleneck, evaluate, rounds
from collbench.topo.greedy import greedy_recursive_doubling, greedy_ring

from topo_helpers import brute_force, from_cost, rack_cost, random_cost

REL = 1e-9


def line(p):
    """Hosts on a line: cost |i - j|."""
    return [[float(abs(i - j)) for j in range(p)] for i in range(p)]


def close(a, b):
    return abs(a - b) <= REL * max(1.0, abs(a), abs(b))


def lex_le(a, b):
    """(primary, secondary) a <= b with a relative tolerance on both."""
    if a[0] < b[0] and not close(a[0], b[0]):
        return True
    return close(a[0], b[0]) and (a[1] <= b[1] or close(a[1], b[1]))


# ------------------------------------------------------------------------------ cost model

def test_ring_rounds_and_cost():
    rn = rounds("ring", 4, "latency")
    assert len(rn) == 1 and rn[0].weight == 3
    assert rn[0].pairs == [(0, 1), (1, 2), (2, 3), (3, 0)]
    # line of 4: links 1, 1, 1 and the closing 3 -> 3 * max = 9, 3 * sum = 18
    assert evaluate([0, 1, 2, 3], line(4), rn) == (9.0, 18.0)
    assert evaluate([0, 1, 3, 2], line(4), rn) == (6.0, 18.0)


def test_recursive_doubling_rounds_power_of_two():
    lat = rounds("recursive-doubling", 4, "latency")
    assert [rd.pairs for rd in lat] == [[(0, 1), (2, 3)], [(0, 2), (1, 3)]]
    assert [rd.weight for rd in lat] == [1, 1]
    bw = rounds("recursive-doubling", 8, "bandwidth")
    assert [rd.weight for rd in bw] == [1, 2, 4]           # 2^k blocks per pair in round k
    assert bw[2].pairs == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # line of 4: round 0 max 1, round 1 max 2 -> latency 3; bandwidth 1*1 + 2*2 = 5
    assert evaluate([0, 1, 2, 3], line(4), lat)[0] == 3.0
    assert evaluate([0, 1, 2, 3], line(4), rounds("recursive-doubling", 4, "bandwidth"))[0] == 5.0


def test_non_power_of_two_is_judged_as_bruck():
    rn = rounds("recursive-doubling", 6, "bandwidth")
    # distances 1, 2, 4; rank r sends to r - d; blocks min(d, P - d)
    assert [rd.weight for rd in rn] == [1, 2, 2]
    assert rn[0].pairs == [(0, 5), (1, 0), (2, 1), (3, 2), (4, 3), (5, 4)]
    assert rn[2].pairs == [(0, 2), (1, 3), (2, 4), (3, 5), (4, 0), (5, 1)]
    # line of 6: maxima 5 (0-5), 4 (0-4, 1-5), 4 (4-0, 5-1)
    assert evaluate(list(range(6)), line(6), rounds("recursive-doubling", 6, "latency"))[0] == 13.0
    assert evaluate(list(range(6)), line(6), rn)[0] == 1 * 5 + 2 * 4 + 2 * 4


# ------------------------------------------------------------------------------ greedy heuristics

def test_greedy_ring_is_nearest_neighbour_from_rank_0():
    # positions on a line: 0, 5, 1, 7, 2 -> from 0: 1 (pos 1), 2 (pos 2), then 5, then 7
    pos = [0, 5, 1, 7, 2]
    cost = [[float(abs(a - b)) for b in pos] for a in pos]
    assert greedy_ring(cost) == [0, 2, 4, 1, 3]


def test_greedy_ring_ties_go_to_the_lowest_rank():
    cost = [[0.0 if i == j else 1.0 for j in range(5)] for i in range(5)]
    assert greedy_ring(cost) == [0, 1, 2, 3, 4]


def test_greedy_recursive_doubling_worked_steps():
    """P = 8 on a line, worked by hand from the report's steps (ties -> lowest host):
    ref 0/host 0: rank 4 -> host 1, rank 2 -> host 2 (two mapped: ref = rank 2 on host 2);
    rank 6 -> host 3, rank 3 (2^4 and 2^2 taken, d = 1) -> host 4 (ref = rank 3 on host 4);
    rank 7 -> host 5, rank 1 -> host 6 (ref = rank 1 on host 6); rank 5 -> host 7."""
    assert greedy_recursive_doubling(line(8)) == [0, 6, 2, 4, 1, 7, 3, 5]


def test_greedy_recursive_doubling_all_ties():
    cost = [[0.0 if i == j else 1.0 for j in range(4)] for i in range(4)]
    # rank 2 -> host 1, rank 1 -> host 2, then ref rank 1: rank 3 -> host 3
    assert greedy_recursive_doubling(cost) == [0, 2, 1, 3]


def test_greedy_recursive_doubling_non_power_of_two():
    """P = 6, all ties. d starts at 4; partners >= 6 are unavailable; when the reference has no
    free partner the lowest unmapped rank is taken (documented extension)."""
    cost = [[0.0 if i == j else 1.0 for j in range(6)] for i in range(6)]
    # rank 4 -> h1, rank 2 -> h2 (ref rank 2); 2^4 = 6 out, 2^2 = 0 taken, rank 3 -> h3;
    # 3^1 = 2 taken, d = 0: lowest unmapped rank 1 -> h4 (ref rank 1); rank 5 -> h5
    assert greedy_recursive_doubling(cost) == [0, 4, 2, 3, 1, 5]


@pytest.mark.parametrize("p", [2, 3, 5, 6, 7, 8, 12, 16, 33])
def test_greedy_orders_are_permutations(p):
    cost = random_cost(p, p)
    for fn in (greedy_ring, greedy_recursive_doubling):
        order = fn(cost)
        assert sorted(order) == list(range(p)) and order[0] == 0


# ------------------------------------------------------------------------------ greedy vs exact

def greedy_trap():
    """A path 0-1-2-3-4 of cost-1 links, its closing link 4-0 costs 10, everything else 5. The
    greedy ring walks the path and must close over the 10; the best ring uses three path links and
    two 5s: slowest link 5, sum 13."""
    p = 5
    c = [[0.0 if i == j else 5.0 for j in range(p)] for i in range(p)]
    for i in range(4):
        c[i][i + 1] = c[i + 1][i] = 1.0
    c[0][4] = c[4][0] = 10.0
    return c


def test_greedy_ring_is_not_optimal_and_exact_is():
    c = greedy_trap()
    rn = rounds("ring", 5)
    assert greedy_ring(c) == [0, 1, 2, 3, 4]
    assert evaluate(greedy_ring(c), c, rn) == (4 * 10.0, 4 * 14.0)
    best = exact.exact_ring(c)
    assert evaluate(best, c, rn) == (4 * 5.0, 4 * 13.0)
    assert bottleneck(best, c, rn)[0] == 5.0
    assert evaluate(best, c, rn) == brute_force(c, rn)[0]
    # the local search gets out of the trap too
    assert evaluate(local_search.improve_ring(c, [greedy_ring(c)], rn, 2.0), c, rn) == (20.0, 52.0)


@pytest.mark.parametrize("p", [4, 5, 6, 7, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_ring_matches_brute_force(p, seed):
    c = random_cost(p, 100 * p + seed)
    rn = rounds("ring", p)
    got = evaluate(exact.exact_ring(c), c, rn)
    want = brute_force(c, rn)[0]
    assert close(got[0], want[0]) and close(got[1], want[1])


def test_exact_ring_bottleneck_first_then_sum():
    """Two rings: one with the smaller sum but a slower link; the exact one must take the other."""
    c = greedy_trap()
    c[0][4] = c[4][0] = 5.5         # the greedy ring: slowest 5.5, sum 9.5; others: slowest 5
    rn = rounds("ring", 5)
    greedy = evaluate([0, 1, 2, 3, 4], c, rn)
    best = evaluate(exact.exact_ring(c), c, rn)
    assert best[0] < greedy[0] and best[1] > greedy[1]
    assert best == (20.0, 52.0)


def test_exact_ring_with_many_ties():
    c = [[0.0 if i == j else 2.0 for j in range(9)] for i in range(9)]
    order = exact.exact_ring(c)
    assert sorted(order) == list(range(9))
    assert evaluate(order, c, rounds("ring", 9)) == (16.0, 144.0)


def test_exact_ring_refuses_large_p():
    with pytest.raises(ValueError):
        exact.exact_ring(random_cost(17, 1))


@pytest.mark.parametrize("metric", ["latency", "bandwidth"])
@pytest.mark.parametrize("p", [4, 5, 6, 7, 8])
def test_exact_recursive_doubling_matches_brute_force(p, metric):
    """Powers of two (recursive doubling) and not (Bruck): the proven primary cost is the optimum."""
    c = random_cost(p, 7 * p + (metric == "bandwidth"))
    rn = rounds("recursive-doubling", p, metric)
    order, proven = exact.exact_rounds(c, rn, dims_symmetric=metric == "latency" and p in (4, 8),
                                       power_of_two=p in (4, 8))
    assert proven
    assert sorted(order) == list(range(p))
    assert close(evaluate(order, c, rn)[0], brute_force(c, rn)[0][0])


def test_exact_recursive_doubling_on_racks_groups_them():
    """Two racks of 4, interleaved in the matrix. With the bandwidth weights the last round
    (distance 4, half the data) must stay inside the racks (4*10 + 2*50 + 10 = 150 against 230 if
    it crossed), so every pair (r, r XOR 4) shares a rack."""
    c, rack = rack_cost(8, 4, seed=3, noise=0.0)
    rn = rounds("recursive-doubling", 8, "bandwidth")
    order, proven = exact.exact_rounds(c, rn, power_of_two=True)
    assert proven
    assert all(rack[order[r]] == rack[order[r ^ 4]] for r in range(8))


def test_min_bottleneck_matching():
    c = line(6)
    assert exact.min_bottleneck_matching(c) == 1.0            # (0,1) (2,3) (4,5)
    c2 = [[0.0, 1, 9, 9], [1, 0, 9, 9], [9, 9, 0, 9], [9, 9, 9, 0]]
    assert exact.min_bottleneck_matching(c2) == 9.0


# ------------------------------------------------------------------------------ properties

@pytest.mark.parametrize("seed", range(6))
def test_methods_are_ordered_on_random_matrices(seed):
    """exact <= heuristic <= min(greedy, identity), every order a permutation, for both patterns."""
    r = random.Random(seed)
    p = r.choice([5, 6, 7, 8, 9, 10, 12])
    metric = r.choice(["latency", "bandwidth"])
    m = from_cost(random_cost(p, 1000 + seed), metric)
    for pattern in ("ring", "recursive-doubling"):
        res = map_order(m, pattern, "auto", time_limit=0.5)
        vals = {k: (v.primary, v.secondary) for k, v in res.results.items()}
        for k, v in res.results.items():
            assert sorted(v.order) == list(range(p)), k
        assert lex_le(vals["heuristic"], vals["greedy"])
        assert lex_le(vals["heuristic"], vals["identity"])
        assert res.results["exact"].optimal is True
        if pattern == "ring":
            assert lex_le(vals["exact"], vals["heuristic"])
        else:
            assert vals["exact"][0] <= vals["heuristic"][0] * (1 + REL)
        chosen = vals[res.chosen]
        assert all(chosen[0] <= v[0] * (1 + REL) for v in vals.values())


@pytest.mark.parametrize("p", [40, 100])
def test_heuristic_on_larger_matrices(p):
    c, rack = rack_cost(p, 10, seed=p)
    m = from_cost(c)
    for pattern in ("ring", "recursive-doubling"):
        res = map_order(m, pattern, "auto", time_limit=1.0)
        assert "exact" not in res.results
        assert res.chosen == "heuristic"
        h = res.results["heuristic"]
        assert sorted(h.order) == list(range(p))
        assert lex_le((h.primary, h.secondary), (res.results["greedy"].primary, res.results["greedy"].secondary))
    # without noise (every inter-rack link equally slow) the ring crosses between the racks only
    # as often as it must, once per rack (with noise, a few per cent on the slowest link can be
    # worth an extra crossing: the bottleneck comes first)
    c, rack = rack_cost(p, 10, seed=p, noise=0.0)
    ring = map_order(from_cost(c), "ring", "heuristic", time_limit=2.0).order
    crossings = sum(rack[ring[i]] != rack[ring[(i + 1) % p]] for i in range(p))
    assert crossings == p // 10


def test_heuristic_ring_breaks_a_bottleneck_the_greedy_order_keeps():
    c = random_cost(60, 5)
    rn = rounds("ring", 60)
    greedy = greedy_ring(c)
    better = local_search.improve_ring(c, [greedy], rn, 2.0)
    assert bottleneck(better, c, rn)[0] < bottleneck(greedy, c, rn)[0]


# ------------------------------------------------------------------------------ map_order

def test_map_order_reports_every_method_against_identity():
    c, rack = rack_cost(8, 4, seed=2)
    m = from_cost(c, "bandwidth")
    res = map_order(m, "ring")
    assert list(res.results) == ["identity", "greedy", "heuristic", "exact"]
    assert res.chosen == "exact"
    assert res.ratio("identity") == 1.0
    assert res.speedup("exact") >= 1.0
    rows = res.rows()
    assert [r["method"] for r in rows] == ["identity", "greedy", "heuristic", "exact"]
    assert rows[0]["worst_unit"] == "GB/s" and rows[0]["cost_unit"] == "us/MB"
    d = res.to_dict()
    assert d["hosts_order"] == [m.labels[i] for i in res.order]
    assert d["pattern"] == "ring" and d["metric"] == "bandwidth"
    # the grouped order crosses between the two racks exactly twice
    crossings = sum(rack[res.order[i]] != rack[res.order[(i + 1) % 8]] for i in range(8))
    assert crossings == 2
    pred = predict(m, "ring", res.order)
    assert close(pred["cost"], res.results["exact"].primary)


def test_map_order_method_choice_and_limits():
    m = from_cost(random_cost(6, 9))
    assert map_order(m, "ring", "greedy").chosen == "greedy"
    assert map_order(m, "recursive-doubling", "heuristic").chosen == "heuristic"
    with pytest.raises(UserError, match="limited to 16"):
        map_order(from_cost(random_cost(17, 1)), "ring", "exact")
    with pytest.raises(UserError):
        map_order(m, "tree")


def test_map_order_two_ranks_and_all_equal():
    m2 = from_cost([[0.0, 3.0], [3.0, 0.0]])
    for pattern in ("ring", "recursive-doubling"):
        res = map_order(m2, pattern)
        assert all(sorted(r.order) == [0, 1] for r in res.results.values())
    flat = from_cost([[0.0 if i == j else 4.0 for j in range(6)] for i in range(6)])
    res = map_order(flat, "recursive-doubling")
    costs = {r.primary for r in res.results.values()}
    assert len(costs) == 1                   # no order is better than another
    assert res.chosen == "exact"             # a proven optimum is preferred on ties


# ------------------------------------------------------------------------------ shared uplinks

def test_shared_uplink_model_by_hand():
    """Hosts 0, 1 in one rack, 2, 3 in the other; intra 1, inter 5. The ring 0 2 1 3 crosses on all
    four links: two flows leave each rack per step, 2 * 5 = 10 per step. The ring 0 1 2 3 crosses
    twice: one flow each way, 5 per step."""
    from collbench.topo.patterns import evaluate_shared
    c = [[0, 1, 5, 5], [1, 0, 5, 5], [5, 5, 0, 1], [5, 5, 1, 0]]
    group = [0, 0, 1, 1]
    rn = rounds("ring", 4, "bandwidth")
    assert evaluate_shared([0, 2, 1, 3], c, rn, group) == 3 * 10
    assert evaluate_shared([0, 1, 2, 3], c, rn, group) == 3 * 5
    # recursive doubling exchanges (both ways): the round whose two pairs cross carries 2 * 5 each way
    rd = rounds("recursive-doubling", 4, "bandwidth")
    assert evaluate_shared([0, 2, 1, 3], c, rd, group) == 1 * 10 + 2 * 1
    assert evaluate_shared([0, 1, 2, 3], c, rd, group) == 1 * 1 + 2 * 10


def test_map_order_reports_the_shared_uplink_speedup_on_racks():
    c, rack = rack_cost(8, 4, seed=6)          # two racks, interleaved: every identity ring link crosses
    res = map_order(from_cost(c, "bandwidth"), "ring")
    assert res.groups is not None and sorted(set(res.groups)) == [0, 1]
    assert all((res.groups[i] == res.groups[j]) == (rack[i] == rack[j]) for i in range(8) for j in range(8))
    assert 3.5 < res.shared_speedup("exact") < 4.5
    assert res.speedup("exact") < 1.2                 # the independent-links model sees little
    assert [set(g) for g in res.to_dict()["groups"]] == [
        {f"h{i}" for i in range(8) if rack[i] == rack[k]} for k in (0, 1)]
    latency = map_order(from_cost(c, "latency"), "ring")
    assert latency.groups is None and latency.shared_speedup("exact") is None


# ------------------------------------------------------------------------------ measurement noise

def test_snap_noise_only_inside_tight_classes():
    from collbench.topo.outliers import snap_noise
    rnd = from_cost(random_cost(12, 3))
    cost, n = snap_noise(rnd)
    assert n == 0 and cost == rnd.cost()               # no structure: values as measured
    c, rack = rack_cost(16, 4, seed=8, noise=0.03)
    c[1][5] = c[5][1] = c[1][5] * 4                     # one slow cable between two racks
    m = from_cost(c)
    cost, n = snap_noise(m)
    assert n >= 118                                     # all but the slow cable and a tail or two
    assert cost[1][5] == c[1][5]                        # the slow cable stays slow
    intra = {cost[i][j] for i in range(16) for j in range(i + 1, 16) if rack[i] == rack[j]}
    assert len(intra) <= 3                              # one speed (plus a tail) per class
    assert map_order(m, "ring", raw_costs=True).snapped == 0


def test_noisy_racks_ring_crosses_only_as_often_as_it_must():
    """With 3 % noise and four racks, the raw bottleneck can be worth an extra crossing; judged by
    the class medians (the default) the ring visits every rack once."""
    p = 40
    c, rack = rack_cost(p, 10, seed=p, noise=0.03)
    res = map_order(from_cost(c), "ring", "heuristic", time_limit=2.0)
    order = res.order
    assert sum(rack[order[i]] != rack[order[(i + 1) % p]] for i in range(p)) == 4
    assert res.snapped > 0
