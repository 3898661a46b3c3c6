"""`collbench once`: run the plan once, show progress, print a table per op, write result files.

Exit codes: 0 every step measured (and validated, with --validate); 1 a step failed, a
validation failed or a planned step never ran (the table says which); 2 a config or flag
error, found before anything runs or is written; 130 interrupted (Ctrl-C) or 143 terminated
(SIGTERM): the MPI job is stopped and no result file is written.
"""

import sys

from collbench import engines, harness
from collbench.cli import add_config_arg
from collbench.config import int_flag, load_config
from collbench.once.report_table import render_other_failures, render_tables
from collbench.atomic_file import Outputs, check_writable
from collbench.results.output_files import write_jsonl, write_tsv


def register(subparsers):
    p = subparsers.add_parser(
        "once", help="run the benchmark plan once: a table per op, optional JSONL/TSV files",
        description="Run every step of the plan once (one op at one size per step) and print a "
                    "table per op: latency avg/min/max, bus bandwidth, validation and the "
                    "Good/Warning/Critical verdict. Progress goes to stderr.",
        epilog="--results appends this run's records to the file (JSON Lines, one per op and "
               "size); --tsv replaces the file with this run's table. Both are written "
               "atomically after the run: an interrupted run writes nothing. Exit code 1 if any "
               "step failed, 2 on a config or flag error (nothing runs).")
    add_config_arg(p)
    p.add_argument("--np", type=int_flag, metavar="N", help="number of MPI ranks (default: the config's ranks)")
    p.add_argument("--ops", metavar="LIST", help="only these ops, e.g. allreduce,bcast")
    p.add_argument("--sizes", metavar="LIST",
                   help="only these sizes (bytes per rank), e.g. 1KB,1MB; each size gets OSU's iteration "
                        "count (1000 + 100 warm-up up to 8KB, 100 + 10 above) unless --iterations or the "
                        "config's plan step sets one")
    p.add_argument("--iterations", type=int_flag, metavar="N",
                   help="timed iterations per step (default: the plan's; OSU's rule for --sizes)")
    p.add_argument("--datatype", metavar="TYPE", help="char, int, float or double (reductions default to float)")
    p.add_argument("--validate", action="store_true", default=None,
                   help="check every result element (on untimed calls)")
    p.add_argument("--engine", choices=sorted(engines.NAMES), help="override the config's engine")
    p.add_argument("--results", metavar="FILE", help="append JSONL result records to FILE")
    p.add_argument("--tsv", metavar="FILE", help="write the results table as TSV to FILE")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def _count(n, noun):
    return f"{n} {noun}{'' if n == 1 else 's'}"


def run(args):
    # Everything that can be wrong with the input is checked before the first mpirun.
    cfg = load_config(args.config)
    steps = harness.once_plan(cfg, engine=args.engine, np=args.np, ops=args.ops, sizes=args.sizes,
                              iterations=args.iterations, datatype=args.datatype, validate=args.validate)
    results_path = check_writable(args.results, "--results", append=True) if args.results else None
    tsv_path = check_writable(args.tsv, "--tsv") if args.tsv else None
    engine, ctx = harness.prepare(cfg, steps)

    records, job = harness.run_plan("once", engine, cfg, steps, ctx, quiet=args.quiet, on_stop="no result file written")
    if job.stopped:
        return job.exit_code
    if not args.quiet:
        print(f"collbench: {_count(len(records), 'record')} from {_count(len(steps), 'step')} in "
              f"{job.elapsed:.1f}s", file=sys.stderr)

    # Files first: a closed stdout (`| head`) must not lose the measurements. Each file is tried
    # (one that fails does not stop the other), the table printed, then exit 2 naming what failed.
    outputs = Outputs()
    if results_path and outputs.run(write_jsonl, results_path, records, flag="--results", path=results_path):
        print(f"collbench: results appended to {results_path}", file=sys.stderr)
    if tsv_path and outputs.run(write_tsv, tsv_path, records, flag="--tsv", path=tsv_path):
        print(f"collbench: table written to {tsv_path}", file=sys.stderr)
    if outputs.failed:
        print_report(cfg, ctx, steps, records)
        outputs.raise_if_failed()

    print_report(cfg, ctx, steps, records)
    outcome = harness.tally(records, steps)
    if not outcome.ok:
        print(f"collbench: {outcome.message()}", file=sys.stderr)
    return outcome.exit_code


def print_report(cfg, ctx, steps, records):
    print(f"collbench once: run {ctx.run_id}, {cfg.ranks} ranks on {ctx.nodes} "
          f"node{'s' if ctx.nodes != 1 else ''} ({', '.join(ctx.hosts)}), engine {cfg.engine}, "
          f"transport {cfg.transport}, {ctx.mpi}, launched by {ctx.launcher}"
          + (f" (Slurm job {ctx.slurm_job_id})" if ctx.slurm_job_id else ""))
    print()
    print(render_tables(records, steps, ranks=cfg.ranks, nodes=ctx.nodes))
    other = render_other_failures(records)
    if other:
        print()
        print(other)
    sys.stdout.flush()
