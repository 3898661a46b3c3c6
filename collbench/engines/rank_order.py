"""A rank order in each launcher's own form: the one writer of rankfiles, machinefiles, hostfiles
and SLURM_HOSTFILEs (the config's `hosts_order` at launch here; `topo map`'s files through
topo/order_files.py).

| launcher            | form                                                               |
|---------------------|--------------------------------------------------------------------|
| Open MPI `mpirun`   | a rankfile, `--rankfile FILE`: `rank r=host slot=k`                |
| Open MPI, seq mapper| a hostfile, one line per rank (`--mca rmaps seq`)                  |
| MPICH Hydra         | a machinefile, `-f FILE`: `host:n` per run of ranks on one host    |
| Slurm `srun`        | `SLURM_HOSTFILE=FILE` and `--distribution=arbitrary`: a host per task |

At launch (docs/TOPO.md, "Launch files"; topo.md §3) a host may appear several times in
hosts_order: its k-th entry is its slot k. An Open MPI rankfile binds each rank to the cores it
names, `--bind-to none` cannot undo that, and a core number the host does not have makes mpirun
fail (silently, exit 1). So a rank is bound to core k only when the config asks for binding
(`--bind-to core`, `hwthread`, ... in launcher_args, without `oversubscribe`); otherwise every
rank gets `slot=*:*`, all of its host's cores, as an unbound launch would.

Launch files are written atomically into the cache directory (collbench.engines.build.cache_dir,
`rank-order/`), named by a hash of their content: concurrent jobs with the same order share
one file, with different orders never touch each other's, and nothing needs cleaning up after a
job (a file is a few bytes per rank).
"""

import hashlib
import os
import tempfile

from collbench.atomic_file import write_atomic
from collbench.engines.build import cache_dir
from collbench.errors import UserError

# the launch forms placement() writes, by the launcher syntax that reads them
RANKFILE, MACHINEFILE, SLURM_HOSTFILE = "rankfile", "machinefile", "slurm_hostfile"
ANY_CORE = "*:*"   # a rankfile slot: every core of the host (an unbound rank)


# ---------------------------------------------------------------- the texts

def _head(comment):
    return [f"# {comment}"] if comment else []


def rankfile_text(hosts, slots, comment=None):
    """Open MPI rankfile: `rank r=hosts[r] slot=slots[r]` (a core number, or ANY_CORE)."""
    lines = _head(comment) + [f"rank {r}={host} slot={slot}" for r, (host, slot) in enumerate(zip(hosts, slots))]
    return "\n".join(lines) + "\n"


def hostfile_text(hosts, comment=None):
    """Open MPI hostfile for the sequential mapper: one line per rank, in rank order."""
    return "\n".join(_head(comment) + list(hosts)) + "\n"


def machinefile_text(hosts, comment=None):
    """MPICH Hydra machinefile: `host:k` places k consecutive ranks; runs of one host merged."""
    lines = _head(comment)
    hosts = list(hosts)
    i = 0
    while i < len(hosts):
        j = i
        while j < len(hosts) and hosts[j] == hosts[i]:
            j += 1
        lines.append(f"{hosts[i]}:{j - i}")
        i = j
    return "\n".join(lines) + "\n"


def slurm_hostfile_text(hosts):
    """SLURM_HOSTFILE for --distribution=arbitrary: one host per task, in task order (no comments:
    Slurm reads every line as a host)."""
    return "\n".join(hosts) + "\n"


# ---------------------------------------------------------------- hosts_order at launch

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


def _directory():
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


def placement(cfg, np, form):
    """(launcher options, environment) placing rank r on hosts_order[r] in the given form
    (RANKFILE for mpirun, MACHINEFILE for Hydra, SLURM_HOSTFILE for srun); ([], {}) without one."""
    if not cfg.hosts_order:
        return [], {}
    check_ranks(cfg, np)
    order = list(cfg.hosts_order)
    if form == RANKFILE:
        cores = slots(order) if binds(cfg) else [ANY_CORE] * len(order)
        text = rankfile_text(order, cores, "collbench hosts_order: rank r runs on entry r")
        return ["--rankfile", write_order_file(text, RANKFILE)], {}
    if form == MACHINEFILE:
        return ["-f", write_order_file(machinefile_text(order), MACHINEFILE)], {}
    if form == SLURM_HOSTFILE:
        path = write_order_file(slurm_hostfile_text(order), SLURM_HOSTFILE)
        return ["--distribution=arbitrary"], {"SLURM_HOSTFILE": path}
    raise ValueError(f"unknown launch form {form!r}")
