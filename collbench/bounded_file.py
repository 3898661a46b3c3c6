"""A small input file read with bounds, and the `NAME=value` settings files read through it.

Every file a user hands a verb (an order file, another tool's output, a tuning env file) is
untrusted: it may be missing, a directory, gigabytes, or binary. read_bytes/read_text read at most
`max_bytes` (one byte more tells a larger file apart) and refuse the rest with a UserError (exit 2)
naming the file and what was expected, never a traceback.
"""

import re

from collbench.errors import UserError


def read_bytes(path, max_bytes, where, expected):
    """The bytes of the file at path; where: how the error names it (e.g. "--order FILE"),
    expected: what it should have been (e.g. "a rank order")."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise UserError(f"{where}: cannot read it ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise UserError(f"{where}: larger than {_size(max_bytes)} (expected {expected})")
    return data


def read_text(path, max_bytes, where, expected):
    """read_bytes decoded as UTF-8."""
    try:
        return read_bytes(path, max_bytes, where, expected).decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{where}: not UTF-8 text (expected {expected})") from None


def read_settings(path, names, where, expected, value=r"\S{1,1024}", max_bytes=1 << 20, required=True):
    """{NAME: value} of a settings file: `[export ]NAME=value` lines (NAME matching the regex
    `names`, value the regex `value`), blank lines and # comments; UserError naming the file and
    line of anything else, or (required) a file that sets nothing."""
    line_re = re.compile(rf"^(?:export\s+)?({names})=({value})$")
    out = {}
    for n, line in enumerate(read_text(path, max_bytes, where, expected).splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        if not m:
            raise UserError(f"{where}:{n}: expected {expected}, got {line[:80]!r}")
        out[m.group(1)] = m.group(2)
    if required and not out:
        raise UserError(f"{where}: sets nothing (expected {expected})")
    return out


def _size(n):
    return f"{n >> 20} MB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"
