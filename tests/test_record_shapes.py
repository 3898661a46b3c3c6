"""Older and other writers' record shapes stay readable (docs/LOG_FORMAT.md, "Shapes readers accept").

The format only ever adds fields, so a log written before a field existed, or by a writer that
leaves an optional one out, must be read by every reader: the exporter, `stress log|status`,
`report` and `baseline`. Each shape below is a record the current writers make (collbench.results.records)
with the fields it did not have taken out; each reader is run for real on a log holding every
shape, and must use every record (none counted as a bad line).
"""

import json
import time

from collbench.config import load_config
from collbench.results import records
from collbench.sizes import format_size
from conftest import unused_port
from exporter_helpers import ExporterProcess, parse_exposition, sample
from report_helpers import collbench

CTX = records.RunContext(load_config(None), "builtin", "mpirun (Open MPI) 4.1.4")

# name -> (type, size_bytes of its result, fields left out). Sizes differ so that every result
# shape is its own (op, size) series in each reader.
SHAPES = {
    # the example: a writer from before straggler detection (or OSU's, which has none)
    "result without straggler_rank": ("result", 1 << 10, ("straggler_rank",)),
    # a writer without thresholds or validation
    "result without verdict, validation, status": ("result", 2 << 10, ("verdict", "validation", "status")),
    # a writer that times only the average (no per-rank spread, no bandwidth, no counts)
    "result with the average only": ("result", 4 << 10, ("latency_min_us", "latency_max_us", "iterations",
                                                          "warmup", "algbw_bytes_per_s", "busbw_bytes_per_s")),
    # a writer that knows nothing of the run around the measurement
    "result without run metadata": ("result", 8 << 10, ("run_id", "hosts", "engine", "mpi", "transport", "time",
                                                         "datatype", "size")),
    # only what readers need: op, size_bytes, latency_avg_us, ranks, nodes, ts, type, schema
    "result, required fields only": ("result", 16 << 10, ("straggler_rank", "verdict", "validation", "status",
                                                          "latency_min_us", "latency_max_us", "iterations", "warmup",
                                                          "algbw_bytes_per_s", "busbw_bytes_per_s", "run_id", "hosts",
                                                          "engine", "mpi", "transport", "time", "datatype", "size")),
    "failure without stderr_tail, exit_code, run metadata": ("failure", None, ("stderr_tail", "exit_code", "run_id",
                                                                              "hosts", "nodes", "ranks", "engine",
                                                                              "mpi", "transport", "time", "status")),
    "event without pid and detail": ("event", None, ("pid", "detail", "time")),
}
RESULT_SIZES = {size for kind, size, _ in SHAPES.values() if kind == "result"}


def shaped(name, ts, seq):
    kind, size, drop = SHAPES[name]
    if kind == "result":
        rec = records.result_record(CTX, "allreduce", size, "float", 100.0 + size / 1024, 90.0, 120.0, 100, 10,
                                    validation="pass", straggler_rank=3, ranks=4, ts=ts)
    elif kind == "failure":
        rec = records.failure_record(CTX, "MPI job exited with code 1 during bcast 1KB", "rank 1 died",
                                     op_name="bcast", size_bytes=1024, exit_code=1, ts=ts)
    else:
        rec = records.event_record("relaunch", pid=4242, detail="relaunch 1 after 1 failure(s)", ts=ts,
                                   run_id=CTX.run_id, attempt=1)
    for field in drop:
        assert field in rec, (name, field)     # the shape really lacks something today's writer writes
        del rec[field]
    rec["seq"] = seq
    return rec


def write_log(path, ts=None):
    ts = time.time() if ts is None else ts
    recs = [shaped(name, ts + i * 0.001, i + 1) for i, name in enumerate(SHAPES)]
    with open(path, "a", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    return recs


def count(kind):
    return sum(1 for k, _, _ in SHAPES.values() if k == kind)


# ------------------------------------------------------------------ exporter

def test_exporter_uses_every_shape(tmp_path):
    log = tmp_path / "results.jsonl"
    log.write_text("")
    with ExporterProcess(["--results-log", str(log), "--state-dir", str(tmp_path), "--collectors", "results",
                          "--poll-interval", "0.1"], unused_port()) as ex:
        ex.wait_ready(timeout=60)
        write_log(log)
        deadline = time.monotonic() + 60
        while True:
            m = parse_exposition(ex.get()[2])
            done = sample(m, "collbench_results_records_total", type="event")
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert sample(m, "collbench_results_parse_errors_total") == 0
    assert sample(m, "collbench_results_records_total", type="result") == count("result")
    assert sample(m, "collbench_results_records_total", type="failure") == count("failure")
    assert sample(m, "collbench_results_records_total", type="event") == count("event")
    for size in RESULT_SIZES:
        got = sample(m, "collbench_latency_avg_seconds", op="allreduce", size=format_size(size), size_bytes=size,
                     nodes=1, ranks=4)
        assert got is not None and abs(got - (100.0 + size / 1024) / 1e6) < 1e-12, (size, got)
    assert sample(m, "collbench_benchmark_failures_total", op="bcast") == 1


# ------------------------------------------------------------------ stress log / status

def test_stress_log_and_status_use_every_shape(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    recs = write_log(state / "results.jsonl")
    p = collbench("stress", "log", "--state-dir", str(state), "--json", "-n", "100")
    assert p.returncode == 0, p.stderr
    assert "not a valid record" not in p.stderr, p.stderr
    assert [json.loads(ln)["seq"] for ln in p.stdout.splitlines()] == [r["seq"] for r in recs]
    p = collbench("stress", "log", "--state-dir", str(state), "-n", "100")
    assert p.returncode == 0 and len(p.stdout.splitlines()) == len(SHAPES), p.stdout + p.stderr
    p = collbench("stress", "status", "--state-dir", str(state), "--json")
    st = json.loads(p.stdout)
    assert st["bad_lines"]["count"] == 0, st["bad_lines"]
    assert {r["size_bytes"] for r in st["last_results"]} == RESULT_SIZES
    assert st["last_failure"]["op"] == "bcast"
    p = collbench("stress", "status", "--state-dir", str(state))
    assert "WARNING" not in p.stdout and p.stdout.count("allreduce") == len(RESULT_SIZES), p.stdout


# ------------------------------------------------------------------ report

def test_report_uses_every_shape(tmp_path):
    log = tmp_path / "results.jsonl"
    write_log(log)
    out = tmp_path / "report.html"
    p = collbench("report", str(log), "-o", str(out), "--no-peak")
    assert p.returncode == 0, p.stderr
    assert f"{len(SHAPES)} record(s)" in p.stderr and "bad line" not in p.stderr, p.stderr
    assert out.stat().st_size > 0


# ------------------------------------------------------------------ baseline

def test_baseline_uses_every_shape(tmp_path):
    log = tmp_path / "results.jsonl"
    write_log(log)
    state = ["--state-dir", str(tmp_path / "state")]
    p = collbench("baseline", "save", "shapes", "--from", str(log), *state)
    assert p.returncode == 0, p.stderr
    saved = json.loads((tmp_path / "state" / "baselines" / "shapes.json").read_text())
    assert "bad line" not in p.stderr, p.stderr
    text = json.dumps(saved)
    for size in RESULT_SIZES:
        assert f'"size_bytes": {size}' in text or f'"size_bytes":{size}' in text, (size, text[:500])
    p = collbench("baseline", "compare", "shapes", str(log), "--format", "json", *state)
    assert p.returncode == 0, p.stdout + p.stderr
