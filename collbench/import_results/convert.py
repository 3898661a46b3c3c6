"""Outputs of runs made elsewhere (nccl-tests, rccl-tests, OSU) -> result records.

A record holds what the output says and nothing else: hosts, ranks and GPUs come from the
device lines (nccl-tests prints one per rank), the NCCL version from its version lines, the time
from -J's start_time. What an output does not say is listed in the record's `unknown` field and
in the import summary (never made up): hosts [] (and nodes 1, the least that ran it), warmup and
iterations 0, transport "unknown" unless --transport names it. Ranks must be known (they define
busbw): from device lines, rccl-tests' "gpus", or --ranks; else the file is refused.

A run that failed (nccl-tests' "Test NCCL failure ... 'why'") gives the result records of the
rows it printed and one failure record carrying the reason, as the engine does.

Rows that records cannot hold are skipped and counted by reason: datatypes outside collbench's
(half, bfloat16, fp8, unsigned), reductions other than sum (`-o all`), ops collbench has no name
for (sendrecv, gather, ...), sizes not divisible by the ranks (all_gather/alltoall, whose
nccl-tests size is the whole buffer and collbench's one rank's block).
"""

import hashlib
import os
import re
import time
from dataclasses import dataclass, field

from collbench.bounded_file import read_bytes
from collbench.engines import nccl_tests as nt
from collbench.engines.nccl_tests_parser import NcclTestsError, parse
from collbench.engines.osu_parser import OsuOutputError, parse_output
from collbench.errors import UserError
from collbench.ops import DATATYPE_TABLE, get_op
from collbench.results.records import failure_record, result_record
from collbench.thresholds import Thresholds

MAX_FILE_BYTES = 64 << 20
# OSU's printed datatype -> ours (the datatype table's osu column); OSU 5.x prints none: MPI_CHAR
OSU_DATATYPES = {None: "char", **{dt.osu: dt.name for dt in DATATYPE_TABLE.values() if dt.osu}}
VARIANTS = ("out-of-place", "in-place", "both")


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
    """One run found in one file: its records and what the summary says about it."""
    path: str
    form: str
    op: str = None
    engine: str = None
    ranks: int = None
    hosts: list = field(default_factory=list)
    records: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)   # reason -> rows
    bad_lines: int = 0
    bad: list = field(default_factory=list)       # (line, reason)
    failures: list = field(default_factory=list)  # what nccl-tests said when it failed
    unknown: list = field(default_factory=list)

    def skip(self, reason):
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def read_file(path):
    """The bytes of one input file; UserError (exit 2) naming it when it cannot be read."""
    return read_bytes(path, MAX_FILE_BYTES, path, "a nccl-tests or OSU output")


def _run_id(path, data, index):
    digest = hashlib.sha256(data).hexdigest()[:8]
    return f"import-{digest}-{index}"


def _file_time(path):
    try:
        return os.path.getmtime(path)
    except OSError:
        return time.time()


def _op_from_name(path):
    """The op a file's name gives away ('all_gather_perf.log', 'rccl_alltoall_2n.txt'), or None."""
    base = os.path.basename(path).lower()
    for op, binary in sorted(nt.BINARIES.items(), key=lambda kv: -len(kv[1])):
        stem = binary[: -len("_perf")]
        if stem in base or stem.replace("_", "") in base.replace("_", "").replace("-", ""):
            return op
    return None


def nccl_tests_runs(path, data, op=None, ranks=None, hosts=None, transport="unknown", variant="out-of-place"):
    """[Imported] for every run in one nccl-tests/rccl-tests output; UserError naming the file."""
    try:
        outputs = parse(data)
    except NcclTestsError as e:
        raise UserError(f"{path}: not a nccl-tests or rccl-tests output: {e}") from None
    ts = _file_time(path)
    runs = []
    for index, out in enumerate(outputs):
        imp = Imported(path, out.form, bad_lines=out.bad_lines, bad=list(out.bad),
                       failures=[f.message() for f in out.failures])
        runs.append(imp)
        imp.op = op or nt.op_of_test(out.test) or nt.op_of_test(out.command_test) or _op_from_name(path)
        if imp.op is None:
            raise UserError(f"{path}: which collective it measured is not in the output (no 'Collective test "
                            f"starting' line, no -J args, no op in the file name): give --op")
        imp.engine = "rccl-tests" if out.form.startswith("rccl") or (out.version or "").startswith("develop") \
            or any("AMD" in d.name for d in out.devices) else "nccl-tests"
        imp.ranks = out.ranks or ranks
        if imp.ranks is None:
            raise UserError(f"{path}: how many ranks ran is not in the output (no '# Rank N ...' device "
                            f"lines): give --ranks")
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
        ctx = ImportContext(_run_id(path, data, index), imp.hosts, imp.ranks, imp.engine, mpi, transport)
        o = get_op(imp.op)
        for row in out.rows:
            dt = nt.FROM_NCCL_TYPE.get(row.type)
            if dt is None:
                imp.skip(f"datatype {row.type} (collbench records hold {', '.join(sorted(set(nt.FROM_NCCL_TYPE.values())))})")
                continue
            if row.redop not in (None, "none", "sum"):
                imp.skip(f"reduction {row.redop} (records are of sum)")
                continue
            size = row.size
            if o.data_per_rank:
                if size % imp.ranks:
                    imp.skip(f"size not divisible by {imp.ranks} ranks")
                    continue
                size //= imp.ranks
            picks = [("oop", None), ("ip", True)] if variant == "both" else \
                [("ip", True)] if variant == "in-place" else [("oop", None)]
            for attr, inplace in picks:
                v = getattr(row, attr)
                if v is None:
                    imp.skip(f"no {'in-place' if inplace else 'out-of-place'} figures")
                    continue
                validation = v.validation
                if v.wrong_kind == "error" and v.wrong is not None and out.out_of_bounds:
                    validation = "fail"    # pre-2.13: the footer's count says the deviations were out of bounds
                root = row.root if o.name in nt.ROOTED and row.root not in (None, -1, 0) else None
                rec = result_record(ctx, o.name, size, dt, v.time_us, v.i_min_us, v.i_max_us,
                                    out.params.get("iters", 0), out.params.get("warmupiters", 0),
                                    validation=validation, straggler_rank=None, ts=ts, inplace=inplace,
                                    root=root)
                if v.wrong is not None:
                    rec["wrong_elements" if v.wrong_kind == "count" else "max_error"] = \
                        int(v.wrong) if v.wrong_kind == "count" and v.wrong % 1 == 0 else v.wrong
                if out.nccl_version:
                    rec["nccl_version"] = out.nccl_version
                rec["imported_from"] = os.path.abspath(path)
                if imp.unknown:
                    rec["unknown"] = list(imp.unknown)
                imp.records.append(rec)
        for f in out.failures[:1]:   # the run stopped there: one failure record, as the engine makes
            rec = failure_record(ctx, f.message(), "", o.name, None, None, ts=ts)
            rec["imported_from"] = os.path.abspath(path)
            imp.records.append(rec)
    return runs


def osu_runs(path, data, op=None, ranks=None, hosts=None, transport="unknown", variant="out-of-place"):
    """[Imported] for one OSU collective output (OSU says nothing of ranks or hosts: --ranks)."""
    try:
        out = parse_output(data.decode("utf-8", errors="replace"))
    except OsuOutputError as e:
        raise UserError(f"{path}: not an OSU collective output: {e}") from None
    if ranks is None:
        raise UserError(f"{path}: OSU does not print how many ranks ran: give --ranks")
    runs = []
    for index, block in enumerate(out.blocks):
        imp = Imported(path, "osu", engine="osu", ranks=ranks, hosts=list(hosts or []))
        runs.append(imp)
        imp.op = op or block.op
        if imp.op is None:
            raise UserError(f"{path}: OSU benchmark {block.benchmark!r} is not a collective collbench knows: "
                            f"give --op")
        dt = OSU_DATATYPES.get((block.datatype or "").upper() or None)
        if not imp.hosts:
            imp.unknown += ["hosts", "nodes"]
        imp.unknown += ["warmup"] + (["transport"] if transport == "unknown" else [])
        ctx = ImportContext(_run_id(path, data, index), imp.hosts, ranks, "osu",
                            f"OSU {block.version}" if block.version else "unknown", transport)
        o = get_op(imp.op)
        for row in block.rows:
            if dt is None:
                imp.skip(f"datatype {block.datatype}")
                continue
            if row.avg_us is None:
                imp.skip("no average latency")
                continue
            size = row.size_bytes if o.has_size else 0
            rec = result_record(ctx, o.name, size or 0, dt if o.has_size else "char", row.avg_us, row.min_us,
                                row.max_us, row.iterations or 0, 0,
                                validation=row.validation or ("fail" if out.validation_error else "off"),
                                straggler_rank=None, ts=_file_time(path))
            rec["imported_from"] = os.path.abspath(path)
            unknown = list(imp.unknown) + ([] if row.iterations else ["iterations"])
            rec["unknown"] = unknown
            imp.records.append(rec)
    return runs


def import_files(kind, paths, **kw):
    """Every run in every file ([Imported]); UserError (exit 2) for the first file that is not
    an output of `kind` or lacks what a record needs. Nothing is written here."""
    convert = {"nccl-tests": nccl_tests_runs, "osu": osu_runs}[kind]
    runs = []
    for path in paths:
        data = read_file(path)
        runs += convert(path, data, **kw)
    return runs


def parse_hosts(text):
    hosts = [h.strip() for h in text.split(",") if h.strip()]
    bad = [h for h in hosts if not re.fullmatch(r"[A-Za-z0-9_.:\-\[\]]{1,255}", h)]
    if not hosts or bad:
        raise UserError(f"--hosts: expected host names separated by commas, got {text[:80]!r}")
    return hosts
