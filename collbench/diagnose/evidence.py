"""The evidence for one regression: per host and counter, what moved during its slow steps
against that counter's normal (the baseline's runs when diagnosing against a baseline that kept
them, else the results' own good steps: _normal) and against its peers; per path (host > peer), the per-peer counters the
same way; per host, how often its rank was the one the others waited for (off its CPU markedly
more than its peers: docs/DIAGNOSIS.md). Each counter's row in congestion/counters.py states the
cause family it is evidence of (congestion, pfc, link_errors; traffic counters are none).

A counter is evidence only when its movement is beyond its normal by a test that respects
counts (congestion/normal.py: the negative-binomial upper tail of the slow steps' events against
the reference rate and burstiness, Bonferroni-corrected over every counter tested), with at least
MIN_EVENTS events, in at least MIN_SLOW_STEPS slow steps and half of them, at MIN_CONTRAST times
the expected count. What fell short is said (`lacking`).

The side of each counter (congestion.counters: np receiver, rp sender, link) says which path.
Where one path alone passes its test, each of its two ends' other paths are tested pooled
(EndpointPool): a host's port losing a little on each of its paths passes no single path's test,
while their sum does.
A path's tcp_retrans_segs arrives net of its tcp_dsack_dups (diagnose/load.py,
record_field.path_loss_items): retransmissions the peer reported it already had are no loss.
"""

from collections import Counter, defaultdict
from functools import lru_cache
from dataclasses import dataclass, field

from collbench.congestion import counters
from collbench.congestion.attribution import ROUTINE_RETRANS_SHARE
from collbench.congestion.counters import LINK_ERRORS, PFC, TRAFFIC, weighed_path_counter
from collbench.congestion.keys import priority, split
from collbench.congestion.normal import Tally, steps_upper_tail, upper_tail

SLOW_HOST, UNEXPLAINED = "slow_host", "unexplained"
STORM = {"tx_pause_storm_warning_events", "tx_pause_storm_error_events"}
MIN_STEP_SHARE = 0.5       # a counter must move in at least half of the slow steps ...
MIN_SLOW_STEPS = 3         # ... and in 3 at least: one burst in one step is no pattern
MIN_EVENTS = 20            # a handful of events is never proof (TCP loss recovery bursts by tens)
MIN_CONTRAST = 3.0         # at least this many times the count its normal expects
ALPHA = 1e-3               # the test's level, over every counter tested at once (Bonferroni)
MIN_OFF_CPU_STEPS = 3      # slow steps carrying the off-CPU rank before a slow host can be named
MAX_SHORT = 3              # counters that moved but fell short, said in `lacking`
POOL_SHARE_OF_PROVEN = 0.25 # an end's other paths one way, pooled, losing (marking) at least a quarter
                            # of the share of segments the proven path does: one port's loss spread
                            # over its peers (measured, 8 shaped ports in the stress loop: 0.40-2.0x);
                            # a lossy link's ends lost nothing on their other paths (17 loop trials)
MIN_POOL_STEPS = 2          # a pool only moves a proven fault to one of its two ends, naming nobody new:
                            # one burst is still no pattern, but half the slow steps is not asked (a
                            # port drops from whichever peer's burst fills it: 2-3 of 5-8 slow steps)


@lru_cache(maxsize=4096)
def family(name):
    """The cause a host counter points at (CONGESTION, PFC, LINK_ERRORS), or None (traffic, or a
    counter the table does not know: never filed under a cause by default)."""
    fam = counters.family(name)
    if fam is None and priority(name):
        fam = PFC
    return None if fam in (None, TRAFFIC) else fam


@lru_cache(maxsize=4096)
def side(name):
    row = counters.row(name)
    return row.side if row else ""


@dataclass
class Judgement:
    """The count test of one counter's slow-step movement against its normal."""
    reference: str = None       # "good steps" or "baseline"; None: no normal to test against
    expected: float = None      # events the normal expects over the slow steps' seconds
    dispersion: float = None    # the negative binomial's overdispersion used
    p_value: float = None       # P(at least this many events | normal), Bonferroni-corrected
    short: str = ""             # why it is not evidence ("" when it is)

    def as_dict(self):
        return {"reference": self.reference, "expected": _round(self.expected, 3),
                "dispersion": _round(self.dispersion, 4), "p_value": _sig(self.p_value)}


def _round(v, digits):
    return None if v is None else round(v, digits)


def _sig(p):
    return None if p is None else float(f"{p:.3g}")


def judge(events, slow_steps_moved, slow_steps, seconds, ref, ref_kind, tests, min_steps=MIN_SLOW_STEPS,
          min_step_share=MIN_STEP_SHARE):
    """A Judgement of `events` in `slow_steps_moved` of `slow_steps` slow steps (`seconds` long)
    against a normal (congestion.normal.Reference, None: none); `tests`: counters tested at once;
    min_steps, min_step_share: the floors of the steps it must have moved in."""
    j = Judgement()
    if ref is None:
        j.short = "no normal to weigh it against (no good steps with counters, and no baseline counter rates)"
        return j
    j.reference, j.dispersion = ref_kind, ref.phi
    j.expected = ref.rate * seconds
    # two views of one normal (congestion/normal.py): how many events, in how many steps; the
    # smaller p, doubled, and corrected for every counter tested
    p_events = upper_tail(events, j.expected, ref.phi, slow_steps)
    p_steps = steps_upper_tail(slow_steps_moved, slow_steps, ref.step_share)
    j.p_value = min(1.0, 2 * min(p_events, p_steps) * max(tests, 1))
    if events < MIN_EVENTS:
        j.short = f"{events} events (needs {MIN_EVENTS})"
    elif slow_steps_moved < max(min_steps, min_step_share * slow_steps):
        j.short = (f"moved in {slow_steps_moved} of {slow_steps} slow steps (needs {min_steps}"
                   + (" and half of them)" if min_step_share else ")"))
    elif events < MIN_CONTRAST * j.expected:
        j.short = (f"{events} events, {events / j.expected:.2g}x the {j.expected:.3g} its normal ({ref_kind}) "
                   f"expects (needs {MIN_CONTRAST:g}x)")
    elif j.p_value > ALPHA:
        j.short = f"p = {j.p_value:.2g} against its normal ({ref_kind}; needs {ALPHA:g})"
    return j


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
    good_rate: float = None   # its normal's rate per second (the good steps' or the baseline's; None: no normal)
    peers_rate: float = 0.0   # the other hosts' mean rate of the same counter in the slow steps
    step_share: float = 0.0   # slow_steps / slow steps with counters
    contrast: float = None    # slow_rate / good_rate (None: no normal; inf: never moved in it)
    test: Judgement = None    # the count test against its normal

    @property
    def name(self):
        return split(self.key)[0]

    @property
    def where(self):
        return split(self.key)[1]

    def qualifies(self):
        """Beyond its normal by the count test (judge), in most slow steps."""
        return self.test is not None and not self.test.short

    @property
    def p_value(self):
        return None if self.test is None else self.test.p_value

    def as_dict(self):
        p = priority(self.name)
        out = {"host": self.host, "counter": self.name, "where": self.where, "side": self.side,
               "slow_steps_moved": self.slow_steps, "slow_step_share": round(self.step_share, 4),
               "rate_slow_per_s": round(self.slow_rate, 3),
               "rate_good_per_s": None if self.good_rate is None else round(self.good_rate, 3),
               "rate_peers_per_s": round(self.peers_rate, 3), "share_of_hosts": round(self.share, 4),
               "delta_slow": self.slow_delta, "delta_good": self.good_delta,
               **(self.test.as_dict() if self.test else {})}
        if p:
            out["priority"] = p[1]
            out["direction"] = p[0]
        return out


@dataclass
class PathEvidence:
    """One path's (host > peer) per-peer counter in the slow steps, and its test."""
    host: str
    peer: str
    counter: str
    family: str
    side: str = ""              # the counter's side of <host> (rp: it sent, np: it received from <peer>)
    slow_delta: float = 0
    segs_out: float = None      # tcp_segs_out of its direction's sender over the same steps (the
                                # traffic a loss share is of: <peer>'s to <host> for an np counter)
    dsack_dups: float = None    # tcp_dsack_dups over the same steps: spurious retransmissions, already
                                # taken out of tcp_retrans_segs (record_field.path_loss_items)
    rtt_us_max: float = None
    test: Judgement = None
    moved_in: set = field(default_factory=set)      # the slow steps (ordinals) it moved in

    @property
    def slow_steps(self):
        return len(self.moved_in)

    def qualifies(self):
        return self.test is not None and not self.test.short

    @property
    def direction(self):
        """(sender, receiver) of the traffic the counter counted: a receiver-side counter
        (tcp_rcv_ooopack on h2>h3) counts what <peer> sent to <host>."""
        return (self.peer, self.host) if self.side == counters.NP else (self.host, self.peer)

    @property
    def p_value(self):
        return None if self.test is None else self.test.p_value

    def as_dict(self):
        return {"path": [self.host, self.peer], "counter": self.counter, "delta_slow": self.slow_delta,
                "slow_steps_moved": self.slow_steps, "segs_out": self.segs_out, "dsack_dups": self.dsack_dups,
                "rtt_us_max": self.rtt_us_max,
                **(self.test.as_dict() if self.test else {})}


@dataclass
class Evidence:
    """What the slow and good steps of one regression say."""
    counters: list = field(default_factory=list)        # CounterEvidence that qualifies, best first
    paths: list = field(default_factory=list)           # PathEvidence that qualifies, best first
    slow_with_paths: int = 0
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
    endpoint_pools: list = field(default_factory=list)   # EndpointPool of both ends of a lone proven path


@dataclass
class EndpointPool:
    """One end of the only path of its family that passed its test: that host's other paths'
    counter, pooled. Loss spread over several of one host's paths (its own port: a shaped or
    overflowing queue drops from every peer) can leave one path proven and the rest each short;
    pooled they pass, and the host, not the one link, is the common endpoint. A lossy link's ends
    have other paths at their normal."""
    host: str
    family: str
    counter: str
    way: str                    # "in": the traffic its peers sent it; "out": what it sent them
    pair: frozenset             # the proven path's two hosts, left out of the pool
    paths: list                 # the PathEvidence pooled (its other paths that way, read in the slow steps)
    peers: list                 # every other peer it had traffic with: the pool's normal is theirs
    test: Judgement = None

    @property
    def slow_delta(self):
        return sum(p.slow_delta for p in self.paths)

    @property
    def slow_steps(self):
        """The slow steps any of its paths moved in."""
        return len(set().union(*(p.moved_in for p in self.paths)))

    def qualifies(self):
        return self.test is not None and not self.test.short

    def subject(self, peer):
        """The (host, peer) whose socket counts this pool's counter for the traffic with `peer`."""
        sender, receiver = (peer, self.host) if self.way == "in" else (self.host, peer)
        return (receiver, sender) if counters.path_row(self.counter).side == counters.NP else (sender, receiver)

    def as_dict(self):
        return {"host": self.host, "counter": self.counter, "direction": self.way, "excluded": sorted(self.pair),
                "paths": [[p.host, p.peer] for p in self.paths if p.slow_delta > 0],
                "delta_slow": self.slow_delta, "slow_steps_moved": self.slow_steps,
                **(self.test.as_dict() if self.test else {})}


class PooledReference:
    """The normal of several paths' counter taken together: their rates summed, the burstiest
    one's overdispersion (paths of one host share its bursts: never taken as independent), and
    the chance that any of them moves in a step."""
    def __init__(self, refs):
        self.rate = sum(r.rate for r in refs)
        self.phi = max(r.phi for r in refs)
        still = 1.0
        for r in refs:
            still *= 1.0 - r.step_share
        self.step_share = min(1.0 - still, 1.0 - 1e-9)


def gather(steps, slow, good, nodes, normal=None):
    """The Evidence of one regression (steps: its series, or several series pooled; slow, good:
    indices; normal: the baseline's congestion.normal.Tally, or None). The off-CPU share is a
    property of the rank, not of the op's structure, so steps of several ops pool."""
    ev = Evidence()
    acc = {}                                   # (host, key) -> CounterEvidence (slow steps, not routine)
    path_acc = {}                              # (host, peer, counter) -> PathEvidence
    traffic = PathTraffic()                    # the paths' segments, DSACKs and RTT in the slow steps
    per_name_slow = Counter()                  # counter name -> delta over hosts (slow steps)
    hosts_per_name = defaultdict(set)
    good_tally = Tally()                       # the good steps' normal (routine movements included)
    slow_secs = slow_path_secs = 0.0
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
            if which == 1:
                ev.good_with_counters += 1
                good_tally.add_exposure("host", s.window_s)
                for host, key, d, _routine in s.moved:
                    if family(split(key)[0]) is not None:
                        good_tally.add(host, key, d, s.window_s)
                if s.paths is not None:
                    good_tally.add_exposure("path", s.window_s)
                    for host, peer, name, v in s.paths:
                        if weighed_path_counter(name):
                            good_tally.add(f"{host}>{peer}", name, v, s.window_s)
                continue
            ev.slow_with_counters += 1
            ev.slow_sources[s.source] += 1
            slow_secs += s.window_s
            for host, key, d, routine in s.moved:
                name = split(key)[0]
                fam = family(name)
                if fam is None or routine:
                    continue
                c = acc.get((host, key))
                if c is None:
                    c = acc[(host, key)] = CounterEvidence(host, key, fam, side(name))
                c.slow_delta += d
                c.slow_steps += 1
                per_name_slow[name] += d
                hosts_per_name[name].add(host)
                ev.moved_hosts.add(host)
            if s.paths is not None:
                ev.slow_with_paths += 1
                slow_path_secs += s.window_s
                _add_paths(path_acc, traffic, s.paths, ev.slow_with_paths)
    for p in path_acc.values():
        traffic.fill(p)
    normal_used, kind = _normal(ev, good_tally, normal)
    moved = [c for c in acc.values() if c.slow_steps]
    tests = len(moved) + sum(1 for p in path_acc.values() if p.test is None and p.slow_delta > 0)
    short = []
    for c in moved:
        name = c.name
        c.share = c.slow_delta / per_name_slow[name]
        c.slow_rate = c.slow_delta / slow_secs if slow_secs else 0.0
        c.step_share = c.slow_steps / ev.slow_with_counters
        peers = max((nodes or len(hosts_per_name[name])) - 1, 1)
        c.peers_rate = (per_name_slow[name] - c.slow_delta) / peers / slow_secs if slow_secs else 0.0
        ref = normal_used.reference(c.host, c.key) if normal_used is not None else None
        if ref is not None:
            c.good_delta = ref.events
            c.good_steps = ref.moved
            c.good_rate = ref.events / ref.seconds
            c.contrast = c.slow_rate / c.good_rate if c.good_rate else float("inf")
        c.test = judge(c.slow_delta, c.slow_steps, ev.slow_with_counters, slow_secs, ref, kind, tests)
        if c.qualifies():
            ev.counters.append(c)
        else:
            short.append(c)
    ev.counters.sort(key=lambda c: (-c.step_share * c.share, -c.slow_delta, c.host, c.key))
    path_short = _judge_paths(ev, path_acc, normal_used, kind, slow_path_secs, tests)
    _pool_endpoints(ev, path_acc, traffic, normal_used, kind, slow_path_secs, tests)
    short.sort(key=lambda c: -c.slow_delta)
    for c in short[:MAX_SHORT]:
        ev.lacking.append(f"evidence short of proof: {c.host}'s {c.name}@{c.where} moved {c.slow_delta} in "
                          f"{c.slow_steps} of {ev.slow_with_counters} slow steps: {c.test.short}")
    for p in path_short[:MAX_SHORT]:
        ev.lacking.append(f"evidence short of proof: the path {p.host} > {p.peer}'s {p.counter} moved "
                          f"{p.slow_delta:g} in {p.slow_steps} of {ev.slow_with_paths} slow steps: {p.test.short}")
    if not ev.slow_with_counters:
        ev.lacking.append("congestion counters: no slow step's record has a `congestion` field (a log written "
                          "before it existed, congestion.enabled false, or an engine that cannot read them)")
    elif ev.slow_sources.get("osu-run"):
        ev.lacking.append("per-host counters: OSU-engine records carry only the launching host's counters "
                          "around the whole run")
    elif normal_used is None:
        ev.lacking.append(f"a normal for the counters: {ev.good_with_counters} good steps with counters, and no "
                          "baseline with counter rates (`collbench baseline save` keeps them): a counter's "
                          "movement cannot be weighed")
    if ev.slow_with_counters and not ev.slow_with_paths:
        ev.lacking.append("per-peer counters: no slow step's record has `congestion.paths` (an engine that does "
                          "not read them): a lossy link is told from a lossy host by the host counters alone")
    if not ev.slow_with_off_cpu:
        ev.lacking.append("per-rank off-CPU shares: no slow step's record has `offcpu_rank` (a log written before "
                          "it existed, the OSU or nccl-tests engines, which report no per-rank times, or ranks not "
                          "spread evenly over the hosts): a slow host cannot be named")
    elif ev.slow_with_off_cpu < MIN_OFF_CPU_STEPS:
        ev.lacking.append(f"slow steps with per-rank off-CPU shares: {ev.slow_with_off_cpu}, fewer than "
                          f"{MIN_OFF_CPU_STEPS}: too few to name a slow host")
    return ev


def _normal(ev, good_tally, baseline_normal):
    """(Tally, kind) the slow steps are weighed against: the baseline's runs when it kept counter
    rates, else the results' own good steps (a short normal: its pseudo-event makes it cautious);
    (None, None). Against a baseline the good steps are the same run's series that stayed within
    their bound, under the same fault (measured: a lossy host's 8 good steps of 12 expected 3210 of
    its 3621 retransmissions), so they are no normal there; in the shift test they come before
    the onset."""
    if baseline_normal is not None and baseline_normal.exposure["host"][0] > 0:
        return baseline_normal, "baseline"
    if ev.good_with_counters:
        return good_tally, "good steps"
    return None, None


class PathTraffic:
    """Per path (host, peer), over the slow steps: tcp_segs_out, tcp_dsack_dups summed and the
    largest tcp_rtt_us_max, whichever steps its loss counters were listed in (a record may leave a
    counter at 0 out: congestion/record_field.py)."""
    FIELDS = {"tcp_segs_out": "segs_out", "tcp_dsack_dups": "dsack_dups", "tcp_rtt_us_max": "rtt_us_max"}

    def __init__(self):
        self.of = {}            # (host, peer) -> {attribute: value}

    def add(self, host, peer, name, v):
        attr = self.FIELDS.get(name)
        if attr is not None:
            got = self.of.setdefault((host, peer), {})
            got[attr] = max(got.get(attr, v), v) if attr == "rtt_us_max" else got.get(attr, 0) + v

    def fill(self, p):
        """p's segs_out (its direction's sender's: what the counted traffic was), dsack_dups, rtt_us_max."""
        p.segs_out = self.of.get(p.direction, {}).get("segs_out")
        mine = self.of.get((p.host, p.peer), {})
        p.dsack_dups, p.rtt_us_max = mine.get("dsack_dups"), mine.get("rtt_us_max")


def _add_paths(path_acc, traffic, paths, ordinal):
    for host, peer, name, v in paths:
        traffic.add(host, peer, name, v)
        if not weighed_path_counter(name):
            continue
        p = path_acc.get((host, peer, name))
        if p is None:
            row = counters.path_row(name)
            p = path_acc[(host, peer, name)] = PathEvidence(host, peer, name, row.family, row.side)
        if v > 0:
            p.slow_delta += v
            p.moved_in.add(ordinal)


def _judge_paths(ev, path_acc, normal_used, kind, seconds, tests):
    """Test every path counter that moved; the ones that qualify go to ev.paths (a loss counter
    only beyond routine loss recovery: ROUTINE_RETRANS_SHARE of the segments sent on the path).
    Returns the ones that fell short, largest first."""
    short = []
    for p in path_acc.values():
        if p.slow_delta <= 0:
            continue
        ref = normal_used.reference(f"{p.host}>{p.peer}", p.counter) if normal_used is not None else None
        events = int(round(p.slow_delta))
        p.test = judge(events, p.slow_steps, ev.slow_with_paths, seconds, ref, kind, tests)
        if (not p.test.short and p.family == LINK_ERRORS and p.segs_out
                and p.slow_delta < ROUTINE_RETRANS_SHARE * p.segs_out):
            p.test.short = (f"{p.slow_delta:g} of {p.segs_out:g} segments sent: routine loss recovery "
                            f"(below {ROUTINE_RETRANS_SHARE:.0%})")
        (ev.paths if p.qualifies() else short).append(p)
    ev.paths.sort(key=lambda p: (-p.slow_delta, p.host, p.peer, p.counter))
    short.sort(key=lambda p: -p.slow_delta)
    return short


def _share(paths, counter):
    """Events per segment sent of the proven paths' `counter` (or, when none of them counts it,
    their largest such share); None where no segments are known (RDMA queue pairs)."""
    same = [p for p in paths if p.counter == counter and p.segs_out]
    shares = [p.slow_delta / p.segs_out for p in (same or [p for p in paths if p.segs_out])]
    return max(shares) if shares else None


def _pool_endpoints(ev, path_acc, traffic, normal_used, kind, seconds, tests):
    """For a family whose proven paths are all between one pair of hosts, each end's other paths,
    pooled per counter and direction (the traffic into the host, or out of it: a port can drop
    one way), tested as one (ev.endpoint_pools); those that pass first, the smallest p first.
    Tested with the same test and Bonferroni count, widened by the pools."""
    if normal_used is None:
        return
    pairs, proven_paths = {}, {}
    for p in ev.paths:
        pairs.setdefault(p.family, set()).add(frozenset((p.host, p.peer)))
        proven_paths.setdefault((p.family, frozenset((p.host, p.peer))), []).append(p)
    candidates = []
    for fam, fam_pairs in pairs.items():
        if len(fam_pairs) != 1:
            continue
        pair = next(iter(fam_pairs))
        for host in sorted(pair):
            other = next(h for h in pair if h != host)
            by_key = {}
            for p in path_acc.values():
                if p.family == fam and host in (p.host, p.peer) and other not in (p.host, p.peer):
                    by_key.setdefault((p.counter, "in" if p.direction[1] == host else "out"), []).append(p)
            # every other peer the host had traffic with, moved or not (a record leaves a counter
            # at 0 out: its path is in the traffic, not in path_acc): the pool's normal is theirs
            peers = {x for hp in traffic.of if host in hp for x in hp} - {host, other}
            for (name, way), ps in sorted(by_key.items()):
                ends = {p.peer if p.host == host else p.host for p in ps}
                candidates.append(EndpointPool(host, fam, name, way, pair, ps, sorted(peers | ends)))
    tests += len(candidates)
    for pool in candidates:
        if pool.slow_delta <= 0:
            continue
        refs = [normal_used.reference("{}>{}".format(*pool.subject(q)), pool.counter) for q in pool.peers]
        ref = PooledReference(refs) if refs and None not in refs else None
        pool.test = judge(int(round(pool.slow_delta)), pool.slow_steps, ev.slow_with_paths, seconds, ref, kind, tests,
                          min_steps=MIN_POOL_STEPS, min_step_share=0.0)
        segs = sum(p.segs_out or 0 for p in pool.paths)
        proven = _share(proven_paths[(pool.family, pool.pair)], pool.counter)
        if not pool.test.short and segs and proven:
            if pool.slow_delta / segs < POOL_SHARE_OF_PROVEN * proven:
                pool.test.short = (f"{pool.slow_delta:g} of {segs:g} segments sent ({pool.slow_delta / segs:.2%}), "
                                   f"under {POOL_SHARE_OF_PROVEN:g}x the proven path's {proven:.2%}")
        ev.endpoint_pools.append(pool)
    ev.endpoint_pools.sort(key=lambda q: (not q.qualifies(), q.test.p_value if q.qualifies() else 1.0, q.host, q.counter))
