"""Real congestion on a 4-host namespace testbed over TCP (issue 20, the first "Done when"): h2's
egress is ECN-marked beyond 2 MB/s by an nftables rule (`scripts/testbed.sh up --ecn-mark`), the
stress loop runs 1MB alltoall/allreduce steps with one rank per host (ob1, btl tcp,
mpi_yield_when_idle 1) and every host's netstat read around each step. Its records attribute the
marks to h2's path (h2's TCPDeliveredCE, its peers' InCEPkts), `once`'s table and the exporter's
top series name h2; after `ecn-clear` no step carries a CE mark and the top series no longer
name h2. Teardown removes everything whatever happens."""

import json
import os
import subprocess
import sys

import pytest

from collbench.congestion import attribution
from conftest import REPO, namespace_testbed, wait_for
from exporter_helpers import ExporterProcess
from lab import testbed

pytestmark = [pytest.mark.netns, pytest.mark.mpi, pytest.mark.slow, pytest.mark.alone]

MB = 1 << 20
CE = ("TCPDeliveredCE", "InCEPkts")
PLAN = ("stress:\n  stop_grace: 5\n  plan:\n"
        "    - {op: alltoall, sizes: [1MB], iterations: 20, warmup: 2}\n"
        "    - {op: allreduce, sizes: [1MB], iterations: 20, warmup: 2}\n")


def _collbench(*args, netns=None, timeout=120):
    pre = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run(pre + [sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def _results(path, after=0):
    try:
        with open(path) as f:
            recs = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
    return [r for r in recs if r.get("type") == "result" and r.get("seq", 0) > after]


def _ce(rec):
    """{(host, counter): delta} of the CE counters in a record's congestion field."""
    out = {}
    for k, v in (rec.get("congestion") or {}).get("moved", {}).items():
        host, _, ck = k.rpartition("|")
        name = ck.partition("@")[0]
        if name in CE:
            out[(host, name)] = v
    return out


def _top_series(ex):
    """{(op, size): host ranked 1} of the exporter's collbench_step_congestion_top."""
    out = {}
    for (name, labels), _ in ex.metrics().items():
        lab = dict(labels)
        if name == "collbench_step_congestion_top" and lab["rank"] == "1":
            out[(lab["op"], lab["size"])] = (lab["host"], lab["counter"])
    return out


@pytest.fixture
def bed(tmp_path):
    with namespace_testbed(4, tmp_path / "tb", "step_timeout: 60s\ncongestion:\n  enabled: true\n" + PLAN,
                           ecn_marks={"h2": "2mbytes"}) as desc:
        yield desc


def test_ecn_marks_on_one_host_are_attributed_to_its_path(bed, free_port):
    cfg = bed["config"]
    h1, h2 = bed["hosts"][0], bed["hosts"][1]
    marked, peers = h2["addr"], [h["addr"] for h in bed["hosts"] if h is not h2]
    state = os.path.join(bed["dir"], "state")
    log = os.path.join(state, "results.jsonl")
    os.makedirs(state, exist_ok=True)
    # every namespace asks for ECN; h2 alone has the marking rule
    for h in bed["hosts"]:
        out = subprocess.run(["ip", "netns", "exec", h["netns"], "sysctl", "-n", "net.ipv4.tcp_ecn"],
                             capture_output=True, text=True).stdout.strip()
        assert out == "1", (h["alias"], out)
    assert testbed.ecn_marked_packets(bed, "h2") == 0 and testbed.ecn_marked_packets(bed, "h3") is None

    ex = ExporterProcess(["--config", cfg, "--results-log", log, "--state-dir", state, "--poll-interval", "0.2",
                          "--collectors", "results,congestion_top"], free_port)
    try:
        ex.wait_ready(timeout=60)
        # ---- marked: the stress loop in the master's namespace, one rank on each host
        r = _collbench("stress", "start", "--config", cfg, netns=h1["netns"])
        assert r.returncode == 0, r.stderr

        def two_marked_per_op():
            recs = [x for x in _results(log) if _ce(x).get((marked, "TCPDeliveredCE"), 0) >= 100]
            return recs if all(sum(x["op"] == op for x in recs) >= 2 for op in ("alltoall", "allreduce")) else None
        recs = wait_for(two_marked_per_op, 60, interval=0.5)
        assert recs, (_results(log)[-4:], open(os.path.join(state, "daemon.log")).read()[-2000:])
        tops = wait_for(lambda: (lambda t: t if all(t.get((op, "1MB"), ("",))[0] == marked
                                                     for op in ("alltoall", "allreduce")) else None)(_top_series(ex)),
                        30, interval=0.3)
        assert tops, _top_series(ex)
        assert tops[("alltoall", "1MB")] == (marked, "TCPDeliveredCE@netstat")
        r = _collbench("stress", "stop", "--config", cfg)
        assert r.returncode == 0, r.stderr
        assert testbed.ecn_marked_packets(bed, "h2") > 0
        every = _results(log)
        last_marked_seq = max(x["seq"] for x in every)
        for x in every:
            assert sorted(x["hosts"]) == sorted([marked] + peers) and x["congestion"]["hosts_read"] == 4
            ce = _ce(x)
            # the marks are on h2's path only: h2 sent the CE-marked packets (TCPDeliveredCE echoed
            # back to it), its peers received them (InCEPkts); never the other way round
            assert {h for h, c in ce if c == "TCPDeliveredCE"} <= {marked}, ce
            assert {h for h, c in ce if c == "InCEPkts"} <= set(peers), ce
        for x in recs:
            assert attribution.top_host(x["congestion"]) == marked, x["congestion"]
            assert any(h in peers and c == "InCEPkts" for h, c in _ce(x)), _ce(x)

        # `once` on the marked testbed: its table names h2 beside the step
        r = _collbench("once", "--config", cfg, "--ops", "alltoall", "--sizes", "1MB", "--iterations", "20",
                       netns=h1["netns"], timeout=120)
        assert r.returncode == 0, r.stderr
        row = [line for line in r.stdout.splitlines() if line.strip().startswith("1MB")]
        assert "congested (most moved)" in r.stdout and row and f"{marked} TCPDeliveredCE=" in row[0], r.stdout

        # ---- cleared: the same loop, no CE mark on any step, and the top series forget h2
        r = subprocess.run([str(REPO / "scripts" / "testbed.sh"), "ecn-clear", bed["dir"], "h2"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "ECN marking removed: h2" in r.stderr, r.stderr
        assert testbed.ecn_marked_packets(bed, "h2") is None
        r = _collbench("stress", "start", "--config", cfg, netns=h1["netns"])
        assert r.returncode == 0, r.stderr
        clean = wait_for(lambda: (lambda c: c if all(sum(x["op"] == op for x in c) >= 2
                                                     for op in ("alltoall", "allreduce")) else None)(
            _results(log, last_marked_seq)), 60, interval=0.5)
        assert clean, _results(log)[-4:]
        assert [_ce(x) for x in clean] == [{}] * len(clean)
        assert all(x["congestion"]["hosts_read"] == 4 for x in clean)
        assert wait_for(lambda: all(host != marked or not counter.startswith(CE)
                                    for host, counter in _top_series(ex).values()), 30, interval=0.3), _top_series(ex)
    finally:
        _collbench("stress", "stop", "--config", cfg)
        ex.stop()


def _nft_table(desc, alias):
    h = [x for x in desc["hosts"] if x["alias"] == alias][0]
    r = subprocess.run(["ip", "netns", "exec", h["netns"], "nft", "list", "table", "ip", testbed.ECN_TABLE],
                       capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def test_ecn_marking_applied_replaced_and_removed_on_a_running_testbed(tmp_path):
    script = str(REPO / "scripts" / "testbed.sh")
    before = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    # a bad rate or host is refused before anything is built
    for bad in (["--ecn-mark", "h2=fast"], ["--ecn-mark", "h2=2mbit"], ["--ecn-mark", "h2"]):
        r = subprocess.run([script, "up", "2", "--dir", str(tmp_path / "bad"), *bad], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and ("bytes per second" in r.stderr or "expected hI=RATE" in r.stderr), r.stderr
    with pytest.raises(testbed.TestbedError, match="no host 'h9'"):
        testbed.up(2, str(tmp_path / "bad9"), python=sys.executable, ecn_marks={"h9": "1mbytes"})
    new = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()) - before
    assert not [n for n in new if n.startswith("cbtb")] and not (tmp_path / "bad9" / "testbed.json").exists()

    desc = testbed.up(2, str(tmp_path / "tb"), python=sys.executable)
    try:
        assert _nft_table(desc, "h1") is None and _nft_table(desc, "h2") is None
        r = subprocess.run([script, "ecn-mark", desc["dir"], "h2=512kbytes"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "h2: ECN CE marked on its egress beyond 512 kbytes/second" in r.stderr, r.stderr
        table = _nft_table(desc, "h2")
        assert 'oifname "eth0"' in table and "limit rate over 512 kbytes/second" in table and "ip ecn set ce" in table
        assert _nft_table(desc, "h1") is None
        assert testbed.load(desc["dir"])["hosts"][1]["ecn_mark"] == "512 kbytes/second"
        # marking again replaces the rate (one rule), a host by address works too
        r = subprocess.run([script, "ecn-mark", desc["dir"], f"{desc['hosts'][1]['addr']}=3mbytes/second"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        table = _nft_table(desc, "h2")
        assert table.count("ip ecn set ce") == 1 and "3 mbytes/second" in table
        r = subprocess.run([script, "ecn-mark", desc["dir"], "h7=1mbytes"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "no host 'h7'" in r.stderr and "3 mbytes/second" in _nft_table(desc, "h2")
        r = subprocess.run([script, "ecn-clear", desc["dir"]], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "ECN marking removed: h2" in r.stderr, r.stderr
        assert _nft_table(desc, "h2") is None and "ecn_mark" not in testbed.load(desc["dir"])["hosts"][1]
        r = subprocess.run([script, "ecn-clear", desc["dir"]], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "no ECN marking to remove" in r.stderr
    finally:
        testbed.down(desc["dir"])
