"""Measure one op under every algorithm: one MPI job per (op, algorithm), rows and records out.

Forcing an algorithm applies to a whole MPI job, so each algorithm's sizes run in their own
job (the built-in engine groups a plan by algorithm). An algorithm that cannot run never stops the
comparison: a documented constraint makes a SKIPPED row before anything runs; a job that fails
makes a FAILED row with what MPI said; after FAILURES_IN_A_ROW consecutive failures the
algorithm's remaining sizes are not tried (each would cost another failing job).
"""

import copy
import sys

from collbench import harness
from collbench.compare.table import FAILED, OK, SKIPPED, make_row
from collbench.config import Step
from collbench.engines import algorithms as algs
from collbench.engines import get_engine, launcher
from collbench.ops import DATATYPES, get_op
from collbench.sizes import format_size

FAILURES_IN_A_ROW = 2


class Plan:
    """What one comparison runs: ops, algorithms per op, sizes, and how each step is timed."""

    def __init__(self, ops, algorithms, sizes, iterations, warmup, datatype, timing, inplace):
        self.ops = ops                      # [op name]
        self.algorithms = algorithms        # {op: [name, ...]} with DEFAULT first
        self.sizes = sizes                  # [bytes per rank]
        self.iterations = iterations
        self.warmup = warmup
        self.datatype = datatype            # None: the op's default
        self.timing = timing
        self.inplace = inplace

    def datatype_for(self, op):
        from collbench.ops import default_datatype
        return self.datatype or default_datatype(get_op(op))

    def steps(self, op, algorithm):
        """The steps of one (op, algorithm) job; algorithm DEFAULT or RULES forces nothing."""
        forced = None if algorithm in (algs.DEFAULT, algs.RULES) else algorithm
        sizes = self.sizes if get_op(op).has_size else [0]
        return [Step(op, size, self.iterations, self.warmup, self.datatype_for(op),
                     inplace=self.inplace, timing=self.timing, algorithm=forced) for size in sizes]

    def count(self, op, size):
        return size // DATATYPES[self.datatype_for(op)] if size else 0


def with_rules(cfg, rules_file):
    """A copy of cfg whose jobs load the tuning file (Open MPI rules or MPICH env file)."""
    settings = algs.launch_settings(cfg, rules_file=rules_file)
    options, mca_env = launcher.mca_arguments(cfg, settings.mca)   # the launcher's own mapping
    out = copy.copy(cfg)
    out.env = dict(cfg.env)
    out.env.update(settings.env)
    out.env.update(mca_env)
    out.launcher_args = options + list(cfg.launcher_args)
    return out


class Progress(harness.Progress):
    """A line per measured or skipped row, with the time left (collbench.harness)."""

    def __init__(self, total, quiet=False, stream=None):
        super().__init__(stream or sys.stderr, total, quiet=quiet)

    def row(self, row):
        what = f"{row['op']} {row['algorithm']} {format_size(row['size_bytes']) if row['size_bytes'] else ''}".rstrip()
        if row["status"] == OK:
            text = f"avg {row['avg_us'] / 1000:.3f} ms" if row["avg_us"] is not None else "measured"
            if row["validation"] == "fail":
                text += " VALIDATION FAILED"
        else:
            text = f"{row['status'].upper()}: {row['reason']}"
        self.finished(f"{what}: {text}")


def measure(cfg, plan, ctx, flavour, algorithm, op, progress=None, job_cfg=None):
    """Rows and records of one (op, algorithm); job_cfg: the config its jobs use (rules check)."""
    engine = get_engine(getattr(plan, "engine", "builtin"))
    if job_cfg is None and hasattr(plan, "job_config"):   # nccl-tests: NCCL_ALGO/NCCL_PROTO in the env
        job_cfg = plan.job_config(cfg, algorithm)
    rows, records, notes = [], [], []
    runnable = []
    for step in plan.steps(op, algorithm):
        count = plan.count(op, step.size_bytes)
        why = algs.known_constraint(flavour, op, algorithm, cfg.ranks, count)
        if why:
            rows.append(make_row(op, algorithm, step.size_bytes, count, step.datatype, SKIPPED, reason=why))
            if progress:
                progress.row(rows[-1])
        else:
            runnable.append(step)
    if not runnable:
        return rows, records, notes
    by_size = {s.size_bytes: s for s in runnable}
    seen = set()
    failures = 0
    gen = engine.run_steps(job_cfg or cfg, runnable, ctx)
    try:
        for rec in gen:
            rec["algorithm"] = algorithm
            records.append(rec)
            size = rec.get("size_bytes") or 0
            if rec.get("type") == "result":
                failures = 0
                row = make_row(op, algorithm, size, plan.count(op, size), rec.get("datatype"), OK, rec)
            elif rec.get("op") is None:      # the job failed after its last step
                notes.append(f"{op} {algorithm}: {rec.get('error')}")
                continue
            else:
                failures += 1
                reason = (algs.failure_reason(rec.get("stderr_tail"), by_size.get(size))
                          or rec.get("error") or "the MPI job failed")
                row = make_row(op, algorithm, size, plan.count(op, size), by_size.get(size, runnable[0]).datatype,
                               FAILED, reason=reason)
            seen.add(size)
            rows.append(row)
            if progress:
                progress.row(row)
            if failures >= FAILURES_IN_A_ROW:
                break
    finally:
        gen.close()        # stops a job still running
    last = next((r["reason"] for r in reversed(rows) if r["status"] == FAILED), "")
    for step in runnable:
        if step.size_bytes not in seen:
            rows.append(make_row(op, algorithm, step.size_bytes, plan.count(op, step.size_bytes), step.datatype,
                                 SKIPPED, reason=f"not tried after {FAILURES_IN_A_ROW} failures in a row ({last})"))
            if progress:
                progress.row(rows[-1])
    rows.sort(key=lambda r: r["size_bytes"])
    return rows, records, notes


def median_rows(rows, repeats=None):
    """One row per (op, algorithm, size) from its blocks (one row per block): the block with the
    median average latency when every block measured it, carrying every block's sample
    (`samples_us`) and their count (`blocks`); else the first block that did not, its reason
    saying how many blocks failed (such a row is never chosen)."""
    groups = {}
    for r in rows:
        groups.setdefault((r["op"], r["algorithm"], r["size_bytes"]), []).append(r)
    out = []
    for group in groups.values():
        ok = sorted((r for r in group if r["status"] == OK), key=lambda r: r["avg_us"] or 0)
        if len(ok) == len(group):
            row = dict(ok[(len(ok) - 1) // 2])
        else:
            row = dict(next(r for r in group if r["status"] != OK))
            if ok:
                row["reason"] = f"in {len(group) - len(ok)} of {len(group)} blocks: {row['reason']}"
        row["samples_us"] = [r["avg_us"] for r in ok if r["avg_us"]]
        row["blocks"] = len(ok)
        row["runs"] = len(group)
        out.append(row)
    return out
