"""The job runner: line streaming, idle timeouts, stderr tails, and stopping a job for good."""

import io
import os
import shutil
import sys
import time

import pytest

from collbench import proctree
from collbench.engines import launcher
from collbench.config import build_config
from collbench.engines.mpi_job import JobTimeout, MpiJob, run_job, stderr_reason
from conftest import wait_for
from engine_helpers import is_gone

PY = sys.executable


def py(code):
    return [PY, "-c", code]


def test_lines_stream_and_idle_timeout_raises():
    job = MpiJob(py("import time\nprint('first', flush=True)\nprint('second', flush=True)\ntime.sleep(60)"),
                 dict(os.environ)).start()
    got = []
    t0 = time.monotonic()
    with pytest.raises(JobTimeout):
        for line in job.lines(idle_timeout=1.0):
            got.append(line)
    assert got == ["first", "second"]
    assert 1.0 <= time.monotonic() - t0 < 20
    assert job.returncode is None  # still running: a timeout does not stop the job by itself
    assert job.stop(grace=5) == []  # python dies on SIGTERM: nothing had to be killed
    assert job.returncode == -15 and is_gone(job.pid)


def test_stderr_tail_is_bounded_and_the_log_gets_both_streams():
    log = io.StringIO()
    code = ("import sys\n"
            "for i in range(500): print(f'err {i}', file=sys.stderr)\n"
            "print('out line')\nsys.exit(3)")
    res = run_job(py(code), dict(os.environ), idle_timeout=30, on_line=lambda line: None, output_log=log)
    assert res.returncode == 3 and not res.timed_out and res.killed_pids == []
    assert res.stderr_tail.splitlines() == [f"err {i}" for i in range(480, 500)]
    text = log.getvalue()
    assert "out] out line" in text and "err] err 0" in text and "err] err 499" in text
    job = MpiJob(py("import sys; [print(i, file=sys.stderr) for i in range(10)]"), dict(os.environ)).start()
    assert job.wait(30) == 0
    assert job.stderr_tail(3) == "7\n8\n9"


def test_run_job_times_out_and_kills_what_ignores_sigterm():
    # the shell and both children ignore SIGTERM: only SIGKILL ends them
    argv = ["sh", "-c", "trap '' TERM; sleep 300 & sleep 300 & echo started; wait"]
    seen = []
    t0 = time.monotonic()
    res = run_job(argv, dict(os.environ), idle_timeout=1.0, on_line=seen.append, stop_grace=1.0)
    assert seen == ["started"] and res.timed_out
    assert len(res.killed_pids) == 3  # sh and its two sleeps
    assert all(is_gone(pid) for pid in res.killed_pids)
    assert res.returncode == -9
    assert time.monotonic() - t0 < 30


def test_process_tree_follows_parent_links():
    job = MpiJob(["sh", "-c", "sleep 300 & sh -c 'sleep 300 & wait' & echo up; wait"], dict(os.environ)).start()
    try:
        assert next(job.lines(30)) == "up"
        deadline = time.monotonic() + 10
        while len(job.descendants()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = job.descendants()
        assert len(tree) == 3  # sleep, the inner sh, and the inner sh's sleep (a grandchild)
        parents = {pid: _ppid(pid) for pid in tree}
        assert sorted(parents.values()).count(job.pid) == 2
        assert any(ppid in tree for ppid in parents.values())
        assert set(proctree.descendants(job.pid)) == set(tree)
    finally:
        job.stop(grace=5)
    assert all(is_gone(pid) for pid in tree)


def _stat_field(pid, n):
    """Field n of /proc/<pid>/stat (1-based, as proc(5)), read here independently of proctree."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[n - 3])


def _ppid(pid):
    return _stat_field(pid, 4)


@pytest.mark.mpi
def test_stop_leaves_nothing_of_an_mpi_job_whose_ranks_ignore_sigterm(tmp_path):
    # real mpirun; each rank ignores SIGTERM and starts a child in a session of its own (out of
    # reach of mpirun's clean-up and of the job's process group), ignoring SIGTERM as well
    cfg = build_config({"ranks": 2, "transport": "shm"}, "<test>", str(tmp_path))
    rank = "trap '' TERM; setsid sleep 300 & echo rank-up; exec sleep 300"
    argv, env = launcher.build_command(cfg, [shutil.which("sh"), "-c", rank])
    job = MpiJob(argv, env).start()
    try:
        lines = job.lines(60)
        assert [next(lines), next(lines)] == ["rank-up", "rank-up"]
        def settled():
            # the escaped children exist a moment before their setsid(): wait for both sessions
            pids = job.descendants()
            return pids if len(pids) == 4 and sum(_sid(p) == p for p in pids) == 2 else None
        before = wait_for(settled, timeout=20) or job.descendants()
        assert len(before) == 4  # two ranks (sleep) and their two escaped sleeps
        escaped = [pid for pid in before if _sid(pid) == pid]
        assert len(escaped) == 2
    finally:
        killed = job.stop(grace=1.5)   # the escaped sleeps ignore SIGTERM: all of it is waited
    assert set(escaped) <= set(killed)  # only SIGKILL, from us, could end them
    assert all(is_gone(pid) for pid in before + [job.pid])
    assert job.returncode is not None


def _sid(pid):
    return _stat_field(pid, 6)


@pytest.mark.mpi
def test_run_job_reports_an_mpi_failure_with_its_stderr(tmp_path):
    cfg = build_config({"ranks": 2, "transport": "shm"}, "<test>", str(tmp_path))
    code = "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then echo 'rank 1 is unhappy' >&2; exit 7; fi; sleep 300"
    argv, env = launcher.build_command(cfg, [shutil.which("sh"), "-c", code])
    t0 = time.monotonic()
    res = run_job(argv, env, idle_timeout=60, on_line=lambda line: None)
    assert res.returncode not in (0, None) and not res.timed_out
    assert "rank 1 is unhappy" in res.stderr_tail
    assert time.monotonic() - t0 < 60


def test_stderr_reason_picks_the_telling_line():
    box = "-" * 74
    died = (f"[vm:1] Read -1, expected 524288, errno = 3\n{box}\nPrimary job  terminated normally, but 1 "
            f"process returned\na non-zero exit code.\n{box}\n{box}\nmpirun noticed that process rank 1 "
            f"with PID 0 on node vm exited on signal 9 (Killed).\n{box}")
    assert stderr_reason(died) == "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
    own = f"collbench-engine: plan p line 2: unknown op 'x'\n{box}\nPrimary job  terminated normally\n{box}"
    assert stderr_reason(own) == "collbench-engine: plan p line 2: unknown op 'x'"
    # a box's first paragraph, in one line (Open MPI wraps its sentences at 74 columns)
    assert stderr_reason(f"{box}\nmpirun was unable to launch\nmore\n\nsecond paragraph\n{box}") == \
        "mpirun was unable to launch more"
    assert stderr_reason("") == ""
    # ssh's failure, not Open MPI's warning of a setpgid race that healthy jobs print too (seen on a
    # loaded machine: the warning's "Permission denied" had been taken for ssh's)
    unreachable = ("[vm:25102] plm:rsh: Warning: setpgid(25112,25112) failed in parent with errno=Permission denied(13)\n"
                   "ssh: Could not resolve hostname badhost1.invalid: Name or service not known\n"
                   f"{box}\nORTE was unable to reliably start one or more daemons.\n{box}")
    assert stderr_reason(unreachable) == "ssh: Could not resolve hostname badhost1.invalid: Name or service not known"
    assert stderr_reason(unreachable.splitlines()[0]) == ""
