"""`collbench compare`: one collective under every algorithm the installed MPI offers, side by side,
and the tuning file that picks the fastest.

    collbench compare --op allgather [--min-bytes 32KB --max-bytes 256MB --factor 2 | --sizes LIST]
                      [--algorithms LIST] [--timing sustained|osu] [--in-place] [--datatype T]
                      [--write-rules FILE] [--check-rules FILE] [--format table|csv|json]

Exit codes: 0 every row measured or explained (a documented constraint, or the MPI's own refusal of
that algorithm); 1 a failure nothing explains, a failed validation, or the default failed; 2 a
config or flag error (nothing runs, nothing is written); 130/143 interrupted (nothing written).
"""

import os
import signal
import sys
import time

from collbench.atomic_file import check_writable, write_atomic
from collbench.compare import rules_file, table
from collbench.compare.runner import Plan, Progress, measure, median_rows, with_rules
from collbench.config import ITERATIONS, MESSAGE_SIZE, WARMUP, apply_overrides, check_flag, int_flag, load_config
from collbench.engines import algorithms as algs
from collbench.engines import get_engine, mpi_flavour
from collbench.errors import UserError
from collbench.ops import DATATYPES, OPS, get_op
from collbench.results.records import RunContext, dumps
from collbench.sizes import format_size

MAX_SIZES = 64
MAX_REPEATS = 100
TIMINGS = ("sustained", "osu")


def register(subparsers):
    from collbench.cli import add_config_arg
    p = subparsers.add_parser(
        "compare", help="one collective under every algorithm the MPI offers; the tuning file that picks the fastest",
        description="Run an op once per collective algorithm the installed MPI offers (Open MPI's "
                    "coll/tuned list from ompi_info, MPICH's from mpivars) plus the library's own "
                    "choice ('default'), over a size sweep, and print one row per algorithm and "
                    "size: latency avg/min/max across ranks, algbw, busbw, validation; the fastest "
                    "per size is marked with its speed-up over default. Each algorithm runs in its "
                    "own MPI job. Progress goes to stderr.",
        epilog="--write-rules writes an Open MPI coll/tuned dynamic rules file (for MPICH: an env "
               "file of MPIR_CVAR_*_INTRA_ALGORITHM settings) selecting the fastest algorithm per "
               "message size; --check-rules re-runs default with such a file loaded and prints it "
               "beside the forced runs (the same path as --write-rules checks the file just "
               "written). docs/ALGORITHMS.md explains the table.")
    add_config_arg(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--op", metavar="OP", help=f"the collective ({', '.join(OPS)})")
    which.add_argument("--ops", metavar="LIST", help="several collectives, e.g. allgather,allreduce")
    p.add_argument("--np", type=int_flag, metavar="N", help="number of MPI ranks (default: the config's ranks)")
    p.add_argument("--min-bytes", metavar="SIZE", default="32KB", help="smallest size, bytes per rank (default 32KB)")
    p.add_argument("--max-bytes", metavar="SIZE", default="256MB", help="largest size (default 256MB)")
    p.add_argument("--factor", type=int_flag, metavar="N", default=2, help="size multiplier between steps (default 2)")
    p.add_argument("--sizes", metavar="LIST", help="these sizes instead of the sweep, e.g. 1KB,1MB")
    p.add_argument("--algorithms", metavar="LIST",
                   help="only these algorithms (default: every one the MPI offers; default always runs)")
    p.add_argument("--iterations", type=int_flag, metavar="N", default=20, help="timed iterations per size (default 20)")
    p.add_argument("--warmup", type=int_flag, metavar="N", default=5, help="untimed warm-up iterations (default 5)")
    p.add_argument("--repeats", type=int_flag, metavar="N", default=1,
                   help="run every algorithm's job N times, in a rotated order each round, and report the "
                        "run with the median latency (a shared machine's load drifts; default 1)")
    p.add_argument("--timing", choices=TIMINGS, default="sustained",
                   help="sustained: iterations back to back, one sync at the end (default); osu: a barrier between iterations")
    p.add_argument("--in-place", action="store_true", help="MPI_IN_PLACE where the op has a receive buffer")
    p.add_argument("--datatype", metavar="TYPE", help=f"{', '.join(DATATYPES)} (default: float for reductions, char otherwise)")
    p.add_argument("--no-validate", action="store_true", help="skip checking every result element")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table", help="stdout format (default table)")
    p.add_argument("--results", metavar="FILE", help="append the JSONL result records (with their algorithm) to FILE")
    p.add_argument("--tsv", metavar="FILE", help="write the rows as TSV to FILE")
    p.add_argument("--write-rules", metavar="FILE", help="write the tuning file selecting the fastest algorithm per size")
    p.add_argument("--check-rules", metavar="FILE", help="also run default with this tuning file loaded")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def parse_ops(args):
    text = args.op if args.op is not None else args.ops
    names = [t.strip() for t in text.split(",") if t.strip()]
    flag = "--op" if args.op is not None else "--ops"
    if not names or (args.op is not None and len(names) != 1):
        raise UserError(f"{flag}: expected {'one op' if args.op is not None else 'a comma list of ops'} "
                        f"of: {', '.join(OPS)}")
    out = []
    for n in names:
        try:
            out.append(get_op(n).name)
        except KeyError:
            raise UserError(f"{flag}: unknown op {n[:40]!r} (expected one of: {', '.join(OPS)})") from None
    return list(dict.fromkeys(out))


def parse_sizes(args):
    """The sizes to run: --sizes, or the sweep from --min-bytes by --factor up to --max-bytes."""
    if args.sizes is not None:
        sizes = [check_flag("--sizes", MESSAGE_SIZE, s.strip()) for s in args.sizes.split(",") if s.strip()]
        if not sizes:
            raise UserError("--sizes: expected a comma list of sizes such as 1KB,1MB")
    else:
        low = check_flag("--min-bytes", MESSAGE_SIZE, args.min_bytes)
        high = check_flag("--max-bytes", MESSAGE_SIZE, args.max_bytes)
        if high < low:
            raise UserError(f"--max-bytes {args.max_bytes} is below --min-bytes {args.min_bytes}")
        if args.factor < 2:
            raise UserError(f"--factor: got {args.factor}, expected a whole number >= 2")
        sizes, s = [], low
        while s <= high and len(sizes) <= MAX_SIZES:
            sizes.append(s)
            s *= args.factor
    sizes = sorted(set(sizes))
    if len(sizes) > MAX_SIZES:
        raise UserError(f"{len(sizes)} sizes: at most {MAX_SIZES} (raise --factor or narrow the range)")
    return sizes


def choose_algorithms(cat, ops, wanted):
    """{op: [DEFAULT, names...]} and skip notes for names some op does not offer."""
    out, missing = {}, {}
    if wanted is None:
        return {op: [algs.DEFAULT] + cat.names(op) for op in ops}, missing
    names = [w.strip() for w in wanted.split(",") if w.strip() and not algs.is_default(w)]
    for n in names:
        if not any(_offered(cat, op, n) for op in ops):
            avail = "; ".join(f"{op}: {', '.join([algs.DEFAULT] + cat.names(op))}" for op in ops)
            raise UserError(f"--algorithms: {n[:64]!r} is not offered by {cat.version} ({cat.source}) "
                            f"for {', '.join(ops)}; available: {avail}")
    for op in ops:
        chosen = [algs.DEFAULT]
        for n in names:
            if _offered(cat, op, n):
                name = cat.find(op, n).name
                if name not in chosen:
                    chosen.append(name)
            else:
                missing.setdefault(op, []).append(n)
        out[op] = chosen
    return out, missing


def _offered(cat, op, name):
    try:
        cat.find(op, name)
        return True
    except UserError:
        return False


def _choices(rows, cat, op):
    """rules_file.Choice per measured size of op: its fastest algorithm."""
    out = []
    for o, size, best, _ in table.fastest(rows):
        if o != op:
            continue
        if best["algorithm"] == algs.DEFAULT:
            value = "0" if cat.flavour == mpi_flavour.OPENMPI else algs.DEFAULT
        else:
            value = cat.find(op, best["algorithm"]).value
        out.append(rules_file.Choice(size, best["algorithm"], value))
    return out


def _check_rules_input(path, flavour):
    if flavour == mpi_flavour.OPENMPI:
        rules_file.read_ompi_rules(path)
    else:
        algs.read_env_file(path)


def run(args):
    from collbench.once.cli import Terminated, raise_terminated
    cfg = load_config(args.config)
    apply_overrides(cfg, np=args.np)
    cfg.validate = not args.no_validate
    ops = parse_ops(args)
    sizes = parse_sizes(args)
    iterations = check_flag("--iterations", ITERATIONS, args.iterations)
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise UserError(f"--repeats: got {args.repeats}, expected a whole number from 1 to {MAX_REPEATS}")
    repeats = args.repeats
    warmup = check_flag("--warmup", WARMUP, args.warmup)
    if args.datatype is not None and args.datatype not in DATATYPES:
        raise UserError(f"--datatype: got {args.datatype[:40]!r}, expected one of: {', '.join(DATATYPES)}")
    plan = Plan(ops, {}, sizes, iterations, warmup, args.datatype, args.timing, args.in_place)
    for op in ops:
        dt = plan.datatype_for(op)
        bad = [s for s in sizes if get_op(op).has_size and s % DATATYPES[dt]]
        if bad:
            raise UserError(f"{op}: size {bad[0]} B is not a multiple of the {dt} size ({DATATYPES[dt]} B)")
    results_path = check_writable(args.results, "--results", append=True) if args.results else None
    tsv_path = check_writable(args.tsv, "--tsv") if args.tsv else None
    write_path = check_writable(args.write_rules, "--write-rules") if args.write_rules else None
    check_path = os.path.abspath(args.check_rules) if args.check_rules else None

    cat = algs.catalogue(cfg)
    if check_path and check_path != write_path:
        _check_rules_input(check_path, cat.flavour)
    plan.algorithms, missing = choose_algorithms(cat, ops, args.algorithms)
    engine = get_engine("builtin")
    every_step = [s for op in ops for a in plan.algorithms[op] for s in plan.steps(op, a)]
    engine.preflight(cfg, every_step)

    from collbench.engines.launcher import mpi_version, resolve_launcher
    ctx = RunContext(cfg, "builtin", mpi_version(resolve_launcher(cfg)))
    total = sum(len(plan.steps(op, a)) for op in ops for a in plan.algorithms[op])
    total += sum(len(plan.steps(op, algs.RULES)) for op in ops) if check_path else 0
    total *= repeats
    progress = Progress(total, quiet=args.quiet)
    rows, records, notes = [], [], []
    for op, names in missing.items():
        for n in names:
            for size in (sizes if get_op(op).has_size else [0]):
                rows.append(table.make_row(op, n, size, plan.count(op, size), plan.datatype_for(op), table.SKIPPED,
                                           reason=f"{cat.version} offers no {n!r} for {op} "
                                                  f"(available: {', '.join(cat.names(op))})"))
                rows[-1]["runs"] = 0
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        measured = []
        for round_ in range(repeats):
            for op in ops:
                names = plan.algorithms[op]
                k = round_ % len(names)
                for name in names[k:] + names[:k]:     # each round starts with another algorithm
                    r, rec, n = measure(cfg, plan, ctx, cat.flavour, name, op, progress)
                    measured += r
                    records += rec
                    notes += n
        rows += median_rows(measured, repeats)
        written = None
        if write_path:
            table.annotate(rows)
            written = _write_rules(write_path, rows, cat, ops, cfg, ctx, plan)
        if check_path and check_path == write_path and written is None:
            notes.append(f"--check-rules {check_path}: not run, no tuning file was written")
        elif check_path:
            job_cfg = with_rules(cfg, check_path)
            checked = []
            for _ in range(repeats):
                for op in ops:
                    r, rec, n = measure(cfg, plan, ctx, cat.flavour, algs.RULES, op, progress, job_cfg=job_cfg)
                    for x in rec:
                        x["rules_file"] = check_path
                    checked += r
                    records += rec
                    notes += n
            rows += median_rows(checked, repeats)
    except (KeyboardInterrupt, Terminated) as e:
        print(f"collbench compare: {'terminated' if isinstance(e, Terminated) else 'interrupted'}; "
              f"no result file written", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    finally:
        signal.signal(signal.SIGTERM, previous)

    order = {op: i for i, op in enumerate(ops)}
    alg_order = {(op, a): i for op in ops for i, a in enumerate(plan.algorithms[op] + [algs.RULES])}
    rows.sort(key=lambda r: (order[r["op"]], r["size_bytes"], alg_order.get((r["op"], r["algorithm"]), 999)))
    table.annotate(rows)
    if not args.quiet:
        print(f"collbench compare: {len(rows)} rows in {time.monotonic() - started:.1f}s", file=sys.stderr)
    try:
        if results_path:
            write_atomic(results_path, (dumps(r) + "\n" for r in records), keep_existing=True)
            print(f"collbench compare: {len(records)} records appended to {results_path}", file=sys.stderr)
        if tsv_path:
            write_atomic(tsv_path, table.tsv_lines(rows, ctx.run_id, cfg.ranks, plan.timing))
            print(f"collbench compare: table written to {tsv_path}", file=sys.stderr)
    except OSError as e:
        print(f"collbench compare: cannot write {e.filename or 'a result file'}: {e.strerror or e}", file=sys.stderr)
        return 1

    meta = {"run_id": ctx.run_id, "mpi": cat.version, "flavour": cat.flavour,
            "algorithms_source": cat.source, "ranks": cfg.ranks, "nodes": ctx.nodes,
            "hosts": list(ctx.hosts), "transport": cfg.transport, "timing": plan.timing,
            "iterations": iterations, "warmup": warmup, "repeats": repeats, "inplace": plan.inplace,
            "validate": cfg.validate, "rules_written": written, "rules_checked": check_path, "notes": notes}
    if args.format == "json":
        sys.stdout.write(table.render_json(rows, meta))
    elif args.format == "csv":
        sys.stdout.write(table.render_csv(rows))
    else:
        title = [f"{cfg.ranks} ranks on {ctx.nodes} node{'s' if ctx.nodes != 1 else ''}, {plan.timing} timing "
                 f"({iterations} iterations, {warmup} warm-up{', in place' if plan.inplace else ''}), "
                 f"{cat.version}, transport {cfg.transport}",
                 f"algorithms from {cat.source}; * = fastest per size, with its speed-up over default"]
        sys.stdout.write(table.render_table(rows, title, os.path.basename(check_path) if check_path else None))
        for note in notes:
            print(f"note: {note}")
        if written:
            print(f"tuning file written: {written}")
    sys.stdout.flush()
    return _exit_code(rows)


def _write_rules(path, rows, cat, ops, cfg, ctx, plan):
    per_op = {op: _choices(rows, cat, op) for op in ops}
    per_op = {op: c for op, c in per_op.items() if c}
    if not per_op:
        print("collbench compare: nothing measured, no tuning file written", file=sys.stderr)
        return None
    header = [f"collbench compare, run {ctx.run_id}: {cat.version}, {cfg.ranks} ranks on "
              f"{ctx.nodes} node(s) ({', '.join(ctx.hosts)}), transport {cfg.transport}",
              f"{plan.timing} timing, {plan.iterations} iterations; sizes "
              f"{', '.join(format_size(s) for s in plan.sizes)}"]
    if cat.flavour == mpi_flavour.OPENMPI:
        text = rules_file.render_ompi_rules(per_op, cfg.ranks, header)
    else:
        text = rules_file.render_mpich_env(per_op, algs.MPICH_INFIX, header)
    try:
        write_atomic(path, [text])
    except OSError as e:
        raise UserError(f"--write-rules {path}: cannot write: {e.strerror or e}") from None
    print(f"collbench compare: tuning file written to {path}", file=sys.stderr)
    return path


def _exit_code(rows):
    for r in rows:
        if r["status"] == table.OK and r["validation"] == "fail":
            return 1
        if r["algorithm"] == algs.DEFAULT and r["status"] != table.OK:
            return 1
        if r["status"] == table.FAILED and not _explained(r["reason"]):
            return 1
    return 0


def _explained(reason):
    return reason.startswith(("MPICH", "Open MPI"))
