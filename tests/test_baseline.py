"""`collbench baseline save|compare|show|list`: a synthetic 2x slowdown is caught (exit 1), a run
within noise is not (exit 0), a slowdown inside a noisy baseline's spread is `noisy`; baselines
saved from real `collbench once` runs; the baseline file is untrusted input (exit 2)."""

import csv
import io
import json
import random
import signal
import statistics

import pytest

from collbench.baselines import key_of, load_baseline, regression_bound_us
from report_helpers import collbench, signal_at_progress

KEYS = [("allreduce", 1 << 10, 12.0), ("allreduce", 1 << 16, 40.0), ("allreduce", 1 << 20, 300.0),
        ("bcast", 1 << 20, 120.0), ("barrier", 0, 3.0)]


def _rec(op, size, lat, run_id, ts, ranks=4, transport="ucx", **extra):
    from collbench.sizes import format_size
    rec = {"schema": 1, "time": "2026-11-22T15:58:48.140Z", "ts": ts, "type": "result", "run_id": run_id,
           "hosts": ["n1", "n1", "n2", "n2"][:ranks], "nodes": 2, "ranks": ranks, "engine": "builtin",
           "mpi": "mpirun (Open MPI) 4.1.4", "transport": transport, "op": op,
           "datatype": "float" if op == "allreduce" else "char", "size": format_size(size) if size else "-",
           "size_bytes": size, "latency_avg_us": lat, "latency_min_us": lat * 0.95, "latency_max_us": lat * 1.05,
           "iterations": 100, "warmup": 10, "algbw_bytes_per_s": size / lat * 1e6 if size else None,
           "busbw_bytes_per_s": size / lat * 1e6 if size else None, "validation": "off", "straggler_rank": 1,
           "verdict": None, "status": "ok"}
    rec.update(extra)
    return rec


def runs_file(path, runs=5, jitter=0.03, seed=1, scale=None, base=KEYS):
    """`runs` runs of every key, each latency jittered by up to +-jitter; scale: {(op, size): factor}."""
    rng = random.Random(seed)
    values = {}
    with open(path, "w") as f:
        for r in range(runs):
            for op, size, lat in base:
                v = round(lat * (1 + rng.uniform(-jitter, jitter)) * (scale or {}).get((op, size), 1.0), 4)
                values.setdefault((op, size), []).append(v)
                f.write(json.dumps(_rec(op, size, v, f"run{seed}-{r}", 1795400000.0 + r)) + "\n")
    return values


def base_args(tmp_path):
    return ["--state-dir", str(tmp_path / "state")]


def compare_json(tmp_path, name, results, *extra):
    p = collbench("baseline", "compare", name, str(results), "--format", "json", *base_args(tmp_path), *extra)
    return p, (json.loads(p.stdout) if p.stdout.strip() else None)


def test_save_then_2x_slowdown_is_a_regression_and_noise_is_not(tmp_path):
    base_values = runs_file(tmp_path / "base.jsonl", seed=1)
    p = collbench("baseline", "save", "weekly", "--from", str(tmp_path / "base.jsonl"), *base_args(tmp_path))
    assert p.returncode == 0, p.stderr
    saved = json.loads((tmp_path / "state" / "baselines" / "weekly.json").read_text())
    assert saved["format"] == "collbench-baseline" and saved["version"] == 1 and len(saved["entries"]) == len(KEYS)
    e = next(x for x in saved["entries"] if x["op"] == "allreduce" and x["size_bytes"] == 1 << 20)
    vals = base_values[("allreduce", 1 << 20)]
    med = statistics.median(vals)
    assert e["n"] == 5 and e["latency_avg_us"]["median"] == pytest.approx(med)
    assert e["latency_avg_us"]["sigma"] == pytest.approx(1.4826 * statistics.median(abs(v - med) for v in vals))
    assert (e["ranks"], e["nodes"], e["transport"], e["engine"], e["algorithm"]) == (4, 2, "ucx", "builtin", None)

    # a run within noise (other jitter, same speed): nothing flagged, exit 0
    runs_file(tmp_path / "same.jsonl", runs=3, seed=2)
    p, out = compare_json(tmp_path, "weekly", tmp_path / "same.jsonl")
    assert p.returncode == 0, p.stdout + p.stderr
    assert {r["verdict"] for r in out["rows"]} == {"ok"}

    # allreduce 1MB twice as slow: caught, exit 1, only that row
    runs_file(tmp_path / "slow.jsonl", runs=3, seed=3, scale={("allreduce", 1 << 20): 2.0})
    p, out = compare_json(tmp_path, "weekly", tmp_path / "slow.jsonl")
    assert p.returncode == 1, p.stdout + p.stderr
    bad = [(r["op"], r["size_bytes"]) for r in out["rows"] if r["verdict"] == "regression"]
    assert bad == [("allreduce", 1 << 20)]
    row = next(r for r in out["rows"] if r["verdict"] == "regression")
    assert 1.8 < row["ratio"] < 2.2 and row["current_n"] == 3 and row["baseline_n"] == 5
    assert "regression(s) against baseline weekly" in p.stderr

    # the table names it too
    p = collbench("baseline", "compare", "weekly", str(tmp_path / "slow.jsonl"), *base_args(tmp_path))
    assert p.returncode == 1 and "REGRESSION" in p.stdout and "1 regression" in p.stdout

    # faster: improved, not a failure
    runs_file(tmp_path / "fast.jsonl", runs=3, seed=4, scale={("bcast", 1 << 20): 0.5})
    p, out = compare_json(tmp_path, "weekly", tmp_path / "fast.jsonl")
    assert p.returncode == 0 and [r["verdict"] for r in out["rows"] if r["op"] == "bcast"] == ["improved"]


def test_a_slowdown_inside_a_noisy_baselines_spread_is_noisy_not_a_regression(tmp_path):
    with open(tmp_path / "base.jsonl", "w") as f:     # a shared fabric's week: median 300, MAD 100
        for i, lat in enumerate((200.0, 260.0, 300.0, 340.0, 400.0, 180.0, 420.0)):
            f.write(json.dumps(_rec("allreduce", 1 << 20, lat, f"r{i}", 1.0 + i)) + "\n")
    assert collbench("baseline", "save", "noisy", "--from", str(tmp_path / "base.jsonl"),
                     *base_args(tmp_path)).returncode == 0
    b = load_baseline("noisy", str(tmp_path / "state"))
    entry = next(iter(b.entries.values()))
    bound = regression_bound_us(entry.median_us, entry.sigma_us, 1.2, 3.0)
    assert entry.median_us == 300.0 and entry.sigma_us == pytest.approx(148.26)
    assert bound == pytest.approx(300 + 3 * 148.26)   # a wide baseline: 3 sigma is beyond 1.2x
    cur = entry.median_us * 1.4                    # 1.4x slower, but inside the noise
    (tmp_path / "cur.jsonl").write_text(json.dumps(_rec("allreduce", 1 << 20, cur, "c", 1.0)) + "\n")
    p, out = compare_json(tmp_path, "noisy", tmp_path / "cur.jsonl")
    assert p.returncode == 0 and out["rows"][0]["verdict"] == "noisy"
    # beyond the bound it is a regression; --k 0 falls back to the ratio alone
    (tmp_path / "cur2.jsonl").write_text(json.dumps(_rec("allreduce", 1 << 20, bound * 1.05, "c", 1.0)) + "\n")
    p, out = compare_json(tmp_path, "noisy", tmp_path / "cur2.jsonl")
    assert p.returncode == 1 and out["rows"][0]["verdict"] == "regression"
    # --k 0: sigma no longer counts, the slowest run (420) still does: 1.4x (420) is noisy, 1.6x
    # (480, past 1.1 x 420) a regression
    p, out = compare_json(tmp_path, "noisy", tmp_path / "cur.jsonl", "--k", "0")
    assert p.returncode == 0 and out["rows"][0]["verdict"] == "noisy"
    (tmp_path / "cur3.jsonl").write_text(json.dumps(_rec("allreduce", 1 << 20, 480.0, "c", 1.0)) + "\n")
    p, out = compare_json(tmp_path, "noisy", tmp_path / "cur3.jsonl", "--k", "0")
    assert p.returncode == 1 and out["rows"][0]["verdict"] == "regression"
    assert out["rows"][0]["bound_us"] == pytest.approx(1.1 * 420)


@pytest.mark.parametrize("gap_s, noted", [(1.0, True), (300.0, False)])
def test_save_says_when_its_runs_span_too_short_a_time(tmp_path, gap_s, noted):
    with open(tmp_path / "base.jsonl", "w") as f:     # 5 runs, gap_s apart: 4 s or 1200 s in all
        for i in range(5):
            f.write(json.dumps(_rec("allreduce", 1 << 20, 100.0 + i, f"r{i}", 1000.0 + i * gap_s)) + "\n")
    p = collbench("baseline", "save", "span", "--from", str(tmp_path / "base.jsonl"), *base_args(tmp_path))
    assert p.returncode == 0, p.stderr
    assert ("its runs span 4 s" in p.stderr) is noted and ("runs span" in p.stderr) is noted, p.stderr


def test_a_slowdown_the_baseline_itself_once_had_is_noisy(tmp_path):
    """Four tight runs and one whole-run slowdown (the testbed's 2x mode): the MAD ignores the slow
    run, the bound does not -- a current run as slow as it is `noisy`; past 1.1x it, a regression.
    A file without the slowest run (older) keeps max(T x m, m + k x s)."""
    with open(tmp_path / "base.jsonl", "w") as f:
        for i, lat in enumerate((100.0, 101.0, 99.0, 100.5, 210.0)):
            f.write(json.dumps(_rec("allreduce", 1 << 20, lat, f"r{i}", 1.0 + i)) + "\n")
    assert collbench("baseline", "save", "modes", "--from", str(tmp_path / "base.jsonl"),
                     *base_args(tmp_path)).returncode == 0
    entry = next(iter(load_baseline("modes", str(tmp_path / "state")).entries.values()))
    assert entry.sigma_us < 2 and entry.slowest_us == 210.0
    assert regression_bound_us(entry.median_us, entry.sigma_us, 1.2, 3.0) == pytest.approx(120.6)   # 1.2 x 100.5
    assert entry.regression_bound_us(1.2, 3.0) == pytest.approx(231.0)
    for lat, verdict, rc in ((205.0, "noisy", 0), (240.0, "regression", 1)):
        (tmp_path / "cur.jsonl").write_text(json.dumps(_rec("allreduce", 1 << 20, lat, "c", 1.0)) + "\n")
        p, out = compare_json(tmp_path, "modes", tmp_path / "cur.jsonl")
        assert (p.returncode, out["rows"][0]["verdict"]) == (rc, verdict), out["rows"]
    saved = tmp_path / "state" / "baselines" / "modes.json"
    doc = json.loads(saved.read_text())
    for e in doc["entries"]:
        del e["latency_avg_us"]["max"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    (tmp_path / "cur.jsonl").write_text(json.dumps(_rec("allreduce", 1 << 20, 205.0, "c", 1.0)) + "\n")
    p, out = compare_json(tmp_path, str(old), tmp_path / "cur.jsonl")
    assert (p.returncode, out["rows"][0]["verdict"]) == (1, "regression"), out["rows"]


def test_keys_separate_transport_ranks_algorithm_and_missing_new(tmp_path):
    with open(tmp_path / "base.jsonl", "w") as f:
        for i in range(3):
            f.write(json.dumps(_rec("allreduce", 1 << 20, 300.0, "a", 1.0 + i)) + "\n")
            f.write(json.dumps(_rec("allreduce", 1 << 20, 900.0, "b", 1.0 + i, transport="ob1-tcp")) + "\n")
            f.write(json.dumps(_rec("allgather", 1 << 20, 500.0, "c", 1.0 + i, algorithm="ring")) + "\n")
            f.write(json.dumps(_rec("allgather", 1 << 20, 700.0, "c", 1.0 + i, algorithm="recursive_doubling"))
                    + "\n")
            f.write(json.dumps(_rec("allreduce", 1 << 20, 150.0, "s", 1.0 + i, timing="sustained")) + "\n")
    assert collbench("baseline", "save", str(tmp_path / "b.json"), "--from", str(tmp_path / "base.jsonl")).returncode == 0
    with open(tmp_path / "cur.jsonl", "w") as f:
        # the tcp transport at the ucx speed is fine; ring at recursive doubling's speed is a regression
        f.write(json.dumps(_rec("allreduce", 1 << 20, 880.0, "d", 1.0, transport="ob1-tcp")) + "\n")
        f.write(json.dumps(_rec("allgather", 1 << 20, 700.0, "d", 1.0, algorithm="ring")) + "\n")
        f.write(json.dumps(_rec("allreduce", 1 << 20, 300.0, "d", 1.0, ranks=2)) + "\n")
        # sustained timing is its own key: 160 is fine against its 150, not "2x faster" than OSU's 300
        f.write(json.dumps(_rec("allreduce", 1 << 20, 160.0, "d", 1.0, timing="sustained")) + "\n")
    p = collbench("baseline", "compare", str(tmp_path / "b.json"), str(tmp_path / "cur.jsonl"), "--format", "csv")
    assert p.returncode == 1, p.stderr
    rows = {(r["op"], r["transport"], r["algorithm"], r["variant"], r["ranks"]): r["verdict"]
            for r in csv.DictReader(io.StringIO(p.stdout))}
    assert rows == {("allreduce", "ucx", "-", "-", "4"): "missing", ("allreduce", "ob1-tcp", "-", "-", "4"): "ok",
                    ("allreduce", "ucx", "-", "-", "2"): "new", ("allgather", "ucx", "ring", "-", "4"): "regression",
                    ("allgather", "ucx", "recursive_doubling", "-", "4"): "missing",
                    ("allreduce", "ucx", "-", "sustained", "4"): "ok"}
    # missing alone fails only when asked
    (tmp_path / "ok.jsonl").write_text(json.dumps(_rec("allreduce", 1 << 20, 300.0, "e", 1.0)) + "\n")
    p = collbench("baseline", "compare", str(tmp_path / "b.json"), str(tmp_path / "ok.jsonl"))
    assert p.returncode == 0, p.stdout
    p = collbench("baseline", "compare", str(tmp_path / "b.json"), str(tmp_path / "ok.jsonl"), "--fail-on-missing")
    assert p.returncode == 1


@pytest.mark.mpi
@pytest.mark.slow
def test_save_from_real_runs_and_compare(tmp_path):
    args = base_args(tmp_path)
    p = collbench("baseline", "save", "real", "--runs", "2", "--np", "2", "--ops", "allreduce,barrier", "--sizes",
                  "1KB,64KB", "--iterations", "20", *args, "--format", "json")
    assert p.returncode == 0, p.stderr
    assert "baseline run 2/2" in p.stderr
    saved = json.loads(p.stdout)
    keys = {(e["op"], e["size"], e["ranks"], e["n"], e["transport"], e["engine"]) for e in saved["entries"]}
    assert keys == {("allreduce", "1KB", 2, 2, "shm", "builtin"), ("allreduce", "64KB", 2, 2, "shm", "builtin"),
                    ("barrier", "-", 2, 2, "shm", "builtin")}
    assert saved["source"]["kind"] == "runs" and len(saved["source"]["run_ids"]) == 2

    # the verdict rule against the real baseline's own numbers: at the median ok, past the bound a regression
    b = load_baseline("real", str(tmp_path / "state"))
    for factor, code in ((1.0, 0), (1.02, 1)):
        with open(tmp_path / "cur.jsonl", "w") as f:
            for e in b.sorted_entries():
                k = e.key
                lat = e.median_us if factor == 1.0 else e.regression_bound_us(1.2, 3.0) * factor
                rec = _rec(k.op, k.size_bytes, lat, "now", 1.0, ranks=2, transport="shm")
                rec.update(hosts=["localhost", "localhost"], nodes=1)
                assert key_of(rec) == k
                f.write(json.dumps(rec) + "\n")
        p, out = compare_json(tmp_path, "real", tmp_path / "cur.jsonl")
        assert p.returncode == code, p.stdout
        assert {r["verdict"] for r in out["rows"]} == ({"ok"} if code == 0 else {"regression"})

    # measuring now: the baseline's ops, sizes and ranks, each key measured once
    p = collbench("baseline", "compare", "real", "--runs", "1", "--iterations", "20", "--format", "json", *args)
    assert p.returncode in (0, 1), p.stderr
    out = json.loads(p.stdout)
    assert sorted((r["op"], r["size"], r["current_n"]) for r in out["rows"]) == [
        ("allreduce", "1KB", 1), ("allreduce", "64KB", 1), ("barrier", "-", 1)]

    p = collbench("baseline", "list", *args)
    assert p.returncode == 0 and "real" in p.stdout
    p = collbench("baseline", "show", "real", "--format", "csv", *args)
    assert p.returncode == 0 and len(list(csv.DictReader(io.StringIO(p.stdout)))) == 3


@pytest.mark.parametrize("content, message", [
    ("{nope", "not valid JSON"),
    ("[]", "top level: expected a JSON object"),
    (json.dumps({"format": "something-else", "version": 1, "entries": []}), "format: expected 'collbench-baseline'"),
    (json.dumps({"format": "collbench-baseline", "version": 7, "entries": []}), "version: expected 1"),
    (json.dumps({"format": "collbench-baseline", "version": 1, "entries": {}}), "entries: expected a list"),
    (json.dumps({"format": "collbench-baseline", "version": 1, "entries": [{"op": "shuffle"}]}),
     "entries[0].op: expected one of"),
    (json.dumps({"format": "collbench-baseline", "version": 1, "entries": [
        {"op": "allreduce", "size_bytes": 1024, "ranks": 2, "n": 3, "latency_avg_us": {"median": -1, "mad": 0}}]}),
     "entries[0].latency_avg_us.median: expected a number > 0"),
    (json.dumps({"format": "collbench-baseline", "version": 1, "entries": [
        {"op": "allreduce", "size_bytes": 1024, "ranks": 2, "n": 3, "latency_avg_us": {"median": 1, "mad": 0}}] * 2}),
     "entries[1]: a second entry"),
    ('{"format": "collbench-baseline", "version": 1, "entries": [{"op": "allreduce", "size_bytes": 1024, '
     '"ranks": 2, "n": 3, "latency_avg_us": {"median": NaN, "mad": 0}}]}', "not valid JSON"),
    ('{"a":' + "[" * 100000, "not valid JSON"),
    (json.dumps({"format": "collbench-baseline", "version": 1, "entries": [
        {"op": "allreduce", "size_bytes": True, "ranks": 2, "n": 3, "latency_avg_us": {"median": 1, "mad": 0}}]}),
     "entries[0].size_bytes: expected a whole number"),
])
def test_a_bad_baseline_file_is_exit_2(tmp_path, content, message):
    path = tmp_path / "b.json"
    path.write_text(content)
    (tmp_path / "cur.jsonl").write_text(json.dumps(_rec("allreduce", 1024, 10.0, "x", 1.0)) + "\n")
    p = collbench("baseline", "compare", str(path), str(tmp_path / "cur.jsonl"))
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stderr and str(path) in p.stderr, p.stderr


def test_bad_names_flags_and_inputs_are_exit_2(tmp_path):
    args = base_args(tmp_path)
    runs_file(tmp_path / "base.jsonl", runs=2)
    p = collbench("baseline", "compare", "nosuch", str(tmp_path / "base.jsonl"), *args)
    assert p.returncode == 2 and "does not exist" in p.stderr
    p = collbench("baseline", "save", "../evil", "--from", str(tmp_path / "base.jsonl"), *args)
    assert p.returncode == 2 and "baseline name" in p.stderr
    assert collbench("baseline", "save", "b1", "--from", str(tmp_path / "base.jsonl"), *args).returncode == 0
    p = collbench("baseline", "save", "b1", "--from", str(tmp_path / "base.jsonl"), *args)
    assert p.returncode == 2 and "--force" in p.stderr
    assert collbench("baseline", "save", "b1", "--from", str(tmp_path / "base.jsonl"), "--force", *args).returncode == 0
    p = collbench("baseline", "save", "b2", "--from", str(tmp_path / "base.jsonl"), "--runs", "2", *args)
    assert p.returncode == 2 and "--from and --runs" in p.stderr
    p = collbench("baseline", "compare", "b1", str(tmp_path / "base.jsonl"), "--threshold", "0.5", *args)
    assert p.returncode == 2 and "--threshold" in p.stderr
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(_rec("alltoall", 1024, 10.0, "x", 1.0)) + "\n" + "garbage\n")
    p = collbench("baseline", "compare", "b1", str(other), *args)
    assert p.returncode == 2 and "nothing to compare" in p.stderr and "1 bad line" in p.stderr
    junk = tmp_path / "junk.jsonl"
    junk.write_text("garbage\n")
    p = collbench("baseline", "save", "b3", "--from", str(junk), *args)
    assert p.returncode == 2 and "no result records" in p.stderr
    assert not (tmp_path / "state" / "baselines" / "b3.json").exists()


def test_baseline_fifo_is_refused_not_waited_on(tmp_path):
    """A FIFO in place of a baseline file: exit 2 at once, never a reader blocked on open()."""
    import os
    import subprocess
    import sys
    fifo = tmp_path / "weekly.json"
    os.mkfifo(fifo)
    res = subprocess.run([sys.executable, "-m", "collbench", "baseline", "compare", str(fifo), os.devnull],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "not a regular file" in res.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("sig, code_wanted, word", [(signal.SIGTERM, 143, "terminated"),
                                                    (signal.SIGINT, 130, "interrupted")])
def test_runs_go_through_the_harness_progress_and_a_signal_stops_them_saving_nothing(tmp_path, sig, code_wanted, word):
    """baseline --runs measures in process through the harness, as every verb does: a progress line
    per step, and SIGTERM / Ctrl-C stop the MPI job, say so, save nothing and exit 143 / 130."""
    from collbench import proctree
    code, err, below = signal_at_progress(
        ["baseline", "save", "stopped", "--runs", "50", "--np", "2", "--ops", "allreduce", "--sizes", "1KB,2KB,4KB,8KB",
         "--iterations", "2000", *base_args(tmp_path)], "[1/4] allreduce", sig)
    assert code == code_wanted, err
    assert f"collbench baseline save: {word} after" in err and "nothing saved" in err
    assert not (tmp_path / "state" / "baselines").exists() or not list((tmp_path / "state" / "baselines").iterdir())
    assert [p for p in below if proctree.pid_alive(p)] == []
