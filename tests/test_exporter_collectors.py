"""Scrape-time collectors against fixture trees shaped like an mlx5 host, captured-style
`ethtool -S` text, and the real host's /proc/net/netstat and ethtool."""

import logging
import subprocess
import time
import uuid

import pytest
from conftest import FIXTURES, require_tool
from exporter_helpers import names, parse_exposition, sample
from prometheus_client import CollectorRegistry, generate_latest

from collbench.exporter.collectors import CollectorSet, DeviceFilter
from collbench.exporter.collectors.ethtool import EthtoolCollector, parse_ethtool_stats
from collbench.congestion.netstat import parse_netstat
from collbench.exporter.collectors.netstat import NetstatCollector
from collbench.exporter.collectors.rdma_sysfs import RdmaSysfsCollector, device_netdevs

SYSFS = str(FIXTURES / "sysfs-mlx5")
FAKE_ETHTOOL = str(FIXTURES / "ethtool" / "fake_ethtool")
PROCFS = str(FIXTURES / "procfs")


def scrape(*collectors):
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CollectorSet(collectors))
    text = generate_latest(reg).decode()
    return text, parse_exposition(text)


def test_rdma_sysfs_counters_from_mlx5_tree():
    text, m = scrape(RdmaSysfsCollector(SYSFS))
    assert sample(m, "collbench_collector_success", collector="rdma_sysfs") == 1
    assert sample(m, "collbench_rdma_np_ecn_marked_roce_packets_total", device="mlx5_0", port="1") == 48211
    assert sample(m, "collbench_rdma_np_cnp_sent_total", device="mlx5_0", port="1") == 48190
    assert sample(m, "collbench_rdma_rp_cnp_handled_total", device="mlx5_1", port="1") == 7
    for counter in ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored",
                    "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "implied_nak_seq_err",
                    "rnr_nak_retry_err", "out_of_buffer", "roce_adp_retrans", "req_transport_retries_exceeded"):
        for dev in ("mlx5_0", "mlx5_1"):
            assert sample(m, f"collbench_rdma_{counter}_total", device=dev, port="1") is not None, (counter, dev)
    # port counters: 4-byte words turned into bytes, the port_ prefix not doubled
    assert sample(m, "collbench_rdma_port_xmit_data_bytes_total", device="mlx5_0", port="1") == 2500000000 * 4
    assert sample(m, "collbench_rdma_port_rcv_data_bytes_total", device="mlx5_1", port="1") == 5678 * 4
    assert sample(m, "collbench_rdma_port_xmit_wait_total", device="mlx5_0", port="1") == 8812
    assert sample(m, "collbench_rdma_port_vl15_dropped_total", device="mlx5_0", port="1") is not None
    # a setting is not a counter; an unreadable counter is skipped, the rest still exported
    assert "collbench_rdma_lifespan_total" not in names(m)
    assert sample(m, "collbench_rdma_port_symbol_error_total", device="mlx5_0", port="1") is not None
    assert sample(m, "collbench_rdma_port_symbol_error_total", device="mlx5_1", port="1") is None
    assert "# TYPE collbench_rdma_np_cnp_sent_total counter" in text


def test_rdma_device_filters():
    _, m = scrape(RdmaSysfsCollector(SYSFS, DeviceFilter(include="mlx5_1")))
    devices = {dict(lbl).get("device") for n, lbl in m if n.startswith("collbench_rdma_")}
    assert devices == {"mlx5_1"}
    _, m = scrape(RdmaSysfsCollector(SYSFS, DeviceFilter(exclude="mlx5_[01]")))
    assert not [n for n, _ in m if n.startswith("collbench_rdma_")]
    assert sample(m, "collbench_collector_success", collector="rdma_sysfs") == 0


def test_rdma_no_devices_is_no_series_not_a_failed_scrape(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="collbench.exporter")
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CollectorSet([RdmaSysfsCollector(str(tmp_path))]))
    for _ in range(3):
        m = parse_exposition(generate_latest(reg).decode())
    assert sample(m, "collbench_collector_success", collector="rdma_sysfs") == 0
    assert not [n for n, _ in m if n.startswith("collbench_rdma_")]
    assert sum("no RDMA devices" in r.getMessage() for r in caplog.records) == 1    # logged once


def test_netdevs_of_rdma_devices():
    assert device_netdevs(SYSFS, "mlx5_0") == ["ens1f0np0"]
    assert device_netdevs(SYSFS, "mlx5_1") == ["ens1f1np1"]


def test_ethtool_mlx5_pause_counters():
    text, m = scrape(EthtoolCollector(FAKE_ETHTOOL, sysfs_root=SYSFS))
    assert sample(m, "collbench_collector_success", collector="ethtool") == 1
    assert sample(m, "collbench_ethtool_pause_frames_total", netdev="ens1f0np0", direction="rx", priority="3") == 88213
    assert sample(m, "collbench_ethtool_pause_frames_total", netdev="ens1f0np0", direction="tx", priority="3") == 90412
    assert sample(m, "collbench_ethtool_pause_frames_total", netdev="ens1f1np1", direction="rx", priority="0") == 0
    assert sample(m, "collbench_ethtool_pause_duration_seconds_total",
                  netdev="ens1f0np0", direction="rx", priority="3") == pytest.approx(1.502331)
    assert sample(m, "collbench_ethtool_pause_transitions_total",
                  netdev="ens1f0np0", direction="rx", priority="3") == 441
    assert sample(m, "collbench_ethtool_pause_ctrl_frames_total", netdev="ens1f0np0", direction="rx") == 4410
    assert sample(m, "collbench_ethtool_pause_ctrl_frames_total", netdev="ens1f0np0", direction="tx") == 120
    assert sample(m, "collbench_ethtool_rx_discards_phy_total", netdev="ens1f0np0") == 3391
    assert sample(m, "collbench_ethtool_pause_storm_warning_events_total", netdev="ens1f0np0") == 2
    assert sample(m, "collbench_ethtool_pause_storm_error_events_total", netdev="ens1f1np1") == 0
    prios = {dict(lbl)["priority"] for n, lbl in m if n == "collbench_ethtool_pause_frames_total"}
    assert prios == {str(p) for p in range(8)}
    # the many other mlx5 statistics are not exported
    assert not [n for n, _ in m if "rx_packets" in n or "vport" in n]


def test_ethtool_parse_ignores_header_and_junk():
    stats = parse_ethtool_stats("NIC statistics:\n     rx_prio1_pause: 5\n  garbage line\n     tx_x: -1\n")
    assert stats == {"rx_prio1_pause": 5, "tx_x": -1}


def test_ethtool_explicit_netdevs_and_filter():
    _, m = scrape(EthtoolCollector(FAKE_ETHTOOL, netdevs=["ens1f1np1", "nosuchdev"], sysfs_root=SYSFS))
    netdevs = {dict(lbl)["netdev"] for n, lbl in m if n.startswith("collbench_ethtool_")}
    assert netdevs == {"ens1f1np1"}
    assert sample(m, "collbench_collector_success", collector="ethtool") == 1
    _, m = scrape(EthtoolCollector(FAKE_ETHTOOL, netdevs=["ens1f0np0", "ens1f1np1"],
                                   device_filter=DeviceFilter(exclude="ens1f0.*")))
    assert {dict(lbl)["netdev"] for n, lbl in m if n.startswith("collbench_ethtool_")} == {"ens1f1np1"}


def test_ethtool_missing_binary_or_no_netdevs(tmp_path):
    _, m = scrape(EthtoolCollector(str(tmp_path / "no-ethtool"), netdevs=["ens1f0np0"]))
    assert sample(m, "collbench_collector_success", collector="ethtool") == 0
    _, m = scrape(EthtoolCollector(FAKE_ETHTOOL, sysfs_root=str(tmp_path)))     # no RDMA devices
    assert sample(m, "collbench_collector_success", collector="ethtool") == 0
    assert not [n for n, _ in m if n.startswith("collbench_ethtool_")]


def test_real_ethtool_on_loopback_has_no_stats():
    require_tool("ethtool")
    _, m = scrape(EthtoolCollector("ethtool", netdevs=["lo"]))
    assert sample(m, "collbench_collector_success", collector="ethtool") == 0
    assert not [n for n, _ in m if n.startswith("collbench_ethtool_")]


@pytest.mark.netns
def test_real_ethtool_on_veth_has_stats_but_no_pause_counters():
    require_tool("ethtool")
    a, b = f"cbx{uuid.uuid4().hex[:6]}", f"cby{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
    try:
        out = subprocess.run(["ethtool", "-S", a], capture_output=True, text=True, check=True).stdout
        assert "peer_ifindex" in out                  # real statistics, none of them mlx5's
        _, m = scrape(EthtoolCollector("ethtool", netdevs=[a]))
        assert sample(m, "collbench_collector_success", collector="ethtool") == 1
        assert not [n for n, _ in m if n.startswith("collbench_ethtool_")]
    finally:
        subprocess.run(["ip", "link", "del", a], check=False)


def test_netstat_fixture():
    _, m = scrape(NetstatCollector(PROCFS))
    assert sample(m, "collbench_netstat_ip_in_ce_packets_total") == 27310
    assert sample(m, "collbench_netstat_ip_in_ect0_packets_total") == 9913456
    assert sample(m, "collbench_netstat_ip_in_ect1_packets_total") == 0
    assert sample(m, "collbench_netstat_ip_in_noect_packets_total") == 18841227


def test_netstat_real_host():
    with open("/proc/net/netstat") as f:
        before = parse_netstat(f.read())["IpExt"]
    _, m = scrape(NetstatCollector("/proc"))
    assert sample(m, "collbench_collector_success", collector="netstat") == 1
    for field, name in (("InCEPkts", "ce"), ("InECT0Pkts", "ect0"), ("InECT1Pkts", "ect1"), ("InNoECTPkts", "noect")):
        value = sample(m, f"collbench_netstat_ip_in_{name}_packets_total")
        assert value is not None and value >= before[field]


def test_netstat_missing_file(tmp_path):
    _, m = scrape(NetstatCollector(str(tmp_path)))
    assert sample(m, "collbench_collector_success", collector="netstat") == 0


def test_a_failing_collector_does_not_break_the_scrape():
    class Broken:
        name = "broken"

        def collect(self):
            raise RuntimeError("bug")

    text, m = scrape(Broken(), NetstatCollector(PROCFS))
    assert sample(m, "collbench_collector_success", collector="broken") == 0
    assert sample(m, "collbench_collector_success", collector="netstat") == 1
    assert sample(m, "collbench_netstat_ip_in_ce_packets_total") == 27310
    assert sample(m, "collbench_collector_duration_seconds", collector="broken") >= 0


def test_ethtool_concurrent_scrapes_share_one_run(tmp_path):
    counter = tmp_path / "runs"
    script = tmp_path / "counting_ethtool"
    script.write_text(f"#!/bin/sh\necho run >> {counter}\nexec {FAKE_ETHTOOL} \"$@\"\n")
    script.chmod(0o755)
    c = EthtoolCollector(str(script), netdevs=["ens1f0np0"], cache_seconds=30)
    import threading
    threads = [threading.Thread(target=lambda: list(c.collect())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.read_text().count("run") == 1


def test_promtool_accepts_all_collectors():
    promtool = require_tool("promtool")
    text, _ = scrape(RdmaSysfsCollector(SYSFS), EthtoolCollector(FAKE_ETHTOOL, sysfs_root=SYSFS),
                     NetstatCollector(PROCFS))
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", r.stdout + r.stderr


def test_ethtool_scrapes_do_not_wait_on_a_refresh(tmp_path):
    """After the first run, a due refresh runs in the background: the scrape gets the last run."""
    runs = tmp_path / "runs"
    script = tmp_path / "slow_ethtool"
    # each run reports one more pause frame than the last, and takes 1 s
    script.write_text(f"#!/bin/sh\necho run >> {runs}\nsleep 1\n"
                      f"echo 'NIC statistics:'\necho \"     rx_prio3_pause: $(wc -l < {runs})\"\n")
    script.chmod(0o755)
    c = EthtoolCollector(str(script), netdevs=["eth9"], cache_seconds=0)

    def frames():
        (fam,) = c.collect()
        return fam.samples[0].value

    assert frames() == 1                                  # the first scrape runs ethtool itself
    start = time.monotonic()
    assert frames() == 1                                  # due: refresh started, last run served
    assert time.monotonic() - start < 0.5
    deadline = time.monotonic() + 20
    while frames() == 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert frames() >= 2                                  # the background run landed


def test_every_collector_file_registers_itself():
    """One file per collector, each registering its own factory (issue 27 item 6): the registry
    holds one collector per module of the package, found without a central list, and the config's
    default names only registered, selectable ones."""
    import pkgutil
    from collbench.config import EXPORTER_SCHEMA
    from collbench.config.schema import COUNTERS_COLLECTORS
    from collbench.exporter import collectors as pkg
    regs = pkg.registered()
    modules = {m.name for m in pkgutil.iter_modules(pkg.__path__)}
    assert {r.factory.__module__.rsplit(".", 1)[1] for r in regs.values()} == modules
    assert len(regs) == len(modules)
    assert set(EXPORTER_SCHEMA["collectors"][1]) <= set(pkg.selectable())
    assert {"legacy", "baseline"} <= set(regs) and not {"legacy", "baseline"} & set(pkg.selectable())
    # the shared table ctl's counters unit selects from says what the registrations say
    assert sorted(COUNTERS_COLLECTORS) == pkg.counters_collectors()
    assert "results" not in pkg.counters_collectors()
