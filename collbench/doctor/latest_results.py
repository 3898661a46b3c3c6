"""What the latest results say of each host: the steps it failed in, and how often its rank was
the one the others waited for (kept off its CPU: collbench/off_cpu.py). Not the slowest rank
(`straggler_rank`): in a collective that is usually a rank that waited for a late peer, so it
would mark a healthy host and miss the starved one (docs/DIAGNOSIS.md). Read through the
project's one results reader, so a hostile line is counted, never fatal; only the last `keep`
records are held."""

from collections import deque

from collbench import off_cpu
from collbench.doctor.checks import DEGRADED
from collbench.results.file_reader import ResultsInput

WAITED_FOR_SHARE = 0.5     # waited for in at least half the latest steps...
WAITED_FOR_MIN_STEPS = 5   # ...of at least this many that carry the off-CPU rank


def waited_for_host(rec):
    """The host of the rank the others waited for in this result (off_cpu's rule), or None."""
    late = off_cpu.of_record(rec)
    return late.host if late is not None and late.waited_for else None


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
    seen, waited, last_failure = {}, {}, {}
    for rec in records:
        hosts = [h for h in rec.get("hosts") or () if isinstance(h, str)]
        for h in hosts:
            last_failure[h] = rec if rec.get("type") == "failure" else None
        if rec.get("type") != "result" or off_cpu.of_record(rec) is None:
            continue          # a failure, or a record without the off-CPU rank (older, OSU, nccl-tests)
        for h in hosts:
            seen[h] = seen.get(h, 0) + 1
        w = waited_for_host(rec)
        if w is not None:
            waited[w] = waited.get(w, 0) + 1
    for h, rec in last_failure.items():
        if rec is not None:
            what = " ".join(str(x) for x in (rec.get("op"), rec.get("size")) if isinstance(x, (str, int)))
            err = str(rec.get("error") or "")[:160]
            out.setdefault(h, []).append((DEGRADED, f"the latest step it ran in failed{(' (' + what + ')') if what else ''}"
                                                    + (f": {err}" if err else "")))
    for h, n in waited.items():
        total = seen.get(h, 0)
        if total >= WAITED_FOR_MIN_STEPS and n >= WAITED_FOR_SHARE * total:
            out.setdefault(h, []).append((DEGRADED, f"the others waited for its rank (kept off its CPU) in {n} of its "
                                                    f"{total} latest steps"))
    return out
