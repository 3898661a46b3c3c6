"""`collbench once`: the plan once, with progress, a table per op and result files.

    cli.py            the verb: flags, checks, the run through the engine, exit codes
    report_table.py   the per-op console table (rendered by collbench.tables)

Its progress, signals and exit codes come from collbench.harness.

Its JSONL and TSV files are written by collbench.results.output_files.
"""
