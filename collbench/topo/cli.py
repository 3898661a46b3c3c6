"""`collbench topo map`: a rank order for ring or recursive-doubling allgather from a measured matrix.

Prints every method's predicted cost against the identity order (the matrix's own order) and
writes the chosen order as an Open MPI rankfile, a hostfile for the sequential mapper, an MPICH
machinefile, a Slurm hostfile, a `hosts_order:` config snippet and the whole result as JSON
(topo/order_files.py), all six or none. Exit 0, or 2 on a bad matrix or flag (nothing is written
then) or when the files cannot be written (the result is still printed; the old set stays whole).
"""

import json
import os
import sys

from collbench import cli_values
from collbench.atomic_file import Outputs
from collbench import tables
from collbench.tables import Column, table_lines
from collbench.topo.mapping import EXACT_MAX, METHODS, map_order, method_arg
from collbench.pair_matrix import METRICS, load_matrix
from collbench.topo.order_files import write_order_files
from collbench.topo.patterns import PATTERNS

FORMATS = ("table", "csv", "json")
CSV_COLUMNS = ("method", "chosen", "cost", "cost_unit", "vs_identity", "speedup", "worst_a", "worst_b",
               "worst_value", "worst_unit", "tie_break_sum", "shared_speedup", "seconds", "optimal", "note")


def register(subparsers):
    p = subparsers.add_parser("topo", help="topology-aware rank order: map ranks from a measured matrix",
                              description="Topology-aware rank order (docs/TOPO.md).")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    add_map(verbs)
    from collbench.topo.measure_cli import add_measure
    add_measure(verbs)
    from collbench.topo.compare_cli import add_compare
    add_compare(verbs)


def add_map(verbs):
    m = verbs.add_parser(
        "map", help="find a rank order for ring or recursive-doubling allgather",
        description="Find a rank order that puts the pairs that talk most on the fastest links of a "
                    "measured latency or bandwidth matrix, compare every method's predicted cost "
                    "with the matrix's own order, and write the order for mpirun, mpiexec, srun "
                    "and collbench.",
        epilog=f"Methods: greedy = the greedy heuristic of the topology-aware collectives report; exact = the optimum (P <= {EXACT_MAX}); "
               f"heuristic = greedy + local search (any P); auto = exact when P <= {EXACT_MAX}, else "
               f"heuristic (default). Files written to --out-dir: PATTERN.rankfile, PATTERN.hostfile, "
               f"PATTERN.machinefile, PATTERN.slurm_hostfile, PATTERN.hosts_order.yaml, "
               f"PATTERN.mapping.json. Exit code 2 on a bad matrix or flag.")
    m.add_argument("--pattern", required=True, choices=PATTERNS, help="the allgather algorithm to map for")
    m.add_argument("--matrix", required=True, metavar="FILE", help="CSV or JSON matrix (docs/TOPO.md)")
    m.add_argument("--metric", choices=sorted(METRICS),
                   help="which matrix of the file (default: its only one; bandwidth when it has both)")
    m.add_argument("--method", type=method_arg, choices=METHODS, default="auto", help="which order to write (default auto; seed: greedy's older name)")
    m.add_argument("--out-dir", default=".", metavar="DIR", help="where to write the order files (default .)")
    m.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    m.add_argument("--time-limit", type=_seconds, default=None, metavar="SECONDS",
                   help="local search budget of the heuristic (default 0.5 + P/250 s, at most 4)")
    m.add_argument("--raw-costs", action="store_true",
                   help="judge orders by the values as measured (default: pairs within measurement "
                        "noise of their class median count at the median, docs/TOPO.md)")
    m.set_defaults(func=cmd_map)


_seconds = cli_values.number_type(0, 3600, "seconds above 0, up to 3600", above_low=True)   # --time-limit
# (0 would leave the local search no time at all)


def cmd_map(args):
    matrix = load_matrix(args.matrix, args.metric)
    result = map_order(matrix, args.pattern, args.method, time_limit=args.time_limit, raw_costs=args.raw_costs)
    data = result.to_dict()
    comment = (f"collbench topo map: {result.pattern} ({result.algorithm}), {matrix.size} ranks, "
               f"metric {matrix.metric.name}, method {result.chosen}, matrix "
               f"{os.path.basename(matrix.source)}")
    outputs = Outputs()  # a failed write still prints the result, then exits 2 naming the file
    files = outputs.run(write_order_files, args.out_dir, result.pattern, result.labels, data, comment) or {}
    data["files"] = files
    if args.format == "json":
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
    elif args.format == "csv":
        sys.stdout.write(csv_text(result))
    else:
        sys.stdout.write(table_text(result))
    if args.format == "table":
        for suffix, path in files.items():
            print(f"collbench: wrote {path}", file=sys.stderr)
    outputs.raise_if_failed()
    return 0


def csv_text(result):
    rows = []
    for row in result.rows():
        a, b = row["worst_pair"] or (None, None)
        rows.append(dict(zip(CSV_COLUMNS, (
            row["method"], int(row["chosen"]), f"{row['cost']:.6g}", row["cost_unit"], f"{row['vs_identity']:.6g}",
            f"{row['speedup']:.6g}", a or "", b or "",
            "" if row["worst_value"] is None else f"{row['worst_value']:.6g}", row["worst_unit"],
            f"{row['tie_break_sum']:.6g}", "" if row["shared_speedup"] is None else f"{row['shared_speedup']:.6g}",
            f"{row['seconds']:.4f}", "" if row["optimal"] is None else int(row["optimal"]), row["note"]))))
    return tables.csv_text([Column(k) for k in CSV_COLUMNS], rows, cell=lambda v: v)


def _num(v):
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.4e}"


def table_text(result):
    m = result.matrix
    lines = [f"{result.pattern} allgather ({result.algorithm}) over {m.size} ranks, "
             f"metric {m.metric.name}, matrix {m.source}",
             f"predicted cost: {'time per MB of per-rank block' if m.metric.higher_is_better else 'time'} "
             f"in the lockstep model (docs/TOPO.md); speed-up = identity cost / cost"]
    shared = result.groups is not None
    columns = [Column("chosen", "", align="left"), Column("method", align="left"), Column("cost"),
               Column("vs identity"), Column("speed-up"), Column("slowest pair", align="left"),
               Column("optimal", align="left"), Column("time")] + ([Column("shared uplinks")] if shared else [])
    rows = []
    for r in result.rows():
        worst = "-"
        if r["worst_pair"]:
            worst = f"{r['worst_pair'][0]}-{r['worst_pair'][1]} {_num(r['worst_value'])} {r['worst_unit']}"
        opt = "-" if r["optimal"] is None else ("yes" if r["optimal"] else "not proven")
        rows.append({"chosen": "*" if r["chosen"] else "", "method": r["method"],
                     "cost": f"{_num(r['cost'])} {r['cost_unit']}", "vs identity": f"{r['vs_identity']:.3f}",
                     "speed-up": f"{r['speedup']:.2f}x", "slowest pair": worst, "optimal": opt,
                     "time": f"{r['seconds']:.2f} s",
                     "shared uplinks": f"{r['shared_speedup']:.2f}x" if shared else None})
    lines += table_lines(columns, rows, indent="  ")
    notes = [f"  {r['method']}: {r['note']}" for r in result.rows() if r["note"]]
    if notes:
        lines.append("notes:")
        lines += notes
    if result.snapped:
        lines.append(f"{result.snapped} of {m.size * (m.size - 1) // 2} pairs lie within measurement noise of "
                     f"their class median and count at it (--raw-costs: as measured)")
    if shared:
        lines.append(f"shared uplinks: speed-up if the links between the {max(result.groups) + 1} host "
                     f"groups found (racks) share one uplink per group (docs/TOPO.md)")
    shown = result.labels if len(result.labels) <= 64 else result.labels[:64] + ["..."]
    lines.append(f"order ({result.chosen}), rank 0 first: {' '.join(shown)}")
    return "\n".join(lines) + "\n"
