"""The config's MPI: the launcher that starts its jobs, which MPI that is (Open MPI or MPICH), its
version, and the tools installed beside it.

Open MPI and MPICH (Debian installs both: `mpirun` is Open MPI's orterun, `mpirun.mpich` is
MPICH's Hydra) differ in everything a launch needs: Hydra takes `-genv NAME VALUE` where mpirun
takes `-x NAME`, knows no `--mca`, `--oversubscribe` or `--allow-run-as-root`, and reads
`-hosts a:2,b:2` rather than Open MPI's hostfile syntax (engines/launcher.py writes each). The
flavour is read from the launcher's name (mpirun.mpich, mpiexec.hydra) or, failing that, from
its `--version` text; that text is asked once per launcher and process (version_output), and
mpi_of(cfg) is everything the launch, the algorithm catalogue and the records need from it.
"""

import os
import re
import shutil
import subprocess
from functools import lru_cache
from typing import NamedTuple

from collbench.errors import UserError

OPENMPI = "openmpi"
MPICH = "mpich"
UNKNOWN = "unknown"     # launched with Open MPI's syntax, as before flavours existed

_SUFFIXED = re.compile(r"^(?:mpirun|mpiexec)\.([A-Za-z0-9_-]+)$")


class MpiInstall(NamedTuple):
    """The config's MPI, as the launch, the algorithm catalogue and the records see it."""
    launcher: str    # absolute path of what starts a job: mpirun, mpirun.mpich, srun
    mpirun: str      # the MPI's own launcher (under srun: the mpirun on PATH); its tools sit beside it
    flavour: str     # OPENMPI, MPICH or UNKNOWN: the MPI of `mpirun`
    version: str     # what records call it: 'mpirun (Open MPI) 4.1.4', 'MPICH 4.0.2 (Hydra)', 'unknown'


NO_LAUNCHER = "none"   # launcher: none: one process started as it is, no MPI launcher


def resolve_launcher(cfg):
    """Absolute path of mpirun/srun, or a UserError saying how to get it (NO_LAUNCHER for
    launcher: none)."""
    if cfg.launcher == NO_LAUNCHER:
        return NO_LAUNCHER
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


def mpi_of(cfg):
    """The config's MPI (UserError when its launcher cannot be found). Under srun the MPI is the
    one the engine is built with: the mpirun on PATH."""
    launcher = resolve_launcher(cfg)
    return _install(launcher, cfg.launcher == "srun")


@lru_cache(maxsize=16)
def _install(launcher, under_srun):
    if launcher == NO_LAUNCHER:
        return MpiInstall(NO_LAUNCHER, NO_LAUNCHER, UNKNOWN, NO_LAUNCHER)
    mpirun = (shutil.which("mpirun") or launcher) if under_srun else launcher
    return MpiInstall(launcher, mpirun, flavour(mpirun), version_line(mpirun))


def version_line(launcher_path):
    """The MPI of a launcher as records name it: the first line of its --version ('mpirun (Open
    MPI) 4.1.4'), MPICH's version for Hydra (whose first line is 'HYDRA build details:'), or
    'unknown' when it cannot say."""
    lines = [ln.strip() for ln in version_output(shutil.which(launcher_path) or launcher_path).splitlines()
             if ln.strip()]
    if not lines:
        return "unknown"
    return describe(launcher_path) if lines[0].startswith("HYDRA") else lines[0]


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
