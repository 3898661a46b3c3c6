"""Run NVIDIA's nccl-tests (or AMD's rccl-tests): `<op>_perf` binaries, one rank per GPU.

The binaries come from the config's `nccl_tests_dir` (the build directory; `build/` under it is
searched too) or $PATH, as `all_reduce_perf` or `all_reduce_perf_mpi` (a NAME_SUFFIX=_mpi build).
They are started through the same launcher as every engine (mpirun or srun, `-g 1`: one GPU per
rank, ranks per node = GPUs per node), or, with `launcher: none`, as one process on this machine
(a GPU box without MPI: a MPI=0 build, one rank).

Steps are grouped into jobs: the steps of one op, datatype, iteration count, warm-up and root
make one job, over a geometric size range when their sizes form one (`-b MIN -e MAX -f F`),
else one job per size (`-b S -e S`). Each job runs `-n iterations -w warmup -d type -c 0|1`
(`-o sum` for reductions, `-r root` for bcast/reduce). nccl-tests prints out-of-place and
in-place figures on every row: a step takes the one its `inplace` asks for. A row's `#wrong`
> 0 is validation "fail" (and `wrong_elements` in the record), `N/A` is "off".

Sizes: nccl-tests' size of all_gather and alltoall is the whole buffer (every rank's block);
collbench's is one rank's block (docs/METRICS.md), so those run at size x ranks and the record
says the per-rank size. A size nccl-tests did not print (a run that failed mid-table: the rows
before stay results) becomes a failure record with the reason nccl-tests or NCCL printed.

This module is the one place that knows nccl-tests: its binaries, argv (`job_args`), datatypes
(`TYPES`) and reductions, and the job (`run_job`: launch, read, why a size has no row). The engine
turns a job's rows into step records (`measure_job`); `compare --engine nccl-tests`
(compare/nccl_compare.py, compare/nccl_candidates.py) and `nccl replay --engine nccl-tests`
(nccl/replay_nccl_tests.py) build their jobs with the same functions.
"""

import os
import shutil
import time
from dataclasses import dataclass
from typing import NamedTuple

from collbench.engines.base import Engine, Measured, failure_message, step_timeout_error
from collbench.engines.launcher import build_command
from collbench.engines.mpi_job import stderr_reason
from collbench.engines.nccl_tests_parser import NcclTestsError, parse
from collbench.errors import UserError
from collbench.ops import DATATYPE_TABLE, OPS, get_op
from collbench.results.records import failure_record, result_record

# collbench op -> nccl-tests binary (barrier has none: NCCL has no barrier)
BINARIES = {op.name: op.nccl_tests_binary for op in OPS.values() if op.nccl_tests_binary}
OPS_OF_BINARY = {b: op for op, b in BINARIES.items()}
ROOTED = ("bcast", "reduce")


class NcclTestsType(NamedTuple):
    """One nccl-tests datatype (src/common.cu test_typenames)."""
    flag: str               # its -d value, as 2.x prints it in the table
    nccl: str               # NCCL's name of it (ncclFloat16 -> float16), as NCCL logs print it
    printed: tuple = ()     # older nccl-tests' spellings in the table


TYPES = (NcclTestsType("int8", "int8", ("char",)), NcclTestsType("uint8", "uint8"),
         NcclTestsType("int32", "int32", ("int",)), NcclTestsType("uint32", "uint32"),
         NcclTestsType("int64", "int64"), NcclTestsType("uint64", "uint64"),
         NcclTestsType("half", "float16"), NcclTestsType("float", "float32"),
         NcclTestsType("double", "float64"), NcclTestsType("bfloat16", "bfloat16"),
         NcclTestsType("f8e4m3", "float8e4m3"), NcclTestsType("f8e5m2", "float8e5m2"))
# collbench datatype -> nccl-tests -d (the op table's column; `short` has no NCCL integer type)
DATATYPES = {dt.name: dt.nccl for dt in DATATYPE_TABLE.values() if dt.nccl}
# NCCL's datatype (a log's) -> nccl-tests -d
FLAG_OF_NCCL_TYPE = {t.nccl: t.flag for t in TYPES}
# nccl-tests' printed type (every version's spelling) -> collbench datatype
FROM_NCCL_TYPE = {spelling: name for name, flag in DATATYPES.items() for t in TYPES if t.flag == flag
                  for spelling in (t.flag, t.nccl, *t.printed)}
# NCCL's reduction (a log's) -> nccl-tests -o (test_opnames; a premultiplied sum is `mulsum`)
REDOPS = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "avg": "avg", "premulsum": "mulsum"}


def op_of_test(test):
    """collbench op of a nccl-tests program name ('all_reduce_perf', '/x/all_gather_perf_mpi'), or None."""
    if not test:
        return None
    base = os.path.basename(str(test))
    if base.endswith("_mpi"):
        base = base[: -len("_mpi")]
    return OPS_OF_BINARY.get(base)


def nccl_size(op, size_bytes, nranks):
    """nccl-tests' -b for one collbench step size (all_gather/alltoall: the whole buffer)."""
    return size_bytes * nranks if op.data_per_rank else size_bytes


def job_args(op, lo, hi, factor, iterations, warmup, type_flag, validate, redop="sum", root=0):
    """The argv tail of one nccl-tests job: sizes lo..hi by factor, one GPU per rank, `-o redop`
    for a reduction (redop None: nccl-tests' default), `-r root` for a rooted op."""
    args = ["-b", str(lo), "-e", str(hi), "-f", str(factor), "-g", "1", "-n", str(iterations),
            "-w", str(warmup), "-d", type_flag, "-c", "1" if validate else "0"]
    if op.reduction and redop:
        args += ["-o", redop]
    if op.name in ROOTED:
        args += ["-r", str(root)]
    return args


def find_binary(cfg, name, environ=None):
    """Path of one nccl-tests binary, or a UserError listing every place looked."""
    environ = os.environ if environ is None else environ
    names = (name, name + "_mpi")
    looked = []
    if cfg.nccl_tests_dir:
        for d in (cfg.nccl_tests_dir, os.path.join(cfg.nccl_tests_dir, "build")):
            for n in names:
                p = os.path.join(d, n)
                looked.append(p)
                if os.path.isfile(p) and os.access(p, os.X_OK):
                    return p
        where = f"nccl_tests_dir in {cfg.source}"
    else:
        for n in names:
            p = shutil.which(n, path=environ.get("PATH", os.defpath))
            if p:
                return p
        looked = list(names)
        where = "$PATH"
    raise UserError(f"engine: nccl-tests needs {name} (or {name}_mpi), not found ({where}): looked at "
                    f"{', '.join(looked)}. Build nccl-tests (make MPI=1, https://github.com/NVIDIA/nccl-tests) "
                    f"and set nccl_tests_dir to its build directory")


def check_plan(cfg, steps):
    """Reject before anything runs what nccl-tests cannot measure (UserError, exit code 2)."""
    for s in steps:
        op = get_op(s.op)
        if op.name not in BINARIES:
            raise UserError(f"engine: nccl-tests has no {op.name} (NCCL has no barrier); "
                            f"leave it out of the plan or use engine: builtin")
        if s.datatype not in DATATYPES:
            raise UserError(f"engine: nccl-tests cannot run {op.name} {s.size_label} with datatype "
                            f"{s.datatype!r} (NCCL types: {', '.join(DATATYPES)})")
        if getattr(s, "algorithm", None):
            raise UserError(f"engine: nccl-tests: plan step {op.name} asks for the MPI algorithm "
                            f"{s.algorithm!r}; NCCL chooses its own (set NCCL_ALGO in the config's env)")
        if op.name in ROOTED and s.root >= cfg.ranks:
            raise UserError(f"engine: nccl-tests: root {s.root} of {op.name} is not a rank of {cfg.ranks}")


def find_binaries(cfg, ops):
    """{op: binary path} for each op (every binary found before the first job runs)."""
    return {op: find_binary(cfg, BINARIES[op]) for op in dict.fromkeys(ops)}


def preflight(cfg, steps):
    """Checks before the first launch; returns {op: binary path}."""
    steps = list(steps)
    check_plan(cfg, steps)
    return find_binaries(cfg, [get_op(s.op).name for s in steps])


def _size_range(sizes):
    """(min, max, factor) when sizes are exactly min * factor^k, k = 0..m; else None."""
    sizes = sorted(set(sizes))
    if len(sizes) == 1:
        return sizes[0], sizes[0], 1
    lo = sizes[0]
    if lo <= 0 or sizes[1] % lo:
        return None
    f = sizes[1] // lo
    want = [lo * f ** k for k in range(len(sizes))]
    return (lo, sizes[-1], f) if f >= 2 and want == sizes else None


def plan_jobs(cfg, steps):
    """[(op name, argv tail, [(index, step, nccl size)])]: the jobs that measure the steps."""
    groups = {}
    for index, s in enumerate(steps):
        op = get_op(s.op)
        key = (op.name, s.datatype, s.iterations, s.warmup, s.root if op.name in ROOTED else 0)
        groups.setdefault(key, []).append((index, s, nccl_size(op, s.size_bytes, cfg.ranks)))
    jobs = []
    for (op_name, dt, iters, warmup, root), members in groups.items():
        sizes = sorted({m[2] for m in members})
        rng = _size_range(sizes)
        ranges = [rng] if rng else [(s, s, 1) for s in sizes]
        for lo, hi, f in ranges:
            args = job_args(get_op(op_name), lo, hi, max(f, 2), iters, warmup, DATATYPES[dt], cfg.validate, root=root)
            sel = [m for m in members if lo <= m[2] <= hi]
            jobs.append((op_name, args, sel))
    return jobs


@dataclass
class JobOutput:
    """What one nccl-tests job printed: its rows by nccl-tests size, and why a size has none."""
    job: object             # the finished MpiJob (returncode, stderr_tail, timed_out)
    t_end: float
    rows: dict              # nccl-tests size -> the first row printed for it
    ranks: int              # ranks per communicator nccl-tests reported (None: not printed)
    nccl_version: str
    reason: str             # why a size has no row: nccl-tests' or NCCL's words, the exit code
    hosts: list             # the ranks' hosts in rank order, as nccl-tests printed them
    lines: list             # what it printed (stdout), line by line: NCCL's INFO lines too


def run_job(cfg, binary, args, runner):
    """Run one nccl-tests job on cfg.ranks ranks and read what it printed; its JobOutput.

    A job that printed nothing within step_timeout is stopped (no rows). A binary built without
    MPI=1 (one rank per communicator) gives no rows either: its figures are one GPU's.
    """
    argv, env = build_command(cfg, [binary] + list(args))
    lines = []
    job = runner.run(argv, env, idle_timeout=runner.idle_timeout(cfg), on_line=lines.append)
    t_end = time.time()
    if job.timed_out:
        return JobOutput(job, t_end, {}, None, None, step_timeout_error(cfg.step_timeout, runner.launch_slack), [],
                         lines)
    try:
        outs = parse("\n".join(line.rstrip("\n") for line in lines))
        why = ""
    except NcclTestsError as e:
        outs, why = [], str(e)
    rows, failures, warnings, first, version = {}, [], [], None, None
    for o in outs:
        first = first or o
        version = version or o.nccl_version
        failures += o.failures
        warnings += o.warnings
        for r in o.rows:
            rows.setdefault(r.size, r)
    # a binary built without MPI=1 prints one whole run per rank, and mpirun interleaves their
    # lines: a run's device lines may land in any of the runs parsed, so the widest one counts
    seen = max((o for o in outs if o.devices), key=lambda o: o.ranks, default=first)
    ranks = seen.ranks if seen is not None else None
    hosts = [d.host for d in sorted(seen.devices, key=lambda d: d.rank)] if seen is not None and seen.devices else []
    if ranks is not None and ranks != cfg.ranks:
        why = (f"nccl-tests ran {ranks} rank(s) per communicator for a job of {cfg.ranks}: "
               f"{'a binary built without MPI=1 (make MPI=1)' if ranks == 1 else 'check -g and the launcher'}")
        rows = {}
    if failures:
        reason = failures[0].message()
        if warnings:    # NCCL's own words (e.g. which NCCL_ALGO name it refused) beside nccl-tests' code
            reason += f" (NCCL WARN {warnings[-1]})"
    elif why:
        reason = why
    else:
        detail = stderr_reason(job.stderr_tail, program_prefix=None)
        reason = (f"exit code {job.returncode}: {detail}" if job.returncode and detail
                  else f"exit code {job.returncode}" if job.returncode else "nccl-tests printed no row for it")
        if warnings:
            reason += f" (NCCL WARN {warnings[-1]})"
    return JobOutput(job, t_end, rows, ranks, version, reason, hosts, lines)


def variant_of(row, inplace):
    """The in-place or out-of-place figures of a row, as the step asks (None: not printed)."""
    return None if row is None else (row.ip if inplace else row.oop)


def wrong_elements(variant):
    """A row's #wrong as the record's wrong_elements (a whole number when it is one)."""
    return variant.wrong if variant.wrong % 1 else int(variant.wrong)


def _step_record(cfg, ctx, step, out, variant):
    op = get_op(step.op)
    rec = result_record(ctx, op.name, step.size_bytes, step.datatype, variant.time_us, variant.i_min_us,
                        variant.i_max_us, step.iterations, step.warmup, validation=variant.validation,
                        straggler_rank=None, ranks=out.ranks or cfg.ranks, ts=out.t_end,
                        inplace=True if step.inplace else None,
                        root=step.root if op.name in ROOTED and step.root else None)
    if variant.wrong is not None:
        rec["wrong_elements"] = wrong_elements(variant)
    if out.nccl_version:
        rec["nccl_version"] = out.nccl_version
    return rec


def measure_job(cfg, ctx, binary, args, members, runner, iteration=None):
    """One nccl-tests job of the engine's plan; [(index, record)] for its steps, in their order."""
    out = run_job(cfg, binary, args, runner)
    if out.hosts:
        ctx.observe_hosts(out.hosts)
    name = os.path.basename(binary)
    results = []
    for index, step, size in members:
        row = out.rows.get(size)
        variant = variant_of(row, step.inplace)
        if variant is not None:
            results.append((index, _step_record(cfg, ctx, step, out, variant)))
            continue
        why = out.reason if row is None else \
            f"nccl-tests printed no {'in-place' if step.inplace else 'out-of-place'} figures for it"
        results.append((index, failure_record(ctx, failure_message(f"{name} {step.size_label}", why, iteration=iteration),
                                              out.job.stderr_tail, get_op(step.op).name, step.size_bytes,
                                              out.job.returncode, ts=out.t_end)))
    return results


class NcclTestsEngine(Engine):
    """nccl-tests / rccl-tests binaries, one job per op and size range (stress: per-step runs)."""

    name = "nccl-tests"

    def preflight(self, cfg, steps):
        preflight(cfg, steps)

    def measure(self, cfg, steps, ctx, runner, on_progress=None, plan_path=None, iteration=None):
        steps = list(steps)
        binaries = preflight(cfg, steps)
        done, next_index = {}, 0
        for op_name, args, members in plan_jobs(cfg, steps):
            if on_progress is not None:
                for index, step, _ in members:
                    on_progress(index, len(steps), step)
            for index, rec in measure_job(cfg, ctx, binaries[op_name], args, members, runner, iteration):
                done[index] = rec
            # records go out in plan order as soon as every step before them is measured
            while next_index in done:
                yield Measured(done.pop(next_index), next_index)
                next_index += 1


ENGINE = NcclTestsEngine()
run_steps, run_loop = ENGINE.run_steps, ENGINE.run_loop
