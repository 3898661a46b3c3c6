"""`collbench nccl replay --engine nccl-tests`: the census' configurations timed through the
nccl-tests binaries, on the GPUs, with the log's own datatypes, reductions and roots.

Each distinct configuration (op, count, datatype, redop, nranks, in-place) is one nccl-tests job
`<op>_perf -b S -e S -g 1 -n iterations -w warmup -d TYPE [-o REDOP] [-r ROOT] -c 0|1`, at the
log's nranks when the config provides that many ranks (else at all it provides, said per row and
in a warning; --np gives the number). S is nccl-tests' size of the call (replay_plan.py's table:
AllGather, ReduceScatter and AlltoAll run at count x type size x nranks); a call larger than
--max-bytes is timed at the cap and its time scaled by bytes (an estimate, marked). The datatype
is the log's: nccl-tests' `-d` names int8 uint8 int32 uint32 int64 uint64 half float double
bfloat16 f8e4m3 f8e5m2 (bfloat16 needs NCCL 2.10+, fp8 NCCL 2.24+ and an sm_90 GPU: nccl-tests
drops them otherwise, and the job's failure says so); the reduction its `-o` (sum prod max min
avg; a premultiplied sum is nccl-tests' `mulsum`). Send/Recv, Gather, Scatter and NCCL 2.30's
one-sided ops have no nccl-tests binary here: listed as not replayed, with the reason.

The time per call is nccl-tests' (the ranks' average); the estimated total is calls x that time.
"""

import copy
import os
from dataclasses import dataclass, field

from collbench.engines import nccl_tests
from collbench.engines.base import failure_message
from collbench.engines.launcher import mpi_version
from collbench.engines.mpi_job import JobRunner
from collbench.errors import UserError
from collbench.nccl.replay_plan import NotReplayed, plan_groups
from collbench.ops import get_op
from collbench.results.records import RunContext, failure_record, result_record
from collbench.sizes import format_size
from collbench.tables import Column, csv_text, table_lines


@dataclass
class Row:
    op: str
    count: int
    datatype: str
    redop: str
    nranks: int
    inplace: bool
    calls: int
    call: object = None                 # EngineCall, or NotReplayed
    args: list = field(default_factory=list)
    time_us: float = None               # per call, scaled to the log's bytes when capped
    busbw: float = None                 # GB/s of the timed call (nccl-tests')
    error: str = ""
    notes: list = field(default_factory=list)

    @property
    def replayed(self):
        return not isinstance(self.call, NotReplayed)

    def to_json(self):
        c = self.call
        return {"op": self.op, "count": self.count, "datatype": self.datatype, "redop": self.redop,
                "nranks": self.nranks, "inplace": self.inplace, "calls": self.calls,
                "replayed": self.replayed, "replay_nranks": c.nranks if self.replayed else None,
                "nccl_tests_args": self.args, "bytes_per_call": c.bytes_per_call if self.replayed else None,
                "measured_bytes": c.measured_bytes if self.replayed else None,
                "estimated": bool(self.replayed and c.capped), "time_us": self.time_us,
                "busbw_GBps": self.busbw,
                "total_us": self.time_us * self.calls if self.time_us is not None else None,
                "error": self.error or (c.reason if not self.replayed else ""), "notes": self.notes}


def _args(row, iterations, warmup, validate):
    c = row.call
    return nccl_tests.job_args(get_op(c.op), c.measured_bytes, c.measured_bytes, 2, iterations, warmup,
                               nccl_tests.FLAG_OF_NCCL_TYPE[row.datatype], validate,
                               redop=nccl_tests.REDOPS.get(row.redop, "sum") if row.redop else None, root=c.root)


def plan(census, cfg, settings):
    """[Row] per census configuration, in the census' order (UserError: nothing replayable)."""
    _, planned = plan_groups(census.groups, cfg, settings)
    rows = []
    for g, call in planned:
        row = Row(g.op, g.count, g.datatype, g.redop, g.nranks, bool(g.inplace), g.calls, call)
        if row.replayed:
            if g.datatype not in nccl_tests.FLAG_OF_NCCL_TYPE:
                row.call = NotReplayed(f"nccl-tests has no datatype {g.datatype}")
            elif g.redop and g.redop not in nccl_tests.REDOPS:
                row.call = NotReplayed(f"nccl-tests has no reduction {g.redop}")
            else:
                if call.nranks != g.nranks:
                    row.notes.append(f"replayed at {call.nranks} ranks (the log's communicator has {g.nranks})")
                if call.root_note:
                    row.notes.append(call.root_note)
                if call.capped:
                    row.notes.append(f"timed at {format_size(call.measured_bytes)} (--max-bytes), time scaled "
                                     f"to {format_size(call.bytes_per_call)}: an estimate")
        rows.append(row)
    if not any(r.replayed for r in rows):
        why = sorted({r.call.reason for r in rows})
        raise UserError(f"{', '.join(str(p) for p in settings_paths(census))}: nothing to replay with nccl-tests "
                        f"({'; '.join(why)[:400]})")
    return rows


def settings_paths(census):
    return [i["path"] for i in census.inputs]


def run_row(cfg, ctx, row, binary, iterations, warmup, runner):
    """Time one configuration; its record (result or failure)."""
    c = row.call
    row.args = _args(row, iterations, warmup, cfg.validate)
    job_cfg = copy.copy(cfg)
    job_cfg.ranks = c.nranks
    out = nccl_tests.run_job(job_cfg, binary, row.args, runner)
    got = nccl_tests.variant_of(out.rows.get(c.measured_bytes), row.inplace)
    if got is None or got.time_us is None:
        row.error = out.reason
        what = f"{os.path.basename(binary)} {row.datatype} {format_size(c.measured_bytes)}"
        return failure_record(ctx, failure_message(what, row.error), out.job.stderr_tail, c.op, c.size_bytes,
                              out.job.returncode, ts=out.t_end)
    row.time_us = got.time_us * c.scale
    row.busbw = got.busbw_gbs
    rec = result_record(ctx, c.op, c.size_bytes, c.datatype, got.time_us, None, None, iterations, warmup,
                        validation=got.validation, ranks=c.nranks, ts=out.t_end,
                        inplace=True if row.inplace else None, root=c.root or None)
    rec.update({"replay_engine": "nccl-tests", "nccl_op": row.op, "nccl_datatype": row.datatype,
                "nccl_redop": row.redop, "log_nranks": row.nranks, "log_count": row.count, "log_calls": row.calls})
    if got.wrong is not None:
        rec["wrong_elements"] = nccl_tests.wrong_elements(got)
    if out.nccl_version:
        rec["nccl_version"] = out.nccl_version
    return rec


@dataclass
class Result:
    rows: list
    records: list
    warnings: list
    nccl_version: str = None

    @property
    def failed(self):
        return [r for r in self.rows if r.replayed and r.time_us is None]


def replay(paths, cfg, settings, on_row=None):
    from collbench.nccl.census import run_census
    census = run_census(paths)
    cfg = copy.copy(cfg)
    cfg.engine = "nccl-tests"
    rows = plan(census, cfg, settings)
    iterations, warmup = settings.counts()
    for r in rows:
        if r.replayed and r.call.op not in nccl_tests.BINARIES:
            r.call = NotReplayed(f"nccl-tests has no {r.call.op}")
    binaries = nccl_tests.find_binaries(cfg, [r.call.op for r in rows if r.replayed])
    warnings = [f"{r.op} {r.datatype} x{r.count} ({r.nranks} ranks): {n}" for r in rows for n in r.notes]
    ctxs, records, runner = {}, [], JobRunner()
    run_id = None
    for r in rows:
        if not r.replayed or r.call.op not in binaries:
            continue
        n = r.call.nranks
        if n not in ctxs:
            job_cfg = copy.copy(cfg)
            job_cfg.ranks = n
            ctxs[n] = RunContext(job_cfg, "nccl-tests", mpi_version(cfg), run_id=run_id)
            run_id = ctxs[n].run_id
        records.append(run_row(cfg, ctxs[n], r, binaries[r.call.op], iterations, warmup, runner))
        if on_row:
            on_row(r)
    version = next((x.get("nccl_version") for x in records if x.get("nccl_version")), None)
    return Result(rows, records, warnings, version)


TABLE = [Column(key, title, align="left") for key, title in (
    ("op", "op"), ("count", "count"), ("datatype", "datatype"), ("redop", "redop"), ("ranks", "ranks"),
    ("calls", "calls"), ("bytes", "bytes/call"), ("time", "time/call"), ("busbw", "busbw GB/s"),
    ("total", "total"), ("note", "note"))]
CSV = [Column(key) for key in ("op", "count", "datatype", "redop", "nranks", "replay_nranks", "inplace", "calls",
                               "bytes_per_call", "measured_bytes", "estimated", "time_us", "busbw_GBps",
                               "total_us", "error")]


def _table_row(r):
    c = r.call
    if not r.replayed:
        note = f"not replayed: {c.reason}"
    elif r.time_us is None:
        note = f"FAILED: {r.error}"
    else:
        note = "; ".join(r.notes)
    return {"op": r.op + (" (in place)" if r.inplace else ""), "count": r.count, "datatype": r.datatype,
            "redop": r.redop or "-",
            "ranks": f"{r.nranks}" if not r.replayed or c.nranks == r.nranks else f"{r.nranks}->{c.nranks}",
            "calls": r.calls, "bytes": format_size(c.bytes_per_call) if r.replayed else "-",
            "time": f"{r.time_us:.2f} us" if r.time_us is not None else "-",
            "busbw": f"{r.busbw:.2f}" if r.busbw is not None else "-",
            "total": f"{r.time_us * r.calls / 1000:.3f} ms" if r.time_us is not None else "-", "note": note}


def render_table(result):
    lines = [f"nccl replay --engine nccl-tests: {sum(1 for r in result.rows if r.time_us is not None)} of "
             f"{len(result.rows)} configurations timed"
             + (f", NCCL {result.nccl_version}" if result.nccl_version else "")]
    lines += table_lines(TABLE, [_table_row(r) for r in result.rows])
    total = sum(r.time_us * r.calls for r in result.rows if r.time_us is not None)
    lines.append(f"estimated collective time of the log's timed configurations: {total / 1000:.3f} ms")
    return "\n".join(lines) + "\n"


def render_csv(result):
    # csv's own cell text (True, repr of floats), as this file has always been written
    return csv_text(CSV, [r.to_json() for r in result.rows], cell=lambda v: "" if v is None else v)


def render_json(result):
    import json
    return json.dumps({"engine": "nccl-tests", "nccl": result.nccl_version,
                       "rows": [r.to_json() for r in result.rows], "warnings": result.warnings}, indent=2) + "\n"
