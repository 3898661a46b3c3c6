"""`collbench compare --engine nccl-tests`: NCCL's algorithms and protocols side by side, on GPUs,
and the environment that selects the proven fastest per op.

The candidates are what NCCL's tuner enables on these ranks (compare/nccl_candidates.py), or
--algorithms ALGO/PROTO,...; each runs as its own nccl-tests job with NCCL_ALGO/NCCL_PROTO set
(`default`: neither, NCCL's own choice). The measurement and the choice are the MPI comparison's:
blocks in rotated order (compare/blocks.py), a speed-up interval per row (compare/stats.py), and
one choice per op (the rule the MPICH env file follows: NCCL_ALGO/NCCL_PROTO hold one setting per
collective for every size), forced only where proven above 1 + margin at some size and not slower
beyond the margin at any. --write-rules writes the env file (compare/nccl_env_file.py), which is
then proven against default in ABBA order (compare/check.py's judge) and an op slower with it is
dropped from it.
"""

import copy
import os
import time

from collbench import cli_values, harness
from collbench.atomic_file import Outputs, OutputError, write_output
from collbench.compare import flags, nccl_candidates, nccl_env_file, outputs, stats, table
from collbench.compare.blocks import run_blocks
from collbench.compare.check import MIN_PAIRS, Check, run_check
from collbench.compare.runner import Plan, Progress, median_rows
from collbench.config import ITERATIONS, WARMUP, Step, apply_overrides, check_flag, load_config
from collbench.engines import algorithms as algs
from collbench.engines import mpi_flavour, nccl_tests
from collbench.errors import UserError
from collbench.ops import DATATYPES, get_op
from collbench.sizes import format_size

FLAVOUR = mpi_flavour.MPICH     # one setting per op for every size, as NCCL_ALGO/NCCL_PROTO hold
ENGINE = "nccl-tests"
REFUSALS = ("invalid usage", "Unrecognized element token", "No algorithm/protocol available",
            "Unrecognized prefix token")


class NcclPlan(Plan):
    """A Plan whose algorithms are NCCL settings: steps force nothing in MPI, the job's
    environment (job_config) carries NCCL_ALGO/NCCL_PROTO."""

    engine = ENGINE

    def __init__(self, *a, candidates=None, env_file=None, **kw):
        super().__init__(*a, **kw)
        self.candidates = candidates or {}      # {name: Candidate}
        self.env_file = env_file                # {NAME: value} of the RULES job

    def steps(self, op, algorithm):
        sizes = self.sizes if get_op(op).has_size else [0]
        return [Step(op, size, self.iterations, self.warmup, self.datatype_for(op), inplace=self.inplace)
                for size in sizes]

    def job_config(self, cfg, algorithm):
        out = copy.copy(cfg)
        out.env = dict(cfg.env)
        if algorithm == algs.RULES:
            out.env.update(self.env_file or {})
        elif algorithm in self.candidates:
            out.env.update(self.candidates[algorithm].env())
        else:
            return None
        out.env.setdefault("NCCL_DEBUG", "WARN")     # NCCL's refusal is printed, and named in the row
        return out


def _tiny_args(op, dt):
    """One call of the smallest size: enough for NCCL to print its tuner's table."""
    size = max(DATATYPES[dt], 8)
    return nccl_tests.job_args(get_op(op), size, size, 2, 1, 0, nccl_tests.DATATYPES[dt], False)


def choose_candidates(cfg, plan, binaries, wanted, say):
    """{op: [DEFAULT, names...]}, {name: Candidate}, notes (the pairs NCCL disabled here)."""
    per_op, every, notes = {}, {}, []
    given = nccl_candidates.parse_names(wanted) if wanted is not None else None
    for op in plan.ops:
        func = nccl_candidates.FUNCS.get(op)
        if func is None:
            raise UserError(f"compare --engine nccl-tests: NCCL has no algorithm choice for {op} "
                            f"(it runs as point-to-point sends); ops: {', '.join(nccl_candidates.FUNCS)}")
        if given is not None:
            cands = given
        else:
            say(f"collbench compare: asking NCCL which algorithms/protocols it enables for {func} "
                f"({os.path.basename(binaries[op])}, NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING)")
            tun = nccl_candidates.discover(cfg, op, binaries[op], _tiny_args(op, plan.datatype_for(op)))
            cands, off = tun.candidates(func)
            notes.append(f"{op}: NCCL's tuner enables {', '.join(c.name for c in cands) or 'nothing'}"
                         + (f"; disabled here (bandwidth 0): {', '.join(off)}" if off else ""))
        per_op[op] = [algs.DEFAULT] + [c.name for c in cands]
        every.update({c.name: c for c in cands})
    return per_op, every, notes


def _explained(reason):
    return any(r in reason for r in REFUSALS)


def run(args):
    cfg = load_config(args.config)
    apply_overrides(cfg, np=args.np)
    cfg.engine = ENGINE
    cfg.validate = not args.no_validate
    for var in ("NCCL_ALGO", "NCCL_PROTO"):
        if var in cfg.env:
            raise UserError(f"compare --engine nccl-tests: the config's env sets {var}={str(cfg.env[var])[:64]!r}; "
                            "default must be NCCL's own choice: take it out of env")
    if args.timing != "sustained":
        raise UserError("--timing osu: nccl-tests times its own way (iterations back to back); leave --timing out")
    ops = flags.parse_ops(args)
    sizes = flags.parse_sizes(args)
    iterations = check_flag("--iterations", ITERATIONS, args.iterations)
    warmup = check_flag("--warmup", WARMUP, args.warmup)
    policy = flags.policy(args)
    cli_values.datatype(args.datatype, allowed=nccl_tests.DATATYPES)
    plan = NcclPlan(ops, {}, sizes, iterations, warmup, args.datatype, "sustained", args.in_place)
    for op in ops:
        dt = plan.datatype_for(op)
        bad = [s for s in sizes if s % DATATYPES[dt]]
        if bad:
            raise UserError(f"{op}: size {bad[0]} B is not a multiple of the {dt} size ({DATATYPES[dt]} B)")
    results_path, tsv_path, write_path, check_path = outputs.output_paths(args)
    check_env = nccl_env_file.read(check_path) if check_path and check_path != write_path else None
    binaries = nccl_tests.preflight(cfg, [s for op in ops for s in plan.steps(op, algs.DEFAULT)])

    progress = Progress(0, quiet=args.quiet)
    plan.algorithms, plan.candidates, notes = choose_candidates(cfg, plan, binaries, args.algorithms, progress.note)
    ctx = harness.run_context(cfg, ENGINE)
    rows, records = [], []
    started = time.monotonic()
    outs = Outputs()
    written, chk, blocks_run, stop_why = None, None, 0, ""
    with harness.Run("compare", progress=progress, on_stop="no result file written") as job:
        check = None
        if check_env is not None:
            plan.env_file = check_env
            check = (check_path, plan.job_config(cfg, algs.RULES))
        measured, rec, n, blocks_run, stop_why = run_blocks(cfg, plan, ctx, FLAVOUR, progress, policy,
                                                            check=check, say=progress.note)
        records += rec
        notes += [x for x in n if x not in notes]
        rows += median_rows(measured)
        table.annotate(rows, policy.margin, FLAVOUR)
        progress.note(f"collbench compare: measured: {stop_why}")
        if write_path:
            written, chk = _write_and_prove(write_path, rows, cfg, ctx, plan, policy, blocks_run, progress, outs)
            if chk is not None:
                records += chk.records
                notes += [x for x in chk.notes if x not in notes]
                rows += chk.rows
    if job.stopped:
        return job.exit_code

    outputs.order_rows(rows, plan, policy.margin, FLAVOUR)
    version = next((r.get("nccl_version") for r in records if r.get("nccl_version")), None)
    nccl = f"NCCL {version}" if version else "NCCL (version not printed)"
    outputs.write_files(args, rows, records, outs, results_path, tsv_path,
                        table.tsv_lines(rows, ctx.run_id, cfg.ranks, "nccl-tests"), started)
    meta = {"run_id": ctx.run_id, "engine": ENGINE, "nccl": version, "ranks": cfg.ranks, "nodes": ctx.nodes,
            "hosts": list(ctx.hosts), "algorithms": plan.algorithms, "iterations": iterations,
            "warmup": warmup, "blocks": blocks_run, "blocks_stopped": stop_why, "margin": policy.margin,
            "inplace": plan.inplace, "validate": cfg.validate, "rules_written": written,
            "rules_checked": check_path, "rules_check": chk.to_json() if chk is not None else None,
            "installed_quality": chk.installed_quality if chk is not None else None,
            "output_errors": [str(e) for e in outs.failed], "notes": notes}
    title = [f"{cfg.ranks} ranks on {ctx.nodes} node{'s' if ctx.nodes != 1 else ''}, nccl-tests "
             f"({iterations} iterations, {warmup} warm-up{', in place' if plan.inplace else ''}), {nccl}; "
             f"{blocks_run} block{'s' if blocks_run != 1 else ''}",
             "candidates: NCCL_ALGO/NCCL_PROTO pairs NCCL's tuner enables here; speed-up over default "
             "(NCCL's own choice): median of the blocks with its 95% interval; rule = the env file "
             "sets it for the op"]
    outputs.print_result(args, rows, meta, title, check_path, policy.margin, chk, written, "env file", notes,
                         edit_table=lambda text: text.replace("the MPICH file forces one algorithm for all sizes",
                                                              "NCCL_ALGO/NCCL_PROTO set one per op for all sizes"))
    outs.raise_if_failed()
    return outputs.exit_code(rows, _explained)


def _choices(rows, plan):
    """{op: (Candidate or None, [sizes])}: the one setting chosen per op (None: NCCL's own)."""
    out = {}
    for op in plan.ops:
        picked = [r for r in rows if r["op"] == op and r.get("chosen") and r["algorithm"] not in (algs.DEFAULT,
                                                                                               algs.RULES)]
        name = picked[0]["algorithm"] if picked else None
        out[op] = (plan.candidates.get(name), sorted({r["size_bytes"] for r in rows if r["op"] == op}))
    return out


def _write_and_prove(path, rows, cfg, ctx, plan, policy, blocks, progress, outs):
    choices = _choices(rows, plan)
    header = [f"collbench compare --engine nccl-tests, run {ctx.run_id}: {cfg.ranks} ranks on {ctx.nodes} "
              f"node(s) ({', '.join(ctx.hosts)}), {blocks} blocks; sizes {', '.join(format_size(s) for s in plan.sizes)}",
              f"a setting is forced for an op only where proven above {1 + policy.margin:.2f}x at some size "
              "and not slower beyond the margin at any; elsewhere NCCL's own choice"]
    text = nccl_env_file.render(choices, header)
    if not outs.write(path, text, "--write-rules"):
        return None, None
    progress.note(f"collbench compare: env file written to {path}")
    forced = {(op, size): c.name for op, (c, sizes) in choices.items() if c for size in sizes}
    if not forced:
        return path, Check(path, ran=False, installed_quality=True,
                           reason="the file sets nothing (NCCL's own choice for every op): nothing to prove")
    plan.env_file = nccl_env_file.variables(choices)
    pairs = max(MIN_PAIRS, min(blocks, stats.MAX_BLOCKS))
    progress.note(f"collbench compare: checking the env file against default: {2 * pairs * len(plan.ops)} "
                  "jobs in ABBA order")
    progress.total += 2 * pairs * len(plan.ops) * len(plan.sizes)
    chk = run_check(cfg, plan, ctx, FLAVOUR, path, forced, pairs, progress, policy.margin)
    dropped_ops = {v.op for v in chk.dropped}
    verdict = [f"check: default without and with this file, {pairs} jobs each in ABBA order: "
               + ("installed-quality" if chk.installed_quality else f"NOT installed-quality ({chk.reason})")]
    verdict += [f"dropped {v.op} ({v.forced}): {format_size(v.size_bytes)} {v.reason}" for v in chk.dropped]
    kept = {op: ((None, s) if op in dropped_ops else (c, s)) for op, (c, s) in choices.items()}
    try:
        write_output(path, nccl_env_file.render(kept, header + verdict), "--write-rules")
    except OutputError as e:
        outs.failed.append(e)
        chk.installed_quality = False
        chk.reason = f"the file could not be rewritten after its check: {e}"
    return path, chk
