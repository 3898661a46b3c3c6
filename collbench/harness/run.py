"""The run context of a verb running MPI jobs: SIGTERM as an exception, Ctrl-C, leftover launchers, exit codes."""

import os
import sys
import time

from collbench import proctree, signals
from collbench.signals import Terminated, raise_terminated  # noqa: F401  (the harness' names for them)

EXIT_INTERRUPTED = 130     # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_TERMINATED = 143      # 128 + SIGTERM


def run_context(cfg, engine):
    """The RunContext of a run: its run id, hosts, and the config's MPI as records name it (the
    launcher is asked once, here, for every verb)."""
    from collbench.engines import launcher
    from collbench.results.records import RunContext
    return RunContext(cfg, engine, launcher.mpi_version(cfg))


def once_plan(cfg, engine=None, **flags):
    """The steps `collbench once` runs for a config narrowed by its flags (engine: --engine; flags:
    apply_overrides' np, ops, sizes, iterations, datatype, validate); cfg is narrowed in place.
    A UserError (exit 2) when no step is left. Also the plan of report's peak test and of
    `baseline --runs`, so their numbers are the numbers `once` gives."""
    from collbench.config import apply_overrides
    from collbench.errors import UserError
    if engine:
        cfg.engine = engine
    apply_overrides(cfg, **flags)
    steps = list(cfg.once_plan())
    if not steps:
        raise UserError("the plan has no steps")
    return steps


def prepare(cfg, steps):
    """(engine, run context) for a plan: the config's engine, its preflight (engine built, every
    step checked: exit 2 before anything runs), and the run context."""
    from collbench import engines
    engine = engines.get_engine(cfg.engine)
    engine.preflight(cfg, steps)
    return engine, run_context(cfg, cfg.engine)


class Stopped(Exception):
    """A Run was stopped by Ctrl-C or SIGTERM and said so: for MPI work below a verb's own logic
    (report's peak test, baseline --runs), which unwinds to the verb that returns exit_code."""

    def __init__(self, exit_code):
        super().__init__(exit_code)
        self.exit_code = exit_code


def stop_leftover_jobs(grace=5.0):
    """Stop any process still below us after an interrupt unwound the engine; their pids.

    The engines stop their job when unwound, but a signal that lands while a launcher is being
    started (inside subprocess.Popen, before the engine holds the job) leaves it running with
    nobody to stop it. Whatever is still our descendant then is exactly such a job.
    """
    me = os.getpid()
    left = proctree.descendants(me)
    # launchers lead their own process group: each leftover's group too
    proctree.stop_tree(lambda: proctree.descendants(me), grace, groups=left,
                       on_wait=proctree.reap_children, kill_wait=grace)
    return left


class Run:
    """A context for the MPI-running part of a verb.

    verb: the name in messages ("once", "topo compare"); total/unit: the work, for progress and
    the stop message; on_stop: what the verb keeps when stopped ("no file written"). Ctrl-C and
    SIGTERM inside the block are caught: leftover launchers are stopped, the message printed,
    and `exit_code` set (130 / 143); the verb returns it after writing what it keeps.
    """

    def __init__(self, verb, total=0, unit="steps", quiet=False, on_stop="nothing written", stream=None,
                 progress=None, weights=None):
        from collbench.harness.progress import Progress
        self.verb = verb
        self.unit = unit
        self.on_stop = on_stop
        self.stream = stream or sys.stderr
        self.progress = progress or Progress(self.stream, total, quiet=quiet, weights=weights)
        self.exit_code = None
        self.started = time.monotonic()
        self._signals = None

    @property
    def stopped(self):
        return self.exit_code is not None

    @property
    def elapsed(self):
        return time.monotonic() - self.started

    def __enter__(self):
        # The MPI job runs in its own session; a SIGTERM to us must still end it (the engines
        # stop their job when unwound), so it is turned into an exception like Ctrl-C.
        self._signals = signals.install(signals.VERB, raise_terminated)
        self.started = time.monotonic()
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None or not issubclass(exc_type, (KeyboardInterrupt, Terminated)):
                self.progress.close()
                return False
            self.progress.close()
            stop_leftover_jobs()
            terminated = issubclass(exc_type, Terminated)
            self.exit_code = EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
            done, total = self.progress.done, self.progress.total
            after = f" after {done} of {total} {self.unit}" if total else ""
            print(f"collbench {self.verb}: {'terminated' if terminated else 'interrupted'}{after}; "
                  f"{self.on_stop}", file=self.stream, flush=True)
            return True
        finally:
            self._signals.restore()


def run_plan(verb, engine, cfg, steps, ctx, quiet=False, on_stop="nothing written", stream=None):
    """Every step of a plan through an engine, with a progress line per step: (records, the Run).

    The records are what finished, also when the run was stopped (run.stopped, run.exit_code).
    """
    from collbench.harness.progress import StepProgress
    progress = StepProgress(stream or sys.stderr, steps, quiet=quiet)
    records = []
    with Run(verb, total=len(steps), progress=progress, on_stop=on_stop, stream=stream) as job:
        for rec in engine.run_steps(cfg, steps, ctx, on_progress=progress.start):
            records.append(rec)
            progress.record(rec)
    return records, job
