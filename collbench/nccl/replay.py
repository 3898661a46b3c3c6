"""`collbench nccl replay`: time an NCCL/RCCL log's collectives through MPI on this cluster.

The census says what a job ran; the replay times it here with the built-in engine, on the
config's hosts, launcher and transport (how a call becomes an engine step: replay_plan.py).

- grouped order (default): each distinct configuration of the census (op, count, datatype,
  redop, nranks, in place) is timed on its own: warm-up calls, then `iterations` timed calls,
  each a one-iteration engine step, so every call's time is known (mean, median, min, max). The
  estimated time of the log's collectives on this fabric is sum(calls x mean), per rank.
- log order: one rank's sequence on one communicator, call by call in the log's order, each call
  an engine step of a few iterations; consecutive calls share one engine plan (one MPI job). The
  RCCL replayer's CSV comes from it, with busbw computed from nranks.

A call's time is the ranks' average (nccl-tests' default, the engine's avg). Communicators are
replayed at their own size when the config (or --np) provides that many ranks, else at the ranks
it provides, with a warning in the output and in the run's `nccl_replay` event record.

Python API:
    result = replay_grouped(paths, cfg, settings)   # or replay_log(...); a ReplayResult
    result.document()                               # what --format json prints
    result.records                                  # results-log records (result, failure, event)
"""

import copy
import errno
import os
import stat
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from collbench.results import records
from collbench.config import apply_overrides
from collbench.errors import UserError
from collbench.nccl.formats import OPS as NCCL_OPS
from collbench.nccl.replay_plan import (CSV_HEADER, DEFAULT_MAX_BYTES, DEFAULT_MAX_CALLS, DEFAULTS,
                                        RCCL_DATATYPE_NAMES, EngineCall, check_capacity,
                                        plan_call, plan_groups, plan_warnings, rcclname_redop, replay_ranks)

SCHEMA = 1
MAX_PLAN_STEPS = 4000       # steps per engine plan (one MPI job); plan files stay far below the engine's 1 MB
EVENT_LIST_MAX = 256        # configurations listed in the run's event record
RUN_ID_PREFIX = "nccl-replay-"


@dataclass
class Settings:
    order: str = "grouped"
    iterations: Optional[int] = None        # None: DEFAULTS[order]
    warmup: Optional[int] = None
    max_bytes: int = DEFAULT_MAX_BYTES
    np: Optional[int] = None                # --np: the ranks the config provides
    comm: Optional[str] = None              # log order: the communicator
    max_calls: int = DEFAULT_MAX_CALLS
    validate: bool = False
    quiet: bool = False

    def counts(self):
        it, wu = DEFAULTS[self.order]
        return (self.iterations if self.iterations is not None else it,
                self.warmup if self.warmup is not None else wu)


def stats(values):
    """(mean, median, min, max) of a non-empty list."""
    return (statistics.fmean(values), statistics.median(values), min(values), max(values))


def nearest_rank(sorted_values, pct):
    """The engine's nearest-rank percentile (collbench_engine.c percentile())."""
    n = len(sorted_values)
    k = int(pct / 100.0 * n + 0.999999)
    return sorted_values[min(max(k, 1), n) - 1]


# --- running ---------------------------------------------------------------------------------------

class Runner:
    """Runs engine steps at a given number of ranks; one RunContext per rank count, one run_id."""

    def __init__(self, cfg, settings, run_id=None):
        from collbench import engines
        from collbench.engines.launcher import mpi_version
        self.cfg = cfg
        self.settings = settings
        self.run_id = run_id or RUN_ID_PREFIX + records.new_run_id()
        self.engine = engines.get_engine("builtin")
        self.mpi = mpi_version(cfg)
        self.contexts = {}
        self.failures = []      # failure records of the engine

    def context(self, nranks):
        """(cfg, RunContext) for a job of nranks ranks on the config's hosts."""
        if nranks not in self.contexts:
            cfg = copy.copy(self.cfg)
            apply_overrides(cfg, np=nranks)
            if cfg.hosts_order:     # rank r on hosts_order[r]: the first nranks of them
                cfg.hosts_order = list(cfg.hosts_order[:nranks])
            cfg.validate = self.settings.validate
            self.contexts[nranks] = (cfg, records.RunContext(cfg, "builtin", self.mpi, run_id=self.run_id))
        return self.contexts[nranks]

    def preflight(self, nranks, steps):
        cfg, _ = self.context(nranks)
        self.engine.preflight(cfg, steps[:1])

    def run(self, nranks, steps, what):
        """The engine's record per step (None where it gave none), in plans of MAX_PLAN_STEPS steps."""
        cfg, ctx = self.context(nranks)
        out = []
        for start in range(0, len(steps), MAX_PLAN_STEPS):
            chunk = steps[start:start + MAX_PLAN_STEPS]
            if not self.settings.quiet:
                print(f"collbench: replay: {what}: steps {start + 1}-{start + len(chunk)} of {len(steps)} "
                      f"at {nranks} rank{'s' if nranks != 1 else ''}", file=sys.stderr, flush=True)
            got = list(self.engine.run_steps(cfg, chunk, ctx))
            out += got[:len(chunk)] + [None] * (len(chunk) - len(got))
        for rec in out:
            if rec is not None and rec.get("type") == "failure":
                self.failures.append(rec)
        return out

    def ctx(self, nranks):
        return self.context(nranks)[1]


def _outcome(rec):
    """(time_us, slowest_us, validation, ts, error) of one engine record."""
    if rec is None:
        return None, None, None, None, "the engine produced no record for this step"
    if rec.get("type") != "result":
        return None, None, None, None, rec.get("error") or "failed"
    return rec["latency_avg_us"], rec["latency_max_us"], rec.get("validation", "off"), rec.get("ts"), None


# --- configurations --------------------------------------------------------------------------------

@dataclass
class Timed:
    """One configuration of the log: timed on its own (grouped order) or gathered from the calls
    of the sequence (log order)."""
    op: str                 # NCCL's name
    count: int
    datatype: str           # NCCL's
    redop: Optional[str]
    nranks: int             # the log's communicator size
    inplace: bool
    calls: int              # per rank
    call: object            # EngineCall or NotReplayed
    roots: list = field(default_factory=list)
    times_us: list = field(default_factory=list)    # measured time per timed unit (ranks' average)
    slowest_us: list = field(default_factory=list)  # the slowest rank's time per unit
    validation: list = field(default_factory=list)
    failure: Optional[str] = None
    last_ts: Optional[float] = None
    total_us: float = 0.0   # estimated: calls x mean (scaled when capped)
    share: float = 0.0

    @property
    def replayed(self):
        return isinstance(self.call, EngineCall)

    def summary(self):
        """(mean, median, min, max) per call in us, scaled when capped (an estimate then); or None."""
        if not self.times_us:
            return None
        return tuple(v * self.call.scale for v in stats(self.times_us))

    def take(self, rec):
        time_us, slowest, validation, ts, error = _outcome(rec)
        if error:
            self.failure = self.failure or error
            return
        self.times_us.append(time_us)
        self.slowest_us.append(slowest)
        self.validation.append(validation)
        self.last_ts = ts

    def row(self):
        """The configuration as a flat dict (CSV row and JSON)."""
        d = {"op": self.op, "count": self.count, "datatype": self.datatype, "redop": self.redop,
             "nranks": self.nranks, "inplace": self.inplace, "calls": self.calls,
             "roots": list(self.roots)}
        if not self.replayed:
            d.update(status="not replayed", reason=self.call.reason)
            return d
        c = self.call
        s = self.summary()
        d.update(status="failed" if self.failure and not s else "replayed", reason=self.failure,
                 collbench_op=c.op, engine_datatype=c.datatype, stand_in=c.stand_in, replay_nranks=c.nranks,
                 root=c.root, size_bytes=c.size_bytes, bytes_per_call=c.bytes_per_call,
                 measured_count=c.measured_count, scale=c.scale, estimated=c.capped,
                 timed=len(self.times_us))
        if s:
            algbw, busbw = c.bandwidth(s[0] / c.scale)
            d.update(mean_us=s[0], median_us=s[1], min_us=s[2], max_us=s[3], algbw_bytes_per_s=algbw,
                     busbw_bytes_per_s=busbw, total_s=self.total_us / 1e6, share=self.share)
        return d


def _shares(timed):
    for t in timed:
        s = t.summary()
        t.total_us = t.calls * s[0] if s else 0.0
    total = sum(t.total_us for t in timed)
    for t in timed:
        t.share = t.total_us / total if total else 0.0


@dataclass
class LoggedTimed:
    """One call of the replayed sequence."""
    position: int           # 1-based, in the rank's sequence on the communicator (every call counted)
    op: str
    count: int
    datatype: str
    redop: Optional[str]
    redop_value: int
    root: int               # as logged (the peer for Send/Recv)
    inplace: bool
    call: object            # EngineCall or NotReplayed
    time_us: Optional[float] = None         # measured: ranks' average over the call's iterations
    slowest_us: Optional[float] = None
    validation: Optional[str] = None
    ts: Optional[float] = None
    failure: Optional[str] = None

    @property
    def estimated_us(self):
        return None if self.time_us is None else self.time_us * self.call.scale

    def row(self):
        d = {"position": self.position, "op": self.op, "count": self.count, "datatype": self.datatype,
             "redop": self.redop, "root": self.root, "inplace": self.inplace}
        if not isinstance(self.call, EngineCall):
            d.update(status="not replayed", reason=self.call.reason)
            return d
        c = self.call
        d.update(status="failed" if self.failure else "replayed", reason=self.failure, collbench_op=c.op,
                 engine_datatype=c.datatype, size_bytes=c.size_bytes, measured_count=c.measured_count,
                 scale=c.scale, estimated=c.capped, time_us=self.estimated_us, measured_us=self.time_us)
        if self.time_us is not None:
            d["algbw_bytes_per_s"], d["busbw_bytes_per_s"] = c.bandwidth(self.time_us)
        return d


# --- the result ------------------------------------------------------------------------------------

@dataclass
class ReplayResult:
    order: str
    runner: Runner
    settings: Settings
    census_totals: dict
    configurations: list            # [Timed], replayed and not
    warnings: list
    inputs: list
    calls: list = None              # log order: [LoggedTimed]
    communicator: dict = None       # log order: the set, member and sizes
    records: list = field(default_factory=list)

    @property
    def failed(self):
        return [t for t in self.configurations if t.replayed and t.failure]

    @property
    def total_us(self):
        return sum(t.total_us for t in self.configurations)

    def document(self):
        it, wu = self.settings.counts()
        doc = {"schema": SCHEMA, "kind": "nccl_replay", "order": self.order, "run_id": self.runner.run_id,
               "engine": "builtin", "mpi": self.runner.mpi, "transport": self.runner.cfg.transport,
               "config": self.runner.cfg.source, "inputs": self.inputs, "iterations": it, "warmup": wu,
               "max_bytes": self.settings.max_bytes, "np": self.settings.np,
               "time_definition": "a call's time is the ranks' average (nccl-tests' convention); *_us in microseconds",
               "total_time_s": self.total_us / 1e6, "warnings": self.warnings,
               "census": self.census_totals,
               "configurations": [t.row() for t in self.configurations]}
        if self.order == "log":
            doc["communicator"] = self.communicator
            doc["calls"] = [c.row() for c in self.calls]
        return doc


def _census_totals(census):
    t = census.totals
    return {"lines": t["lines"], "collective_lines": t["collective_lines"],
            "malformed_lines": t["malformed_lines"], "desync_findings": len(census.desync)}


def _census_warnings(census):
    w = list(census.warnings)
    if census.desync:
        w.append(f"the census found {len(census.desync)} desync finding(s) in the log (`collbench nccl census` "
                 f"shows them): the ranks did not issue the same collectives")
    return w


# --- grouped ---------------------------------------------------------------------------------------

def replay_grouped(paths, cfg, settings, run_id=None):
    """Census the logs, then time each distinct configuration. UserError on bad input (before
    anything runs); engine failures are recorded in the result."""
    from collbench.nccl.census import run_census
    census = run_census(paths)
    iterations, warmup = settings.counts()
    capacity, planned = plan_groups(census.groups, cfg, settings)
    timed = [Timed(op=g.op, count=g.count, datatype=g.datatype, redop=g.redop, nranks=g.nranks,
                   inplace=g.inplace, calls=g.calls, call=call, roots=list(g.roots)) for g, call in planned]
    if not any(t.replayed for t in timed):
        raise UserError(_nothing_replayable(paths, timed))
    warnings = _rank_warnings({t.nranks for t in timed if t.replayed and t.call.nranks != t.nranks},
                              capacity, settings.np)
    warnings += plan_warnings(timed, settings.max_bytes, "configurations") + _census_warnings(census)

    runner = Runner(cfg, settings, run_id)
    by_n = {}
    for t in timed:
        if t.replayed:
            by_n.setdefault(t.call.nranks, []).append(t)
    for n in sorted(by_n):      # preflight every job before the first one runs
        runner.preflight(n, [by_n[n][0].call.step(1, 0)])
    for n in sorted(by_n):
        steps, owners = [], []
        for t in by_n[n]:
            for k in range(iterations):
                steps.append(t.call.step(1, warmup if k == 0 else 0))
                owners.append(t)
        recs = runner.run(n, steps, f"{len(by_n[n])} configuration{'s' if len(by_n[n]) != 1 else ''}")
        for t, rec in zip(owners, recs):
            t.take(rec)
    _shares(timed)
    result = ReplayResult("grouped", runner, settings, _census_totals(census), timed, warnings,
                          [i["path"] for i in census.inputs])
    result.records = (result_records(runner, timed, 1, warmup, per_iteration=True) + runner.failures
                      + [replay_event(result)])
    return result


def _nothing_replayable(paths, timed):
    ops = Counter()
    for t in timed:
        ops[t.op] += t.calls
    listed = ", ".join(f"{op} ({n} calls)" for op, n in ops.most_common(6))
    names = ", ".join(paths[:3]) + (" ..." if len(paths) > 3 else "")
    reasons = sorted({t.call.reason for t in timed})
    return (f"{names}: nothing to replay: the log's calls are {listed}, none of which the built-in engine "
            f"times ({'; '.join(reasons)})")


def _rank_warnings(shrunk, capacity, np_given):
    if not shrunk:
        return []
    sizes = ", ".join(map(str, sorted(shrunk)))
    return [f"replayed at {capacity} ranks (--np {np_given}), but the log's communicators have {sizes} ranks: "
            f"the times are for {capacity} ranks, not the log's"]


# --- log order -------------------------------------------------------------------------------------

def replay_log(paths, cfg, settings, run_id=None):
    """One rank's sequence on one communicator, in the log's order."""
    from collbench.nccl.census import run_census
    spooled = SpooledInputs(paths)      # the log is read twice: stdin and pipes are kept
    try:
        census = run_census(spooled.paths)
        cset, member = select_member(census, settings.comm)
        nranks_log = member["nranks"]
        check_capacity([nranks_log], cfg, settings.np)
        capacity = settings.np if settings.np is not None else cfg.ranks
        n = replay_ranks(nranks_log, capacity)
        calls, total = read_sequence(spooled.paths, member, settings.max_calls, settings.max_bytes, n)
    finally:
        spooled.cleanup()
    iterations, warmup = settings.counts()
    if not any(isinstance(c.call, EngineCall) for c in calls):
        where = f"communicator {cset['key']!r} (rank handle {member['host']}:{member['pid']} comm {member['comm']})"
        ops = Counter(c.op for c in calls)
        raise UserError(f"nothing to replay on {where}: its calls are "
                        f"{', '.join(f'{op} ({k})' for op, k in ops.most_common(5))}, none of which the built-in "
                        f"engine times (--comm picks another communicator; the census lists them)")
    warnings = _rank_warnings({nranks_log} if n != nranks_log else set(), capacity, settings.np)
    warnings += plan_warnings(calls, settings.max_bytes, "calls") + _census_warnings(census)
    if total > len(calls):
        warnings.append(f"the sequence has {total} calls; the first {len(calls)} are replayed (--max-calls)")

    runner = Runner(cfg, settings, run_id)
    replayable = [c for c in calls if isinstance(c.call, EngineCall)]
    steps = [c.call.step(iterations, warmup) for c in replayable]
    runner.preflight(n, steps)
    recs = runner.run(n, steps, f"{len(replayable)} calls in log order")
    for c, rec in zip(replayable, recs):
        c.time_us, c.slowest_us, c.validation, c.ts, c.failure = _outcome(rec)
    timed = aggregate_log(calls, nranks_log)
    communicator = {"key": cset["key"], "source": cset["source"], "nranks": nranks_log, "replay_nranks": n,
                    "host": member["host"], "pid": member["pid"], "comm": member["comm"], "rank": member["rank"],
                    "calls_in_sequence": total, "calls_read": len(calls), "replayed": len(replayable)}
    result = ReplayResult("log", runner, settings, _census_totals(census), timed, warnings,
                          [i["path"] for i in census.inputs], calls=calls, communicator=communicator)
    result.records = (result_records(runner, timed, iterations, warmup, per_iteration=False) + runner.failures
                      + [replay_event(result)])
    return result


def select_member(census, comm):
    """(communicator set, rank handle) to replay: --comm, or the largest communicator (most calls
    among equals); its lowest rank that logged collectives."""
    sets = {s["key"]: s for s in census.sets}
    members = census.communicators
    if comm is None:
        counts = Counter()
        for m in members:
            counts[m["set"]] += m["collectives"]
        candidates = [s for s in census.sets if counts[s["key"]]]
        if not candidates:
            raise UserError("nothing to replay: no communicator of the log has collective calls (only "
                            "Send/Recv or one-sided lines)")
        chosen = max(candidates, key=lambda s: (s["nranks"], counts[s["key"]]))
        pool = [m for m in members if m["set"] == chosen["key"]]
    else:
        pool = _members_for(comm, members)
        if not pool:
            keys = ", ".join(repr(s["key"]) for s in census.sets[:8])
            raise UserError(f"--comm {comm!r}: no such communicator in the log (expected a communicator as the "
                            f"census lists it, e.g. {keys}; a commId; a comm pointer; or host:pid:pointer)")
        chosen = sets[pool[0]["set"]]
        pool = [m for m in pool if m["set"] == chosen["key"]]
    with_calls = [m for m in pool if m["collectives"]] or pool
    member = min(with_calls, key=lambda m: (m["rank"] is None, m["rank"] or 0))
    return chosen, member


def _members_for(comm, members):
    comm = comm.strip()
    found = [m for m in members if m["set"] == comm]
    if found:
        return found
    low = comm.lower()
    ids = {low, "0x" + low[2:] if low.startswith("0x") else "0x" + low}
    found = [m for m in members if m["comm_id"] and m["comm_id"].lower() in ids]
    if found:
        return found
    parts = comm.rsplit(":", 2)
    if len(parts) == 3:
        host, pid, ptr = parts
        return [m for m in members if m["host"] == host and str(m["pid"]) == pid and m["comm"] == ptr]
    return [m for m in members if m["comm"] == comm]


def read_sequence(paths, member, max_calls, max_bytes, nranks):
    """The rank handle's calls in log order as LoggedTimed (at most max_calls), and how many it has."""
    from collbench.nccl.census import iter_calls
    out, total = [], 0
    for logged in iter_calls(paths, comm=member["comm"]):
        c = logged.call
        if c.host != member["host"] or c.pid != member["pid"] or c.nranks != member["nranks"]:
            continue
        total += 1
        if len(out) >= max_calls:
            continue
        call = plan_call(c.op.name, c.count, c.datatype, nranks, c.inplace, c.root, max_bytes)
        out.append(LoggedTimed(position=total, op=c.op.name, count=c.count, datatype=c.datatype, redop=c.redop,
                               redop_value=c.redop_value, root=c.root, inplace=c.inplace, call=call))
    return out, total


def aggregate_log(calls, nranks_log):
    """The sequence per configuration (rooted ops also per root) as Timed, in order of first call."""
    groups = {}
    for c in calls:
        key = (c.op, c.count, c.datatype, c.redop, c.inplace, c.root if NCCL_OPS[c.op].rooted else None)
        t = groups.get(key)
        if t is None:
            t = groups[key] = Timed(op=c.op, count=c.count, datatype=c.datatype, redop=c.redop, nranks=nranks_log,
                                    inplace=c.inplace, calls=0, call=c.call, roots=[c.root])
        t.calls += 1
        if c.failure:
            t.failure = t.failure or c.failure
        elif c.time_us is not None:
            t.times_us.append(c.time_us)
            t.slowest_us.append(c.slowest_us)
            t.validation.append(c.validation)
            t.last_ts = c.ts
    out = list(groups.values())
    _shares(out)
    return out


def csv_rows(calls):
    """The RCCL replayer's CSV rows (tuples of strings) of the replayed calls, in log order. The time
    is the estimate for a capped call; busbw is the timed call's (the estimate's is the same)."""
    rows = []
    for c in calls:
        if not isinstance(c.call, EngineCall):
            continue
        time_ms = busbw = ""
        if c.time_us is not None:
            time_ms = f"{c.estimated_us / 1000.0:.6g}"
            bw = c.call.bandwidth(c.time_us)[1]
            busbw = f"{bw / 1e9:.6g}" if bw is not None else ""
        rows.append((str(c.position), c.op, str(int(c.inplace)), str(c.count), RCCL_DATATYPE_NAMES[c.datatype],
                     rcclname_redop(c.redop_value), str(c.root), time_ms, busbw))
    return rows


def csv_text(calls):
    return "".join(", ".join(r) + "\n" for r in [CSV_HEADER] + csv_rows(calls))


# --- records ---------------------------------------------------------------------------------------

def validation_of(states):
    if "fail" in states:
        return "fail"
    return "pass" if states and all(s == "pass" for s in states) else "off"


def result_records(runner, timed, unit_iterations, warmup, per_iteration):
    """One result record per timed configuration: what was measured (the timed size, not the
    estimate). unit_iterations: iterations per timed unit (step); per_iteration: each unit was one
    iteration (grouped order), so the slowest rank's unit times are the per-iteration times whose
    percentiles the record carries."""
    out = []
    for t in timed:
        if not t.replayed or not t.times_us:
            continue
        call = t.call
        optional = {}
        if call.inplace:
            optional["inplace"] = True
        if call.root:
            optional["root"] = call.root
        if per_iteration:
            worst = sorted(t.slowest_us)
            optional.update(latency_p50_us=nearest_rank(worst, 50), latency_p90_us=nearest_rank(worst, 90),
                            latency_p99_us=nearest_rank(worst, 99), latency_pmax_us=worst[-1])
        # min/max (the fastest and slowest rank's averages) are not known: each unit is its own step
        out.append(records.result_record(
            runner.ctx(call.nranks), call.op, call.size_bytes, call.datatype, round(statistics.fmean(t.times_us), 4),
            None, None, len(t.times_us) * unit_iterations, warmup, validation=validation_of(t.validation),
            straggler_rank=None, ranks=call.nranks, ts=t.last_ts, **optional))
    return out


def replay_event(result):
    """The run's `nccl_replay` event: what was replayed from which log, the warnings, the estimate."""
    confs = [_event_configuration(t) for t in result.configurations]
    replayed = [t for t in result.configurations if t.replayed]
    detail = (f"NCCL log replay ({result.order} order): {len(replayed)} of {len(confs)} configurations replayed, "
              f"estimated {result.total_us / 1e6:.6g} s of collectives per rank")
    if result.warnings:
        detail += "; " + "; ".join(result.warnings)
    extra = {"communicator": result.communicator} if result.communicator else {}
    return records.event_record(
        "nccl_replay", run_id=result.runner.run_id, detail=detail, order=result.order,
        inputs=result.inputs[:64], warnings=list(result.warnings), total_time_s=round(result.total_us / 1e6, 9),
        max_bytes=result.settings.max_bytes, configurations=confs[:EVENT_LIST_MAX],
        configurations_total=len(confs), **extra)


def _event_configuration(t):
    d = {"nccl_op": t.op, "count": t.count, "nccl_datatype": t.datatype, "redop": t.redop, "log_nranks": t.nranks,
         "inplace": t.inplace, "calls": t.calls}
    if not t.replayed:
        d["not_replayed"] = t.call.reason
        return d
    c = t.call
    s = t.summary()
    d.update(op=c.op, datatype=c.datatype, stand_in=c.stand_in, size_bytes=c.size_bytes, ranks=c.nranks,
             root=c.root, scale=round(c.scale, 6), estimated=c.capped,
             mean_us=round(s[0], 4) if s else None, total_s=round(t.total_us / 1e6, 9), share=round(t.share, 6),
             error=t.failure)
    return d


# --- inputs ----------------------------------------------------------------------------------------

class SpooledInputs:
    """stdin and pipes copied to temporary files, so that the log can be read twice (census, then
    the sequence in log order). Files and directories are passed through."""

    def __init__(self, paths):
        self.paths, self.tmp = [], []
        try:
            for p in paths:
                self.paths.append(self._spool(p) if p == "-" or _is_stream(p) else p)
        except BaseException:
            self.cleanup()
            raise

    def _spool(self, p):
        from collbench.nccl.log_input import open_stream, spool_dir
        try:
            fd, tmp = tempfile.mkstemp(prefix="collbench-replay-", suffix=".log", dir=spool_dir())
        except OSError as e:
            raise UserError(f"{p}: cannot copy the input to a temporary file in {spool_dir()} "
                            f"(the log is read twice): {e.strerror}; set TMPDIR to a directory with room") from None
        self.tmp.append(tmp)
        with os.fdopen(fd, "wb") as out:
            try:
                own = p != "-"
                if not own and sys.stdin is None:
                    raise OSError(errno.EBADF, "standard input is closed")
                src = open_stream(p) if own else sys.stdin.buffer
                try:
                    while True:
                        data = src.read(1 << 20)
                        if not data:
                            break
                        try:
                            out.write(data)
                            out.flush()
                        except OSError as e:
                            raise UserError(f"{p}: cannot copy the input to {tmp} (the log is read twice): "
                                            f"{e.strerror}; set TMPDIR to a directory with room") from None
                finally:
                    if own:
                        src.close()
            except OSError as e:
                raise UserError(f"{p}: cannot read: {e.strerror or e}") from None
        return tmp

    def cleanup(self):
        for t in self.tmp:
            try:
                os.unlink(t)
            except OSError:
                pass
        self.tmp = []


def _is_stream(path):
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)
