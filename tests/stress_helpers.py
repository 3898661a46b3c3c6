"""Helpers for the stress daemon tests: configs, the CLI, waiting on the results log, /proc."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from collbench.proctree import descendants, pid_alive
from collbench.results.results_log import read_records
from conftest import REPO, wait_for

# Small sizes, few iterations: a plan pass takes milliseconds, so records stream fast.
TINY_PLAN = """\
  plan:
    - {op: allreduce, sizes: [1KB, 16KB], iterations: 20, warmup: 2}
    - {op: bcast, sizes: [4KB], iterations: 20, warmup: 2}
    - {op: alltoall, sizes: [1KB], iterations: 10, warmup: 1}
"""
TINY_STEPS = [("allreduce", 1024), ("allreduce", 16384), ("bcast", 4096), ("alltoall", 1024)]


def write_config(tmp_path, stress_extra="", top_extra="", plan=TINY_PLAN, ranks=4):
    """A local config (shared memory, 4 ranks) with a tiny stress plan; returns its path.

    stress_extra's keys replace the defaults (the config refuses duplicate keys)."""
    given = {line.split(":")[0].strip() for line in stress_extra.splitlines() if ":" in line}
    defaults = "".join(f"  {k}: {v}\n" for k, v in (("backoff_initial", 0.1), ("backoff_max", 0.5),
                                                      ("stop_grace", 5)) if k not in given)
    text = (f"ranks: {ranks}\ntransport: shm\nstep_timeout: 60s\n{top_extra}"
            f"stress:\n{defaults}{stress_extra}{plan}")
    path = tmp_path / "collbench.yaml"
    path.write_text(text)
    return path


class Stress:
    """`collbench stress VERB --config C --state-dir S` for one test."""

    def __init__(self, config, state_dir):
        self.config = str(config)
        self.state_dir = Path(state_dir)
        self.results = self.state_dir / "results.jsonl"

    def cmd(self, verb, *extra):
        return [sys.executable, "-m", "collbench", "stress", verb, "--config", self.config,
                "--state-dir", str(self.state_dir), *extra]

    def run(self, verb, *extra, timeout=90):
        return subprocess.run(self.cmd(verb, *extra), capture_output=True, text=True, timeout=timeout,
                              cwd=REPO)

    def start(self):
        r = self.run("start")
        assert r.returncode == 0, f"start failed ({r.returncode}): {r.stdout}{r.stderr}"
        return self.pid()

    def pid(self):
        return int((self.state_dir / "stress.pid").read_text())

    def state(self):
        return json.loads((self.state_dir / "stress.state.json").read_text())

    def records(self):
        return read_records(str(self.results), rotate_keep=10000)

    def results_(self):
        return [r for r in self.records() if r["type"] == "result"]

    def wait_for(self, predicate, timeout=60, what="condition"):
        """Poll the results log until predicate(records) is truthy; returns its value."""
        value = wait_for(lambda: predicate(self.records()), timeout, interval=0.2)
        if value:
            return value
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; "
                             f"daemon.log:\n{self.daemon_log()}")

    def daemon_log(self):
        p = self.state_dir / "daemon.log"
        return p.read_text()[-4000:] if p.exists() else "(no daemon.log)"

    def cleanup(self):
        """Always run: stop the daemon; if that fails, kill what it left, by pid."""
        try:
            self.run("stop", timeout=60)
        finally:
            try:
                st = self.state()
            except (OSError, ValueError):
                return
            for pid in [st.get("pid"), st.get("job_pid")]:
                if pid and pid_alive(pid):
                    for p in descendants(pid) + [pid]:
                        try:
                            os.kill(p, signal.SIGKILL)
                        except ProcessLookupError:
                            pass


def program(pid):
    """argv[0]'s basename of a live pid, or None."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return os.path.basename(raw.split(b"\0")[0].decode()) if raw else None


def job_processes(daemon_pid):
    """{pid: program} of the daemon's live process tree (mpirun, ranks, orted ...)."""
    return {p: program(p) for p in descendants(daemon_pid) if pid_alive(p)}


def wait_gone(pids, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        left = [p for p in pids if pid_alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]
