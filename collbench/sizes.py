"""Message sizes: '4MB', '64KB', '1024' <-> bytes. Binary units, as OSU and seed 001 use."""

import re

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10,
          "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
MAX_SIZE = 1 << 31  # one rank's buffer; past this MPI counts overflow int


def parse_size(value):
    """Return bytes for 4MB / 64KB / 1024 / 1.5MB (an int given as int is bytes).

    Raises ValueError with the accepted forms when the value is not a size.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size (expected e.g. 1024, 64KB, 4MB)")
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE_RE.match(str(value))
        unit = m.group(2).upper() if m else None
        if not m or unit not in _UNITS:
            raise ValueError(f"{value!r} is not a size (expected e.g. 1024, 64KB, 4MB)")
        n = float(m.group(1)) * _UNITS[unit]
        if n != int(n):
            raise ValueError(f"{value!r} is not a whole number of bytes")
        n = int(n)
    if n < 1 or n > MAX_SIZE:
        raise ValueError(f"{value!r} is out of range (1 B to 2GB)")
    return n


def format_size(nbytes):
    """The size label: the largest binary unit that divides exactly (4MB, 64KB, 1000B)."""
    for unit, mult in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult}{unit}"
    return f"{nbytes}B"
