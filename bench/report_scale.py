#!/usr/bin/env python3
"""`collbench report` at stress-log scale: the time to build a report from 100,000 records and
the file's size (targets: < 5 s, < 3 MB), and the time Chromium takes to render it.

The log is stress-daemon-shaped: every op of the op table at 8 sizes, repeated plan passes
with latency jitter, four daemon lives (run ids) on the same setup, a failure + backoff +
relaunch every 200 passes, a few bad lines, rotated into results.jsonl and .1 ... .3. Records
are made by collbench.results.records (the writer's own format) and checked by the reader under test.

Figures, each against a baseline measured in the same run:
  * build: the `collbench report` CLI end to end (process start, imports, read, aggregate, plot,
    write; --peak-gbps so no MPI run is timed), median of --repeat runs, wall and CPU time (the
    reader uses a process per core for large inputs); baseline: only json.loads of every line of
    the same files, in-process;
  * size of the HTML; peak RSS of the report process;
  * render: Chromium loading the page and taking a screenshot (median of --repeat), against the
    same Chromium on an empty page (its start-up and shutdown).

    .venv/bin/python bench/report_scale.py [--records 100000] [--repeat 3] [--keep DIR]
"""

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from collbench.results import records  # noqa: E402
from collbench.config import load_config  # noqa: E402
from collbench.ops import OPS, default_datatype  # noqa: E402

SIZES = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24]
RUNS = 4
FILES = 4


def make_log(directory, n_records, seed=14):
    """Write ~n_records result records (+ failures, events, bad lines) as results.jsonl and
    rotations in directory; the number of result records."""
    rng = random.Random(seed)
    cfg = load_config(None)
    cfg.ranks = 16
    cfg.transport = "ucx"
    steps = [(op, size) for op in OPS.values() for size in (SIZES if op.has_size else [0])]
    lines, seq, results = [], 0, 0
    passes = n_records // len(steps) + 1
    ts = 1795400000.0
    for run in range(RUNS):
        ctx = records.RunContext(cfg, "builtin", "mpirun (Open MPI) 4.1.4",
                                 run_id=f"20261123T{run:02d}0000-{rng.getrandbits(32):08x}")
        ctx.hosts = [f"node{i // 8:02d}" for i in range(16)]
        ctx.nodes = 2
        seq += 1
        lines.append(records.dumps(dict(records.event_record("start", pid=4000 + run, detail="started", ts=ts,
                                                             run_id=ctx.run_id, mode="loop", steps=len(steps),
                                                             config="/etc/collbench.yaml"), seq=seq)))
        for it in range(1, passes // RUNS + 2):
            for op, size in steps:
                if results >= n_records:
                    break
                ts += 0.02
                base = 2.0 + size / 8e3 * (2 if op.reduction else 1)
                avg = base * (1 + rng.uniform(-0.05, 0.05)) * (1.6 if rng.random() < 0.01 else 1.0)
                rec = records.result_record(ctx, op.name, size, default_datatype(op), round(avg, 4),
                                            round(avg * 0.93, 4), round(avg * 1.08, 4), 100, 10,
                                            straggler_rank=rng.choice((3, 3, 3, 11)), ts=ts)
                seq += 1
                rec.update(iteration=it, t_start=round(ts - 0.01, 3), t_end=round(ts, 3), seq=seq)
                lines.append(records.dumps(rec))
                results += 1
            if it % 200 == 0:
                seq += 1
                fail = records.failure_record(ctx, f"MPI job exited with code 137 during allreduce 1MB (iteration {it})",
                                              "mpirun noticed that process rank 3 exited on signal 9 (Killed).",
                                              "allreduce", 1 << 20, 137, ts=ts)
                fail.update(iteration=it, seq=seq)
                lines.append(records.dumps(fail))
                for ev in ("backoff", "relaunch"):
                    seq += 1
                    lines.append(records.dumps(dict(records.event_record(ev, pid=4000 + run, detail=ev, ts=ts,
                                                                         run_id=ctx.run_id), seq=seq)))
            if results >= n_records:
                break
    for i in range(20):   # a torn line and other garbage, as a crash or a disk fault leaves
        lines.insert(rng.randrange(len(lines)), rng.choice(['{"schema":1,"type":"result","op":"allre',
                                                             "\x00\x00\x00", "[1,2,3]", '{"type":"result"}']))
    per_file = len(lines) // FILES + 1
    os.makedirs(directory, exist_ok=True)
    for k in range(FILES):
        chunk = lines[k * per_file:(k + 1) * per_file]
        name = "results.jsonl" if k == FILES - 1 else f"results.jsonl.{FILES - 1 - k}"
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write("\n".join(chunk) + "\n")
    return results


def bare_parse_seconds(directory):
    t0 = time.perf_counter()
    n = 0
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as f:
            for line in f:
                try:
                    json.loads(line)
                    n += 1
                except ValueError:
                    pass
    return time.perf_counter() - t0


def build_report(directory, out):
    """Wall seconds, CPU seconds (the process and its reader workers) and peak RSS (KB) of one
    `collbench report` process."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = r0.ru_maxrss
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "collbench", "report", directory, "-o", out, "--peak-gbps", "12.5"],
                       capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"collbench report failed: {p.stderr}")
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return seconds, cpu, max(r1.ru_maxrss, before), p.stderr.strip().splitlines()


def chromium_seconds(page, png, tmp):
    chromium = shutil.which("chromium")
    if not chromium:
        sys.exit("chromium is not installed: run scripts/install.sh")
    profile = tempfile.mkdtemp(dir=tmp, prefix="profile-")
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", "--no-first-run",
            "--disable-background-networking", "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--screenshot={png}", "--window-size=1280,4000", "file://" + page]
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    shutil.rmtree(profile, ignore_errors=True)
    if p.returncode != 0 or not os.path.exists(png):
        sys.exit(f"chromium failed: {p.stderr[-1000:]}")
    return seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", metavar="DIR", help="keep the log and the report in DIR")
    args = ap.parse_args()
    tmp = args.keep or tempfile.mkdtemp(prefix="collbench-report-scale-")
    os.makedirs(tmp, exist_ok=True)
    log_dir = os.path.join(tmp, "state")
    shutil.rmtree(log_dir, ignore_errors=True)
    n = make_log(log_dir, args.records)
    size = sum(os.path.getsize(os.path.join(log_dir, f)) for f in os.listdir(log_dir))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other work on the machine slows "
          "every figure alike)")
    print(f"log: {n} result records in {FILES} files ({size / 1e6:.1f} MB), {len(OPS)} ops x {len(SIZES)} sizes, "
          f"{RUNS} daemon lives")

    bare = statistics.median(bare_parse_seconds(log_dir) for _ in range(args.repeat))
    out = os.path.join(tmp, "report.html")
    builds, cpus, rss, summary = [], [], 0, []
    for _ in range(args.repeat):
        s, c, r, summary = build_report(log_dir, out)
        builds.append(s)
        cpus.append(c)
        rss = max(rss, r)
    build, cpu = statistics.median(builds), statistics.median(cpus)
    html_size = os.path.getsize(out)
    print(f"collbench says: {' | '.join(line.replace('collbench: ', '') for line in summary)}")
    print(f"build report:   {build:.2f} s (median of {args.repeat}: {', '.join(f'{b:.2f}' for b in builds)}), "
          f"target < 5 s  -> {'OK' if build < 5 else 'OVER'}")
    print(f"  CPU time {cpu:.2f} s (process + reader workers, less sensitive to other load); on an idle "
          f"{os.cpu_count()}-core machine the wall time is about {cpu / max(1, min(2, os.cpu_count())) + 0.3:.1f} s")
    print(f"  baseline: json.loads of every line alone {bare:.2f} s; the report costs {build / bare:.1f}x that")
    print(f"report size:    {html_size / 1e6:.2f} MB, target < 3 MB -> {'OK' if html_size < 3e6 else 'OVER'}")
    print(f"peak RSS:       {rss / 1024:.0f} MB (report process)")

    blank = os.path.join(tmp, "blank.html")
    with open(blank, "w") as f:
        f.write("<!doctype html><html><body></body></html>\n")
    render = statistics.median(chromium_seconds(out, os.path.join(tmp, "report.png"), tmp) for _ in range(args.repeat))
    empty = statistics.median(chromium_seconds(blank, os.path.join(tmp, "blank.png"), tmp) for _ in range(args.repeat))
    print(f"chromium:       {render:.2f} s to load and screenshot the report vs {empty:.2f} s for an empty page "
          f"(its own start-up): the report adds {render - empty:.2f} s ({render / empty:.2f}x)")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept in {tmp}")


if __name__ == "__main__":
    main()
