"""The evidence for one regression: per host and counter, what moved during its slow steps
against the same host's good steps and against its peers; per host, how often its rank was the
one the others waited for (off its CPU markedly more than its peers: docs/DIAGNOSIS.md). Each counter belongs to one family, the cause it points at (docs/DIAGNOSIS.md):

  congestion   ECN marks, CNPs, TCP CE echoes: DCQCN / TCP ECN reacting to queues on the path
  pfc          PFC and link-level pauses, pause storms, blocked transmit time, buffer drops
  link_errors  symbol/PHY/ICRC errors, link down/retraining, out-of-sequence, retransmissions

The side of each counter (congestion.counters: np receiver, rp sender, link) says which path.
"""

from collections import Counter, defaultdict
from functools import lru_cache
from dataclasses import dataclass, field

from collbench.congestion import counters
from collbench.congestion.keys import priority, split

CONGESTION, PFC, LINK_ERRORS, SLOW_HOST, UNEXPLAINED = "congestion", "pfc", "link_errors", "slow_host", "unexplained"
CAUSES = (CONGESTION, PFC, LINK_ERRORS, SLOW_HOST, UNEXPLAINED)

_CONGESTION = {"np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored",
               "roce_slow_restart_cnps", "InCEPkts", "TCPDeliveredCE", "TCPECNRehash"}
_PFC = {"rx_pause_ctrl_phy", "tx_pause_ctrl_phy", "tx_pause_storm_warning_events", "tx_pause_storm_error_events",
        "port_xmit_wait", "port_xmit_discards", "rx_discards_phy", "rx_out_of_buffer", "out_of_buffer",
        "TCPRcvQDrop"}
STORM = {"tx_pause_storm_warning_events", "tx_pause_storm_error_events"}
MIN_STEP_SHARE = 0.5       # a counter must move in at least half of the slow steps
MIN_CONTRAST = 3.0         # ... at least this many times its rate in the same host's good steps
MIN_OFF_CPU_STEPS = 3      # slow steps carrying the off-CPU rank before a slow host can be named


@lru_cache(maxsize=4096)
def family(name):
    """The cause a counter points at (CONGESTION, PFC, LINK_ERRORS), or None (not a signal)."""
    if name in _CONGESTION:
        return CONGESTION
    if name in _PFC or priority(name):
        return PFC
    for source in counters.SOURCES:
        if counters.lookup(source, name) is not None:
            return LINK_ERRORS
    return None


@lru_cache(maxsize=4096)
def side(name):
    for source in counters.SOURCES:
        row = counters.lookup(source, name)
        if row is not None:
            return row.side
    return ""


@dataclass
class CounterEvidence:
    host: str
    key: str                  # "<counter>@<where>"
    family: str
    side: str
    slow_delta: int = 0
    slow_steps: int = 0       # slow steps in which it moved
    good_delta: int = 0
    good_steps: int = 0
    share: float = 0.0        # of the counter's movement over all hosts in the slow steps
    slow_rate: float = 0.0    # per second of the slow steps' windows
    good_rate: float = None   # per second of the good steps' windows (None: no good step had counters)
    peers_rate: float = 0.0   # the other hosts' mean rate of the same counter in the slow steps
    step_share: float = 0.0   # slow_steps / slow steps with counters
    contrast: float = None    # slow_rate / good_rate (None: no good steps; inf: never moved in them)

    @property
    def name(self):
        return split(self.key)[0]

    @property
    def where(self):
        return split(self.key)[1]

    def qualifies(self):
        """Moving in most slow steps, and more than in the same host's good steps."""
        return (self.step_share >= MIN_STEP_SHARE
                and (self.contrast is None or self.contrast >= MIN_CONTRAST))

    def as_dict(self):
        p = priority(self.name)
        out = {"host": self.host, "counter": self.name, "where": self.where, "side": self.side,
               "slow_steps_moved": self.slow_steps, "slow_step_share": round(self.step_share, 4),
               "rate_slow_per_s": round(self.slow_rate, 3),
               "rate_good_per_s": None if self.good_rate is None else round(self.good_rate, 3),
               "rate_peers_per_s": round(self.peers_rate, 3), "share_of_hosts": round(self.share, 4),
               "delta_slow": self.slow_delta, "delta_good": self.good_delta}
        if p:
            out["priority"] = p[1]
            out["direction"] = p[0]
        return out


@dataclass
class Evidence:
    """What the slow and good steps of one regression say."""
    counters: list = field(default_factory=list)        # CounterEvidence that qualifies, best first
    slow_with_counters: int = 0
    good_with_counters: int = 0
    slow_sources: Counter = field(default_factory=Counter)
    moved_hosts: set = field(default_factory=set)        # hosts with any signal in the slow steps
    off_cpu_slow: Counter = field(default_factory=Counter)   # host -> slow steps its rank was waited for
    off_cpu_good: Counter = field(default_factory=Counter)
    on_cpu: Counter = field(default_factory=Counter)         # host -> sum of its on-CPU share in those
    peers_on_cpu: Counter = field(default_factory=Counter)   # host -> sum of its peers' mean share
    slow_with_off_cpu: int = 0                               # slow steps whose records carry the field
    good_with_off_cpu: int = 0
    lacking: list = field(default_factory=list)


def gather(steps, slow, good, nodes):
    """The Evidence of one regression (steps: its series, or several series pooled; slow, good:
    indices). The off-CPU share is a property of the rank, not of the op's structure, so steps of
    several ops pool."""
    ev = Evidence()
    acc = {}                                   # (host, key) -> CounterEvidence
    per_name_slow = Counter()                  # counter name -> delta over hosts (slow steps)
    hosts_per_name = defaultdict(set)
    slow_secs = good_secs = 0.0
    for which, idx in ((0, slow), (1, good)):
        for i in idx:
            s = steps[i]
            if s.off_cpu is not None:
                host, on, peers_on = s.off_cpu
                named = s.off_cpu.waited_for      # the one rule (collbench/off_cpu.py)
                if which == 0:
                    ev.slow_with_off_cpu += 1
                    if named:
                        ev.off_cpu_slow[host] += 1
                        ev.on_cpu[host] += on
                        ev.peers_on_cpu[host] += peers_on
                else:
                    ev.good_with_off_cpu += 1
                    if named:
                        ev.off_cpu_good[host] += 1
            if s.window_s is None:
                continue
            if which == 0:
                ev.slow_with_counters += 1
                ev.slow_sources[s.source] += 1
                slow_secs += s.window_s
            else:
                ev.good_with_counters += 1
                good_secs += s.window_s
            for host, key, d in s.moved:
                name = key.partition("@")[0]
                fam = family(name)
                if fam is None:
                    continue
                c = acc.get((host, key))
                if c is None:
                    c = acc[(host, key)] = CounterEvidence(host, key, fam, side(name))
                if which == 0:
                    c.slow_delta += d
                    c.slow_steps += 1
                    per_name_slow[name] += d
                    hosts_per_name[name].add(host)
                    ev.moved_hosts.add(host)
                else:
                    c.good_delta += d
                    c.good_steps += 1
    for c in acc.values():
        if not c.slow_steps:
            continue
        name = c.name
        c.share = c.slow_delta / per_name_slow[name]
        c.slow_rate = c.slow_delta / slow_secs if slow_secs else 0.0
        c.step_share = c.slow_steps / ev.slow_with_counters
        peers = max((nodes or len(hosts_per_name[name])) - 1, 1)
        c.peers_rate = (per_name_slow[name] - c.slow_delta) / peers / slow_secs if slow_secs else 0.0
        if ev.good_with_counters:
            c.good_rate = c.good_delta / good_secs if good_secs else 0.0
            c.contrast = c.slow_rate / c.good_rate if c.good_rate else float("inf")
        if c.qualifies():
            ev.counters.append(c)
    ev.counters.sort(key=lambda c: (-c.step_share * c.share, -c.slow_delta, c.host, c.key))
    if not ev.slow_with_counters:
        ev.lacking.append("congestion counters: no slow step's record has a `congestion` field (a log written "
                          "before it existed, congestion.enabled false, or an engine that cannot read them)")
    elif ev.slow_sources.get("osu-run"):
        ev.lacking.append("per-host counters: OSU-engine records carry only the launching host's counters "
                          "around the whole run")
    if not ev.slow_with_off_cpu:
        ev.lacking.append("per-rank off-CPU shares: no slow step's record has `offcpu_rank` (a log written before "
                          "it existed, the OSU or nccl-tests engines, which report no per-rank times, or ranks not "
                          "spread evenly over the hosts): a slow host cannot be named")
    elif ev.slow_with_off_cpu < MIN_OFF_CPU_STEPS:
        ev.lacking.append(f"slow steps with per-rank off-CPU shares: {ev.slow_with_off_cpu}, fewer than "
                          f"{MIN_OFF_CPU_STEPS}: too few to name a slow host")
    return ev
