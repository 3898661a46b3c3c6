"""`collbench diagnose [RESULTS...] [--state-dir DIR] [--since DURATION] [--baseline NAME]
[--format table|csv|json]`: what regressed, and the host, port or link that explains it.

Exit codes: 0 nothing regressed; 1 a regression was found (its suspects named, or `unexplained`
when nothing explains it); 2 bad input (no usable result record, a malformed or foreign baseline,
a bad flag).
"""

import os
import sys
import time

from collbench.cli import IntermixedArgumentParser, add_config_arg
from collbench.diagnose.verdict import Diagnosis, explain
from collbench.errors import UserError
from collbench.results.file_reader import ResultsInput, parse_since

EXIT_NONE, EXIT_FOUND, EXIT_BAD = 0, 1, 2


def register(subparsers):
    p = subparsers.add_parser(
        "diagnose", help="what regressed, and which host, port or link explains it (congestion, pfc, "
                         "link errors, a slow host)",
        description="Find the series (op, size, ranks, transport) that regressed, against a saved baseline or "
                    "as a persistent shift within the series itself, and explain it from the steps' congestion "
                    "counters and per-rank timings: ranked suspects (a host, a link between two hosts, or a "
                    "port and priority of a host) with a cause (congestion, pfc, link_errors, slow_host, "
                    "unexplained) and the evidence. Exit 1 when a regression is found, 0 when nothing "
                    "regressed, 2 on bad input. docs/DIAGNOSIS.md says what each cause means.")
    p.__class__ = IntermixedArgumentParser   # options between RESULTS (as `baseline compare`)
    add_config_arg(p)
    p.add_argument("results", nargs="*", metavar="RESULTS",
                   help="results files or stress state directories (default: the state directory's results.jsonl)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="the stress state directory: its results.jsonl when no RESULTS are given, and its "
                        "baselines/ (default: state_dir in the config)")
    p.add_argument("--since", metavar="DURATION", help="only records from then on (30m, 2h, 7d or a time)")
    p.add_argument("--baseline", metavar="NAME",
                   help="compare against this saved baseline (a name in <state-dir>/baselines or a .json path); "
                        "without it, a regression is a persistent shift within each series")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="output format (csv: the suspects)")
    # a production job's NCCL Inspector records (diagnose/inspector.py, docs/INSPECTOR.md)
    p.add_argument("--inspector", action="append", metavar="DIR|RESULTS",
                   help="diagnose a job's NCCL Inspector records (its dump directory or files, or results of "
                        "`import nccl-inspector`) with the hosts' counters of --prometheus or --counters-from")
    p.add_argument("--prometheus", metavar="URL", help="with --inspector: the Prometheus that scrapes the per-host "
                   "counters exporters (range queries of each counter's increase per host)")
    p.add_argument("--counters-from", metavar="RESULTS", action="append",
                   help="with --inspector: the results log of the stress loop that ran beside the job")
    p.add_argument("--step", type=float, default=5.0, metavar="SECONDS",
                   help="with --prometheus: the interval the counters' increase is read over (default 5)")
    p.set_defaults(func=cmd_diagnose)


def _state_dir(args, cfg):
    if args.state_dir:
        return os.path.abspath(os.path.expanduser(args.state_dir))
    return os.path.abspath(os.path.expanduser(cfg.state_dir))


def diagnose(paths, baseline=None, since=None, shift_ratio=None):
    """(Diagnosis, ResultsInput) of the results files (the verb without its flags and output).
    shift_ratio: the shift test's size gate without a baseline (the config's alerts.shift_ratio, the
    gate of the alert that sent the operator here; None: its default)."""
    from collbench.diagnose import regression
    from collbench.diagnose.load import load
    source = ResultsInput(paths, since=since)
    loaded = load(source)
    bad = source.bad_lines
    where = ", ".join(source.paths[:3]) + (" ..." if len(source.paths) > 3 else "")
    if not loaded.series:
        extra = f" ({bad} bad line(s) skipped)" if bad else ""
        raise UserError(f"{where}: no usable result record{extra}: nothing to diagnose")
    notes = []
    if baseline is not None:
        _check_same_cluster(baseline, loaded)
    regs, det_notes = regression.detect(loaded.series, baseline, shift_ratio=shift_ratio)
    notes += det_notes
    if len(loaded.clusters) > 1:
        shapes = ", ".join(f"{n} nodes/{r} ranks/{t}" for (n, r, t) in sorted(loaded.clusters, key=str)[:4])
        notes.append(f"the results mix {len(loaded.clusters)} cluster shapes ({shapes}); each series is judged on its own")
    suspects = explain(loaded, regs, baseline.counter_normal if baseline is not None else None)
    if regs and loaded.no_congestion:
        notes.append(f"{loaded.no_congestion} of {loaded.results} result(s) carry no congestion counters "
                     "(older logs, congestion.enabled false, or the OSU/nccl-tests engines): the diagnosis "
                     "could not use counters there")
    if bad:
        notes.append(f"{bad} bad line(s) skipped in the input")
    d = Diagnosis("baseline" if baseline is not None else "shift", baseline.name if baseline is not None else None,
                  regs, suspects, notes,
                  {"files": list(source.paths), "results": loaded.results, "failures": loaded.failures,
                   "bad_lines": bad, "series": len(loaded.series)})
    return d, source


def _check_same_cluster(baseline, loaded):
    """A baseline of another cluster (other ranks, nodes, transport or engine) matches no series:
    exit 2 saying what differs, rather than an empty "no regression"."""
    if any(k in baseline.entries for k in loaded.series):
        return
    def shapes(keys):
        return sorted({f"{k.ranks} ranks/{k.nodes} nodes/{k.transport}/{k.engine}" for k in keys})
    b, c = shapes(baseline.entries), shapes(loaded.series)
    raise UserError(f"baseline {baseline.path or baseline.name}: no series of the results matches it: the baseline "
                    f"has {', '.join(b[:4])}; the results have {', '.join(c[:4])} (a baseline of another "
                    "cluster or configuration: save one from these results with `collbench baseline save`)")


def cmd_diagnose(args):
    from collbench.atomic_file import write_output
    from collbench.diagnose import output
    from collbench.config import load_config
    since = parse_since(args.since, time.time()) if args.since is not None else None
    paths = args.results
    cfg = load_config(args.config)
    need_state = (not paths and not args.inspector) or args.baseline
    state = _state_dir(args, cfg) if need_state else None
    if not paths and not args.inspector:
        if not os.path.isfile(os.path.join(state, "results.jsonl")):
            raise UserError(f"no RESULTS given and the state directory {state} has no results.jsonl "
                            "(name results files, or the stress state directory with --state-dir)")
        paths = [state]
    baseline = None
    if args.baseline:
        from collbench.baselines import baseline_file
        baseline = baseline_file.load(args.baseline, state)
    if args.inspector:
        from collbench.diagnose.inspector import diagnose_inspector
        if not 0.5 <= args.step <= 3600:
            raise UserError(f"--step: expected 0.5 to 3600 seconds, got {args.step:g}")
        d, summary = diagnose_inspector(args.inspector + list(args.results or []), args.prometheus,
                                        args.counters_from, baseline, args.step, cfg.alerts.shift_ratio)
        print(f"collbench: {summary}", file=sys.stderr)
    else:
        d, source = diagnose(paths, baseline, since, cfg.alerts.shift_ratio)
        print(f"collbench: {source.summary_line()}", file=sys.stderr)
    if args.format == "json":
        text = output.json_text(d)
    elif args.format == "csv":
        text = output.csv_text(d)
    else:
        text = output.table_text(d)
    write_output(None, text)
    return EXIT_FOUND if d.regressions else EXIT_NONE
