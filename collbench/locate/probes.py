"""locate's probes as real MPI jobs: the collective on a group of the config's hosts (the
built-in engine, one rank per host), and every pair of a group (collbench.pair_probe, topo
measure's job). A job that fails is a ProbeFailed with its reason."""

import copy

from collbench.locate.search import ProbeFailed
from collbench.pair_probe import MeasureError, Settings
from collbench.pair_probe import run as run_pairs
from collbench.results.records import RunContext


def group_config(cfg, hosts):
    """A copy of cfg whose job runs one rank on each of `hosts` (config host names), in order."""
    by_name = {h.name: h for h in cfg.hosts}
    sub = copy.copy(cfg)
    sub.hosts = [by_name[h] for h in hosts]
    sub.hostfile = None                 # the launcher's --host list is the group alone
    sub.hosts_order = list(hosts)
    sub.ranks = len(hosts)
    sub.ranks_per_node = None
    return sub


class MpiProber:
    """group(hosts): the step's fastest iteration in microseconds (a degraded link slows every
    iteration; a host descheduled now and then slows only some: the minimum is the robust
    figure); pairs(hosts): {(a, b): microseconds per `size` message one way}."""

    def __init__(self, cfg, engine, step, mpi, pair_iterations, timeout, on_probe=None):
        self.cfg, self.engine, self.step, self.mpi = cfg, engine, step, mpi
        self.pair_settings = Settings(lat_size=8, bw_size=step.size_bytes or (1 << 20), iterations=pair_iterations,
                                      warmup=1, timeout=timeout)
        self.on_probe = on_probe or (lambda kind, hosts: None)

    def group(self, hosts):
        self.on_probe("group", hosts)
        sub = group_config(self.cfg, hosts)
        recs = list(self.engine.run_steps(sub, [self.step], RunContext(sub, self.engine.name, self.mpi)))
        rec = recs[-1] if recs else None
        if rec is None or rec.get("type") != "result":
            raise ProbeFailed((rec or {}).get("error") or "the job gave no result")
        return float(rec["latency_min_us"])

    def pairs(self, hosts):
        self.on_probe("pairs", hosts)
        try:
            m = run_pairs(group_config(self.cfg, hosts), self.pair_settings)
        except MeasureError as e:
            raise ProbeFailed(str(e)) from None
        size = self.pair_settings.bw_size
        return {(m.labels[a], m.labels[b]): size / v["bw_bytes_per_s"] * 1e6 for (a, b), v in m.pairs.items()}
