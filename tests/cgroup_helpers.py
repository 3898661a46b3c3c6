"""A CPU-quota cgroup and a thread that moves chosen engine ranks into it as they start: how the
tests make a host or a rank slow for real (a CPU hog, a throttled node). Used by the diagnose and
engine off-CPU tests."""

import threading
import time
import uuid
from pathlib import Path


class Cgroup:
    """A cpu-quota cgroup (v2 cpu.max or v1 cpu.cfs_quota_us): what is moved into it gets at most
    quota_us of CPU time per period_us."""

    def __init__(self, quota_us, period_us=100000):
        name = f"collbench-test-{uuid.uuid4().hex[:8]}"
        if Path("/sys/fs/cgroup/cgroup.controllers").exists():
            self.dir = Path("/sys/fs/cgroup") / name
            self.dir.mkdir()
            (self.dir / "cpu.max").write_text(f"{quota_us} {period_us}\n")
        else:
            self.dir = Path("/sys/fs/cgroup/cpu") / name
            self.dir.mkdir()
            (self.dir / "cpu.cfs_period_us").write_text(f"{period_us}\n")
            (self.dir / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")

    def add(self, pid):
        (self.dir / "cgroup.procs").write_text(f"{pid}\n")

    def release(self):
        """Move every process still in the cgroup back to its parent (a long-lived job's ranks:
        the stress loop's outlive the fault), so that it can be removed."""
        for pid in (self.dir / "cgroup.procs").read_text().split():
            try:
                (self.dir.parent / "cgroup.procs").write_text(f"{pid}\n")
            except OSError:      # it ended meanwhile
                pass

    def remove(self):
        self.release()
        for _ in range(100):     # its processes have ended, but the kernel may not have let go yet
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def environ(proc):
    """The environment of /proc/<pid> as a list of b"NAME=value"."""
    return (proc / "environ").read_bytes().split(b"\0")


def rank_of(env):
    """Open MPI's rank of a process from its environment (bytes), or None."""
    return next((e.split(b"=", 1)[1] for e in env if e.startswith(b"OMPI_COMM_WORLD_RANK=")), None)


class RankMover(threading.Thread):
    """Moves every process for which wants(Path('/proc/<pid>')) is true into the cgroup as it
    appears, until stopped (with `throttling(...)`); `moved` holds their pids. wants() may raise
    OSError (the process ended): it is then skipped."""

    def __init__(self, cgroup, wants):
        super().__init__(daemon=True)
        self.cgroup, self.wants = cgroup, wants
        self.stop = threading.Event()
        self.moved = set()

    def run(self):
        while not self.stop.is_set():
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit() or int(proc.name) in self.moved:
                    continue
                try:
                    if self.wants(proc):
                        self.cgroup.add(int(proc.name))
                        self.moved.add(int(proc.name))
                except OSError:
                    continue
            time.sleep(0.005)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join()
