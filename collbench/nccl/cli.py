"""`collbench nccl census PATH...`: what collectives an NCCL/RCCL job ran, and whether its ranks agreed.

Exit codes: 0 done, 1 a desync was found and --fail-on-desync was given, 2 bad input (no file,
empty, binary, no COLL lines; the message names the file and what was expected).
"""

import sys

from collbench.atomic_file import write_output

FORMATS = ("table", "csv", "json")


def register(subparsers):
    p = subparsers.add_parser(
        "nccl", help="NCCL/RCCL collective logs: census and desync finder",
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


def cmd_census(args):
    from collbench.nccl import report
    from collbench.nccl.census import run_census

    census = run_census(args.paths)
    if args.format == "json":
        text = report.render_json(census)
    elif args.format == "csv":
        text = report.render_csv(census)
        for line in report.desync_summary(census):
            print(line, file=sys.stderr)
    else:
        text = report.render_table(census, verbose=args.verbose)
    write_output(args.output, text)
    if args.format != "table":
        for w in census.warnings:
            print(f"collbench: warning: {w}", file=sys.stderr)
    return 1 if census.desync and args.fail_on_desync else 0
