"""Message sizes: '4MB', '64KB', '1024' <-> bytes. Binary units, as OSU and the prototype this project replaces use."""

import math
import re

from collbench.bounded_repr import bounded_repr

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10,
          "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
_SIZE_RE = re.compile(r"^\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([A-Za-z]{0,3})\s*$")
MAX_SIZE = 1 << 31  # a size value (log rotation, thresholds): 2GB
# One rank's message in a plan: the built-in engine takes size_bytes 1..INT_MAX (MPI counts
# are int), so "the 2 GB limit" is 2147483647 B, one byte short of 2GB.
MAX_MESSAGE_SIZE = (1 << 31) - 1
MESSAGE_LIMIT_TEXT = "the 2 GB limit (at most 2147483647 B per rank: MPI counts are int)"


def parse_size(value, max_bytes=MAX_SIZE):
    """Return bytes for 4MB / 64KB / 1024 / 1.5MB (an int given as int is bytes).

    Raises ValueError with the accepted forms when the value is not a size; the value is shown
    cut to a line, whatever its size.
    """
    shown = bounded_repr(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{shown} is not a size (expected e.g. 1024, 64KB, 4MB)")
    if isinstance(value, int):
        n = value
    else:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{shown} is not a size (expected e.g. 1024, 64KB, 4MB)")
        m = _SIZE_RE.match(str(value))
        unit = m.group(2).upper() if m else None
        if not m or unit not in _UNITS:
            raise ValueError(f"{shown} is not a size (expected e.g. 1024, 64KB, 4MB)")
        n = float(m.group(1)) * _UNITS[unit]
        if not math.isfinite(n) or n != int(n):
            raise ValueError(f"{shown} is not a whole number of bytes")
        n = int(n)
    if n < 1:
        raise ValueError(f"{shown} is out of range (1 B to 2GB)")
    if n > max_bytes:
        limit = MESSAGE_LIMIT_TEXT if max_bytes == MAX_MESSAGE_SIZE else f"{format_size(max_bytes)}"
        raise ValueError(f"{shown} is out of range: above {limit}")
    return n


def parse_message_size(value):
    """A plan's message size (bytes per rank): parse_size within the engine's 2 GB limit."""
    return parse_size(value, MAX_MESSAGE_SIZE)


def format_size(nbytes):
    """The size label: the largest binary unit that divides exactly (4MB, 64KB, 1000B)."""
    for unit, mult in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult}{unit}"
    return f"{nbytes}B"
