"""The OSU engine cannot be instrumented from inside: each step's record gets the launching
host's counters around the whole OSU run (source "osu-run"), results and failures alike. Real
mpirun jobs of the OSU stand-in (tests/osu_standin); the host's RDMA counters are a fixture tree
that a thread drives upward while the jobs run."""

import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from collbench.config import apply_overrides, load_config
from collbench.engines import osu as osu_engine
from collbench.results.record_parser import ParseError, parse_record
from collbench.results.records import RunContext, dumps

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.mpi


def test_osu_steps_carry_the_launching_hosts_counters_around_each_run(tmp_path, monkeypatch):
    sysfs = tmp_path / "sys"
    shutil.copytree(REPO / "tests/fixtures/sysfs-mlx5", sysfs, symlinks=True)
    counter = sysfs / "class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent"
    host = socket.gethostname()
    cfg_path = tmp_path / "osu.yaml"
    cfg_path.write_text(f"engine: osu\nosu_path: {REPO / 'tests/osu_standin'}\nranks: 2\n"
                        f"congestion:\n  enabled: true\n  sysfs_root: {tmp_path / 'elsewhere'}\n"
                        f"  hosts:\n    {host}: {{sysfs_root: {sysfs}, netstat: {tmp_path / 'no-netstat'}}}\n")
    cfg = load_config(str(cfg_path))
    apply_overrides(cfg, ops="bcast,allgather", sizes="2KB", iterations=10)
    monkeypatch.setenv("OSU_STANDIN_FAIL", "bcast")
    stop, driven = threading.Event(), [0]

    def drive():
        value = int(counter.read_text())
        while not stop.is_set():
            value += 5
            driven[0] += 5
            tmp = counter.with_name("np_cnp_sent.new")
            tmp.write_text(f"{value}\n")
            tmp.replace(counter)
            time.sleep(0.002)
    t = threading.Thread(target=drive, daemon=True)
    t.start()
    try:
        ctx = RunContext(cfg, "osu", "test-mpi", run_id="t")
        recs = list(osu_engine.run_steps(cfg, cfg.plan, ctx))
    finally:
        stop.set()
        t.join()
    assert [r["type"] for r in recs] == ["failure", "result"]
    total = 0
    for r in recs:
        c = r["congestion"]
        assert c["source"] == "osu-run" and c["hosts_read"] == 1
        (key,) = c["moved"]          # the driven counter only: the fixture's others stand still
        assert key.endswith("|np_cnp_sent@mlx5_0/1") and c["moved"][key] % 5 == 0
        total += c["moved"][key]
        assert not isinstance(parse_record(dumps(r)), ParseError)
    assert 0 < total <= driven[0]
