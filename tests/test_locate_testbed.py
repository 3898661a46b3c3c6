"""`collbench locate` on an 8-host namespace testbed (one rank per host, ob1 over TCP): unshaped,
nothing is named; with one host's link shaped (tbf on both ends of its veth, as the testbed's
--link-rate shapes it, no ECN marking and no pauses: the counters see nothing), that host is
named; SIGTERM in the middle of a probe leaves no probe job behind in any namespace. Teardown
removes everything whatever happens. The repeat of the unshaped case (10 of 10) is
bench/locate_probes.py --testbed-runs."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, namespace_testbed, wait_for
from lab import testbed

pytestmark = [pytest.mark.netns, pytest.mark.mpi, pytest.mark.slow, pytest.mark.alone]

SHAPE = "100mbit"


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    with namespace_testbed(8, tmp_path_factory.mktemp("locate") / "tb", "step_timeout: 120s\n") as desc:
        yield desc


def locate(bed, *args, timeout=300):
    argv = ["ip", "netns", "exec", bed["hosts"][0]["netns"], sys.executable, "-m", "collbench", "locate",
            "--config", bed["config"], "--format", "json", *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert r.stdout.startswith("{"), r.stderr
    return r.returncode, json.loads(r.stdout), r.stderr


def probe_processes(bed):
    """Pids in the testbed's namespaces other than their sshd (a leftover probe job's orted or
    engine would be here)."""
    sshd = {h.get("sshd_pid") for h in bed["hosts"]}
    return {h["alias"]: [p for p in testbed.netns_pids(h["netns"]) if p not in sshd] for h in bed["hosts"]}


def test_unshaped_testbed_names_nothing(bed):
    rc, doc, err = locate(bed)
    assert rc == 0 and doc["culprit"] is None, (doc, err)
    assert doc["probes"] and doc["measurements"] >= 2 and "beyond the noise" in doc["verdict"], doc


def test_shaped_host_is_named(bed):
    h5 = bed["hosts"][4]
    testbed.shape_link(h5, SHAPE)
    try:
        rc, doc, err = locate(bed)
    finally:
        testbed.shape_link(h5, None)
    assert rc == 1, (doc, err)
    assert doc["culprit"]["host"] == h5["addr"], doc
    ev = doc["culprit"]["evidence"]
    assert ev["slowest_of_its_pairs_vs_others"] >= doc["ratio"] and ev["bisection"], ev
    assert all(h5["addr"] in step["slow"] for step in ev["bisection"]), ev
    assert doc["measurements"] < 28, doc       # fewer than the full matrix's 8 * 7 / 2 pairs


def test_sigterm_leaves_no_probe_job(bed):
    h3 = bed["hosts"][2]
    testbed.shape_link(h3, "20mbit")            # probes that take seconds: the signal lands inside one
    try:
        argv = ["ip", "netns", "exec", bed["hosts"][0]["netns"], sys.executable, "-m", "collbench", "locate",
                "--config", bed["config"], "--iterations", "50"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                start_new_session=True)
        try:
            busy = wait_for(lambda: any(probe_processes(bed).values()) or None, 60, interval=0.2)
            assert busy, "no probe job started"
            time.sleep(1.0)
            # ip netns exec execs: the pid is collbench's own
            os.kill(proc.pid, signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        assert proc.returncode == 143, err
        assert "collbench locate: terminated" in err and "no probe job left" in err, err
        left = wait_for(lambda: (lambda p: p if not any(p.values()) else None)(probe_processes(bed)), 20, interval=0.3)
        assert left is not None, probe_processes(bed)
    finally:
        testbed.shape_link(h3, None)
