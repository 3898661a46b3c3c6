"""Parse the stdout of OSU Micro-Benchmarks collective latency tests (5.x and 7.x).

Every form the collective benchmarks print (read from OSU's c/util/osu_util_mpi.c and
osu_util.c): a preamble line `# OSU MPI[-CUDA] <Title> Latency Test[ v<version>]`, in 7.x one
`# Datatype: MPI_<T>.` line per datatype (`-T all` gives several blocks), a column header
(`# Size  Avg Latency(us)`, or `# Avg Latency(us)` for barrier), optional `Min Latency(us)`,
`Max Latency(us)`, `Iterations` (`-f`), `Validation` (`-c`, Pass/Fail), `P<n> Tail Lat(us)`
(`-z`), `Transmit Size` (`-D`), then one row per message size. A validation failure ends the
output with `DATA VALIDATION ERROR: ...`. Usage/help text, or output with no result rows, is
an OsuOutputError carrying the text, so the caller can show what OSU said.
"""

import math
import re
from dataclasses import dataclass, field

MAX_LINE_CHARS = 8192      # a row is < 200 characters; a longer line is not one (counted when not strict)
MAX_BAD_KEPT = 50          # bad rows kept verbatim when counting (all of them are counted)
MAX_IGNORED_KEPT = 1000

# OSU's preamble: printf("# " BENCHMARK " v" PACKAGE_VERSION) with BENCHMARK "OSU MPI%s <title>"
_TITLE_RE = re.compile(r"^# OSU MPI(?P<variant>-[A-Z]+(?: MANAGED)?)? (?P<title>.+?)"
                       r"(?: v(?P<version>\d+(?:\.\d+)*[A-Za-z0-9.-]*))?\s*$")
_DATATYPE_RE = re.compile(r"^# Datatype: (?P<dt>\S+?)\.?\s*$")
_VALIDATION_ERROR_RE = re.compile(r"^DATA VALIDATION ERROR: .*?(?:message size (?P<size>\d+))?\.?\s*$")
_USAGE_RE = re.compile(r"^(Usage: \S+|Options:\s*$|\s+-[a-zA-Z], --[a-z-]+)")
_TAIL_RE = re.compile(r"^P(?P<pct>\d+) Tail Lat\(us\)$")
# mpirun --tag-output prefixes every line with "[jobid,rank]<stdout>:"
_TAG_RE = re.compile(r"^\[\d+,\d+\]<stdout>:")

# Column header text -> the field a row value fills. Anything else is kept by name only.
_COLUMNS = {
    "Size": "size_bytes",
    "Avg Latency(us)": "avg_us",
    "Min Latency(us)": "min_us",
    "Max Latency(us)": "max_us",
    "Iterations": "iterations",
    "Validation": "validation",
    "Transmit Size": "transmit_size",
}
_INT_FIELDS = ("size_bytes", "iterations", "transmit_size")

# OSU's benchmark titles (its BENCHMARK macros) -> our op names. These are OSU's spellings,
# not properties of an op, so they live with the parser of OSU's text.
OSU_TITLES = {
    "Allreduce Latency Test": "allreduce",
    "Broadcast Latency Test": "bcast",
    "Reduce Latency Test": "reduce",
    "Allgather Latency Test": "allgather",
    "All-to-All Personalized Exchange Latency Test": "alltoall",
    "Reduce_scatter Latency Test": "reduce_scatter",
    "Barrier Latency Test": "barrier",
}


class OsuOutputError(ValueError):
    """OSU printed something that is not a result table (usage text, an error, nothing)."""

    def __init__(self, message, text=""):
        super().__init__(message)
        self.text = text


@dataclass
class OsuRow:
    size_bytes: int = None          # None for barrier (no size column)
    avg_us: float = None
    min_us: float = None            # with -f
    max_us: float = None            # with -f
    iterations: int = None          # with -f
    validation: str = None          # "pass" / "fail" with -c, else None
    tail_us: dict = field(default_factory=dict)   # {50: P50 us, ...} with -z
    values: dict = field(default_factory=dict)    # every column by its header text (raw strings)


@dataclass
class OsuBlock:
    benchmark: str                  # OSU's title, e.g. "Allreduce Latency Test"
    op: str                         # our op name for it, or None for a benchmark we do not know
    version: str                    # "7.4", "5.6.3", or None when the header has none
    variant: str                    # "" or the accelerator suffix ("-CUDA", ...)
    datatype: str                   # "MPI_FLOAT", or None (5.x prints none; it is MPI_CHAR)
    columns: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    row_count: int = 0              # rows read (also when a streaming reader does not keep them)

    def row_for(self, size_bytes):
        """The row for a message size (barrier: its only row), or None."""
        for row in self.rows:
            if row.size_bytes is None or row.size_bytes == size_bytes:
                return row
        return None


@dataclass
class OsuOutput:
    blocks: list
    validation_error: str = None    # OSU's "DATA VALIDATION ERROR: ..." line
    ignored: list = field(default_factory=list)   # lines that were not part of a table (the first 1000)
    bad_lines: int = 0              # rows that could not be read (OsuReader(strict=False) only)
    bad: list = field(default_factory=list)       # (line number, why) of the first MAX_BAD_KEPT

    def block(self, datatype=None):
        """The block for an MPI datatype name ("MPI_FLOAT"); a 5.x block (no datatype) matches any."""
        for b in self.blocks:
            if datatype is None or b.datatype is None or b.datatype.upper() == datatype.upper():
                return b
        return None


def parse_columns(header_line):
    """'# Size   Avg Latency(us)  ...' -> ['Size', 'Avg Latency(us)', ...]."""
    body = header_line.lstrip("#").strip()
    # OSU pads columns with printf widths; column names themselves hold single spaces only.
    return [c for c in re.split(r"\s{2,}", body) if c]


def _is_column_header(line):
    return line.startswith("#") and ("Latency(us)" in line or line.lstrip("# ").startswith("Size"))


def _parse_row(line, columns, lineno, text):
    tokens = line.split()
    if len(tokens) != len(columns):
        raise OsuOutputError(f"line {lineno}: {len(tokens)} values under {len(columns)} columns "
                             f"({', '.join(columns)}): {line.strip()[:200]!r}", text)
    row = OsuRow()
    for name, tok in zip(columns, tokens):
        row.values[name] = tok
        tail = _TAIL_RE.match(name)
        attr = _COLUMNS.get(name)
        try:
            if tail:
                row.tail_us[int(tail.group("pct"))] = _finite(tok)
            elif attr == "validation":
                if tok not in ("Pass", "Fail"):
                    raise ValueError(tok)
                row.validation = tok.lower()
            elif attr in _INT_FIELDS:
                if not re.fullmatch(r"\d{1,19}", tok):
                    raise ValueError(tok)
                setattr(row, attr, int(tok))
            elif attr is not None:
                setattr(row, attr, _finite(tok))
        except ValueError:
            raise OsuOutputError(f"line {lineno}: {tok[:40]!r} is not a valid {name!r} value"
                                 + (" (a finite number >= 0)" if attr not in ("validation",) else "")
                                 + f": {line.strip()[:200]!r}", text) from None
    return row


def _finite(tok):
    """A latency or tail as OSU prints it (%.2f): finite and >= 0; nan, inf, 1e999 and a
    60-million-digit number are not (float() would make the last two inf)."""
    if len(tok) > 40:
        raise ValueError(tok)
    v = float(tok)
    if not math.isfinite(v) or v < 0:
        raise ValueError(tok)
    return v


class OsuReader:
    """OSU's stdout read one line at a time (parse_output's reading, for outputs of millions of
    rows): feed() returns the OsuRow a line holds, or None; `current` is the block it belongs to.
    strict: a row that does not fit its header raises OsuOutputError (an engine run: OSU's own
    output must be whole); otherwise it is counted in bad_lines with its line number and why.
    keep_rows: also keep each row in its block (parse_output); a streaming caller keeps none."""

    def __init__(self, strict=True, keep_rows=True, text=""):
        self.strict, self.keep_rows, self.text = strict, keep_rows, text
        self.out = OsuOutput(blocks=[])
        self.title = None       # (benchmark, op, version, variant) of the current preamble
        self.datatype = None
        self.current = None     # the block receiving rows
        self.usage_lines = []

    def _bad(self, lineno, why):
        if self.strict:
            raise OsuOutputError(why, self.text)
        self.out.bad_lines += 1
        if len(self.out.bad) < MAX_BAD_KEPT:
            self.out.bad.append((lineno, why.split(": ", 1)[1] if why.startswith("line ") else why))

    def feed(self, lineno, raw):
        if len(raw) > MAX_LINE_CHARS:
            self._bad(lineno, f"line {lineno}: more than {MAX_LINE_CHARS} characters")
            return None
        line = _TAG_RE.sub("", raw).rstrip()
        if not line.strip():
            return None
        if self.current is not None and line[:1] in "0123456789-. " and re.match(r"^\s*[-\d.]", line):
            try:
                row = _parse_row(line, self.current.columns, lineno, self.text)
            except OsuOutputError as e:
                self._bad(lineno, str(e))
                return None
            self.current.row_count += 1
            if self.keep_rows:
                self.current.rows.append(row)
            return row
        m = _TITLE_RE.match(line)
        if m:
            self.title = (m.group("title"), OSU_TITLES.get(m.group("title")), m.group("version"),
                          m.group("variant") or "")
            self.datatype, self.current = None, None
            return None
        m = _DATATYPE_RE.match(line)
        if m:
            self.datatype, self.current = m.group("dt"), None
            return None
        if _is_column_header(line):
            if self.title is None:
                raise OsuOutputError(f"line {lineno}: column header before any '# OSU MPI ...' "
                                     f"title: {line[:200]!r}", self.text)
            self.current = OsuBlock(benchmark=self.title[0], op=self.title[1], version=self.title[2],
                                    variant=self.title[3], datatype=self.datatype, columns=parse_columns(line))
            self.out.blocks.append(self.current)
            return None
        m = _VALIDATION_ERROR_RE.match(line)
        if m:
            self.out.validation_error = line.strip()
            return None
        if _USAGE_RE.match(line):
            self.usage_lines.append(line)
            return None
        if len(self.out.ignored) < MAX_IGNORED_KEPT:
            self.out.ignored.append(line)
        return None

    def finish(self):
        """The OsuOutput; OsuOutputError for usage text or no result rows."""
        if self.usage_lines:
            raise OsuOutputError("OSU printed its usage text instead of results (an option it does not "
                                 f"accept?): {self.usage_lines[0].strip()}", self.text)
        if not sum(b.row_count for b in self.out.blocks):
            what = "no '# OSU MPI ...' title" if self.title is None else f"no result rows under {self.title[0]!r}"
            if self.out.bad_lines:
                what += f" that could be read ({self.out.bad_lines} not: {self.out.bad[0][1]})"
            raise OsuOutputError(f"OSU output holds {what}", self.text)
        return self.out


def parse_output(text):
    """Parse one OSU collective benchmark's stdout into an OsuOutput.

    Raises OsuOutputError (with .text) for usage/help text, rows that do not fit their header
    (or hold a value that is not a finite number >= 0), or output holding no result rows at all.
    """
    reader = OsuReader(strict=True, keep_rows=True, text=text)
    for lineno, raw in enumerate(text.splitlines(), 1):
        reader.feed(lineno, raw)
    return reader.finish()
