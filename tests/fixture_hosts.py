"""Emulated hosts for real runs whose RDMA and ethtool counters cannot exist here: `collbench once`
launches real mpirun ranks of the built-in engine on this machine (shm), each rank reporting as one
of the hosts (COLLBENCH_ENGINE_HOST_OF_RANK), and each host reads its own copy of the fixture
counter trees, which a Driver thread moves while the ranks run. Used by tests/test_diagnose_real.py
and bench/diagnose_accuracy.py (its PFC and link-error classes)."""

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import yaml

from cgroup_helpers import Cgroup, RankMover, environ, rank_of

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPO = FIXTURES.parent.parent
HOSTS = ("hA", "hB", "hC", "hD")
NETDEVS = ("ens1f0np0", "ens1f1np1")


def _replace(path, text):
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def make_hosts(root):
    """(config path, {host: its counter sources}): the four hosts' fixture trees copied under root and
    a config running 4 ranks on shm with congestion counters on."""
    hosts = {}
    for h in HOSTS:
        sysfs = root / h / "sys"
        shutil.copytree(FIXTURES / "sysfs-mlx5", sysfs, symlinks=True)
        eth = root / h / "eth"
        eth.mkdir(parents=True)
        for netdev in NETDEVS:
            shutil.copy(FIXTURES / "ethtool" / f"mlx5_{netdev}.txt", eth / netdev)
        hosts[h] = {"sysfs_root": str(sysfs), "ethtool_root": str(eth),
                    "netstat": str(FIXTURES / "procfs/net/netstat")}
    config = {"ranks": 4, "transport": "shm", "step_timeout": 600, "state_dir": str(root / "state"),
              "env": {"COLLBENCH_ENGINE_HOST_OF_RANK": ",".join(HOSTS)},
              "congestion": {"enabled": True, "hosts": hosts}}
    cfg = root / "collbench.yaml"
    cfg.write_text(yaml.safe_dump(config))
    return cfg, hosts


def hw_counter(hosts, host, name, port="mlx5_0/ports/1", kind="hw_counters"):
    """The path of one RDMA port counter of one emulated host."""
    device, number = port.split("/")[0], port.split("/")[-1]
    return Path(hosts[host]["sysfs_root"]) / "class/infiniband" / device / "ports" / number / kind / name


def ethtool_file(hosts, host, netdev=NETDEVS[0]):
    return Path(hosts[host]["ethtool_root"]) / netdev


class Driver(threading.Thread):
    """Every ~2 ms one fixture counter of one host goes up by `step` (a sysfs file, or the ethtool
    statistic `name` in an ethtool -S text)."""

    def __init__(self, path, name=None, step=7):
        super().__init__(daemon=True)
        self.path, self.stat, self.step = path, name, step   # (Thread owns .name)
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            if self.stat is None:
                _replace(self.path, f"{int(self.path.read_text()) + self.step}\n")
            else:
                text = self.path.read_text()
                text, n = re.subn(rf"(\b{self.stat}: )(\d+)", lambda m: f"{m.group(1)}{int(m.group(2)) + self.step}", text)
                assert n == 1
                _replace(self.path, text)
            time.sleep(0.002)


def throttler(cgroup, marker, ranks):
    """A RankMover of one run's engine ranks (marked by an environment variable) whose rank is in `ranks`."""
    marker, ranks = marker.encode(), {str(r).encode() for r in ranks}

    def wants(proc):
        if b"collbench-engine" not in (proc / "cmdline").read_bytes():
            return False
        env = environ(proc)
        return marker in env and rank_of(env) in ranks
    return RankMover(cgroup, wants)


def once(cfg, results, plan_args, throttle_ranks=(), quota_us=8000, driver=None):
    """`collbench once` on the emulated hosts (plan_args: --ops/--sizes/--iterations), its ranks in
    `throttle_ranks` held to quota_us of CPU per 100 ms (the regression), `driver` moving a counter
    meanwhile; asserts it ran (and that a rank was throttled)."""
    marker = f"COLLBENCH_DIAGNOSE_TEST={uuid.uuid4().hex}"
    threads, cgroup = [], None
    if throttle_ranks:
        cgroup = Cgroup(quota_us)
        threads.append(throttler(cgroup, marker, throttle_ranks))
    if driver is not None:
        threads.append(driver)
    for t in threads:
        t.start()
    try:
        p = subprocess.run([sys.executable, "-m", "collbench", "once", "--config", str(cfg), "--results",
                            str(results), "--quiet", *plan_args], capture_output=True, text=True, timeout=900,
                           cwd=REPO, env={**os.environ, marker.split("=")[0]: marker.split("=")[1]})
    finally:
        for t in threads:
            t.stop.set()
            t.join()
        if cgroup is not None:
            cgroup.remove()
    assert p.returncode == 0, p.stderr[-3000:]
    if throttle_ranks:
        assert threads[0].moved, "no engine rank was throttled"
    return results
