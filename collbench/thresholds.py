"""Latency thresholds and the Good / Warning / Critical verdict.

Defaults are the figures of the prototype this project replaces, for an 8-node 25 Gb/s RoCEv2 cluster. Where its "What good
looks like" table gives warning and critical bounds they are used as they stand; where only the
"Target" column gives a bound, the target is the warning threshold and twice the target the
critical one. Other (op, size) pairs get no verdict unless the config sets one.
"""

import re

from collbench.ops import get_op
from collbench.sizes import format_size, parse_size

_MS = 1000.0
DEFAULT_LATENCY_US = {
    # (op, size label): (warning_us, critical_us)
    ("allreduce", "4MB"): (40 * _MS, 60 * _MS),
    ("allreduce", "1MB"): (10 * _MS, 20 * _MS),
    ("allreduce", "64KB"): (1 * _MS, 2 * _MS),
    ("allreduce", "1KB"): (100.0, 200.0),
    ("bcast", "4MB"): (30 * _MS, 60 * _MS),
    ("bcast", "1MB"): (10 * _MS, 15 * _MS),
    ("alltoall", "1MB"): (100 * _MS, 200 * _MS),
    ("reduce", "1MB"): (10 * _MS, 20 * _MS),
    ("allgather", "128KB"): (10 * _MS, 20 * _MS),
}
DEFAULT_ECN_RATE = (100.0, 500.0)  # ECN-marked packets per second: warning, critical

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|µs|ms|s)\s*$")
_DURATION_MULT = {"us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}


def parse_duration_us(value):
    """'10ms' / '100us' / '1.5s' / a bare number of microseconds -> microseconds."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration (expected e.g. 100us, 10ms, 1s)")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"{value!r} must be positive")
        return float(value)
    m = _DURATION_RE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a duration (expected e.g. 100us, 10ms, 1s)")
    us = float(m.group(1)) * _DURATION_MULT[m.group(2)]
    if us <= 0:
        raise ValueError(f"{value!r} must be positive")
    return us


class Thresholds:
    """Latency thresholds per (op, size_bytes), in microseconds."""

    def __init__(self, latency_us=None, ecn_rate=DEFAULT_ECN_RATE):
        base = DEFAULT_LATENCY_US if latency_us is None else latency_us
        self.latency_us = {(get_op(op).name, parse_size(size)): tuple(bounds)
                           for (op, size), bounds in base.items()}
        self.ecn_rate = tuple(ecn_rate)

    def bounds(self, op, size_bytes):
        """(warning_us, critical_us) or None."""
        return self.latency_us.get((op, size_bytes))

    def verdict(self, op, size_bytes, latency_us):
        b = self.bounds(op, size_bytes)
        if b is None or latency_us is None:
            return None
        warning, critical = b
        if latency_us > critical:
            return "Critical"
        if latency_us >= warning:
            return "Warning"
        return "Good"

    def items(self):
        """[(op, size_bytes, size_label, warning_us, critical_us)] sorted by op then size."""
        return [(op, size, format_size(size), w, c)
                for (op, size), (w, c) in sorted(self.latency_us.items())]
