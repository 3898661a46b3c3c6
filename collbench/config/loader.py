"""Load and validate a config file (or the embedded local default): the walk over SCHEMA, the
keys of more than one kind (hosts, hostfiles, plans, thresholds, hosts_order), and the bounded
reading of the files themselves. Every error names the file, the dotted key and what was expected."""

import os
import re
import stat
import sys
from collections import Counter
from types import SimpleNamespace

import yaml

from collbench.bounded_repr import bounded_repr, bounded_text
from collbench.bounded_yaml import YAMLRefused, load_bounded
from collbench.config.kinds import (ALGORITHM, BOOL, CRITICAL_LATENCY, INT_MAX, ITERATIONS, MAX_CONFIG_BYTES,
                                    MAX_HOSTFILE_BYTES, MESSAGE_SIZE, PATH, POS_FLOAT, POS_INT, SIZE, WARMUP,
                                    WARNING_LATENCY, plain_scalar)
from collbench.config.model import (Config, Host, Step, default_state_dir, local_default_ranks,
                                    osu_default_iterations, resolve_path)
from collbench.config.schema import PLAN_STEP_KEYS, SCHEMA, TOP_KEYS
from collbench.errors import ConfigError
from collbench.ops import DATATYPES, OPS, default_datatype, get_op
from collbench.sizes import format_size, parse_size
from collbench.thresholds import DEFAULT_ECN_RATE, DEFAULT_LATENCY_US, Thresholds

def _fresh(default):
    """A default list or mapping copied: each Config gets its own, the table's stays as declared."""
    return type(default)(default) if isinstance(default, (list, dict)) else default


class Loader:
    def __init__(self, source, base_dir):
        self.source = source
        self.base_dir = base_dir
        self.deprecated = []     # older key names read: warned on stderr once the config has loaded

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
                if bad or "host" not in item or not plain_scalar(item["host"]):
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
                if not op.measured:     # imported only (sendrecv, ...): no engine runs it
                    raise KeyError(item["op"])
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
        bad = [k for k in v if k not in ("latency", "ecn_rate", "default_latency", "seed_defaults")]
        if bad:
            self.fail(f"thresholds.{bad[0]}", "unknown key (allowed: latency, ecn_rate, default_latency)")
        # default_latency: keep the default table (DEFAULT_LATENCY_US) under the pairs set here.
        # seed_defaults is its older name (after the prototype the table came from), still read
        key = "default_latency"
        if "seed_defaults" in v:
            if "default_latency" in v:
                self.fail("thresholds.seed_defaults", "the older name of thresholds.default_latency: give one of them")
            key = "seed_defaults"
            self.deprecated.append("thresholds.seed_defaults is deprecated, use thresholds.default_latency")
        keep_defaults = self.value(f"thresholds.{key}", BOOL, v.get(key, True))
        latency = dict(DEFAULT_LATENCY_US) if keep_defaults else {}
        lat = v.get("latency") or {}
        if not isinstance(lat, dict):
            self.fail("thresholds.latency", "expected {op: {size: {warning: 10ms, critical: 20ms}}}")
        for op_name, sizes in lat.items():
            key = f"thresholds.latency.{op_name}"
            try:
                op = get_op(op_name)
                if not op.measured:
                    raise KeyError(op_name)
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
    own = Loader(path, os.path.dirname(path))
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
    ld = Loader(source, base_dir)
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
        congestion=section("congestion"),
        doctor=section("doctor"),
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
    for what in ld.deprecated:     # only for a config that loads: a refused one says just why
        print(f"collbench: warning: {source}: {what}", file=sys.stderr)
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
