#!/usr/bin/env python3
"""`collbench import` on outputs far larger than real ones: time and peak memory, beside a naive pass.

Inputs (written to a temporary directory): a 1,000,000-row OSU allreduce output (29 MB) and
60 MB of nccl-tests rows (513k rows, 2.13+ layout, 2 device lines), the two cases of issue 26.
For each, --repeat runs (default 3) of:

- `collbench import ... --results FILE` (this checkout);
- naive: the least any importer does, in Python: read the file line by line, split each row,
  float() its numbers and write one JSON line per row (no validation, no cap, no records);
- old (with --old DIR, a checkout of an earlier collbench): the same import command there.

Each run is its own process; its wall time and its peak RSS (wait4's ru_maxrss of that process)
are printed as median [min-max] over the runs. The machine is shared: the load average is
printed before and after.

    .venv/bin/python bench/import_scale.py [--repeat 3] [--old /path/to/old/checkout] [--only osu|nccl]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

NCCL_HEAD = """# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   6899 on hostA device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   6900 on hostA device  1 [0000:05:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""

NAIVE = r"""
import json, sys
src, dst, kind = sys.argv[1:4]
with open(src) as f, open(dst, "w") as out:
    for line in f:
        fields = line.split()
        if not fields or not fields[0][0].isdigit():
            continue
        if kind == "osu":
            out.write(json.dumps({"size": int(fields[0]), "avg_us": float(fields[1])}) + "\n")
        else:
            out.write(json.dumps({"size": int(fields[0]), "time_us": float(fields[5]),
                                  "algbw": float(fields[6]), "busbw": float(fields[7])}) + "\n")
"""


def write_inputs(tmp):
    osu = tmp / "osu_1m_rows.txt"
    with open(osu, "w") as f:
        f.write("# OSU MPI Allreduce Latency Test v7.4\n# Datatype: MPI_FLOAT.\n# Size       Avg Latency(us)\n")
        for i in range(1_000_000):
            f.write(f"{4 * (i % 1000 + 1):<10d}{12.5 + i % 7:>18.2f}\n")
    nccl = tmp / "nccl_tests_60mb.txt"
    with open(nccl, "w") as f:
        f.write(NCCL_HEAD)
        n = i = 0
        while n < 60_000_000:
            s = 8 << (i % 20)
            line = (f"{s:>12d}  {s // 4:>12d}     float     sum      -1    {30.1 + i % 5:>5.2f}    0.00    0.00"
                    f"      0    {30.2:>5.2f}    0.00    0.00      0\n")
            f.write(line)
            n += len(line)
            i += 1
    return {"osu": (osu, ["osu", osu, "--ranks", "2", "--op", "allreduce"]),
            "nccl": (nccl, ["nccl-tests", nccl, "--op", "allreduce"])}


def measure(cmd, cwd, timeout_s):
    """(wall seconds, peak RSS MB, exit code) of one process; (timeout, ...) when it ran too long."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return time.monotonic() - t0, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)
        if time.monotonic() - t0 > timeout_s:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            return float("inf"), usage.ru_maxrss / 1024, "timeout"
        time.sleep(0.02)


def summary(values):
    finite = [v for v in values if v != float("inf")]
    if len(finite) < len(values):
        return f">{max(finite or [0]):.1f} (timed out)"
    return f"{statistics.median(values):7.1f} [{min(values):.1f}-{max(values):.1f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--old", help="a checkout of an earlier collbench, measured the same way")
    ap.add_argument("--only", choices=("osu", "nccl"))
    ap.add_argument("--timeout", type=float, default=300, help="seconds before a run is stopped (default 300)")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="import-scale-") as d:
        tmp = Path(d)
        inputs = write_inputs(tmp)
        print(f"{'input':<24} {'what':<10} {'wall s median [min-max]':>26} {'peak RSS MB median [min-max]':>30}  "
              f"records/rows written")
        for key, (path, argv) in inputs.items():
            if args.only and key != args.only:
                continue
            kinds = [("collbench", REPO), ("naive", None)] + ([("old", Path(args.old))] if args.old else [])
            for what, tree in kinds:
                walls, rss, written = [], [], 0
                for _ in range(args.repeat):
                    out = tmp / f"out-{what}.jsonl"
                    out.unlink(missing_ok=True)
                    if what == "naive":
                        cmd = [sys.executable, "-c", NAIVE, str(path), str(out), key]
                    else:
                        cmd = [sys.executable, "-m", "collbench", "import", *map(str, argv), "--results", str(out),
                               "--format", "json"]
                    wall, mb, rc = measure(cmd, tree or REPO, args.timeout)
                    walls.append(wall)
                    rss.append(mb)
                    written = sum(1 for _ in open(out)) if out.exists() else 0
                    if rc not in (0, "timeout"):
                        print(f"  {what}: exit {rc}")
                print(f"{path.name:<24} {what:<10} {summary(walls):>26} {summary(rss):>30}  {written}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
