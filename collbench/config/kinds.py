"""The kinds of config values: each checks a value and converts it, or raises ValueError saying
what was expected; and the limits they hold values to (what the engine and MPI accept, so a value
past them is exit 2 naming the key, never an mpirun that fails or runs forever)."""

import math
import re


from collbench.names import netdev_name_problem
from collbench.sizes import parse_message_size, parse_size
from collbench.thresholds import parse_duration_us

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


class Kind:
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
    return Kind(check, expected)


def choice(*choices):
    expected = f"one of: {', '.join(map(str, choices))}"

    def check(v):
        if not isinstance(v, str) or v not in choices:
            raise ValueError(expected)
        return v
    return Kind(check, expected)


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
    return Kind(check, expected)


def _string(expected, limit=MAX_STRING):
    expected = f"{expected} (at most {limit} characters, no NUL)"

    def check(v):
        # NUL cannot reach a path, an argv or an environment: os and subprocess raise on it
        if not isinstance(v, str) or len(v) > limit or "\0" in v:
            raise ValueError(expected)
        return v
    return Kind(check, expected)


def plain_scalar(x):
    return isinstance(x, (str, int, float)) and not isinstance(x, bool)


def _str_list():
    expected = f"a list of strings (each at most {MAX_STRING} characters)"

    def check(v):
        if not isinstance(v, list) or not all(plain_scalar(x) for x in v):
            raise ValueError(expected)
        out = [str(x) for x in v]
        if any(len(x) > MAX_STRING or "\0" in x for x in out):
            raise ValueError(expected)
        return out
    return Kind(check, expected)


def _str_map():
    def check(v):
        if not isinstance(v, dict):
            raise ValueError("a mapping of NAME: value")
        out = {}
        for k, x in v.items():
            if (not isinstance(k, str) or not k.replace("_", "").isalnum() or len(k) > 256
                    or not (plain_scalar(x) or isinstance(x, bool))):
                raise ValueError("a mapping of NAME: value (names of letters, digits and _; scalar values)")
            out[k] = str(x).lower() if isinstance(x, bool) else str(x)
            if len(out[k]) > MAX_ENV_VALUE or "\0" in out[k]:
                raise ValueError(f"a mapping of NAME: value (values of at most {MAX_ENV_VALUE} characters, no NUL)")
        return out
    return Kind(check, "a mapping of NAME: value")


def _size_kind(parse, expected):
    return Kind(parse, expected)


_SECONDS_RE = re.compile(r"^\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*(ms|s|m|h)?\s*$")
_SECONDS_MULT = {"ms": 1e-3, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}


def _seconds_kind():
    expected = "a duration such as 30s, 500ms, 10m, or a number of seconds (at most a year)"

    def check(v):
        if isinstance(v, bool) or not plain_scalar(v):
            raise ValueError(expected)
        m = _SECONDS_RE.match(str(v))
        if not m:
            raise ValueError(expected)
        seconds = float(m.group(1)) * _SECONDS_MULT[m.group(2)]
        if not 0 < seconds <= MAX_SECONDS:
            raise ValueError(expected)
        return seconds
    return Kind(check, expected)


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
    return Kind(check, expected)


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
# exporter.congestion_top_k: hosts per op and size (congestion/attribution.MAX_K)
TOP_K = _ranged(int, "a whole number from 1 to 16", 1, 16)
STR_LIST = _str_list()
STR_MAP = _str_map()


def _host_sources():
    """congestion.hosts: {hostname: {sysfs_root, netstat, ethtool_root, rdma_qp_root: absolute paths;
    netdevs: [names]}}."""
    expected = ("a mapping of hostname: {sysfs_root, netstat, ethtool_root, rdma_qp_root: absolute paths "
                "without spaces; netdevs: a list of names}")
    keys = ("sysfs_root", "netstat", "ethtool_root", "rdma_qp_root", "netdevs")

    def check(v):
        if not isinstance(v, dict) or len(v) > 65536:
            raise ValueError(expected)
        out = {}
        for host, over in v.items():
            if (not isinstance(host, str) or not host or len(host) > 255 or any(c.isspace() or c == "|" for c in host)
                    or not isinstance(over, dict) or any(k not in keys for k in over)):
                raise ValueError(expected)
            entry = {}
            for k, x in over.items():
                if k == "netdevs":
                    if (not isinstance(x, list) or len(x) > 16
                            or not all(isinstance(n, str) and 0 < len(n) < 16 and n.isprintable() and " " not in n
                                       and "/" not in n for n in x)):
                        raise ValueError(expected)
                    entry[k] = list(x)
                elif (not isinstance(x, str) or not x.startswith("/") or len(x) >= 1024
                      or any(c.isspace() for c in x) or "\0" in x):
                    raise ValueError(expected)
                else:
                    entry[k] = x
            out[host] = entry
        return out
    return Kind(check, expected)


HOST_SOURCES = _host_sources()


def _doctor_hosts():
    """doctor.hosts: {hostname: {sysfs_root, qos_dir: absolute paths}} (a host's trees read here)."""
    expected = "a mapping of hostname: {sysfs_root, qos_dir: absolute paths without spaces}"

    def check(v):
        if not isinstance(v, dict) or len(v) > 65536:
            raise ValueError(expected)
        out = {}
        for host, over in v.items():
            if (not isinstance(host, str) or not host or len(host) > 255 or any(c.isspace() for c in host)
                    or not isinstance(over, dict) or any(k not in ("sysfs_root", "qos_dir") for k in over)):
                raise ValueError(expected)
            for x in over.values():
                if (not isinstance(x, str) or not x.startswith("/") or len(x) >= 1024
                        or any(c.isspace() for c in x) or "\0" in x):
                    raise ValueError(expected)
            out[host] = dict(over)
        return out
    return Kind(check, expected)


def _priorities():
    """A list of 802.1p priorities 0..7 (doctor.pfc_priorities, doctor.ecn_priorities)."""
    expected = "a list of priorities 0..7, e.g. [3]"

    def check(v):
        if (not isinstance(v, list) or len(v) > 8
                or not all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= 7 for p in v)):
            raise ValueError(expected)
        return sorted(set(v))
    return Kind(check, expected)


def _netdev_names():
    """doctor.netdevs: interface names, each joined to <sysfs_root>/class/net/ (never a path)."""
    expected = "a list of interface names (1 to 15 printable ASCII characters, no / : , or spaces, not . or ..)"

    def check(v):
        if not isinstance(v, list) or len(v) > 256 or any(netdev_name_problem(x) for x in v):
            raise ValueError(expected)
        return list(v)
    return Kind(check, expected)


def _link_width():
    expected = "a link width such as 4X (1 to 3 digits and X)"

    def check(v):
        if not isinstance(v, str) or not re.fullmatch(r"[0-9]{1,3}[Xx]", v):
            raise ValueError(expected)
        return v.upper()
    return Kind(check, expected)


DOCTOR_HOSTS = _doctor_hosts()
NETDEV_NAMES = _netdev_names()
LINK_WIDTH = _link_width()
PRIORITIES = _priorities()
PRIORITY = _ranged(int, "a priority 0..7", 0, 7)
DSCP = _ranged(int, "a DSCP value 0..63", 0, 63)
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
    return Kind(check, expected)


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
    return Kind(check, expected)


ALGORITHM = _algorithm_kind()
