"""The records of every rank of one collective, joined: (communicator, collective, sequence
number) -> its rank spread (min/avg/max of the ranks' times, the slowest rank, and the rank the
others waited for), what neither nccl-tests nor the Inspector's own means show.

Which rank the others waited for: a collective's kernel runs on every rank until the last rank
arrives, so the late rank has the *shortest* kernel time and the earlier ranks the longest. With
verbose traces (coll_start_ts, a CPU clock) the rank that entered the collective last is named
directly; without them, the rank with the shortest time, when it is clearly shorter than the
median (SPREAD_MARGIN), else none (ranks that finish together name nobody).

2.28/2.29 dump the latest collective of each communicator on every dump, so one collective can
appear many times in a rank's file: one (communicator, collective, sn, rank) is kept once.
"""

import statistics

SPREAD_MARGIN = 0.8    # the shortest time at most 80 % of the median: a rank arrived late


class Collective:
    """One collective of one communicator: {rank: InspectorOp}."""

    __slots__ = ("comm_id", "func", "sn", "ranks", "duplicates")

    def __init__(self, comm_id, func, sn):
        self.comm_id, self.func, self.sn = comm_id, func, sn
        self.ranks = {}
        self.duplicates = 0

    def add(self, op):
        if op.rank in self.ranks:
            self.duplicates += 1     # the same collective dumped again (2.28/2.29), or a rewrite
            return False
        self.ranks[op.rank] = op
        return True

    @property
    def first(self):
        return self.ranks[min(self.ranks)]

    def spread(self):
        """{min_us, avg_us, max_us, slowest_rank, waited_for_rank, waited_for_by (how the
        waited-for rank was told: "start_ts" or "shortest_time"), ranks_reported}."""
        ops = [self.ranks[r] for r in sorted(self.ranks)]
        times = [op.exec_us for op in ops]
        out = {"min_us": min(times), "avg_us": round(sum(times) / len(times), 3), "max_us": max(times),
               "slowest_rank": max(ops, key=lambda o: (o.exec_us, -o.rank)).rank,
               "waited_for_rank": None, "waited_for_by": None, "ranks_reported": len(ops)}
        if len(ops) < 2:
            return out
        if all(op.start_us is not None for op in ops):
            late = max(ops, key=lambda o: (o.start_us, -o.rank))
            if late.start_us > min(op.start_us for op in ops):
                out["waited_for_rank"], out["waited_for_by"] = late.rank, "start_ts"
                return out
        shortest = min(ops, key=lambda o: (o.exec_us, o.rank))
        if shortest.exec_us <= SPREAD_MARGIN * statistics.median(times):
            out["waited_for_rank"], out["waited_for_by"] = shortest.rank, "shortest_time"
        return out


def join(ops):
    """({(comm_id, func, sn): Collective} of the collectives, [p2p ops] deduplicated,
    duplicates dropped)."""
    colls, p2p, seen_p2p, dups = {}, [], set(), 0
    for op in ops:
        if op.kind == "p2p":
            key = (op.comm_id, op.rank, op.func, op.sn, op.peer)
            if key in seen_p2p:
                dups += 1
                continue
            seen_p2p.add(key)
            p2p.append(op)
            continue
        key = (op.comm_id, op.func, op.sn)
        c = colls.get(key)
        if c is None:
            c = colls[key] = Collective(*key)
        if not c.add(op):
            dups += 1
    return colls, p2p, dups
