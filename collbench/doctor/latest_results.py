"""What the latest results say of each host: the steps it failed in, and how often it was the
straggler (the slowest rank's host). Read through the project's one results reader, so a hostile
line is counted, never fatal; only the last `keep` records are held."""

from collections import deque

from collbench.doctor.checks import DEGRADED
from collbench.results.file_reader import ResultsInput

STRAGGLER_SHARE = 0.5      # the straggler of at least half the latest steps...
STRAGGLER_MIN_STEPS = 5    # ...of at least this many, among at least 3 hosts


def straggler_host(rec):
    """The straggler rank's host: ranks sit in blocks of ranks/len(hosts) in `hosts` order."""
    rank, hosts, ranks = rec.get("straggler_rank"), rec.get("hosts"), rec.get("ranks")
    if (not isinstance(rank, int) or not isinstance(ranks, int) or not isinstance(hosts, (list, tuple))
            or not hosts or ranks <= 0 or ranks % len(hosts) or not 0 <= rank < ranks):
        return None
    return hosts[rank // (ranks // len(hosts))]


def read_latest(paths, keep):
    """(the last `keep` result/failure records, the reader's summary line or '')."""
    inp = ResultsInput(paths, flag="--results")
    latest = deque(maxlen=keep)
    for rec in inp:
        if rec.get("type") in ("result", "failure"):
            latest.append(rec)
    return list(latest), inp.summary_line()


def per_host(records):
    """{host: [(level, reason)]} from the latest records."""
    out = {}
    seen, slowest, last_failure = {}, {}, {}
    for rec in records:
        hosts = [h for h in rec.get("hosts") or () if isinstance(h, str)]
        for h in hosts:
            last_failure[h] = rec if rec.get("type") == "failure" else None
        s = straggler_host(rec) if rec.get("type") == "result" else None
        if s is not None and len(hosts) >= 3:
            for h in hosts:
                seen[h] = seen.get(h, 0) + 1
            slowest[s] = slowest.get(s, 0) + 1
    for h, rec in last_failure.items():
        if rec is not None:
            what = " ".join(str(x) for x in (rec.get("op"), rec.get("size")) if isinstance(x, (str, int)))
            err = str(rec.get("error") or "")[:160]
            out.setdefault(h, []).append((DEGRADED, f"the latest step it ran in failed{(' (' + what + ')') if what else ''}"
                                                    + (f": {err}" if err else "")))
    for h, n in slowest.items():
        total = seen.get(h, 0)
        if total >= STRAGGLER_MIN_STEPS and n >= STRAGGLER_SHARE * total:
            out.setdefault(h, []).append((DEGRADED, f"the straggler (slowest rank) of {n} of its {total} latest steps"))
    return out
