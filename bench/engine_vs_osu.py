#!/usr/bin/env python3
"""Built-in engine latencies beside OSU 7.4's, at 2 ranks over ob1 + vader (shared memory).

Runs collbench-engine with OSU 7.4's defaults (MPI_CHAR, 1 B .. 1 MB, 1000 iterations with 200
warm-up up to 8 KB, 100 with 10 above) for all seven ops, and prints each op and size beside the
captured OSU output in <fixtures>/osu-7.4/<op>_np2.txt, with the deviation and its median per op.

    .venv/bin/python bench/engine_vs_osu.py [--runs N] [--fixtures DIR]

The fixtures were captured on a similar 2-core VM, not on this machine: deviations include the
machine difference. For a same-machine check run OSU itself (collbench once --engine osu).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from collbench import builtin_engine, config, launcher  # noqa: E402
from collbench.config import Step, osu_default_iterations  # noqa: E402
from collbench.ops import OPS  # noqa: E402
from collbench.step_runner import run_job  # noqa: E402

SIZES = [1 << k for k in range(21)]  # OSU's default range: 1 B .. 1 MB
FIXTURE_DIRS = (REPO.parent / "shared" / "fixtures" / "osu-7.4", REPO / "tests" / "fixtures" / "osu-7.4")


def read_fixture(path):
    """{size_bytes: avg_us} from OSU's default output (barrier: {0: avg_us})."""
    figures = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if not parts or line.startswith("#"):
            continue
        if len(parts) == 1:
            figures[0] = float(parts[0])
        else:
            figures[int(parts[0])] = float(parts[1])
    return figures


def plan():
    steps = []
    for op in OPS.values():
        for size in (SIZES if op.has_size else [0]):
            iterations, warmup = osu_default_iterations(size)
            steps.append(Step(op.name, size, iterations, warmup, "char"))
    return steps


def run_engine(cfg, steps, workdir):
    """One engine job over the whole plan: {(op, size): avg_us}."""
    argv, env = builtin_engine.engine_command(cfg, steps, os.path.join(workdir, "plan.txt"), validate=False)
    got = {}

    def on_line(line):
        rec = builtin_engine.parse_line(line)
        if rec:
            got[(rec["op"], rec["size_bytes"])] = rec["avg_us"]

    result = run_job(argv, env, idle_timeout=300, on_line=on_line)
    if result.returncode != 0 or len(got) != len(steps):
        sys.exit(f"engine run failed ({result.returncode}, {len(got)}/{len(steps)} steps):\n{result.stderr_tail}")
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="engine runs; the per-size figure is their median")
    ap.add_argument("--fixtures", type=Path, default=next((d for d in FIXTURE_DIRS if d.is_dir()), FIXTURE_DIRS[-1]))
    args = ap.parse_args()

    # as the fixtures were captured: plain `mpirun -np 2`, default binding, ob1 + vader
    cfg = config.build_config({"hosts": ["localhost:2"], "ranks": 2, "transport": "shm",
                               "oversubscribe": False}, "<bench>", str(REPO))
    steps = plan()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"engine-vs-osu-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    print("collbench engine vs OSU 7.4 fixtures: 2 ranks, ob1 + vader, MPI_CHAR, OSU default iterations")
    print(f"fixtures: {args.fixtures} (captured on a similar 2-core VM, NOT this run's machine)")
    print(f"mpi: {launcher.mpi_version(launcher.resolve_launcher(cfg))}; load before: {os.getloadavg()[0]:.2f}")
    runs = []
    for i in range(args.runs):
        t0 = time.monotonic()
        runs.append(run_engine(cfg, steps, str(workdir)))
        print(f"run {i + 1}: {time.monotonic() - t0:.1f}s wall, load {os.getloadavg()[0]:.2f}")

    summary = []
    for op in OPS.values():
        osu = read_fixture(args.fixtures / f"{op.name}_np2.txt")
        print(f"\n{op.title}")
        head = "".join(f"{f'run{i + 1}(us)':>11}" for i in range(args.runs))
        print(f"{'size':>9} {'osu(us)':>9}{head} {'median':>9} {'dev':>8}")
        devs = []
        for size in (SIZES if op.has_size else [0]):
            figs = [r[(op.name, size)] for r in runs]
            med = statistics.median(figs)
            ref = osu.get(size)
            dev = (med - ref) / ref * 100 if ref else None
            if dev is not None:
                devs.append(dev)
            cols = "".join(f"{f:>11.2f}" for f in figs)
            print(f"{size:>9} {ref if ref is not None else float('nan'):>9.2f}{cols} {med:>9.2f} "
                  f"{'' if dev is None else f'{dev:+7.1f}%':>8}")
        mdev = statistics.median(devs) if devs else float("nan")
        mabs = statistics.median(abs(d) for d in devs) if devs else float("nan")
        summary.append((op.name, mdev, mabs))
    print("\nmedian deviation per op (engine vs fixture; signed, and of absolute values):")
    for name, mdev, mabs in summary:
        print(f"  {name:<15} {mdev:+7.1f}%   |dev| {mabs:6.1f}%")
    subprocess.run(["rm", "-rf", str(workdir)], check=False)


if __name__ == "__main__":
    main()
