"""What a comparison leaves once measured, for either engine (compare/cli.py, compare/nccl_compare.py):
the rows in table order, the --results records and --tsv rows written (a file that cannot be
written is kept in `outs` and named at the end), stdout in the chosen --format, and the exit code.
"""

import os
import sys
import time

from collbench.atomic_file import check_writable
from collbench.compare import table
from collbench.engines import algorithms as algs
from collbench.results.records import dumps
from collbench.sizes import format_size
from collbench.tables import Column, table_lines


def output_paths(args):
    """(--results, --tsv, --write-rules, --check-rules) as absolute paths or None, each file to
    write checked writable before anything runs (UserError naming the flag)."""
    results_path = check_writable(args.results, "--results", append=True) if args.results else None
    tsv_path = check_writable(args.tsv, "--tsv") if args.tsv else None
    write_path = check_writable(args.write_rules, "--write-rules") if args.write_rules else None
    check_path = os.path.abspath(args.check_rules) if args.check_rules else None
    return results_path, tsv_path, write_path, check_path


def order_rows(rows, plan, margin, flavour):
    """rows sorted as the table prints them (op as asked, size, algorithm as planned, the file's
    `rules` rows last) and annotated again (speed-ups, wins, the chosen row), in place."""
    order = {op: i for i, op in enumerate(plan.ops)}
    alg_order = {(op, a): i for op in plan.ops for i, a in enumerate(plan.algorithms[op] + [algs.RULES])}
    rows.sort(key=lambda r: (order[r["op"]], r["size_bytes"], alg_order.get((r["op"], r["algorithm"]), 999)))
    table.annotate(rows, margin, flavour)


def write_files(args, rows, records, outs, results_path, tsv_path, tsv_lines, started):
    """Append the records to --results and write the TSV lines to --tsv, saying so on stderr."""
    if not args.quiet:
        print(f"collbench compare: {len(rows)} rows in {time.monotonic() - started:.1f}s", file=sys.stderr)
    if results_path and outs.append(results_path, [dumps(r) + "\n" for r in records], "--results") \
            and not args.quiet:
        print(f"collbench compare: {len(records)} records appended to {results_path}", file=sys.stderr)
    if tsv_path and outs.write(tsv_path, "".join(tsv_lines), "--tsv") and not args.quiet:
        print(f"collbench compare: table written to {tsv_path}", file=sys.stderr)


def print_result(args, rows, meta, title, check_path, margin, chk, written, written_what, notes,
                 edit_table=None):
    """stdout in --format: the JSON document (meta and rows), the CSV rows, or the table with the
    file check's lines, the notes and the file written (`written_what`: "tuning file", "env file")."""
    if args.format == "json":
        sys.stdout.write(table.render_json(rows, meta))
    elif args.format == "csv":
        sys.stdout.write(table.render_csv(rows))
    else:
        text = table.render_table(rows, title, os.path.basename(check_path) if check_path else None, margin)
        sys.stdout.write(edit_table(text) if edit_table else text)
        for line in check_lines(chk):
            print(line)
        for note in notes:
            print(f"note: {note}")
        if written:
            print(f"{written_what} written: {written}")
    sys.stdout.flush()


# a check's gain per size: op, size, what the file forces, gain [interval], verdict (no heading)
CHECK_COLUMNS = (Column("op", align="left"), Column("size", width=6, fmt=format_size),
                 Column("forced", align="left", width=21), Column("gain", align="left"),
                 Column("verdict", align="left"))


def check_lines(chk):
    """The lines after the table that tell the written file's check (none without a check)."""
    if chk is None:
        return []
    if not chk.ran:
        return [f"tuning file check: {chk.reason}"] + (
            ["the file is installed-quality (it cannot make a collective slower)"] if chk.installed_quality else [])
    lines = [f"tuning file check ({chk.pairs} jobs without and {chk.pairs} with it, ABBA order): gain per size"]
    rows = [{"op": v.op, "size": v.size_bytes, "forced": v.forced or "library's choice",
             "gain": ("-" if v.gain is None else f"{v.gain:.3f}x")
             + ("" if v.ci_low is None else f" [{v.ci_low:.3f}, {v.ci_high:.3f}]"),
             "verdict": v.verdict + (f": {v.reason}" if v.verdict == "dropped" else "")} for v in chk.sizes]
    lines += table_lines(CHECK_COLUMNS, rows, indent="  ", rule=False, heading=False)
    if chk.noise is not None:
        lines.append(f"  control noise (sizes the file leaves alone): {chk.noise * 100:.1f} %")
    g = chk.gain()
    if g is not None:
        lines.append(f"  geometric mean gain where the file forces an algorithm: {(g - 1) * 100:+.1f} %")
    for v in chk.dropped:
        lines.append(f"dropped from the file: {v.op} {format_size(v.size_bytes)} ({v.forced}): back to the "
                     f"library's choice")
    lines.append("the file is installed-quality" if chk.installed_quality
                 else f"the file is NOT installed-quality: {chk.reason}")
    return lines


def exit_code(rows, explained):
    """0 every row measured or explained (explained(reason): a refusal the MPI or NCCL documents);
    1 a failed validation, a failed default, or a failure nothing explains."""
    for r in rows:
        if r["status"] == table.OK and r["validation"] == "fail":
            return 1
        if r["algorithm"] == algs.DEFAULT and r["status"] != table.OK:
            return 1
        if r["status"] == table.FAILED and not explained(str(r["reason"])):
            return 1
    return 0
