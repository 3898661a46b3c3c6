"""`collbench once` end to end: the CLI as a subprocess, real mpirun at 2 ranks.

The built-in engine runs for real. The OSU engine runs tests/osu_standin/osu_<op> (OSU cannot be
built here; see tests/test_osu_engine.py), which also lets a test make one step fail or hang.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from collbench.ops import get_op
from conftest import REPO

STANDIN = REPO / "tests" / "osu_standin"
pytestmark = pytest.mark.mpi

RESULT_FIELDS = {
    "schema", "type", "time", "ts", "run_id", "hosts", "nodes", "ranks", "engine", "mpi", "transport",
    "op", "datatype", "size", "size_bytes", "latency_avg_us", "latency_min_us", "latency_max_us",
    "iterations", "warmup", "algbw_bytes_per_s", "busbw_bytes_per_s", "validation", "straggler_rank",
    "verdict", "status"}


def once(*args, env=None, cwd=REPO, timeout=180):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "collbench", "once", *args], capture_output=True,
                          text=True, cwd=cwd, env=full_env, timeout=timeout)


def osu_config(tmp_path, extra=""):
    path = tmp_path / "osu.yaml"
    path.write_text(f"engine: osu\nosu_path: {STANDIN}\nranks: 2\n{extra}")
    return str(path)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_tsv(path):
    lines = path.read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:]]


def test_builtin_run_table_jsonl_tsv(tmp_path):
    results, tsv = tmp_path / "r.jsonl", tmp_path / "r.tsv"
    p = once("--np", "2", "--ops", "allreduce,bcast,barrier", "--sizes", "1KB,64KB", "--iterations", "20",
             "--results", str(results), "--tsv", str(tsv))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "engine builtin" in out and "2 ranks on 1 node (localhost)" in out
    for title in ("Allreduce (float, 2 ranks on 1 node)", "Broadcast (char, 2 ranks on 1 node)",
                  "Barrier (char, 2 ranks on 1 node)"):
        assert title in out
    allreduce = out.split("Allreduce (")[1].split("\n\n")[0].splitlines()
    assert allreduce[1].split() == ["size", "avg", "min", "max", "slowest", "algbw", "GB/s", "busbw",
                                    "GB/s", "valid", "verdict"]
    assert [r.split()[0] for r in allreduce[3:]] == ["1KB", "64KB"]
    assert all(" us " in r or " ms " in r for r in allreduce[3:])
    assert allreduce[3].split()[-1] in ("Good", "Warning", "Critical")  # seed 001 sets allreduce 1KB

    recs = read_jsonl(results)
    assert [(r["op"], r["size_bytes"]) for r in recs] == [
        ("allreduce", 1024), ("allreduce", 65536), ("bcast", 1024), ("bcast", 65536), ("barrier", 0)]
    for r in recs:
        assert RESULT_FIELDS <= set(r), RESULT_FIELDS - set(r)
        assert (r["type"], r["status"], r["engine"], r["transport"]) == ("result", "ok", "builtin", "shm")
        assert (r["hosts"], r["nodes"], r["ranks"], r["iterations"]) == (["localhost"], 1, 2, 20)
        assert "Open MPI" in r["mpi"]
        assert r["straggler_rank"] in (0, 1)
        assert 0 < r["latency_min_us"] <= r["latency_avg_us"] <= r["latency_max_us"]
        algbw, busbw = get_op(r["op"]).bandwidth(r["size_bytes"], 2, r["latency_avg_us"])
        assert r["algbw_bytes_per_s"] == (None if algbw is None else round(algbw, 1))
        assert r["busbw_bytes_per_s"] == (None if busbw is None else round(busbw, 1))
    assert len({r["run_id"] for r in recs}) == 1

    rows = read_tsv(tsv)
    assert [(r["op"], r["size"]) for r in rows] == [
        ("allreduce", "1KB"), ("allreduce", "64KB"), ("bcast", "1KB"), ("bcast", "64KB"), ("barrier", "-")]
    assert float(rows[1]["busbw_GBps"]) == pytest.approx(recs[1]["busbw_bytes_per_s"] / 1e9, rel=1e-5)
    assert rows[4]["busbw_GBps"] == "" and rows[0]["status"] == "ok"
    # progress: one line per step on a non-terminal stderr
    progress = [ln for ln in p.stderr.splitlines() if ln.startswith("[")]
    assert [ln.split("]")[0] for ln in progress] == ["[1/5", "[2/5", "[3/5", "[4/5", "[5/5"]


def test_narrowing_flags_and_append(tmp_path):
    results, tsv = tmp_path / "r.jsonl", tmp_path / "r.tsv"
    for _ in range(2):
        p = once("--np", "2", "--ops", "bcast", "--sizes", "4KB", "--iterations", "7", "--quiet",
                 "--results", str(results), "--tsv", str(tsv))
        assert p.returncode == 0, p.stderr
        assert not [ln for ln in p.stderr.splitlines() if ln.startswith("[")]  # --quiet
    recs = read_jsonl(results)
    assert [(r["op"], r["size_bytes"], r["iterations"]) for r in recs] == [("bcast", 4096, 7)] * 2
    assert len({r["run_id"] for r in recs}) == 2          # the JSONL file is appended to
    assert len(read_tsv(tsv)) == 1                        # the TSV is this run's table
    assert "Allreduce" not in p.stdout and "4KB" in p.stdout


def test_osu_engine_failed_step_exit_1(tmp_path):
    results, tsv = tmp_path / "r.jsonl", tmp_path / "r.tsv"
    p = once("--config", osu_config(tmp_path), "--ops", "allreduce,bcast", "--sizes", "1KB,1MB",
             "--iterations", "10", "--results", str(results), "--tsv", str(tsv),
             env={"OSU_STANDIN_FAIL": "bcast"})
    assert p.returncode == 1, p.stderr
    assert "FAILED: osu_bcast 1KB: exit code" in p.stdout and "simulated rank failure" in p.stdout
    assert "195.53 us" in p.stdout  # allreduce 1MB from the captured OSU output
    recs = read_jsonl(results)
    assert [(r["type"], r["op"], r["size_bytes"]) for r in recs] == [
        ("result", "allreduce", 1024), ("result", "allreduce", 1048576),
        ("failure", "bcast", 1024), ("failure", "bcast", 1048576)]
    fail = recs[2]
    assert fail["status"] == "failed" and fail["exit_code"] != 0
    assert "simulated rank failure" in fail["stderr_tail"]
    assert recs[0]["engine"] == "osu" and recs[0]["straggler_rank"] is None
    rows = read_tsv(tsv)
    assert rows[2]["status"] == "failed" and rows[2]["size"] == "1KB" and "exit code" in rows[2]["error"]
    assert "2 failed" in p.stderr


def test_validation_failure_exit_1(tmp_path):
    p = once("--config", osu_config(tmp_path), "--ops", "reduce", "--sizes", "1KB", "--iterations", "5",
             "--validate", env={"OSU_STANDIN_BADVALID": "reduce"})
    assert p.returncode == 1
    row = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("1KB")][0]
    assert " fail " in row
    assert "1 failed validation" in p.stderr


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_run_writes_nothing_and_stops_mpi(tmp_path, sig, code):
    results = tmp_path / "r.jsonl"
    results.write_text('{"kept": true}\n')
    env = dict(os.environ, OSU_STANDIN_HANG="bcast", COLLBENCH_TEST_TOKEN=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "collbench", "once", "--config", osu_config(tmp_path),
                             "--ops", "allreduce,bcast", "--sizes", "1KB", "--iterations", "5",
                             "--results", str(results), "--tsv", str(tmp_path / "r.tsv")],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()   # allreduce finished; bcast now hangs
        assert first.startswith("[1/2] allreduce 1KB")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert "no result file written" in err
    # the hanging rank was stopped with its job, not orphaned
    left = [p for p in os.listdir("/proc") if p.isdigit() and f"COLLBENCH_TEST_TOKEN={tmp_path}" in _environ(p)]
    assert [(p, open(f"/proc/{p}/cmdline").read(), open(f"/proc/{p}/stat").read()) for p in left] == []
    assert results.read_text() == '{"kept": true}\n'
    assert not (tmp_path / "r.tsv").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no temp files left


def test_controller_once_from_repo_root(tmp_path):
    p = subprocess.run([sys.executable, "mpi_test_controller.py", "once", "--np", "2", "--ops", "barrier",
                        "--iterations", "5", "--results", str(tmp_path / "r.jsonl")],
                       cwd=REPO, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert "Barrier (char, 2 ranks on 1 node)" in p.stdout
    (rec,) = read_jsonl(tmp_path / "r.jsonl")
    assert (rec["op"], rec["iterations"], rec["ranks"]) == ("barrier", 5, 2)


def test_live_progress_line_on_a_terminal(tmp_path):
    import pty
    master, slave = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "collbench", "once", "--config", osu_config(tmp_path),
                            "--ops", "allreduce,barrier", "--sizes", "1KB", "--iterations", "5"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=slave, text=True, timeout=120)
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side is closed and drained
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    err = b"".join(chunks).decode()
    assert p.returncode == 0
    # one line rewritten in place (carriage return + erase line), cleared before the summary
    assert "\r\x1b[K[1/2] allreduce 1KB (float, 5 iterations)" in err
    assert "\r\x1b[K[1/2] allreduce 1KB: avg 1.03 us" in err
    assert "\r\x1b[K[2/2] barrier: avg 0.32 us" in err
    assert "\n[" not in err
    assert "\r\x1b[Kcollbench: 2 records from 2 steps" in err
    assert "Allreduce (float, 2 ranks on 1 node)" in p.stdout


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# ------------------------------------------------------------------ tables and files (units)

def test_latency_units_and_table_rows():
    from collbench.config import Step
    from collbench.once.report_table import render_tables
    from collbench.tables import format_gb_per_s as format_gbps, format_us as format_latency
    assert [format_latency(v) for v in (0.42, 999.994, 1000.0, 38900.0, 2.5e6, None)] == [
        "0.42 us", "999.99 us", "1.00 ms", "38.90 ms", "2.50 s", "-"]
    assert [format_gbps(v) for v in (3.2e9, 1.2e7, None)] == ["3.20", "0.0120", "-"]
    recs = [
        {"type": "result", "op": "allreduce", "size_bytes": 4194304, "datatype": "float",
         "latency_avg_us": 38900.0, "latency_min_us": 38000.0, "latency_max_us": 40100.0,
         "straggler_rank": 5, "algbw_bytes_per_s": 1.078e8, "busbw_bytes_per_s": 1.887e8,
         "validation": "pass", "verdict": "Good"},
        {"type": "failure", "op": "allreduce", "size_bytes": 1024, "error": "allreduce 1KB: MPI job exited with code 1"},
    ]
    steps = [Step("allreduce", 1024, 10, 1, "float"), Step("allreduce", 65536, 10, 1, "float"),
             Step("allreduce", 4194304, 10, 1, "float")]
    text = render_tables(recs, steps, ranks=8, nodes=8)
    lines = text.splitlines()
    assert lines[0] == "Allreduce (float, 8 ranks on 8 nodes)"
    assert lines[3].split() == ["1KB", "FAILED:", "allreduce", "1KB:", "MPI", "job", "exited", "with", "code", "1"]
    assert lines[4].split()[:2] == ["64KB", "NOT"] and "NOT RUN" in lines[4]
    assert lines[5].split() == ["4MB", "38.90", "ms", "38.00", "ms", "40.10", "ms", "rank", "5", "0.11", "0.19",
                                "pass", "Good"]


def test_jsonl_append_is_atomic_and_keeps_the_old_file(tmp_path):
    from collbench.results.output_files import write_jsonl
    path = tmp_path / "r.jsonl"
    path.write_text('{"old": 1}')            # a torn last line without its newline
    os.chmod(path, 0o600)
    write_jsonl(path, [{"a": 1}, {"b": float("nan")}])
    assert path.read_text() == '{"old": 1}\n{"a":1}\n{"b":null}\n'
    assert path.stat().st_mode & 0o777 == 0o600
    before = path.read_text()

    def broken():
        yield {"c": 1}
        raise RuntimeError("disk gone")      # fails half-way through the new records
    with pytest.raises(RuntimeError):
        write_jsonl(path, broken())
    assert path.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["r.jsonl"]


def test_tsv_fields_never_break_lines(tmp_path):
    from collbench.results.output_files import write_tsv
    path = tmp_path / "t.tsv"
    write_tsv(path, [{"type": "failure", "op": "bcast", "size_bytes": 2048, "ranks": 4, "status": "failed",
                      "error": "bcast 2KB:\tline one\nline two"}, {"type": "event", "event": "start"}])
    header, row = path.read_text().splitlines()
    cells = dict(zip(header.split("\t"), row.split("\t")))
    assert len(row.split("\t")) == len(header.split("\t"))
    assert (cells["op"], cells["size"], cells["status"], cells["error"]) == (
        "bcast", "2KB", "failed", "bcast 2KB: line one line two")


def test_configured_thresholds_set_the_verdict(tmp_path):
    extra = ("thresholds:\n  default_latency: false\n  latency:\n"
             "    allreduce:\n      1KB: {warning: 0.5us, critical: 1us}\n"
             "      1MB: {warning: 150us, critical: 300us}\n")
    results = tmp_path / "r.jsonl"
    p = once("--config", osu_config(tmp_path, extra), "--ops", "allreduce,bcast", "--sizes", "1KB,1MB",
             "--iterations", "5", "--results", str(results))
    assert p.returncode == 0, p.stderr
    verdicts = {(r["op"], r["size"]): r["verdict"] for r in read_jsonl(results)}
    # captured OSU figures: allreduce 1KB 1.03 us (> 1 us), 1MB 195.53 us (150..300 us)
    assert verdicts == {("allreduce", "1KB"): "Critical", ("allreduce", "1MB"): "Warning",
                        ("bcast", "1KB"): None, ("bcast", "1MB"): None}   # seed defaults off
    rows = {ln.split()[0]: ln.split()[-1] for ln in p.stdout.split("Allreduce (")[1].split("\n\n")[0].splitlines()[3:]}
    assert rows == {"1KB": "Critical", "1MB": "Warning"}


SRUN_CRASHING_ONCE = """#!/bin/sh
# srun whose first job dies in start-up as Open MPI's PMIx race makes it (a segfault before any rank
# finished MPI_Init: nothing printed, exit 139); later jobs run the engine (one rank, MPI singleton)
case "$*" in *collbench-engine*) ;; *) echo "slurm 22.05.8"; exit 0;; esac   # --version
n=$(cat "$0.count" 2>/dev/null || echo 0); echo $((n + 1)) > "$0.count"
[ "$n" -lt {crashes} ] && {{ echo "srun: error: node1: task 0: Segmentation fault" >&2; exit 139; }}
while [ $# -gt 0 ]; do case "${{1##*/}}" in collbench-engine*) break;; esac; shift; done
exec "$@"
"""


@pytest.mark.parametrize("crashes, rc", [(1, 0), (2, 1)])
def test_a_job_that_dies_in_start_up_under_srun_is_launched_once_more(tmp_path, crashes, rc):
    srun = tmp_path / "srun"
    srun.write_text(SRUN_CRASHING_ONCE.format(crashes=crashes))
    srun.chmod(0o755)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"launcher: srun\nlauncher_path: {srun}\nranks: 1\n")
    results = tmp_path / "r.jsonl"
    p = once("--config", str(cfg), "--ops", "allreduce", "--sizes", "1KB", "--iterations", "2",
             "--results", str(results), "-q")
    assert p.returncode == rc, p.stdout + p.stderr
    assert (tmp_path / "srun.count").read_text().strip() == "2"       # launched twice, never a third time
    assert p.stderr.count("before every rank finished MPI_Init") == 1, p.stderr
    (rec,) = read_jsonl(results)
    assert rec["type"] == ("result" if rc == 0 else "failure"), rec
    if rc:
        assert "139" in rec["error"] and "Segmentation fault" in rec["error"], rec
