#!/usr/bin/env python3
"""Duty cycle of the stress daemon: long-lived MPI job vs one mpirun per step (the prototype's way).

Runs the real daemon loop (collbench.stress.daemon.Daemon) twice over the same plan on the
same ranks, each for a fixed wall-clock window, and prints

    duty cycle = sum over records of the step's time inside collectives, clipped to the window
                 / window length

where a step's time inside collectives is the engine's [t_start, t_end] (barrier, warm-up and
timed iterations). The window opens when the daemon starts (before mpirun is launched), so
launch cost counts against the mode that pays it.

    .venv/bin/python bench/duty_cycle.py                     # the prototype's ops/sizes, iterations / 10, 20 s each
    .venv/bin/python bench/duty_cycle.py --plan prototype    # the plan of the prototype this project replaces, as is
"""

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from collbench.config import PROTOTYPE_PLAN, Step, default_plan, load_config  # noqa: E402
from collbench.engines.build import ensure_engine  # noqa: E402
from collbench.stress.daemon import Daemon  # noqa: E402
from collbench.results.results_log import read_records  # noqa: E402
from collbench.results.state_dir import StatePaths  # noqa: E402


def bench_plan(kind, scale):
    plan = default_plan(PROTOTYPE_PLAN)
    if kind == "prototype":
        return plan
    return [Step(s.op, s.size_bytes, max(1, s.iterations // scale), max(1, s.warmup // scale), s.datatype)
            for s in plan]


def run_window(cfg, plan, mode, seconds):
    """Run the daemon in `mode` for `seconds`; (duty cycle, results, failures, wall seconds)."""
    state_dir = tempfile.mkdtemp(prefix=f"collbench-bench-{mode}-")
    try:
        daemon = Daemon(cfg, StatePaths(state_dir), mode=mode, plan=plan)
        t0 = time.time()
        timer = threading.Timer(seconds, daemon.request_stop, args=("bench window over",))
        timer.start()
        try:
            daemon.run()
        finally:
            timer.cancel()
        t_end_window = t0 + seconds
        recs = read_records(os.path.join(state_dir, "results.jsonl"))
        results = [r for r in recs if r.get("type") == "result"]
        failures = [r for r in recs if r.get("type") == "failure"]
        busy = sum(max(0.0, min(r["t_end"], t_end_window) - max(r["t_start"], t0)) for r in results)
        return busy / seconds, len(results), len(failures)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="collbench config (default: this machine, shm)")
    p.add_argument("--np", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--seconds", type=float, default=20.0, help="window per mode (default 20)")
    p.add_argument("--plan", choices=("scaled", "prototype", "seed"), default="scaled",
                   help="scaled: the prototype's ops and sizes with iterations / --scale (default); "
                        "prototype: the prototype's plan as is (seed: its old name)")
    p.add_argument("--scale", type=int, default=10, help="iteration divisor for --plan scaled")
    args = p.parse_args()
    if args.plan == "seed":
        print("bench/duty_cycle.py: --plan seed is now --plan prototype", file=sys.stderr)
        args.plan = "prototype"

    cfg = load_config(args.config)
    cfg.ranks = args.np
    cfg.stress.backoff_initial = 1.0
    plan = bench_plan(args.plan, args.scale)
    ensure_engine(cfg)   # build outside the timed windows
    print(f"plan: {len(plan)} steps ({args.plan}: "
          + ", ".join(f"{s.op} {s.size_label} x{s.iterations}" for s in plan) + ")")
    print(f"ranks: {cfg.ranks}, transport {cfg.transport}, window {args.seconds:g} s per mode, "
          f"{os.cpu_count()} CPUs")
    rows = []
    for mode, label in (("loop", "long-lived job (builtin --loop)"),
                        ("step", "one mpirun per step (prototype)")):
        duty, nres, nfail = run_window(cfg, plan, mode, args.seconds)
        rows.append((label, duty, nres, nfail))
        print(f"  {label:<34} duty cycle {duty:6.3f}   {nres:5d} records  {nfail} failures", flush=True)
    ratio = rows[0][1] / rows[1][1] if rows[1][1] else float("inf")
    print(f"long-lived / per-step duty cycle: {ratio:.2f}x")
    print(f"target >= 0.95 for the long-lived mode: {'met' if rows[0][1] >= 0.95 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
