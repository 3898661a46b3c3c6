"""The built-in engine from Python: plan files, the engine's command line, its CBREC records.

`run_steps` runs a whole plan in one MPI job and turns each CBREC line into a result record.
A job that dies, hangs or stops answering yields a failure record for the step in progress
(with MPI's stderr tail and exit code), and a fresh job carries on with the steps after it:
MPI faults are recorded, never raised.
"""

import json
import logging
import math
import os
import shutil
import subprocess
import tempfile
from typing import NamedTuple

from collbench.results import records
from collbench.congestion import engine_lines as congestion_lines, sources as congestion_sources
from collbench.engines import algorithms, launcher
from collbench.engines.base import (Engine, LoopRecord, Measured, failure_message, run_per_step,
                                    step_label, step_timeout_error)
from collbench.engines.build import ensure_engine
from collbench.engines.mpi_job import JobTimeout, describe_exit, stderr_reason
from collbench.errors import UserError
from collbench.ops import get_op

RECORD_PREFIX = "CBREC "
# collbench_engine.c's MAX_PLAN_BYTES: it refuses a larger plan file, so a larger plan would fail
# in every job it is relaunched for; preflight refuses it before anything runs
MAX_PLAN_BYTES = 1 << 20
# key -> accepted types of a CBREC payload; anything else is not a record
RECORD_FIELDS = {
    "op": str, "size_bytes": int, "datatype": str, "iterations": int, "warmup": int,
    "avg_us": (int, float), "min_us": (int, float), "max_us": (int, float), "max_rank": int,
    "validation": str, "loop": int, "step": int, "t_start": (int, float), "t_end": (int, float),
    "ranks": int,
}
# optional CBREC keys (plan options, per-iteration percentiles, the off-CPU rank) -> accepted types
OPTIONAL_FIELDS = {"inplace": int, "root": int, "timing": str, "p50_us": (int, float),
                   "p90_us": (int, float), "p99_us": (int, float), "pmax_us": (int, float),
                   "offcpu_rank": int, "offcpu_max": (int, float), "offcpu_avg": (int, float)}
TIMINGS = ("osu", "sustained")
VALIDATION_STATES = ("pass", "fail", "off")
HOSTS_PREFIX = "CBHOSTS "


def plan_options(step):
    """The plan line's key=value fields for what differs from OSU's defaults ("" for none)."""
    opts = []
    if getattr(step, "inplace", False):
        opts.append("inplace=1")
    if getattr(step, "root", 0):
        opts.append(f"root={int(step.root)}")
    if getattr(step, "timing", "osu") != "osu":
        opts.append(f"timing={step.timing}")
    if getattr(step, "samples", False):
        opts.append("samples=1")
    return "".join(" " + o for o in opts)


def plan_text(steps):
    """The engine plan file's text for steps."""
    lines = ["# collbench-engine plan: op size_bytes iterations warmup datatype"]
    for s in steps:
        op = get_op(s.op)
        lines.append(f"{op.name} {s.size_bytes if op.has_size else 0} {s.iterations} {s.warmup} {s.datatype}"
                     + plan_options(s))
    return "\n".join(lines) + "\n"


def check_plan_size(steps):
    """UserError (exit 2) when the steps' plan file is larger than the engine reads."""
    size = len(plan_text(steps).encode("utf-8"))
    if size > MAX_PLAN_BYTES:
        raise UserError(f"the plan of {len(steps)} steps is {size} bytes as an engine plan file, above "
                        f"collbench-engine's limit of {MAX_PLAN_BYTES} bytes: fewer sizes or ops per run "
                        "(or a larger --factor)")


def write_plan(steps, path):
    """Write steps as an engine plan file (atomically: temp file, then rename)."""
    text = plan_text(steps)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".plan-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def engine_command(cfg, steps, plan_path, loop=False, validate=None, max_loops=None):
    """Write the plan to plan_path and return (argv, env) launching the engine on it."""
    write_plan(steps, plan_path)
    program = [ensure_engine(cfg), "--plan", os.path.abspath(plan_path)]
    if cfg.launcher == "srun":   # Slurm picks the nodes: the ranks say which (RunContext.observe_hosts)
        program.append("--report-hosts")
    if loop:
        program.append("--loop")
    if cfg.validate if validate is None else validate:
        program.append("--validate")
    if max_loops is not None:
        program += ["--max-loops", str(int(max_loops))]
    # an algorithm is forced per job and op: the steps of one job never disagree (same_job_prefix)
    forced = algorithms.job_algorithms(steps)
    # each host's counters around each step (collbench/congestion); not in a job that forces an
    # algorithm: MPICH refuses a forced algorithm for the engine's own exchange of the counters too
    # (an MPI_Allgather of host names), which would fail the timed step it is not part of
    if congestion_sources.enabled(cfg) and not forced and not _mpich_forces_algorithms(cfg):
        program += ["--congestion", congestion_sources.write_spec(cfg, os.path.abspath(plan_path) + ".congestion")]
    return launcher.build_command(cfg, program, algorithms=forced)


def _mpich_forces_algorithms(cfg):
    """True when the job's environment forces MPICH collective algorithms (a tuning env file)."""
    return any(k.startswith("MPIR_CVAR_") and k.endswith("_ALGORITHM") for k in (cfg.env or {}))


def _json_object(line, prefix):
    """The JSON object after `prefix` on an engine output line, or None (another line, or damaged)."""
    line = line.strip()
    if not line.startswith(prefix):
        return None
    try:
        payload = json.loads(line[len(prefix):])
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def parse_line(line):
    """The payload of a CBREC line as a dict, or None for any other line (or a damaged record)."""
    rec = _json_object(line, RECORD_PREFIX)
    if rec is None:
        return None
    for key, types in RECORD_FIELDS.items():
        if not isinstance(rec.get(key), types) or isinstance(rec.get(key), bool):
            return None
    if rec["validation"] not in VALIDATION_STATES:
        return None
    for key, types in OPTIONAL_FIELDS.items():
        if key in rec and (not isinstance(rec[key], types) or isinstance(rec[key], bool)):
            return None
    if rec.get("timing", "osu") not in TIMINGS:
        return None
    return rec


def parse_hosts_payload(line):
    """The payload of a CBHOSTS line as a dict ({"hosts": [...], "slurm_job_id": "123" when the
    ranks ran in a Slurm job}), or None for any other line (or a damaged one)."""
    payload = _json_object(line, HOSTS_PREFIX)
    hosts = None if payload is None else payload.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        return None
    job = payload.get("slurm_job_id")
    out = {"hosts": hosts}
    if isinstance(job, str) and job.isascii() and job.isdigit() and len(job) <= 20:
        out["slurm_job_id"] = job
    return out


def parse_hosts_line(line):
    """The per-rank host list of a CBHOSTS line (rank i ran on hosts[i]), or None."""
    payload = parse_hosts_payload(line)
    return None if payload is None else payload["hosts"]


def _offcpu(rec):
    """The record's off-CPU fields (docs/LOG_FORMAT.md: the rank its peers waited for) from a CBREC
    payload; {} from an engine older than them or with a value out of range."""
    rank, top, avg = rec.get("offcpu_rank"), rec.get("offcpu_max"), rec.get("offcpu_avg")
    if rank is None or top is None or avg is None or not 0 <= rank < rec["ranks"]:
        return {}
    if not (math.isfinite(top) and math.isfinite(avg) and 0.0 <= avg <= top <= 1.0):
        return {}
    return {"offcpu_rank": rank, "offcpu_share_max": round(float(top), 4), "offcpu_share_avg": round(float(avg), 4)}


def to_result(ctx, rec, step=None):
    """A results record (records.result_record) from a parsed CBREC payload; optional fields
    (in place, root, timing, percentiles, algorithm) only where the step asked for them."""
    optional = {}
    if rec.get("inplace"):
        optional["inplace"] = True
    if rec.get("root"):
        optional["root"] = rec["root"]
    if rec.get("timing", "osu") != "osu":
        optional["timing"] = rec["timing"]
    for key in ("p50_us", "p90_us", "p99_us", "pmax_us"):
        if key in rec:
            optional["latency_" + key] = rec[key]
    if step is not None and getattr(step, "algorithm", None):
        optional["algorithm"] = step.algorithm
    record = records.result_record(
        ctx, rec["op"], rec["size_bytes"], rec["datatype"], rec["avg_us"], rec["min_us"],
        rec["max_us"], rec["iterations"], rec["warmup"], validation=rec["validation"],
        straggler_rank=rec["max_rank"], ranks=rec["ranks"], ts=rec["t_end"], **optional)
    record.update(_offcpu(rec))
    if "congestion" in rec:   # the step's CBCONG line (_job): the counters that moved, per host
        payload, tick, ranks = rec["congestion"]
        record["congestion"] = congestion_lines.record_congestion(payload, ctx.hosts, tick, ranks)
    return record


class _JobEnd(NamedTuple):
    """How one engine job ended."""
    error: str          # None when nothing went wrong that the records do not already say
    returncode: int
    timed_out: bool
    stderr_tail: str
    started: bool       # every rank got through MPI_Init (its CBHOSTS line or a record came)


log = logging.getLogger(__name__)
# Under srun, Open MPI 4.1 and Slurm's PMIx plugin race in MPI_Init: a rank on a loaded node may
# get a peer's first message before its TCP handler is set, and segfault (1 step in ~30 here;
# docs/TROUBLESHOOTING.md). A job that died by a signal before every rank finished MPI_Init ran
# nothing of the plan: it is launched once more (once per job), and the retry said on stderr.


def _died_in_start_up(cfg, end, in_batch):
    rc = end.returncode
    return (cfg.launcher == "srun" and in_batch == 0 and not end.started and not end.timed_out
            and rc is not None and (rc < 0 or rc > 128))


def _job(cfg, steps, ctx, runner, plan_path, loop=False, max_loops=None):
    """One engine job over steps: yields each CBREC payload, then returns a _JobEnd.

    Closing the generator (the consumer stopped) stops the job.
    """
    argv, env = engine_command(cfg, steps, plan_path, loop=loop, max_loops=max_loops)
    idle = runner.idle_timeout(cfg)
    job = runner.start(argv, env)
    error, timed_out, started = None, False, False
    congestion = None   # the CBCONG payload printed just before its step's CBREC line
    try:
        for line in job.lines(idle):
            rec = parse_line(line)
            if rec is None:
                if line.startswith(congestion_lines.PREFIX):
                    congestion = congestion_lines.parse_line(line)
                    continue
                if line.startswith(HOSTS_PREFIX):   # srun: where Slurm put the ranks, in which job
                    started = True                  # (rank 0 gathered every rank's host: all are up)
                    payload = parse_hosts_payload(line) or {}
                    ctx.observe_hosts(payload.get("hosts") or [])
                    if payload.get("slurm_job_id"):
                        ctx.observe_slurm_job(payload["slurm_job_id"])
                continue
            if congestion is not None and (congestion["loop"], congestion["step"]) == (rec["loop"], rec["step"]):
                rec["congestion"] = (congestion, congestion_sources.xmit_wait_tick_ns(cfg),
                                     congestion_lines.rank_hosts(cfg))
            congestion = None
            started = True
            yield rec
        try:
            job.wait(timeout=idle)
        except subprocess.TimeoutExpired:
            runner.stop(job)
            error = f"engine closed its output but did not exit within {idle:g}s; job stopped"
    except JobTimeout:
        timed_out = True
        runner.stop(job)
        error = step_timeout_error(cfg.step_timeout, runner.launch_slack)
    finally:
        runner.finish(job)
    return _JobEnd(error, job.returncode, timed_out, job.stderr_tail(runner.stderr_tail_lines), started)


def _reason(end):
    """MPI's own word on a failed job (none for a hung one: its stderr says nothing about it)."""
    return "" if end.timed_out else stderr_reason(end.stderr_tail)


class _PlanFile:
    """plan_path, or a temporary one removed afterwards."""

    def __init__(self, plan_path):
        self.workdir = None if plan_path else tempfile.mkdtemp(prefix="collbench-plan-")
        self.path = plan_path or os.path.join(self.workdir, "plan.txt")

    def __enter__(self):
        return self.path

    def __exit__(self, *exc):
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


class BuiltinEngine(Engine):
    """collbench-engine: a whole plan in one MPI job (a fresh job carries on after a failure)."""

    name = "builtin"
    loops_in_one_job = True

    def preflight(self, cfg, steps):
        """The engine binary (built now if need be), every step's algorithm, the congestion spec,
        a launcher command."""
        algorithms.check_steps(cfg, steps)
        check_plan_size(steps)
        if congestion_sources.enabled(cfg):     # the engine's spec limits, before any launch
            congestion_sources.check_spec(cfg)
        launcher.build_command(cfg, [ensure_engine(cfg), "--plan", os.devnull])

    def measure(self, cfg, steps, ctx, runner, on_progress=None, plan_path=None, iteration=None):
        steps = list(steps)
        total = len(steps)
        done = 0  # steps that have a record
        retried_at = None   # `done` where a job was last relaunched after dying in its start-up
        with _PlanFile(plan_path) as path:
            while done < total:
                batch = algorithms.same_job_prefix(steps[done:])   # one job per forced algorithm
                if on_progress:
                    on_progress(done, total, batch[0])
                in_batch = 0
                job = _job(cfg, batch, ctx, runner, path)
                try:
                    while True:
                        rec = next(job)
                        if in_batch >= len(batch):
                            continue
                        yield Measured(to_result(ctx, rec, batch[in_batch]), done + in_batch,
                                       (rec["t_start"], rec["t_end"]))
                        in_batch += 1
                        if in_batch < len(batch) and on_progress:
                            on_progress(done + in_batch, total, batch[in_batch])
                except StopIteration as stop:
                    end = stop.value
                finally:
                    job.close()
                rc = end.returncode
                error = end.error
                validation_only = rc == 1 and in_batch == len(batch)  # the records already say "fail"
                if error is None and rc != 0 and not validation_only:
                    error = f"MPI job {describe_exit(rc)}"
                elif error is None and in_batch < len(batch):  # e.g. a stop signal from elsewhere
                    error = f"MPI job exited with code 0 after {in_batch} of its {len(batch)} steps"
                if error is None:
                    done += in_batch
                    continue
                if _died_in_start_up(cfg, end, in_batch) and retried_at != done:
                    retried_at = done
                    log.warning("%s: %s before every rank finished MPI_Init (nothing of the plan ran): "
                                "launching it once more (srun and Open MPI's start-up race, docs/TROUBLESHOOTING.md)",
                                step_label(batch[0]), error)
                    continue
                if in_batch < len(batch):
                    step = batch[in_batch]
                    yield Measured(records.failure_record(
                        ctx, failure_message(step_label(step), error, _reason(end), iteration),
                        end.stderr_tail, step.op, step.size_bytes, rc), done + in_batch)
                    done += in_batch + 1
                else:  # every step reported, then the job failed (e.g. in MPI_Finalize)
                    yield Measured(records.failure_record(
                        ctx, failure_message(None, f"after its last step the {error}", _reason(end), iteration),
                        end.stderr_tail, None, None, rc), done + in_batch - 1)
                    done += in_batch

    def run_loop(self, cfg, steps, ctx, runner, first_iteration=1, passes=None, plan_path=None):
        """One engine job for all passes (`--loop`; one pass: a plain plan run)."""
        steps = list(steps)
        if algorithms.needs_separate_jobs(steps):   # two algorithms of one op: a job per step
            yield from run_per_step(self, cfg, steps, ctx, runner, first_iteration, passes, plan_path)
            return
        iteration, next_index = first_iteration, 0   # the pass and step the next record is for
        with _PlanFile(plan_path) as path:
            job = _job(cfg, steps, ctx, runner, path, loop=passes != 1,
                       max_loops=passes if passes not in (None, 1) else None)
            try:
                while True:
                    rec = next(job)
                    index = rec["step"]
                    step = steps[index] if 0 <= index < len(steps) else None
                    iteration = first_iteration + rec["loop"]
                    yield LoopRecord(to_result(ctx, rec, step), iteration, index, (rec["t_start"], rec["t_end"]))
                    next_index = index + 1
                    if next_index >= len(steps):
                        next_index, iteration = 0, iteration + 1
            except StopIteration as stop:
                end = stop.value
            finally:
                job.close()
        passes_done = iteration - first_iteration
        if end.error is None and end.returncode == 0 and passes is not None and passes_done >= passes:
            return
        error = end.error
        if error is None:
            error = (f"MPI job {describe_exit(end.returncode)}" if end.returncode != 0 else
                     "MPI job exited before it was stopped" if passes is None else
                     "MPI job finished without completing the plan")
        step = steps[next_index]
        yield LoopRecord(records.failure_record(
            ctx, failure_message(step_label(step), error, _reason(end), iteration), end.stderr_tail,
            step.op, step.size_bytes, end.returncode), iteration, next_index)


ENGINE = BuiltinEngine()
# the module's own entry points, for callers that hold the module
preflight, run_steps, run_loop = ENGINE.preflight, ENGINE.run_steps, ENGINE.run_loop
