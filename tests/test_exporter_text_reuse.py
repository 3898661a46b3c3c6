"""The scrape path's shortcuts must not change what is served: FamilyTextReuse gives exactly
prometheus_client's encoding of a fresh collection, and the RDMA collector's cached directory
layout follows counters and devices that come and go."""

import shutil
from types import SimpleNamespace

from prometheus_client import generate_latest

from conftest import FIXTURES
from collbench.exporter.app import Exporter
from collbench.exporter.server import FamilyTextReuse

TIME_BASED = ("collbench_collector_duration_seconds",)


def _app(tmp_path, sysfs):
    s = SimpleNamespace(results_log=str(tmp_path / "results.jsonl"), state_dir=str(tmp_path / "state"),
                        max_age=900.0, poll_interval=1.0, legacy_metrics=False,
                        collectors=["results", "rdma_sysfs", "netstat"], sysfs_root=str(sysfs),
                        procfs_root=str(FIXTURES / "procfs"), ethtool="ethtool", netdevs=None,
                        device_include=None, device_exclude=None, backfill_bytes=1 << 20)
    return Exporter(s)


def _stable(text):
    return [ln for ln in text.decode().splitlines() if not ln.startswith(TIME_BASED)]


def test_reused_text_equals_a_fresh_encoding_as_counters_change(tmp_path):
    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sysfs-mlx5", sysfs, symlinks=True)
    app = _app(tmp_path, sysfs)
    reuse = FamilyTextReuse(generate_latest)
    counter = sysfs / "class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent"

    first = reuse(app.registry)
    assert _stable(first) == _stable(generate_latest(app.registry))
    assert 'collbench_rdma_np_cnp_sent_total{device="mlx5_0",port="1"}' in first.decode()

    counter.write_text("987654321\n")                       # a counter moves between scrapes
    second = reuse(app.registry)
    assert _stable(second) == _stable(generate_latest(app.registry))
    assert 'collbench_rdma_np_cnp_sent_total{device="mlx5_0",port="1"} 9.87654321e+08' in second.decode()

    counter.unlink()                                          # a counter disappears: no series, no error
    third = reuse(app.registry).decode()
    assert 'np_cnp_sent_total{device="mlx5_0"' not in third
    assert 'collbench_collector_success{collector="rdma_sysfs"} 1.0' in third

    shutil.rmtree(sysfs / "class/infiniband/mlx5_1")          # a device goes away
    fourth = reuse(app.registry).decode()
    assert 'device="mlx5_1"' not in fourth and 'device="mlx5_0"' in fourth
