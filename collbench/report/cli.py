"""`collbench report RESULTS... -o report.html`: one self-contained HTML page (plots inline as
SVG, nothing fetched at view time) from any results files; `--png DIR` the same plots as PNG,
`--markdown FILE` the all-gather microbenchmark guide's "Expected Results" table.

Exit codes: 0 written; 2 bad input (a file that does not exist, nothing usable in any file, a
bad flag) with nothing written.
"""

import math
import os
import sys
import time

from collbench.atomic_file import FileSet, check_writable
from collbench.cli import add_config_arg
from collbench.errors import UserError
from collbench.report.aggregate import Aggregate
from collbench.results.file_reader import ResultsInput, parse_since


def register(subparsers):
    p = subparsers.add_parser(
        "report", help="an HTML report with plots (and PNG / markdown) from results files",
        description="Build one self-contained HTML page from results files (once --results, the stress "
                    "daemon's results.jsonl and its rotations, sweep/compare output): per op latency and "
                    "busbw vs size (log-log, one line per run/algorithm/order/host set), the per-rank "
                    "spread and straggler ranks, failures, a run table, and busbw as a percentage of the "
                    "point-to-point peak.",
        epilog="RESULTS may be files or stress state directories (results.jsonl and its rotations are read). "
               "Bad lines are counted and shown in the report's Input section, never fatal. The peak: "
               "--peak-from a topo measure matrix, --peak-gbps, --no-peak, or (default) a two-rank "
               "broadcast measured now with `collbench once` (--config picks the hosts). Exit 2 on bad "
               "input; nothing is written then.")
    p.add_argument("results", nargs="+", metavar="RESULTS", help="results JSONL files or state directories")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")
    p.add_argument("--png", metavar="DIR", help="also write each op's plots as DIR/<op>.png")
    p.add_argument("--markdown", metavar="FILE", help="also write the results as the all-gather microbenchmark guide's table (markdown)")
    p.add_argument("--title", metavar="T", default="collbench report", help="page title")
    p.add_argument("--since", metavar="WHEN", help="only records from then on: a duration back from now "
                                                    "(30m, 2h, 7d) or a time (2026-11-22T15:00:00Z)")
    p.add_argument("--group-by", choices=("auto", "run", "setup"), default="auto",
                   help="one line per run, or per setup (runs with the same hosts, ranks, transport, engine, "
                        "MPI, algorithm and order merged); auto: per run unless there are more than 10")
    peak = p.add_mutually_exclusive_group()
    peak.add_argument("--peak-from", metavar="FILE", help="topo measure bandwidth matrix (JSON or CSV)")
    peak.add_argument("--peak-gbps", type=float, metavar="N",
                      help="the point-to-point peak in GB/s (10^9 bytes/s; a 100 Gb/s link is 12.5)")
    peak.add_argument("--no-peak", action="store_true", help="no peak: no percentages")
    add_config_arg(p)
    p.add_argument("--quiet", "-q", action="store_true", help="no summary on stderr")
    p.set_defaults(func=run)


def peak_source(args):
    """A function giving the Peak. Flags and matrix files are checked now, before any input is
    read; a measured peak is deferred until the input proved usable (it costs an MPI run)."""
    from collbench.report import peak as peak_mod
    if args.no_peak:
        peak = peak_mod.no_peak()
    elif args.peak_gbps is not None:
        if not (math.isfinite(args.peak_gbps) and args.peak_gbps > 0):
            raise UserError(f"--peak-gbps {args.peak_gbps}: expected a number of GB/s > 0")
        peak = peak_mod.peak_from_value(float(args.peak_gbps))
    elif args.peak_from:
        peak = peak_mod.peak_from_matrix(args.peak_from)
    else:
        return lambda: peak_mod.measure_peak(args.config, quiet=args.quiet)
    return lambda: peak


def build(paths, peak_fn, title="collbench report", since=None, group_by="auto"):
    """Read, aggregate, plot: (html text, ReportData, figures, Peak, ResultsInput). peak_fn() is
    called only after the input proved usable (a measured peak costs an MPI run)."""
    from collbench.report.figures import all_figures
    from collbench.report.html_report import render
    started = time.monotonic()
    source = ResultsInput(paths, since=since)
    agg = source.consume(Aggregate)
    if not agg.types.get("result") and not agg.types.get("failure"):
        detail = f" ({source.summary_line()})"
        raise UserError(f"no result or failure records in {', '.join(paths)}{detail}")
    data = agg.build(group_by)
    peak = peak_fn()
    if peak.bytes_per_s:
        for p in data.points:
            if p.busbw:
                p.pct_of_peak = 100.0 * p.busbw / peak.bytes_per_s
    figures = all_figures(data, peak.bytes_per_s)
    text = render(data, figures, peak, source.stats, title, source.paths,
                  build_seconds=time.monotonic() - started)
    return text, data, figures, peak, source


def run(args):
    out = check_writable(args.output, "-o")
    md = check_writable(args.markdown, "--markdown") if args.markdown else None
    if args.png:
        if os.path.exists(args.png) and not os.path.isdir(args.png):
            raise UserError(f"--png {args.png}: exists and is not a directory")
    since = parse_since(args.since, time.time()) if args.since is not None else None
    if args.peak_from and not os.path.isfile(args.peak_from):
        raise UserError(f"--peak-from {args.peak_from}: no such file")
    if args.config:
        from collbench.config import load_config
        load_config(args.config)        # a bad config fails now, not after the input was read
    peak_fn = peak_source(args)

    from collbench import harness
    try:
        text, data, figures, peak, source = build(args.results, peak_fn, title=args.title, since=since,
                                                  group_by=args.group_by)
    except harness.Stopped as e:        # the harness said what was stopped and that nothing is written
        return e.exit_code
    # the HTML, the markdown table and the PNGs are one set: all written or none (a full disk
    # leaves the previous report whole, never a new page beside old plots)
    files = FileSet("-o")
    files.add(out, text)
    if md:
        from collbench.report.markdown_table import render_markdown
        files.add(md, render_markdown(data, peak, title=args.title), "--markdown")
    png_paths = []
    created = args.png and not os.path.isdir(args.png)
    if args.png:
        from collbench.report.chart_png import figure_png
        try:
            os.makedirs(args.png, exist_ok=True)
        except OSError as e:
            raise UserError(f"--png {args.png}: cannot create: {e.strerror or e}") from None
        for op, fig in figures:
            png_paths.append(files.add(os.path.join(args.png, f"{op}.png"), figure_png(fig), "--png"))
    try:
        files.commit()
    except UserError:
        if created:
            try:
                os.rmdir(args.png)
            except OSError:
                pass
        raise
    if not args.quiet:
        print(f"collbench: {source.summary_line()}", file=sys.stderr)
        if peak.source == "failed":
            print(f"collbench: warning: {peak.text}; the report has no percentages", file=sys.stderr)
        print(f"collbench: report written to {out} ({len(text.encode()) / 1024:.0f} KB, "
              f"{len(data.series)} series, {len(figures)} plots)", file=sys.stderr)
        if md:
            print(f"collbench: markdown table written to {md}", file=sys.stderr)
        for p in png_paths:
            print(f"collbench: plot written to {p}", file=sys.stderr)
    return 0
