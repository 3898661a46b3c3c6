#!/usr/bin/env python3
"""The exporter's cost of following a job's NCCL Inspector directory (collectors/inspector.py),
with a job of 1,024 communicators on the host, beside baselines measured in the same run:

  1. cost per Inspector record read: the collector's poll over fresh lines (read, checked,
     deduplicated, observed, change-point tested) per record, against the floor of json.loads
     of the same lines alone;
  2. a steady scrape: one dump of every communicator (1,024 new records) read and the whole
     exposition rendered, against the same exporter's scrape without the collector (netstat only);
  3. the exposition alone with the default top-k (20 communicators exported) and with every
     communicator exported (top-k 1024): the series bound's worth.

The job: 8 processes (GPUs) on the host, 128 communicators each (1,024), AllReduce and AllGather
of 64 KB .. 256 MB, the 2.30 writer (lab/inspector_writer.py: the plugin's lines). Every figure is
the median of --rounds rounds with its min..max.

    .venv/bin/python bench/inspector_bench.py [--records-per-comm 50] [--rounds 5]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from collbench.exporter.collectors import CollectorSet  # noqa: E402
from collbench.exporter.collectors.inspector import InspectorCollector  # noqa: E402
from collbench.exporter.collectors.netstat import NetstatCollector  # noqa: E402
from lab.inspector_writer import InspectorWriter  # noqa: E402

PROCS, COMMS_PER_PROC = 8, 128
SIZES = [64 << 10, 1 << 20, 16 << 20, 256 << 20]


class Clock:
    def __init__(self):
        self.t = time.time()

    def __call__(self):
        return self.t


def write_job(d, clock, per_comm, sn0=0):
    """Every communicator's next `per_comm` collectives, one dump per process."""
    for p in range(PROCS):
        w = InspectorWriter(d, "node1", 1000 + p, shape="2.30", clock=clock)
        w.opened = os.path.exists(w.path)
        for c in range(COMMS_PER_PROC):
            cid = p * COMMS_PER_PROC + c
            for i in range(per_comm):
                sn = sn0 + i + 1
                func = "AllReduce" if cid % 2 else "AllGather"
                w.record(comm_id=f"0x{0x10000000000000 + cid:x}", comm_name=f"comm{cid}", rank=p, n_ranks=64,
                         nnodes=8, func=func, sn=sn, msg_bytes=SIZES[cid % len(SIZES)],
                         exec_us=500 + (cid % 97) + (sn % 7))
        w.dump()


def spread(xs, scale=1.0, unit=""):
    xs = sorted(x * scale for x in xs)
    return f"{statistics.median(xs):.3g}{unit} (min {xs[0]:.3g} .. max {xs[-1]:.3g}, n={len(xs)})"


def registry_of(*collectors):
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CollectorSet(collectors))
    return reg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records-per-comm", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    per_record, floor, steady, steady_base, expo20, expo_all = [], [], [], [], [], []
    for _ in range(args.rounds):
        d = tempfile.mkdtemp(prefix="inspector-bench-")
        try:
            clock = Clock()
            col = InspectorCollector(d, window_s=3600, top_k=20, clock=clock)
            col.poll()                     # following the directory before the job writes
            write_job(d, clock, args.records_per_comm)
            files = sorted(os.path.join(d, f) for f in os.listdir(d))
            lines = [line for f in files for line in open(f, "rb")]
            n = len(lines)
            t0 = time.perf_counter()
            for line in lines:
                json.loads(line)
            floor.append((time.perf_counter() - t0) / n)
            t0, got = time.perf_counter(), 0
            while got < n:                 # MAX_READ bytes a poll
                got += col.poll()
            per_record.append((time.perf_counter() - t0) / got)
            assert got == n and col.bad_lines == 0, (got, n)
            reg = registry_of(col)
            base = registry_of(NetstatCollector())
            # steady: one dump of every communicator, then a scrape (read + render)
            for k in range(3):
                write_job(d, clock, 1, sn0=args.records_per_comm + k)
                t0 = time.perf_counter()
                text = generate_latest(reg)
                steady.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                generate_latest(base)
                steady_base.append(time.perf_counter() - t0)
            assert b"collbench_inspector_latency_seconds" in text
            t0 = time.perf_counter()
            generate_latest(reg)
            expo20.append(time.perf_counter() - t0)
            col.top_k = 1024
            t0 = time.perf_counter()
            full = generate_latest(reg)
            expo_all.append(time.perf_counter() - t0)
        finally:
            shutil.rmtree(d)
    print(f"job: {PROCS} processes x {COMMS_PER_PROC} communicators = {PROCS * COMMS_PER_PROC} communicators, "
          f"{args.records_per_comm} records each first ({n} lines, {sum(len(x) for x in lines) / n:.0f} bytes/line)")
    print(f"1. cost per record, collector poll:        {spread(per_record, 1e6, ' us')}")
    print(f"   baseline: json.loads of the line alone: {spread(floor, 1e6, ' us')}")
    print(f"2. scrape with one new dump of 1024 comms: {spread(steady, 1e3, ' ms')}")
    print(f"   baseline: scrape without the collector: {spread(steady_base, 1e3, ' ms')}")
    print(f"3. exposition, top-k 20 (default):         {spread(expo20, 1e3, ' ms')} ({len(text)} bytes)")
    print(f"   exposition, every communicator:         {spread(expo_all, 1e3, ' ms')} ({len(full)} bytes)")


if __name__ == "__main__":
    main()
