"""Fold a stream of records into what the report shows: run series, one point per
(series, op, datatype, size) with the medians of its repeated measurements, failures, events.

A *series* is one line in a plot: the records that share where and how they were measured.
At the finest level that is one run (`run_id`) with its algorithm, rank order, pattern and
host list (`compare` and `topo compare` write several of those per run); grouping by *setup*
drops the run id, so the many daemon lives of a long stress log become one line per setup.

Memory is per point, not per record: the values of repeated measurements are kept in
`array('d')` (8 bytes each), so a million-record stress log costs tens of MB.
"""

from array import array
from collections import Counter
from dataclasses import dataclass, field

from collbench.ops import OPS
from collbench.report.congestion import CongestionAcc
from collbench.stats import median, quantile

# What makes two records belong to different lines, in the order labels show them.
SERIES_FIELDS = ("run_id", "algorithm", "order", "pattern", "timing", "inplace", "root", "hosts", "nodes",
                 "ranks", "transport", "engine", "mpi")
SETUP_FIELDS = tuple(f for f in SERIES_FIELDS if f != "run_id")
AUTO_MAX_SERIES = 10   # group-by auto: more runs than this -> one line per setup

VALUE_FIELDS = ("latency_avg_us", "latency_min_us", "latency_max_us", "latency_p50_us", "latency_p90_us",
                "latency_p99_us", "busbw_bytes_per_s", "algbw_bytes_per_s")

# Tableau-10: distinct, readable on white, the same colour for a series in every plot.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
MARKERS = ("circle", "square", "triangle", "diamond")


def series_key(rec):
    """The values of SERIES_FIELDS (written out: this runs once per record)."""
    g = rec.get
    return (g("run_id"), g("algorithm"), g("order"), g("pattern"), g("timing"), g("inplace"), g("root"),
            g("hosts"), g("nodes"), g("ranks"), g("transport"), g("engine"), g("mpi"))


class _PointAcc:
    __slots__ = ("values", "stragglers", "validation_fail", "first_ts", "last_ts", "iterations")

    def __init__(self):
        self.values = {}
        self.stragglers = Counter()
        self.validation_fail = 0
        self.first_ts = None
        self.last_ts = None
        self.iterations = None

    def add(self, rec):
        values, g = self.values, rec.get
        for f in VALUE_FIELDS:
            v = g(f)
            if v is not None:
                a = values.get(f)
                if a is None:
                    a = values[f] = array("d")
                a.append(v)
        rank = g("straggler_rank")
        if rank is not None:
            self.stragglers[rank] += 1
        if g("validation") == "fail":
            self.validation_fail += 1
        self.iterations = g("iterations", self.iterations)
        ts = g("ts")
        if ts is not None:
            if self.first_ts is None or ts < self.first_ts:
                self.first_ts = ts
            if self.last_ts is None or ts > self.last_ts:
                self.last_ts = ts

    def _times(self, first, last):
        if first is not None:
            self.first_ts = first if self.first_ts is None else min(self.first_ts, first)
        if last is not None:
            self.last_ts = last if self.last_ts is None else max(self.last_ts, last)

    def merge(self, other):
        for f, a in other.values.items():
            self.values.setdefault(f, array("d")).extend(a)
        self.stragglers.update(other.stragglers)
        self.validation_fail += other.validation_fail
        self.iterations = other.iterations if other.iterations is not None else self.iterations
        self._times(other.first_ts, other.last_ts)


class _SeriesAcc:
    def __init__(self):
        self.run_ids = Counter()
        self.results = 0
        self.failures = 0
        self.first_ts = None
        self.last_ts = None
        self.files = Counter()
        self.events = Counter()
        self.datatypes = set()

    def add(self, rec):
        if rec.get("run_id"):
            self.run_ids[rec["run_id"]] += 1
        self.files[rec.get("_file")] += 1
        ts = rec.get("ts")
        if ts is not None:
            self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
            self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)

    def merge(self, other):
        self.run_ids.update(other.run_ids)
        self.results += other.results
        self.failures += other.failures
        self.files.update(other.files)
        self.events.update(other.events)
        self.datatypes |= other.datatypes
        for ts in (other.first_ts, other.last_ts):
            if ts is not None:
                self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
                self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)


class _FailureAcc:
    def __init__(self):
        self.count = 0
        self.first_ts = None
        self.last_ts = None
        self.last = None          # the newest failure record
        self.exit_codes = Counter()

    def add(self, rec):
        self.count += 1
        ts = rec.get("ts")
        if ts is not None:
            self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
        if self.last is None or (ts is not None and ts >= (self.last.get("ts") or 0)):
            self.last = rec
            self.last_ts = ts if ts is not None else self.last_ts
        self.exit_codes[rec.get("exit_code")] += 1

    def merge(self, other):
        self.count += other.count
        self.exit_codes.update(other.exit_codes)
        if other.first_ts is not None:
            self.first_ts = other.first_ts if self.first_ts is None else min(self.first_ts, other.first_ts)
        if self.last is None or (other.last_ts or 0) >= (self.last_ts or 0):
            self.last, self.last_ts = other.last, other.last_ts


class Aggregate:
    """Feed records with add(); then build(group_by) gives the report's data."""

    def __init__(self):
        self._series = {}      # run-level key -> _SeriesAcc
        self._points = {}      # (run key, op, datatype, size_bytes) -> _PointAcc
        self._failures = {}    # (run key, op, size_bytes) -> _FailureAcc
        self._events = {}      # run_id -> Counter(event)
        self.types = Counter()
        self.congestion = CongestionAcc()   # the congestion section's host x step map

    def add(self, rec):
        rtype = rec.get("type")
        self.types[rtype] += 1
        if rtype == "result":
            key = series_key(rec)
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = _SeriesAcc()
            s.add(rec)
            s.results += 1
            s.datatypes.add(rec.get("datatype"))
            pkey = (key, rec["op"], rec.get("datatype"), rec["size_bytes"])
            p = self._points.get(pkey)
            if p is None:
                p = self._points[pkey] = _PointAcc()
            p.add(rec)
            self.congestion.add(rec)
        elif rtype == "failure":
            key = series_key(rec)
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = _SeriesAcc()
            s.add(rec)
            s.failures += 1
            fkey = (key, rec.get("op"), rec.get("size_bytes"))
            f = self._failures.get(fkey)
            if f is None:
                f = self._failures[fkey] = _FailureAcc()
            f.add(rec)
        elif rtype == "event" and rec.get("run_id"):
            self._events.setdefault(rec["run_id"], Counter())[rec.get("event")] += 1

    def merge(self, other):
        """Add another Aggregate's records (one part of a parallel read)."""
        for mine, theirs, make in ((self._series, other._series, _SeriesAcc), (self._points, other._points, _PointAcc),
                                   (self._failures, other._failures, _FailureAcc)):
            for key, acc in theirs.items():
                if key in mine:
                    mine[key].merge(acc)
                else:
                    mine[key] = acc
        for run_id, events in other._events.items():
            self._events.setdefault(run_id, Counter()).update(events)
        self.types.update(other.types)
        self.congestion.merge(other.congestion)

    @property
    def run_count(self):
        return len(self._series)

    def build(self, group_by="auto"):
        """The report's data: ReportData. group_by: run, setup, or auto (run unless that gives
        more than AUTO_MAX_SERIES lines, then setup)."""
        if group_by == "auto":
            group_by = "run" if len(self._series) <= AUTO_MAX_SERIES else "setup"
        fields = SERIES_FIELDS if group_by == "run" else SETUP_FIELDS
        coarse = (lambda k: k) if group_by == "run" else (lambda k: k[1:])   # run_id is first

        series_acc, points_acc, failures_acc = {}, {}, {}
        for key, acc in self._series.items():
            ck = coarse(key)
            if ck not in series_acc:
                series_acc[ck] = _SeriesAcc()
            series_acc[ck].merge(acc)
            for run_id in acc.run_ids:
                series_acc[ck].events.update(self._events.get(run_id, {}))
        for (key, op, dt, size), acc in self._points.items():
            pk = (coarse(key), op, dt, size)
            if pk not in points_acc:
                points_acc[pk] = _PointAcc()
            points_acc[pk].merge(acc)
        for (key, op, size), acc in self._failures.items():
            fk = (coarse(key), op, size)
            if fk not in failures_acc:
                failures_acc[fk] = _FailureAcc()
            failures_acc[fk].merge(acc)

        ordered = sorted(series_acc.items(), key=lambda kv: (kv[1].first_ts or 0, str(kv[0])))
        series = {}
        varying = _varying_fields(fields, [k for k, _ in ordered])
        for i, (key, acc) in enumerate(ordered):
            attrs = dict(zip(fields, key))
            series[key] = Series(
                index=i, key=key, attrs=attrs, label=_label(attrs, varying, acc),
                color=PALETTE[i % len(PALETTE)], marker=MARKERS[(i // len(PALETTE)) % len(MARKERS)],
                run_ids=[r for r, _ in acc.run_ids.most_common()], results=acc.results,
                failures=acc.failures, first_ts=acc.first_ts, last_ts=acc.last_ts,
                files=sorted(f for f in acc.files if f), events=dict(acc.events))

        points = []
        for (key, op, dt, size), acc in points_acc.items():
            points.append(_point(series[key], op, dt, size, acc))
        failures = []
        for (key, op, size), acc in failures_acc.items():
            failures.append(FailureGroup(series=series[key], op=op, size_bytes=size, count=acc.count,
                                         first_ts=acc.first_ts, last_ts=acc.last_ts, last=acc.last,
                                         exit_codes=dict(acc.exit_codes)))
        failures.sort(key=lambda f: (-f.count, f.series.index, _op_index(f.op), f.size_bytes or 0))
        return ReportData(group_by=group_by, series=list(series.values()), points=points, failures=failures,
                          types=dict(self.types), congestion=self.congestion)


def _op_index(name):
    return list(OPS).index(name) if name in OPS else len(OPS)


def _varying_fields(fields, keys):
    """The fields whose value differs between series: what a legend must show to tell them apart."""
    if len(keys) < 2:
        return []
    return [f for i, f in enumerate(fields) if len({k[i] for k in keys}) > 1]


def _hosts_text(hosts, limit=3):
    """The distinct hosts in rank order (a host runs several ranks): node00,node01 +6."""
    if not hosts:
        return "?"
    hosts = list(dict.fromkeys(hosts))
    text = ",".join(hosts[:limit])
    return text + (f" +{len(hosts) - limit}" if len(hosts) > limit else "")


def _field_text(name, value):
    if name == "timing":
        return "sustained timing" if value == "sustained" else "OSU timing"
    if name == "inplace":
        return "in place" if value else "not in place"
    if name == "root":
        return f"root {value or 0}"
    if value is None:
        return f"no {name}" if name in ("algorithm", "order", "pattern") else f"{name} ?"
    if name == "run_id":
        return f"run {value}"
    if name == "hosts":
        return f"hosts {_hosts_text(value)}"
    if name == "nodes":
        return f"{value} node{'s' if value != 1 else ''}"
    if name == "ranks":
        return f"{value} ranks"
    if name == "mpi":
        return value
    return f"{name} {value}"


def _label(attrs, varying, acc):
    """A legend label: the fields that tell this series from the others, else its setup."""
    if varying:
        return " · ".join(_field_text(f, attrs.get(f)) for f in varying)
    parts = [_field_text("ranks", attrs.get("ranks")), _field_text("nodes", attrs.get("nodes"))]
    for f in ("transport", "engine", "algorithm", "order", "pattern", "timing", "inplace", "root"):
        if attrs.get(f) is not None:
            parts.append(str(attrs[f]) if f in ("transport", "engine") else _field_text(f, attrs[f]))
    if attrs.get("run_id"):
        parts.insert(0, f"run {attrs['run_id']}")
    return " · ".join(parts)


@dataclass
class Series:
    index: int
    key: tuple
    attrs: dict
    label: str
    color: str
    marker: str
    run_ids: list
    results: int
    failures: int
    first_ts: float
    last_ts: float
    files: list
    events: dict


@dataclass
class Point:
    """One (series, op, datatype, size): medians over its n repeated measurements."""
    series: Series
    op: str
    datatype: str
    size_bytes: int
    n: int
    latency_avg_us: float
    latency_min_us: float
    latency_max_us: float
    latency_q1_us: float          # spread of the repeated averages (not the ranks)
    latency_q3_us: float
    p50_us: float
    p90_us: float
    p99_us: float
    busbw: float
    algbw: float
    stragglers: list              # [(rank, times it was the slowest)], most often first
    validation_fail: int
    iterations: int
    first_ts: float
    last_ts: float
    pct_of_peak: float = None     # set by the report once the peak is known


def _point(series, op, dt, size, acc):
    v = acc.values
    avg = sorted(v["latency_avg_us"])

    def med(f):
        return median(v[f]) if f in v and len(v[f]) else None

    return Point(series=series, op=op, datatype=dt, size_bytes=size, n=len(avg),
                 latency_avg_us=quantile(avg, 0.5), latency_min_us=med("latency_min_us"),
                 latency_max_us=med("latency_max_us"), latency_q1_us=quantile(avg, 0.25),
                 latency_q3_us=quantile(avg, 0.75), p50_us=med("latency_p50_us"), p90_us=med("latency_p90_us"),
                 p99_us=med("latency_p99_us"), busbw=med("busbw_bytes_per_s"), algbw=med("algbw_bytes_per_s"),
                 stragglers=acc.stragglers.most_common(3), validation_fail=acc.validation_fail,
                 iterations=acc.iterations, first_ts=acc.first_ts, last_ts=acc.last_ts)


@dataclass
class FailureGroup:
    series: Series
    op: str
    size_bytes: int
    count: int
    first_ts: float
    last_ts: float
    last: dict
    exit_codes: dict


@dataclass
class ReportData:
    group_by: str
    series: list
    points: list
    failures: list
    types: dict = field(default_factory=dict)
    congestion: object = None     # report/congestion.py CongestionAcc

    def ops(self):
        """Ops with results or failures, in op-table order."""
        names = {p.op for p in self.points} | {f.op for f in self.failures if f.op}
        return [n for n in OPS if n in names]

    def lines(self, op):
        """[(series, datatype, [points by size])] for one op, series in order."""
        by_line = {}
        for p in self.points:
            if p.op == op:
                by_line.setdefault((p.series.index, p.datatype or ""), []).append(p)
        out = []
        for (_, dt), pts in sorted(by_line.items()):
            pts.sort(key=lambda p: p.size_bytes)
            out.append((pts[0].series, pts[0].datatype, pts))
        return out
