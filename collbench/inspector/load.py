"""Every Inspector record under some paths -> result records, with a count per file of what was
read, skipped (and why) and could not be read: `import nccl-inspector` and `diagnose --inspector`.
"""

import os
from dataclasses import dataclass, field

from collbench.inspector import files, spread
from collbench.inspector.parse import FormatError, parse_line, parse_prom
from collbench.inspector.records import bucket_record, collective_record, prom229_record

MAX_BAD_KEPT = 20
# per-rank records kept over all files (~1 KB each in memory): a day of a 1,024-rank job's busiest
# communicators; the rest are counted, not read
MAX_OPS = 1_000_000


@dataclass
class FileSummary:
    path: str
    form: str = None            # json-2.28 (no timing source), json-2.29 (no comm_name), json-2.30+, prom-2.29, prom-2.30
    lines: int = 0
    ops: int = 0                # records read (coll and p2p)
    p2p: int = 0
    verbose: int = 0
    bad_lines: int = 0
    bad: list = field(default_factory=list)     # (line, reason), the first few
    error: str = None           # the file could not be read at all
    job_id: str = None


@dataclass
class Loaded:
    files: list = field(default_factory=list)          # FileSummary
    records: list = field(default_factory=list)        # result records, in time order
    collectives: dict = field(default_factory=dict)    # (comm_id, func, sn) -> spread.Collective
    p2p: list = field(default_factory=list)
    duplicates: int = 0
    skipped: dict = field(default_factory=dict)        # reason -> collectives
    errors: list = field(default_factory=list)         # (path, why) of files and directories not read

    def skip(self, reason, n=1):
        self.skipped[reason] = self.skipped.get(reason, 0) + n


def _json_form(op):
    if op.comm_name is not None:
        return "json-2.30+"
    return "json-2.28/2.29" if op.timing_source is not None else "json-2.28"


def load(paths):
    """A Loaded of every Inspector file under `paths` (files, directories, .gz)."""
    out = Loaded()
    found, errors = files.list_files(paths)
    out.errors += errors
    ops, job_of_comm, path_of = [], {}, {}
    for path in found:
        src = files.read_source(path)
        fs = FileSummary(path, job_id=src.job_id)
        out.files.append(fs)
        if src.text is None:
            fs.error = src.error
            out.errors.append((path, src.error))
            continue
        base = path[:-3] if path.endswith(".gz") else path
        if base.endswith(".prom") or (not base.endswith((".log", ".jsonl")) and src.text.lstrip()[:1] not in ("{", "")):
            _prom(src, fs, out)
            continue
        for n, line in enumerate(src.text.splitlines(), 1):
            if not line.strip():
                continue
            fs.lines += 1
            if len(ops) >= MAX_OPS:
                out.skip(f"records past the first {MAX_OPS} (the import's bound)")
                continue
            try:
                op = parse_line(line)
            except FormatError as e:
                fs.bad_lines += 1
                if len(fs.bad) < MAX_BAD_KEPT:
                    fs.bad.append((n, str(e)))
                continue
            fs.ops += 1
            fs.p2p += op.kind == "p2p"
            fs.verbose += op.start_us is not None
            fs.form = _newest(fs.form, _json_form(op))
            ops.append(op)
            path_of[id(op)] = path
            if src.job_id:
                job_of_comm.setdefault(op.comm_id, src.job_id)
    colls, out.p2p, out.duplicates = spread.join(ops)
    out.collectives = colls
    for c in colls.values():
        rec = collective_record(c, job_of_comm.get(c.comm_id), os.path.abspath(path_of[id(c.first)]))
        if rec is None:
            out.skip(f"{c.func} (collbench has no such op)")
            continue
        out.records.append(rec)
    if out.p2p:
        out.skip("point-to-point Send/Recv (collbench has no p2p op; read, not recorded)", len(out.p2p))
    out.records.sort(key=lambda r: (r["ts"], r.get("comm_id", ""), r.get("coll_sn", 0)))
    return out


ORDER = ("json-2.28", "json-2.28/2.29", "json-2.30+")


def _newest(a, b):
    return b if a is None or ORDER.index(b) > ORDER.index(a) else a


def _prom(src, fs, out):
    form, items, bad = parse_prom(src.text)
    fs.form = form
    fs.lines = src.text.count("\n")
    fs.bad_lines = len(bad)
    fs.bad = bad[:MAX_BAD_KEPT]
    if form is None:
        fs.error = "no NCCL Inspector sample in it"
        return
    try:
        mtime = os.path.getmtime(src.path)
    except OSError:
        mtime = None
    for item in items:
        fs.ops += 1
        if form == "prom-2.29":
            rec = prom229_record(item, os.path.abspath(src.path))
        else:
            fs.p2p += item.kind == "p2p"
            rec = bucket_record(item, mtime, os.path.abspath(src.path))
        if rec is None:
            out.skip(f"{item.func} (collbench has no such op)")
            continue
        if src.job_id and "slurm_job_id" not in rec:
            rec["slurm_job_id"] = src.job_id
        out.records.append(rec)
