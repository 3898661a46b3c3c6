"""The YAML configuration: load, validate, and the embedded local default.

Every top-level key and section is declared once in SCHEMA; validation walks it, so an unknown
key, a wrong type or a bad value is reported with the file, the dotted key and what was
expected, before anything runs (exit code 2). Paths come out resolved (Config.resolve_path:
relative to the config file); command-line flags narrow a config through apply_overrides (one
override_* function per flag) and check_flag.
"""

import math
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

import yaml

from collbench.bounded_repr import bounded_repr, bounded_text
from collbench.bounded_yaml import YAMLRefused, load_bounded
from collbench.engines import NAMES as ENGINE_NAMES
from collbench.errors import ConfigError
from collbench.ops import DATATYPES, OPS, default_datatype, get_op
from collbench.sizes import format_size, parse_message_size, parse_size
from collbench.thresholds import DEFAULT_ECN_RATE, DEFAULT_LATENCY_US, Thresholds, parse_duration_us

LAUNCHERS = ("mpirun", "srun", "none")   # none: one process, no launcher (engines/launcher.py)
TRANSPORTS = ("shm", "ob1-tcp", "ucx", "ucx-tcp", "none")
ENGINES = ENGINE_NAMES             # collbench/engines: the registry of engines

# What the built-in engine (collbench/engines/collbench_engine.c) and MPI accept: checked here,
# so a value past them is exit 2 naming the key, never an mpirun that fails or runs forever.
INT_MAX = 2**31 - 1            # ranks, slots: MPI's int
MAX_ITERATIONS = 10**12        # iterations and warm-up (the engine's MAX_ITERATIONS)
MAX_SECONDS = 365 * 86400.0    # a duration setting: a year (sleep/wait overflow past ~292 years)
MAX_NUMBER = 1e9               # any other positive number (link speed, packet rates)
MAX_STRING = 4096              # a string or path setting (PATH_MAX)
MAX_ENV_VALUE = 32768
MAX_ROTATE_KEEP = 10000        # rotated results logs kept (readers look for each in turn)
MAX_CONFIG_BYTES = 256 << 10   # a config is a few KB
MAX_HOSTFILE_BYTES = 1 << 20   # ~40,000 hosts

# the stress plan of the prototype this project replaces (its bash loop): (op, sizes, iterations)
SEED_PLAN = (
    ("allreduce", ("4MB", "1MB", "64KB", "1KB"), 500),
    ("bcast", ("4MB", "1MB"), 500),
    ("alltoall", ("1MB",), 300),
    ("allgather", ("128KB",), 500),
    ("reduce", ("1MB",), 500),
)
# `once` with no plan runs every op: the seed's plan plus the two ops it leaves out.
ONCE_EXTRA_PLAN = (
    ("reduce_scatter", ("1MB",), 500),
    ("barrier", ("0",), 1000),
)


@dataclass(frozen=True)
class Host:
    name: str
    slots: int = 1


@dataclass(frozen=True)
class Step:
    op: str
    size_bytes: int      # 0 for barrier
    iterations: int
    warmup: int
    datatype: str
    # engine plan options beyond OSU's (defaults: what OSU does)
    inplace: bool = False
    root: int = 0
    timing: str = "osu"          # "osu" | "sustained"
    samples: bool = False        # per-iteration times: p50/p90/p99 in the record
    algorithm: str = None        # the MPI's collective algorithm to force (None: its own choice)
    # the config's plan step set `iterations` (else OSU's count for the size): --sizes keeps it
    iterations_set: bool = field(default=False, compare=False)

    @property
    def size_label(self):
        return format_size(self.size_bytes) if self.size_bytes else "-"


@dataclass
class Config:
    source: str                      # file path, or "<default>"
    hosts: list                      # [Host]
    hostfile: str                    # path when hosts came from a hostfile, else None
    ranks: int
    ranks_per_node: int              # None: fill slots in order
    oversubscribe: bool
    launcher: str
    launcher_path: str
    launcher_args: list
    env: dict
    transport: str
    engine: str
    osu_path: str
    engine_path: str
    datatype: str                    # None: per op default
    validate: bool
    step_timeout: float
    plan: list                       # [Step]; None when the config gives none
    thresholds: Thresholds
    state_dir: str
    stress: SimpleNamespace
    exporter: SimpleNamespace
    master: SimpleNamespace
    alerts: SimpleNamespace
    implicit_hosts: bool = False     # no hosts in the config: ranks on this machine only
    slurm: SimpleNamespace = None    # SLURM_SCHEMA's keys
    hosts_order: list = None         # host of each rank (rank r on hosts_order[r]); None: the launcher's fill
    mpicc: str = None                # the MPI's C compiler wrapper for the engine (default: beside launcher_path, or mpicc)
    nccl_tests_dir: str = None       # engine nccl-tests: where <op>_perf are (None: $PATH)
    base_dir: str = None             # what relative paths in the config are relative to (its directory)

    @property
    def host_names(self):
        return [h.name for h in self.hosts]

    def resolve_path(self, path):
        """A path as this config writes it: ~ expanded, relative to the config file's directory
        (the current one for the embedded default). The loader resolves every PATH key with it."""
        return resolve_path(path, self.base_dir or os.getcwd())

    def placement(self):
        """Host names the ranks land on, in order (mpirun's by-slot fill, or ranks_per_node)."""
        per_host = [self.ranks_per_node or h.slots for h in self.hosts]
        used, left = [], self.ranks
        for h, n in zip(self.hosts, per_host):
            if left <= 0:
                break
            used.append(h.name)
            left -= n
        if left > 0 and self.oversubscribe and self.hosts:
            used = self.host_names  # mpirun wraps around: every host gets ranks
        return used

    @property
    def nodes(self):
        return max(1, len(self.placement()))

    def once_plan(self):
        return self.plan if self.plan is not None else default_plan(SEED_PLAN + ONCE_EXTRA_PLAN, self.datatype)

    def stress_plan(self):
        if self.stress.plan is not None:
            return self.stress.plan
        return self.plan if self.plan is not None else default_plan(SEED_PLAN, self.datatype)


# ---------------------------------------------------------------- field kinds

class _Kind:
    """A value checker: returns the converted value or raises ValueError('expected ...')."""

    def __init__(self, check, expected):
        self.check = check
        self.expected = expected


def _typed(t, expected):
    def check(v):
        if isinstance(v, bool) and t is not bool:
            raise ValueError(expected)
        if t is float and isinstance(v, int):
            try:
                return float(v)
            except OverflowError:
                raise ValueError(expected) from None
        if not isinstance(v, t):
            raise ValueError(expected)
        return v
    return _Kind(check, expected)


def _choice(*choices):
    expected = f"one of: {', '.join(map(str, choices))}"

    def check(v):
        if not isinstance(v, str) or v not in choices:
            raise ValueError(expected)
        return v
    return _Kind(check, expected)


def _ranged(t, expected, low, high, low_allowed=True):
    """An int or float from low to high; floats finite (NaN compares false with every bound)."""
    base = _typed(t, expected)

    def check(v):
        v = base.check(v)
        if t is float and not math.isfinite(v):
            raise ValueError(expected)
        if v < low or (v == low and not low_allowed) or v > high:
            raise ValueError(expected)
        return v
    return _Kind(check, expected)


def _string(expected, limit=MAX_STRING):
    expected = f"{expected} (at most {limit} characters, no NUL)"

    def check(v):
        # NUL cannot reach a path, an argv or an environment: os and subprocess raise on it
        if not isinstance(v, str) or len(v) > limit or "\0" in v:
            raise ValueError(expected)
        return v
    return _Kind(check, expected)


def _plain_scalar(x):
    return isinstance(x, (str, int, float)) and not isinstance(x, bool)


def _str_list():
    expected = f"a list of strings (each at most {MAX_STRING} characters)"

    def check(v):
        if not isinstance(v, list) or not all(_plain_scalar(x) for x in v):
            raise ValueError(expected)
        out = [str(x) for x in v]
        if any(len(x) > MAX_STRING or "\0" in x for x in out):
            raise ValueError(expected)
        return out
    return _Kind(check, expected)


def _str_map():
    def check(v):
        if not isinstance(v, dict):
            raise ValueError("a mapping of NAME: value")
        out = {}
        for k, x in v.items():
            if (not isinstance(k, str) or not k.replace("_", "").isalnum() or len(k) > 256
                    or not (_plain_scalar(x) or isinstance(x, bool))):
                raise ValueError("a mapping of NAME: value (names of letters, digits and _; scalar values)")
            out[k] = str(x).lower() if isinstance(x, bool) else str(x)
            if len(out[k]) > MAX_ENV_VALUE or "\0" in out[k]:
                raise ValueError(f"a mapping of NAME: value (values of at most {MAX_ENV_VALUE} characters, no NUL)")
        return out
    return _Kind(check, "a mapping of NAME: value")


def _size_kind(parse, expected):
    return _Kind(parse, expected)


_SECONDS_RE = re.compile(r"^\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*(ms|s|m|h)?\s*$")
_SECONDS_MULT = {"ms": 1e-3, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}


def _seconds_kind():
    expected = "a duration such as 30s, 500ms, 10m, or a number of seconds (at most a year)"

    def check(v):
        if isinstance(v, bool) or not _plain_scalar(v):
            raise ValueError(expected)
        m = _SECONDS_RE.match(str(v))
        if not m:
            raise ValueError(expected)
        seconds = float(m.group(1)) * _SECONDS_MULT[m.group(2)]
        if not 0 < seconds <= MAX_SECONDS:
            raise ValueError(expected)
        return seconds
    return _Kind(check, expected)


def _latency_kind(example):
    expected = f"a duration such as {example} (us, ms or s; at most a year)"

    def check(v):
        try:
            us = parse_duration_us(v)
        except ValueError:
            raise ValueError(expected) from None   # its message repeats the value, of any length
        if not (math.isfinite(us) and 0 < us <= MAX_SECONDS * 1e6):
            raise ValueError(expected)
        return us
    return _Kind(check, expected)


STR = _string("a string")
PATH = _string("a path")  # resolved against the config file's directory, ~ expanded
BOOL = _typed(bool, "true or false")
POS_INT = _ranged(int, f"a positive whole number (at most {INT_MAX})", 1, INT_MAX)
NONNEG_INT = _ranged(int, f"a whole number >= 0 (at most {INT_MAX})", 0, INT_MAX)
POS_FLOAT = _ranged(float, "a positive number (at most 1e9)", 0, MAX_NUMBER, low_allowed=False)
NONNEG_FLOAT = _ranged(float, "a number >= 0 (at most 1e9)", 0, MAX_NUMBER)
# durations in seconds: finite, so `stop_grace: .nan` cannot turn a grace period into none
POS_SECONDS = _ranged(float, f"a positive number of seconds (at most {MAX_SECONDS:.0f}, a year)",
                      0, MAX_SECONDS, low_allowed=False)
NONNEG_SECONDS = _ranged(float, f"a number of seconds >= 0 (at most {MAX_SECONDS:.0f}, a year)", 0, MAX_SECONDS)
RANKS = _ranged(int, f"a positive whole number (at most {INT_MAX}: MPI ranks are int)", 1, INT_MAX)
ITERATIONS = _ranged(int, "a positive whole number (at most 10^12, the engine's limit)", 1, MAX_ITERATIONS)
WARMUP = _ranged(int, "a whole number >= 0 (at most 10^12, the engine's limit)", 0, MAX_ITERATIONS)
PORT = _ranged(int, "a port number from 1 to 65535", 1, 65535)
ROTATE_KEEP = _ranged(int, f"a whole number from 0 to {MAX_ROTATE_KEEP}", 0, MAX_ROTATE_KEEP)
STR_LIST = _str_list()
STR_MAP = _str_map()
SIZE = _size_kind(parse_size, "a size such as 1024, 64KB, 4MB")
# one rank's message in a plan or --sizes: the engine's 2 GB limit (2147483647 B)
MESSAGE_SIZE = _size_kind(parse_message_size, "a size such as 1024, 64KB, 4MB (below 2GB)")
SECONDS = _seconds_kind()
WARNING_LATENCY = _latency_kind("10ms")
CRITICAL_LATENCY = _latency_kind("20ms")


def _fraction():
    expected = "a number in (0, 1]"

    def check(v):
        try:
            v = POS_FLOAT.check(v)
        except ValueError:
            raise ValueError(expected) from None
        if v > 1:
            raise ValueError(expected)
        return v
    return _Kind(check, expected)


FRACTION = _fraction()


def _algorithm_kind():
    """A plan step's `algorithm`: a name (ring, recursive_doubling) or Open MPI's numeric id; which
    names exist is the MPI's to say (checked against it before anything runs). default: None."""
    expected = "an algorithm name such as ring or recursive_doubling (letters, digits, _ and -), or default"
    pattern = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

    def check(v):
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 999:
            return str(v)
        if not isinstance(v, str) or not pattern.match(v):
            raise ValueError(expected)
        return None if v.lower() == "default" else v
    return _Kind(check, expected)


ALGORITHM = _algorithm_kind()

# Sections with plain keys: key -> (kind, default). None default means "not set".
STRESS_SCHEMA = {
    "pause": (NONNEG_SECONDS, 0.0),          # seconds between plan passes
    "duty_cycle": (FRACTION, 1.0),           # at most this share of wall time in MPI jobs
    "backoff_initial": (POS_SECONDS, 5.0),   # seconds before the first relaunch
    "backoff_max": (POS_SECONDS, 300.0),     # cap of the exponential back-off
    "rotate_bytes": (SIZE, 100 << 20),       # rotate the results log past this size
    "rotate_keep": (ROTATE_KEEP, 5),         # rotated files kept
    "results_log": (PATH, None),              # default <state_dir>/results.jsonl
    "stop_grace": (POS_SECONDS, 10.0),       # SIGTERM -> SIGKILL grace, seconds
}
EXPORTER_SCHEMA = {
    "listen": (STR, "0.0.0.0:9105"),
    "results_log": (PATH, None),              # default: the daemon's log in state_dir
    "max_age": (POS_SECONDS, 900.0),         # seconds before a result series disappears
    "poll_interval": (POS_SECONDS, 1.0),     # seconds between log polls
    "legacy_metrics": (BOOL, False),
    "tls_cert": (PATH, None),
    "tls_key": (PATH, None),
    "basic_auth_user": (STR, None),
    "basic_auth_password_file": (PATH, None),  # file holding the password; never in this config
    "sysfs_root": (PATH, "/sys"),
    "procfs_root": (PATH, "/proc"),
    "ethtool": (STR, "ethtool"),
    "netdevs": (STR_LIST, None),             # default: the RDMA devices' netdevs from sysfs
    "device_include": (STR, None),           # regex on RDMA device / netdev names
    "device_exclude": (STR, None),
    "collectors": (STR_LIST, ["results", "rdma_sysfs", "ethtool", "netstat"]),
    "max_series": (POS_INT, 10000),          # result series kept per metric family; more are dropped and counted
    "baseline": (STR, None),                 # baseline NAME (in state_dir) or PATH.json: collbench_baseline_* series
}
MASTER_SCHEMA = {
    "host": (STR, None),                     # address or ~/.ssh/config alias; unset = act locally
    "user": (STR, None),
    "port": (PORT, None),
    "identity_file": (PATH, None),
    "known_hosts": (PATH, None),              # default ~/.ssh/known_hosts
    "ssh_config": (PATH, None),               # default ~/.ssh/config
    "connect_timeout": (POS_SECONDS, 10.0),
    "command_timeout": (POS_SECONDS, 3600.0),
    "remote_dir": (STR, "/opt/collbench"),   # where collbench lives on the master
    "remote_config": (STR, None),            # config path on the master (default: uploaded copy)
    "remote_state_dir": (STR, None),
    "python": (STR, "python3"),
    "hosts_ssh_config": (STR, None),         # ssh config the master uses to reach the hosts (servers, deploy)
}
ALERTS_SCHEMA = {
    "for": (STR, "2m"),                      # how long a latency must stay above a bound
    "stale_after": (POS_SECONDS, 600.0),     # results older than this fire ResultsStale
    "failure_window": (STR, "15m"),
    "nodes": (POS_INT, 8),                   # the cluster size the thresholds are for
    "link_gbps": (POS_FLOAT, 25.0),          # the link speed the thresholds are for
    "job": (STR, "collbench"),               # Prometheus job name of the exporter's scrape
    "regression_ratio": (POS_FLOAT, 1.5),    # CollbenchLatencyRegression: live / baseline above this
    "regression_k": (NONNEG_FLOAT, 3.0),     # ... and above the baseline median + k x its sigma
    "regression_for": (STR, None),           # ... for this long (default: alerts.for)
}
# launcher: srun, and the stress loop as a Slurm job (collbench/stress/slurm_job.py)
SLURM_SCHEMA = {
    "partition": (STR, None),                # srun/sbatch --partition
    "account": (STR, None),                  # --account
    "time_limit": (SECONDS, None),           # --time, rounded up to whole minutes (Slurm's unit)
    "nodes": (POS_INT, None),                # --nodes (default: Slurm's choice, or the allocation's)
    "mpi": (STR, "pmix"),                    # srun --mpi (Debian's OpenMPI 4.1 speaks PMIx only)
    "srun_args": (STR_LIST, []),             # extra srun arguments
    "sbatch_args": (STR_LIST, []),           # extra sbatch arguments of the stress job
    "job_name": (STR, "collbench-stress"),   # the stress job's name
    "signal_before": (SECONDS, 60.0),        # SIGTERM the stress job this long before its time limit
    "stress_job": (BOOL, False),             # `stress start` submits the loop as a job (--scheduler slurm)
}
PLAN_STEP_KEYS = ("op", "sizes", "iterations", "warmup", "datatype", "algorithm")
# Keys whose value is more than one kind: their loader method reads them (hosts, plan, ...).
HOSTS = _Kind(None, "a hostfile path or a non-empty list of hosts (name, 'name:slots' or {host: name, slots: N})")
HOSTS_ORDER = _Kind(None, "a list of the config's hosts, one per rank")
PLAN = _Kind(None, "a non-empty list of {op, sizes, iterations, warmup, datatype, algorithm}")
THRESHOLDS = _Kind(None, "a mapping with keys: latency, ecn_rate, seed_defaults")

# The config: every top-level key, declared once. A plain key maps to (kind, default; None:
# not set), a section to its schema. Defaults that depend on other keys are build_config's
# (noted here). Validation walks this table; the order is the one error messages list.
SCHEMA = {
    "hosts": (HOSTS, None),                  # unset: this machine only (implicit_hosts)
    "ranks": (RANKS, None),                  # default: len(hosts_order), the hosts' slots, or min(4, 2 x CPUs) here
    "ranks_per_node": (RANKS, None),         # unset: fill slots in order
    "oversubscribe": (BOOL, None),           # default: true on this machine only, false with hosts
    "launcher": (_choice(*LAUNCHERS), "mpirun"),
    "launcher_path": (STR, None),
    "launcher_args": (STR_LIST, []),
    "env": (STR_MAP, {}),
    "transport": (_choice(*TRANSPORTS), None),   # default: shm on this machine, ob1-tcp with hosts
    "engine": (_choice(*ENGINES), "builtin"),
    "osu_path": (PATH, None),
    "nccl_tests_dir": (PATH, None),          # engine nccl-tests: its build directory (unset: $PATH)
    "engine_path": (PATH, None),
    "datatype": (_choice(*DATATYPES), None),     # unset: per op (reductions float, the others char)
    "validate": (BOOL, False),
    "step_timeout": (SECONDS, 600.0),
    "plan": (PLAN, None),                    # unset: the default plans (SEED_PLAN ...)
    "thresholds": (THRESHOLDS, None),        # unset: the prototype's defaults
    "state_dir": (PATH, None),               # default: default_state_dir()
    "stress": STRESS_SCHEMA,                 # and stress.plan (PLAN)
    "exporter": EXPORTER_SCHEMA,
    "master": MASTER_SCHEMA,
    "alerts": ALERTS_SCHEMA,
    "slurm": SLURM_SCHEMA,
    "hosts_order": (HOSTS_ORDER, None),      # one config host per rank
    "mpicc": (STR, None),                    # the MPI C compiler wrapper for the built-in engine
}
TOP_KEYS = tuple(SCHEMA)


def resolve_path(path, base_dir):
    """path with ~ expanded, made absolute against base_dir if relative."""
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(base_dir, path))


def flag_path(path):
    """A path given on the command line: ~ expanded, relative to the current directory."""
    return os.path.abspath(os.path.expanduser(path))


def _fresh(default):
    """A default list or mapping copied: each Config gets its own, the table's stays as declared."""
    return type(default)(default) if isinstance(default, (list, dict)) else default


def default_state_dir():
    if os.geteuid() == 0:
        return "/var/lib/collbench"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "collbench")


def local_default_ranks():
    return min(4, (os.cpu_count() or 1) * 2)


def osu_default_iterations(size_bytes):
    """OSU 7.4's defaults (COLL_LOOP/SKIP_SMALL, _LARGE): 1000 iterations (100 warm-up) up to 8KB, 100 (10) above."""
    return (1000, 100) if size_bytes <= 8192 else (100, 10)


def default_plan(spec, datatype=None):
    steps = []
    for op_name, sizes, iterations in spec:
        op = get_op(op_name)
        for s in sizes:
            size = 0 if not op.has_size else parse_size(s)
            warmup = max(1, iterations // 10)
            steps.append(Step(op.name, size, iterations, warmup, datatype or default_datatype(op)))
    return steps


# ---------------------------------------------------------------- validation

class _Loader:
    def __init__(self, source, base_dir):
        self.source = source
        self.base_dir = base_dir

    def fail(self, key, message):
        raise config_error(self.source, key, message)

    def value(self, key, kind, v):
        try:
            return kind.check(v)
        except (ValueError, TypeError, OverflowError) as e:
            detail = (str(e) if isinstance(e, ValueError) else "") or kind.expected
            shown = bounded_repr(v)
            if detail.startswith(shown):
                self.fail(key, detail)  # the parser already quoted the value
            self.fail(key, f"got {shown}, expected {detail}")

    def path(self, p):
        return resolve_path(p, self.base_dir)

    def section(self, name, data, schema):
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(name, f"expected a mapping with keys: {', '.join(schema)}")
        unknown = [k for k in data if k not in schema]
        if unknown:
            self.fail(f"{name}.{unknown[0]}", f"unknown key (allowed: {', '.join(schema)})")
        out = {}
        for key, (kind, default) in schema.items():
            v = _fresh(default) if data.get(key) is None else self.value(f"{name}.{key}", kind, data[key])
            if kind is PATH and data.get(key) is not None:
                v = self.path(v)
            out[key] = v
        return out

    def hosts(self, v):
        if isinstance(v, str):
            path = self.path(self.value("hosts", PATH, v))
            return parse_hostfile(path, self), path
        if not isinstance(v, list) or not v:
            self.fail("hosts", "expected a hostfile path or a non-empty list of hosts "
                               "(name, 'name:slots' or {host: name, slots: N})")
        hosts = []
        for i, item in enumerate(v):
            key = f"hosts[{i}]"
            if isinstance(item, str):
                name, _, slots = item.partition(":")
                slots = _slots(slots or "1")
                if slots is None:
                    self.fail(key, f"got {bounded_repr(item)}, expected name or name:slots "
                                   f"with slots from 1 to {INT_MAX}")
                hosts.append(Host(_hostname(self, key, name), slots))
            elif isinstance(item, dict):
                bad = [k for k in item if k not in ("host", "slots")]
                if bad or "host" not in item or not _plain_scalar(item["host"]):
                    self.fail(key, f"got {bounded_repr(item)}, expected {{host: name, slots: N}}")
                slots = self.value(f"{key}.slots", POS_INT, item.get("slots", 1))
                hosts.append(Host(_hostname(self, f"{key}.host", str(item["host"])), slots))
            else:
                self.fail(key, f"got {bounded_repr(item)}, expected name, 'name:slots' or {{host: name, slots: N}}")
        return hosts, None

    def plan(self, v, key, datatype):
        if not isinstance(v, list) or not v:
            self.fail(key, "expected a non-empty list of {op, sizes, iterations, warmup}")
        steps = []
        for i, item in enumerate(v):
            k = f"{key}[{i}]"
            if not isinstance(item, dict):
                self.fail(k, f"expected a mapping with keys: {', '.join(PLAN_STEP_KEYS)}")
            unknown = [x for x in item if x not in PLAN_STEP_KEYS]
            if unknown:
                self.fail(f"{k}.{unknown[0]}", f"unknown key (allowed: {', '.join(PLAN_STEP_KEYS)})")
            if "op" not in item:
                self.fail(f"{k}.op", f"missing (expected one of: {', '.join(OPS)})")
            try:
                op = get_op(item["op"])
            except KeyError:
                self.fail(f"{k}.op", f"got {bounded_repr(item['op'])}, expected one of: {', '.join(OPS)}")
            dt = item.get("datatype", datatype) or default_datatype(op)
            if not isinstance(dt, str) or dt not in DATATYPES:
                self.fail(f"{k}.datatype", f"got {bounded_repr(dt)}, expected one of: {', '.join(DATATYPES)}")
            if op.reduction is False and dt != "char" and item.get("datatype") is None:
                dt = "char"
            algorithm = self.value(f"{k}.algorithm", ALGORITHM, item["algorithm"]) if item.get("algorithm") is not None else None
            sizes = item.get("sizes", ["0"] if not op.has_size else None)
            if sizes is None:
                self.fail(f"{k}.sizes", "missing (expected a list such as [1KB, 1MB])")
            if not isinstance(sizes, list) or not sizes:
                sizes = [sizes] if isinstance(sizes, (str, int)) else None
                if sizes is None:
                    self.fail(f"{k}.sizes", "expected a list of sizes such as [1KB, 1MB]")
            for j, s in enumerate(sizes):
                if not op.has_size:
                    size = 0
                else:
                    size = self.value(f"{k}.sizes[{j}]", MESSAGE_SIZE, s)
                    if size % DATATYPES[dt]:
                        self.fail(f"{k}.sizes[{j}]", f"{bounded_repr(s)} is not a multiple of the {dt} size "
                                                     f"({DATATYPES[dt]} B)")
                osu_iters, osu_warmup = osu_default_iterations(size)
                iters = self.value(f"{k}.iterations", ITERATIONS, item["iterations"]) if "iterations" in item else osu_iters
                warmup = self.value(f"{k}.warmup", WARMUP, item["warmup"]) if "warmup" in item else (
                    osu_warmup if "iterations" not in item else max(1, iters // 10))
                steps.append(Step(op.name, size, iters, warmup, dt, iterations_set="iterations" in item,
                                  algorithm=algorithm))
        return steps

    def thresholds(self, v):
        if v is None:
            return Thresholds()
        if not isinstance(v, dict):
            self.fail("thresholds", "expected a mapping with keys: latency, ecn_rate")
        bad = [k for k in v if k not in ("latency", "ecn_rate", "seed_defaults")]
        if bad:
            self.fail(f"thresholds.{bad[0]}", "unknown key (allowed: latency, ecn_rate, seed_defaults)")
        use_seed = self.value("thresholds.seed_defaults", BOOL, v.get("seed_defaults", True))
        latency = dict(DEFAULT_LATENCY_US) if use_seed else {}
        lat = v.get("latency") or {}
        if not isinstance(lat, dict):
            self.fail("thresholds.latency", "expected {op: {size: {warning: 10ms, critical: 20ms}}}")
        for op_name, sizes in lat.items():
            key = f"thresholds.latency.{op_name}"
            try:
                op = get_op(op_name)
            except KeyError:
                self.fail(key, f"unknown op (expected one of: {', '.join(OPS)})")
            if not isinstance(sizes, dict):
                self.fail(key, "expected {size: {warning: 10ms, critical: 20ms}}")
            for size, bounds in sizes.items():
                skey = f"{key}.{size}"
                size_b = self.value(skey, SIZE, size)
                if not isinstance(bounds, dict) or set(bounds) != {"warning", "critical"}:
                    self.fail(skey, "expected {warning: <duration>, critical: <duration>}")
                w = self.value(f"{skey}.warning", WARNING_LATENCY, bounds["warning"])
                c = self.value(f"{skey}.critical", CRITICAL_LATENCY, bounds["critical"])
                if c < w:
                    self.fail(skey, f"critical ({bounded_repr(bounds['critical'])}) is below "
                                    f"warning ({bounded_repr(bounds['warning'])})")
                latency = {k: b for k, b in latency.items()
                           if not (get_op(k[0]).name == op.name and parse_size(k[1]) == size_b)}
                latency[(op.name, format_size(size_b))] = (w, c)
        ecn = v.get("ecn_rate")
        ecn_rate = DEFAULT_ECN_RATE
        if ecn is not None:
            if not isinstance(ecn, dict) or set(ecn) != {"warning", "critical"}:
                self.fail("thresholds.ecn_rate", "expected {warning: N, critical: N} packets per second")
            ecn_rate = (self.value("thresholds.ecn_rate.warning", POS_FLOAT, ecn["warning"]),
                        self.value("thresholds.ecn_rate.critical", POS_FLOAT, ecn["critical"]))
        return Thresholds(latency, ecn_rate)


def _hostname(loader, key, name):
    name = name.strip()
    # Host names reach mpirun argv and remote shells: allow only what a host name can hold.
    if (not name or len(name) > 253 or any(not (c.isalnum() or c in "-._") for c in name)
            or name.startswith("-")):
        loader.fail(key, f"got {bounded_repr(name)}, expected a host name or address "
                         "(letters, digits, - . _; at most 253 characters)")
    return name


_SLOTS_RE = re.compile(r"^[0-9]{1,10}$")   # ASCII digits: str.isdigit() takes '²', which int() refuses


def _slots(text):
    """A slot count from 1 to INT_MAX, or None."""
    if not _SLOTS_RE.match(text) or not 1 <= int(text) <= INT_MAX:
        return None
    return int(text)


def config_error(source, key, message):
    """A ConfigError whose parts are cut to a line each: values from a config can be any size."""
    return ConfigError(bounded_text(source, 512) if source else source,
                       bounded_text(key, 160) if key else key, bounded_text(message))


class InputFileError(Exception):
    """A config or hostfile that cannot be read; `problem` completes '<what> <path> ...'."""

    def __init__(self, problem, about_type=False):
        super().__init__(problem)
        self.problem = problem
        self.about_type = about_type   # missing or not a file (rather than unreadable content)


def read_input_file(path, limit):
    """The text of a config or hostfile: a regular file of at most `limit` bytes, UTF-8.

    Opened non-blocking and checked with fstat on the open descriptor, so a FIFO or a device
    put in its place is refused, never waited on.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputFileError("does not exist", about_type=True) from None
    except NotADirectoryError:
        raise InputFileError("does not exist (a part of its path is not a directory)", about_type=True) from None
    except ValueError:   # a NUL in the path
        raise InputFileError("is not a valid path", about_type=True) from None
    except OSError as e:
        raise InputFileError(f"cannot be read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputFileError("is a directory", about_type=True)
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError("is not a regular file (a FIFO, socket or device)", about_type=True)
        if st.st_size > limit:
            raise InputFileError(f"is {st.st_size} bytes, over the {limit // 1024} KB limit")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:
        raise InputFileError(f"cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:   # grew since fstat
        raise InputFileError(f"is over the {limit // 1024} KB limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InputFileError(f"is not UTF-8 text (byte 0x{data[e.start]:02x} on line {line})") from None


def parse_hostfile(path, loader=None):
    """OpenMPI hostfile: 'host slots=N' per line, '#' comments. Returns [Host].

    With `loader` (a config naming the hostfile), a file that cannot be read is reported
    against the config's `hosts` key; line errors always name the hostfile.
    """
    try:
        text = read_input_file(path, MAX_HOSTFILE_BYTES)
    except InputFileError as e:
        if loader is None:
            raise config_error(path, None, f"hostfile {e.problem}") from None
        hint = " (expected a hostfile path or a list of hosts)" if e.about_type else ""
        loader.fail("hosts", f"hostfile {path} {e.problem}{hint}")
    own = _Loader(path, os.path.dirname(path))
    hosts = []
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = 1
        for p in parts[1:]:
            k, _, val = p.partition("=")
            n = _slots(val)
            if k in ("slots", "max_slots", "max-slots") and n is not None:
                if k == "slots":
                    slots = n
            else:
                own.fail(f"line {lineno}", f"got {bounded_repr(line)}, expected 'host slots=N' "
                                           f"(N from 1 to {INT_MAX})")
        hosts.append(Host(_hostname(own, f"line {lineno}", parts[0]), slots))
    if not hosts:
        raise config_error(path, None, "the hostfile lists no hosts")
    return hosts


def load_config(path=None):
    """Load and validate a config file; None gives the embedded local default."""
    if path is None:
        return build_config({}, "<default>", os.getcwd())
    try:
        text = read_input_file(path, MAX_CONFIG_BYTES)
    except InputFileError as e:
        hint = ", expected a YAML config file" if e.about_type and "exist" not in e.problem else ""
        raise config_error(path, None, f"config file {e.problem}{hint}") from None
    try:
        data = load_bounded(text)
    except YAMLRefused as e:
        raise config_error(path, e.where, e.message) from None
    except yaml.YAMLError as e:
        raise config_error(path, None, f"not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise config_error(path, None, "expected a mapping of settings at the top level")
    return build_config(data, path, os.path.dirname(os.path.abspath(path)))


def build_config(data, source, base_dir):
    ld = _Loader(source, base_dir)
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        ld.fail(unknown[0], f"unknown key (allowed: {', '.join(TOP_KEYS)})")

    def get(key, default=None):
        """A plain key's value: checked against its SCHEMA kind, paths resolved; else the
        SCHEMA default (or `default`, for the defaults that depend on other keys)."""
        kind, schema_default = SCHEMA[key]
        if data.get(key) is None:
            return _fresh(schema_default) if default is None else default
        value = ld.value(key, kind, data[key])
        return ld.path(value) if kind is PATH else value

    def section(name):
        return SimpleNamespace(**ld.section(name, data.get(name), SCHEMA[name]))

    local = "hosts" not in data
    if local:
        hosts, hostfile = [Host("localhost", local_default_ranks())], None
    else:
        hosts, hostfile = ld.hosts(data["hosts"])
    total_slots = sum(h.slots for h in hosts)
    if "ranks" not in data and total_slots > INT_MAX:
        ld.fail("ranks", f"not set, and the hosts' {total_slots} slots are more ranks than MPI's int "
                         f"holds (set ranks, at most {INT_MAX})")
    hosts_order = _hosts_order(ld, data, hosts) if data.get("hosts_order") is not None else None
    ranks = get("ranks", len(hosts_order) if hosts_order else local_default_ranks() if local else total_slots)
    if hosts_order and ranks != len(hosts_order):
        ld.fail("hosts_order", f"{len(hosts_order)} entries for {ranks} ranks (expected one entry per rank)")
    datatype = get("datatype")
    plan = ld.plan(data["plan"], "plan", datatype) if data.get("plan") is not None else None

    stress = ld.section("stress", {k: v for k, v in (data.get("stress") or {}).items() if k != "plan"}
                        if isinstance(data.get("stress"), dict) else data.get("stress"), SCHEMA["stress"])
    stress_plan = (data.get("stress") or {}).get("plan") if isinstance(data.get("stress"), dict) else None
    stress["plan"] = ld.plan(stress_plan, "stress.plan", datatype) if stress_plan is not None else None

    cfg = Config(
        source=source,
        hosts=hosts,
        hostfile=hostfile,
        ranks=ranks,
        ranks_per_node=get("ranks_per_node"),
        oversubscribe=get("oversubscribe", local),
        launcher=get("launcher"),
        launcher_path=get("launcher_path"),
        launcher_args=get("launcher_args"),
        env=get("env"),
        transport=get("transport", "shm" if local else "ob1-tcp"),
        engine=get("engine"),
        osu_path=get("osu_path"),
        nccl_tests_dir=get("nccl_tests_dir"),
        engine_path=get("engine_path"),
        datatype=datatype,
        validate=get("validate"),
        step_timeout=get("step_timeout"),
        plan=plan,
        thresholds=ld.thresholds(data.get("thresholds")),
        state_dir=get("state_dir") or default_state_dir(),
        stress=SimpleNamespace(**stress),
        exporter=section("exporter"),
        master=section("master"),
        alerts=section("alerts"),
        implicit_hosts=local,
        slurm=section("slurm"),
        hosts_order=hosts_order,
        mpicc=get("mpicc"),
        base_dir=base_dir,
    )
    if hosts_order and not cfg.oversubscribe:
        slots = {h.name: h.slots for h in hosts}
        for name, n in sorted(Counter(hosts_order).items()):
            if n > slots[name]:
                ld.fail("hosts_order", f"host {name} has {n} ranks but {slots[name]} slot(s) "
                                       "(set oversubscribe: true or add slots)")
    if cfg.ranks_per_node and not cfg.oversubscribe and cfg.ranks > cfg.ranks_per_node * len(hosts):
        ld.fail("ranks", f"{cfg.ranks} ranks do not fit {len(hosts)} hosts x ranks_per_node "
                         f"{cfg.ranks_per_node} (set oversubscribe: true or lower ranks)")
    if not cfg.ranks_per_node and not cfg.oversubscribe and cfg.ranks > total_slots:
        ld.fail("ranks", f"{cfg.ranks} ranks exceed the {total_slots} slots of the hosts "
                         "(set oversubscribe: true, add slots, or lower ranks)")
    return cfg


def _hosts_order(ld, data, hosts):
    """The `hosts_order` list: one config host per rank (a host may repeat: its k-th entry is
    its slot k); ConfigError naming the entry otherwise."""
    v = data["hosts_order"]
    if "hosts" not in data:
        ld.fail("hosts_order", "needs `hosts`: its entries must be hosts of the config")
    if not isinstance(v, list) or not v:
        ld.fail("hosts_order", f"got {bounded_repr(v)}, expected a list of host names, one per rank")
    if len(v) > INT_MAX:
        ld.fail("hosts_order", "more entries than MPI ranks can number")
    known = {h.name for h in hosts}
    for i, name in enumerate(v):
        if not isinstance(name, str) or name not in known:
            shown = ", ".join(sorted(known)[:8]) + (", ..." if len(known) > 8 else "")
            ld.fail(f"hosts_order[{i}]", f"got {bounded_repr(name)}, expected one of the config's hosts ({shown})")
    return list(v)


def check_flag(flag, kind, value):
    """A command-line value checked as the config key it overrides (kind: POS_INT, POS_FLOAT,
    POS_SECONDS ...); ConfigError naming the flag."""
    return _Loader("command line", os.getcwd()).value(flag, kind, value)


_INT_FLAG_RE = re.compile(r"^\s*[+-]?[0-9]{1,30}\s*$")


def int_flag(text):
    """argparse type of a whole-number flag (--np, --iterations): argparse's own int error
    repeats the value whole; this one shows it cut to a line. The range is apply_overrides' job."""
    import argparse
    if not _INT_FLAG_RE.match(text):
        raise argparse.ArgumentTypeError(f"invalid int value: {bounded_repr(text)}")
    return int(text)


def apply_overrides(cfg, np=None, ops=None, sizes=None, iterations=None, datatype=None, validate=None):
    """Narrow a config from command-line flags, each by its own override_* function below (in
    this order: a flag's error names it, and ops/sizes/datatype shape the plan before its sizes
    are checked against the datatypes and --iterations is applied). Returns cfg (modified)."""
    if np is not None:
        override_np(cfg, np)
    if datatype is not None:
        override_datatype(cfg, datatype)
    if validate is not None:
        override_validate(cfg, validate)
    if ops is not None:
        override_ops(cfg, ops)
    if sizes is not None:
        override_sizes(cfg, sizes)
    if ops is not None or sizes is not None or datatype is not None:
        check_plan_sizes(cfg.plan, "--sizes")
    if iterations is not None:
        override_iterations(cfg, iterations)
    return cfg


def _flags():
    return _Loader("command line", os.getcwd())


def override_np(cfg, np):
    """--np: the number of ranks (on this machine only, the one host gets that many slots)."""
    cfg.ranks = _flags().value("--np", RANKS, np)
    if cfg.implicit_hosts:
        cfg.hosts = [Host("localhost", max(cfg.ranks, 1))]


def override_validate(cfg, validate):
    """--validate: check every result element."""
    cfg.validate = validate


def override_datatype(cfg, datatype):
    """--datatype: the datatype of the reductions (and of every op when it is char)."""
    cfg.datatype = _flags().value("--datatype", _choice(*DATATYPES), datatype)
    cfg.plan = [Step(s.op, s.size_bytes, s.iterations, s.warmup,
                     cfg.datatype if get_op(s.op).reduction or cfg.datatype == "char" else s.datatype,
                     algorithm=s.algorithm, iterations_set=s.iterations_set) for s in cfg.once_plan()]


def override_ops(cfg, ops):
    """--ops: only these ops; one the plan lacks runs at 1MB (or no size), 100 iterations."""
    ld = _flags()
    names = []
    for name in [o for o in ops.split(",") if o.strip()]:
        try:
            names.append(get_op(name.strip()).name)
        except KeyError:
            ld.fail("--ops", f"got {bounded_repr(name)}, expected a comma list of: {', '.join(OPS)}")
    if not names:
        ld.fail("--ops", f"expected a comma list of: {', '.join(OPS)}")
    plan = cfg.once_plan()
    known = {s.op for s in plan}
    extra = [n for n in names if n not in known]
    plan = [s for s in plan if s.op in names]
    for n in extra:
        plan += default_plan([(n, ("1MB",) if get_op(n).has_size else ("0",), 100)], cfg.datatype)
    cfg.plan = plan


def override_sizes(cfg, sizes):
    """--sizes: every op of the plan at these sizes (bytes per rank)."""
    ld = _flags()
    size_list = [ld.value("--sizes", MESSAGE_SIZE, s.strip()) for s in sizes.split(",") if s.strip()]
    if not size_list:
        ld.fail("--sizes", "expected a comma list of sizes such as 1KB,1MB")
    plan = cfg.once_plan()
    new = []
    for op_name in dict.fromkeys(s.op for s in plan):
        op = get_op(op_name)
        first = next(s for s in plan if s.op == op_name)
        for size in (size_list if op.has_size else [0]):
            # OSU's count for each size, unless the config's plan set one (the built-in
            # default plan's fixed counts are for its own sizes, not configured ones)
            it, wu = osu_default_iterations(size)
            if first.iterations_set:
                it, wu = first.iterations, first.warmup
            new.append(Step(op_name, size, it, wu, first.datatype, algorithm=first.algorithm))
    cfg.plan = new


def override_iterations(cfg, iterations):
    """--iterations: timed iterations of every step (warm-up a tenth, at most the plan's)."""
    it = _flags().value("--iterations", ITERATIONS, iterations)
    cfg.plan = [Step(s.op, s.size_bytes, it, max(1, min(s.warmup, it // 10 or 1)), s.datatype,
                     algorithm=s.algorithm) for s in cfg.once_plan()]


def check_plan_sizes(plan, key):
    """Every step's size a whole number of its datatype's elements; ConfigError naming key."""
    for s in plan:
        if s.size_bytes % DATATYPES[s.datatype]:
            _flags().fail(key, f"{s.size_bytes} B is not a multiple of the {s.datatype} size "
                               f"({DATATYPES[s.datatype]} B)")

