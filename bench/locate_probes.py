#!/usr/bin/env python3
"""locate's probes against P, and (with --testbed-runs) on the 8-host namespace testbed.

    .venv/bin/python bench/locate_probes.py                      # simulated fabric, P = 8 .. 1024
    .venv/bin/python bench/locate_probes.py --testbed-runs 10    # + the testbed (root): unshaped
                                                                 #   and one host shaped, N runs each

Simulated fabric (collbench.locate.simulate): one slow host among P, each probe answered at once;
the measurements locate makes (collective runs + pairs measured, every level and the pairs
confirmed) beside a full pairwise matrix's P (P - 1) / 2, for the culprit at the first, middle
and last position.

Testbed: 8 hosts, one rank each, ob1 over TCP. N runs of `collbench locate` unshaped (target:
nothing named 10 of 10) and N runs with h5's link shaped by tbf at --rate on both ends (target:
h5 named in <= 60 s), each with its wall time; min / median / max printed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from collbench.locate.simulate import full_matrix_pairs, simulate_probes  # noqa: E402


def simulated(ps):
    print(f"{'P':>6} {'locate (first/middle/last culprit)':>36} {'full matrix':>12} {'ratio':>9}")
    for p in ps:
        counts = [simulate_probes(p, f"h{i}") for i in (0, p // 2, p - 1)]
        full = full_matrix_pairs(p)
        print(f"{p:>6} {'/'.join(str(c) for c in counts):>36} {full:>12} {full / max(counts):>8.1f}x")


def _spread(xs):
    return f"min {min(xs):.1f} / median {statistics.median(xs):.1f} / max {max(xs):.1f}" if xs else "-"


def _locate(desc):
    t0 = time.monotonic()
    r = subprocess.run(["ip", "netns", "exec", desc["hosts"][0]["netns"], sys.executable, "-m", "collbench", "locate",
                        "--config", desc["config"], "--format", "json"], capture_output=True, text=True, timeout=600,
                       cwd=REPO)
    wall = time.monotonic() - t0
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        return None, wall, r.stderr.strip().splitlines()[-1:] or ["no output"], 0
    c = doc["culprit"]
    return (None if c is None else c.get("host") or "-".join(c["link"])), wall, doc["verdict"], doc["measurements"]


def testbed_runs(n, rate):
    from lab import testbed
    with tempfile.TemporaryDirectory(prefix="locate-bench-") as tmp:
        desc = testbed.up(8, os.path.join(tmp, "tb"), python=sys.executable)
        try:
            with open(desc["config"], "a") as f:
                f.write("step_timeout: 120s\n")
            h5 = desc["hosts"][4]
            for label, shaped in (("unshaped", False), (f"h5 shaped at {rate}", True)):
                if shaped:
                    testbed.shape_link(h5, rate)
                named, walls = [], []
                for i in range(n):
                    who, wall, verdict, meas = _locate(desc)
                    named.append(who)
                    walls.append(wall)
                    print(f"  {label} run {i + 1}: named {who or 'nothing'} in {wall:.1f} s, {meas} measurements: "
                          f"{verdict[:110]}", flush=True)
                if shaped:
                    testbed.shape_link(h5, None)
                    right = sum(w == h5["addr"] for w in named)
                    print(f"{label}: h5 ({h5['addr']}) named in {right} of {n} runs; wall s {_spread(walls)}; "
                          f"named within 60 s: {sum(w == h5['addr'] and s <= 60 for w, s in zip(named, walls))} of {n}")
                else:
                    print(f"{label}: nothing named in {sum(w is None for w in named)} of {n} runs; wall s {_spread(walls)}")
        finally:
            testbed.down(desc["dir"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed-runs", type=int, default=0, metavar="N", help="also N runs each on the testbed (root)")
    ap.add_argument("--rate", default="100mbit", help="the shaped host's link rate (default 100mbit)")
    args = ap.parse_args()
    simulated([8, 16, 32, 64, 128, 256, 512, 1024])
    if args.testbed_runs:
        print(f"\ntestbed: 8 hosts, {args.testbed_runs} runs each; load average {os.getloadavg()[0]:.1f}", flush=True)
        testbed_runs(args.testbed_runs, args.rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
