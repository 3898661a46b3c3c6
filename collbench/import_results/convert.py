"""Outputs of runs made elsewhere (nccl-tests, rccl-tests, OSU) -> result records.

A record holds what the output says and nothing else: hosts, ranks and GPUs come from the
device lines (nccl-tests prints one per rank), the NCCL version from its version lines, the time
from -J's start_time. What an output does not say is listed in the record's `unknown` field and
in the import summary (never made up): hosts [] (and nodes 1, the least that ran it), warmup and
iterations 0, transport "unknown" unless --transport names it.

The collective: named by the output, else inferred from its table (collbench/import_results/
infer.py: the column set, the row values, busbw/algbw against the rank count), else from the
file's name; --op when it stays ambiguous. The ranks: the device lines, rccl-tests' "gpus",
--ranks, else the rank count busbw/algbw fixes (allreduce, the gathers and scatters), else unknown
(bcast, reduce, sendrecv: their busbw needs none): the records then carry the least that ran it
(nThread x nGpus of the parameter line, else 1) and list "ranks" in `unknown`.

A run that failed (nccl-tests' "Test NCCL failure ... 'why'") gives the result records of the
rows it printed and one failure record carrying the reason, as the engine does.

Rows that records cannot hold are skipped and counted by reason: datatypes outside collbench's
(half, bfloat16, fp8, unsigned), reductions other than sum (`-o all`), sizes not divisible by the
ranks (all_gather/alltoall/scatter/gather/hypercube, whose nccl-tests size is the whole buffer
and collbench's one rank's block), rows past MAX_ROWS.

Inputs are read line by line through collbench.bounded_file (a regular file, or a pipe: `-` is
standard input, `<(...)` a pipe; nothing to read for --wait seconds is an error, never a hang),
at most MAX_FILE_BYTES each; records go to a spool file (RecordSink), never a list in memory.
"""

import hashlib
import os
import re
import tempfile
import time
from dataclasses import dataclass, field

from collbench.bounded_file import UntrustedFileError, iter_lines_limited
from collbench.engines.nccl_tests import FROM_NCCL_TYPE
from collbench.engines.nccl_tests_parser import MAX_ROWS, NcclTestsError, parse_lines
from collbench.engines.osu_parser import OsuOutputError, OsuReader
from collbench.errors import UserError
from collbench.import_results.infer import infer, ranks_for
from collbench.ops import DATATYPE_TABLE, get_op
from collbench.results.records import dumps, failure_record, result_record
from collbench.thresholds import Thresholds

MAX_FILE_BYTES = 64 << 20
MAX_LINE_BYTES = 65536      # longer lines come back cut, and the parsers count them as bad
WAIT_S = 30.0               # a pipe or FIFO with nothing to read for this long is refused
# OSU's printed datatype -> ours (the datatype table's osu column); OSU 5.x prints none: MPI_CHAR
OSU_DATATYPES = {None: "char", **{dt.osu: dt.name for dt in DATATYPE_TABLE.values() if dt.osu}}
VARIANTS = ("out-of-place", "in-place", "both")
# the ops whose records carry their root (rooted ops; root 0 is the default and left out)
ROOTED = ("bcast", "reduce", "scatter", "gather")


class ImportContext:
    """What every record of one imported run shares (the RunContext of a run made elsewhere)."""

    def __init__(self, run_id, hosts, ranks, engine, mpi, transport):
        self.run_id = run_id
        self.hosts = list(hosts)
        self.nodes = max(1, len(self.hosts))
        self.ranks = ranks
        self.engine = engine
        self.mpi = mpi
        self.transport = transport
        self.thresholds = Thresholds()

    def common(self):
        return {"run_id": self.run_id, "hosts": list(self.hosts), "nodes": self.nodes,
                "ranks": self.ranks, "engine": self.engine, "mpi": self.mpi, "transport": self.transport}


@dataclass
class Imported:
    """One run found in one file: what the summary says about it (its records are in the sink)."""
    path: str
    form: str
    op: str = None
    op_from: str = ""             # how the op was known ("--op", "the output names its test (...)", inferred ...)
    engine: str = None
    ranks: int = None
    ranks_from: str = ""          # "device lines", "--ranks", "busbw/algbw ...", "unknown (...)"
    hosts: list = field(default_factory=list)
    records: int = 0
    skipped: dict = field(default_factory=dict)   # reason -> rows
    bad_lines: int = 0
    bad: list = field(default_factory=list)       # (line, reason)
    failures: list = field(default_factory=list)  # what nccl-tests said when it failed
    unknown: list = field(default_factory=list)

    def skip(self, reason, n=1):
        self.skipped[reason] = self.skipped.get(reason, 0) + n


class RecordSink:
    """Where the records of every file go until all files have been read: counted, and (spool)
    written as JSON lines to an unnamed temporary file, so a million rows never sit in memory.
    lines() reads them back for the one append at the end."""

    def __init__(self, spool=False, directory=None):
        self.count = 0
        self.file = tempfile.TemporaryFile("w+", encoding="utf-8", dir=directory) if spool else None

    def add(self, imp, rec):
        imp.records += 1
        self.count += 1
        if self.file is not None:
            self.file.write(dumps(rec) + "\n")

    def lines(self):
        if self.file is None:
            return
        self.file.flush()
        self.file.seek(0)
        yield from self.file

    def close(self):
        if self.file is not None:
            self.file.close()


class _Input:
    """The lines of one input (a path, or '-' for standard input), hashed as they are read (the
    run id names the content), through bounded_file; UserError naming the input when it cannot
    be read within its bounds."""

    def __init__(self, path, wait_s=WAIT_S):
        self.path = path
        self.name = "standard input" if path == "-" else path
        self.wait_s = wait_s
        self.digest = hashlib.sha256()

    def lines(self):
        try:
            for line in iter_lines_limited(self.path, MAX_FILE_BYTES, max_line=MAX_LINE_BYTES,
                                           allow_pipes=True, idle_s=self.wait_s, strip_nul=True):
                self.digest.update(line.encode("utf-8", "replace"))
                self.digest.update(b"\n")
                yield line
        except UntrustedFileError as e:
            raise UserError(f"{self.name}: {e} (expected a nccl-tests or OSU output)") from None

    def run_id(self, index):
        return f"import-{self.digest.hexdigest()[:8]}-{index}"

    def time(self):
        if self.path != "-":
            try:
                return os.path.getmtime(self.path)
            except OSError:
                pass
        return time.time()

    def source(self):
        return "-" if self.path == "-" else os.path.abspath(self.path)


def _least_ranks(out):
    """The fewest ranks that could have printed this output: nThread x nGpus of one process."""
    n = (out.params.get("nthread") or out.params.get("nthreads") or 1) * (out.params.get("ngpus") or 1)
    return n if 1 <= n <= 1 << 20 else 1


def _ranks(imp, out, op, ranks):
    """(ranks, where from); adds 'ranks' to imp.unknown when nothing says it."""
    if out.ranks:
        if not out.devices:
            return out.ranks, "the output's gpus"
        return out.ranks, "the device lines" + (" of the run before it" if out.setup_from_previous else "")
    if ranks:
        return ranks, "--ranks"
    n, how = ranks_for(out, op)
    if n:
        return n, how
    least = _least_ranks(out)
    imp.unknown.append("ranks")
    return least, (f"unknown (no device lines; records carry {least}, the least that ran it"
                   + (": nThread x nGpus" if least > 1 else "") + ")")


def nccl_tests_runs(inp, sink, op=None, ranks=None, hosts=None, transport="unknown", variant="out-of-place"):
    """[Imported] for every run in one nccl-tests/rccl-tests output; UserError naming the file."""
    try:
        outputs = parse_lines(inp.lines())
    except NcclTestsError as e:
        raise UserError(f"{inp.name}: not a nccl-tests or rccl-tests output: {e}") from None
    ts = inp.time()
    runs = []
    for index, out in enumerate(outputs):
        imp = Imported(inp.name, out.form, bad_lines=out.bad_lines, bad=list(out.bad),
                       failures=[f.message() for f in out.failures])
        runs.append(imp)
        known_ranks = out.ranks or ranks
        inference = infer(out, inp.path, known_ranks)
        if op:
            imp.op, imp.op_from = get_op(op).name, "--op"
        elif inference.op:
            imp.op, imp.op_from = inference.op, inference.how
        elif out.rows or out.failures:
            which = f" (run {index + 1} of {len(outputs)})" if len(outputs) > 1 else ""
            left = (f"the table fits {', '.join(inference.candidates)} ({inference.how})"
                    if inference.candidates else "its table does not fit any nccl-tests op"
                    if out.rows else "no table")
            raise UserError(f"{inp.name}{which}: which collective it measured is not in the output (no "
                            f"'Collective test starting' line, no command line, no op in the file name) and "
                            f"{left}: give --op")
        else:
            continue     # nothing but a parameter line: no run to import
        imp.engine = "rccl-tests" if out.form.startswith("rccl") or out.rccl \
            or (out.version or "").startswith("develop") or any("AMD" in d.name for d in out.devices) \
            else "nccl-tests"
        imp.ranks, imp.ranks_from = _ranks(imp, out, imp.op, ranks)
        imp.hosts = out.hosts or list(hosts or [])
        if not imp.hosts:
            imp.unknown += ["hosts", "nodes"]
        if not out.params.get("iters"):
            imp.unknown.append("iterations")
        if "warmupiters" not in out.params:
            imp.unknown.append("warmup")
        if transport == "unknown":
            imp.unknown.append("transport")
        mpi = f"NCCL {out.nccl_version}" if out.nccl_version else "unknown"
        ctx = ImportContext(inp.run_id(index), imp.hosts, imp.ranks, imp.engine, mpi, transport)
        o = get_op(imp.op)
        if out.rows_dropped:
            imp.skip(f"rows past the first {MAX_ROWS} of a run", out.rows_dropped)
        if not out.rows and not out.failures:
            imp.skip("no result rows (a run whose table the output does not hold)")
        picks = [("oop", None), ("ip", True)] if variant == "both" else \
            [("ip", True)] if variant == "in-place" else [("oop", None)]
        for row in out.rows:
            dt = FROM_NCCL_TYPE.get(row.type)
            if dt is None:
                imp.skip(f"datatype {row.type} (collbench records hold {', '.join(sorted(set(FROM_NCCL_TYPE.values())))})")
                continue
            if row.redop not in (None, "", "none", "sum"):
                imp.skip(f"reduction {row.redop} (records are of sum)")
                continue
            size = row.size
            if o.data_per_rank:
                if "ranks" in imp.unknown:
                    imp.skip("ranks unknown: one rank's block of the buffer unknown (give --ranks)")
                    continue
                if size % imp.ranks:
                    imp.skip(f"size not divisible by {imp.ranks} ranks")
                    continue
                size //= imp.ranks
            for attr, inplace in picks:
                v = getattr(row, attr)
                if v is None:
                    imp.skip(f"no {'in-place' if inplace else 'out-of-place'} figures")
                    continue
                validation = v.validation
                if v.wrong_kind == "error" and v.wrong is not None and out.out_of_bounds:
                    validation = "fail"    # pre-2.13: the footer's count says the deviations were out of bounds
                root = row.root if o.name in ROOTED and row.root not in (None, -1, 0) else None
                rec = result_record(ctx, o.name, size, dt, v.time_us, v.i_min_us, v.i_max_us,
                                    out.params.get("iters", 0), out.params.get("warmupiters", 0),
                                    validation=validation, straggler_rank=None, ts=ts, inplace=inplace,
                                    root=root)
                if v.wrong is not None:
                    rec["wrong_elements" if v.wrong_kind == "count" else "max_error"] = \
                        int(v.wrong) if v.wrong_kind == "count" and v.wrong % 1 == 0 else v.wrong
                if out.nccl_version:
                    rec["nccl_version"] = out.nccl_version
                rec["imported_from"] = inp.source()
                if imp.unknown:
                    rec["unknown"] = list(imp.unknown)
                sink.add(imp, rec)
        for f in out.failures[:1]:   # the run stopped there: one failure record, as the engine makes
            rec = failure_record(ctx, f.message(), "", o.name, None, None, ts=ts)
            rec["imported_from"] = inp.source()
            sink.add(imp, rec)
    return runs


def osu_runs(inp, sink, op=None, ranks=None, hosts=None, transport="unknown", variant="out-of-place"):
    """[Imported] for one OSU collective output (OSU says nothing of ranks or hosts: --ranks).
    Rows are read as they come; each block keeps compact rows (at most MAX_ROWS in all, the rest
    counted), made into records once the whole file is read (its run id names its content)."""
    if ranks is None:
        raise UserError(f"{inp.name}: OSU does not print how many ranks ran: give --ranks")
    reader = OsuReader(strict=False, keep_rows=False)
    kept = {}            # id(block) -> [(size, avg, min, max, iterations, validation)]
    dropped = {}
    total = 0
    try:
        for lineno, line in enumerate(inp.lines(), 1):
            if total >= MAX_ROWS and reader.current is not None and line[:1].isdigit():
                key = id(reader.current)      # past the cap: a row is counted, not parsed
                dropped[key] = dropped.get(key, 0) + 1
                continue
            row = reader.feed(lineno, line)
            if row is None:
                continue
            key = id(reader.current)
            total += 1
            kept.setdefault(key, []).append((row.size_bytes, row.avg_us, row.min_us, row.max_us,
                                             row.iterations, row.validation))
        out = reader.finish()
    except OsuOutputError as e:
        raise UserError(f"{inp.name}: not an OSU collective output: {e}") from None
    ts = inp.time()
    runs = []
    for index, block in enumerate(out.blocks):
        imp = Imported(inp.name, "osu", engine="osu", ranks=ranks, ranks_from="--ranks", hosts=list(hosts or []))
        if index == 0:
            imp.bad_lines, imp.bad = out.bad_lines, list(out.bad)
        runs.append(imp)
        imp.op = op or block.op
        imp.op_from = "--op" if op else f"OSU's title ({block.benchmark})"
        if imp.op is None:
            raise UserError(f"{inp.name}: OSU benchmark {block.benchmark!r} is not a collective collbench knows: "
                            f"give --op")
        dt = OSU_DATATYPES.get((block.datatype or "").upper() or None)
        if not imp.hosts:
            imp.unknown += ["hosts", "nodes"]
        imp.unknown += ["warmup"] + (["transport"] if transport == "unknown" else [])
        ctx = ImportContext(inp.run_id(index), imp.hosts, ranks, "osu",
                            f"OSU {block.version}" if block.version else "unknown", transport)
        o = get_op(imp.op)
        if dropped.get(id(block)):
            imp.skip(f"rows past the first {MAX_ROWS} of a file", dropped[id(block)])
        for size_bytes, avg_us, min_us, max_us, iterations, validation in kept.get(id(block), ()):
            if dt is None:
                imp.skip(f"datatype {block.datatype}")
                continue
            if avg_us is None:
                imp.skip("no average latency")
                continue
            size = size_bytes if o.has_size else 0
            rec = result_record(ctx, o.name, size or 0, dt if o.has_size else "char", avg_us, min_us,
                                max_us, iterations or 0, 0,
                                validation=validation or ("fail" if out.validation_error else "off"),
                                straggler_rank=None, ts=ts)
            rec["imported_from"] = inp.source()
            rec["unknown"] = list(imp.unknown) + ([] if iterations else ["iterations"])
            sink.add(imp, rec)
    return runs


def import_files(kind, paths, sink, wait_s=WAIT_S, **kw):
    """Every run in every file ([Imported]), its records handed to sink; UserError (exit 2) for
    the first file that is not an output of `kind` or lacks what a record needs. Nothing is
    written to the results here."""
    if sum(1 for p in paths if p == "-") > 1:
        raise UserError("standard input ('-') can be read once: name it once")
    convert = {"nccl-tests": nccl_tests_runs, "osu": osu_runs}[kind]
    runs = []
    for path in paths:
        runs += convert(_Input(path, wait_s), sink, **kw)
    return runs


def parse_hosts(text):
    hosts = [h.strip() for h in text.split(",") if h.strip()]
    bad = [h for h in hosts if not re.fullmatch(r"[A-Za-z0-9_.:\-\[\]]{1,255}", h)]
    if not hosts or bad:
        raise UserError(f"--hosts: expected host names separated by commas, got {text[:80]!r}")
    return hosts
