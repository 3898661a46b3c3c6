"""Per-peer evidence on the 3-host namespace testbed (issue 28 item 2): each host's reader reads
the kernel's tcp_info of its TCP sockets (netlink inet_diag) around every step, and the record's
`congestion.paths` says which path moved, not only which host.

One testbed for the file (one rank per host, ob1 over TCP). A quiet `once` run: every record
carries paths between testbed hosts only, named by their hostfile addresses, each ordered pair
seen, never a host to itself. Then a lossy cable, for real: an nftables rule in h1's namespace
drops 3 % of the packets h2 sends it (`iifname eth0 ip saddr H2 numgen random mod 1000 lt 30
drop`, on their way in: a cable losing them in flight): h2>h1 carries the retransmissions that
were not spurious, h1>h2 the out-of-order arrivals, every other path stays near quiet.
"""

import json
import subprocess
import sys
from collections import defaultdict

import pytest

from collbench.congestion import record_field
from conftest import REPO, namespace_testbed

pytestmark = [pytest.mark.netns, pytest.mark.mpi, pytest.mark.slow, pytest.mark.alone]

ARGS = ["--ops", "alltoall,allreduce", "--sizes", "256KB,1MB", "--iterations", "20"]
LOSS_TABLE = "cbtest_loss"


def _collbench(*args, netns=None, timeout=180):
    pre = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run(pre + [sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def _once(bed, name):
    results = str(bed["root"] / f"{name}.jsonl")
    r = _collbench("once", "--config", bed["config"], "--results", results, "--quiet", *ARGS,
                   netns=bed["hosts"][0]["netns"])
    assert r.returncode == 0, r.stderr[-3000:]
    with open(results) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    recs = [x for x in recs if x.get("type") == "result"]
    assert len(recs) == 4, recs
    for x in recs:
        assert record_field.validate(x["congestion"]) is None
        assert "paths" in x["congestion"], x["congestion"]
    return recs


def _per_path(recs, counter):
    """{(host, peer): the counter summed over the records}."""
    out = defaultdict(float)
    for x in recs:
        for k, v in x["congestion"]["paths"].items():
            host, peer, name = record_field.path_key(k)
            if name == counter:
                out[(host, peer)] += v
    return dict(out)


def _nft(host, *args):
    return subprocess.run(["ip", "netns", "exec", host["netns"], "nft", *args], capture_output=True, text=True,
                          timeout=30)


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    root = tmp_path_factory.mktemp("paths-testbed")
    with namespace_testbed(3, root / "tb", "step_timeout: 60s\ncongestion:\n  enabled: true\n") as desc:
        desc["root"] = root          # outside the testbed directory, which down() removes
        yield desc


def test_a_quiet_run_carries_every_path_between_testbed_hosts(bed):
    addrs = {h["addr"] for h in bed["hosts"]}
    recs = _once(bed, "quiet")
    segs = _per_path(recs, "tcp_segs_out")
    # alltoall talks to every peer: each ordered pair of hosts, named by the hostfile's addresses
    assert set(segs) == {(a, b) for a in addrs for b in addrs if a != b}, segs
    assert all(v > 0 for v in segs.values()), segs
    for x in recs:
        for k in x["congestion"]["paths"]:
            host, peer, name = record_field.path_key(k)
            assert host in x["hosts"] and peer in x["hosts"] and host != peer, k
        rtt = [v for k, v in x["congestion"]["paths"].items() if k.endswith("|tcp_rtt_us_max")]
        assert rtt and all(isinstance(v, float) and v > 0 for v in rtt), x["congestion"]["paths"]


def _lossy_cable(peer, lossy, per_mille=30):
    """Drop per_mille of lossy's packets to peer on their way in (peer's namespace, prerouting): a
    cable losing them in flight, silent to the sender. The same rule on lossy's own egress
    (postrouting, `oifname eth0 ip daddr PEER`) is no lossy cable for its TCP: the kernel returns
    the drop to the sending socket as a failed transmit, which it sends again unannounced, never
    a retransmission (docs/CONGESTION.md)."""
    _nft(peer, "delete", "table", "ip", LOSS_TABLE)
    for cmd in (["add", "table", "ip", LOSS_TABLE],
                ["add", "chain", "ip", LOSS_TABLE, "in", "{ type filter hook prerouting priority 0; }"],
                ["add", "rule", "ip", LOSS_TABLE, "in", "iifname", "eth0", "ip", "saddr", lossy["addr"],
                 "numgen", "random", "mod", "1000", "lt", str(per_mille), "counter", "drop"]):
        r = _nft(peer, *cmd)
        assert r.returncode == 0, r.stderr


def _net_retrans(recs):
    """{(host, peer): retransmissions less the spurious ones (the peer's DSACKs said it had them)}."""
    dsack = _per_path(recs, "tcp_dsack_dups")
    return {p: v - dsack.get(p, 0) for p, v in _per_path(recs, "tcp_retrans_segs").items()}


def test_a_lossy_link_shows_on_its_path(bed):
    h1, h2, _ = bed["hosts"]
    _lossy_cable(h1, h2)
    try:
        recs = _once(bed, "lossy")
        table = _nft(h1, "list", "table", "ip", LOSS_TABLE).stdout
    finally:
        _nft(h1, "delete", "table", "ip", LOSS_TABLE)
    dropped = int(table.split("counter packets ")[1].split()[0])
    assert dropped > 0, table
    net = _net_retrans(recs)
    lossy = net.get((h2["addr"], h1["addr"]), 0)
    # the sender on the lossy cable retransmits what was lost; every other path stays near quiet
    # (its retransmissions, where a loaded machine made some, were spurious: DSACKed)
    others = {p: v for p, v in net.items() if p != (h2["addr"], h1["addr"])}
    assert lossy >= 100 and all(v * 5 < lossy for v in others.values()), (dropped, net)
    assert _per_path(recs, "tcp_bytes_retrans")[(h2["addr"], h1["addr"])] > 0
    # the receiver's view of the same cable: h1 got h2's packets out of order
    ooo = _per_path(recs, "tcp_rcv_ooopack")
    assert max(ooo, key=ooo.get) == (h1["addr"], h2["addr"]), ooo
