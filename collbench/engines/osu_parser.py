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

import re
from dataclasses import dataclass, field

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
    ignored: list = field(default_factory=list)   # lines that were not part of a table

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
                             f"({', '.join(columns)}): {line.strip()!r}", text)
    row = OsuRow()
    for name, tok in zip(columns, tokens):
        row.values[name] = tok
        tail = _TAIL_RE.match(name)
        attr = _COLUMNS.get(name)
        try:
            if tail:
                row.tail_us[int(tail.group("pct"))] = float(tok)
            elif attr == "validation":
                if tok not in ("Pass", "Fail"):
                    raise ValueError(tok)
                row.validation = tok.lower()
            elif attr in _INT_FIELDS:
                setattr(row, attr, int(tok))
            elif attr is not None:
                setattr(row, attr, float(tok))
        except ValueError:
            raise OsuOutputError(f"line {lineno}: {tok!r} is not a valid {name!r} value: "
                                 f"{line.strip()!r}", text) from None
    return row


def parse_output(text):
    """Parse one OSU collective benchmark's stdout into an OsuOutput.

    Raises OsuOutputError (with .text) for usage/help text, rows that do not fit their header,
    or output holding no result rows at all.
    """
    blocks, ignored = [], []
    title = None            # (benchmark, op, version, variant) of the current preamble
    datatype = None
    current = None          # the block receiving rows
    validation_error = None
    usage_lines = []

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _TAG_RE.sub("", raw).rstrip()
        if not line.strip():
            continue
        m = _TITLE_RE.match(line)
        if m:
            title = (m.group("title"), OSU_TITLES.get(m.group("title")), m.group("version"),
                     m.group("variant") or "")
            datatype, current = None, None
            continue
        m = _DATATYPE_RE.match(line)
        if m:
            datatype, current = m.group("dt"), None
            continue
        if _is_column_header(line):
            if title is None:
                raise OsuOutputError(f"line {lineno}: column header before any '# OSU MPI ...' "
                                     f"title: {line!r}", text)
            current = OsuBlock(benchmark=title[0], op=title[1], version=title[2], variant=title[3],
                               datatype=datatype, columns=parse_columns(line))
            blocks.append(current)
            continue
        m = _VALIDATION_ERROR_RE.match(line)
        if m:
            validation_error = line.strip()
            continue
        if _USAGE_RE.match(line):
            usage_lines.append(line)
            continue
        if current is not None and re.match(r"^\s*[-\d.]", line):
            current.rows.append(_parse_row(line, current.columns, lineno, text))
            continue
        ignored.append(line)

    if usage_lines:
        raise OsuOutputError("OSU printed its usage text instead of results (an option it does not "
                             f"accept?): {usage_lines[0].strip()}", text)
    rows = sum(len(b.rows) for b in blocks)
    if not rows:
        what = "no '# OSU MPI ...' title" if title is None else f"no result rows under {title[0]!r}"
        raise OsuOutputError(f"OSU output holds {what}", text)
    return OsuOutput(blocks=blocks, validation_error=validation_error, ignored=ignored)
