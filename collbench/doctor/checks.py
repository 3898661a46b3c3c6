"""The verdict per host: `failed` (cannot take part: unreachable, a port or link down, no
interface), `degraded` (runs, but slower or lossier than it should: a setting that differs from
the config's expectation or from the other hosts, a combination known to hurt, stragglers and
failures in the latest results) or `healthy`. Each verdict carries its reasons.

Facts may come from another host (doctor.remote): every field is checked for its type here and
a field of the wrong type is as good as absent.
"""

import re
from collections import Counter
from dataclasses import dataclass, field

from collbench.bounded_repr import bounded_text

HEALTHY, DEGRADED, FAILED = "healthy", "degraded", "failed"
_RANK = {HEALTHY: 0, DEGRADED: 1, FAILED: 2}
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec(?:\s*\((\d+X)\b)?")
ROCE_V2 = "roce v2"


@dataclass
class Verdict:
    host: str
    verdict: str = HEALTHY
    reasons: list = field(default_factory=list)     # [(level, text)], level failed|degraded
    notes: list = field(default_factory=list)       # what could not be checked

    def add(self, level, text):
        self.reasons.append((level, text))
        if _RANK[level] > _RANK[self.verdict]:
            self.verdict = level

    def to_dict(self):
        return {"host": self.host, "verdict": self.verdict,
                "reasons": [{"level": lv, "reason": t} for lv, t in self.reasons], "notes": list(self.notes)}


def _d(v):
    return v if isinstance(v, dict) else {}


def _l(v):
    return v if isinstance(v, list) else []


def _i(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _s(v):
    return v if isinstance(v, str) else None


def _why(d, key):
    """' (why)' when a facts dict's `unreadable` says why `key` could not be read; else ''."""
    why = _s(_unreadable(d).get(key))
    return f" ({why})" if why else ""


def _unreadable(d):
    """{file: why} of what a host's facts could not read or found garbled (typed: remote facts)."""
    return {bounded_text(k, 80): bounded_text(x, 200) for k, x in _d(d.get("unreadable")).items()
            if isinstance(k, str) and isinstance(x, str)}


def _prios(v):
    """A {prio: 0/1} map of a facts file (JSON keys are strings) as {int: int}."""
    out = {}
    for k, x in _d(v).items():
        try:
            p = int(k)
        except (TypeError, ValueError):
            continue
        if 0 <= p <= 7 and _i(x) is not None:
            out[p] = x
    return out


def parse_rate(text):
    """(Gb/s, width such as '4X') of an RDMA port's `rate` ('100 Gb/sec (4X EDR)'); Nones when not."""
    m = _RATE.match(text or "")
    return (float(m.group(1)), m.group(2)) if m else (None, None)


class Peers:
    """One setting's values over the hosts (each host's distinct values counted once): a host
    differs when its value is not the one most hosts have (on a tie, when any other host has
    another value: which side is wrong cannot be told). One host alone has no peers."""

    def __init__(self, per_host):
        per_host = [{v for v in values if v is not None} for values in per_host]
        self.hosts = sum(1 for values in per_host if values)
        self.counts = Counter(v for values in per_host for v in values)
        top = self.counts.most_common(2)
        self.majority = top[0][0] if top and (len(top) == 1 or top[0][1] > top[1][1]) else None

    def others(self, value):
        """The other hosts' values (sorted, as text) when `value` differs from them; else None."""
        if value is None or self.hosts < 2 or len(self.counts) < 2 or value == self.majority:
            return None
        rest = [v for v in self.counts if v != value]
        return ", ".join(str(list(v) if isinstance(v, tuple) else v) for v in sorted(rest, key=str))


def traffic_priority(env, trust):
    """The priority the config's UCX_*/NCCL_IB_* settings send RoCE traffic on, with its source;
    (None, None) when they do not say. Traffic class = DSCP << 2 and priority = DSCP >> 3 (the
    default dscp2prio map) under DSCP trust; the service level is the priority under PCP trust."""
    for key in ("NCCL_IB_TC", "UCX_IB_TRAFFIC_CLASS"):
        v = env.get(key)
        if v is not None and str(v).isdigit() and int(v) < 256 and trust != "pcp":
            return int(v) >> 5, f"{key}={v}"
    for key in ("NCCL_IB_SL", "UCX_IB_SL"):
        v = env.get(key)
        if v is not None and str(v).isdigit() and int(v) < 16 and trust != "dscp":
            return int(v) % 8, f"{key}={v}"
    return None, None


def env_gid_index(env):
    for key in ("NCCL_IB_GID_INDEX", "UCX_IB_GID_INDEX"):
        v = env.get(key)
        if v is not None and str(v).isdigit():
            return int(v), f"{key}={v}"
    return None, None


def env_devices(env):
    """[(device, port or None, source)] the config's env names (NCCL_IB_HCA, UCX_NET_DEVICES)."""
    out = []
    hca = str(env.get("NCCL_IB_HCA") or "")
    if hca and not hca.startswith("^"):
        for item in hca.lstrip("=").split(","):
            name, _, port = item.strip().partition(":")
            if name:
                out.append((name, port or None, "NCCL_IB_HCA"))
    for item in str(env.get("UCX_NET_DEVICES") or "").split(","):
        name, _, port = item.strip().partition(":")
        if name and name != "all" and port:     # device:port is an RDMA device; a bare name a netdev
            out.append((name, port, "UCX_NET_DEVICES"))
    return out


def _pfc(d):
    """The PFC-enabled priorities of a netdev's facts (sorted), or None when unknown."""
    pfc = d.get("pfc")
    return sorted({p for p in pfc if _i(p) is not None and 0 <= p <= 7}) if isinstance(pfc, list) else None


def _setting(d, key):
    """A netdev's setting as a comparable, hashable value (None when absent or of the wrong type)."""
    if key == "trust":
        return _s(d.get(key))
    if key == "pfc":
        pfc = _pfc(d)
        return None if pfc is None else tuple(pfc)
    return _i(d.get(key))


class HostView:
    """One host's facts, typed: the values compared between hosts."""

    def __init__(self, facts):
        f = _d(facts)
        self.ports = [p for p in _l(f.get("rdma")) if isinstance(p, dict)]
        self.netdevs = {k: _d(v) for k, v in _d(f.get("netdevs")).items() if isinstance(k, str)}
        self.problems = [bounded_text(p, 300) for p in _l(f.get("problems")) if isinstance(p, str)]

    def mtus(self):
        """The MTUs of the interfaces that are up (a down one carries nothing)."""
        return {n: _i(v.get("mtu")) for n, v in self.netdevs.items()
                if (_s(v.get("operstate")) or "").lower() in ("up", "unknown")}

    def roce_v2_index(self):
        for p in self.ports:
            for g in _l(p.get("gids")):
                if isinstance(g, dict) and ROCE_V2 in (_s(g.get("type")) or "").lower() and _i(g.get("index")) is not None:
                    return g["index"]
        return None


def judge(hosts, cfg, results_by_host=None):
    """[Verdict] for [HostFacts] against cfg.doctor's expectations, cfg.env and each other."""
    exp, env = cfg.doctor, dict(cfg.env or {})
    views = {h.host: HostView(h.facts) for h in hosts if h.error is None}
    verdicts = []
    # what most hosts have: a host differing from it is named (its peers are the evidence)
    maj_mtu = Peers([v.mtus().values() for v in views.values()])
    rates = {h: [parse_rate(_s(p.get("rate"))) for p in v.ports] for h, v in views.items()}
    maj_rate = (Peers([[r[0] for r in rs] for rs in rates.values()]), Peers([[r[1] for r in rs] for rs in rates.values()]))
    maj_gid = Peers([[v.roce_v2_index()] for v in views.values()])
    per_dev = lambda key: Peers([[_setting(d, key) for d in v.netdevs.values()] for v in views.values()])
    maj = {k: per_dev(k) for k in ("trust", "pfc", "cnp_802p_prio", "cnp_dscp")}
    for h in hosts:
        v = Verdict(h.host)
        verdicts.append(v)
        if h.error is not None:
            v.add(FAILED, h.error)
            continue
        view = views[h.host]
        for problem in view.problems:     # the sysfs tree holds something that is not what it should
            v.add(DEGRADED, problem)
        if not view.netdevs:
            v.add(FAILED, "no network interface found (doctor.netdevs, sysfs_root)")
        for name, d in sorted(view.netdevs.items()):
            _netdev(v, name, d, exp, env, maj, maj_mtu, views)
        _ports(v, view, exp, env, rates[h.host], maj_rate, maj_gid, len(views))
        for level, text in (results_by_host or {}).get(h.host, []):
            v.add(level, text)
    return verdicts


def _netdev(v, name, d, exp, env, maj, maj_mtu, views):
    state = (_s(d.get("operstate")) or "").lower()
    if d.get("operstate") is None or state not in ("up", "unknown"):
        if d.get("chosen") == "all":     # not an RDMA port's, not named in the config: not ours to judge
            v.notes.append(f"{name}: {state or 'unreadable'} (not an RDMA interface; doctor.netdevs to check it)")
            return
        v.add(FAILED, f"{name}: link is {state or 'unreadable'} (operstate){_why(d, 'operstate')}")
    for key, why in sorted(_unreadable(d).items()):     # garbage or unreadable settings are findings
        if key not in ("mtu", "operstate"):
            v.add(DEGRADED, f"{name}: {key} unreadable ({why})")
    if _s(d.get("qos_unreadable")):
        v.add(DEGRADED, f"{name}: mlnx_qos output unreadable ({bounded_text(d['qos_unreadable'], 200)})")
    mtu = _i(d.get("mtu"))
    if mtu is None:
        v.add(DEGRADED, f"{name}: MTU unreadable{_why(d, 'mtu')}")
    elif exp.mtu is not None and mtu != exp.mtu:
        v.add(DEGRADED, f"{name}: MTU {mtu}, the config expects {exp.mtu}")
    elif maj_mtu.others(mtu):
        v.add(DEGRADED, f"{name}: MTU {mtu} differs from other hosts' {maj_mtu.others(mtu)} (the larger "
                        "side's packets are dropped or fragmented on the way)")
    trust, pfc = _s(d.get("trust")), _pfc(d)
    for key, want, have, shown in (("trust", exp.trust, trust, trust),
                                   ("pfc", exp.pfc_priorities, pfc, pfc),
                                   ("cnp_802p_prio", exp.cnp_802p_prio, _i(d.get("cnp_802p_prio")), _i(d.get("cnp_802p_prio"))),
                                   ("cnp_dscp", exp.cnp_dscp, _i(d.get("cnp_dscp")), _i(d.get("cnp_dscp")))):
        label = {"pfc": "PFC-enabled priorities", "trust": "trust mode"}.get(key, key)
        if have is None:
            if want is not None:
                v.add(DEGRADED, f"{name}: {label} unreadable, the config expects {want}")
            continue
        if want is not None and have != want:
            v.add(DEGRADED, f"{name}: {label} {shown}, the config expects {want}")
        elif want is None and maj[key].others(tuple(have) if isinstance(have, list) else have):
            other = maj[key].others(tuple(have) if isinstance(have, list) else have)
            v.add(DEGRADED, f"{name}: {label} {shown} differs from other hosts' {other}")
    np_, rp = _prios(d.get("ecn_np")), _prios(d.get("ecn_rp"))
    if not d.get("has_ecn"):
        if exp.ecn_priorities:
            v.add(DEGRADED, f"{name}: no ECN settings (ecn/roce_np, roce_rp), the config expects ECN on "
                            f"priorities {exp.ecn_priorities}")
        else:
            v.notes.append(f"{name}: no ECN settings to read (not an mlx5 RoCE interface)")
    else:
        ecn_on = sorted(p for p in range(8) if np_.get(p) == 1 and rp.get(p) == 1)
        for p in exp.ecn_priorities or ():
            off = [side for side, m in (("roce_np", np_), ("roce_rp", rp)) if m.get(p) != 1]
            if off:
                v.add(DEGRADED, f"{name}: ECN off on priority {p} ({', '.join(off)}), the config expects it on")
        if pfc is not None:
            for p in pfc:
                if p not in ecn_on:
                    off = [side for side, m in (("roce_np", np_), ("roce_rp", rp)) if m.get(p) != 1]
                    v.add(DEGRADED, f"{name}: PFC without ECN on priority {p} ({', '.join(off)} off): congestion "
                                    "pauses the link (head-of-line blocking, pause storms) instead of slowing the senders")
            prio, source = traffic_priority(env, trust or exp.trust)
            watched = set(exp.ecn_priorities or ()) | ({prio} if prio is not None else set())
            if not watched and not exp.pfc_priorities and len(ecn_on) < 8:
                watched = set(ecn_on)     # ECN set per priority by hand: those priorities carry RoCE
            for p in sorted(watched):
                if p in ecn_on and p not in pfc:
                    v.add(DEGRADED, f"{name}: ECN on priority {p} without PFC"
                                    + (f" (the traffic's priority, {source})" if p == prio else "")
                                    + ": a burst beyond the marking threshold drops packets (RoCE retransmits "
                                      "go-back-N)")
        else:
            v.notes.append(f"{name}: PFC and trust unknown (no mlnx_qos output)")


def _ports(v, view, exp, env, rates, maj_rate, maj_gid, n_hosts):
    names = {_s(p.get("device")) for p in view.ports}
    for dev, port, source in env_devices(env):
        if dev not in names and view.ports:
            v.add(FAILED, f"the config's {source} names {dev}, which this host does not have")
    want_gid, gid_source = (exp.gid_index, "doctor.gid_index") if exp.gid_index is not None else env_gid_index(env)
    for p, (gbps, width) in zip(view.ports, rates):
        label = f"{_s(p.get('device'))} port {_s(p.get('port'))}"
        state, phys = _s(p.get("state")) or "", _s(p.get("phys_state")) or ""
        if "ACTIVE" not in state.upper():
            v.add(FAILED, f"{label}: state {state or 'unreadable'}{_why(p, 'state')}")
        ethernet = (_s(p.get("link_layer")) or "Ethernet").lower() == "ethernet"
        for key, why in sorted(_unreadable(p).items()):
            if key not in ("state", "rate") and (ethernet or not key.startswith("gid")):
                v.add(DEGRADED, f"{label}: {key} unreadable ({why})")
        if phys and "LINKUP" not in phys.upper().replace(" ", ""):
            v.add(FAILED, f"{label}: physical state {phys}")
        if gbps is None:
            v.add(DEGRADED, f"{label}: rate unreadable ({(_s(p.get('rate')) or '')[:40]!r}){_why(p, 'rate')}")
        else:
            if exp.link_gbps is not None and gbps != exp.link_gbps:
                v.add(DEGRADED, f"{label}: {gbps:g} Gb/s, the config expects {exp.link_gbps:g}")
            elif exp.link_gbps is None and maj_rate[0].others(gbps):
                v.add(DEGRADED, f"{label}: {gbps:g} Gb/s, other hosts' ports run at {maj_rate[0].others(gbps)}")
            if exp.link_width and width and width != exp.link_width:
                v.add(DEGRADED, f"{label}: width {width}, the config expects {exp.link_width}")
            elif not exp.link_width and maj_rate[1].others(width):
                v.add(DEGRADED, f"{label}: width {width}, other hosts' ports are {maj_rate[1].others(width)}")
        if (_s(p.get("link_layer")) or "Ethernet").lower() != "ethernet":
            continue
        gids = {g["index"]: g for g in _l(p.get("gids")) if isinstance(g, dict) and _i(g.get("index")) is not None}
        v2 = sorted(i for i, g in gids.items() if ROCE_V2 in (_s(g.get("type")) or "").lower())
        if not v2:
            v.add(DEGRADED, f"{label}: no RoCE v2 GID (no IP address on its netdev?)")
        elif want_gid is not None and want_gid not in v2:
            have = gids.get(want_gid)
            v.add(DEGRADED, f"{label}: GID index {want_gid} ({gid_source}) is "
                            + (f"{_s(have.get('type')) or 'of no type'}" if have else "empty")
                            + f", the RoCE v2 GIDs are at {v2}")
        elif want_gid is None and maj_gid.others(v2[0]):
            v.add(DEGRADED, f"{label}: first RoCE v2 GID at index {v2[0]}, other hosts' at {maj_gid.others(v2[0])} "
                            "(one GID index in the job's settings cannot suit both)")
