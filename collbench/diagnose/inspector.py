"""`diagnose --inspector DIR|RESULTS`: a production job's slow collectives (NCCL Inspector
records), explained with the counters of the hosts in those minutes.

The job's records carry no counters, so each collective is given those of the interval it ran in,
from where they already are:
  * `--prometheus URL`: the per-host counters exporters as Prometheus scraped them (range queries of
    each counter's increase per host over every interval of `--step` seconds of the job:
    collbench/congestion/from_prometheus.py);
  * `--counters-from RESULTS`: a results log of the stress loop that ran beside the job (each of its
    steps' `congestion` field covers the collectives that ran in its window).
Then every collective is a step of its series (op, size, ranks, nodes), and the slow ones are found
and explained by diagnose's own rules: a persistent shift within the series, or against
`--baseline`; evidence.gather and ranking over the slow and good steps, as for the stress loop. The
counters of one interval are shared by the collectives in it: the rates stay the interval's
(delta over window), and a counter moving in most slow intervals and not in the good ones is what
names a host.
"""

import bisect
import os

from collbench.errors import UserError

DEFAULT_STEP_S = 5.0
SOURCE = "prometheus"


def _records(paths):
    """Result records of the job: Inspector files and directories (collbench/inspector) or results
    files holding imported ones (engine nccl-inspector). (records, what was read, bad lines)."""
    from collbench.inspector.load import load
    from collbench.results.file_reader import ResultsInput
    inspector_paths, results_paths = [], []
    for p in paths:
        (results_paths if _results_file(p) else inspector_paths).append(p)
    records, bad, read = [], 0, []
    if inspector_paths:
        loaded = load(inspector_paths)
        records += loaded.records
        bad += sum(f.bad_lines for f in loaded.files)
        read.append(f"{len(loaded.files)} Inspector file(s), {len(loaded.records)} collective(s)")
    if results_paths:
        class Keep:
            def __init__(self):
                self.recs = []

            def add(self, rec):
                if rec.get("type") == "result":
                    self.recs.append(rec)

            def merge(self, other):
                self.recs += other.recs
        src = ResultsInput(results_paths)
        got = src.consume(Keep).recs
        records += got
        bad += src.bad_lines
        read.append(f"{len(got)} result record(s) from {len(src.paths)} results file(s)")
    return records, "; ".join(read), bad


def _results_file(path):
    """A collbench results file (not the plugin's): a regular file, not .gz, .log or .prom, whose
    first line is not an Inspector record (the plugin's JSON lines open with "header")."""
    if not os.path.isfile(path) or path.endswith((".gz", ".log", ".prom")):
        return False
    try:
        with open(path, "rb") as f:     # a regular file (checked): 4 KB read, whatever its size
            head = f.read(4096)
    except OSError:
        return True                     # the results reader names the file and why
    return not head.lstrip().startswith(b'{"header"')


def _when(rec):
    return float(rec.get("t_end") or rec.get("ts") or 0.0)


def _stress_windows(paths):
    """[(t_start, t_end, moved)] of the stress loop's steps that carry counters, by start."""
    from collbench.results.file_reader import ResultsInput

    class Windows:
        def __init__(self):
            self.rows = []

        def add(self, rec):
            f = rec.get("congestion") if rec.get("type") == "result" else None
            if isinstance(f, dict) and isinstance(f.get("moved"), dict):
                try:
                    self.rows.append((float(f["t_start"]), float(f["t_end"]), f["moved"]))
                except (KeyError, TypeError, ValueError):
                    pass

        def merge(self, other):
            self.rows += other.rows
    rows = ResultsInput(paths).consume(Windows).rows
    rows.sort(key=lambda r: r[0])
    return rows


def attach_counters(records, prometheus=None, counters_from=None, step_s=DEFAULT_STEP_S):
    """Give each record a `congestion` field: the counters of the interval it ran in. Returns the
    number of records given counters."""
    if prometheus:
        from collbench.congestion.from_prometheus import Prometheus, PrometheusError
        times = [_when(r) for r in records]
        try:
            inc = Prometheus(prometheus).increases(min(times) - step_s, max(times) + step_s, step_s)
        except PrometheusError as e:
            raise UserError(str(e)) from None
        grid = sorted(inc)
        n = 0
        for rec, t in zip(records, times):
            i = bisect.bisect_left(grid, t)      # the first interval end at or after the collective
            if i == len(grid):
                continue
            end = grid[i]
            rec["congestion"] = {"source": SOURCE, "t_start": end - step_s, "t_end": end, "moved": dict(inc[end])}
            n += 1
        return n
    rows = _stress_windows(counters_from)
    starts = [r[0] for r in rows]
    n = 0
    for rec in records:
        t = _when(rec)
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and rows[i][0] <= t <= rows[i][1]:
            rec["congestion"] = {"source": "stress-log", "t_start": rows[i][0], "t_end": rows[i][1],
                                 "moved": dict(rows[i][2])}
            n += 1
    return n


def diagnose_inspector(paths, prometheus=None, counters_from=None, baseline=None, step_s=DEFAULT_STEP_S,
                       shift_ratio=None):
    """(Diagnosis, summary line) of a job's Inspector records."""
    from collbench.diagnose import regression
    from collbench.diagnose.load import Loaded
    from collbench.diagnose.verdict import Diagnosis, explain
    if not prometheus and not counters_from:
        raise UserError("--inspector: give where the hosts' counters are: --prometheus URL (the counters "
                        "exporters' Prometheus) or --counters-from RESULTS (the stress loop's results log)")
    records, read, bad = _records(paths)
    records = [r for r in records if r.get("type") == "result" and r.get("engine") == "nccl-inspector"]
    if not records:
        raise UserError(f"{', '.join(paths)[:200]}: no NCCL Inspector collective ({read or 'nothing read'}): "
                        "nothing to diagnose")
    with_counters = attach_counters(records, prometheus, counters_from, step_s)
    loaded = Loaded()
    for rec in sorted(records, key=lambda r: (_when(r), r.get("comm_id", ""), r.get("coll_sn", 0))):
        loaded.add(rec)
    loaded.finish()
    notes = []
    regs, det_notes = regression.detect(loaded.series, baseline, shift_ratio=shift_ratio)
    notes += det_notes
    suspects = explain(loaded, regs, baseline.counter_normal if baseline is not None else None)
    where = f"Prometheus {prometheus} (increase per {step_s:g} s)" if prometheus else f"the stress log {counters_from}"
    notes.append(f"the job's counters: {with_counters} of {len(records)} collective(s) got the counters of their "
                 f"interval from {where}")
    waited = {}
    for r in records:
        if r.get("waited_for_host"):
            waited[r["waited_for_host"]] = waited.get(r["waited_for_host"], 0) + 1
    if waited:
        top = sorted(waited.items(), key=lambda kv: -kv[1])[:3]
        notes.append("ranks the others waited for (Inspector, per collective): "
                     + ", ".join(f"{h} {n}x" for h, n in top))
    if bad:
        notes.append(f"{bad} bad line(s) skipped in the input")
    d = Diagnosis("baseline" if baseline is not None else "shift", baseline.name if baseline is not None else None,
                  regs, suspects, notes, {"files": list(paths), "results": len(records), "failures": 0,
                                          "bad_lines": bad, "series": len(loaded.series)})
    return d, f"{read}; {with_counters} with counters"
