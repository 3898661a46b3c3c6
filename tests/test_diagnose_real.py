"""`collbench diagnose` on records of real runs: `collbench once` launches real mpirun ranks of the
built-in engine on four emulated hosts (COLLBENCH_ENGINE_HOST_OF_RANK: one rank each on hA..hD),
each host reading its own fixture counter tree (RDMA sysfs and mlx5 ethtool cannot exist here).
A baseline is saved from quiet runs; then a fault is made real while the ranks run:

  * congestion / pfc / link_errors: every rank is CPU-throttled by a cgroup cpu quota (the
    regression: the ranks' real latency rises) while a thread drives
    one host's fixture counters upward (ECN marks, PFC pauses without ECN, symbol errors):
    the diagnosis must name that host with that cause, and not the others;
  * quiet: a run with nothing done names no suspect.

(slow_host on a real run with one host's rank CPU-throttled: tests/test_diagnose_slow_host_testbed.py
on the namespace testbed; here every rank is throttled alike, so none is kept off its CPU more
than its peers.)
"""

import json
import subprocess
import sys

import pytest

import fixture_hosts
from fixture_hosts import Driver, ethtool_file, hw_counter, make_hosts

pytestmark = pytest.mark.alone   # a regression measured against a baseline

PLAN = ["--ops", "allreduce,allgather,alltoall", "--sizes", "1MB,2MB", "--iterations", "10"]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    """Four emulated hosts with their fixture trees, a config, and a baseline from three quiet runs."""
    root = tmp_path_factory.mktemp("diagnose-real")
    cfg, hosts = make_hosts(root)
    bed = {"root": root, "cfg": cfg, "hosts": hosts}
    quiet = root / "quiet.jsonl"
    for _ in range(3):
        once(bed, quiet)
    p = subprocess.run([sys.executable, "-m", "collbench", "baseline", "save", "quiet", "--from", str(quiet),
                        "--config", str(cfg)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return bed


def once(bed, results, throttle_ranks=(), driver=None):
    return fixture_hosts.once(bed["cfg"], results, PLAN, throttle_ranks=throttle_ranks, driver=driver)


def diagnose(bed, results):
    p = subprocess.run([sys.executable, "-m", "collbench", "diagnose", str(results), "--baseline", "quiet",
                        "--config", str(bed["cfg"]), "--format", "json"], capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def test_ecn_marks_on_one_host_during_a_slow_run_are_incast_into_it(bed):
    drv = Driver(hw_counter(bed["hosts"], "hB", "np_ecn_marked_roce_packets"))
    rc, doc = diagnose(bed, once(bed, bed["root"] / "ecn.jsonl", throttle_ranks=(0, 1, 2, 3), driver=drv))
    top = doc["suspects"][0]
    assert rc == 1 and (top["host"], top["cause"], top["port"]) == ("hB", "congestion", "mlx5_0/1"), doc["suspects"]
    assert top["detail"].startswith("incast into hB")
    assert not [s for s in doc["suspects"] if s["host"] in ("hA", "hC", "hD") and s["cause"] != "slow_host"]


def test_pauses_without_ecn_on_one_host_are_pfc(bed):
    drv = Driver(ethtool_file(bed["hosts"], "hC"), "tx_prio3_pause", step=3)
    rc, doc = diagnose(bed, once(bed, bed["root"] / "pfc.jsonl", throttle_ranks=(0, 1, 2, 3), driver=drv))
    top = doc["suspects"][0]
    assert rc == 1 and (top["host"], top["cause"], top["port"], top["priority"]) == ("hC", "pfc", "ens1f0np0", 3), \
        doc["suspects"]


def test_symbol_errors_on_one_host_are_link_errors(bed):
    drv = Driver(hw_counter(bed["hosts"], "hA", "symbol_error", kind="counters"), step=1)
    rc, doc = diagnose(bed, once(bed, bed["root"] / "errors.jsonl", throttle_ranks=(0, 1, 2, 3), driver=drv))
    top = doc["suspects"][0]
    assert rc == 1 and (top["host"], top["cause"], top["port"]) == ("hA", "link_errors", "mlx5_0/1"), doc["suspects"]


def test_a_quiet_run_names_no_suspect(bed):
    rc, doc = diagnose(bed, once(bed, bed["root"] / "quiet2.jsonl"))
    # the latency of a quiet run on a shared machine may still stray past a three-run baseline's
    # bound (then the verdict is `unexplained`); what must never happen is a named culprit
    assert doc["verdict"] in ("no regression", "unexplained"), doc["suspects"]
    assert [s for s in doc["suspects"] if s["host"] or s["link"]] == [], doc["suspects"]
    assert rc == (0 if doc["verdict"] == "no regression" else 1)
