"""The two greedy heuristics of the topology-aware collectives report, as written there (the
Mirsadeghi & Afsahi heuristics in Kitor's Open MPI form, topo.md §1.1): `topo map --method greedy`
(called `seed` before, after the prototype's scripts it came from), the baseline the other
methods are measured against.

"Closest" means the lowest cost (latency, or 1/bandwidth); ties go to the lowest matrix rank, as
`argmax` over the matrix does in Kitor's code. Both return an order: order[new rank] = matrix rank.
"""


def _closest(cost_row, free):
    """The free matrix rank with the lowest cost from this row; ties -> lowest rank."""
    best, best_c = None, None
    for j in free:                       # free is kept sorted, so the first minimum wins ties
        c = cost_row[j]
        if best_c is None or c < best_c:
            best, best_c = j, c
    return best


def greedy_ring(cost):
    """Ring: process 0 is the reference; repeatedly give the next new rank to the node closest to
    the reference and make it the reference. The closing link back to rank 0 is never looked at."""
    p = len(cost)
    order = [0]
    free = list(range(1, p))
    ref = 0
    while free:
        nxt = _closest(cost[ref], free)
        free.remove(nxt)
        order.append(nxt)
        ref = nxt
    return order


def greedy_recursive_doubling(cost):
    """Recursive doubling: rank 0 stays on its node and is the reference. Starting from the last
    stage (distance P/2), skip distances whose partner (reference XOR d) is already mapped, halving
    d; map new rank = reference XOR d onto the free node closest to the reference's node; after two
    processes are mapped from one reference, the last one mapped becomes the reference and the
    search restarts from the last stage.

    Two cases the report leaves open, handled as documented in docs/TOPO.md: when P is not a power of
    two, d starts at the largest power of two below P and partners >= P count as unavailable; when
    every partner of the reference is already mapped (d reaches 0; Kitor's code would loop forever)
    the lowest unmapped rank is taken.
    """
    p = len(cost)
    top = 1
    while top * 2 < p:
        top *= 2
    node_of_rank = {0: 0}                # new rank -> matrix rank (node)
    free_nodes = list(range(1, p))
    ref_rank, ref_node, d, cnt = 0, 0, top, 0
    for _ in range(p - 1):
        while d and ((ref_rank ^ d) in node_of_rank or (ref_rank ^ d) >= p):
            d //= 2
        if d:
            new = ref_rank ^ d
        else:
            new = min(r for r in range(p) if r not in node_of_rank)
        node = _closest(cost[ref_node], free_nodes)
        free_nodes.remove(node)
        node_of_rank[new] = node
        cnt += 1
        if cnt == 2:
            ref_rank, ref_node, d, cnt = new, node, top, 0
    return [node_of_rank[r] for r in range(p)]
