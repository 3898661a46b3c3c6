"""Read results files into per-series lists of compact steps: only what the diagnosis uses
(latency, the host of the rank the others waited for, the congestion signals that moved), so
10,000 steps of 1024 hosts stay a few MB. Records come through the project's one reader (results.file_reader:
untrusted lines are counted, never fatal); the counter side of a record is congestion.attribution's.
"""

import sys
from collections import Counter
from typing import NamedTuple

from collbench.baselines.baseline_file import key_of
from collbench.congestion.attribution import signals


class Step(NamedTuple):
    ts: float
    seq: int
    latency_us: float
    off_cpu: tuple        # (host, on-CPU share, its peers' mean) of the rank off its CPU the most; None: unknown
    window_s: float       # the congestion window's length; None without a congestion field
    moved: tuple          # ((host, "<counter>@<where>", delta), ...) of the signals that moved
    source: str           # the congestion field's source ("engine", "osu-run") or None


def rank_host(rank, rec):
    """The host of `rank`: ranks are placed in blocks of ranks/nodes per host, in the order of
    `hosts` (mpirun's by-slot fill); None when that cannot be told."""
    hosts, ranks = rec.get("hosts"), rec.get("ranks")
    if (not isinstance(rank, int) or isinstance(rank, bool) or not isinstance(ranks, int) or not hosts
            or not isinstance(hosts, (list, tuple)) or ranks <= 0 or ranks % len(hosts) or not 0 <= rank < ranks):
        return None
    host = hosts[rank // (ranks // len(hosts))]
    return host if isinstance(host, str) else None


def _share(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0 else None


def off_cpu(rec):
    """(host, on, peers_on) of the rank that spent the largest share of the step's loop off its
    CPU (`offcpu_rank`, `offcpu_share_max`): the share of the loop it was on its CPU, and the
    mean of the other ranks' (from `offcpu_share_avg`); None for a record without the fields
    (older logs, the OSU and nccl-tests engines), with values out of range, or whose rank's host
    cannot be told."""
    top, avg, ranks = _share(rec.get("offcpu_share_max")), _share(rec.get("offcpu_share_avg")), rec.get("ranks")
    if top is None or avg is None or avg > top or not isinstance(ranks, int) or ranks < 2:
        return None
    host = rank_host(rec.get("offcpu_rank"), rec)
    if host is None:
        return None
    peers_off = min(max((ranks * avg - top) / (ranks - 1), 0.0), 1.0)
    return host, 1.0 - top, 1.0 - peers_off


class Loaded:
    """The consumer ResultsInput.consume fills (add, merge): series by BaselineKey, plus what the
    records said about the cluster (nodes, ranks, transports) and how many lacked evidence."""

    def __init__(self):
        self.series = {}              # BaselineKey -> [Step]
        self.clusters = Counter()     # (nodes, ranks, transport) -> results
        self.failures = 0
        self.results = 0
        self.no_congestion = 0        # results without a congestion field
        self.osu_run = 0              # results whose counters are the launching host's only
        self.no_off_cpu = 0           # results without the off-CPU rank (or whose host cannot be told)

    def add(self, rec):
        t = rec.get("type")
        if t == "failure":
            self.failures += 1
            return
        if t != "result":
            return
        self.results += 1
        self.clusters[(rec.get("nodes"), rec.get("ranks"), rec.get("transport"))] += 1
        field = rec.get("congestion")
        window, moved, source = None, (), None
        if isinstance(field, dict):
            source = field.get("source")
            window = max(float(field["t_end"]) - float(field["t_start"]), 1e-6)
            # signals(): the exporter's rule too (routine TCP retransmissions are no evidence)
            moved = tuple((sys.intern(h), sys.intern(k), d)
                          for h, per in signals(field).items() for k, d in per.items())
            if source == "osu-run":
                self.osu_run += 1
        else:
            self.no_congestion += 1
        late = off_cpu(rec)
        if late is None:
            self.no_off_cpu += 1
        else:
            late = (sys.intern(late[0]), late[1], late[2])
        step = Step(float(rec.get("ts") or 0.0), int(rec.get("seq") or 0), float(rec["latency_avg_us"]),
                    late, window, moved, source)
        self.series.setdefault(key_of(rec), []).append(step)

    def merge(self, other):
        for k, steps in other.series.items():
            self.series.setdefault(k, []).extend(steps)
        self.clusters.update(other.clusters)
        for name in ("failures", "results", "no_congestion", "osu_run", "no_off_cpu"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def finish(self):
        """Each series in time order (files and parallel parts arrive in any order)."""
        for steps in self.series.values():
            steps.sort(key=lambda s: (s.ts, s.seq))
        return self


def load(results_input):
    """A Loaded of every usable result in the inputs (a ResultsInput)."""
    return results_input.consume(Loaded).finish()
