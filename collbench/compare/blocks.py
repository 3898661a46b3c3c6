"""The comparison's measurement, in blocks: each block runs every algorithm's job once (one MPI job
per (op, algorithm), every size in it), the algorithms in a rotated order so that none always
runs first or last (as `topo compare` alternates its orders). Each block gives every (op,
algorithm, size) one sample.

How many blocks: a fixed number (--blocks), or, by default, from the spread measured: at least
stats.MIN_BLOCKS, then one more block while some row's speed-up interval is still undecided (it
straddles 1 + margin and is wider than `width`), until stats.MAX_BLOCKS; never a block that the
time budget cannot pay for (judged from the blocks' mean time), even below the minimum (then the
reason says that no win can be proven). The time is estimated before the first block (a rough
model: a launch per job plus the data at 1 GB/s) and again from the first block's own time.
"""

import time
from dataclasses import dataclass

from collbench.compare import stats, table
from collbench.compare.runner import measure, median_rows
from collbench.engines import algorithms as algs
from collbench.tables import format_duration
from collbench.ops import get_op

LAUNCH_GUESS_S = 1.0          # one MPI job's start and end, before the first block is timed


@dataclass
class Policy:
    blocks: int = None        # fixed count; None: adaptive
    budget_s: float = 600.0   # adaptive: stop when one more block would overrun this
    margin: float = stats.DEFAULT_MARGIN
    width: float = 2 * stats.DEFAULT_MARGIN   # an interval this narrow (relative) is settled
    min_blocks: int = stats.MIN_BLOCKS
    max_blocks: int = stats.MAX_BLOCKS

    @property
    def adaptive(self):
        return self.blocks is None


def jobs_per_block(plan, with_check):
    return sum(len(plan.algorithms[op]) + (1 if with_check else 0) for op in plan.ops)


def rows_per_block(plan, with_check):
    return sum(len(plan.steps(op, a)) for op in plan.ops
               for a in plan.algorithms[op] + ([algs.RULES] if with_check else []))


def guess_block_s(plan, nranks, with_check):
    """A block's time before any was measured: a launch per job plus every call's bytes at 1 GB/s."""
    total = 0.0
    for op in plan.ops:
        names = plan.algorithms[op] + ([algs.RULES] if with_check else [])
        for _ in names:
            total += LAUNCH_GUESS_S
            for step in plan.steps(op, algs.DEFAULT):
                data = get_op(op).data_bytes(step.size_bytes, nranks) if get_op(op).has_size else 0
                total += (step.iterations + step.warmup) * (20e-6 + data / 1e9)
    return total


def undecided(rows, policy):
    """The measured forced rows whose interval does not yet settle the choice."""
    return [r for r in rows if table.candidate(r) and not stats.settled(r, policy.margin, policy.width)]


def run_blocks(cfg, plan, ctx, flavour, progress, policy, check=None, say=None):
    """(block rows, records, notes, blocks run, why it stopped). check: (path, config loading
    it) of --check-rules' file; its `rules` job then runs in every block too."""
    say = say or (lambda text: None)
    check_path, check_cfg = check or (None, None)
    measured, records, notes = [], [], []
    per_block = rows_per_block(plan, check_cfg is not None)
    planned = policy.blocks if not policy.adaptive else policy.min_blocks
    guess = guess_block_s(plan, cfg.ranks, check_cfg is not None)
    jobs = jobs_per_block(plan, check_cfg is not None)
    if policy.adaptive:
        say(f"{jobs} MPI jobs per block; {policy.min_blocks} blocks at least, more while a speed-up "
            f"interval is undecided, at most {policy.max_blocks} and the time budget "
            f"{format_duration(policy.budget_s)} (--time-budget); estimated "
            f"~{format_duration(guess * policy.min_blocks)} to {format_duration(policy.budget_s)}")
    else:
        say(f"{jobs} MPI jobs per block, {policy.blocks} blocks: estimated ~{format_duration(guess * policy.blocks)}")
    progress.total = planned * per_block
    started = time.monotonic()
    done, why = 0, ""
    while True:
        block_start = time.monotonic()
        for op in plan.ops:
            names = plan.algorithms[op] + ([algs.RULES] if check_cfg is not None else [])
            k = done % len(names)
            for name in names[k:] + names[:k]:     # each block starts with another algorithm
                job_cfg = check_cfg if name == algs.RULES else None
                r, rec, n = measure(cfg, plan, ctx, flavour, name, op, progress, job_cfg=job_cfg)
                if name == algs.RULES:
                    for x in rec:
                        x["rules_file"] = check_path
                for row in r:
                    row["block"] = done
                measured += r
                records += rec
                notes += [x for x in n if x not in notes]
        done += 1
        block_s = time.monotonic() - block_start
        elapsed = time.monotonic() - started
        if not policy.adaptive:
            if done >= policy.blocks:
                why = f"{done} blocks (--blocks)"
                break
            continue
        if done == 1:
            affordable = max(1, int(policy.budget_s // max(block_s, 1e-3)))
            say(f"block 1 took {format_duration(block_s)}: {policy.min_blocks} blocks ~"
                f"{format_duration(block_s * policy.min_blocks)}; the budget allows about "
                f"{min(affordable, policy.max_blocks)}")
        mean_block = elapsed / done
        open_rows = None
        if done >= policy.min_blocks:
            rows = median_rows(measured)
            table.annotate(rows, policy.margin, flavour)
            open_rows = undecided(rows, policy)
            if not open_rows:
                why = f"every interval settled after {done} blocks"
                break
        still = f" ({len(open_rows)} interval(s) still undecided)" if open_rows else ""
        if done >= policy.max_blocks:
            why = f"{done} blocks, the most{still}"
            break
        if elapsed + mean_block > policy.budget_s:
            why = f"time budget {format_duration(policy.budget_s)} spent after {done} blocks{still}"
            if done < policy.min_blocks:
                why += (f"; fewer than {policy.min_blocks} blocks rarely prove a win at 95 %: "
                        "raise --time-budget")
            break
        progress.total = (done + 1) * per_block
    return measured, records, notes, done, why
