"""Helpers for the engine and step-runner tests: a private engine build, configs, pid checks."""

import os
import shutil

import pytest

from collbench.engines import build as engine_build
from collbench.config import build_config


@pytest.fixture(scope="session")
def engine_bin(tmp_path_factory):
    """A collbench-engine built once per session into a private cache, copied to a unique path.

    The unique path lets a test find the job's ranks by /proc/<pid>/exe, by pid, never by name.
    """
    cache = tmp_path_factory.mktemp("engine-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("COLLBENCH_CACHE_DIR", str(cache))
    try:
        built = engine_build.ensure_engine(None)
    finally:
        mp.undo()
    private = tmp_path_factory.mktemp("engine-bin") / "collbench-engine"
    shutil.copy2(built, private)
    return str(private)


def engine_cfg(tmp_path, engine_path, ranks=2, transport="shm", **extra):
    data = {"ranks": ranks, "transport": transport, "engine_path": str(engine_path),
            "step_timeout": 120}
    data.update(extra)
    return build_config(data, "<test>", str(tmp_path))


def pids_of_exe(exe):
    """Live (non-zombie) processes whose executable is exe."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/exe") == exe and not is_gone(int(name)):
                found.append(int(name))
        except OSError:
            pass
    return found


def is_gone(pid):
    """True when pid no longer runs (no /proc entry, or a zombie waiting for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"
