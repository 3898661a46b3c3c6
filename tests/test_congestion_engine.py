"""The congestion counters of every host around every step, through the real path: `collbench
once` launches real mpirun ranks of the built-in engine, whose lowest rank per host reads that
host's counters before and after each step's timed loop.

Two hosts are emulated on this machine (the engine's COLLBENCH_ENGINE_HOST_OF_RANK hook names
ranks 0-1 "hA" and 2-3 "hB"), each reading its own fixture tree (congestion.hosts): RDMA sysfs
and mlx5 `ethtool -S` output cannot exist here. A background thread drives hB's PFC pause and
ECN-mark counters upward and makes one of hA's go backwards while the ranks run; a second one,
woken by the engine's own reads (inotify), deletes an hA counter between a step's two snapshots so
that it vanishes and flips another between garbage and its value once per snapshot. The netstat test runs real TCP over
loopback and reads the kernel's own /proc/net/netstat.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from collbench.results.record_parser import ParseError, parse_record
from inotify_helpers import OpenWatch

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ECN = "np_ecn_marked_roce_packets"


def _replace(path, text):
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)   # a reader sees the old file or the new one, never half of one


def _fixture_host(root, name):
    sysfs = root / name / "sys"
    shutil.copytree(FIXTURES / "sysfs-mlx5", sysfs, symlinks=True)
    eth = root / name / "eth"
    eth.mkdir(parents=True)
    for netdev in ("ens1f0np0", "ens1f1np1"):
        shutil.copy(FIXTURES / "ethtool" / f"mlx5_{netdev}.txt", eth / netdev)
    return sysfs, eth


class Driver(threading.Thread):
    """Every ~2 ms: hB's ECN marks (mlx5_1 port 1) and priority-3 pauses (ens1f0np0, rx) go up;
    hA's rp_cnp_handled goes down by one."""

    def __init__(self, hosts):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        (sys_a, _), (sys_b, eth_b) = hosts["hA"], hosts["hB"]
        self.ecn = sys_b / "class/infiniband/mlx5_1/ports/1/hw_counters" / ECN
        self.eth = eth_b / "ens1f0np0"
        hw_a = sys_a / "class/infiniband/mlx5_0/ports/1/hw_counters"
        self.backwards = hw_a / "rp_cnp_handled"
        self.driven = {"ecn": 0, "pause": 0, "duration_us": 0}
        self.ticks = 0

    def _bump_ethtool(self):
        text = self.eth.read_text()
        def add(name, n):
            nonlocal text
            text, count = re.subn(rf"(\b{name}: )(\d+)", lambda m: f"{m.group(1)}{int(m.group(2)) + n}", text)
            assert count == 1, name
        add("rx_prio3_pause", 3)
        add("rx_prio3_pause_duration", 500)
        _replace(self.eth, text)

    def run(self):
        ecn = int(self.ecn.read_text())
        back = int(self.backwards.read_text())
        while not self.stop.is_set():
            ecn += 7
            _replace(self.ecn, f"{ecn}\n")
            self._bump_ethtool()
            self.driven["ecn"] += 7
            self.driven["pause"] += 3
            self.driven["duration_us"] += 500
            back -= 1
            _replace(self.backwards, f"{back}\n")
            self.ticks += 1
            time.sleep(0.002)


class Vanisher(threading.Thread):
    """hA's np_cnp_sent is deleted as soon as the engine has opened it, and put back once the next
    snapshot has passed it (that snapshot's later read of hA's ethtool file shows it has); then one
    snapshot reads it untouched. The cycle is three snapshots long, so the deletions fall on before-
    and after-step snapshots in turn: every second one makes the counter vanish within a step (read
    before, absent after) however long the steps take. Timing-driven toggling missed that in about
    a third of runs.
    hA's out_of_sequence flips between garbage and its (unchanged) value each time a snapshot reads
    hA's ethtool file (once per snapshot), so about half the snapshots find it garbage. Flipping it
    on a 2 ms timer let a loaded machine's slow ticks miss all seven snapshots of a run (a CI failure)."""

    def __init__(self, hosts):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        (sys_a, eth_a), _ = hosts["hA"], hosts["hB"]
        self.hw = sys_a / "class/infiniband/mlx5_0/ports/1/hw_counters"
        self.eth = eth_a
        self.deleted = 0
        self.ready = threading.Event()

    def run(self):
        counter = self.hw / "np_cnp_sent"
        text = counter.read_text()
        flipping = self.hw / "out_of_sequence"
        value, flips = flipping.read_text(), 0
        state, eth_reads = "armed", 0
        with OpenWatch([self.hw, self.eth]) as watch:
            self.ready.set()
            while not self.stop.is_set():
                opened = watch.next(0.05)
                if opened is None:
                    continue
                where, name = opened
                if where == self.hw and name == counter.name:
                    if state == "armed":
                        counter.unlink()
                        self.deleted += 1
                        state, eth_reads = "deleted", 0
                    elif state == "skip":
                        state = "armed"
                elif where == self.eth and name == "ens1f0np0":
                    flips += 1
                    _replace(flipping, "N/A (no PMA)\n" if flips % 2 else value)
                    if state != "deleted":
                        continue
                    eth_reads += 1
                    if eth_reads == 2:         # the snapshot after the deleting one found it absent
                        _replace(counter, text)
                        state = "skip"
        if not counter.exists():
            _replace(counter, text)


def _run_once(tmp_path, config, args, env=None):
    cfg = tmp_path / "collbench.yaml"
    cfg.write_text(yaml.safe_dump(config))
    results = tmp_path / "results.jsonl"
    proc = subprocess.run([sys.executable, "-m", "collbench", "once", "--config", str(cfg), "--results",
                           str(results), "--quiet", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = results.read_text().splitlines()
    recs = [parse_record(line) for line in lines]
    assert not [r for r in recs if isinstance(r, ParseError)], recs
    return recs


def test_only_the_driven_host_carries_its_pauses_and_marks_and_faults_are_skipped_and_counted(tmp_path):
    hosts = {name: _fixture_host(tmp_path, name) for name in ("hA", "hB")}
    config = {
        "ranks": 4, "transport": "shm", "step_timeout": 300,
        "env": {"COLLBENCH_ENGINE_HOST_OF_RANK": "hA,hA,hB,hB"},
        "congestion": {"enabled": True, "hosts": {
            name: {"sysfs_root": str(sysfs), "ethtool_root": str(eth), "netstat": str(FIXTURES / "procfs/net/netstat")}
            for name, (sysfs, eth) in hosts.items()}},
    }
    driver, vanisher = Driver(hosts), Vanisher(hosts)
    driver.start()
    vanisher.start()
    assert vanisher.ready.wait(10)
    try:
        recs = _run_once(tmp_path, config, ["--ops", "allreduce,bcast,alltoall", "--sizes", "256KB,1MB",
                                            "--iterations", "100"])
    finally:
        driver.stop.set()
        vanisher.stop.set()
        driver.join()
        vanisher.join()
    results = [r for r in recs if r["type"] == "result"]
    assert len(results) == 6 and not [r for r in recs if r["type"] == "failure"]
    for r in results:
        c = r["congestion"]
        assert c["source"] == "engine" and c["hosts_read"] == 2
        assert c["t_start"] - 1e-3 <= r["ts"] <= c["t_end"] + 1e-3   # the step ended inside the window
        for key, delta in c["moved"].items():
            host, _, counter = key.partition("|")
            assert delta > 0
            if host == "hA":   # nothing was driven on hA: its faulty counters never show as moved
                assert not counter.startswith((ECN, "rx_prio", "tx_prio", "np_cnp_sent", "rp_cnp_handled",
                                               "out_of_sequence")), key
            else:
                assert host == "hB", key
                assert counter in (f"{ECN}@mlx5_1/1", "rx_prio3_pause@ens1f0np0",
                                   "rx_prio3_pause_duration@ens1f0np0"), key
        for key, fraction in c.get("lost", {}).items():
            assert key == "hB|rx_prio3_pause_duration@ens1f0np0" and 0 < fraction <= 1
        # both fixture trees hold one "N/A" counter (mlx5_1 symbol_error): skipped on every step
        assert c["skipped"]["hA"] >= 1 and c["skipped"]["hB"] >= 1 and c["faults"]["garbage"] >= 2
    moved = lambda key: [r["congestion"]["moved"].get(key, 0) for r in results]   # noqa: E731
    ecn, pause = moved(f"hB|{ECN}@mlx5_1/1"), moved("hB|rx_prio3_pause@ens1f0np0")
    duration = moved("hB|rx_prio3_pause_duration@ens1f0np0")
    assert sum(1 for x in ecn if x) >= 3 and sum(1 for x in pause if x) >= 3, (ecn, pause, driver.ticks)
    # what the steps saw happened during them: never more than was driven, in the driven steps
    assert 0 < sum(ecn) <= driver.driven["ecn"] and 0 < sum(pause) <= driver.driven["pause"]
    assert 0 < sum(duration) <= driver.driven["duration_us"]
    assert all(x % 7 == 0 for x in ecn) and all(x % 3 == 0 for x in pause)
    totals = [r["congestion"]["totals"].get(ECN, 0) for r in results]
    assert totals == ecn
    faults = [r["congestion"]["faults"] for r in results]
    assert vanisher.deleted >= 3
    assert 1 <= sum(f.get("vanished", 0) for f in faults) <= vanisher.deleted, (faults, vanisher.deleted)
    assert sum(f.get("backwards", 0) for f in faults) >= 1
    assert sum(f["garbage"] for f in faults) > 2 * len(results)   # the injected garbage on top of the fixtures'
    assert all(r["congestion"]["skipped"]["hA"] >= r["congestion"]["skipped"]["hB"] for r in results)


def test_netstat_tcp_counters_move_under_a_real_loopback_tcp_run(tmp_path):
    """ob1 over TCP on loopback: the kernel's own TcpExt counters move during the step."""
    config = {"ranks": 2, "transport": "ob1-tcp", "step_timeout": 300,
              "congestion": {"enabled": True, "sysfs_root": str(tmp_path / "no-rdma")}}
    recs = _run_once(tmp_path, config, ["--ops", "allreduce", "--sizes", "4MB", "--iterations", "20"])
    (r,) = [r for r in recs if r["type"] == "result"]
    c = r["congestion"]
    (host,) = r["hosts"]
    # 2 ranks x >= 20 x 2 MB over loopback: at least ~600 segments of 64 KB delivered and acked
    assert c["moved"].get(f"{host}|TCPDelivered@netstat", 0) >= 300, c
    assert c["totals"]["TCPDelivered"] >= 300
    assert not [k for k in c["moved"] if "@mlx5" in k or "prio" in k]


def test_a_run_with_congestion_disabled_has_no_field(tmp_path):
    recs = _run_once(tmp_path, {"ranks": 2, "transport": "shm", "congestion": {"enabled": False}},
                     ["--ops", "barrier", "--iterations", "10"])
    assert [r for r in recs if r["type"] == "result"] and not [r for r in recs if "congestion" in r]


def test_counters_on_real_sysfs_are_read_fresh_through_held_descriptors(tmp_path):
    """On sysfs the engine keeps each counter file open and reads it at offset 0 (kernfs shows the
    value afresh). No RDMA device here: the tree's counter files are links to the kernel's own
    loopback statistics (sysfs files), which real UDP traffic moves while the step runs."""
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "hw_counters").mkdir(parents=True)
    (port / "counters").mkdir()
    (port / "hw_counters" / ECN).symlink_to("/sys/class/net/lo/statistics/rx_packets")
    (port / "counters" / "port_xmit_discards").symlink_to("/sys/class/net/lo/statistics/tx_dropped")
    stop, sent = threading.Event(), [0]

    def traffic():
        import socket
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            while not stop.is_set():
                s.sendto(b"x", ("127.0.0.1", 9))   # discard port: delivered on lo, dropped by the stack
                sent[0] += 1
                time.sleep(0.0005)
    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    try:
        config = {"ranks": 2, "transport": "shm",
                  "congestion": {"enabled": True, "sysfs_root": str(tmp_path / "sys"),
                                 "netstat": str(tmp_path / "no-netstat")}}
        recs = _run_once(tmp_path, config, ["--ops", "allreduce", "--sizes", "1MB,4MB", "--iterations", "50"])
    finally:
        stop.set()
        t.join()
    results = [r for r in recs if r["type"] == "result"]
    assert len(results) == 2
    for r in results:
        (host,) = r["hosts"]
        assert r["congestion"]["moved"].get(f"{host}|{ECN}@mlx5_0/1", 0) > 0, (r["congestion"], sent)


def test_the_stress_loop_job_carries_each_passes_counters(tmp_path):
    """--loop: one job for every pass (the stress daemon's), a CBCONG line per step and pass."""
    from collbench.config import Step, build_config
    from collbench.engines import builtin
    from collbench.engines.mpi_job import JobRunner
    from collbench.results.records import RunContext

    sysfs, eth = _fixture_host(tmp_path, "h")
    counter = sysfs / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait"
    cfg = build_config({"ranks": 2, "transport": "shm",
                        "congestion": {"enabled": True, "sysfs_root": str(sysfs), "ethtool_root": str(eth),
                                       "netstat": str(FIXTURES / "procfs/net/netstat"), "xmit_wait_tick_ns": 8}},
                       "<test>", str(tmp_path))
    stop = threading.Event()

    def drive():
        v = int(counter.read_text())
        while not stop.is_set():
            v += 125_000          # 1 ms of waiting in 8 ns ticks, every ~2 ms
            _replace(counter, f"{v}\n")
            time.sleep(0.002)
    t = threading.Thread(target=drive, daemon=True)
    t.start()
    try:
        steps = [Step("allreduce", 1 << 20, 100, 5, "float"), Step("bcast", 1 << 20, 100, 5, "char")]
        loop = list(builtin.run_loop(cfg, steps, RunContext(cfg, "builtin", "test"), JobRunner(), passes=3,
                                     plan_path=str(tmp_path / "plan.txt")))
    finally:
        stop.set()
        t.join()
    assert [(x.iteration, x.step) for x in loop] == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    key = "port_xmit_wait@mlx5_0/1"
    waits = [x.record["congestion"]["moved"].get(f"{x.record['hosts'][0]}|{key}", 0) for x in loop]
    assert sum(1 for w in waits if w) >= 3 and all(w % 125_000 == 0 for w in waits)
    for x in loop:
        lost = x.record["congestion"].get("lost", {})
        assert set(lost) <= {f"{x.record['hosts'][0]}|{key}"} and all(0 < f <= 1 for f in lost.values())
        assert not isinstance(parse_record(json.dumps(x.record)), ParseError)
    assert (tmp_path / "plan.txt.congestion").exists()
