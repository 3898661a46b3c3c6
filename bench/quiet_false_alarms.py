#!/usr/bin/env python3
"""How often `collbench diagnose --baseline` pages for nothing: quiet runs, no fault (issue 28).

One namespace testbed (lab/testbed.py: real namespaces, sshd, mpirun ranks over TCP), RUNS quiet
`collbench once` runs of the accuracy campaign's plan, each its own results file. Then, for every
baseline size B (--baseline-sizes) and every verdict length R (--runs-per-verdict): a baseline saved
from B runs (--layout: B consecutive runs, as `baseline save --runs B` takes them, or B runs spread
over the collection, as one taken from a stress log over days), and `collbench diagnose` run on each
group of R consecutive other runs against it. It
prints, per (B, R): verdicts, false alarms (a regression found), false culprits (a host or link
named), and the largest ratio seen, beside the machine's load.

The runs are kept (--data DIR): `--data DIR --evaluate-only` diagnoses them again without a
testbed, so two rules are compared on the same measurements, not on two noisy campaigns.

    .venv/bin/python bench/quiet_false_alarms.py --runs 40 --data /tmp/quiet
    .venv/bin/python bench/quiet_false_alarms.py --data /tmp/quiet --evaluate-only
"""

import argparse
import glob
import json
import os
import shutil
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from lab import testbed  # noqa: E402
from testbed_runs import collbench  # noqa: E402

OPS = ["--ops", "allreduce,allgather,alltoall,bcast", "--sizes", "256KB,512KB,1MB", "--iterations", "20"]


def collect(args):
    os.makedirs(args.data, exist_ok=True)
    bed = testbed.up(args.hosts, os.path.join(args.data, "tb"), python=sys.executable)
    try:
        with open(bed["config"], "a") as f:
            f.write("step_timeout: 60s\ncongestion:\n  enabled: true\n")
        # what diagnose --config reads, kept beside the runs (the testbed's directory goes with it)
        shutil.copy(bed["config"], os.path.join(args.data, "config.yaml"))
        shutil.copy(os.path.join(bed["dir"], "hostfile"), os.path.join(args.data, "hostfile"))
        started = time.monotonic()
        for i in range(args.runs):
            path = os.path.join(args.data, f"run-{i:03d}.jsonl")
            load = os.getloadavg()[0]
            r = collbench("once", "--config", bed["config"], "--results", path, "--quiet", *OPS,
                          netns=bed["hosts"][0]["netns"], timeout=300)
            if r.returncode not in (0, 1):
                raise RuntimeError(f"once failed: {r.stderr[-500:]}")
            with open(os.path.join(args.data, "loads.jsonl"), "a") as f:
                f.write(json.dumps({"run": i, "load": load}) + "\n")
            left = (time.monotonic() - started) / (i + 1) * (args.runs - i - 1)
            print(f"run {i + 1}/{args.runs} (load {load:.1f}; ~{left:.0f} s left)", file=sys.stderr, flush=True)
    finally:
        testbed.down(bed["dir"])


def evaluate(args):
    runs = sorted(glob.glob(os.path.join(args.data, "run-*.jsonl")))
    config = os.path.join(args.data, "config.yaml")
    loads = []
    if os.path.exists(os.path.join(args.data, "loads.jsonl")):
        loads = [json.loads(x)["load"] for x in open(os.path.join(args.data, "loads.jsonl"))]
    print(f"{len(runs)} quiet runs in {args.data}, baselines of {args.layout} runs; load average "
          + (f"{min(loads):.1f}-{max(loads):.1f}" if loads else "unknown"))
    print(f"{'baseline runs':>13} {'runs/verdict':>12} {'verdicts':>8} {'false alarms':>12} {'false culprits':>14} "
          f"{'max ratio':>9}")
    rows = []
    for b in args.baseline_sizes:
        for first in range(args.baseline_offsets):     # disjoint baselines: their spread shows
            if args.layout == "block":       # b consecutive runs (`baseline save --runs b`)
                chosen = list(range(first * b, first * b + b))
            else:                            # b runs spread over the whole collection (a log's week)
                stride = len(runs) // b
                chosen = list(range(first, stride * b, stride))
            if chosen[-1] >= len(runs):
                break
            base = os.path.join(args.data, f"baseline-{args.layout}-{b}-{first}.json")
            r = collbench("baseline", "save", base, "--from", *[runs[i] for i in chosen], "--force",
                          "--format", "json")
            if r.returncode != 0:
                raise RuntimeError(r.stderr)
            rest = [run for i, run in enumerate(runs) if i not in chosen]
            for per in args.runs_per_verdict:
                alarms = culprits = n = 0
                worst = 1.0
                for g in range(0, len(rest) - per + 1, per):
                    d = collbench("diagnose", *rest[g:g + per], "--baseline", base, "--config", config,
                                  "--format", "json", timeout=120)
                    if d.returncode not in (0, 1):
                        raise RuntimeError(d.stderr)
                    doc = json.loads(d.stdout)
                    n += 1
                    alarms += doc["verdict"] != "no regression"
                    culprits += any(s["host"] or s["link"] for s in doc["suspects"])
                    worst = max([worst] + [x["ratio"] for x in doc["regressions"]])
                rows.append({"baseline_runs": b, "layout": args.layout, "baseline_first": first,
                             "runs_per_verdict": per,
                             "verdicts": n, "false_alarms": alarms, "false_culprits": culprits, "max_ratio": worst})
                print(f"{b:>13} {per:>12} {n:>8} {alarms:>12} {culprits:>14} {worst:>9.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "runs": len(runs), "loads": loads}, f, indent=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--runs", type=int, default=40, help="quiet once runs to collect (default 40)")
    p.add_argument("--data", required=True, metavar="DIR", help="where the runs are kept")
    p.add_argument("--evaluate-only", action="store_true", help="diagnose the runs already in --data again")
    p.add_argument("--baseline-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[3, 5, 8])
    p.add_argument("--baseline-offsets", type=int, default=2, help="disjoint baselines per size (default 2)")
    p.add_argument("--layout", choices=("block", "spread"), default="block",
                   help="the baseline's runs: consecutive ones (block) or spread over the collection")
    p.add_argument("--runs-per-verdict", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    if not args.evaluate_only:
        if os.geteuid() != 0:
            p.error("the testbed needs root")
        collect(args)
    evaluate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
