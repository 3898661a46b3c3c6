"""`collbench diagnose`: what regressed, and which host, port or link explains it (docs/DIAGNOSIS.md).

load.py        results records -> series of compact steps (latency, the off-CPU rank's host, counter deltas)
regression.py  which series regressed: against a baseline, else a persistent shift (change_point)
evidence.py    counter families and the evidence per host/port/link in slow vs good steps
ranking.py     suspects with a cause class and a score, merged over regressions, best first
output.py      the table and the JSON document
cli.py         the verb
"""
