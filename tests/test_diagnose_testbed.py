"""`collbench diagnose` on a 4-host namespace testbed (real hosts: own network namespace, address,
sshd; one rank per host over TCP): a baseline is saved from quiet `once` runs, then

  * congestion: h2's egress is ECN-marked for real (an nftables rule, `testbed.sh ecn-mark`) during
    a run made slower by a cgroup cpu quota on every rank (on veth, ECN marks alone slow the
    collectives too little to pass a baseline's bound reliably on a shared machine): the diagnosis
    names h2's outgoing path from its real TCPDeliveredCE, and no other host;
  * quiet: a run with nothing done names no suspect.
"""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, is_root
from lab import testbed
from test_diagnose_real import Cgroup

pytestmark = [pytest.mark.netns, pytest.mark.mpi, pytest.mark.slow]

ARGS = ["--ops", "alltoall,allreduce,allgather", "--sizes", "1MB,2MB", "--iterations", "10"]


def _collbench(*args, netns=None, timeout=300):
    pre = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run(pre + [sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


class NetnsThrottler(threading.Thread):
    """Moves every engine rank running in the testbed's namespaces into the cgroup as it starts."""

    def __init__(self, cgroup, namespaces):
        super().__init__(daemon=True)
        self.cgroup, self.inodes = cgroup, {os.stat(f"/run/netns/{ns}").st_ino for ns in namespaces}
        self.stop = threading.Event()
        self.moved = set()

    def run(self):
        while not self.stop.is_set():
            for p in os.listdir("/proc"):
                if not p.isdigit() or int(p) in self.moved:
                    continue
                try:
                    if b"collbench-engine" not in open(f"/proc/{p}/cmdline", "rb").read():
                        continue
                    if os.stat(f"/proc/{p}/ns/net").st_ino not in self.inodes:
                        continue
                    self.cgroup.add(int(p))
                    self.moved.add(int(p))
                except OSError:
                    continue
            time.sleep(0.005)


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    assert is_root(), "the testbed needs root"
    root = tmp_path_factory.mktemp("diagnose-testbed")
    desc = testbed.up(4, str(root / "tb"), python=sys.executable)
    try:
        with open(desc["config"], "a") as f:
            f.write("step_timeout: 120s\ncongestion:\n  enabled: true\n")
        desc["root"] = str(root)      # outside the testbed directory, which down() removes
        desc["quiet"] = str(root / "quiet.jsonl")
        for _ in range(3):
            once(desc, desc["quiet"])
        r = _collbench("baseline", "save", "quiet", "--from", desc["quiet"], "--config", desc["config"])
        assert r.returncode == 0, r.stderr
        yield desc
    finally:
        namespaces = [h["netns"] for h in desc["hosts"]]
        testbed.down(desc["dir"])
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [ns for ns in namespaces if ns in listed]


def once(bed, results):
    r = _collbench("once", "--config", bed["config"], "--results", results, "--quiet", *ARGS,
                   netns=bed["hosts"][0]["netns"])
    assert r.returncode == 0, r.stderr[-3000:]
    return results


def diagnose(bed, results):
    r = _collbench("diagnose", results, "--baseline", "quiet", "--config", bed["config"], "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def test_real_ecn_marking_on_one_host_names_its_outgoing_path(bed):
    h2 = bed["hosts"][1]
    testbed.ecn_mark(bed["dir"], {"h2": "256kbytes"})
    cg = Cgroup(20000)
    t = NetnsThrottler(cg, [h["netns"] for h in bed["hosts"]])
    t.start()
    try:
        results = once(bed, os.path.join(bed["root"], "ecn.jsonl"))
    finally:
        t.stop.set()
        t.join()
        cg.remove()
        testbed.ecn_clear(bed["dir"], ["h2"])
    assert len(t.moved) >= 4, "the ranks were not throttled"
    rc, doc = diagnose(bed, results)
    assert rc == 1 and doc["regressions"], doc
    top = doc["suspects"][0]
    # h2's egress is marked: its outgoing path, or (a ring op sending to one neighbour) the link out of it
    assert top["cause"] == "congestion" and h2["addr"] in (top["host"], (top["link"] or [None])[0]), doc["suspects"]
    assert top["evidence"]["counters"][0] == {**top["evidence"]["counters"][0], "host": h2["addr"],
                                              "counter": "TCPDeliveredCE", "side": "rp"}
    assert not [s for s in doc["suspects"] if s["host"] not in (None, h2["addr"])], doc["suspects"]


def test_a_quiet_run_names_no_suspect(bed):
    rc, doc = diagnose(bed, once(bed, os.path.join(bed["root"], "quiet2.jsonl")))
    # the latency of a quiet run on a shared machine may still stray past a three-run baseline's
    # bound (then the verdict is `unexplained`); what must never happen is a named culprit
    assert doc["verdict"] in ("no regression", "unexplained"), doc["suspects"]
    assert [s for s in doc["suspects"] if s["host"] or s["link"]] == [], doc["suspects"]
    assert rc == (0 if doc["verdict"] == "no regression" else 1)
