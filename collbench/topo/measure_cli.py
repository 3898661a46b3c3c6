"""`collbench topo measure`: the latency and bandwidth matrices of the config's hosts, the heat
maps, and the outliers an operator must look at first (docs/TOPO.md, "Measuring").

Files in --out-dir (each written atomically): latency.csv, bandwidth.csv, matrix.json (both
matrices and how they were measured), latency.png/.svg and bandwidth.png/.svg (heat maps with the
outliers marked), outliers.json. Exit 0; 1 when the job failed, or with --fail-on-outlier when
there are outliers; 2 on a bad config or flag (nothing runs).
"""

import csv
import io
import json
import os
import sys

from collbench import cli_values, harness
from collbench.config import load_config
from collbench.atomic_file import FileSet, Outputs, check_writable
from collbench.results.output_files import write_jsonl
from collbench.sizes import format_size
from collbench.tables import Column, table_lines
from collbench.topo import measure
from collbench.pair_matrix import csv_text as csv_matrix, json_text as json_matrices
from collbench.results.records import dumps
from collbench.topo.order_files import check_out_dir
from collbench.topo.outliers import DEFAULT_RATIO, find_outliers

FORMATS = ("table", "csv", "json")
METRIC_NAMES = ("latency", "bandwidth")
MAX_GRID = 16            # ranks up to which the table prints the matrices themselves
CSV_COLUMNS = ("a", "b", "round", "latency_us", "bandwidth_GBps", "latency_outlier", "bandwidth_outlier")


def add_measure(verbs):
    from collbench.cli import add_config_arg
    m = verbs.add_parser(
        "measure", help="measure every pair's latency and bandwidth: matrices, heat maps, outliers",
        description="Run one MPI job over the config's hosts (one rank per host, or --ranks-per-host) "
                    "that ping-pongs every pair of ranks: a small message for latency, a large one for "
                    "bandwidth, in P-1 rounds of disjoint pairs (one pair at a time, or each round's "
                    "pairs at once with --concurrent). Writes the matrices (CSV and JSON, with host "
                    "names), heat maps, and names the hosts and links clearly slower than their peers.",
        epilog="Files in --out-dir: latency.csv, bandwidth.csv, matrix.json, latency.PIC, bandwidth.PIC, "
               "outliers.json (PIC: --picture). `collbench topo map --matrix DIR/matrix.json` reads "
               "them. Exit code 1 when the job failed or (--fail-on-outlier) when there are outliers, "
               "2 on a bad config or flag.")
    add_config_arg(m)
    m.add_argument("--ranks-per-host", type=_positive_int, default=1, metavar="N",
                   help="ranks on each host (default 1); labels become host:k")
    m.add_argument("--concurrent", action="store_true",
                   help="measure each round's pairs at once (closer to a collective's load; default: one "
                        "pair at a time)")
    m.add_argument("--lat-size", type=_size, default=8, metavar="SIZE", help="latency message (default 8 B)")
    m.add_argument("--bw-size", type=_size, default=1 << 20, metavar="SIZE",
                   help="bandwidth message (default 1MB)")
    m.add_argument("--iterations", type=_positive_int, default=100, metavar="N",
                   help="latency ping-pongs per pair (default 100; bandwidth: N/4+1)")
    m.add_argument("--warmup", type=_nonneg_int, default=None, metavar="N",
                   help="untimed ping-pongs first (default N/10, at least 1)")
    m.add_argument("--out-dir", default=".", metavar="DIR", help="where the files go (default .)")
    m.add_argument("--picture", choices=("png", "svg"), default="png", help="heat map format (default png)")
    m.add_argument("--format", choices=FORMATS, default="table", help="console output (default table)")
    m.add_argument("--outlier-ratio", type=_ratio, default=DEFAULT_RATIO, metavar="X",
                   help=f"how much slower than its class a host or link must be (default {DEFAULT_RATIO:g})")
    m.add_argument("--outlier-metric", choices=("both",) + METRIC_NAMES, default="both",
                   help="whose outliers count for --fail-on-outlier and the summary (default both; on a "
                        "loaded machine latency is noisy: bandwidth)")
    m.add_argument("--fail-on-outlier", action="store_true", help="exit 1 when there are outliers")
    m.add_argument("--results", metavar="FILE",
                   help="append the measurement to a JSONL results file (topo_pair / topo_measure events)")
    m.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="stop the job after this long without output (default: the config's step_timeout; "
                        "the job prints only at its end)")
    m.set_defaults(func=cmd_measure)


_positive_int = cli_values.count_type(1, 1_000_000)     # --ranks-per-host, --iterations
_nonneg_int = cli_values.count_type(0, 1_000_000)       # --warmup
_size = cli_values.size_type()
_ratio = cli_values.ratio_type("1.5")      # --outlier-ratio


_seconds = cli_values.duration_type(1.0, 7 * 86400.0)    # --timeout


def cmd_measure(args):
    cfg = load_config(args.config)
    settings = measure.Settings(
        ranks_per_host=args.ranks_per_host, lat_size=args.lat_size, bw_size=args.bw_size,
        iterations=args.iterations, warmup=args.warmup if args.warmup is not None else max(1, args.iterations // 10),
        concurrent=args.concurrent, timeout=args.timeout or cfg.step_timeout)
    measure.measure_config(cfg, settings.ranks_per_host)     # a bad host/slot combination: exit 2 now
    out_dir = check_out_dir(args.out_dir)
    results_path = check_writable(args.results, "--results", append=True) if args.results else None
    ctx = harness.run_context(cfg, "builtin")

    failed = None
    with harness.Run("topo measure", quiet=True, on_stop="nothing written") as job:
        try:
            result = measure.run(cfg, settings)
        except measure.MeasureError as e:
            failed = e
    if job.stopped:
        return job.exit_code
    if failed is not None:
        print(f"collbench: topo measure: {failed}", file=sys.stderr)
        if failed.stderr_tail:
            print("\n".join("  " + ln for ln in failed.stderr_tail.splitlines()[-10:]), file=sys.stderr)
        if results_path:
            write_jsonl(results_path, [measure.failure(ctx, failed)])
        return 1

    lat, bw = result.matrices(measure.meta(result, ctx, cfg))
    reports = {"latency": find_outliers(lat, ratio=args.outlier_ratio),
               "bandwidth": find_outliers(bw, ratio=args.outlier_ratio)}
    # a measurement is never thrown away because one output failed: write what can be, print
    # the table, then exit 2 naming what could not be written
    outputs = Outputs()
    files = outputs.run(write_files, out_dir, lat, bw, reports, args.picture) or {}
    if results_path and outputs.append(results_path, [json_line(r) for r in measure.pair_events(result, ctx)
                                                      + [measure.summary_event(result, ctx, reports, files)]],
                                       "--results") is not None:
        files["results"] = os.path.abspath(results_path)
    if args.format == "json":
        doc = json_doc(result, lat, bw, reports, files)
        doc["any_outliers"] = any(r.any for k, r in reports.items() if k in counted(args.outlier_metric))
        doc["outlier_metric"] = args.outlier_metric
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    elif args.format == "csv":
        sys.stdout.write(csv_text(result, reports))
    else:
        sys.stdout.write(table_text(result, lat, bw, reports, ctx, counted(args.outlier_metric)))
        for path in files.values():
            print(f"collbench: wrote {path}", file=sys.stderr)
    outputs.raise_if_failed()
    if args.fail_on_outlier and any(r.any for k, r in reports.items() if k in counted(args.outlier_metric)):
        return 1
    return 0


def counted(outlier_metric):
    """The metrics whose outliers count (--outlier-metric)."""
    return METRIC_NAMES if outlier_metric == "both" else (outlier_metric,)


def write_files(out_dir, lat, bw, reports, picture):
    """Every output file, as one set (all or none: atomic_file.FileSet); {name: absolute path}.
    OutputError (exit 2) naming the file that could not be written."""
    from collbench.topo.heatmap import picture_format, render
    files = FileSet("--out-dir")
    names = {"latency_csv": files.add(os.path.join(out_dir, "latency.csv"), csv_matrix(lat)),
             "bandwidth_csv": files.add(os.path.join(out_dir, "bandwidth.csv"), csv_matrix(bw)),
             "matrix_json": files.add(os.path.join(out_dir, "matrix.json"), json_matrices([lat, bw])),
             "outliers_json": files.add(os.path.join(out_dir, "outliers.json"),
                                        json.dumps({k: r.to_dict() for k, r in reports.items()}, indent=1) + "\n")}
    for name, m in (("latency", lat), ("bandwidth", bw)):
        path = os.path.join(out_dir, f"{name}.{picture}")
        names[f"{name}_heatmap"] = files.add(path, render(
            m, picture_format(path), f"{name} ({m.metric.unit}) between {m.size} ranks, collbench topo measure",
            reports[name]))
    written = files.commit()
    return {name: os.path.abspath(written[path]) for name, path in names.items()}


def json_line(rec):
    return dumps(rec) + "\n"


def _outlier_sets(report):
    hosts = {h.host for h in report.hosts}
    links = {frozenset((lk.a, lk.b)) for lk in report.links}
    return hosts, links


def csv_text(result, reports):
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    sets = {k: _outlier_sets(r) for k, r in reports.items()}
    for (a, b), v in sorted(result.pairs.items()):
        la, lb = result.labels[a], result.labels[b]
        flags = []
        for name in METRIC_NAMES:
            hosts, links = sets[name]
            flags.append(int(la in hosts or lb in hosts or frozenset((la, lb)) in links))
        w.writerow([la, lb, v["round"], f"{v['lat_us']:.6g}", f"{v['bw_bytes_per_s'] / 1e9:.6g}"] + flags)
    return out.getvalue()


def json_doc(result, lat, bw, reports, files):
    return {"hosts": list(result.labels), "latency_us": [list(r) for r in lat.values],
            "bandwidth_GBps": [list(r) for r in bw.values], "meta": lat.meta,
            "outliers": {k: r.to_dict() for k, r in reports.items()},
            "any_outliers": any(r.any for r in reports.values()), "files": files}


def _grid(m, fmt):
    labels = list(m.labels)
    columns = [Column("host", "", align="left")] + [Column(i, f"[{i}]") for i in range(len(labels))]
    rows = [{"host": f"[{i}] {lb}", **{j: "-" if v is None else fmt(v) for j, v in enumerate(row)}}
            for i, (lb, row) in enumerate(zip(labels, m.values))]
    return table_lines(columns, rows, indent="  ", rule=False)


def table_text(result, lat, bw, reports, ctx, metrics=METRIC_NAMES):
    s = result.settings
    p = result.size
    lines = [f"topo measure: run {ctx.run_id}, {p} ranks ({s.ranks_per_host} per host), "
             f"{p * (p - 1) // 2} pairs in {p - 1 + p % 2} rounds, "
             f"{'each round at once' if s.concurrent else 'one pair at a time'}, {ctx.mpi}, "
             f"{result.seconds:.1f} s",
             f"latency: {format_size(s.lat_size)} ping-pong x {s.iterations} (one-way us); bandwidth: "
             f"{format_size(s.bw_size)} ping-pong x {s.iterations // 4 + 1} (GB/s)"]
    for name, m, fmt in (("bandwidth", bw, lambda v: f"{v:.3g}"), ("latency", lat, lambda v: f"{v:.4g}")):
        lines.append("")
        lines.append(f"{name} ({m.metric.unit}):")
        if p <= MAX_GRID:
            lines += _grid(m, fmt)
        rep = reports[name]
        if rep.groups and len(rep.groups) > 1:
            lines.append("  host groups joined by the fastest links (racks): "
                         + "; ".join(" ".join(g) for g in rep.groups))
        lines += ["  " + ln for ln in rep.lines()]
    counted_reports = [r for k, r in reports.items() if k in metrics]
    flagged = sorted({h.host for r in counted_reports for h in r.hosts})
    links = sorted({f"{lk.a}-{lk.b}" for r in counted_reports for lk in r.links})
    lines.append("")
    if flagged or links:
        lines.append(f"look first at ({' and '.join(metrics)}): "
                     + ", ".join([f"host {h}" for h in flagged] + [f"link {x}" for x in links]))
    else:
        lines.append(f"no outliers ({' and '.join(metrics)})")
    return "\n".join(lines) + "\n"
