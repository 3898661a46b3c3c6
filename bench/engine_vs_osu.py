#!/usr/bin/env python3
"""Built-in engine latencies beside OSU 7.4's, at 2 ranks over ob1 + vader (shared memory).

Runs collbench-engine with OSU 7.4's defaults (MPI_CHAR, 1 B .. 1 MB, 1000 iterations with 200
warm-up up to 8 KB, 100 with 10 above) for all seven ops, and prints each op and size beside the
captured OSU output in <fixtures>/osu-7.4/<op>_np2.txt, with the deviation and its median per op.

    .venv/bin/python bench/engine_vs_osu.py [--runs N] [--fixtures DIR] [--osu-dir DIR]

The fixtures were captured on a similar 2-core VM, not on this machine: deviations from them
include the machine difference. With --osu-dir (a directory holding OSU 7.4's osu_<op> binaries
built with the same MPI) the real OSU also runs here, alternating with the engine, and the
deviation is taken against it: the same-machine check.
"""

import argparse
import os
import shutil
import statistics
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


def parse_osu_default(text):
    """{size_bytes: avg_us} from OSU's default output (barrier: {0: avg_us})."""
    figures = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or line.startswith("#"):
            continue
        try:
            if len(parts) == 1:
                figures[0] = float(parts[0])
            else:
                figures[int(parts[0])] = float(parts[1])
        except ValueError:
            continue  # not a result row (a warning, a banner)
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


def run_osu(cfg, osu_dir):
    """Every osu_<op> with its defaults, one mpirun each: {(op, size): avg_us}."""
    got = {}
    for op in OPS.values():
        argv, env = launcher.build_command(cfg, [str(Path(osu_dir) / op.osu_binary)])
        lines = []
        result = run_job(argv, env, idle_timeout=300, on_line=lines.append)
        if result.returncode != 0:
            sys.exit(f"{op.osu_binary} failed ({result.returncode}):\n{result.stderr_tail}")
        for size, avg in parse_osu_default("\n".join(lines)).items():
            got[(op.name, size)] = avg
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs; the per-size figure is their median")
    ap.add_argument("--fixtures", type=Path, default=next((d for d in FIXTURE_DIRS if d.is_dir()), FIXTURE_DIRS[-1]))
    ap.add_argument("--osu-dir", type=Path, help="OSU 7.4 binaries built with this MPI: compare on this machine")
    args = ap.parse_args()

    # as the fixtures were captured: plain `mpirun -np 2`, default binding, ob1 + vader
    cfg = config.build_config({"hosts": ["localhost:2"], "ranks": 2, "transport": "shm",
                               "oversubscribe": False}, "<bench>", str(REPO))
    steps = plan()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"engine-vs-osu-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    print("collbench engine vs OSU 7.4: 2 ranks, ob1 + vader, MPI_CHAR, OSU default iterations")
    print(f"fixtures: {args.fixtures} (captured on a similar 2-core VM, NOT this run's machine)")
    if args.osu_dir:
        print(f"OSU on this machine: {args.osu_dir} (deviation is taken against it)")
    print(f"mpi: {launcher.mpi_version(launcher.resolve_launcher(cfg))}; load before: {os.getloadavg()[0]:.2f}")
    engine_runs, osu_runs = [], []
    try:
        for i in range(args.runs):
            t0 = time.monotonic()
            engine_runs.append(run_engine(cfg, steps, str(workdir)))
            if args.osu_dir:
                osu_runs.append(run_osu(cfg, args.osu_dir))
            print(f"run {i + 1}: {time.monotonic() - t0:.1f}s wall, load {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    summary = []
    for op in OPS.values():
        fixture = parse_osu_default((args.fixtures / f"{op.name}_np2.txt").read_text())
        print(f"\n{op.title}")
        head = "".join(f"{f'eng{i + 1}':>9}" for i in range(args.runs))
        here = f"{'osu-here':>9}" if osu_runs else ""
        print(f"{'size':>8} {'fixture':>8}{here}{head} {'engine':>8} {'dev':>8}   (us)")
        devs = []
        for size in (SIZES if op.has_size else [0]):
            figs = [r[(op.name, size)] for r in engine_runs]
            med = statistics.median(figs)
            ref_fixture = fixture.get(size)
            ref_here = statistics.median(r[(op.name, size)] for r in osu_runs) if osu_runs else None
            ref = ref_here if osu_runs else ref_fixture
            dev = (med - ref) / ref * 100 if ref else None
            if dev is not None:
                devs.append(dev)
            here = f"{ref_here:>9.2f}" if osu_runs else ""
            cols = "".join(f"{f:>9.2f}" for f in figs)
            fx = f"{ref_fixture:>8.2f}" if ref_fixture is not None else f"{'-':>8}"
            print(f"{size:>8} {fx}{here}{cols} {med:>8.2f} {'' if dev is None else f'{dev:+7.1f}%':>8}")
        summary.append((op.name, statistics.median(devs) if devs else float("nan"),
                        statistics.median(abs(d) for d in devs) if devs else float("nan")))
    against = "OSU on this machine" if osu_runs else "the fixtures (another machine)"
    print(f"\nmedian deviation per op, engine vs {against}: signed, and of absolute values")
    for name, mdev, mabs in summary:
        print(f"  {name:<15} {mdev:+7.1f}%   |dev| {mabs:6.1f}%")


if __name__ == "__main__":
    main()
