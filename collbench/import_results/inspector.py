"""`collbench import nccl-inspector PATH... [--results OUT.jsonl]`: the NCCL Inspector plugin's
files (JSON lines of 2.28 to 2.30+, verbose traces, Prometheus textfiles; directories walked,
.gz read) as result records, one per collective with its rank spread (collbench/inspector).

Exit 2 when nothing usable was found (no file, or no record a result can hold); files that
could not be read and lines that are not Inspector records are counted and named in the summary.
"""

import sys

from collbench.atomic_file import append_lines, check_writable
from collbench.bounded_repr import terminal_safe
from collbench.errors import UserError
from collbench.inspector.load import load
from collbench.results.records import dumps
from collbench.tables import Column, render

COLUMNS = (Column("file", align="left"), Column("form", align="left"), Column("job"), Column("lines"),
           Column("ops"), Column("p2p"), Column("verbose"), Column("bad_lines", "bad lines"),
           Column("error", align="left"))


def cmd_import_inspector(args):
    for flag in ("op", "ranks", "hosts"):
        if getattr(args, flag, None) is not None:
            raise UserError(f"--{flag}: not for nccl-inspector (its records say it)")
    if args.results:
        check_writable(args.results, "--results", append=True)
    loaded = load(args.files)
    if not loaded.files:
        raise UserError(f"{', '.join(args.files)[:200]}: no NCCL Inspector file found (expected *.log, *.jsonl, "
                        "*.prom or their .gz, or a directory holding them)")
    if not loaded.records:
        why = "; ".join(f"{terminal_safe(p)}: {e}" for p, e in loaded.errors[:3]) or \
            "; ".join(f"{n} {r}" for r, n in loaded.skipped.items()) or \
            "; ".join(f"{terminal_safe(f.path)}:{ln}: {w}" for f in loaded.files for ln, w in f.bad[:2]) or \
            "no Inspector record"
        raise UserError(f"nothing to import from {len(loaded.files)} file(s): {why}")
    if args.transport != "unknown":     # the job's transport, for baseline keys (the records cannot say)
        for rec in loaded.records:
            rec["transport"] = args.transport
            rec["unknown"] = [u for u in rec.get("unknown", []) if u != "transport"]
    rows = [{"file": f.path, "form": f.form or "-", "job": f.job_id or "-", "lines": f.lines, "ops": f.ops,
             "p2p": f.p2p, "verbose": f.verbose, "bad_lines": f.bad_lines, "error": f.error or ""}
            for f in loaded.files]
    if args.format == "table":
        rows = [{k: terminal_safe(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]
    render(COLUMNS, rows, args.format, out=sys.stdout)
    if args.format == "table":
        for f in loaded.files:
            for line, why in f.bad[:3]:
                print(f"  {terminal_safe(f.path)}:{line}: not read: {terminal_safe(why)}")
        waited = sum(1 for r in loaded.records if "waited_for_rank" in r)
        print(f"{len(loaded.records)} collective(s) from {sum(f.ops for f in loaded.files)} record(s); "
              f"{loaded.duplicates} repeated record(s) of one collective merged; "
              f"{waited} with a rank the others waited for"
              + "".join(f"; {n} {r} skipped" for r, n in loaded.skipped.items()))
    if args.results:
        append_lines(args.results, [dumps(r) + "\n" for r in loaded.records], flag="--results")
        if args.format == "table":
            print(f"{len(loaded.records)} records appended to {args.results}")
    return 0
