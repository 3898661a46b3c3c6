#!/usr/bin/env python3
"""What reading the congestion counters around every step costs (issue 20; docs/CONGESTION.md).

1. One snapshot of one host: two RDMA ports' worth of counters (the mlx5 fixture tree: two
   devices, hw_counters and counters each), two netdevs' `ethtool -S` statistics (fixture files)
   and the kernel's /proc/net/netstat. Measured where it runs: the built-in engine reports each
   after-step snapshot's time in its CBCONG line (a real mpirun job of --loop steps), once with
   the counters as plain fixture files (opened by name on every read) and once with each counter
   a link to a real sysfs file (held open, read with pread: the engine's path on a real host); the
   Python reader (the OSU engine's, once per whole OSU run) is timed in-process. Beside them, in
   the same run, the floors: one open/read/close of one counter file, and of /proc/net/netstat.
   Target: < 100 µs per snapshot.
2. The stress duty cycle with snapshots off and on (bench/duty_cycle.py's measure: the share of
   wall time inside the steps' [t_start, t_end]), alternating off/on windows so drift and the
   machine's other load fall on both; beside it, the snapshots' own time per window (one per
   step: a step's after-snapshot is the next step's before). Target: loss < 1 %. The loss
   depends on the step length: --scale 1 is the stress plan as the daemon runs it, --scale 10
   (default) steps ten times shorter.
3. The per-peer read (engines/engine_paths.c: tcp_info of the TCP sockets by netlink inet_diag,
   TCP transports), on a 2-host namespace testbed (root): its own time per snapshot ("pus" in
   CBCONG): the engine's way (a dump the kernel filters to the job's peers, then lookups of
   those sockets by id) beside the baseline of a full dump at every snapshot, with the
   namespace's own sockets and with --sockets more idle loopback connections; then the duty
   cycle of --loops plan loops per job with the per-peer read off/on.

    .venv/bin/python bench/congestion_overhead.py                   # 3 rounds of 10 s windows
    .venv/bin/python bench/congestion_overhead.py --rounds 5 --seconds 20
    .venv/bin/python bench/congestion_overhead.py --only paths --snapshots 500 --rounds 5
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from collbench.config import Step, load_config  # noqa: E402
from collbench.congestion.snapshot import HostReader  # noqa: E402
from collbench.congestion import sources  # noqa: E402
from collbench.engines import builtin  # noqa: E402
from collbench.engines.build import ensure_engine  # noqa: E402
from duty_cycle import bench_plan, run_window  # noqa: E402

FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")


def fixture_host(root):
    sysfs = os.path.join(root, "sys")
    shutil.copytree(os.path.join(FIXTURES, "sysfs-mlx5"), sysfs, symlinks=True)
    eth = os.path.join(root, "eth")
    os.makedirs(eth)
    for netdev in ("ens1f0np0", "ens1f1np1"):
        shutil.copy(os.path.join(FIXTURES, "ethtool", f"mlx5_{netdev}.txt"), os.path.join(eth, netdev))
    return sysfs, eth


def sysfs_backed_host(root, plain_sysfs):
    """The same two ports' counter names, each a link to a real sysfs file (the kernel's network
    statistics): the engine then takes its sysfs path (held descriptors, pread). This is sysfs's
    own cost; an mlx5 driver adds its firmware query per hw_counters read, which no machine
    without the NIC can measure."""
    stats = sorted(glob.glob("/sys/class/net/*/statistics/*"))
    if not stats:
        return None
    sysfs, i = os.path.join(root, "sysfs-backed"), 0
    for sub in glob.glob(os.path.join(plain_sysfs, "class/infiniband/*/ports/*/*counters")):
        target = os.path.join(sysfs, os.path.relpath(sub, plain_sysfs))
        os.makedirs(target)
        for name in sorted(os.listdir(sub)):
            os.symlink(stats[i % len(stats)], os.path.join(target, name))
            i += 1
    return sysfs


def spread(values):
    v = sorted(values)
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))]   # noqa: E731
    return f"median {statistics.median(v):7.1f}  p10 {q(0.1):7.1f}  p90 {q(0.9):7.1f}  max {v[-1]:8.1f}  (n={len(v)})"


def engine_snapshot_us(cfg, loops, workdir, field="us"):
    """The engine's own after-step snapshot times (µs) over `loops` barrier steps (field "pus":
    the per-peer read's)."""
    argv, env = builtin.engine_command(cfg, [Step("barrier", 0, 1, 0, "char")], os.path.join(workdir, "plan.txt"),
                                       loop=True, max_loops=loops)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"engine failed: {out.stderr[-2000:]}")
    us = []
    for line in out.stdout.splitlines():
        if line.startswith("CBCONG "):
            for h in json.loads(line[7:])["hosts"].values():
                us.append(h[field])
    return us[10:]   # the first snapshots list the directories cold


def python_snapshot_us(src, n):
    reader = HostReader(src)
    reader.snapshot()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        reader.snapshot()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def one_file_us(path, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, 64)
        os.close(fd)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


HOLDER = """
import socket, sys, time
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1024)
held = []
for _ in range(int(sys.argv[1])):
    c = socket.create_connection(server.getsockname()); s, _ = server.accept(); held += [c, s]
print("ready", flush=True)
time.sleep(3600)
"""


def testbed_job(desc, cfg, steps, work, loops, env=None):
    """The engine's CBCONG and CBREC payloads of one --loop job on the testbed, launched from h1."""
    argv, job_env = builtin.engine_command(cfg, steps, os.path.join(work, "plan.txt"), loop=True, max_loops=loops)
    out = subprocess.run(["ip", "netns", "exec", desc["hosts"][0]["netns"], *argv], env={**job_env, **(env or {})},
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"engine failed: {out.stderr[-2000:]}")
    cong = [json.loads(ln[7:]) for ln in out.stdout.splitlines() if ln.startswith("CBCONG ")]
    recs = [json.loads(ln[6:]) for ln in out.stdout.splitlines() if ln.startswith("CBREC ")]
    return cong, recs


def _field_us(cong, field):
    return [h.get(field, 0.0) for c in cong[10:] for h in c["hosts"].values()]


def _duty(recs):
    """Share of the job's wall time (first step's start to last step's end) inside the steps."""
    busy = sum(r["t_end"] - r["t_start"] for r in recs)
    return busy / (recs[-1]["t_end"] - recs[0]["t_start"])


def paths_section(args, work):
    """Per-peer read on a 2-host namespace testbed (one rank per host over TCP): its cost, and a
    full dump's at every snapshot beside it, with the namespace's own sockets and with --sockets
    idle loopback connections more; then the duty cycle with the per-peer read off and on."""
    from lab import testbed
    if os.geteuid() != 0:
        print("per-peer read: needs root (a namespace testbed); skipped")
        return
    desc = testbed.up(2, os.path.join(work, "tb"), python=sys.executable)
    holder = None
    try:
        cfg = load_config(desc["config"])
        cfg.congestion.enabled, cfg.congestion.paths = True, True
        barrier = [Step("barrier", 0, 1, 0, "char")]
        h1 = desc["hosts"][0]["netns"]
        print(f"per-peer read (tcp_info by netlink inet_diag), µs per snapshot, 2-host testbed, "
              f"{args.snapshots} barrier steps:")
        for extra in (0, args.sockets):
            if extra:
                holder = subprocess.Popen(["ip", "netns", "exec", h1, sys.executable, "-c", HOLDER, str(extra)],
                                          stdout=subprocess.PIPE, text=True)
                holder.stdout.readline()
            for label, env in (("engine (lookups; filtered dumps)", None),
                               ("baseline: dump all, every step", {"COLLBENCH_ENGINE_PATHS_NAIVE": "1"})):
                cong, _ = testbed_job(desc, cfg, barrier, work, args.snapshots, env)
                print(f"  +{2 * extra:5d} idle sockets, {label:<32} {spread(_field_us(cong, 'pus'))}", flush=True)
        cong, _ = testbed_job(desc, cfg, barrier, work, args.snapshots)
        print(f"  beside it, the host counters' snapshot              {spread(_field_us(cong, 'us'))}")
        plan = bench_plan("scaled", args.scale)
        print(f"duty cycle, {len(plan)}-step plan (iterations / {args.scale}) x {args.loops} loops per job, "
              f"per-peer read off/on alternating, order swapped each round (+{2 * args.sockets} idle sockets on h1, "
              f"filtered):")
        duty = {False: [], True: []}
        for rnd in range(args.rounds):
            for on in ((False, True) if rnd % 2 == 0 else (True, False)):   # neither always second
                cfg.congestion.paths = on
                cong, recs = testbed_job(desc, cfg, plan, work, args.loops)
                duty[on].append(_duty(recs))
                share = sum(_field_us(cong, "pus")) * 1e-6 / (recs[-1]["t_end"] - recs[0]["t_start"]) * 100
                print(f"  round {rnd + 1} per-peer {'on ' if on else 'off'}  duty cycle {duty[on][-1]:.4f}  "
                      f"{len(recs)} steps" + (f"  (per-peer reads: {share:.3f} % of the job's wall time)" if on else ""),
                      flush=True)
        losses = [(off - on) / off * 100 for off, on in zip(duty[False], duty[True])]
        print(f"  off: median {statistics.median(duty[False]):.4f} (min {min(duty[False]):.4f}, max {max(duty[False]):.4f})")
        print(f"  on:  median {statistics.median(duty[True]):.4f} (min {min(duty[True]):.4f}, max {max(duty[True]):.4f})")
        print(f"  loss per round, %: {', '.join(f'{x:+.2f}' for x in losses)}; median {statistics.median(losses):+.2f} "
              f"(measured difference, machine noise included)")
        with open("/proc/loadavg") as f:
            print(f"  load average: {f.read().split()[0]}")
    finally:
        if holder:
            holder.kill()
            holder.wait()
        testbed.down(desc["dir"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="collbench config (default: this machine, shm)")
    p.add_argument("--np", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--snapshots", type=int, default=2000, help="snapshots timed (default 2000)")
    p.add_argument("--rounds", type=int, default=3, help="off/on window pairs (default 3)")
    p.add_argument("--seconds", type=float, default=10.0, help="window per mode and round (default 10)")
    p.add_argument("--scale", type=int, default=10, help="iteration divisor of the prototype plan (default 10)")
    p.add_argument("--sockets", type=int, default=500, help="idle loopback connections for the per-peer read (default 500)")
    p.add_argument("--loops", type=int, default=3, help="plan loops per job in the per-peer duty cycle (default 3)")
    p.add_argument("--only", choices=("host", "paths"), help="run only the host counters' part or the per-peer part")
    args = p.parse_args()

    work = tempfile.mkdtemp(prefix="collbench-congestion-bench-")
    try:
        sysfs, eth = fixture_host(work)
        cfg = load_config(args.config)
        cfg.ranks = args.np
        cfg.stress.backoff_initial = 1.0
        ensure_engine(cfg)
        if args.only == "paths":
            paths_section(args, work)
            return 0
        src = sources.HostSources(sysfs, "/proc/net/netstat", eth)
        n_counters = len(HostReader(src).snapshot().values)
        print(f"one host: {n_counters} counters (2 RDMA ports' hw_counters + counters, 2 netdevs' ethtool "
              f"statistics, /proc/net/netstat); {os.cpu_count()} CPUs, {cfg.ranks} ranks, transport {cfg.transport}")

        cfg.congestion.enabled, cfg.congestion.sysfs_root, cfg.congestion.ethtool_root = True, sysfs, eth
        transport, ranks = cfg.transport, cfg.ranks
        cfg.ranks = 1                 # the snapshot's cost does not depend on the ranks; one keeps TCP idle
        cfg.transport = "ob1-tcp"     # a TCP transport: the snapshot includes /proc/net/netstat
        print("snapshot cost, µs (with netstat: TCP transports):")
        print(f"  engine, fixture files       {spread(engine_snapshot_us(cfg, args.snapshots, work))}")
        backed = sysfs_backed_host(work, sysfs)
        if backed:
            cfg.congestion.sysfs_root = backed
            print(f"  engine, sysfs-backed        {spread(engine_snapshot_us(cfg, args.snapshots, work))}")
        else:
            print("  engine, sysfs-backed        (no /sys/class/net/*/statistics here)")
        cfg.transport = "shm"         # RDMA and shared-memory transports: no netstat
        print("snapshot cost, µs (without netstat: other transports):")
        print(f"  engine, fixture files       {spread(engine_snapshot_us(cfg, args.snapshots, work))}")
        if backed:
            cfg.congestion.sysfs_root = backed
            print(f"  engine, sysfs-backed        {spread(engine_snapshot_us(cfg, args.snapshots, work))}")
        cfg.congestion.sysfs_root = sysfs
        cfg.transport, cfg.ranks = transport, ranks
        fixture_us = engine_snapshot_us(cfg, args.snapshots, work)   # what the duty-cycle runs read
        print(f"  Python reader (OSU runs)    {spread(python_snapshot_us(src, args.snapshots))}")
        counter = os.path.join(sysfs, "class/infiniband/mlx5_0/ports/1/hw_counters/np_ecn_marked_roce_packets")
        print(f"  baseline: one counter file  {spread(one_file_us(counter, args.snapshots))}")
        print(f"  baseline: /proc/net/netstat {spread(one_file_us('/proc/net/netstat', args.snapshots))}")
        with open("/proc/loadavg") as f:
            print(f"  load average: {f.read().split()[0]}")

        plan = bench_plan("scaled", args.scale)
        print(f"stress duty cycle ({len(plan)} steps, iterations / {args.scale}; {args.seconds:g} s windows, "
              f"off/on alternating; transport {cfg.transport}, fixture counters, one snapshot per step):")
        duty, bounds = {False: [], True: []}, []
        snap_s = statistics.mean(fixture_us) * 1e-6
        for rnd in range(args.rounds):
            for on in (False, True):
                cfg.congestion.enabled = on
                d, nres, nfail = run_window(cfg, plan, "loop", args.seconds)
                duty[on].append(d)
                # what the snapshots cost: one per step (a step's after-snapshot is the next one's
                # before), at the measured mean, per window
                bound = f"  ({nres} snapshots: {nres * snap_s / args.seconds * 100:.3f} % of the window)"
                if on:
                    bounds.append(nres * snap_s / args.seconds * 100)
                print(f"  round {rnd + 1} snapshots {'on ' if on else 'off'}  duty cycle {d:.4f}  {nres:5d} records"
                      f"  {nfail} failures{bound if on else ''}", flush=True)
        losses = [(off - on) / off * 100 for off, on in zip(duty[False], duty[True]) if off]
        if not losses:
            print("  no steps finished inside the windows: give them longer (--seconds)")
            return 1
        print(f"  off: median {statistics.median(duty[False]):.4f} (min {min(duty[False]):.4f}, max {max(duty[False]):.4f})")
        print(f"  on:  median {statistics.median(duty[True]):.4f} (min {min(duty[True]):.4f}, max {max(duty[True]):.4f})")
        print(f"  loss per round, %: {', '.join(f'{x:+.2f}' for x in losses)}; median {statistics.median(losses):+.2f} "
              f"(target < 1 %; measured difference, machine noise included)")
        print(f"  snapshot time per window, %: {', '.join(f'{x:.3f}' for x in bounds)} (the loss it can cause)")
        if args.only != "host":
            paths_section(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
