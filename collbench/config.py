"""The YAML configuration: load, validate, and the embedded local default.

Every section is declared once in SCHEMA; validation walks it, so an unknown key, a wrong type
or a bad value is reported with the file, the dotted key and what was expected, before anything
runs (exit code 2).
"""

import os
import re
from dataclasses import dataclass
from types import SimpleNamespace

import yaml

from collbench.errors import ConfigError
from collbench.ops import DATATYPES, OPS, default_datatype, get_op
from collbench.sizes import format_size, parse_size
from collbench.thresholds import DEFAULT_ECN_RATE, DEFAULT_LATENCY_US, Thresholds, parse_duration_us

LAUNCHERS = ("mpirun", "srun")
TRANSPORTS = ("shm", "ob1-tcp", "ucx", "ucx-tcp", "none")
ENGINES = ("builtin", "osu")

# seed 001's stress plan: (op, sizes, iterations)
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

    @property
    def host_names(self):
        return [h.name for h in self.hosts]

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
            return float(v)
        if not isinstance(v, t):
            raise ValueError(expected)
        return v
    return _Kind(check, expected)


def _choice(*choices):
    def check(v):
        if v not in choices:
            raise ValueError(f"one of: {', '.join(map(str, choices))}")
        return v
    return _Kind(check, f"one of: {', '.join(map(str, choices))}")


def _positive(t, expected, allow_zero=False):
    base = _typed(t, expected)

    def check(v):
        v = base.check(v)
        if v < 0 or (v == 0 and not allow_zero):
            raise ValueError(expected)
        return v
    return _Kind(check, expected)


def _str_list():
    def check(v):
        if not isinstance(v, list) or not all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in v):
            raise ValueError("a list of strings")
        return [str(x) for x in v]
    return _Kind(check, "a list of strings")


def _str_map():
    def check(v):
        if not isinstance(v, dict):
            raise ValueError("a mapping of NAME: value")
        out = {}
        for k, x in v.items():
            if not isinstance(k, str) or not k.replace("_", "").isalnum() or isinstance(x, (dict, list)) or x is None:
                raise ValueError("a mapping of NAME: value (names of letters, digits and _; scalar values)")
            out[k] = str(x).lower() if isinstance(x, bool) else str(x)
        return out
    return _Kind(check, "a mapping of NAME: value")


def _size_kind():
    def check(v):
        return parse_size(v)
    return _Kind(check, "a size such as 1024, 64KB, 4MB")


_SECONDS_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SECONDS_MULT = {"ms": 1e-3, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}


def _seconds_kind():
    expected = "a duration such as 30s, 500ms, 10m, or a number of seconds"

    def check(v):
        if isinstance(v, bool):
            raise ValueError(expected)
        m = _SECONDS_RE.match(str(v))
        if not m or float(m.group(1)) <= 0:
            raise ValueError(expected)
        return float(m.group(1)) * _SECONDS_MULT[m.group(2)]
    return _Kind(check, expected)


STR = _typed(str, "a string")
PATH = _typed(str, "a path")  # resolved against the config file's directory, ~ expanded
BOOL = _typed(bool, "true or false")
POS_INT = _positive(int, "a positive whole number")
NONNEG_INT = _positive(int, "a whole number >= 0", allow_zero=True)
POS_FLOAT = _positive(float, "a positive number")
NONNEG_FLOAT = _positive(float, "a number >= 0", allow_zero=True)
STR_LIST = _str_list()
STR_MAP = _str_map()
SIZE = _size_kind()
SECONDS = _seconds_kind()


def _fraction():
    def check(v):
        v = POS_FLOAT.check(v)
        if v > 1:
            raise ValueError("a number in (0, 1]")
        return v
    return _Kind(check, "a number in (0, 1]")


FRACTION = _fraction()

# Sections with plain keys: key -> (kind, default). None default means "not set".
STRESS_SCHEMA = {
    "pause": (NONNEG_FLOAT, 0.0),            # seconds between plan passes
    "duty_cycle": (FRACTION, 1.0),           # at most this share of wall time in MPI jobs
    "backoff_initial": (POS_FLOAT, 5.0),     # seconds before the first relaunch
    "backoff_max": (POS_FLOAT, 300.0),       # cap of the exponential back-off
    "rotate_bytes": (SIZE, 100 << 20),       # rotate the results log past this size
    "rotate_keep": (NONNEG_INT, 5),          # rotated files kept
    "results_log": (PATH, None),              # default <state_dir>/results.jsonl
    "stop_grace": (POS_FLOAT, 10.0),         # SIGTERM -> SIGKILL grace, seconds
}
EXPORTER_SCHEMA = {
    "listen": (STR, "0.0.0.0:9105"),
    "results_log": (PATH, None),              # default: the daemon's log in state_dir
    "max_age": (POS_FLOAT, 900.0),           # seconds before a result series disappears
    "poll_interval": (POS_FLOAT, 1.0),       # seconds between log polls
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
}
MASTER_SCHEMA = {
    "host": (STR, None),                     # address or ~/.ssh/config alias; unset = act locally
    "user": (STR, None),
    "port": (POS_INT, None),
    "identity_file": (PATH, None),
    "known_hosts": (PATH, None),              # default ~/.ssh/known_hosts
    "ssh_config": (PATH, None),               # default ~/.ssh/config
    "connect_timeout": (POS_FLOAT, 10.0),
    "command_timeout": (POS_FLOAT, 3600.0),
    "remote_dir": (STR, "/opt/collbench"),   # where collbench lives on the master
    "remote_config": (STR, None),            # config path on the master (default: uploaded copy)
    "remote_state_dir": (STR, None),
    "python": (STR, "python3"),
    "hosts_ssh_config": (STR, None),         # ssh config the master uses to reach the hosts (servers, deploy)
}
ALERTS_SCHEMA = {
    "for": (STR, "2m"),                      # how long a latency must stay above a bound
    "stale_after": (POS_FLOAT, 600.0),       # results older than this fire ResultsStale
    "failure_window": (STR, "15m"),
    "nodes": (POS_INT, 8),                   # the cluster size the thresholds are for
    "link_gbps": (POS_FLOAT, 25.0),          # the link speed the thresholds are for
    "job": (STR, "collbench"),               # Prometheus job name of the exporter's scrape
}
PLAN_STEP_KEYS = ("op", "sizes", "iterations", "warmup", "datatype")
TOP_KEYS = ("hosts", "ranks", "ranks_per_node", "oversubscribe", "launcher", "launcher_path",
            "launcher_args", "env", "transport", "engine", "osu_path", "engine_path", "datatype",
            "validate", "step_timeout", "plan", "thresholds", "state_dir",
            "stress", "exporter", "master", "alerts")


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
        raise ConfigError(self.source, key, message)

    def value(self, key, kind, v):
        try:
            return kind.check(v)
        except ValueError as e:
            detail = str(e) or kind.expected
            if detail.startswith((repr(v), str(v))):
                self.fail(key, detail)  # the parser already quoted the value
            self.fail(key, f"got {v!r}, expected {detail}")

    def path(self, p):
        p = os.path.expanduser(p)
        return p if os.path.isabs(p) else os.path.normpath(os.path.join(self.base_dir, p))

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
            v = default if data.get(key) is None else self.value(f"{name}.{key}", kind, data[key])
            if kind is PATH and data.get(key) is not None:
                v = self.path(v)
            out[key] = v
        return out

    def hosts(self, v):
        if isinstance(v, str):
            path = self.path(v)
            if not os.path.isfile(path):
                self.fail("hosts", f"hostfile {path} does not exist (expected a hostfile path or a list of hosts)")
            return parse_hostfile(path, self), path
        if not isinstance(v, list) or not v:
            self.fail("hosts", "expected a hostfile path or a non-empty list of hosts "
                               "(name, 'name:slots' or {host: name, slots: N})")
        hosts = []
        for i, item in enumerate(v):
            key = f"hosts[{i}]"
            if isinstance(item, str):
                name, _, slots = item.partition(":")
                slots = slots or "1"
                if not slots.isdigit() or int(slots) < 1:
                    self.fail(key, f"got {item!r}, expected name or name:slots with slots >= 1")
                hosts.append(Host(_hostname(self, key, name), int(slots)))
            elif isinstance(item, dict):
                bad = [k for k in item if k not in ("host", "slots")]
                if bad or "host" not in item:
                    self.fail(key, f"got {item!r}, expected {{host: name, slots: N}}")
                slots = self.value(f"{key}.slots", POS_INT, item.get("slots", 1))
                hosts.append(Host(_hostname(self, f"{key}.host", str(item["host"])), slots))
            else:
                self.fail(key, f"got {item!r}, expected name, 'name:slots' or {{host: name, slots: N}}")
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
                self.fail(f"{k}.op", f"got {item['op']!r}, expected one of: {', '.join(OPS)}")
            dt = item.get("datatype", datatype) or default_datatype(op)
            if dt not in DATATYPES:
                self.fail(f"{k}.datatype", f"got {dt!r}, expected one of: {', '.join(DATATYPES)}")
            if op.reduction is False and dt != "char" and item.get("datatype") is None:
                dt = "char"
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
                    size = self.value(f"{k}.sizes[{j}]", SIZE, s)
                    if size % DATATYPES[dt]:
                        self.fail(f"{k}.sizes[{j}]", f"{s!r} is not a multiple of the {dt} size ({DATATYPES[dt]} B)")
                osu_iters, osu_warmup = osu_default_iterations(size)
                iters = self.value(f"{k}.iterations", POS_INT, item["iterations"]) if "iterations" in item else osu_iters
                warmup = self.value(f"{k}.warmup", NONNEG_INT, item["warmup"]) if "warmup" in item else (
                    osu_warmup if "iterations" not in item else max(1, iters // 10))
                steps.append(Step(op.name, size, iters, warmup, dt))
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
                w = self.value(f"{skey}.warning", _Kind(parse_duration_us, "a duration such as 10ms"), bounds["warning"])
                c = self.value(f"{skey}.critical", _Kind(parse_duration_us, "a duration such as 20ms"), bounds["critical"])
                if c < w:
                    self.fail(skey, f"critical ({bounds['critical']}) is below warning ({bounds['warning']})")
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
    if not name or any(not (c.isalnum() or c in "-._") for c in name) or name.startswith("-"):
        loader.fail(key, f"got {name!r}, expected a host name or address (letters, digits, - . _)")
    return name


def parse_hostfile(path, loader=None):
    """OpenMPI hostfile: 'host slots=N' per line, '#' comments. Returns [Host]."""
    loader = loader or _Loader(path, os.path.dirname(path))
    hosts = []
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            slots = 1
            for p in parts[1:]:
                k, _, val = p.partition("=")
                if k in ("slots", "max_slots", "max-slots") and val.isdigit() and int(val) >= 1:
                    if k == "slots":
                        slots = int(val)
                else:
                    raise ConfigError(path, f"line {lineno}",
                                      f"got {line!r}, expected 'host slots=N'")
            hosts.append(Host(_hostname(loader, f"line {lineno}", parts[0]), slots))
    if not hosts:
        raise ConfigError(path, None, "the hostfile lists no hosts")
    return hosts


def load_config(path=None):
    """Load and validate a config file; None gives the embedded local default."""
    if path is None:
        return build_config({}, "<default>", os.getcwd())
    if not os.path.isfile(path):
        raise ConfigError(path, None, "config file does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(path, None, f"not valid YAML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(path, None, f"cannot read: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, None, "expected a mapping of settings at the top level")
    return build_config(data, path, os.path.dirname(os.path.abspath(path)))


def build_config(data, source, base_dir):
    ld = _Loader(source, base_dir)
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        ld.fail(unknown[0], f"unknown key (allowed: {', '.join(TOP_KEYS)})")

    def get(key, kind, default):
        return default if data.get(key) is None else ld.value(key, kind, data[key])

    local = "hosts" not in data
    if local:
        hosts, hostfile = [Host("localhost", local_default_ranks())], None
    else:
        hosts, hostfile = ld.hosts(data["hosts"])
    total_slots = sum(h.slots for h in hosts)
    ranks = get("ranks", POS_INT, local_default_ranks() if local else total_slots)
    datatype = get("datatype", _choice(*DATATYPES), None)
    plan = ld.plan(data["plan"], "plan", datatype) if data.get("plan") is not None else None

    stress = ld.section("stress", {k: v for k, v in (data.get("stress") or {}).items() if k != "plan"}
                        if isinstance(data.get("stress"), dict) else data.get("stress"), STRESS_SCHEMA)
    stress_plan = (data.get("stress") or {}).get("plan") if isinstance(data.get("stress"), dict) else None
    stress["plan"] = ld.plan(stress_plan, "stress.plan", datatype) if stress_plan is not None else None

    cfg = Config(
        source=source,
        hosts=hosts,
        hostfile=hostfile,
        ranks=ranks,
        ranks_per_node=get("ranks_per_node", POS_INT, None),
        oversubscribe=get("oversubscribe", BOOL, local),
        launcher=get("launcher", _choice(*LAUNCHERS), "mpirun"),
        launcher_path=get("launcher_path", STR, None),
        launcher_args=get("launcher_args", STR_LIST, []),
        env=get("env", STR_MAP, {}),
        transport=get("transport", _choice(*TRANSPORTS), "shm" if local else "ob1-tcp"),
        engine=get("engine", _choice(*ENGINES), "builtin"),
        osu_path=ld.path(data["osu_path"]) if isinstance(data.get("osu_path"), str) else get("osu_path", STR, None),
        engine_path=ld.path(data["engine_path"]) if isinstance(data.get("engine_path"), str) else get("engine_path", STR, None),
        datatype=datatype,
        validate=get("validate", BOOL, False),
        step_timeout=get("step_timeout", SECONDS, 600.0),
        plan=plan,
        thresholds=ld.thresholds(data.get("thresholds")),
        state_dir=ld.path(data["state_dir"]) if isinstance(data.get("state_dir"), str) else get("state_dir", STR, default_state_dir()),
        stress=SimpleNamespace(**stress),
        exporter=SimpleNamespace(**ld.section("exporter", data.get("exporter"), EXPORTER_SCHEMA)),
        master=SimpleNamespace(**ld.section("master", data.get("master"), MASTER_SCHEMA)),
        alerts=SimpleNamespace(**ld.section("alerts", data.get("alerts"), ALERTS_SCHEMA)),
        implicit_hosts=local,
    )
    if cfg.ranks_per_node and not cfg.oversubscribe and cfg.ranks > cfg.ranks_per_node * len(hosts):
        ld.fail("ranks", f"{cfg.ranks} ranks do not fit {len(hosts)} hosts x ranks_per_node "
                         f"{cfg.ranks_per_node} (set oversubscribe: true or lower ranks)")
    if not cfg.ranks_per_node and not cfg.oversubscribe and cfg.ranks > total_slots:
        ld.fail("ranks", f"{cfg.ranks} ranks exceed the {total_slots} slots of the hosts "
                         "(set oversubscribe: true, add slots, or lower ranks)")
    if cfg.engine == "osu" and cfg.osu_path is None and not os.environ.get("OSU_PATH"):
        pass  # resolved (with a clear error listing where it looked) when the OSU engine starts
    return cfg


def apply_overrides(cfg, np=None, ops=None, sizes=None, iterations=None, datatype=None, validate=None):
    """Narrow a config from command-line flags; errors name the flag. Returns cfg (modified)."""
    ld = _Loader("command line", os.getcwd())
    if np is not None:
        cfg.ranks = ld.value("--np", POS_INT, np)
        if cfg.implicit_hosts:
            cfg.hosts = [Host("localhost", max(cfg.ranks, 1))]
    if datatype is not None:
        cfg.datatype = ld.value("--datatype", _choice(*DATATYPES), datatype)
    if validate is not None:
        cfg.validate = validate
    if ops is None and sizes is None and iterations is None and datatype is None:
        return cfg
    plan = cfg.once_plan()
    if ops is not None:
        names = []
        for name in [o for o in ops.split(",") if o.strip()]:
            try:
                names.append(get_op(name.strip()).name)
            except KeyError:
                ld.fail("--ops", f"got {name!r}, expected a comma list of: {', '.join(OPS)}")
        if not names:
            ld.fail("--ops", f"expected a comma list of: {', '.join(OPS)}")
        known = {s.op for s in plan}
        # An op named on the command line but absent from the plan runs at 1MB (or no size), 100 iterations.
        extra = [n for n in names if n not in known]
        plan = [s for s in plan if s.op in names]
        for n in extra:
            plan += default_plan([(n, ("1MB",) if get_op(n).has_size else ("0",), 100)], cfg.datatype)
    if sizes is not None:
        size_list = [ld.value("--sizes", SIZE, s.strip()) for s in sizes.split(",") if s.strip()]
        if not size_list:
            ld.fail("--sizes", "expected a comma list of sizes such as 1KB,1MB")
        new = []
        for op_name in dict.fromkeys(s.op for s in plan):
            op = get_op(op_name)
            first = next(s for s in plan if s.op == op_name)
            for size in (size_list if op.has_size else [0]):
                it, wu = osu_default_iterations(size)
                if first.iterations != osu_default_iterations(first.size_bytes)[0]:
                    it, wu = first.iterations, first.warmup
                new.append(Step(op_name, size, it, wu, first.datatype))
        plan = new
    if datatype is not None:
        plan = [Step(s.op, s.size_bytes, s.iterations, s.warmup,
                     cfg.datatype if get_op(s.op).reduction or cfg.datatype == "char" else s.datatype) for s in plan]
    for s in plan:
        if s.size_bytes % DATATYPES[s.datatype]:
            ld.fail("--sizes", f"{s.size_bytes} B is not a multiple of the {s.datatype} size ({DATATYPES[s.datatype]} B)")
    if iterations is not None:
        it = ld.value("--iterations", POS_INT, iterations)
        plan = [Step(s.op, s.size_bytes, it, max(1, min(s.warmup, it // 10 or 1)), s.datatype) for s in plan]
    cfg.plan = plan
    return cfg

