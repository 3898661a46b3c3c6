"""`collbench sweep`: ops over a range of message sizes, with per-iteration percentiles, written as
the all-gather microbenchmark guide's pair of files (a JSONL metrics report and a `t_<op>_<RUNID>.tsv` per op).

plan            the size list (--min-bytes/--max-bytes/--factor or --sizes) and the steps (OSU's
                iteration rule where no count is given)
metrics_report  a result record -> {"metadata", "metrics"} line; the TSV rows; the files
table           the console table (--format table|csv|json)
cli             the verb
"""
