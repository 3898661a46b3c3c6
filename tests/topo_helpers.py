"""Synthetic matrices for the topo tests and bench: random, rack-structured, with slow hosts/links."""

import itertools
import random

from collbench.pair_matrix import TopoMatrix
from collbench.topo.patterns import evaluate


def from_cost(cost, metric="latency", prefix="h"):
    """A TopoMatrix whose cost() is the given symmetric cost (latency in us)."""
    p = len(cost)
    vals = [[None if i == j else (cost[i][j] if metric == "latency" else 1000.0 / cost[i][j])
             for j in range(p)] for i in range(p)]
    return TopoMatrix.from_rows([f"{prefix}{i}" for i in range(p)], metric, vals)


def random_cost(p, seed, lo=1.0, hi=10.0):
    r = random.Random(seed)
    c = [[0.0] * p for _ in range(p)]
    for i in range(p):
        for j in range(i + 1, p):
            c[i][j] = c[j][i] = r.uniform(lo, hi)
    return c


def rack_cost(p, rack_size, seed, intra=10.0, inter=50.0, noise=0.03, interleave=True):
    """Racks of rack_size hosts; host i in rack i % racks (interleaved, as a scheduler might list
    them) or i // rack_size; lognormal noise."""
    r = random.Random(seed)
    racks = max(1, p // rack_size)
    rack = [(i % racks) if interleave else (i // rack_size) for i in range(p)]
    c = [[0.0] * p for _ in range(p)]
    for i in range(p):
        for j in range(i + 1, p):
            c[i][j] = c[j][i] = (intra if rack[i] == rack[j] else inter) * r.lognormvariate(0, noise)
    return c, rack


def rack_matrix(p, racks, seed=1, metric="latency", slow_host=None, host_factor=3.0, slow_link=None,
                link_factor=4.0, noise=0.03, intra=10.0, inter=50.0):
    """Interleaved racks (host i in rack i % racks) with an optional slow host and slow link."""
    r = random.Random(seed)
    v = [[None] * p for _ in range(p)]
    for i in range(p):
        for j in range(i + 1, p):
            x = (intra if i % racks == j % racks else inter) * r.lognormvariate(0, noise)
            if slow_host in (i, j):
                x *= host_factor
            if slow_link is not None and {i, j} == set(slow_link):
                x *= link_factor
            if metric == "bandwidth":
                x = 1000.0 / x
            v[i][j] = v[j][i] = x
    return TopoMatrix.from_rows([f"node{i}" for i in range(p)], metric, v)


def brute_force(cost, rnds):
    """The lexicographic optimum over all orders with host 0 at rank 0: ((primary, secondary), order)."""
    p = len(cost)
    best = None
    for perm in itertools.permutations(range(1, p)):
        order = (0,) + perm
        v = evaluate(order, cost, rnds)
        if best is None or v < best[0]:
            best = (v, list(order))
    return best
