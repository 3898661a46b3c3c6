"""The engines: what runs the collectives, and everything that starts them.

    base.py              the Engine interface (preflight, run_steps, run_loop) and the one
                         wording of a failure
    builtin.py           the built-in C/MPI engine: plan files, CBREC records, one job per plan
    collbench_engine.c   its main source (ops, plan, timing, validation); engine_counters.c and
                         engine_offcpu.c beside it, collbench_engine.h shared; build.py builds
                         them into one binary with mpicc (cli.py: `collbench engine`)
    osu.py               the OSU Micro-Benchmarks, one job per step; osu_parser.py reads them
    nccl_tests.py        NVIDIA's nccl-tests / AMD's rccl-tests on GPUs; nccl_tests_parser.py reads them
    launcher.py          the one launch path: mpirun / Hydra / srun command line and environment
    mpi_job.py           one MPI job: stream its output, stop its whole process tree
    mpi_flavour.py       the config's MPI: its launcher, Open MPI or MPICH, version, tools beside it
    algorithms/          the MPI's own collective algorithms: what it offers, forcing one, why one
                         cannot run, what a failed forced run says
    rank_order.py        the one writer of rankfiles, machinefiles and SLURM_HOSTFILEs (hosts_order)

The verbs that run the config's engine (once, sweep, the stress daemon) find it by its config
name with get_engine() and use only the Engine interface. The verbs that need what only the
built-in engine does ask for it by name: forced algorithms and timing modes through
get_engine("builtin") (compare, topo compare, nccl replay), its --pairs mode through
launcher.build_command and builtin's CBHOSTS parser (topo measure).
"""

import importlib

from collbench.config.schema import ENGINES as NAMES

# config `engine` -> the module whose ENGINE implements it, engines/<name>.py (imported on first
# use: `once` with one engine need not import the other). The names are the config's (a floor
# below): an engine registers here, under the name the config declares, never the other way up.
_MODULES = {name: f"collbench.engines.{name.replace('-', '_')}" for name in NAMES}


def get_engine(name):
    """The Engine registered under `name`; KeyError naming the known ones otherwise."""
    if name not in _MODULES:
        raise KeyError(f"unknown engine {name!r} (expected one of: {', '.join(NAMES)})")
    return importlib.import_module(_MODULES[name]).ENGINE
