"""The built-in engine from Python: plan files, the engine's command line, its CBREC records.

`run_steps` runs a whole plan in one MPI job and turns each CBREC line into a result record.
A job that dies, hangs or stops answering yields a failure record for the step in progress
(with MPI's stderr tail and exit code), and a fresh job carries on with the steps after it:
MPI faults are recorded, never raised.
"""

import json
import os
import shutil
import subprocess
import tempfile

from collbench import records
from collbench.engines import launcher
from collbench.engines.build import ensure_engine
from collbench.ops import get_op
from collbench.sizes import format_size
from collbench.engines.mpi_job import JobTimeout, MpiJob, stderr_reason

RECORD_PREFIX = "CBREC "
# key -> accepted types of a CBREC payload; anything else is not a record
RECORD_FIELDS = {
    "op": str, "size_bytes": int, "datatype": str, "iterations": int, "warmup": int,
    "avg_us": (int, float), "min_us": (int, float), "max_us": (int, float), "max_rank": int,
    "validation": str, "loop": int, "step": int, "t_start": (int, float), "t_end": (int, float),
    "ranks": int,
}
# optional CBREC keys (plan options and per-iteration percentiles) -> accepted types
OPTIONAL_FIELDS = {"inplace": int, "root": int, "timing": str, "p50_us": (int, float),
                   "p90_us": (int, float), "p99_us": (int, float), "pmax_us": (int, float)}
TIMINGS = ("osu", "sustained")
VALIDATION_STATES = ("pass", "fail", "off")
HOSTS_PREFIX = "CBHOSTS "
STDERR_TAIL_LINES = 20
STOP_GRACE = 10.0


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


def write_plan(steps, path):
    """Write steps as an engine plan file (atomically: temp file, then rename)."""
    lines = ["# collbench-engine plan: op size_bytes iterations warmup datatype"]
    for s in steps:
        op = get_op(s.op)
        lines.append(f"{op.name} {s.size_bytes if op.has_size else 0} {s.iterations} {s.warmup} {s.datatype}"
                     + plan_options(s))
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".plan-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
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
    return launcher.build_command(cfg, program)


def parse_line(line):
    """The payload of a CBREC line as a dict, or None for any other line (or a damaged record)."""
    line = line.strip()
    if not line.startswith(RECORD_PREFIX):
        return None
    try:
        rec = json.loads(line[len(RECORD_PREFIX):])
    except ValueError:
        return None
    if not isinstance(rec, dict):
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


def parse_hosts_line(line):
    """The per-rank host list of a CBHOSTS line (rank i ran on hosts[i]), or None."""
    line = line.strip()
    if not line.startswith(HOSTS_PREFIX):
        return None
    try:
        payload = json.loads(line[len(HOSTS_PREFIX):])
    except ValueError:
        return None
    hosts = payload.get("hosts") if isinstance(payload, dict) else None
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        return None
    return hosts


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
    return records.result_record(
        ctx, rec["op"], rec["size_bytes"], rec["datatype"], rec["avg_us"], rec["min_us"],
        rec["max_us"], rec["iterations"], rec["warmup"], validation=rec["validation"],
        straggler_rank=rec["max_rank"], ranks=rec["ranks"], ts=rec["t_end"], **optional)


def describe_exit(returncode):
    if returncode is None:
        return "did not exit"
    if returncode < 0:
        return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _step_label(step):
    op = get_op(step.op)
    return f"{op.name} {format_size(step.size_bytes)}" if op.has_size else op.name


def run_steps(cfg, steps, ctx, on_progress=None, output_log=None):
    """Run steps in as few MPI jobs as possible; yield one result or failure record per step."""
    steps = list(steps)
    total = len(steps)
    done = 0  # steps that have a record
    workdir = tempfile.mkdtemp(prefix="collbench-plan-")
    try:
        while done < total:
            batch = steps[done:]
            argv, env = engine_command(cfg, batch, os.path.join(workdir, "plan.txt"))
            job = MpiJob(argv, env, output_log=output_log).start()
            in_batch = 0
            error, timed_out = None, False
            try:
                if on_progress:
                    on_progress(done, total, batch[0])
                for line in job.lines(cfg.step_timeout):
                    rec = parse_line(line)
                    if rec is None and line.startswith(HOSTS_PREFIX):
                        ctx.observe_hosts(parse_hosts_line(line) or [])
                    if rec is None or in_batch >= len(batch):
                        continue
                    yield to_result(ctx, rec, batch[in_batch])
                    in_batch += 1
                    if in_batch < len(batch) and on_progress:
                        on_progress(done + in_batch, total, batch[in_batch])
                try:
                    job.wait(timeout=cfg.step_timeout)
                except subprocess.TimeoutExpired:
                    job.stop(STOP_GRACE)
                    error = f"engine closed its output but did not exit within {cfg.step_timeout:g}s; job stopped"
            except JobTimeout:
                timed_out = True
                job.stop(STOP_GRACE)
                error = f"no result within step_timeout {cfg.step_timeout:g}s; job stopped"
            finally:
                if job.returncode is None:  # the consumer stopped iterating, or an exception
                    job.stop(STOP_GRACE)
            rc = job.returncode
            validation_only = rc == 1 and in_batch == len(batch)  # the records already say "fail"
            if error is None and rc != 0 and not validation_only:
                error = f"MPI job {describe_exit(rc)}"
            elif error is None and in_batch < len(batch):  # e.g. a stop signal from elsewhere
                error = f"MPI job exited with code 0 after {in_batch} of its {len(batch)} steps"
            if error is None:
                done += in_batch
                continue
            tail = job.stderr_tail(STDERR_TAIL_LINES)
            reason = stderr_reason(tail)
            if reason and not timed_out:
                error = f"{error}: {reason}"
            if in_batch < len(batch):
                step = batch[in_batch]
                yield records.failure_record(ctx, f"{_step_label(step)}: {error}", tail, step.op,
                                             step.size_bytes, rc)
                done += in_batch + 1
            else:  # every step reported, then the job failed (e.g. in MPI_Finalize)
                yield records.failure_record(ctx, f"after its last step the {error}", tail, None, None, rc)
                done += in_batch
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
