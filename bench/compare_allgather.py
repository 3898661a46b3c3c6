#!/usr/bin/env python3
"""What the tuning file `collbench compare --write-rules` buys, over consecutive runs.

Each of --runs runs (default 3) is `collbench compare --op allgather --write-rules FILE` at --np
ranks over --min-bytes..--max-bytes (factor --factor), with compare's defaults for the blocks
(adaptive, within --time-budget) and its own ABBA check of the file. Then the bench measures the
file itself, independently of compare: --pairs pairs of jobs, default without and with the file
(`--algorithms default --blocks 1`, the file loaded by MCA parameters), in ABBA order; per size the
gain median(without) / median(with) with its 95 % rank interval (collbench.compare.stats). Sizes
where the file keeps the library's choice run the same algorithm both ways: their gain is the
control, the noise of the figure.

Per run it prints: the sizes the file forces (compare's interval), compare's verdict
(installed-quality or not), and the bench's own gain per size with its interval, the geometric
mean over all sizes and over the forced ones, the worst size, and the control.

    .venv/bin/python bench/compare_allgather.py [--np 4] [--runs 3] [--min-bytes 1KB] [--max-bytes 16MB]
                                                [--factor 2] [--time-budget 120] [--pairs 4]

The machine's load average is printed before and after each run: on a shared machine the figures
move with it.
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
sys.path.insert(0, str(REPO))

from collbench.compare.stats import speedup_interval  # noqa: E402


def load():
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def label(size):
    return f"{size // 1024}KB" if size < 1 << 20 else f"{size >> 20}MB"


def pct(x):
    return "-" if x is None else f"{(x - 1) * 100:+.1f}%"


def interval(g, lo, hi):
    if g is None:
        return "-"
    return f"{pct(g)} [{pct(lo)}, {pct(hi)}]" if lo is not None else f"{pct(g)} [no interval]"


def geo(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def measure_file(single, cfg, rules, tmp, pairs):
    """{size: (without samples, with samples)} from ABBA pairs of default jobs without/with the file."""
    with open(cfg, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    data["launcher_args"] = list(data.get("launcher_args") or []) + [
        "--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_dynamic_rules_filename", rules]
    tuned = os.path.join(tmp, "tuned.yaml")
    with open(tuned, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f)
    runs = {"without": single + ["-c", cfg], "with": single + ["-c", tuned]}
    out = {}
    for n in range(2 * pairs):
        which = "without" if n % 4 in (0, 3) else "with"
        q = subprocess.run(runs[which], capture_output=True, text=True, cwd=str(REPO))
        if q.returncode not in (0, 1) or not q.stdout.strip():
            sys.stderr.write(q.stderr[-2000:])
            continue
        for r in json.loads(q.stdout)["rows"]:
            if r["status"] == "ok" and r["algorithm"] == "default":
                out.setdefault(r["size_bytes"], {"without": [], "with": []})[which].append(r["avg_us"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--min-bytes", default="1KB")
    ap.add_argument("--max-bytes", default="16MB")
    ap.add_argument("--factor", default="2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--time-budget", default="120", help="compare's --time-budget per run (default 120 s)")
    ap.add_argument("--pairs", type=int, default=4, help="the bench's own ABBA pairs per run (default 4)")
    ap.add_argument("--config", help="a collbench config (default: this machine, --transport)")
    args = ap.parse_args()

    summary = []
    with tempfile.TemporaryDirectory(prefix="compare-bench-") as tmp:
        cfg = args.config
        if cfg is None:
            cfg = os.path.join(tmp, "bench.yaml")
            with open(cfg, "w", encoding="utf-8") as f:
                f.write(f"ranks: {args.np}\ntransport: {args.transport}\nstep_timeout: 1200\n")
        common = [sys.executable, "-m", "collbench", "compare", "--op", "allgather", "--np", str(args.np),
                  "--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes, "--factor", args.factor,
                  "--iterations", str(args.iterations), "--warmup", str(args.warmup), "--timing", "sustained",
                  "--format", "json", "-q"]
        single = common + ["--algorithms", "default", "--blocks", "1"]
        for run in range(1, args.runs + 1):
            rules = os.path.join(tmp, f"allgather-rules-{run}.conf")
            print(f"\n=== run {run}: before: {load()}")
            t0 = time.monotonic()
            p = subprocess.run(common + ["-c", cfg, "--write-rules", rules, "--time-budget", args.time_budget],
                               capture_output=True, text=True, cwd=str(REPO))
            took = time.monotonic() - t0
            if p.returncode not in (0, 1) or not p.stdout.strip():
                sys.stderr.write(p.stderr[-3000:])
                return p.returncode or 1
            doc = json.loads(p.stdout)
            chk = doc.get("rules_check") or {}
            print(f"compare: {doc['blocks']} blocks ({doc['blocks_stopped']}), {took:.0f}s; {load()}")
            forced = {v["size_bytes"]: v for v in chk.get("sizes", []) if v["forced"] and v["verdict"] == "kept"}
            for v in chk.get("sizes", []):
                if v["forced"]:
                    print(f"  compare's check {label(v['size_bytes']):>5} {v['forced']:<20} "
                          f"{interval(v['gain'], v['ci_low'], v['ci_high'])}  {v['verdict']}")
            print(f"  file: {'installed-quality' if doc.get('installed_quality') else 'NOT installed-quality'}"
                  f" ({chk.get('reason') or 'check passed'}); forces {len(forced)} of {len(doc['chosen'])} sizes")
            t1 = time.monotonic()
            samples = measure_file(single, cfg, rules, tmp, args.pairs)
            print(f"bench's own check: {args.pairs} ABBA pairs, {time.monotonic() - t1:.0f}s; {load()}")
            gains, forced_gains, control = {}, [], []
            for size in sorted(samples):
                s = samples[size]
                g, lo, hi = speedup_interval(s["without"], s["with"])
                gains[size] = (g, lo, hi)
                what = forced[size]["forced"] if size in forced else "(library's choice: control)"
                (forced_gains if size in forced else control).append(g)
                print(f"  {label(size):>5} {what:<28} {interval(g, lo, hi)}")
            all_geo = geo([g for g, _, _ in gains.values()])
            worst = min(gains.items(), key=lambda kv: kv[1][0] or 9) if gains else None
            print(f"  gain of the file, geometric mean over {len(gains)} sizes: {pct(all_geo)}; over the "
                  f"{len(forced_gains)} forced: {pct(geo(forced_gains))}; worst "
                  f"{pct(worst[1][0]) if worst else '-'} ({label(worst[0]) if worst else '-'}); control "
                  f"{', '.join(pct(g) for g in control) or '-'}")
            summary.append((run, doc["blocks"], len(forced), all_geo, geo(forced_gains), worst, control,
                            doc.get("installed_quality")))
    print("\n| run | blocks | sizes forced | file vs default, geometric mean (all sizes) | forced sizes | worst size | "
          "control (same algorithm both ways) | installed-quality |")
    print("|---|---|---|---|---|---|---|---|")
    for run, blocks, nforced, all_geo, fgeo, worst, control, iq in summary:
        ctrl = ", ".join(pct(g) for g in control[:4]) + (" ..." if len(control) > 4 else "")
        print(f"| {run} | {blocks} | {nforced} | {pct(all_geo)} | {pct(fgeo)} | "
              f"{pct(worst[1][0]) if worst else '-'} ({label(worst[0]) if worst else '-'}) | {ctrl or '-'} | "
              f"{'yes' if iq else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
