"""The ethtool collector's ioctl path (SIOCETHTOOL, no fork) against the real `ethtool -S` of
the same device: a veth pair between two network namespaces of the test's own, with traffic
that moves its counters. The fixture command path (captured mlx5 output) is in
test_exporter_collectors.py."""

import json
import logging
import subprocess
import sys
import uuid

import pytest
from conftest import FIXTURES, REPO, require_tool
from exporter_helpers import parse_exposition, sample
from prometheus_client import CollectorRegistry, generate_latest

from collbench.exporter.collectors import CollectorSet
from collbench.exporter.collectors.ethtool import EthtoolCollector, exported_indices
from collbench.congestion.ethtool_ioctl import EthtoolStatsReader, IoctlUnavailable, NoStats

FAKE_ETHTOOL = str(FIXTURES / "ethtool" / "fake_ethtool")
PACKETS = 150


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=60)


def in_ns(ns, argv, check=True):
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=120,
                          check=check, cwd=REPO)


def send_udp(ns, address, count):
    in_ns(ns, [sys.executable, "-c",
               "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
               f"for _ in range({count}): s.sendto(b'x' * 200, ({address!r}, 9))\n"])


def ethtool_pairs(text):
    """[(name, value)] in `ethtool -S` order (the header line dropped)."""
    pairs = []
    for line in text.splitlines()[1:]:
        name, _, value = line.strip().rpartition(": ")
        pairs.append((name, int(value)))
    return pairs


IOCTL_READ = """
import json, sys
sys.path.insert(0, sys.argv[1])
from collbench.congestion.ethtool_ioctl import EthtoolStatsReader
print(json.dumps(EthtoolStatsReader().read(sys.argv[2])))
"""


@pytest.fixture
def veth():
    """(namespace of the receiving end, its netdev, the sender's namespace, receiver address).
    Receive-side GRO puts veth in NAPI mode, whose per-queue counters (rx_queue_0_xdp_packets,
    _bytes) then count the packets; IPv6 is off so nothing but the test's traffic moves them."""
    require_tool("ethtool")
    tag = uuid.uuid4().hex[:6]
    ns_tx, ns_rx = f"cbei{tag}t", f"cbei{tag}r"
    tx, rx = f"cbeit{tag}", f"cbeir{tag}"
    ip("netns", "add", ns_tx)
    try:
        ip("netns", "add", ns_rx)
        for ns in (ns_tx, ns_rx):
            in_ns(ns, ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"])
        ip("-n", ns_tx, "link", "add", tx, "type", "veth", "peer", "name", rx, "netns", ns_rx)
        ip("-n", ns_tx, "addr", "add", "198.19.77.1/30", "dev", tx)
        ip("-n", ns_rx, "addr", "add", "198.19.77.2/30", "dev", rx)
        # GSO/TSO off on the sender: veth only takes the NAPI path for packets GRO may merge.
        in_ns(ns_tx, ["ethtool", "-K", tx, "tso", "off", "gso", "off"])
        in_ns(ns_rx, ["ethtool", "-K", rx, "gro", "on"])
        ip("-n", ns_tx, "link", "set", tx, "up")
        ip("-n", ns_rx, "link", "set", rx, "up")
        # a static neighbour: no ARP packet lands in the counters either
        mac = in_ns(ns_rx, ["cat", f"/sys/class/net/{rx}/address"]).stdout.strip()
        ip("-n", ns_tx, "neigh", "replace", "198.19.77.2", "lladdr", mac, "dev", tx, "nud", "permanent")
        yield ns_rx, rx, ns_tx, "198.19.77.2"
    finally:
        for ns in (ns_tx, ns_rx):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=60)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=60).stdout
    assert ns_tx not in names and ns_rx not in names


@pytest.mark.netns
def test_ioctl_reads_what_ethtool_S_prints(veth):
    ns, dev, ns_tx, address = veth
    send_udp(ns_tx, address, PACKETS)
    for _ in range(5):
        before = ethtool_pairs(in_ns(ns, ["ethtool", "-S", dev]).stdout)
        ours = [tuple(p) for p in json.loads(in_ns(ns, [sys.executable, "-c", IOCTL_READ, str(REPO), dev]).stdout)]
        after = ethtool_pairs(in_ns(ns, ["ethtool", "-S", dev]).stdout)
        if before == after:      # nothing moved meanwhile: the three readings must agree
            break
    assert before == after
    assert ours == before                         # same names, same order, same values
    values = dict(ours)
    assert "peer_ifindex" in values
    assert values["rx_queue_0_xdp_packets"] >= PACKETS        # real, moving counters: not all zero
    assert values["rx_queue_0_xdp_bytes"] >= PACKETS * 200


MOVING_READS = """
import json, socket, subprocess, sys
sys.path.insert(0, sys.argv[1])
from collbench.congestion.ethtool_ioctl import EthtoolStatsReader
wanted = lambda names: [i for i, n in enumerate(names) if n.startswith("rx_queue_0_xdp_")]
r = EthtoolStatsReader(select=wanted)
first = r.read(sys.argv[2])
subprocess.run(sys.argv[3:], check=True)       # more traffic
print(json.dumps([first, r.read(sys.argv[2])]))
"""


@pytest.mark.netns
def test_ioctl_reader_selects_and_sees_counters_move(veth):
    ns, dev, ns_tx, address = veth
    send_udp(ns_tx, address, 10)
    sender = ["ip", "netns", "exec", ns_tx, sys.executable, "-c",
              "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
              f"for _ in range({PACKETS}): s.sendto(b'x' * 200, ({address!r}, 9))\n"]
    first, second = json.loads(in_ns(ns, [sys.executable, "-c", MOVING_READS, str(REPO), dev, *sender]).stdout)
    first, second = dict(first), dict(second)
    assert set(first) == set(second) == {"rx_queue_0_xdp_packets", "rx_queue_0_xdp_bytes", "rx_queue_0_xdp_redirect",
                                         "rx_queue_0_xdp_drops", "rx_queue_0_xdp_tx", "rx_queue_0_xdp_tx_errors"}
    assert second["rx_queue_0_xdp_packets"] - first["rx_queue_0_xdp_packets"] >= PACKETS
    assert first["rx_queue_0_xdp_packets"] >= 10


COLLECT = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
os.environ["PATH"] = ""            # no ethtool to fork
from prometheus_client import CollectorRegistry, generate_latest
from collbench.exporter.collectors import CollectorSet
from collbench.exporter.collectors.ethtool import EthtoolCollector
c = EthtoolCollector("ethtool", netdevs=[sys.argv[2]])
reg = CollectorRegistry(auto_describe=False)
reg.register(CollectorSet([c]))
print(json.dumps({"use_ioctl": c.use_ioctl, "stats": c.read_all(), "text": generate_latest(reg).decode()}))
"""


@pytest.mark.netns
def test_collector_reads_veth_by_ioctl_without_ethtool_on_path(veth):
    """With no ethtool to fork (PATH empty), the default collector still reads the device: the
    ioctl path. The same with the command path fails, so the test can tell them apart."""
    ns, dev, _, _ = veth
    out = json.loads(in_ns(ns, [sys.executable, "-c", COLLECT, str(REPO), dev]).stdout)
    assert out["use_ioctl"] is True
    assert out["stats"] == {dev: {}}        # statistics read; none of them mlx5 pause counters
    m = parse_exposition(out["text"])
    assert sample(m, "collbench_collector_success", collector="ethtool") == 1
    assert not [n for n, _ in m if n.startswith("collbench_ethtool_")]

    forked = in_ns(ns, [sys.executable, "-c", COLLECT.replace('EthtoolCollector("ethtool", ',
                                                              'EthtoolCollector("ethtool", use_ioctl=False, '),
                        str(REPO), dev], check=False)
    assert forked.returncode != 0 and "NoData" in forked.stderr and "not found" in forked.stderr


def test_ioctl_no_statistics_and_bad_names():
    r = EthtoolStatsReader()
    with pytest.raises(NoStats, match="no statistics"):
        r.read("lo")                                     # a real device without driver statistics
    with pytest.raises(NoStats, match="no such device"):
        r.read(f"cbnone{uuid.uuid4().hex[:6]}")
    for bad in ("", "x" * 16, "a/b", "a\0b"):
        with pytest.raises(NoStats, match="not a network interface name"):
            r.read(bad)
    r.close()


def test_default_command_selects_the_ioctl():
    assert EthtoolCollector().use_ioctl is True
    assert EthtoolCollector("ethtool").use_ioctl is True
    assert EthtoolCollector("/usr/sbin/ethtool").use_ioctl is False      # a command given: run it
    assert EthtoolCollector(FAKE_ETHTOOL).use_ioctl is False
    assert EthtoolCollector(FAKE_ETHTOOL).reader is None


def test_exported_indices_pick_the_pause_counters():
    names = ("rx_packets", "rx_prio3_pause", "tx_prio3_pause_duration", "rx_prio0_pause_transition",
             "tx_pause_ctrl_phy", "rx_discards_phy", "tx_pause_storm_warning_events",
             "tx_pause_storm_error_events", "rx_prio3_packets", "rx_prio10_pause", "rx_pause_ctrl_phy_x")
    assert exported_indices(names) == [1, 2, 3, 4, 5, 6, 7]


class _RefusingReader:
    """Stands in for a host where SIOCETHTOOL is refused (a seccomp filter, a kernel without
    it): that cannot be produced on this machine."""

    def __init__(self):
        self.calls = []

    def read(self, netdev):
        self.calls.append(netdev)
        raise IoctlUnavailable("Operation not permitted")


def test_refused_ioctl_falls_back_to_the_command(caplog):
    caplog.set_level(logging.INFO, logger="collbench.exporter")
    c = EthtoolCollector(FAKE_ETHTOOL, netdevs=["ens1f0np0", "ens1f1np1"], use_ioctl=True)
    c.reader = _RefusingReader()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CollectorSet([c]))
    m = parse_exposition(generate_latest(reg).decode())
    assert c.reader.calls == ["ens1f0np0", "ens1f1np1"]
    assert sample(m, "collbench_collector_success", collector="ethtool") == 1
    assert sample(m, "collbench_ethtool_pause_frames_total", netdev="ens1f0np0", direction="rx", priority="3") == 88213
    assert sample(m, "collbench_ethtool_rx_discards_phy_total", netdev="ens1f1np1") is not None
    assert any("ioctl not possible" in r.getMessage() for r in caplog.records)
