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
"""

import os
import shutil
import time

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
# collbench datatype -> nccl-tests -d (2.x spellings; `short` has no NCCL integer type)
DATATYPES = {dt.name: dt.nccl for dt in DATATYPE_TABLE.values() if dt.nccl}
# nccl-tests' printed type (every version's spelling) -> collbench datatype
FROM_NCCL_TYPE = {"int8": "char", "char": "char", "int32": "int", "int": "int", "float": "float",
                  "float32": "float", "double": "double", "float64": "double", "int64": "long"}
ROOTED = ("bcast", "reduce")


def binary_for(op_name):
    return BINARIES.get(get_op(op_name).name)


def op_of_test(test):
    """collbench op of a nccl-tests program name ('all_reduce_perf', '/x/all_gather_perf_mpi'), or None."""
    if not test:
        return None
    base = os.path.basename(str(test))
    for suffix in ("_mpi", ""):
        if suffix and base.endswith(suffix):
            base = base[: -len(suffix)]
    return OPS_OF_BINARY.get(base)


def nccl_size(op, size_bytes, nranks):
    """nccl-tests' -b for one collbench step size (all_gather/alltoall: the whole buffer)."""
    return size_bytes * nranks if op.data_per_rank else size_bytes


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


def preflight(cfg, steps):
    """Checks before the first launch; returns {op: binary path}."""
    steps = list(steps)
    check_plan(cfg, steps)
    return {op: find_binary(cfg, BINARIES[op]) for op in dict.fromkeys(get_op(s.op).name for s in steps)}


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
    """[(argv tail, [(index, step, nccl size)])]: the jobs that measure the steps."""
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
            args = ["-b", str(lo), "-e", str(hi), "-f", str(max(f, 2)), "-g", "1",
                    "-n", str(iters), "-w", str(warmup), "-d", DATATYPES[dt], "-c", "1" if cfg.validate else "0"]
            if get_op(op_name).reduction:
                args += ["-o", "sum"]
            if op_name in ROOTED:
                args += ["-r", str(root)]
            sel = [m for m in members if lo <= m[2] <= hi]
            jobs.append((op_name, args, sel))
    return jobs


def _step_record(cfg, ctx, step, out, row, t_end, nccl_version):
    op = get_op(step.op)
    variant = row.ip if step.inplace else row.oop
    nranks = out.ranks or cfg.ranks
    rec = result_record(ctx, op.name, step.size_bytes, step.datatype, variant.time_us, variant.i_min_us,
                        variant.i_max_us, step.iterations, step.warmup, validation=variant.validation,
                        straggler_rank=None, ranks=nranks, ts=t_end,
                        inplace=True if step.inplace else None,
                        root=step.root if op.name in ROOTED and step.root else None)
    if variant.wrong is not None:
        rec["wrong_elements"] = variant.wrong if variant.wrong % 1 else int(variant.wrong)
    if nccl_version:
        rec["nccl_version"] = nccl_version
    return rec


def run_job(cfg, ctx, op_name, binary, args, members, runner, iteration=None):
    """One nccl-tests job; [(index, record)] for its steps, in their order."""
    program = [binary] + args
    argv, env = build_command(cfg, program)
    lines = []
    job = runner.run(argv, env, idle_timeout=runner.idle_timeout(cfg), on_line=lines.append)
    t_end = time.time()
    name = os.path.basename(binary)

    def fail(step, message):
        what = f"{name} {step.size_label}"
        return failure_record(ctx, failure_message(what, message, iteration=iteration), job.stderr_tail,
                              get_op(step.op).name, step.size_bytes, job.returncode, ts=t_end)

    if job.timed_out:
        return [(i, fail(s, step_timeout_error(cfg.step_timeout, runner.launch_slack))) for i, s, _ in members]
    text = "\n".join(line.rstrip("\n") for line in lines)
    try:
        outs = parse(text)
    except NcclTestsError as e:
        outs = []
        why = str(e)
    else:
        why = ""
    rows, failures, warnings, out, version = {}, [], [], None, None
    for o in outs:
        out = out or o
        version = version or o.nccl_version
        failures += o.failures
        warnings += o.warnings
        for r in o.rows:
            rows.setdefault(r.size, r)
    if out is not None and out.devices:
        ctx.observe_hosts([d.host for d in sorted(out.devices, key=lambda d: d.rank)])
    if out is not None and out.ranks is not None and out.ranks != cfg.ranks:
        why = (f"nccl-tests ran {out.ranks} rank(s) per communicator for a job of {cfg.ranks}: "
               f"{'a binary built without MPI=1 (make MPI=1)' if out.ranks == 1 else 'check -g and the launcher'}")
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
    results = []
    for index, step, size in members:
        row = rows.get(size)
        variant = None if row is None else (row.ip if step.inplace else row.oop)
        if variant is None:
            results.append((index, fail(step, reason if row is None else "nccl-tests printed no "
                                        f"{'in-place' if step.inplace else 'out-of-place'} figures for it")))
        else:
            results.append((index, _step_record(cfg, ctx, step, out, row, t_end, version)))
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
            for index, rec in run_job(cfg, ctx, op_name, binaries[op_name], args, members, runner, iteration):
                done[index] = rec
            # records go out in plan order as soon as every step before them is measured
            while next_index in done:
                yield Measured(done.pop(next_index), next_index)
                next_index += 1


ENGINE = NcclTestsEngine()
run_steps, run_loop = ENGINE.run_steps, ENGINE.run_loop
