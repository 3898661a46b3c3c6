"""`collbench compare`: one collective under every algorithm the installed MPI offers, side by side,
and the tuning file that forces an algorithm only where its win is proven.

    collbench compare --op allgather [--min-bytes 32KB --max-bytes 256MB --factor 2 | --sizes LIST]
                      [--algorithms LIST] [--timing sustained|osu] [--in-place] [--datatype T]
                      [--write-rules FILE] [--check-rules FILE] [--format table|csv|json]

Each algorithm is measured in blocks (compare/blocks.py), its speed-up over default gets a
interval and the tuning file forces it only where that interval lies above 1 + margin
(compare/stats.py); the file written is then checked against default in ABBA order
(compare/check.py), and a size where it is slower is dropped.

Exit codes: 0 every row measured or explained (a documented constraint, or the MPI's own refusal of
that algorithm); 1 a failure nothing explains, a failed validation, or the default failed; 2 a
config or flag error (nothing runs, nothing is written), or an output file that could not be
written at the end (the others are written and the table printed, the failed file named);
130/143 interrupted (nothing written).
"""

import os
import time

from collbench import cli_values, harness
from collbench.atomic_file import Outputs, OutputError, write_output
from collbench.compare import flags, outputs, rules_file, stats, table
from collbench.compare.blocks import run_blocks
from collbench.compare.check import MIN_PAIRS, run_check
from collbench.compare.runner import Plan, Progress, median_rows, with_rules
from collbench.config import ITERATIONS, WARMUP, apply_overrides, check_flag, int_flag, load_config
from collbench.engines import algorithms as algs
from collbench.engines import get_engine, mpi_flavour
from collbench.errors import UserError
from collbench.ops import DATATYPES, OPS, get_op
from collbench.sizes import format_size

TIMINGS = ("sustained", "osu")


def register(subparsers):
    from collbench.cli import add_config_arg
    p = subparsers.add_parser(
        "compare", help="one collective under every algorithm the MPI offers; the tuning file that picks the fastest",
        description="Run an op once per collective algorithm the installed MPI offers (Open MPI's "
                    "coll/tuned list from ompi_info, MPICH's from mpivars) plus the library's own "
                    "choice ('default'), over a size sweep, and print one row per algorithm and "
                    "size: latency avg/min/max across ranks, algbw, busbw, validation, and the "
                    "speed-up over default with its 95% interval from several blocks of jobs; a win "
                    "is marked only where the interval lies above 1. Each algorithm runs in its own "
                    "MPI job. Progress goes to stderr.",
        epilog="--write-rules writes an Open MPI coll/tuned dynamic rules file (for MPICH: an env "
               "file of MPIR_CVAR_*_INTRA_ALGORITHM settings) forcing an algorithm only where its "
               "speed-up interval lies above 1 + --margin, checked against default before it is called "
               "installed-quality; --check-rules re-runs default with such a file loaded and prints it "
               "beside the forced runs (the same path as --write-rules checks the file just "
               "written). docs/ALGORITHMS.md explains the table.")
    add_config_arg(p)
    p.add_argument("--engine", choices=("builtin", "nccl-tests"), default="builtin",
                   help="builtin: the MPI's collective algorithms (default); nccl-tests: NCCL's "
                        "algorithms/protocols (NCCL_ALGO/NCCL_PROTO) through nccl-tests on GPUs")
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
    p.add_argument("--blocks", type=int_flag, metavar="N",
                   help="run every algorithm's job N times (blocks, a rotated order each block); default: "
                        f"from the measured spread, at least {stats.MIN_BLOCKS}, more while a speed-up interval "
                        "is undecided, within --time-budget")
    p.add_argument("--repeats", type=int_flag, metavar="N", help="the same as --blocks (its older name)")
    p.add_argument("--time-budget", metavar="SECONDS", default="600",
                   help="adaptive blocks: stop adding blocks when one more would overrun this (default 600)")
    p.add_argument("--margin", metavar="PERCENT", default="5",
                   help="force an algorithm only where its speed-up interval lies above 1 + PERCENT/100 "
                        "(default 5)")
    p.add_argument("--timing", choices=TIMINGS, default="sustained",
                   help="sustained: iterations back to back, one sync at the end (default); osu: a barrier between iterations")
    p.add_argument("--in-place", action="store_true", help="MPI_IN_PLACE where the op has a receive buffer")
    p.add_argument("--datatype", metavar="TYPE", help=f"{', '.join(DATATYPES)} (default: float for reductions, char otherwise)")
    p.add_argument("--no-validate", action="store_true", help="skip checking every result element")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table", help="stdout format (default table)")
    p.add_argument("--results", metavar="FILE", help="append the JSONL result records (with their algorithm) to FILE")
    p.add_argument("--tsv", metavar="FILE", help="write the rows as TSV to FILE")
    p.add_argument("--write-rules", metavar="FILE",
                   help="write the tuning file forcing an algorithm only where its win is proven, then prove "
                        "the file against default (ABBA) and drop a size where it is slower")
    p.add_argument("--check-rules", metavar="FILE", help="also run default with this tuning file loaded")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


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


def _choices(rows, cat, op, dropped=()):
    """rules_file.Choice per measured size of op: the chosen row's algorithm (default where the
    file keeps the library's choice, or where the check dropped the size)."""
    out = []
    for o, size, chosen, _, _ in table.per_size([r for r in rows if r["algorithm"] != algs.RULES]):
        if o != op or chosen is None:
            continue
        name = chosen["algorithm"]
        if name == algs.DEFAULT or (op, size) in dropped:
            value = "0" if cat.flavour == mpi_flavour.OPENMPI else algs.DEFAULT
            name = algs.DEFAULT
        else:
            value = cat.find(op, name).value
        out.append(rules_file.Choice(size, name, value))
    return out


def _forced(per_op, flavour):
    """{(op, size): algorithm} the file forces (MPICH: every size of an op whose CVAR it sets)."""
    out = {}
    for op, choices in per_op.items():
        if flavour == mpi_flavour.MPICH:
            name = rules_file.mpich_choice(choices)
            if name and name != algs.DEFAULT:
                out.update({(op, c.size_bytes): name for c in choices})
        else:
            out.update({(op, c.size_bytes): c.name for c in choices if c.name != algs.DEFAULT})
    return out


def _check_rules_input(path, cat):
    if cat.flavour == mpi_flavour.OPENMPI:
        rules_file.read_ompi_rules(path, rules_file.catalogue_ids(cat))
    else:
        algs.read_env_file(path)


def run(args):
    return RUNS[args.engine](args)


def _run_nccl_tests(args):
    from collbench.compare import nccl_compare
    return nccl_compare.run(args)


def _run_mpi(args):
    cfg = load_config(args.config)
    apply_overrides(cfg, np=args.np)
    cfg.validate = not args.no_validate
    ops = flags.parse_ops(args)
    sizes = flags.parse_sizes(args)
    iterations = check_flag("--iterations", ITERATIONS, args.iterations)
    policy = flags.policy(args)
    warmup = check_flag("--warmup", WARMUP, args.warmup)
    cli_values.datatype(args.datatype)
    plan = Plan(ops, {}, sizes, iterations, warmup, args.datatype, args.timing, args.in_place)
    for op in ops:
        dt = plan.datatype_for(op)
        bad = [s for s in sizes if get_op(op).has_size and s % DATATYPES[dt]]
        if bad:
            raise UserError(f"{op}: size {bad[0]} B is not a multiple of the {dt} size ({DATATYPES[dt]} B)")
    results_path, tsv_path, write_path, check_path = outputs.output_paths(args)

    cat = algs.catalogue(cfg)
    if check_path and check_path != write_path:
        _check_rules_input(check_path, cat)
    plan.algorithms, missing = choose_algorithms(cat, ops, args.algorithms)
    engine = get_engine("builtin")
    every_step = [s for op in ops for a in plan.algorithms[op] for s in plan.steps(op, a)]
    engine.preflight(cfg, every_step)

    ctx = harness.run_context(cfg, "builtin")
    block_check = (check_path, with_rules(cfg, check_path)) if check_path and check_path != write_path else None
    progress = Progress(0, quiet=args.quiet)
    rows, records, notes = [], [], []
    for op, names in missing.items():
        for n in names:
            for size in (sizes if get_op(op).has_size else [0]):
                rows.append(table.make_row(op, n, size, plan.count(op, size), plan.datatype_for(op), table.SKIPPED,
                                           reason=f"{cat.version} offers no {n!r} for {op} "
                                                  f"(available: {', '.join(cat.names(op))})"))
                rows[-1]["runs"] = 0
    started = time.monotonic()
    outs = Outputs()
    written, chk, blocks_run, stop_why = None, None, 0, ""
    with harness.Run("compare", progress=progress, on_stop="no result file written") as job:
        measured, rec, n, blocks_run, stop_why = run_blocks(cfg, plan, ctx, cat.flavour, progress, policy,
                                                            check=block_check, say=progress.note)
        records += rec
        notes += n
        rows += median_rows(measured)
        table.annotate(rows, policy.margin, cat.flavour)
        progress.note(f"collbench compare: measured: {stop_why}")
        if write_path:
            written, chk = _write_and_prove(write_path, rows, cat, cfg, ctx, plan, policy, blocks_run,
                                            progress, outs)
            if chk is not None:
                records += chk.records
                notes += [x for x in chk.notes if x not in notes]
                rows += chk.rows
        if check_path and check_path == write_path and written is None:
            notes.append(f"--check-rules {check_path}: not run, no tuning file was written")
    if job.stopped:
        return job.exit_code

    outputs.order_rows(rows, plan, policy.margin, cat.flavour)
    outputs.write_files(args, rows, records, outs, results_path, tsv_path,
                        table.tsv_lines(rows, ctx.run_id, cfg.ranks, plan.timing), started)
    meta = {"run_id": ctx.run_id, "mpi": cat.version, "flavour": cat.flavour,
            "algorithms_source": cat.source, "ranks": cfg.ranks, "nodes": ctx.nodes,
            "hosts": list(ctx.hosts), "transport": cfg.transport, "timing": plan.timing,
            "iterations": iterations, "warmup": warmup, "blocks": blocks_run, "repeats": blocks_run,
            "blocks_stopped": stop_why, "margin": policy.margin, "inplace": plan.inplace,
            "validate": cfg.validate, "rules_written": written, "rules_checked": check_path,
            "rules_check": chk.to_json() if chk is not None else None,
            "installed_quality": chk.installed_quality if chk is not None else None,
            "output_errors": [str(e) for e in outs.failed], "notes": notes}
    title = [f"{cfg.ranks} ranks on {ctx.nodes} node{'s' if ctx.nodes != 1 else ''}, {plan.timing} timing "
             f"({iterations} iterations, {warmup} warm-up{', in place' if plan.inplace else ''}), "
             f"{cat.version}, transport {cfg.transport}; {blocks_run} block{'s' if blocks_run != 1 else ''}",
             f"algorithms from {cat.source}; speed-up over default: median of the blocks with its 95% "
             f"interval; win = interval above 1; rule = the tuning file forces it (interval above "
             f"{1 + policy.margin:.2f}); keep = the file keeps the library's choice"]
    outputs.print_result(args, rows, meta, title, check_path, policy.margin, chk, written, "tuning file", notes)
    outs.raise_if_failed()
    return outputs.exit_code(rows, _explained)


def _render(path, rows, cat, cfg, ctx, plan, policy, blocks, dropped=(), verdict=None):
    per_op = {op: _choices(rows, cat, op, dropped) for op in plan.ops}
    per_op = {op: c for op, c in per_op.items() if c}
    if not per_op:
        return None, per_op
    header = [f"collbench compare, run {ctx.run_id}: {cat.version}, {cfg.ranks} ranks on "
              f"{ctx.nodes} node(s) ({', '.join(ctx.hosts)}), transport {cfg.transport}",
              f"{plan.timing} timing, {plan.iterations} iterations, {blocks} blocks; sizes "
              f"{', '.join(format_size(s) for s in plan.sizes)}",
              f"an algorithm is forced only where its speed-up interval (95%) lies above {1 + policy.margin:.2f}x; "
              "elsewhere the library's own choice"]
    if verdict:
        header += verdict
    if cat.flavour == mpi_flavour.OPENMPI:
        text = rules_file.render_ompi_rules(per_op, cfg.ranks, header)
    else:
        text = rules_file.render_mpich_env(per_op, algs.MPICH_INFIX, header)
    return text, per_op


def _write_and_prove(path, rows, cat, cfg, ctx, plan, policy, blocks, progress, outs):
    """Write the tuning file, check it against default (ABBA), drop the sizes where it is slower
    and write it again with the check's verdict; (path written or None, Check or None)."""
    text, per_op = _render(path, rows, cat, cfg, ctx, plan, policy, blocks)
    if text is None:
        progress.note("collbench compare: nothing measured, no tuning file written")
        return None, None
    if not outs.write(path, text, "--write-rules"):
        progress.note(f"collbench compare: {outs.failed[-1]}; the file is not checked")
        return None, None
    progress.note(f"collbench compare: tuning file written to {path}")
    forced = _forced(per_op, cat.flavour)
    if not forced:
        from collbench.compare.check import Check
        chk = Check(path, ran=False, installed_quality=True,
                    reason="the file forces nothing (the library's own choice at every size): nothing to prove")
        return path, chk
    if not os.path.isfile(path):
        from collbench.compare.check import Check
        return path, Check(path, reason=f"{path} is not a regular file: not checked")
    pairs = max(MIN_PAIRS, min(blocks, stats.MAX_BLOCKS))
    jobs = 2 * pairs * len(plan.ops)
    progress.note(f"collbench compare: checking the file against default: {jobs} MPI jobs in ABBA order")
    progress.total += jobs * len(plan.sizes)
    chk = run_check(cfg, plan, ctx, cat.flavour, path, forced, pairs, progress, policy.margin)
    dropped = {(v.op, v.size_bytes) for v in chk.dropped}
    if cat.flavour == mpi_flavour.MPICH:       # one CVAR for every size: a dropped size drops the op
        ops = {op for op, _ in dropped}
        dropped = {k for k in forced if k[0] in ops}
        for v in chk.sizes:
            if v.verdict == "kept" and v.op in ops:
                v.verdict, v.reason = "dropped", (f"{v.reason}, but the op's one CVAR is dropped: "
                                                  "slower beyond noise at another size")
    verdict = [f"check: default without and with this file, {pairs} jobs each in ABBA order: "
               + ("installed-quality" if chk.installed_quality else f"NOT installed-quality ({chk.reason})")]
    verdict += [f"dropped {v.op} {format_size(v.size_bytes)} ({v.forced}): {v.reason}" for v in chk.dropped]
    text, _ = _render(path, rows, cat, cfg, ctx, plan, policy, blocks, dropped, verdict)
    try:
        write_output(path, text, "--write-rules")
    except OutputError as e:
        outs.failed.append(e)
        chk.installed_quality = False
        chk.reason = f"the file could not be rewritten after its check: {e}"
    return path, chk


def _explained(reason):
    return reason.startswith(("MPICH", "Open MPI"))


# `compare --engine NAME` -> the comparison it runs
RUNS = {"builtin": _run_mpi, "nccl-tests": _run_nccl_tests}
