"""NCCL Inspector output (the NCCL profiler plugin's per-collective records, docs/INSPECTOR.md),
read as untrusted input by `import nccl-inspector`, the exporter's inspector collector and
`diagnose --inspector`.

    parse.py     one JSON line (2.28 .. 2.30+, verbose traces, p2p) or a Prometheus textfile
                 (2.29's per-collective form, 2.30's buckets) -> typed tuples, or a reason
    files.py     paths (files, directories, .gz) -> bounded reads, counted errors, the job id
    spread.py    the records of every rank of one collective -> its rank spread
    records.py   collectives -> result records (collbench/results/records.py)
"""
