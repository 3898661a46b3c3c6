"""Parse one NCCL/RCCL debug-log line (bytes) into a typed record.

Lines that matter (as NCCL and RCCL print them; docs/NCCL.md lists the versions):
- COLL:   `<prefix> NCCL INFO <Op>: opCount <hex> sendbuff <p> recvbuff <p> [acc <p>] count <n>
           [size <n>] datatype <d> op <r> [root <r>] comm <p> [nranks=<n>] stream <p>
           [task <t> globalrank <g>] [devRedOp <d> isPtr <i> scaler <x>]`  (NCCL 2.4-2.30, RCCL 4.x-7.x)
- INIT:   `[<func> ]comm <p> rank <r> nranks <n> ... [busId <x>] [commId 0x<x>] ... - Init COMPLETE`
- kernel: RCCL's `## [<t>] [<rank>:<block>] <opcount> KL HWID <x> <kernel> ... busId <x> nRanks <n>`
- TUNING: `[<Op>: ]<n> Bytes -> Algo <a> proto <p> ...`  (numeric ids before 2.24, names after)

`<prefix>` is `host:pid:tid [cudaDev]`, optionally preceded by anything a wrapper adds (a timestamp,
Ray's `(RayTrainWorker pid=.., ip=..)`, mpirun's `[1,0]<stdout>:`), so it is parsed from the right.
Nothing here raises on any input: a line is a record, a `Malformed` with its reason, or None.

`normalize_chunk` is the census' fast path: it rewrites the per-call parts of every COLL line in a
block (opCount and buffer pointers) into an in-place marker, with a few C-level passes, so that the
lines of one rank's repeated calls become byte-identical and can be counted by dictionary lookup.
`parse_coll` understands both the raw and the normalized form. `join_wrapped` puts a COLL line
that a terminal or an issue tracker wrapped after `comm` or `stream` back on one line.

Numbers are checked against the C types NCCL prints them from: a count above 2^64-1 (size_t) is
a malformed line, not a call; pointer-like fields (comm, stream, commId, ...) longer than
FIELD_MAX characters are malformed too, so that no field can make a table entry large.
"""

import functools
import operator
import re
from itertools import compress, repeat
from typing import NamedTuple, Optional

from collbench.nccl.formats import (ALGORITHMS, DATATYPES, KERNEL_ALGOS, KERNEL_PROTOS, KERNEL_TYPES, OPS,
                                    PROTOCOLS, RECV, SEND, NcclOp, canonical_op, redop_name)

COLL_MARK = b": opCount "       # every COLL line has it; cheap `in` pre-filter
INFO_MARK = b"NCCL INFO "
MAX_TEXT = 300                  # characters of a bad line kept for the -v report
SIZE_T_MAX = (1 << 64) - 1      # NCCL's count and byte sizes are size_t
FIELD_MAX = 64                  # characters of a pointer or id field (0x + 16 hex digits is 18)
HOST_MAX = 255                  # characters of a host name (a longer "prefix" is not one NCCL wrote)


class CollLine(NamedTuple):
    host: Optional[str]         # None when the line has no host:pid:tid prefix (stripped or garbled)
    pid: Optional[int]
    tid: Optional[int]
    dev: Optional[int]          # cudaDev at log time, not a rank
    op: NcclOp
    op_name: str                # as logged (mscclFuncAllReduce, AllToAllPivot, ...)
    opcount: Optional[int]      # None in the normalized form
    inplace: bool
    count: int
    datatype: str
    type_size: int
    redop: Optional[str]        # None for ops that do not reduce
    redop_value: int
    root: int                   # Send/Recv: the peer
    comm: str
    nranks: int
    stream: str
    task: Optional[int]         # RCCL 6.x: index inside the group
    globalrank: Optional[int]   # RCCL 6.x: the rank in this communicator


class InitLine(NamedTuple):
    host: Optional[str]
    pid: Optional[int]
    comm: str
    rank: int
    nranks: int
    comm_id: Optional[str]      # NCCL >= 2.16
    bus_id: Optional[str]
    cuda_dev: Optional[int]
    func: Optional[str]         # ncclCommInitRank, ncclCommSplit, ... (NCCL >= 2.21)
    parent: Optional[str]


class KernelLine(NamedTuple):
    host: Optional[str]
    pid: Optional[int]
    record: str                 # KL (launch), KE (end), CE, PE, CL, Abort, ...
    rank: int                   # comm->rank
    opcount: int
    p2p: bool                   # head `%06x-%06x` (p2p opCounts)
    kernel: Optional[str]       # KL only: the kernel function name
    coll: Optional[NcclOp]      # from the kernel name (None for SendRecv and unknown names)
    algorithm: Optional[str]
    protocol: Optional[str]
    datatype: Optional[str]     # element type of the kernel, mapped onto our datatype names
    bus_id: Optional[str]
    nranks: Optional[int]


class TuningLine(NamedTuple):
    host: Optional[str]
    pid: Optional[int]
    op: Optional[NcclOp]        # None for the 2.20-2.22 / RCCL form without an op name
    nbytes: int
    algorithm: str
    protocol: str


class Malformed(NamedTuple):
    reason: str
    text: str


def clip_text(line):
    """A bad line for humans: decoded whatever the bytes, capped, no control characters."""
    text = line[:MAX_TEXT].decode("utf-8", "backslashreplace")
    if not text.isprintable():      # else (the common case) there is nothing to escape
        text = "".join(c if c.isprintable() else "\\x%02x" % ord(c) if ord(c) < 256 else "?" for c in text)
    return text + ("..." if len(line) > MAX_TEXT else "")


def _text(b):
    return b.decode("utf-8", "backslashreplace")


def split_prefix(line):
    """(host, pid, tid, dev, message) of a `... host:pid:tid [dev] NCCL INFO message` line.

    None when there is no `NCCL INFO`. host/pid/tid are None when the part before it is not a
    prefix NCCL wrote (stripped by a tool, or the tail of another process's cut line). The last
    `NCCL INFO` wins: stdout shared by many ranks can glue a cut line in front of a whole one.
    """
    i = line.rfind(INFO_MARK)
    if i < 0:
        return None
    msg = line[i + len(INFO_MARK):]
    pre = line[:i].rstrip()
    dev = None
    k = pre.rfind(b" ")
    tok = pre[k + 1:]
    if tok[:1] == b"[" and tok[-1:] == b"]" and tok[1:-1].isdigit() and len(tok) < 12:
        dev = int(tok[1:-1])
        pre = pre[:k] if k >= 0 else b""
        k = pre.rfind(b" ")
        tok = pre[k + 1:]
    parts = tok.rsplit(b":", 3)
    host = pid = tid = None
    if (len(parts) >= 3 and parts[-1].isdigit() and parts[-2].isdigit() and parts[-3]
            and len(parts[-1]) < 20 and len(parts[-2]) < 20 and len(parts[-3]) <= HOST_MAX):
        host, pid, tid = _text(parts[-3]), int(parts[-2]), int(parts[-1])
    if msg[:1] == b"[":             # `NCCL INFO [2] AllReduce:` (seen in NVIDIA/nccl#1352)
        j = msg.find(b"] ")
        if 0 < j < 8 and msg[1:j].isdigit():
            msg = msg[j + 2:]
    return host, pid, tid, dev, msg


# numbers are bounded (a size_t has 20 digits) so that int() never meets a 64 KiB digit string
_COLL = re.compile(
    rb"([A-Za-z_][A-Za-z0-9_]*): opCount "
    rb"(?:([0-9a-fA-F]{1,16}|\^) sendbuff (\S+) recvbuff (\S+) (?:acc \S+ )?|([=~^]) )"
    rb"count (\d{1,20}) (?:size \d{1,20} )?datatype (-?\d{1,10}) op (-?\d{1,10}) (?:root (-?\d{1,10}) )?"
    rb"comm (\S+) \[nranks=(\d{1,10})\] stream (\S+)"
    rb"((?: task -?\d{1,10} globalrank -?\d{1,10}| devRedOp -?\d{1,10} isPtr -?\d{1,10} scaler [0-9a-fA-F]{1,16})*)"
    rb"\s*\Z")
_TASK = re.compile(rb" task (-?\d{1,10}) globalrank (-?\d{1,10})")
OFFSET_OPS = tuple(name for name, op in OPS.items() if op.inplace_offset)  # AllGather, ReduceScatter


def pointer_value(text):
    if text == b"(nil)":
        return 0
    try:
        return int(text, 16)
    except ValueError:
        return None


def offset_inplace(op, diff, unit, nranks):
    """Whether a call of op (an NcclOp with an inplace_offset) is in place: diff = sendbuff - recvbuff
    is inplace_offset * rank*count*size for a rank in 0..nranks-1 (NCCL's definition)."""
    diff *= op.inplace_offset
    return unit > 0 and diff >= 0 and diff % unit == 0 and diff // unit < nranks


def parse_coll(line):
    """A COLL line (raw or normalized) -> CollLine, or Malformed saying what is wrong."""
    if line.count(COLL_MARK) != 1:
        return Malformed("garbled: several COLL lines run together", clip_text(line))
    pre = split_prefix(line)
    if pre is None:             # no `NCCL INFO` at all: the prefix was stripped (NVIDIA/nccl#783)
        host = pid = tid = dev = None
        j = line.find(COLL_MARK)
        k = max(line.rfind(b" ", 0, j), line.rfind(b"\t", 0, j))
        msg = line[k + 1:]
    else:
        host, pid, tid, dev, msg = pre
    m = _COLL.match(msg)
    if m is None:
        return Malformed(_coll_problem(msg), clip_text(line))
    (name, opcount, send, recv, marker, count, dtype, redop, root, comm, nranks, stream,
     extra) = m.groups()
    op_name = _text(name)
    op = canonical_op(op_name)
    if op is None:
        return Malformed(f"unknown op name {op_name!r}", clip_text(line))
    dt = DATATYPES.get(int(dtype))
    if dt is None:
        return Malformed(f"unknown datatype {int(dtype)} (expected 0-11)", clip_text(line))
    if len(comm) > FIELD_MAX or len(stream) > FIELD_MAX:
        return Malformed(f"comm or stream field longer than {FIELD_MAX} characters", clip_text(line))
    redop_value = int(redop)
    if redop_value < 0:
        return Malformed(f"negative reduction op {redop_value}", clip_text(line))
    nranks = int(nranks)
    if nranks < 1:
        return Malformed("nranks=0", clip_text(line))
    root = int(root) if root is not None else 0
    if op.rooted and not 0 <= root < nranks:
        what = "peer" if op.kind in (SEND, RECV) else "root"
        return Malformed(f"{what} {root} outside 0..{nranks - 1}", clip_text(line))
    count = int(count)
    if count > SIZE_T_MAX:
        return Malformed(f"count {count} above 2^64-1 (NCCL's count is a size_t)", clip_text(line))
    unit = count * dt[1]
    inplace = False
    if op.kind not in (SEND, RECV):
        if marker is not None:
            inplace = marker == b"="    # `^` without pointers: the caller decides (census.OffsetCall)
        elif send == recv:
            inplace = True
        elif op.inplace_offset:
            s, r = pointer_value(send), pointer_value(recv)
            inplace = s is not None and r is not None and offset_inplace(op, s - r, unit, nranks)
    task = grank = None
    if extra:
        t = _TASK.search(extra)
        if t:
            task, grank = int(t.group(1)), int(t.group(2))
    opcount = int(opcount, 16) if opcount and opcount != b"^" else None
    return CollLine(host, pid, tid, dev, op, op_name, opcount, inplace, count, dt[0], dt[1],
                    redop_name(redop_value) if op.reduction else None, redop_value,
                    root if op.rooted else 0, _text(comm), nranks, _text(stream), task, grank)


_FIELDS = (b" sendbuff ", b" recvbuff ", b" count ", b" datatype ", b" op ", b" comm ", b" [nranks=", b" stream ")


def _coll_problem(msg):
    """Why a line with `: opCount ` is not a COLL line, in words (for the -v report)."""
    if not re.match(rb"[A-Za-z_]\w*: opCount ", msg):
        return "no op name before opCount (NCCL < 2.3.7 or a cut line)"
    normalized = re.match(rb"[A-Za-z_]\w*: opCount [=~] ", msg) is not None
    for field in _FIELDS[2:] if normalized else _FIELDS:
        if field not in msg:
            return f"truncated: no {field.decode().strip(' [=')!r} field"
    return "unexpected field values or trailing text"


_INIT = re.compile(rb"(?:([A-Za-z_]\w*) )?comm (\S+) rank (-?\d{1,10}) nranks (\d{1,10}) (.*?)- Init COMPLETE")
_INIT_EXTRA = re.compile(rb"\b(cudaDev|busId|commId|parent) (\S+)")     # one pass for the four


def parse_init(line):
    pre = split_prefix(line)
    if pre is None:
        return None
    host, pid, _tid, _dev, msg = pre
    m = _INIT.match(msg)
    if m is None:
        return Malformed("Init COMPLETE line without comm/rank/nranks", clip_text(line))
    func, comm, rank, nranks, extra = m.groups()
    rank, nranks = int(rank), int(nranks)
    if nranks < 1 or not 0 <= rank < nranks:
        return Malformed(f"Init COMPLETE with rank {rank} of nranks {nranks}", clip_text(line))
    if len(comm) > FIELD_MAX:
        return Malformed(f"Init COMPLETE with a comm field longer than {FIELD_MAX} characters", clip_text(line))
    got = dict.fromkeys((b"cudaDev", b"busId", b"commId", b"parent"))
    for key, value in _INIT_EXTRA.findall(extra):
        if got[key] is None:            # the first one counts
            if len(value) > FIELD_MAX:
                return Malformed(f"Init COMPLETE with a {key.decode()} field longer than {FIELD_MAX} characters",
                                 clip_text(line))
            got[key] = _text(value)
    cuda = got[b"cudaDev"]
    cuda = int(cuda) if cuda and cuda.isdigit() and len(cuda) < 10 else None
    return InitLine(host, pid, _text(comm), rank, nranks, got[b"commId"], got[b"busId"], cuda,
                    _text(func) if func else None, got[b"parent"])


_KERNEL = re.compile(rb"## \[\s*[0-9.]+\] \[(\d{1,10}):(\d{1,10})\] ([0-9a-fA-F]{1,16})(-[0-9a-fA-F]{1,16})? (\S+)(.*)")
_KL = re.compile(rb" HWID\s+[0-9a-fA-F]+ (\S+)")
_BUSID = re.compile(rb" busId ([0-9a-fA-F]+)")
_NRANKS = re.compile(rb" nRanks (\d{1,10})")
KERNEL_PREFIXES = ("ncclDevFunc_", "ncclFunction_", "ncclKernel_")


@functools.lru_cache(maxsize=1024)
def parse_kernel_name(name):
    """(coll op or None, algorithm, protocol, datatype) of `ncclDevFunc_<Coll>_<ALGO>_<PROTO>_<RedOp>_<type>`
    (RCCL 6.2 names; 6.1's ncclFunction_; develop's short types and unroll suffix), or None."""
    for prefix in KERNEL_PREFIXES:
        if name.startswith(prefix):
            rest = name[len(prefix):]
            break
    else:
        return None
    coll, _, rest = rest.partition("_")
    algo = next((a for a in KERNEL_ALGOS if rest.startswith(a + "_")), None)
    if algo is None:
        return None
    rest = rest[len(algo) + 1:]
    proto = next((p for p in KERNEL_PROTOS if rest.startswith(p + "_") or rest == p), None)
    if proto is None:
        return None
    rest = rest[len(proto) + 1:]
    _redop, _, ctype = rest.partition("_")
    dtype = KERNEL_TYPES.get(ctype)
    if dtype is None and "_" in ctype:      # develop appends the unroll factor
        dtype = KERNEL_TYPES.get(ctype.rsplit("_", 1)[0])
    return canonical_op(coll), algo, proto, dtype


def parse_kernel(line):
    pre = split_prefix(line)
    if pre is None:
        return None
    host, pid, _tid, _dev, msg = pre
    m = _KERNEL.match(msg)
    if m is None:
        return Malformed("kernel-trace line without [rank:block] opCount", clip_text(line))
    rank, _block, opc, opc2, record, rest = m.groups()
    kernel = coll = algo = proto = dtype = None
    if record == b"KL":
        k = _KL.match(rest)
        if k:
            kernel = _text(k.group(1))
            parsed = parse_kernel_name(kernel)
            if parsed:
                coll, algo, proto, dtype = parsed
    bus = _BUSID.search(rest)
    nr = _NRANKS.search(rest)
    return KernelLine(host, pid, _text(record), int(rank), int(opc, 16), opc2 is not None, kernel, coll,
                      algo, proto, dtype, _text(bus.group(1)) if bus else None,
                      int(nr.group(1)) if nr else None)


_TUNING = re.compile(rb"(?:([A-Za-z_]\w*): )?(\d{1,20}) Bytes -> Algo (\S+) proto (\S+)")


def _tuning_name(token, table):
    text = _text(token)
    return table.get(int(text), text) if text.isdigit() and len(text) < 10 else text


def parse_tuning(line):
    pre = split_prefix(line)
    if pre is None:
        return None
    host, pid, _tid, _dev, msg = pre
    m = _TUNING.match(msg)
    if m is None:
        return Malformed("TUNING line without '<n> Bytes -> Algo <a> proto <p>'", clip_text(line))
    name, nbytes, algo, proto = m.groups()
    if int(nbytes) > SIZE_T_MAX:
        return Malformed(f"TUNING line with {int(nbytes)} bytes, above 2^64-1", clip_text(line))
    if len(algo) > FIELD_MAX or len(proto) > FIELD_MAX:
        return Malformed(f"TUNING line with an algorithm or protocol longer than {FIELD_MAX} characters",
                         clip_text(line))
    op = canonical_op(_text(name)) if name else None
    if name and op is None:
        return None             # another subsystem's line that happens to look alike
    return TuningLine(host, pid, op, int(nbytes), _tuning_name(algo, ALGORITHMS), _tuning_name(proto, PROTOCOLS))


INIT_MARK = b"Init COMPLETE"
KERNEL_MARK = b"NCCL INFO ## ["
TUNING_MARK = b" Bytes -> Algo "


def parse_line(line):
    """Any line -> CollLine | InitLine | KernelLine | TuningLine | Malformed, or None (not ours)."""
    if not isinstance(line, bytes):
        line = str(line).encode("utf-8", "surrogateescape")
    line = line.rstrip(b"\r\n")
    if COLL_MARK in line:
        return parse_coll(line)
    if INFO_MARK not in line:
        return None
    if INIT_MARK in line:
        return parse_init(line)
    if KERNEL_MARK in line:
        return parse_kernel(line)
    if TUNING_MARK in line:
        return parse_tuning(line)
    return None


# --- fast path -----------------------------------------------------------------------------------

# possessive quantifiers (`++`, `{m,n}+`): each run is followed by a byte it cannot hold (a space), so
# giving back bytes never makes a match; not trying saves a fifth of the split (a half in strip_comms)
_SPLIT = re.compile(rb" opCount [0-9a-fA-F]{1,16}+ sendbuff (\S++) recvbuff (\S++) (?:acc \S++ )?")
_SPLIT_OPCOUNT = re.compile(rb" opCount ([0-9a-fA-F]{1,16}+) sendbuff (\S++) recvbuff (\S++) (?:acc \S++ )?")
_MARKS = {True: b" opCount = ", False: b" opCount ~ "}
MARKER = re.compile(rb" opCount [=~^] ")     # what normalize_chunk leaves, once per COLL line
MARKER_TEXTS = (b" opCount = ", b" opCount ~ ", b" opCount ^ ")     # the same as three plain searches


def marker_text_in(chunk):
    """Whether one of MARKER_TEXTS is in chunk. `~` and `^` are rare in a log: a one-byte memchr
    first skips their searches (a search for a text that ends in a space, which every COLL line has
    many of, steps through the block slowly)."""
    return (b" opCount = " in chunk or (b"~" in chunk and b" opCount ~ " in chunk)
            or (b"^" in chunk and b" opCount ^ " in chunk))


_OFFSET_SUFFIXES = tuple(name.encode() + b":" for name in OFFSET_OPS)
_OFFSET_PROBES = tuple(name.encode() + b": opCount " for name in OFFSET_OPS)
_BARE_OFFSET = b" opCount ^ "


def normalize_chunk(chunk, opcounts=None, pointers=None):
    """The block with every COLL line's `opCount <hex> sendbuff <p> recvbuff <p> [acc <p>]` replaced
    by `opCount =` (sendbuff == recvbuff) or `opCount ~` (not). AllGather/ReduceScatter lines whose
    pointers differ keep them (`opCount ^ sendbuff <p> recvbuff <p>`): their in-place test is an
    offset of rank*count, decided by parse_coll. Only C-level list passes: no Python code runs per
    line. Everything else is left as it was; the line count does not change.

    opcounts: a list that receives the removed opCounts (hex bytes), one per marker, in order.
    pointers: a list; AllGather/ReduceScatter lines whose pointers differ then become a bare
    `opCount ^ ` too, and their (sendbuff, recvbuff) pairs are appended to it, in line order, for
    the caller to decide per call (a log with fresh buffers on every call still repeats lines)."""
    if opcounts is None:
        parts = _SPLIT.split(chunk)
        n = len(parts) // 3
        if not n:
            return chunk
        pieces = parts[0::3]
        sends, recvs = parts[1::3], parts[2::3]
    else:
        parts = _SPLIT_OPCOUNT.split(chunk)
        n = len(parts) // 4
        if not n:
            return chunk
        pieces = parts[0::4]
        opcounts.extend(parts[1::4])
        sends, recvs = parts[2::4], parts[3::4]
    equal = list(map(bytes.__eq__, sends, recvs))
    marks = list(map(_MARKS.__getitem__, equal))
    if any(map(chunk.__contains__, _OFFSET_PROBES)):
        offset_ops = map(bytes.endswith, pieces[:n], repeat(_OFFSET_SUFFIXES))
        need = list(map(operator.and_, offset_ops, map(operator.not_, equal)))
        if True in need:
            idx = list(compress(range(n), need))
            if pointers is not None:
                pointers.extend(zip(map(sends.__getitem__, idx), map(recvs.__getitem__, idx)))
                for i in idx:
                    marks[i] = _BARE_OFFSET
            else:
                raws = map(b"".join, zip(repeat(b" opCount ^ sendbuff "), map(sends.__getitem__, idx),
                                         repeat(b" recvbuff "), map(recvs.__getitem__, idx), repeat(b" ")))
                for i, mark in zip(idx, raws):
                    marks[i] = mark
    out = [b""] * (2 * n + 1)
    out[0::2] = pieces
    out[1::2] = marks
    return b"".join(out)


COMM_MARK = b" comm * [nranks="   # what strip_comms leaves of a COLL line's ` comm <pointer> [nranks=`
_COMM_FIELD = re.compile(rb" comm (\S{1,%d}+) \[nranks=" % FIELD_MAX)     # (possessive: see _SPLIT)


def strip_comms(chunk, pointers):
    """The block with the pointer of every ` comm <pointer> [nranks=` taken out (COMM_MARK left in
    its place) and appended to `pointers`, in order: the lines of one rank's calls on any number of
    communicators become one text. One C-level split; the caller checks that the block does not
    hold COMM_MARK itself."""
    parts = _COMM_FIELD.split(chunk)
    if len(parts) == 1:
        return chunk
    pointers.extend(parts[1::2])
    return COMM_MARK.join(parts[0::2])


# NCCL's own timestamp at the start of a line (2.26+, NCCL_DEBUG_TIMESTAMP_LEVELS: `[%F %T] `, with
# `%Nf` sub-second digits)
_STAMP = re.compile(rb"\n\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})?\] (?=\S)")


def strip_stamps(chunk):
    """The block without NCCL's timestamp at the start of its lines: a line's parse never reads
    the part before its host (prefixes are parsed from the right), and without the stamp the
    lines of repeated calls are one text again (one C-level pass, only when a line of the block's
    first 4 KiB starts with `[`)."""
    if chunk[:1] != b"[" and chunk.find(b"\n[", 0, 4096) < 0:
        return chunk
    return _STAMP.sub(b"\n", b"\n" + chunk)[1:]


def restore_comms(line, pointers):
    """A line of strip_comms' output with its pointers put back (as many as it has markers)."""
    pieces = line.split(COMM_MARK)
    out = [pieces[0]]
    for i, piece in enumerate(pieces[1:]):
        out += (b" comm ", pointers[i] if i < len(pointers) else b"", b" [nranks=", piece)
    return b"".join(out)


# --- wrapped lines -------------------------------------------------------------------------------

WRAP_WORDS = (b" comm", b" stream")
CONTINUATION = re.compile(rb"[ \t]*(?:0x[0-9a-fA-F]{1,16}|\(nil\))(?:[ \t\r]|\Z)")   # a wrapped line's rest
WRAP_ENDS = tuple(word + space + end for word in (b" comm", b" stream") for space in (b"", b" ", b"\t")
                  for end in (b"\n", b"\r\n"))
# a COLL line cut after `comm` or `stream`, and a next line that starts with the pointer it lacks
_WRAPPED = re.compile(rb"(: opCount [^\n]*? (?:comm|stream))[ \t]*\r?\n[ \t]*"
                      rb"(?=(?:0x[0-9a-fA-F]{1,16}|\(nil\))(?:[ \t\r\n]|\Z))")


def join_wrapped(chunk):
    """(chunk, joins): COLL lines wrapped after `comm` or `stream` (a terminal's or an issue
    tracker's line wrap; the pointer continues on the next line) joined with their continuation.
    Only a next line that starts with a pointer is joined: a line cut for good is left alone (and
    parses as malformed). Costs a few C-level searches when nothing is wrapped."""
    if not any(map(chunk.__contains__, WRAP_ENDS)):
        return chunk, 0
    total = 0
    for _ in range(2):      # a line wrapped after both `comm` and `stream`
        chunk, n = _WRAPPED.subn(rb"\1 ", chunk)
        total += n
        if not n:
            break
    return chunk, total


def wrapped_tail(chunk):
    """Whether the last line of a block (ending in a newline) is a COLL line cut after `comm` or
    `stream`, whose continuation is in the next block."""
    return chunk.endswith(WRAP_ENDS) and COLL_MARK in chunk[chunk.rfind(b"\n", 0, len(chunk) - 1) + 1:]
