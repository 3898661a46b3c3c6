"""`collbench sweep` with real mpirun at 2 ranks: the metrics report and TSV files against the
JSONL records of the same run, the console formats, OSU's iteration rule (also for `once
--sizes`), the OSU engine without per-iteration samples, and bad input (exit 2, nothing run or
written)."""

import csv
import io
import json
import signal
import subprocess
import sys
import time

import pytest

from collbench.config import Step, apply_overrides, load_config
from collbench.sweep import plan
from conftest import REPO

pytestmark = pytest.mark.mpi

STANDIN = REPO / "tests" / "osu_standin"
# The names the files promise (docs/REPORTS.md, "Sweeps"), written out here on purpose.
METADATA = ["run_id", "time", "op", "ranks", "nodes", "hosts", "dtype", "count", "size", "size_bytes", "iterations",
            "warmup", "samples", "transport", "engine", "algorithm", "timing", "mpi", "validation", "verdict"]
METRICS = ["latency (us)_avg", "latency (us)_p50", "latency (us)_p90", "latency (us)_p99", "latency (us)_pmax",
           "latency (us)_min", "latency (us)_max", "algbw (GB/s)_avg", "algbw (GB/s)_max", "algbw (GB/s)_min",
           "busbw (GB/s)_avg", "busbw (GB/s)_max", "busbw (GB/s)_min", "transferred_data (bytes)",
           "straggler_rank"]
COLUMNS = METADATA + METRICS + ["status", "error"]
SIZES = [4, 16, 64, 256, 1024, 4096]      # -b 4 -e 4KB -f 4


def sweep(*args, timeout=300, cwd=None):
    return subprocess.run([sys.executable, "-m", "collbench", "sweep", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_tsv(path):
    lines = path.read_text().split("\n")
    assert lines[-1] == ""
    rows = [line.split("\t") for line in lines[:-1]]
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    res = sweep("--np", "2", "--op", "allreduce", "--ops", "allgather,barrier", "-b", "4", "-e", "4KB", "-f", "4",
                "--iterations", "20", "--results", str(tmp / "results.jsonl"), "--out-dir", str(tmp / "out"),
                "--format", "json")
    assert res.returncode == 0, res.stderr
    return {"tmp": tmp, "out": tmp / "out", "stdout": res.stdout, "stderr": res.stderr,
            "records": read_jsonl(tmp / "results.jsonl")}


def approx(v):
    return pytest.approx(v, rel=1e-8, abs=1e-12)


def test_records_one_per_size_with_percentiles(run):
    recs = run["records"]
    assert [(r["op"], r["size_bytes"]) for r in recs] == \
        [("allreduce", s) for s in SIZES] + [("allgather", s) for s in SIZES] + [("barrier", 0)]
    assert len({r["run_id"] for r in recs}) == 1
    for r in recs:
        assert r["type"] == "result" and r["iterations"] == 20 and r["warmup"] == 2 and r["ranks"] == 2
        assert 0 < r["latency_p50_us"] <= r["latency_p90_us"] <= r["latency_p99_us"] <= r["latency_pmax_us"]
        # the slowest single iteration is at least the slowest rank's average
        assert r["latency_pmax_us"] >= r["latency_max_us"] * 0.999
        assert r["datatype"] == ("float" if r["op"] == "allreduce" else "char")


def test_metrics_report_against_the_records(run):
    lines = read_jsonl(run["out"] / "metrics_report.jsonl")
    recs = run["records"]
    assert len(lines) == len(recs) == 13
    for line, r in zip(lines, recs):
        assert list(line) == ["metadata", "metrics"]
        md, m = line["metadata"], line["metrics"]
        assert list(md) == METADATA and list(m) == METRICS
        width = 4 if r["op"] == "allreduce" else 1
        assert md == {"run_id": r["run_id"], "time": r["time"], "op": r["op"], "ranks": 2, "nodes": 1,
                      "hosts": ["localhost"], "dtype": r["datatype"], "count": r["size_bytes"] // width,
                      "size": r["size"], "size_bytes": r["size_bytes"], "iterations": 20, "warmup": 2,
                      "samples": 20, "transport": r["transport"], "engine": "builtin", "algorithm": None,
                      "timing": "osu", "mpi": r["mpi"], "validation": "off", "verdict": r["verdict"]}
        assert m["latency (us)_avg"] == r["latency_avg_us"]
        assert m["latency (us)_min"] == r["latency_min_us"] and m["latency (us)_max"] == r["latency_max_us"]
        for p in ("p50", "p90", "p99", "pmax"):
            assert m[f"latency (us)_{p}"] == r[f"latency_{p}_us"]
        assert m["straggler_rank"] == r["straggler_rank"]
        if r["op"] == "barrier":
            assert md["count"] == 0 and m["transferred_data (bytes)"] is None
            assert all(m[f"{bw} (GB/s)_{s}"] is None for bw in ("algbw", "busbw") for s in ("avg", "max", "min"))
            continue
        # by hand: S = size (allreduce) or size x 2 ranks (allgather); busbw factor at 2 ranks:
        # 2(n-1)/n = 1 for allreduce, (n-1)/n = 0.5 for allgather
        s_bytes = r["size_bytes"] * (2 if r["op"] == "allgather" else 1)
        factor = 1.0 if r["op"] == "allreduce" else 0.5
        assert m["transferred_data (bytes)"] == s_bytes
        assert m["algbw (GB/s)_avg"] == approx(r["algbw_bytes_per_s"] / 1e9)
        assert m["busbw (GB/s)_avg"] == approx(r["busbw_bytes_per_s"] / 1e9)
        assert m["algbw (GB/s)_max"] == approx(s_bytes / (r["latency_min_us"] * 1e-6) / 1e9)
        assert m["algbw (GB/s)_min"] == approx(s_bytes / (r["latency_max_us"] * 1e-6) / 1e9)
        assert m["busbw (GB/s)_max"] == approx(factor * s_bytes / (r["latency_min_us"] * 1e-6) / 1e9)
        assert m["busbw (GB/s)_min"] == approx(factor * s_bytes / (r["latency_max_us"] * 1e-6) / 1e9)
        assert m["busbw (GB/s)_min"] <= m["busbw (GB/s)_avg"] * (1 + 1e-6) <= m["busbw (GB/s)_max"] * (1 + 2e-6)


def test_tsv_files_one_per_op_with_the_reports_columns(run):
    run_id = run["records"][0]["run_id"]
    names = sorted(p.name for p in run["out"].iterdir())
    assert names == sorted(["metrics_report.jsonl"] + [f"t_{op}_{run_id}.tsv" for op in
                                                       ("allreduce", "allgather", "barrier")])
    report = read_jsonl(run["out"] / "metrics_report.jsonl")
    for op in ("allreduce", "allgather", "barrier"):
        header, rows = read_tsv(run["out"] / f"t_{op}_{run_id}.tsv")
        assert header == COLUMNS
        lines = [line for line in report if line["metadata"]["op"] == op]
        assert len(rows) == len(lines) == (1 if op == "barrier" else len(SIZES))
        for row, line in zip(rows, lines):
            assert row["status"] == "ok" and row["error"] == ""
            assert row["hosts"] == "localhost" and row["algorithm"] == ""
            for key, value in {**line["metadata"], **line["metrics"]}.items():
                if value is None:
                    assert row[key] == "", key
                elif isinstance(value, float):
                    assert float(row[key]) == approx(value), key
                elif isinstance(value, list):
                    assert row[key] == ",".join(value)
                else:
                    assert row[key] == str(value), key


def test_json_output_and_where_the_files_went(run):
    rows = json.loads(run["stdout"])
    report = read_jsonl(run["out"] / "metrics_report.jsonl")
    assert [list(r) for r in rows] == [COLUMNS] * len(report)
    for row, line in zip(rows, report):
        assert row == {**line["metadata"], **line["metrics"], "status": "ok", "error": None}
    run_id = run["records"][0]["run_id"]
    assert f"metrics report written to {run['out'] / 'metrics_report.jsonl'}" in run["stderr"]
    for op in ("allreduce", "allgather", "barrier"):
        assert f"{op} table written to {run['out'] / f't_{op}_{run_id}.tsv'}" in run["stderr"]
    assert f"results appended to {run['tmp'] / 'results.jsonl'}" in run["stderr"]


def test_table_and_csv_formats_and_the_report_is_appended(run, tmp_path):
    out = run["tmp"] / "out2"
    res = sweep("--np", "2", "--op", "reduce", "--sizes", "8,1KB", "-n", "10", "--out-dir", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("collbench sweep: run ") and "2 ranks on 1 node" in lines[0]
    assert lines[2] == "Reduce (float, 2 ranks on 1 node)"
    assert lines[3].split() == ["size", "count", "iters", "avg", "p50", "p90", "p99", "pmax", "min", "max",
                                "algbw", "GB/s", "busbw", "GB/s", "valid", "verdict"]
    assert lines[5].split()[:3] == ["8B", "2", "10"] and lines[6].split()[:3] == ["1KB", "256", "10"]
    assert "percentiles of the per-iteration time of the slowest rank" in res.stdout
    assert "no per-iteration samples" not in res.stdout
    res2 = sweep("--np", "2", "--op", "reduce", "--sizes", "8,1KB", "-n", "10", "--out-dir", str(out), "--quiet",
                 "--format", "csv")
    assert res2.returncode == 0, res2.stderr
    rows = list(csv.DictReader(io.StringIO(res2.stdout)))
    assert list(rows[0]) == COLUMNS and [r["size"] for r in rows] == ["8B", "1KB"]
    assert all(float(r["latency (us)_p50"]) > 0 for r in rows)
    # the report keeps both runs (appended); each run has its own TSV
    report = read_jsonl(out / "metrics_report.jsonl")
    assert len(report) == 4 and len({line["metadata"]["run_id"] for line in report}) == 2
    assert len(list(out.glob("t_reduce_*.tsv"))) == 2


def test_osu_engine_has_no_samples_and_says_so(tmp_path):
    cfg = tmp_path / "osu.yaml"
    cfg.write_text(f"engine: osu\nosu_path: {STANDIN}\nranks: 2\n")
    res = sweep("--config", str(cfg), "--op", "allreduce", "--sizes", "1KB,4KB", "-n", "10", "--out-dir",
                str(tmp_path / "out"), "--results", str(tmp_path / "r.jsonl"), "--quiet")
    assert res.returncode == 0, res.stderr
    assert "engine osu: no per-iteration samples, so the p50/p90/p99/pmax columns are empty" in res.stdout
    lines = res.stdout.splitlines()
    header = next(ln for ln in lines if ln.split()[:2] == ["size", "count"])
    for size in ("1KB", "4KB"):
        row = next(ln for ln in lines if ln.split()[:1] == [size])
        # right-aligned columns: the cells between avg's and pmax's right edges are blank
        assert row[header.index(" avg") + 4:header.index(" pmax") + 5].strip() == "", row
        assert row[:header.index(" avg") + 4].split()[-1] == "us" and "us" in row[header.index(" pmax") + 5:]
    recs = read_jsonl(tmp_path / "r.jsonl")
    assert [r["engine"] for r in recs] == ["osu", "osu"] and all("latency_p50_us" not in r for r in recs)
    report = read_jsonl(tmp_path / "out" / "metrics_report.jsonl")
    for line in report:
        assert line["metadata"]["samples"] == 0 and line["metadata"]["engine"] == "osu"
        assert all(line["metrics"][f"latency (us)_{p}"] is None for p in ("p50", "p90", "p99", "pmax"))
        assert line["metrics"]["latency (us)_avg"] > 0
    res = sweep("--config", str(cfg), "--op", "allreduce", "--sizes", "1KB", "-n", "10", "--out-dir",
                str(tmp_path / "out"), "--quiet", "--format", "csv")
    assert res.returncode == 0
    assert "no per-iteration samples" in res.stderr
    (row,) = csv.DictReader(io.StringIO(res.stdout))
    assert row["latency (us)_p50"] == "" and row["latency (us)_pmax"] == "" and row["engine"] == "osu"


# ---------------------------------------------------------------- OSU's iteration rule

def test_osu_iteration_rule_for_every_size_without_a_count(tmp_path):
    res = sweep("--np", "2", "--op", "bcast", "--sizes", "8KB,16KB", "--out-dir", str(tmp_path), "--results",
                str(tmp_path / "r.jsonl"), "--quiet")
    assert res.returncode == 0, res.stderr
    assert [(r["size_bytes"], r["iterations"], r["warmup"]) for r in read_jsonl(tmp_path / "r.jsonl")] == \
        [(8192, 1000, 100), (16384, 100, 10)]


def test_sweep_plan_iterations():
    steps = plan.build_steps(["allreduce", "barrier"], [4, 8192, 8196, 1 << 20])
    assert [(s.op, s.size_bytes, s.iterations, s.warmup, s.samples) for s in steps] == [
        ("allreduce", 4, 1000, 100, True), ("allreduce", 8192, 1000, 100, True),
        ("allreduce", 8196, 100, 10, True), ("allreduce", 1 << 20, 100, 10, True),
        ("barrier", 0, 1000, 100, True)]
    steps = plan.build_steps(["allreduce"], [4, 1 << 20], iterations=50)
    assert [(s.iterations, s.warmup) for s in steps] == [(50, 5), (50, 5)]
    steps = plan.build_steps(["allreduce"], [4, 1 << 20], warmup=0)
    assert [(s.iterations, s.warmup) for s in steps] == [(1000, 0), (100, 0)]
    assert plan.size_range("4", "4KB", 4) == [4, 16, 64, 256, 1024, 4096]
    assert plan.size_range("1KB", "5KB", 2) == [1024, 2048, 4096]     # 5KB not reached exactly
    assert plan.size_range("1MB", "1MB", 2) == [1 << 20]


def test_once_sizes_get_osus_rule_unless_the_plan_sets_a_count(tmp_path):
    cfg = apply_overrides(load_config(None), ops="allreduce,bcast", sizes="1KB,8KB,16KB,4MB")
    assert {(s.size_bytes, s.iterations, s.warmup) for s in cfg.plan} == {
        (1024, 1000, 100), (8192, 1000, 100), (16384, 100, 10), (4 << 20, 100, 10)}
    path = tmp_path / "c.yaml"
    # a count set in the plan is kept, even one that happens to be OSU's for the step's own size
    path.write_text("plan:\n  - {op: allreduce, sizes: [1KB], iterations: 1000, warmup: 7}\n"
                    "  - {op: bcast, sizes: [1KB]}\n")
    cfg = apply_overrides(load_config(str(path)), sizes="1KB,1MB")
    assert [(s.op, s.size_bytes, s.iterations, s.warmup) for s in cfg.plan] == [
        ("allreduce", 1024, 1000, 7), ("allreduce", 1 << 20, 1000, 7),
        ("bcast", 1024, 1000, 100), ("bcast", 1 << 20, 100, 10)]
    # equality of steps ignores where the count came from
    assert Step("allreduce", 4, 1, 1, "float", iterations_set=True) == Step("allreduce", 4, 1, 1, "float")


def test_once_sizes_real_run_and_help(tmp_path):
    res = subprocess.run([sys.executable, "-m", "collbench", "once", "--np", "2", "--ops", "allreduce", "--sizes",
                          "8KB,16KB", "--results", str(tmp_path / "r.jsonl"), "--quiet"], capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert [(r["size_bytes"], r["iterations"], r["warmup"]) for r in read_jsonl(tmp_path / "r.jsonl")] == \
        [(8192, 1000, 100), (16384, 100, 10)]
    helptext = subprocess.run([sys.executable, "-m", "collbench", "once", "--help"], capture_output=True, text=True,
                              timeout=60, cwd=REPO).stdout
    assert "OSU's iteration count (1000 + 100 warm-up up to 8KB, 100 + 10 above)" in " ".join(helptext.split())
    helptext = sweep("--help").stdout
    assert "1000 timed + 100 warm-up up to 8KB and 100 + 10 above" in " ".join(helptext.split())


# ---------------------------------------------------------------- bad input and interruption

@pytest.mark.parametrize("args, expected", [
    (["--min-bytes", "0"], "--min-bytes: '0' is out of range (1 B to 2GB)"),
    (["--min-bytes", "1KB", "--max-bytes", "512"], "--max-bytes 512B is below --min-bytes 1KB"),
    (["--max-bytes", "4GB"], "--max-bytes: '4GB' is out of range: above the 2 GB limit"),
    (["--factor", "1"], "--factor: got 1, expected a whole number from 2"),
    (["--factor", "1.5"], "argument --factor/-f: invalid int value: '1.5'"),
    (["--sizes", "1KB,lots"], "--sizes: 'lots' is not a size"),
    (["--sizes", ","], "--sizes: expected a comma list of sizes"),
    (["--sizes", "1KB", "-b", "4"], "give either --sizes or --min-bytes/--max-bytes/--factor"),
    (["--op", "allreduce,nope"], "--op 'nope': unknown op"),
    (["--op", ","], "--op: expected an op"),
    (["-b", "6", "-e", "24"], "size 6B (6 B) is not a whole number of float elements (4 B) for allreduce"),
    (["--datatype", "quad"], "argument --datatype: invalid choice: 'quad'"),
    (["--iterations", "0"], "--iterations: got 0"),
    (["--warmup", "-1"], "--warmup: got -1"),
    (["--np", "0"], "--np: got 0"),
    (["--engine", "nccl"], "argument --engine: invalid choice: 'nccl'"),
    (["--format", "xml"], "argument --format: invalid choice: 'xml'"),
])
def test_bad_input_exits_2_and_runs_nothing(tmp_path, args, expected):
    out = tmp_path / "out"
    res = sweep("--np", "2", "--out-dir", str(out), "--results", str(tmp_path / "r.jsonl"), *args, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert expected in res.stderr, res.stderr
    assert not out.exists() and not (tmp_path / "r.jsonl").exists()
    assert res.stdout == ""


def test_bad_output_paths_exit_2(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "metrics_report.jsonl").mkdir()
    for args, expected in (
            (["--out-dir", str(tmp_path / "file")], "exists and is not a directory"),
            (["--out-dir", str(tmp_path / "dir")], f"{tmp_path / 'dir' / 'metrics_report.jsonl'}: is a directory"),
            (["--out-dir", str(tmp_path / "file" / "sub")], "cannot be created"),
            (["--results", str(tmp_path / "dir")], "--results " + str(tmp_path / "dir") + ": is a directory"),
            (["--results", str(tmp_path / "no" / "r.jsonl")], "does not exist"),
            (["--config", str(tmp_path / "none.yaml")], "config file does not exist")):
        res = sweep("--np", "2", "--sizes", "1KB", *(["--out-dir", str(tmp_path / "o")] if args[0] != "--out-dir"
                                                     else []), *args, timeout=60)
        assert res.returncode == 2 and expected in res.stderr, (args, res.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"]
    assert [p.name for p in (tmp_path / "dir").iterdir()] == ["metrics_report.jsonl"]


def test_sigterm_stops_the_job_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "collbench", "sweep", "--np", "2", "--op", "allreduce",
                             "--sizes", "1KB,1MB", "-n", "20000", "--out-dir", str(out), "--results",
                             str(tmp_path / "r.jsonl")], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        # the first size is done (a progress line) while the second runs for a long time (20,000 calls
        # of 1MB: seconds here, the signal lands within milliseconds of the line; 1KB's share is
        # 0.3 s alone, where 200,000 calls took 3 s alone and 50 s on a loaded machine)
        line = proc.stderr.readline()
        deadline = time.monotonic() + 240
        while "[1/2]" not in line and time.monotonic() < deadline and line:
            line = proc.stderr.readline()
        assert "[1/2] allreduce 1KB" in line, line
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    assert "terminated after 1 of 2 steps; no file written" in err
    assert not out.exists() and not (tmp_path / "r.jsonl").exists()


def test_a_plan_larger_than_the_engine_reads_is_refused_before_running(tmp_path):
    """10,000 sizes x 6 ops (issue 19 item 8): the engine refuses a plan file over 1 MB, and would
    refuse it again in every job relaunched after the failure (~2 s x 60,000 steps). Exit 2 at
    once, naming the plan's size and the limit, nothing written."""
    out = tmp_path / "out"
    sizes = ",".join(str(8 * k) for k in range(1, 10_001))
    started = time.monotonic()
    res = sweep("--np", "2", "--ops", "allreduce,bcast,reduce,allgather,alltoall,reduce_scatter", "--sizes", sizes,
                "--datatype", "long", "--out-dir", str(out), "--results", str(tmp_path / "r.jsonl"), timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "the plan of 60000 steps is " in res.stderr
    plan_bytes = int(res.stderr.split("the plan of 60000 steps is ")[1].split()[0])
    assert plan_bytes > 1048576
    assert "above collbench-engine's limit of 1048576 bytes" in res.stderr
    assert time.monotonic() - started < 60
    assert not out.exists() and not (tmp_path / "r.jsonl").exists() and res.stdout == ""


def test_the_plan_limit_is_the_engines():
    from collbench.engines.builtin import MAX_PLAN_BYTES
    source = (REPO / "collbench" / "engines" / "collbench_engine.c").read_text()
    (line,) = [ln for ln in source.splitlines() if ln.startswith("#define MAX_PLAN_BYTES ")]
    assert eval(line.split(None, 2)[2]) == MAX_PLAN_BYTES       # "(1 << 20)": a C and Python expression
