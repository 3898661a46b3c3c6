"""`collbench sweep`: one or more ops over a range of sizes, with per-iteration percentiles.

Exit codes: 0 every size measured; 1 a step failed, failed validation or never ran (the table
says which), or a file could not be written; 2 bad input (flags, config, an output path),
found before anything runs; 130 interrupted / 143 terminated (the MPI job is stopped and no
file is written).
"""

import os
import sys

from collbench import engines, harness
from collbench.cli import add_config_arg
from collbench.config import apply_overrides, int_flag, load_config
from collbench.errors import UserError
from collbench.atomic_file import check_writable
from collbench.results.output_files import write_jsonl
from collbench.ops import DATATYPES
from collbench.sweep import metrics_report, plan, table

def register(subparsers):
    p = subparsers.add_parser(
        "sweep", help="ops over a range of message sizes: percentiles per size, a JSONL report and TSV",
        description="Run one or more ops over a range of message sizes (bytes per rank), as nccl-tests' "
                    "-b/-e/-f or OSU's size loop, and report per size OSU's average, min and max over the "
                    "ranks with the median, p90, p99 and max (pmax) of the per-iteration time of the slowest "
                    "rank, algbw and busbw. Writes the pair of files of the all-gather microbenchmark guide into --out-dir: "
                    f"{metrics_report.REPORT_NAME} (appended: one JSON line per size, "
                    "{\"metadata\": ..., \"metrics\": ...}) and t_<op>_<RUNID>.tsv per op.",
        epilog="Iterations: every size gets OSU's count, 1000 timed + 100 warm-up up to 8KB and 100 + 10 "
               "above, unless --iterations/--warmup set one (the config's plan is not used). "
               "--engine osu runs the real osu_<op> binaries, which print no per-iteration times: the "
               "percentile columns stay empty. Files are written atomically after the run; an "
               "interrupted run writes nothing. --results appends the ordinary JSONL result records "
               "(docs/LOG_FORMAT.md). Exit 1 if a size failed, 2 on bad input (nothing runs).")
    add_config_arg(p)
    p.add_argument("--op", "--ops", dest="ops", action="append", metavar="OP[,OP...]",
                   help=f"the op(s) to sweep (repeatable, or a comma list; default {plan.DEFAULT_OPS})")
    p.add_argument("--min-bytes", "-b", metavar="SIZE",
                   help=f"smallest size, bytes per rank (4, 1KB, 1MB; default {plan.DEFAULT_MIN_BYTES})")
    p.add_argument("--max-bytes", "-e", metavar="SIZE",
                   help=f"largest size (default {plan.DEFAULT_MAX_BYTES}); included when the factor reaches it")
    p.add_argument("--factor", "-f", type=int_flag, metavar="F",
                   help=f"multiplication factor between sizes (default {plan.DEFAULT_FACTOR})")
    p.add_argument("--sizes", metavar="LIST", help="these sizes instead of a range, e.g. 1KB,64KB,1MB")
    p.add_argument("--np", type=int_flag, metavar="N", help="number of MPI ranks (default: the config's ranks)")
    p.add_argument("--iterations", "-n", type=int_flag, metavar="N",
                   help="timed iterations at every size (default: OSU's rule, 1000 up to 8KB, 100 above)")
    p.add_argument("--warmup", "-w", type=int_flag, metavar="N",
                   help="warm-up iterations at every size (default: OSU's rule, 100 up to 8KB, 10 above; "
                        "with --iterations a tenth of it)")
    p.add_argument("--datatype", choices=sorted(DATATYPES),
                   help="element type for every op (default: float for reductions, char otherwise)")
    p.add_argument("--validate", action="store_true", default=None, help="check every result element")
    p.add_argument("--engine", choices=sorted(engines.NAMES), help="override the config's engine")
    p.add_argument("--out-dir", "-o", metavar="DIR", default=".",
                   help=f"where {metrics_report.REPORT_NAME} and the t_<op>_<RUNID>.tsv files go "
                        "(created if missing; default: the current directory)")
    p.add_argument("--results", metavar="FILE", help="also append the JSONL result records to FILE")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="console output (default table); csv and json have the TSV's columns")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def check_out_dir(path):
    """The absolute out-dir, or UserError if it cannot become a writable directory."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UserError(f"--out-dir {path}: exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UserError(f"--out-dir {path}: directory is not writable")
        # the report is appended to: it must be a readable file
        check_writable(os.path.join(path, metrics_report.REPORT_NAME), "--out-dir")
        return path
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--out-dir {path}: cannot be created ({parent} is not a writable directory)")
    return path


def sizes_from(args):
    if args.sizes is not None:
        if any(v is not None for v in (args.min_bytes, args.max_bytes, args.factor)):
            raise UserError("--sizes: give either --sizes or --min-bytes/--max-bytes/--factor, not both")
        return plan.size_list(args.sizes)
    return plan.size_range(args.min_bytes or plan.DEFAULT_MIN_BYTES, args.max_bytes or plan.DEFAULT_MAX_BYTES,
                           plan.DEFAULT_FACTOR if args.factor is None else args.factor)


def run(args):
    # Everything about the input is checked before the first mpirun.
    op_names = plan.parse_ops(args.ops)
    sizes = sizes_from(args)
    cfg = load_config(args.config)
    if args.engine:
        cfg.engine = args.engine
    apply_overrides(cfg, np=args.np, validate=args.validate)
    steps = plan.build_steps(op_names, sizes, datatype=args.datatype, config_datatype=cfg.datatype,
                             iterations=args.iterations, warmup=args.warmup)
    out_dir = check_out_dir(args.out_dir)
    results_path = check_writable(args.results, "--results", append=True) if args.results else None
    engine, ctx = harness.prepare(cfg, steps)

    records, job = harness.run_plan("sweep", engine, cfg, steps, ctx, quiet=args.quiet, on_stop="no file written")
    if job.stopped:
        return job.exit_code

    # Files first: a closed stdout (`| head`) must not lose the measurements. Each file on its
    # own: one that cannot be written (a full disk) does not cost the others.
    status = 0
    files = metrics_report.output_files(out_dir, ctx.run_id, records, op_names)
    if results_path:
        files.insert(0, ("results", results_path, lambda: write_jsonl(results_path, records)))
    for what, path, write in files:
        try:
            write()
        except OSError as e:
            print(f"collbench: cannot write {what} {path}: {e.strerror or e}", file=sys.stderr)
            status = 1
            continue
        done = "appended to" if what == "results" else "written to"
        print(f"collbench: {what} {done} {path}", file=sys.stderr)

    if args.format == "csv":
        sys.stdout.write(table.render_csv(records))
    elif args.format == "json":
        sys.stdout.write(table.render_json(records))
    else:
        print(f"collbench sweep: run {ctx.run_id}, {cfg.ranks} ranks on {ctx.nodes} "
              f"node{'s' if ctx.nodes != 1 else ''} ({', '.join(ctx.hosts)}), engine {cfg.engine}, "
              f"transport {cfg.transport}, {ctx.mpi}")
        print()
        sys.stdout.write(table.render_table(records, steps, cfg.ranks, ctx.nodes, cfg.engine))
    if table.without_samples(records) and args.format != "table":
        print(f"collbench: {table.no_samples_note(cfg.engine)}", file=sys.stderr)
    sys.stdout.flush()

    outcome = harness.tally(records, steps)
    if not outcome.ok:
        print(f"collbench: {outcome.message()}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"collbench: {len(records)} sizes in {job.elapsed:.1f}s", file=sys.stderr)
    return status
