"""`collbench import nccl-inspector` (issue 29 item 1): every released shape of the NCCL
Inspector's output, written by the stand-in writer (lab/inspector_writer.py, itself checked here
against the plugin README's published samples, tests/fixtures/inspector/), becomes result records
with the rank spread; `report` and `baseline` read them unchanged; bad input is counted, and
nothing usable exits 2."""

import gzip
import json
import os
import subprocess
import sys

import pytest

from conftest import FIXTURES, REPO
from lab.inspector_writer import InspectorWriter, format_line

SAMPLES = FIXTURES / "inspector"
T0 = 1_790_000_000.0


def collbench(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def records_of(tmp_path, *paths):
    out = tmp_path / "out.jsonl"
    if out.exists():
        out.unlink()
    r = collbench("import", "nccl-inspector", *map(str, paths), "--results", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    return [json.loads(line) for line in out.read_text().splitlines()], r.stdout


class Clock:
    def __init__(self, t=T0):
        self.t = t

    def __call__(self):
        return self.t


def job(tmp_path, shape, hosts=("n1", "n2"), ranks_per_host=2, steps=3, late_rank=None, verbose=False,
        p2p=False, dumps_per_step=1, comm_name="dp_group", jobdir="nccl-inspector-4242"):
    """A 4-rank job's files: one writer per rank (one process per GPU), an AllReduce of 64 MiB and
    an AllGather of 1 MiB per rank each step; late_rank arrives 3 ms late (the others' kernels
    wait for it: its time is the shortest)."""
    d = tmp_path / jobdir
    d.mkdir(exist_ok=True)
    clock = Clock()
    n = len(hosts) * ranks_per_host
    writers = [InspectorWriter(str(d), hosts[r // ranks_per_host], 1000 + r, shape=shape, clock=clock)
               for r in range(n)]
    for step in range(steps):
        for func, size, base_us in (("AllReduce", 64 << 20, 9000), ("AllGather", 1 << 20, 800)):
            for r, w in enumerate(writers):
                exec_us = base_us + 3000 + r * 10 if late_rank is not None and r != late_rank else base_us + r * 10
                start = int(clock.t * 1e6) + (3000 if r == late_rank else 0)
                op = dict(comm_id="0x1a2b3c4d5e6f70", comm_name=comm_name, rank=r, n_ranks=n, nnodes=len(hosts),
                          func=func, sn=step + 1, msg_bytes=size, exec_us=exec_us, timing_source="kernel_gpu")
                if verbose:
                    op["trace"] = dict(start_sn=1, stop_sn=2, start_ts=start, stop_ts=start + 5,
                                       kernels=[(3, 40, 39, start + 100, start + 100 + exec_us, start + 100 + exec_us)
                                                for _ in range(2)])
                w.record(**op)
                if p2p and func == "AllGather":
                    w.record(comm_id="0x1a2b3c4d5e6f70", comm_name=comm_name, rank=r, n_ranks=n, nnodes=len(hosts),
                             kind="p2p", func="Send", sn=step + 1, peer=(r + 1) % n, msg_bytes=1 << 20,
                             exec_us=300, timing_source="kernel_gpu")
            clock.t += 0.05
            if shape != "2.30":     # the latest collective per communicator: dumps between ops see each
                dump(writers, clock, dumps_per_step)
        if shape == "2.30":
            dump(writers, clock, dumps_per_step)
    return d


def dump(writers, clock, times):
    for _ in range(times):
        for w in writers:
            w.dump()
        clock.t += 0.01


def test_stand_in_writes_the_published_samples_byte_for_byte():
    plain = (SAMPLES / "readme-sample.log").read_text()
    verbose = (SAMPLES / "readme-verbose-sample.log").read_text()
    assert format_line(dict(comm_id="0x7f8c496ae9f661", rank=2, n_ranks=8, nnodes=1, func="AllReduce", sn=1407,
                            msg_bytes=17179869184, exec_us=61974),
                       "2.28", "example-hostname", 1639453, 1748030377748202, "", "profiler_plugin") == plain
    assert format_line(dict(comm_id="0xe62dedaa97644a", rank=4, n_ranks=8, nnodes=1, func="ReduceScatter", sn=1231,
                            msg_bytes=2147483648, exec_us=41057, timing_source="kernel_gpu",
                            trace=dict(start_sn=1, stop_sn=2, start_ts=1752867229235059, stop_ts=1752867229235064,
                                       kernels=[(3, 48, 47, 1752867229235181, 1752867229275811, 1752867229275811)])),
                       "2.29", "example-hostname", 438776, 1752867229276385, "9019a1912-dirty") == verbose


def test_published_samples_import_with_collbench_sizes_and_bandwidth(tmp_path):
    recs, _ = records_of(tmp_path, SAMPLES / "readme-sample.log", SAMPLES / "readme-verbose-sample.log")
    by_op = {r["op"]: r for r in recs}
    ar, rs = by_op["allreduce"], by_op["reduce_scatter"]
    assert (ar["size_bytes"], ar["latency_avg_us"], ar["ranks"], ar["nodes"], ar["coll_sn"]) == \
        (17179869184, 61974, 8, 1, 1407)
    # collbench's busbw (ops.py factors) agrees with the plugin's own figure
    assert ar["busbw_bytes_per_s"] / 1e9 == pytest.approx(ar["inspector_busbw_gbs"], rel=1e-6)
    # ReduceScatter: the Inspector's size is the per-rank block; collbench's the whole send buffer
    assert rs["size_bytes"] == 2147483648 * 8 and rs["size"] == "16GB"
    assert rs["busbw_bytes_per_s"] / 1e9 == pytest.approx(366.134533, rel=1e-6)
    assert rs["t_start"] == pytest.approx(1752867229.235059) and "time" not in rs["unknown"]
    assert "time" in ar["unknown"] and ar["timing_source"] == "unknown" and rs["timing_source"] == "kernel_gpu"
    assert ar["engine"] == "nccl-inspector" and "datatype" not in ar and "datatype" in ar["unknown"]


@pytest.mark.parametrize("shape,form", [("2.28", "json-2.28"), ("2.29", "json-2.28/2.29"), ("2.30", "json-2.30+")])
def test_every_shape_one_record_per_collective_with_the_rank_spread(tmp_path, shape, form):
    d = job(tmp_path, shape, late_rank=2, dumps_per_step=3)
    recs, out = records_of(tmp_path, d)
    assert form in out
    # 2 ops x 3 steps, whatever the repeats (2.28/2.29 dump each communicator's latest on every dump)
    assert sorted((r["op"], r["coll_sn"]) for r in recs) == sorted((op, s) for op in ("allreduce", "allgather")
                                                                    for s in (1, 2, 3))
    if shape != "2.30":
        assert "repeated record(s) of one collective merged" in out and " 0 repeated" not in out
    ar = [r for r in recs if r["op"] == "allreduce"][0]
    assert (ar["ranks"], ar["nodes"], ar["hosts"], ar["ranks_reported"]) == (4, 2, ["n1", "n2"], 4)
    assert (ar["latency_min_us"], ar["latency_max_us"]) == (9020, 12030)
    assert ar["latency_avg_us"] == pytest.approx((12000 + 12010 + 9020 + 12030) / 4)
    assert (ar["waited_for_rank"], ar["waited_for_host"], ar["waited_for_by"]) == (2, "n2", "shortest_time")
    assert (ar["straggler_rank"], ar["straggler_host"]) == (3, "n2")
    assert ar["slurm_job_id"] == "4242" and ar["comm_id"] == "0x1a2b3c4d5e6f70"
    assert ("comm_name" in ar) == (shape == "2.30")
    ag = [r for r in recs if r["op"] == "allgather"][0]
    assert ag["size_bytes"] == 1 << 20      # per rank, as collbench's allgather
    assert ar["transport"] == "unknown" and "transport" in ar["unknown"]


def test_verbose_traces_name_the_rank_that_entered_last_and_p2p_is_counted(tmp_path):
    d = job(tmp_path, "2.30", late_rank=1, verbose=True, p2p=True)
    recs, out = records_of(tmp_path, d)
    ar = [r for r in recs if r["op"] == "allreduce"][0]
    assert (ar["waited_for_rank"], ar["waited_for_by"], ar["waited_for_host"]) == (1, "start_ts", "n1")
    assert ar["t_end"] > ar["t_start"] and "time" not in ar["unknown"]
    assert "12 point-to-point Send/Recv" in out       # 3 steps x 4 ranks, read and counted
    assert len(recs) == 6


def test_gz_and_quiet_ranks_name_nobody(tmp_path):
    d = job(tmp_path, "2.30", late_rank=None)
    for p in list(d.iterdir()):
        with open(p, "rb") as f, gzip.open(str(p) + ".gz", "wb") as g:
            g.write(f.read())
        p.unlink()
    recs, _ = records_of(tmp_path, d)
    assert len(recs) == 6 and not [r for r in recs if "waited_for_rank" in r]


def test_prometheus_textfiles_229_and_230(tmp_path):
    d = tmp_path / "prom"
    d.mkdir()
    labels = (SAMPLES / "readme-prom-labels.txt").read_text().strip()
    # 2.29: the README's labels, without the two it lists that the code does not emit
    (d / "nccl_inspector_metrics_a.prom").write_text(
        "".join(f"{m}{{{labels}}} {v}\n" for m, v in (("nccl_algorithm_bandwidth_gbs", "180.5"),
                                                        ("nccl_bus_bandwidth_gbs", "315.875"),
                                                        ("nccl_collective_exec_time_microseconds", "11897"))))
    recs, out = records_of(tmp_path, d / "nccl_inspector_metrics_a.prom")
    (r,) = recs
    assert "prom-2.29" in out
    assert (r["op"], r["size_bytes"], r["latency_avg_us"], r["rank"], r["host"], r["coll_sn"]) == \
        ("allreduce", 2 << 30, 11897.0, 4, "pool0-0002", 228924)
    # 2.30: the stand-in's buckets (one file per GPU), deleted at finalize
    w = InspectorWriter(str(d), "n1", 7, shape="2.30", prom=True, uuid="3f1c2a9e-0000-4000-8000-00000000abcd",
                        job_id="77", clock=Clock())
    for sn, t in enumerate((1000, 1100, 1200), 1):
        w.record(comm_id="0x1", comm_name="tp", rank=0, n_ranks=8, nnodes=1, func="AllReduce", sn=sn,
                 msg_bytes=8192 + sn, exec_us=t, algo_proto="RING_LL")
    w.record(comm_id="0x1", comm_name="tp", rank=0, n_ranks=8, nnodes=1, kind="p2p", func="Recv", sn=1, peer=3,
             msg_bytes=1 << 20, exec_us=50)
    w.dump()
    text = open(w.prom_path).read()
    assert 'message_size="8-9KB",algo_proto="RING_LL"} 1100\n' in text and "# " not in text
    # the RCCL fork's form: HELP/TYPE lines, a `cluster` label, its counters (known, not read)
    rccl = tmp_path / "rccl.prom"
    rccl.write_text("# HELP nccl_bus_bandwidth_gbs RCCL collective bus bandwidth in GB/s\n"
                    "# TYPE nccl_bus_bandwidth_gbs gauge\n"
                    + text.replace('version="v5.1",', 'version="v5.1",cluster="mi300",')
                    + 'nccl_collectives_total{version="v5.1",slurm_job_id="77",node="n1",gpu="GPU0"} 3\n')
    recs, _ = records_of(tmp_path, rccl)
    assert [(r["op"], r["latency_avg_us"]) for r in recs] == [("allreduce", 1100.0)]
    r = collbench("import", "nccl-inspector", str(rccl), "--format", "json")
    (summary,) = json.loads(r.stdout)
    assert (summary["form"], summary["bad_lines"], summary["p2p"]) == ("prom-2.30", 0, 1), summary
    recs, out = records_of(tmp_path, w.prom_path)
    assert "prom-2.30" in out
    (r,) = recs
    assert (r["op"], r["size_bytes"], r["latency_avg_us"], r["size_range"], r["slurm_job_id"], r["algorithm"]) == \
        ("allreduce", 8192, 1100.0, "8-9KB", "77", "RING_LL")
    w.finalize()
    assert not os.path.exists(w.prom_path)


def test_report_and_baseline_read_the_imported_records(tmp_path):
    d = job(tmp_path, "2.30", steps=6)
    results = tmp_path / "out.jsonl"
    r = collbench("import", "nccl-inspector", str(d), "--results", str(results), "--transport", "ucx")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    assert {r["transport"] for r in recs} == {"ucx"} and not [r for r in recs if "transport" in r["unknown"]]
    html = tmp_path / "r.html"
    r = collbench("report", str(results), "-o", str(html), "--no-peak")
    assert r.returncode == 0, r.stderr
    assert "nccl-inspector" in html.read_text() and "allreduce" in html.read_text().lower()
    state = tmp_path / "state"
    r = collbench("baseline", "save", "prod", "--from", str(results), "--state-dir", str(state), "--format", "json")
    assert r.returncode == 0, r.stderr
    r = collbench("baseline", "compare", "prod", "--state-dir", str(state), str(results), "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr


def test_bad_input_is_counted_and_nothing_usable_exits_2(tmp_path):
    d = job(tmp_path, "2.30", steps=1)
    log = sorted(d.glob("*.log"))[0]
    with open(log, "a") as f:
        f.write('{"header":{"id":"0x1","rank":9,"n_ranks":4,"nnodes":1},"metadata":{},"coll_perf":{}}\n')
        f.write("[" * 100000 + "\n")
        f.write('{"header":"x"}\n')
        f.write("x" * 300000 + "\n")
    recs, out = records_of(tmp_path, d)
    assert len(recs) == 2
    assert "header.rank: expected a whole number 0..3, got 9" in out and "not JSON" in out
    assert "header: expected an object" in out
    junk = tmp_path / "junk.log"
    junk.write_text("hello\n")
    r = collbench("import", "nccl-inspector", str(junk))
    assert r.returncode == 2 and "nothing to import" in r.stderr and "not JSON" in r.stderr, r.stderr
    bomb = tmp_path / "bomb.log.gz"
    bomb.write_bytes(gzip.compress(b"{" + b" " * (8 << 20)))     # one 8 MB line
    from collbench.bounded_file import UntrustedFileError
    from collbench.inspector.files import gunzip
    with pytest.raises(UntrustedFileError, match="decompresses to more than 1 MB"):
        gunzip(bomb.read_bytes(), 1 << 20)
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    r = collbench("import", "nccl-inspector", str(bomb), str(fifo), str(tmp_path / "missing.log"))
    assert r.returncode == 2 and "not a regular file" in r.stderr + r.stdout, r.stderr
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    r = collbench("import", "nccl-inspector", str(empty))
    assert r.returncode == 2 and "no NCCL Inspector file found" in r.stderr


def test_records_past_the_bound_are_counted_not_held(tmp_path, monkeypatch):
    """The records kept over all files are bounded (memory): the rest are counted in `skipped`."""
    from collbench.inspector import load as inspector_load
    d = job(tmp_path, "2.30", steps=3)
    whole = inspector_load.load([str(d)])
    read = sum(f.ops for f in whole.files)
    monkeypatch.setattr(inspector_load, "MAX_OPS", read - 2)
    cut = inspector_load.load([str(d)])
    assert sum(f.ops for f in cut.files) == read - 2
    assert cut.skipped == {f"records past the first {read - 2} (the import's bound)": 2}, cut.skipped
