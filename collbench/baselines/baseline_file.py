"""The baseline file: per (op, size, ranks, nodes, transport, engine, algorithm, variant) the median and
spread of a cluster's own latency, saved once ("this is how fast we are") and compared against
after every change. Format (docs/REPORTS.md):

    {"format": "collbench-baseline", "version": 1, "name": "weekly",
     "created": "2026-11-23T19:40:31.399Z", "created_ts": 1795462831.399, "collbench": "0.1.0",
     "metric": "latency_avg_us",
     "source": {"kind": "results" | "runs", "files": [...], "runs": N, "config": "...",
                "run_ids": [...]},
     "entries": [
       {"op": "allreduce", "size": "1MB", "size_bytes": 1048576, "ranks": 16, "nodes": 2,
        "transport": "ucx", "engine": "builtin", "algorithm": null, "variant": "", "datatype": "float",
        "n": 5,
        "latency_avg_us": {"median": 303.0, "mad": 1.2, "sigma": 1.78, "q1": 302.1, "q3": 304.0,
                           "min": 301.0, "max": 309.9},
        "busbw_bytes_per_s": {"median": 3.46e9} | null,
        "first_ts": 1795462831.4, "last_ts": 1795462990.1}, ...],
     "counter_normal": {                     # optional (older files have none): each host's and path's
       "exposure": {"host": {"steps": 24, "seconds": 6.1, "sum_t2": 1.7}, "path": {...}},
       "counters": {"h3|TCPFastRetrans@netstat": {"events": 312, "steps_moved": 1, "sum_x2": 97344.0,
                    "sum_xt": 124.8, "rate_per_s": 51.1, "dispersion": 22.6}, ...}}}

`counter_normal` is congestion.normal's Tally of the runs' congestion fields: per host (and per
path, "<host>><peer>") and counter, the events, the steps it moved in and the moments of its
per-step counts (their spread: `dispersion`), over the steps whose records carried counters.
`collbench diagnose --baseline` weighs a regression's slow steps against it (the results' good
steps in a `once` run are its other series, under the same fault).

`sigma` is 1.4826 x MAD, the robust standard deviation of the runs. A file being loaded is
untrusted input: anything wrong is a UserError naming the file, the entry and the key.
"""

import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from collbench import __version__
from collbench.atomic_file import write_output
from collbench.baselines.comparison import regression_bound_us
from collbench.bounded_file import UntrustedFileError, read_limited
from collbench.bounded_repr import bounded_repr
from collbench.congestion import normal as counter_normal_mod
from collbench.congestion.attribution import flagged_signal_items
from collbench.congestion.counters import TRAFFIC, family, weighed_path_counter
from collbench.congestion.record_field import path_loss_items
from collbench.errors import UserError
from collbench.ops import OPS, get_op
from collbench.stats import summarize
from collbench.sizes import format_size

FORMAT = "collbench-baseline"
VERSION = 1
METRIC = "latency_avg_us"
MAX_FILE_BYTES = 64 << 20
MAX_TS = 253402300799.0   # 9999-12-31T23:59:59Z: a created_ts/first_ts/last_ts beyond it is no date
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# Runs a baseline needs: its bound is max(1.2 x median, median + 3 sigma) with sigma from the MAD of
# the runs; the MAD of 3 values is often near 0 (two runs alike), leaving only the 1.2x ratio,
# which a quiet run on a shared machine crosses (13 of 30 quiet `once` runs against 3-run
# baselines on the 6-host testbed, issue 28); `baseline save` says when it has fewer
MIN_RUNS = 5
# ... and over how long: on the 2-core testbed quiet runs fall into slow spells of ~10 s (every
# series 1.8-3.3x slower at once); baselines of 8 runs spread over 40 runs (~50 s) let 15 % of
# 3-run verdicts page for nothing, 8 consecutive runs (~10 s) 37 % (bench/quiet_false_alarms.py,
# docs/DIAGNOSIS.md). `baseline save` says when its runs span less than this
MIN_SPAN_S = 600.0


@dataclass(frozen=True)
class BaselineKey:
    """What a measurement is comparable on. None: the record did not say (e.g. no algorithm)."""
    op: str
    size_bytes: int
    ranks: int
    nodes: int
    transport: str
    engine: str
    algorithm: str
    variant: str = ""             # non-default timing options: "sustained", "inplace", "root=3", joined by ","

    @property
    def size(self):
        return format_size(self.size_bytes) if get_op(self.op).has_size and self.size_bytes else "-"

    def labels(self):
        """Prometheus-style labels (all strings; "" for unknown), e.g. for the exporter's
        baseline series: op, size, size_bytes, nodes, ranks, transport, engine, algorithm, variant."""
        return {"op": self.op, "size": self.size, "size_bytes": str(self.size_bytes),
                "nodes": "" if self.nodes is None else str(self.nodes), "ranks": str(self.ranks),
                "transport": self.transport or "", "engine": self.engine or "",
                "algorithm": self.algorithm or "", "variant": self.variant or ""}

    def sort_key(self):
        return (list(OPS).index(self.op), self.ranks, self.nodes or 0, self.transport or "", self.engine or "",
                self.algorithm or "", self.variant or "", self.size_bytes)


def key_of(rec):
    """The BaselineKey of a checked result record (results_reader)."""
    return BaselineKey(op=rec["op"], size_bytes=rec["size_bytes"], ranks=rec["ranks"], nodes=rec.get("nodes"),
                       transport=rec.get("transport"), engine=rec.get("engine"), algorithm=rec.get("algorithm"),
                       variant=variant_of(rec))


def variant_of(rec):
    """How a record was timed when not OSU's way: sustained timing (no barrier between
    iterations), MPI_IN_PLACE, a root other than 0. Such numbers differ systematically from the
    plain ones, so they are kept apart; "" for a plain record."""
    parts = []
    if rec.get("timing") not in (None, "osu"):
        parts.append(str(rec["timing"]))
    if rec.get("inplace"):
        parts.append("inplace")
    if rec.get("root"):
        parts.append(f"root={rec['root']}")
    return ",".join(parts)


@dataclass
class Entry:
    key: BaselineKey
    n: int
    latency: dict                 # stats.summarize of latency_avg_us over the runs
    busbw: dict = None            # {"median": bytes/s} or None
    datatype: str = None
    first_ts: float = None
    last_ts: float = None

    @property
    def median_us(self):
        return self.latency["median"]

    @property
    def sigma_us(self):
        """Robust standard deviation of the baseline runs (1.4826 x MAD); 0 with one run."""
        return self.latency["sigma"]

    @property
    def slowest_us(self):
        """The slowest baseline run (the median when the file gave no max)."""
        return self.latency["max"]

    def regression_bound_us(self, threshold, k):
        """comparison.regression_bound_us of this entry: its median, sigma and slowest run."""
        return regression_bound_us(self.median_us, self.sigma_us, threshold, k, self.slowest_us)

    def as_dict(self):
        k = self.key
        return {"op": k.op, "size": k.size, "size_bytes": k.size_bytes, "ranks": k.ranks, "nodes": k.nodes,
                "transport": k.transport, "engine": k.engine, "algorithm": k.algorithm, "variant": k.variant,
                "datatype": self.datatype,
                "n": self.n, "latency_avg_us": self.latency, "busbw_bytes_per_s": self.busbw,
                "first_ts": self.first_ts, "last_ts": self.last_ts}


@dataclass
class Baseline:
    name: str
    entries: dict                 # BaselineKey -> Entry
    created_ts: float = None
    source: dict = field(default_factory=dict)
    path: str = None
    collbench: str = None
    counter_normal: object = None   # congestion.normal.Tally of the runs' counters, or None

    def sorted_entries(self):
        return [self.entries[k] for k in sorted(self.entries, key=BaselineKey.sort_key)]

    def as_dict(self):
        return {"format": FORMAT, "version": VERSION, "name": self.name, "created": _iso(self.created_ts),
                "created_ts": self.created_ts, "collbench": self.collbench or __version__, "metric": METRIC,
                "source": self.source, "entries": [e.as_dict() for e in self.sorted_entries()],
                **({"counter_normal": self.counter_normal.as_dict()} if self.counter_normal is not None else {})}


def _iso(ts):
    """The UTC ISO time of a Unix timestamp; None when there is none or it is not a date."""
    if ts is None:
        return None
    try:
        return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return None


class Collector:
    """Latency values per key from checked result records; then entries()."""

    def __init__(self):
        self.values = {}          # key -> [latency_avg_us]
        self.busbw = {}
        self.meta = {}            # key -> [datatype, first_ts, last_ts]
        self.run_ids = {}         # run_id -> None (ordered set)
        self.failures = []        # failure records (few kept)
        self.failure_count = 0
        self.normal = counter_normal_mod.Tally()   # per host/path and counter, over the steps with counters

    def add(self, rec):
        if rec.get("type") == "failure":
            self.failure_count += 1
            if len(self.failures) < 20:
                self.failures.append(rec)
            return
        if rec.get("type") != "result":
            return
        if rec.get("validation") == "fail":
            return   # a wrong answer's speed is no reference
        k = key_of(rec)
        self.values.setdefault(k, []).append(rec["latency_avg_us"])
        if rec.get("busbw_bytes_per_s") is not None:
            self.busbw.setdefault(k, []).append(rec["busbw_bytes_per_s"])
        ts = rec.get("ts")
        m = self.meta.setdefault(k, [rec.get("datatype"), ts, ts])
        if ts is not None:
            m[1] = ts if m[1] is None else min(m[1], ts)
            m[2] = ts if m[2] is None else max(m[2], ts)
        if rec.get("run_id"):
            self.run_ids[rec["run_id"]] = None
        self._add_counters(rec.get("congestion"))

    def _add_counters(self, field):
        """The step's counter movements into the normal (routine TCP loss recovery included: it
        is part of what a quiet run does); per-host OSU-run counters are no step's."""
        if not isinstance(field, dict) or field.get("source") != "engine":
            return
        seconds = max(float(field["t_end"]) - float(field["t_start"]), 1e-6)
        self.normal.add_exposure("host", seconds)
        for host, key, delta, _routine in flagged_signal_items(field):
            if family(key.partition("@")[0]) not in (None, TRAFFIC):
                self.normal.add(host, key, delta, seconds)
        if "paths" in field:
            self.normal.add_exposure("path", seconds)
            for host, peer, name, v in path_loss_items(field):   # net of DSACKed
                if weighed_path_counter(name):
                    self.normal.add(f"{host}>{peer}", name, int(round(v)), seconds)

    def merge(self, other):
        """Add another Collector's measurements (one part of a parallel read)."""
        for mine, theirs in ((self.values, other.values), (self.busbw, other.busbw)):
            for k, v in theirs.items():
                mine.setdefault(k, []).extend(v)
        for k, (dt, first, last) in other.meta.items():
            m = self.meta.setdefault(k, [dt, first, last])
            if first is not None:
                m[1] = first if m[1] is None else min(m[1], first)
            if last is not None:
                m[2] = last if m[2] is None else max(m[2], last)
        self.run_ids.update(other.run_ids)
        self.failures = (self.failures + other.failures)[:20]
        self.failure_count += other.failure_count
        self.normal.merge(other.normal)

    def summaries(self):
        """key -> stats.summarize(latency values)."""
        return {k: summarize(v) for k, v in self.values.items()}

    def entries(self):
        out = {}
        for k, vals in self.values.items():
            bw = self.busbw.get(k)
            dt, first, last = self.meta[k]
            out[k] = Entry(key=k, n=len(vals), latency=summarize(vals),
                           busbw={"median": summarize(bw)["median"]} if bw else None,
                           datatype=dt, first_ts=first, last_ts=last)
        return out


# ------------------------------------------------------------------ names and files

def resolve_path(name, state_dir):
    """NAME -> <state_dir>/baselines/NAME.json; a name ending in .json is a path as given."""
    if name.endswith(".json"):
        return os.path.abspath(os.path.expanduser(name))
    if not NAME_RE.match(name):
        raise UserError(f"baseline name {name!r}: expected letters, digits, '.', '_' or '-' (up to 100), "
                        "or a path ending in .json")
    return os.path.join(state_dir, "baselines", f"{name}.json")


def save(baseline, path, force=False):
    """Write the baseline atomically; UserError if it exists (without force) or cannot be written."""
    if os.path.exists(path) and not force:
        raise UserError(f"baseline {path} exists: use --force to replace it (or another name)")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError as e:
        raise UserError(f"baseline {path}: cannot write: {e.strerror or e}") from None
    write_output(path, json.dumps(baseline.as_dict(), indent=1, allow_nan=False) + "\n", flag="baseline")
    baseline.path = path
    return path


def _at(where, key):
    return f"{where}.{key}" if where else key


class _Checker:
    def __init__(self, path):
        self.path = path

    def fail(self, where, message):
        raise UserError(f"baseline {self.path}: {where}: {message}")

    def num(self, d, key, where, minimum=0.0, strict=False, required=True, maximum=None, what=None):
        v = d.get(key)
        if v is None and not required:
            return None
        try:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (
                v > minimum if strict else v >= minimum) and (maximum is None or v <= maximum)
        except OverflowError:  # an int too large for a float
            ok = False
        if not ok:
            expected = what or f"a number {'>' if strict else '>='} {minimum:g}"
            self.fail(_at(where, key), f"expected {expected}, got {bounded_repr(v, 40)}")
        return float(v)

    def timestamp(self, d, key, where):
        """A Unix time (seconds since 1970, UTC) or absent; a string ("yesterday"), a bool or a
        number no date has (1e20, -1e300) is an error."""
        return self.num(d, key, where, minimum=0.0, required=False, maximum=MAX_TS,
                        what="a Unix time in seconds (a number, 1970 to 9999)")

    def count(self, d, key, where, minimum=0, required=True):
        v = d.get(key)
        if v is None and not required:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum or v > 1 << 62:
            self.fail(_at(where, key), f"expected a whole number >= {minimum}, got {bounded_repr(v, 40)}")
        return v

    def text(self, d, key, where, required=False):
        v = d.get(key)
        if v is None and not required:
            return None
        if not isinstance(v, str) or len(v) > 200:
            self.fail(_at(where, key), f"expected a string (up to 200 characters), got {bounded_repr(v, 40)}")
        return v


def load(name_or_path, state_dir):
    """The Baseline saved under a name (or at a .json path); UserError if missing or malformed."""
    path = resolve_path(name_or_path, state_dir)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        where = "" if name_or_path.endswith(".json") else f" (state directory {state_dir})"
        raise UserError(f"baseline {name_or_path}: {path} does not exist{where}") from None
    except OSError as e:
        raise UserError(f"baseline {path}: cannot read: {e.strerror}") from None
    if size > MAX_FILE_BYTES:
        raise UserError(f"baseline {path}: {size} bytes, over the {MAX_FILE_BYTES >> 20} MB limit")
    try:
        # the one bounded reader: regular files only (a FIFO put in its place must not hang it)
        raw = read_limited(path, MAX_FILE_BYTES)
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_no_duplicate_keys)
    except UntrustedFileError as e:
        raise UserError(f"baseline {path}: {e}") from None
    except UnicodeDecodeError:
        raise UserError(f"baseline {path}: not UTF-8 text") from None
    except (ValueError, RecursionError) as e:
        raise UserError(f"baseline {path}: not valid JSON: {str(e)[:100]}") from None
    return from_dict(data, path)


def _no_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


def _no_duplicate_keys(pairs):
    """An object with each key once: a second "created_ts" (or any key) is refused, not read as the
    last one (a reader and a writer could take different values)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {bounded_repr(k, 40)} given twice in one object")
        out[k] = v
    return out


def from_dict(data, path="<baseline>"):
    c = _Checker(path)
    if not isinstance(data, dict):
        c.fail("top level", "expected a JSON object")
    if data.get("format") != FORMAT:
        c.fail("format", f"expected {FORMAT!r}, got {bounded_repr(data.get('format'), 40)} (not a collbench baseline)")
    if data.get("version") != VERSION or isinstance(data.get("version"), bool):
        c.fail("version", f"expected {VERSION}, got {bounded_repr(data.get('version'), 40)} (made by another "
                          "collbench version: save the baseline again)")
    if data.get("metric", METRIC) != METRIC:
        c.fail("metric", f"expected {METRIC!r}")
    entries_raw = data.get("entries")
    if not isinstance(entries_raw, list):
        c.fail("entries", "expected a list")
    entries = {}
    for i, e in enumerate(entries_raw):
        where = f"entries[{i}]"
        if not isinstance(e, dict):
            c.fail(where, "expected an object")
        op = e.get("op")
        try:
            op = get_op(op).name if isinstance(op, str) else None
        except KeyError:
            op = None
        if op is None:
            c.fail(f"{where}.op", f"expected one of {', '.join(OPS)}, got {bounded_repr(e.get('op'), 40)}")
        key = BaselineKey(op=op, size_bytes=c.count(e, "size_bytes", where), ranks=c.count(e, "ranks", where, 1),
                          nodes=c.count(e, "nodes", where, 1, required=False),
                          transport=c.text(e, "transport", where), engine=c.text(e, "engine", where),
                          algorithm=c.text(e, "algorithm", where), variant=c.text(e, "variant", where) or "")
        if "size" in e and e["size"] != key.size:
            c.fail(f"{where}.size", f"{bounded_repr(e['size'], 40)} does not match size_bytes {key.size_bytes} "
                                    f"({key.size!r}): the file was edited inconsistently")
        if key in entries:
            c.fail(where, f"a second entry for {key.op} {key.size} ranks {key.ranks} (each key once)")
        lat = e.get("latency_avg_us")
        if not isinstance(lat, dict):
            c.fail(f"{where}.latency_avg_us", "expected an object with median, mad, sigma")
        lw = f"{where}.latency_avg_us"
        latency = {"median": c.num(lat, "median", lw, strict=True), "mad": c.num(lat, "mad", lw)}
        latency["sigma"] = c.num(lat, "sigma", lw, required=False)
        if latency["sigma"] is None:
            latency["sigma"] = 1.4826 * latency["mad"]
        for k in ("q1", "q3", "min", "max"):
            v = c.num(lat, k, lw, required=False)
            latency[k] = latency["median"] if v is None else v
        n = c.count(e, "n", where, 1)
        latency["n"] = n
        busbw = e.get("busbw_bytes_per_s")
        if busbw is not None:
            if not isinstance(busbw, dict):
                c.fail(f"{where}.busbw_bytes_per_s", "expected an object with median, or null")
            busbw = {"median": c.num(busbw, "median", f"{where}.busbw_bytes_per_s")}
        entries[key] = Entry(key=key, n=n, latency=latency, busbw=busbw, datatype=c.text(e, "datatype", where),
                             first_ts=c.timestamp(e, "first_ts", where),
                             last_ts=c.timestamp(e, "last_ts", where))
    source = data.get("source") if isinstance(data.get("source"), dict) else {}
    name = data.get("name") if isinstance(data.get("name"), str) else os.path.basename(path)
    normal = None
    if data.get("counter_normal") is not None:
        try:
            normal = counter_normal_mod.from_dict(data["counter_normal"], "counter_normal")
        except ValueError as e:      # the message names the key (counter_normal.<...>)
            raise UserError(f"baseline {path}: {e}") from None
    created = c.timestamp(data, "created_ts", "")
    if data.get("created") is not None and not isinstance(data.get("created"), str):
        c.fail("created", f"expected an ISO time string, got {bounded_repr(data['created'], 40)}")
    return Baseline(name=name[:100], entries=entries, created_ts=created, source=source, path=path,
                    collbench=data.get("collbench") if isinstance(data.get("collbench"), str) else None,
                    counter_normal=normal)


def new_baseline(name, collector, source):
    entries = collector.entries()
    source = dict(source, run_ids=list(collector.run_ids)[:100])
    normal = collector.normal if collector.normal.exposure["host"][0] else None
    return Baseline(name=name, entries=entries, created_ts=round(time.time(), 3), source=source,
                    counter_normal=normal)


def list_baselines(state_dir):
    """[(name, path)] of the baselines saved in the state directory."""
    d = os.path.join(state_dir, "baselines")
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise UserError(f"{d}: cannot list: {e.strerror}") from None
    return [(n[:-5], os.path.join(d, n)) for n in names]
