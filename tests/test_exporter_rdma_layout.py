"""The RDMA sysfs collector's kept layout: counter files opened relative to kept directory
descriptors must follow devices and counters that are replaced, removed and added, hold a
bounded number of descriptors, and release them; the netstat collector's one-section parse
must equal the full parse."""

import gc
import os
import shutil
import threading

from conftest import FIXTURES, wait_for
from prometheus_client import CollectorRegistry, generate_latest
from exporter_helpers import parse_exposition, sample

from collbench.exporter.collectors import CollectorSet
from collbench.congestion.netstat import parse_netstat, section_fields
from collbench.exporter.collectors.rdma_sysfs import RdmaSysfsCollector

HW = "class/infiniband/mlx5_0/ports/1/hw_counters"


def scrape(c):
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CollectorSet([c]))
    return parse_exposition(generate_latest(reg).decode())


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def settled():
    """No thread of an earlier test (an ethtool refresh, a collection) is still closing descriptors."""
    assert wait_for(lambda: not [t for t in threading.enumerate()
                                 if t.name.startswith(("ethtool-refresh", "collector-"))], 10)
    gc.collect()


def cnp(m, dev="mlx5_0"):
    return sample(m, "collbench_rdma_np_cnp_sent_total", device=dev, port="1")


def test_replaced_counters_directory_is_followed(tmp_path):
    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sysfs-mlx5", sysfs, symlinks=True)
    c = RdmaSysfsCollector(str(sysfs))
    assert cnp(scrape(c)) == 48190

    # the counters directory is replaced by a new one (a driver reload): the kept descriptor
    # points at the removed one; at most one scrape may miss the series, then the new values show
    hw = sysfs / HW
    new = tmp_path / "new_hw"
    shutil.copytree(hw, new)
    (new / "np_cnp_sent").write_text("5\n")
    shutil.rmtree(hw)
    shutil.move(str(new), str(hw))
    values = [cnp(scrape(c)) for _ in range(2)]
    assert values[-1] == 5 and values[0] in (None, 5)

    # a counter written in place and one renamed over are both read fresh
    (hw / "np_cnp_sent").write_text("6\n")
    assert cnp(scrape(c)) == 6
    (tmp_path / "tmp").write_text("7\n")
    os.replace(tmp_path / "tmp", hw / "np_cnp_sent")
    assert cnp(scrape(c)) == 7

    # a new counter appears after the layout's refresh period (here: every scrape)
    c.layout_seconds = 0
    (hw / "brand_new_counter").write_text("11\n")
    assert sample(scrape(c), "collbench_rdma_brand_new_counter_total", device="mlx5_0", port="1") == 11


def test_removed_device_and_descriptors_bounded_and_released(tmp_path):
    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sysfs-mlx5", sysfs, symlinks=True)
    settled()
    before = open_fds()
    c = RdmaSysfsCollector(str(sysfs), layout_seconds=0)       # a rebuild on every scrape
    for _ in range(50):
        m = scrape(c)
    held = open_fds() - before
    assert 0 < held <= 4          # two ports, a hw_counters and a counters directory each
    assert cnp(m, "mlx5_1") is not None

    shutil.rmtree(sysfs / "class/infiniband/mlx5_1")
    m = scrape(c)
    assert cnp(m, "mlx5_1") is None and cnp(m) == 48190
    assert open_fds() - before <= 2

    shutil.rmtree(sysfs / "class/infiniband")                     # no devices at all
    m = scrape(c)
    assert sample(m, "collbench_collector_success", collector="rdma_sysfs") == 0
    assert open_fds() == before

    shutil.copytree(FIXTURES / "sysfs-mlx5", tmp_path / "sys2", symlinks=True)
    c2 = RdmaSysfsCollector(str(tmp_path / "sys2"))
    scrape(c2)
    assert open_fds() > before
    del c2
    gc.collect()
    assert open_fds() == before                                  # released with the collector


def test_concurrent_collections_with_rebuilds_read_the_right_files(tmp_path):
    """Collections from several threads while the layout is rebuilt every time: every value
    read belongs to its own label (a descriptor closed under another collection could make
    it read another directory)."""
    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sysfs-mlx5", sysfs, symlinks=True)
    c = RdmaSysfsCollector(str(sysfs), layout_seconds=0)
    expected = cnp(scrape(c)), cnp(scrape(c), "mlx5_1")
    assert expected[0] != expected[1]
    bad = []

    def work():
        for _ in range(40):
            m = scrape(c)
            got = cnp(m), cnp(m, "mlx5_1")
            if got != expected:
                bad.append(got)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


def test_netstat_one_section_equals_full_parse():
    for path in ("/proc/net/netstat", FIXTURES / "procfs" / "net" / "netstat"):
        with open(path) as f:
            text = f.read()
        full = parse_netstat(text)
        assert full["IpExt"] and full["TcpExt"]
        for section in full:
            assert section_fields(text, section) == full[section]
    assert section_fields(text, "NoSuch") == {}
