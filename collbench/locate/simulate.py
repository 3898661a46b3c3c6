"""locate on a simulated fabric: P hosts, one slow host or link (or none), each probe answered at
once with the time the slow part imposes. For the probe count against P (bench/locate_probes.py,
bench/diagnose_scale.py) and the search's tests; no MPI runs."""

from collbench.locate.search import locate

FAST, SLOW = 1.0, 10.0


class SimulatedFabric:
    """culprit: None, a host name, or a (host, host) link; hosts are h0 .. h{P-1}."""

    def __init__(self, p, culprit=None):
        self.hosts = [f"h{i}" for i in range(p)]
        self.culprit = culprit

    def _slow(self, members):
        c = self.culprit
        if c is None:
            return False
        if isinstance(c, str):
            return c in members
        return c[0] in members and c[1] in members

    def group(self, hosts):
        return SLOW if self._slow(set(hosts)) else FAST

    def pairs(self, hosts):
        return {(a, b): (SLOW if self._slow({a, b}) else FAST)
                for i, a in enumerate(hosts) for b in hosts[i + 1:]}


def simulate(p, culprit=None):
    """locate's Result on a simulated fabric of p hosts (p >= 3)."""
    fabric = SimulatedFabric(p, culprit)
    return locate(fabric.hosts, fabric, clock=lambda: 0.0)


def simulate_probes(p, culprit="h0"):
    """How many measurements locate makes to find `culprit` among p hosts (collective runs plus
    pairs measured), to set beside a full pairwise matrix's p (p - 1) / 2."""
    return simulate(p, culprit).measurements


def full_matrix_pairs(p):
    return p * (p - 1) // 2
