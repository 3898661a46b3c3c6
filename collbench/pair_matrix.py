"""The pairwise matrix file: latency and/or bandwidth between every pair of ranks, with host names.

Two forms (docs/TOPO.md, "Matrix files"):

* CSV, one matrix per file. The header's first cell names the metric and its unit
  (`latency_us` or `bandwidth_GBps`), the other cells the labels; each row starts with its label
  (same order as the header) followed by the values. The diagonal is empty, `-` or a number
  (ignored: a rank's distance to itself is not a link).
* JSON, one or both matrices:
  `{"format": "collbench-topo-matrix", "version": 1, "hosts": [labels],
    "latency_us": [[...]], "bandwidth_GBps": [[...]], "meta": {...}}`
  with `null` (or a number, ignored) on the diagonal. `meta` is free-form (how it was measured).

A label is a host name (letters, digits, `-`, `.`, `_`, as in the config) or `host:N`, the N-th
rank on that host when a host runs several ranks. Latency is in microseconds (one-way, from a
small-message ping-pong), bandwidth in GB/s (10^9 bytes/s, from a large-message ping-pong).

The file is untrusted: every defect is a `MatrixError` (exit 2) naming the file and the cell.
"""

import csv
import io
import json
import math
import os
import re

from collbench.atomic_file import write_atomic
from collbench.bounded_repr import bounded_repr
from collbench.errors import UserError

FORMAT_NAME = "collbench-topo-matrix"
FORMAT_VERSION = 1
MAX_LABELS = 2048                   # 4M cells: larger fabrics are not mapped rank by rank
MAX_FILE_BYTES = 64 << 20
MAX_CELL_CHARS = 64
MIN_VALUE, MAX_VALUE = 1e-9, 1e12   # keeps every sum of costs finite and exact enough
MAX_SLOT = 65535


class Metric:
    """One kind of matrix: its file key, unit, and how a value becomes a cost (lower = better)."""

    def __init__(self, name, key, unit, cost_unit, higher_is_better):
        self.name = name
        self.key = key
        self.unit = unit
        self.cost_unit = cost_unit
        self.higher_is_better = higher_is_better

    def cost(self, value):
        # bandwidth -> microseconds to move 1 MB (10^6 bytes) over the link: 1000 / GBps
        return 1000.0 / value if self.higher_is_better else value

    def value_of_cost(self, cost):
        return 1000.0 / cost if self.higher_is_better else cost


METRICS = {
    "latency": Metric("latency", "latency_us", "us", "us", False),
    "bandwidth": Metric("bandwidth", "bandwidth_GBps", "GB/s", "us/MB", True),
}
METRIC_BY_KEY = {m.key: m for m in METRICS.values()}

_LABEL = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,252}(:[0-9]{1,5})?$")
_NUMBER = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_SPECIAL = {"nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}


class MatrixError(UserError):
    """A matrix file (or matrix data) that cannot be used. Exit code 2."""

    def __init__(self, source, where, message):
        self.source = source
        self.where = where
        parts = [p for p in (source, where) if p]
        super().__init__(": ".join(parts + [message]))


def split_label(label):
    """'node3' -> ('node3', 0); 'node3:2' -> ('node3', 2)."""
    host, sep, slot = label.partition(":")
    return host, (int(slot) if sep else 0)


class TopoMatrix:
    """One validated P x P matrix of one metric.

    labels: tuple of P unique labels (host or host:N), in the file's (the original) rank order.
    values: tuple of P tuples; values[i][j] is the measured value from i to j, None on the diagonal.
    """

    def __init__(self, labels, metric, values, source="<matrix>", meta=None):
        self.labels = tuple(labels)
        self.metric = METRICS[metric]
        self.values = tuple(tuple(row) for row in values)
        self.source = source
        self.meta = dict(meta or {})

    @classmethod
    def from_rows(cls, labels, metric, rows, source="<matrix>", meta=None):
        """Build from Python data (e.g. the measure job's results) with the files' validation."""
        if metric not in METRICS:
            raise MatrixError(source, None, f"unknown metric {metric!r} (expected latency or bandwidth)")
        labels = _check_labels(source, labels, "hosts")
        key = METRICS[metric].key
        values = _check_rows(source, key, rows, labels, lambda i, j: f"{key}[{i}][{j}]")
        return cls(labels, metric, values, source, meta)

    @property
    def size(self):
        return len(self.labels)

    @property
    def hosts(self):
        """The host of each label (a host appears once per rank it runs)."""
        return tuple(split_label(lb)[0] for lb in self.labels)

    def pair_value(self, i, j):
        """The pair's value in the metric's unit, the slower of its two directions."""
        a, b = self.values[i][j], self.values[j][i]
        return min(a, b) if self.metric.higher_is_better else max(a, b)

    def cost(self):
        """Symmetric cost matrix (list of lists of float, 0.0 on the diagonal), lower = better:
        latency in us, bandwidth as us per MB. The slower direction of each pair counts: a ring
        or exchange step waits for it."""
        n = self.size
        to_cost = self.metric.cost
        out = [[0.0] * n for _ in range(n)]
        for i in range(n):
            vi = self.values[i]
            for j in range(i + 1, n):
                c = max(to_cost(vi[j]), to_cost(self.values[j][i]))
                out[i][j] = out[j][i] = c
        return out

    def reordered(self, order):
        """The same matrix with rank r = old rank order[r] (for pictures of a mapped order)."""
        vals = [[None if a == b else self.values[a][b] for b in order] for a in order]
        return TopoMatrix([self.labels[i] for i in order], self.metric.name, vals, self.source, self.meta)


# ---------------------------------------------------------------------------------------- loading

def load_matrices(path):
    """All matrices in a CSV or JSON file: {metric name: TopoMatrix}. MatrixError on any defect."""
    text = _read_text(path)
    stripped = text.lstrip()
    if path.lower().endswith(".json") or stripped.startswith("{"):
        return _parse_json(path, text)
    return _parse_csv(path, text)


def load_matrix(path, metric=None):
    """The file's matrix of `metric`; metric None: the only one, or bandwidth when both are there."""
    found = load_matrices(path)
    if metric is None:
        if len(found) == 1:
            return next(iter(found.values()))
        return found["bandwidth"]
    if metric not in METRICS:
        raise MatrixError(path, None, f"unknown metric {metric!r} (expected latency or bandwidth)")
    if metric not in found:
        have = ", ".join(METRICS[m].key for m in found)
        raise MatrixError(path, None, f"has no {METRICS[metric].key} matrix (it has {have})")
    return found[metric]


def _read_text(path):
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise MatrixError(path, None, f"file is {size} bytes, more than the {MAX_FILE_BYTES} "
                                          f"bytes a matrix of {MAX_LABELS} hosts needs")
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise MatrixError(path, None, "no such file") from None
    except IsADirectoryError:
        raise MatrixError(path, None, "is a directory (expected a CSV or JSON matrix file)") from None
    except OSError as e:
        raise MatrixError(path, None, f"cannot read: {e.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise MatrixError(path, None, f"file is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise MatrixError(path, f"byte {e.start}", "not UTF-8 text") from None
    if "\x00" in text:
        raise MatrixError(path, f"character {text.index(chr(0))}", "NUL byte (not a text file)")
    if not text.strip():
        raise MatrixError(path, None, "empty file (expected a CSV or JSON matrix)")
    return text


def _check_labels(source, labels, where):
    if not isinstance(labels, (list, tuple)):
        raise MatrixError(source, where, f"got {_show(labels)}, expected a list of host names")
    if len(labels) < 2:
        raise MatrixError(source, where, f"{len(labels)} host(s): a matrix needs at least 2")
    if len(labels) > MAX_LABELS:
        raise MatrixError(source, where, f"{len(labels)} hosts, more than the limit of {MAX_LABELS}")
    seen = {}
    for i, lb in enumerate(labels):
        if not isinstance(lb, str) or not _LABEL.match(lb) or split_label(lb)[1] > MAX_SLOT:
            raise MatrixError(source, f"{where}[{i}]",
                              f"got {_show(lb)}, expected a host name (letters, digits, - . _) "
                              f"or host:N for the N-th rank on a host")
        if lb in seen:
            raise MatrixError(source, f"{where}[{i}]", f"{lb!r} repeats {where}[{seen[lb]}]")
        seen[lb] = i
    return tuple(labels)


def _show(v):
    return bounded_repr(v, 40)


def _number(source, where, raw, diagonal, text_cells=True):
    """A cell's value: float, or None on the diagonal. raw: str (CSV) or a JSON value.
    text_cells False (JSON, Python data): a cell must be a number, not a string holding one."""
    if isinstance(raw, _Unparsed):
        raise MatrixError(source, where, f"got {raw}, expected a positive number")
    if isinstance(raw, str) and not text_cells:
        raise MatrixError(source, where, f"got {_show(raw)}, a string: expected a number (JSON cells are "
                                         f"numbers, not quoted; null on the diagonal)")
    if raw is None or (isinstance(raw, str) and raw.strip() in ("", "-")):
        if diagonal:
            return None
        raise MatrixError(source, where, "missing value (expected a positive number)")
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise MatrixError(source, where, f"got {_show(raw)}, expected a positive number")
    if isinstance(raw, str):
        text = raw.strip()
        if len(text) > MAX_CELL_CHARS:
            raise MatrixError(source, where, f"got a {len(text)}-character cell, expected a number")
        if text.lower() in _SPECIAL:
            raise MatrixError(source, where, f"got {text}, expected a finite positive number")
        if not _NUMBER.match(text):
            raise MatrixError(source, where, f"got {_show(text)}, expected a positive number")
        value = float(text)
    else:
        value = float(raw)
    if math.isnan(value):
        raise MatrixError(source, where, "got NaN, expected a finite positive number")
    if diagonal:
        return None
    if value < 0:
        raise MatrixError(source, where, f"got {value:g}, negative (expected a positive number)")
    if not (MIN_VALUE <= value <= MAX_VALUE):
        raise MatrixError(source, where, f"got {value:g}, expected a positive number from "
                                         f"{MIN_VALUE:g} to {MAX_VALUE:g}")
    return value


def _check_rows(source, key, rows, labels, where_of, text_cells=False):
    n = len(labels)
    if not isinstance(rows, (list, tuple)):
        raise MatrixError(source, key, f"got {_show(rows)}, expected a list of {n} rows "
                                       f"(a list of lists of numbers)")
    if len(rows) != n:
        raise MatrixError(source, key, f"{len(rows)} rows for {n} hosts (the matrix must be square)")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)):
            raise MatrixError(source, f"{key}[{i}] (host {labels[i]})",
                              f"got {_show(row)}, expected a list of {n} numbers")
        if len(row) != n:
            raise MatrixError(source, f"{key}[{i}] (host {labels[i]})",
                              f"{len(row)} values for {n} hosts (the matrix must be square)")
        fast = _fast_row(row, i, text_cells)
        if fast is not None:
            _number(source, f"{where_of(i, i)} ({labels[i]} -> {labels[i]})", row[i], True, text_cells)
            out.append(fast)
            continue
        out.append(tuple(_number(source, f"{where_of(i, j)} ({labels[i]} -> {labels[j]})", v, i == j,
                                 text_cells)
                         for j, v in enumerate(row)))
    return tuple(out)


def _fast_row(row, diag, text_cells=True):
    """The row's values when every off-diagonal cell is plainly valid (checked in bulk, in C), else
    None: the cell-by-cell path then finds and names the bad cell. Big matrices load in seconds."""
    cells = list(row)
    cells[diag] = 1.0
    if isinstance(cells[0], str) and text_cells:
        cells[diag] = "1"
        joined = ",".join(cells)
        # float() also takes '1_000', non-ASCII digits and 'nan'/'inf': leave those to the slow path
        if not joined.isascii() or "_" in joined or max(map(len, cells)) > MAX_CELL_CHARS:
            return None
    elif not all(type(v) is float or type(v) is int for v in cells):
        return None
    try:
        vals = list(map(float, cells))
    except (ValueError, TypeError, OverflowError):
        return None
    if not math.isfinite(math.fsum(vals)) or min(vals) < MIN_VALUE or max(vals) > MAX_VALUE:
        return None
    vals[diag] = None
    return tuple(vals)


class _Unparsed:
    """A JSON literal Python would turn into NaN/inf or an over-long integer: reported, not used."""

    def __init__(self, text):
        digits = len(text.lstrip("-"))
        self.text = text if len(text) <= 20 else f"{text[:17]}... ({digits} digits)"

    def __str__(self):
        return self.text

    __repr__ = __str__


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs):
    """A JSON object with each key once: `{"hosts": [...], "hosts": [...]}` is refused, not read as
    its last value (which a reader and a writer could take differently)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _parse_json(path, text):
    try:
        doc = json.loads(text, parse_constant=_Unparsed, object_pairs_hook=_no_duplicate_keys,
                         parse_int=lambda s: int(s) if len(s) <= 300 else _Unparsed(s))
    except _DuplicateKey as e:
        raise MatrixError(path, bounded_repr(e.args[0]), "key given twice (each key once)") from None
    except RecursionError:
        raise MatrixError(path, None, "JSON nested too deeply (expected an object of matrices)") from None
    except ValueError as e:
        where = f"line {e.lineno} column {e.colno}" if hasattr(e, "lineno") else None
        raise MatrixError(path, where, f"not valid JSON: {getattr(e, 'msg', e)}") from None
    if not isinstance(doc, dict):
        raise MatrixError(path, None, f"got a JSON {type(doc).__name__}, expected an object with "
                                      f"'hosts' and 'latency_us' and/or 'bandwidth_GBps'")
    fmt = doc.get("format", FORMAT_NAME)
    if fmt != FORMAT_NAME:
        raise MatrixError(path, "format", f"got {_show(fmt)}, expected {FORMAT_NAME!r}")
    version = doc.get("version", FORMAT_VERSION)
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise MatrixError(path, "version", f"got {_show(version)}, expected {FORMAT_VERSION}")
    known = {"format", "version", "hosts", "meta"} | set(METRIC_BY_KEY)
    unknown = sorted(str(k) for k in doc if k not in known)
    if unknown:
        raise MatrixError(path, unknown[0], f"unknown key (expected {', '.join(sorted(known))})")
    if "hosts" not in doc:
        raise MatrixError(path, "hosts", "missing (expected the list of host names)")
    labels = _check_labels(path, doc["hosts"], "hosts")
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise MatrixError(path, "meta", f"got {_show(meta)}, expected an object")
    found = {}
    for key, metric in METRIC_BY_KEY.items():
        if key in doc:
            values = _check_rows(path, key, doc[key], labels, lambda i, j, k=key: f"{k}[{i}][{j}]",
                                 text_cells=False)
            found[metric.name] = TopoMatrix(labels, metric.name, values, path, meta)
    if not found:
        raise MatrixError(path, None, "no matrix: expected 'latency_us' and/or 'bandwidth_GBps'")
    return found


def _parse_csv(path, text):
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:
        raise MatrixError(path, None, f"not valid CSV: {e}") from None
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    header = [c.strip() for c in rows[0]]
    metric = METRIC_BY_KEY.get(header[0])
    if metric is None:
        raise MatrixError(path, "line 1 column 1", f"got {_show(header[0])}, expected the metric "
                                                   f"and unit: {' or '.join(METRIC_BY_KEY)}")
    labels = _check_labels(path, header[1:], "line 1 (header)")
    n = len(labels)
    body = rows[1:]
    if len(body) != n:
        raise MatrixError(path, None, f"{len(body)} data rows for {n} hosts in the header "
                                      f"(the matrix must be square)")
    values = []
    for i, row in enumerate(body):
        line = i + 2
        if len(row) != n + 1:
            raise MatrixError(path, f"line {line}", f"{len(row)} cells, expected {n + 1} "
                                                    f"(the host name and {n} values)")
        if row[0].strip() != labels[i]:
            raise MatrixError(path, f"line {line} column 1", f"got {_show(row[0].strip())}, expected "
                                                             f"{labels[i]!r} (rows in header order)")
        fast = _fast_row(row[1:], i, True)
        if fast is not None:
            _number(path, f"line {line} column {i + 2} ({labels[i]} -> {labels[i]})", row[i + 1], True)
            values.append(fast)
            continue
        values.append(tuple(
            _number(path, f"line {line} column {j + 2} ({labels[i]} -> {labels[j]})", cell, i == j)
            for j, cell in enumerate(row[1:])))
    return {metric.name: TopoMatrix(labels, metric.name, values, path)}


# ---------------------------------------------------------------------------------------- saving

def _fmt(v):
    return "" if v is None else repr(float(v))


def csv_text(matrix):
    """The CSV form of one matrix."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([matrix.metric.key] + list(matrix.labels))
    for lb, row in zip(matrix.labels, matrix.values):
        w.writerow([lb] + [_fmt(v) for v in row])
    return out.getvalue()


def json_text(matrices, meta=None):
    """The JSON form of one or more matrices over the same labels (list or dict of TopoMatrix)."""
    ms = list(matrices.values()) if isinstance(matrices, dict) else list(matrices)
    if not ms or any(m.labels != ms[0].labels for m in ms):
        raise ValueError("json_text needs matrices over the same labels")
    doc = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "hosts": list(ms[0].labels)}
    for m in ms:
        doc[m.metric.key] = [list(row) for row in m.values]
    doc["meta"] = dict(meta if meta is not None else ms[0].meta)
    return json.dumps(doc, indent=None, separators=(",", ":")) + "\n"


def save_csv(path, matrix):
    """Write one matrix as CSV (atomic_file's writer). Returns the path written; OSError when it
    cannot be. A set of files goes through atomic_file.FileSet with csv_text/json_text instead."""
    return write_atomic(path, [csv_text(matrix)])


def save_json(path, matrices, meta=None):
    """Write one or more matrices as JSON (atomic_file's writer). Returns the path written."""
    return write_atomic(path, [json_text(matrices, meta)])
