"""`collbench import nccl-tests|osu FILE... [--results OUT.jsonl] [--format table|csv|json]`.

Every run found in the files becomes result records (collbench/import_results/convert.py), so
`report`, `baseline` and `diagnose` compare against a vendor's acceptance run or last year's
numbers as against their own. The summary says per run: the op and how it was known (named by
the output, inferred from its table, the file's name, --op), the ranks and where they came from,
the hosts (from the output's device lines), the records made, the rows skipped and why, the lines
that could not be read, what the output did not say. FILE `-` is standard input; a pipe or FIFO
with nothing to read for --wait seconds is refused, never waited on for good. With --results the
records are appended to that file (all files are read and checked first, their records spooled
to a temporary file: a bad file exits 2 and nothing is written); without it, nothing is written
and the summary shows what would be imported.

Exit codes: 0 imported; 2 bad input (a file that is not such an output, one whose op stays
ambiguous or whose OSU ranks are not given, a file with no row a record can hold, a bad flag or
output path).
"""

import sys

from collbench.atomic_file import append_lines, check_writable
from collbench.bounded_repr import terminal_safe
from collbench.errors import UserError
from collbench.import_results.convert import VARIANTS, WAIT_S, RecordSink, import_files, parse_hosts
from collbench.ops import ALL_OPS
from collbench.tables import Column, render

KINDS = ("nccl-tests", "osu", "nccl-inspector")   # nccl-inspector: inspector.py
COLUMNS = (Column("file", align="left"), Column("form", align="left"), Column("op", align="left"),
           Column("engine", align="left"), Column("ranks"), Column("hosts", align="left"),
           Column("records"), Column("skipped", align="left"), Column("bad_lines", "bad lines"),
           Column("failures", align="left"), Column("unknown", align="left"))
# in csv/json; the table says them in notes below it (they are sentences)
SOURCE_COLUMNS = (Column("op_from", "op from", align="left"), Column("ranks_from", "ranks from", align="left"),
                  Column("bad", "first bad lines", align="left"))


def register(subparsers):
    p = subparsers.add_parser(
        "import", help="turn nccl-tests/rccl-tests or OSU outputs of runs made elsewhere into result records",
        description="Read outputs of nccl-tests / rccl-tests (text in every version's form, -J JSON, "
                    "rccl-tests -Z json|csv) or OSU collective benchmarks and turn every result row into "
                    "a result record, so report, baseline and diagnose can compare against them. Hosts, "
                    "ranks and GPUs come from the output's device lines; what the output does not say is "
                    "listed (a record's `unknown` field), never made up.")
    p.add_argument("kind", choices=KINDS, help="what produced the files")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="output files (stdout of a run, -J JSON, CSV); - for standard input")
    p.add_argument("--results", metavar="OUT.jsonl", help="append the records to this results file")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table", help="summary format")
    p.add_argument("--op", choices=sorted(ALL_OPS),
                   help="the collective, when neither the output nor its table tells (asked for when ambiguous)")
    p.add_argument("--ranks", type=int, metavar="N",
                   help="ranks of the run, when the output has no device lines (OSU never has)")
    p.add_argument("--wait", type=float, default=WAIT_S, metavar="S",
                   help=f"how long standard input or a pipe may send nothing before it is refused "
                        f"(default {WAIT_S:g})")
    p.add_argument("--hosts", metavar="H1,H2", help="hosts of the run, when the output has no device lines")
    p.add_argument("--transport", default="unknown", metavar="NAME",
                   help="the transport the run used, for baseline keys (default: unknown)")
    p.add_argument("--variant", choices=VARIANTS, default="out-of-place",
                   help="nccl-tests figures to import (in-place records carry inplace: true; default "
                        "out-of-place, as engine runs measure)")
    p.set_defaults(func=cmd_import)


def cmd_import(args):
    if args.kind == "nccl-inspector":   # files and directories of the NCCL Inspector plugin
        from collbench.import_results.inspector import cmd_import_inspector
        return cmd_import_inspector(args)
    if args.ranks is not None and not 1 <= args.ranks <= 2**31 - 1:
        raise UserError(f"--ranks: expected a whole number >= 1, got {args.ranks}")
    if not 0 < args.wait <= 86400:
        raise UserError(f"--wait: expected seconds > 0 (at most a day), got {args.wait:g}")
    if not args.transport or len(args.transport) > 64 or not args.transport.isprintable():
        raise UserError("--transport: expected a short name (at most 64 characters)")
    hosts = parse_hosts(args.hosts) if args.hosts else None
    if args.results:
        check_writable(args.results, "--results", append=True)
    sink = RecordSink(spool=bool(args.results))
    try:
        runs = import_files(args.kind, args.files, sink, wait_s=args.wait, op=args.op, ranks=args.ranks,
                            hosts=hosts, transport=args.transport, variant=args.variant)
        for path in dict.fromkeys(run.path for run in runs):
            mine = [run for run in runs if run.path == path]
            if not any(run.records for run in mine):     # a file none of whose runs gives a record
                skipped = {}
                for run in mine:
                    for r, n in run.skipped.items():
                        skipped[r] = skipped.get(r, 0) + n
                why = "; ".join(f"{n} row(s): {r}" for r, n in skipped.items()) or "no result rows"
                bad = next((run for run in mine if run.bad), None)
                if bad:
                    why += f"; {bad.bad_lines} line(s) not read, the first: line {bad.bad[0][0]}: {bad.bad[0][1]}"
                raise UserError(f"{path}: nothing to import ({why})")
        rows = [{"file": run.path, "form": run.form, "op": run.op, "engine": run.engine, "ranks": run.ranks,
                 "hosts": ",".join(run.hosts) or "unknown", "records": run.records,
                 "skipped": "; ".join(f"{n} {r}" for r, n in run.skipped.items()),
                 "bad_lines": run.bad_lines, "failures": run.failures[0] if run.failures else "",
                 "unknown": ",".join(run.unknown), "op_from": run.op_from, "ranks_from": run.ranks_from,
                 "bad": "; ".join(f"line {n}: {why}" for n, why in run.bad[:3])}
                for run in runs]
        if args.format == "table":
            rows = [{k: terminal_safe(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]
            render(COLUMNS, rows, args.format, out=sys.stdout)
            for run, row in zip(runs, rows):
                print(f"  {row['file']}: op {row['op']}: {row['op_from']}; ranks {row['ranks']}: {row['ranks_from']}")
                for line, why in run.bad[:3]:
                    print(f"  {row['file']}:{line}: not read: {terminal_safe(why)}")
        else:
            render(COLUMNS + SOURCE_COLUMNS, rows, args.format, out=sys.stdout)
        if args.results:
            append_lines(args.results, sink.lines(), flag="--results")
            if args.format == "table":
                print(f"{sink.count} records appended to {args.results}")
    finally:
        sink.close()
    return 0
