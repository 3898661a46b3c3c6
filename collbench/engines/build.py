"""Locate or build the built-in engine with mpicc: collbench/engines/collbench_engine.c (ops, plan,
timing, validation) and the sources beside it (COMPANIONS: counter and per-peer readers, off-CPU reader), one
binary, sharing collbench_engine.h.

The binary is cached per (every source and header, MPI wrapper flags, compiler version):
upgrading the MPI or editing any source gives a new file, never a stale one. Builds go to a
temporary file in the cache directory and are renamed into place, so concurrent builders never
see or leave a half-written binary.
"""

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from collbench.engines.mpi_flavour import mpicc_for
from collbench.errors import UserError

ENGINE_DIR = Path(__file__).resolve().parent
SOURCE = ENGINE_DIR / "collbench_engine.c"
COMPANIONS = (ENGINE_DIR / "engine_counters.c", ENGINE_DIR / "engine_paths.c", ENGINE_DIR / "engine_offcpu.c")
HEADERS = (ENGINE_DIR / "collbench_engine.h",)
BINARY_PREFIX = "collbench-engine-"
CFLAGS = ("-O2", "-Wall", "-Wextra", "-std=c99")
COMPILE_TIMEOUT = 300


def cache_dir():
    """$COLLBENCH_CACHE_DIR, else $XDG_CACHE_HOME/collbench, else ~/.cache/collbench."""
    explicit = os.environ.get("COLLBENCH_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "collbench"


def find_mpicc(cfg=None):
    """The MPI C compiler wrapper, or a UserError saying how to get it: the config's `mpicc`, else
    the one beside a launcher_path naming its MPI (mpirun.mpich -> mpicc.mpich), else $MPICC,
    else mpicc on PATH."""
    name = (getattr(cfg, "mpicc", None) or (cfg is not None and cfg.launcher_path and mpicc_for(cfg.launcher_path))
            or os.environ.get("MPICC") or "mpicc")
    path = shutil.which(name)
    if path is None:
        raise UserError(f"MPI C compiler {name!r} not found on PATH: install libopenmpi-dev "
                        f"(Debian/Ubuntu) or your MPI's development package, set MPICC, "
                        f"or set engine_path in the config to a prebuilt collbench-engine")
    return path


def _tool_output(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        return f"{out.returncode}\n{out.stdout}\n{out.stderr}"
    except (OSError, subprocess.SubprocessError) as e:
        return f"error: {e}"


def toolchain_fingerprint(mpicc):
    """What the binary depends on besides the source: the wrapper's flags and the compiler."""
    # --showme is Open MPI's; MPICH and Intel MPI spell it -show.
    showme = _tool_output([mpicc, "--showme"])
    if not showme.startswith("0\n"):
        showme = _tool_output([mpicc, "-show"])
    # Open MPI also names its own version (the library the binary links against)
    return showme + _tool_output([mpicc, "--showme:version"]) + _tool_output([mpicc, "--version"])


def engine_key(mpicc):
    h = hashlib.sha256()
    for path in (SOURCE, *COMPANIONS, *HEADERS):
        h.update(path.read_bytes() + b"\0")
    h.update(b"\0" + " ".join(CFLAGS).encode())
    h.update(b"\0" + toolchain_fingerprint(mpicc).encode())
    return h.hexdigest()[:16]


def cached_engine_path(mpicc=None):
    """Where ensure_engine keeps the binary for this source and MPI (it may not exist yet)."""
    return cache_dir() / (BINARY_PREFIX + engine_key(mpicc or find_mpicc()))


def check_prebuilt(path):
    p = Path(path)
    if not p.is_file():
        raise UserError(f"engine_path {path}: no such file (expected a collbench-engine binary; "
                        f"unset engine_path to build one with mpicc)")
    if not os.access(p, os.X_OK):
        raise UserError(f"engine_path {path}: not executable (chmod +x it)")
    return str(p)


def ensure_engine(cfg=None, force=False):
    """Path of a working engine binary: cfg.engine_path if set, else the cached build (built now if missing)."""
    if cfg is not None and getattr(cfg, "engine_path", None):
        return check_prebuilt(cfg.engine_path)
    mpicc = find_mpicc(cfg)
    target = cached_engine_path(mpicc)
    if target.is_file() and os.access(target, os.X_OK) and not force:
        return str(target)
    return build(mpicc, target)


def build(mpicc, target):
    """Compile SOURCE and COMPANIONS to target atomically; UserError with the compiler's stderr on
    failure."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the engine cache directory {target.parent}: {e} "
                        f"(set COLLBENCH_CACHE_DIR to a writable directory)") from None
    fd, tmp = tempfile.mkstemp(prefix=".build-", dir=str(target.parent))
    os.close(fd)
    try:
        argv = [mpicc, *CFLAGS, "-I", str(ENGINE_DIR), "-o", tmp, str(SOURCE), *map(str, COMPANIONS)]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=COMPILE_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise UserError(f"compiling the engine timed out after {COMPILE_TIMEOUT}s: {' '.join(argv)}") from None
        except OSError as e:
            raise UserError(f"cannot run {mpicc}: {e}") from None
        if out.returncode != 0:
            detail = (out.stderr or out.stdout).strip()
            raise UserError(f"compiling the engine failed ({' '.join(argv)}), exit code "
                            f"{out.returncode}:\n{detail}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)  # atomic: a concurrent builder's rename wins whole
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return str(target)
