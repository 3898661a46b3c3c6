"""The config's `hosts_order` applied at launch: rank r runs on hosts_order[r].

Each launcher takes a rank order in its own form (docs/TOPO.md, "Launch files"; topo.md §3):

| launcher            | form                                                               |
|---------------------|--------------------------------------------------------------------|
| Open MPI `mpirun`   | a rankfile, `--rankfile FILE`: `rank r=host slot=k`                |
| MPICH Hydra         | a machinefile, `-f FILE`: `host:n` per run of ranks on one host    |
| Slurm `srun`        | `SLURM_HOSTFILE=FILE` and `--distribution=arbitrary`: a host per task |

A host may appear several times: its k-th entry is its slot k. An Open MPI rankfile binds each
rank to the cores it names, `--bind-to none` cannot undo that, and a core number the host does
not have makes mpirun fail (silently, exit 1). So a rank is bound to core k only when the
config asks for binding (`--bind-to core`, `hwthread`, ... in launcher_args, without
`oversubscribe`); otherwise every rank gets `slot=*:*`, all of its host's cores, as an unbound
launch would.

The files are written atomically into the cache directory (collbench.engines.build.cache_dir,
`rank-order/`), named by a hash of their content: concurrent jobs with the same order share
one file, with different orders never touch each other's, and nothing needs cleaning up after a
job (a file is a few bytes per rank).
"""

import hashlib
import os
import tempfile

from collbench.atomic_file import write_atomic
from collbench.errors import UserError


def check_ranks(cfg, np):
    """UserError unless the job's rank count is the order's length."""
    if cfg.hosts_order and np != len(cfg.hosts_order):
        raise UserError(f"{cfg.source}: hosts_order lists {len(cfg.hosts_order)} ranks, but the job "
                        f"runs {np} (give --np {len(cfg.hosts_order)}, or change hosts_order)")


def binds(cfg):
    """True when the config asks mpirun to bind ranks (`--bind-to X`, X not none) and does not
    oversubscribe: then rank k of a host is bound to its core k."""
    if cfg.oversubscribe:
        return False
    args = list(cfg.launcher_args)
    policy = None
    for i, a in enumerate(args):
        if a in ("--bind-to", "-bind-to") and i + 1 < len(args):
            policy = args[i + 1]
        elif a.startswith(("--bind-to=", "-bind-to=")):
            policy = a.split("=", 1)[1]
    return policy is not None and policy.split(":")[0] != "none"


def slots(hosts_order):
    """The slot of each rank on its host: the number of earlier entries of the same host."""
    seen = {}
    out = []
    for h in hosts_order:
        out.append(seen.get(h, 0))
        seen[h] = out[-1] + 1
    return out


def rankfile_text(hosts_order, bind=True):
    """Open MPI rankfile: `rank r=host slot=k` (k-th entry of the host), or slot=*:* unbound."""
    lines = ["# collbench hosts_order: rank r runs on entry r"]
    for r, (host, k) in enumerate(zip(hosts_order, slots(hosts_order))):
        lines.append(f"rank {r}={host} slot={k if bind else '*:*'}")
    return "\n".join(lines) + "\n"


def machinefile_text(hosts_order):
    """MPICH Hydra machinefile: `host:n` for each run of n consecutive ranks on one host."""
    from collbench.topo.order_files import machinefile_text as text
    return text(list(hosts_order))


def slurm_hostfile_text(hosts_order):
    """SLURM_HOSTFILE for --distribution=arbitrary: the host of each task, one per line."""
    from collbench.topo.order_files import slurm_hostfile_text as text
    return text(list(hosts_order))


def _directory():
    from collbench.engines.build import cache_dir
    for d in (os.path.join(str(cache_dir()), "rank-order"),
              os.path.join(tempfile.gettempdir(), f"collbench-rank-order-{os.geteuid()}")):
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            if os.access(d, os.W_OK | os.X_OK):
                return d
        except OSError:
            continue
    raise UserError("hosts_order: no writable directory for the launch file (set COLLBENCH_CACHE_DIR)")


def write_order_file(text, suffix):
    """The file holding text (written once, atomically; named by its content). Its path."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]
    path = os.path.join(_directory(), f"{digest}.{suffix}")
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return path
    except (OSError, UnicodeDecodeError):
        pass
    try:
        return write_atomic(path, [text])
    except OSError as e:
        raise UserError(f"hosts_order: cannot write {path}: {e.strerror}") from None


def openmpi_options(cfg, np):
    """mpirun's options placing the ranks in hosts_order (a rankfile)."""
    check_ranks(cfg, np)
    return ["--rankfile", write_order_file(rankfile_text(cfg.hosts_order, binds(cfg)), "rankfile")]


def hydra_options(cfg, np):
    """MPICH Hydra's options placing the ranks in hosts_order (a machinefile)."""
    check_ranks(cfg, np)
    return ["-f", write_order_file(machinefile_text(cfg.hosts_order), "machinefile")]


def srun_settings(cfg, np):
    """(srun options, environment) placing the tasks in hosts_order (SLURM_HOSTFILE)."""
    check_ranks(cfg, np)
    path = write_order_file(slurm_hostfile_text(cfg.hosts_order), "slurm_hostfile")
    return ["--distribution=arbitrary"], {"SLURM_HOSTFILE": path}
