"""`collbench nccl census`: stream NCCL/RCCL logs in constant memory and count the collectives.

The scanner reads blocks of lines. A block without kernel-trace lines takes the fast path:
`normalize_chunk` turns every COLL line into a form without its per-call parts (opCount, buffer
pointers), so a rank's repeated calls are byte-identical; each line is then one dictionary lookup
that yields the bound `append` of its rank's list with the call's record id, and is called. Lines
not in the cache (new configurations, other subsystems, INIT/TUNING lines, garbage) take the slow
path: `log_parser` parses them and the result is cached when it is a COLL line. After each block
the per-rank lists are folded into the census counts and into the desync digests, then cleared,
so memory depends on the number of distinct configurations and ranks, not on the log's length.
In RCCL kernel-trace input the opCount matters (it ties a kernel launch, and so an algorithm and
protocol, to its call): there the normalization hands the removed opCounts over, in line order.

Python API:
    census = run_census(["logs/"])              # Census; raises a UserError subclass on bad input
    for g in census.groups: g.op, g.count, g.datatype, g.type_size, g.redop, g.nranks, g.inplace,
                            g.roots, g.calls, g.rank_calls, g.bytes_per_call, g.total_bytes, g.share
    census.communicators                        # per rank handle: host, pid, comm, rank, set, ...
    census.document()                           # the JSON document `--format json` prints
    for c in iter_calls(["logs/"], comm="0x55d0c1a2e0"):   # COLL lines in log order, streamed:
        c.source, c.line, c.call                # LoggedCall; c.call is a log_parser.CollLine
"""

from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import NamedTuple, Optional

from collbench.errors import UserError
from collbench.nccl import desync
from collbench.nccl.formats import COLL, DATATYPE_SIZES, OPS, RECV, SEND, same_kernel_type
from collbench.nccl.log_input import BLOCK, MAX_LINE, LogInputError, SourceStats, expand_paths, read_blocks
from collbench.nccl.log_parser import (COLL_MARK, INFO_MARK, INIT_MARK, KERNEL_MARK, MARKER, TUNING_MARK, CollLine,
                                       Malformed, clip_text, normalize_chunk, parse_coll, parse_init,
                                       parse_kernel, parse_line, parse_tuning)

SCHEMA = 1
CACHE_MAX = 50_000          # normalized lines cached; cleared when full (timestamped lines never repeat)
RECENT_MAX = 1024           # per-rank opCount -> call map for kernel-trace attribution
SAMPLES_MAX = 50            # malformed lines kept for -v / JSON
ROOTS_MAX = 16              # distinct roots listed per configuration
TUNING_KEYS_MAX = 100_000
FLUSH_BYTES = 4 << 20      # input bytes between folds of the per-rank lists (bounds their length)
PAIRS_MAX = 50_000          # (rank, direction, peer) p2p digests; beyond, p2p lines are only counted
KIND_CODE = {COLL: 0, SEND: 1, RECV: 2}     # anything else (RMA) is 3: counted, not checked

NO_COLL_HINT = ("Collective lines come from NCCL_DEBUG=INFO with COLL in NCCL_DEBUG_SUBSYS "
                "(NCCL_DEBUG_SUBSYS=INIT,COLL also gives ranks and commIds); the default subsystems "
                "(INIT; INIT,ENV from 2.16; INIT,BOOTSTRAP,ENV from 2.23) and NCCL_DEBUG=WARN log none. "
                "RCCL reads the same variables")


class NoCollectivesError(UserError):
    """The input holds no NCCL/RCCL collective (COLL) line."""


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


class LoggedCall(NamedTuple):
    """One COLL line, streamed by iter_calls: where it was and what it says."""
    source: str
    line: int               # 1-based line number in its source
    call: CollLine


class Member:
    """One rank's handle of one communicator: (host, pid, comm pointer), a new one after re-init."""

    __slots__ = ("index", "host", "pid", "comm", "rank", "nranks", "comm_id", "bus_id", "cuda_dev", "func",
                 "parent", "cset", "seq", "other", "pairs", "pairs_dropped", "counts", "lines", "digest", "recent",
                 "closed")

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

    def identity(self):
        return {"host": self.host, "pid": self.pid, "comm": self.comm, "rank": self.rank}

    def where(self):
        return f"{self.host or '?'}:{self.pid if self.pid is not None else '?'} comm {self.comm}"


@dataclass
class Algorithm:
    algorithm: str
    protocol: str
    count: int
    source: str             # "kernel-trace" (RCCL KL lines, per call) or "tuning" (NCCL TUNING lines, rank 0)


@dataclass
class ConfigGroup:
    """One distinct (op, count, datatype, redop, nranks, in-place) configuration of the log."""
    op: str                 # NCCL's name: AllReduce AllGather ReduceScatter Broadcast Reduce AlltoAll Gather ...
    collbench_op: str       # the row of collbench.ops for it, "" when there is none (Gather, Scatter, Send, Recv)
    count: int              # elements as passed to the API (per rank for AllGather, per peer for AlltoAll)
    datatype: str
    type_size: int
    redop: Optional[str]    # None for ops that do not reduce
    nranks: int
    inplace: bool
    rank_calls: int         # lines: calls summed over every rank that logged one
    calls: int              # invocations per rank: the maximum over the ranks that logged it
    bytes_per_call: int     # nccl-tests' S
    total_bytes: int        # calls * bytes_per_call
    share: float            # of all groups' total_bytes
    roots: list             # distinct roots (peers for Send/Recv), at most ROOTS_MAX
    op_names: list          # names as logged (mscclFuncAllReduce, AllToAllPivot, ...)
    ranks: int              # ranks (communicator handles) that logged it
    hosts: int
    algorithms: list = field(default_factory=list)     # [Algorithm], most frequent first

    def key(self):
        return (self.op, self.count, self.datatype, self.redop, self.nranks, self.inplace)


class Scanner:
    """The streaming pass. `collect` (second pass only): {member index: (lo, hi)} collective windows
    and {(member index, dir, peer)} p2p sequences to gather for locating desyncs."""

    def __init__(self, collect=None):
        self.recs, self.rec_ids = [], {}
        self.rec_kind, self.rec_dsig = [], []
        self.dsigs, self.dsig_ids = [], {}
        self.members, self.by_ptr, self.by_rank = [], {}, {}
        self.sets = {}
        self.init_pending = {}
        self.ordinals = {}
        self.cache = {}                 # normalized COLL line -> bound append of its rank list
        self.dcache = {}                # the same for kernel-trace input: (list, record id, opCount map)
        self.tail_cache = {}            # the same keyed by the line from its host on (wrapper cut off)
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
        self._unflushed = 0
        self.detailed = False           # kernel-trace input: COLL lines keep their opCounts
        self.collect_coll, self.collect_p2p = collect if collect else ({}, set())
        self.collected_coll, self.collected_p2p = {}, {}
        self._source = ""
        self._lineno = 0
        self._lines = None
        self._raw = None
        self._search = 0

    # --- blocks ----------------------------------------------------------------------------------

    def feed(self, chunk, source_name, first_line):
        """One block of complete lines from source_name, whose first line is number first_line."""
        self._source, self._lineno, self._search, self._raw = source_name, first_line, 0, chunk
        if self.detailed or KERNEL_MARK in chunk:
            # kernel-trace input: a COLL line's opCount ties it to its kernel's line, so the
            # normalization hands the opCounts over, consumed one per COLL line in order
            self.detailed = True
            if MARKER.search(chunk):    # marker text in the input itself: parse raw lines instead
                lines = chunk.split(b"\n")
                lines.pop()
                self._lines = lines
                for line in lines:
                    self._slow(line, False)
            else:
                opcounts = []
                lines = normalize_chunk(chunk, opcounts).split(b"\n")
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
                        target, rid, recent = e
                        target.append(rid)
                        recent[int(next(opc), 16)] = rid
                        if len(recent) > RECENT_MAX:
                            del recent[next(iter(recent))]
                self._opcounts = None
        else:
            lines = normalize_chunk(chunk).split(b"\n")
            lines.pop()
            self._lines = lines
            get = self.cache.get
            slow = self._slow
            for line in lines:
                f = get(line)
                if f is None:
                    slow(line, True)
                else:
                    f()
        self._lines = self._raw = None
        self._unflushed += len(chunk)
        if self._unflushed >= FLUSH_BYTES:
            self.flush()
        return len(lines)

    def _slow(self, line, fast):
        opcount = None
        if self._opcounts is not None and b" opCount " in line:
            for _ in MARKER.findall(line):      # keep the opCounts aligned with their lines
                opcount = next(self._opcounts, None)
        if len(line) > MAX_LINE:        # lines longer than a block are cut by the reader, these here
            self.overlong += 1
            self.overlong_by_source[self._source] = self.overlong_by_source.get(self._source, 0) + 1
            line = line[:MAX_LINE]
            fast = False
        if COLL_MARK in line:
            self._coll(line, fast, opcount)
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
        self.malformed_reasons[reason] += 1
        if len(self.samples) < SAMPLES_MAX and self._lines is not None:
            try:
                idx = self._lines.index(line, self._search)
            except ValueError:
                idx = None
            if idx is not None:
                self._search = idx + 1
                raw = self._raw.split(b"\n")[idx] if self._raw is not None else line
                self.samples.append({"source": self._source, "line": self._lineno + idx, "reason": reason,
                                     "text": clip_text(raw)})

    # --- COLL ------------------------------------------------------------------------------------

    def _coll(self, line, fast, opcount=None):
        tail = None
        if fast and self._opcounts is None:
            # a wrapper prefix that changes on every line (a timestamp) defeats the line cache; the
            # part from the host on parses the same, so it has a cache of its own
            i = line.rfind(INFO_MARK)
            j = line.rfind(b" ", 0, line.rfind(b" ", 0, i - 1)) if i > 1 else -1
            if j > 0:
                tail = line[j + 1:]
                f = self.tail_cache.get(tail)
                if f is not None:
                    f()
                    return
        rec = parse_coll(line.rstrip(b"\r"))
        if type(rec) is Malformed:
            self._bad(line, rec.reason)
            return
        if rec.host is None:
            self.no_prefix += 1
        m = self._member(rec)
        if m.rank is None and rec.globalrank is not None and 0 <= rec.globalrank < rec.nranks:
            m.rank = rec.globalrank     # MSCCL lines have no globalrank; the rank's other lines do
            self.by_rank.setdefault((m.host, m.pid, m.rank, m.nranks), []).append(m)
        rid = self._rid(rec)
        kind = self.rec_kind[rid]
        if kind == 0:
            target = m.seq
        elif kind == 3:
            target = m.other
        else:
            key = ("send" if kind == 1 else "recv", rec.root)
            pd = m.pairs.get(key)
            if pd is None and self.pair_count < PAIRS_MAX:
                pd = m.pairs[key] = desync.PairDigest()
                self.pair_count += 1
            if pd is None:
                m.pairs_dropped = True
                target = m.other
            else:
                target = pd.rids
        if self.detailed:
            if fast and self._opcounts is not None:
                if len(self.dcache) >= CACHE_MAX:
                    self.dcache.clear()
                self.dcache[line] = (target, rid, m.recent)
            number = rec.opcount if opcount is None else int(opcount, 16)
            if number is not None:
                m.recent[number] = rid
                if len(m.recent) > RECENT_MAX:
                    del m.recent[next(iter(m.recent))]
        elif fast:
            if len(self.cache) >= CACHE_MAX:
                self.cache.clear()
            f = self.cache[line] = partial(target.append, rid)
            if tail is not None:
                if len(self.tail_cache) >= CACHE_MAX:
                    self.tail_cache.clear()
                self.tail_cache[tail] = f
        target.append(rid)

    def _rid(self, c):
        rec = Rec(c.op.name, c.op_name, c.count, c.datatype, c.redop, c.root, c.inplace, c.nranks)
        rid = self.rec_ids.get(rec)
        if rid is not None:
            return rid
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
        key = (c.host, c.pid, c.comm)
        m = self.by_ptr.get(key)
        if m is not None and not m.closed and m.nranks == c.nranks:
            return m
        m = Member(len(self.members), c.host, c.pid, c.comm, c.nranks)
        self.members.append(m)
        self.by_ptr[key] = m
        init = self.init_pending.pop(key, None)
        if init is not None and init.nranks == c.nranks:
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
        cset.members.append(m)
        m.cset = cset
        if m.rank is not None:
            self.by_rank.setdefault((c.host, c.pid, m.rank, c.nranks), []).append(m)
        return m

    # --- other lines -----------------------------------------------------------------------------

    def _init(self, line):
        init = parse_init(line.rstrip(b"\r"))
        if init is None:
            return
        if type(init) is Malformed:
            self._bad(line, init.reason)
            return
        self.init_lines += 1
        key = (init.host, init.pid, init.comm)
        self.init_pending[key] = init
        old = self.by_ptr.get(key)
        if old is not None:
            old.closed = True   # the pointer was re-initialised: its next COLL line starts a new handle
            self.cache.clear()
            self.dcache.clear()
            self.tail_cache.clear()

    def _kernel(self, line):
        if b" KL " not in line:         # kernel end, element and data records: counted, not parsed
            self.kernel_lines += 1
            return
        k = parse_kernel(line.rstrip(b"\r"))
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

    def _tuning(self, line):
        t = parse_tuning(line.rstrip(b"\r"))
        if t is None or type(t) is Malformed:
            return
        self.tuning_lines += 1
        key = (t.host, t.pid, t.op.name if t.op else None, t.nbytes)
        got = self.tuning.get(key)
        if got is None:
            if len(self.tuning) >= TUNING_KEYS_MAX:
                return
            got = self.tuning[key] = Counter()
        got[(t.algorithm, t.protocol)] += 1

    # --- after each block ------------------------------------------------------------------------

    def flush(self):
        """Fold the rank lists filled since the last flush into counts and digests."""
        self._unflushed = 0
        dsig = self.rec_dsig
        collect_coll, collect_p2p = self.collect_coll, self.collect_p2p
        for m in self.members:
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

    @staticmethod
    def _count(m, rids):
        m.lines += len(rids)
        counts = m.counts
        for rid, n in Counter(rids).items():
            counts[rid] = counts.get(rid, 0) + n

    # --- results ---------------------------------------------------------------------------------

    def describe(self, dsig_id):
        sig = self.dsigs[dsig_id]
        if sig[0] == "p2p":
            return {"op": "Send/Recv", "count": sig[1], "datatype": sig[2]}
        op, count, datatype, redop, root = sig
        return {"op": op, "count": count, "datatype": datatype, "redop": redop, "root": root}


def _scan(sources, scanner, stats, warnings, block):
    for src in sources:
        st = stats.setdefault(src.name, SourceStats())
        lineno = 1
        if not scanner.detailed and src.sniff(KERNEL_MARK):
            scanner.detailed = True     # decided before the first block, whatever the block size
        for chunk in read_blocks(src, st, warnings, block=block):
            lineno += scanner.feed(chunk, src.name, lineno)
        scanner.flush()
        st.lines = lineno - 1


class Census:
    """The result of run_census: configuration groups, communicators, hosts, desync findings."""

    def __init__(self, groups, communicators, sets, hosts, desync_findings, totals, inputs, malformed,
                 warnings):
        self.groups = groups                    # [ConfigGroup], largest total_bytes first
        self.communicators = communicators      # [dict] one per rank handle
        self.sets = sets                        # [dict] one per (known or inferred) communicator
        self.hosts = hosts                      # [dict]
        self.desync = desync_findings           # [dict]
        self.totals = totals                    # dict of counters (lines, collective_lines, ...)
        self.inputs = inputs                    # [dict] per source
        self.malformed = malformed              # [dict] samples
        self.warnings = warnings                # [str]

    def document(self):
        doc = {"schema": SCHEMA, "kind": "nccl_census"}
        doc.update(self.totals)
        doc["groups"] = [dict(asdict(g), algorithms=[asdict(a) for a in g.algorithms]) for g in self.groups]
        doc["communicators"] = self.communicators
        doc["communicator_sets"] = self.sets
        doc["hosts"] = self.hosts
        doc["desync"] = self.desync
        doc["inputs"] = self.inputs
        doc["malformed"] = self.malformed
        doc["warnings"] = self.warnings
        return doc


def run_census(paths, block=BLOCK):
    """Census of the logs at paths (files, directories, .gz, '-' for stdin). UserError on bad input."""
    warnings = []
    sources = expand_paths(paths, warnings)
    try:
        stats = {}
        scanner = Scanner()
        _scan(sources, scanner, stats, warnings, block)
        _check_input(sources, stats, scanner)
        findings = _desync(sources, scanner, block, warnings)
        return _build(scanner, sources, stats, findings, warnings)
    finally:
        for src in sources:
            src.cleanup()


def _check_input(sources, stats, scanner):
    read = [s for s in sources if stats[s.name].skipped is None]
    names = ", ".join(s.name for s in sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")
    if not read:
        raise LogInputError(f"{names}: no readable log (every file was skipped)")
    if sum(stats[s.name].bytes for s in read) == 0:
        raise LogInputError(f"{names}: empty log (0 bytes)")
    if not scanner.members:
        lines = sum(stats[s.name].lines for s in read)
        seen = []
        if scanner.malformed:
            seen.append(f"{scanner.malformed} malformed COLL lines "
                        f"({', '.join(r for r, _ in scanner.malformed_reasons.most_common(2))})")
        if scanner.info_lines:
            seen.append(f"{scanner.info_lines} NCCL INFO lines of other subsystems")
        if scanner.warn_lines:
            seen.append(f"{scanner.warn_lines} NCCL WARN lines")
        found = "; found " + ", ".join(seen) if seen else "; no NCCL lines at all"
        raise NoCollectivesError(f"{names}: no NCCL collective lines in {lines} lines{found}. {NO_COLL_HINT}")


def _desync(sources, scanner, block, warnings):
    sets = list(scanner.sets.values())
    for cset in sets:
        if cset.nranks == 1:
            cset.status, cset.note = "unchecked", "nranks=1: nothing to compare"
        elif cset.source == "unattributed":
            cset.status, cset.note = "unchecked", "lines without host:pid:tid cannot be told apart by rank"
    checked = [c for c in sets if c.status != "unchecked"]
    pending, pairs = desync.plan(checked)
    if not pending and not pairs:
        return []
    coll, p2p = desync.requests(pending, pairs)
    collected_coll, collected_p2p = {}, {}
    if coll or p2p:
        second = Scanner(collect=(coll, p2p))
        try:
            _scan(sources, second, {}, [], block)
        except UserError as e:      # a file vanished or changed since the first pass
            warnings.append(f"second pass to locate the desync failed ({e}); positions are approximate")
        collected_coll, collected_p2p = second.collected_coll, second.collected_p2p
    return desync.resolve(pending, pairs, collected_coll, collected_p2p, scanner.describe)


def _build(scanner, sources, stats, findings, warnings):
    recs = scanner.recs
    groups = {}         # key -> accumulators
    for m in scanner.members:
        per_group = {}
        for rid, n in m.counts.items():
            rec = recs[rid]
            key = (rec.op, rec.count, rec.datatype, rec.redop, rec.nranks, rec.inplace)
            g = groups.get(key)
            if g is None:
                g = groups[key] = {"rank_calls": 0, "calls": 0, "roots": set(), "names": set(), "ranks": 0,
                                   "hosts": set(), "rids": set(), "tuning": set()}
            g["rank_calls"] += n
            per_group[key] = per_group.get(key, 0) + n
            if len(g["roots"]) < ROOTS_MAX:
                g["roots"].add(rec.root)
            g["names"].add(rec.op_name)
            g["rids"].add(rid)
            if scanner.tuning:
                nbytes = OPS[rec.op].bytes_per_call(rec.count, DATATYPE_SIZES[rec.datatype], rec.nranks)
                for tkey in ((m.host, m.pid, rec.op, nbytes), (m.host, m.pid, None, nbytes)):
                    if tkey in scanner.tuning:
                        g["tuning"].add(tkey)
        for key, n in per_group.items():
            g = groups[key]
            g["calls"] = max(g["calls"], n)
            g["ranks"] += 1
            g["hosts"].add(m.host)
    out = []
    for key, g in groups.items():
        op, count, datatype, redop, nranks, inplace = key
        size = DATATYPE_SIZES[datatype]
        per_call = OPS[op].bytes_per_call(count, size, nranks)
        algos = Counter()
        for rid in g["rids"]:
            algos.update({(a, p, "kernel-trace"): n for (a, p), n in scanner.kernel_algos.get(rid, {}).items()})
        for tkey in g["tuning"]:
            algos.update({(a, p, "tuning"): n for (a, p), n in scanner.tuning[tkey].items()})
        out.append(ConfigGroup(
            op=op, collbench_op=OPS[op].collbench_op, count=count, datatype=datatype, type_size=size,
            redop=redop, nranks=nranks, inplace=inplace, rank_calls=g["rank_calls"], calls=g["calls"],
            bytes_per_call=per_call, total_bytes=per_call * g["calls"], share=0.0,
            roots=sorted(g["roots"]), op_names=sorted(g["names"]), ranks=g["ranks"], hosts=len(g["hosts"]),
            algorithms=[Algorithm(a, p, n, s) for (a, p, s), n in algos.most_common()]))
    total = sum(g.total_bytes for g in out)
    for g in out:
        g.share = g.total_bytes / total if total else 0.0
    out.sort(key=lambda g: (-g.total_bytes, -g.calls, g.op, g.count, g.datatype, g.nranks, g.inplace))

    communicators, hosts = [], {}
    for m in scanner.members:
        nbytes = 0
        colls = p2p = 0
        for rid, n in m.counts.items():
            rec = recs[rid]
            nbytes += n * OPS[rec.op].bytes_per_call(rec.count, DATATYPE_SIZES[rec.datatype], rec.nranks)
            if scanner.rec_kind[rid] == 0:
                colls += n
            elif scanner.rec_kind[rid] in (1, 2):
                p2p += n
        communicators.append({
            "host": m.host, "pid": m.pid, "comm": m.comm, "rank": m.rank, "nranks": m.nranks,
            "comm_id": m.comm_id, "bus_id": m.bus_id, "cuda_dev": m.cuda_dev, "init": m.func,
            "parent": m.parent, "set": m.cset.key, "lines": m.lines, "collectives": colls, "p2p": p2p,
            "bytes": nbytes})
        h = hosts.setdefault(m.host, {"host": m.host, "processes": set(), "communicators": 0,
                                      "collective_lines": 0, "bytes": 0})
        h["processes"].add(m.pid)
        h["communicators"] += 1
        h["collective_lines"] += m.lines
        h["bytes"] += nbytes
    host_list = []
    for h in sorted(hosts.values(), key=lambda h: (h["host"] is None, h["host"] or "")):
        h["processes"] = len(h["processes"])
        host_list.append(h)
    sets = [{"key": c.key, "source": c.source, "nranks": c.nranks, "members": len(c.members),
             "ranks_seen": sorted({m.rank for m in c.members if m.rank is not None}),
             "status": c.status, "note": c.note} for c in scanner.sets.values()]

    inputs = []
    for src in sources:
        st = stats[src.name]
        inputs.append({"path": src.name, "bytes": st.bytes, "lines": st.lines, "compressed": src.compressed,
                       "overlong_lines": st.overlong + scanner.overlong_by_source.get(src.name, 0),
                       "skipped": st.skipped, "error": st.error})
    if scanner.no_prefix:
        warnings.append(f"{scanner.no_prefix} COLL lines had no host:pid:tid prefix (stripped, or glued to "
                        f"another rank's cut line): their ranks are guessed from the comm pointer alone")
    if scanner.malformed and findings:
        warnings.append(f"{scanner.malformed} malformed COLL lines: a garbled line loses a call, which can "
                        f"itself show up as a desync")
    if scanner.kernel_lines and not scanner.kernel_attributed:
        warnings.append("kernel-trace lines found but none could be tied to a call (they need the "
                        "calls' ranks: RCCL's globalrank field or INIT lines)")
    totals = {
        "lines": sum(st.lines for st in stats.values()),
        "bytes_read": sum(st.bytes for st in stats.values()),
        "collective_lines": sum(m.lines for m in scanner.members),
        "malformed_lines": scanner.malformed,
        "overlong_lines": sum(st.overlong for st in stats.values()) + scanner.overlong,
        "nccl_info_lines": scanner.info_lines,
        "nccl_warn_lines": scanner.warn_lines,
        "init_lines": scanner.init_lines,
        "kernel_trace_lines": scanner.kernel_lines,
        "kernel_trace_attributed": scanner.kernel_attributed,
        "tuning_lines": scanner.tuning_lines,
        "total_bytes": total,
        "malformed_reasons": dict(scanner.malformed_reasons.most_common()),
    }
    return Census(out, communicators, sets, host_list, findings, totals, inputs, scanner.samples, warnings)


def iter_calls(paths, comm=None, block=BLOCK):
    """Every COLL line of the logs, in log order, as LoggedCall; streamed (constant memory).
    comm: only the lines of this comm pointer (e.g. "0x55d0c1a2e0"; filter host and pid yourself:
    pointers are unique per process only). Malformed lines are skipped. Raises LogInputError for
    inputs that cannot be read."""
    mark = COLL_MARK if comm is None else b" comm " + comm.encode() + b" "
    warnings = []
    sources = expand_paths(paths, warnings)
    try:
        for src in sources:
            st = SourceStats()
            lineno = 1
            for chunk in read_blocks(src, st, warnings, block=block):
                lines = chunk.split(b"\n")
                lines.pop()
                for i, line in enumerate(lines):
                    if mark in line:
                        rec = parse_line(line)
                        if type(rec) is CollLine and (comm is None or rec.comm == comm):
                            yield LoggedCall(src.name, lineno + i, rec)
                lineno += len(lines)
            st.lines = lineno - 1
    finally:
        for src in sources:
            src.cleanup()
