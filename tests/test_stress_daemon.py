"""The stress daemon, started and stopped for real: real mpirun, 4 real engine ranks."""

import json
import os
import signal
import subprocess

import pytest

from conftest import wait_for

from collbench.proctree import pid_alive
from collbench.engines.mpi_job import stderr_reason as mpi_reason
from collbench.stress.daemon import backoff_delay
from collbench.bench_processes import TOKEN_ENV, environ_token
from stress_helpers import (TINY_STEPS, Stress, job_processes, wait_gone, write_config)

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

RESULT_FIELDS = {"schema", "type", "time", "ts", "run_id", "hosts", "nodes", "ranks", "engine", "mpi",
                 "transport", "op", "datatype", "size", "size_bytes", "latency_avg_us", "latency_min_us",
                 "latency_max_us", "iterations", "warmup", "algbw_bytes_per_s", "busbw_bytes_per_s",
                 "validation", "straggler_rank", "verdict", "status", "iteration", "seq", "t_start", "t_end"}


@pytest.fixture
def stress(tmp_path):
    made = []

    def make(stress_extra="", top_extra="", **kw):
        s = Stress(write_config(tmp_path, stress_extra, top_extra, **kw), tmp_path / "state")
        made.append(s)
        return s
    yield make
    for s in made:
        s.cleanup()


def n_results(k):
    return lambda recs: len([r for r in recs if r["type"] == "result"]) >= k


def test_start_status_log_servers_stop(stress):
    s = stress()
    r = s.run("status")
    assert r.returncode == 3 and "stopped" in r.stdout, r.stdout + r.stderr

    pid = s.start()
    assert pid_alive(pid)
    s.wait_for(n_results(3 * len(TINY_STEPS)), what="three plan passes")

    # records parse and carry the contract's fields; seq runs 1, 2, 3 ... from the start event
    recs = s.records()
    assert recs[0]["type"] == "event" and recs[0]["event"] == "start" and recs[0]["pid"] == pid
    assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
    results = [r for r in recs if r["type"] == "result"]
    for r in results:
        assert RESULT_FIELDS <= set(r), RESULT_FIELDS - set(r)
        assert r["status"] == "ok" and r["engine"] == "builtin" and r["ranks"] == 4
        assert r["latency_avg_us"] > 0 and r["t_end"] >= r["t_start"]
    # one record per (iteration, op, size), in plan order, iterations counted from 1
    first = [(r["iteration"], r["op"], r["size_bytes"]) for r in results[:len(TINY_STEPS) * 2]]
    assert first == [(it, op, size) for it in (1, 2) for op, size in TINY_STEPS]

    # a second start is refused, and changes nothing
    r = s.run("start")
    assert r.returncode == 1 and "already running" in r.stderr and str(pid) in r.stderr
    assert s.pid() == pid

    r = s.run("status")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"running (pid {pid}" in r.stdout
    for op, _size in TINY_STEPS:
        assert op in r.stdout
    # the state file is rewritten at most once a second: give it that second
    st = wait_for(lambda: (lambda st: st if st["iteration"] >= 1 else None)(
        json.loads(s.run("status", "--json").stdout)), timeout=10, interval=0.3)
    assert st and st["state"] == "running" and st["pid"] == pid and st["iteration"] >= 1
    assert {(x["op"], x["size_bytes"]) for x in st["last_results"]} == set(TINY_STEPS)

    r = s.run("log", "-n", "5")
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and len(lines) == 5
    assert all("avg" in ln and "busbw" in ln for ln in lines), lines

    # the job: mpirun and 4 engine ranks, all carrying the daemon's token
    procs = job_processes(pid)
    names = list(procs.values())
    assert names.count("mpirun") == 1, procs
    assert len([n for n in names if n.startswith("collbench-engine")]) == 4, procs
    token = s.state()["token"]
    assert all(environ_token(p) == token for p in procs)
    srv = json.loads(s.run("servers", "--json").stdout)
    listed = {p["pid"]: p for p in srv[0]["data"]["processes"]}
    assert set(procs) <= set(listed)
    assert all(listed[p]["ours"] and listed[p]["cpu_percent"] is not None for p in procs)

    r = s.run("stop")
    assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr
    assert wait_gone([pid] + list(procs), timeout=5) == [], "processes left after stop"
    assert not [p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
                if environ_token(p) == token], "a process with the daemon's token survived"
    assert not (s.state_dir / "stress.pid").exists()
    recs = s.records()
    assert recs[-1]["type"] == "event" and recs[-1]["event"] == "stop"
    assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
    r = s.run("status")
    assert r.returncode == 3 and "stopped" in r.stdout


def test_rank_sigkill_yields_failure_then_fresh_results(stress):
    s = stress()
    pid = s.start()
    s.wait_for(n_results(2 * len(TINY_STEPS)), what="results")
    ranks = [p for p, name in job_processes(pid).items() if name.startswith("collbench-engine")]
    assert len(ranks) == 4
    old_job = s.state()["job_pid"]
    os.kill(ranks[2], signal.SIGKILL)

    def fresh_after_failure(recs):
        fails = [r for r in recs if r["type"] == "failure"]
        if not fails:
            return None
        after = [r for r in recs if r["type"] == "result" and r["seq"] > fails[0]["seq"]]
        return (fails[0], after) if len(after) >= len(TINY_STEPS) else None

    failure, after = s.wait_for(fresh_after_failure, timeout=60, what="a failure, then fresh results")
    assert failure["status"] == "failed" and failure["exit_code"] not in (0, None)
    assert "signal 9" in failure["error"] or "Killed" in failure["error"], failure["error"]
    assert failure["op"] in {op for op, _ in TINY_STEPS} and isinstance(failure["iteration"], int)
    assert failure["stderr_tail"]
    events = [r["event"] for r in s.records() if r["type"] == "event"]
    assert events[:3] == ["start", "backoff", "relaunch"]
    # the relaunched job is a new mpirun; iterations keep counting up across the relaunch
    assert s.state()["job_pid"] != old_job
    assert after[0]["iteration"] > failure["iteration"] - 1
    assert all(r["iteration"] >= after[0]["iteration"] for r in after)
    assert pid_alive(pid) and s.run("status").returncode == 0
    assert wait_gone(ranks, timeout=10) == []


def test_daemon_sigkill_is_crashed_then_restart_replaces_stale_pid(stress):
    s = stress()
    pid = s.start()
    s.wait_for(n_results(len(TINY_STEPS)), what="results")
    job = list(job_processes(pid))
    os.kill(pid, signal.SIGKILL)
    assert wait_gone([pid], timeout=10) == []

    r = s.run("status")
    assert r.returncode == 1, r.stdout
    assert "crashed" in r.stdout and "stale pid file" in r.stdout and str(pid) in r.stdout
    assert json.loads(s.run("status", "--json").stdout)["state"] == "crashed"
    last_seq = s.records()[-1]["seq"]

    new_pid = s.start()   # replaces the stale pid file; the orphaned job is gone for good
    assert new_pid != pid and s.pid() == new_pid
    assert wait_gone(job, timeout=10) == []
    s.wait_for(lambda recs: any(r["type"] == "result" and r["seq"] > last_seq for r in recs),
               what="results from the new daemon")
    recs = s.records()
    restart = next(r for r in recs if r["type"] == "event" and r["event"] == "start" and r["pid"] == new_pid)
    assert restart["seq"] == last_seq + 1, "seq must continue after a restart"
    assert s.run("status").returncode == 0
    assert s.run("stop").returncode == 0
    r = s.run("status")
    assert r.returncode == 3 and "stopped" in r.stdout


def test_stop_after_crash_cleans_up_and_reports_stopped(stress):
    s = stress()
    pid = s.start()
    s.wait_for(n_results(1), what="results")
    os.kill(pid, signal.SIGKILL)
    wait_gone([pid])
    r = s.run("stop")
    assert r.returncode == 0 and "stale pid file" in r.stdout, r.stdout + r.stderr
    assert not (s.state_dir / "stress.pid").exists()
    r = s.run("status")
    assert r.returncode == 3 and "stopped" in r.stdout


def test_rotation_under_fast_plan_keeps_every_record_once(stress):
    s = stress("  rotate_bytes: 24KB\n  rotate_keep: 1000\n")
    s.start()
    out_path = s.state_dir.parent / "followed.jsonl"
    with open(out_path, "w") as out_file:   # a file, not a pipe: nothing blocks the follower
        follower = subprocess.Popen(s.cmd("log", "-f", "--json", "-n", "0"), stdout=out_file)
    rotations = lambda: len(list(s.state_dir.glob("results.jsonl.*")))   # noqa: E731
    try:
        # the follower starts at the live file's end once it is up (a second or more under load, in
        # which the fast plan may rotate several times): rotations count from when it follows
        assert wait_for(lambda: out_path.stat().st_size > 0, 60, interval=0.1), "the follower printed nothing"
        followed_from = rotations()
        s.wait_for(lambda _recs: rotations() >= max(5, followed_from + 3), timeout=60,
                   what="five rotations, three of them while followed")
        assert s.run("stop").returncode == 0
        last_seq = s.records()[-1]["seq"]

        def followed_to_the_end():   # the follower polls every 0.5 s
            tail = out_path.read_text().strip().splitlines()
            return tail and json.loads(tail[-1])["seq"] == last_seq
        wait_for(followed_to_the_end, 10, interval=0.1)
    finally:
        follower.terminate()
        follower.wait(timeout=10)
    out = out_path.read_text()
    recs = s.records()
    seqs = [r["seq"] for r in recs]
    assert seqs == list(range(1, len(recs) + 1)), "a record was lost or duplicated across a rotation"
    rotated = sorted(p.name for p in s.state_dir.glob("results.jsonl.*"))
    assert len(rotated) >= 5
    for p in s.state_dir.glob("results.jsonl*"):
        assert p.stat().st_size < 24 * 1024 + 4096, p   # rotated at the first record past the size
        assert p.read_bytes().endswith(b"\n")
    # every complete plan pass has each (op, size) exactly once
    results = [r for r in recs if r["type"] == "result"]
    by_it = {}
    for r in results:
        by_it.setdefault(r["iteration"], []).append((r["op"], r["size_bytes"]))
    for it in sorted(by_it)[:-1]:
        assert by_it[it] == TINY_STEPS, (it, by_it[it])
    # a reader following the live file across rotations saw each record exactly once
    followed = [json.loads(x)["seq"] for x in out.splitlines() if x.strip()]
    assert followed and followed == list(range(followed[0], seqs[-1] + 1))
    file_of = {}
    for p in s.state_dir.glob("results.jsonl*"):
        for line in p.read_text().splitlines():
            file_of[json.loads(line)["seq"]] = p.name
    assert len({file_of[q] for q in followed}) >= 3, "the follower must have crossed rotations"


def test_pause_releases_the_nodes_between_passes(stress):
    s = stress("  pause: 1.5\n")
    pid = s.start()
    s.wait_for(lambda recs: {r.get("iteration") for r in recs if r["type"] == "result"} >= {1, 2, 3},
               timeout=60, what="three passes")
    results = s.results_()
    for it in (1, 2):
        end = max(r["t_end"] for r in results if r["iteration"] == it)
        nxt = min(r["t_start"] for r in results if r["iteration"] == it + 1)
        assert nxt - end >= 1.5, f"pass {it + 1} began {nxt - end:.2f}s after pass {it}"
    assert s.state()["mode"] == "pass"
    assert pid_alive(pid) and not [r for r in s.records() if r["type"] == "failure"]


def test_failing_job_backs_off_exponentially_and_never_dies(stress, tmp_path):
    bad = tmp_path / "failing-engine"
    bad.write_text("#!/bin/sh\necho 'collbench-engine: cannot start (test)' >&2\nexit 3\n")
    bad.chmod(0o755)
    s = stress("  backoff_initial: 0.2\n  backoff_max: 0.4\n", top_extra=f"engine_path: {bad}\n")
    pid = s.start()
    recs = s.wait_for(lambda r: len([x for x in r if x.get("event") == "relaunch"]) >= 3 and r,
                      timeout=90, what="three relaunches")
    fails = [r for r in recs if r["type"] == "failure"]
    backoffs = [r for r in recs if r.get("event") == "backoff"]
    relaunches = [r for r in recs if r.get("event") == "relaunch"]
    # 0.2 s, then doubling, capped at backoff_max 0.4 s (not 0.8), each wait really waited: no busy loop
    assert [b["delay_s"] for b in backoffs[:3]] == [0.2, 0.4, 0.4]
    assert [b["failures"] for b in backoffs[:3]] == [1, 2, 3]
    for b, r in zip(backoffs, relaunches):
        assert r["seq"] == b["seq"] + 1 and r["ts"] - b["ts"] >= b["delay_s"] - 0.01
    # every failure is followed by its back-off; the failing engine's words are kept
    for f in fails[:3]:
        assert next(x for x in recs if x["seq"] == f["seq"] + 1)["event"] == "backoff"
    assert fails[0]["exit_code"] == 3 and "cannot start (test)" in fails[0]["stderr_tail"]
    assert pid_alive(pid) and s.run("status").returncode == 0


def test_backoff_and_reason_helpers():
    assert [backoff_delay(n, 5, 300) for n in (1, 2, 3, 7, 100)] == [5, 10, 20, 300, 300]
    tail = ("-----\nPrimary job  terminated normally, but 1 process returned\n-----\n"
            "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).\n-----")
    assert mpi_reason(tail).startswith("mpirun noticed that process rank 1")
    assert mpi_reason("----\nThere are not enough slots available in the system\n----") \
        .startswith("There are not enough slots")
    assert TOKEN_ENV == "COLLBENCH_STRESS_TOKEN"


OSU_PLAN = """\
  plan:
    - {op: allreduce, sizes: [1KB], iterations: 5, warmup: 1}
    - {op: bcast, sizes: [1KB], iterations: 5, warmup: 1}
"""


def test_osu_engine_runs_one_mpirun_per_step_and_records_failures(tmp_path, repo):
    mark = tmp_path / "osu-runs.txt"
    top = (f"engine: osu\nosu_path: {repo / 'tests' / 'osu_standin'}\n"
           f"env: {{OSU_STANDIN_MARK: {mark}, OSU_STANDIN_FAIL: bcast}}\n")
    s = Stress(write_config(tmp_path, top_extra=top, plan=OSU_PLAN, ranks=2), tmp_path / "state")
    try:
        s.start()
        recs = s.wait_for(lambda r: len([x for x in r if x["type"] == "failure"]) >= 2 and r,
                          timeout=90, what="two failed passes")
        assert s.state()["mode"] == "step"
        results = [r for r in recs if r["type"] == "result"]
        fails = [r for r in recs if r["type"] == "failure"]
        assert results and all(r["engine"] == "osu" and r["op"] == "allreduce" for r in results)
        # bcast fails in every pass: a failure record naming it, then back-off, then the next pass
        assert all(f["op"] == "bcast" and f["exit_code"] not in (0, None) for f in fails)
        assert [r["iteration"] for r in results[:2]] == [1, 2]
        assert fails[0]["iteration"] == 1 and "simulated rank failure" in fails[0]["stderr_tail"]
        events = [r["event"] for r in recs if r["type"] == "event"]
        assert events[:3] == ["start", "backoff", "relaunch"]
        # one mpirun per step: each rank of each step appended one line
        runs = mark.read_text().splitlines()
        assert len([x for x in runs if x.startswith("allreduce 0 ")]) >= 2
        assert len([x for x in runs if x.startswith("bcast 0 ")]) >= 2
    finally:
        s.cleanup()


def test_run_in_foreground_notifies_systemd_and_stops_on_sigterm(tmp_path):
    import socket
    s = Stress(write_config(tmp_path), tmp_path / "state")
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(60)
    env = dict(os.environ, NOTIFY_SOCKET=sock_path)
    proc = subprocess.Popen(s.cmd("run"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        msg = sock.recv(4096).decode()
        assert "READY=1" in msg and f"MAINPID={proc.pid}" in msg
        assert s.pid() == proc.pid
        s.wait_for(n_results(len(TINY_STEPS)), what="results")
        procs = list(job_processes(proc.pid))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        _out, err = proc.communicate(timeout=10)
        assert "stopped (signal SIGTERM)" in err
        assert wait_gone(procs, timeout=5) == []
        last = s.records()[-1]
        assert last["event"] == "stop" and last["detail"] == "signal SIGTERM"
        assert s.run("status").returncode == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
        s.cleanup()


def test_duty_cycle_limit_rests_in_proportion(stress):
    # one step long enough (~0.5 s) that the rest it earns dwarfs the relaunch time
    s = stress("  duty_cycle: 0.34\n", plan="  plan:\n    - {op: allreduce, sizes: [64KB], iterations: 4000}\n")
    s.start()
    # one rest, between the first pass and the second, is the proportion (a third pass only repeated it:
    # another job and another rest twice its length, 40 % of the test's time)
    s.wait_for(lambda recs: {r.get("iteration") for r in recs if r["type"] == "result"} >= {1, 2},
               timeout=90, what="two passes")
    results = s.results_()
    mine = [r for r in results if r["iteration"] == 1]
    busy = max(r["t_end"] for r in mine) - min(r["t_start"] for r in mine)
    rest = min(r["t_start"] for r in results if r["iteration"] == 2) - max(r["t_end"] for r in mine)
    # rest >= job time x (1/0.34 - 1), and the job time includes at least the steps' span; without the
    # limit the rest is only the relaunch (about a second), shorter than 1.94 x this step's span
    assert busy > 0.2 and rest >= busy * (1 / 0.34 - 1), (busy, rest)
    assert s.state()["mode"] == "pass"
