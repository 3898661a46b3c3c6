"""`collbench nccl census`: what collectives a log ran, per configuration, communicator and host.

The streaming pass over the log is `scanner.Scanner` (constant memory, every table bounded); this
module turns what it kept into the census: configuration groups with nccl-tests' bytes, rank
handles, communicator sets, hosts, desync findings (located by a second pass where needed:
desync.py), inconsistencies (an INIT line that disagrees with its COLL lines, two processes
claiming one rank of a commId) and what did not fit the tables.

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
from typing import NamedTuple, Optional

from collbench.errors import UserError
from collbench.nccl import desync
from collbench.nccl.formats import DATATYPE_SIZES, OPS
from collbench.nccl.log_input import BLOCK, LogInputError, SourceStats, expand_paths, joined_blocks, read_blocks
from collbench.nccl.log_parser import COLL_MARK, CollLine, parse_line
from collbench.nccl.scanner import Scanner, collector_off, overflow_text, scan

SCHEMA = 1
ROOTS_MAX = 16              # distinct roots listed per configuration

NO_COLL_HINT = ("Collective lines come from NCCL_DEBUG=INFO with COLL in NCCL_DEBUG_SUBSYS "
                "(NCCL_DEBUG_SUBSYS=INIT,COLL also gives ranks and commIds); the default subsystems "
                "(INIT; INIT,ENV from 2.16; INIT,BOOTSTRAP,ENV from 2.23) and NCCL_DEBUG=WARN log none. "
                "RCCL reads the same variables")


class NoCollectivesError(UserError):
    """The input holds no NCCL/RCCL collective (COLL) line."""


class LoggedCall(NamedTuple):
    """One COLL line, streamed by iter_calls: where it was and what it says."""
    source: str
    line: int               # 1-based line number in its source
    call: CollLine


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


class Census:
    """The result of run_census: configuration groups, communicators, hosts, desync findings."""

    def __init__(self, groups, communicators, sets, hosts, desync_findings, totals, inputs, malformed,
                 warnings, inconsistencies=()):
        self.groups = groups                    # [ConfigGroup], largest total_bytes first
        self.communicators = communicators      # [dict] one per rank handle
        self.sets = sets                        # [dict] one per (known or inferred) communicator
        self.hosts = hosts                      # [dict]
        self.desync = desync_findings           # [dict]
        self.totals = totals                    # dict of counters (lines, collective_lines, ...)
        self.inputs = inputs                    # [dict] per source
        self.malformed = malformed              # [dict] samples
        self.warnings = warnings                # [str]
        self.inconsistencies = list(inconsistencies)    # [dict] kind, set, message

    def document(self):
        doc = {"schema": SCHEMA, "kind": "nccl_census"}
        doc.update(self.totals)
        doc["groups"] = [dict(asdict(g), algorithms=[asdict(a) for a in g.algorithms]) for g in self.groups]
        doc["communicators"] = self.communicators
        doc["communicator_sets"] = self.sets
        doc["hosts"] = self.hosts
        doc["desync"] = self.desync
        doc["inconsistencies"] = self.inconsistencies
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
        with collector_off():
            scan(sources, scanner, stats, warnings, block)
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
    for cset in sets:
        if cset.conflicted:
            if cset.status == "consistent":
                cset.status = "inconsistent"
            cset.note = ("two processes claim one rank (see the inconsistencies)"
                         + ("; " + cset.note if cset.note else ""))
    if not pending and not pairs:
        return []
    coll, p2p = desync.requests(pending, pairs)
    collected_coll, collected_p2p = {}, {}
    if coll or p2p:
        second = Scanner(collect=(coll, p2p))
        try:
            scan(sources, second, {}, [], block)
        except UserError as e:      # a file vanished or changed since the first pass
            warnings.append(f"second pass to locate the desync failed ({e}); positions are approximate")
        collected_coll, collected_p2p = second.collected_coll, second.collected_p2p
    return desync.resolve(pending, pairs, collected_coll, collected_p2p, scanner.describe)


def _group(groups, rec, n):
    """The accumulators of rec's configuration group, with n more rank lines of rec counted."""
    key = (rec.op, rec.count, rec.datatype, rec.redop, rec.nranks, rec.inplace)
    g = groups.get(key)
    if g is None:
        g = groups[key] = {"rank_calls": 0, "calls": 0, "roots": set(), "names": set(), "ranks": 0,
                           "hosts": set(), "rids": set(), "tuning": set()}
    g["rank_calls"] += n
    if len(g["roots"]) < ROOTS_MAX:
        g["roots"].add(rec.root)
    g["names"].add(rec.op_name)
    return key, g


def _build(scanner, sources, stats, findings, warnings):
    recs = scanner.recs
    groups = {}         # key -> accumulators
    for m in scanner.members:
        per_group = {}
        for rid, n in m.counts.items():
            rec = recs[rid]
            key, g = _group(groups, rec, n)
            per_group[key] = per_group.get(key, 0) + n
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
    for rid, n in scanner.spill_counts.items():     # lines outside the handle tables: rank lines only
        _group(groups, recs[rid], n)
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
    for what, n in scanner.overflow.items():
        warnings.append(f"{n} {overflow_text(what)}: the log has more than the census keeps in memory")
    if scanner.conflict_count:
        warnings.append(f"{scanner.conflict_count} inconsistencies between lines of one communicator "
                        f"(listed under Inconsistencies)")
    joined = sum(st.joined for st in stats.values())
    if joined:
        warnings.append(f"{joined} COLL lines were wrapped after 'comm' or 'stream' (a terminal's or a "
                        f"tracker's line wrap) and were joined with their next line")
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
        "wrapped_lines_joined": joined,
        "untracked_lines": sum(scanner.overflow[k] for k in ("rank_handles", "configurations", "counters")),
        "overflow": dict(scanner.overflow),
        "inconsistency_count": scanner.conflict_count,
    }
    return Census(out, communicators, sets, host_list, findings, totals, inputs, scanner.samples, warnings,
                  scanner.conflicts)


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
            for chunk, joined in joined_blocks(read_blocks(src, st, warnings, block=block)):
                lines = chunk.split(b"\n")
                lines.pop()
                for i, line in enumerate(lines):
                    if mark in line:
                        rec = parse_line(line)
                        if type(rec) is CollLine and (comm is None or rec.comm == comm):
                            yield LoggedCall(src.name, lineno + i, rec)
                lineno += len(lines) + joined
            st.lines = lineno - 1
    finally:
        for src in sources:
            src.cleanup()
