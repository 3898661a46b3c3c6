"""Stopping the local daemon: `stress stop`."""

import os
import signal
import sys
import time

from collbench import proctree
from collbench.errors import UserError
from collbench.results.state_dir import (CRASHED, RUNNING, STOPPED, daemon_status, is_daemon, remove_pid_file,
                                         write_json_atomic)
from collbench import bench_processes as processes


def stop_daemon(args, cfg, paths):
    """`stress stop`: SIGTERM the daemon (it stops its job), SIGKILL after stress.stop_grace,
    then every process left with its token; confirmed by pid."""
    st = daemon_status(paths, scan=True)
    token = st.info.get("token")
    if st.state == RUNNING:
        if st.reason:   # found in /proc, not by its pid file
            print(f"collbench stress: daemon pid {st.pid} found by its lock: {st.reason}", file=sys.stderr)
        t0 = time.monotonic()
        try:
            os.kill(st.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        except PermissionError:
            raise UserError(f"not permitted to signal the daemon (pid {st.pid}): run `stress stop` as "
                            f"its user or root (under systemd: systemctl stop collbench-stress)") from None
        grace = cfg.stress.stop_grace + 5.0   # the daemon itself gives its job stop_grace
        while time.monotonic() - t0 < grace and _daemon_alive(st):
            time.sleep(0.1)
        escalated = _daemon_alive(st)
        if escalated:
            print(f"collbench stress: daemon pid {st.pid} still running {grace:.0f}s after SIGTERM: SIGKILL",
                  file=sys.stderr)
            proctree.signal_tree(None, signal.SIGKILL, [st.pid])
        killed = _kill_token(token)
        left = _wait_gone([st.pid] + killed, 5.0)
        if left:
            print(f"collbench stress: could not stop pid(s) {', '.join(map(str, left))}", file=sys.stderr)
            return 1
        if escalated:
            _mark_stopped(paths, st.info, "killed by `stress stop` after the grace period")
            remove_pid_file(paths)
        extra = f"; killed {len(killed)} leftover process(es)" if killed else ""
        print(f"collbench stress: stopped (pid {st.pid}, {time.monotonic() - t0:.1f}s){extra}")
        return 0
    killed = _kill_token(token)
    left = _wait_gone(killed, 5.0)
    if st.state == CRASHED:
        remove_pid_file(paths)
        _mark_stopped(paths, st.info, f"cleaned up after a crash ({st.reason})")
        msg = f"collbench stress: was not running ({st.reason}); removed the stale pid file"
    else:
        msg = "collbench stress: not running"
    if killed:
        msg += f"; killed {len(killed)} process(es) the dead daemon left: {', '.join(map(str, killed))}"
    print(msg)
    return 1 if left else 0


def _daemon_alive(st):
    return is_daemon(st.pid, st.info.get("proc_start"))


def _kill_token(token):
    """SIGKILL every process carrying the daemon's token (its job's processes); their pids."""
    if not token:
        return []
    pids = [p for p in processes.token_pids(token) if proctree.pid_alive(p)]
    proctree.signal_tree(None, signal.SIGKILL, pids)
    return pids


def _wait_gone(pids, timeout):
    end = time.monotonic() + timeout
    while True:
        left = [p for p in pids if proctree.pid_alive(p)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


def _mark_stopped(paths, info, why):
    if not info:
        return
    info = dict(info, status=STOPPED, updated=time.time(), job_pid=None, stop_reason=why)
    try:
        write_json_atomic(paths.state, info)
    except OSError:
        pass
