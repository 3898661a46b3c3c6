#!/usr/bin/env python3
"""Throughput and memory of `collbench nccl census` against a naive parser, on generated logs.

Five cases, each generated (default 200 MiB) into a temporary directory:

  perrank      16 ranks on 2 hosts, one file per process as NCCL_DEBUG_FILE=%h.%p writes them, INIT
               lines with commIds (world, tensor-parallel groups of 8, data-parallel pairs), then
               training steps of TP AllGather/ReduceScatter, DP AllReduce buckets, a world AllReduce
               of the loss and, every 4th step, an all-to-all as a Send/Recv group; pointers come from
               a small pool per call site (as PyTorch's caching allocator reuses them)
  interleaved  one file holding every rank of three jobs (32, 16 and 8 ranks; one with `srun
               --label` prefixes), lines interleaved at random as a merged `srun` stdout gives them,
               with fresh buffer addresses on every line (nothing repeats byte for byte)
  comms        one file with many distinct communicators: 16 processes that create a new
               communicator (comm pointer, commId, INIT line) for every two calls
  mixed        logs of many short jobs of nine NCCL/RCCL versions concatenated (2.4 to 2.28 INIT and
               COLL forms, RCCL devRedOp / task+globalrank / acc suffixes, srun, Ray and NCCL timestamp
               prefixes), 4-16 ranks each, a pipeline communicator re-created every 12 steps at recycled
               pointers, every other job in containers (its pids and pointers those of an earlier job)
  fixtures     the repository's fixture logs (tests/fixtures/nccl: every version, wrapper, kernel
               traces, garbage) concatenated again and again: the same pointers of the same pids
               re-initialised every 65 KB, more handles than the census keeps

and measures, each run in a fresh process (--repeat runs of each, alternating):

  census    collbench.nccl.census.run_census over the case's directory (census + desync check)
  naive     one regular expression over every line (the tolerant one of shared/research/nccl.md),
            every match kept in memory, then counted

printing MB/s per CPU second (user+sys of that process: one core, whatever else the machine runs),
wall-clock MB/s and peak RSS as the median and the range of the runs. Targets, per case: census
>= 100 MB/s per CPU second, peak RSS < 100 MB (exit 1 when a case misses them); the line after each
case gives the census' speed as a multiple of the naive parser's (issue 26: at least 1 on every
case). The naive parser's RSS grows with the log.

    .venv/bin/python bench/nccl_census.py                          # every case, 200 MiB each
    .venv/bin/python bench/nccl_census.py --case interleaved --size 1GB --repeat 5
"""

import argparse
import json
import os
import random
import re
import resource
import shutil
import statistics
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


def generate_perrank(directory, total_bytes):
    """One file per process (NCCL_DEBUG_FILE=%h.%p): 16 ranks, pointers from a pool per call site."""
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


# several jobs in one merged stream: (ranks, tensor-parallel size, `srun --label` prefix or not)
INTERLEAVED_JOBS = ((32, 8, True), (16, 4, False), (8, 8, False))


def _interleaved_rank(job, nranks, tp, label, r):
    """(init lines, step function) of rank r of job `job`: every call gets fresh buffer pointers."""
    per_host = 8
    host = f"job{job}-node-{r // per_host:03d}"
    pid = 40000 + 1000 * job + 37 * r
    pre = (f"{r}: " if label else "") + f"{host}:{pid}:{pid + 5} [{r % per_host}] NCCL INFO "
    world, tpc, dp = (0x55f3a0000000 + job * 0x10000000 + r * 0x100000 + k * 0x10000 for k in range(3))
    init = [f"{pre}ncclCommInitRank comm {world:#x} rank {r} nranks {nranks} cudaDev {r % per_host} busId "
            f"{0x18000 + 0x10000 * (r % per_host):x} commId 0x{0x6b1f00d4c0ffee00 + job:016x} - Init COMPLETE",
            f"{pre}ncclCommSplit comm {tpc:#x} rank {r % tp} nranks {tp} cudaDev {r % per_host} parent {world:#x} "
            f"commId 0x{0x7c00 + 0x100 * job + r // tp:016x} - Init COMPLETE",
            f"{pre}ncclCommSplit comm {dp:#x} rank {r // tp} nranks {nranks // tp} cudaDev {r % per_host} "
            f"parent {world:#x} commId 0x{0x9d00 + 0x100 * job + r % tp:016x} - Init COMPLETE"]
    state = {"opc": 0, "ptr": 0x7f0000000000 + job * 0x100000000000 + r * 0x1000000000}
    pre_b = pre.encode()

    def step():
        out = []

        def line(op, count, dt, size, comm, n, inplace, root=0, redop=0):
            state["ptr"] += 0x2000000
            recv = state["ptr"]
            if not inplace:
                send = recv + 0x1000000
            elif op == "AllGather":
                send = recv + (r % tp) * count * size
            elif op == "ReduceScatter":
                send, recv = recv, recv + (r % tp) * count * size
            else:
                send = recv
            out.append(b"%s%s: opCount %x sendbuff %#x recvbuff %#x count %d datatype %d op %d root %d "
                       b"comm %#x [nranks=%d] stream %#x" % (pre_b, op.encode(), state["opc"], send, recv,
                                                             count, dt, redop, root, comm, n, comm + 0x8000))
            state["opc"] += 1
        for layer in range(4):
            line("AllGather", 1048576 + 65536 * layer, 9, 2, tpc, tp, layer % 2 == 0)
            line("ReduceScatter", 1048576 + 65536 * layer, 9, 2, tpc, tp, layer % 2 == 1, redop=0)
        for bucket in range(3):
            line("AllReduce", 6553600, 7, 4, dp, nranks // tp, True)
        line("AllReduce", 1, 7, 4, world, nranks, True, redop=4)
        line("Broadcast", 4096, 0, 1, world, nranks, True)
        return out
    return [x.encode() for x in init], step


def generate_interleaved(directory, total_bytes, seed=5):
    """One file: every rank of several jobs, lines interleaved as a merged `srun` stdout gives them,
    fresh buffer pointers on every call (nothing repeats byte for byte but the configuration)."""
    rnd = random.Random(seed)
    ranks = []
    for job, (nranks, tp, label) in enumerate(INTERLEAVED_JOBS):
        for r in range(nranks):
            ranks.append(_interleaved_rank(job, nranks, tp, label, r))
    size = 0
    with open(os.path.join(directory, "srun-merged.log"), "wb", buffering=1 << 20) as f:
        head = [line for init, _ in ranks for line in init]
        rnd.shuffle(head)
        f.write(b"\n".join(head) + b"\n")
        while size < total_bytes:
            per_rank = [step() for _, step in ranks]
            order = [i for i, lines in enumerate(per_rank) for _ in lines]
            rnd.shuffle(order)
            its = [iter(lines) for lines in per_rank]
            chunk = b"\n".join(next(its[i]) for i in order) + b"\n"
            f.write(chunk)
            size += len(chunk)


COMMS_RANKS = 16


def generate_comms(directory, total_bytes):
    """One file with many distinct communicators: each of 16 processes creates a new communicator
    (its own comm pointer and commId, an INIT line) for every two calls, as a job that splits a
    communicator per step would; about one comm pointer per 700 bytes of log."""
    size = 0
    epoch = 0
    with open(os.path.join(directory, "many-comms.log"), "wb", buffering=1 << 20) as f:
        while size < total_bytes:
            out = []
            for r in range(COMMS_RANKS):
                pre = b"node%02d:%d:%d [%d] NCCL INFO " % (r // 8, 50000 + r, 50000 + r, r % 8)
                comm = 0x560000000000 + epoch * 0x100000 + r * 0x1000
                out.append(b"%sncclCommSplit comm %#x rank %d nranks %d cudaDev %d commId 0x%016x - Init COMPLETE"
                           % (pre, comm, r, COMMS_RANKS, r % 8, 0x1000000 + epoch))
                for k in range(2):
                    buf = 0x7f0000000000 + r * 0x10000000 + (k << 20)
                    out.append(b"%sAllReduce: opCount %x sendbuff %#x recvbuff %#x count %d datatype 7 op 0 root 0 "
                               b"comm %#x [nranks=%d] stream 0x%x" % (pre, 2 * epoch + k, buf, buf, 1024 << k, comm,
                                                                      COMMS_RANKS, 0x7e00 + r))
            chunk = b"\n".join(out) + b"\n"
            f.write(chunk)
            size += len(chunk)
            epoch += 1


# NCCL/RCCL versions of the `mixed` case: (name, INIT line form, COLL line suffix form, prefix form)
# after the format tables of shared/research/nccl.md §1.1-1.3 (INIT lines by version, RCCL suffixes,
# the 2.26+ timestamp, wrapper prefixes)
MIXED_VERSIONS = (
    ("2.4", "2.4", "", ""),
    ("2.12", "2.7", "", "srun"),
    ("2.19", "2.18", "", ""),
    ("2.22", "2.21", "", "ray"),
    ("2.27", "2.24", "", ""),
    ("2.28", "2.24", "", "timestamp"),
    ("rccl-5.2", "2.7", "devredop", ""),
    ("rccl-6.2", "2.18", "task", ""),
    ("rccl-systems", "2.18", "acc", ""),
)


def _mixed_init(form, pre, comm, rank, nranks, dev, comm_id, parent, color):
    bus = f"{0x18000 + 0x10000 * dev:x}"
    if form == "2.4":
        return f"{pre}comm {comm:#x} rank {rank} nranks {nranks} cudaDev {dev} nvmlDev {dev} - Init COMPLETE"
    if form == "2.7":
        return f"{pre}comm {comm:#x} rank {rank} nranks {nranks} cudaDev {dev} busId {bus} - Init COMPLETE"
    if form == "2.18":
        return (f"{pre}comm {comm:#x} rank {rank} nranks {nranks} cudaDev {dev} nvmlDev {dev} busId {bus} "
                f"commId 0x{comm_id:016x} - Init COMPLETE")
    split = parent is not None
    head = f"{pre}{'ncclCommSplit' if split else 'ncclCommInitRank'} comm {comm:#x} rank {rank} nranks {nranks} " \
           f"cudaDev {dev} nvmlDev {dev} busId {bus} "
    if split:
        head += (f"parent {parent:#x} color {color} key {rank} " if form == "2.21" else
                 f"parent {parent:#x} splitCount 1 color {color} key {rank} ")
    return head + f"commId 0x{comm_id:016x} - Init COMPLETE"


def _mixed_job(out, job, budget, rnd):
    """One job of the mixed log (about `budget` bytes): its ranks' lines in the job's NCCL/RCCL version, merged
    as one stream gives them (ranks in random order within each call), other INFO lines between, and
    communicators re-created every few steps at recycled pointers (a re-initialised pointer)."""
    version, init_form, suffix, wrap = MIXED_VERSIONS[job % len(MIXED_VERSIONS)]
    nranks = (8, 16, 4)[job % 3]
    per_host, tp = min(8, nranks), min(4, nranks)
    ranks = []
    for r in range(nranks):
        host = f"v{version.replace('.', '')}-node{r // per_host:02d}"
        # every other job ran in containers: the same small pids on the same pod names, job after job
        pid = 100 + 7 * r if job % 2 else 30000 + 1000 * (job % 40) + 7 * r
        dev = r % per_host
        pre = f"{host}:{pid}:{pid + 3} [{dev}] NCCL INFO "
        if wrap == "srun":
            pre = f"{r}: {pre}"
        elif wrap == "ray":
            pre = f"(RayTrainWorker pid={pid}, ip=10.1.{r // per_host}.{dev + 2}) {pre}"
        # comm pointers repeat from job to job (the allocator of the same program); pids do not
        world, tpc, dp = (0x55aa10000000 + r * 0x1000000 + k * 0x10000 for k in range(3))
        ranks.append({"r": r, "pre": pre, "dev": dev, "world": world, "tp": tpc, "dp": dp, "opc": 0,
                      "pp": None})
    lines = []
    for x in ranks:
        r = x["r"]
        lines.append(_mixed_init(init_form, x["pre"], x["world"], r, nranks, x["dev"], 0xc0ffee0000 + job, None, 0))
        lines.append(f"{x['pre']}Channel 00/02 :    " + " ".join(str(i) for i in range(nranks)))
        lines.append(_mixed_init(init_form, x["pre"], x["tp"], r % tp, tp, x["dev"], 0x7c000000 + 256 * job + r // tp,
                                 x["world"], r // tp))
        lines.append(_mixed_init(init_form, x["pre"], x["dp"], r // tp, nranks // tp, x["dev"],
                                 0x9d000000 + 256 * job + r % tp, x["world"], r % tp))
    step = 0
    ts = 1_748_765_702.137 + job * 3600

    def stamp(texts):          # NCCL_DEBUG_TIMESTAMP_LEVELS=INFO: a new stamp on every line
        nonlocal ts
        if wrap != "timestamp":
            return texts
        out = []
        for t in texts:
            ts += 0.000137
            out.append(time.strftime("[%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}] {t}")
        return out
    lines = stamp(lines)
    size = sum(len(s) + 1 for s in lines)
    out.write("\n".join(lines).encode() + b"\n")

    def coll(x, op, count, dt, redop, root, comm, n, send, recv):
        opc = x["opc"]
        x["opc"] += 1
        mid = "acc (nil) " if suffix == "acc" else ""
        text = (f"{x['pre']}{op}: opCount {opc:x} sendbuff {send} recvbuff {recv} {mid}count {count} datatype {dt} "
                f"op {redop} root {root} comm {comm:#x} [nranks={n}] stream {comm + 0x8000:#x}")
        if suffix == "task":
            text += f" task 0 globalrank {x['rank_of'][comm]}"
        elif suffix == "acc":
            text += f" task 0 globalrank {x['rank_of'][comm]}"
        elif suffix == "devredop":
            text += f" devRedOp {redop} isPtr 0 scaler 0"
        return text
    for x in ranks:
        r = x["r"]
        x["rank_of"] = {x["world"]: r, x["tp"]: r % tp, x["dp"]: r // tp}
    while size < budget:
        calls = []
        if step % 12 == 0:       # a pipeline communicator re-created at one of two recycled pointers
            for x in ranks:
                r = x["r"]
                x["pp"] = 0x55ab00000000 + r * 0x1000000 + ((step // 12) % 2) * 0x40000
                x["rank_of"][x["pp"]] = r
                calls.append((x, _mixed_init(init_form, x["pre"], x["pp"], r, nranks, x["dev"],
                                             0xabc00000 + 4096 * job + step, x["world"], 0)))
        for layer in range(4):
            for x in ranks:
                r = x["r"]
                base = 0x7f0000000000 + r * 0x10000000000 + layer * 0x10000000 + (step % 2) * 0x4000000
                count = 1048576 + 65536 * layer
                send = f"{base + (r % tp) * count * 2:#x}" if layer % 2 == 0 else f"{base + 0x2000000:#x}"
                calls.append((x, coll(x, "AllGather", count, 9, 0, 0, x["tp"], tp, send, f"{base:#x}")))
            for x in ranks:
                r = x["r"]
                base = 0x7f0000000000 + r * 0x10000000000 + (4 + layer) * 0x10000000
                calls.append((x, coll(x, "ReduceScatter", 1048576 + 65536 * layer, 9, 0, 0, x["tp"], tp,
                                      f"{base:#x}", f"{base + 0x4000000:#x}")))
        for bucket in range(3):
            for x in ranks:
                buf = f"{0x7e0000000000 + x['r'] * 0x1000000000 + bucket * 0x10000000:#x}"
                calls.append((x, coll(x, "AllReduce", 6553600 if bucket < 2 else 1193046, 7, 0, 0, x["dp"],
                                      nranks // tp, buf, buf)))
        for x in ranks:
            buf = f"{0x7d0000000000 + x['r'] * 0x1000:#x}"
            calls.append((x, coll(x, "AllReduce", 1, 7, 4 if version not in ("2.4", "rccl-5.2") else 0, 0,
                                  x["world"], nranks, buf, buf)))
        for x in ranks:         # pipeline: send to the next rank, receive from the previous one
            r = x["r"]
            if version == "2.4":    # no Send/Recv before 2.7: a broadcast instead
                buf = f"{0x7c0000000000 + r * 0x100000:#x}"
                calls.append((x, coll(x, "Broadcast", 262144, 9, 0, 0, x["pp"], nranks, buf, buf)))
                continue
            calls.append((x, coll(x, "Send", 262144, 9, 0, (r + 1) % nranks, x["pp"], nranks, "(nil)",
                                  f"{0x7c0000000000 + r * 0x100000:#x}")))
            calls.append((x, coll(x, "Recv", 262144, 9, 0, (r - 1) % nranks, x["pp"], nranks, "(nil)",
                                  f"{0x7c1000000000 + r * 0x100000:#x}")))
        if version == "2.28":
            for x in ranks[:1]:
                calls.append((x, f"{x['pre']}AllReduce: 4 Bytes -> Algo TREE proto LL channel{{Lo..Hi}}={{0..1}}"))
        # ranks print at their own pace: each call's lines in random rank order
        chunk_lines = []
        i = 0
        while i < len(calls):
            j = i + nranks
            group = calls[i:j]
            rnd.shuffle(group)
            chunk_lines += [t for _, t in group]
            i = j
        if step % 50 == 0:
            chunk_lines.append(f"[rank0] step {step} loss 2.{step % 9999:04d} lr 3e-4")
        chunk_lines = stamp(chunk_lines)
        data = ("\n".join(chunk_lines) + "\n").encode()
        out.write(data)
        size += len(data)
        step += 1
    return size


def generate_mixed(directory, total_bytes, seed=7):
    """One file: logs of many jobs of nine NCCL/RCCL versions concatenated, each in its version's INIT
    and COLL forms (2.4 to 2.28, RCCL 5.x devRedOp, 6.x task/globalrank, rocm-systems acc; srun, Ray
    and timestamp prefixes), 4-16 ranks, TP/DP/world communicators and a pipeline communicator
    re-created every 12 steps at one of two recycled pointers: thousands of rank handles, re-initialised
    pointers, comm pointers that repeat from job to job; every other job in containers (the same pids
    and hosts as the job of its version before it, so its INIT lines re-initialise those handles)."""
    rnd = random.Random(seed)
    size = 0
    job = 0
    per_job = 512 << 10
    with open(os.path.join(directory, "mixed-versions.log"), "wb", buffering=1 << 20) as f:
        while size < total_bytes:
            size += _mixed_job(f, job, min(per_job, total_bytes - size), rnd)
            job += 1


FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures", "nccl")


def generate_fixtures(directory, total_bytes):
    """One file: the repository's NCCL/RCCL fixture logs (tests/fixtures/nccl: every version and wrapper
    the parser knows, kernel traces, garbage) concatenated, again and again: every repetition
    re-initialises the same pointers of the same pids, so handles are made and closed throughout."""
    names = sorted(n for n in os.listdir(FIXTURES) if n.endswith(".log"))
    data = b"".join(open(os.path.join(FIXTURES, n), "rb").read() for n in names)
    size = 0
    with open(os.path.join(directory, "fixtures-concatenated.log"), "wb", buffering=1 << 20) as f:
        while size < total_bytes:
            f.write(data)
            size += len(data)


CASES = {"perrank": generate_perrank, "interleaved": generate_interleaved, "comms": generate_comms,
         "mixed": generate_mixed, "fixtures": generate_fixtures}


def child(mode, directory):
    """Run `mode` once in this (fresh) process: its CPU and wall time, and its peak RSS."""
    got = run_once(mode, directory)
    got["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(got))


def run_once(mode, directory):
    paths = sorted(os.path.join(directory, n) for n in os.listdir(directory))
    nbytes = sum(os.path.getsize(p) for p in paths)
    if mode == "census":
        from collbench.nccl.census import run_census     # imported before the clock starts
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if mode == "census":
        c = run_census([directory])
        doc = c.document()
        summary = {"lines": doc["lines"], "collective_lines": doc["collective_lines"], "groups": len(doc["groups"]),
                   "desync": len(doc["desync"]), "untracked": doc.get("untracked_lines", 0)}
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
        summary = {"lines": lines, "collective_lines": len(records), "groups": len(groups), "desync": None,
                   "untracked": 0}
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


def measure(mode, directory):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, directory],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(values, fmt):
    """median (min-max) of the repeats."""
    values = sorted(values)
    return f"{fmt % statistics.median(values)} ({fmt % values[0]}-{fmt % values[-1]})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="200MB", help="log size to generate per case (binary units: 200MB, 1GB)")
    ap.add_argument("--case", default=",".join(CASES),
                    help=f"comma-separated cases to generate and measure (default all: {', '.join(CASES)})")
    ap.add_argument("--dir", help="generate into this directory (default: a temporary one, removed after)")
    ap.add_argument("--skip-naive", action="store_true", help="measure only the census")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each parser per case, each in a fresh process (default 3); the median and "
                         "the range are printed")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1])
        return 0
    cases = [c.strip() for c in args.case.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases or args.repeat < 1:
        ap.error(f"--case: expected some of {', '.join(CASES)}; --repeat: at least 1")
    total = parse_size(args.size, max_bytes=1 << 40)
    base = args.dir or tempfile.mkdtemp(prefix="collbench-nccl-bench.")
    os.makedirs(base, exist_ok=True)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, Python loop "
          f"{calibration():.1f} M iterations per CPU second; {args.repeat} runs of each parser per case, "
          f"each in a fresh process: median (min-max)")
    failed = []
    try:
        for case in cases:
            tmp = os.path.join(base, case)
            os.makedirs(tmp, exist_ok=True)
            t0 = time.perf_counter()
            CASES[case](tmp, total)
            names = os.listdir(tmp)
            size = sum(os.path.getsize(os.path.join(tmp, n)) for n in names)
            print(f"\n== {case}: generated {size / 2**20:.0f} MiB in {len(names)} file(s) "
                  f"({time.perf_counter() - t0:.1f} s)")
            modes = ["census"] + ([] if args.skip_naive else ["naive"])
            runs = {m: [] for m in modes}
            for _ in range(args.repeat):        # alternate, so that a change of load hits both
                for m in modes:
                    runs[m].append(measure(m, tmp))
            print(f"{'':8s} {'MB/s per CPU s':>22s} {'MB/s wall':>20s} {'peak RSS MB':>20s} {'lines':>9s} "
                  f"{'coll lines':>10s} {'groups':>6s}")
            for m in modes:
                rs = runs[m]
                print(f"{m:8s} {spread([r['bytes'] / r['cpu'] / 1e6 for r in rs], '%.1f'):>22s} "
                      f"{spread([r['bytes'] / r['wall'] / 1e6 for r in rs], '%.1f'):>20s} "
                      f"{spread([r['rss_mb'] for r in rs], '%.1f'):>20s} {rs[0]['lines']:9d} "
                      f"{rs[0]['collective_lines']:10d} {rs[0]['groups']:6d}")
            c = runs["census"]
            mbps = statistics.median(r["bytes"] / r["cpu"] / 1e6 for r in c)
            rss = max(r["rss_mb"] for r in c)
            ok = mbps >= TARGET_MBPS and rss < TARGET_RSS_MB
            line = (f"census {case}: median {mbps:.1f} MB/s per CPU second (target >= {TARGET_MBPS:.0f}), "
                    f"peak RSS at most {rss:.1f} MB (target < {TARGET_RSS_MB:.0f}): {'met' if ok else 'MISSED'}; "
                    f"desync findings {c[0]['desync']}, untracked lines {c[0]['untracked']}")
            if "naive" in runs:
                n = runs["naive"]
                nmbps = statistics.median(r["bytes"] / r["cpu"] / 1e6 for r in n)
                line += f"; vs naive: {mbps / nmbps:.2f}x the speed"
                if n[0]["collective_lines"] != c[0]["collective_lines"] + c[0]["untracked"]:
                    line += f" (COLL lines differ: naive {n[0]['collective_lines']})"
            print(line)
            if not ok:
                failed.append(case)
            if not args.dir:
                shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
