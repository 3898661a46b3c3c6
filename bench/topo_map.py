#!/usr/bin/env python3
"""Rank mapping methods: predicted cost and run time on random and rack-structured matrices.

For P = 8, 16, 64, 1024, for ring and recursive-doubling allgather, on

    random   every pair's latency uniform in [1, 10] us (no structure: the hard case)
    racks    bandwidth, racks of 4 (P <= 16), 8 (P = 64) or 32 (P = 1024) hosts listed interleaved
             the way a scheduler might hand them out; 10 GB/s inside a rack, 2 GB/s between racks,
             3 % noise

prints one row per method: its cost (the predicted time of the cost model,
collbench/topo/patterns.py) relative to the exact optimum where it is computed (P <= 16; "opt"),
else relative to the best order found ("best"); the same for the tie-break sum (the total load,
which counts the crossings between racks); on racks the predicted speed-up over the identity
order if the racks share one uplink each (docs/TOPO.md); its wall-clock time. Then the whole
`collbench topo map` command on a P = 1024 CSV file (load, validate, map, write the files), wall
and CPU, against the target of 10 s.

    .venv/bin/python bench/topo_map.py                 # everything
    .venv/bin/python bench/topo_map.py --sizes 8,16    # only these P
"""

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from collbench.topo.mapping import map_order  # noqa: E402
from collbench.pair_matrix import TopoMatrix, save_csv  # noqa: E402

METHODS = ("identity", "greedy", "heuristic", "exact")


def random_matrix(p, seed):
    r = random.Random(seed)
    v = [[None] * p for _ in range(p)]
    for i in range(p):
        for j in range(i + 1, p):
            v[i][j] = v[j][i] = r.uniform(1.0, 10.0)
    return TopoMatrix.from_rows([f"h{i}" for i in range(p)], "latency", v, source=f"random-{p}")


def rack_matrix(p, seed):
    size = 4 if p <= 16 else 8 if p <= 64 else 32
    racks = max(1, p // size)
    r = random.Random(seed)
    v = [[None] * p for _ in range(p)]
    for i in range(p):
        for j in range(i + 1, p):
            base = 10.0 if i % racks == j % racks else 2.0
            v[i][j] = v[j][i] = base * r.lognormvariate(0, 0.03)
    return TopoMatrix.from_rows([f"h{i}" for i in range(p)], "bandwidth", v, source=f"racks-{p}")


def bench_one(matrix, pattern):
    """Rows (method, cost/ref, tie-break/ref, shared speed-up, seconds, optimal), ref name, cpu s."""
    cpu0 = time.process_time()
    res = map_order(matrix, pattern)
    cpu = time.process_time() - cpu0
    exact = res.results.get("exact")
    if exact is not None and exact.optimal:
        ref_name, ref = "opt", exact
    else:
        ref_name, ref = "best", min(res.results.values(), key=lambda r: (r.primary, r.secondary))
    rows = []
    for m in METHODS:
        r = res.results.get(m)
        if r is not None:
            rows.append((m, r.primary / ref.primary, r.secondary / ref.secondary, res.shared_speedup(m),
                         r.seconds, r.optimal))
    return rows, ref_name, cpu


def cli_run(p, tmp):
    m = random_matrix(p, 1)
    path = os.path.join(tmp, f"m{p}.csv")
    save_csv(path, m)
    out = os.path.join(tmp, "out")
    results = {}
    for pattern in ("ring", "recursive-doubling"):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "collbench", "topo", "map", "--pattern", pattern,
                            "--matrix", path, "--out-dir", out, "--format", "csv"],
                           capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if r.returncode != 0:
            raise SystemExit(f"topo map failed: {r.stderr}")
        results[pattern] = (wall, cpu)
    return results, os.path.getsize(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,16,64,1024", help="comma-separated P values")
    ap.add_argument("--no-cli", action="store_true", help="skip the whole-command run at P = 1024")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"{'P':>5} {'matrix':7} {'pattern':19} {'method':10} {'ref':4} {'cost':>8} {'tie-break':>10} "
          f"{'shared':>8} {'seconds':>8}   (cpu s of all methods)")
    for p in sizes:
        for kind, gen in (("random", random_matrix), ("racks", rack_matrix)):
            matrix = gen(p, p)
            for pattern in ("ring", "recursive-doubling"):
                rows, ref, cpu = bench_one(matrix, pattern)
                for n, (m, rel, rel2, shared, secs, opt) in enumerate(rows):
                    flag = "" if opt is None or opt else "?"
                    sh = "-" if shared is None else f"{shared:.2f}x"
                    tail = f"   ({cpu:.2f})" if n == len(rows) - 1 else ""
                    print(f"{p:>5} {kind:7} {pattern:19} {m:10} {ref:4} {rel:>7.3f}{flag or ' '} {rel2:>10.3f} "
                          f"{sh:>8} {secs:>8.3f}{tail}", flush=True)
    print("cost, tie-break = the method's / the reference's (opt: the proven optimum, best: the best "
          "order any method found); ? = exact search stopped at its limit; shared = predicted speed-up "
          "over identity if each rack's links share one uplink")
    if not args.no_cli and 1024 in sizes:
        with tempfile.TemporaryDirectory(prefix="collbench-topo-bench-") as tmp:
            results, size = cli_run(1024, tmp)
        for pattern, (wall, cpu) in results.items():
            print(f"collbench topo map --pattern {pattern} on a 1024-host CSV ({size / 1e6:.1f} MB): "
                  f"wall {wall:.2f} s, cpu {cpu:.2f} s (target: under 10 s)")


if __name__ == "__main__":
    main()
