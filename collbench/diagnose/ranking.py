"""Suspects from the evidence: a host (or a link between two hosts, or a port and priority of a
host), a cause class and a score in 0..1, ranked over every regression. Each cause class is one
entry of CAUSES: its rule (the function that reads the evidence), its explanation and its
section of docs/DIAGNOSIS.md.

How sure: a suspect named from counters carries `p_value`, the smallest Bonferroni-corrected
upper-tail probability of its evidence against the counter's normal (evidence.judge): how likely
a counter at its normal would have moved that much.

Scores: a counter suspect scores (slow steps it moved in / slow steps with counters) x (its share
of that counter's movement over hosts) x (1 - good rate / slow rate): moving in every slow step,
on this host alone, and never in the good ones is 1. A slow host scores by how much more often
its rank was the one the others waited for (on its CPU at most 40 % as much as its peers) in the slow
steps than in the good ones.
"""

from dataclasses import dataclass, field

from typing import Callable, NamedTuple

from collbench.congestion.counters import CONGESTION, LINK_ERRORS, NP, PFC, RP
from collbench.congestion.keys import priority
from collbench.diagnose.evidence import (SLOW_HOST, STORM, UNEXPLAINED, MIN_OFF_CPU_STEPS, MIN_STEP_SHARE)
from collbench.off_cpu import MAX_ON_CPU_RATIO

CONCENTRATED = 0.5          # a host holding at least half of a counter's movement: more than any other can
LINK_CONCENTRATED = 0.75    # a link: both ends hold most of their side's movement (a second host's share
                            # of a quarter already says the path is not the only one)
COMMON_ENDPOINT = 0.75      # a host on the paths holding this share of the lossy paths' events: the others
                            # are its peers' echoes (dropped ACKs); less is a fabric-wide problem
OFF_CPU_MARGIN = 0.25       # the waited-for share in slow steps above that in the good steps
MIN_GOOD_OFF_CPU_STEPS = 3  # fewer good steps with the field: compared with 0 (quiet steps name none)
PFC_BESIDE_MARKS = 0.5      # pauses beside ECN marks: the same queues seen at the link layer, less
                            # likely the cause than the marks
MAX_LACKING = 12            # what a merged suspect lacks, said once each, the first of them
OFF_CPU_BONUS = 0.1         # a named host whose rank was also waited for: a little more likely


@dataclass
class Suspect:
    cause: str
    host: str = None
    link: tuple = None          # (sender host, receiver host)
    port: str = None
    priority: int = None
    detail: str = ""
    score: float = 0.0
    counters: list = field(default_factory=list)     # CounterEvidence
    off_cpu: dict = None        # the slow-host evidence: how often its rank was waited for
    lacking: list = field(default_factory=list)
    regressions: list = field(default_factory=list)  # labels of the regressions it explains
    paths: list = field(default_factory=list)        # PathEvidence (per-peer counters)
    pools: list = field(default_factory=list)        # EndpointPool that named its host

    def identity(self):
        return (self.cause, self.host, self.link, self.port, self.priority)

    @property
    def p_value(self):
        """How sure: the smallest corrected p-value of its counters' tests (None: not from counters)."""
        ps = [c.p_value for c in list(self.counters) + list(self.paths) if c.p_value is not None]
        ps += [q.test.p_value for q in self.pools if q.test.p_value is not None]
        return min(ps) if ps else None


def _score(c):
    contrast = 1.0 if c.contrast is None or c.contrast == float("inf") else max(0.0, 1.0 - 1.0 / c.contrast)
    return c.step_share * c.share * contrast


def _best(cs):
    return max(cs, key=lambda c: (_score(c), c.slow_delta)) if cs else None


def _congestion(cs):
    """The congested path from which side counted what."""
    np_best, rp_best = _best([c for c in cs if c.side == NP]), _best([c for c in cs if c.side == RP])
    np_conc = np_best is not None and np_best.share >= CONCENTRATED
    rp_conc = rp_best is not None and rp_best.share >= CONCENTRATED
    if (np_conc and rp_conc and np_best.host != rp_best.host
            and min(np_best.share, rp_best.share) >= LINK_CONCENTRATED):
        return Suspect(CONGESTION, link=(rp_best.host, np_best.host), score=min(_score(np_best), _score(rp_best)),
                       counters=[rp_best, np_best],
                       detail=f"the path {rp_best.host} -> {np_best.host}: {rp_best.host}'s sender-side "
                              f"{rp_best.name} and {np_best.host}'s receiver-side {np_best.name} both concentrate "
                              "on it")
    if rp_conc and (not np_conc or _score(rp_best) >= _score(np_best)):
        return Suspect(CONGESTION, host=rp_best.host, port=_port(rp_best), score=_score(rp_best),
                       counters=[rp_best] + ([np_best] if np_best else []),   # the receivers' side beside it
                       detail=f"{rp_best.host}'s outgoing path: the sender-side reaction ({rp_best.name}) concentrates "
                              f"on it ({rp_best.share:.0%} of all hosts')")
    if np_conc:
        return Suspect(CONGESTION, host=np_best.host, port=_port(np_best), score=_score(np_best),
                       counters=[np_best] + ([rp_best] if rp_best else []),   # the senders' side beside it
                       detail=f"incast into {np_best.host}: the receiver-side marks ({np_best.name}) concentrate on "
                              f"it ({np_best.share:.0%} of all hosts')")
    best = _best(cs)
    return Suspect(CONGESTION, host=best.host, port=_port(best), score=_score(best), counters=[best],
                   detail=f"congestion spread over several hosts; the most on {best.host} ({best.name}, "
                          f"{best.share:.0%} of all hosts')")


def _port(c):
    return None if c.where == "netstat" else c.where


def _pfc(cs):
    best = _best(cs)
    p = priority(best.name)
    s = Suspect(PFC, host=best.host, port=_port(best), priority=p[1] if p else None, score=_score(best),
                counters=[best])
    if best.name in STORM:
        s.detail = f"pause storm on {best.host} ({best.name} at {best.where})"
    elif p and p[0] == "tx":
        s.detail = (f"{best.host} paused its peer on priority {p[1]} ({best.where}): its receive side cannot drain, "
                    "and no ECN marks moved (ECN thresholds above PFC's?)")
    elif p:
        s.detail = (f"{best.host} was paused by its peer on priority {p[1]} ({best.where}): congestion beyond its "
                    "port, with no ECN marks (ECN thresholds above PFC's?)")
    else:
        s.detail = f"{best.host}'s port {best.where} was blocked or dropped ({best.name}) with no ECN marks"
    return s


def _link_errors(cs):
    """A host's link, when its errors or retransmissions concentrate on it; the link between two
    hosts when the senders' retransmissions concentrate on one and the receivers' out-of-order
    arrivals on another; None when they are spread over the hosts (every host retransmitting
    alike is load or the whole fabric, not one cable: a burst on a random host must not name it)."""
    rp_best = _best([c for c in cs if c.side == RP and c.share >= LINK_CONCENTRATED])
    np_best = _best([c for c in cs if c.side == NP and c.share >= LINK_CONCENTRATED])
    if rp_best and np_best and rp_best.host != np_best.host:
        return Suspect(LINK_ERRORS, link=(rp_best.host, np_best.host), score=min(_score(rp_best), _score(np_best)),
                       counters=[rp_best, np_best],
                       detail=f"the link {rp_best.host} -> {np_best.host}: {rp_best.host} retransmits "
                              f"({rp_best.name}) and {np_best.host} receives out of order ({np_best.name}), each "
                              "alone: packets lost on the way between them (cable, optics, a port)")
    best = _best([c for c in cs if c.share >= CONCENTRATED])
    if best is None:
        return None
    return Suspect(LINK_ERRORS, host=best.host, port=_port(best), score=_score(best), counters=[best],
                   detail=f"{best.host}'s {best.name} at {best.where} (cable, optics or a flapping link: "
                          "errors, losses and the retransmissions they cost)")


def _path_suspects(paths, pools=()):
    """Suspects from per-peer evidence (paths that passed the count test), per family: the common
    endpoint of the lossy (or marked) paths names that host; paths all between the same two hosts
    name the link, unless one end's other paths pooled passed too (evidence.EndpointPool: that end
    is the common endpoint, its other paths each short of proof alone); paths with no common
    endpoint name nobody (a fabric-wide problem)."""
    out = []
    by_family = {}
    for p in paths:
        by_family.setdefault(p.family, []).append(p)
    for fam, ps in by_family.items():
        pairs = {frozenset((p.host, p.peer)) for p in ps}
        total = sum(p.slow_delta for p in ps)
        what = "lossy" if fam == LINK_ERRORS else "marked" if fam == CONGESTION else "paused"
        if len(pairs) == 1:
            # the direction whose traffic counted the most (a receiver's out-of-order arrivals
            # count the other end's sending: evidence.PathEvidence.direction)
            ways = {}
            for p in ps:
                ways[p.direction] = ways.get(p.direction, 0) + p.slow_delta
            sender, receiver = max(ways, key=lambda d: (ways[d], d))
            ends = [q for q in pools if q.family == fam and q.qualifies()]
            if len({q.host for q in ends}) == 1:
                q = ends[0]
                others = [p for p in q.paths if p.slow_delta > 0]
                out.append(Suspect(fam, host=q.host, score=1.0, paths=ps + others, pools=[q],
                                   detail=f"{q.host}'s link: the one {what} path proven alone ({sender} -> {receiver}), "
                                          f"and {q.host}'s {len(others)} other path(s) {'into it' if q.way == 'in' else 'out of it'} "
                                          f"together beyond their normal "
                                          f"({q.counter}: {q.slow_delta:g} in {q.slow_steps} slow steps)"))
                continue
            out.append(Suspect(fam, link=(sender, receiver), score=1.0, paths=ps,
                               detail=f"the link {sender} -> {receiver}: the only {what} path "
                                      f"({', '.join(sorted({p.counter for p in ps}))}: {total:g} in the slow steps)"))
            continue
        on = {}
        for p in ps:
            for h in (p.host, p.peer):
                on[h] = on.get(h, 0) + p.slow_delta
        host, events = max(on.items(), key=lambda kv: (kv[1], kv[0]))
        n_paths = len({(p.host, p.peer) for p in ps if host in (p.host, p.peer)})
        if events >= COMMON_ENDPOINT * total and n_paths >= 2:
            out.append(Suspect(fam, host=host, score=events / total, paths=[p for p in ps if host in (p.host, p.peer)],
                               detail=f"{host}'s link: the common endpoint of {n_paths} {what} paths "
                                      f"({events / total:.0%} of their {', '.join(sorted({p.counter for p in ps}))})"))
    return out


def _slow_host(ev, nodes):
    """The off_cpu evidence dict and score of a host whose rank the others waited for (on its CPU
    at most 40 % as much as its peers) in most slow steps, markedly more often than in the good
    steps; None. Quiet steps name no rank (every rank polls on its CPU), so without good steps
    to compare with the reference is 0."""
    if ev.slow_with_off_cpu < MIN_OFF_CPU_STEPS or not ev.off_cpu_slow or not nodes or nodes < 2:
        return None
    host, times = ev.off_cpu_slow.most_common(1)[0]
    share = times / ev.slow_with_off_cpu
    have_good = ev.good_with_off_cpu >= MIN_GOOD_OFF_CPU_STEPS
    ref = ev.off_cpu_good[host] / ev.good_with_off_cpu if have_good else 0.0
    if share < max(MIN_STEP_SHARE, 2.0 / nodes) or share < ref + OFF_CPU_MARGIN:
        return None
    info = {"host": host, "slow_steps_waited_for": times, "slow_steps": ev.slow_with_off_cpu,
            "share_slow": round(share, 4), "share_good": round(ref, 4) if have_good else None,
            "on_cpu_share": round(ev.on_cpu[host] / times, 4),
            "peers_on_cpu_share": round(ev.peers_on_cpu[host] / times, 4)}
    return info, min(1.0, (share - ref) / (1.0 - ref)) if ref < 1 else 0.0


def _pauses_beside_marks(out, pauses):
    """Pauses with ECN marks are the same congestion seen at the link layer too: the congestion
    suspect takes the pause counters of its host or link, and a pfc suspect beside it scores
    less (dropped when it names the same host)."""
    cong = next((s for s in out if s.cause == CONGESTION), None)
    pfc = next((s for s in out if s.cause == PFC), None)
    if cong is None:
        return
    for c in pauses:
        if c.host in (cong.host,) + (cong.link or ()):
            cong.counters.append(c)
    if pfc is not None:
        pfc.score *= PFC_BESIDE_MARKS
        if pfc.host == cong.host:
            out.remove(pfc)


def suspects_of(ev, nodes):
    """The suspects of one regression (its Evidence), best first; an `unexplained` one when none."""
    by_family = {}
    for c in ev.counters:
        by_family.setdefault(c.family, []).append(c)
    out = []
    for name, cause in CAUSES.items():       # the causes counters are evidence of, each its own rule
        if cause.from_counters and name in by_family:
            s = cause.rule(by_family[name])
            if s is not None:
                out.append(s)
    _pauses_beside_marks(out, by_family.get(PFC, ()))
    # per-peer evidence names the path; it replaces a host-counter suspect of the same cause
    for ps in _path_suspects(ev.paths, ev.endpoint_pools):
        same = [s for s in out if s.cause == ps.cause]
        for s in same:
            if {s.host} | set(s.link or ()) <= {ps.host} | set(ps.link or ()):
                ps.counters += s.counters
                out.remove(s)
        out.append(ps)
    slow = _slow_host(ev, nodes)
    if slow:
        info, score = slow
        host = info["host"]
        named = [s for s in out if s.host == host or host in (s.link or ())]
        if named:
            named[0].off_cpu = info
            named[0].score = min(1.0, named[0].score + OFF_CPU_BONUS * score)
        else:
            good = ("" if info["share_good"] is None
                    else f"; {info['share_good']:.0%} of the good steps")
            out.append(Suspect(
                SLOW_HOST, host=host, score=score, off_cpu=info,
                detail=f"the others waited for {host}'s rank: on its CPU {info['on_cpu_share']:.1%} of the loop "
                       f"against its peers' {info['peers_on_cpu_share']:.1%}, in {info['slow_steps_waited_for']} of "
                       f"{info['slow_steps']} slow steps ({info['share_slow']:.0%}{good})"
                       + (" with no congestion counter moving on it" if host not in ev.moved_hosts
                          else "; its counters moved, but no more than in the good steps")))
    if not out:
        lacking = "; ".join(x.split(":")[0] for x in ev.lacking)
        out.append(Suspect(UNEXPLAINED, lacking=list(ev.lacking),
                           detail="a regression with no evidence: no counter moved beyond its normal (the good steps' "
                                  "or the baseline's) by the count test, and no host's rank kept the others waiting "
                                  f"(on its CPU at most {MAX_ON_CPU_RATIO * 100:.0f} % as much as its peers) in most slow "
                                  "steps" + (f" (lacking: {lacking})" if lacking else "")))
    for s in out:
        s.lacking = s.lacking or list(ev.lacking)
    out.sort(key=lambda s: -s.score)
    return out


def rank(per_regression):
    """Merge [([regression labels], [Suspect])] into one list: the same suspect (cause, host, link,
    port, priority) named by several regressions keeps its best score and lists them all."""
    merged = {}
    for labels, suspects in per_regression:
        for s in suspects:
            m = merged.get(s.identity())
            if m is None:
                merged[s.identity()] = m = s
            elif s.score > m.score:
                s.regressions = m.regressions
                s.lacking = m.lacking + [x for x in s.lacking if x not in m.lacking]
                s.paths = s.paths or m.paths      # named from its paths by any regression: it has them
                merged[s.identity()] = m = s
            else:
                m.lacking = m.lacking + [x for x in s.lacking if x not in m.lacking]
                m.paths = m.paths or s.paths
            m.lacking = m.lacking[:MAX_LACKING]
            m.regressions += [x for x in labels if x not in m.regressions]
    _fold_across_regressions(merged)
    # an `unexplained` is only a suspect where nothing else explains anything
    if any(s.cause != UNEXPLAINED for s in merged.values()):
        merged = {k: s for k, s in merged.items() if s.cause != UNEXPLAINED}
    # equal scores (every slow step, one host alone, no good steps to compare): the larger movement
    # first (tens of TCP retransmissions beside tens of thousands of CE echoes are not the cause)
    return sorted(merged.values(), key=lambda s: (s.cause == UNEXPLAINED, -round(s.score, 2), -len(s.regressions),
                                                  -max((c.slow_delta for c in s.counters), default=0),
                                                  s.host or "", s.link or ()))


def _fold_across_regressions(merged):
    """suspects_of's rule -- per-peer evidence over host counters -- across regressions: each
    regression sees only the paths its op uses, so two of them can name one fault twice.
    1. A link named as the only lossy (or marked) path of one regression, that another names as
       one of several such paths of a host -- their common endpoint -- is that host's: a ring
       allreduce sends to one neighbour (measured: a 3 %-lossy host's allreduce named its one
       ring link, first, and its alltoall the host over 6 paths).
    2. A host named from its host counters alone, at one end of a link its paths named, is that
       link's (a lossy link's sender retransmits on its host counters too; measured: a 3 % lossy
       link named by its paths, and its sender by TCPTimeouts in another regression).
    What is folded goes, its regressions listed on what it folded into."""
    def fold(key, into):
        into.regressions += [x for x in merged[key].regressions if x not in into.regressions]
        del merged[key]

    for key, link in list(merged.items()):
        if link.link is None or not link.paths:
            continue
        pair = frozenset(link.link)
        for host in merged.values():
            if host.cause != link.cause or host.host not in pair or not host.paths:
                continue
            its_pairs = {frozenset((p.host, p.peer)) for p in host.paths}
            if len(its_pairs) >= 2 and pair in its_pairs:
                fold(key, host)
                break
    for key, host in list(merged.items()):
        if host.host is None or host.paths or host.port is not None or host.cause == UNEXPLAINED:
            continue
        for link in merged.values():
            if link.cause == host.cause and link.paths and link.link is not None and host.host in link.link:
                fold(key, link)
                break


class Cause(NamedTuple):
    """One cause class: the rule that names it from the evidence, what it means, where it is
    documented. Adding a cause is one entry here (and its family in congestion/counters.py when
    counters are its evidence: then its rule takes that family's qualifying CounterEvidence and
    returns a Suspect or None, and suspects_of calls it in this table's order)."""
    rule: Callable
    explanation: str
    docs: str
    from_counters: bool = False     # the rule reads the counters of the family of the same name


CAUSES = {
    CONGESTION: Cause(_congestion, "ECN marks and CNPs rising with the latency: queues on a path",
                      "docs/DIAGNOSIS.md#congestion-ecn-marks-and-cnps-rising-with-the-latency", True),
    PFC: Cause(_pfc, "pauses without ECN marks: the link layer stopped traffic",
               "docs/DIAGNOSIS.md#pfc-pauses-without-ecn-marks", True),
    LINK_ERRORS: Cause(_link_errors, "errors, losses and the retransmissions they cost: a bad cable, optics or link",
                       "docs/DIAGNOSIS.md#link_errors-a-bad-cable-optics-or-link", True),
    SLOW_HOST: Cause(_slow_host, "the others kept waiting for one host's rank, and no counter moved",
                     "docs/DIAGNOSIS.md#slow_host-the-others-kept-waiting-for-one-hosts-rank-and-no-counter-moved"),
    UNEXPLAINED: Cause(None, "a regression with no evidence", "docs/DIAGNOSIS.md#unexplained-a-regression-with-no-evidence"),
}
