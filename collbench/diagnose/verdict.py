"""The diagnosis both inputs share (a results log, a production job's Inspector records): the
Diagnosis they print, and the suspects that explain a set of regressions."""

from dataclasses import dataclass, field

from collbench.diagnose import evidence, ranking
from collbench.diagnose.output import label


@dataclass
class Diagnosis:
    method: str
    baseline_name: str
    regressions: list
    suspects: list
    notes: list = field(default_factory=list)
    input: dict = field(default_factory=dict)

    def method_text(self):
        return f"against baseline {self.baseline_name}" if self.baseline_name else "persistent shifts within each series"


def explain(loaded, regs, normal=None):
    """The ranked suspects of the regressions regs of loaded's series; normal: the baseline's
    counter normal (None: the results' own good steps only)."""
    # the pooled evidence first: of equal suspects the first one's evidence is kept, and the slow
    # steps of several series say more than one series' (a `once` run's single step)
    per = _pooled(loaded, regs, normal)
    for r in regs:
        ev = evidence.gather(loaded.series[r.key], r.slow, r.normal_steps, r.key.nodes, normal)
        per.append(([label(r.key)], ranking.suspects_of(ev, r.key.nodes)))
    return ranking.rank(per)


def _pooled(loaded, regs, normal):
    """Suspects from the slow steps of every regression of one cluster shape taken together (a
    `once` run against a baseline has one step per series: alone, none shows a pattern); the
    good steps are the regressed series' normal steps and every step of the series that did not
    regress -- before the group's first onset when every shift's normal is its steps before its
    onset (a fault touches the series it did not slow too: a lossy link's alltoall moves its loss
    while only the allreduce crossed the gate). The counters and the off-CPU rank are
    the host's, not the op's, so they pool over ops."""
    out = []
    shapes = {}
    for r in regs:
        shapes.setdefault((r.key.nodes, r.key.ranks), []).append(r)
    for (nodes, ranks), group in shapes.items():
        if len(group) < 2:
            continue
        steps, slow, good = [], [], []
        regressed = {r.key for r in group}
        onset = min(r.onset_ts for r in group) if all(r.normal is not None for r in group) else None
        for r in group:
            base = len(steps)
            steps += loaded.series[r.key]
            slow += [base + i for i in r.slow]
            good += [base + i for i in r.normal_steps]
        for key, series in loaded.series.items():
            if key not in regressed and (key.nodes, key.ranks) == (nodes, ranks):
                good += [len(steps) + i for i, s in enumerate(series) if onset is None or s.ts < onset]
                steps += series
        ev = evidence.gather(steps, slow, good, nodes, normal)
        out.append(([label(r.key) for r in group], ranking.suspects_of(ev, nodes)))
    return out
