"""collbench.proctree against real processes: odd program names, zombies, reused pids, trees."""

import os
import shutil
import subprocess
import sys

from collbench import proctree
from conftest import wait_for


def _field(pid, name):
    st = proctree.read_stat(pid)
    return getattr(st, name) if st else None


def test_comm_with_spaces_and_parentheses(tmp_path):
    # the kernel takes comm from the executable's name: give it one that fools a naive split
    exe = tmp_path / "a) (b c"
    shutil.copy(shutil.which("sleep"), exe)
    proc = subprocess.Popen([str(exe), "30"])
    try:
        # comm changes early in exec, the argument pages (cmdline) a moment later: wait for both
        assert wait_for(lambda: _field(proc.pid, "comm") == "a) (b c" and proctree.cmdline(proc.pid))
        st = proctree.read_stat(proc.pid)
        assert (st.pid, st.ppid) == (proc.pid, os.getpid()) and st.state in ("R", "S")
        assert st.pgid == os.getpgid(proc.pid) and st.sid == os.getsid(proc.pid)
        assert st.start_ticks == proctree.start_ticks(proc.pid) > 0
        assert proctree.cmdline(proc.pid) == [str(exe), "30"]
    finally:
        proc.kill()
        proc.wait()


def test_zombie_is_not_alive_and_a_reused_start_time_is_not_the_same_process():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = proctree.start_ticks(proc.pid)
    assert wait_for(lambda: _field(proc.pid, "state") == "Z")   # ended, not yet reaped
    assert not proctree.pid_alive(proc.pid)
    assert not proctree.same_process(proc.pid, ticks)
    assert proctree.read_stat(proc.pid).ppid == os.getpid()
    proc.wait()
    assert proctree.read_stat(proc.pid) is None and proctree.start_ticks(proc.pid) is None
    me = proctree.start_ticks(os.getpid())
    assert proctree.same_process(os.getpid(), me)
    assert not proctree.same_process(os.getpid(), me - 1)


def test_descendants_follow_parent_links():
    # sh -> sleep, and sh -> sh -> sleep
    script = "sleep 30 & sh -c 'sleep 30 & wait' & echo up; read x"
    proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        assert wait_for(lambda: len(proctree.descendants(proc.pid)) == 3)
        tree = proctree.descendants(proc.pid)
        stats = proctree.all_stats()
        assert all(proctree.is_running(stats[p]) for p in tree)
        assert sorted(stats[p].ppid == proc.pid for p in tree) == [False, True, True]
        assert proc.pid not in tree and proctree.descendants(proc.pid, stats) == tree
    finally:
        for p in proctree.descendants(proc.pid):
            os.kill(p, 9)
        proc.kill()
        proc.wait()


def test_net_namespace_of_self_and_of_a_missing_pid():
    assert proctree.net_namespace("self").startswith("net:[")
    assert proctree.net_namespace(os.getpid()) == proctree.net_namespace("self")
    assert proctree.net_namespace(2 ** 22 + 1) is None
