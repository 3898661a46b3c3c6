"""The census' streaming pass: blocks of log lines in, per-rank counts and desync digests out.

A block without kernel-trace lines takes the fast path: `normalize_chunk` turns every COLL line
into a form without its per-call parts (opCount, buffer pointers), so a rank's repeated calls are
byte-identical; each line is then one dictionary lookup that yields a callable appending the
call's record id to its rank's list. AllGather/ReduceScatter lines whose buffers differ (in place
is then an offset of rank*count*size, decided per call) get a cached `OffsetCall` instead, which
takes the pointers normalize_chunk handed over, in line order; so a merged log whose every line
has fresh buffer addresses still hits the cache. Lines not in the cache (new configurations,
other subsystems, INIT/TUNING lines, garbage) take the slow path: `log_parser` parses them and
the result is cached when it is a COLL line. After each block the per-rank lists are folded into
counts and desync digests, then cleared. A COLL line wrapped after `comm` or `stream` (a terminal's
or an issue tracker's wrap) is malformed on its own; only then is the next line looked at, and
joined when it completes the record, so unwrapped logs pay nothing for it. A line that is new
only by its comm and stream pointers (a job that makes a communicator per step) is not parsed
again: a parsed line of the same shape (`coll_shape`) gives it, and a new job's line (new pids) is
not either: the shape is kept without its host:pid:tid (`job_shape`). While a block's lines miss
the caches by their comm pointer, the next blocks' comm pointers are taken out too (`strip_comms`,
handed over in line order): a line then stands for every communicator that logs it (a
`CommSwitch`, one entry per pointer), so a communicator per step or a log that re-initialises its
pointers stays one lookup per line; a re-initialised pointer drops only its own handle's entries
(`_forget`).

Every table is bounded (the *_MAX constants below), whatever the log: distinct rank handles (comm pointers),
configurations, pending INIT lines, TUNING keys, (handle, configuration) counters, p2p pairs,
malformed reasons, the line cache. What does not fit is counted in `overflow` and reported, so
memory stays under 100 MB. In RCCL kernel-trace input the opCount matters (it ties a kernel
launch, and so an algorithm and protocol, to its call): there the normalization hands the removed
opCounts over, in line order.
"""

import gc
import re
from collections import Counter, deque
from contextlib import contextmanager
from functools import partial
from itertools import repeat
from operator import call, itemgetter, length_hint, sub
from typing import NamedTuple, Optional

from collbench.nccl import desync
from collbench.nccl.formats import COLL, RECV, SEND, same_kernel_type
from collbench.nccl.log_input import MAX_LINE, SourceStats, read_blocks
from collbench.nccl.log_parser import (COLL_MARK, COMM_MARK, CONTINUATION, FIELD_MAX, HOST_MAX, INFO_MARK, INIT_MARK,
                                       KERNEL_MARK, MARKER, TUNING_MARK, WRAP_WORDS, CollLine, Malformed, clip_text,
                                       marker_text_in, normalize_chunk, parse_coll, parse_init, parse_kernel,
                                       parse_tuning, pointer_value, restore_comms, strip_comms, strip_stamps)

# the bounds of every table (see the module doc); what exceeds one is counted in Scanner.overflow
MEMBERS_MAX = 8192          # rank handles (host, pid, comm pointer): lines of more are counted, not checked
RECS_MAX = 10_000           # distinct call configurations per rank (lines of more: counted as untracked)
INIT_PENDING_MAX = 20_000   # INIT lines whose handle has not logged a collective yet (oldest dropped)
TUNING_KEYS_MAX = 10_000    # (host, pid, op, bytes) of TUNING lines
COUNTERS_MAX = 250_000      # (handle, configuration) call counters
PAIRS_MAX = 20_000          # (rank, direction, peer) p2p digests; beyond, p2p lines are only counted
REASONS_MAX = 64            # distinct malformed-line reasons (more are counted under one)
CONFLICTS_MAX = 50          # inconsistencies kept with their message (all are counted)
CACHE_MAX = 40_000          # lines cached in all line caches; cleared when full (timestamped lines never repeat)
CACHE_BYTES = 8 << 20       # ... or when their bytes reach this
SHAPES_MAX = 4096           # parsed lines kept by shape (each a whole CollLine: the largest entries)
INITS_MAX = 4096            # parsed INIT and TUNING lines kept by their text
RECENT_MAX = 1024           # per-rank opCount -> call map for kernel-trace attribution
SAMPLES_MAX = 50            # malformed lines kept for -v / JSON
WRAPS_MAX = 2               # continuation lines of one wrapped COLL line (after `comm` and after `stream`)
FLUSH_BYTES = 4 << 20       # input bytes between folds of the per-rank lists (bounds their length)
WINDOW = 512                # lines looked up in the line cache at once (looked up again after a drop)
STRIP_START, STRIP_STAY = 0.05, 0.01    # share of a block's lines missing the caches by their comm pointer: out
KIND_CODE = {COLL: 0, SEND: 1, RECV: 2}     # anything else (RMA) is 3: counted, not checked

OVERFLOW_WHAT = {
    "rank_handles": "COLL lines of rank handles beyond the first {MEMBERS_MAX} (counted in the "
                    "configurations' rank lines, not per communicator, not checked for desync)",
    "configurations": "COLL lines of configurations beyond the first {RECS_MAX} (not counted in any group)",
    "counters": "COLL lines beyond {COUNTERS_MAX} (handle, configuration) counters (counted in the "
                "configurations' rank lines, not in their calls per rank)",
    "init_lines": "INIT lines dropped beyond {INIT_PENDING_MAX} pending ones (those handles lose their rank)",
    "tuning_keys": "TUNING lines beyond {TUNING_KEYS_MAX} distinct (host, pid, op, size) keys (not used)",
    "p2p_pairs": "Send/Recv lines beyond {PAIRS_MAX} rank pairs (counted, not checked for desync)",
}


def overflow_text(what):
    """What an overflow counter counts, in words, with the limit in force."""
    return OVERFLOW_WHAT[what].format(**{k: v for k, v in globals().items() if k.endswith("_MAX")})


class Rec(NamedTuple):
    """One distinct call configuration as a rank issued it (the census' unit of counting)."""
    op: str
    op_name: str
    count: int
    datatype: str
    redop: Optional[str]
    root: int
    inplace: bool
    nranks: int


class Member:
    """One rank's handle of one communicator: (host, pid, comm pointer), a new one after re-init."""

    __slots__ = ("index", "host", "pid", "comm", "rank", "nranks", "comm_id", "bus_id", "cuda_dev", "func",
                 "parent", "cset", "seq", "other", "pairs", "pairs_dropped", "counts", "lines", "digest", "recent",
                 "closed", "cached", "cached_generation")

    def __init__(self, index, host, pid, comm, nranks):
        self.index = index
        self.host, self.pid, self.comm, self.nranks = host, pid, comm, nranks
        self.rank = self.comm_id = self.bus_id = self.cuda_dev = self.func = self.parent = None
        self.cset = None
        self.seq = []           # collective record ids of this block, in order
        self.pairs = {}         # ("send"|"recv", peer) -> desync.PairDigest, whose .rids is this block's
        self.pairs_dropped = False
        self.other = []         # record ids not checked for desync (one-sided RMA, p2p beyond PAIRS_MAX)
        self.counts = {}        # record id -> lines
        self.lines = 0
        self.digest = desync.SequenceDigest()
        self.recent = {}        # opCount -> record id (kernel-trace blocks only)
        self.closed = False
        self.cached = []        # (line cache, key) of the entries that append to this handle's lists ...
        self.cached_generation = -1     # ... since the caches were last cleared (older lists are void)

    def identity(self):
        return {"host": self.host, "pid": self.pid, "comm": self.comm, "rank": self.rank}

    def where(self):
        return f"{self.host or '?'}:{self.pid if self.pid is not None else '?'} comm {self.comm}"


_COMM, _STREAM = CollLine._fields.index("comm"), CollLine._fields.index("stream")
_NEXT = object()       # OffsetCall.take's "the next pointer difference of the block"


class OffsetCall:
    """The cache entry of an AllGather/ReduceScatter line whose buffers differ: whether a call is
    in place (sendbuff and recvbuff rank*count*size apart, NCCL's definition) is decided per call
    from the pointer difference the block handed over; each outcome's target is made once."""

    __slots__ = ("scanner", "call", "member", "unit", "span", "negate", "targets")

    def __init__(self, scanner, call, member):
        self.scanner, self.call, self.member = scanner, call, member
        self.unit = call.count * call.type_size
        self.span = self.unit * call.nranks
        self.negate = call.op.inplace_offset < 0        # ReduceScatter: recvbuff = sendbuff + rank*count*size
        self.targets = [None, None]     # out of place, in place: bound appends

    def take(self, diff=_NEXT):
        """One call: diff is sendbuff - recvbuff (None when a pointer is not a number); called
        without it (from the line cache), the next difference of the block."""
        if diff is _NEXT:
            diffs = self.scanner.diffs
            diff = next(diffs, None) if diffs is not None else None
        if diff is None:
            inplace = False
        else:
            if self.negate:
                diff = -diff
            unit = self.unit
            inplace = (0 <= diff < self.span and diff % unit == 0) if unit else diff == 0
        f = self.targets[inplace]
        if f is None:
            lst, rid = self.scanner._place(self.call._replace(inplace=inplace), self.member)
            f = self.targets[inplace] = partial(lst.append, rid)
        f()

    __call__ = take


class CommSwitch:
    """The cache entry of a COLL line whose comm pointer strip_comms took out: the same text stands
    for the calls of every communicator that logs it, told apart by the pointer the block handed
    over (in line order). Each pointer's entry (what the line with that pointer would be cached as:
    an append to its handle's list, an OffsetCall) is made once, on its first line; so a job that
    makes a communicator per step, or a log that re-initialises its pointers, is not parsed again."""

    __slots__ = ("scanner", "call", "rid", "offset", "detailed", "by_comm", "spill")

    def __init__(self, scanner, call, rid, offset, detailed=False):
        self.scanner, self.call, self.rid = scanner, call, rid
        self.offset = offset    # a bare `opCount ^` line: its entries are OffsetCalls
        self.detailed = detailed    # kernel-trace input: its entries are (list, record id, opCount map)
        self.by_comm = {}       # comm pointer (bytes) -> entry
        self.spill = None       # the entry of every pointer beyond a full handle table

    def __call__(self):
        comm = next(self.scanner.comms, None)
        f = self.by_comm.get(comm)
        if f is None:
            f = self.scanner._switch_entry(self, comm)
        f()

    def take(self, comm, diff):
        """One call whose pointer (and, for a bare `opCount ^` line, pointer difference) the slow
        path has already taken."""
        f = self.by_comm.get(comm)
        if f is None:
            f = self.scanner._switch_entry(self, comm)
        if type(f) is OffsetCall or type(f) is Unattributed:
            f.take(diff)
        else:
            f()


class Unattributed:
    """The cache entry of a COLL line without a host:pid:tid prefix: the entry it wraps, and one more
    such line counted (Scanner.no_prefix counts lines, cached or not)."""

    __slots__ = ("scanner", "entry")

    def __init__(self, scanner, entry):
        self.scanner, self.entry = scanner, entry

    def __call__(self):
        self.scanner.no_prefix += 1
        self.entry()

    def take(self, diff=_NEXT):
        self.scanner.no_prefix += 1
        if type(self.entry) is OffsetCall:
            self.entry.take(diff)
        else:
            self.entry()


_POINTER_FIELD = re.compile(rb"[^\s]{1,%d}\Z" % FIELD_MAX)


def coll_shape(line):
    """(shape, comm, stream) of a normalized COLL line: the line without its comm and stream
    values, which is all a job that makes a communicator per step changes from line to line; a
    parsed line of the same shape is that line with the other comm and stream. (None, None, None)
    when the fields are not where a COLL line has them."""
    body = line.rstrip(b"\r")
    i = body.rfind(b" comm ")
    j = body.find(b" [nranks=", i + 6) if i > 0 else -1
    k = body.find(b" stream ", j + 9) if j > 0 else -1
    if k < 0:
        return None, None, None
    e = body.find(b" ", k + 8)
    if e < 0:
        e = len(body)
    comm, stream = body[i + 6:j], body[k + 8:e]
    if not _POINTER_FIELD.match(comm) or not _POINTER_FIELD.match(stream):
        return None, None, None
    return body[:i + 6] + body[j:k + 8] + body[e:] + line[len(body):], comm, stream


def job_shape(shape):
    """(key, host, pid, tid) of a coll_shape: the shape without its host:pid:tid token, the part
    that changes with every new job (new pids) and every host, and that token's fields, read as
    log_parser.split_prefix reads them. None when the shape has no such token before its COLL part
    (the parse gives it no host): such a shape keeps its whole text as its key. The token holds no
    space and ends in digits, so no `NCCL INFO ` can overlap it: shapes of one key differ only in
    those three fields."""
    i = shape.rfind(INFO_MARK)
    if i <= 0 or shape.find(COLL_MARK, i) < 0:
        return None
    b = len(shape[:i].rstrip())
    a = shape.rfind(b" ", 0, b) + 1
    tok = shape[a:b]
    if tok[:1] == b"[" and tok[-1:] == b"]" and tok[1:-1].isdigit() and len(tok) < 12:    # [cudaDev]
        if a == 0:
            return None
        b = a - 1
        a = shape.rfind(b" ", 0, b) + 1
        tok = shape[a:b]
    parts = tok.rsplit(b":", 3)
    if (len(parts) >= 3 and parts[-1].isdigit() and parts[-2].isdigit() and parts[-3]
            and len(parts[-1]) < 20 and len(parts[-2]) < 20 and len(parts[-3]) <= HOST_MAX):
        return ((shape[:a], shape[b:]), parts[-3].decode("utf-8", "backslashreplace"), int(parts[-2]),
                int(parts[-1]))
    return None


def pointer_diffs(pairs):
    """sendbuff - recvbuff of each (sendbuff, recvbuff) pair (None where one is not a number),
    with C-level passes unless a pointer is `(nil)` or garbage."""
    try:
        return list(map(sub, map(int, map(itemgetter(0), pairs), repeat(16)),
                        map(int, map(itemgetter(1), pairs), repeat(16))))
    except ValueError:
        out = []
        for send, recv in pairs:
            s, r = pointer_value(send), pointer_value(recv)
            out.append(None if s is None or r is None else s - r)
        return out


class Scanner:
    """The streaming pass. `collect` (second pass only): {member index: (lo, hi)} collective windows
    and {(member index, dir, peer)} p2p sequences to gather for locating desyncs."""

    def __init__(self, collect=None):
        self.recs, self.rec_ids = [], {}
        self.rec_kind, self.rec_dsig = [], []
        self.dsigs, self.dsig_ids = [], {}
        self.members, self.by_ptr, self.by_rank = [], {}, {}
        self.unflushed = []             # the handles whose lists may fill, in index order (a closed one: until flushed)
        self._closed = False            # whether a handle was closed since the last flush
        self.comm_tokens = set()        # the comm pointers (bytes) of the handles
        self.sets = {}
        self.init_pending = {}
        self.ordinals = {}
        self.cache = {}                 # normalized COLL line -> callable that appends to its rank list
        self.dcache = {}                # the same for kernel-trace input: (list, record id, opCount map)
        self.tail_cache = {}            # the same keyed by the line from its host on (wrapper cut off)
        self.shapes = {}                # a parsed line keyed by its text without comm/stream pointers
        self.inits = {}                 # INIT, TUNING, kernel-trace, malformed COLL line -> its parse (_keep_parsed)
        self.shaped = 0                 # lines taken from `shapes` (for tests)
        self.cache_bytes = 0
        self.cache_generation = 0       # bumped whenever the caches are cleared
        self.cache_invalidations = 0    # bumped whenever a closed handle's entries are dropped
        self.switched = 0               # entries in the CommSwitches of the line caches
        self.diffs = None               # sendbuff - recvbuff of this block's `opCount ^` lines, in order
        self.comms = None               # the comm pointers strip_comms took out of this block, in order
        self._strip = False             # whether strip_comms runs on the next block
        self._misses = 0                # COLL lines of this block that missed the caches
        self._comm_misses = 0           # ... of them, those only a comm pointer kept out (see feed)
        self._comm_values = None        # ... as a list (to restore lines ahead of the iterator)
        self._key = None                # the line as the block has it (comm pointers out) in the slow path
        self._opcounts = None
        self.kernel_algos = {}          # record id -> Counter((algo, proto))
        self.tuning = {}                # (host, pid, op or None, bytes) -> Counter((algo, proto))
        self.malformed = 0
        self.malformed_reasons = Counter()
        self.samples = []
        self.info_lines = self.warn_lines = self.init_lines = 0
        self.kernel_lines = self.kernel_attributed = self.tuning_lines = 0
        self.no_prefix = 0
        self.overlong = 0
        self.overlong_by_source = {}
        self.pair_count = 0
        self.counters = 0
        self.spill = []                 # record ids of lines of handles beyond MEMBERS_MAX (this block)
        self.unknown = []               # lines of configurations beyond RECS_MAX (this block)
        self.spill_counts = {}          # record id -> lines counted outside any handle
        self.overflow = Counter()       # OVERFLOW_WHAT key -> lines or entries that did not fit
        self.conflicts = []             # inconsistencies: {"kind", "set", "message"}, at most CONFLICTS_MAX
        self.conflict_count = 0
        self._scratch_recent = {}
        self.joined = 0                 # wrapped COLL lines joined with their continuation
        self._pending_wrap = None       # a wrapped last line of a block: (line, opCount, pointers)
        self._unflushed = 0
        self.detailed = False           # kernel-trace input: COLL lines keep their opCounts
        self.collect_coll, self.collect_p2p = collect if collect else ({}, set())
        self.collected_coll, self.collected_p2p = {}, {}
        self._source = ""
        self._lineno = 0
        self._lines = None
        self._raw = None
        self._raw_lines = None          # the block's raw lines, split when a malformed line is sampled
        self._search = 0

    # --- blocks ----------------------------------------------------------------------------------

    def feed(self, chunk, source_name, first_line):
        """One block of complete lines from source_name, whose first line is number first_line."""
        self._source, self._lineno, self._search, self._raw = source_name, first_line, 0, chunk
        self._raw_lines = None
        if self._pending_wrap is not None:
            self._finish_wrap(chunk)
        # (a one-byte test first: memchr is many times faster than a search for the whole mark)
        if self.detailed or (b"#" in chunk and KERNEL_MARK in chunk):
            # kernel-trace input: a COLL line's opCount ties it to its kernel's line, so the
            # normalization hands the opCounts over, consumed one per COLL line in order
            self.detailed = True
            if marker_text_in(chunk):      # marker text in the input: parse raw lines instead
                lines = chunk.split(b"\n")
                lines.pop()
                self._lines = lines
                for line in lines:
                    self._slow(line, False)
            else:
                opcounts = []
                normalized = normalize_chunk(chunk, opcounts)
                literal = b"*" in chunk and COMM_MARK in chunk        # (see below)
                comms = iter(())
                if literal:
                    self.clear_caches()
                elif self._strip:
                    self._comm_values = []
                    normalized = strip_comms(normalized, self._comm_values)
                    self.comms = comms = iter(self._comm_values)
                lines = normalized.split(b"\n")
                lines.pop()
                self._lines = lines
                self._opcounts = opc = iter(opcounts)
                get = self.dcache.get
                slow = self._slow
                for line in lines:
                    e = get(line)
                    if e is None:
                        slow(line, True)
                    else:
                        if type(e) is CommSwitch:
                            comm = next(comms, None)
                            f = e.by_comm.get(comm)
                            e = f if f is not None else self._switch_entry(e, comm)
                        target, rid, recent = e
                        target.append(rid)
                        recent[int(next(opc), 16)] = rid
                        if len(recent) > RECENT_MAX:
                            del recent[next(iter(recent))]
                self._opcounts = None
                self.comms = self._comm_values = None
                if literal:
                    self.clear_caches()
        else:
            # `opCount ^` text in the input itself would take pointers meant for other lines
            pairs = None if b"^" in chunk and b" opCount ^" in chunk else []
            normalized = strip_stamps(normalize_chunk(chunk, pointers=pairs))
            literal = b"*" in chunk and COMM_MARK in chunk
            if literal:
                # the comm marker in the input itself: its lines would meet the cached lines of
                # stripped blocks (and take their pointers); this block keeps its pointers, and
                # the line caches start again before and after it (else a text with the marker
                # is always a stripped block's, one without it a kept block's: they never meet)
                self.clear_caches()
            elif self._strip:
                self._comm_values = []
                normalized = strip_comms(normalized, self._comm_values)
                self.comms = iter(self._comm_values)
            lines = normalized.split(b"\n")
            lines.pop()
            self._lines = lines
            self.diffs = iter(pointer_diffs(pairs)) if pairs else None
            # C-level lookup passes (a window of lines at a time); runs of hits are called by
            # deque(map(call, ...)) without a Python loop; a miss takes the slow path (which may
            # fill the cache for later lines, or drop entries: then the window's rest is looked up
            # again, at most WINDOW lines whatever the block)
            get = self.cache.get
            slow = self._slow
            for w in range(0, len(lines), WINDOW):
                window = lines[w:w + WINDOW]
                entries = list(map(get, window))
                n, start = len(entries), 0
                while start < n:
                    try:
                        i = entries.index(None, start)
                    except ValueError:
                        i = n
                    if i > start:
                        deque(map(call, entries[start:i]), 0)
                    if i < n:
                        f = get(window[i])
                        if f is None:
                            state = self.cache_generation, self.cache_invalidations
                            slow(window[i], True)
                            if state != (self.cache_generation, self.cache_invalidations):
                                entries[i + 1:] = map(get, window[i + 1:])
                        else:
                            f()
                    start = i + 1
            self.diffs = None
            self.comms = self._comm_values = None
            if literal:
                self.clear_caches()
        self._lines = self._raw = self._raw_lines = None
        # take the comm pointers out of the next block only while lines miss the caches because of
        # their comm pointer: where they hit (a job's communicators logging on), or miss for another
        # reason (a new job's pids, a timestamp prefix: logs of many short jobs), the CommSwitch is
        # one more Python call per line for nothing. A miss is the comm pointer's when a parsed line
        # of the same process differs from it only in its pointers (a new or re-initialised
        # communicator), or when a CommSwitch makes a pointer's entry; kernel-trace input (which
        # has no shapes) counts every miss
        rate = (self._misses if self.detailed else self._comm_misses) / (len(lines) or 1)
        self._strip = rate > STRIP_STAY if self._strip else rate > STRIP_START
        self._misses = self._comm_misses = 0
        self._unflushed += len(chunk)
        if self._unflushed >= FLUSH_BYTES:
            self.flush()
        return len(lines)

    def _slow(self, line, fast):
        opcount = diff = comm = None
        self._key = None
        if self.comms is not None and COMM_MARK in line:
            # the line as the log has it (parsed, and cached as a CommSwitch under the block's text)
            self._key = line
            values = [next(self.comms, b"") for _ in range(line.count(COMM_MARK))]
            line = restore_comms(line, values)
            if len(values) == 1:
                comm = values[0]
        if self._opcounts is not None and b" opCount " in line:
            for _ in MARKER.findall(line):      # keep the opCounts aligned with their lines
                opcount = next(self._opcounts, None)
        elif self.diffs is not None and b" opCount ^ " in line:
            for _ in range(line.count(b" opCount ^ ")):     # the same for the pointer differences
                diff = next(self.diffs, None)
        if len(line) > MAX_LINE:        # a joined wrapped line can exceed a block's line cap
            self.overlong += 1
            self.overlong_by_source[self._source] = self.overlong_by_source.get(self._source, 0) + 1
            line = line[:MAX_LINE]
            fast = False
            self._key = None
        if COLL_MARK in line:
            self._coll(line, fast, opcount, diff, comm)
        elif INFO_MARK in line:
            self.info_lines += 1
            if INIT_MARK in line:
                self._init(line)
            elif KERNEL_MARK in line:
                self._kernel(line)
            elif TUNING_MARK in line:
                self._tuning(line)
        elif b"NCCL WARN" in line:
            self.warn_lines += 1

    def _bad(self, line, reason):
        self.malformed += 1
        if reason not in self.malformed_reasons and len(self.malformed_reasons) >= REASONS_MAX:
            reason = "other reasons"
        self.malformed_reasons[reason] += 1
        if len(self.samples) < SAMPLES_MAX and self._lines is not None:
            try:
                idx = self._lines.index(self._key if self._key is not None else line, self._search)
            except ValueError:
                idx = None
            if idx is not None:
                self._search = idx + 1
                if self._raw is not None and self._raw_lines is None:
                    self._raw_lines = self._raw.split(b"\n")     # (once per block, not per sample)
                raw = self._raw_lines[idx] if self._raw is not None else line
                self.samples.append({"source": self._source, "line": self._lineno + idx, "reason": reason,
                                     "text": clip_text(raw)})

    def _cache(self, table, key, value, m=None):
        """Cache value under key; m: the handle whose lists value appends to (None: the tables of
        lines outside any handle, which never change)."""
        if table is self.shapes:
            if len(table) >= SHAPES_MAX:
                table.clear()
            table[key] = value
            return
        if (len(self.cache) + len(self.dcache) + len(self.tail_cache) + self.switched >= CACHE_MAX
                or self.cache_bytes >= CACHE_BYTES):
            self.clear_caches()
        table[key] = value
        self.cache_bytes += len(key)
        if table is not self.cache and table is not self.tail_cache and table is not self.dcache:
            self.switched += 1
        if m is not None:
            if m.cached_generation != self.cache_generation:
                m.cached = []
                m.cached_generation = self.cache_generation
            m.cached.append((table, key))

    def _forget(self, m):
        """Drop the cached entries that append to handle m's lists (m was closed): only those, so
        that a log which re-initialises pointers all along keeps every other line cached."""
        if m.cached_generation == self.cache_generation and m.cached:
            lines = (self.cache, self.tail_cache, self.dcache)
            dropped = False
            for table, key in m.cached:
                if table.pop(key, None) is not None:
                    self.cache_bytes -= len(key)
                    if table is lines[0] or table is lines[1] or table is lines[2]:
                        dropped = True      # (a line's entry: a window looked up before may hold it)
                    else:
                        self.switched -= 1  # (a CommSwitch's: it looks its pointers up per call)
            if dropped:
                self.cache_invalidations += 1
        m.cached = []

    def clear_caches(self):
        """Empty the line caches (the shapes keep their own bound: no entry of theirs belongs to a
        handle)."""
        for m in self.members:      # (their lists name entries that are gone)
            m.cached = []
        self.cache.clear()
        self.switched = 0
        self.dcache.clear()
        self.tail_cache.clear()
        self.cache_bytes = 0
        self.cache_generation += 1

    def conflict(self, kind, cset, message):
        self.conflict_count += 1
        if len(self.conflicts) < CONFLICTS_MAX:
            self.conflicts.append({"kind": kind, "set": cset.key if cset else None, "message": message})

    # --- COLL ------------------------------------------------------------------------------------

    def _coll(self, line, fast, opcount=None, diff=None, pointer=None):
        """diff: for a bare `opCount ^` line, its sendbuff - recvbuff (None: not known). pointer: the
        comm pointer strip_comms took out of the line (its one marker), which the line's text in
        the block (self._key), cached as a CommSwitch, lacks."""
        self._misses += 1
        switched = self.comms is not None
        if switched and pointer is None:
            fast = False        # not one comm pointer taken out (malformed, or wrapper text): not cached
        key = self._key if switched else line
        tail = None
        if fast and self._opcounts is None:
            # a wrapper prefix that changes on every line (a timestamp) defeats the line cache; the
            # part from the host on parses the same, so it has a cache of its own
            i = key.rfind(INFO_MARK)
            j = key.rfind(b" ", 0, key.rfind(b" ", 0, i - 1)) if i > 1 else -1
            if j > 0:
                tail = key[j + 1:]
                f = self.tail_cache.get(tail)
                if f is not None:
                    if switched:
                        f.take(pointer, diff)
                    elif type(f) is OffsetCall or type(f) is Unattributed:
                        f.take(diff)
                    else:
                        f()
                    return
        shape = comm = stream = known = job = None
        if fast and self._opcounts is None:
            shape, comm, stream = coll_shape(line)
            if shape is not None:
                job = job_shape(shape)
                if job is not None:
                    shape = job[0]
                known = self.shapes.get(shape)
        if known is not None:
            # the same line but for its comm/stream pointers and its host:pid:tid: no parse. The
            # shape's CollLine, with this line's host, pid and tid, stands for this line wherever its
            # pointers do not matter (the configuration, the handle's host, pid and nranks); a
            # handle is made from the line's own CollLine
            rec, rid = known
            if job is not None and (rec.host != job[1] or rec.pid != job[2] or rec.tid != job[3]):
                rec = rec._replace(host=job[1], pid=job[2], tid=job[3])
            if rec is known[0] or (rec.host, rec.pid) == (known[0].host, known[0].pid):
                self._comm_misses += 1      # (the same process: a new or re-initialised communicator)
            self.shaped += 1
            comm = comm.decode("utf-8", "backslashreplace")
            m = self.by_ptr.get((rec.host, rec.pid, comm))
            if m is None or m.closed or m.nranks != rec.nranks:
                m = None
                if len(self.members) < MEMBERS_MAX:
                    fields = list(rec)
                    fields[_COMM], fields[_STREAM] = comm, stream.decode("utf-8", "backslashreplace")
                    m = self._member(CollLine._make(fields))
        else:
            rec = self.inits.get(line)      # (a malformed line kept by its text: a log that repeats it)
            if rec is None:
                rec = parse_coll(line.rstrip(b"\r"))
                if type(rec) is Malformed:
                    self._keep_parsed(line, rec)
            if type(rec) is Malformed:
                if not self._wrapped(line, opcount, diff):
                    self._bad(line, rec.reason)
                return
            rid = None
            if shape is not None:
                known = [rec, None]     # its record id once _place has made it
                self._cache(self.shapes, shape, known)
            m = self._member(rec)
        if rec.host is None:
            self.no_prefix += 1
        if m is not None and m.rank is None and rec.globalrank is not None and 0 <= rec.globalrank < rec.nranks:
            m.rank = rec.globalrank     # MSCCL lines have no globalrank; the rank's other lines do
            self.by_rank.setdefault((m.host, m.pid, m.rank, m.nranks), []).append(m)
        if rec.op.inplace_offset and b" opCount ^ count " in line:    # normalize_chunk's bare form
            entry = OffsetCall(self, rec, m)
            if fast:
                self._cache_line(key, tail, entry if rec.host is not None else Unattributed(self, entry), m, rec,
                                 None, pointer)
            entry.take(diff)
            return
        target, rid = self._place(rec, m, rid)
        if known is not None:
            known[1] = rid
        if self.detailed:
            recent = m.recent if m is not None else self._scratch_recent
            if fast and self._opcounts is not None and rec.host is not None:     # (no_prefix counts per line)
                if pointer is None:
                    self._cache(self.dcache, line, (target, rid, recent), m)
                else:
                    switch = CommSwitch(self, rec, rid, False, True)
                    self._cache(self.dcache, key, switch)
                    self._cache(switch.by_comm, pointer, (target, rid, recent), m)
            number = rec.opcount if opcount is None else int(opcount, 16)
            if number is not None:
                recent[number] = rid
                if len(recent) > RECENT_MAX:
                    del recent[next(iter(recent))]
        elif fast:
            f = partial(target.append, rid)
            self._cache_line(key, tail, f if rec.host is not None else Unattributed(self, f), m, rec, rid, pointer)
        target.append(rid)

    def _cache_line(self, key, tail, entry, m, rec, rid, pointer):
        """Cache a COLL line's entry under its text (and its tail); in a block whose comm pointers
        were taken out, a CommSwitch under the text and the entry under the pointer."""
        if pointer is None:
            self._cache(self.cache, key, entry, m)
            if tail is not None:
                self._cache(self.tail_cache, tail, entry, m)
            return
        switch = CommSwitch(self, rec, rid, type(entry) is OffsetCall or (type(entry) is Unattributed
                                                                       and type(entry.entry) is OffsetCall))
        self._cache(self.cache, key, switch)
        if tail is not None:
            self._cache(self.tail_cache, tail, switch)
        self._cache(switch.by_comm, pointer, entry, m)

    def _switch_entry(self, switch, pointer):
        """The entry of a CommSwitch's line with another comm pointer: what _coll makes of the line
        with that pointer in it, from the parsed line the switch holds (its configuration and
        prefix are the line's; a handle is made from it with the pointer put back)."""
        self._misses += 1
        self._comm_misses += 1
        rec = switch.call
        if pointer is None:         # (the block handed over fewer pointers than it has markers)
            pointer = b""
        full = len(self.members) >= MEMBERS_MAX
        if full and switch.spill is not None and pointer.isascii() and pointer not in self.comm_tokens:
            return switch.spill     # no handle has the pointer and none can be made: one entry for all
        comm = pointer.decode("utf-8", "backslashreplace")
        m = self.by_ptr.get((rec.host, rec.pid, comm))
        if m is None or m.closed or m.nranks != rec.nranks:
            m = None
            if len(self.members) < MEMBERS_MAX:
                m = self._member(rec._replace(comm=comm))
        if m is not None and m.rank is None and rec.globalrank is not None and 0 <= rec.globalrank < rec.nranks:
            m.rank = rec.globalrank
            self.by_rank.setdefault((m.host, m.pid, m.rank, m.nranks), []).append(m)
        if switch.detailed:     # (lines without a prefix are not cached there: no Unattributed)
            target, rid = self._place(rec, m, switch.rid)
            switch.rid = rid
            entry = (target, rid, m.recent if m is not None else self._scratch_recent)
        else:
            if switch.offset:
                entry = OffsetCall(self, rec, m)
            else:
                target, rid = self._place(rec, m, switch.rid)
                switch.rid = rid
                entry = partial(target.append, rid)
            if rec.host is None:
                entry = Unattributed(self, entry)
        if m is None and full:
            # the handle table never shrinks: no handle will take this line again, it stays the
            # entry; cached per pointer too when a handle has the pointer (a log that re-initialises
            # its pointers after the table filled would look each line's pointer up again)
            if switch.spill is None:
                switch.spill = entry
            else:
                entry = switch.spill
            if pointer in self.comm_tokens:
                self._cache(switch.by_comm, pointer, entry)
        else:
            self._cache(switch.by_comm, pointer, entry, m)
        return entry

    # --- wrapped lines -----------------------------------------------------------------------------

    def _wrapped(self, line, opcount, diff):
        """Whether a malformed COLL line was wrapped after `comm`/`stream` and is (or may be, at the
        end of a block) completed by the next line or two; the joined line is then counted, once."""
        if not line.rstrip(b" \t\r").endswith(WRAP_WORDS) or self._lines is None:
            return False
        try:
            idx = self._lines.index(self._key if self._key is not None else line, self._search)
        except ValueError:
            return False
        following = self._lines[idx + 1:idx + 1 + WRAPS_MAX]
        if self.comms is not None and any(COMM_MARK in x for x in following):
            # their pointers are the next ones the iterator has not handed out yet
            pos = len(self._comm_values) - length_hint(self.comms)
            restored = []
            for x in following:
                n = x.count(COMM_MARK)
                restored.append(restore_comms(x, self._comm_values[pos:pos + n]) if n else x)
                pos += n
            following = restored
        return self._complete(line, following, opcount, diff, True)

    def _complete(self, cur, following, opcount, diff, may_wait):
        """Join cur with the continuation lines in `following` until it parses (at most WRAPS_MAX);
        with may_wait, a record still open at the end of `following` waits for the next block."""
        for n, nxt in enumerate(following, 1):
            if not cur.rstrip(b" \t\r").endswith(WRAP_WORDS) or not CONTINUATION.match(nxt):
                return False
            cur = cur.rstrip(b" \t\r") + b" " + nxt.strip()
            if type(parse_coll(cur)) is not Malformed:
                self.joined += 1
                self._coll(cur, False, opcount, diff)
                return True
            if n == WRAPS_MAX:
                return False
        if may_wait and cur.rstrip(b" \t\r").endswith(WRAP_WORDS):
            self._pending_wrap = (cur, opcount, diff)
            return True
        return False

    def _finish_wrap(self, chunk):
        """The start of the next block (b"" at the end of a source) for a wrapped line kept back."""
        line, opcount, diff = self._pending_wrap
        self._pending_wrap = None
        lines, self._lines = self._lines, None      # not sampled: its block is gone
        if not self._complete(line, chunk.split(b"\n", WRAPS_MAX)[:WRAPS_MAX], opcount, diff, False):
            rec = parse_coll(line.rstrip(b"\r"))
            self._bad(line, rec.reason if type(rec) is Malformed else "wrapped COLL line")
        self._lines = lines

    def end_source(self):
        if self._pending_wrap is not None:
            self._finish_wrap(b"")
        self.flush()

    def done(self):
        """After the last source: the caches are of no more use (their memory goes before the
        census is built)."""
        self.clear_caches()
        self.shapes.clear()
        self.inits.clear()
        self._scratch_recent.clear()

    def _place(self, c, m, rid=None):
        """(list, record id) where a call of this configuration on handle m (None: beyond the
        table) is appended. rid: the configuration's record id when known."""
        if rid is None:
            rid = self._rid(c)
        if rid is None:
            return self.unknown, None
        if m is None:
            return self.spill, rid
        kind = self.rec_kind[rid]
        if kind == 0:
            return m.seq, rid
        if kind == 3:
            return m.other, rid
        key = ("send" if kind == 1 else "recv", c.root)
        pd = m.pairs.get(key)
        if pd is None and self.pair_count < PAIRS_MAX:
            pd = m.pairs[key] = desync.PairDigest()
            self.pair_count += 1
        if pd is None:
            m.pairs_dropped = True
            self.overflow["p2p_pairs"] += 1
            return m.other, rid
        return pd.rids, rid

    def _rid(self, c):
        rec = Rec(c.op.name, c.op_name, c.count, c.datatype, c.redop, c.root, c.inplace, c.nranks)
        rid = self.rec_ids.get(rec)
        if rid is not None:
            return rid
        if len(self.recs) >= RECS_MAX:
            return None
        rid = len(self.recs)
        self.recs.append(rec)
        self.rec_ids[rec] = rid
        kind = KIND_CODE.get(c.op.kind, 3)
        if kind == 0:
            sig = (c.op.name, c.count, c.datatype, c.redop, c.root if c.op.rooted else None)
        else:
            sig = ("p2p", c.count, c.datatype)
        dsig = self.dsig_ids.get(sig)
        if dsig is None:
            dsig = self.dsig_ids[sig] = len(self.dsigs)
            self.dsigs.append(sig)
        self.rec_kind.append(kind)
        self.rec_dsig.append(dsig)
        return rid

    def _member(self, c):
        """The handle of a COLL line, made on its first line; None when the table is full."""
        key = (c.host, c.pid, c.comm)
        old = m = self.by_ptr.get(key)
        if m is not None and not m.closed and m.nranks == c.nranks:
            return m
        if len(self.members) >= MEMBERS_MAX:
            return None
        m = Member(len(self.members), c.host, c.pid, c.comm, c.nranks)
        if old is not None and not old.closed:
            # the pointer's lines of the other nranks stay cached for the old handle: the one that
            # replaces it in by_ptr drops them too when the pointer is re-initialised
            m.cached, m.cached_generation, old.cached = old.cached, old.cached_generation, []
        self.members.append(m)
        self.unflushed.append(m)
        self.comm_tokens.add(c.comm.encode("utf-8", "surrogateescape"))
        self.by_ptr[key] = m
        init = self.init_pending.pop(key, None)
        if init is not None and init.nranks != c.nranks:
            self.conflict("nranks", None,
                          f"{m.where()}: its INIT line says rank {init.rank} of nranks {init.nranks} but its COLL "
                          f"lines say nranks={c.nranks}; the INIT line is not used for it")
            init = None
        if init is not None:
            m.rank, m.comm_id, m.bus_id, m.cuda_dev = init.rank, init.comm_id, init.bus_id, init.cuda_dev
            m.func, m.parent = init.func, init.parent
        elif c.globalrank is not None and 0 <= c.globalrank < c.nranks:
            m.rank = c.globalrank
        if c.host is None:
            skey, source = f"no host:pid prefix, nranks={c.nranks}", "unattributed"
        elif m.comm_id:
            skey, source = f"commId {m.comm_id}", "commId"
        else:
            # the k-th communicator of this size in the process (per rank, or per device when the
            # rank is unknown: one process may drive several GPUs of one communicator)
            who = ("rank", m.rank) if m.rank is not None else ("dev", c.dev)
            okey = (c.host, c.pid, c.nranks, who)
            k = self.ordinals.get(okey, 0)
            self.ordinals[okey] = k + 1
            skey, source = f"nranks={c.nranks} #{k}", "inferred"
        cset = self.sets.get(skey)
        if cset is None:
            cset = self.sets[skey] = desync.CommSet(skey, source, c.nranks)
        if source == "commId" and m.rank is not None:
            owner = cset.rank_owner.setdefault(m.rank, m)
            if owner is not m and (owner.host, owner.pid) != (m.host, m.pid):
                cset.conflicted = True
                self.conflict("duplicate_rank", cset,
                              f"communicator {cset.key}: rank {m.rank} is claimed by two processes, "
                              f"{owner.where()} and {m.where()}")
        cset.members.append(m)
        m.cset = cset
        if m.rank is not None:
            self.by_rank.setdefault((c.host, c.pid, m.rank, c.nranks), []).append(m)
        return m

    # --- other lines -----------------------------------------------------------------------------

    def _init(self, line):
        if len(self.members) >= MEMBERS_MAX:
            # no handle can be made any more: an INIT line only matters if it re-initialises a
            # pointer a handle has (cheap test on the comm token before the parse)
            i = line.find(b" comm ")
            token = line[i + 6:line.find(b" ", i + 6)] if i >= 0 else b""
            if token and token not in self.comm_tokens:
                self.init_lines += 1
                return
        init = self.inits.get(line, _NEXT)
        if init is _NEXT:       # (a log that re-initialises its pointers logs the same INIT lines again)
            init = parse_init(line.rstrip(b"\r"))
            self._keep_parsed(line, init)
        if init is None:
            return
        if type(init) is Malformed:
            self._bad(line, init.reason)
            return
        self.init_lines += 1
        key = (init.host, init.pid, init.comm)
        pending = self.init_pending
        pending.pop(key, None)
        if len(self.members) < MEMBERS_MAX:     # else no handle can be made for it any more
            if len(pending) >= INIT_PENDING_MAX:
                del pending[next(iter(pending))]
                self.overflow["init_lines"] += 1
            pending[key] = init
        old = self.by_ptr.get(key)
        if old is not None:
            old.closed = True   # the pointer was re-initialised: its next COLL line starts a new handle
            self._closed = True
            self._forget(old)

    def _kernel(self, line):
        if b" KL " not in line:         # kernel end, element and data records: counted, not parsed
            self.kernel_lines += 1
            return
        k = self.inits.get(line, _NEXT)
        if k is _NEXT:          # (RCCL stamps its kernel lines: only a log that repeats itself hits)
            k = parse_kernel(line.rstrip(b"\r"))
            self._keep_parsed(line, k)
        if k is None or type(k) is Malformed:
            return
        self.kernel_lines += 1
        if k.record != "KL" or k.coll is None or k.p2p:
            return
        for m in self.by_rank.get((k.host, k.pid, k.rank, k.nranks), ()):
            rid = m.recent.get(k.opcount)
            if rid is None:
                continue
            rec = self.recs[rid]
            if rec.op != k.coll.name or not same_kernel_type(rec.datatype, k.datatype):
                continue
            del m.recent[k.opcount]     # one launch per call, however many blocks print it
            self.kernel_algos.setdefault(rid, Counter())[(k.algorithm, k.protocol)] += 1
            self.kernel_attributed += 1
            return

    def _keep_parsed(self, line, parsed):
        """Keep a parsed INIT, TUNING or kernel-trace line, or a malformed COLL line, by its text
        (bounded: cleared when full). Which parser a text goes to depends on the text alone, so
        the kinds never meet under one key."""
        if len(self.inits) >= INITS_MAX:
            self.inits.clear()
        self.inits[line] = parsed

    def _tuning(self, line):
        t = self.inits.get(line, _NEXT)
        if t is _NEXT:          # (rank 0 logs one TUNING line per size, again and again)
            t = parse_tuning(line.rstrip(b"\r"))
            self._keep_parsed(line, t)
        if t is None or type(t) is Malformed:
            return
        self.tuning_lines += 1
        key = (t.host, t.pid, t.op.name if t.op else None, t.nbytes)
        got = self.tuning.get(key)
        if got is None:
            if len(self.tuning) >= TUNING_KEYS_MAX:
                self.overflow["tuning_keys"] += 1
                return
            got = self.tuning[key] = Counter()
        got[(t.algorithm, t.protocol)] += 1

    # --- after each block ------------------------------------------------------------------------

    def flush(self):
        """Fold the rank lists filled since the last flush into counts and digests."""
        self._unflushed = 0
        dsig = self.rec_dsig
        collect_coll, collect_p2p = self.collect_coll, self.collect_p2p
        if self.spill:
            self._spilled(self.spill, "rank_handles")
            self.spill.clear()
        if self.unknown:
            self.overflow["configurations"] += len(self.unknown)
            self.unknown.clear()
        # (a closed handle's entries are gone: once its lists are folded below, nothing fills them again)
        live = self.unflushed
        if self._closed:
            self.unflushed = [m for m in live if not m.closed]
            self._closed = False
        for m in live:
            seq = m.seq
            if seq:
                self._count(m, seq)
                ids = list(map(dsig.__getitem__, seq))
                if collect_coll and m.index in collect_coll:
                    lo, hi = collect_coll[m.index]
                    start = m.digest.n
                    a, b = max(lo, start), min(hi, start + len(ids))
                    if a < b:
                        self.collected_coll.setdefault(m.index, (lo, []))[1].extend(ids[a - start:b - start])
                m.digest.feed(ids)
                seq.clear()
            for key, pd in m.pairs.items():
                rids = pd.rids
                if rids:
                    self._count(m, rids)
                    ids = list(map(dsig.__getitem__, rids))
                    if collect_p2p and (m.index,) + key in collect_p2p:
                        got = self.collected_p2p.setdefault((m.index,) + key, [])
                        got.extend(ids[:desync.P2P_LOCATE_CAP - len(got)])
                    pd.feed(ids)
                    rids.clear()
            if m.other:
                self._count(m, m.other)
                m.other.clear()

    def _spilled(self, rids, what):
        """Lines counted outside any handle's counters: in the groups' rank lines only."""
        spill = self.spill_counts
        for rid, n in Counter(rids).items():
            spill[rid] = spill.get(rid, 0) + n
        self.overflow[what] += len(rids)

    def _count(self, m, rids):
        m.lines += len(rids)
        counts = m.counts
        over = None
        for rid, n in Counter(rids).items():
            if rid in counts:
                counts[rid] += n
            elif self.counters < COUNTERS_MAX:
                counts[rid] = n
                self.counters += 1
            else:
                over = over or []
                over += [rid] * n
        if over:
            self._spilled(over, "counters")

    # --- results ---------------------------------------------------------------------------------

    def describe(self, dsig_id):
        sig = self.dsigs[dsig_id]
        if sig[0] == "p2p":
            return {"op": "Send/Recv", "count": sig[1], "datatype": sig[2]}
        op, count, datatype, redop, root = sig
        return {"op": op, "count": count, "datatype": datatype, "redop": redop, "root": root}


@contextmanager
def collector_off():
    """The cyclic garbage collector off, as it was after. The census makes no reference cycles per
    line (tests/test_nccl_census_cache.py checks it), while the collector's full passes walked
    every cached entry and handle, again and again: a third of the CPU time on logs of many
    communicators, and once more for all of them when it came back on before the census was built."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def scan(sources, scanner, stats, warnings, block):
    """Feed every source to the scanner, block by block (the collector off meanwhile)."""
    with collector_off():
        _scan(sources, scanner, stats, warnings, block)


def _scan(sources, scanner, stats, warnings, block):
    for src in sources:
        st = stats.setdefault(src.name, SourceStats())
        lineno = 1
        if not scanner.detailed and src.sniff(KERNEL_MARK):
            scanner.detailed = True     # decided before the first block, whatever the block size
        joined = scanner.joined
        for chunk in read_blocks(src, st, warnings, block=block):
            lineno += scanner.feed(chunk, src.name, lineno)
        scanner.end_source()
        st.lines = lineno - 1
        st.joined = scanner.joined - joined
    scanner.done()
