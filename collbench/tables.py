"""Every `--format table|csv|json` output: one renderer and one set of value formatters.

A table is a list of `Column`s and a list of rows (dicts by column key). `render` turns it into
aligned text (`table`), CSV, JSON or a Markdown table; `table_lines` gives the aligned text as
lines for a verb that puts titles and notes around it. A `Span` row (a FAILED or NOT RUN step)
shows its first columns and then one text across the rest.

Formatters, one per unit: `format_us` (a latency in microseconds, the unit chosen per value),
`format_gb_per_s` (bytes per second shown as GB/s, 10^9 bytes/s as nccl-tests), `format_size`
(an exact size label, 4MB / 1000B), `format_bytes` (a rounded amount, 28.2MB) and
`format_duration` (45s / 3m05s / 2h00m / 1d03h: ages, uptimes and time left).
"""

import csv
import io
import json
from dataclasses import dataclass
from typing import Callable, Optional

from collbench.sizes import format_size

__all__ = ["Column", "Span", "render", "table_lines", "csv_text", "json_text", "markdown_lines",
           "format_us", "format_gb_per_s", "format_size", "format_bytes", "format_duration", "cell_text"]

FORMATS = ("table", "csv", "json")


@dataclass(frozen=True)
class Column:
    """One column: the row key it shows, its heading, "right" or "left" alignment, fmt(value) -> text
    for the text table (default: str(value), None as an empty cell), and its least width."""
    key: str
    title: Optional[str] = None
    align: str = "right"
    fmt: Optional[Callable] = None
    width: int = 0

    @property
    def heading(self):
        return self.key if self.title is None else self.title

    def text(self, row):
        value = row.get(self.key) if isinstance(row, dict) else None
        if self.fmt is not None:
            return str(self.fmt(value))
        return "" if value is None else str(value)


@dataclass(frozen=True)
class Span:
    """A row that shows its first `lead` columns (from `values`) and then `text` across the rest."""
    values: dict
    text: str
    lead: int = 1


def cell_text(value):
    """A value as a CSV/TSV cell: None empty, booleans true/false, lists comma-joined, floats to 9
    digits, whitespace runs (tabs, newlines) as one space."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, float):
        return f"{value:.9g}"
    return " ".join(str(value).split())   # a cell never holds a tab or a newline (errors can)


def table_lines(columns, rows, indent="", rule=True, sep="  ", heading=True):
    """Aligned text lines: the heading (heading=True), a rule of dashes (rule=True), one line per row.

    Widths fit the heading and every cell (and each column's least width); a Span row widens
    only its lead columns. Lines carry no trailing spaces.
    """
    columns = list(columns)
    cells = []
    for row in rows:
        if isinstance(row, Span):
            cells.append(([c.text(row.values) for c in columns[:row.lead]], str(row.text)))
        else:
            cells.append(([c.text(row) for c in columns], None))
    widths = [max(c.width, len(c.heading) if heading else 0) for c in columns]
    for texts, _ in cells:
        for i, t in enumerate(texts):
            widths[i] = max(widths[i], len(t))

    def line(texts, span=None):
        parts = [t.ljust(w) if c.align == "left" else t.rjust(w) for c, w, t in zip(columns, widths, texts)]
        if span is not None:
            parts.append(span)
        return (indent + sep.join(parts)).rstrip()

    out = [line([c.heading for c in columns])] if heading else []
    if rule:
        out.append(indent + sep.join("-" * w for w in widths))
    out += [line(texts, span) for texts, span in cells]
    return out


def csv_text(columns, rows, cell=cell_text):
    """CSV with the column keys as header; Span rows are left out (their steps have no values)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.key for c in columns])
    for row in rows:
        if not isinstance(row, Span):
            w.writerow([cell(row.get(c.key)) for c in columns])
    return buf.getvalue()


def json_text(columns, rows):
    """A JSON list of objects by column key, typed values; Span rows are left out."""
    return json.dumps([{c.key: row.get(c.key) for c in columns} for row in rows if not isinstance(row, Span)],
                      indent=1, ensure_ascii=False) + "\n"


def _md_cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_lines(columns, rows):
    """A Markdown (GitHub) table: every cell padded to its column's width, pipes escaped."""
    heads = [_md_cell(c.heading) for c in columns]
    body = [[_md_cell(c.text(r)) for c in columns] for r in rows if not isinstance(r, Span)]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(heads)]

    def line(texts):
        # Markdown aligns by its own rule line; the source stays left-padded, as GitHub renders it
        return "| " + " | ".join(t.ljust(w) for t, w in zip(texts, widths)) + " |"
    return [line(heads), "| " + " | ".join("-" * w for w in widths) + " |"] + [line(r) for r in body]


def render(columns, rows, fmt="table", out=None, *, indent="", rule=True, title=None):
    """The table as text in `fmt` ("table", "csv", "json" or "markdown"); written to `out` too when given.

    title: a line above a text table (table format only).
    """
    columns = list(columns)
    rows = list(rows)
    if fmt == "csv":
        text = csv_text(columns, rows)
    elif fmt == "json":
        text = json_text(columns, rows)
    elif fmt == "markdown":
        text = "\n".join(markdown_lines(columns, rows)) + "\n"
    elif fmt == "table":
        text = "\n".join(([title] if title else []) + table_lines(columns, rows, indent=indent, rule=rule)) + "\n"
    else:
        raise ValueError(f"unknown table format {fmt!r} (expected table, csv, json or markdown)")
    if out is not None:
        out.write(text)
    return text


# ------------------------------------------------------------------ value formatters

def format_us(us, digits=2, scaled_digits=None, missing="-", significant=None, micro="us"):
    """A latency given in microseconds with its unit chosen per value: 12.34 us / 5.87 ms / 1.20 s.

    digits: decimals shown; scaled_digits: decimals for ms and s (default: digits).
    significant=N: N significant digits instead, and ns below 1 us (chart ticks: 250 µs, 1.5 ms);
    micro: the microsecond unit's name ("us" in text tables, "µs" in figures).
    """
    if us is None:
        return missing
    if significant is not None:
        if us >= 1e6:
            return f"{us / 1e6:.{significant}g} s"
        if us >= 1e3:
            return f"{us / 1e3:.{significant}g} ms"
        if us >= 1:
            return f"{us:.{significant}g} {micro}"
        return f"{us * 1e3:.{significant}g} ns"
    big = digits if scaled_digits is None else scaled_digits
    if us < 1000:
        return f"{us:.{digits}f} {micro}"
    if us < 1e6:
        return f"{us / 1e3:.{big}f} ms"
    if us >= 1e12:      # past 11 days: a hopeless but finite value (1e308) in a few characters
        return f"{us / 1e6:.3g} s"
    return f"{us / 1e6:.{big}f} s"


def format_gb_per_s(bytes_per_s, significant=None, missing="-"):
    """Bytes per second shown as GB/s (10^9 B/s), without the unit.

    Default: two decimals, four below 0.1 GB/s; significant=N: N significant digits.
    """
    if bytes_per_s is None:
        return missing
    gb = bytes_per_s / 1e9
    if significant is not None:
        return f"{gb:.{significant}g}"
    return f"{gb:.2f}" if gb >= 0.1 else f"{gb:.4f}"


_BYTE_UNITS = (("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10))


def format_bytes(n):
    """An amount of bytes in binary units, as the rest of collbench (1MB = 1048576 B): 512MB when
    exact, 28.2MB otherwise."""
    for unit, mult in _BYTE_UNITS:
        if n >= mult:
            return f"{n // mult}{unit}" if n % mult == 0 else f"{n / mult:.1f}{unit}"
    return f"{n}B"


def format_duration(seconds, days=True, missing="?"):
    """45s / 3m05s / 2h00m / 1d03h, rounded to the second: ages and uptimes in every console table,
    and the time left of progress lines (days=False: 25h00m, as a countdown reads). None: missing."""
    if seconds is None:
        return missing
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400 or not days:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
