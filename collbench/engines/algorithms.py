"""The MPI library's own collective algorithms: which the installed MPI offers, and how to force one.

The list comes from the MPI at run time, never from a table here (names and ids differ between
releases):

* Open MPI: coll/tuned's enumerators of `coll_tuned_<op>_algorithm`, read from `ompi_info --param
  coll all --level 9 --parsable` (lines `mca:coll:tuned:param:coll_tuned_allgather_algorithm:
  enumerator:value:4:ring`; id 0 "ignore" is the library's own choice). Forced per job with
  `--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_<op>_algorithm <id>`; a component that
  outranks tuned for intra-communicators (han in Open MPI 5.x, priority 35 against tuned's 30)
  would take the call before tuned sees it, so it is excluded (`--mca coll ^han`) when
  ompi_info shows it with the higher priority.
* MPICH: the values of `MPIR_CVAR_<OP>_INTRA_ALGORITHM`, read from `mpivars` (MPICH's own CVAR
  lister), else MPICH_4_0_DOCUMENTED below. Forced per job with the environment
  `MPIR_CVAR_<OP>_INTRA_ALGORITHM=<name>`, plus `MPIR_CVAR_DEVICE_COLLECTIVES=none` (the ch4
  device may otherwise pick its own algorithm over the MPIR-level one) and
  `MPIR_CVAR_COLLECTIVE_FALLBACK=error` (an algorithm that cannot serve the call fails the job
  instead of silently running another one under the forced name). An unknown value makes MPI_Init
  fail ("Invalid MPIR_CVAR_... value (x)"): every name is verified by the run itself.

Forcing applies to a whole MPI job, per op: one job can force allgather and allreduce at once,
never two algorithms of one op (job_algorithms, same_job_prefix).

The list is cached per MPI install (in this process, and in the engine cache directory keyed by
the lister's path, size and mtime), so a CLI start does not re-run ompi_info.
"""

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass, field

from collbench.engines import mpi_flavour
from collbench.errors import UserError
from collbench.ops import DATATYPES, OPS, get_op

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


def mpi_launcher(cfg):
    """The mpirun/mpiexec of the config's MPI (under srun: the mpirun on PATH, as mpi_version does)."""
    import shutil
    if cfg.launcher == "srun":
        return shutil.which("mpirun") or "mpirun"
    from collbench.engines.launcher import resolve_launcher
    return resolve_launcher(cfg)


def _lister_key(flavour, tool):
    st = os.stat(tool)
    return f"{CACHE_VERSION}|{flavour}|{os.path.realpath(tool)}|{st.st_size}|{st.st_mtime_ns}"


def _cache_file(key):
    from collbench.engines.build import cache_dir
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
    from collbench.atomic_file import write_atomic
    try:
        path = _cache_file(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(str(path), [json.dumps({"key": key, "catalogue": cat.to_json()})])
    except OSError:
        pass   # a read-only cache only costs the lister's run next time


def catalogue(cfg):
    """The Catalogue of the config's MPI; UserError (exit 2) when it cannot be asked."""
    launcher = mpi_launcher(cfg)
    flavour = mpi_flavour.flavour(launcher)
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
    return not _MPICH_BAD_VALUE.search(out.stdout + out.stderr)


# ---------------------------------------------------------------- jobs and launch settings

def job_algorithms(steps):
    """{op: algorithm} that one job running steps must force (default steps force nothing);
    ValueError when two steps of one op ask for different algorithms."""
    chosen = {}
    for s in steps:
        name = None if is_default(getattr(s, "algorithm", None)) else canonical(s.algorithm)
        if s.op in chosen and chosen[s.op] != name:
            raise ValueError(f"{s.op}: steps ask for {chosen[s.op] or DEFAULT} and {name or DEFAULT} "
                             f"in one MPI job (an algorithm is forced per job)")
        chosen[s.op] = name
    return {op: name for op, name in chosen.items() if name is not None}


def same_job_prefix(steps):
    """The longest leading run of steps one MPI job can run (no op with two algorithms)."""
    steps = list(steps)
    chosen = {}
    for i, s in enumerate(steps):
        name = None if is_default(getattr(s, "algorithm", None)) else canonical(s.algorithm)
        if s.op in chosen and chosen[s.op] != name:
            return steps[:i]
        chosen[s.op] = name
    return steps


def needs_separate_jobs(steps):
    try:
        job_algorithms(steps)
        return False
    except ValueError:
        return True


def check_steps(cfg, steps):
    """Every step's algorithm exists in the config's MPI (UserError naming the step and listing
    the available ones); nothing is asked of the MPI when no step forces one."""
    forced = [s for s in steps if not is_default(getattr(s, "algorithm", None))]
    if not forced:
        return
    cat = catalogue(cfg)
    for s in forced:
        try:
            cat.find(s.op, s.algorithm)
        except UserError as e:
            size = f" {s.size_label}" if get_op(s.op).has_size else ""
            raise UserError(f"{cfg.source}: plan step {s.op}{size}: {e}") from None


@dataclass
class LaunchSettings:
    mca: list = field(default_factory=list)    # (name, value) pairs: Open MPI's --mca
    env: dict = field(default_factory=dict)    # variables the ranks need


def launch_settings(cfg, algorithms=None, rules_file=None):
    """What forces algorithms ({op: name}) or loads a tuning file for one job of cfg's MPI.
    Nothing (and no MPI tool run) when neither is asked for."""
    algorithms = {op: name for op, name in (algorithms or {}).items() if not is_default(name)}
    if not algorithms and not rules_file:
        return LaunchSettings()
    return settings_for(catalogue(cfg), algorithms, rules_file)


def settings_for(cat, algorithms, rules_file=None):
    """launch_settings for a given Catalogue."""
    algorithms = {op: name for op, name in (algorithms or {}).items() if not is_default(name)}
    settings = LaunchSettings()
    if cat.flavour == mpi_flavour.OPENMPI:
        settings.mca.append(("coll_tuned_use_dynamic_rules", "1"))
        for op, name in sorted(algorithms.items()):
            a = cat.find(op, name)
            settings.mca.append((f"coll_tuned_{get_op(op).name}_algorithm", a.value))
        if rules_file:
            settings.mca.append(("coll_tuned_dynamic_rules_filename", os.path.abspath(rules_file)))
        if cat.outranking:
            settings.mca.append(("coll", "^" + ",".join(cat.outranking)))
        return settings
    for op, name in sorted(algorithms.items()):
        a = cat.find(op, name)
        settings.env[f"MPIR_CVAR_{MPICH_INFIX[get_op(op).name]}_INTRA_ALGORITHM"] = a.value
    if algorithms:
        settings.env["MPIR_CVAR_DEVICE_COLLECTIVES"] = "none"
        settings.env["MPIR_CVAR_COLLECTIVE_FALLBACK"] = "error"
    if rules_file:
        settings.env.update(read_env_file(rules_file))
    return settings


_ENV_LINE = re.compile(r"^(?:export\s+)?(MPIR_CVAR_[A-Z0-9_]+)=([A-Za-z0-9_./:,+-]*)$")


def read_env_file(path):
    """MPIR_CVAR_* settings from an env file (`[export ]NAME=value`, # comments); UserError naming
    the file and line for anything else."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the MPICH settings file: {e}") from None
    env = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _ENV_LINE.match(line)
        if not m:
            raise UserError(f"{path}: line {n}: expected MPIR_CVAR_NAME=value, got {line[:80]!r}")
        env[m.group(1)] = m.group(2)
    return env


# ---------------------------------------------------------------- why an algorithm cannot run

def _is_pow2(n):
    return n > 0 and n & (n - 1) == 0


def known_constraint(flavour, op, name, nranks, count):
    """Why this algorithm cannot run as itself for nranks ranks and count elements ("" if it
    can), from the library's source: such a row is reported, not measured under a wrong name."""
    if is_default(name):
        return ""
    op, name = get_op(op).name, canonical(name)
    if flavour == mpi_flavour.MPICH:
        if op == "allgather" and name == "recursive_doubling" and not _is_pow2(nranks):
            # MPIR_Allgather_impl: MPII_COLLECTIVE_FALLBACK_CHECK(local_size == coll.pof2)
            return f"needs a power-of-two number of ranks (MPICH refuses it at {nranks})"
        return ""
    if flavour != mpi_flavour.OPENMPI:
        return ""
    if name == "two_proc" and nranks != 2:
        # coll_base_{allgather,alltoall,barrier}.c: *_two_procs returns MPI_ERR_UNSUPPORTED_OPERATION
        return f"needs exactly 2 ranks (Open MPI aborts with MPI_ERR_UNSUPPORTED_OPERATION at {nranks})"
    if op == "allgather" and name == "recursive_doubling" and not _is_pow2(nranks):
        # coll_base_allgather.c: non-power-of-two sizes switch to bruck
        return f"needs a power-of-two number of ranks (at {nranks} Open MPI runs bruck instead)"
    if op == "allgather" and name == "neighbor" and nranks % 2:
        # coll_base_allgather.c: odd sizes switch to ring
        return f"needs an even number of ranks (at {nranks} Open MPI runs ring instead)"
    if op == "allreduce" and name == "ring" and count < nranks:
        # coll_base_allreduce.c: count < comm size switches to recursive doubling
        return (f"needs at least one element per rank ({count} < {nranks}: Open MPI runs "
                f"recursive_doubling instead)")
    return ""


_MPICH_BAD_VALUE = re.compile(r"Invalid (MPIR_CVAR_\w+) value \(([^)]*)\)")
_MPI_CALL = re.compile(r"\b(MPI_[A-Z][a-z_]*)\(([^()]*)\) failed")
_MPI_NAME = {"allreduce": "MPI_Allreduce", "bcast": "MPI_Bcast", "reduce": "MPI_Reduce",
             "allgather": "MPI_Allgather", "alltoall": "MPI_Alltoall",
             "reduce_scatter": "MPI_Reduce_scatter", "barrier": "MPI_Barrier"}


def _timed_call(call, args, step):
    """Whether MPICH's failing call is the step's own collective (same op and count)."""
    if step is None or call != _MPI_NAME.get(get_op(step.op).name):
        return False
    m = re.search(r"\b(?:send)?count=(\d+)", args)
    if m is None:
        return True
    return int(m.group(1)) == step.size_bytes // DATATYPES.get(step.datatype, 1)


def failure_reason(stderr_tail, step=None):
    """What a failed forced run's stderr says about the algorithm ("" when it says nothing).

    MPICH names the failing call in its error stack; when that is not the step's own collective
    (the engine's bookkeeping: count=1 reductions, the plan broadcast), the algorithm was refused
    for that call, and the row says so rather than blaming the timed one.
    """
    text = stderr_tail or ""
    m = _MPICH_BAD_VALUE.search(text)
    if m:
        return f"MPICH does not know {m.group(2)!r} for {m.group(1)}"
    call = _MPI_CALL.search(text)
    if "User set collective algorithm is not usable" in text:
        if call is None or _timed_call(call.group(1), call.group(2), step):
            return "MPICH: the algorithm cannot serve this call (MPIR_CVAR_COLLECTIVE_FALLBACK=error)"
        return (f"MPICH refuses the algorithm for the engine's own {call.group(1)}"
                f"({_short_args(call.group(2))}), so the timed calls could not run")
    if "MPI_ERR_UNSUPPORTED_OPERATION" in text or "operation not supported" in text:
        return "Open MPI: the algorithm does not support this call (MPI_ERR_UNSUPPORTED_OPERATION)"
    if call is not None and "Fatal error in" in text:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        stack = [ln for ln in lines if re.match(r"^MPI[RDI]?\w*\(\d+\)", ln)]
        where = stack[-1] if stack else lines[-1]
        return f"MPICH: {call.group(1)} failed under the forced algorithm ({' '.join(where.split())[:160]})"
    return ""


def _short_args(args):
    """The count, datatype and op of an MPI call's argument text (no buffer addresses)."""
    parts = [p.strip() for p in args.split(",")]
    keep = [p for p in parts if not re.match(r"^(?:send|recv)?buf(?:fer)?=", p)]
    return ", ".join(keep)[:120]
