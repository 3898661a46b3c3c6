"""The op table and the datatype table: one row per operation, one row per datatype, each with
every fact about it that collbench uses.

Everything that needs to know about an op (engine plan, OSU runner, nccl-tests runner,
bandwidth, exporter legacy names, dashboard reference, failure diagnosis) or a datatype (element
size, the MPI type, OSU's and nccl-tests' spelling) reads these tables instead of branching on
names. The built-in engine's own tables (OPS[] and DATATYPES[] in engines/collbench_engine.c)
are checked against these by tests/test_ops_table.py.
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
    mpi_function: str    # the MPI call (as MPI's error messages name it)
    nccl_tests_binary: str = None   # nccl-tests' <op>_perf; None: NCCL has no such collective
    measured: bool = True    # a collbench engine runs it; False: only imported (IMPORTED_OPS)
    data_peers: bool = False  # S = size x (n-1): each rank's block goes to every other rank once (hypercube)

    def data_bytes(self, size_bytes, nranks):
        """S, the bytes that define algorithm bandwidth (docs/METRICS.md)."""
        if self.data_peers:
            return size_bytes * (nranks - 1)
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
       training_use="Gradient synchronization across GPUs, every training step", mpi_function="MPI_Allreduce", nccl_tests_binary="all_reduce_perf"),
    Op(name="bcast", title="Broadcast", osu_binary="osu_bcast", reduction=False, has_size=True,
       data_per_rank=False, bus_factor_kind="one", legacy_name="broadcast",
       training_use="Model weight distribution at initialization", mpi_function="MPI_Bcast", nccl_tests_binary="broadcast_perf"),
    Op(name="reduce", title="Reduce", osu_binary="osu_reduce", reduction=True, has_size=True,
       data_per_rank=False, bus_factor_kind="one", legacy_name="reduce",
       training_use="Loss aggregation for logging, every N steps", mpi_function="MPI_Reduce", nccl_tests_binary="reduce_perf"),
    Op(name="allgather", title="Allgather", osu_binary="osu_allgather", reduction=False, has_size=True,
       data_per_rank=True, bus_factor_kind="ring", legacy_name="allgather",
       training_use="Batch-norm statistics, sharded-parameter gathers (ZeRO/FSDP)", mpi_function="MPI_Allgather", nccl_tests_binary="all_gather_perf"),
    Op(name="alltoall", title="Alltoall", osu_binary="osu_alltoall", reduction=False, has_size=True,
       data_per_rank=True, bus_factor_kind="ring", legacy_name="alltoall",
       training_use="Expert routing in MoE models, per layer", mpi_function="MPI_Alltoall", nccl_tests_binary="alltoall_perf"),
    Op(name="reduce_scatter", title="Reduce_scatter", osu_binary="osu_reduce_scatter", reduction=True,
       has_size=True, data_per_rank=False, bus_factor_kind="ring", legacy_name="",
       training_use="Sharded gradient reduction (ZeRO/FSDP)", mpi_function="MPI_Reduce_scatter", nccl_tests_binary="reduce_scatter_perf"),
    Op(name="barrier", title="Barrier", osu_binary="osu_barrier", reduction=False, has_size=False,
       data_per_rank=False, bus_factor_kind="none", legacy_name="",
       training_use="Synchronization; pure latency", mpi_function="MPI_Barrier"),
)}

# What other tools measure and collbench only records (`collbench import nccl-tests`): nccl-tests'
# point-to-point and rooted tests. Their sizes follow collbench's (one rank's block where the test
# moves a block per rank); their bus factors are nccl-tests' (src/<test>.cu, <Test>GetBw, 2.19.6).
# No engine runs them: plans and --ops refuse them (measured=False); every record reader takes them.
IMPORTED_OPS = {op.name: op for op in (
    Op(name="sendrecv", title="Sendrecv", osu_binary="", reduction=False, has_size=True,
       data_per_rank=False, bus_factor_kind="one", legacy_name="",
       training_use="Pipeline-parallel activations between stages (point to point)",
       mpi_function="MPI_Sendrecv", nccl_tests_binary="sendrecv_perf", measured=False),
    Op(name="scatter", title="Scatter", osu_binary="osu_scatter", reduction=False, has_size=True,
       data_per_rank=True, bus_factor_kind="ring", legacy_name="",
       training_use="Handing each rank its shard from one root", mpi_function="MPI_Scatter",
       nccl_tests_binary="scatter_perf", measured=False),
    Op(name="gather", title="Gather", osu_binary="osu_gather", reduction=False, has_size=True,
       data_per_rank=True, bus_factor_kind="ring", legacy_name="",
       training_use="Collecting every rank's shard on one root (checkpoints, evaluation)",
       mpi_function="MPI_Gather", nccl_tests_binary="gather_perf", measured=False),
    Op(name="hypercube", title="Hypercube", osu_binary="", reduction=False, has_size=True,
       data_per_rank=True, bus_factor_kind="one", legacy_name="",
       training_use="nccl-tests' all-pairs exchange in log2(n) steps (a fabric check)",
       mpi_function="", nccl_tests_binary="hypercube_perf", measured=False, data_peers=True),
    Op(name="alltoallv", title="Alltoallv", osu_binary="osu_alltoallv", reduction=False, has_size=True,
       data_per_rank=True, bus_factor_kind="ring", legacy_name="",
       training_use="Expert routing in MoE models with uneven token counts", mpi_function="MPI_Alltoallv",
       nccl_tests_binary="alltoallv_perf", measured=False),
)}
# every op a record may name: what collbench measures, then what it imports
ALL_OPS = {**OPS, **IMPORTED_OPS}

ALIASES = {"broadcast": "bcast", "reducescatter": "reduce_scatter", "reduce-scatter": "reduce_scatter",
           "send_recv": "sendrecv"}


@dataclass(frozen=True)
class Datatype:
    name: str            # ours: plans, --datatype, records, the engine's plan files
    size: int            # bytes per element
    mpi: str             # the MPI type the engine moves (MPI_SIGNED_CHAR for char sums where
                         # the MPI refuses MPI_SUM on MPI_CHAR: collbench_engine.c probes it)
    osu: str             # OSU 7.4's name: `-T` takes it in lower case, its table prints it; None: OSU lacks it
    nccl: str            # nccl-tests' `-d` value; None: NCCL has no such type


# short and long stand in for what MPI has no type for (NCCL's float16/bfloat16, 8-byte ints):
# the same bytes moved; reductions on them are integer sums
DATATYPE_TABLE = {dt.name: dt for dt in (
    Datatype(name="char", size=1, mpi="MPI_CHAR", osu="MPI_CHAR", nccl="int8"),
    Datatype(name="short", size=2, mpi="MPI_SHORT", osu=None, nccl=None),
    Datatype(name="int", size=4, mpi="MPI_INT", osu="MPI_INT", nccl="int32"),
    Datatype(name="float", size=4, mpi="MPI_FLOAT", osu="MPI_FLOAT", nccl="float"),
    Datatype(name="double", size=8, mpi="MPI_DOUBLE", osu=None, nccl="double"),
    Datatype(name="long", size=8, mpi="MPI_LONG_LONG", osu=None, nccl="int64"),
)}
# name -> bytes per element: the table's size column, what most readers need
DATATYPES = {dt.name: dt.size for dt in DATATYPE_TABLE.values()}


def get_op(name):
    """The Op for a name or alias, measured or imported (a record may name either); KeyError lists
    the known ops. What runs an op checks `op.measured`."""
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in ALL_OPS:
        raise KeyError(f"unknown op {name!r} (expected one of: {', '.join(ALL_OPS)})")
    return ALL_OPS[key]


def default_datatype(op):
    """Reductions default to float (OpenMPI 4.1 saturates MPI_CHAR sums, ompi#8045); others move bytes."""
    return "float" if op.reduction else "char"
