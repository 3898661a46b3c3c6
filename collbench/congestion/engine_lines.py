"""The built-in engine's CBCONG lines (engines/engine_counters.c) -> the record's
`congestion` field. A line is checked like any outside input: a damaged one is ignored (the step
keeps its result, without the field)."""

import json
import math

from collbench.congestion import record_field
from collbench.congestion.deltas import FAULTS, HostDelta

PREFIX = "CBCONG "
MAX_HOSTS = 65536
MAX_MOVED_PER_HOST = 64
MAX_PATHS_PER_HOST = 64 * 40     # engine_paths.c: PATH_MAX_PEERS peers, 9 tcp + 31 QP counters each
_MAX_VALUE = (1 << 64) - 1


def _count(v, hi=_MAX_VALUE):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi


def _seconds(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1e12


def _host_paths(h):
    """A host's per-peer counters ("p": {"<peer>|<counter>": n}, engine_paths.c) and the peers it
    left out ("pd"): ({}, 0) without them, None when damaged."""
    if "p" not in h:
        return {}, 0
    p = h["p"]
    if (not isinstance(p, dict) or len(p) > MAX_PATHS_PER_HOST
            or not all(isinstance(k, str) and "|" in k and len(k) <= 400 and _count(v) for k, v in p.items())
            or not all(_count(h.get(k, 0)) for k in ("ps", "pd", "pf")) or not _seconds(h.get("pus", 0))):
        return None
    return dict(p), h.get("pd", 0)


def _host_delta(h):
    if not isinstance(h, dict):
        return None
    f, d = h.get("f"), h.get("d")
    if (not _seconds(h.get("dt")) or not _count(h.get("n")) or not _count(h.get("src"))
            or not isinstance(f, list) or len(f) != len(FAULTS) or not all(_count(x) for x in f)
            or not isinstance(d, dict) or len(d) > MAX_MOVED_PER_HOST or not _count(h.get("drop", 0))
            or not all(isinstance(k, str) and _count(v) for k, v in d.items())):
        return None
    if "r" in h and not _count(h["r"], 1 << 31):
        return None
    paths = _host_paths(h)
    if paths is None:
        return None
    return (HostDelta(dict(d), {name: n for name, n in zip(FAULTS, f) if n}, h["n"], float(h["dt"]), h["src"]),
            h.get("drop", 0), h.get("r"), paths)


def parse_line(line):
    """The payload of a CBCONG line: {"loop", "step", "t0", "t1", "hosts": {host: HostDelta},
    "dropped": n}, or None for any other line (or a damaged one)."""
    line = line.strip()
    if not line.startswith(PREFIX):
        return None
    try:
        p = json.loads(line[len(PREFIX):])
    except ValueError:
        return None
    if (not isinstance(p, dict) or not _count(p.get("loop"), 1 << 31) or not _count(p.get("step"), 1 << 31)
            or not _seconds(p.get("t0")) or not _seconds(p.get("t1")) or not isinstance(p.get("hosts"), dict)
            or len(p["hosts"]) > MAX_HOSTS):
        return None
    hosts, dropped, readers, paths = {}, 0, {}, {}
    for name, h in p["hosts"].items():
        got = _host_delta(h)
        if got is None:
            return None
        hosts[name], drop, rank, (host_paths, paths_dropped) = got
        dropped += drop + paths_dropped
        if rank is not None:
            readers[name] = rank
        if "p" in h:
            paths[name] = host_paths
    out = {"loop": p["loop"], "step": p["step"], "t0": float(p["t0"]), "t1": float(p["t1"]),
           "hosts": hosts, "dropped": dropped, "readers": readers}
    if paths:
        out["paths"] = paths
    return out


def rank_hosts(cfg):
    """The config's host of every rank, where the config decides it (hosts_order, or mpirun's fill
    of the hostfile's slots / ranks_per_node in order); None where it does not (srun, this machine
    only, an oversubscribed wrap-around)."""
    if getattr(cfg, "hosts_order", None):
        return list(cfg.hosts_order)
    if cfg.launcher != "mpirun" or getattr(cfg, "implicit_hosts", False):
        return None
    out = []
    for h in cfg.hosts:
        out += [h.name] * (cfg.ranks_per_node or h.slots)
        if len(out) >= cfg.ranks:
            return out[:cfg.ranks]
    return None


def _names(payload, record_hosts, ranks):
    """{MPI's name: the record's} through each reader's rank, when that maps readers one to one
    onto the record's hosts (the config's, e.g. the hostfile's addresses); else None."""
    hosts, readers = payload["hosts"], payload.get("readers") or {}
    if not ranks or not record_hosts or set(readers) != set(hosts):
        return None
    names = {m: ranks[r] for m, r in readers.items() if r < len(ranks)}
    if len(names) != len(hosts) or len(set(names.values())) != len(names) or not set(names.values()) <= set(record_hosts):
        return None
    return names


def _renamed(payload, names):
    """{record host: HostDelta}: MPI's names replaced by the record's (_names), else as they are."""
    hosts = payload["hosts"]
    return {names[m]: d for m, d in hosts.items()} if names else hosts


def _renamed_paths(payload, names):
    """{record host: {"<peer>|<counter>": n}}: hosts and the peers the engine named by their host
    renamed like the hosts (a peer the engine knew only by its address keeps it)."""
    out = {}
    for host, entries in (payload.get("paths") or {}).items():
        mine = {}
        for k, v in entries.items():
            peer, _, counter = k.rpartition("|")
            mine[f"{(names or {}).get(peer, peer)}|{counter}"] = v
        out[(names or {}).get(host, host)] = mine
    return out


def record_congestion(payload, record_hosts=None, xmit_wait_tick_ns=None, ranks=None):
    """The record's `congestion` field from a parsed CBCONG payload (ranks: rank_hosts(cfg))."""
    kw = {} if xmit_wait_tick_ns is None else {"xmit_wait_tick_ns": xmit_wait_tick_ns}
    names = _names(payload, record_hosts, ranks)
    if "paths" in payload:
        kw["paths"] = _renamed_paths(payload, names)
    return record_field.build(_renamed(payload, names), payload["t0"], payload["t1"],
                              source="engine", hosts=record_hosts, dropped=payload["dropped"], **kw)
