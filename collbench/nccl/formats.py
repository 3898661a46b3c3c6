"""NCCL/RCCL enums and op names: what the numbers and names in a COLL line mean.

One table per enum (nccl.h's for the values, NCCL's COLL INFO lines for the op names). An
NCCL op's facts are a row of OPS: its kind, how nccl-tests sizes it, whether it reduces or has a
root, how its in-place buffers are laid out, and which row of collbench's own op table
(`collbench.ops.OPS`) times it; whether it reduces is taken from that row where there is one, and
tests/test_nccl_ops_table.py checks the rest against it (and the C engine's table is checked
against ops.py), so the three op tables cannot drift apart. The parser, census and replay read
these rows rather than test NCCL op names (replay_plan keeps a name-keyed table of the reasons
why an op is not replayed, and the RCCL replayer's spellings).
"""

import functools
from dataclasses import dataclass

from collbench.ops import get_op

# ncclDataType_t value -> (our name, bytes per element). RCCL uses the same values.
DATATYPES = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4),
    4: ("int64", 8), 5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4),
    8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8e4m3", 1), 11: ("float8e5m2", 1),
}
DATATYPE_SIZES = {name: size for name, size in DATATYPES.values()}

# ncclRedOp_t; values >= 5 are ops made by ncclRedOpCreatePreMulSum (dynamic, per communicator)
REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
PREMULSUM = "premulsum"

# ncclAlgo / ncclProto ids as printed by the numeric TUNING line (nccl_tuner.h, v2.30)
ALGORITHMS = {0: "TREE", 1: "RING", 2: "COLLNET_DIRECT", 3: "COLLNET_CHAIN", 4: "NVLS",
              5: "NVLS_TREE", 6: "PAT"}
PROTOCOLS = {0: "LL", 1: "LL128", 2: "SIMPLE"}

# kinds of call: positional collectives, point-to-point (matched per peer), one-sided (not checked)
COLL, SEND, RECV, RMA = "coll", "send", "recv", "rma"


@dataclass(frozen=True)
class NcclOp:
    name: str           # NCCL's name (AlltoAll with a lower-case "to", as NCCL >= 2.28 prints it)
    kind: str           # COLL, SEND, RECV or RMA
    per_rank: bool      # nccl-tests' S is count*size*nranks (AllGather, ReduceScatter, AlltoAll, ...)
    reduction: bool     # the `op` field means something
    rooted: bool        # the `root` field means something (Send/Recv: it is the peer)
    collbench_op: str   # the matching row of collbench.ops.OPS, or "" when there is none
    inplace_offset: int = 0     # in place when sendbuff - recvbuff = this * rank*count*size (+1
                                # AllGather, -1 ReduceScatter: NCCL's definitions); 0: when they are equal

    def bytes_per_call(self, count, type_size, nranks):
        """nccl-tests' S for one call: the bytes that define algbw."""
        return count * type_size * (nranks if self.per_rank else 1)


def _op(name, kind, per_rank, rooted, collbench_op="", reduction=None, inplace_offset=0):
    """A row; `reduction` comes from collbench's op table when the op has a row there."""
    if reduction is None:
        reduction = get_op(collbench_op).reduction
    return NcclOp(name, kind, per_rank, reduction, rooted, collbench_op, inplace_offset)


OPS = {op.name: op for op in (
    _op("AllReduce", COLL, False, False, "allreduce"),
    _op("AllGather", COLL, True, False, "allgather", inplace_offset=1),
    _op("ReduceScatter", COLL, True, False, "reduce_scatter", inplace_offset=-1),
    _op("Broadcast", COLL, False, True, "bcast"),
    _op("Reduce", COLL, False, True, "reduce"),
    _op("AlltoAll", COLL, True, False, "alltoall"),
    _op("Gather", COLL, True, True, reduction=False),
    _op("Scatter", COLL, True, True, reduction=False),
    _op("Send", SEND, False, True, reduction=False),
    _op("Recv", RECV, False, True, reduction=False),
    # NCCL 2.30 one-sided RMA: logged with the same printf, not matched across ranks
    _op("PutSignal", RMA, False, True, reduction=False),
    _op("Signal", RMA, False, True, reduction=False),
    _op("WaitSignal", RMA, False, True, reduction=False),
)}

# lower-case spellings -> NCCL name. RCCL spells AllToAll; rocm-systems logs AlltoAllPivot/AlltoAllGda;
# the v-variants have per-peer counts the line does not show, so their size is AlltoAll's estimate.
_ALIASES = {name.lower(): name for name in OPS}
_ALIASES.update({"alltoallpivot": "AlltoAll", "alltoallgda": "AlltoAll", "alltoallv": "AlltoAll",
                 "alltoallvgda": "AlltoAll", "bcast": "Broadcast"})
MSCCL_PREFIX = "mscclfunc"


@functools.lru_cache(maxsize=1024)      # (a handful of names, asked for by every parsed line)
def canonical_op(name):
    """NCCL's op for a logged name (case-insensitive; MSCCL's mscclFunc<Op> too), or None."""
    key = name.lower()
    if key.startswith(MSCCL_PREFIX):
        key = key[len(MSCCL_PREFIX):]
    target = _ALIASES.get(key)
    return OPS[target] if target else None


def redop_name(value):
    if value in REDOPS:
        return REDOPS[value]
    return PREMULSUM if value >= len(REDOPS) else None


# kernel-name element types (RCCL Generator.cmake / generate.py, both spellings) -> datatype.
# RCCL runs signed-integer Sum/Prod on the unsigned kernel, so integer types match by width only.
KERNEL_TYPES = {
    "int8_t": "int8", "i8": "int8", "uint8_t": "uint8", "u8": "uint8",
    "int32_t": "int32", "i32": "int32", "uint32_t": "uint32", "u32": "uint32",
    "int64_t": "int64", "i64": "int64", "uint64_t": "uint64", "u64": "uint64",
    "half": "float16", "f16": "float16", "float": "float32", "f32": "float32",
    "double": "float64", "f64": "float64", "hip_bfloat16": "bfloat16", "__nv_bfloat16": "bfloat16",
    "bf16": "bfloat16", "rccl_float8": "float8e4m3", "f8": "float8e4m3", "fp8_e4m3": "float8e4m3",
    "rccl_bfloat8": "float8e5m2", "bf8": "float8e5m2", "fp8_e5m2": "float8e5m2",
}
_UNSIGNED_TWIN = {"int8": "uint8", "int32": "uint32", "int64": "uint64"}


def same_kernel_type(datatype, kernel_type):
    """Whether a kernel's element type can serve a call of `datatype` (signed ints run unsigned)."""
    if kernel_type is None or datatype == kernel_type:
        return True
    return _UNSIGNED_TWIN.get(datatype) == kernel_type or _UNSIGNED_TWIN.get(kernel_type) == datatype


# algorithm names with an underscore must be tried before their prefixes
KERNEL_ALGOS = ("COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS_TREE", "COLLNET", "NVLS", "TREE", "RING", "PAT")
KERNEL_PROTOS = ("LL128", "LL", "SIMPLE")
