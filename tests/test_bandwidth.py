"""algbw / busbw per op against hand-computed figures (nccl-tests conventions, docs/METRICS.md).

Every case: size = 1 MiB per rank (1048576 B), average latency 1000 us = 1 ms, so
algbw = S / 0.001 s. S = size for allreduce, reduce_scatter, bcast, reduce; S = size x n for
allgather and alltoall. busbw = algbw x factor: 2(n-1)/n, (n-1)/n, (n-1)/n, 1.
"""

import pytest

from collbench.config import load_config
from collbench.ops import OPS, get_op
from collbench.results.records import RunContext, result_record

MIB = 1048576
HAND = [
    # op, n, algbw B/s, busbw B/s   (worked by hand, see the module docstring)
    ("allreduce", 2, 1048576000, 1048576000),       # factor 2*1/2 = 1
    ("allreduce", 4, 1048576000, 1572864000),       # factor 2*3/4 = 1.5
    ("allreduce", 8, 1048576000, 1835008000),       # factor 2*7/8 = 1.75
    ("reduce_scatter", 2, 1048576000, 524288000),   # factor 1/2
    ("reduce_scatter", 4, 1048576000, 786432000),   # factor 3/4
    ("reduce_scatter", 8, 1048576000, 917504000),   # factor 7/8
    ("allgather", 2, 2097152000, 1048576000),       # S = 2 MiB, factor 1/2
    ("allgather", 4, 4194304000, 3145728000),       # S = 4 MiB, factor 3/4
    ("allgather", 8, 8388608000, 7340032000),       # S = 8 MiB, factor 7/8
    ("alltoall", 2, 2097152000, 1048576000),
    ("alltoall", 4, 4194304000, 3145728000),
    ("alltoall", 8, 8388608000, 7340032000),
    ("bcast", 2, 1048576000, 1048576000),
    ("bcast", 4, 1048576000, 1048576000),
    ("bcast", 8, 1048576000, 1048576000),
    ("reduce", 2, 1048576000, 1048576000),
    ("reduce", 4, 1048576000, 1048576000),
    ("reduce", 8, 1048576000, 1048576000),
]


@pytest.mark.parametrize("op,n,algbw,busbw", HAND)
def test_bandwidth_by_hand(op, n, algbw, busbw):
    got_alg, got_bus = get_op(op).bandwidth(MIB, n, 1000.0)
    assert got_alg == pytest.approx(algbw, rel=1e-12)
    assert got_bus == pytest.approx(busbw, rel=1e-12)


def test_every_op_with_bandwidth_is_covered():
    assert {op for op, *_ in HAND} == {name for name, op in OPS.items() if op.bus_factor_kind != "none"}


def test_barrier_has_no_bandwidth():
    assert get_op("barrier").bandwidth(0, 8, 5.0) == (None, None)


@pytest.mark.parametrize("latency", [0, 0.0, None, -1.0])
def test_no_bandwidth_without_a_positive_latency(latency):
    assert get_op("allreduce").bandwidth(MIB, 4, latency) == (None, None)


def test_seed_001_worked_example():
    # docs/METRICS.md: seed 001's allreduce 4MB at 38.9 ms on 8 nodes
    algbw, busbw = get_op("allreduce").bandwidth(4 * MIB, 8, 38900.0)
    assert algbw == pytest.approx(4194304 / 0.0389)
    assert round(algbw / 1e9, 4) == 0.1078
    assert round(busbw / 1e9, 4) == 0.1887


def test_result_record_carries_the_bandwidth():
    cfg = load_config(None)
    ctx = RunContext(cfg, "osu", "test-mpi", run_id="r1")
    rec = result_record(ctx, "allgather", MIB, "char", 1000.0, 900.0, 1100.0, 100, 10, ranks=4)
    assert rec["algbw_bytes_per_s"] == 4194304000.0
    assert rec["busbw_bytes_per_s"] == 3145728000.0
    assert rec["ranks"] == 4 and rec["size"] == "1MB" and rec["size_bytes"] == MIB
    bar = result_record(ctx, "barrier", 0, "char", 3.0, 2.0, 4.0, 1000, 100, ranks=4)
    assert bar["algbw_bytes_per_s"] is None and bar["busbw_bytes_per_s"] is None
