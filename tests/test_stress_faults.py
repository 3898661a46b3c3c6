"""Faults an operator (or logrotate) causes under the running stress daemon, for real: the results
log renamed or deleted, a rotation that cannot happen, the state directory deleted, ranks killed.
Real daemon, real mpirun, 2 real engine ranks on shared memory (or the OSU stand-in per step)."""

import json
import os
import shutil
import signal
import subprocess

import pytest

from conftest import wait_for

from collbench.proctree import cmdline, pid_alive, read_stat
from collbench.stress.mpi_output import RawOutputLog
from collbench.results.results_log import ResultsLog
from stress_helpers import Stress, job_processes, wait_gone, write_config

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


@pytest.fixture
def stress(tmp_path):
    made = []

    def make(stress_extra="", top_extra="", **kw):
        kw.setdefault("ranks", 2)
        s = Stress(write_config(tmp_path, stress_extra, top_extra, **kw), tmp_path / "state")
        made.append(s)
        return s
    yield make
    for s in made:
        if s.state_dir.exists():
            for p in s.state_dir.glob("*.1"):     # the test's blocking directories, if still there
                if p.is_dir():
                    shutil.rmtree(p)
        s.cleanup()


def file_records(path):
    """Every parsable record of one file (its own reader: no rotation logic involved)."""
    out = []
    with open(path, "rb") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def live(s):
    return file_records(s.results) if s.results.exists() else []


def results_in(recs):
    return [r for r in recs if r.get("type") == "result"]


def events(recs, name):
    return [r for r in recs if r.get("type") == "event" and r.get("event") == name]


def zombie_children(pid):
    """Children of pid in state Z, from /proc/*/stat read here (independent of collbench.proctree)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[0] == "Z" and int(fields[1]) == pid:
            out.append(int(d))
    return out


def rank_zero(pids):
    """The pid of MPI rank 0 among pids (OMPI_COMM_WORLD_RANK in its environment), else the first."""
    for p in pids:
        try:
            env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK=0" in env:
            return p
    return pids[0]


def signal_pending(pid, signum):
    """True once signum is pending for the (stopped) process pid."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("ShdPnd:"):
                return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    return False


# ---------------------------------------------------------------- the writers alone

def test_results_log_writer_reopens_renamed_and_deleted_file(tmp_path):
    p = tmp_path / "results.jsonl"
    log = ResultsLog(str(p), rotate_bytes=0, rotate_keep=3, event_fields={"pid": 42, "run_id": "r1"})
    for i in range(3):
        log.append({"type": "result", "i": i})
    moved = tmp_path / "results.jsonl-20261122"
    os.rename(p, moved)
    log.append({"type": "result", "i": 3})
    reopened = file_records(p)
    assert [r.get("event") for r in reopened] == ["log_reopened", None]
    ev = reopened[0]
    assert ev["reason"] == "renamed" and ev["file"] == str(p) and ev["pid"] == 42 and ev["run_id"] == "r1"
    assert [r["seq"] for r in file_records(moved)] == [1, 2, 3]
    assert [r["seq"] for r in reopened] == [4, 5] and reopened[1]["i"] == 3

    with open(p, "rb") as held:          # read what the deleted file held, through our descriptor
        os.unlink(p)
        log.append({"type": "result", "i": 4})
        gone = [json.loads(x) for x in held.read().splitlines()]
    now = file_records(p)
    assert [r["seq"] for r in gone] == [4, 5]     # nothing more went into the deleted file
    assert now[0]["event"] == "log_reopened" and now[0]["reason"] == "deleted" and now[0]["seq"] == 6
    assert now[1]["i"] == 4 and now[1]["seq"] == 7
    assert log.reopens == 2
    log.close()


def test_results_log_writer_survives_a_rotation_that_fails(tmp_path):
    p = tmp_path / "results.jsonl"
    blocker = tmp_path / "results.jsonl.1"
    blocker.mkdir()
    (blocker / "keep").write_text("a directory where the rotated file must go\n")
    log = ResultsLog(str(p), rotate_bytes=1000, rotate_keep=1)
    for i in range(40):                  # ~4 KB: every rotation attempt fails
        log.append({"type": "result", "i": i, "pad": "x" * 60})
    recs = file_records(p)
    failed = events(recs, "rotate_failed")
    assert failed and log.rotate_failures == len(failed) and log.rotations == 0
    assert failed[0]["file"] == str(p) and "Is a directory" in failed[0]["error"]
    assert len(failed) < 10, "a failed rotation is retried after growth, not at every record"
    assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
    assert [r["i"] for r in results_in(recs)] == list(range(40))

    shutil.rmtree(blocker)               # fixed: the next attempt rotates
    for i in range(40, 80):
        log.append({"type": "result", "i": i, "pad": "x" * 60})
    assert log.rotations >= 1 and blocker.is_file()
    both = file_records(blocker) + file_records(p)
    seqs = [r["seq"] for r in both]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[-1] == log.last_seq
    assert [r["i"] for r in results_in(both)][-1] == 79
    log.close()


def test_mpi_output_writer_reopens_and_survives_a_failed_rotation(tmp_path):
    p = tmp_path / "mpi-output.log"
    seen = []
    out = RawOutputLog(str(p), max_bytes=2000, on_event=lambda ev, detail, **f: seen.append((ev, f)))
    out.write("line 1\n")
    out.flush()
    os.rename(p, tmp_path / "mpi-output.log.old")
    out.write("line 2\n")
    out.flush()
    assert p.read_text() == "line 2\n"
    assert seen == [("log_reopened", {"file": str(p), "reason": "renamed"})]
    os.unlink(p)
    out.write("line 3\n")
    out.flush()
    assert p.read_text() == "line 3\n" and seen[-1][1]["reason"] == "deleted"

    (tmp_path / "mpi-output.log.1").mkdir()
    (tmp_path / "mpi-output.log.1" / "keep").write_text("x")
    for i in range(100):
        out.write(f"line {i:03d} " + "y" * 40 + "\n")
    out.flush()
    fails = [f for ev, f in seen if ev == "rotate_failed"]
    assert fails and fails[0]["file"] == str(p)
    text = p.read_text()
    assert "line 099" in text and "line 000" in text   # nothing lost while rotation failed
    out.close()


# ---------------------------------------------------------------- the running daemon

def test_renamed_results_log_is_reopened_without_loss(stress):
    s = stress()
    pid = s.start()
    s.wait_for(lambda r: len(results_in(r)) >= 4, timeout=90, what="results")
    moved = s.state_dir / "results.jsonl-20261122"      # logrotate without copytruncate
    os.rename(s.results, moved)

    new = wait_for(lambda: (lambda r: r if len(results_in(r)) >= 4 else None)(live(s)),
                   timeout=90, interval=0.2)
    assert new, f"no results in the configured path after the rename; daemon.log:\n{s.daemon_log()}"
    ev = new[0]
    assert ev["type"] == "event" and ev["event"] == "log_reopened" and ev["reason"] == "renamed"
    assert ev["pid"] == pid and ev["file"] == str(s.results)
    old = file_records(moved)
    assert ev["run_id"] == old[0]["run_id"]
    seqs = [r["seq"] for r in old + new]
    assert seqs == list(range(1, len(seqs) + 1)), "a record was lost or duplicated by the rename"
    # two more plan passes into the configured path: none of them into the renamed file
    assert wait_for(lambda: len(results_in(live(s))) >= len(results_in(new)) + 8, timeout=30, interval=0.1)
    assert len(file_records(moved)) == len(old), "the daemon kept writing into the renamed file"
    assert pid_alive(pid)
    r = s.run("status")
    assert r.returncode == 0 and f"running (pid {pid}" in r.stdout, r.stdout + r.stderr


def test_deleted_results_log_is_recreated_and_seq_continues(stress):
    s = stress()
    pid = s.start()
    s.wait_for(lambda r: len(results_in(r)) >= 4, timeout=90, what="results")
    with open(s.results, "rb") as held:
        os.unlink(s.results)
        new = wait_for(lambda: (lambda r: r if len(results_in(r)) >= 4 else None)(live(s)),
                       timeout=90, interval=0.2)
        old = [json.loads(x) for x in held.read().splitlines()]
    assert new, f"no results in a new file after the delete; daemon.log:\n{s.daemon_log()}"
    ev = new[0] if new[0].get("event") == "log_reopened" else new[1]
    assert ev["event"] == "log_reopened" and ev["reason"] == "deleted" and ev["pid"] == pid
    new_seqs = [r["seq"] for r in new]
    assert new_seqs == list(range(new_seqs[0], new_seqs[0] + len(new)))
    # continues after the deleted file: a record the deleted file swallowed is written again
    # (same seq, same content), nothing else is repeated, nothing is missing
    by_seq = {r["seq"]: r for r in old}
    for r in new:
        if r["seq"] in by_seq:
            assert by_seq[r["seq"]] == r
    assert new_seqs[0] <= old[-1]["seq"] + 1
    assert sorted(set(by_seq) | set(new_seqs)) == list(range(1, new_seqs[-1] + 1))
    assert pid_alive(pid)


def test_failed_rotation_is_an_event_not_a_crash(stress):
    s = stress("  rotate_bytes: 64KB\n  rotate_keep: 1\n")
    pid = s.start()
    # a non-empty directory where each rotated file must go: unlink and rename both fail
    blockers = [s.state_dir / "results.jsonl.1", s.state_dir / "mpi-output.log.1"]
    for b in blockers:
        if b.is_file():
            b.unlink()
        b.mkdir()
        (b / "keep").write_text("x\n")

    def both_failed():
        recs = live(s)
        files = {e["file"] for e in events(recs, "rotate_failed")}
        return recs if {str(s.results), str(s.state_dir / "mpi-output.log")} <= files else None

    recs = wait_for(both_failed, timeout=180, interval=0.2)
    assert recs, f"no rotate_failed events; daemon.log:\n{s.daemon_log()}"
    failed = events(recs, "rotate_failed")
    assert all(e["pid"] == pid and e["error"] for e in failed)
    first = failed[0]["seq"]
    assert results_in([r for r in recs if r["seq"] > first]) or wait_for(
        lambda: results_in([r for r in live(s) if r["seq"] > first]), timeout=60), \
        "no result after the failed rotation"
    assert pid_alive(pid)

    for b in blockers:               # the operator fixes it: the next attempt rotates
        shutil.rmtree(b)
    assert wait_for(lambda: blockers[0].is_file() and blockers[1].is_file(), timeout=180, interval=0.2), \
        f"rotation did not resume; daemon.log:\n{s.daemon_log()}"
    def rotated_and_live():
        # the daemon keeps rotating (64KB, keep 1): a rotation between the two reads would drop a
        # file's worth; the rotated file's inode is the same before and after when none came between
        ino = blockers[0].stat().st_ino
        recs = file_records(blockers[0]) + live(s)
        return recs if blockers[0].stat().st_ino == ino else None
    both = wait_for(rotated_and_live, timeout=30, interval=0.1)
    assert both, "the log rotated between every two reads for 30 s"
    seqs = [r["seq"] for r in both]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a record was lost or duplicated"
    assert pid_alive(pid) and s.run("status").returncode == 0
    r = s.run("stop")
    assert r.returncode == 0, r.stdout + r.stderr
    assert events(live(s), "stop")


def freeze(pid):
    """SIGSTOP, then wait until the kernel has stopped it: kill() returns first, and a daemon still
    running for a moment may write a file into the directory the test is about to delete."""
    os.kill(pid, signal.SIGSTOP)
    assert wait_for(lambda: getattr(read_stat(pid), "state", None) == "T", timeout=10), read_stat(pid)


def test_deleted_state_dir_found_refused_recreated_and_stopped(stress):
    s = stress()
    pid = s.start()
    s.wait_for(lambda r: len(results_in(r)) >= 4, timeout=90, what="results")
    run_id = s.records()[0]["run_id"]

    # Frozen, the daemon cannot notice yet: status, start and run must find it by /proc alone.
    freeze(pid)
    try:
        last_seq = s.records()[-1]["seq"]
        shutil.rmtree(s.state_dir)
        r = s.run("status")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"running (pid {pid}" in r.stdout and "was deleted" in r.stdout, r.stdout
        st = json.loads(s.run("status", "--json").stdout)
        assert st["state"] == "running" and st["pid"] == pid and "deleted" in st["reason"]
        r = s.run("start")
        assert r.returncode == 1 and "already running" in r.stderr and str(pid) in r.stderr, r.stdout + r.stderr
        r = s.run("run", timeout=120)
        assert r.returncode == 1 and "already running" in r.stderr and str(pid) in r.stderr, r.stdout + r.stderr
    finally:
        os.kill(pid, signal.SIGCONT)

    # Running again, it notices: directory, lock, pid and state files back, and an event says so.
    def recreated():
        recs = live(s)
        return recs if events(recs, "state_dir_recreated") and len(results_in(recs)) >= 2 else None
    recs = wait_for(recreated, timeout=90, interval=0.3)
    assert recs, f"no state_dir_recreated event; daemon.log:\n{s.daemon_log()}"
    ev = events(recs, "state_dir_recreated")[0]
    assert ev["pid"] == pid and ev["run_id"] == run_id and ev["state_dir"] == str(s.state_dir)
    assert s.pid() == pid
    assert wait_for(lambda: s.state().get("pid") == pid, timeout=10)
    seqs = [r["seq"] for r in recs]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[0] > last_seq
    r = s.run("status")
    assert r.returncode == 0 and f"running (pid {pid}" in r.stdout and "WARNING" not in r.stdout, r.stdout
    r = s.run("start")             # the recreated directory is locked again
    assert r.returncode == 1 and "already running" in r.stderr, r.stdout + r.stderr
    assert [p for p in job_processes(pid).values() if p == "mpirun"], "the job must have run on"

    # Deleted again and frozen: `stop` finds it by /proc and stops it.
    procs = list(job_processes(pid))
    freeze(pid)
    try:
        shutil.rmtree(s.state_dir)
        stopper = subprocess.Popen(s.cmd("stop"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert wait_for(lambda: signal_pending(pid, signal.SIGTERM) or stopper.poll() is not None,
                        timeout=60, interval=0.1)
        assert stopper.poll() is None, stopper.communicate()
    finally:
        os.kill(pid, signal.SIGCONT)
    out, err = stopper.communicate(timeout=120)
    assert stopper.returncode == 0 and "stopped" in out, out + err
    assert "deleted" in err, err
    assert wait_gone([pid] + procs, timeout=30) == []
    r = s.run("status")
    assert r.returncode == 3 and "stopped" in r.stdout, r.stdout + r.stderr


def test_killed_ranks_leave_no_zombie_under_the_daemon(stress):
    s = stress()
    pid = s.start()
    s.wait_for(lambda r: len(results_in(r)) >= 4, timeout=90, what="results")
    for k in range(1, 3):
        # mpirun starts its ranks one after the other: wait for both, not the first one seen
        ranks = wait_for(lambda: (r if len(r := [p for p, n in job_processes(pid).items()
                                                 if n.startswith("collbench-engine")]) == 2 else None),
                         timeout=60, interval=0.2)
        assert ranks and len(ranks) == 2, job_processes(pid)
        os.kill(rank_zero(ranks), signal.SIGKILL)
        s.wait_for(lambda r: len(events(r, "relaunch")) >= k, timeout=90, what=f"relaunch {k}")
        left = wait_for(lambda: not zombie_children(pid), timeout=10, interval=0.2)
        assert left, f"zombie children of the daemon after killed rank {k}: {zombie_children(pid)}"
    fails = [r for r in s.records() if r["type"] == "failure"]
    assert len(fails) >= 2 and pid_alive(pid)


OSU_PLAN = """\
  plan:
    - {op: allreduce, sizes: [1KB], iterations: 5, warmup: 1}
    - {op: bcast, sizes: [1KB], iterations: 5, warmup: 1}
"""


def test_killed_mpirun_in_osu_step_mode_leaves_no_zombie(tmp_path, repo):
    """One mpirun per step (engine osu): mpirun killed while its rank hangs in a step orphans the
    rank; the daemon (their subreaper) stops it with the job and reaps it at once."""
    top = (f"engine: osu\nosu_path: {repo / 'tests' / 'osu_standin'}\n"
           "env: {OSU_STANDIN_HANG: bcast}\n")
    s = Stress(write_config(tmp_path, top_extra=top, plan=OSU_PLAN, ranks=2), tmp_path / "state")
    try:
        pid = s.start()
        assert s.state()["mode"] == "step"
        for k in range(1, 3):
            def hanging_step():
                procs = job_processes(pid)
                mpirun = [p for p, name in procs.items() if name == "mpirun"]
                ranks = [p for p, name in procs.items() if name != "mpirun"
                         and any(a.endswith("/osu_bcast") for a in cmdline(p) or ())]
                # rank 1 has returned, rank 0 sleeps after the header: the step hangs
                return mpirun if mpirun and len(ranks) == 1 and rank_zero(ranks) == ranks[0] else None
            mpirun = wait_for(hanging_step, timeout=120, interval=0.2)
            assert mpirun, f"no hanging bcast step; daemon.log:\n{s.daemon_log()}"
            os.kill(mpirun[0], signal.SIGKILL)   # its hanging rank 0 is orphaned to the daemon
            s.wait_for(lambda r: len(events(r, "relaunch")) >= k, timeout=120, what=f"relaunch {k}")
            assert wait_for(lambda: not zombie_children(pid), timeout=10, interval=0.2), \
                f"zombie children of the daemon: {zombie_children(pid)}"
        fails = [r for r in s.records() if r["type"] == "failure"]
        assert len(fails) >= 2 and all(f["op"] == "bcast" and f["exit_code"] == -9 for f in fails), fails
        assert pid_alive(pid)
    finally:
        s.cleanup()


def test_unreadable_results_log_is_an_error_for_log_and_a_note_for_status(tmp_path):
    """Permission denied on the results log (the child drops the capabilities that let root read
    a mode-000 file): `stress log` exits 2 naming the file; `status` still reports the daemon."""
    import ctypes
    import subprocess
    import sys

    def drop_dac():
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2):   # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if libc.prctl(24, cap, 0, 0, 0) != 0:   # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    state = tmp_path / "state"
    state.mkdir()
    log = state / "results.jsonl"
    log.write_text('{"schema":1}\n')
    log.chmod(0)

    def run(*verb):
        return subprocess.run([sys.executable, "-m", "collbench", "stress", *verb, "--state-dir", str(state)],
                              capture_output=True, text=True, timeout=60, preexec_fn=drop_dac)
    res = run("log")
    assert res.returncode == 2, res.stderr
    assert f"results log {log}: cannot read: Permission denied" in res.stderr and "Traceback" not in res.stderr
    res = run("status")
    assert res.returncode == 3 and "stopped" in res.stdout, res.stdout + res.stderr
    assert "cannot read the results log" in res.stderr and "Traceback" not in res.stderr
