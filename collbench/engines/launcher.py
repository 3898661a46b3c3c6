"""Build the mpirun / srun command line and environment from the config.

Transport presets are one table: the MCA parameters and UCX variables each preset sets. With
mpirun they become `--mca k v` and `-x VAR`; with srun, OMPI_MCA_k variables in the environment.
"""

import os
import shutil
import subprocess
from functools import lru_cache

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


@lru_cache(maxsize=8)
def mpi_version(launcher_path):
    """First line of `mpirun --version` (e.g. 'mpirun (Open MPI) 4.1.4'), or 'unknown'."""
    if launcher_path == "none":
        return "none"
    if os.path.basename(launcher_path) == "srun":   # srun is Slurm's: ask the MPI the engine is built with
        launcher_path = shutil.which("mpirun") or launcher_path
    try:
        out = subprocess.run([launcher_path, "--version"], capture_output=True, text=True, timeout=20)
        line = (out.stdout or out.stderr).strip().splitlines()
        if line and line[0].startswith("HYDRA"):   # MPICH's launcher: "HYDRA build details:"
            from collbench.engines.mpi_flavour import describe
            return describe(launcher_path)
        return line[0].strip() if line else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def resolve_launcher(cfg):
    """Absolute path of mpirun/srun, or a UserError saying how to get it ("none" for launcher: none)."""
    if cfg.launcher == "none":
        return "none"
    name = cfg.launcher_path or cfg.launcher
    path = shutil.which(name)
    if path is None and cfg.launcher_path:
        # the advice differs: the configured path is what is wrong, not the PATH
        where = f"launcher_path {name!r} in {cfg.source}"
        if os.sep not in name:
            raise UserError(f"{where}: not found on PATH (give the full path of {cfg.launcher}, "
                            f"or remove launcher_path to use the {cfg.launcher} on PATH)")
        problem = ("is a directory" if os.path.isdir(name) else "is not executable" if os.path.exists(name)
                   else "does not exist")
        raise UserError(f"{where}: {problem} (set it to the full path of an executable {cfg.launcher}, "
                        f"or remove launcher_path to use the {cfg.launcher} on PATH)")
    if path is None:
        raise UserError(f"launcher {name!r} not found on PATH (install openmpi-bin, or set "
                        f"launcher_path in the config)")
    return path


def transport_env(cfg):
    """The environment the ranks need: preset variables, overridden by the config's env."""
    env = dict(TRANSPORT_PRESETS[cfg.transport]["env"])
    env.update(cfg.env)
    return env


def build_command(cfg, program_argv, ranks=None, algorithms=None):
    """(argv, env) to launch program_argv on cfg.ranks ranks over cfg.hosts.

    env is the full environment for subprocess (os.environ plus the transport's variables).
    algorithms: {op: algorithm name} forced for this job (engines/algorithms.py translates them
    per MPI flavour). An MPICH launcher (mpirun.mpich, Hydra) gets Hydra's command line.
    """
    launcher = resolve_launcher(cfg)
    np = ranks or cfg.ranks
    if cfg.launcher == "none":   # one process on this machine, started as it is (a GPU box without MPI)
        if np != 1 or not cfg.implicit_hosts:
            raise UserError(f"launcher: none starts one process on this machine; the config asks for "
                            f"{np} ranks{'' if cfg.implicit_hosts else ' on hosts'} (use mpirun or srun)")
        env = dict(os.environ)
        env.update(transport_env(cfg))
        return list(program_argv), env
    from collbench.engines import algorithms as algs, mpi_flavour
    forced = algs.launch_settings(cfg, algorithms)
    extra_env = transport_env(cfg)
    extra_env.update(forced.env)
    env = dict(os.environ)
    env.update(extra_env)
    mca = tuple(TRANSPORT_PRESETS[cfg.transport]["mca"]) + tuple(forced.mca)
    if cfg.launcher != "srun" and mpi_flavour.flavour(launcher) == mpi_flavour.MPICH:
        return mpi_flavour.hydra_command(cfg, launcher, np, extra_env, program_argv), env
    if cfg.launcher == "srun":
        from collbench import slurm
        argv = [launcher, "-n", str(np)] + slurm.srun_options(cfg, np)
        if cfg.ranks_per_node and not cfg.hosts_order:
            argv += ["--ntasks-per-node", str(cfg.ranks_per_node)]
        if cfg.hosts_order:   # rank r on hosts_order[r]: SLURM_HOSTFILE, --distribution=arbitrary
            from collbench.engines import rank_order
            options, order_env = rank_order.srun_settings(cfg, np)
            argv += options
            env.update(order_env)
        elif cfg.hosts and not _is_local(cfg):
            argv += ["--nodelist", ",".join(cfg.placement())]
        for k, v in mca:
            env[f"OMPI_MCA_{k}"] = v
        argv += ["--export=ALL"]
        argv += list(cfg.launcher_args)
        return argv + list(program_argv), env

    argv = [launcher, "-np", str(np)]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if cfg.oversubscribe:
        # binding cores that ranks must share only slows them down
        argv += ["--oversubscribe", "--bind-to", "none"]
    if cfg.hostfile:
        argv += ["--hostfile", cfg.hostfile]
    elif not _is_local(cfg):
        argv += ["--host", ",".join(f"{h.name}:{h.slots}" for h in cfg.hosts)]
    if cfg.hosts_order:   # rank r on hosts_order[r]: a rankfile
        from collbench.engines import rank_order
        argv += rank_order.openmpi_options(cfg, np)
    elif cfg.ranks_per_node:
        argv += ["--map-by", f"ppr:{cfg.ranks_per_node}:node"]
    for k, v in mca:
        argv += ["--mca", k, v]
    for name in sorted(extra_env):
        argv += ["-x", name]
    argv += list(cfg.launcher_args)
    return argv + list(program_argv), env


def _is_local(cfg):
    """No hosts configured: plain -np on this machine (a configured localhost:4 still gets --host)."""
    return cfg.implicit_hosts
