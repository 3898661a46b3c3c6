#!/usr/bin/env python3
"""Exporter memory and scrape time with a results log of 50,000 distinct sizes (issue 9), with
the series cap (`exporter.max_series`, default 10000) and without it (a cap above the count:
what the exporter did before the cap), in one run.

For each: a real `collbench exporter` process; the log appears whole (rename) and is read by
the tailer; once every record is counted: RSS (VmRSS, VmHWM), the exposition size, and the
time of a plain GET /metrics (median and max of --scrapes sequential scrapes).

    .venv/bin/python bench/exporter_series_cap.py [--sizes 50000] [--cap 10000] [--scrapes 5]
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from collbench.results import records  # noqa: E402
from collbench.config import load_config  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def get(url, timeout=120):
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read()
    return time.perf_counter() - t0, body


def write_log(path, n):
    ctx = records.RunContext(load_config(None), "builtin", "Open MPI 4.1.4")
    one = records.result_record(ctx, "allreduce", 4, "float", 10.0, 9.0, 11.0, 100, 10, ranks=8, ts=time.time())
    with open(path, "w") as f:
        for i in range(n):
            size = 4 * (i + 1)
            f.write(records.dumps(dict(one, size_bytes=size, size=records.format_size(size),
                                       latency_avg_us=10.0 + i, seq=i + 1)) + "\n")


def measure(tmp, n, cap, scrapes):
    cfg = os.path.join(tmp, f"cap{cap}.yaml")
    with open(cfg, "w") as f:
        f.write(f"exporter:\n  max_series: {cap}\n  collectors: [results]\n")
    live = os.path.join(tmp, f"live{cap}.jsonl")
    src = os.path.join(tmp, f"src{cap}.jsonl")
    write_log(src, n)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "collbench", "exporter", "--config", cfg, "--results-log", live,
                             "--state-dir", tmp, "--listen", f"127.0.0.1:{port}", "--poll-interval", "0.2",
                             "--log-level", "error"], cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                get(url + "/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the exporter did not start")
                time.sleep(0.1)
        rss0 = status_kb(proc.pid, "VmRSS")
        t0 = time.monotonic()
        os.rename(src, live)
        want = f'collbench_results_records_total{{type="result"}} {float(n)}'.encode()
        while True:
            _, body = get(url + "/metrics?name[]=collbench_results_records_total")
            if want in body:
                break
            if time.monotonic() - t0 > 600:
                raise SystemExit("the records were not all read within 10 min")
            time.sleep(0.5)
        ingest = time.monotonic() - t0
        times, size = [], 0
        for _ in range(scrapes):
            dt, body = get(url + "/metrics")
            times.append(dt)
            size = len(body)
        series = body.count(b"collbench_latency_avg_seconds{")
        return {"cap": cap, "series": series, "ingest_s": ingest, "rss0_mb": rss0 / 1024,
                "rss_mb": status_kb(proc.pid, "VmRSS") / 1024, "hwm_mb": status_kb(proc.pid, "VmHWM") / 1024,
                "scrape_med_s": statistics.median(times), "scrape_max_s": max(times), "body_mb": size / 1e6}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, default=50000, help="distinct sizes in the log (default 50000)")
    ap.add_argument("--cap", type=int, default=10000, help="exporter.max_series (default 10000)")
    ap.add_argument("--scrapes", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="collbench-seriescap-") as tmp:
        rows = [measure(tmp, args.sizes, args.cap, args.scrapes),
                measure(tmp, args.sizes, args.sizes * 10, args.scrapes)]
    print(f"results log: {args.sizes} distinct sizes (allreduce, one result each); exporter, results collector only")
    print(f"{'max_series':>11} {'series':>7} {'ingest s':>9} {'RSS idle MB':>12} {'RSS MB':>7} {'peak MB':>8} "
          f"{'scrape med s':>13} {'scrape max s':>13} {'body MB':>8}")
    for r in rows:
        print(f"{r['cap']:>11} {r['series']:>7} {r['ingest_s']:>9.2f} {r['rss0_mb']:>12.1f} {r['rss_mb']:>7.1f} "
              f"{r['hwm_mb']:>8.1f} {r['scrape_med_s']:>13.3f} {r['scrape_max_s']:>13.3f} {r['body_mb']:>8.2f}")
    capped, free = rows
    print(f"capped / uncapped: RSS {capped['rss_mb'] / free['rss_mb']:.2f}x, "
          f"scrape {capped['scrape_med_s'] / free['scrape_med_s']:.2f}x; dropped "
          f"{args.sizes - capped['series']} series (collbench_exporter_series_dropped_total)")


if __name__ == "__main__":
    main()
