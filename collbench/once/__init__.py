"""`collbench once`: the plan once, with progress, a table per op and result files.

    cli.py            the verb: flags, checks, the run through the engine, exit codes
    progress.py       progress on stderr (a live line on a terminal)
    report_table.py   the per-op console table, and latency/bandwidth as text

Its JSONL and TSV files are written by collbench.results.output_files.
"""
