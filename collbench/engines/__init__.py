"""The engines: what runs the collectives, and everything that starts them.

    base.py              the Engine interface (preflight, run_steps, run_loop) and the one
                         wording of a failure
    builtin.py           the built-in C/MPI engine: plan files, CBREC records, one job per plan
    collbench_engine.c   its source; build.py builds it with mpicc (cli.py: `collbench engine`)
    osu.py               the OSU Micro-Benchmarks, one job per step; osu_parser.py reads them
    nccl_tests.py        NVIDIA's nccl-tests / AMD's rccl-tests on GPUs; nccl_tests_parser.py reads them
    launcher.py          the mpirun / srun command line and environment from the config
    mpi_job.py           one MPI job: stream its output, stop its whole process tree
    algorithms.py        the MPI's own collective algorithms and how to force one
    mpi_flavour.py       Open MPI or MPICH, and the tools beside the launcher
    rank_order.py        the config's hosts_order at launch

Callers find an engine by its config name with get_engine() and use only the Engine interface:
nothing outside this package branches on an engine's name.
"""

import importlib

# config `engine` -> the module whose ENGINE implements it (imported on first use: `once` with
# one engine need not import the other)
_MODULES = {
    "builtin": "collbench.engines.builtin",
    "osu": "collbench.engines.osu",
    "nccl-tests": "collbench.engines.nccl_tests",
}
NAMES = tuple(_MODULES)


def get_engine(name):
    """The Engine registered under `name`; KeyError naming the known ones otherwise."""
    if name not in _MODULES:
        raise KeyError(f"unknown engine {name!r} (expected one of: {', '.join(NAMES)})")
    return importlib.import_module(_MODULES[name]).ENGINE
