"""The op table. An operation is one row: its OSU binary, what it moves, its busbw factor.

Everything that needs to know about an op (engine plan, OSU runner, bandwidth, exporter
legacy names, dashboard reference) reads this table instead of branching on names.
"""

from dataclasses import dataclass


# bus_factor_kind -> busbw / algbw at n ranks (nccl-tests' PERFORMANCE.md)
BUS_FACTORS = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,   # reduce-scatter + allgather
    "ring": lambda n: (n - 1) / n,              # each rank lacks (n-1)/n of the data
    "one": lambda n: 1.0,                       # every byte crosses once (bcast, reduce)
    "none": lambda n: None,
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
    legacy_name: str     # seed prototype's metric infix (mpi_<legacy>_latency_us), or ""
    training_use: str    # seed 001: what it means for training

    def data_bytes(self, size_bytes, nranks):
        """S, the bytes that define algorithm bandwidth (docs/METRICS.md)."""
        return size_bytes * nranks if self.data_per_rank else size_bytes

    def bus_factor(self, nranks):
        """nccl-tests' factor from algbw to busbw, or None (barrier moves no data)."""
        return BUS_FACTORS[self.bus_factor_kind](nranks)

    def bandwidth(self, size_bytes, nranks, latency_us):
        """(algbw, busbw) in bytes per second for one average latency; (None, None) if n/a."""
        factor = self.bus_factor(nranks)
        if factor is None or not self.has_size or not latency_us or latency_us <= 0:
            return None, None
        algbw = self.data_bytes(size_bytes, nranks) / (latency_us * 1e-6)
        return algbw, algbw * factor


OPS = {op.name: op for op in (
    Op("allreduce", "Allreduce", "osu_allreduce", True, True, False, "allreduce", "allreduce",
       "Gradient synchronization across GPUs, every training step"),
    Op("bcast", "Broadcast", "osu_bcast", False, True, False, "one", "broadcast",
       "Model weight distribution at initialization"),
    Op("reduce", "Reduce", "osu_reduce", True, True, False, "one", "reduce",
       "Loss aggregation for logging, every N steps"),
    Op("allgather", "Allgather", "osu_allgather", False, True, True, "ring", "allgather",
       "Batch-norm statistics, sharded-parameter gathers (ZeRO/FSDP)"),
    Op("alltoall", "Alltoall", "osu_alltoall", False, True, True, "ring", "alltoall",
       "Expert routing in MoE models, per layer"),
    Op("reduce_scatter", "Reduce_scatter", "osu_reduce_scatter", True, True, False, "ring", "",
       "Sharded gradient reduction (ZeRO/FSDP)"),
    Op("barrier", "Barrier", "osu_barrier", False, False, False, "none", "",
       "Synchronization; pure latency"),
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
