"""The communication patterns a rank order is mapped for, and the cost model that judges an order.

An order is a list `order` of length P: new rank r runs on the matrix's rank `order[r]` (its
host). `cost` is the symmetric cost matrix of `TopoMatrix.cost()` (latency in us, or us per MB
for bandwidth). A pattern is a list of rounds; a round is a set of rank pairs that talk at the
same time and a weight; the round lasts as long as its slowest pair (lockstep: every rank waits
for its partner before the next round):

    primary(order)   = sum over rounds k of  w_k * max over pairs (a, b) of cost[order[a]][order[b]]
    secondary(order) = sum over rounds k of  w_k * sum over pairs of the same

Orders are compared lexicographically by (primary, secondary): the predicted time first, then the
total load as the tie-break (docs/TOPO.md, "Cost model").

* ring (Open MPI and MPICH ring allgather): P-1 steps, each rank sending one block to rank+1.
  One round of the P links (r, r+1 mod P), weight P-1: primary = (P-1) * slowest link, so the
  order minimises the bottleneck link first, then the sum of the links (topo.md §2.4).
* recursive-doubling, P a power of two: rounds k = 0 .. log2(P)-1, pairs (r, r XOR 2^k), distance
  1 first (both libraries, topo.md §2.3). Round k moves 2^k blocks per pair.
* recursive-doubling, P not a power of two: both libraries run Bruck instead (Open MPI switches
  to it, MPICH's recursive_doubling is limited to powers of two and its default picks Bruck,
  topo.md §4): rounds k while 2^k < P, rank r sends to r - 2^k and receives from r + 2^k (mod P),
  min(2^k, P - 2^k) blocks per pair.

Weights: with the latency metric each round costs one message latency (w_k = 1, ring w = P-1);
with the bandwidth metric a round costs its blocks (w_k = blocks moved per pair; ring w = P-1),
so the primary cost is the predicted time per MB of per-rank block.
"""

PATTERNS = ("ring", "recursive-doubling")


class Round:
    __slots__ = ("weight", "pairs", "exchange")

    def __init__(self, weight, pairs, exchange=False):
        self.weight = weight
        self.pairs = pairs          # list of (rank a, rank b): a sends to b
        self.exchange = exchange    # True: b sends to a as well (sendrecv with the same partner)

    def __repr__(self):
        return f"Round(weight={self.weight}, pairs={self.pairs})"


def is_power_of_two(p):
    return p >= 1 and p & (p - 1) == 0


def algorithm_name(pattern, p):
    """What the MPI library actually runs for this pattern at P ranks."""
    if pattern == "ring":
        return "ring"
    return "recursive doubling" if is_power_of_two(p) else "Bruck (recursive doubling needs a power of two)"


def rounds(pattern, p, metric="latency"):
    """The pattern's rounds for P ranks under the metric's weights (see the module doc)."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}")
    bandwidth = metric == "bandwidth"
    if p < 2:
        return []
    if pattern == "ring":
        return [Round(p - 1, [(r, (r + 1) % p) for r in range(p)])]
    out = []
    dist = 1
    if is_power_of_two(p):
        while dist < p:
            pairs = [(r, r ^ dist) for r in range(p) if r < r ^ dist]
            out.append(Round(dist if bandwidth else 1, pairs, exchange=True))
            dist <<= 1
    else:
        while dist < p:
            pairs = [(r, (r - dist) % p) for r in range(p)]      # r sends to r - 2^k
            out.append(Round(min(dist, p - dist) if bandwidth else 1, pairs))
            dist <<= 1
    return out


def evaluate(order, cost, rnds):
    """(primary, secondary) cost of an order; see the module doc."""
    primary = 0.0
    secondary = 0.0
    for rd in rnds:
        worst = 0.0
        total = 0.0
        for a, b in rd.pairs:
            c = cost[order[a]][order[b]]
            total += c
            if c > worst:
                worst = c
        primary += rd.weight * worst
        secondary += rd.weight * total
    return primary, secondary


def round_maxima(order, cost, rnds):
    """Per round: (weight, slowest pair's cost, (rank a, rank b) of that pair)."""
    out = []
    for rd in rnds:
        worst, at = -1.0, None
        for a, b in rd.pairs:
            c = cost[order[a]][order[b]]
            if c > worst:
                worst, at = c, (a, b)
        out.append((rd.weight, worst, at))
    return out


def bottleneck(order, cost, rnds):
    """The slowest pair of any round: (cost, rank a, rank b)."""
    worst = (-1.0, None, None)
    for rd in rnds:
        for a, b in rd.pairs:
            c = cost[order[a]][order[b]]
            if c > worst[0]:
                worst = (c, a, b)
    return worst


def evaluate_shared(order, cost, rnds, group):
    """Predicted cost when the links between groups of hosts (the racks) share one uplink per
    group and direction, each carrying its flows one after another at their measured pair cost:

        round time = max(slowest pair, max over groups and directions of the sum of the costs of
                         the round's flows leaving / entering the group)

    weighted and summed as in `evaluate`. group: group index per matrix rank (outliers.host_groups).
    An informational model for a fabric with oversubscribed inter-rack links (the testbed's shaped
    link); the methods optimise `evaluate`."""
    total = 0.0
    for rd in rnds:
        worst = 0.0
        out_load = {}
        in_load = {}
        for a, b in rd.pairs:
            ha, hb = order[a], order[b]
            c = cost[ha][hb]
            if c > worst:
                worst = c
            ga, gb = group[ha], group[hb]
            if ga != gb:
                out_load[ga] = out_load.get(ga, 0.0) + c
                in_load[gb] = in_load.get(gb, 0.0) + c
                if rd.exchange:
                    out_load[gb] = out_load.get(gb, 0.0) + c
                    in_load[ga] = in_load.get(ga, 0.0) + c
        for load in (out_load, in_load):
            for v in load.values():
                if v > worst:
                    worst = v
        total += rd.weight * worst
    return total

