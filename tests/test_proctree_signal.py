"""proctree.signal_tree / stop_tree: the one way collbench signals a process tree, on real processes."""

import os
import signal
import subprocess
import sys
import time

from collbench import proctree
from conftest import wait_for

# a process that ignores SIGTERM and starts a child (in its group) that ignores it too
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(600)
"""
POLITE = "import time; print('ready', flush=True); time.sleep(600)"


def start(code):
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, proc.stdout.readline().strip()


def tree_of(proc):
    stats = proctree.all_stats()
    pids = proctree.descendants(proc.pid, stats) + ([proc.pid] if proc.pid in stats else [])
    return {p: stats[p].start_ticks for p in pids}


def test_stop_tree_terms_then_kills_what_ignores_sigterm():
    proc, child = start(STUBBORN)
    child = int(child)
    try:
        assert proctree.pid_alive(child)
        seen = {}

        def live():
            seen.update(tree_of(proc))
            return {p: s for p, s in seen.items() if proctree.same_process(p, s)}

        t0 = time.monotonic()
        killed = proctree.stop_tree(live, grace=1.0, groups=proc.pid, on_wait=proc.poll)
        assert time.monotonic() - t0 >= 1.0            # the grace period was given
        assert sorted(killed) == sorted([proc.pid, child])   # both ignored SIGTERM: SIGKILLed
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert wait_for(lambda: not proctree.pid_alive(child), timeout=10)
    finally:
        proctree.signal_tree(proc.pid, signal.SIGKILL, [proc.pid, child])
        proc.wait()


def test_stop_tree_returns_nothing_when_sigterm_is_enough():
    proc, _ = start(POLITE)
    killed = proctree.stop_tree(lambda: {p: s for p, s in tree_of(proc).items() if proctree.same_process(p, s)},
                                grace=20.0, groups=proc.pid, on_wait=proc.poll)
    assert killed == [] and proc.wait(timeout=10) == -signal.SIGTERM


def test_signal_tree_reaches_the_group_and_skips_reused_pids():
    proc, _ = start(POLITE)
    try:
        start_ticks = proctree.start_ticks(proc.pid)
        # a start time that is not the process's: as if the pid had been reused since
        assert proctree.signal_tree(None, signal.SIGTERM, {proc.pid: start_ticks + 1}) == []
        assert proc.poll() is None and proctree.pid_alive(proc.pid)
        # the group alone reaches it (it leads its own group)
        assert proctree.signal_tree(proc.pid, signal.SIGTERM) == []
        assert proc.wait(timeout=10) == -signal.SIGTERM
        # gone: nothing to signal, nothing raised
        assert proctree.signal_tree(proc.pid, signal.SIGTERM, [proc.pid]) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


OWN_GROUP = """
import os, signal, sys
from collbench import proctree
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
proctree.signal_tree(os.getpgrp(), signal.SIGUSR1)
proctree.signal_tree([os.getpgrp(), None, 0, -1], signal.SIGUSR1)
before = len(got)
os.killpg(os.getpgrp(), signal.SIGUSR1)   # the handler works: a real group signal is seen
print(before, len(got))
"""


def test_signal_tree_never_signals_our_own_group():
    out = subprocess.run([sys.executable, "-c", OWN_GROUP], capture_output=True, text=True, timeout=60,
                         start_new_session=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1"]
