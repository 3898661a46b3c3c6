"""`collbench topo compare`: ring and recursive-doubling allgather (and allreduce) forced, in the
original rank order and in a new one; the measured speed-up with its confidence interval beside
what `topo map`'s two models predicted (docs/TOPO.md, "Proving the speed-up").

Exit 0 when every point was measured in both orders; 1 when a job failed (its rows say so); 2 on
a bad config, order file, matrix or flag (nothing runs).
"""

import csv
import io
import json
import os
import statistics
import sys

from collbench import cli_values, harness, stats
from collbench.config import load_config
from collbench.errors import UserError
from collbench.ops import DATATYPES
from collbench.results.records import event_record
from collbench.sizes import format_size
from collbench.tables import Column, format_duration, format_us, table_lines
from collbench.topo import compare
from collbench.topo.mapping import METHODS, map_order, method_arg, predict
from collbench.pair_matrix import METRICS, load_matrix
from collbench.topo.outliers import host_groups

FORMATS = ("table", "csv", "json")
CSV_COLUMNS = ("pattern", "op", "size", "size_bytes", "algorithm", "original_median_us", "new_median_us",
               "speedup", "ci_low", "ci_high", "blocks_original", "blocks_new", "predicted_speedup",
               "predicted_shared_speedup", "note")
CI_METHOD = (f"{int(stats.CONFIDENCE * 100)}% percentile bootstrap of median(original)/median(new) "
             f"over the blocks ({stats.BOOTSTRAP_SAMPLES} resamples)")


def add_compare(verbs):
    from collbench.cli import add_config_arg
    c = verbs.add_parser(
        "compare", help="measure the speed-up of a rank order: ring / recursive doubling forced, both orders",
        description="Run allgather (and allreduce, --ops) with ring and with recursive doubling forced, "
                    "in the original rank order (the config's hosts as listed) and in a new one, and "
                    "print the speed-up with a confidence interval beside what `topo map` predicted.",
        epilog="The new order: --order FILE (any file `topo map` writes), or `topo map` run now on "
               "--matrix (one order per pattern), or the config's hosts_order. Each point gets "
               "--iterations timed calls per order (at least 100, the topology-aware collectives report's rule) in --blocks plan "
               f"steps; the interval is a {CI_METHOD}. Exit code 1 when a job failed, 2 on bad input.")
    add_config_arg(c)
    c.add_argument("--order", metavar="FILE",
                   help="the new order: PAT.hosts_order.yaml, PAT.mapping.json, PAT.rankfile, PAT.hostfile, "
                        "PAT.machinefile or PAT.slurm_hostfile (from topo map)")
    c.add_argument("--matrix", metavar="FILE",
                   help="a topo measure matrix: maps the new order now (without --order) and predicts the "
                        "speed-up")
    c.add_argument("--metric", choices=sorted(METRICS), help="which matrix of the file (default bandwidth)")
    c.add_argument("--method", type=method_arg, choices=METHODS, default="auto", help="topo map's method (default auto; seed: greedy's older name)")
    c.add_argument("--patterns", default="ring,recursive-doubling", metavar="LIST",
                   help="ring and/or recursive-doubling (default both)")
    c.add_argument("--ops", default="allgather", metavar="LIST", help="allgather and/or allreduce (default allgather)")
    c.add_argument("--sizes", default="1MB", metavar="LIST", help="bytes per rank, e.g. 64KB,1MB (default 1MB)")
    c.add_argument("--iterations", type=cli_values.count_type(), default=compare.REPORT_MIN_ITERATIONS, metavar="N",
                   help=f"timed calls per point and order (default {compare.REPORT_MIN_ITERATIONS}, the topology-aware collectives report's minimum)")
    c.add_argument("--blocks", type=_count, default=10, metavar="N",
                   help="plan steps the calls are split into: the samples of the interval (default 10)")
    c.add_argument("--warmup", type=cli_values.count_type(0), default=None, metavar="N",
                   help="untimed calls before each point (default iterations/10)")
    c.add_argument("--rounds", type=_count, default=1, metavar="K",
                   help="alternate the orders over K jobs each (A B A B ...; default 1)")
    c.add_argument("--datatype", choices=sorted(DATATYPES), help="default: the op's own")
    c.add_argument("--format", choices=FORMATS, default="table", help="console output (default table)")
    c.add_argument("--results", metavar="FILE", help="append the result records to a JSONL results file")
    c.set_defaults(func=cmd_compare)


_count = cli_values.count_type(1, 10_000_000)        # --blocks, --rounds


def _sizes(text, ops, datatype):
    """--sizes in the order given, each once; each a whole, positive number of the op's datatype."""
    sizes = [cli_values.message_size(x.strip(), "--sizes") for x in text.split(",") if x.strip()]
    if not sizes:
        raise UserError("--sizes: expected a comma list of sizes such as 64KB,1MB")
    from collbench.ops import default_datatype, get_op
    for op in ops:
        dt = datatype or default_datatype(get_op(op))
        for size in sizes:
            if size < DATATYPES[dt] or size % DATATYPES[dt]:
                raise UserError(f"--sizes: {size} B is not a positive multiple of the {dt} size "
                                f"({DATATYPES[dt]} B) used for {op}")
    return tuple(dict.fromkeys(sizes))


def resolve_orders(cfg, args, patterns):
    """({pattern: (original, new, label)}, matrix or None, {pattern: map result or None})."""
    matrix = load_matrix(args.matrix, args.metric) if args.matrix else None
    orders, mapped = {}, {}
    fixed = None
    if args.order:
        fixed = compare.load_order(args.order, cfg), f"file:{os.path.basename(args.order)}"
    elif matrix is None:
        if not cfg.hosts_order:
            raise UserError("no new order: give --order FILE, --matrix FILE (topo map runs now), or "
                            f"hosts_order in {cfg.source}")
        fixed = compare.check_order(cfg.hosts_order, cfg, f"{cfg.source}: hosts_order"), "hosts_order"
    for pattern in patterns:
        if fixed:
            new, label = fixed
            mapped[pattern] = None
        else:
            res = map_order(matrix, pattern, args.method)
            new = compare.check_order(res.labels, cfg, f"--matrix {args.matrix}: topo map's order")
            label = f"mapped:{res.chosen}"
            mapped[pattern] = res
        orders[pattern] = (compare.original_order(cfg, new), new, label)
    return orders, matrix, mapped


def matrix_indices(matrix, order):
    """The matrix rank of each entry of a host order (k-th entry of a host: its label host or
    host:k); None when a host is not in the matrix."""
    index = {lb: i for i, lb in enumerate(matrix.labels)}
    seen, out = {}, []
    for h in order:
        k = seen.get(h, 0)
        seen[h] = k + 1
        i = index.get(f"{h}:{k}", index.get(h) if k == 0 else None)
        if i is None:
            return None
        out.append(i)
    return out if len(set(out)) == len(out) == matrix.size else None


def predictions(matrix, orders):
    """{pattern: (speed-up under independent links, under shared uplinks or None)} or {} without
    a matrix (or when an order is not over the matrix's ranks)."""
    if matrix is None:
        return {}
    groups = host_groups(matrix)
    groups = groups if max(groups) > 0 and matrix.metric.higher_is_better else None
    out = {}
    for pattern, (original, new, _) in orders.items():
        a, b = matrix_indices(matrix, original), matrix_indices(matrix, new)
        if a is None or b is None:
            continue
        pa, pb = predict(matrix, pattern, a, groups=groups), predict(matrix, pattern, b, groups=groups)
        links = pa["cost"] / pb["cost"] if pb["cost"] > 0 else None
        shared = (pa["shared_cost"] / pb["shared_cost"]
                  if groups is not None and pb["shared_cost"] and pb["shared_cost"] > 0 else None)
        out[pattern] = (links, shared)
    return out


LONG_RUN_S = 300          # a run the matrix predicts to take longer is announced before it starts
JOB_START_S = 2.0         # mpirun's start and the engine's set-up, per job


def plan_text(s):
    n = len(s.patterns) * len(s.ops) * len(s.sizes)
    return (f"{n} point{'s' if n != 1 else ''} x 2 orders x {s.iterations} calls "
            f"({', '.join(format_size(x) for x in s.sizes)})")


def estimate_seconds(matrix, orders, s):
    """The run's time by the matrix's cost model (calls x predicted time per call in each order, plus
    each job's start), or None without a matrix or when an order is not over its ranks. A latency
    matrix predicts the time of small messages only: the estimate is then a lower bound."""
    if matrix is None:
        return None
    total = 0.0
    for pattern, (original, new, _) in orders.items():
        for order in (original, new):
            idx = matrix_indices(matrix, order)
            if idx is None:
                return None
            cost = predict(matrix, pattern, idx)["cost"]       # us, or us per 10^6 B of block
            for op in s.ops:
                for size in s.sizes:
                    per_call_us = cost * size / 1e6 if matrix.metric.higher_is_better else cost
                    if op == "allreduce":               # a reduce-scatter and an allgather
                        per_call_us *= 2
                    calls = s.iterations + s.warmup * s.rounds + (s.blocks - s.rounds)
                    total += per_call_us * calls / 1e6
            total += s.rounds * JOB_START_S
    return total


class BlockProgress(harness.Progress):
    """Progress of topo compare: one line per measured block (a plan step), with the time left."""

    def __init__(self, stream, s):
        self.settings = s
        self.segments = {p: self._weights(p, s.ops) for p in s.patterns}
        weights = [w for seg in self.segments.values() for w in seg]
        super().__init__(stream, len(weights), weights=weights)

    def _weights(self, pattern, ops):
        """Each block's expected share, in the order compare.run runs them (original, then new, per job)."""
        s = self.settings
        steps = [st for op in ops for st in compare.block_steps(s, op, compare.PATTERN_ALGORITHM[pattern])]
        parts = [steps] if s.rounds <= 1 else compare._split_rounds(steps, s)
        return [harness.step_weight(st) for part in parts for st in part + part]

    def plan(self, pattern, ops):
        """compare.run's on_plan: a pattern runs only `ops` (the others are not available)."""
        if tuple(ops) != tuple(self.settings.ops):
            self.segments[pattern] = self._weights(pattern, ops)
            self.weights = [w for seg in self.segments.values() for w in seg]
            self.total = len(self.weights)

    def record(self, pattern, which, rec):
        if rec.get("type") not in ("result", "failure"):
            return
        what = f"{pattern}, {which} order: {rec.get('op', '?')} {format_size(rec.get('size_bytes') or 0)}"
        if rec["type"] == "failure":
            self.finished(f"{what}: FAILED: {str(rec.get('error', ''))[:200]}")
        else:
            self.finished(f"{what}: block of {rec.get('iterations')} calls, "
                          f"{format_us(rec.get('latency_avg_us'))} per call")


def cmd_compare(args):
    cfg = load_config(args.config)
    if cfg.implicit_hosts:
        raise UserError(f"{cfg.source}: topo compare needs the hosts in the config (hosts:) to place ranks")
    patterns = cli_values.name_list(args.patterns, compare.PATTERNS, "--patterns")
    ops = tuple(cli_values.op_names(args.ops, "--ops", allowed=compare.OPS))
    sizes = _sizes(args.sizes, ops, args.datatype)
    if args.blocks > args.iterations:
        raise UserError(f"--blocks {args.blocks}: more blocks than --iterations {args.iterations}")
    if args.rounds > args.blocks:
        raise UserError(f"--rounds {args.rounds}: more rounds than --blocks {args.blocks}")
    settings = compare.Settings(patterns=patterns, ops=ops, sizes=sizes, iterations=args.iterations,
                                blocks=args.blocks, rounds=args.rounds, datatype=args.datatype,
                                warmup=args.warmup if args.warmup is not None else max(1, args.iterations // 10))
    orders, matrix, mapped = resolve_orders(cfg, args, patterns)
    results_path = None
    if args.results:
        from collbench.atomic_file import check_writable
        results_path = check_writable(args.results, "--results", append=True)
    ctx = harness.run_context(cfg, "builtin")
    predicted = predictions(matrix, orders)

    estimate = estimate_seconds(matrix, orders, settings)
    if estimate is not None and estimate >= LONG_RUN_S:
        print(f"collbench topo compare: warning: the matrix predicts about {format_duration(estimate)} "
              f"for {plan_text(settings)}; fewer --sizes, --iterations or --patterns make it shorter. "
              "Progress follows; Ctrl-C or SIGTERM stops it and keeps what finished.", file=sys.stderr)
    progress = BlockProgress(sys.stderr, settings)
    points, recs = [], []
    with harness.Run("topo compare", unit="blocks", progress=progress, on_stop="writing what finished") as job:
        compare.run(cfg, orders, settings, ctx, on_plan=progress.plan, on_record=progress.record,
                    points=points, recs=recs)
    seconds = job.elapsed
    if job.stopped:
        for p in points:
            if not (p.original and p.new) and not p.note:
                p.note = "stopped before both orders were measured"
    rows = [row(p, predicted.get(p.pattern)) for p in points]
    if results_path:
        from collbench.results.output_files import write_jsonl
        summary = event_record("topo_compare", run_id=ctx.run_id, detail=f"{len(rows)} points"
                               + (f", stopped after {progress.done} of {progress.total} blocks" if job.stopped else ""),
                               points=[{k: r[k] for k in ("pattern", "op", "size_bytes", "speedup", "ci_low",
                                                          "ci_high")} for r in rows][:256])
        write_jsonl(results_path, recs + [summary])
    doc = {"run_id": ctx.run_id, "mpi": ctx.mpi, "transport": cfg.transport, "iterations": settings.iterations,
           "blocks": settings.blocks, "rounds": settings.rounds, "ci_method": CI_METHOD, "seconds": round(seconds, 1),
           "orders": {p: {"original": o, "new": n, "label": lb} for p, (o, n, lb) in orders.items()},
           "points": rows}
    if job.stopped:
        doc["stopped"] = f"after {progress.done} of {progress.total} blocks"
    if args.format == "json":
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    elif args.format == "csv":
        sys.stdout.write(csv_text(rows))
    else:
        sys.stdout.write(table_text(doc, rows, settings, mapped))
        if results_path:
            print(f"collbench: results appended to {results_path}", file=sys.stderr)
    if job.stopped:
        return job.exit_code
    failed = [r for r in rows if r["errors"] or (r["speedup"] is None and not r["note"].startswith("not run"))]
    return 1 if failed else 0


def row(p, predicted):
    speedup, lo, hi = p.stats()
    links, shared = predicted if predicted else (None, None)
    return {"pattern": p.pattern, "op": p.op, "size": format_size(p.size_bytes), "size_bytes": p.size_bytes,
            "algorithm": p.algorithm,
            "original_median_us": statistics.median(p.original) if p.original else None,
            "new_median_us": statistics.median(p.new) if p.new else None,
            "speedup": speedup, "ci_low": lo, "ci_high": hi,
            "blocks_original": len(p.original), "blocks_new": len(p.new),
            "predicted_speedup": links, "predicted_shared_speedup": shared,
            "note": p.note or "", "errors": list(p.errors)}


def _f(v, fmt="{:.4g}"):
    return "" if v is None else fmt.format(v)


def csv_text(rows):
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in rows:
        w.writerow([_f(r[c]) if isinstance(r[c], float) else ("" if r[c] is None else r[c]) for c in CSV_COLUMNS])
    return out.getvalue()


def table_text(doc, rows, s, mapped):
    lines = [f"topo compare: run {doc['run_id']}, {doc['mpi']}, transport {doc['transport']}, "
             f"{s.iterations} calls per point and order in {s.blocks} blocks, {doc['seconds']:.0f} s"]
    if s.iterations < compare.REPORT_MIN_ITERATIONS:
        lines.append(f"note: {s.iterations} calls per point, fewer than the {compare.REPORT_MIN_ITERATIONS} the topology-aware collectives report asks for")
    if doc.get("stopped"):
        lines.append(f"stopped {doc['stopped']}: the points below hold what finished")
    for pattern, o in doc["orders"].items():
        src = o["label"]
        res = mapped.get(pattern)
        if res is not None:
            src += f", topo map predicts {res.speedup(res.chosen):.2f}x against the matrix's order"
        lines.append(f"{pattern}: original order: {' '.join(o['original'][:32])}{' ...' if len(o['original']) > 32 else ''}")
        lines.append(f"{' ' * len(pattern)}  new order ({src}): {' '.join(o['new'][:32])}"
                     f"{' ...' if len(o['new']) > 32 else ''}")
    columns = [Column("pattern", align="left"), Column("op", align="left"), Column("size", align="left"),
               Column("algorithm", align="left"), Column("original us"), Column("new us"), Column("speed-up"),
               Column("ci", f"{int(stats.CONFIDENCE * 100)}% CI"), Column("predicted"), Column("pred. shared"),
               Column("note", align="left")]
    table = []
    for r in rows:
        ci = "" if r["ci_low"] is None else f"{r['ci_low']:.2f}-{r['ci_high']:.2f}"
        note = "; ".join([r["note"]] * bool(r["note"]) + r["errors"][:1])
        table.append({"pattern": r["pattern"], "op": r["op"], "size": r["size"], "algorithm": r["algorithm"],
                      "original us": _f(r["original_median_us"], "{:.1f}"), "new us": _f(r["new_median_us"], "{:.1f}"),
                      "speed-up": _f(r["speedup"], "{:.2f}x"), "ci": ci,
                      "predicted": _f(r["predicted_speedup"], "{:.2f}x"),
                      "pred. shared": _f(r["predicted_shared_speedup"], "{:.2f}x"), "note": note[:160]})
    lines += table_lines(columns, table, indent="  ")
    lines.append(f"speed-up = median(original) / median(new); CI: {CI_METHOD}")
    lines.append("predicted: topo map's cost model with independent links; pred. shared: the links between "
                 "racks sharing one uplink per rack (docs/TOPO.md)")
    return "\n".join(lines) + "\n"
