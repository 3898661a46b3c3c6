#!/usr/bin/env python3
"""Throughput and memory of `collbench nccl census` against a naive parser, on a generated log.

Generates a multi-rank NCCL log (default 1 GiB) into a temporary directory: 16 ranks on 2 hosts,
one file per process as NCCL_DEBUG_FILE=%h.%p writes them, INIT lines with commIds (world,
tensor-parallel groups of 8, data-parallel pairs), then training steps of TP AllGather/ReduceScatter,
DP AllReduce buckets, a world AllReduce of the loss and, every 4th step, an all-to-all as a
Send/Recv group; pointers come from a small pool per call site (as PyTorch's caching allocator
reuses them) and opCount counts up. Then, each in its own process, measures:

  census    collbench.nccl.census.run_census over the directory (census + desync check)
  naive     one regular expression over every line (the tolerant one of shared/research/nccl.md),
            every match kept in memory, then counted

and prints MB/s per CPU second (user+sys of that process: one core, whatever else the machine
runs; the best of --repeat runs), wall-clock MB/s, and peak RSS. Targets: census >= 100 MB/s,
peak RSS < 100 MB. The naive parser's RSS grows with the log (about 4 GB at 1 GiB).

    .venv/bin/python bench/nccl_census.py                # 1 GiB
    .venv/bin/python bench/nccl_census.py --size 256MB   # smaller, e.g. on a loaded machine
"""

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from collbench.sizes import parse_size  # noqa: E402

NRANKS, PER_HOST, TP = 16, 8, 8
TARGET_MBPS, TARGET_RSS_MB = 100.0, 100.0

# the tolerant regex of shared/research/nccl.md §1 (named groups), searched on every line
NAIVE = re.compile(
    rb"(?P<host>[^\s:()`]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO (?:\[\d+\] )?(?P<op>[A-Za-z]+): "
    rb"opCount (?P<opcount>[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) recvbuff (?P<recvbuff>\S+)(?: acc (?P<acc>\S+))? "
    rb"count (?P<count>\d+)(?: size \d+)? datatype (?P<dtype>-?\d+) op (?P<redop>-?\d+)(?: root (?P<root>-?\d+))? "
    rb"comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)"
    rb"(?: task (?P<task>\d+) globalrank (?P<grank>\d+))?"
    rb"(?: devRedOp (?P<devredop>\d+) isPtr (?P<isptr>\d+) scaler (?P<scaler>[0-9a-fA-F]+))?")


def rank_templates(r):
    """(init lines, per-step line templates with %x for opCount) of rank r."""
    host = f"gpu-node-{r // PER_HOST:03d}"
    pid = 181000 + 37 * r
    pre = f"{host}:{pid}:{pid} [{r % PER_HOST}] NCCL INFO "
    world, tp, dp = (hex(0x55f3a0000000 + r * 0x100000 + k * 0x10000) for k in range(3))
    streams = {c: hex(int(c, 16) + 0x8000) for c in (world, tp, dp)}
    init = [f"{pre}NCCL version 2.23.4+cuda12.4",
            f"{pre}Bootstrap : Using ib0:10.12.{r // PER_HOST}.{r % PER_HOST + 10}<0>",
            f"{pre}ncclCommInitRank comm {world} rank {r} nranks {NRANKS} cudaDev {r % PER_HOST} nvmlDev "
            f"{r % PER_HOST} busId {0x18000 + 0x10000 * (r % PER_HOST):x} commId 0x6b1f00d4c0ffee01 - Init COMPLETE",
            f"{pre}ncclCommSplit comm {tp} rank {r % TP} nranks {TP} cudaDev {r % PER_HOST} nvmlDev {r % PER_HOST} "
            f"busId {0x18000 + 0x10000 * (r % PER_HOST):x} parent {world} splitCount 1 color {r // TP} key {r % TP} "
            f"commId 0x{0x7c00 + r // TP:016x} - Init COMPLETE",
            f"{pre}ncclCommSplit comm {dp} rank {r // TP} nranks {NRANKS // TP} cudaDev {r % PER_HOST} nvmlDev "
            f"{r % PER_HOST} busId {0x18000 + 0x10000 * (r % PER_HOST):x} parent {world} splitCount 2 color "
            f"{r % TP} key {r // TP} commId 0x{0x9d00 + r % TP:016x} - Init COMPLETE",
            f"{pre}Channel 00/24 :    0   1   2   3   4   5   6   7"]
    steps = []
    for step in range(4):           # four step shapes, repeated; pointers from a pool per call site
        t = []

        def line(op, count, dt, redop, root, comm, nranks, inplace, site):
            base = 0x7f2a00000000 + r * 0x1000000000 + site * 0x4000000 + (step % 2) * 0x200000
            send = hex(base)
            recv = send if inplace else hex(base + 0x100000)
            if op == "AllGather" and inplace:
                send = hex(base + (r % TP) * count * 2)
            t.append(f"{pre}{op}: opCount %x sendbuff {send} recvbuff {recv} count {count} datatype {dt} "
                     f"op {redop} root {root} comm {comm} [nranks={nranks}] stream {streams[comm]}")
        for layer in range(6):
            line("AllGather", 2097152 + 65536 * layer, 9, 0, 0, tp, TP, layer % 2 == 0, layer)
        for layer in range(6):
            line("ReduceScatter", 2097152 + 65536 * layer, 9, 0, 0, tp, TP, False, 10 + layer)
        for bucket in range(4):
            line("AllReduce", 6553600 if bucket < 3 else 1193046, 7, 0, 0, dp, NRANKS // TP, True, 20 + bucket)
        line("AllReduce", 1, 7, 4, 0, world, NRANKS, True, 30)
        if step == 3:
            for j in range(NRANKS):
                peer = (r + j) % NRANKS
                t.append(f"{pre}Send: opCount %x sendbuff (nil) recvbuff {hex(0x7e0000000000 + peer * 0x100000)} "
                         f"count 262144 datatype 9 op 0 root {peer} comm {world} [nranks={NRANKS}] "
                         f"stream {streams[world]}")
                t.append(f"{pre}Recv: opCount %x sendbuff (nil) recvbuff {hex(0x7e1000000000 + peer * 0x100000)} "
                         f"count 262144 datatype 9 op 0 root {peer} comm {world} [nranks={NRANKS}] "
                         f"stream {streams[world]}")
        steps.append([s.encode() for s in t])
    return host, pid, [s.encode() for s in init], steps


def generate(directory, total_bytes):
    per_rank = total_bytes // NRANKS
    for r in range(NRANKS):
        host, pid, init, steps = rank_templates(r)
        opc = 0
        size = 0
        with open(os.path.join(directory, f"{host}.{pid}.log"), "wb", buffering=1 << 20) as f:
            head = b"\n".join(init) + b"\n"
            f.write(head)
            size += len(head)
            step = 0
            while size < per_rank:
                out = []
                for tmpl in steps[step % 4]:
                    out.append(tmpl % opc)
                    opc += 1
                if step % 500 == 0:
                    out.append(b"[rank%d] step %d loss 2.%04d lr 3e-4 tokens/s 41250" % (r, step, step % 9999))
                chunk = b"\n".join(out) + b"\n"
                f.write(chunk)
                size += len(chunk)
                step += 1


def child(mode, directory, repeat):
    """Run `mode` repeat times in this process; the best run's CPU and wall time, the peak RSS."""
    best = None
    for _ in range(repeat):
        got = run_once(mode, directory)
        if best is None or got["cpu"] < best["cpu"]:
            best = got
    best["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(best))


def run_once(mode, directory):
    paths = sorted(os.path.join(directory, n) for n in os.listdir(directory))
    nbytes = sum(os.path.getsize(p) for p in paths)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if mode == "census":
        from collbench.nccl.census import run_census
        c = run_census([directory])
        doc = c.document()
        summary = {"lines": doc["lines"], "collective_lines": doc["collective_lines"], "groups": len(doc["groups"]),
                   "desync": len(doc["desync"])}
    else:
        records = []
        lines = 0
        for p in paths:
            with open(p, "rb") as f:
                for line in f:
                    lines += 1
                    m = NAIVE.search(line)
                    if m:
                        records.append(m.groups())
        groups = {}
        for g in records:
            key = (g[4], g[9], g[10], g[11], g[14], g[6] == g[7])
            groups[key] = groups.get(key, 0) + 1
        summary = {"lines": lines, "collective_lines": len(records), "groups": len(groups), "desync": None}
        del records
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    summary.update(bytes=nbytes, cpu=ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime, wall=wall)
    return summary


def calibration():
    """Millions of trivial interpreter loop iterations per CPU second: how fast this core runs Python
    right now (a few years old desktop core does about 25-30)."""
    t0 = time.process_time()
    x = 0
    for i in range(3_000_000):
        x += i
    return 3.0 / (time.process_time() - t0)


def measure(mode, directory, repeat):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, directory, str(repeat)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1GB", help="log size to generate (binary units: 256MB, 1GB)")
    ap.add_argument("--dir", help="generate into this directory (default: a temporary one, removed after)")
    ap.add_argument("--skip-naive", action="store_true", help="measure only the census")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each parser; the best CPU time counts (default 3; other load only slows runs down)")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "DIR", "REPEAT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    total = parse_size(args.size, max_bytes=1 << 40)
    tmp = args.dir or tempfile.mkdtemp(prefix="collbench-nccl-bench.")
    os.makedirs(tmp, exist_ok=True)
    try:
        t0 = time.perf_counter()
        generate(tmp, total)
        size = sum(os.path.getsize(os.path.join(tmp, n)) for n in os.listdir(tmp))
        print(f"generated {size / 2**20:.0f} MiB in {NRANKS} per-rank files ({time.perf_counter() - t0:.1f} s) "
              f"in {tmp}")
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, Python loop "
              f"{calibration():.1f} M iterations per CPU second; best of {args.repeat} runs each")
        rows = [("census", measure("census", tmp, args.repeat))]
        if not args.skip_naive:
            rows.append(("naive", measure("naive", tmp, args.repeat)))
        print(f"{'':8s} {'MB/s/cpu':>9s} {'MB/s wall':>9s} {'cpu s':>7s} {'peak RSS':>9s} {'lines':>10s} "
              f"{'coll lines':>10s} {'groups':>6s}")
        for name, m in rows:
            print(f"{name:8s} {m['bytes'] / m['cpu'] / 1e6:9.1f} {m['bytes'] / m['wall'] / 1e6:9.1f} {m['cpu']:7.1f} "
                  f"{m['rss_mb']:7.1f}MB {m['lines']:10d} {m['collective_lines']:10d} {m['groups']:6d}")
        census = rows[0][1]
        mbps = census["bytes"] / census["cpu"] / 1e6
        line = (f"census: {mbps:.1f} MB/s per CPU second (target >= {TARGET_MBPS:.0f}), peak RSS "
                f"{census['rss_mb']:.1f} MB (target < {TARGET_RSS_MB:.0f}), desync findings {census['desync']}")
        if len(rows) > 1:
            naive = rows[1][1]
            line += (f"; vs naive: {mbps / (naive['bytes'] / naive['cpu'] / 1e6):.1f}x faster, "
                     f"{naive['rss_mb'] / census['rss_mb']:.1f}x less memory")
            if naive["collective_lines"] != census["collective_lines"]:
                line += f" (COLL lines differ: naive {naive['collective_lines']})"
        print(line)
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
