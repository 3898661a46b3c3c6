"""Numbers read from the text of an untrusted output (nccl-tests tables, NCCL Inspector
textfiles): one parser, so "finite and >= 0" means the same wherever a measured value is read."""

import math


def finite_nonnegative(text, what, shown=40):
    """float(text) when it is a finite number >= 0; else ValueError naming `what` and the text (cut
    to `shown` characters: an output's field can be megabytes)."""
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{what} {text[:shown]!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{what} {text[:shown]!r} is not a finite number >= 0")
    return v
