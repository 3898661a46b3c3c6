#!/usr/bin/env python3
"""Exporter cost on a 1 GiB results log, against the seed prototype's way (re-read the whole
file with a regular expression per size on every poll), in one run:

  1. poll cost at steady state (10 new records per poll) and with nothing new, vs. one
     prototype poll on the same file; the two must find the same latest values;
  2. RSS: the real exporter process (peak, after start-up, steady polling and the scrape load)
     vs. the prototype's poll;
  3. start-up time on the 1 GiB log: to the first scrape that shows the latency series (process
     start, imports, backfill), and the backfill alone; also with every record "recent" (the
     backfill then stops at its byte budget);
  4. scrape latency p50/p99 with 20 concurrent scrapers for 30 s on loopback: each on its
     own 1 s interval (20 independent Prometheus servers); all 20 at the same instant every
     second; and back to back with no pause (saturation: on a 2-core host the 20 scraper
     processes and the exporter share the CPUs, so that latency is queueing);
  5. the same interval load with every RDMA counter moving every 20 ms (copies of the sysfs
     fixtures: the exporter formats again only families that changed, so static fixtures are
     its best case and this its worst), in a network namespace of the bench's own with two
     veth pairs whose driver statistics move too (UDP traffic from a peer namespace). The
     ethtool collector is run four ways, interleaved (`--churn-repeat` rounds) so that other
     load on the host falls on all of them alike:
       fixture command -- the captured mlx5 `ethtool -S` text, moving, printed by the fixture
                          stand-in command: a fork per netdev and refresh (a configured command);
       fork on veths   -- the real /usr/sbin/ethtool -S forked per veth and refresh (before);
       ioctl on veths  -- the same statistics by the SIOCETHTOOL ioctl, no fork (the default now);
       no ethtool      -- the collector left out: the floor.
     With `--baseline-tree DIR` (a checkout of the code before a change, e.g.
     `git archive <commit> | tar -x -C DIR`) its exporter runs the fixture and veth rows too:
     before and after in one run. Ratios against the fork rows are printed per round.
     (veth statistics have no mlx5 pause names, so the veth rows serve no ethtool series: they
     compare the reading, the fixture row the formatting of moving ethtool series.) Needs root
     (`ip netns`);
  6. a collector blocked on a stuck file: the counters-only exporter (sysfs, ethtool and netstat
     collectors on the fixtures) with one more collector whose read of a FIFO nobody writes never
     returns (what a NIC whose firmware stopped answering does to a hw_counters read), beside the
     same exporter without it, interleaved (`--stuck-repeat` rounds), 20 scrapers each every 1 s
     from the first scrape on: every scrape must answer within the scrape timeout (Prometheus'
     default 10 s); the first ones wait out the collector deadline (exporter.collector_timeout, 3 s),
     the later ones do not wait at all (a stuck collector is not started again).

The log is generated once in /tmp and reused; each run appends a fresh 15-minute window of
records to it (what a running daemon would have written recently).

    .venv/bin/python bench/exporter_bench.py [--log PATH] [--size-gib 1] [--scrape-seconds 30]
        [--only churn|stuck] [--churn-repeat 3] [--stuck-repeat 3]
"""

import argparse
import http.client
import json
import multiprocessing
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from collbench.config import PROTOTYPE_PLAN, default_plan  # noqa: E402
from collbench.exporter.app import Exporter  # noqa: E402
from collbench.ops import get_op  # noqa: E402
from collbench.sizes import format_size  # noqa: E402

PLAN = [(s.op, s.size_bytes) for s in default_plan(PROTOTYPE_PLAN)]
RECORD = ('{"schema":1,"type":"result","time":"%s","ts":%.3f,"run_id":"20261122T000000-bench000",'
          '"hosts":["gpu01","gpu02","gpu03","gpu04","gpu05","gpu06","gpu07","gpu08"],"nodes":8,"ranks":64,'
          '"engine":"builtin","mpi":"Open MPI 4.1.4","transport":"ucx","op":"%s","datatype":"float",'
          '"size":"%s","size_bytes":%d,"latency_avg_us":%.2f,"latency_min_us":%.2f,"latency_max_us":%.2f,'
          '"iterations":500,"warmup":50,"algbw_bytes_per_s":%.1f,"busbw_bytes_per_s":%.1f,"validation":"off",'
          '"straggler_rank":17,"verdict":"Good","status":"ok","iteration":%d,"seq":%d}\n')
RATE = 0.75          # records per second in the generated history (a busy 8-step plan)
WINDOW = 900         # the recent window appended each run (exporter.max_age default)


def record(seq, ts, op, size_bytes):
    lat = 40.0 + size_bytes / 100.0 + (seq % 97)
    algbw, busbw = get_op(op).bandwidth(size_bytes, 64, lat)
    iso = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))
    return RECORD % (iso, ts, op, format_size(size_bytes), size_bytes, lat, lat * 0.9, lat * 1.1,
                     algbw or 0.0, busbw or 0.0, seq // len(PLAN) + 1, seq)


def ensure_log(path, size):
    if os.path.exists(path) and os.path.getsize(path) >= size:
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    one = len(record(1, time.time(), "allreduce", 4 << 20))
    n = size // one + 1
    start = time.time() - WINDOW - n / RATE
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        buf = []
        for seq in range(1, n + 1):
            op, sz = PLAN[seq % len(PLAN)]
            buf.append(record(seq, start + seq / RATE, op, sz))
            if len(buf) == 20000:
                f.write("".join(buf))
                buf.clear()
        f.write("".join(buf))
    os.replace(tmp, path)
    return True


def last_seq(path):
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 4096))
        tail = f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
    return json.loads(tail)["seq"]


def append_window(path):
    """A fresh 15 minutes of records at the end, as the daemon would have written them."""
    seq = last_seq(path)
    now = time.time()
    n = int(WINDOW * RATE)
    with open(path, "a") as f:
        f.write("".join(record(seq + i, now - WINDOW + i / RATE, *PLAN[(seq + i) % len(PLAN)])
                        for i in range(1, n + 1)))
    return seq + n


# ---------------------------------------------------------------- the prototype's way

def prototype_poll(path, out):
    """What the seed prototype did every poll: read the whole log, one regex per size."""
    t0, c0 = time.perf_counter(), time.process_time()
    with open(path, encoding="utf-8") as f:
        content = f.read()
    latest = {}
    for op, size in PLAN:
        pattern = re.compile(r'"op":"%s","datatype":"\w+","size":"%s",.*?"latency_avg_us":([0-9.]+)'
                             % (op, format_size(size)))
        found = pattern.findall(content)
        if found:
            latest[f"{op}/{format_size(size)}"] = float(found[-1])
    with open(out, "w") as f:
        json.dump({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "latest": latest,
                   "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}, f)


def run_prototype(path):
    out = path + ".proto.json"
    subprocess.run([sys.executable, __file__, "--prototype-poll", path, out], check=True)
    with open(out) as f:
        return json.load(f)


# ---------------------------------------------------------------- our poll, in process

def our_poll_cost(path, polls=200, per_poll=10):
    ex = Exporter(SimpleNamespace(results_log=path, state_dir=None, max_age=WINDOW * 2.0, poll_interval=1.0,
                                  legacy_metrics=False, collectors=["results"], sysfs_root="/sys",
                                  procfs_root="/proc", ethtool="ethtool", netdevs=None, device_include=None,
                                  device_exclude=None))
    ex.backfill()
    latest = {f"{s.op}/{s.size}": round(s.avg_s * 1e6, 2) for s in ex.state.fresh_series()}
    seq = last_seq(path)
    busy, idle = [], []
    with open(path, "a") as f:
        for i in range(polls):
            now = time.time()
            f.write("".join(record(seq + j, now, *PLAN[(seq + j) % len(PLAN)]) for j in range(1, per_poll + 1)))
            f.flush()
            seq += per_poll
            c0 = time.process_time()
            ex.poll_once()
            busy.append(time.process_time() - c0)
            c0 = time.process_time()
            ex.poll_once()
            idle.append(time.process_time() - c0)
    records = ex.state.snapshot()["records"]["result"]
    ex.stop()
    return busy, idle, latest, records


# ---------------------------------------------------------------- the exporter process

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    """utime + stime of a process (and its waited-for children: the ethtool runs)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def get(port, path="/metrics", timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def start_exporter(path, extra=(), sysfs=None, ethtool=None, tree=REPO):
    port = free_port()
    fixtures = os.path.join(REPO, "tests", "fixtures")
    cmd = [sys.executable, "-m", "collbench", "exporter", "--listen", f"127.0.0.1:{port}", "--results-log", path,
           "--sysfs-root", sysfs or os.path.join(fixtures, "sysfs-mlx5"), "--ethtool",
           ethtool or os.path.join(fixtures, "ethtool", "fake_ethtool"), "--procfs-root", "/proc", *extra]
    t0 = time.perf_counter()
    # `python -m` imports collbench from the cwd: `tree` may be another checkout (--baseline-tree)
    proc = subprocess.Popen(cmd, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"exporter exited: {proc.stderr.read()}")
        try:
            status, body = get(port, timeout=2)
            if status == 200 and "collbench_latency_avg_seconds{" in body:
                break
        except OSError:
            pass
        if time.perf_counter() - t0 > 60:
            stop_exporter(proc)
            raise SystemExit("exporter did not serve the latency series within 60 s")
        time.sleep(0.01)
    ready = time.perf_counter() - t0
    return proc, port, ready


def churning_fixtures(workdir):
    """Copies of the sysfs and ethtool fixtures whose counters `churn` can move: the fixtures
    are static, and the exporter formats again only the families that changed since the
    previous scrape, so a static tree is its best case. Returns (sysfs root, ethtool command)."""
    fixtures = os.path.join(REPO, "tests", "fixtures")
    sysfs = os.path.join(workdir, "sysfs-churn")
    ethtool_dir = os.path.join(workdir, "ethtool-churn")
    for src, dst in ((os.path.join(fixtures, "sysfs-mlx5"), sysfs), (os.path.join(fixtures, "ethtool"), ethtool_dir)):
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, symlinks=True)
    return sysfs, os.path.join(ethtool_dir, "fake_ethtool")


def churn(sysfs, ethtool_cmd, seconds, period):
    """Every `period` s, add to every RDMA counter file and every ethtool counter (all of them
    move on every scrape: the exporter's worst case), for at most `seconds`."""
    counters = [os.path.join(d, f) for d, _, files in os.walk(sysfs) if os.path.basename(d) in ("counters", "hw_counters")
                for f in files]
    values = {}
    for path in counters:
        with open(path) as f:
            try:
                values[path] = int(f.read())
            except ValueError:
                pass     # "N/A (no PMA)" stays as it is
    texts = {}
    edir = os.path.dirname(ethtool_cmd)
    for name in os.listdir(edir):
        if name.endswith(".txt"):
            with open(os.path.join(edir, name)) as f:
                texts[os.path.join(edir, name)] = f.read().splitlines()
    number = re.compile(r"^(\s*[A-Za-z0-9_.\[\]-]+:\s*)(\d+)\s*$")
    spare = os.path.join(os.path.dirname(sysfs), "churn.tmp")
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        step += 1
        # Written beside the trees and renamed in: a reader never sees a half-written file
        # (sysfs never shows one), nor a temporary name in a counters directory.
        for path, v in values.items():
            with open(spare, "w") as f:
                f.write(f"{v + step * 7}\n")
            os.replace(spare, path)
        for path, lines in texts.items():
            out = [number.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + step * 3}", line) for line in lines]
            with open(spare, "w") as f:
                f.write("\n".join(out) + "\n")
            os.replace(spare, path)
        time.sleep(period)


def stop_exporter(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    err = proc.stderr.read()
    proc.stderr.close()
    m = re.search(r"recovered (\d+) recent records in ([0-9.]+) s", err)
    return (int(m.group(1)), float(m.group(2))) if m else (None, None)


# ---------------------------------------------------------------- churn rows, in a namespace

TRAFFIC = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
addresses = sys.argv[1].split(",")
period = float(sys.argv[2])
while True:
    for a in addresses:
        for _ in range(5):
            s.sendto(b"x" * 200, (a, 9))
    time.sleep(period)
"""


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=60)


class VethNamespace:
    """Two namespaces of the bench's own: `ns` (the exporter's) with the receiving ends of
    `pairs` veth pairs, and a peer sending them UDP traffic. Receive-side GRO puts veth in
    NAPI mode, whose per-queue statistics then count the packets: driver statistics that
    move, as a NIC's do. Removed (with their veths) on exit."""

    def __init__(self, pairs, period):
        tag = uuid.uuid4().hex[:6]
        self.ns, self.peer = f"cbbench{tag}", f"cbbench{tag}p"
        self.netdevs = [f"cbbv{i}{tag}" for i in range(pairs)]
        self.period = period
        self.traffic = None

    def __enter__(self):
        ip("netns", "add", self.ns)
        try:
            ip("netns", "add", self.peer)
            addresses = []
            for ns in (self.ns, self.peer):
                ip("netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                   "net.ipv6.conf.default.disable_ipv6=1")
                ip("-n", ns, "link", "set", "lo", "up")
            for i, dev in enumerate(self.netdevs):
                peer_dev = dev.replace("cbbv", "cbbp")
                ip("-n", self.ns, "link", "add", dev, "type", "veth", "peer", "name", peer_dev, "netns", self.peer)
                ip("-n", self.ns, "addr", "add", f"198.19.{100 + i}.2/30", "dev", dev)
                ip("-n", self.peer, "addr", "add", f"198.19.{100 + i}.1/30", "dev", peer_dev)
                ip("netns", "exec", self.ns, "ethtool", "-K", dev, "gro", "on")
                ip("netns", "exec", self.peer, "ethtool", "-K", peer_dev, "tso", "off", "gso", "off")
                ip("-n", self.ns, "link", "set", dev, "up")
                ip("-n", self.peer, "link", "set", peer_dev, "up")
                addresses.append(f"198.19.{100 + i}.2")
            self.traffic = subprocess.Popen(["ip", "netns", "exec", self.peer, sys.executable, "-c", TRAFFIC,
                                             ",".join(addresses), str(self.period)])
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        if self.traffic is not None:
            self.traffic.terminate()
            self.traffic.wait()
        for ns in (self.peer, self.ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=60)


def churn_variants(netdevs, fixture_ethtool, baseline_tree=None):
    """(key, label, extra exporter flags, --ethtool value, checkout) of the churn rows."""
    veths = ["--netdevs", ",".join(netdevs)]
    real = shutil.which("ethtool") or "/usr/sbin/ethtool"
    rows = []
    if baseline_tree:
        rows += [("base-fixture", "baseline code: fixture command (fork), mlx5 series moving", [], fixture_ethtool,
                  baseline_tree),
                 ("base-fork", "baseline code: ethtool -S forked on 2 veths", veths, "ethtool", baseline_tree)]
    return rows + [
        ("fixture", "ethtool: fixture command (fork), mlx5 series moving", [], fixture_ethtool, REPO),
        ("fork", "ethtool: ethtool -S forked on 2 veths", veths, real, REPO),
        ("ioctl", "ethtool: SIOCETHTOOL ioctl on the same veths", veths, "ethtool", REPO),
        ("none", "no ethtool collector (floor)", ["--collectors", "results,rdma_sysfs,netstat"], None, REPO),
    ]


def churn_child(args):
    """Runs in the bench's namespace (`ip netns exec`): the churn rows, interleaved over
    `churn_repeat` rounds; one JSON line per row on stdout."""
    sysfs, ethtool_cmd = churning_fixtures(os.path.dirname(args.log))
    mover = multiprocessing.Process(target=churn, args=(sysfs, ethtool_cmd, 1e9, args.churn_period), daemon=True)
    mover.start()
    try:
        for rnd in range(1, args.churn_repeat + 1):
            for key, label, extra, ethtool, tree in churn_variants(args.churn_child.split(","), ethtool_cmd,
                                                                   args.baseline_tree):
                print(f"  round {rnd}: {label} ...", file=sys.stderr, flush=True)
                proc, port, _ = start_exporter(args.log, extra, sysfs=sysfs, ethtool=ethtool, tree=tree)
                time.sleep(3)
                body = get(port)[1]
                # the row must measure what it says: the ethtool collector read its devices
                ok = key == "none" or 'collbench_collector_success{collector="ethtool"} 1.0' in body
                c0 = cpu_seconds(proc.pid)
                lat, errors = scrape_load(port, args.scrapers, args.scrape_seconds, "interval", args.scrape_interval)
                cpu = cpu_seconds(proc.pid) - c0
                stop_exporter(proc)
                print(json.dumps({"round": rnd, "key": key, "label": label, "p50": statistics.median(lat),
                                  "p99": pct(lat, 99), "n": len(lat), "errors": errors, "cpu": cpu,
                                  "ethtool_ok": ok, "lines": body.count("\n"),
                                  "load": os.getloadavg()[0]}), flush=True)
    finally:
        mover.terminate()
        mover.join()


def churn_rows(args):
    """The churn rows, measured in a namespace with moving veth statistics; list of dicts."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("ethtool") is None:
        raise SystemExit("the churn rows need root, ip and ethtool (a namespace with veth pairs)")
    with VethNamespace(pairs=2, period=args.churn_period) as ns:
        cmd = ["ip", "netns", "exec", ns.ns, sys.executable, os.path.abspath(__file__), "--churn-child",
               ",".join(ns.netdevs), "--log", args.log, "--scrapers", str(args.scrapers),
               "--scrape-seconds", str(args.scrape_seconds), "--scrape-interval", str(args.scrape_interval),
               "--churn-period", str(args.churn_period), "--churn-repeat", str(args.churn_repeat)]
        if args.baseline_tree:
            cmd += ["--baseline-tree", args.baseline_tree]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def churn_table(results, scrapers):
    rows = []
    by_round = {}
    for r in results:
        by_round.setdefault(r["round"], {})[r["key"]] = r
    for rnd in sorted(by_round):
        rs = by_round[rnd]
        for key in ("base-fixture", "base-fork", "fixture", "fork", "ioctl", "none"):
            r = rs.get(key)
            if r is None:
                continue
            target = "< 10 ms" if key == "ioctl" else ""
            rows += [
                (f"churn {rnd}: {r['label']}", "" if r["ethtool_ok"] else "ETHTOOL COLLECTOR FAILED",
                 "", None if r["ethtool_ok"] else False),
                (f"  scrape p50 / p99, {scrapers} scrapers own phase",
                 f"{r['p50'] * 1e3:.2f} ms / {r['p99'] * 1e3:.2f} ms", target,
                 r["p99"] < 0.010 if target else None),
                ("  exporter CPU per scrape (incl. polls, forks)",
                 f"{r['cpu'] / max(1, r['n']) * 1e3:.2f} ms", "", None),
                ("  scrapes / errors / lines / host load", f"{r['n']} / {r['errors']} / {r['lines']} / {r['load']:.1f}",
                 "", r["errors"] == 0),
            ]
        if "ioctl" in rs and "fork" in rs:
            i, f = rs["ioctl"], rs["fork"]
            rows.append((f"  round {rnd} ratio ioctl / fork: p50, p99, CPU per scrape",
                         f"{i['p50'] / f['p50']:.2f}, {i['p99'] / f['p99']:.2f}, "
                         f"{(i['cpu'] / max(1, i['n'])) / max(1e-9, f['cpu'] / max(1, f['n'])):.2f}", "", None))
        for base, what in (("fixture", "fixture command"), ("base-fork", "baseline code forking"),
                           ("base-fixture", "baseline code, fixture command")):
            if "ioctl" in rs and base in rs:
                i, f = rs["ioctl"], rs[base]
                rows.append((f"  round {rnd} ratio ioctl / {what}: p50, p99",
                             f"{i['p50'] / f['p50']:.2f}, {i['p99'] / f['p99']:.2f}", "", None))
    return rows


def scraper(port, seconds, queue, mode, interval, index):
    """One scraper on a keep-alive connection, as Prometheus scrapes. `mode`:
    interval -- every `interval` s from its own random phase (independent Prometheus servers);
    burst    -- every `interval` s, all scrapers at the same instant (aligned servers);
    flat-out -- back to back, no pause (a saturation test: latency is queueing on the CPUs)."""
    import random
    lat, starts, errors = [], [], 0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    end = time.monotonic() + seconds
    rng = random.Random(index)
    next_at = time.time() + (rng.random() * interval if mode == "interval" else 0)
    while time.monotonic() < end:
        if mode == "burst":
            next_at = (int(time.time() / interval) + 1) * interval
        if mode != "flat-out":
            time.sleep(max(0.0, next_at - time.time()))
            if mode == "interval":
                next_at += interval
        t0 = time.perf_counter()
        try:
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                errors += 1
            lat.append(time.perf_counter() - t0)
            starts.append(time.time())
        except OSError:
            errors += 1
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.close()
    queue.put((lat, errors, starts))


def scrape_load(port, scrapers, seconds, mode, interval, after=None):
    """(sorted latencies, errors); after (a time.time()): also the sorted latencies of the
    scrapes sent from then on."""
    q = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=scraper, args=(port, seconds, q, mode, interval, i))
             for i in range(scrapers)]
    for p in procs:
        p.start()
    results = [q.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    lat = sorted(x for r, _, _ in results for x in r)
    errors = sum(e for _, e, _ in results)
    if after is None:
        return lat, errors
    later = sorted(x for r, _, st in results for x, t in zip(r, st) if t - x >= after)
    return lat, errors, later


SCRAPE_TIMEOUT = 10.0     # Prometheus' default scrape_timeout


def stuck_child(args):
    """--stuck-child PORT FIFO|-: the counters-only exporter on the fixtures, in this process,
    plus (FIFO given) a collector blocked on reading that FIFO."""
    from collbench.exporter.collectors import Collector
    from collbench.exporter.server import ExporterHTTPServer
    port, fifo = args.stuck_child
    fixtures = os.path.join(REPO, "tests", "fixtures")

    class StuckFile(Collector):
        name = "stuck_file"

        def collect(self):
            with open(fifo, "rb") as f:     # blocks in the kernel until a writer comes: never
                f.read()
            return []

    class BenchExporter(Exporter):
        def build_collectors(self):
            return super().build_collectors() + ([StuckFile()] if fifo != "-" else [])

    settings = SimpleNamespace(counters_only=True, collectors=["rdma_sysfs", "ethtool", "netstat"],
                               sysfs_root=os.path.join(fixtures, "sysfs-mlx5"), procfs_root="/proc",
                               ethtool=os.path.join(fixtures, "ethtool", "fake_ethtool"), netdevs=None,
                               device_include=None, device_exclude=None, legacy_metrics=False, results_log=None,
                               state_dir=None, max_age=900.0, poll_interval=1.0)
    ex = BenchExporter(settings)
    server = ExporterHTTPServer(("127.0.0.1", int(port)), ex)
    ex.start()
    server.serve_forever(poll_interval=0.1)


def stuck_rows(args):
    """{"baseline"|"stuck": [(latencies sorted, errors, over the timeout)] per round}."""
    results = {"baseline": [], "stuck": []}
    workdir = f"/tmp/collbench-bench/stuck-{os.getpid()}"
    os.makedirs(workdir, exist_ok=True)
    fifo = os.path.join(workdir, "hw_counter")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    try:
        for _ in range(args.stuck_repeat):
            for variant in ("baseline", "stuck"):
                port = free_port()
                proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--stuck-child", str(port),
                                         fifo if variant == "stuck" else "-"], cwd=REPO,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    deadline = time.monotonic() + 30
                    while True:      # /health, not /metrics: the load's first scrapes meet the stuck read
                        try:
                            if get(port, "/health", timeout=2)[0] == 200:
                                break
                        except OSError:
                            pass
                        if time.monotonic() > deadline or proc.poll() is not None:
                            raise SystemExit(f"stuck-row exporter ({variant}) did not start")
                        time.sleep(0.02)
                    # "later": scrapes sent after the first collection's deadline (3 s) had passed
                    lat, errors, later = scrape_load(port, args.scrapers, args.scrape_seconds, "interval", 1.0,
                                                     after=time.time() + 3.5)
                    results[variant].append((lat, errors, sum(1 for x in lat if x >= SCRAPE_TIMEOUT), later))
                finally:
                    proc.kill()      # the stuck row's blocked thread would end with it anyway
                    proc.wait()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def stuck_table(results, scrapers):
    def spread(values, fmt):
        return fmt(statistics.median(values)) + (f" ({fmt(min(values))}-{fmt(max(values))})" if len(values) > 1 else "")

    ms = lambda v: f"{v * 1e3:.2f} ms"   # noqa: E731
    rows = []
    for variant, what in (("baseline", "no collector blocked (baseline)"),
                          ("stuck", "one collector blocked on a FIFO")):
        rounds = results[variant]
        every = all(errors == 0 and over == 0 for _, errors, over, _ in rounds)
        rows += [
            (f"stuck-file row, {scrapers} scrapers 1/s, {what}: p50", spread([statistics.median(r[0]) for r in rounds], ms),
             "", None),
            ("  p99", spread([pct(r[0], 99) for r in rounds], ms), "", None),
            ("  max", spread([r[0][-1] for r in rounds], ms), f"< {SCRAPE_TIMEOUT:g} s",
             all(r[0][-1] < SCRAPE_TIMEOUT for r in rounds)),
            ("  p50 / p99 / max of the scrapes sent after the first 3.5 s",
             " / ".join(spread([f(r[3]) for r in rounds], ms) for f in (statistics.median, lambda v: pct(v, 99),
                                                                        lambda v: v[-1])), "", None),
            ("  scrapes / errors / over the scrape timeout",
             " + ".join(f"{len(r[0])}/{r[1]}/{r[2]}" for r in rounds), "0 / 0", every),
        ]
    return rows


def pct(sorted_values, p):
    return sorted_values[min(len(sorted_values) - 1, int(p / 100 * len(sorted_values)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", default="/tmp/collbench-bench/results-1g.jsonl")
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--scrapers", type=int, default=20)
    ap.add_argument("--scrape-seconds", type=float, default=30.0, help="per scrape load mode")
    ap.add_argument("--scrape-interval", type=float, default=1.0, help="interval/burst modes: seconds between scrapes")
    ap.add_argument("--churn-period", type=float, default=0.02,
                    help="churn run: seconds between updates of every sysfs/ethtool counter (default 0.02)")
    ap.add_argument("--churn-repeat", type=int, default=1,
                    help="rounds of the churn rows, interleaved (default 1)")
    ap.add_argument("--baseline-tree", metavar="DIR",
                    help="churn rows: also run the exporter of this checkout (the code before a change, "
                         "e.g. `git archive <commit> | tar -x -C DIR`) on the fixture and the veths")
    ap.add_argument("--only", choices=("all", "churn", "stuck"), default="all",
                    help="churn: only the churn rows (the log still comes first; a small --size-gib will do); "
                         "stuck: only the stuck-file rows (no log)")
    ap.add_argument("--stuck-repeat", type=int, default=1,
                    help="rounds of the stuck-file rows, baseline and stuck interleaved (default 1)")
    ap.add_argument("--stuck-child", nargs=2, metavar=("PORT", "FIFO"), help=argparse.SUPPRESS)
    ap.add_argument("--prototype-poll", nargs=2, metavar=("LOG", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--churn-child", metavar="NETDEVS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prototype_poll:
        prototype_poll(*args.prototype_poll)
        return 0
    if args.churn_child:
        churn_child(args)
        return 0
    if args.stuck_child:
        stuck_child(args)
        return 0
    if args.only == "stuck":
        print(f"stuck-file rows: {args.stuck_repeat} round(s) of 2 x {args.scrape_seconds:.0f} s ...", flush=True)
        print_rows(stuck_table(stuck_rows(args), args.scrapers))
        return 0

    t0 = time.perf_counter()
    made = ensure_log(args.log, int(args.size_gib * (1 << 30)))
    print(f"results log {args.log}: {os.path.getsize(args.log) / (1 << 30):.2f} GiB "
          f"({'generated' if made else 'reused'} in {time.perf_counter() - t0:.1f} s)", flush=True)
    append_window(args.log)
    if args.only == "churn":
        print(f"churn rows: {args.churn_repeat} round(s) of {6 if args.baseline_tree else 4} x "
              f"{args.scrape_seconds:.0f} s ...", flush=True)
        rows = churn_table(churn_rows(args), args.scrapers)
        print_rows(rows)
        return 0

    print("prototype poll (whole file, one regex per size) ...", flush=True)
    proto = run_prototype(args.log)
    print("our poll, 200 x (10 new records + an idle poll) ...", flush=True)
    busy, idle, ours_latest, recs = our_poll_cost(args.log)
    agree = all(abs(ours_latest.get(k, -1) - v) < 0.01 for k, v in proto["latest"].items()) and \
        set(proto["latest"]) == set(ours_latest)

    print("exporter process: start-up on the log ...", flush=True)
    proc, port, ready = start_exporter(args.log)
    rss_start = rss_kb(proc.pid, "VmRSS")
    time.sleep(3)       # a few steady polls
    loads, cpu = {}, {}
    for mode in ("interval", "burst", "flat-out"):
        print(f"{args.scrapers} scrapers x {args.scrape_seconds:.0f} s, {mode} ...", flush=True)
        c0 = cpu_seconds(proc.pid)
        loads[mode] = scrape_load(port, args.scrapers, args.scrape_seconds, mode, args.scrape_interval)
        cpu[mode] = cpu_seconds(proc.pid) - c0
    rss_after = rss_kb(proc.pid, "VmRSS")
    hwm = rss_kb(proc.pid, "VmHWM")
    series = get(port)[1].count("\n")
    backfilled, backfill_s = stop_exporter(proc)

    print(f"churn rows: {args.churn_repeat} round(s) of {6 if args.baseline_tree else 4} x "
          f"{args.scrape_seconds:.0f} s ...", flush=True)
    churn_results = churn_rows(args)

    print(f"stuck-file rows: {args.stuck_repeat} round(s) of 2 x {args.scrape_seconds:.0f} s ...", flush=True)
    stuck_results = stuck_rows(args)

    print("exporter process: start-up with every record recent (byte budget bound) ...", flush=True)
    proc2, _, ready_worst = start_exporter(args.log, ["--max-age", "1e9"])
    hwm_worst = rss_kb(proc2.pid, "VmHWM")
    backfilled2, backfill2_s = stop_exporter(proc2)

    busy.sort()
    idle.sort()
    p50b, p99b, p50i = statistics.median(busy) * 1e3, pct(busy, 99) * 1e3, statistics.median(idle) * 1e3
    rows = [
        ("poll, 10 new records (CPU, median)", f"{p50b:.3f} ms", "< 1 ms", p50b < 1),
        ("poll, 10 new records (CPU, p99)", f"{p99b:.3f} ms", "< 1 ms", p99b < 1),
        ("poll, nothing new (CPU, median)", f"{p50i:.3f} ms", "", None),
        ("prototype poll on the same file (CPU)", f"{proto['cpu'] * 1e3:.0f} ms", "", None),
        ("  ratio prototype / ours", f"{proto['cpu'] * 1e3 / p50b:.0f} x", "", None),
        ("  same latest values found", "yes" if agree else "NO", "yes", agree),
        ("exporter RSS after start-up", f"{rss_start / 1024:.1f} MB", "< 80 MB", rss_start < 80 * 1024),
        ("exporter RSS after scrape load", f"{rss_after / 1024:.1f} MB", "< 80 MB", rss_after < 80 * 1024),
        ("exporter peak RSS (VmHWM)", f"{hwm / 1024:.1f} MB", "< 80 MB", hwm < 80 * 1024),
        ("exporter peak RSS, budget-bound start", f"{hwm_worst / 1024:.1f} MB", "< 80 MB", hwm_worst < 80 * 1024),
        ("prototype poll peak RSS", f"{proto['maxrss_kb'] / 1024:.0f} MB", "", None),
        ("start-up to first full scrape (process)", f"{ready:.2f} s", "< 1 s", ready < 1),
        ("  of which backfill", f"{backfill_s:.3f} s ({backfilled} records)", "", None),
        ("start-up, all records recent (process)", f"{ready_worst:.2f} s", "< 1 s", ready_worst < 1),
        ("  of which backfill", f"{backfill2_s:.3f} s ({backfilled2} records, 8 MiB budget)", "", None),
    ]
    iv = args.scrape_interval
    for mode, what in (("interval", f"each every {iv:g} s, own phase"),
                       ("burst", f"all at once every {iv:g} s"), ("flat-out", "back to back (saturation)")):
        lat, errors = loads[mode]
        target = "< 10 ms" if mode == "interval" else ""
        rows += [
            (f"scrape p50, {args.scrapers} scrapers {what}", f"{statistics.median(lat) * 1e3:.2f} ms", "", None),
            ("  exporter CPU per scrape (incl. its polls)", f"{cpu[mode] / max(1, len(lat)) * 1e3:.2f} ms", "", None),
            (f"scrape p99, {args.scrapers} scrapers {what}", f"{pct(lat, 99) * 1e3:.2f} ms", target,
             pct(lat, 99) < 0.010 if target else None),
            ("  scrapes / errors / lines per scrape",
             f"{len(lat)} ({len(lat) / args.scrape_seconds:.0f}/s) / {errors} / {series}", "", None),
        ]
    rows += churn_table(churn_results, args.scrapers)
    rows += stuck_table(stuck_results, args.scrapers)
    print_rows(rows)
    print(f"({recs} records polled in process)")
    return 0


def print_rows(rows):
    print()
    print(f"{'measure':62} {'value':40} {'target':9} ok")
    for name, value, target, ok in rows:
        print(f"{name:62} {value:40} {target:9} {'' if ok is None else ('yes' if ok else 'NO')}")
    print(f"\n(host: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    sys.exit(main())
