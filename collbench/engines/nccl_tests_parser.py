"""Read what nccl-tests (NVIDIA) and rccl-tests (AMD) print, in every form they have printed.

The text table (the forms are in tests/fixtures/nccl_tests/README.md, each from a published run):

- pre-2019: `nThread 1 nGpus 8 ...` without '#', device lines `#   Rank  0 on host device 0 [..]`,
  columns `bytes N type op time algbw busbw res` (res: max error, e-notation `0e+00`);
- before v2.13 (per collective): `size count type redop time algbw busbw error` for reductions,
  `size count type root ...` for broadcast, `size count type ...` for all_gather; `error` is the
  largest deviation (`1e-06`), `N/A` with -c 0;
- v2.13 and later: 13 columns `size count type redop root time algbw busbw #wrong` x2 (`#wrong` a
  count, `%6g`: large counts in e-notation), `N/A` with -c 0, device lines `Rank N Group G Pid P`;
  2.19 adds `-I` per-iteration columns (i_min i_max i_p99 i_cv% per variant) and -S timestamps;
- `# nccl-tests version`, `# Collective test starting/concluded:`, `rccl-tests: Version`,
  `NCCL version` lines; NCCL INFO/WARN lines and MPI noise anywhere in between;
- launcher prefixes on every line: Open MPI `--tag-output` (`[1,0]<stdout>:`) and `srun -l` (`0: `);
- a run that fails mid-table: the rows before stay, `host: Test NCCL failure common.cu:1204 'why'`
  (or `Test CUDA failure`, `NCCL failure x.cu:95 'why'`, `Test timeout`) becomes a Failure;
- 2017-2018 printed times in milliseconds (read as microseconds here) and its footer without '#';
- pasted forms: header lines without '#' (a rendered page copied back), rows without their header
  (the layout their field count tells), several runs one after another (a new parameter line,
  device lines after rows, a command line, or a table of another shape starts the next run; a
  table with no setup lines of its own takes the devices of the run before); hypercube's empty
  redop prints no field.

Text is read line by line (parse_lines: a 60 MB output is never held whole); at most MAX_ROWS
rows are kept per run, the rest counted.

Structured forms: nccl-tests `-J file.json` (2.19+; the writer is src/util.cu), rccl-tests
`-Z json` (one object per line, or a list) and `-Z csv` (a header row with the same keys).

Everything here reads untrusted input: a line that looks like a table row but does not fit the
table's header is counted in Output.bad_lines with its line number and why; nothing raises but
NcclTestsError for input that is not nccl-tests output at all (or too large).
"""

import csv
import itertools
import json
import math
import re
from dataclasses import dataclass, field

from collbench.text_numbers import finite_nonnegative

MAX_INPUT_BYTES = 64 << 20     # a sweep of every op and type is a few MB
MAX_LINE_CHARS = 8192          # a device line is < 2 KB (nccl-tests' MAX_LINE 2048 per process)
MAX_ROWS = 100000             # rows kept per run (a sweep of every type and op is a few thousand)
MAX_BAD_KEPT = 50              # bad lines kept verbatim (all of them are counted)


class NcclTestsError(ValueError):
    """The input is not nccl-tests / rccl-tests output (or is too large to be)."""


@dataclass(slots=True)
class Variant:
    """One half of a table row: out-of-place or in-place."""
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: float = None          # None: validation off (N/A)
    wrong_kind: str = "count"    # "count" (#wrong) or "error" (pre-2.13 max deviation)
    i_min_us: float = None       # -I per-iteration columns (2.19+)
    i_max_us: float = None
    i_p99_us: float = None

    @property
    def validation(self):
        """'pass', 'fail' or 'off' (N/A)."""
        if self.wrong is None:
            return "off"
        if self.wrong_kind == "count":
            return "fail" if self.wrong > 0 else "pass"
        return "pass"   # a max deviation: the footer's "Out of bounds values" says whether it failed


@dataclass(slots=True)
class Row:
    size: int                    # bytes, as nccl-tests counts them (all_gather: the whole buffer)
    count: int
    type: str
    redop: str = None
    root: int = None             # -1: nccl-tests' "no root"
    oop: Variant = None          # None: not printed (trace replay)
    ip: Variant = None
    line: int = 0


@dataclass
class Device:
    rank: int
    host: str
    device: int
    pid: int = None
    group: int = None
    bus_id: str = ""
    name: str = ""


@dataclass
class Failure:
    reason: str                  # "unhandled cuda error ...", as the program said it
    kind: str = ""               # "NCCL", "CUDA", "timeout", "invalid"
    where: str = ""              # "common.cu:1204"
    host: str = ""
    line: int = 0

    def message(self):
        head = f"{self.kind} failure" if self.kind in ("NCCL", "CUDA") else "failure"
        at = f" at {self.where}" if self.where else ""
        on = f" on {self.host}" if self.host else ""
        return f"nccl-tests {head}{at}{on}: {self.reason}"


@dataclass
class Output:
    """One run of one nccl-tests binary."""
    test: str = None             # "all_reduce_perf" (Collective test starting / -J args), if printed
    form: str = "text"           # text | json (-J) | rccl-json | rccl-csv
    version: str = None          # nccl-tests / rccl-tests version, if printed
    nccl_version: str = None
    params: dict = field(default_factory=dict)   # nThread, nGpus, minBytes, iters, warmup iters, validation...
    devices: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    warnings: list = field(default_factory=list)  # NCCL WARN lines (context for a failure)
    out_of_bounds: int = None
    avg_busbw: float = None
    concluded: bool = False
    bad_lines: int = 0
    bad: list = field(default_factory=list)       # (line number, reason) of the first MAX_BAD_KEPT
    ranks_hint: int = None       # ranks a structured form states (rccl-tests' "gpus")
    command_test: str = None     # the binary a command line in the text ran (a copied terminal session)
    columns: tuple = ()          # the key columns of its table header ("size", "count", "type", "redop", "root")
    setup_from_previous: bool = False   # a table with no setup lines of its own: devices/params of the run before
    rows_dropped: int = 0        # result rows past MAX_ROWS (counted, not kept)
    rccl: bool = False           # a line only rccl-tests prints ("# Errors with asterisks ...")

    def bad_line(self, lineno, reason):
        self.bad_lines += 1
        if len(self.bad) < MAX_BAD_KEPT:
            self.bad.append((lineno, reason))

    @property
    def ranks(self):
        """Ranks in the communicator: one device line per rank, else what the output states."""
        if self.devices:
            return len({d.rank for d in self.devices})
        return self.ranks_hint

    @property
    def hosts(self):
        return list(dict.fromkeys(d.host for d in self.devices))

    @property
    def empty(self):
        return not (self.rows or self.failures or self.devices or self.params)


# ------------------------------------------------------------------ the text form

_PREFIX = re.compile(r"^\s*\d+:\s")     # srun -l
# Open MPI --tag-output: at the start of a line, and wherever mpirun's read of the rank's output
# ended (nccl-tests prints a row in several printf calls: a tag can land mid-line)
_TAG = re.compile(r"\[\d+,\d+\]<(?:stdout|stderr)>:")
_NCCL_LOG = re.compile(r"\bNCCL (INFO|WARN|TRACE|ABORT)\b\s?(.*)")
_TESTS_VERSION = re.compile(r"^#\s*nccl-tests version (\S+)(?:.*\bnccl-library=(\d{4,6})\b)?")
# the lines naming a version: (pattern, the Output field its first group sets); the first match wins
_VERSION_LINES = ((_TESTS_VERSION, "version"),
                  (re.compile(r"^\s*rccl-tests: Version (\S+)"), "version"),
                  (re.compile(r"^\s*NCCL version (\S+)"), "nccl_version"),
                  (re.compile(r"^#\s*NCCL Tests compiled with NCCL (\S+)"), "nccl_version"))
_STARTING = re.compile(r"^#?\s*Collective test starting:\s*(\S+)")
_CONCLUDED = re.compile(r"^#?\s*Collective test concluded:\s*(\S+)")
_PARAMS = re.compile(r"^#?\s*nThreads?:?\s+\d+\s+nGpus:?\s+\d+")
_PARAM_PAIR = re.compile(r"([A-Za-z][A-Za-z ]*?):?\s+(-?\d+)(?:\(\w+\))?(?=\s|$)")
_DEVICE = re.compile(r"^#?\s*Rank\s+(\d+)(?:\s+Group\s+(\d+))?(?:\s+Pid\s+(\d+))?\s+on\s+(\S+)\s+"
                     r"device\s+(\d+)\s+\[([^\]]*)\]\s*(.*?)\s*$")
_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(\d+)")
_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+|nan|inf)")
# the lines that say a run failed: (pattern, the Failure of its match and line number), matched
# against the line without its leading and trailing white space
_FAILURE_LINES = (
    (re.compile(r"^(?:(\S+):\s+)?(?:Test )?(NCCL|CUDA) failure (\S+?:\d+)\s+'(.*?)'?\s*$"),
     lambda m, n: Failure(m.group(4).strip().rstrip("/ ").strip() or "(no reason given)", m.group(2), m.group(3),
                          m.group(1) or "", n)),
    (re.compile(r"^(?:(\S+):\s+)?Test timeout \((\d+)s\)\s*(.*)$"),
     lambda m, n: Failure(f"test timeout ({m.group(2)}s) {m.group(3)}".strip(), "timeout", "", m.group(1) or "", n)),
    (re.compile(r"^(Invalid number of GPUs: .*|invalid option .*|Incompatible NCCL versions.*)$"),
     lambda m, n: Failure(m.group(1), "invalid", "", "", n)),
    (re.compile(r"^#\s*error:\s*(.+)$"),
     lambda m, n: Failure(m.group(1).strip(), "NCCL", "", "", n)),
)
_NUMBER_START = re.compile(r"^\s*\d")
# rccl-tests' footer line (src/common.cu there), which nccl-tests never prints
_RCCL_FOOTER = re.compile(r"^#?\s*Errors with asterisks indicate errors that have exceeded")
# header lines without their '#' (a page that rendered '#' lines as headings, copied back as text)
_BARE_HEADER = re.compile(r"^\s*(?:(?:size|bytes)\s+(?:count|N)\s+type\b.*\balgbw\s+busbw\b|"
                          r"out-of-place\s+in-place\s*$|in-place\s+out-of-place\s*$|\(B\)\s+\(elements\)|"
                          r"Using devices\s*$)", re.IGNORECASE)
# a shell line that ran a binary ("$ ./build/all_reduce_perf -b 8"): names the test when nothing else does
_COMMAND = re.compile(r"(?:^|[/\s=])((?:all_reduce|all_gather|alltoallv?|broadcast|reduce_scatter|reduce|"
                      r"sendrecv|scatter|gather|hypercube)_perf)(?:_mpi)?(?:\s|$|=)")

# column names of the key part, in the spellings of every version
_KEY_COLUMNS = {"size": "size", "bytes": "size", "count": "count", "n": "count", "type": "type",
                "redop": "redop", "op": "redop", "root": "root"}
_TIME = ("time", "cputime")
_WRONG = {"#wrong": "count", "wrong": "count", "error": "error", "res": "error"}


class _Layout:
    """What a table header says: the key columns and each variant's columns, in order."""

    def __init__(self, keys, variants, timestamp, time_scale=1.0):
        self.time_scale = time_scale  # to microseconds: 1000 for the 2017-2018 layout, which printed ms
        self.keys = keys              # ["size", "count", "type", "redop", "root"]
        self.variants = variants      # [("oop", ["time", "algbw", "busbw", "#wrong", ...]), ("ip", [...])]
        self.timestamp = timestamp    # a trailing -S timestamp column
        self.width = len(keys) + sum(len(cols) for _, cols in variants)
        self.key_at = {k: i for i, k in enumerate(keys)}
        # the field counts its rows have: one fewer where hypercube's empty redop prints no field
        self.row_widths = (self.width, self.width - 1) if "redop" in keys and "root" in keys else (self.width,)
        # per variant: (attribute, first field, the column names, the #wrong column's name or None)
        self.spans, at = [], len(keys)
        for name, cols in variants:
            self.spans.append((name, at, cols, next((c for c in cols if c in _WRONG), None)))
            at += len(cols)


def _layout(header, ip_first):
    names = header.lstrip("#").split()
    keys = []
    i = 0
    while i < len(names) and names[i].lower() in _KEY_COLUMNS:
        keys.append(_KEY_COLUMNS[names[i].lower()])
        i += 1
    if "size" not in keys or i >= len(names) or names[i].lower() not in _TIME:
        return None
    groups, cur = [], None
    timestamp = False
    for name in names[i:]:
        low = name.lower()
        if low in _TIME:
            cur = []
            groups.append(cur)
        if low == "timestamp":
            timestamp = True
            continue
        cur.append(low)
    if not groups or len(groups) > 2 or any(g[:3] != [g[0], "algbw", "busbw"] for g in groups):
        return None
    order = ["ip", "oop"] if ip_first else ["oop", "ip"]
    # 2017-2018 (until "Resync all tests with test code from NCCL 2.4", 2019-03) headed its sizes
    # `bytes N` and printed times in milliseconds (%7.3f of deltaSec * 1.0E3)
    scale = 1000.0 if names[0].lower() == "bytes" else 1.0
    return _Layout(keys, list(zip(order, groups)), timestamp, scale)


_MODERN = _layout("#  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong",
                  ip_first=False)
# rows met without their header (an excerpt that starts below it, or a paste that lost it): the
# layout their shape tells, by field count and whether the fourth field is a reduction's name
_HEADERLESS = {
    13: _MODERN,     # 2.13+ (and reduce before it: size count type redop root)
    12: _layout("# size count type redop time algbw busbw error time algbw busbw error", ip_first=False),
    "12root": _layout("# size count type root time algbw busbw error time algbw busbw error", ip_first=False),
    11: _layout("# size count type time algbw busbw error time algbw busbw error", ip_first=False),
}


def _headerless_layout(fields):
    """The layout a header-less row's shape tells, or None."""
    n = len(fields)
    if n == 12:
        return _HEADERLESS["12root" if _WHOLE.fullmatch(fields[3]) else 12]
    return _HEADERLESS.get(n)


def nccl_version_of_code(code):
    """NCCL_VERSION_CODE as text: 22803 -> '2.28.3' (2.9 and later), 2708 -> '2.7.8' (before)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _number(text, what):
    return finite_nonnegative(text, what, shown=20)


_WHOLE = re.compile(r"-?\d{1,19}")
_TYPE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


def _integer(text, what, lo=0):
    if not (text.isdigit() and len(text) <= 19) and not _WHOLE.fullmatch(text):
        raise ValueError(f"{what} {text[:20]!r} is not a whole number")
    v = int(text)
    if v < lo:
        raise ValueError(f"{what} {v} is below {lo}")
    return v


def _variant(cols, fields, wrong_name):
    wrong = None
    if wrong_name is not None:
        text = fields[cols.index(wrong_name)]
        if text != "N/A":
            wrong = _number(text, wrong_name)
    v = Variant(_number(fields[0], "time"), _number(fields[1], "algbw"), _number(fields[2], "busbw"),
                wrong, _WRONG.get(wrong_name, "count"))
    if len(cols) > 4:
        for col, attr in (("i_min", "i_min_us"), ("i_max", "i_max_us"), ("i_p99", "i_p99_us")):
            if col in cols:
                setattr(v, attr, _number(fields[cols.index(col)], col))
    return v


def _row(layout, fields, lineno):
    width, at = layout.width, layout.key_at
    if layout.timestamp and len(fields) > width:
        fields = fields[:width]        # the timestamp is date and time: its own fields
    if len(fields) == width - 1 and "redop" in at and "root" in at:
        i = at["redop"]
        if _WHOLE.fullmatch(fields[i]):
            fields = fields[:i] + [""] + fields[i:]   # hypercube prints its redop as "": no field
    if len(fields) != width:
        raise ValueError(f"{len(fields)} fields, the table header has {width}")
    row = Row(size=_integer(fields[at["size"]], "size"),
              count=_integer(fields[at["count"]], "count") if "count" in at else 0,
              type=fields[at["type"]] if "type" in at else "", line=lineno)
    if "type" in at and not _TYPE_NAME.fullmatch(row.type):
        raise ValueError(f"type {row.type[:20]!r} is not a datatype name")
    if "redop" in at:
        row.redop = fields[at["redop"]]
    if "root" in at:
        row.root = _integer(fields[at["root"]], "root", lo=-1)
    for name, start, cols, wrong_name in layout.spans:
        v = _variant(cols, fields[start:start + len(cols)], wrong_name)
        if layout.time_scale != 1.0:
            v.time_us *= layout.time_scale
        setattr(row, name, v)
    return row


def _params(line):
    out = {}
    for k, v in _PARAM_PAIR.findall(line.lstrip("#")):
        out["".join(k.split()).lower()] = int(v)
    return out


def _first_match(table, line):
    """(match, what goes with its pattern) of the first pattern in table matching line, or None."""
    for rx, what in table:
        m = rx.match(line)
        if m:
            return m, what
    return None


def _strip_prefix(line):
    if "]<std" in line:
        line = _TAG.sub("", line)
    m = _PREFIX.match(line)
    return line[m.end():] if m else line


def parse_text(text):
    """Every run in a text output (a file may hold several, one after another): [Output]."""
    return parse_text_lines(text.splitlines())


_SETUP_FIELDS = ("version", "nccl_version", "params", "devices")


def _next_output(outputs, inherit=False):
    """A new Output after the current one; inherit: a table with no setup lines of its own (a
    second table pasted below the first) takes the devices and parameters of the run before."""
    prev = outputs[-1]
    out = Output()
    if inherit:
        out.version, out.nccl_version = prev.version, prev.nccl_version
        out.params, out.devices = dict(prev.params), list(prev.devices)
        out.setup_from_previous = bool(prev.devices or prev.params)
    outputs.append(out)
    return out


def parse_text_lines(lines):
    """Every run in the lines of a text output (any iterable of str, read one at a time: a file of
    millions of rows is never held whole; at most MAX_ROWS rows kept per run, the rest counted)."""
    outputs = [Output()]
    layout = None
    ip_first = False
    pending_test = None     # a command line or banner naming the next run's test
    for lineno, raw in enumerate(lines, 1):
        out = outputs[-1]
        if len(raw) > MAX_LINE_CHARS:
            out.bad_line(lineno, f"line of more than {MAX_LINE_CHARS} characters")
            continue
        if "\0" in raw:
            raw = raw.replace("\0", "")
        line = _strip_prefix(raw).rstrip()
        if not line.strip():
            continue
        row_error = None
        if _NUMBER_START.match(line):       # most lines of a big output: tried first
            fields = line.split()
            if layout is None or (out.rows and len(fields) not in layout.row_widths and not layout.timestamp):
                # rows without their header: an excerpt that starts below it, or a paste that lost
                # it; a row of another shape below a table is another run (a second test's table)
                guess = _headerless_layout(fields)
                try:
                    first = _row(guess, fields, lineno) if guess is not None else None
                except ValueError:
                    first = None          # not a row at all (a log line that starts with a digit)
                if first is not None:
                    if layout is not None:
                        out = _next_output(outputs, inherit=True)
                        if pending_test:
                            out.command_test, pending_test = pending_test, None
                    layout = guess
                    out.columns = tuple(layout.keys)
                    out.rows.append(first)
                    continue
            if layout is None:
                row_error = "a table row before any table header"
            elif len(out.rows) >= MAX_ROWS and len(fields) >= layout.width - 1:
                if not out.rows_dropped:    # said once; Output.rows_dropped counts them all
                    out.bad_line(lineno, f"more than {MAX_ROWS} rows in one run: this row and the rest "
                                         f"counted, not kept")
                out.rows_dropped += 1
                continue
            else:
                try:
                    out.rows.append(_row(layout, fields, lineno))
                    continue
                except ValueError as e:
                    row_error = str(e)    # unless the line is something else that starts with a digit
        m = _NCCL_LOG.search(line)
        if m:
            if m.group(1) in ("WARN", "ABORT") and len(out.warnings) < 20:
                out.warnings.append(m.group(2).strip()[:300])
            continue
        m = _STARTING.match(line)
        if m:
            if not out.empty:
                out = _next_output(outputs)
                layout = None
            out.test = m.group(1)[:100]
            pending_test = None
            continue
        m = _PARAMS.match(line)
        if m:
            if out.rows or out.failures:
                out = _next_output(outputs)
                layout = None
            if pending_test and not out.test:
                out.command_test, pending_test = pending_test, None
            out.params.update(_params(line))
            continue
        m = _TESTS_VERSION.match(line)
        if m and m.group(2):   # nccl-library=22803: the NCCL the binary ran with
            code = int(m.group(2))
            out.nccl_version = out.nccl_version or nccl_version_of_code(code)
        found = _first_match(_VERSION_LINES, line)
        if found:
            setattr(out, found[1], found[0].group(1)[:100])
            continue
        m = _CONCLUDED.match(line)
        if m:
            out.concluded = True
            out.test = out.test or m.group(1)[:100]
            continue
        m = _DEVICE.match(line)
        if m:
            if out.rows or out.failures:         # the device lines of the next run
                out = _next_output(outputs)
                layout = None
            if out.setup_from_previous:
                out.devices, out.setup_from_previous = [], False
            out.devices.append(Device(rank=int(m.group(1)), group=int(m.group(2)) if m.group(2) else None,
                                      pid=int(m.group(3)) if m.group(3) else None, host=m.group(4),
                                      device=int(m.group(5)), bus_id=m.group(6), name=m.group(7)[:200]))
            continue
        if _RCCL_FOOTER.match(line):
            out.rccl = True
            continue
        m = _OOB.match(line)
        if m:
            out.out_of_bounds = int(m.group(1)[:19])
            continue
        m = _AVG.match(line)
        if m:
            try:
                out.avg_busbw = float(m.group(1))
            except ValueError:
                out.bad_line(lineno, "Avg bus bandwidth is not a number")
            continue
        found = _first_match(_FAILURE_LINES, line.strip())
        if found:
            out.failures.append(found[1](found[0], lineno))
            continue
        stripped = line.lstrip()
        if (stripped.startswith("#") or _BARE_HEADER.match(stripped)) and not _COMMAND.search(stripped):
            low = stripped.lower()
            if "out-of-place" in low and "in-place" in low:
                ip_first = low.index("in-place") < low.index("out-of-place")
            elif "algbw" in low and "busbw" in low:
                new = _layout(stripped, ip_first)
                if new is None:
                    out.bad_line(lineno, "a table header with columns this reader does not know")
                elif out.rows or out.failures:
                    # a second table below the first: another run (its own test, same setup unless it says)
                    out = _next_output(outputs, inherit=True)
                if pending_test and not out.test and not out.command_test:
                    out.command_test, pending_test = pending_test, None
                layout = new
                if new is not None:
                    out.columns = tuple(new.keys)
                ip_first = False
            continue
        if row_error:
            out.bad_line(lineno, row_error)
            continue
        m = _COMMAND.search(line)
        if m:
            if out.rows or out.failures:
                pending_test = m.group(1)          # names the run that follows
            elif out.command_test is None:
                out.command_test = m.group(1)
        # anything else (MPI banners, "Authorization required", a shell prompt) is not ours
    return [o for o in outputs if not o.empty] or [outputs[0]]


# ------------------------------------------------------------------ nccl-tests -J (2.19+)

def _num_or_none(v, what):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        if v == "nan":
            raise ValueError(f"{what} is nan")
        raise ValueError(f"{what}: expected a number, got {type(v).__name__}")
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{what}: {v!r} is not a finite number >= 0")
    return float(v)


def _json_variant(obj, per_iter, what):
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ValueError(f"{what}: expected an object")
    t = obj.get("time", obj.get("cpu_time"))
    v = Variant(_num_or_none(t, f"{what}.time"), _num_or_none(obj.get("alg_bw"), f"{what}.alg_bw"),
                _num_or_none(obj.get("bus_bw"), f"{what}.bus_bw"),
                _num_or_none(obj.get("nwrong"), f"{what}.nwrong"))
    if v.time_us is None or v.algbw_gbs is None or v.busbw_gbs is None:
        raise ValueError(f"{what}: time, alg_bw and bus_bw are required")
    if isinstance(per_iter, dict):
        v.i_min_us = _num_or_none(per_iter.get("min_us"), f"{what}_per_iter.min_us")
        v.i_max_us = _num_or_none(per_iter.get("max_us"), f"{what}_per_iter.max_us")
        v.i_p99_us = _num_or_none(per_iter.get("p99_us"), f"{what}_per_iter.p99_us")
    return v


def parse_json(text):
    """nccl-tests' -J file: one JSON object (version, args, config with devices, results...)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise NcclTestsError(f"not JSON: {str(e)[:120]}") from None
    if not isinstance(doc, dict) or "results" not in doc and "config" not in doc:
        raise NcclTestsError("not a nccl-tests -J file (no 'config' or 'results' key)")
    out = Output(form="json")
    args = doc.get("args")
    if isinstance(args, list) and args and isinstance(args[0], str):
        out.test = args[0].rsplit("/", 1)[-1][:100]
    nv = doc.get("nccl_version")
    if isinstance(nv, int) and not isinstance(nv, bool):
        out.nccl_version = nccl_version_of_code(nv) if 1000 <= nv < 10**6 else None
    cfg = doc.get("config")
    if isinstance(cfg, dict):
        for key, name in (("nthreads", "nthread"), ("ngpus", "ngpus"), ("warmup_iters", "warmupiters"),
                          ("iterations", "iters"), ("validation", "validation"),
                          ("minimum_bytes", "minbytes"), ("maximum_bytes", "maxbytes")):
            v = cfg.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                out.params[name] = v
        devices = cfg.get("devices")
        if isinstance(devices, list):
            for i, d in enumerate(devices[:65536]):
                try:
                    if not isinstance(d, dict):
                        raise ValueError("not an object")
                    rank, dev, host = d.get("rank"), d.get("device"), d.get("hostname")
                    if not (isinstance(rank, int) and isinstance(dev, int) and isinstance(host, str) and host):
                        raise ValueError("rank, device and hostname are required")
                    out.devices.append(Device(rank=rank, host=host[:256], device=dev,
                                              pid=d.get("pid") if isinstance(d.get("pid"), int) else None,
                                              group=d.get("group") if isinstance(d.get("group"), int) else None,
                                              bus_id=str(d.get("device_hex", ""))[:64],
                                              name=str(d.get("device_info", ""))[:200]))
                except ValueError as e:
                    out.bad_line(0, f"config.devices[{i}]: {e}")
    results = doc.get("results")
    if results is not None and not isinstance(results, list):
        raise NcclTestsError("results: expected a list")
    for i, r in enumerate((results or [])[:MAX_ROWS]):
        try:
            if not isinstance(r, dict):
                raise ValueError("not an object")
            size, count = r.get("size"), r.get("count")
            if not (isinstance(size, int) and isinstance(count, int)) or size < 0 or count < 0:
                raise ValueError("size and count must be whole numbers >= 0")
            typ = r.get("type")
            if not isinstance(typ, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,31}", typ):
                raise ValueError("type is not a datatype name")
            root = r.get("root")
            root = int(root.strip()) if isinstance(root, str) and re.fullmatch(r"\s*-?\d{1,10}", root) else None
            redop = r.get("redop") if isinstance(r.get("redop"), str) else None
            out.rows.append(Row(size=size, count=count, type=typ, redop=redop, root=root,
                                oop=_json_variant(r.get("out_of_place"), r.get("out_of_place_per_iter"),
                                                  "out_of_place"),
                                ip=_json_variant(r.get("in_place"), r.get("in_place_per_iter"), "in_place"),
                                line=i))
        except ValueError as e:
            out.bad_line(i, f"results[{i}]: {e}")
    oob = doc.get("out_of_bounds")
    if isinstance(oob, dict) and isinstance(oob.get("count"), int):
        out.out_of_bounds = oob["count"]
    avg = doc.get("average_bus_bandwidth")
    if isinstance(avg, dict) and isinstance(avg.get("bandwidth"), (int, float)):
        out.avg_busbw = float(avg["bandwidth"])
    errors = doc.get("errors")
    if isinstance(errors, list):
        for e in errors[:20]:
            if isinstance(e, str) and e.strip():
                out.failures.append(Failure(e.strip()[:500], "NCCL"))
    out.concluded = "end_time" in doc
    return [out]


# ------------------------------------------------------------------ rccl-tests -Z json|csv

_RCCL_NAMES = {"allreduce": "all_reduce_perf", "allgather": "all_gather_perf", "broadcast": "broadcast_perf",
               "reduce": "reduce_perf", "reducescatter": "reduce_scatter_perf", "alltoall": "alltoall_perf"}


def _rccl_records(objs, form):
    """rccl-tests' result objects (one per size and variant) grouped into Outputs by test name."""
    outs = {}
    rows = {}
    for i, o in enumerate(objs[:MAX_ROWS * 2]):
        name = o.get("name") if isinstance(o, dict) else None
        key = name if isinstance(name, str) else None
        out = outs.get(key)
        if out is None:
            out = outs[key] = Output(form=form)
            if key:
                out.test = _RCCL_NAMES.get(key.lower().replace("_", ""), key[:100])
        try:
            if not isinstance(o, dict):
                raise ValueError("not an object")
            size = o.get("size")
            size = int(size) if isinstance(size, str) and size.isdigit() else size
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError("size must be a whole number >= 0")
            typ = o.get("type")
            if not isinstance(typ, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,31}", typ):
                raise ValueError("type is not a datatype name")
            wrong = o.get("#wrong")
            wrong = None if wrong in (None, "N/A", "") else _number(str(wrong), "#wrong")
            v = Variant(_number(str(o.get("time")), "time"), _number(str(o.get("algBw")), "algBw"),
                        _number(str(o.get("busBw")), "busBw"), wrong)
            inplace = str(o.get("inPlace")) in ("1", "True", "true")
            redop = o.get("redop") if isinstance(o.get("redop"), str) else None
            rk = (key, size, typ, redop)
            row = rows.get(rk)
            if row is None:
                row = rows[rk] = Row(size=size, count=0, type=typ, redop=redop, line=i + 1)
                out.rows.append(row)
            setattr(row, "ip" if inplace else "oop", v)
            gpus = o.get("gpus")
            gpus = int(gpus) if isinstance(gpus, str) and gpus.isdigit() else gpus
            if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0:
                out.ranks_hint = gpus
        except (ValueError, TypeError) as e:
            out.bad_line(i + 1, str(e))
    return list(outs.values())


def parse_rccl_json(text):
    text = text.strip()
    objs = []
    if text.startswith("["):
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise NcclTestsError(f"not JSON: {str(e)[:120]}") from None
        if not isinstance(doc, list):
            raise NcclTestsError("expected a JSON list of results")
        objs = doc
    else:
        bad = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip().rstrip(",")
            if not line:
                continue
            try:
                objs.append(json.loads(line))
            except (ValueError, RecursionError):
                bad.append(n)
        if bad and not objs:
            raise NcclTestsError(f"not JSON lines (line {bad[0]})")
        outs = _rccl_records(objs, "rccl-json")
        for n in bad:
            outs[0].bad_line(n, "not a JSON object")
        return outs
    return _rccl_records(objs, "rccl-json")


def parse_rccl_csv(text):
    try:
        reader = csv.DictReader(text.splitlines())
        if not reader.fieldnames or "busBw" not in [f.strip() for f in reader.fieldnames]:
            raise NcclTestsError("not an rccl-tests CSV (no busBw column in the header)")
        objs = [{(k or "").strip(): (v.strip() if isinstance(v, str) else v) for k, v in r.items()}
                for _, r in zip(range(MAX_ROWS * 2), reader)]
    except csv.Error as e:
        raise NcclTestsError(f"not a CSV file: {str(e)[:120]}") from None
    for o in objs:
        for k in ("time", "algBw", "busBw"):
            if isinstance(o.get(k), str):
                try:
                    o[k] = float(o[k])
                except ValueError:
                    pass
    return _rccl_records(objs, "rccl-csv")


# ------------------------------------------------------------------ any form

def detect_form(text):
    head = text.lstrip()[:4096]
    if head.startswith("{") and '"results"' in text[:1 << 20] and ('"nccl_version"' in text or '"config"' in text):
        return "json"
    if head.startswith(("{", "[")) and ('"busBw"' in head or '"algBw"' in head):
        return "rccl-json"
    first = head.splitlines()[0] if head else ""
    if "busBw" in first and "," in first:
        return "rccl-csv"
    return "text"


def parse(data):
    """Every run in one nccl-tests/rccl-tests output (bytes or str), in any form: [Output]."""
    if isinstance(data, (bytes, bytearray)):
        if len(data) > MAX_INPUT_BYTES:
            raise NcclTestsError(f"{len(data)} bytes (at most {MAX_INPUT_BYTES})")
        text = bytes(data).decode("utf-8", errors="replace")
    else:
        text = data
        if len(text) > MAX_INPUT_BYTES:
            raise NcclTestsError(f"{len(text)} characters (at most {MAX_INPUT_BYTES})")
    text = text.replace("\x00", "")
    form = detect_form(text)
    if form == "json":
        return parse_json(text)
    if form == "rccl-json":
        return parse_rccl_json(text)
    if form == "rccl-csv":
        return parse_rccl_csv(text)
    return _checked(parse_text(text))


def _checked(outs):
    if not any(o.rows or o.failures or o.devices or o.params for o in outs):
        raise NcclTestsError("no nccl-tests output in it (no parameter line, device line, table or failure)")
    return outs


def parse_lines(lines):
    """parse() for an output read line by line (collbench.bounded_file.iter_lines_limited, which
    bounds its size): the text form is parsed as it is read, never held whole; the structured
    forms (-J, -Z json|csv: one document) are joined first."""
    it = iter(lines)
    head = []
    for line in it:
        head.append(line)
        if line.strip():
            break
    first = head[-1].lstrip() if head else ""
    if first.startswith(("{", "[")) or ("busBw" in first and "," in first):
        return parse("\n".join(itertools.chain(head, it)))
    return _checked(parse_text_lines(itertools.chain(head, it)))
