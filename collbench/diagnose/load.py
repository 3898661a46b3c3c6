"""Read results files into per-series lists of compact steps: only what the diagnosis uses
(latency, the host of the rank the others waited for, the congestion signals that moved), so
10,000 steps of 1024 hosts stay a few MB. Records come through the project's one reader (results.file_reader:
untrusted lines are counted, never fatal); the counter side of a record is congestion.attribution's.
"""

from collections import Counter
from typing import NamedTuple

from collbench import off_cpu
from collbench.baselines.baseline_file import key_of
from collbench.congestion.attribution import flagged_signal_items
from collbench.congestion.counters import path_row
from collbench.congestion.record_field import path_loss_items


class Step(NamedTuple):
    ts: float
    seq: int
    latency_us: float
    off_cpu: tuple        # off_cpu.OffCpu of the rank off its CPU the most; None: unknown
    window_s: float       # the congestion window's length; None without a congestion field
    moved: tuple          # ((host, "<counter>@<where>", delta, routine), ...) of the signals that moved
    source: str           # the congestion field's source ("engine", "osu-run") or None
    paths: tuple = None   # ((host, peer, counter, value), ...) per peer; None: the record has none


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
        self._steps = {}              # the fields key_of reads -> that series' list (a cache)

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
        window, moved, source, paths = None, (), None, None
        if isinstance(field, dict):
            source = field.get("source")
            window = max(float(field["t_end"]) - float(field["t_start"]), 1e-6)
            # the exporter's rule too (routine TCP retransmissions are no evidence; flagged, since a
            # counter's normal counts them);
            # its strings are shared between steps (cached per key), so 10,000 steps stay small
            moved = tuple(flagged_signal_items(field))
            if "paths" in field:     # newer engines: per-peer counters (counters.PATH_COUNTERS), loss
                # net of the retransmissions the peer DSACKed (spurious: record_field.path_loss_items)
                paths = tuple(p for p in path_loss_items(field) if path_row(p[2]) is not None)
            if source == "osu-run":
                self.osu_run += 1
        else:
            self.no_congestion += 1
        late = off_cpu.of_record(rec)     # its host: a string of the reader's shared `hosts` tuple
        if late is None:
            self.no_off_cpu += 1
        step = Step(float(rec.get("ts") or 0.0), int(rec.get("seq") or 0), float(rec["latency_avg_us"]),
                    late, window, moved, source, paths)
        # the series key, built once per distinct set of the fields it reads (a few per log)
        raw = (rec["op"], rec["size_bytes"], rec["ranks"], rec.get("nodes"), rec.get("transport"), rec.get("engine"),
               rec.get("algorithm"), rec.get("timing"), rec.get("inplace"), rec.get("root"))
        steps = self._steps.get(raw)
        if steps is None:
            steps = self._steps[raw] = self.series.setdefault(key_of(rec), [])
        steps.append(step)

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
