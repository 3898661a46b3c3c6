#!/usr/bin/env python3
"""How much ECN marks alone slow the collectives on the namespace testbed, under the congestion
control `testbed.sh up` pins (cubic; issue 28: the machine's default, bbr, ignores CE marks).

Quiet `once` runs alternate with runs whose host h2's egress is CE-marked above --rate (nftables,
no queue), so both see the same machine load; it prints per op the median latency and its range,
quiet and marked, and the CE-marked packets h2 counted (TcpExt TCPDeliveredCE) per step.

    .venv/bin/python bench/ecn_marks_slowdown.py [--hosts 4] [--runs 4] [--rate 256kbytes] [--cc cubic]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from lab import testbed  # noqa: E402

ARGS = ["--ops", "alltoall,allreduce", "--sizes", "1MB", "--iterations", "20"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--runs", type=int, default=4, help="runs of each kind, interleaved (default 4)")
    p.add_argument("--rate", default="256kbytes", help="h2's egress is CE-marked above this (default 256kbytes)")
    p.add_argument("--cc", default=None, help="TCP congestion control in the namespaces (default: what up pins)")
    args = p.parse_args(argv)
    root = tempfile.mkdtemp(prefix="ecn-slowdown-")
    bed = testbed.up(args.hosts, os.path.join(root, "tb"), python=sys.executable)
    rows = {"quiet": [], "marked": []}
    try:
        with open(bed["config"], "a") as f:
            f.write("step_timeout: 60s\ncongestion:\n  enabled: true\n")
        if args.cc:
            for h in bed["hosts"]:
                subprocess.run(["ip", "netns", "exec", h["netns"], "sysctl", "-q", "-w",
                                f"net.ipv4.tcp_congestion_control={args.cc}"], check=True)
        cc = {testbed.congestion_control(h) for h in bed["hosts"]}

        def once(kind):
            out = os.path.join(root, f"{kind}.jsonl")
            seen = sum(1 for _ in open(out)) if os.path.exists(out) else 0
            subprocess.run(["ip", "netns", "exec", bed["hosts"][0]["netns"], sys.executable, "-m", "collbench", "once",
                            "--config", bed["config"], "--results", out, "--quiet", *ARGS],
                           capture_output=True, text=True, cwd=REPO, check=True)
            for line in list(open(out))[seen:]:
                r = json.loads(line)
                ce = sum(v for k, v in (r.get("congestion") or {}).get("moved", {}).items() if "TCPDeliveredCE" in k)
                rows[kind].append((r["op"], r["latency_avg_us"], ce))
        for i in range(args.runs):
            once("quiet")
            testbed.ecn_mark(bed["dir"], {"h2": args.rate})
            once("marked")
            testbed.ecn_clear(bed["dir"])
            print(f"run {i + 1}/{args.runs}", file=sys.stderr, flush=True)
    finally:
        testbed.down(bed["dir"])
    print(f"{args.hosts} hosts, congestion control {', '.join(sorted(cc))}, h2 marked above {args.rate}, "
          f"{args.runs} runs each, load {os.getloadavg()[0]:.1f}")
    for op in ("alltoall", "allreduce"):
        for kind in ("quiet", "marked"):
            lat = [x for o, x, _ in rows[kind] if o == op]
            ce = [c for o, _, c in rows[kind] if o == op]
            print(f"{op:<10} 1MB {kind:<7} median {statistics.median(lat) / 1e3:7.2f} ms "
                  f"({min(lat) / 1e3:.2f}-{max(lat) / 1e3:.2f}); CE-marked packets per step {min(ce)}-{max(ce)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
