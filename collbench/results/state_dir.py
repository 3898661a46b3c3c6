"""The daemon's pid file, state file and lock, and telling a live daemon from a stale pid file.

A pid alone proves nothing after a crash: the kernel reuses pids. The state file records the
daemon's start time as the kernel counts it (/proc/<pid>/stat field 22, clock ticks since
boot); a pid is our daemon only if it is alive, not a zombie, and has that start time. The
lock file is held (flock) by the daemon for its whole life, so two daemons can never share a
state directory even when two `start`s race.
"""

import fcntl
import json
import os
from dataclasses import dataclass, field

from collbench import proctree
from collbench.bounded_file import UntrustedFileError, read_limited_text
from collbench.bounded_repr import bounded_repr
from collbench.config import flag_path
from collbench.errors import UserError

PID_FILE = "stress.pid"
STATE_FILE = "stress.state.json"
LOCK_FILE = "stress.lock"
RESULTS_FILE = "results.jsonl"
MPI_OUTPUT_FILE = "mpi-output.log"
DAEMON_LOG_FILE = "daemon.log"
PLAN_FILE = "stress-plan.txt"   # the engine plan file of the running job

RUNNING, STOPPED, CRASHED = "running", "stopped", "crashed"
# `status` exit codes, as LSB init scripts: 0 running, 1 dead with a pid file left, 3 not running.
STATUS_EXIT = {RUNNING: 0, CRASHED: 1, STOPPED: 3}


class AlreadyRunning(UserError):
    exit_code = 1


@dataclass
class StatePaths:
    state_dir: str
    results_log: str = None

    def __post_init__(self):
        if self.results_log is None:
            self.results_log = os.path.join(self.state_dir, RESULTS_FILE)

    @classmethod
    def for_config(cls, cfg, state_dir=None):
        """The daemon's files for a config: in state_dir (a --state-dir flag, relative to the
        current directory) or the config's; the results log where stress.results_log puts it
        (already resolved by the config loader), else in the state directory."""
        directory = flag_path(state_dir) if state_dir else os.path.abspath(cfg.state_dir)
        results = cfg.stress.results_log
        return cls(directory, os.path.abspath(results) if results else None)

    @property
    def pid(self):
        return os.path.join(self.state_dir, PID_FILE)

    @property
    def state(self):
        return os.path.join(self.state_dir, STATE_FILE)

    @property
    def lock(self):
        return os.path.join(self.state_dir, LOCK_FILE)

    @property
    def mpi_output(self):
        return os.path.join(self.state_dir, MPI_OUTPUT_FILE)

    @property
    def daemon_log(self):
        return os.path.join(self.state_dir, DAEMON_LOG_FILE)

    @property
    def plan(self):
        return os.path.join(self.state_dir, PLAN_FILE)

    def ensure(self):
        """Create the state directory (and the results log's) or say why it cannot be."""
        for d in {self.state_dir, os.path.dirname(os.path.abspath(self.results_log))}:
            try:
                os.makedirs(d, exist_ok=True)
            except OSError as e:
                raise UserError(f"state directory {d}: cannot create it ({e.strerror}); "
                                f"choose another with --state-dir or state_dir in the config") from None
            if not os.access(d, os.W_OK | os.X_OK):
                raise UserError(f"state directory {d} is not writable by this user; "
                                f"choose another with --state-dir or state_dir in the config")


# ---------------------------------------------------------------- /proc

def is_daemon(pid, start_ticks, proc_root="/proc"):
    """Is `pid` alive and the very process that wrote the state (same kernel start time)?"""
    if not pid:
        return False
    if start_ticks is None:
        # An old state file without a start time: fall back on the command line.
        if not proctree.pid_alive(pid, proc_root):
            return False
        cmd = " ".join(proctree.cmdline(pid, proc_root) or ())
        return "stress" in cmd and ("collbench" in cmd or "mpi_bandwidth_stress" in cmd)
    return proctree.same_process(pid, start_ticks, proc_root=proc_root)


# ---------------------------------------------------------------- files

def write_json_atomic(path, obj):
    """Write to a temp file in the same directory, fsync, rename: readers see old or new."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_pid_file(paths, pid):
    tmp = f"{paths.pid}.tmp.{pid}"
    with open(tmp, "w") as f:
        f.write(f"{pid}\n")
    os.replace(tmp, paths.pid)


# The state directory may hold anything (a FIFO, a link to /dev/zero, gigabytes): its files are
# read bounded, and a file that is not what the daemon writes counts as garbled (a stale daemon).
MAX_PID_FILE = 64
MAX_STATE_FILE = 1 << 20
READ_TIMEOUT_S = 5.0


def read_pid_file(paths):
    """The pid in the pid file, None if there is none; a garbled file counts as stale (0)."""
    try:
        text = read_limited_text(paths.pid, MAX_PID_FILE, timeout_s=READ_TIMEOUT_S).strip()
    except UntrustedFileError:
        return 0 if os.path.lexists(paths.pid) else None    # gone meanwhile: a clean stop
    return int(text) if text.isascii() and text.isdigit() and 0 < int(text) < 1 << 31 else 0


def read_state(paths):
    """The state file's object, None if there is none; {} when it is not one (garbled)."""
    try:
        data = json.loads(read_limited_text(paths.state, MAX_STATE_FILE, timeout_s=READ_TIMEOUT_S))
    except UntrustedFileError:
        return {} if os.path.lexists(paths.state) else None
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _pid(v):
    """A pid from the state file: a positive int a kernel can have, else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 31 else None


def remove_pid_file(paths, pid=None):
    """Remove the pid file (only if it still names `pid`, when given)."""
    if pid is not None and read_pid_file(paths) not in (pid, 0, None):
        return
    try:
        os.unlink(paths.pid)
    except FileNotFoundError:
        pass


class DaemonLock:
    """An exclusive flock held for the daemon's life; released by the kernel if it dies.

    A flock lives on an inode: delete the state directory and a new one gets a new, unlocked
    lock file. So acquire() also scans /proc for a daemon still holding the old one (find_daemons),
    and the running daemon re-locks the new file once it notices (holds_path(), relock()).
    """

    def __init__(self, paths):
        self.paths = paths
        self.fd = None

    def acquire(self):
        fd = self._lock_file()
        others = [d for d in find_daemons(self.paths.state_dir) if d.pid != os.getpid()]
        if others:
            os.close(fd)
            raise AlreadyRunning(f"a stress daemon is already running in {self.paths.state_dir} "
                                 f"(pid {others[0].pid}; {others[0].reason}); stop it first with "
                                 "`collbench stress stop`")
        self.fd = fd
        return self

    def _lock_file(self):
        fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = read_pid_file(self.paths)
            raise AlreadyRunning(f"a stress daemon is already running in {self.paths.state_dir}"
                                 + (f" (pid {pid})" if pid else "")
                                 + "; stop it first with `collbench stress stop`") from None
        return fd

    def holds_path(self):
        """False once the lock file at its path is not the one we hold (deleted or replaced)."""
        try:
            st = os.stat(self.paths.lock)
        except FileNotFoundError:
            return False
        except OSError:
            return True      # cannot tell (permissions): nothing to repair
        own = os.fstat(self.fd)
        return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)

    def relock(self):
        """Lock the file now at the path, then let the old (deleted) one go; AlreadyRunning if taken."""
        fd = self._lock_file()
        old, self.fd = self.fd, fd
        if old is not None:
            os.close(old)

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ---------------------------------------------------------------- finding a daemon in /proc

@dataclass
class FoundDaemon:
    pid: int
    start_ticks: int
    reason: str          # why the pid file did not lead to it ("its state directory ... was deleted")


def is_stress_daemon_argv(argv):
    """True for the argv of `collbench stress start|run` (console script or python -m collbench)."""
    for i in range(len(argv or ()) - 1):
        if argv[i] == "stress" and argv[i + 1] in ("start", "run"):
            head = argv[:i]
            return (any(a == "-m" and b == "collbench" for a, b in zip(head, head[1:]))
                    or any(os.path.basename(a) == "collbench" for a in head))
    return False


def find_daemons(state_dir, proc_root="/proc"):
    """Live stress daemons holding the lock file of `state_dir` open, even a deleted one.

    Exact, never by name: the process's argv must be `collbench stress start|run` and one of its
    open files must be <state_dir>/stress.lock (the kernel appends ' (deleted)' once the file or
    its directory is gone). A forked child between fork and exec is left out (its parent counts).
    """
    lock_paths = {os.path.join(d, LOCK_FILE) for d in
                  (os.path.abspath(state_dir), os.path.realpath(state_dir))}
    found = {}
    for pid in proctree.pids(proc_root):
        if not is_stress_daemon_argv(proctree.cmdline(pid, proc_root)):
            continue
        for target in proctree.open_paths(pid, proc_root):
            deleted = target.endswith(" (deleted)")
            if (target[:-len(" (deleted)")] if deleted else target) in lock_paths:
                st = proctree.read_stat(pid, proc_root)
                if proctree.is_running(st):
                    found[pid] = (st, deleted)
                break
    out = []
    for pid, (st, deleted) in sorted(found.items()):
        if st.ppid in found:
            continue
        if deleted:
            reason = (f"its state directory {state_dir} was deleted under it"
                      if not os.path.isdir(state_dir) else
                      f"its lock file in {state_dir} was deleted (the directory was removed and recreated)")
        else:
            reason = f"it runs without a valid pid file in {state_dir}"
        out.append(FoundDaemon(pid, st.start_ticks, reason))
    return out


# ---------------------------------------------------------------- status

@dataclass
class DaemonStatus:
    state: str                   # running | stopped | crashed
    pid: int = None
    reason: str = ""
    info: dict = field(default_factory=dict)   # the state file's contents

    @property
    def exit_code(self):
        return STATUS_EXIT[self.state]


def daemon_status(paths, scan=False):
    """Running, stopped or crashed, from the pid file, the state file and /proc.

    With scan, a daemon the files do not lead to (its state directory deleted under it) is
    looked for in /proc by its lock file (find_daemons); the reason says why it was not found
    by its files. The exporter polls without scan (files only, cheap).
    """
    st = _status_from_files(paths)
    if scan and st.state != RUNNING:
        found = find_daemons(paths.state_dir)
        if found:
            d = found[0]
            info = st.info if st.info.get("pid") == d.pid else {"pid": d.pid, "proc_start": d.start_ticks}
            if not isinstance(info.get("started"), (int, float)) and _started_at(d.start_ticks):
                info = dict(info, started=_started_at(d.start_ticks))
            return DaemonStatus(RUNNING, d.pid, d.reason, info)
    return st


def _started_at(ticks):
    """Unix time of a start time in clock ticks since boot (None if /proc/stat has no btime)."""
    try:
        with open("/proc/stat") as f:
            btime = next(int(ln.split()[1]) for ln in f if ln.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None


def _status_from_files(paths):
    info = read_state(paths) or {}
    pid_file = read_pid_file(paths)
    if pid_file is None and info.get("status") in (None, STOPPED):
        return DaemonStatus(STOPPED, None, "", info)    # a clean stop removes the pid file
    pid = pid_file if pid_file is not None else _pid(info.get("pid"))
    start_ticks = info.get("proc_start") if info.get("pid") == pid else None
    if not (isinstance(start_ticks, int) and not isinstance(start_ticks, bool)):
        start_ticks = None
    if pid and is_daemon(pid, start_ticks):
        return DaemonStatus(RUNNING, pid, "", info)
    if pid_file is not None:
        why = ("the pid file is unreadable" if pid_file == 0 else
               f"pid {pid} is not running" if not proctree.pid_alive(pid) else
               f"pid {pid} is now another process")
        return DaemonStatus(CRASHED, pid, f"stale pid file ({why})", info)
    return DaemonStatus(CRASHED, pid, f"the state file says {bounded_repr(info.get('status'))} "
                                      "but no daemon is running", info)


