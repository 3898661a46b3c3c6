"""A production job's collectives, from the NCCL Inspector plugin's files on this host
(`exporter.inspector_dir`: the job's NCCL_INSPECTOR_DUMP_DIR, or a directory holding one
nccl-inspector-<jobid> directory per job; docs/INSPECTOR.md).

At each scrape the new lines of every <host>-pid<pid>.log are read (from the offset reached; a
file the plugin truncated on its first dump, rewrote or replaced starts over; a file deleted at the
job's end is forgotten) and every changed Prometheus textfile is read whole; each record becomes
one observation of its series (op, size bucket, nranks, nodes, communicator name -- the id before
2.30, which wrote no name) kept for `exporter.inspector_window`. 2.28/2.29 write each
communicator's latest collective on every dump: one (communicator, op, sn, rank) counts once.

    collbench_inspector_latency_seconds{op,size,nranks,nodes,comm_name,quantile}   p50, p99, max (1)
    collbench_inspector_busbw_bytes_per_second{...}       median bus bandwidth (collbench's factors)
    collbench_inspector_ops{...}                          records in the window
    collbench_inspector_slowest_host_latency_seconds{...,slowest_host}  the host whose ranks' median is highest
    collbench_inspector_latency_shift{...}                1 while the change-point test (change_point.py) says
                                                          the latency shifted up and stayed up
    collbench_inspector_latency_shift_ratio{...}          the recent median over the reference
    collbench_inspector_newest_record_age_seconds         now - the newest record's dump time
    collbench_inspector_records_total, _bad_lines_total, _duplicates_total, _file_resets_total,
    collbench_inspector_files, collbench_inspector_communicators_not_exported, _series_dropped_total

Bounded: series of the `exporter.inspector_top_k` communicators with the most bytes in the window
are exported, the others counted; at most MAX_SERIES series and MAX_OBS observations each are kept,
at most MAX_READ bytes are read per scrape (the rest on the next), every line is checked
(collbench/inspector/parse.py) and a bad one counted.
"""

import math
import os
import stat
import statistics
import threading
import time
from collections import deque

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from collbench.bounded_file import UntrustedFileError, read_limited_text
from collbench.change_point import MIN_RATIO, ShiftDetector
from collbench.exporter.collectors import Collector, NoData, register
from collbench.inspector.parse import MAX_LINE, OPS, FormatError, parse_line, parse_prom
from collbench.inspector.records import collbench_size
from collbench.ops import get_op
from collbench.sizes import format_size

MAX_FILES = 4096
MAX_SERIES = 4096
MAX_OBS = 512            # per series: the window's quantiles are of at most the latest 512
MAX_READ = 8 << 20       # bytes per scrape over all files (~17,000 records: a scrape of a few seconds at most)
START_BYTES = 8 << 20    # a log first seen larger than this is read from its last START_BYTES (the window's)
MAX_PROM_BYTES = 16 << 20
MAX_RANKS_TESTED = 64   # per series: the change-point tests of at most 64 ranks
MAX_SEEN = 1 << 18       # (communicator, op, rank) -> latest sn, for the 2.28/2.29 repeats
LABELS = ["op", "size", "nranks", "nodes", "comm_name"]


def size_bucket(nbytes):
    """The power-of-two bucket of a collbench size, as its label (`1MB` holds 1 MB .. 2 MB - 1)."""
    return format_size(1 << (nbytes.bit_length() - 1)) if nbytes > 0 else "0B"


class _Tail:
    __slots__ = ("ident", "offset", "partial", "mid_line")

    def __init__(self, ident, offset=0):
        self.ident, self.offset, self.partial = ident, offset, b""
        self.mid_line = offset > 0       # started inside the file: its first line is a part


class _Series:
    """The window's observations of one series, and one change-point test per rank: ranks of one
    collective differ systematically (the early ranks wait for the late one), so each rank is
    tested against its own reference and the series is shifted when any rank is."""
    __slots__ = ("obs", "detectors", "min_ratio", "bytes")

    def __init__(self, min_ratio):
        self.obs = deque()                    # (ts, exec_us, busbw B/s or None, host, nbytes), at most MAX_OBS
        self.detectors = {}                   # (host, rank) -> ShiftDetector
        self.min_ratio = min_ratio
        self.bytes = 0                        # the bytes of obs: the communicator's traffic, kept as it goes

    def append(self, o):
        if len(self.obs) >= MAX_OBS:
            self.popleft()
        self.obs.append(o)
        self.bytes += o[4]

    def popleft(self):
        self.bytes -= self.obs.popleft()[4]

    def test(self, host, rank, exec_us):
        det = self.detectors.get((host, rank))
        if det is None:
            if len(self.detectors) >= MAX_RANKS_TESTED:
                return
            det = self.detectors[(host, rank)] = ShiftDetector(self.min_ratio)
        det.add(exec_us)

    def shift(self):
        """(shifted, ratio) over the ranks' tests; None before any is ready."""
        ready = [d for d in self.detectors.values() if d.ready]
        if not ready:
            return None
        best = max(ready, key=lambda d: (d.shift, d.ratio))
        return best.shift, best.ratio


class InspectorCollector(Collector):
    name = "inspector"

    def __init__(self, directory, window_s=300.0, top_k=20, clock=time.time, min_ratio=MIN_RATIO):
        self.directory = directory
        self.window_s = window_s
        self.top_k = top_k
        self.clock = clock
        self.min_ratio = min_ratio
        self._lock = threading.Lock()
        self._tails = {}          # path -> _Tail
        self._prom_seen = {}      # path -> (ident, mtime_ns, size)
        self._seen = {}           # (comm_id, func, rank) -> latest sn
        self.series = {}          # label tuple -> _Series
        self.records = self.bad_lines = self.duplicates = self.resets = self.series_dropped = 0
        self.newest_ts = None

    # ------------------------------------------------------------------ reading

    def _files(self):
        out = []
        try:
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except OSError as e:
            raise NoData(f"{self.directory}: {e.strerror or e}") from None
        for e in entries:
            if len(out) >= MAX_FILES:
                break
            try:
                if e.is_dir(follow_symlinks=False):      # nccl-inspector-<jobid>: one level down
                    for sub in sorted(os.scandir(e.path), key=lambda s: s.name)[:MAX_FILES]:
                        if sub.name.endswith((".log", ".jsonl", ".prom")):
                            out.append(sub.path)
                elif e.name.endswith((".log", ".jsonl", ".prom")):
                    out.append(e.path)
            except OSError:
                continue
        return out[:MAX_FILES]

    def poll(self):
        """Read what is new in the directory; returns the records taken."""
        if not self.directory:
            raise NoData("exporter.inspector_dir is not set")
        paths = self._files()
        budget, taken = MAX_READ, 0
        live = set(paths)
        for gone in [p for p in self._tails if p not in live]:
            del self._tails[gone]                  # deleted at the job's end
        for gone in [p for p in self._prom_seen if p not in live]:
            del self._prom_seen[gone]
        for path in paths:
            if path.endswith(".prom"):
                taken += self._read_prom(path)
            elif budget > 0:
                n, used = self._read_json(path, budget)
                taken += n
                budget -= used
        return taken

    def _read_json(self, path, budget):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            return 0, 0
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return 0, 0
            ident = (st.st_dev, st.st_ino)
            tail = self._tails.get(path)
            if tail is None or tail.ident != ident or st.st_size < tail.offset:
                if tail is not None:
                    self.resets += 1               # truncated on the first dump, rewritten, replaced
                    tail = self._tails[path] = _Tail(ident)
                else:       # first seen (the exporter started during a job): its recent end only
                    tail = self._tails[path] = _Tail(ident, max(0, st.st_size - START_BYTES))
            want = min(st.st_size - tail.offset, budget)
            if want <= 0:
                return 0, 0
            data = os.pread(fd, want, tail.offset)
        except OSError:
            return 0, 0
        finally:
            os.close(fd)
        tail.offset += len(data)
        data = tail.partial + data
        if tail.mid_line:
            cut = data.find(b"\n")
            if cut < 0:
                tail.partial = b"" if len(data) > MAX_LINE else data
                return 0, len(data)
            data, tail.mid_line = data[cut + 1:], False
        lines = data.split(b"\n")
        tail.partial = lines.pop()
        if len(tail.partial) > MAX_LINE:
            self.bad_lines += 1
            tail.partial = b""
        n = 0
        for line in lines:
            if not line.strip():
                continue
            try:
                op = parse_line(line)
            except FormatError:
                self.bad_lines += 1
                continue
            n += self._take(op)
        return n, len(data)

    def _take(self, op):
        key = (op.comm_id, op.func, op.rank, op.kind, op.peer)
        last = self._seen.get(key)
        if last is not None and op.sn <= last:
            self.duplicates += 1
            return 0
        if len(self._seen) >= MAX_SEEN:
            self._seen.clear()
        self._seen[key] = op.sn
        self.records += 1
        ts = op.stop_us / 1e6 if op.stop_us else op.dump_us / 1e6
        now = self.clock()
        if not now - 86400 < ts < now + 3600:      # a clock far off: when it was read
            ts = now
        self.newest_ts = ts if self.newest_ts is None else max(self.newest_ts, ts)
        op_name = op.op
        if op_name is None:
            return 1
        self._observe(op_name, collbench_size(op_name, op.msg_bytes, op.n_ranks), op.n_ranks, op.nnodes,
                      op.comm_name if op.comm_name not in (None, "unknown") else op.comm_id, ts, op.exec_us,
                      op.hostname, op.rank)
        return 1

    def _observe(self, op_name, size, nranks, nnodes, comm, ts, exec_us, host, rank):
        labels = (op_name, size_bucket(size), str(nranks), str(nnodes), comm)
        ser = self.series.get(labels)
        if ser is None:
            if len(self.series) >= MAX_SERIES:
                self.series_dropped += 1
                return
            ser = self.series[labels] = _Series(self.min_ratio)
        _, busbw = get_op(op_name).bandwidth(size, nranks, exec_us)
        ser.append((ts, exec_us, busbw, host, get_op(op_name).data_bytes(size, nranks)))
        ser.test(host, rank, exec_us)

    def _read_prom(self, path):
        try:
            st = os.stat(path)
        except OSError:
            return 0
        sig = ((st.st_dev, st.st_ino), st.st_mtime_ns, st.st_size)
        if self._prom_seen.get(path) == sig:
            return 0
        self._prom_seen[path] = sig
        try:
            text = read_limited_text(path, MAX_PROM_BYTES)
        except UntrustedFileError:
            self.bad_lines += 1
            return 0
        form, items, bad = parse_prom(text)
        self.bad_lines += len(bad)
        now = self.clock()
        for it in items:
            op_name = OPS.get(it.func) if getattr(it, "kind", "coll") == "coll" else None
            self.records += 1
            self.newest_ts = now if self.newest_ts is None else max(self.newest_ts, now)
            if op_name is None:
                continue
            if form == "prom-2.30":     # one bucket: the interval's mean, one observation
                self._observe(op_name, collbench_size(op_name, it.size_low, it.n_ranks), it.n_ranks, it.nnodes,
                              it.comm_name, now, it.exec_us, it.node, it.gpu)
            else:
                key = (it.comm_id, it.func, it.rank, "prom", None)
                if self._seen.get(key, -1) >= it.sn:
                    self.duplicates += 1
                    continue
                self._seen[key] = it.sn
                self._observe(op_name, collbench_size(op_name, it.msg_bytes, it.n_ranks), it.n_ranks, it.nnodes,
                              it.comm_id, now, it.exec_us, it.hostname, it.rank)
        return len(items)

    # ------------------------------------------------------------------ exporting

    def collect(self):
        with self._lock:
            self.poll()
            return list(self._families())

    def _families(self):
        now = self.clock()
        horizon = now - self.window_s
        traffic, rows = {}, []
        for labels, ser in list(self.series.items()):
            while ser.obs and ser.obs[0][0] < horizon:
                ser.popleft()
            if not ser.obs:
                if not (ser.shift() or (False,))[0]:
                    del self.series[labels]
                continue
            rows.append((labels, ser))
            traffic[labels[4]] = traffic.get(labels[4], 0) + ser.bytes
        keep = set(sorted(traffic, key=lambda c: (-traffic[c], c))[:self.top_k])
        lat = GaugeMetricFamily("collbench_inspector_latency_seconds",
                                "Latency quantiles (0.5, 0.99, 1 = max) over exporter.inspector_window of the "
                                "Inspector's per-rank collective time (coll_exec_time_us) on this host.",
                                labels=LABELS + ["quantile"])
        bw = GaugeMetricFamily("collbench_inspector_busbw_bytes_per_second",
                               "Median bus bandwidth over the window (collbench's bus factors, docs/METRICS.md).",
                               labels=LABELS)
        count = GaugeMetricFamily("collbench_inspector_ops", "Inspector records in the window.", labels=LABELS)
        slow = GaugeMetricFamily("collbench_inspector_slowest_host_latency_seconds",
                                 "The median latency of the host whose ranks' median is the highest in the window "
                                 "(the host label names it).", labels=LABELS + ["slowest_host"])
        shift = GaugeMetricFamily("collbench_inspector_latency_shift",
                                  "1 while the latency shifted up and stayed up (the change-point test of "
                                  "collbench_latency_shift, over every record) by at least alerts.shift_ratio.",
                                  labels=LABELS)
        ratio = GaugeMetricFamily("collbench_inspector_latency_shift_ratio",
                                  "The latest records' median over the in-control reference.", labels=LABELS)
        for labels, ser in sorted(rows):
            if labels[4] not in keep:
                continue
            times = sorted(o[1] for o in ser.obs)
            for q, v in (("0.5", _quantile(times, 0.5)), ("0.99", _quantile(times, 0.99)), ("1", times[-1])):
                lat.add_metric(list(labels) + [q], v / 1e6)
            bws = [o[2] for o in ser.obs if o[2] is not None]
            if bws:
                bw.add_metric(list(labels), statistics.median(bws))
            count.add_metric(list(labels), len(ser.obs))
            per_host = {}
            for o in ser.obs:
                per_host.setdefault(o[3], []).append(o[1])
            host, med = max(((h, statistics.median(v)) for h, v in per_host.items()), key=lambda hv: (hv[1], hv[0]))
            slow.add_metric(list(labels) + [host], med / 1e6)
            tested = ser.shift()
            if tested is not None:
                shift.add_metric(list(labels), 1.0 if tested[0] else 0.0)
                ratio.add_metric(list(labels), tested[1])
        yield from (lat, bw, count, slow, shift, ratio)
        age = GaugeMetricFamily("collbench_inspector_newest_record_age_seconds",
                                "Seconds since the newest Inspector record was written (its dump time): a job that "
                                "stopped, or a dump thread that is off, shows as a growing age.")
        if self.newest_ts is not None:
            age.add_metric([], max(0.0, now - self.newest_ts))
        yield age
        yield GaugeMetricFamily("collbench_inspector_files", "Inspector JSON logs followed.", value=len(self._tails))
        yield GaugeMetricFamily("collbench_inspector_communicators_not_exported",
                                "Communicators with records in the window beyond exporter.inspector_top_k (by bytes).",
                                value=len(traffic) - len(keep))
        for name, doc, v in (
                ("collbench_inspector_records", "Inspector records read (every shape; repeats not counted).",
                 self.records),
                ("collbench_inspector_bad_lines", "Lines that are not Inspector records, counted and skipped.",
                 self.bad_lines),
                ("collbench_inspector_duplicates", "Records of a collective already read (2.28/2.29 repeat each "
                 "communicator's latest collective on every dump).", self.duplicates),
                ("collbench_inspector_file_resets", "Logs read again from the start: truncated by the plugin's first "
                 "dump, rewritten or replaced.", self.resets),
                ("collbench_inspector_series_dropped", "Observations not kept because MAX_SERIES series were held.",
                 self.series_dropped)):
            yield CounterMetricFamily(name, doc, value=v)


def _quantile(sorted_values, q):
    """The nearest-rank quantile of a sorted list."""
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


@register("inspector", counters=True, enabled_by="inspector_dir")
def _inspector(ex, _device_filter):
    # exporter.inspector_dir set: follow the job's Inspector files (on --counters-only too)
    return InspectorCollector(ex.setting("inspector_dir"), ex.setting("inspector_window"),
                              ex.setting("inspector_top_k"), ex.clock, ex.setting("shift_ratio"))
