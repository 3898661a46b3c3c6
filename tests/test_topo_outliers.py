"""Outliers on synthetic rack-structured matrices: the slow host and the slow link are named with
their evidence, and a clean matrix (with measurement noise) gives none."""

import pytest

from collbench.pair_matrix import TopoMatrix
from collbench.topo.outliers import find_outliers

from topo_helpers import rack_matrix


@pytest.mark.parametrize("p,racks", [(8, 2), (16, 2), (16, 4), (32, 4)])
@pytest.mark.parametrize("metric", ["latency", "bandwidth"])
def test_clean_rack_matrix_has_no_outliers(p, racks, metric):
    rep = find_outliers(rack_matrix(p, racks, seed=p + racks, metric=metric, noise=0.08))
    assert not rep.any, rep.lines()
    assert len(rep.classes) == 2
    assert rep.lines()[-1] == "no outliers"
    # the classes are the racks: intra-rack pairs fast, inter-rack slow, and the groups are the racks
    n_intra = racks * (p // racks) * (p // racks - 1) // 2
    assert rep.classes[0].pairs == n_intra
    fast, slow = rep.classes[0].median, rep.classes[1].median
    assert (fast > slow) if metric == "bandwidth" else (fast < slow)
    assert sorted(sorted(g) for g in rep.groups) == sorted(
        sorted(f"node{i}" for i in range(p) if i % racks == r) for r in range(racks))


@pytest.mark.parametrize("p,racks,slow_host,slow_link", [
    (8, 2, 3, (0, 6)),        # the slow link inside a rack: 4x intra looks like an inter-rack pair
    (16, 4, 5, (1, 2)),       # between racks
    (16, 2, 6, (1, 3)),
])
@pytest.mark.parametrize("metric", ["latency", "bandwidth"])
def test_slow_host_and_slow_link_are_named(p, racks, slow_host, slow_link, metric):
    m = rack_matrix(p, racks, seed=7, metric=metric, slow_host=slow_host, slow_link=slow_link)
    rep = find_outliers(m)
    assert [h.host for h in rep.hosts] == [f"node{slow_host}"]
    h = rep.hosts[0]
    assert 2.7 < h.factor < 3.3                   # 3x slower than its peers
    assert h.slow_links == h.links == p - 1        # all its links
    assert [(lk.a, lk.b) for lk in rep.links] == [tuple(f"node{i}" for i in sorted(slow_link))]
    lk = rep.links[0]
    assert 3.5 < lk.factor < 4.6
    a, b = sorted(slow_link)
    assert lk.value == m.pair_value(a, b)
    same_rack = a % racks == b % racks
    assert lk.pair_class == (0 if same_rack else 1)
    # the evidence: the value against its class median, in the metric's unit
    text = "\n".join(rep.lines())
    assert f"slow host node{slow_host}" in text and f"slow link node{a} - node{b}" in text
    assert m.metric.unit in text
    d = rep.to_dict()
    assert d["hosts"][0]["host"] == f"node{slow_host}" and d["links"][0]["class_median"] == lk.class_median


def test_slightly_slower_host_is_named_at_the_ratio():
    rep = find_outliers(rack_matrix(8, 2, seed=3, slow_host=4, host_factor=1.7, noise=0.02))
    assert [h.host for h in rep.hosts] == ["node4"]
    rep = find_outliers(rack_matrix(8, 2, seed=3, slow_host=4, host_factor=1.2, noise=0.02))
    assert rep.hosts == []                         # 1.2x is not "clearly slower" (ratio 1.5)
    rep = find_outliers(rack_matrix(8, 2, seed=3, slow_host=4, host_factor=1.2, noise=0.02), ratio=1.1)
    assert [h.host for h in rep.hosts] == ["node4"]


def test_flat_fabric_single_class():
    rep = find_outliers(rack_matrix(10, 1, seed=4, slow_link=(2, 7)))
    assert len(rep.classes) == 1 and rep.groups == [[f"node{i}" for i in range(10)]]
    assert [(lk.a, lk.b) for lk in rep.links] == [("node2", "node7")]
    assert rep.hosts == []


def test_two_hosts_cannot_be_compared():
    rep = find_outliers(rack_matrix(2, 1, seed=1, slow_link=(0, 1)))
    assert not rep.any and len(rep.classes) == 1


def test_a_value_class_that_structure_empties_is_no_crash():
    # two racks of 4 (intra 10); between them half the pairs at 50 and half at 250 -- the 50 links
    # already join the racks, so every 250 pair meets at that level and its value class is left
    # empty (topo measure crashed on min() of it)
    p = 8
    v = [[None] * p for _ in range(p)]
    for i in range(p):
        for j in range(i + 1, p):
            x = 10.0 if i // 4 == j // 4 else (50.0 if (i + j) % 2 else 250.0)
            v[i][j] = v[j][i] = x
    rep = find_outliers(TopoMatrix.from_rows([f"node{i}" for i in range(p)], "latency", v))
    assert len(rep.classes) == 2 and all(c.pairs for c in rep.classes)
    assert sum(c.pairs for c in rep.classes) == p * (p - 1) // 2
