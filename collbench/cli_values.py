"""Flag values: one parser per kind of value, with the same bounds in every verb.

`--ops` (op names, comma lists, repeatable), `--sizes` (message sizes), size ranges as
nccl-tests' -b/-e/-f with their `--factor`, counts (`--iterations`, `--blocks`, ...), name
lists (`--patterns`) and durations. A bad value is a UserError naming the flag and what was
expected (exit 2), found before anything runs; a value is shown cut to a line, whatever its size.
"""

import argparse

from collbench.bounded_repr import bounded_repr
from collbench.errors import UserError
from collbench.ops import DATATYPES, OPS, get_op
from collbench.sizes import format_size, parse_message_size

MAX_FACTOR = 1 << 30       # the multiplication factor between sizes (nccl-tests' -f)
MAX_SIZES = 10_000         # sizes in one plan: a range from 1 B by 2 to 2 GB has 31
MAX_COUNT = 10 ** 12       # timed or warm-up calls: the engine's limit


def op_names(values, flag="--ops", one=False, allowed=None):
    """Op names from a flag's value(s) (each a comma list; a list when the flag repeats), in order,
    each once, by their canonical names. one: exactly one op; allowed: a subset of the ops."""
    items = []
    for value in ([values] if isinstance(values, str) else list(values or [])):
        items += [x.strip() for x in str(value).split(",") if x.strip()]
    choices = list(allowed) if allowed is not None else list(OPS)
    if not items or (one and len(items) != 1):
        raise UserError(f"{flag}: expected {'one op' if one else 'an op or a comma list'} of: {', '.join(choices)}")
    names = []
    for item in items:
        try:
            name = get_op(item).name
        except KeyError:
            name = None
        if name is None or name not in choices:
            shown = bounded_repr(item, 40)
            raise UserError(f"{flag} {shown}: unknown op {shown} (expected one of: {', '.join(choices)})")
        if name not in names:
            names.append(name)
    return names


def name_list(text, allowed, flag):
    """A comma list of names from `allowed` (--patterns), in order, each once."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise UserError(f"{flag}: got {bounded_repr(text, 80)}, expected a comma list of: {', '.join(allowed)}")
    return tuple(dict.fromkeys(items))


def message_size(value, flag):
    """One message size (bytes per rank), within the engine's 2 GB limit."""
    try:
        return parse_message_size(value)
    except ValueError as e:
        raise UserError(f"{flag}: {e}") from None


def size_list(text, flag="--sizes", as_given=False):
    """--sizes 1KB,64KB,1MB -> the sizes in bytes, ascending, each once (as_given: in the order
    given, repeats kept: `once` runs its plan as written)."""
    sizes = [message_size(s.strip(), flag) for s in str(text).split(",") if s.strip()]
    if not sizes:
        raise UserError(f"{flag}: expected a comma list of sizes such as 1KB,64KB,1MB")
    if len(sizes) > MAX_SIZES:
        raise UserError(f"{flag}: {len(sizes)} sizes, at most {MAX_SIZES}")
    return sizes if as_given else sorted(set(sizes))


def factor(value, flag="--factor"):
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= MAX_FACTOR:
        raise UserError(f"{flag}: got {bounded_repr(value)}, expected a whole number from 2 to {MAX_FACTOR} "
                        "(the multiplication factor between sizes, as nccl-tests' -f)")
    return value


def size_range(min_bytes, max_bytes, step_factor, max_sizes=MAX_SIZES):
    """[min, min*f, min*f^2, ...] up to max (bytes), as nccl-tests' -b/-e/-f."""
    lo = message_size(min_bytes, "--min-bytes")
    hi = message_size(max_bytes, "--max-bytes")
    if hi < lo:
        raise UserError(f"--max-bytes {format_size(hi)} is below --min-bytes {format_size(lo)}")
    f = factor(step_factor)
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= f
    if len(sizes) > max_sizes:
        raise UserError(f"{len(sizes)} sizes: at most {max_sizes} (raise --factor or narrow the range)")
    return sizes


def count(value, flag, low=1, high=MAX_COUNT):
    """A whole number from low to high (--iterations, --blocks, --np ...); None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"{flag}: got {bounded_repr(value)}, expected a whole number from {low} to {high}")
    return value


def count_type(low=1, high=MAX_COUNT):
    """argparse type= for a count flag: the value cut to a line in the error, bounds checked."""
    def parse(text):
        try:
            v = int(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"got {bounded_repr(text, 40)}, expected a whole number") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"got {v}, expected {low} to {high}")
        return v
    parse.__name__ = "count"
    return parse


def number_type(low, high, what, above_low=False):
    """argparse type= for a number flag: from low (above it, with above_low) to high; what: the
    words for what was expected ("seconds above 0, up to 3600")."""
    def parse(text):
        try:
            v = float(str(text)[:64])
        except ValueError:
            v = None
        if v is None or not (low < v if above_low else low <= v) or not v <= high:   # NaN fails too
            raise argparse.ArgumentTypeError(f"got {bounded_repr(text, 40)}, expected {what}")
        return v
    parse.__name__ = "number"
    return parse


def ratio_type(example, high=1000.0):
    """argparse type= for a ratio flag (--ratio, --outlier-ratio): a number above 1, at most high."""
    return number_type(1.0, high, f"a number above 1 (e.g. {example})", above_low=True)


def size_type():
    """argparse type= for one message size flag (--lat-size)."""
    def parse(text):
        try:
            return parse_message_size(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = "size"
    return parse


def duration_type(low=0.0, high=365 * 86400.0):
    """argparse type= for a duration flag (--timeout): seconds, or 30s / 5m / 2h."""
    def parse(text):
        try:
            return duration(text, "", low, high)
        except UserError as e:
            raise argparse.ArgumentTypeError(str(e).lstrip(": ")) from None
    parse.__name__ = "duration"
    return parse


def duration(value, flag, low=0.0, high=365 * 86400.0):
    """Seconds from 30, 1.5, 30s, 5m, 2h, 1d."""
    text = str(value).strip().lower()
    mult = 1.0
    for suffix, m in (("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0), ("d", 86400.0)):
        if text.endswith(suffix) and text[:-len(suffix)].strip():
            text, mult = text[:-len(suffix)].strip(), m
            break
    try:
        seconds = float(text) * mult
    except ValueError:
        seconds = None
    if seconds is None or seconds != seconds or not low <= seconds <= high:
        raise UserError(f"{flag}: got {bounded_repr(value, 40)}, expected a duration from {low:g} s to "
                        f"{high:g} s such as 30, 30s, 5m, 2h")
    return seconds


def datatype(value, flag="--datatype", allowed=None):
    """A datatype name (None stays None); allowed: the ones this engine has (default: every one)."""
    choices = list(allowed) if allowed is not None else list(DATATYPES)
    if value is not None and value not in choices:
        raise UserError(f"{flag}: got {bounded_repr(value, 40)}, expected one of: {', '.join(choices)}")
    return value


def number(value, flag, low, high, what):
    """A finite number from low to high (--margin, --time-budget); what: the words for what was
    expected ("a percentage from 0 to 100")."""
    try:
        v = float(str(value)[:64])
    except ValueError:
        v = None
    if v is None or not low <= v <= high:      # NaN fails the comparison too
        raise UserError(f"{flag}: got {bounded_repr(value, 40)}, expected {what}")
    return v
