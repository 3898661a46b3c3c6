"""The rank a step's other ranks waited for, from a result record's off-CPU fields (`offcpu_rank`,
`offcpu_share_max`, `offcpu_share_avg`: docs/LOG_FORMAT.md), and the one rule that names it
(shared by `collbench diagnose` and `collbench doctor`).

The built-in engine reads each rank's thread CPU time and the wall clock around the step's loop.
MPI ranks poll while they wait, so a healthy rank stays on its CPU; a rank kept off it (a CPU hog,
a cgroup quota, throttling) is the one the others wait for. The slowest rank (`straggler_rank`,
the largest time per call) is usually one of those waiting, not the cause (docs/DIAGNOSIS.md).
"""

from typing import NamedTuple

# the rank is named when it was on its CPU at most this share of its peers' mean (and they were on
# theirs at least MIN_PEERS_ON_CPU of the loop: ranks that all sleep say nothing). Measured on the
# 4-host testbed (4 ranks on 2 cores shared with other jobs, load ~11; docs/DIAGNOSIS.md): quiet
# steps 0.62-0.99; h4's rank held to 2 % of a CPU by a cgroup quota 0.07-0.09, to 5 % 0.15-0.18
MAX_ON_CPU_RATIO = 0.4
MIN_PEERS_ON_CPU = 0.02


class OffCpu(NamedTuple):
    host: str
    on: float          # the share of the loop the rank was on its CPU
    peers_on: float    # the other ranks' mean share

    @property
    def waited_for(self):
        """The rule: this rank kept the others waiting."""
        return self.peers_on >= MIN_PEERS_ON_CPU and self.on <= MAX_ON_CPU_RATIO * self.peers_on


def rank_host(rank, rec):
    """The host of `rank`: ranks are placed in blocks of ranks/nodes per host, in the order of
    `hosts` (mpirun's by-slot fill); None when that cannot be told."""
    hosts, ranks = rec.get("hosts"), rec.get("ranks")
    if (not isinstance(rank, int) or isinstance(rank, bool) or not isinstance(ranks, int) or not hosts
            or not isinstance(hosts, (list, tuple)) or ranks <= 0 or ranks % len(hosts) or not 0 <= rank < ranks):
        return None
    host = hosts[rank // (ranks // len(hosts))]
    return host if isinstance(host, str) else None


def _share(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0 else None


def of_record(rec):
    """The OffCpu of the rank that spent the largest share of the step's loop off its CPU; None
    for a record without the fields (older logs, the OSU and nccl-tests engines), with values out
    of range, or whose rank's host cannot be told."""
    top, avg, ranks = _share(rec.get("offcpu_share_max")), _share(rec.get("offcpu_share_avg")), rec.get("ranks")
    if top is None or avg is None or avg > top or not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 2:
        return None
    host = rank_host(rec.get("offcpu_rank"), rec)
    if host is None:
        return None
    peers_off = min(max((ranks * avg - top) / (ranks - 1), 0.0), 1.0)
    return OffCpu(host, 1.0 - top, 1.0 - peers_off)
