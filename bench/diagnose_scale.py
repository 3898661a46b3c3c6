#!/usr/bin/env python3
"""`collbench diagnose` at fleet scale: step records of 1024 hosts x 10,000 steps with one planted
culprit (targets: diagnose < 5 s, RSS < 200 MB, the culprit named first).

The log: 10,000 result records over 4 series (allreduce and alltoall at 1MB and 16MB, 2,500 steps
each), 1024 hosts x 2 ranks, every record's `congestion` field as the engine writes it (only what
moved: a few hosts' InCEPkts/TCPDeliveredCE noise per step, each with its real-looking delta) and
its off-CPU rank (a random rank, on its CPU about as much as its peers: no slow host).
From 60 % of the run on, the culprit host's priority-3 PFC pauses (tx: its receive side cannot
drain) move in every step and the latency of every series rises by 40 %; no ECN marks come with
them, so the cause is `pfc`. Records are checked by the project's one reader, as in production.

Figures, each the median (and min..max) of --repeat runs, against a baseline measured in the same
run on the same file:
  * diagnose: the `collbench diagnose FILE --format json` CLI end to end (process start, imports,
    read with a process per core, detection, evidence, ranking), wall time and peak RSS (the
    largest of the process and its reader processes);
  * baseline: `collbench stress log`-free reading of the same file through the same reader
    (results.file_reader.ResultsInput with a consumer that keeps nothing), in a child process:
    the cost any verb pays to read the log;
  * the culprit found: the first suspect's host and cause.

    .venv/bin/python bench/diagnose_scale.py [--hosts 1024] [--steps 10000] [--repeat 3] [--keep DIR]
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
SERIES = [("allreduce", "1MB", 1 << 20, 900.0), ("allreduce", "16MB", 1 << 24, 9000.0),
          ("alltoall", "1MB", 1 << 20, 1500.0), ("alltoall", "16MB", 1 << 24, 21000.0)]
CULPRIT_COUNTER = "tx_prio3_pause@ens1f0np0"


def make_log(path, n_hosts, n_steps, culprit, seed=21):
    rng = random.Random(seed)
    hosts = [f"node{i:04d}" for i in range(n_hosts)]
    ranks = 2 * n_hosts
    hosts_json = json.dumps(hosts)
    onset = int(n_steps * 0.6)
    ts = 1795400000.0
    with open(path, "w") as f:
        for i in range(n_steps):
            op, size, size_bytes, base = SERIES[i % len(SERIES)]
            slow = i >= onset
            lat = base * rng.gauss(1.0, 0.03) * (1.4 if slow else 1.0)
            dur = lat * 110 / 1e6
            t0, ts = ts, ts + dur + 0.01
            moved = {}
            for _ in range(6):     # background: ECN traffic on a few hosts, every step
                h = hosts[rng.randrange(n_hosts)]
                moved[f"{h}|InCEPkts@netstat"] = rng.randint(1, 40)
                moved[f"{hosts[rng.randrange(n_hosts)]}|TCPDeliveredCE@netstat"] = rng.randint(1, 40)
            if slow:
                moved[f"{culprit}|{CULPRIT_COUNTER}"] = rng.randint(2000, 4000)
                moved[f"{culprit}|tx_prio3_pause_duration@ens1f0np0"] = rng.randint(200000, 400000)
            totals = {}
            for k, d in moved.items():
                name = k.split("|", 1)[1].split("@", 1)[0]
                totals[name] = totals.get(name, 0) + d
            cong = {"source": "engine", "t_start": round(t0, 6), "t_end": round(ts, 6), "hosts_read": n_hosts,
                    "moved": moved, "totals": totals}
            rec = ('{"schema":1,"time":"2026-11-23T10:00:00.000Z","ts":%.6f,"type":"result","run_id":"20261123T100000-0badcafe",'
                   '"hosts":%s,"nodes":%d,"ranks":%d,"engine":"builtin","mpi":"mpirun (Open MPI) 4.1.4","transport":"ucx",'
                   '"op":"%s","datatype":"float","size":"%s","size_bytes":%d,"latency_avg_us":%.3f,"latency_min_us":%.3f,'
                   '"latency_max_us":%.3f,"iterations":100,"warmup":10,"algbw_bytes_per_s":1e9,"busbw_bytes_per_s":1e9,'
                   '"validation":"off","straggler_rank":%d,"offcpu_rank":%d,"offcpu_share_max":%.4f,'
                   '"offcpu_share_avg":%.4f,"verdict":null,"status":"ok","iteration":%d,"t_start":%.6f,'
                   '"t_end":%.6f,"congestion":%s,"seq":%d}\n'
                   % (ts, hosts_json, n_hosts, ranks, op, size, size_bytes, lat, lat * 0.95, lat * 1.05,
                      rng.randrange(ranks), rng.randrange(ranks), rng.uniform(0.02, 0.05), rng.uniform(0.005, 0.02),
                      i // len(SERIES) + 1, t0, ts, json.dumps(cong), i + 1))
            f.write(rec)


READ_ONLY = r"""
import sys, resource
sys.path.insert(0, %r)
from collbench.results.file_reader import ResultsInput
class Null:
    n = 0
    def add(self, rec): self.n += 1
    def merge(self, other): self.n += other.n
print(ResultsInput([sys.argv[1]]).consume(Null).n)
""" % REPO




def _measure(cmd):
    """(rc, stdout, wall s, peak RSS MB of the process and its children) of one run, through a
    wrapper that reports getrusage of its children (the command and the reader processes)."""
    wrapper = ("import resource, subprocess, sys, time; t0 = time.perf_counter(); "
               "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); w = time.perf_counter() - t0; "
               "r = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024; "
               "sys.stderr.write(p.stderr); print(repr((p.returncode, p.stdout, w, r)))")
    p = subprocess.run([PY, "-c", wrapper, *cmd], capture_output=True, text=True, cwd=REPO)
    rc, out, wall, rss = eval(p.stdout.strip().splitlines()[-1])
    return rc, out, wall, rss


def _spread(xs):
    return f"{statistics.median(xs):.2f} (min {min(xs):.2f}, max {max(xs):.2f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", metavar="DIR", help="write the log here and keep it")
    a = ap.parse_args()
    d = a.keep or tempfile.mkdtemp(prefix="cb-diagnose-scale-")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "results.jsonl")
    culprit = f"node{(a.hosts * 3) // 4 + 1:04d}"
    t0 = time.perf_counter()
    make_log(path, a.hosts, a.steps, culprit)
    print(f"log: {a.steps} steps x {a.hosts} hosts, {os.path.getsize(path) / 1e6:.1f} MB, planted culprit {culprit} "
          f"(pfc, tx prio 3) [{time.perf_counter() - t0:.1f} s to write]; {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}")
    base_w, base_r, diag_w, diag_r, found = [], [], [], [], []
    for _ in range(a.repeat):
        rc, out, w, r = _measure([PY, "-c", READ_ONLY, path])
        assert rc == 0 and int(out.strip()) == a.steps, (rc, out)
        base_w.append(w)
        base_r.append(r)
        rc, out, w, r = _measure([PY, "-m", "collbench", "diagnose", path, "--format", "json"])
        doc = json.loads(out)
        first = doc["suspects"][0] if doc["suspects"] else {}
        found.append((rc, first.get("host"), first.get("cause"), first.get("priority")))
        diag_w.append(w)
        diag_r.append(r)
    print(f"{'':28s} {'wall s':>34s} {'peak RSS MB':>34s}")
    print(f"{'baseline: read the log':28s} {_spread(base_w):>34s} {_spread(base_r):>34s}")
    print(f"{'collbench diagnose':28s} {_spread(diag_w):>34s} {_spread(diag_r):>34s}")
    ok = all(f == (1, culprit, "pfc", 3) for f in found)
    print(f"first suspect: {found[0][1]} cause {found[0][2]} priority {found[0][3]} (exit {found[0][0]}) -> "
          f"{'culprit found' if ok else 'CULPRIT MISSED'} in {sum(f[1] == culprit for f in found)}/{len(found)} runs")
    print(f"targets: diagnose < 5 s: {'met' if statistics.median(diag_w) < 5 else 'MISSED'}; RSS < 200 MB: "
          f"{'met' if max(diag_r) < 200 else 'MISSED'}")
    if not a.keep:
        shutil.rmtree(d, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
