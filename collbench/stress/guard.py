"""The daemon's guard: a thread that checks once a second what an operator may do under the
running daemon, and repairs it.

- the results log or mpi-output.log renamed or deleted: reopened (`log_reopened` event, by the
  writers themselves: collbench.results.appender);
- the state directory (or its lock file) deleted: recreated, lock re-taken, pid and state files
  rewritten (`state_dir_recreated` event); another daemon that took it meanwhile stops this one;
- ranks orphaned by a dying mpirun: reaped (the daemon is their subreaper).
"""

import logging
import os
import threading

from collbench import proctree
from collbench.errors import UserError
from collbench.results.state_dir import AlreadyRunning, write_pid_file

log = logging.getLogger("collbench.stress")

# How often the guard checks the state directory, the logs and orphaned children.
GUARD_INTERVAL = 1.0


class Guard:
    """The guard thread of one daemon (stress.daemon.Daemon): start(), stop()."""

    def __init__(self, daemon):
        self.daemon = daemon
        self.stopped = threading.Event()
        self._state_dir_error = None
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self.run, name="stress-guard", daemon=True)
        self._thread.start()

    def stop(self):
        self.stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def run(self):
        while not self.stopped.wait(GUARD_INTERVAL):
            try:
                self.tick()
            except Exception:   # the guard must outlive anything it trips over
                log.exception("guard check")

    def tick(self):
        d = self.daemon
        d.mpi_log.check()   # outside the io lock: it only queues its events
        with d._io_lock:
            if d.stopping:
                return
            self.check_state_dir()
            d.results.check()
            d._append_pending()
            self.reap_orphans()

    def check_state_dir(self):
        """The lock file at its path is not ours any more: the state directory was deleted (or
        the lock file). Recreate it, take the new lock, rewrite pid and state files, say so."""
        d = self.daemon
        if d._lock.holds_path():
            self._state_dir_error = None
            return
        sd = d.paths.state_dir
        reason = "directory deleted" if not os.path.isdir(sd) else "lock file deleted or replaced"
        try:
            d.paths.ensure()
            d._lock.relock()
        except AlreadyRunning as e:   # another daemon got in first: one of us must go, and it has the dir
            log.error("state directory %s: %s; stopping", sd, e)
            d._event("lock_lost", f"state directory {sd} ({reason}) is now locked by another daemon; "
                                  "stopping this one", state_dir=sd, reason=reason)
            d.request_stop("another daemon holds the recreated state directory")
            return
        except (UserError, OSError) as e:
            if str(e) != self._state_dir_error:
                log.error("state directory %s (%s) cannot be recreated: %s", sd, reason, e)
                self._state_dir_error = str(e)
            return
        self._state_dir_error = None
        try:
            write_pid_file(d.paths, d.pid)
        except OSError as e:
            log.error("cannot write %s: %s", d.paths.pid, e)
        if d._stdio_is_daemon_log:
            _reopen_stdio(d.paths.daemon_log)
        d._write_state_locked(d.status, force=True)
        log.warning("state directory %s: %s under the running daemon; recreated it and re-took its lock",
                    sd, reason)
        d._event("state_dir_recreated", f"state directory {sd}: {reason} while the daemon ran; "
                                        "recreated it, re-took its lock, rewrote the pid and state files",
                 state_dir=sd, reason=reason)

    def reap_orphans(self):
        """Reap zombie children from our jobs' sessions (ranks orphaned by a dead mpirun), never a
        launcher subprocess still waits for, nor a child of anything else (compiler runs)."""
        d = self.daemon
        sessions = set(d._job_sessions)
        for pid in proctree.child_pids(d.pid):
            if pid in d._live_launchers:
                continue
            st = proctree.read_stat(pid)
            if st is not None and st.state == "Z" and st.sid in sessions:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def same_file(fd, path):
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _reopen_stdio(path):
    """Point stdout and stderr (the daemon's log under `stress start`) at a new `path`."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        log.error("cannot reopen %s: %s", path, e)
        return
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
