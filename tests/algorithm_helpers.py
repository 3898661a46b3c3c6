"""Helpers for the algorithm and compare tests: an engine built with MPICH, runs under Open MPI's
pml monitoring."""

import pytest

from conftest import require_tool

from collbench.compare import pml_monitoring as pm
from collbench.config import build_config
from collbench.engines import builtin
from collbench.engines.build import ensure_engine
from collbench.results.records import RunContext


@pytest.fixture(scope="session")
def mpich_engine(tmp_path_factory):
    """collbench-engine built with MPICH's mpicc.mpich (the build picks it from launcher_path)."""
    require_tool("mpirun.mpich")
    require_tool("mpicc.mpich")
    cache = tmp_path_factory.mktemp("mpich-engine-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("COLLBENCH_CACHE_DIR", str(cache))
    try:
        cfg = build_config({"launcher_path": "mpirun.mpich"}, "<test>", str(cache))
        return ensure_engine(cfg)
    finally:
        mp.undo()


def run_monitored(tmp_path, cfg, steps, name="run"):
    """(records, profiles) of the steps run through the built-in engine with pml monitoring."""
    directory = tmp_path / name
    directory.mkdir()
    mc = pm.monitored(cfg, directory)
    recs = list(builtin.run_steps(mc, steps, RunContext(mc, "builtin", "test")))
    return recs, pm.read_profiles(directory)


def sends(profiles, size):
    return pm.sends_of_size(profiles, 0, size)
