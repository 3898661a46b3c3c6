"""The op table. An operation is one row: its OSU binary, what it moves, its busbw factor.

Everything that needs to know about an op (engine plan, OSU runner, bandwidth, exporter
legacy names, dashboard reference) reads this table instead of branching on names.
"""

from dataclasses import dataclass
from typing import Callable, NamedTuple


class BusFactor(NamedTuple):
    """busbw / algbw at n ranks (nccl-tests' PERFORMANCE.md), and the formula as people write it."""
    factor: Callable
    formula: str


# bus_factor_kind -> its factor
BUS_FACTORS = {
    "allreduce": BusFactor(lambda n: 2.0 * (n - 1) / n, "2(n-1)/n"),   # reduce-scatter + allgather
    "ring": BusFactor(lambda n: (n - 1) / n, "(n-1)/n"),               # each rank lacks (n-1)/n of the data
    "one": BusFactor(lambda n: 1.0, "1"),                              # every byte crosses once (bcast, reduce)
    "none": BusFactor(lambda n: None, "-"),                            # no data moved (barrier)
}


@dataclass(frozen=True)
class Op:
    name: str            # our name, also the engine's and the label value
    title: str           # for tables
    osu_binary: str      # osu_<op> in OSU's collective directory
    reduction: bool      # takes an MPI_Op: validated on int/float, default datatype float
    has_size: bool       # barrier has none
    data_per_rank: bool  # S = size x n (allgather, alltoall) instead of S = size
    bus_factor_kind: str  # a key of BUS_FACTORS
    legacy_name: str     # the prototype's metric infix (mpi_<legacy>_latency_us), or ""
    training_use: str    # what it means for training (the prototype's reference table)

    def data_bytes(self, size_bytes, nranks):
        """S, the bytes that define algorithm bandwidth (docs/METRICS.md)."""
        return size_bytes * nranks if self.data_per_rank else size_bytes

    def bus_factor(self, nranks):
        """nccl-tests' factor from algbw to busbw, or None (barrier moves no data)."""
        return BUS_FACTORS[self.bus_factor_kind].factor(nranks)

    @property
    def bus_factor_formula(self):
        """The factor as text: '2(n-1)/n', '(n-1)/n', '1', or '-' for none."""
        return BUS_FACTORS[self.bus_factor_kind].formula

    def bandwidth(self, size_bytes, nranks, latency_us):
        """(algbw, busbw) in bytes per second for one average latency; (None, None) if n/a."""
        factor = self.bus_factor(nranks)
        if factor is None or not self.has_size or not latency_us or latency_us <= 0:
            return None, None
        algbw = self.data_bytes(size_bytes, nranks) / (latency_us * 1e-6)
        return algbw, algbw * factor


OPS = {op.name: op for op in (
    Op(name="allreduce", title="Allreduce", osu_binary="osu_allreduce", reduction=True, has_size=True,
       data_per_rank=False, bus_factor_kind="allreduce", legacy_name="allreduce",
       training_use="Gradient synchronization across GPUs, every training step"),
    Op(name="bcast", title="Broadcast", osu_binary="osu_bcast", reduction=False, has_size=True,
       data_per_rank=False, bus_factor_kind="one", legacy_name="broadcast",
       training_use="Model weight distribution at initialization"),
    Op(name="reduce", title="Reduce", osu_binary="osu_reduce", reduction=True, has_size=True,
       data_per_rank=False, bus_factor_kind="one", legacy_name="reduce",
       training_use="Loss aggregation for logging, every N steps"),
    Op(name="allgather", title="Allgather", osu_binary="osu_allgather", reduction=False, has_size=True,
       data_per_rank=True, bus_factor_kind="ring", legacy_name="allgather",
       training_use="Batch-norm statistics, sharded-parameter gathers (ZeRO/FSDP)"),
    Op(name="alltoall", title="Alltoall", osu_binary="osu_alltoall", reduction=False, has_size=True,
       data_per_rank=True, bus_factor_kind="ring", legacy_name="alltoall",
       training_use="Expert routing in MoE models, per layer"),
    Op(name="reduce_scatter", title="Reduce_scatter", osu_binary="osu_reduce_scatter", reduction=True,
       has_size=True, data_per_rank=False, bus_factor_kind="ring", legacy_name="",
       training_use="Sharded gradient reduction (ZeRO/FSDP)"),
    Op(name="barrier", title="Barrier", osu_binary="osu_barrier", reduction=False, has_size=False,
       data_per_rank=False, bus_factor_kind="none", legacy_name="",
       training_use="Synchronization; pure latency"),
)}

ALIASES = {"broadcast": "bcast", "reducescatter": "reduce_scatter", "reduce-scatter": "reduce_scatter"}
# the engine's datatypes and their sizes; short and long stand in for 2- and 8-byte types MPI lacks
DATATYPES = {"char": 1, "short": 2, "int": 4, "float": 4, "double": 8, "long": 8}


def get_op(name):
    """The Op for a name or alias; KeyError lists the known ops."""
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in OPS:
        raise KeyError(f"unknown op {name!r} (expected one of: {', '.join(OPS)})")
    return OPS[key]


def default_datatype(op):
    """Reductions default to float (OpenMPI 4.1 saturates MPI_CHAR sums, ompi#8045); others move bytes."""
    return "float" if op.reduction else "char"
