"""Processes as /proc shows them: stat fields, liveness, start times, descendants; and the one
way collbench signals a process tree (signal_tree, stop_tree).

The one /proc parser of collbench: the job runner, the stress daemon, the SSH agent and the
`servers` probe all read processes through it, and signal them through it. A pid alone proves nothing once a process may
have ended (the kernel reuses pids), so whoever keeps a pid to signal later keeps its start time
(/proc/<pid>/stat field 22, clock ticks since boot) with it and checks same_process() first.

Standard library only, and no collbench imports: `ctl servers` sends this file's source to hosts
where collbench is not installed (see servers._probe_script).
"""

import os
import signal
import time
from typing import NamedTuple

# A zombie (Z) has ended and only waits for its parent to reap it; X is the moment of reaping.
DEAD_STATES = ("Z", "X")


class ProcStat(NamedTuple):
    """The fields of /proc/<pid>/stat that collbench uses."""
    pid: int
    comm: str          # the kernel's name of the program, cut at 15 characters
    state: str         # R, S, D, T, Z ...
    ppid: int
    pgid: int
    sid: int
    cpu_ticks: int     # utime + stime
    start_ticks: int   # start time, clock ticks since boot
    rss_pages: int


def parse_stat(pid, text):
    """A ProcStat from the text of /proc/<pid>/stat, or None if it is not one."""
    # comm (field 2) may hold spaces and parentheses: it ends at the *last* ')'
    open_, close = text.find("("), text.rfind(")")
    rest = text[close + 2:].split()
    try:
        return ProcStat(int(pid), text[open_ + 1:close], rest[0], int(rest[1]), int(rest[2]),
                        int(rest[3]), int(rest[11]) + int(rest[12]), int(rest[19]), int(rest[21]))
    except (IndexError, ValueError):
        return None


def read_stat(pid, proc_root="/proc"):
    """The ProcStat of pid, or None if there is no such process (or no readable stat)."""
    try:
        with open(f"{proc_root}/{int(pid)}/stat", "rb") as f:
            data = f.read()
    except (OSError, ValueError):
        return None
    return parse_stat(pid, data.decode("utf-8", "replace"))


def pids(proc_root="/proc"):
    """Every pid in /proc (processes may end before they are read)."""
    try:
        return [int(d) for d in os.listdir(proc_root) if d.isdigit()]
    except OSError:
        return []


def all_stats(proc_root="/proc"):
    """{pid: ProcStat} of every process, zombies included."""
    out = {}
    for pid in pids(proc_root):
        st = read_stat(pid, proc_root)
        if st is not None:
            out[pid] = st
    return out


def is_running(st):
    """True for the ProcStat of a process that has not ended (not None, not a zombie)."""
    return st is not None and st.state not in DEAD_STATES


def pid_alive(pid, proc_root="/proc"):
    """True for a running (or sleeping, stopped...) process; False for gone or a zombie."""
    return is_running(read_stat(pid, proc_root))


def start_ticks(pid, proc_root="/proc"):
    """The start time of pid in clock ticks since boot, or None if it does not exist."""
    st = read_stat(pid, proc_root)
    return st.start_ticks if st else None


def same_process(pid, ticks, stats=None, proc_root="/proc"):
    """True while pid runs and is the process that had start time `ticks` (not a reused pid).

    `stats` (from all_stats) answers from one snapshot instead of reading /proc again.
    """
    st = stats.get(pid) if stats is not None else read_stat(pid, proc_root)
    return is_running(st) and st.start_ticks == ticks


def descendants(root_pid, stats=None, proc_root="/proc"):
    """Pids of every running process below root_pid (not root_pid itself), by ppid links.

    A zombie is left out (it has no children: they were re-parented when it ended).
    """
    stats = stats if stats is not None else all_stats(proc_root)
    children = {}
    for pid, st in stats.items():
        children.setdefault(st.ppid, []).append(pid)
    found, todo = [], [root_pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if is_running(stats[child]):
                found.append(child)
                todo.append(child)
    return found


def cmdline(pid, proc_root="/proc"):
    """argv of pid as a list of str ([] for a kernel thread or a zombie), None if unreadable."""
    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def child_pids(pid, proc_root="/proc"):
    """Pids whose parent is pid, zombies included (/proc/<pid>/task/*/children, else a full scan)."""
    base = f"{proc_root}/{pid}/task"
    try:
        tasks = os.listdir(base)
        out = []
        for tid in tasks:
            with open(f"{base}/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        return out
    except FileNotFoundError:     # a kernel without CONFIG_PROC_CHILDREN (or pid gone)
        if not os.path.isdir(f"{proc_root}/{pid}"):
            return []
    except (OSError, ValueError):
        pass
    return [p for p, st in all_stats(proc_root).items() if st.ppid == pid]


def open_paths(pid, proc_root="/proc"):
    """Paths of the files pid holds open (/proc/<pid>/fd links; a deleted file's ends in
    ' (deleted)'); [] if unreadable (another user's process, or gone)."""
    base = f"{proc_root}/{pid}/fd"
    try:
        fds = os.listdir(base)
    except OSError:
        return []
    out = []
    for fd in fds:
        try:
            out.append(os.readlink(f"{base}/{fd}"))
        except OSError:
            pass
    return out


def net_namespace(pid, proc_root="/proc"):
    """The network namespace of pid ('net:[4026531840]'), None if unreadable."""
    try:
        return os.readlink(f"{proc_root}/{pid}/ns/net")
    except OSError:
        return None


# ---------------------------------------------------------------- signalling a process tree
# The one place collbench signals a job, a command or what they left behind. Never by name:
# by process group and by pid, a pid with its start time when it was kept for later.

def signal_tree(groups, sig, pids=()):
    """Send sig to process group(s) `groups` (an id, several, or None), then to each of `pids`.

    pids is a list, or {pid: start ticks} to skip a pid that now names another process (the
    kernel reuses pids). Our own process group is never signalled; processes that are gone or
    not ours to signal are skipped. Returns the pids signalled.
    """
    if groups is None:
        groups = ()
    elif isinstance(groups, int):
        groups = (groups,)
    own = os.getpgrp()
    for pgid in groups:
        if pgid and pgid > 0 and pgid != own:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    starts = pids if isinstance(pids, dict) else None
    sent = []
    for pid in pids:
        if starts is not None and not same_process(pid, starts[pid]):
            continue
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return sent


def reap_children():
    """Reap every child of ours that has ended (without waiting for the others)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_tree(find, grace, groups=None, on_wait=None, poll=0.05, kill_wait=10.0):
    """SIGTERM a process tree, SIGKILL what is left of it after `grace` seconds.

    find() gives the tree's live processes as signal_tree's pids (asked again while waiting, so
    processes started meanwhile are found too); groups is signal_tree's, or a function giving
    it at each signal (a group id names another group once its leader is gone and the id is
    reused); on_wait() runs at every poll (reap what ended). After SIGKILL it waits up to
    kill_wait s for the kernel to end them. Returns the pids that needed SIGKILL.
    """
    def signal_all(sig, alive):
        signal_tree(groups() if callable(groups) else groups, sig, alive)

    def waiting(seconds):
        deadline = time.monotonic() + seconds
        while True:
            if on_wait is not None:
                on_wait()
            alive = find()
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(poll)

    alive = find()
    if not alive:
        return []
    signal_all(signal.SIGTERM, alive)
    alive = waiting(grace)
    if not alive:
        return []
    killed = sorted(alive)
    signal_all(signal.SIGKILL, alive)
    waiting(kill_wait)
    return killed
