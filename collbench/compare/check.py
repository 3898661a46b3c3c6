"""Prove a written tuning file: `default` without the file (A) and with it (B), each its own MPI
job over the same sizes, in ABBA order (A B B A A B B A ...), so neither the machine's drift nor
the position in a pair favours one side. Per size the file's gain is median(A) / median(B) with
its interval (compare/stats.py).

Sizes where the file keeps the library's own choice (algorithm 0; for MPICH, ops it sets nothing
for) run the same algorithm both ways: their gain is the control, the noise of the check. A forced
size is dropped from the file (back to the library's choice) when it is slower beyond noise: its
interval lies wholly below 1, or its gain is below 1 - the control's noise (the largest distance
from 1 of a control size's gain, at most the margin; 0 without a control: then any measured loss
drops the size), or the file's job did not measure it. The file is installed-quality when the
check ran with at least 2 jobs a side and every size it still forces passed.
"""

from dataclasses import dataclass, field

from collbench.compare import stats
from collbench.compare.runner import measure, median_rows, with_rules
from collbench.compare.table import OK
from collbench.engines import algorithms as algs

MIN_PAIRS = 4


def abba(pairs):
    """The job order of `pairs` A/B pairs: A B B A A B B A ..."""
    return [algs.DEFAULT if i % 4 in (0, 3) else algs.RULES for i in range(2 * pairs)]


@dataclass
class SizeVerdict:
    op: str
    size_bytes: int
    forced: str              # the algorithm the file forces there; None: the library's choice (control)
    gain: float = None       # median(without) / median(with): > 1 the file is faster
    ci_low: float = None
    ci_high: float = None
    verdict: str = ""        # kept, dropped, control
    reason: str = ""

    def to_json(self):
        return {"op": self.op, "size_bytes": self.size_bytes, "forced": self.forced, "gain": self.gain,
                "ci_low": self.ci_low, "ci_high": self.ci_high, "verdict": self.verdict, "reason": self.reason}


@dataclass
class Check:
    path: str
    pairs: int = 0
    sizes: list = field(default_factory=list)      # SizeVerdict
    noise: float = None                            # the control's noise (None: no control size)
    ran: bool = False
    installed_quality: bool = False
    reason: str = ""
    rows: list = field(default_factory=list)       # the `rules` rows (with the file), for the table
    records: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def dropped(self):
        return [v for v in self.sizes if v.verdict == "dropped"]

    @property
    def kept(self):
        return [v for v in self.sizes if v.verdict == "kept"]

    def gain(self):
        """(geometric mean gain over the sizes the file still forces, [(low, high)])."""
        return stats.geometric_mean([v.gain for v in self.kept])

    def to_json(self):
        return {"file": self.path, "ran": self.ran, "pairs": self.pairs, "installed_quality": self.installed_quality,
                "reason": self.reason, "control_noise": self.noise, "geomean_gain_forced": self.gain(),
                "sizes": [v.to_json() for v in self.sizes],
                "dropped": [{"op": v.op, "size_bytes": v.size_bytes, "algorithm": v.forced, "reason": v.reason}
                            for v in self.dropped]}


def judge(results, forced, margin=stats.DEFAULT_MARGIN):
    """[SizeVerdict], noise: the verdict per size from results {(op, size): (gain, low, high)} and
    forced {(op, size): algorithm} (the sizes the file forces)."""
    control = [abs(g - 1.0) for key, (g, _, _) in results.items() if key not in forced and g is not None]
    noise = min(max(control), margin) if control else None
    floor = 1.0 - (noise or 0.0)
    out = []
    for key in sorted(set(results) | set(forced)):
        g, lo, hi = results.get(key, (None, None, None))
        v = SizeVerdict(key[0], key[1], forced.get(key), g, lo, hi)
        if v.forced is None:
            v.verdict, v.reason = "control", "the file keeps the library's choice: the same algorithm both ways"
        elif g is None:
            v.verdict, v.reason = "dropped", "not measured with the file loaded (its job failed there)"
        elif lo is None or hi is None:
            v.verdict, v.reason = "dropped", "no interval (fewer than 2 jobs a side)"
        elif hi < 1.0:
            v.verdict, v.reason = "dropped", f"slower beyond noise: {g:.3f}x [{lo:.3f}, {hi:.3f}] lies below 1"
        elif g < floor:
            v.verdict, v.reason = "dropped", (f"slower than the control's noise allows: {g:.3f}x < {floor:.3f} "
                                              f"(control noise {noise * 100:.1f} %)" if noise is not None else
                                              f"slower: {g:.3f}x < 1 (no control size to measure the noise)")
        else:
            v.verdict, v.reason = "kept", f"{g:.3f}x [{lo:.3f}, {hi:.3f}]"
        out.append(v)
    return out, noise


def run_check(cfg, plan, ctx, flavour, path, forced, pairs, progress, margin=stats.DEFAULT_MARGIN):
    """Run the ABBA check of the file at path; a Check. forced: {(op, size): algorithm}."""
    chk = Check(path, pairs=pairs)
    # nccl-tests: the file's variables ride in the plan's own job_config (runner.measure)
    job_cfg = None if hasattr(plan, "job_config") else with_rules(cfg, path)
    sides = {algs.DEFAULT: [], algs.RULES: []}
    order = abba(pairs)
    for i, which in enumerate(order):
        for op in plan.ops:
            r, rec, n = measure(cfg, plan, ctx, flavour, which, op, progress,
                                job_cfg=job_cfg if which == algs.RULES else None)
            for x in rec:
                x["check"] = "with" if which == algs.RULES else "without"
                if which == algs.RULES:
                    x["rules_file"] = path
            for row in r:
                row["block"] = i
            sides[which] += r
            chk.records += rec
            chk.notes += [x for x in n if x not in chk.notes]
    without = {(r["op"], r["size_bytes"]): r for r in median_rows(sides[algs.DEFAULT])}
    with_file = median_rows(sides[algs.RULES])
    results = {}
    for row in with_file:
        key = (row["op"], row["size_bytes"])
        base = without.get(key)
        base_ok = base is not None and base["status"] == OK
        if base_ok:
            row["baseline_us"] = list(base["samples_us"])
        if row["status"] == OK and base_ok:
            results[key] = stats.speedup_interval(base["samples_us"], row["samples_us"])
        else:
            results[key] = (None, None, None)
    chk.rows = with_file
    chk.sizes, chk.noise = judge(results, forced, margin)
    missing_default = [k for k in forced if k not in without or without[k]["status"] != OK]
    chk.ran = True
    if missing_default:
        chk.reason = (f"default without the file failed at {len(missing_default)} size(s): "
                      "the check is incomplete")
    elif pairs < 2:
        chk.reason = "fewer than 2 jobs a side: no interval"
    else:
        chk.installed_quality = True
    return chk
