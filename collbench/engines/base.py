"""The engine interface: what `once`, the stress daemon and every new driver call, and nothing else.

An engine turns plan steps (collbench.config.Step) into records (collbench.results.records): one result
or one failure record per step. MPI faults (a rank dies, a job hangs, a binary is missing on a
host) become failure records, never exceptions; a UserError is raised only by preflight(), for
what is wrong before anything runs.

    preflight(cfg, steps)            checks that must pass before the first mpirun (UserError)
    run_steps(cfg, steps, ctx, ...)  every step once: a record per step, in plan order
    run_loop(cfg, steps, ctx, ...)   the plan pass after pass (the stress daemon), until a failure

Both run methods are built on measure(), the one thing an engine implements: it runs the steps
once and yields Measured items (the record, the step's index, its timed window if the engine
knows it). run_loop's default repeats per-step runs (one MPI job per step); an engine that can
keep one job over many passes (the built-in engine's --loop) overrides it.

How jobs are started and stopped is the caller's: a JobRunner (engines/mpi_job.py) is passed in.
"""

from typing import NamedTuple

from collbench.engines.mpi_job import JobRunner
from collbench.ops import get_op
from collbench.sizes import format_size

MAX_ERROR_CHARS = 500   # a failure record's error is one line of at most this many characters


class Measured(NamedTuple):
    """One step's outcome from Engine.measure()."""
    record: dict           # a result or failure record
    index: int             # the step's index in the steps measured
    window: tuple = None   # (t_start, t_end): wall-clock seconds around the timed part, if known


class LoopRecord(NamedTuple):
    """One record of Engine.run_loop()."""
    record: dict           # a result or failure record
    iteration: int         # the plan pass it belongs to (counted from first_iteration)
    step: int              # the index in the plan of its step
    window: tuple = None   # (t_start, t_end), as Measured.window


def step_label(step):
    """'allreduce 1MB', or 'barrier' for an op without a size."""
    op = get_op(step.op)
    return f"{op.name} {format_size(step.size_bytes)}" if op.has_size else op.name


def failure_message(what, error, reason="", iteration=None):
    """The one wording of a failure: '<what> (iteration N): <error>: <MPI's reason>', one line.

    what: the step ('allreduce 1MB', or the OSU binary that ran it), None for the job as a whole;
    iteration: the stress loop's plan pass, None outside the loop.
    """
    head = " ".join(p for p in (what, f"(iteration {iteration})" if iteration is not None else None) if p)
    text = f"{head}: {error}" if head else error
    if reason and reason not in text:
        text += f": {reason}"
    return " ".join(text.split())[:MAX_ERROR_CHARS]


def step_timeout_error(step_timeout, launch_slack=0.0):
    """The one wording of a step that produced nothing within step_timeout."""
    slack = f" (+{launch_slack:g}s for the launch)" if launch_slack else ""
    return f"no result within step_timeout {step_timeout:g}s{slack}; job stopped"


class Engine:
    """A way to run collectives. Subclasses set `name` and implement measure()."""

    name = None
    # run_loop keeps one MPI job over many plan passes (no relaunch cost between passes)
    loops_in_one_job = False

    def preflight(self, cfg, steps):
        """Check what can be checked before anything runs; UserError (exit 2) if it is wrong."""

    def measure(self, cfg, steps, ctx, runner, on_progress=None, plan_path=None, iteration=None):
        """Run every step once; yield a Measured per step (its result or its failure).

        on_progress(index, total, step) is called as each step starts; plan_path is where an
        engine that reads a plan file writes it (None: a temporary file); iteration only goes
        into failure messages (the stress loop's pass).
        """
        raise NotImplementedError

    def run_steps(self, cfg, steps, ctx, on_progress=None, output_log=None, runner=None):
        """Run every step once; yield one result or failure record per step, in plan order.

        output_log: a file object that gets the jobs' raw output; runner: a JobRunner (default:
        a plain one writing to output_log).
        """
        runner = runner or JobRunner(output_log)
        for item in self.measure(cfg, steps, ctx, runner, on_progress=on_progress):
            yield item.record

    def run_loop(self, cfg, steps, ctx, runner, first_iteration=1, passes=None, plan_path=None):
        """Run the plan pass after pass (passes=None: until stopped); yield a LoopRecord per
        step. Ends after the first failure record, or when `passes` passes are done.

        The default: one MPI job per step. Closing the generator stops the running job.
        """
        return run_per_step(self, cfg, steps, ctx, runner, first_iteration, passes, plan_path)


def run_per_step(engine, cfg, steps, ctx, runner, first_iteration=1, passes=None, plan_path=None):
    """The plan pass after pass with one MPI job per step (LoopRecords; ends at the first failure)."""
    steps = list(steps)
    iteration = first_iteration
    while passes is None or iteration < first_iteration + passes:
        for index, step in enumerate(steps):
            for item in engine.measure(cfg, [step], ctx, runner, plan_path=plan_path, iteration=iteration):
                yield LoopRecord(item.record, iteration, index, item.window)
                if item.record["type"] == "failure":
                    return
        iteration += 1
