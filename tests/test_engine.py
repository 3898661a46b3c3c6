"""The built-in engine: its build, its protocol, and run_steps, with real mpirun ranks."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from collbench.results import records
from collbench.engines import build as engine_build, builtin as builtin_engine, launcher
from collbench.config import Step
from collbench.errors import UserError
from collbench.engines.mpi_job import MpiJob, run_job
from engine_helpers import engine_bin, engine_cfg, is_gone, pids_of_exe  # noqa: F401

REPO = Path(__file__).resolve().parent.parent

# busbw / algbw per DESIGN.md's table (written out here, not read from ops.py)
BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "bcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
DATA_TIMES_N = {"allgather", "alltoall"}


def ctx_for(cfg):
    return records.RunContext(cfg, "builtin", launcher.mpi_version(cfg))


def every_op_plan():
    """Every op; reductions on int and float, the others on char (and double once); sizes whose
    element counts do not divide by 2 or 4, so reduce_scatter's uneven split is checked too."""
    steps = []
    for op in ("allreduce", "reduce", "reduce_scatter"):
        for dt in ("int", "float"):
            for size in (4, 65548):
                steps.append(Step(op, size, 3, 1, dt))
    for op in ("bcast", "allgather", "alltoall"):
        for size in (1, 65537):
            steps.append(Step(op, size, 3, 1, "char"))
    steps.append(Step("allgather", 8 * 1001, 3, 1, "double"))
    steps.append(Step("barrier", 0, 5, 1, "char"))
    return steps


# ---------------------------------------------------------------- build

def test_build_is_cached_keyed_and_forced(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    first = engine_build.ensure_engine()
    assert Path(first).parent == tmp_path / "cache"
    assert os.access(first, os.X_OK)
    inode = os.stat(first).st_ino
    assert engine_build.ensure_engine() == first and os.stat(first).st_ino == inode  # cached
    assert engine_build.ensure_engine(force=True) == first
    assert os.stat(first).st_ino != inode  # rebuilt and renamed into place
    # a different source is a different binary
    src = tmp_path / "collbench_engine.c"
    src.write_text(engine_build.SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(engine_build, "SOURCE", src)
    other = engine_build.ensure_engine()
    assert other != first and os.access(other, os.X_OK)
    out = subprocess.run([other, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--plan FILE" in out.stdout
    assert not list((tmp_path / "cache").glob(".build-*"))


def test_every_engine_source_is_built_keyed_shipped_and_small(tmp_path, monkeypatch):
    """The engine is several C sources and a header: each is in the cache key (an edit to any of
    them is a new binary), the package ships them, and none grows past 1,400 lines."""
    import tomllib
    from fnmatch import fnmatch
    engine_dir = engine_build.SOURCE.parent
    on_disk = {p.name for p in engine_dir.iterdir() if p.suffix in (".c", ".h")}
    keyed = {p.name for p in (engine_build.SOURCE, *engine_build.COMPANIONS, *engine_build.HEADERS)}
    assert on_disk == keyed and len(keyed) >= 3
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["collbench"]
    for name in keyed:
        assert any(fnmatch(f"engines/{name}", g) for g in globs), name
        assert len((engine_dir / name).read_text().splitlines()) <= 1400, name
    monkeypatch.setattr(engine_build, "toolchain_fingerprint", lambda mpicc: "same")
    key = engine_build.engine_key("mpicc")
    for attr in ("COMPANIONS", "HEADERS"):
        paths = getattr(engine_build, attr)
        copy = tmp_path / paths[0].name
        copy.write_text(paths[0].read_text() + "\n/* changed */\n")
        monkeypatch.setattr(engine_build, attr, (copy, *paths[1:]))
        assert engine_build.engine_key("mpicc") != key, attr
        monkeypatch.setattr(engine_build, attr, paths)
    assert engine_build.engine_key("mpicc") == key


def test_concurrent_builders_never_corrupt_the_binary(tmp_path):
    env = dict(os.environ, COLLBENCH_CACHE_DIR=str(tmp_path / "cache"))
    code = "from collbench.engines.build import ensure_engine; print(ensure_engine(force=True))"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    paths = {o[0].strip() for o in outs}
    assert len(paths) == 1
    path = paths.pop()
    out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "usage: collbench-engine" in out.stdout
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [Path(path).name]


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("COLLBENCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert engine_build.cache_dir() == tmp_path / "xdg" / "collbench"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert engine_build.cache_dir() == tmp_path / "home" / ".cache" / "collbench"
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "explicit"))
    assert engine_build.cache_dir() == tmp_path / "explicit"


def test_missing_mpicc_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MPICC", "mpicc-that-does-not-exist")
    with pytest.raises(UserError, match="libopenmpi-dev"):
        engine_build.ensure_engine()


def test_compile_error_shows_compiler_output(monkeypatch, tmp_path):
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "broken.c"
    bad.write_text("int main(void) { return undeclared_thing; }\n")
    monkeypatch.setattr(engine_build, "SOURCE", bad)
    with pytest.raises(UserError) as err:
        engine_build.ensure_engine()
    assert "compiling the engine failed" in str(err.value)
    assert "undeclared_thing" in str(err.value)  # the compiler's own message
    assert list((tmp_path / "cache").iterdir()) == []  # no half-built file left


def test_engine_path_must_exist_and_be_executable(tmp_path, engine_bin):
    missing = tmp_path / "nope" / "collbench-engine"
    with pytest.raises(UserError, match=str(missing)):
        engine_build.ensure_engine(engine_cfg(tmp_path, missing))
    plain = tmp_path / "not-executable"
    plain.write_text("")
    plain.chmod(0o644)
    with pytest.raises(UserError, match="not executable"):
        engine_build.ensure_engine(engine_cfg(tmp_path, plain))
    assert engine_build.ensure_engine(engine_cfg(tmp_path, engine_bin)) == engine_bin


def test_cli_engine_build_and_path(tmp_path, collbench_cmd):
    env = dict(os.environ, COLLBENCH_CACHE_DIR=str(tmp_path / "cache"))
    before = subprocess.run(collbench_cmd + ["engine", "path"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert before.returncode == 1 and "not built yet" in before.stderr
    built = subprocess.run(collbench_cmd + ["engine", "build"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    path = built.stdout.strip()
    assert os.access(path, os.X_OK) and path.startswith(str(tmp_path / "cache"))
    after = subprocess.run(collbench_cmd + ["engine", "path"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=60)
    assert after.returncode == 0 and after.stdout.strip() == path
    bad = tmp_path / "c.yaml"
    bad.write_text(f"engine_path: {tmp_path}/missing-engine\n")
    out = subprocess.run(collbench_cmd + ["engine", "build", "--config", str(bad)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "missing-engine" in out.stderr


# ---------------------------------------------------------------- plan and records

def test_write_plan_and_parse_line(tmp_path):
    plan = tmp_path / "plan.txt"
    builtin_engine.write_plan([Step("allreduce", 1024, 10, 2, "float"), Step("barrier", 0, 5, 1, "char")], plan)
    lines = [ln for ln in plan.read_text().splitlines() if not ln.startswith("#")]
    assert lines == ["allreduce 1024 10 2 float", "barrier 0 5 1 char"]
    good = {"op": "bcast", "size_bytes": 8, "datatype": "char", "iterations": 3, "warmup": 1,
            "avg_us": 1.5, "min_us": 1.0, "max_us": 2, "max_rank": 1, "validation": "pass", "loop": 0,
            "step": 0, "t_start": 1.0, "t_end": 2.0, "ranks": 2}
    assert builtin_engine.parse_line("CBREC " + json.dumps(good) + "\n") == good
    assert builtin_engine.parse_line("some MPI warning") is None
    assert builtin_engine.parse_line("CBREC {\"op\": \"bcast\"") is None  # cut short
    assert builtin_engine.parse_line("CBREC " + json.dumps(dict(good, validation="maybe"))) is None
    assert builtin_engine.parse_line("CBREC " + json.dumps(dict(good, ranks=True))) is None
    no_key = dict(good)
    del no_key["max_rank"]
    assert builtin_engine.parse_line("CBREC " + json.dumps(no_key)) is None


# ---------------------------------------------------------------- every op, for real

@pytest.mark.parametrize("ranks,transport", [(2, "shm"), (4, "shm"), (2, "ucx-tcp"), (4, "ucx-tcp")])
def test_every_op_validates(tmp_path, engine_bin, ranks, transport):
    cfg = engine_cfg(tmp_path, engine_bin, ranks=ranks, transport=transport, validate=True)
    steps = every_op_plan()
    progress = []
    recs = list(builtin_engine.run_steps(cfg, steps, ctx_for(cfg),
                                         on_progress=lambda i, n, s: progress.append((i, n, s.op))))
    assert progress == [(i, len(steps), s.op) for i, s in enumerate(steps)]
    assert [r["type"] for r in recs] == ["result"] * len(steps), [r.get("error") for r in recs]
    for step, rec in zip(steps, recs):
        where = f"{step} at {ranks} ranks over {transport}"
        assert (rec["op"], rec["size_bytes"], rec["datatype"]) == (step.op, step.size_bytes, step.datatype), where
        assert (rec["iterations"], rec["warmup"], rec["ranks"]) == (step.iterations, step.warmup, ranks)
        assert rec["validation"] == ("off" if step.op == "barrier" else "pass"), where
        assert 0 < rec["latency_min_us"] <= rec["latency_avg_us"] <= rec["latency_max_us"], where
        assert 0 <= rec["straggler_rank"] < ranks
        assert rec["transport"] == transport and rec["engine"] == "builtin"
        if step.op == "barrier":
            assert rec["algbw_bytes_per_s"] is None and rec["busbw_bytes_per_s"] is None
            continue
        data = step.size_bytes * (ranks if step.op in DATA_TIMES_N else 1)
        assert rec["algbw_bytes_per_s"] == pytest.approx(data / (rec["latency_avg_us"] * 1e-6), rel=1e-3)
        # records round bandwidths to 0.1 B/s
        assert rec["busbw_bytes_per_s"] == pytest.approx(rec["algbw_bytes_per_s"] * BUS_FACTOR[step.op](ranks),
                                                         rel=1e-6, abs=0.2)


def test_wrong_results_fail_validation(tmp_path, engine_bin):
    # the engine's test hook spoils one element of rank 1's results; validation must notice
    cfg = engine_cfg(tmp_path, engine_bin, validate=True, env={"COLLBENCH_ENGINE_CORRUPT_RANK": "1"})
    steps = [Step("allreduce", 64, 3, 1, "float"), Step("alltoall", 64, 3, 1, "char"),
             Step("reduce_scatter", 64, 3, 1, "int")]
    recs = list(builtin_engine.run_steps(cfg, steps, ctx_for(cfg)))
    assert [(r["type"], r["validation"]) for r in recs] == [("result", "fail")] * 3
    argv, env = builtin_engine.engine_command(cfg, steps[:1], str(tmp_path / "p.txt"))
    res = run_job(argv, env, idle_timeout=120, on_line=lambda line: None)
    assert res.returncode == 1
    assert "validation failed: allreduce 64 B float" in res.stderr_tail
    assert "rank 1" in res.stderr_tail


def test_validation_off_unless_asked(tmp_path, engine_bin):
    cfg = engine_cfg(tmp_path, engine_bin)
    recs = list(builtin_engine.run_steps(cfg, [Step("bcast", 1024, 3, 1, "char")], ctx_for(cfg)))
    assert [(r["type"], r["validation"]) for r in recs] == [("result", "off")]


def test_loop_with_max_loops(tmp_path, engine_bin):
    # every stdout line here must be a step line: no congestion (CBCONG) lines in between
    cfg = engine_cfg(tmp_path, engine_bin, congestion={"enabled": False})
    steps = [Step("allreduce", 1024, 3, 1, "float"), Step("barrier", 0, 3, 1, "char")]
    argv, env = builtin_engine.engine_command(cfg, steps, str(tmp_path / "plan.txt"), loop=True, max_loops=3)
    assert "--loop" in argv and argv[argv.index("--max-loops") + 1] == "3"
    got = []
    res = run_job(argv, env, idle_timeout=120, on_line=lambda line: got.append(builtin_engine.parse_line(line)))
    assert res.returncode == 0 and not res.timed_out
    assert [(r["loop"], r["step"], r["op"]) for r in got] == [
        (loop, i, s.op) for loop in range(3) for i, s in enumerate(steps)]
    assert all(a["t_end"] <= b["t_start"] for a, b in zip(got, got[1:]))


BAD_PLANS = {
    "unknown-op": ("allreduce 1024 10 1 float\nallscatter 64 10 1 char\n", "line 2: unknown op 'allscatter'"),
    "fields": ("allreduce 1024 10 1\n", "line 1: expected 5 fields"),
    "multiple": ("# header\n\nallreduce 6 10 1 float\n", "line 3: size 6 B is not a multiple of the float size"),
    "extra-field": ("bcast 64 10 1 char fast\n", "line 1: extra field 'fast' is not key=value"),
    "bad-option": ("bcast 64 10 1 char root=99\n", "line 1: bad field 'root=99'"),
    "too-many-fields": ("bcast 64 10 1 char " + "inplace=1 " * 6 + "\n", "at most 5 key=value fields"),
    "barrier-size": ("barrier 8 10 1 char\n", "must be 0 for barrier"),
    "iterations": ("bcast 64 0 1 char\n", "iterations '0'"),
    "datatype": ("bcast 64 10 1 half\n", "unknown datatype 'half'"),
    "empty": ("# nothing here\n\n", "has no steps"),
}


BAD_ARGUMENTS = {
    "unreadable-plan": (["--plan", "/nonexistent/plan.txt"], "cannot read plan /nonexistent/plan.txt"),
    "max-loops": (["--plan", "PLAN", "--max-loops", "0"], "--max-loops: '0'"),
    "unknown-argument": (["--plan", "PLAN", "--fast"], "unknown or incomplete argument '--fast'"),
    "no-plan": ([], "--plan FILE (or --pairs) is required"),
}


@pytest.fixture(scope="module")
def refused_runs(tmp_path_factory, engine_bin):
    """Every bad plan and bad argument list, each its own real mpirun job, run side by side: a
    refused engine's mpirun takes a second or two to report the exit, nearly all of it waiting.
    {case: (plan path or None, JobResult, stdout lines)}."""
    from concurrent.futures import ThreadPoolExecutor
    base = tmp_path_factory.mktemp("refused")
    good_plan = base / "plan.txt"
    good_plan.write_text("barrier 0 3 1 char\n")
    cfg = engine_cfg(base, engine_bin)
    cases = {}
    for name, (text, _message) in BAD_PLANS.items():
        plan = base / f"{name}.plan"
        plan.write_text(text)
        cases[("plan", name)] = (plan, [engine_bin, "--plan", str(plan)])
    for name, (args, _message) in BAD_ARGUMENTS.items():
        cases[("args", name)] = (None, [engine_bin] + [str(good_plan) if a == "PLAN" else a for a in args])

    def run(engine_argv):
        argv, env = launcher.build_command(cfg, engine_argv)
        out = []
        return run_job(argv, env, idle_timeout=120, on_line=out.append), out
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {case: pool.submit(run, engine_argv) for case, (_plan, engine_argv) in cases.items()}
        return {case: (cases[case][0], *f.result()) for case, f in futures.items()}


@pytest.mark.parametrize("name", sorted(BAD_PLANS))
def test_bad_plan_exits_2(refused_runs, name):
    plan, res, out = refused_runs[("plan", name)]
    message = BAD_PLANS[name][1]
    assert res.returncode == 2
    assert f"plan {plan}" in res.stderr_tail and message in res.stderr_tail
    assert not [line for line in out if line.startswith("CBREC")]


@pytest.mark.parametrize("name", sorted(BAD_ARGUMENTS))
def test_bad_arguments_exit_2(refused_runs, name):
    _plan, res, _out = refused_runs[("args", name)]
    assert res.returncode == 2 and BAD_ARGUMENTS[name][1] in res.stderr_tail


# ---------------------------------------------------------------- faults

def test_sigterm_stops_a_looping_engine_cleanly(tmp_path, engine_bin):
    cfg = engine_cfg(tmp_path, engine_bin)
    argv, env = builtin_engine.engine_command(
        cfg, [Step("allreduce", 4096, 200, 10, "float"), Step("bcast", 4096, 200, 10, "char")],
        str(tmp_path / "plan.txt"), loop=True)
    job = MpiJob(argv, env).start()
    lines = []
    try:
        for line in job.lines(120):
            lines.append(line)
            # count step records: other lines (the congestion counters, CBCONG) come between them
            if sum(ln.startswith("CBREC") for ln in lines) == 5 and line.startswith("CBREC"):
                ranks = pids_of_exe(engine_bin)
                assert len(ranks) == 2
                job.stop(grace=10)
    finally:
        if job.returncode is None:
            job.stop()
    records_seen = [builtin_engine.parse_line(line) for line in lines if line.startswith("CBREC")]
    assert len(records_seen) >= 5 and all(records_seen)  # every record whole
    assert all(is_gone(pid) for pid in ranks + [job.pid])


def test_stop_signal_with_a_stuck_peer_ends_the_rank_within_the_grace(tmp_path, engine_bin):
    """A SIGTERM while the step in progress cannot finish (its peer stopped here; dead, or killed
    with it, under Slurm) ends the rank within COLLBENCH_ENGINE_STOP_GRACE, not at the launcher's
    SIGKILL (Slurm's KillWait): it waited forever for the step boundary before."""
    cfg = engine_cfg(tmp_path, engine_bin)
    argv, env = builtin_engine.engine_command(cfg, [Step("allreduce", 4096, 10 ** 9, 10, "float")],
                                              str(tmp_path / "plan.txt"))
    job = MpiJob(argv, dict(env, COLLBENCH_ENGINE_STOP_GRACE="2")).start()
    stuck = None
    try:
        deadline = time.monotonic() + 60
        while len(pids_of_exe(engine_bin)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks = sorted(pids_of_exe(engine_bin))
        assert len(ranks) == 2, ranks
        time.sleep(1.0)                      # both in the timed loop, which runs for hours
        stuck, signalled = ranks
        os.kill(stuck, signal.SIGSTOP)
        t0 = time.monotonic()
        os.kill(signalled, signal.SIGTERM)
        while not is_gone(signalled) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        elapsed = time.monotonic() - t0
        assert is_gone(signalled), "the signalled rank still waits for its stopped peer after 30 s"
        assert elapsed < 12, elapsed         # the 2 s grace, with room for a loaded machine
    finally:
        if stuck is not None and not is_gone(stuck):
            os.kill(stuck, signal.SIGCONT)
        job.stop(grace=5)
    assert "did not end within 2s of the stop signal" in job.stderr_tail(200)


def test_killed_rank_gives_a_failure_then_later_steps_run(tmp_path, engine_bin):
    cfg = engine_cfg(tmp_path, engine_bin)
    steps = [Step("allreduce", 1024, 10, 1, "float"),
             Step("allreduce", 1 << 20, 100000, 1, "float"),  # long: a rank dies during it
             Step("bcast", 1024, 10, 1, "char"),
             Step("barrier", 0, 10, 1, "char")]
    victims = []

    def on_progress(index, total, step):
        if index == 1:
            ranks = pids_of_exe(engine_bin)
            assert len(ranks) == 2
            victims.append(max(ranks))
            os.kill(victims[0], signal.SIGKILL)

    t0 = time.monotonic()
    recs = list(builtin_engine.run_steps(cfg, steps, ctx_for(cfg), on_progress=on_progress))
    assert time.monotonic() - t0 < 60  # the failure was noticed, not waited out
    assert [r["type"] for r in recs] == ["result", "failure", "result", "result"]
    fail = recs[1]
    assert (fail["op"], fail["size_bytes"], fail["status"]) == ("allreduce", 1 << 20, "failed")
    assert fail["exit_code"] not in (0, None)
    assert "allreduce 1MB" in fail["error"] and "exited with code" in fail["error"]
    assert "exited on signal 9" in fail["error"]  # mpirun's account of the dead rank, in one line
    assert fail["stderr_tail"].strip()  # mpirun said what happened
    assert [r["op"] for r in recs[2:]] == ["bcast", "barrier"]
    assert is_gone(victims[0]) and pids_of_exe(engine_bin) == []


def test_engine_stopped_from_outside_is_recorded_and_the_plan_goes_on(tmp_path, engine_bin):
    # SIGTERM straight to the ranks (as a node's shutdown would): the engine ends cleanly at a
    # step boundary with exit 0; the steps it did not run must not vanish or loop forever
    cfg = engine_cfg(tmp_path, engine_bin)
    steps = [Step("allreduce", 1024, 10, 1, "float"), Step("allreduce", 65536, 2000, 1, "float"),
             Step("bcast", 1024, 10, 1, "char"), Step("barrier", 0, 10, 1, "char")]

    def on_progress(index, total, step):
        if index == 1:
            for pid in pids_of_exe(engine_bin):
                os.kill(pid, signal.SIGTERM)

    recs = list(builtin_engine.run_steps(cfg, steps, ctx_for(cfg), on_progress=on_progress))
    assert [r["op"] for r in recs] == [s.op for s in steps]  # every step once, in order
    fails = [r for r in recs if r["type"] == "failure"]
    assert len(fails) == 1 and fails[0]["exit_code"] == 0
    assert "exited with code 0 after" in fails[0]["error"]
    assert recs[0]["type"] == recs[-1]["type"] == "result"
    assert pids_of_exe(engine_bin) == []


def test_hung_step_is_timed_out_and_killed(tmp_path, engine_bin):
    cfg = engine_cfg(tmp_path, engine_bin, step_timeout=1)
    steps = [Step("allreduce", 1 << 20, 10 ** 7, 1, "float"),  # hours: far past step_timeout
             Step("barrier", 0, 10, 1, "char")]
    seen, done = set(), threading.Event()

    def watch():  # the hung job's ranks, by pid, while it runs
        while not done.is_set():
            seen.update(pids_of_exe(engine_bin))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    gen = builtin_engine.run_steps(cfg, steps, ctx_for(cfg))
    try:
        first = next(gen)
    finally:
        done.set()
        watcher.join()
    elapsed = time.monotonic() - t0
    assert first["type"] == "failure" and first["op"] == "allreduce"
    assert "no result within step_timeout 1s" in first["error"]
    assert 1 <= elapsed < 40
    assert len(seen) == 2 and all(is_gone(pid) for pid in seen)  # nothing of the hung job is left
    rest = list(gen)
    assert [(r["type"], r["op"]) for r in rest] == [("result", "barrier")]
    assert pids_of_exe(engine_bin) == []
