"""A value as shown in an error message: repr, but never longer than a line.

Config values, flags and log fields are untrusted: a 1 MB string, a 10,000-digit number or a
list that aliases expand to millions of items must not turn into a 1 MB error message, and
repr() of an int past 4300 digits even raises (Python's int-to-str limit).
"""

import reprlib

SHOWN_CHARS = 80    # a value in a message: at most this many characters
MESSAGE_CHARS = 600  # a whole message


class _Repr(reprlib.Repr):
    def __init__(self, limit):
        super().__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = 6
        self.maxdict = 4
        self.maxstring = limit
        self.maxother = limit
        self.maxlong = limit

    def repr_int(self, x, level):
        if x.bit_length() > 256:   # ~77 digits: say how big instead of converting it
            return f"<a {'negative ' if x < 0 else ''}number of about {int(x.bit_length() * 0.30103) + 1} digits>"
        return super().repr_int(x, level)


def bounded_repr(value, limit=SHOWN_CHARS):
    """repr(value) cut to `limit` characters (with '...'): safe for any size, type and nesting."""
    try:
        text = _Repr(limit).repr(value)
    except Exception:  # a repr that fails (exotic types) still yields a message
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def bounded_text(text, limit=MESSAGE_CHARS):
    """A message or key cut to `limit` characters, saying how much was left out."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


PATH_CHARS = 160    # a path in a message


def shown_path(path, limit=PATH_CHARS):
    """A path as a message shows it: whole when short, else its start and its end (the file's
    name) around the count of characters left out; a 5,000-character path is never a 5,000-
    character error line."""
    path = str(path)
    if len(path) <= limit:
        return path
    keep = limit - 40
    return f"{path[:keep // 2]}...({len(path) - keep} characters)...{path[-(keep - keep // 2):]}"


def bounded_lines(text, limit=1000):
    """text with every line longer than `limit` shortened in its middle (shown_path's way): the
    last bound on any message collbench prints."""
    return "\n".join(shown_path(line, limit) for line in str(text).split("\n"))


# C0 controls (but tab and newline, which a table may hold), DEL and C1 controls: what a
# terminal acts on (escape sequences, cursor moves, title changes) rather than shows.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f, *range(0x80, 0xa0))}
_CONTROL_ONE_LINE = {**_CONTROL, 0x09: "\\t", 0x0a: "\\n"}


def terminal_safe(text, one_line=True):
    """text with every control character a terminal would act on shown escaped (ESC -> '\\x1b'),
    so a value read from an untrusted file (a baseline's transport, a log's host field) cannot
    move the cursor, recolour or retitle the operator's terminal. one_line: tab and newline are
    escaped too (a value inside a table cell or a message)."""
    return str(text).translate(_CONTROL_ONE_LINE if one_line else _CONTROL)
