#!/usr/bin/env python3
"""How often `collbench diagnose` names the right host or link, and how often it names a wrong
one: a campaign of planted faults on the namespace testbed (issue 28, item 4).

One testbed (lab/testbed.py: real network namespaces, sshd, mpirun ranks over TCP, cubic pinned)
and a baseline saved from --baseline-runs quiet `once` runs spread over --baseline-spread-s. Then, in random order:

  classes (each --trials times, at a random host, peer and strength):
    ecn          the host's egress CE-marked above RATE (nftables), a marking queue in front of it
                 -> expected: congestion, the host (or the link out of it)
    lossy_host   PERMILLE of the host's packets dropped on the wire -> link_errors, the host
    lossy_link   PERMILLE of the host's packets toward one peer dropped -> link_errors, the link
                 (both ends); run with alltoall only (on 4 ranks the only op pairing every two hosts)
    shaped       the host's link shaped (tbf), no marking: no counter moves -> `unexplained` is
                 the right answer for diagnose (`collbench locate` finds it by measuring); when the
                 shaper's queue overflows and drops (the stress loop), link_errors naming the host
                 is right too, a link through it one end
    cpu          the host's rank held to QUOTA of a CPU (cgroup) -> slow_host, the host
  quiet runs (--quiet): no fault -> no suspect named; a `no regression` verdict counted apart

  fixture classes (--fixture-classes; RDMA and ethtool counters exist here only as fixture trees):
    pfc          real mpirun ranks on 4 emulated hosts (tests/fixture_hosts.py: shm, each rank one
                 host), every rank CPU-starved (the regression), and one host's ethtool
                 tx_prio3_pause driven up by STEP every 2 ms -> pfc, the host
    link_errors  the same with one host's port symbol_error driven up -> link_errors, the host

--mode once: each trial is `once` runs (--runs-per-trial) with the fault on, then `diagnose
--baseline`.
--mode loop: the stress daemon runs on the testbed the whole campaign (one long-lived engine job,
allreduce and alltoall 1MB steps, every host's counters read around each step), and the shift
test (change_point.ShiftDetector, as the exporter's latency_shift collector runs it, with
--shift-ratio) is fed its results as they are written. Each trial: LOOP_LOOKBACK_S of quiet steps,
then the fault until a shift that began after it has held for --for-s (the alert's `for:`) or
--for-s + LOOP_FAULT_S passed (a quiet trial: --for-s + LOOP_QUIET_S, so that its alert could
fire), then `diagnose` on that window of the daemon's log (no baseline: the window's own quiet
steps are the normal), then the fault cleared and the test back in control. A quiet trial is the same window
with no fault: an alert in it is a false alarm, a named suspect a false culprit. The fixture classes
run in once mode only.

Per class it prints trials, right (host or link and cause), one end (lossy_link: the sender's
link named, not the link: what host counters alone can say; shaped: a link through the host), wrong (a named suspect that is not
the planted one), unexplained, no regression, and the median seconds from the fault applied to
the verdict, the slowdown (a series' median latency with the fault over its normal, measured
apart from diagnose: the baseline's runs, or the loop window's steps before the fault) and the
right answers among the trials slowed SLOWED (1.3x) or more, the issue's bar; over the quiet runs
the false culprits and the false alarms (a regression found), with the machine's load average.
Figures are one campaign's: repeat it (--seed) for their spread.

A campaign keeps its windows (each trial's records), the baseline's runs and campaign.json (the
rows, with what each trial planted) in the directory it prints at its end. --rejudge DIR
diagnoses those windows again with this tree's code, judges them as the campaign did and prints
the same report, with each changed verdict: a change to diagnose measured on the same records
in seconds, not on a new campaign in hours (the alerts, the slowdowns and the load stay the
campaign's).

    .venv/bin/python bench/diagnose_accuracy.py --trials 20 --quiet 40      # the issue's campaign
    .venv/bin/python bench/diagnose_accuracy.py --trials 2 --quiet 4         # a smoke run
    .venv/bin/python bench/diagnose_accuracy.py --mode loop --fixture-classes '' --trials 3 --quiet 10
    .venv/bin/python bench/diagnose_accuracy.py --rejudge /tmp/diag-accuracy-loop-XXXX  # after a change
"""

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from lab import testbed  # noqa: E402
from testbed_runs import collbench, seq_window  # noqa: E402

from collbench import signals  # noqa: E402
from collbench.results.follower import LogFollower  # noqa: E402
from collbench.results.record_parser import is_record, parse_record  # noqa: E402

OPS = ["--ops", "allreduce,allgather,alltoall,bcast", "--sizes", "256KB,512KB,1MB", "--iterations", "20"]
LINK_OPS = ["--ops", "alltoall", "--sizes", "256KB,512KB,1MB", "--iterations", "20"]
STRENGTHS = {"ecn": ["1mbytes", "2mbytes", "4mbytes"], "lossy_host": [10, 30, 50], "lossy_link": [10, 30, 50],
             "shaped": ["50mbit", "100mbit"], "cpu": [1000, 2500]}     # cpu: quota us per 50 ms
CLASSES = tuple(STRENGTHS)
FIXTURE_STRENGTHS = {"pfc": [1, 3, 10], "link_errors": [1, 3]}    # counts added every 2 ms
FIXTURE_PLAN = ["--ops", "allreduce,allgather,alltoall", "--sizes", "1MB,2MB", "--iterations", "10"]
QUEUE_RATE = "400mbit"          # the marking port's queue (a port marks because its queue builds)
LINK_RUNS = 3                   # lossy_link: alltoall's 3 steps a run; a counter needs 3 slow steps
# loop mode: two series (alltoall pairs every two hosts, for lossy_link), so that each sees a step
# every second or so and the shift test fires within seconds of a fault
LOOP_PLAN = ("stress:\n  stop_grace: 5\n  plan:\n"
             "    - {op: allreduce, sizes: [1MB], iterations: 10, warmup: 1}\n"
             "    - {op: alltoall, sizes: [1MB], iterations: 10, warmup: 1}\n")
SLOWED = 1.3                    # the bar: >= 95 % right where a collective slowed this much
LOOP_LOOKBACK_S = 20            # quiet steps before the fault in the verdict's window (diagnose's normal:
                                # ~30 steps of each series)
LOOP_FAULT_S = 50               # the longest a fault stays on waiting for the alert, past its `for:`
LOOP_QUIET_S = 20               # a quiet trial's second phase, past the `for:`: a fault's time to its alert
LOOP_RECOVER_S = 90             # the longest the shift test may take to come back in control


def once(bed, results, ops):
    r = collbench("once", "--config", bed["config"], "--results", results, "--quiet", *ops,
                  netns=bed["hosts"][0]["netns"], timeout=300)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"once failed: {r.stderr[-500:]}")


def verdict_runs(bed, results, ops, args, runs_each=1):
    """The `once` runs one verdict judges: --runs-per-trial groups of runs_each runs, the groups
    --run-spacing-s apart (a slow spell of the machine lasts ~10 s: runs spread past it are not
    all in it)."""
    for i in range(args.runs_per_trial):
        if i:
            time.sleep(args.run_spacing_s)
        for _ in range(runs_each):
            once(bed, results, ops)


def diagnose(bed, results):
    r = collbench("diagnose", results, "--baseline", "quiet", "--config", bed["config"], "--format", "json",
                  timeout=120)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"diagnose failed: {r.stderr[-500:]}")
    return json.loads(r.stdout)


def result_records(path):
    """The result records with a latency of a results file, validated as collbench reads them."""
    with open(path, "rb") as f:
        recs = [parse_record(line) for line in f]
    return [r for r in recs if is_record(r) and r.get("type") == "result" and "latency_avg_us" in r]


def latencies(recs):
    """{(op, size, ranks): [latency_avg_us, ...]} of result records."""
    out = {}
    for r in recs:
        out.setdefault((r.get("op"), r.get("size"), r.get("ranks")), []).append(r["latency_avg_us"])
    return out


def slowdown(normal, judged):
    """The fault's slowdown, measured apart from diagnose: the largest ratio of a series' median
    latency in the judged steps to its median in the normal ones (1.0 when none is in both). The
    issue's target holds at the strengths that slow a collective by SLOWED or more."""
    ratios = [statistics.median(judged[k]) / statistics.median(normal[k]) for k in judged
              if normal.get(k) and statistics.median(normal[k]) > 0]
    return round(max(ratios, default=1.0), 3)


class Fault:
    """Apply and clear one planted fault; `expected` says what a right diagnosis names."""

    def __init__(self, bed, cls, host, peer, strength):
        self.bed, self.cls, self.host, self.peer, self.strength = bed, cls, host, peer, strength
        self.mover = self.cgroup = None

    def expected(self):
        a, b = self.host["addr"], self.peer["addr"]
        return {"ecn": ("congestion", a, None), "lossy_host": ("link_errors", a, None),
                "lossy_link": ("link_errors", None, [a, b]), "shaped": ("unexplained", a, None),
                "cpu": ("slow_host", a, None)}[self.cls]

    def __enter__(self):
        d = self.bed["dir"]
        if self.cls == "ecn":
            testbed.ecn_mark(d, {self.host["alias"]: self.strength})
            testbed.shape_link(self.host, QUEUE_RATE)
        elif self.cls == "lossy_host":
            testbed.loss(d, self.host["alias"], self.strength)
        elif self.cls == "lossy_link":
            testbed.loss(d, self.host["alias"], self.strength, peer=self.peer["alias"])
        elif self.cls == "shaped":
            testbed.shape_link(self.host, self.strength)
        elif self.cls == "cpu":
            from cgroup_helpers import Cgroup
            from testbed_runs import host_throttler
            self.cgroup = Cgroup(self.strength, period_us=50000)
            self.mover = host_throttler(self.cgroup, self.host["netns"])
            self.mover.start()
        return self

    def __exit__(self, *exc):
        d = self.bed["dir"]
        if self.cls == "ecn":
            testbed.ecn_clear(d)
            testbed.shape_link(self.host, None)
        elif self.cls in ("lossy_host", "lossy_link"):
            testbed.loss_clear(d)
        elif self.cls == "shaped":
            testbed.shape_link(self.host, None)
        elif self.cls == "cpu":
            self.mover.stop.set()
            self.mover.join()
            self.cgroup.remove()      # the stress loop's ranks outlive the fault: moved back out first


class ShiftWatch:
    """The shift test fed with the daemon's results as they are written, per op, size and rank
    count, as the exporter's latency_shift collector feeds it; `alerted()` is the alert: a series'
    flag on for for_s (the rule's `for:`, per series as Prometheus keeps it); `longest` the longest
    such spell since reset() (what a longer `for:` would have let through)."""

    def __init__(self, log, min_ratio, for_s):
        from collbench.change_point import ShiftDetector
        self.min_ratio, self.for_s = min_ratio, for_s
        # the log from its start, across its rotations (stress.rotate_bytes: ~6 KB a step here)
        self.follower = LogFollower(log, from_start=True)
        self.detectors, self.seq, self.longest = {}, 0, 0.0
        self.since = {}        # series -> when its flag came on (while it stays on)
        self.new = ShiftDetector

    def reset(self):
        self.longest = 0.0

    def poll(self):
        for rec in self.follower.poll():
            if rec.get("type") != "result" or "latency_avg_us" not in rec:
                continue
            self.seq = max(self.seq, rec.get("seq", 0))
            key = (rec.get("op"), rec.get("size"), rec.get("ranks"))
            det = self.detectors.setdefault(key, self.new(self.min_ratio))
            det.add(rec["latency_avg_us"])
        now = time.monotonic()
        self.since = {key: self.since.get(key, now) for key, d in self.detectors.items() if d.shift}
        self.longest = max([self.longest] + [now - t for t in self.since.values()])

    def alerted(self, since=None):
        """Whether a series' flag has held for_s; with `since`, only a flag that came on at or
        after it (a fault's own alert: one already on before the fault is no answer to it)."""
        now = time.monotonic()
        return any(now - t >= self.for_s for t in self.since.values() if since is None or t >= since)

    def in_control(self):
        from collbench.change_point import H
        return bool(self.detectors) and all(d.ready and not d.shift and d.statistic < H / 2
                                            for d in self.detectors.values())


def named(doc):
    """The suspects of a diagnosis that name a host or link."""
    return [s for s in doc["suspects"] if s["host"] or s["link"]]


def trial_row(doc, slowed, cls, **fields):
    """One fault trial's row: its class, `fields`, its slowdown and what the diagnosis said."""
    top = doc["suspects"][0] if doc["suspects"] else {}
    return {"class": cls, **fields, "ratio": max((x["ratio"] for x in doc["regressions"]), default=1.0), "slowdown": slowed,
            "top": [top.get("cause"), top.get("host"), top.get("link"), top.get("p_value")],
            "lacking": (top.get("evidence") or {}).get("lacking", [])[:3]}


def quiet_row(doc, slowed, **fields):
    """One quiet trial's row: `fields`, its slowdown and what the diagnosis said."""
    return {"verdict": doc["verdict"], "named": len(named(doc)), "ratios": [x["ratio"] for x in doc["regressions"]],
            "slowdown": slowed, **fields}


def judge(doc, expected):
    """right / one end / wrong / unexplained / no regression of one diagnosis against what was planted."""
    cause, host, link = expected
    named_ = named(doc)
    if doc["verdict"] == "no regression":
        return "no regression"
    top = named_[0] if named_ else None
    others = [s for s in named_[1:] if host not in ([s["host"]] + (s["link"] or [])) and s["link"] != link]
    if cause == "unexplained":
        if not named_:
            return "right"
        # a shaped link whose queue overflowed (the stress loop's load does it): its drops are
        # real loss on that host's link, and naming the host for it sends the engineer to it
        if top["cause"] == "link_errors" and not others:
            if top["host"] == host:
                return "right"
            if host in (top["link"] or []):
                return "one end"
        return "wrong"
    if not named_:
        return "unexplained"
    ok = top["cause"] == cause and (top["link"] == link if link else top["host"] == host)
    if link and not others and top["cause"] == cause and top["host"] == link[0]:
        return "one end"     # the lossy link's sender named, not the link (host counters alone)
    return "right" if ok and not others else "wrong"


def campaign(args):
    rng = random.Random(args.seed)
    root = tempfile.mkdtemp(prefix="diag-accuracy-")
    bed = testbed.up(args.hosts, os.path.join(root, "tb"), python=sys.executable)
    rows, quiet_rows = [], []
    try:
        with open(bed["config"], "a") as f:
            f.write("step_timeout: 60s\ncongestion:\n  enabled: true\n")
        base = os.path.join(root, "baseline.jsonl")
        t0 = time.monotonic()
        for i in range(args.baseline_runs):
            # spread over --baseline-spread-s: the machine's slow spells last ~10 s, and a baseline
            # that never saw one calls the next one a regression (docs/DIAGNOSIS.md, "Quiet runs")
            time.sleep(max(0.0, t0 + i * args.baseline_spread_s / max(1, args.baseline_runs - 1) - time.monotonic()))
            once(bed, base, OPS)
            print(f"baseline run {i + 1}/{args.baseline_runs}", file=sys.stderr, flush=True)
        r = collbench("baseline", "save", "quiet", "--from", base, "--config", bed["config"])
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        normal = latencies(result_records(base))
        plan = [c for c in args.classes for _ in range(args.trials)] + ["quiet"] * args.quiet
        rng.shuffle(plan)
        started = time.monotonic()
        for n, cls in enumerate(plan):
            results = os.path.join(root, f"trial-{n}.jsonl")
            load = os.getloadavg()[0]
            if cls == "quiet":
                verdict_runs(bed, results, OPS, args)
                doc = diagnose(bed, results)
                quiet_rows.append(quiet_row(doc, slowdown(normal, latencies(result_records(results))), load=load,
                                            window=os.path.basename(results)))
                outcome = "false culprit" if named(doc) else doc["verdict"]
            else:
                host, peer = rng.sample(bed["hosts"], 2)
                strength = rng.choice(STRENGTHS[cls])
                fault = Fault(bed, cls, host, peer, strength)
                t0 = time.monotonic()
                with fault:
                    verdict_runs(bed, results, LINK_OPS if cls == "lossy_link" else OPS, args,
                                 LINK_RUNS if cls == "lossy_link" else 1)
                doc = diagnose(bed, results)
                outcome = judge(doc, fault.expected())
                rows.append(trial_row(doc, slowdown(normal, latencies(result_records(results))), cls,
                                      strength=strength, outcome=outcome, seconds=time.monotonic() - t0, load=load,
                                      host=host["alias"], peer=peer["alias"], expected=fault.expected(),
                                      window=os.path.basename(results)))
            left = (time.monotonic() - started) / (n + 1) * (len(plan) - n - 1)
            print(f"[{n + 1}/{len(plan)}] {cls}: {outcome} (load {load:.1f}; ~{left:.0f} s left)",
                  file=sys.stderr, flush=True)
    finally:
        testbed.down(bed["dir"])
        keep(root, "once", args, rows, quiet_rows)
    return rows, quiet_rows


def loop_campaign(args):
    """Mode loop: rows as campaign()'s, plus whether and when the alert fired."""
    rng = random.Random(args.seed)
    root = tempfile.mkdtemp(prefix="diag-accuracy-loop-")
    bed = testbed.up(args.hosts, os.path.join(root, "tb"), python=sys.executable)
    log = os.path.join(bed["dir"], "state", "results.jsonl")     # the testbed config's state_dir
    os.makedirs(os.path.dirname(log), exist_ok=True)
    rows, quiet_rows = [], []
    try:
        with open(bed["config"], "a") as f:
            # alerts.shift_ratio: diagnose's shift gate is the alert's (docs/DIAGNOSIS.md, "What regressed")
            f.write(f"step_timeout: 60s\ncongestion:\n  enabled: true\nalerts:\n  shift_ratio: {args.shift_ratio}\n"
                    + LOOP_PLAN)
        r = collbench("stress", "start", "--config", bed["config"], netns=bed["hosts"][0]["netns"])
        if r.returncode != 0:
            raise RuntimeError(f"stress start failed: {r.stderr[-500:]}")
        watch = ShiftWatch(log, args.shift_ratio, args.for_s)

        def settle(deadline_s):
            """Polls until the test is in control (or deadline_s); whether it is."""
            t_end = time.monotonic() + deadline_s
            while time.monotonic() < t_end:
                watch.poll()
                if watch.in_control():
                    return True
                time.sleep(0.5)
            return False

        if not settle(120):
            raise RuntimeError(f"the shift test never came in control: {len(watch.detectors)} series in {log}")
        plan = [c for c in args.classes for _ in range(args.trials)] + ["quiet"] * args.quiet
        rng.shuffle(plan)
        started = time.monotonic()
        for n, cls in enumerate(plan):
            in_control = settle(LOOP_RECOVER_S)
            first = watch.seq + 1
            time.sleep(LOOP_LOOKBACK_S)
            watch.poll()
            watch.reset()
            load = os.getloadavg()[0]
            fault = None
            if cls != "quiet":
                host, peer = rng.sample(bed["hosts"], 2)
                strength = rng.choice(STRENGTHS[cls])
                fault = Fault(bed, cls, host, peer, strength)
            t_fault = time.time()         # the window's steps before it are its normal
            with fault or contextlib.nullcontext():
                t0, alert_s = time.monotonic(), None
                while time.monotonic() - t0 < args.for_s + (LOOP_FAULT_S if fault else LOOP_QUIET_S):
                    watch.poll()
                    if watch.alerted(since=t0 if fault else None) and alert_s is None:
                        alert_s = time.monotonic() - t0
                        if fault is not None:
                            break       # a quiet trial runs on: its longest shift spell says which `for:` would hold
                    time.sleep(0.5)
                watch.poll()
                path = os.path.join(root, f"trial-{n}.jsonl")
                if seq_window(log, first, watch.seq, path) == 0:
                    # no step ended in the window (a job relaunched, a rotation missed): said, not judged
                    doc = {"verdict": "no steps", "suspects": [], "regressions": []}
                else:
                    r = collbench("diagnose", path, "--config", bed["config"], "--format", "json", timeout=120)
                    if r.returncode not in (0, 1):
                        raise RuntimeError(f"diagnose failed: {r.stderr[-500:]}")
                    doc = json.loads(r.stdout)
            window = result_records(path)
            slowed = slowdown(latencies(r for r in window if r["ts"] < t_fault),
                              latencies(r for r in window if r["ts"] >= t_fault))
            if fault is None:
                quiet_rows.append(quiet_row(doc, slowed, load=load, alerted=alert_s is not None,
                                            shift_spell_s=round(watch.longest, 1), in_control_before=in_control,
                                            window=os.path.basename(path)))
                outcome = "false culprit" if named(doc) else doc["verdict"]
            else:
                outcome = "no steps" if doc["verdict"] == "no steps" else judge(doc, fault.expected())
                rows.append(trial_row(doc, slowed, cls, strength=strength, outcome=outcome,
                                      seconds=time.monotonic() - t0, alert_s=alert_s, load=load, host=host["alias"],
                                      peer=peer["alias"], in_control_before=in_control, expected=fault.expected(),
                                      window=os.path.basename(path)))
            left = (time.monotonic() - started) / (n + 1) * (len(plan) - n - 1)
            print(f"[loop {n + 1}/{len(plan)}] {cls}: {outcome}, alert "
                  f"{'none' if alert_s is None else f'after {alert_s:.0f} s'} (load {load:.1f}; ~{left:.0f} s left)",
                  file=sys.stderr, flush=True)
    finally:
        try:
            stop = collbench("stress", "stop", "--config", bed["config"], timeout=60)
            if stop.returncode != 0:
                print(f"stress stop: {stop.stderr[-300:]}", file=sys.stderr)
            daemon_log = os.path.join(os.path.dirname(log), "daemon.log")
            if os.path.exists(daemon_log):      # kept for a post-mortem: the testbed's directory goes
                shutil.copy(daemon_log, root)
        finally:
            testbed.down(bed["dir"])
            keep(root, "loop", args, rows, quiet_rows)
    return rows, quiet_rows


def fixture_campaign(args):
    """The PFC and link-error classes on emulated hosts (no testbed): rows as campaign()'s."""
    from pathlib import Path

    import fixture_hosts
    rng = random.Random(args.seed + 1)
    root = Path(tempfile.mkdtemp(prefix="diag-accuracy-fixtures-"))
    cfg, hosts = fixture_hosts.make_hosts(root)
    base = root / "baseline.jsonl"
    for i in range(args.baseline_runs):
        fixture_hosts.once(cfg, base, FIXTURE_PLAN)
        print(f"fixture baseline run {i + 1}/{args.baseline_runs}", file=sys.stderr, flush=True)
    r = collbench("baseline", "save", "quiet", "--from", str(base), "--config", str(cfg))
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    normal = latencies(result_records(base))
    plan = [c for c in args.fixture_classes for _ in range(args.trials)]
    rng.shuffle(plan)
    rows, started = [], time.monotonic()
    for n, cls in enumerate(plan):
        host, strength = rng.choice(fixture_hosts.HOSTS), rng.choice(FIXTURE_STRENGTHS[cls])
        if cls == "pfc":
            driver = fixture_hosts.Driver(fixture_hosts.ethtool_file(hosts, host), "tx_prio3_pause", step=strength)
        else:
            driver = fixture_hosts.Driver(fixture_hosts.hw_counter(hosts, host, "symbol_error", kind="counters"),
                                          step=strength)
        results, load, t0 = root / f"trial-{n}.jsonl", os.getloadavg()[0], time.monotonic()
        fixture_hosts.once(cfg, results, FIXTURE_PLAN, throttle_ranks=(0, 1, 2, 3), driver=driver)
        r = collbench("diagnose", str(results), "--baseline", "quiet", "--config", str(cfg), "--format",
                      "json", timeout=120)
        if r.returncode not in (0, 1):
            raise RuntimeError(f"diagnose failed: {r.stderr[-500:]}")
        doc = json.loads(r.stdout)
        outcome = judge(doc, (cls, host, None))
        rows.append(trial_row(doc, slowdown(normal, latencies(result_records(results))), cls,
                              strength=strength, outcome=outcome, seconds=time.monotonic() - t0, load=load,
                              host=host, peer=None, expected=(cls, host, None), window=results.name))
        left = (time.monotonic() - started) / (n + 1) * (len(plan) - n - 1)
        print(f"[fixtures {n + 1}/{len(plan)}] {cls}: {outcome} (load {load:.1f}; ~{left:.0f} s left)",
              file=sys.stderr, flush=True)
    keep(str(root), "fixtures", args, rows, [], config=str(cfg))
    return rows


def keep(root, mode, args, rows, quiet_rows, config=None):
    """ROOT/campaign.json: what --rejudge needs to diagnose the campaign's windows again (they stay
    in ROOT, with the baseline's runs: baseline.jsonl)."""
    with open(os.path.join(root, "campaign.json"), "w") as f:
        json.dump({"mode": mode, "shift_ratio": args.shift_ratio, "config": config, "trials": rows,
                   "quiet": quiet_rows}, f, indent=1)
    print(f"{mode} campaign kept in {root} (--rejudge {root})", file=sys.stderr)


def rejudge(root):
    """A kept campaign's windows diagnosed again with this tree's code, and judged as the campaign
    judged them: what a change to diagnose does to the measured accuracy, on the same records."""
    with open(os.path.join(root, "campaign.json")) as f:
        kept = json.load(f)
    work = tempfile.mkdtemp(prefix="diag-rejudge-")
    config = kept.get("config")
    if config is None:
        config = os.path.join(work, "collbench.yaml")
        with open(config, "w") as f:
            f.write(f"state_dir: {work}\n"
                    + (f"alerts:\n  shift_ratio: {kept['shift_ratio']}\n" if kept["mode"] == "loop" else ""))
    against = []
    if kept["mode"] != "loop":
        # the baseline saved again from its runs, by this tree's `baseline save`
        r = collbench("baseline", "save", "rejudged", "--from", os.path.join(root, "baseline.jsonl"),
                      "--config", config, "--state-dir", work)
        if r.returncode != 0:
            raise RuntimeError(f"baseline save failed: {r.stderr[-500:]}")
        against = ["--baseline", "rejudged", "--state-dir", work]

    def again(row):
        r = collbench("diagnose", os.path.join(root, row["window"]), *against, "--config", config,
                      "--format", "json", timeout=120)
        if r.returncode not in (0, 1):
            raise RuntimeError(f"diagnose failed on {row['window']}: {r.stderr[-500:]}")
        return json.loads(r.stdout)

    rows, quiet_rows, changed = [], [], 0
    for row in kept["trials"]:
        doc = again(row)
        new = trial_row(doc, row["slowdown"], row["class"], **{k: v for k, v in row.items() if k not in
                        ("class", "ratio", "slowdown", "top", "lacking", "outcome")},
                        outcome=judge(doc, row["expected"]))
        if new["outcome"] != row["outcome"]:
            changed += 1
            print(f"{row['window']} ({row['class']}): {row['outcome']} -> {new['outcome']}", file=sys.stderr)
        rows.append(new)
    for row in kept["quiet"]:
        doc = again(row)
        new = quiet_row(doc, row["slowdown"], **{k: v for k, v in row.items() if k not in
                                                  ("verdict", "named", "ratios", "slowdown")})
        if (new["verdict"], new["named"]) != (row["verdict"], row["named"]):
            changed += 1
            print(f"{row['window']} (quiet): {row['verdict']} -> {new['verdict']}, named {new['named']}",
                  file=sys.stderr)
        quiet_rows.append(new)
    print(f"re-diagnosed {len(rows) + len(quiet_rows)} windows of {root}: {changed} changed", file=sys.stderr)
    return rows, quiet_rows


def report(rows, quiet_rows):
    alerts = [r for r in rows if "alert_s" in r]
    if alerts:
        print("loop mode: alerts fired in "
              + ", ".join(f"{cls} {sum(r['alert_s'] is not None for r in rs)}/{len(rs)}"
                          for cls in CLASSES for rs in [[r for r in alerts if r["class"] == cls]] if rs)
              + (f"; median fault to alert {statistics.median(a):.0f} s"
                 if (a := [r["alert_s"] for r in alerts if r["alert_s"] is not None]) else "")
              + f"; trials begun with the shift test not back in control within {LOOP_RECOVER_S} s: "
              f"{sum(r.get('in_control_before') is False for r in alerts + quiet_rows)}")
    print(f"{'class':<12} {'trials':>6} {'right':>6} {'1 end':>6} {'wrong':>6} {'unexpl':>7} {'no-reg':>7} "
          f"{'median s':>9} {'slowdown':>13} {f'right if >={SLOWED}x':>15}  strengths right/tried")
    for cls in CLASSES + tuple(FIXTURE_STRENGTHS):
        rs = [r for r in rows if r["class"] == cls]
        if not rs:
            continue
        count = {k: sum(r["outcome"] == k for r in rs)
                 for k in ("right", "one end", "wrong", "unexplained", "no regression")}
        by_strength = {}
        for r in rs:
            ok, n = by_strength.get(r["strength"], (0, 0))
            by_strength[r["strength"]] = (ok + (r["outcome"] == "right"), n + 1)
        slowed = [r["slowdown"] for r in rs]
        bar = [r for r in rs if r["slowdown"] >= SLOWED]
        bar_right = f"{sum(r['outcome'] == 'right' for r in bar)}/{len(bar)}"
        print(f"{cls:<12} {len(rs):>6} {count['right']:>6} {count['one end']:>6} {count['wrong']:>6} "
              f"{count['unexplained']:>7} "
              f"{count['no regression']:>7} {statistics.median(r['seconds'] for r in rs):>9.1f} "
              f"{min(slowed):>6.2f}-{max(slowed):<6.2f} {bar_right:>15}  "
              + ", ".join(f"{s}: {ok}/{n}" for s, (ok, n) in sorted(by_strength.items(), key=str)))
    if quiet_rows:
        loads = [q["load"] for q in quiet_rows]
        print(f"quiet runs: {len(quiet_rows)}; false culprits {sum(q['named'] > 0 for q in quiet_rows)}; "
              f"slowdown {min(q['slowdown'] for q in quiet_rows):.2f}-{max(q['slowdown'] for q in quiet_rows):.2f}; "
              f"false alarms (a regression found) {sum(q['verdict'] != 'no regression' for q in quiet_rows)}; "
              + (f"alerts fired {sum(q['alerted'] for q in timed)} of {len(timed)}; "
                 if (timed := [q for q in quiet_rows if "alerted" in q]) else "")
              + f"load average {min(loads):.1f}-{max(loads):.1f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("once", "loop"), default="once",
                   help="once runs against a baseline, or the stress loop with the shift test (default once)")
    p.add_argument("--shift-ratio", type=float, default=2.0,
                   help="loop mode: alerts.shift_ratio (default 2.0: the loop's quiet steps here change level "
                        "1.6-2.7x for 20-60 s, docs/DIAGNOSIS.md)")
    p.add_argument("--for-s", type=float, default=30.0, help="loop mode: the alert's `for:` in seconds (default 30)")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--trials", type=int, default=20, help="trials per fault class (default 20)")
    p.add_argument("--quiet", type=int, default=40, help="quiet runs (default 40)")
    p.add_argument("--classes", default=",".join(CLASSES), help=f"fault classes (default {','.join(CLASSES)})")
    p.add_argument("--fixture-classes", default=",".join(FIXTURE_STRENGTHS),
                   help=f"classes on emulated hosts with fixture counters (default {','.join(FIXTURE_STRENGTHS)}; "
                        "'' for none)")
    p.add_argument("--baseline-runs", type=int, default=8)
    p.add_argument("--baseline-spread-s", type=float, default=120.0,
                   help="seconds the baseline's runs are spread over (default 120)")
    p.add_argument("--runs-per-trial", type=int, default=1, help="once runs with the fault on, or quiet, per "
                                                                   f"verdict (lossy_link: {LINK_RUNS}x as many, "
                                                                   "alltoall's 3 steps each)")
    p.add_argument("--run-spacing-s", type=float, default=0.0,
                   help="seconds between the runs of one verdict (default 0: back to back)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="FILE", help="write every trial's row there too")
    p.add_argument("--rejudge", metavar="DIR", action="append", default=[],
                   help="no campaign: diagnose a kept campaign's windows (DIR/campaign.json, the directory a "
                        "campaign prints at its end) again with this tree's code and report them; repeatable")
    args = p.parse_args(argv)
    args.classes = [c for c in args.classes.split(",") if c]
    args.fixture_classes = [c for c in args.fixture_classes.split(",") if c]
    unknown = set(args.fixture_classes) - set(FIXTURE_STRENGTHS)
    if unknown:
        p.error(f"unknown fixture classes {', '.join(sorted(unknown))} (known: {', '.join(FIXTURE_STRENGTHS)})")
    unknown = set(args.classes) - set(CLASSES)
    if unknown:
        p.error(f"unknown classes {', '.join(sorted(unknown))} (known: {', '.join(CLASSES)})")
    if args.rejudge:
        rows, quiet_rows = [], []
        for root in args.rejudge:
            r, q = rejudge(root)
            rows, quiet_rows = rows + r, quiet_rows + q
        report(rows, quiet_rows)
        return 0
    if os.geteuid() != 0:
        p.error("the testbed needs root")
    # SIGTERM unwinds like Ctrl-C: the campaign's `finally` stops the daemon and takes the testbed down
    signals.install(signals.VERB, signals.raise_terminated)
    run = loop_campaign if args.mode == "loop" else campaign
    rows, quiet_rows = run(args) if args.classes or args.quiet else ([], [])
    if args.fixture_classes:
        rows += fixture_campaign(args)
    report(rows, quiet_rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trials": rows, "quiet": quiet_rows, "args": vars(args)}, f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except signals.Terminated:
        print("diagnose_accuracy: terminated (the daemon stopped, the testbed down)", file=sys.stderr)
        sys.exit(143)
