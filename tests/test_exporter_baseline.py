"""The exporter's baseline collector: collbench_baseline_* beside the live series, from a baseline
saved by the real `collbench baseline save`; promtool-clean; labels identical to the live ones;
a missing, malformed or hostile file is the collector's failure and never the scrape's; a file
replaced under a running exporter is served at the next scrape."""

import json
import os
import subprocess
import sys
import time

import pytest

from collbench.baselines.baseline_file import from_dict
from collbench.exporter.collectors import CollectorSet
from collbench.exporter.collectors.baseline import BaselineCollector, choose_entries
from conftest import REPO, require_tool, wait_for
from exporter_helpers import ExporterProcess, append, result_line, sample

LIVE = (("allreduce", 1 << 20, 300.0), ("allreduce", 1024, 20.0), ("bcast", 4 << 20, 900.0), ("barrier", 0, 5.0))
LABELS = ("op", "size", "size_bytes", "nodes", "ranks")


def write_log(path, factor=1.0, seq=1):
    now = time.time()
    for i, (op, size, us) in enumerate(LIVE):
        append(path, result_line(seq + i, op=op, size_bytes=size, avg_us=us * factor, nodes=2, ranks=4, ts=now))


def save_baseline(tmp_path, log, name="base.json", *extra):
    res = subprocess.run([sys.executable, "-m", "collbench", "baseline", "save", str(tmp_path / name), "--from",
                          str(log), *extra], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    return tmp_path / name


def families(text):
    from prometheus_client.parser import text_string_to_metric_families
    return {f.name: f for f in text_string_to_metric_families(text)}


def exporter(tmp_path, log, port, *args):
    return ExporterProcess(["--results-log", str(log), "--state-dir", str(tmp_path / "state"), "--max-age", "86400",
                            "--poll-interval", "0.2", "--collectors", "results", *args], port)


def test_baseline_series_match_the_live_series_and_pass_promtool(tmp_path, free_port):
    promtool = require_tool("promtool")
    log = tmp_path / "results.jsonl"
    write_log(log)
    base_log = tmp_path / "baseline-runs.jsonl"
    write_log(base_log, factor=0.5)            # the baseline: twice as fast
    write_log(base_log, factor=0.5, seq=10)    # two runs per key
    baseline = save_baseline(tmp_path, base_log)
    with exporter(tmp_path, log, free_port, "--baseline", str(baseline)) as ex:
        ex.wait_ready()
        status, _, text = ex.get()
        assert status == 200
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                               timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        fams = families(text)
        live = {tuple(s.labels[k] for k in LABELS): s.value for s in fams["collbench_latency_avg_seconds"].samples}
        base = {tuple(s.labels[k] for k in LABELS): s.value for s in fams["collbench_baseline_latency_seconds"].samples}
        # identical label sets (and no other labels), so live / baseline matches one to one
        assert all(set(s.labels) == set(LABELS) for s in fams["collbench_baseline_latency_seconds"].samples)
        assert set(live) == set(base) and len(live) == len(LIVE)
        for key, value in live.items():
            assert value / base[key] == pytest.approx(2.0)
        metrics = ex.metrics()
        assert sample(metrics, "collbench_baseline_latency_seconds", op="allreduce", size="1MB",
                      size_bytes=1 << 20, nodes=2, ranks=4) == pytest.approx(150e-6)
        assert sample(metrics, "collbench_baseline_latency_sigma_seconds", op="allreduce", size="1MB",
                      size_bytes=1 << 20, nodes=2, ranks=4) == 0.0
        assert sample(metrics, "collbench_baseline_runs", op="bcast", size="4MB", size_bytes=4 << 20,
                      nodes=2, ranks=4) == 2
        # busbw: twice the live one (half the latency); barrier has none
        busbw = {s.labels["op"] + s.labels["size"]: s.value
                 for s in fams["collbench_baseline_busbw_bytes_per_second"].samples}
        live_bw = {s.labels["op"] + s.labels["size"]: s.value for s in fams["collbench_busbw_bytes_per_second"].samples}
        assert set(busbw) == set(live_bw) and "barrier-" not in busbw
        for k in busbw:
            assert busbw[k] == pytest.approx(2 * live_bw[k], rel=1e-6)
        assert sample(metrics, "collbench_baseline_info", baseline="base") == 1
        assert sample(metrics, "collbench_collector_success", collector="baseline") == 1
        created = sample(metrics, "collbench_baseline_created_timestamp_seconds")
        assert created == pytest.approx(json.loads(baseline.read_text())["created_ts"])


def test_missing_then_saved_then_malformed_then_replaced(tmp_path, free_port):
    log = tmp_path / "results.jsonl"
    write_log(log)
    path = tmp_path / "later.json"
    with exporter(tmp_path, log, free_port, "--baseline", str(path)) as ex:
        ex.wait_ready()
        m = ex.metrics()
        # missing: the collector failed, the scrape and the live series did not
        assert sample(m, "collbench_collector_success", collector="baseline") == 0
        assert sample(m, "collbench_collector_success", collector="results") == 1
        assert sample(m, "collbench_latency_avg_seconds", op="bcast", size="4MB", size_bytes=4 << 20, nodes=2,
                      ranks=4) == pytest.approx(900e-6)
        assert not any(n.startswith("collbench_baseline_") for n, _ in m)

        save_baseline(tmp_path, log, "later.json")
        m = wait_for(lambda: (lambda m: m if sample(m, "collbench_collector_success", collector="baseline") == 1
                              else None)(ex.metrics()), timeout=10)
        assert m, "the saved baseline was not picked up"
        assert sample(m, "collbench_baseline_latency_seconds", op="bcast", size="4MB", size_bytes=4 << 20, nodes=2,
                      ranks=4) == pytest.approx(900e-6)

        # malformed in place: its series go, the collector reports the failure, the scrape goes on
        path.write_text('{"format": "collbench-baseline", "version": 1, "entries": [{"op": "allreduce"}]}')
        m = ex.metrics()
        assert sample(m, "collbench_collector_success", collector="baseline") == 0
        assert not any(n.startswith("collbench_baseline_") for n, _ in m)
        assert sample(m, "collbench_collector_success", collector="results") == 1

        # replaced (baseline save --force) with other values: served at the next scrape
        other = tmp_path / "other.jsonl"
        write_log(other, factor=3.0)
        save_baseline(tmp_path, other, "later.json", "--force")
        m = ex.metrics()
        assert sample(m, "collbench_collector_success", collector="baseline") == 1
        assert sample(m, "collbench_baseline_latency_seconds", op="bcast", size="4MB", size_bytes=4 << 20, nodes=2,
                      ranks=4) == pytest.approx(2700e-6)


def test_bad_baseline_name_is_exit_2(tmp_path, free_port):
    log = tmp_path / "results.jsonl"
    write_log(log)
    for args, where in ((["--baseline", "no spaces/allowed"], "--baseline"), ([], "exporter.baseline")):
        cfg = tmp_path / "c.yaml"
        cfg.write_text("exporter:\n  baseline: 'bad name'\n" if not args else "{}\n")
        res = subprocess.run([sys.executable, "-m", "collbench", "exporter", "--config", str(cfg),
                              "--listen", f"127.0.0.1:{free_port}", "--results-log", str(log), *args],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
        assert res.returncode == 2, res.stderr
        assert where in res.stderr and "expected letters, digits" in res.stderr


def test_a_baseline_path_in_the_config_is_relative_to_the_config(tmp_path, free_port):
    log = tmp_path / "results.jsonl"
    write_log(log)
    (tmp_path / "conf").mkdir()
    save_baseline(tmp_path / "conf", log, "b.json")
    cfg = tmp_path / "conf" / "collbench.yaml"
    cfg.write_text("exporter:\n  baseline: b.json\n")
    with ExporterProcess(["--config", str(cfg), "--results-log", str(log), "--state-dir", str(tmp_path),
                          "--max-age", "86400", "--collectors", "results"], free_port) as ex:
        ex.wait_ready()
        assert sample(ex.metrics(), "collbench_collector_success", collector="baseline") == 1


# ---------------------------------------------------------------- the collector in-process, untrusted files

def collect(collector):
    out = {}
    for fam in CollectorSet([collector]).collect():
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def success(values):
    return values[("collbench_collector_success", (("collector", "baseline"),))]


HOSTILE = [
    b"",
    b"\xff\xfe not utf-8",
    b"[]",
    b"null",
    b'{"format": "collbench-baseline", "version": 1, "entries": "many"}',
    b'{"format": "collbench-baseline", "version": 1, "entries": [{"op": "allreduce", "size_bytes": -1}]}',
    b'{"format": "collbench-baseline", "version": 1, "entries": [{"op": "nope"}]}',
    b'{"format": "collbench-baseline", "version": 1, "entries": [{"op": "bcast", "size_bytes": 1024, "ranks": 2, '
    b'"nodes": 1, "n": 1, "latency_avg_us": {"median": 1e999, "mad": 0}}]}',
    b'{"format": "collbench-baseline", "version": 1, "entries": [{"op": "bcast", "size_bytes": 1024, "ranks": 2, '
    b'"nodes": 1, "n": 1, "latency_avg_us": {"median": NaN, "mad": 0}}]}',
    b"[" * 100000 + b"]" * 100000,
    b'{"format": "collbench-baseline", "version": 2, "entries": []}',
]


@pytest.mark.parametrize("content", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_baseline_files_fail_only_the_collector(tmp_path, content):
    path = tmp_path / "b.json"
    path.write_bytes(content)
    values = collect(BaselineCollector(str(path), str(tmp_path)))
    assert success(values) == 0
    assert not any(name.startswith("collbench_baseline_") for name, _ in values)


def test_a_directory_or_fifo_in_place_of_the_file_fails_the_collector(tmp_path):
    (tmp_path / "dir.json").mkdir()
    assert success(collect(BaselineCollector(str(tmp_path / "dir.json"), str(tmp_path)))) == 0
    os.mkfifo(tmp_path / "fifo.json")
    start = time.monotonic()
    assert success(collect(BaselineCollector(str(tmp_path / "fifo.json"), str(tmp_path)))) == 0
    assert time.monotonic() - start < 10   # never waits on a FIFO


def entry(op="allreduce", size=1 << 20, ranks=4, nodes=2, transport="ucx", engine="builtin", algorithm=None, n=3,
          median=100.0, last_ts=1.0, variant=""):
    return {"op": op, "size_bytes": size, "ranks": ranks, "nodes": nodes, "transport": transport, "engine": engine,
            "algorithm": algorithm, "variant": variant, "n": n, "latency_avg_us": {"median": median, "mad": 1.0},
            "last_ts": last_ts}


def test_one_series_per_live_label_set_the_exporters_transport_and_engine_first():
    b = from_dict({"format": "collbench-baseline", "version": 1, "entries": [
        entry(transport="ucx", median=100.0, n=3),
        entry(transport="ob1-tcp", median=200.0, n=9),
        entry(transport="ucx", algorithm="ring", median=50.0, n=9),
        entry(transport="ucx", variant="sustained", median=60.0, n=9),
        entry(op="bcast", transport="ob1-tcp", variant="inplace", median=500.0, n=9, last_ts=20.0),
        entry(op="bcast", transport="ob1-tcp", median=300.0, n=5, last_ts=5.0),
        entry(op="bcast", transport="ob1-tcp", engine="osu", median=400.0, n=2, last_ts=9.0),
        entry(op="reduce", transport="ob1-tcp", median=10.0, n=2, last_ts=5.0),
        entry(op="reduce", transport="ob1-tcp", engine="osu", median=20.0, n=2, last_ts=9.0),
        entry(op="alltoall", nodes=None, median=7.0),          # no node count: no live series can match
    ]})
    chosen = choose_entries(b, transport="ucx", engine="builtin")
    assert {k: e.median_us for k, e in chosen.items()} == {
        ("allreduce", "1MB", str(1 << 20), "2", "4"): 100.0,   # ucx/builtin without an algorithm
        ("bcast", "1MB", str(1 << 20), "2", "4"): 300.0,       # none matches: a plain one, the most runs
        ("reduce", "1MB", str(1 << 20), "2", "4"): 20.0,       # ... then the newest
    }
    chosen = choose_entries(b, transport="ob1-tcp", engine="builtin")
    assert chosen[("allreduce", "1MB", str(1 << 20), "2", "4")].median_us == 200.0


def test_series_are_capped_at_max_series(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"format": "collbench-baseline", "version": 1,
                                "entries": [entry(size=4 * (i + 1)) for i in range(50)]}))
    values = collect(BaselineCollector(str(path), str(tmp_path), max_series=20))
    assert success(values) == 1
    assert sum(1 for name, _ in values if name == "collbench_baseline_latency_seconds") == 20
