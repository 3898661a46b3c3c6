"""The exporter follows a job's NCCL Inspector directory (issue 29 item 2): a real `collbench
exporter --counters-only --inspector-dir` (the per-host exporter) while the stand-in writer
(lab/inspector_writer.py, the plugin's writer) writes 2.29 and 2.30 files into it: quantiles per
(op, size bucket, nranks, nodes, communicator), the slowest host, a persistent shift (and not a
spike), repeats counted once, the first dump's truncation and a new job's file read from the
start, files deleted at the end forgotten, bad lines counted, series bounded to the top-k
communicators by bytes."""

import os
import statistics
import time

import pytest

from conftest import wait_for
from exporter_helpers import ExporterProcess, sample
from lab.inspector_writer import InspectorWriter

from collbench.change_point import WARMUP

COMM = dict(comm_id="0x5e5e5e5e5e5e5e", n_ranks=4, nnodes=2)


def ar(sn, exec_us, rank=0, comm_name="dp", **kw):
    return dict(COMM, comm_name=comm_name, rank=rank, func="AllReduce", sn=sn, msg_bytes=4 << 20, exec_us=exec_us,
                **kw)


def scrape_when(ex, pred, timeout=30):
    box = {}

    def ok():
        box["m"] = ex.metrics()
        return pred(box["m"])
    assert wait_for(ok, timeout, interval=0.2), sorted(k for k in box["m"] if k[0].startswith("collbench_inspector"))
    return box["m"]


L = dict(op="allreduce", size="4MB", nranks="4", nodes="2")


def test_exporter_follows_an_inspector_directory(tmp_path, free_port):
    d = tmp_path / "inspector"
    d.mkdir()
    w0 = InspectorWriter(str(d), "n1", 11, shape="2.30", clock=time.time)
    w1 = InspectorWriter(str(d), "n2", 12, shape="2.30", clock=time.time)
    with ExporterProcess(["--counters-only", "--collectors", "netstat", "--inspector-dir", str(d)], free_port) as ex:
        ex.wait_ready(timeout=60)
        m = ex.metrics()
        assert sample(m, "collbench_collector_success", collector="inspector") == 1
        # 20 collectives: rank 0 on n1 at ~1000 us, rank 1 on n2 at ~1500 us
        sn = 0
        for i in range(WARMUP + 8):
            sn += 1
            w0.record(**ar(sn, 1000 + i % 3))
            w1.record(**ar(sn, 1500 + i % 3, rank=1))
        w0.dump()
        w1.dump()
        m = scrape_when(ex, lambda m: sample(m, "collbench_inspector_records_total") == 2 * (WARMUP + 8))
        lab = dict(L, comm_name="dp")
        assert sample(m, "collbench_inspector_ops", **lab) == 2 * (WARMUP + 8)
        assert sample(m, "collbench_inspector_latency_seconds", quantile="1", **lab) == pytest.approx(1502e-6)
        assert sample(m, "collbench_inspector_latency_seconds", quantile="0.5", **lab) == pytest.approx(1002e-6)
        assert sample(m, "collbench_inspector_slowest_host_latency_seconds", slowest_host="n2", **lab) == \
            pytest.approx(1501e-6)
        bw = sample(m, "collbench_inspector_busbw_bytes_per_second", **lab)
        # collbench's busbw (2(n-1)/n = 1.5 at 4 ranks) of every record, their median
        times = [1000 + i % 3 for i in range(WARMUP + 8)] + [1500 + i % 3 for i in range(WARMUP + 8)]
        assert bw == pytest.approx(statistics.median((4 << 20) / (t * 1e-6) * 1.5 for t in times))
        assert sample(m, "collbench_inspector_latency_shift", **lab) == 0
        assert 0 <= sample(m, "collbench_inspector_newest_record_age_seconds") < 30
        # a spike of one collective is not a shift; 8 collectives at 3x are
        sn += 1
        w0.record(**ar(sn, 9000))
        for i in range(3):
            sn += 1
            w0.record(**ar(sn, 1000))
        w0.dump()
        m = scrape_when(ex, lambda m: sample(m, "collbench_inspector_records_total") == 2 * (WARMUP + 8) + 4)
        assert sample(m, "collbench_inspector_latency_shift", **lab) == 0
        for i in range(8):
            sn += 1
            w0.record(**ar(sn, 3000 + i))
        w0.dump()
        m = scrape_when(ex, lambda m: sample(m, "collbench_inspector_latency_shift", **lab) == 1)
        assert sample(m, "collbench_inspector_latency_shift_ratio", **lab) > 2
        # bad lines counted, the good ones still read
        with open(w1.path, "a") as f:
            f.write('{"header":{}}\nnot json\n')
        w1.record(**ar(sn, 1500, rank=1))
        w1.dump()
        m = scrape_when(ex, lambda m: sample(m, "collbench_inspector_bad_lines_total") == 2)
        # the job ends: its files are deleted and forgotten; a new job (same pid, same name) truncates
        # on its first dump and is read from the start
        files_before = sample(m, "collbench_inspector_files")
        assert files_before == 2
        (d / w0.path.split("/")[-1]).unlink()
        m = scrape_when(ex, lambda m: sample(m, "collbench_inspector_files") == 1)
        w1b = InspectorWriter(str(d), "n2", 12, shape="2.30", clock=time.time)
        w1b.record(**ar(1, 700, rank=1, comm_name="tp", comm_id="0x77"))
        w1b.dump()
        m = scrape_when(ex, lambda m: sample(m, "collbench_inspector_ops", **dict(L, comm_name="tp")) == 1)
        assert sample(m, "collbench_inspector_file_resets_total") >= 1


def test_repeats_of_229_count_once_and_communicators_are_bounded(tmp_path, free_port):
    d = tmp_path / "nccl-inspector-99"
    d.mkdir()
    w = InspectorWriter(str(d), "n1", 5, shape="2.29", clock=time.time)
    # 30 communicators, communicator k moving k MB: the top 20 by bytes are exported
    for k in range(1, 31):
        w.record(comm_id=f"0x{k:x}", rank=0, n_ranks=2, nnodes=1, func="AllGather", sn=1, msg_bytes=k << 20,
                 exec_us=100 * k)
    for _ in range(3):
        w.dump()        # 2.29 writes each communicator's latest collective on every dump
    with ExporterProcess(["--counters-only", "--collectors", "netstat", "--inspector-dir", str(tmp_path)],
                         free_port) as ex:
        ex.wait_ready(timeout=60)
        m = scrape_when(ex, lambda m: sample(m, "collbench_inspector_records_total") == 30)
        assert sample(m, "collbench_inspector_duplicates_total") == 60
        assert sample(m, "collbench_inspector_communicators_not_exported") == 10
        exported = {dict(k[1])["comm_name"] for k in m if k[0] == "collbench_inspector_ops"}
        assert exported == {f"0x{k:x}" for k in range(11, 31)}
        # communicator 0x1e: an allgather of 30 MB per rank, in the 16MB bucket
        assert sample(m, "collbench_inspector_ops", op="allgather", size="16MB", nranks="2", nodes="1",
                      comm_name="0x1e") == 1


def test_prometheus_textfiles_are_read_when_they_change_and_forgotten_when_unlinked(tmp_path, free_port):
    d = tmp_path / "prom"
    d.mkdir()
    w = InspectorWriter(str(d), "n7", 3, shape="2.30", prom=True, uuid="0a1b2c3d-0000-4000-8000-000000000001",
                        job_id="12", clock=time.time)
    w.path = str(tmp_path / "json-elsewhere.log")      # the JSON log out of the followed directory
    for sn in (1, 2):
        w.record(comm_id="0x9", comm_name="pp", rank=0, n_ranks=16, nnodes=2, func="Broadcast", sn=sn,
                 msg_bytes=(3 << 20) + sn, exec_us=2000 + 100 * sn)
    w.dump()
    with ExporterProcess(["--counters-only", "--collectors", "netstat", "--inspector-dir", str(d)], free_port) as ex:
        ex.wait_ready(timeout=60)
        lab = dict(op="bcast", size="2MB", nranks="16", nodes="2", comm_name="pp")
        # one bucket ("3-4MB": its lower bound 3 MB, the 2MB bucket), its mean 2150 us: one observation
        m = scrape_when(ex, lambda m: sample(m, "collbench_inspector_ops", **lab) == 1)
        assert sample(m, "collbench_inspector_latency_seconds", quantile="0.5", **lab) == pytest.approx(2150e-6)
        assert sample(m, "collbench_inspector_slowest_host_latency_seconds", slowest_host="n7", **lab) is not None
        m = ex.metrics()      # unchanged: not read again
        assert sample(m, "collbench_inspector_ops", **lab) == 1
        w.record(comm_id="0x9", comm_name="pp", rank=0, n_ranks=16, nnodes=2, func="Broadcast", sn=3,
                 msg_bytes=3 << 20, exec_us=4000)
        time.sleep(0.01)
        w.dump()
        m = scrape_when(ex, lambda m: sample(m, "collbench_inspector_ops", **lab) == 2)
        assert sample(m, "collbench_inspector_latency_seconds", quantile="1", **lab) == pytest.approx(4000e-6)
        w.finalize()       # the job's end: the plugin unlinks its Prometheus files
        m = ex.metrics()
        assert sample(m, "collbench_collector_success", collector="inspector") == 1
        assert sample(m, "collbench_inspector_records_total") == 2


def test_a_large_log_found_mid_job_is_read_from_its_recent_end(tmp_path):
    """The exporter started while a job had written more than START_BYTES: it reads the recent end,
    starting at a line boundary (no bad line from the cut), and every line after."""
    from collbench.exporter.collectors.inspector import START_BYTES, InspectorCollector
    w = InspectorWriter(str(tmp_path), "n1", 9, shape="2.30", clock=time.time)
    sn = 0
    while not os.path.exists(w.path) or os.path.getsize(w.path) < START_BYTES + (1 << 20):
        for _ in range(2000):
            sn += 1
            w.record(**ar(sn, 1000 + sn % 5))
        w.dump()
    lines = sum(1 for _ in open(w.path))
    col = InspectorCollector(str(tmp_path), clock=time.time)
    got = 0
    for _ in range(10):
        got += col.poll()
    assert col.bad_lines == 0
    tail_lines = sum(1 for _ in open(w.path, "rb").read()[-START_BYTES:].split(b"\n")[1:] if _)
    assert got == tail_lines < lines
    w.record(**ar(sn + 1, 1000))
    w.dump()
    assert col.poll() == 1
