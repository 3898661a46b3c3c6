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
import time
from dataclasses import dataclass, field

from collbench.engines import nccl_tests
from collbench.engines.launcher import build_command, mpi_version
from collbench.engines.mpi_job import JobRunner
from collbench.engines.nccl_tests_parser import NcclTestsError, parse
from collbench.errors import UserError
from collbench.nccl.formats import OPS as NCCL_OPS, PREMULSUM
from collbench.nccl.replay_plan import NotReplayed, plan_groups
from collbench.results.records import RunContext, failure_record, result_record
from collbench.sizes import format_size

# NCCL datatype (collbench/nccl/formats.py) -> nccl-tests -d (src/common.cu test_typenames)
NCCL_TESTS_TYPES = {"int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
                    "uint64": "uint64", "float16": "half", "float32": "float", "float64": "double",
                    "bfloat16": "bfloat16", "float8e4m3": "f8e4m3", "float8e5m2": "f8e5m2"}
# NCCL reduction -> nccl-tests -o (test_opnames)
NCCL_TESTS_OPS = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "avg": "avg", PREMULSUM: "mulsum"}


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
    args = ["-b", str(c.measured_bytes), "-e", str(c.measured_bytes), "-f", "2", "-g", "1",
            "-n", str(iterations), "-w", str(warmup), "-d", NCCL_TESTS_TYPES[row.datatype],
            "-c", "1" if validate else "0"]
    if NCCL_OPS[row.op].reduction and row.redop:
        args += ["-o", NCCL_TESTS_OPS.get(row.redop, "sum")]
    if NCCL_OPS[row.op].rooted:
        args += ["-r", str(c.root)]
    return args


def plan(census, cfg, settings):
    """[Row] per census configuration, in the census' order (UserError: nothing replayable)."""
    _, planned = plan_groups(census.groups, cfg, settings)
    rows = []
    for g, call in planned:
        row = Row(g.op, g.count, g.datatype, g.redop, g.nranks, bool(g.inplace), g.calls, call)
        if row.replayed:
            if g.datatype not in NCCL_TESTS_TYPES:
                row.call = NotReplayed(f"nccl-tests has no datatype {g.datatype}")
            elif g.redop and g.redop not in NCCL_TESTS_OPS:
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
    argv, env = build_command(job_cfg, [binary] + row.args, ranks=c.nranks)
    lines = []
    job = runner.run(argv, env, idle_timeout=runner.idle_timeout(cfg), on_line=lines.append)
    t_end = time.time()
    what = f"{os.path.basename(binary)} {row.datatype} {format_size(c.measured_bytes)}"
    try:
        outs = parse("\n".join(line.rstrip("\n") for line in lines))
    except NcclTestsError as e:
        outs, why = [], str(e)
    else:
        why = ""
    got, version = None, None
    for o in outs:
        version = version or o.nccl_version
        if o.failures and not why:
            why = o.failures[0].message() + (f" (NCCL WARN {o.warnings[-1]})" if o.warnings else "")
        if o.ranks is not None and o.ranks != c.nranks:
            why = f"nccl-tests ran {o.ranks} rank(s) per communicator for a job of {c.nranks} (build with MPI=1)"
            continue
        for r in o.rows:
            if r.size == c.measured_bytes and got is None:
                got = r.ip if row.inplace else r.oop
    if job.timed_out:
        why = f"no output for step_timeout {cfg.step_timeout}s: stopped"
    if got is None or got.time_us is None:
        row.error = why or (f"exit code {job.returncode}" if job.returncode else "nccl-tests printed no row for it")
        return failure_record(ctx, f"{what}: {row.error}", job.stderr_tail, c.op, c.size_bytes, job.returncode,
                              ts=t_end)
    row.time_us = got.time_us * c.scale
    row.busbw = got.busbw_gbs
    rec = result_record(ctx, c.op, c.size_bytes, c.datatype, got.time_us, None, None, iterations, warmup,
                        validation=got.validation, ranks=c.nranks, ts=t_end,
                        inplace=True if row.inplace else None, root=c.root or None)
    rec.update({"replay_engine": "nccl-tests", "nccl_op": row.op, "nccl_datatype": row.datatype,
                "nccl_redop": row.redop, "log_nranks": row.nranks, "log_count": row.count, "log_calls": row.calls})
    if got.wrong is not None:
        rec["wrong_elements"] = got.wrong if got.wrong % 1 else int(got.wrong)
    if version:
        rec["nccl_version"] = version
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
    binaries = {}
    for r in rows:        # every binary found before the first job runs
        if r.replayed and r.call.op not in binaries:
            if r.call.op not in nccl_tests.BINARIES:
                r.call = NotReplayed(f"nccl-tests has no {r.call.op}")
                continue
            binaries[r.call.op] = nccl_tests.find_binary(cfg, nccl_tests.BINARIES[r.call.op])
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


def render_table(result):
    head = ("op", "count", "datatype", "redop", "ranks", "calls", "bytes/call", "time/call", "busbw GB/s",
            "total", "note")
    out = []
    for r in result.rows:
        c = r.call
        ranks = (f"{r.nranks}" if not r.replayed or c.nranks == r.nranks else f"{r.nranks}->{c.nranks}")
        if not r.replayed:
            note = f"not replayed: {c.reason}"
        elif r.time_us is None:
            note = f"FAILED: {r.error}"
        else:
            note = "; ".join(r.notes)
        out.append((r.op + (" (in place)" if r.inplace else ""), str(r.count), r.datatype, r.redop or "-", ranks,
                    str(r.calls), format_size(c.bytes_per_call) if r.replayed else "-",
                    f"{r.time_us:.2f} us" if r.time_us is not None else "-",
                    f"{r.busbw:.2f}" if r.busbw is not None else "-",
                    f"{r.time_us * r.calls / 1000:.3f} ms" if r.time_us is not None else "-", note))
    widths = [max(len(h), *(len(x[i]) for x in out)) if out else len(h) for i, h in enumerate(head)]
    lines = [f"nccl replay --engine nccl-tests: {sum(1 for r in result.rows if r.time_us is not None)} of "
             f"{len(result.rows)} configurations timed"
             + (f", NCCL {result.nccl_version}" if result.nccl_version else "")]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(x, widths)).rstrip() for x in out]
    total = sum(r.time_us * r.calls for r in result.rows if r.time_us is not None)
    lines.append(f"estimated collective time of the log's timed configurations: {total / 1000:.3f} ms")
    return "\n".join(lines) + "\n"


def render_csv(result):
    import csv
    import io
    buf = io.StringIO()
    fields = ("op", "count", "datatype", "redop", "nranks", "replay_nranks", "inplace", "calls", "bytes_per_call",
              "measured_bytes", "estimated", "time_us", "busbw_GBps", "total_us", "error")
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in result.rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.to_json().items()})
    return buf.getvalue()


def render_json(result):
    import json
    return json.dumps({"engine": "nccl-tests", "nccl": result.nccl_version,
                       "rows": [r.to_json() for r in result.rows], "warnings": result.warnings}, indent=2) + "\n"


def cmd(args):
    """`nccl replay --engine nccl-tests` (grouped order): flags checked before the log is read."""
    import sys
    from collbench import harness
    from collbench.atomic_file import Outputs
    from collbench.config import load_config
    from collbench.nccl import replay as mpi_replay
    from collbench.nccl.cli import _safe, replay_flags
    from collbench.results.records import dumps

    if args.order != "grouped":
        raise UserError("--engine nccl-tests replays the grouped configurations (--order grouped); "
                        "--order log is the built-in engine's")
    common, checked = replay_flags(args)
    settings = mpi_replay.Settings(order="grouped", **common)
    cfg = load_config(args.config)
    cfg.validate = bool(args.validate)

    def progress(row):
        if not args.quiet:
            what = f"{row.op} {row.datatype} x{row.count} at {row.call.nranks} ranks"
            done = f"{row.time_us:.2f} us/call" if row.time_us is not None else f"FAILED: {row.error}"
            print(f"collbench nccl replay: {what}: {done}", file=sys.stderr)

    with harness.Run("nccl replay", quiet=True, on_stop="nothing written") as job:
        result = replay(args.paths, cfg, settings, on_row=progress)
    if job.stopped:
        return job.exit_code
    if args.format == "json":
        text = render_json(result)
    elif args.format == "csv":
        text = render_csv(result)
    else:
        text = _safe(render_table(result))
    outs = Outputs()
    if "--results" in checked:
        outs.append(checked["--results"], [dumps(r) + "\n" for r in result.records], "--results")
    if "--csv" in checked:
        outs.write(checked["--csv"], render_csv(result), "--csv")
    outs.write(args.output, text, "-o")
    for w in result.warnings:
        print(f"collbench: warning: {_safe(w)}", file=sys.stderr)
    bad = [r for r in result.records if r.get("type") == "result" and r.get("validation") == "fail"]
    if result.failed or bad:
        print(f"collbench: replay: {len(result.failed)} configuration(s) failed, {len(bad)} failed validation",
              file=sys.stderr)
    outs.raise_if_failed()
    return 1 if result.failed or bad else 0
