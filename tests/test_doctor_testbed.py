"""`collbench doctor` on a 3-host namespace testbed, reading each host's real interface over SSH
(doctor.remote: `python -m collbench.doctor.facts` in that host's namespace, through the
testbed's ssh_config): healthy as built; one host's MTU lowered with `ip link` is named
degraded against its peers; a host whose link is down is failed (unreachable). Teardown removes
everything whatever happens."""

import json
import subprocess
import sys

import pytest

from conftest import REPO, namespace_testbed

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@pytest.fixture
def bed(tmp_path):
    with namespace_testbed(3, tmp_path / "tb", "doctor:\n  remote: true\n") as desc:
        yield desc


def _doctor(cfg, netns):
    r = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-m", "collbench", "doctor", "--config", cfg,
                        "--format", "json"], capture_output=True, text=True, timeout=120, cwd=REPO)
    doc = json.loads(r.stdout) if r.stdout.startswith("{") else None
    assert doc is not None, r.stderr
    return r.returncode, {h["host"]: (h["verdict"], [x["reason"] for x in h["reasons"]]) for h in doc["hosts"]}


def _ip(host, *args):
    subprocess.run(["ip", "netns", "exec", host["netns"], "ip", "link", "set", "dev", "eth0", *args], check=True)


def test_doctor_reads_the_real_interfaces_over_ssh(bed):
    h1, h2, h3 = bed["hosts"]
    cfg = bed["config"]
    rc, v = _doctor(cfg, h1["netns"])
    assert rc == 0 and v == {h["addr"]: ("healthy", []) for h in bed["hosts"]}, v

    _ip(h3, "mtu", "1400")
    rc, v = _doctor(cfg, h1["netns"])
    assert rc == 1, v
    assert v[h3["addr"]][0] == "degraded" and v[h3["addr"]][1] == [
        "eth0: MTU 1400 differs from other hosts' 1500 (the larger side's packets are dropped or fragmented on the way)"], v
    assert v[h1["addr"]] == v[h2["addr"]] == ("healthy", []), v

    _ip(h3, "mtu", "1500")
    _ip(h2, "down")
    rc, v = _doctor(cfg, h1["netns"])
    assert rc == 1 and v[h2["addr"]][0] == "failed" and v[h2["addr"]][1][0].startswith("unreachable"), v
    assert v[h3["addr"]] == ("healthy", []), v
