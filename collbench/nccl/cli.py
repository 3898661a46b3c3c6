"""`collbench nccl census PATH...`: what collectives an NCCL/RCCL job ran, and whether its ranks agreed.
`collbench nccl replay PATH...`: time them through MPI on this cluster (collbench/nccl/replay.py).

Exit codes: census: 0 done, 1 a desync was found and --fail-on-desync was given; replay: 0 done,
1 a replayed step failed (the records say which); both: 2 bad input (no file, empty, binary, no
COLL lines, nothing replayable, a config without the log's ranks; the message names the file and
what was expected), nothing written; replay: also 2 when an output (-o, --csv, --results) cannot
be written after the run: the others are still written and the failed one is named.
Outputs go through collbench.atomic_file: a device or FIFO is written through, never replaced;
--results is appended in place.
"""

import os
import sys

from collbench import cli_values
from collbench.atomic_file import write_output
from collbench.config import int_flag

FORMATS = ("table", "csv", "json")


def register(subparsers):
    p = subparsers.add_parser(
        "nccl", help="NCCL/RCCL collective logs: census, desync finder, replay on this fabric",
        description="Read NCCL/RCCL debug logs (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL).")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    c = verbs.add_parser(
        "census", help="count the collectives of a log and check that ranks issued the same ones",
        description="Stream NCCL/RCCL logs in constant memory: per (op, count, datatype, redop, nranks, "
                    "in-place) the calls and bytes, per communicator and host, and desync findings "
                    "(ranks of one communicator that issued different collectives). See docs/NCCL.md.")
    c.add_argument("paths", nargs="+", metavar="PATH",
                   help="log files, directories (read recursively), .gz files, or - for stdin")
    c.add_argument("--format", choices=FORMATS, default="table",
                   help="table (default), csv (the configuration groups) or json (everything)")
    c.add_argument("-o", "--output", metavar="FILE",
                   help="write the output to FILE atomically instead of stdout")
    c.add_argument("-v", "--verbose", action="store_true",
                   help="all rows, every rank handle, and the malformed lines with file:line")
    c.add_argument("--fail-on-desync", action="store_true",
                   help="exit 1 when a desync is found")
    c.set_defaults(func=cmd_census)
    register_replay(verbs)


def register_replay(verbs):
    from collbench.cli import add_config_arg
    from collbench.nccl.replay_plan import DEFAULT_MAX_CALLS, DEFAULTS
    r = verbs.add_parser(
        "replay", help="time a log's collectives through MPI on this cluster (built-in engine)",
        description="Run the collectives of NCCL/RCCL logs with the built-in engine on the config's hosts, "
                    "launcher and transport. --order grouped (default) times each distinct configuration and "
                    "estimates the log's total collective time on this fabric; --order log replays one rank's "
                    "calls on one communicator in the log's order (the RCCL replayer's CSV with --format csv). "
                    "See docs/NCCL.md.",
        epilog="float16/bfloat16 (and fp8) have no MPI datatype: they are timed as integers of their width. "
               "Outputs (-o, --csv, --results) are written atomically after the run. Exit 1 if a step "
               "failed, 2 on bad input (nothing runs, nothing is written).")
    r.add_argument("paths", nargs="+", metavar="PATH",
                   help="log files, directories (read recursively), .gz files, or - for stdin")
    add_config_arg(r)
    r.add_argument("--engine", choices=("builtin", "nccl-tests"), default="builtin",
                   help="builtin: MPI on host memory (default); nccl-tests: the config's nccl-tests binaries "
                        "on the GPUs, with the log's datatypes, reductions and roots (grouped order)")
    r.add_argument("--np", type=int_flag, metavar="N",
                   help="ranks the cluster provides (default: the config's ranks); a communicator larger than "
                        "that is replayed at N ranks, with a warning")
    r.add_argument("--order", choices=("grouped", "log"), default="grouped",
                   help="grouped: each distinct configuration, with repetitions (default); log: one rank's "
                        "sequence in the log's order")
    r.add_argument("--iterations", type=int_flag, metavar="N",
                   help=f"timed calls per configuration (grouped, default {DEFAULTS['grouped'][0]}) or "
                        f"iterations per call (log, default {DEFAULTS['log'][0]})")
    r.add_argument("--warmup", type=int_flag, metavar="N",
                   help=f"untimed calls before them (default {DEFAULTS['grouped'][1]} grouped, "
                        f"{DEFAULTS['log'][1]} per call in log order)")
    r.add_argument("--max-bytes", metavar="SIZE", default="64MB",
                   help="cap on nccl-tests' size of a call (the larger of a rank's send and receive buffers); "
                        "larger calls are timed at the cap and their time scaled by bytes (default 64MB)")
    r.add_argument("--comm", metavar="COMM",
                   help="log order: the communicator (as the census lists it, a commId, a comm pointer or "
                        "host:pid:pointer; default: the largest)")
    r.add_argument("--max-calls", type=int_flag, metavar="N", default=DEFAULT_MAX_CALLS,
                   help=f"log order: replay at most the first N calls of the sequence (default {DEFAULT_MAX_CALLS})")
    r.add_argument("--format", choices=FORMATS, default="table",
                   help="table (default); csv: the RCCL replayer's CSV (log order) or one row per "
                        "configuration (grouped); json: everything")
    r.add_argument("-o", "--output", metavar="FILE", help="write the output to FILE atomically instead of stdout")
    r.add_argument("--csv", metavar="FILE", help="also write the CSV to FILE (atomically)")
    r.add_argument("--results", metavar="FILE",
                   help="append the JSONL records (one result per timed configuration, failures, and an "
                        "nccl_replay event) to FILE")
    r.add_argument("--validate", action="store_true", help="check every result element (on untimed calls)")
    r.add_argument("-v", "--verbose", action="store_true", help="every row of the tables")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    r.set_defaults(func=cmd_replay)


def _stdout_closed(output):
    """Output to a closed stdout (`>&-`) is refused before any work, exit 2."""
    from collbench.errors import UserError
    if output not in (None, "-"):
        return
    try:
        os.fstat(1)
    except OSError:
        raise UserError("standard output is closed: nowhere to print the result (give -o FILE)") from None


def _safe(text):
    """Text from the log (host, comm, commId fields) shown on a terminal: control characters escaped."""
    from collbench.bounded_repr import terminal_safe
    return terminal_safe(text, one_line=False)


def replay_flags(args):
    """The flags both replay engines share, checked before the log is read or anything runs:
    (replay.Settings keywords, {flag: output path checked writable})."""
    from collbench.atomic_file import check_writable
    common = dict(iterations=cli_values.count(args.iterations, "--iterations", 1, 10**6),
                  warmup=cli_values.count(args.warmup, "--warmup", 0, 10**6),
                  max_bytes=cli_values.message_size(args.max_bytes, "--max-bytes"),
                  np=cli_values.count(args.np, "--np", 1, 1 << 20), validate=args.validate, quiet=args.quiet)
    _stdout_closed(args.output)
    checked = {}
    for flag, path in (("--results", args.results), ("--csv", args.csv), ("-o", args.output)):
        if path not in (None, "-"):
            checked[flag] = check_writable(path, flag, append=flag == "--results")
    return common, checked


def cmd_census(args):
    from collbench.nccl import report
    from collbench.nccl.census import run_census

    _stdout_closed(args.output)
    census = run_census(args.paths)
    if args.format == "json":
        text = report.render_json(census)
    elif args.format == "csv":
        text = report.render_csv(census)
        for line in report.desync_summary(census):
            print(_safe(line), file=sys.stderr)
    else:
        text = _safe(report.render_table(census, verbose=args.verbose))
    write_output(args.output, text)
    if args.format != "table":
        for w in census.warnings:
            print(f"collbench: warning: {_safe(w)}", file=sys.stderr)
    return 1 if census.desync and args.fail_on_desync else 0


def cmd_replay(args):
    return REPLAYS[args.engine](args)


def _write_replay(args, checked, result, report, render_table):
    """Every output of a replay (-o in --format, --csv, --results) that can be written is (the
    measurements are not thrown away for one that cannot); the Outputs, whose failures the
    command raises once it has said the rest. report: the module with render_json/render_csv."""
    from collbench.atomic_file import Outputs
    from collbench.results.records import dumps
    if args.format == "json":
        text = report.render_json(result)
    elif args.format == "csv":
        text = report.render_csv(result)
    else:
        text = _safe(render_table(result))
    outs = Outputs()
    if "--results" in checked:      # appended in place: an existing results log is not read
        outs.append(checked["--results"], [dumps(r) + "\n" for r in result.records], "--results")
    if "--csv" in checked:
        outs.write(checked["--csv"], report.render_csv(result), "--csv")
    outs.write(args.output, text, "-o")
    return outs


def _replay_builtin(args):
    from collbench import harness
    from collbench.config import load_config
    from collbench.errors import UserError
    from collbench.nccl import replay, replay_report

    # everything that can be wrong with the flags is found before the log is read or anything runs
    if args.comm is not None and args.order != "log":
        raise UserError("--comm picks the communicator of --order log")
    common, checked = replay_flags(args)
    settings = replay.Settings(order=args.order, comm=args.comm,
                               max_calls=cli_values.count(args.max_calls, "--max-calls", 1, 10**8), **common)
    cfg = load_config(args.config)

    with harness.Run("nccl replay", quiet=True, on_stop="nothing written") as job:
        run = replay.replay_log if args.order == "log" else replay.replay_grouped
        result = run(args.paths, cfg, settings)
    if job.stopped:
        return job.exit_code

    outs = _write_replay(args, checked, result, replay_report,
                         lambda r: replay_report.render_table(r, verbose=args.verbose))
    if args.format != "table":
        for w in result.warnings:
            print(f"collbench: warning: {_safe(w)}", file=sys.stderr)
    bad_validation = [r for r in result.records if r.get("type") == "result" and r.get("validation") == "fail"]
    if result.failed or bad_validation:
        print(f"collbench: replay: {len(result.failed)} configuration(s) failed ({len(result.runner.failures)} "
              f"failure record(s)), {len(bad_validation)} failed validation", file=sys.stderr)
    outs.raise_if_failed()
    return 1 if result.failed or bad_validation else 0


def _replay_nccl_tests(args):
    """`nccl replay --engine nccl-tests` (grouped order): flags checked before the log is read."""
    from collbench import harness
    from collbench.config import load_config
    from collbench.errors import UserError
    from collbench.nccl import replay as mpi_replay
    from collbench.nccl import replay_nccl_tests

    if args.order != "grouped":
        raise UserError("--engine nccl-tests replays the grouped configurations (--order grouped); "
                        "--order log is the built-in engine's")
    common, checked = replay_flags(args)
    settings = mpi_replay.Settings(order="grouped", **common)
    cfg = load_config(args.config)
    cfg.validate = bool(args.validate)

    def progress(row):
        if not args.quiet:
            what = f"{row.op} {row.datatype} x{row.count} at {row.call.nranks} ranks"
            done = f"{row.time_us:.2f} us/call" if row.time_us is not None else f"FAILED: {row.error}"
            print(f"collbench nccl replay: {what}: {done}", file=sys.stderr)

    with harness.Run("nccl replay", quiet=True, on_stop="nothing written") as job:
        result = replay_nccl_tests.replay(args.paths, cfg, settings, on_row=progress)
    if job.stopped:
        return job.exit_code
    outs = _write_replay(args, checked, result, replay_nccl_tests, replay_nccl_tests.render_table)
    for w in result.warnings:
        print(f"collbench: warning: {_safe(w)}", file=sys.stderr)
    bad = [r for r in result.records if r.get("type") == "result" and r.get("validation") == "fail"]
    if result.failed or bad:
        print(f"collbench: replay: {len(result.failed)} configuration(s) failed, {len(bad)} failed validation",
              file=sys.stderr)
    outs.raise_if_failed()
    return 1 if result.failed or bad else 0


# `nccl replay --engine NAME` -> the command that replays with it
REPLAYS = {"builtin": _replay_builtin, "nccl-tests": _replay_nccl_tests}
