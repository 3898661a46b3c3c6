"""The one harness for every verb that runs MPI jobs (once, sweep, compare, topo measure, topo
compare, nccl replay, report's peak test, baseline --runs): signals, progress with the time left, leftover launchers, exit codes.

    with harness.Run("sweep", total=len(steps), unit="steps", on_stop="no file written") as run:
        for rec in engine.run_steps(...):
            run.progress.finished(...)
    if run.stopped:
        return run.exit_code        # 130 after Ctrl-C, 143 after SIGTERM

Inside the block SIGTERM raises `Terminated`, so it unwinds like Ctrl-C: the engines stop the job
they hold when unwound, and `stop_leftover_jobs` stops a launcher a signal caught half-started.
The verb then says what it keeps (`on_stop`) and returns the exit code.
"""

from collbench.harness.progress import Progress, StepProgress, step_weight
from collbench.harness.run import (EXIT_INTERRUPTED, EXIT_TERMINATED, Run, Stopped, Terminated, raise_terminated,
                                   once_plan, prepare, run_context, run_plan, stop_leftover_jobs)
from collbench.harness.tally import Tally, tally

__all__ = ["Run", "Stopped", "once_plan", "prepare", "run_context", "run_plan", "Progress", "StepProgress", "Terminated", "raise_terminated", "stop_leftover_jobs",
           "EXIT_INTERRUPTED", "EXIT_TERMINATED", "Tally", "tally", "step_weight"]
