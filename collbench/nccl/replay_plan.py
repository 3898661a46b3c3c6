"""How an NCCL/RCCL call becomes a step of the built-in engine (`collbench nccl replay`).

Per nccl-tests' conventions (its doc/PERFORMANCE.md) and the engine's OSU size convention
(docs/DESIGN.md), for a call replayed at n ranks with element size ts:

  NCCL op        engine op       engine size (bytes per rank)       nccl-tests S       busbw factor
  AllReduce      allreduce       count*ts                           count*ts           2(n-1)/n
  Broadcast      bcast           count*ts                           count*ts           1
  Reduce         reduce          count*ts                           count*ts           1
  AllGather      allgather       count*ts (each rank's part)        count*ts*n         (n-1)/n
  ReduceScatter  reduce_scatter  count*ts*n (the whole send buffer) count*ts*n         (n-1)/n
  AlltoAll       alltoall        count*ts (to each peer)            count*ts*n         (n-1)/n

NCCL's count is the API's (per rank for AllGather, the per-rank result for ReduceScatter, per
peer for AlltoAll). collbench.ops computes S and the factor from the engine size (data_bytes,
bandwidth), which lands on nccl-tests' S for every row above. Send/Recv/Gather/Scatter (and NCCL
2.30's one-sided ops) have no engine op: they are not replayed, and the reason says why.

Datatypes go by size: float16/bfloat16 have no MPI type and are timed as 2-byte integers
(MPI_SHORT), fp8 as 1-byte integers (MPI_CHAR): the same bytes move, reductions are integer sums.
The engine reduces with MPI_SUM only; other reductions are timed as sums.

A call whose S exceeds max_bytes is timed with fewer elements (S at the cap) and its time scaled
by the bytes ratio: an estimate (bandwidth-bound, linear in bytes).
"""

from dataclasses import dataclass
from typing import Optional

from collbench.config import Step
from collbench.errors import UserError
from collbench.nccl.formats import DATATYPE_SIZES, OPS as NCCL_OPS, RMA
from collbench.ops import get_op

# NCCL datatype -> the engine's datatype of the same size (collbench.ops.DATATYPES)
ENGINE_DATATYPES = {
    "int8": "char", "uint8": "char", "float8e4m3": "char", "float8e5m2": "char",
    "float16": "short", "bfloat16": "short",
    "int32": "int", "uint32": "int", "float32": "float",
    "int64": "long", "uint64": "long", "float64": "double",
}
# NCCL datatypes MPI has no type for: timed as integers of their width (same bytes moved)
STAND_INS = {
    "float16": "2-byte integers (MPI_SHORT)", "bfloat16": "2-byte integers (MPI_SHORT)",
    "float8e4m3": "1-byte integers (MPI_CHAR)", "float8e5m2": "1-byte integers (MPI_CHAR)",
}
# the RCCL replayer's names (rcclReplayer.hpp DataTypeToName / RedOpToName), for its CSV
RCCL_DATATYPE_NAMES = {
    "int8": "Int8", "uint8": "Uint8", "int32": "Int32", "uint32": "Uint32", "int64": "Int64",
    "uint64": "Uint64", "float16": "Float16", "float32": "Float32", "float64": "Float64",
    "bfloat16": "Bfloat16", "float8e4m3": "Fp8E4M3", "float8e5m2": "Fp8E5M2",
}
RCCL_REDOP_NAMES = {0: "Sum", 1: "Product", 2: "Max", 3: "Min", 4: "Average"}
CSV_HEADER = ("callNumber", "functionName", "inPlace", "count(numElements)", "datatype", "op", "root",
              "time(msec)", "groupCallBusBandwidth(GB/s)")

# why an NCCL op has no replay
NOT_REPLAYED_REASONS = {
    "Send": "point-to-point: the engine times collectives, and a Send/Recv group's pattern is not in its lines",
    "Recv": "point-to-point: the engine times collectives, and a Send/Recv group's pattern is not in its lines",
    "Gather": "the built-in engine has no Gather",
    "Scatter": "the built-in engine has no Scatter",
}
RMA_REASON = "one-sided RMA (NCCL 2.30), not a collective"
ZERO_COUNT_REASON = "count 0: moves no data"

DEFAULT_MAX_BYTES = 64 << 20
DEFAULTS = {"grouped": (20, 5), "log": (3, 1)}     # (iterations, warm-up) per configuration / per call
DEFAULT_MAX_CALLS = 100_000  # log order: calls of the sequence replayed at most


@dataclass(frozen=True)
class EngineCall:
    """How one NCCL call is timed by the engine."""
    op: str                 # collbench op
    size_bytes: int         # the engine's size (OSU's bytes per rank), of the timed (maybe capped) call
    datatype: str           # the engine's datatype
    inplace: bool
    root: int
    nranks: int             # replayed at
    count: int              # the log's count
    measured_count: int     # elements timed (< count when capped)
    bytes_per_call: int     # nccl-tests' S of the log's count at nranks
    measured_bytes: int     # S of the timed call
    stand_in: Optional[str]  # "2-byte integers (MPI_SHORT)" for float16/bfloat16, ...
    root_note: Optional[str] = None

    @property
    def scale(self):
        """Bytes of the log's call / bytes timed: the factor on the time (1.0 when not capped)."""
        return self.bytes_per_call / self.measured_bytes if self.measured_bytes else 1.0

    @property
    def capped(self):
        return self.measured_count != self.count

    def step(self, iterations, warmup):
        return Step(self.op, self.size_bytes, iterations, warmup, self.datatype, inplace=self.inplace,
                    root=self.root)

    def bandwidth(self, time_us):
        """(algbw, busbw) in bytes/s of the timed call (= of the scaled estimate), or (None, None)."""
        return get_op(self.op).bandwidth(self.size_bytes, self.nranks, time_us)


@dataclass(frozen=True)
class NotReplayed:
    reason: str


def not_replayed_reason(nccl_op):
    op = NCCL_OPS[nccl_op]
    if op.kind == RMA:
        return RMA_REASON
    return NOT_REPLAYED_REASONS.get(nccl_op, "no matching op in the built-in engine")


def plan_call(nccl_op, count, datatype, nranks, inplace, root, max_bytes):
    """EngineCall (or NotReplayed) of one NCCL call replayed at `nranks` ranks."""
    op = NCCL_OPS[nccl_op]
    if not op.collbench_op:
        return NotReplayed(not_replayed_reason(nccl_op))
    if count <= 0:
        return NotReplayed(ZERO_COUNT_REASON)
    ts = DATATYPE_SIZES[datatype]
    ours = get_op(op.collbench_op)
    # the engine's size per element of count: reduce_scatter's size is the whole send buffer
    per_element = ts * nranks if ours.name == "reduce_scatter" else ts
    s_per_element = ours.data_bytes(per_element, nranks)    # nccl-tests' S per element of count
    measured = count
    if count * s_per_element > max_bytes:
        measured = max(1, max_bytes // s_per_element)
    root_note = None
    if op.rooted:
        if root >= nranks:
            root_note = f"root {root} timed as root {root % nranks} (replayed at {nranks} ranks)"
            root %= nranks
    else:
        root = 0
    return EngineCall(op=ours.name, size_bytes=measured * per_element, datatype=ENGINE_DATATYPES[datatype],
                      inplace=bool(inplace), root=root, nranks=nranks, count=count, measured_count=measured,
                      bytes_per_call=count * s_per_element, measured_bytes=measured * s_per_element,
                      stand_in=STAND_INS.get(datatype), root_note=root_note)


def replay_ranks(log_nranks, capacity):
    """The ranks a communicator of log_nranks is replayed at: its own size when the config (or
    --np) provides that many, else all the config provides."""
    return log_nranks if log_nranks <= capacity else capacity


def check_capacity(log_sizes, cfg, np_given):
    """Without --np the config must provide the log's largest communicator: UserError otherwise."""
    if np_given is not None:
        return
    too_big = sorted(n for n in set(log_sizes) if n > cfg.ranks)
    if too_big:
        where = "the default config (this machine)" if cfg.source == "<default>" else f"the config {cfg.source}"
        raise UserError(
            f"the log has {too_big[-1]}-rank communicators but {where} provides "
            f"{cfg.ranks} ranks: give --np N to replay them at N ranks (the times are then for N ranks "
            f"and say so), or a config with at least {too_big[-1]} ranks (hosts/slots or ranks)")


def plan_groups(groups, cfg, settings):
    """(capacity, [(group, EngineCall or NotReplayed)]): each census configuration's call at the
    ranks this cluster gives it (check_capacity first: UserError when it cannot run them)."""
    capacity = settings.np if settings.np is not None else cfg.ranks
    check_capacity([g.nranks for g in groups if NCCL_OPS[g.op].collbench_op], cfg, settings.np)
    return capacity, [(g, plan_call(g.op, g.count, g.datatype, replay_ranks(g.nranks, capacity), g.inplace,
                                    g.roots[0] if g.roots else 0, settings.max_bytes)) for g in groups]


def rcclname_redop(value):
    return RCCL_REDOP_NAMES.get(value, "PreMulSum" if value is not None and value >= 5 else "Sum")


# --- warnings --------------------------------------------------------------------------------------

def plan_warnings(items, max_bytes, what):
    """How the replay differs from the log, in words. items: objects with .call (EngineCall or
    NotReplayed), .datatype, .redop and, for configurations, .roots; what: 'configurations' or
    'calls'. The rank count's warning is the caller's."""
    from collbench.sizes import format_size
    timed = [it for it in items if isinstance(it.call, EngineCall)]
    w = []
    stand = sorted({it.datatype for it in timed if it.call.stand_in})
    two = [d for d in stand if DATATYPE_SIZES[d] == 2]
    one = [d for d in stand if DATATYPE_SIZES[d] == 1]
    if two:
        w.append(f"{'/'.join(two)}: MPI has no such datatype; timed as 2-byte integers (MPI_SHORT, engine "
                 f"datatype short): the same bytes move, reductions are integer sums")
    if one:
        w.append(f"{'/'.join(one)}: MPI has no such datatype; timed as 1-byte integers (MPI_CHAR, engine "
                 f"datatype char)")
    capped = [it for it in timed if it.call.capped]
    if capped:
        k = len(capped)
        w.append(f"{k} {what if k != 1 else what[:-1]} {'exceed' if k != 1 else 'exceeds'} --max-bytes "
                 f"{format_size(max_bytes)} (nccl-tests' size): timed with fewer elements, the time scaled by "
                 f"the bytes ratio (an estimate)")
    redops = sorted({it.redop for it in timed if it.redop and it.redop != "sum"})
    if redops:
        w.append(f"reduction ops other than sum ({', '.join(redops)}) are timed as MPI_SUM (the engine's only "
                 f"reduction)")
    w += sorted({it.call.root_note for it in timed if it.call.root_note})[:5]
    for it in [it for it in timed if len(getattr(it, "roots", ())) > 1][:5]:
        w.append(f"{it.op} count={it.count} {it.datatype} was called with roots {', '.join(map(str, it.roots))}: "
                 f"timed at root {it.call.root}")
    return w
