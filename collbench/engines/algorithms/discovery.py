"""The algorithms one MPI install offers, per op: asked of the MPI at run time and cached.

* Open MPI: coll/tuned's enumerators of `coll_tuned_<op>_algorithm`, read from `ompi_info --param
  coll all --level 9 --parsable` (lines `mca:coll:tuned:param:coll_tuned_allgather_algorithm:
  enumerator:value:4:ring`; id 0 "ignore" is the library's own choice), and the priorities of
  the components that would take a call before tuned does (OUTRANKING_CANDIDATES).
* MPICH: the values of `MPIR_CVAR_<OP>_INTRA_ALGORITHM`, read from `mpivars` (MPICH's own CVAR
  lister), else MPICH_4_0_DOCUMENTED below; each value is checked by MPICH itself (MPI_Init
  refuses an unknown one).

The list is cached per MPI install (in this process, and in the engine cache directory keyed by
the lister's path, size and mtime), so a CLI start does not re-run ompi_info.
"""

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass, field

from collbench.atomic_file import write_atomic
from collbench.engines import mpi_flavour
from collbench.engines.build import cache_dir
from collbench.errors import UserError
from collbench.ops import OPS, get_op

DEFAULT = "default"     # the library's own choice: nothing forced
RULES = "rules"         # the library's choice with a tuning (rules) file loaded

# Components that, when ompi_info lists them above tuned's priority, take intra-communicator
# collectives before tuned does (han and adapt in 5.x; acoll, xhc, hcoll, ucc where installed).
OUTRANKING_CANDIDATES = ("han", "adapt", "acoll", "xhc", "hcoll", "ucc")

# MPICH's CVAR infix per op (MPIR_CVAR_<INFIX>_INTRA_ALGORITHM).
MPICH_INFIX = {name: name.upper() for name in OPS}

# Fallback when mpivars is missing: the blocking intra-communicator algorithms of MPICH 4.0.x,
# as documented in MPICH 4.0's src/mpi/coll/cvars.txt (the MPIR_CVAR_<OP>_INTRA_ALGORITHM
# descriptions) and printed by Debian's MPICH 4.0.2 `mpivars`. Verified at run time: MPICH
# refuses an unknown value in MPI_Init.
MPICH_4_0_DOCUMENTED = {
    "allgather": ("brucks", "nb", "recursive_doubling", "ring"),
    "allreduce": ("nb", "smp", "recursive_doubling", "reduce_scatter_allgather"),
    "alltoall": ("brucks", "nb", "pairwise", "pairwise_sendrecv_replace", "scattered"),
    "bcast": ("binomial", "nb", "smp", "scatter_recursive_doubling_allgather", "scatter_ring_allgather"),
    "reduce": ("binomial", "nb", "smp", "reduce_scatter_gather"),
    "reduce_scatter": ("nb", "noncommutative", "pairwise", "recursive_doubling", "recursive_halving"),
    "barrier": ("nb", "smp", "dissemination"),
}
MPICH_DOCUMENTED_SOURCE = "MPICH 4.0.x documented list (src/mpi/coll/cvars.txt)"

# MPICH's refusal of an unknown CVAR value, in MPI_Init's error
MPICH_BAD_VALUE = re.compile(r"Invalid (MPIR_CVAR_\w+) value \(([^)]*)\)")

LISTER_TIMEOUT = 60
CACHE_VERSION = 1


@dataclass(frozen=True)
class Algorithm:
    name: str
    value: str      # what forces it: Open MPI's id ("4"), MPICH's CVAR value ("ring")


@dataclass
class Catalogue:
    """The algorithms one MPI install offers, per op of collbench's op table."""
    flavour: str
    version: str
    source: str                                   # where the list came from
    algorithms: dict = field(default_factory=dict)  # op -> tuple of Algorithm
    outranking: tuple = ()                         # coll components excluded when forcing (Open MPI)

    def names(self, op):
        return [a.name for a in self.algorithms.get(get_op(op).name, ())]

    def find(self, op, name):
        """The Algorithm for a name (case, '-' for '_' and Open MPI's numeric id accepted);
        None for the default; UserError (exit 2) listing the available ones otherwise."""
        op = get_op(op).name
        if is_default(name):
            return None
        wanted = canonical(name)
        for a in self.algorithms.get(op, ()):
            if canonical(a.name) == wanted or (self.flavour == mpi_flavour.OPENMPI and a.value == wanted):
                return a
        raise UserError(f"no algorithm {str(name)[:64]!r} for {op} in {self.version} (listed by {self.source}); "
                        f"available: {', '.join([DEFAULT] + self.names(op))}")

    def to_json(self):
        return {"flavour": self.flavour, "version": self.version, "source": self.source,
                "algorithms": {op: [[a.name, a.value] for a in algs] for op, algs in self.algorithms.items()},
                "outranking": list(self.outranking)}

    @classmethod
    def from_json(cls, data):
        """A Catalogue from a cache file's JSON, or None when anything in it is not as written."""
        try:
            algs = {}
            for op, items in data["algorithms"].items():
                if op not in OPS or not isinstance(items, list):
                    return None
                pairs = []
                for item in items:
                    if (not isinstance(item, list) or len(item) != 2
                            or not all(isinstance(x, str) and 0 < len(x) <= 128 for x in item)):
                        return None
                    pairs.append(Algorithm(item[0], item[1]))
                algs[op] = tuple(pairs)
            out = data["outranking"]
            if not (isinstance(out, list) and all(isinstance(x, str) and x in OUTRANKING_CANDIDATES for x in out)):
                return None
            fields = [data[k] for k in ("flavour", "version", "source")]
            if not all(isinstance(x, str) and len(x) <= 512 for x in fields):
                return None
            if data["flavour"] not in (mpi_flavour.OPENMPI, mpi_flavour.MPICH):
                return None
            return cls(data["flavour"], data["version"], data["source"], algs, tuple(out))
        except (KeyError, TypeError, AttributeError):
            return None


def is_default(name):
    return name is None or (isinstance(name, str) and canonical(name) in ("", DEFAULT))


def canonical(name):
    return str(name).strip().lower().replace("-", "_")


# ---------------------------------------------------------------- Open MPI: ompi_info

_TUNED_ENUM = re.compile(r"^mca:coll:tuned:param:coll_tuned_(\w+?)_algorithm:enumerator:value:(-?\d+):(.+)$")
_PRIORITY = re.compile(r"^mca:coll:(\w+):param:coll_(\w+)_priority:value:(-?\d+)\s*$")


def parse_ompi_info(text):
    """(algorithms {op: (Algorithm, ...)}, priorities {component: int}) from ompi_info --parsable."""
    algorithms, priorities = {}, {}
    for line in text.splitlines():
        line = line.strip()
        m = _TUNED_ENUM.match(line)
        if m:
            op, ident, name = m.group(1), m.group(2), m.group(3).strip()
            if op in OPS and ident != "0":    # 0 is "ignore": the library's own choice
                algorithms.setdefault(op, []).append(Algorithm(name, ident))
            continue
        m = _PRIORITY.match(line)
        if m and m.group(1) == m.group(2):
            priorities[m.group(1)] = int(m.group(3))
    return {op: tuple(a) for op, a in algorithms.items()}, priorities


def outranking_components(priorities):
    """The components that take intra-communicator collectives before tuned (higher priority)."""
    tuned = priorities.get("tuned")
    if tuned is None:
        return ()
    return tuple(c for c in OUTRANKING_CANDIDATES if priorities.get(c, -1) > tuned)


# ---------------------------------------------------------------- MPICH: mpivars

_CVAR_LINE = re.compile(r"^\s*MPIR_CVAR_([A-Z_]+)_INTRA_ALGORITHM\s*=[^\t]*\t(?:[^\t]*\t){4}(.*)$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def mpich_names_from_description(desc):
    """The algorithm names in one MPIR_CVAR_..._INTRA_ALGORITHM description, or None.

    mpivars prints the description with its line breaks removed: "...algorithmauto - Internal
    ... FILE)brucks             - Force brucks algorithmnb                 - Force ...". Each name
    is padded so that its " - " lines up with the others: the width of the column is the first
    name's length (what follows the auto line's closing parenthesis) plus its padding, and every
    later name is that width minus its own padding.
    """
    parts = re.split(r"( +)- ", desc)
    segments, pads = parts[0::2], [len(p) for p in parts[1::2]]
    if len(segments) < 3 or not segments[0].endswith("auto"):
        return None
    if pads[0] > 1:                         # the auto line is aligned with the others
        width = len("auto") + pads[0]
    elif ")" in segments[1]:
        width = len(segments[1].rsplit(")", 1)[1]) + pads[1]
    else:
        return None
    names = []
    for seg, pad in zip(segments[1:-1], pads[1:]):
        n = width - pad
        if n <= 0 or n > len(seg):
            return None
        name = seg[-n:]
        if not _NAME.match(name):
            return None
        names.append(name)
    return names


def parse_mpivars(text):
    """{op: (Algorithm, ...)} from mpivars' output; ops whose description cannot be read are left out."""
    algorithms = {}
    by_infix = {v: k for k, v in MPICH_INFIX.items()}
    for line in text.splitlines():
        m = _CVAR_LINE.match(line)
        if not m or m.group(1) not in by_infix:
            continue
        names = mpich_names_from_description(m.group(2))
        if names:
            algorithms[by_infix[m.group(1)]] = tuple(Algorithm(n, n) for n in names)
    return algorithms


# ---------------------------------------------------------------- discovery and cache

_MEMORY = {}


def _run(argv):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=LISTER_TIMEOUT,
                         stdin=subprocess.DEVNULL, errors="replace")
    return out.returncode, out.stdout, out.stderr


def _lister_key(flavour, tool):
    st = os.stat(tool)
    return f"{CACHE_VERSION}|{flavour}|{os.path.realpath(tool)}|{st.st_size}|{st.st_mtime_ns}"


def _cache_file(key):
    return cache_dir() / f"algorithms-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _read_cache(key):
    try:
        data = json.loads(_cache_file(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("catalogue"), dict):
        return None
    return Catalogue.from_json(data["catalogue"])


def _write_cache(key, cat):
    try:
        path = _cache_file(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(str(path), [json.dumps({"key": key, "catalogue": cat.to_json()})])
    except OSError:
        pass   # a read-only cache only costs the lister's run next time


def catalogue(cfg, mpi=None):
    """The Catalogue of the config's MPI (mpi: its mpi_flavour.MpiInstall, when the caller holds
    it); UserError (exit 2) when it cannot be asked."""
    mpi = mpi or mpi_flavour.mpi_of(cfg)
    launcher, flavour = mpi.mpirun, mpi.flavour
    if flavour == mpi_flavour.OPENMPI:
        tool = mpi_flavour.sibling_tool(launcher, "ompi_info")
        if tool is None:
            raise UserError(f"ompi_info not found beside {launcher} or on PATH: it lists Open MPI's "
                            f"collective algorithms (install openmpi-bin)")
    elif flavour == mpi_flavour.MPICH:
        tool = mpi_flavour.sibling_tool(launcher, "mpivars")
    else:
        raise UserError(f"cannot tell which MPI {launcher} belongs to (its --version names neither "
                        f"Open MPI nor MPICH): collective algorithms cannot be listed or forced")
    key = _lister_key(flavour, tool) if tool else f"{CACHE_VERSION}|{flavour}|documented|{launcher}"
    if key in _MEMORY:
        return _MEMORY[key]
    cat = _read_cache(key) if tool else None
    if cat is None:
        cat = (_ask_ompi_info(launcher, tool) if flavour == mpi_flavour.OPENMPI
               else _ask_mpich(launcher, tool))
        if tool:
            _write_cache(key, cat)
    _MEMORY[key] = cat
    return cat


def _ask_ompi_info(launcher, tool):
    argv = [tool, "--param", "coll", "all", "--level", "9", "--parsable"]
    try:
        rc, out, err = _run(argv)
    except (OSError, subprocess.SubprocessError) as e:
        raise UserError(f"cannot run {' '.join(argv)}: {e}") from None
    algorithms, priorities = parse_ompi_info(out)
    if rc != 0 or not algorithms:
        detail = (err or out).strip().splitlines()[-1:] or ["no coll_tuned_<op>_algorithm enumerators"]
        raise UserError(f"{' '.join(argv)} listed no tuned collective algorithms (exit {rc}: {detail[0][:200]}); "
                        f"is the coll/tuned component installed?")
    return Catalogue(mpi_flavour.OPENMPI, mpi_flavour.describe(launcher), f"ompi_info ({tool})",
                     algorithms, outranking_components(priorities))


def _ask_mpich(launcher, tool):
    version = mpi_flavour.describe(launcher)
    algorithms = {}
    if tool:
        try:
            _, out, _ = _run([tool])
            algorithms = parse_mpivars(out)
        except (OSError, subprocess.SubprocessError):
            algorithms = {}
    if algorithms:
        source = f"mpivars ({tool})"
        # an op whose description could not be read keeps the documented list
        for op, names in MPICH_4_0_DOCUMENTED.items():
            algorithms.setdefault(op, tuple(Algorithm(n, n) for n in names))
    else:
        source = MPICH_DOCUMENTED_SOURCE
        algorithms = {op: tuple(Algorithm(n, n) for n in names) for op, names in MPICH_4_0_DOCUMENTED.items()}
    if tool:
        algorithms = {op: tuple(a for a in found if _mpich_accepts(tool, op, a.value))
                      for op, found in algorithms.items()}
        source += ", each value accepted by MPICH"
    return Catalogue(mpi_flavour.MPICH, version, source, algorithms, ())


def _mpich_accepts(tool, op, value):
    """MPICH's own check of a CVAR value: MPI_Init (of mpivars, an MPI program) refuses an unknown one."""
    env = dict(os.environ)
    env[f"MPIR_CVAR_{MPICH_INFIX[op]}_INTRA_ALGORITHM"] = value
    try:
        out = subprocess.run([tool, "-nodesc"], capture_output=True, text=True, timeout=LISTER_TIMEOUT,
                             stdin=subprocess.DEVNULL, env=env, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return True   # cannot ask: the job itself will say (failure_reason)
    return not MPICH_BAD_VALUE.search(out.stdout + out.stderr)
