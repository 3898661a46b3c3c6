"""`collbench baseline save|compare|show|list`: a cluster's own latency as the reference.

save     NAME [--from RESULTS...] | [--runs N]   median and spread per (op, size, ranks, nodes,
         transport, engine, algorithm) of N runs (`collbench once` run N times, or records read
         from results files) into <state_dir>/baselines/NAME.json (or NAME when it ends in .json)
compare  NAME [RESULTS...]   current vs baseline: ratio and verdict (comparison.py); without
         RESULTS, measures now with `collbench once` (--runs, default 3) on the baseline's ops,
         sizes and ranks
show     NAME                the saved entries
list                         the baselines in the state directory

Exit codes: 0 fine; 1 compare found a regression (or a missing key with --fail-on-missing, or
the current run measured nothing); 2 bad input (a missing or malformed baseline or results
file, a bad flag, nothing comparable in the given files).
"""

import json
import math
import os
import sys
import time

from collbench import harness
from collbench.baselines import baseline_file as bf
from collbench.bounded_repr import terminal_safe
from collbench.congestion.normal import MIN_REF_STEPS
from collbench.baselines.comparison import (DEFAULT_K, DEFAULT_THRESHOLD, MISSING, NEW, REGRESSION, SLOWEST_MARGIN,
                                            compare, counts)
from collbench.cli import IntermixedArgumentParser, add_config_arg
from collbench.errors import UserError
from collbench.tables import Column, csv_text, format_us, table_lines
from collbench.results.file_reader import ResultsInput, parse_since

DEFAULT_SAVE_RUNS = 5
DEFAULT_COMPARE_RUNS = 3


def register(subparsers):
    p = subparsers.add_parser(
        "baseline", help="save this cluster's latency as a baseline; compare against it (regressions)",
        description="Baselines: the median and spread of a cluster's own latency per (op, size, ranks, nodes, "
                    "transport, engine, algorithm), and a comparison that flags regressions beyond the "
                    "baseline's noise. For CI and after maintenance: compare exits 1 on a regression.")
    # intermixed: `compare NAME --state-dir D results.jsonl` (options between positionals) parses
    verbs = p.add_subparsers(dest="verb", metavar="VERB", parser_class=IntermixedArgumentParser)
    verbs.required = True

    def verb(name, func, help_, description=None):
        v = verbs.add_parser(name, help=help_, description=description or help_)
        add_config_arg(v)
        v.add_argument("--state-dir", metavar="DIR",
                       help="where named baselines live (<DIR>/baselines/NAME.json; default: state_dir in the "
                            "config, else /var/lib/collbench as root, ~/.local/state/collbench otherwise)")
        v.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format")
        v.set_defaults(func=func)
        return v

    v = verb("save", cmd_save, "measure (or read) and save a baseline",
             "Save the median and spread of N runs per (op, size, ranks, nodes, transport, engine, algorithm). "
             "With --from, the runs are the records in results files (each record one measurement); "
             "otherwise `collbench once` runs --runs times (default 5) with --config and the narrowing flags.")
    v.add_argument("name", metavar="NAME", help="a name (saved in the state directory) or a path ending in .json")
    v.add_argument("--from", dest="sources", nargs="+", metavar="RESULTS",
                   help="results files or state directories to take the measurements from")
    v.add_argument("--runs", type=int, metavar="N", help=f"run `collbench once` N times (default {DEFAULT_SAVE_RUNS})")
    _once_flags(v)
    v.add_argument("--since", metavar="WHEN", help="with --from: only records from then on (30m, 2h, 7d or a time)")
    v.add_argument("--force", action="store_true", help="replace an existing baseline of that name")

    v = verb("compare", cmd_compare, "compare current results with a baseline (exit 1 on a regression)",
             "Current median latency vs the baseline's per key, with the ratio and a verdict: regression when "
             "the ratio is above --threshold AND the latency is above the baseline median + k x sigma and "
             f"{SLOWEST_MARGIN:g}x the baseline's slowest run (its noise); noisy when only the ratio is; improved, "
             "ok, new, missing. Without RESULTS, measures now "
             f"with `collbench once` (--runs, default {DEFAULT_COMPARE_RUNS}) on the baseline's ops, sizes and "
             "ranks.")
    v.add_argument("name", metavar="NAME", help="the baseline: a saved name or a .json path")
    v.add_argument("results", nargs="*", metavar="RESULTS", help="results files or state directories (current)")
    v.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, metavar="RATIO",
                   help=f"current/baseline ratio above which a change can be a regression (default {DEFAULT_THRESHOLD})")
    v.add_argument("--k", type=float, default=DEFAULT_K, metavar="K",
                   help=f"noise allowance in baseline sigmas (1.4826 x MAD) (default {DEFAULT_K:g})")
    v.add_argument("--runs", type=int, metavar="N", help=f"without RESULTS: runs of `collbench once` (default "
                                                         f"{DEFAULT_COMPARE_RUNS})")
    v.add_argument("--iterations", type=int, metavar="N", help="without RESULTS: timed iterations per step")
    v.add_argument("--since", metavar="WHEN", help="only current records from then on (30m, 2h, 7d or a time)")
    v.add_argument("--fail-on-missing", action="store_true",
                   help="exit 1 also when a baseline key has no current measurement")

    v = verb("show", cmd_show, "print a saved baseline's entries")
    v.add_argument("name", metavar="NAME", help="a saved name or a .json path")
    verb("list", cmd_list, "list the baselines saved in the state directory")


def _once_flags(v):
    v.add_argument("--np", type=int, metavar="N", help="with --runs: number of MPI ranks")
    v.add_argument("--ops", metavar="LIST", help="with --runs: only these ops")
    v.add_argument("--sizes", metavar="LIST", help="with --runs: only these sizes")
    v.add_argument("--iterations", type=int, metavar="N", help="with --runs: timed iterations per step")


def state_dir(args):
    if args.state_dir:
        return os.path.abspath(os.path.expanduser(args.state_dir))
    from collbench.config import load_config
    return os.path.abspath(os.path.expanduser(load_config(args.config).state_dir))


# ------------------------------------------------------------------ measuring

def measure(collector, runs, once_flags, config, label, verb):
    """Run `collbench once`'s plan (narrowed by once_flags: np, ops, sizes, iterations) `runs`
    times into collector, in this process through the harness: progress on stderr, Ctrl-C and
    SIGTERM stop the run (harness.Stopped). Failed steps are recorded (failure records); a config or
    flag error is a UserError before anything runs."""
    from collbench.config import load_config
    cfg = load_config(config)
    steps = harness.once_plan(cfg, **once_flags)
    engine, _ = harness.prepare(cfg, steps)
    for i in range(runs):
        started = time.monotonic()
        ctx = harness.run_context(cfg, cfg.engine)       # a run id per run
        records, job = harness.run_plan(verb, engine, cfg, steps, ctx, on_stop="nothing saved")
        if job.stopped:
            raise harness.Stopped(job.exit_code)
        results = 0
        for rec in records:
            collector.add(rec)
            results += rec.get("type") == "result"
        fails = sum(1 for r in records if r.get("type") == "failure")
        extra = f", {fails} failed step(s)" if fails else ""
        print(f"collbench: {label} run {i + 1}/{runs}: {results} result(s){extra} "
              f"({time.monotonic() - started:.1f}s)", file=sys.stderr)


def once_args(flags):
    """once's command-line words of the flags, as a baseline's source records them."""
    return [w for flag, value in flags.items() if value is not None for w in (f"--{flag}", str(value))]


def _read(paths, since):
    """(Collector, ResultsInput) of the records in paths; the read summary on stderr."""
    source = ResultsInput(paths, since=since)
    collector = source.consume(bf.Collector)
    print(f"collbench: {source.summary_line()}", file=sys.stderr)
    for s in source.stats:
        for reason, n in s.reasons.most_common(3):
            print(f"collbench:   {s.path}: {n} line(s): {reason}", file=sys.stderr)
    return collector, source


def _check_runs(runs):
    if runs is not None and runs < 1:
        raise UserError(f"--runs {runs}: expected a number of runs >= 1")


# ------------------------------------------------------------------ output

def _fmt_us(v):
    return "-" if v is None else format_us(v)


def _render_table(headers, rows, right):
    columns = [Column(i, h, align="right" if i in right else "left") for i, h in enumerate(headers)]
    return "\n".join(table_lines(columns, [dict(enumerate(r)) for r in rows]))


def _csv(headers, rows):
    # the cells as they are: csv's own text of a number, as this output has always been written
    return csv_text([Column(h) for h in headers], [dict(zip(headers, r)) for r in rows], cell=lambda v: v)


def _key_cells(k, with_alg):
    """with_alg: the algorithm and variant columns are shown (some key has one). Text read from a
    file (transport, engine, ...) is terminal-safe: an escape sequence in it is shown, not obeyed."""
    cells = [k.op, k.size, str(k.ranks), "-" if k.nodes is None else str(k.nodes), k.transport or "-",
             k.engine or "-"] + ([k.algorithm or "-", k.variant or "-"] if with_alg else [])
    return [terminal_safe(c) for c in cells]


def _json_safe(value):
    """value with every non-finite number (a ratio or bound that overflowed) as null, and beside it
    `non_finite: {key: "Infinity"}` saying why: `json.dumps` would write Infinity, which is not JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        out, why = {}, {}
        for k, v in value.items():
            if isinstance(v, float) and not math.isfinite(v):
                why[k] = "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
            out[k] = _json_safe(v)
        if why:
            out["non_finite"] = why
        return out
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _json(value):
    return json.dumps(_json_safe(value), indent=1, allow_nan=False) + "\n"


def render_entries(baseline, fmt):
    entries = baseline.sorted_entries()
    if fmt == "json":
        return _json(baseline.as_dict())
    with_alg = any(e.key.algorithm or e.key.variant for e in entries)
    headers = ["op", "size", "ranks", "nodes", "transport", "engine"] + (["algorithm", "variant"] if with_alg else []) + \
              ["median", "sigma", "q1", "q3", "n", "busbw GB/s"]
    if fmt == "csv":
        headers = [h.replace(" GB/s", "_GBps") for h in headers]
        rows = [_key_cells(e.key, with_alg) + [f"{e.median_us:.6g}", f"{e.sigma_us:.6g}", f"{e.latency['q1']:.6g}",
                                               f"{e.latency['q3']:.6g}", str(e.n),
                                               f"{e.busbw['median'] / 1e9:.6g}" if e.busbw else ""]
                for e in entries]
        return _csv([h if h not in ("median", "sigma", "q1", "q3") else h + "_us" for h in headers], rows)
    rows = [_key_cells(e.key, with_alg) + [_fmt_us(e.median_us), _fmt_us(e.sigma_us), _fmt_us(e.latency["q1"]),
                                           _fmt_us(e.latency["q3"]), str(e.n),
                                           f"{e.busbw['median'] / 1e9:.3g}" if e.busbw else "-"]
            for e in entries]
    right = {2, 3} | set(range(len(headers) - 6, len(headers)))
    return _render_table(headers, rows, right) + "\n"


def render_comparison(baseline, comparisons, fmt, threshold, k, extra=None):
    tally = counts(comparisons)
    if fmt == "json":
        out = {"baseline": {"name": baseline.name, "path": baseline.path, "created": bf._iso(baseline.created_ts),
                            "entries": len(baseline.entries)},
               "threshold": threshold, "k": k,
               "rule": f"regression: current > max(threshold * median, median + k * sigma, {SLOWEST_MARGIN:g} * slowest)",
               "rows": [c.as_dict() for c in comparisons], "summary": tally}
        out.update(extra or {})
        return _json(out)
    with_alg = any(c.key.algorithm or c.key.variant for c in comparisons)
    headers = ["op", "size", "ranks", "nodes", "transport", "engine"] + (["algorithm", "variant"] if with_alg else []) + \
              ["baseline", "sigma", "n", "current", "n", "ratio", "bound", "verdict"]
    rows = []
    for c in comparisons:
        b, cur = c.baseline, c.current
        if fmt == "csv":
            rows.append(_key_cells(c.key, with_alg) + [
                f"{b.median_us:.6g}" if b else "", f"{b.sigma_us:.6g}" if b else "", str(b.n) if b else "",
                f"{cur['median']:.6g}" if cur else "", str(cur["n"]) if cur else "",
                f"{c.ratio:.4f}" if c.ratio is not None else "", f"{c.bound_us:.6g}" if c.bound_us else "",
                c.verdict])
        else:
            rows.append(_key_cells(c.key, with_alg) + [
                _fmt_us(b.median_us if b else None), _fmt_us(b.sigma_us if b else None), str(b.n) if b else "-",
                _fmt_us(cur["median"] if cur else None), str(cur["n"]) if cur else "-",
                f"{c.ratio:.2f}x" if c.ratio is not None else "-", _fmt_us(c.bound_us),
                c.verdict.upper() if c.verdict == REGRESSION else c.verdict])
    if fmt == "csv":
        headers = headers[:-8] + ["baseline_us", "sigma_us", "baseline_n", "current_us", "current_n", "ratio",
                                  "bound_us", "verdict"]
        return _csv(headers, rows)
    right = {2, 3} | set(range(len(headers) - 8, len(headers) - 1))
    summary = ", ".join(f"{n} {v}" for v, n in tally.items() if n)
    head = (f"baseline {terminal_safe(baseline.name)} ({terminal_safe(baseline.path)}), {len(baseline.entries)} entries, saved "
            f"{bf._iso(baseline.created_ts) or '?'}; threshold {threshold:g}x, k {k:g}")
    return f"{head}\n\n{_render_table(headers, rows, right)}\n\n{summary}\n"


# ------------------------------------------------------------------ verbs

def cmd_save(args):
    _check_runs(args.runs)
    if args.sources and args.runs is not None:
        raise UserError("--from and --runs: give one (measurements from files, or runs now)")
    path = bf.resolve_path(args.name, state_dir(args))
    if os.path.exists(path) and not args.force:
        raise UserError(f"baseline {path} exists: use --force to replace it (or another name)")
    if args.sources:
        if any(getattr(args, f) is not None for f in ("np", "ops", "sizes", "iterations")):
            raise UserError("--np/--ops/--sizes/--iterations apply to --runs, not to --from")
        since = parse_since(args.since, time.time()) if args.since is not None else None
        collector, _ = _read(args.sources, since)
        source = {"kind": "results", "files": [os.path.abspath(p) for p in args.sources]}
    else:
        if args.since:
            raise UserError("--since applies to --from")
        runs = args.runs or DEFAULT_SAVE_RUNS
        collector = bf.Collector()
        flags = {"np": args.np, "ops": args.ops, "sizes": args.sizes, "iterations": args.iterations}
        try:
            measure(collector, runs, flags, args.config, "baseline", "baseline save")
        except harness.Stopped as e:
            return e.exit_code
        source = {"kind": "runs", "runs": runs, "config": os.path.abspath(args.config) if args.config else None,
                  "once_args": once_args(flags)}
    if not collector.values:
        why = f"; {collector.failure_count} failure record(s), e.g. {terminal_safe(collector.failures[0].get('error'))}" \
            if collector.failures else ""
        raise UserError(f"no result records to make a baseline from{why}")
    baseline = bf.new_baseline(args.name if not args.name.endswith(".json") else os.path.basename(args.name)[:-5],
                               collector, source)
    bf.save(baseline, path, force=args.force)
    sys.stdout.write(render_entries(baseline, args.format))
    few = sum(1 for e in baseline.entries.values() if e.n < bf.MIN_RUNS)
    print(f"collbench: baseline {baseline.name} saved to {path}: {len(baseline.entries)} entries", file=sys.stderr)
    if few:
        print(f"collbench: note: {few} of {len(baseline.entries)} entries have fewer than {bf.MIN_RUNS} measurements: "
              "their spread is not known well enough (the median absolute deviation of fewer runs is often near 0, "
              "so a quiet run strays past the bound and is reported as a regression): save it from "
              f"{bf.MIN_RUNS} runs or more (--runs, or more records with --from)", file=sys.stderr)
    firsts = [e.first_ts for e in baseline.entries.values() if e.first_ts is not None]
    lasts = [e.last_ts for e in baseline.entries.values() if e.last_ts is not None]
    if firsts and lasts and max(lasts) - min(firsts) < bf.MIN_SPAN_S:
        print(f"collbench: note: its runs span {max(lasts) - min(firsts):.0f} s: a machine's slow spells last longer than that "
              "(docs/DIAGNOSIS.md, quiet runs), and a baseline that never saw one calls the next one a regression; "
              f"a baseline from runs spread over more than {bf.MIN_SPAN_S // 60:.0f} minutes (--from the stress "
              "loop's state directory, --since 1d) holds them", file=sys.stderr)
    steps = baseline.counter_normal.exposure["host"][0] if baseline.counter_normal is not None else 0
    if steps < MIN_REF_STEPS:
        print(f"collbench: note: the counters' normal holds {steps} steps with congestion counters (fewer than "
              f"{MIN_REF_STEPS}): `diagnose --baseline` cannot tell a counter's bursts from its steady rate and "
              "weighs its movements cautiously", file=sys.stderr)
    return 0


def _compare_runs(baseline, args):
    """Measure now: one set of runs per ranks value in the baseline, on its ops and sizes."""
    collector = bf.Collector()
    by_ranks = {}
    for key in baseline.entries:
        ops, sizes = by_ranks.setdefault(key.ranks, ({}, {}))
        ops[key.op] = None
        if key.size_bytes:
            sizes[key.size] = None
    runs = args.runs or DEFAULT_COMPARE_RUNS
    for ranks, (ops, sizes) in sorted(by_ranks.items()):
        flags = {"np": ranks, "ops": ",".join(ops), "sizes": ",".join(sizes) if sizes else None,
                 "iterations": args.iterations}
        measure(collector, runs, flags, args.config, f"{ranks} ranks:", "baseline compare")
    return collector


def cmd_compare(args):
    _check_runs(args.runs)
    for flag, v in (("--threshold", args.threshold), ("--k", args.k)):
        if not math.isfinite(v) or v < (1.0 if flag == "--threshold" else 0.0):
            raise UserError(f"{flag} {v}: expected a number >= {1 if flag == '--threshold' else 0}")
    baseline = bf.load(args.name, state_dir(args))
    if not baseline.entries:
        raise UserError(f"baseline {baseline.path}: has no entries")
    extra = {}
    if args.results:
        if args.runs is not None or args.iterations is not None:
            raise UserError("--runs/--iterations measure now: give them without RESULTS")
        since = parse_since(args.since, time.time()) if args.since is not None else None
        collector, source = _read(args.results, since)
        extra["input"] = [s.as_dict() for s in source.stats]
    else:
        if args.since:
            raise UserError("--since applies to RESULTS")
        try:
            collector = _compare_runs(baseline, args)
        except harness.Stopped as e:
            return e.exit_code
    current = collector.summaries()
    comparisons = compare(baseline, current, args.threshold, args.k)
    matched = [c for c in comparisons if c.verdict not in (NEW, MISSING)]
    if collector.failure_count:
        extra["failures"] = collector.failure_count
    sys.stdout.write(render_comparison(baseline, comparisons, args.format, args.threshold, args.k, extra))
    if collector.failure_count:
        print(f"collbench: {collector.failure_count} failure record(s) in the current results, e.g. "
              f"{terminal_safe(collector.failures[0].get('error'))}", file=sys.stderr)
    if not matched:
        msg = ("nothing to compare: no current result matches a baseline entry (same op, size, ranks, nodes, "
               "transport, engine, algorithm)")
        if args.results:
            raise UserError(f"{msg} in {', '.join(args.results)}")
        print(f"collbench: {msg}: the measurement failed", file=sys.stderr)
        return 1
    tally = counts(comparisons)
    if tally[REGRESSION]:
        print(f"collbench: {tally[REGRESSION]} regression(s) against baseline {baseline.name}", file=sys.stderr)
        return 1
    if args.fail_on_missing and tally[MISSING]:
        print(f"collbench: {tally[MISSING]} baseline entries have no current measurement", file=sys.stderr)
        return 1
    return 0


def cmd_show(args):
    baseline = bf.load(args.name, state_dir(args))
    sys.stdout.write(render_entries(baseline, args.format))
    return 0


def cmd_list(args):
    d = state_dir(args)
    items = bf.list_baselines(d)
    rows, bad = [], []
    for name, path in items:
        try:  # one bad file is named; the others are still listed
            b = bf.load(path, d)
            kind = b.source.get("kind", "?")
            rows.append([name, bf._iso(b.created_ts) or "?", str(len(b.entries)),
                         kind if isinstance(kind, str) else "?", path])
        except UserError as e:
            rows.append([name, "-", "-", "unreadable", path])
            bad.append(str(e))
    headers = ["name", "created", "entries", "from", "path"]
    if args.format == "json":
        sys.stdout.write(json.dumps([dict(zip(headers, r)) for r in rows], indent=1) + "\n")
    elif args.format == "csv":
        sys.stdout.write(_csv(headers, [[terminal_safe(c) for c in r] for r in rows]))
    elif rows:
        sys.stdout.write(_render_table(headers, [[terminal_safe(c) for c in r] for r in rows], {2}) + "\n")
    else:
        print(f"no baselines in {d}/baselines", file=sys.stderr)
    for message in bad:
        print(f"collbench: unreadable: {terminal_safe(message)}", file=sys.stderr)
    return 0
