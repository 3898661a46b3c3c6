#!/usr/bin/env python3
"""Allgather under every algorithm the installed MPI offers, and what the written rules file buys.

Runs `collbench compare --op allgather` at 4 ranks from 1 KB to 16 MB per rank (factor 2),
sustained timing, with --write-rules and --check-rules on the same file, and prints per size:
each algorithm's busbw, the fastest, the default's deficit against it, and the gain the rules
file delivers, measured: default with the file loaded, run after the forced runs, against the
default run without it (not predicted from the table): after the comparison, --repeats pairs of
jobs, default without and with the file (`--algorithms default`, the file loaded by MCA
parameters), in ABBA order; per size the median of the pairs' ratios. Where the file keeps the
library's own choice the two jobs run the same algorithm: their "gain" there is printed as the
control, the noise floor of the figure.

    .venv/bin/python bench/compare_allgather.py [--np 4] [--transport shm] [--iterations 20]
                                                [--repeats 3] [--min-bytes 1KB] [--max-bytes 16MB]
                                                [--config FILE]

The machine's load average is printed before and after: on a shared machine the figures move
with it. Every algorithm runs --repeats times in rotated order; the table shows the median run.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def load():
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def median_busbw(rows):
    values = [r["busbw_bytes_per_s"] for r in rows if r["busbw_bytes_per_s"] is not None]
    return statistics.median(values) if values else None


def gbps(bps):
    return "-" if bps is None else f"{bps / 1e9:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--min-bytes", default="1KB")
    ap.add_argument("--max-bytes", default="16MB")
    ap.add_argument("--config", help="a collbench config (default: this machine, --transport)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds of the comparison (compare --repeats: the median run per algorithm and size) "
                         "and default-then-rules passes after it (the gain: their median ratio); default 3")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="compare-bench-") as tmp:
        cfg = args.config
        if cfg is None:
            cfg = os.path.join(tmp, "bench.yaml")
            with open(cfg, "w", encoding="utf-8") as f:
                f.write(f"ranks: {args.np}\ntransport: {args.transport}\nstep_timeout: 1200\n")
        rules = os.path.join(tmp, "allgather-rules.conf")
        common = [sys.executable, "-m", "collbench", "compare", "--op", "allgather",
                  "--np", str(args.np), "--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes,
                  "--factor", "2", "--iterations", str(args.iterations), "--warmup", str(args.warmup),
                  "--timing", "sustained", "--format", "json", "-q"]
        argv = common + ["-c", cfg, "--check-rules", rules, "--repeats", str(args.repeats), "--write-rules", rules]
        single = common + ["--repeats", "1", "--algorithms", "default"]   # one job: default, +/- the file
        print(f"before: {load()}")
        t0 = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO))
        took = time.monotonic() - t0
        print(f"after:  {load()}  ({took:.0f}s)")
        if p.returncode not in (0, 1) or not p.stdout.strip():
            sys.stderr.write(p.stderr)
            return p.returncode or 1
        doc = json.loads(p.stdout)
        rules_text = open(rules, encoding="utf-8").read() if os.path.exists(rules) else ""
        # The gain, measured again: default without and with the file, each its own job, in
        # alternating order (ABBA: without/with, with/without, ...), so neither the machine's
        # drift nor the position in a pair decides it.
        paired = {}
        if rules_text:
            with open(cfg, encoding="utf-8") as f:
                data = yaml.safe_load(f) or {}
            data["launcher_args"] = list(data.get("launcher_args") or []) + [
                "--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_dynamic_rules_filename", rules]
            tuned_cfg = os.path.join(tmp, "tuned.yaml")
            with open(tuned_cfg, "w", encoding="utf-8") as f:
                yaml.safe_dump(data, f)
            runs = {"default": single + ["-c", cfg], "rules": single + ["-c", tuned_cfg]}
            for n in range(2 * args.repeats):
                order = ("default", "rules") if n % 4 < 2 else ("rules", "default")
                which = order[n % 2]
                q = subprocess.run(runs[which], capture_output=True, text=True, cwd=str(REPO))
                if q.returncode not in (0, 1) or not q.stdout.strip():
                    sys.stderr.write(q.stderr)
                    break
                for r in json.loads(q.stdout)["rows"]:
                    if r["status"] == "ok":
                        paired.setdefault(r["size_bytes"], {}).setdefault(which, []).append(r)
            print(f"after {args.repeats} default/rules pairs: {load()}  ({time.monotonic() - t0:.0f}s)")

    rows = doc["rows"]
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows if r["algorithm"] != "rules"))
    shown = [a for a in algorithms if any(r["algorithm"] == a and r["status"] == "ok" for r in rows)]
    skipped = {r["algorithm"]: r["reason"] for r in rows if r["status"] != "ok" and r["algorithm"] not in shown}
    print(f"\nallgather, {doc['ranks']} ranks, {doc['mpi']}, transport {doc['transport']}, "
          f"{doc['timing']} timing, {doc['iterations']} iterations; busbw in GB/s")
    for name, reason in skipped.items():
        print(f"  {name}: not measured: {reason}")
    width = max(9, *(len(a) for a in shown))
    header = f"{'size':>7}  " + "  ".join(f"{a[:width]:>{width}}" for a in shown)
    header += f"  {'fastest':>{width}}  {'default deficit':>15}"
    header += f"  {'default*':>9}  {'rules*':>9}  {'rules gain':>10}" if paired else f"  {'rules':>9}  {'rules gain':>10}"
    print(header)
    gains, deficits, control = [], [], []
    for size in sorted({r["size_bytes"] for r in rows}):
        group = {r["algorithm"]: r for r in rows if r["size_bytes"] == size}
        cells = [gbps(group[a]["busbw_bytes_per_s"]) if a in group and group[a]["status"] == "ok" else "-" for a in shown]
        best = next((r for r in group.values() if r["fastest"]), None)
        default, checked = group.get("default"), group.get("rules")
        deficit = gain = None
        if best and default and default["status"] == "ok":
            deficit = 1 - best["avg_us"] / default["avg_us"]
            deficits.append(deficit)
        pairs = paired.get(size, {})
        paired_cells = ["-", "-"]
        if pairs.get("default") and pairs.get("rules"):
            gain = statistics.median(d["avg_us"] / r["avg_us"] for d, r in zip(pairs["default"], pairs["rules"])) - 1
            gains.append(gain)
            if best is not None and best["algorithm"] == "default":   # the file's rule there: algorithm 0
                control.append(gain)
            paired_cells = [gbps(median_busbw(pairs["default"])), gbps(median_busbw(pairs["rules"]))]
        elif checked and checked["status"] == "ok" and default and default["status"] == "ok":
            gain = default["avg_us"] / checked["avg_us"] - 1
            gains.append(gain)
        label = f"{size // 1024}KB" if size < 1 << 20 else f"{size >> 20}MB"
        line = f"{label:>7}  " + "  ".join(f"{c:>{width}}" for c in cells)
        line += f"  {(best['algorithm'] if best else '-')[:width]:>{width}}"
        line += f"  {'-' if deficit is None else f'{deficit * 100:.0f}%':>15}"
        if paired:
            line += f"  {paired_cells[0]:>9}  {paired_cells[1]:>9}"
        else:
            line += f"  {gbps(checked['busbw_bytes_per_s']) if checked and checked['status'] == 'ok' else '-':>9}"
        line += f"  {'-' if gain is None else f'{gain * 100:+.0f}%':>10}"
        print(line)
    if paired:
        print(f"* default and rules: median busbw of {args.repeats} jobs each, run after the comparison in ABBA order")
    if control:
        print(f"control: where the file keeps the library's own choice (algorithm 0) the same algorithm runs "
              f"with and without it, so the measured gain there is noise: "
              f"{', '.join(f'{g * 100:+.0f}%' for g in control)} ({len(control)} sizes)")
    if gains:
        geo = math.exp(sum(math.log(1 + g) for g in gains) / len(gains)) - 1
        how = f"median of {args.repeats} ABBA-ordered pairs of jobs" if paired else "the comparison's own check"
        print(f"\nrules gain ({how}) vs default, measured: geometric mean {geo * 100:+.1f}% over {len(gains)} sizes "
              f"(best {max(gains) * 100:+.0f}%, worst {min(gains) * 100:+.0f}%)")
    if deficits:
        print(f"default's deficit against the fastest: median {sorted(deficits)[len(deficits) // 2] * 100:.0f}%, "
              f"largest {max(deficits) * 100:.0f}%")
    if rules_text:
        print("\nthe rules file written:")
        print("\n".join("  " + ln for ln in rules_text.splitlines() if ln and not ln.startswith("#")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
