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
from collbench.errors import UserError

PID_FILE = "stress.pid"
STATE_FILE = "stress.state.json"
LOCK_FILE = "stress.lock"
RESULTS_FILE = "results.jsonl"
MPI_OUTPUT_FILE = "mpi-output.log"
DAEMON_LOG_FILE = "daemon.log"

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


def read_pid_file(paths):
    """The pid in the pid file, None if there is none; a garbled file counts as stale (0)."""
    try:
        with open(paths.pid) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def read_state(paths):
    try:
        with open(paths.state, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def remove_pid_file(paths, pid=None):
    """Remove the pid file (only if it still names `pid`, when given)."""
    if pid is not None and read_pid_file(paths) not in (pid, 0, None):
        return
    try:
        os.unlink(paths.pid)
    except FileNotFoundError:
        pass


class DaemonLock:
    """An exclusive flock held for the daemon's life; released by the kernel if it dies."""

    def __init__(self, paths):
        self.paths = paths
        self.fd = None

    def acquire(self):
        self.fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            pid = read_pid_file(self.paths)
            raise AlreadyRunning(f"a stress daemon is already running in {self.paths.state_dir}"
                                 + (f" (pid {pid})" if pid else "")
                                 + "; stop it first with `collbench stress stop`") from None
        return self

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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


def daemon_status(paths):
    """Running, stopped or crashed, from the pid file, the state file and /proc."""
    info = read_state(paths) or {}
    pid_file = read_pid_file(paths)
    if pid_file is None and info.get("status") in (None, STOPPED):
        return DaemonStatus(STOPPED, None, "", info)    # a clean stop removes the pid file
    pid = pid_file if pid_file is not None else info.get("pid")
    start_ticks = info.get("proc_start") if info.get("pid") == pid else None
    if pid and is_daemon(pid, start_ticks):
        return DaemonStatus(RUNNING, pid, "", info)
    if pid_file is not None:
        why = ("the pid file is unreadable" if pid_file == 0 else
               f"pid {pid} is not running" if not proctree.pid_alive(pid) else
               f"pid {pid} is now another process")
        return DaemonStatus(CRASHED, pid, f"stale pid file ({why})", info)
    return DaemonStatus(CRASHED, pid, f"the state file says {info.get('status')!r} "
                                      "but no daemon is running", info)


