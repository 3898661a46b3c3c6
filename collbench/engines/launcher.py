"""The one launch path: the command line and environment of one MPI job, from the config.

build_command makes one pass and asks each part once:

1. mpi_flavour.mpi_of: the launcher and its MPI (Open MPI or MPICH; probed once per process)
2. algorithms.launch_settings: what forces the job's algorithms (MCA parameters or variables)
3. the transport preset (TRANSPORT_PRESETS) and the config's `env`
4. rank_order.placement: hosts_order as the launcher's own file
5. slurm.srun_options (srun only): the PMI plugin and the job's shape

and then writes the argv in the launcher's syntax: Open MPI's mpirun (`--mca k v`, `-x VAR`),
MPICH's Hydra (`-genv VAR value`, no MCA), Slurm's srun (MCA parameters as OMPI_MCA_k in the
environment), or none (launcher: none, one process started as it is). mca_arguments is the one
mapping from MCA parameters to a launcher's options or environment, for callers that pass
settings through launcher_args and env (compare's tuning files, pml monitoring).
"""

import os

from collbench import slurm
from collbench.engines import algorithms as algs
from collbench.engines import mpi_flavour, rank_order
from collbench.engines.mpi_flavour import NO_LAUNCHER
from collbench.errors import UserError

TRANSPORT_PRESETS = {
    # RDMA clusters (as the prototype this project replaces ran them): UCX with UD verbs
    "ucx": {"mca": (("pml", "ucx"), ("osc", "ucx")),
            "env": {"UCX_TLS": "ud_verbs,self,sm", "UCX_NET_DEVICES": "all"}},
    # UCX over TCP: the UCX code path without RDMA devices (pml_ucx refuses tcp unless told "any")
    "ucx-tcp": {"mca": (("pml", "ucx"), ("pml_ucx_tls", "any"), ("pml_ucx_devices", "any")),
                "env": {"UCX_TLS": "tcp,sm,self"}},
    # OpenMPI's ob1 over TCP only: hosts that share /dev/shm and a hostname (namespaces) need it
    "ob1-tcp": {"mca": (("pml", "ob1"), ("btl", "tcp,self")), "env": {}},
    # one machine, shared memory
    "shm": {"mca": (("pml", "ob1"), ("btl", "vader,self")), "env": {}},
    # leave the MPI's own defaults alone
    "none": {"mca": (), "env": {}},
}


# the launcher syntaxes build_command writes, and the rank-order file each reads
MPIRUN, HYDRA, SRUN = "mpirun", "hydra", "srun"
_ORDER_FORM = {MPIRUN: rank_order.RANKFILE, HYDRA: rank_order.MACHINEFILE, SRUN: rank_order.SLURM_HOSTFILE}


def mpi_version(cfg):
    """The config's MPI as records name it ('mpirun (Open MPI) 4.1.4', 'MPICH 4.0.2 (Hydra)',
    'none' for launcher: none); UserError when the launcher cannot be found."""
    return mpi_flavour.mpi_of(cfg).version


def syntax(cfg, mpi=None):
    """MPIRUN, HYDRA, SRUN or NO_LAUNCHER: the command line the config's launcher takes."""
    if cfg.launcher in (SRUN, NO_LAUNCHER):
        return cfg.launcher
    mpi = mpi or mpi_flavour.mpi_of(cfg)
    return HYDRA if mpi.flavour == mpi_flavour.MPICH else MPIRUN


def transport_env(cfg):
    """The environment the ranks need: preset variables, overridden by the config's env."""
    env = dict(TRANSPORT_PRESETS[cfg.transport]["env"])
    # the engine's grace for the step in progress after a stop signal: half of stress.stop_grace
    # (SIGTERM -> SIGKILL), so a rank whose step cannot end (a peer gone) stops before the kill
    env["COLLBENCH_ENGINE_STOP_GRACE"] = f"{max(1.0, cfg.stress.stop_grace / 2):g}"
    env.update(cfg.env)
    return env


def mca_arguments(cfg, mca):
    """(launcher options, environment variables) carrying MCA parameters [(name, value)]:
    `--mca name value` on mpirun's command line; OMPI_MCA_name variables under srun (and under
    Hydra or no launcher, where only an Open MPI program reads them)."""
    if syntax(cfg) == MPIRUN:
        return _mca_options(mca), {}
    return [], _mca_env(mca)


def _mca_options(mca):
    options = []
    for k, v in mca:
        options += ["--mca", k, v]
    return options


def _mca_env(mca):
    return {f"OMPI_MCA_{k}": v for k, v in mca}


def build_command(cfg, program_argv, ranks=None, algorithms=None):
    """(argv, env) to launch program_argv on cfg.ranks ranks (or `ranks`) over cfg.hosts.

    env is the full environment for subprocess (os.environ plus the transport's variables).
    algorithms: {op: algorithm name} forced for this job (engines/algorithms translates them
    per MPI flavour).
    """
    np = ranks or cfg.ranks
    mpi = mpi_flavour.mpi_of(cfg)
    form = syntax(cfg, mpi)
    env = dict(os.environ)
    if form == NO_LAUNCHER:   # one process on this machine, started as it is (a GPU box without MPI)
        if np != 1 or not cfg.implicit_hosts:
            raise UserError(f"launcher: none starts one process on this machine; the config asks for "
                            f"{np} ranks{'' if cfg.implicit_hosts else ' on hosts'} (use mpirun or srun)")
        env.update(transport_env(cfg))
        return list(program_argv), env
    forced = algs.launch_settings(cfg, algorithms, mpi=mpi)
    variables = transport_env(cfg)
    variables.update(forced.env)
    mca = list(TRANSPORT_PRESETS[cfg.transport]["mca"]) + list(forced.mca)
    placement, order_env = rank_order.placement(cfg, np, _ORDER_FORM[form])
    env.update(variables)
    env.update(order_env)
    if form == SRUN:
        argv = _srun_argv(cfg, mpi.launcher, np, placement)
        env.update(_mca_env(mca))
    elif form == HYDRA:
        argv = _hydra_argv(cfg, mpi.launcher, np, placement, variables)
    else:
        argv = _mpirun_argv(cfg, mpi.launcher, np, placement, mca, variables)
    return argv + list(cfg.launcher_args) + list(program_argv), env


def _mpirun_argv(cfg, launcher, np, placement, mca, variables):
    """Open MPI's mpirun: ranks, hosts, placement, MCA parameters, the variables to export (-x)."""
    argv = [launcher, "-np", str(np)]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if cfg.oversubscribe:
        # binding cores that ranks must share only slows them down
        argv += ["--oversubscribe", "--bind-to", "none"]
    if cfg.hostfile:
        argv += ["--hostfile", cfg.hostfile]
    elif not cfg.implicit_hosts:   # a configured localhost:4 still gets --host
        argv += ["--host", ",".join(f"{h.name}:{h.slots}" for h in cfg.hosts)]
    if placement:   # rank r on hosts_order[r]: a rankfile
        argv += placement
    elif cfg.ranks_per_node:
        argv += ["--map-by", f"ppr:{cfg.ranks_per_node}:node"]
    argv += _mca_options(mca)
    for name in sorted(variables):
        argv += ["-x", name]
    return argv


def _hydra_argv(cfg, launcher, np, placement, variables):
    """MPICH Hydra: ranks, hosts or a machinefile, per-node count, the variables (-genv)."""
    argv = [launcher, "-np", str(np)]
    if placement:   # rank r on hosts_order[r]: a machinefile
        argv += placement
    elif not cfg.implicit_hosts:
        argv += ["-hosts", ",".join(f"{h.name}:{h.slots}" for h in cfg.hosts)]
    if cfg.ranks_per_node and not placement:
        argv += ["-ppn", str(cfg.ranks_per_node)]
    for name in sorted(variables):
        argv += ["-genv", name, str(variables[name])]
    return argv


def _srun_argv(cfg, launcher, np, placement):
    """Slurm's srun: tasks, the slurm section's options, placement; the environment goes whole."""
    argv = [launcher, "-n", str(np)] + slurm.srun_options(cfg, np)
    if cfg.ranks_per_node and not placement:
        argv += ["--ntasks-per-node", str(cfg.ranks_per_node)]
    if placement:   # rank r on hosts_order[r]: SLURM_HOSTFILE, --distribution=arbitrary
        argv += placement
    elif cfg.hosts and not cfg.implicit_hosts:
        argv += ["--nodelist", ",".join(cfg.placement())]
    return argv + ["--export=ALL"]
