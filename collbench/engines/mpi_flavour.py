"""Which MPI a launcher belongs to (Open MPI or MPICH), the tools installed beside it, and MPICH's
Hydra command line.

Open MPI and MPICH (Debian installs both: `mpirun` is Open MPI's orterun, `mpirun.mpich` is
MPICH's Hydra) differ in everything a launch needs: Hydra takes `-genv NAME VALUE` where mpirun
takes `-x NAME`, knows no `--mca`, `--oversubscribe` or `--allow-run-as-root`, and reads
`-hosts a:2,b:2` rather than Open MPI's hostfile syntax. The flavour is read from the launcher's
name (mpirun.mpich, mpiexec.hydra) or, failing that, from its `--version` text.
"""

import os
import re
import shutil
import subprocess
from functools import lru_cache

OPENMPI = "openmpi"
MPICH = "mpich"
UNKNOWN = "unknown"     # launched with Open MPI's syntax, as before flavours existed

_SUFFIXED = re.compile(r"^(?:mpirun|mpiexec)\.([A-Za-z0-9_-]+)$")


@lru_cache(maxsize=16)
def version_output(path):
    """The full text of `path --version` (stdout then stderr), or "" when it cannot run."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL)
        return (out.stdout or "") + (out.stderr or "")
    except (OSError, subprocess.SubprocessError):
        return ""


def flavour(launcher_path):
    """OPENMPI, MPICH or UNKNOWN for a launcher (a path or a name on PATH)."""
    if not launcher_path:
        return UNKNOWN
    names = {os.path.basename(launcher_path).lower()}
    full = shutil.which(launcher_path) or launcher_path
    names.add(os.path.basename(os.path.realpath(full)).lower())
    if any("mpich" in n or "hydra" in n for n in names):
        return MPICH
    text = version_output(full)
    if "HYDRA" in text or "MPICH" in text:
        return MPICH
    if "Open MPI" in text or "OpenRTE" in text:
        return OPENMPI
    return UNKNOWN


def describe(launcher_path):
    """'Open MPI 4.1.4', 'MPICH 4.0.2 (Hydra)', or the first line of --version ('unknown')."""
    full = shutil.which(launcher_path) or launcher_path
    text = version_output(full)
    m = re.search(r"\(Open MPI\)\s+(\S+)", text)
    if m:
        return f"Open MPI {m.group(1)}"
    m = re.search(r"^\s*Version:\s*(\S+)", text, re.M)
    if flavour(launcher_path) == MPICH and m:
        return f"MPICH {m.group(1)} (Hydra)"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else "unknown"


def sibling_tool(launcher_path, name):
    """The tool `name` installed beside the launcher (its directory, then its real file's
    directory), else on PATH; None if nowhere. Beside first: two MPIs share /usr/bin, and the
    tool on PATH may belong to the other one."""
    full = shutil.which(launcher_path) or launcher_path
    for directory in dict.fromkeys((os.path.dirname(full), os.path.dirname(os.path.realpath(full)))):
        candidate = os.path.join(directory, name)
        if directory and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)


def mpicc_for(launcher_path):
    """The C compiler wrapper of the launcher's MPI when its name says which (mpirun.mpich ->
    mpicc.mpich beside it), else None (the caller's default applies)."""
    if not launcher_path:
        return None
    m = _SUFFIXED.match(os.path.basename(launcher_path))
    suffix = m.group(1) if m else None
    if suffix == "hydra" or (suffix is None and flavour(launcher_path) == MPICH):
        suffix = "mpich"
    if suffix is None:
        return None
    full = shutil.which(launcher_path) or launcher_path
    candidate = os.path.join(os.path.dirname(full), f"mpicc.{suffix}")
    return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None


def hydra_command(cfg, launcher, np, extra_env, program_argv):
    """MPICH Hydra's argv: ranks, hosts, per-node count, the variables the ranks need (-genv)."""
    argv = [launcher, "-np", str(np)]
    if getattr(cfg, "hosts_order", None):   # rank r on hosts_order[r]: a machinefile
        from collbench.engines import rank_order
        argv += rank_order.hydra_options(cfg, np)
    elif not cfg.implicit_hosts:
        argv += ["-hosts", ",".join(f"{h.name}:{h.slots}" for h in cfg.hosts)]
    if cfg.ranks_per_node and not getattr(cfg, "hosts_order", None):
        argv += ["-ppn", str(cfg.ranks_per_node)]
    for name in sorted(extra_env):
        argv += ["-genv", name, str(extra_env[name])]
    argv += list(cfg.launcher_args)
    return argv + list(program_argv)
