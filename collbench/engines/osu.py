"""Run the real OSU Micro-Benchmarks (`osu_<op>`), one mpirun per plan step.

Each step runs its op's binary for exactly one message size (`-m S:S`) with the step's
iterations and warm-up (`-i`, `-x`), the full listing (`-f`: min/max/iterations), `-c` when
validating and `-T mpi_<type>` for a non-char datatype (flag spellings from OSU 7.4's
osu_util.c / osu_util_options.h). The output is parsed with collbench.engines.osu_parser and becomes one
result record; a step that times out, exits non-zero or prints no usable row becomes a failure
record carrying MPI's stderr tail. OSU reports no per-rank times, so straggler_rank is null.

The binaries must exist at the same path on every host (as mpirun runs them there); only the
local copy can be checked before the run.
"""

import os
import shutil
import time

from collbench.engines.base import Engine, Measured, failure_message, step_timeout_error
from collbench.engines import algorithms
from collbench.engines.launcher import build_command
from collbench.engines.mpi_job import stderr_reason
from collbench.engines.osu_parser import OsuOutputError, parse_output
from collbench.errors import UserError
from collbench.ops import DATATYPE_TABLE, get_op
from collbench.results.records import failure_record, result_record
from collbench.congestion.around_run import AroundRun

# OSU 7.4 `-T` accepts mpi_char, mpi_int, mpi_float (and all): the datatype table's osu column
OSU_DATATYPES = {dt.name: dt.osu for dt in DATATYPE_TABLE.values() if dt.osu}
OSU_DEFAULT_MEM_LIMIT = 512 << 20   # OSU's MAX_MEM_LIMIT: -M is needed past it
# Where OSU's `make install` puts the collectives (7.x adds /blocking), under a given root.
INSTALL_SUBDIRS = (
    "",
    "libexec/osu-micro-benchmarks/mpi/collective/blocking",
    "libexec/osu-micro-benchmarks/mpi/collective",
    "mpi/collective/blocking",
    "mpi/collective",
    "c/mpi/collective/blocking",     # a 7.x build tree
    "bin",
)
STANDARD_ROOTS = ("/usr/local", "/opt/osu-micro-benchmarks", "/opt/osu", "/usr")


def _candidates(root):
    return [os.path.normpath(os.path.join(root, sub)) if sub else os.path.normpath(root)
            for sub in INSTALL_SUBDIRS]


def _has_all(directory, names):
    return all(os.path.isfile(os.path.join(directory, n)) and os.access(os.path.join(directory, n), os.X_OK)
               for n in names)


def find_osu_dir(cfg, op_names, environ=None):
    """The directory holding osu_<op> for every op named, or a UserError listing every place looked.

    An explicit location (config osu_path, else $OSU_PATH) is the only one searched, so a typo
    never silently runs some other OSU install; without one, the standard install roots and
    $PATH are searched in order.
    """
    environ = os.environ if environ is None else environ
    names = sorted({get_op(o).osu_binary for o in op_names})
    looked = []
    if cfg.osu_path:
        sources = [("osu_path in " + cfg.source, cfg.osu_path)]
    elif environ.get("OSU_PATH"):
        sources = [("$OSU_PATH", environ["OSU_PATH"])]
    else:
        sources = [("standard install root", root) for root in STANDARD_ROOTS]
        on_path = shutil.which(names[0], path=environ.get("PATH", os.defpath)) if names else None
        if on_path:
            sources.append(("$PATH", os.path.dirname(on_path)))
    for origin, root in sources:
        for d in _candidates(os.path.expanduser(root)):
            if d in (x for x, _ in looked):
                continue
            looked.append((d, origin))
            if _has_all(d, names):
                return d
    where = "\n".join(f"  {d}  ({origin})" for d, origin in looked)
    raise UserError(
        f"engine: osu needs the OSU Micro-Benchmarks binaries {', '.join(names)}, not found "
        f"(executable, all in one directory) in any of:\n{where}\n"
        f"Install OSU (https://mvapich.cse.ohio-state.edu/benchmarks/) and set osu_path in the "
        f"config or OSU_PATH to its collective directory, e.g. "
        f"/usr/local/libexec/osu-micro-benchmarks/mpi/collective/blocking")


def check_plan(steps):
    """Reject before anything runs what OSU cannot measure (UserError, exit code 2)."""
    for s in steps:
        op = get_op(s.op)
        if op.has_size and s.datatype not in OSU_DATATYPES:
            raise UserError(f"engine: osu cannot run {s.op} {s.size_label} with datatype {s.datatype!r}: "
                            f"OSU's -T accepts {', '.join(OSU_DATATYPES)} (use --datatype or the "
                            f"config's datatype, or engine: builtin)")


def osu_argv(binary, step, validate, nranks):
    """The OSU command line for one step (one size)."""
    op = get_op(step.op)
    argv = [binary]
    if op.has_size:
        argv += ["-m", f"{step.size_bytes}:{step.size_bytes}"]
        if op.data_per_rank and step.size_bytes * nranks > OSU_DEFAULT_MEM_LIMIT:
            # OSU would silently lower the max size past its 512 MB per-process limit
            argv += ["-M", str(step.size_bytes * nranks * 2)]
    argv += ["-i", str(step.iterations), "-x", str(step.warmup), "-f"]
    if op.has_size:  # barrier takes neither -c nor -T
        if validate:
            argv.append("-c")
        if step.datatype != "char":
            argv += ["-T", OSU_DATATYPES[step.datatype].lower()]
    return argv


def preflight(cfg, steps):
    """Everything that can be checked before the first mpirun; returns the OSU directory."""
    check_plan(steps)
    algorithms.check_steps(cfg, steps)
    return find_osu_dir(cfg, [s.op for s in steps])


def run_step(cfg, step, ctx, osu_dir, runner, iteration=None):
    """One step as its own OSU job (runner: a JobRunner); its result or failure record."""
    op = get_op(step.op)
    binary = os.path.join(osu_dir, op.osu_binary)
    program = osu_argv(binary, step, cfg.validate, cfg.ranks)
    argv, env = build_command(cfg, program, algorithms={op.name: getattr(step, "algorithm", None)})
    what = f"{op.osu_binary} {step.size_label}" if op.has_size else op.osu_binary
    lines = []
    job = runner.run(argv, env, idle_timeout=runner.idle_timeout(cfg), on_line=lines.append)
    t_end = time.time()
    stdout = "\n".join(line.rstrip("\n") for line in lines)
    size = step.size_bytes if op.has_size else 0

    def fail(message):
        return failure_record(ctx, failure_message(what, message, iteration=iteration), job.stderr_tail,
                              op.name, size, job.returncode, ts=t_end)

    if job.timed_out:
        return fail(step_timeout_error(cfg.step_timeout, runner.launch_slack))
    try:
        out = parse_output(stdout)
    except OsuOutputError as e:
        reason = str(e)
        if job.returncode:
            # OSU (or MPI) says why on stderr: "Invalid option [-T]", "This test requires ..."
            detail = stderr_reason(job.stderr_tail, program_prefix=None)
            reason = f"exit code {job.returncode}: {detail}" if detail else f"exit code {job.returncode}; {reason}"
        if "usage text" in str(e) and any(f in program for f in ("-T", "-c")):
            reason += " (OSU 5.x has no -T or -c: run it with datatype char and validate false)"
        return fail(reason)
    want_dt = OSU_DATATYPES.get(step.datatype) if op.has_size else None
    block = out.block(want_dt)
    if block is None:
        return fail(f"OSU printed no {want_dt} block (found {', '.join(str(b.datatype) for b in out.blocks)})")
    row = block.row_for(size)
    if row is None or row.avg_us is None:
        return fail(f"OSU printed no row for size {size}")
    validation = row.validation or ("fail" if out.validation_error else "off")
    if job.returncode and validation != "fail":
        why = stderr_reason(job.stderr_tail, program_prefix=None) or "after printing its result"
        return fail(f"exit code {job.returncode}: {why}")
    return result_record(ctx, op.name, size, step.datatype, row.avg_us, row.min_us, row.max_us,
                         row.iterations or step.iterations, step.warmup, validation=validation,
                         straggler_rank=None, ts=t_end)


class OsuEngine(Engine):
    """The real OSU binaries, one mpirun per step (the stress loop: repeated per-step runs)."""

    name = "osu"

    def preflight(self, cfg, steps):
        preflight(cfg, steps)

    def measure(self, cfg, steps, ctx, runner, on_progress=None, plan_path=None, iteration=None):
        steps = list(steps)
        osu_dir = preflight(cfg, steps)
        around = AroundRun(cfg)   # congestion counters: the launching host's, around each whole run
        for index, step in enumerate(steps):
            if on_progress is not None:
                on_progress(index, len(steps), step)
            yield Measured(around.run(lambda: run_step(cfg, step, ctx, osu_dir, runner, iteration), ctx.hosts),
                           index)


ENGINE = OsuEngine()
run_steps, run_loop = ENGINE.run_steps, ENGINE.run_loop
