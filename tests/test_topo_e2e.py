"""End to end on an 8-host, 2-rack namespace testbed (racks joined by 100 Mbit/s uplinks, the
hostfile interleaving the racks as a scheduler might): `topo measure` finds the racks, `topo map`
groups them, the map's rankfile is accepted by mpirun and places the ranks where it says, and
`topo compare` shows ring allgather at a bandwidth-bound size at least 1.3x faster in the new order.
"""

import json
import statistics
import subprocess
import sys

import pytest

from collbench.results.record_parser import is_record, parse_record
from collbench.pair_matrix import load_matrices
from conftest import REPO, is_root

pytestmark = [pytest.mark.netns, pytest.mark.mpi, pytest.mark.slow, pytest.mark.alone]

PREFIX = "cbte13"    # this file's namespaces (other testbeds use other prefixes)


def _collbench(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


@pytest.fixture
def racks_bed(tmp_path):
    assert is_root(), "the testbed needs root"
    from lab import testbed
    desc = testbed.up(8, str(tmp_path / "tb"), prefix=PREFIX, racks=2, inter_rack_rate="100mbit",
                      python=sys.executable)
    try:
        yield desc
    finally:
        testbed.down(desc["dir"])
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert not [b for b in desc["rack_bridges"] + desc["uplinks"] + [desc["bridge"]] if b in links]
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [h for h in desc["hosts"] if h["netns"] in listed]


def _crossings(order, rack_of):
    """Ring links (cyclic) between hosts of different racks."""
    return sum(rack_of[a] != rack_of[b] for a, b in zip(order, order[1:] + order[:1]))


def test_measure_map_and_compare_on_two_racks(racks_bed, tmp_path):
    bed = racks_bed
    hosts = [h["addr"] for h in bed["hosts"]]
    rack_of = {h["addr"]: h["rack"] for h in bed["hosts"]}
    assert [rack_of[h] for h in hosts] == [0, 1] * 4          # the hostfile interleaves the racks

    # 1. measure: intra-rack pairs clearly faster than inter-rack ones, the racks found as groups
    mdir = tmp_path / "measure"
    r = _collbench("topo", "measure", "--config", bed["config"], "--iterations", "10", "--bw-size", "256KB",
                   "--out-dir", str(mdir), "--format", "json", "--timeout", "180")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["hosts"] == hosts
    bw = load_matrices(str(mdir / "matrix.json"))["bandwidth"]
    intra = [bw.pair_value(i, j) for i in range(8) for j in range(i + 1, 8) if rack_of[hosts[i]] == rack_of[hosts[j]]]
    inter = [bw.pair_value(i, j) for i in range(8) for j in range(i + 1, 8) if rack_of[hosts[i]] != rack_of[hosts[j]]]
    # (the unshaped intra-rack pairs are CPU-bound veth copies: on a loaded machine their spread is
    # wide, hence medians)
    assert statistics.median(intra) > 3 * statistics.median(inter), (intra, inter)
    assert max(inter) < 1.3 * 100e6 / 8 / 1e9     # no inter-rack pair beats the 100 Mbit/s uplink
    groups = doc["outliers"]["bandwidth"]["groups"]
    assert sorted(sorted(g) for g in groups) == sorted(
        sorted(h for h in hosts if rack_of[h] == r) for r in (0, 1)), groups

    # 2. map: the ring order keeps each rack together (2 crossings instead of 8)
    odir = tmp_path / "order"
    r = _collbench("topo", "map", "--pattern", "ring", "--matrix", str(mdir / "matrix.json"),
                   "--out-dir", str(odir), "--format", "json")
    assert r.returncode == 0, r.stderr
    mapped = json.loads(r.stdout)
    new_order = mapped["hosts_order"]
    assert sorted(new_order) == sorted(hosts)
    assert _crossings(hosts, rack_of) == 8 and _crossings(new_order, rack_of) == 2, new_order

    # 3. the rankfile is accepted by mpirun and puts rank r on the host it names
    name_of = {h["addr"]: h["name"] for h in bed["hosts"]}
    r = subprocess.run(["mpirun", "--allow-run-as-root", "-np", "8", "--hostfile", bed["hostfile"],
                        "--rankfile", str(odir / "ring.rankfile"), "--mca", "plm_rsh_args", f"-F {bed['ssh_config']}",
                        "--mca", "oob_tcp_if_include", bed["subnet"], "sh", "-c",
                        'echo "rank $OMPI_COMM_WORLD_RANK $(hostname)"'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ran = dict(line.split()[1:3] for line in r.stdout.splitlines() if line.startswith("rank "))
    assert ran == {str(i): name_of[h] for i, h in enumerate(new_order)}, (ran, new_order)

    # 4. compare: ring allgather at a bandwidth-bound size, original against the map's order. 32KB
    # a rank is already bound by the 100 Mbit/s uplinks (~70 ms a call in the original order, 4
    # flows an uplink, against ~15 ms: the 4x of the shared-uplink model), and takes a quarter of
    # 128KB's time (the test took 137 s at 128KB, 46 s at 32KB)
    results = tmp_path / "results.jsonl"
    r = _collbench("topo", "compare", "--config", bed["config"], "--order", str(odir / "ring.rankfile"),
                   "--matrix", str(mdir / "matrix.json"), "--patterns", "ring", "--ops", "allgather",
                   "--sizes", "32KB", "--iterations", "100", "--blocks", "10", "--rounds", "2",
                   "--format", "json", "--results", str(results))
    assert r.returncode == 0, r.stdout + r.stderr
    cmp = json.loads(r.stdout)
    assert cmp["orders"]["ring"]["original"] == hosts and cmp["orders"]["ring"]["new"] == new_order
    (point,) = cmp["points"]
    assert (point["pattern"], point["op"], point["size_bytes"], point["algorithm"]) == ("ring", "allgather",
                                                                                         32768, "ring")
    assert point["blocks_original"] == point["blocks_new"] == 10
    assert point["speedup"] == pytest.approx(point["original_median_us"] / point["new_median_us"])
    blocks = [(x.get("order"), x.get("latency_avg_us"), x.get("error")) for x in map(json.loads, open(results))
              if x["type"] != "event"]
    assert point["speedup"] >= 1.3, (json.dumps(point), blocks)
    assert point["ci_low"] > 1.0 and point["ci_low"] <= point["speedup"] <= point["ci_high"], point
    # what map predicted beside it: the independent-link model sees about the same slowest link
    # (an inter-rack one either way), the shared-uplink model 4 flows per uplink against 1
    assert 0.8 < point["predicted_speedup"] < 2.0
    assert point["predicted_shared_speedup"] > 2.0

    # the measurements are result records the report can tell apart
    recs = [parse_record(line) for line in open(results)]
    assert all(is_record(x) for x in recs)
    res = [x for x in recs if x["type"] == "result"]
    assert len(res) == 20 and {x["algorithm"] for x in res} == {"ring"}
    assert {x["order"] for x in res} == {"original", "file:ring.rankfile"}
    assert {tuple(x["hosts"]) for x in res if x["order"] != "original"} == {tuple(new_order)}
    assert sum(x["iterations"] for x in res if x["order"] == "original") >= 100


def test_testbed_script_builds_racks_joined_by_shaped_uplinks(tmp_path):
    """scripts/testbed.sh up N --racks R --inter-rack-rate RATE: a bridge per rack, each host on its
    rack's bridge (h1, h3 in rack 0; h2, h4 in rack 1), the uplinks shaped both ways; down removes all."""
    assert is_root(), "the testbed needs root"
    script = str(REPO / "scripts" / "testbed.sh")
    d = tmp_path / "tb"
    r = subprocess.run([script, "up", "4", "--dir", str(d), "--prefix", "cbtr13", "--racks", "2",
                        "--inter-rack-rate", "50mbit"], capture_output=True, text=True, timeout=120)
    try:
        assert r.returncode == 0, r.stderr
        assert "2 racks" in r.stderr
        desc = json.loads((d / "testbed.json").read_text())
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        master = {}
        for line in links.splitlines():
            name = line.split(": ")[1].split("@")[0]
            if " master " in line:
                master[name] = line.split(" master ")[1].split()[0]
        assert [master[h["veth"]] for h in desc["hosts"]] == [desc["rack_bridges"][i % 2] for i in range(4)]
        for r_index, up in enumerate(desc["uplinks"]):
            assert master[up] == desc["rack_bridges"][r_index]
            qdisc = subprocess.run(["tc", "class", "show", "dev", up], capture_output=True, text=True).stdout
            assert "rate 50Mbit" in qdisc, qdisc
        spine_ports = [n for n, m in master.items() if m == desc["bridge"]]
        assert len(spine_ports) == 2
        for port in spine_ports:
            qdisc = subprocess.run(["tc", "class", "show", "dev", port], capture_output=True, text=True).stdout
            assert "rate 50Mbit" in qdisc, qdisc
        bad = subprocess.run([script, "up", "4", "--dir", str(tmp_path / "bad"), "--inter-rack-rate", "1mbit"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 1 and "--inter-rack-rate needs --racks 2" in bad.stderr
    finally:
        subprocess.run([script, "down", str(d)], capture_output=True, text=True, timeout=120)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not [b for b in desc["rack_bridges"] + desc["uplinks"] + [desc["bridge"]] if b in links]
