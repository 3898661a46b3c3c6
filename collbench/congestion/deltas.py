"""Before/after snapshots -> what moved. Faults are skipped and counted, never a failed step and
never a negative delta:

  vanished    read before, absent after (a port or netdev went away)
  unreadable  the file or statistic exists but could not be read (before or after)
  garbage     it holds something other than a whole number 0..2^64-1 (before or after)
  backwards   after < before (a driver reload or a counter reset)

A counter that appears only after has no baseline: it is left out, not counted.
The built-in engine applies the same rules in C (engines/engine_counters.c, cong_fragment).
"""

from typing import Dict, NamedTuple

from collbench.congestion.snapshot import GARBAGE, UNREADABLE

VANISHED, BACKWARDS = "vanished", "backwards"
FAULTS = (VANISHED, UNREADABLE, BACKWARDS, GARBAGE)


class HostDelta(NamedTuple):
    moved: Dict[str, int]      # key -> delta > 0
    faults: Dict[str, int]     # fault kind -> counters skipped for it
    read: int                  # counters read both times
    seconds: float             # between the two snapshots (monotonic)
    sources_read: int = 1      # 0: nothing of this host's could be read


def delta(before, after):
    moved, faults, read = {}, dict.fromkeys(FAULTS, 0), 0
    for k in set(before.faults) | set(after.faults):
        faults[after.faults.get(k) or before.faults[k]] += 1
    for k, b in before.values.items():
        a = after.values.get(k)
        if a is None:
            if k not in after.faults:
                faults[VANISHED] += 1
            continue
        read += 1
        if a < b:
            faults[BACKWARDS] += 1
        elif a > b:
            moved[k] = a - b
    return HostDelta(moved, {f: n for f, n in faults.items() if n}, read,
                     max(0.0, after.mono - before.mono), min(before.sources_read, after.sources_read))
