"""The results log and the results files: one home for writing, reading and validating records.

Shared by every verb (the stress daemon writes the log; the exporter, `stress log|status`,
`ctl servers`, `report` and `baseline` read it; `once`, `sweep`, `compare`, `topo` and `nccl`
write results files). docs/LOG_FORMAT.md is the contract.

    records.py        build result / failure / event records (the JSONL format)
    record_parser.py  the one validator: a raw line in, a record or a ParseError out
    lines.py          the one line splitter and the one backwards reader (bounded lines, O_NONBLOCK opens);
                      ReadFingerprint: how a tailing reader tells an append from a truncation
    appender.py       the one rotating, reopening append writer (results log and mpi-output.log)
    results_log.py    the daemon's results log: seq over the appender; reading it back (tail, all)
    follower.py       `stress log -f`: records as they are appended, across rotations
    tailer.py         the exporter's incremental tail (rotation, copytruncate, rewrites)
    file_reader.py    results files as untrusted input for report and baseline (counted bad lines)
    output_files.py   the JSONL and TSV result files of once, sweep, compare, topo, nccl replay
    state_dir.py      the daemon's state directory: pid, state and lock files, daemon status
"""
