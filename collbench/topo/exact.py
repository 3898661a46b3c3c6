"""Optimal orders for small P, pure Python.

Ring (`exact_ring`): the lexicographic optimum (slowest link, then sum of links) in two Held–Karp
passes over subsets of the P-1 ranks after rank 0 (a ring can start anywhere): the first finds the
smallest achievable bottleneck B* (a min-sum pass over rank-exponential weights, see below), the
second the cheapest ring over links <= B* only. Each pass is (P-1) 2^(P-2) min-reductions of P-1
terms done by `min(map(add, ...))` in C, about 0.4 s each at P = 16.

Recursive doubling / Bruck (`exact_rounds`): depth-first branch and bound on the predicted time
(the primary cost) over the rank -> host assignment, any pattern of rounds. Host 0 sits at rank 0
(XOR / rotation symmetry: relabelling the ranks keeps every round's pairs); with equal round
weights (latency) the hypercube's dimensions are interchangeable too, so the hosts at ranks 1, 2,
4, ... are kept increasing. Ranks are placed in bit-reversed order so the heavy last rounds
(distance P/2) close first, each on the hosts nearest its partner first. The bound is the weighted
sum of each round's slowest closed pair, never below the round's static floor (`_round_floors`)
nor below, for a placed rank whose partner is still open, the cost to its nearest free host;
the search stops after `node_limit` nodes or `time_limit` seconds and then says so (proven=False).
"""

import time
from operator import add

INF = float("inf")
EXACT_RING_MAX = 16


def exact_ring(cost):
    """The optimal ring for P <= EXACT_RING_MAX: order (starting at rank 0)."""
    p = len(cost)
    if p > EXACT_RING_MAX:
        raise ValueError(f"exact ring search is limited to P <= {EXACT_RING_MAX}")
    if p <= 3:
        return list(range(p))        # every ring of 3 or fewer is the same set of links
    # Pass 1, bottleneck: a min-sum tour over weights (P+1)^rank(cost) has the smallest possible
    # slowest link, since any link of a higher rank outweighs P links of lower ranks (a plain sum
    # pass is cheaper than a min-max one: operator.add beats max() per element).
    levels = sorted({cost[i][j] for i in range(p) for j in range(i + 1, p)})
    rank = {c: k for k, c in enumerate(levels)}
    base = float(p + 1)
    weighted = [[base ** rank[c] if i != j else 0.0 for j, c in enumerate(row)] for i, row in enumerate(cost)]
    first = _held_karp(weighted, add, None)[1]
    b_star = max(cost[first[i]][first[(i + 1) % p]] for i in range(p))
    # Pass 2, sum: the cheapest ring over links <= B*.
    return _held_karp(cost, add, b_star)[1]


def _held_karp(cost, combine, cap):
    """Best closed tour from node 0 under combine (max: bottleneck, add: sum), only links <= cap.

    Nodes 1..p-1 are bits 0..n-1. dp[mask][u]: best value of a path from node 0 through exactly
    the nodes of mask, ending at u (INF when none). Returns (value, order)."""
    if len(cost) - 1 > 60:
        raise ValueError("held-karp over more than 61 nodes")
    p = len(cost)
    n = p - 1
    col = []                         # col[u][v]: cost of link v -> u (INF when over the cap)
    for u in range(n):
        row = cost[u + 1]
        col.append([row[v + 1] if (cap is None or row[v + 1] <= cap) and v != u else INF
                    for v in range(n)])
    start = [cost[0][u + 1] if cap is None or cost[0][u + 1] <= cap else INF for u in range(n)]
    full = (1 << n) - 1
    dp = [None] * (1 << n)
    blank = [INF] * n
    for u in range(n):
        row = list(blank)
        row[u] = start[u]
        dp[1 << u] = row
    bits = [1 << u for u in range(n)]
    for mask in range(3, full + 1):
        if not mask & (mask - 1):
            continue
        row = list(blank)
        for u in range(n):
            bu = bits[u]
            if mask & bu:
                row[u] = min(map(combine, dp[mask ^ bu], col[u]))
        dp[mask] = row
    # close the ring back to node 0
    last = dp[full]
    best, best_u = INF, None
    for u in range(n):
        v = combine(last[u], start[u])
        if v < best:
            best, best_u = v, u
    if best_u is None:
        raise ValueError("no ring under the cap")
    # walk back
    path = [best_u]
    mask, u = full, best_u
    while mask & (mask - 1):
        prev = dp[mask ^ bits[u]]
        want = dp[mask][u]
        cu = col[u]
        v = min(range(n), key=lambda x: (combine(prev[x], cu[x]) != want, x))
        mask ^= bits[u]
        u = v
        path.append(u)
    path.reverse()
    return best, [0] + [x + 1 for x in path]


def _bit_reversed(p):
    bits = max(1, (p - 1).bit_length())
    return sorted(range(p), key=lambda r: int(format(r, f"0{bits}b")[::-1], 2))


def min_bottleneck_matching(cost):
    """The smallest possible slowest pair of a perfect matching of all P (even) hosts."""
    p = len(cost)
    memo = {0: 0.0}

    def best(mask):
        if mask in memo:
            return memo[mask]
        low = mask & -mask
        i = low.bit_length() - 1
        rest = mask ^ low
        row = cost[i]
        out = INF
        m = rest
        while m:
            bj = m & -m
            m ^= bj
            c = row[bj.bit_length() - 1]
            if c < out:
                v = best(rest ^ bj)
                v = c if c > v else v
                if v < out:
                    out = v
        memo[mask] = out
        return out

    return best((1 << p) - 1)


def _round_floors(cost, rnds):
    """A lower bound on each round's slowest pair, whatever the order.

    Every host takes part in every round. A round that is a perfect matching (recursive doubling)
    costs at least the best bottleneck matching; a round where each host has two different partners
    (Bruck: send to r - d, receive from r + d) at least the largest second-nearest cost; any round
    at least the largest nearest-neighbour cost."""
    p = len(cost)
    ranked = [sorted(c for j, c in enumerate(row) if j != i) for i, row in enumerate(cost)]
    nearest = max(r[0] for r in ranked)
    second = max(r[1] for r in ranked) if p > 2 else nearest
    matching = None
    floors = []
    for rd in rnds:
        degree = [0] * p
        partners = [set() for _ in range(p)]
        for a, b in rd.pairs:
            partners[a].add(b)
            partners[b].add(a)
        sizes = {len(s) for s in partners}
        if sizes == {1} and p % 2 == 0 and p <= 16:
            if matching is None:
                matching = min_bottleneck_matching(cost)
            floors.append(matching)
        elif min(sizes) >= 2:
            floors.append(second)
        else:
            floors.append(nearest)
        del degree
    return floors


def exact_rounds(cost, rnds, upper=None, node_limit=5_000_000, time_limit=30.0, dims_symmetric=False,
                 power_of_two=True):
    """Branch and bound on the primary cost (predicted time) of a rounds pattern (module doc).

    upper: an order to start from (its cost is the incumbent). Returns (order, proven): the order
    has the smallest primary cost (proven=True) or is the best found when the search hit its
    node or time limit (proven=False). Among orders of equal primary cost the first found is
    returned; the caller polishes the tie-break sum (mapping.py)."""
    from collbench.topo.patterns import evaluate

    p = len(cost)
    if p <= 2:
        return list(range(p)), True
    weights = [rd.weight for rd in rnds]
    # per rank: the (round, partner) pairs closed when it is placed after its partner
    seq = _bit_reversed(p) if power_of_two else list(range(p))
    position = {r: i for i, r in enumerate(seq)}
    closes = [[] for _ in range(p)]
    for k, rd in enumerate(rnds):
        for a, b in rd.pairs:
            later, earlier = (a, b) if position[a] > position[b] else (b, a)
            closes[later].append((k, earlier))
    for cl in closes:                  # heaviest round first: the anchor for candidate order
        cl.sort(key=lambda t: -weights[t[0]])
    opens = [sorted({k for k, rd in enumerate(rnds) for a, b in rd.pairs
                     if r in (a, b) and position[b if a == r else a] > position[r]}) for r in range(p)]
    # symmetry chain: hosts at ranks 1, 2, 4, ... increasing (equal-weight hypercube only)
    chain = [1 << i for i in range((p - 1).bit_length())] if dims_symmetric and power_of_two else []
    chain_index = {r: i for i, r in enumerate(chain)}
    floors = _round_floors(cost, rnds)
    near = [sorted((j for j in range(p) if j != i), key=lambda j, r=cost[i]: (r[j], j)) for i in range(p)]

    if upper is None:
        upper = list(range(p))
    best_order = list(upper)
    best = [evaluate(best_order, cost, rnds)[0]]
    floor_total = sum(w * f for w, f in zip(weights, floors))
    if floor_total >= best[0] * (1 - 1e-12):
        return best_order, True          # the incumbent meets the lower bound
    host_at = [-1] * p
    used = [False] * p
    # maxima[k] starts at the round's floor: the bound is then just the weighted sum
    maxima = list(floors)
    bound = [floor_total]
    nodes = [0]
    deadline = time.monotonic() + time_limit
    aborted = [False]

    def place(depth):
        if depth == p:
            if bound[0] < best[0] * (1 - 1e-12):
                best[0] = evaluate(host_at, cost, rnds)[0]
                best_order[:] = host_at
            return
        nodes[0] += 1
        if nodes[0] > node_limit or (nodes[0] & 1023 == 0 and time.monotonic() > deadline):
            aborted[0] = True
            return
        r = seq[depth]
        cl = closes[r]
        cands = near[host_at[cl[0][1]]] if cl else range(p)
        lo_host, hi_host = -1, p
        if r in chain_index:
            i = chain_index[r]
            lo_host = max([host_at[q] for q in chain[:i] if host_at[q] >= 0], default=-1)
            hi_host = min([host_at[q] for q in chain[i + 1:] if host_at[q] >= 0], default=p)
        limit = best[0] * (1 - 1e-12)
        for h in cands:
            if used[h] or not lo_host < h < hi_host:
                continue
            row = cost[h]
            saved = []
            b = bound[0]
            for k, e in cl:
                c = row[host_at[e]]
                m = maxima[k]
                if c > m:
                    saved.append((k, m))
                    maxima[k] = c
                    b += weights[k] * (c - m)
            op = opens[r]
            if op:
                # a pair still open will go to a free host: at least h's nearest free one
                for g in near[h]:
                    if not used[g]:
                        c = row[g]
                        break
                for k in op:
                    m = maxima[k]
                    if c > m:
                        saved.append((k, m))
                        maxima[k] = c
                        b += weights[k] * (c - m)
            if b < limit:
                bound[0], old = b, bound[0]
                host_at[r] = h
                used[h] = True
                place(depth + 1)
                used[h] = False
                host_at[r] = -1
                bound[0] = old
                limit = best[0] * (1 - 1e-12)
            for k, m in reversed(saved):
                maxima[k] = m
            if aborted[0]:
                return

    host_at[0] = 0                       # rank 0 holds host 0 (symmetry); it closes nothing
    used[0] = True
    place(1)
    return list(best_order), not aborted[0]
