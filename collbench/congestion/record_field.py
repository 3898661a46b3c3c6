"""The `congestion` field of a result or failure record (docs/LOG_FORMAT.md, "congestion"):
built from per-host deltas, bounded, and validated for every reader (results/record_parser.py).

    "congestion": {
      "source": "engine",                      # engine: per step, per host; osu-run: around one
                                               #   whole OSU run, the launching host only
      "t_start": 1764140000.123, "t_end": 1764140000.456,   # the step's wall-clock window
      "hosts_read": 4,                         # hosts whose counters were read
      "moved": {"h2|np_ecn_marked_roce_packets@mlx5_0/1": 1200,
                "h2|rx_prio3_pause@ens1f0np0": 40, ...},    # "<host>|<counter>@<where>": delta
      "totals": {"np_ecn_marked_roce_packets": 1200, ...},  # per counter, over hosts and places
      "lost": {"h2|rx_prio3_pause_duration@ens1f0np0": 0.12}, # fraction of the window paused
      "xmit_wait_tick_ns": 8.0,                # the port_xmit_wait tick the fractions used
      "skipped": {"h3": 2},                    # counters skipped on a host (faults)
      "faults": {"vanished": 1, "backwards": 1},            # skipped, by kind (deltas.FAULTS)
      "unread": ["h4"],                        # hosts whose counters could not be read at all
      "dropped": 0,                            # moved counters left out by the bounds
      "paths": {"h3>h1|tcp_retrans_segs": 41,  # per peer: "<host>><peer>|<counter>": the step's
                "h3>h1|tcp_rtt_us_max": 812.0, # delta (gauges: their value at the step's end);
                "h3>h2|qp_out_of_sequence": 3} #   counters.PATH_COUNTERS; {} when read and quiet
    }

Only what moved is kept; a host where nothing moved appears nowhere but in hosts_read. Bounds:
MAX_PER_HOST moved counters per host (the largest deltas), MAX_MOVED and MAX_LOST per record;
what they leave out is counted in "dropped". "paths" (engine_paths.c) holds only the peers that
were active in the step (sent segments, retransmitted, a QP counter moved), at most MAX_PATHS
entries, the most retransmitting paths first; a host whose sockets were read and were quiet
adds nothing. Eight containers per record whatever the number of hosts (the parser allows 64
per line), and at most ~0.5 MB at 1024 hosts, ~0.75 MB with full paths (lines: 1 MiB).
"""

import math
import re

from collbench.congestion.deltas import FAULTS
from collbench.congestion.keys import KEY, split
from collbench.congestion.lost_time import DEFAULT_XMIT_WAIT_TICK_NS, lost

SOURCES = ("engine", "osu-run")
MAX_PER_HOST = 32
MAX_MOVED = 4096
MAX_LOST = 2048
MAX_HOST_ENTRIES = 4096        # skipped / unread entries
MAX_TOTALS = 1024
MAX_HOSTS_READ = 1 << 20
MAX_HOST_NAME = 255            # a DNS name; MPI's processor names are shorter
MAX_INT = (1 << 63) - 1
MAX_TS = float(1 << 34)
MAX_PATHS = 4096               # ~60 bytes each: ~0.25 MB
MAX_PATH_VALUE = float(1 << 62)
MAX_FUTURE_FIELDS = 16         # fields of later versions a reader passes over
FIELDS = ("source", "t_start", "t_end", "hosts_read", "moved", "totals", "lost", "xmit_wait_tick_ns",
          "skipped", "faults", "unread", "dropped", "paths")
_NAME = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")
_HOST = re.compile(r"[^\x00-\x20\x7f-\x9f|]{1,255}")
_PATH_END = r"[^\x00-\x20\x7f-\x9f|>]{1,255}"
PATH_KEY = re.compile(rf"({_PATH_END})>({_PATH_END})\|(tcp_[a-z_]{{1,40}}|qp_[A-Za-z0-9_]{{1,40}})")
_GAUGE_MAX = "_max"     # counters whose value is a largest reading (a float), not a count


def record_host(name, hosts):
    """The record's name for a host the engine named (MPI's processor name): the same name, else
    the record host whose short name (before the first dot) matches, else the name itself."""
    if not hosts or name in hosts:
        return name
    short = name.split(".", 1)[0]
    for h in hosts:
        if h.split(".", 1)[0] == short:
            return h
    return name


def path_key(k):
    """(host, peer, counter) of a paths key "<host>><peer>|<counter>", or None."""
    m = PATH_KEY.fullmatch(k) if isinstance(k, str) else None
    return m.groups() if m else None


def _paths(host_paths, hosts, only):
    """The field's "paths" from {host: {"<peer>|<counter>": n}} and the entries left out. A
    counter at 0 is left out (readers take it as 0): most of a step's per-peer counters do not
    move, and they were half the stress loop's ~6 KB a step."""
    entries, retrans = [], {}
    for name in sorted(host_paths):
        host = only or record_host(name, hosts)
        for k, v in host_paths[name].items():
            if v == 0:
                continue
            peer, _, counter = k.rpartition("|")
            path = f"{host}>{record_host(peer, hosts)}"
            entries.append((path, counter, v))
            if counter == "tcp_retrans_segs":
                retrans[path] = v
    # the bound keeps whole paths, the most retransmitting first
    entries.sort(key=lambda e: (-retrans.get(e[0], 0), e[0], e[1]))
    out, dropped = {}, 0
    for path, counter, v in entries:
        key = f"{path}|{counter}"
        if len(out) >= MAX_PATHS or not PATH_KEY.fullmatch(key):
            dropped += 1
            continue
        out[key] = float(v) if counter.endswith(_GAUGE_MAX) else min(int(v), MAX_INT)
    return out, dropped


def build(host_deltas, t_start, t_end, source="engine", hosts=None,
          xmit_wait_tick_ns=DEFAULT_XMIT_WAIT_TICK_NS, unread=(), dropped=0, paths=None):
    """The field from {host: deltas.HostDelta}; hosts: the record's `hosts` (names mapped to them);
    paths: {host: {"<peer>|<counter>": n}} read per peer (engine_paths.c), None when not read."""
    moved, lost_all, totals, skipped, faults = {}, {}, {}, {}, {}
    unread = list(unread)
    hosts_read = 0
    # one host read and one host in the record: the same machine, whatever each calls it
    # (a local run's record says "localhost", MPI says the machine's name)
    only = hosts[0] if hosts and len(hosts) == 1 and len(host_deltas) == 1 else None
    for name in sorted(host_deltas):
        d = host_deltas[name]
        host = only or record_host(name, hosts)
        if not _HOST.fullmatch(host):
            dropped += len(d.moved)
            continue
        if d.sources_read <= 0:
            unread.append(host)
            continue
        hosts_read += 1
        n_faults = sum(d.faults.values())
        if n_faults:
            skipped[host] = skipped.get(host, 0) + n_faults
            for f, n in d.faults.items():
                faults[f] = faults.get(f, 0) + n
        kept = sorted(d.moved.items(), key=lambda kv: (-kv[1], kv[0]))
        dropped += max(0, len(kept) - MAX_PER_HOST)
        kept = dict(kept[:MAX_PER_HOST])
        for k, v in kept.items():
            if not KEY.fullmatch(k):
                dropped += 1
                continue
            if len(moved) >= MAX_MOVED:
                dropped += 1
                continue
            moved[f"{host}|{k}"] = min(v, MAX_INT)
            name_only = split(k)[0]
            if name_only in totals or len(totals) < MAX_TOTALS:
                totals[name_only] = min(MAX_INT, totals.get(name_only, 0) + v)
        for k, f in lost(kept, d.seconds, xmit_wait_tick_ns).items():
            if len(lost_all) < MAX_LOST and KEY.fullmatch(k):
                lost_all[f"{host}|{k}"] = f
    field = {"source": source, "t_start": round(t_start, 6), "t_end": round(max(t_end, t_start), 6),
             "hosts_read": hosts_read, "moved": moved, "totals": dict(sorted(totals.items()))}
    if lost_all:
        field["lost"] = lost_all
        field["xmit_wait_tick_ns"] = float(xmit_wait_tick_ns)
    if skipped:
        field["skipped"] = dict(list(skipped.items())[:MAX_HOST_ENTRIES])
        field["faults"] = faults
    if unread:
        field["unread"] = sorted(set(unread))[:MAX_HOST_ENTRIES]
    if paths is not None:
        field["paths"], left_out = _paths(paths, hosts, only)
        dropped += left_out
    if dropped:
        field["dropped"] = dropped
    return field


def host_of(record_key):
    """(host, counter key) of a record key "<host>|<counter>@<where>"."""
    host, _, k = record_key.rpartition("|")
    return host, k


def path_items(field):
    """(host, peer, counter, value) of a valid field's per-peer counters (none in a field written
    before they existed); a caller's unchecked dict gives no traceback either."""
    paths = field.get("paths") if isinstance(field, dict) else None
    for k, v in (paths.items() if isinstance(paths, dict) else ()):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        parts = path_key(k)
        if parts is None or not (math.isfinite(v) and 0 <= v <= MAX_PATH_VALUE) or parts[0] == parts[1]:
            continue
        yield (*parts, v)


def path_loss_items(field):
    """path_items with each path's tcp_retrans_segs net of its tcp_dsack_dups (the segments the
    peer reported it already had: spurious retransmissions, as a late ACK's tail-loss probe sends
    by the thousand on a loaded machine, docs/CONGESTION.md), never below 0; a field without
    tcp_dsack_dups (an older engine) keeps the raw count. What diagnose and the baseline's normal
    weigh as loss."""
    items = list(path_items(field))
    dsack = {(h, p): v for h, p, name, v in items if name == "tcp_dsack_dups"}
    for h, p, name, v in items:
        if name == "tcp_retrans_segs" and (h, p) in dsack:
            v = max(0, v - dsack[(h, p)])
        yield h, p, name, v


# ---------------------------------------------------------------- validation (every reader)

def _what(v):
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object", type(None): "null"}.get(type(v), "a value")


def _int(key, v, lo, hi=MAX_INT):
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"{key}: expected a whole number from {lo} to {hi}, got {_what(v)}")


def _num(key, v, lo, hi):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"{key}: expected a number from {lo:g} to {hi:g}, got {_what(v)}")


def _obj(key, v, limit):
    if not isinstance(v, dict):
        raise ValueError(f"{key}: expected an object, got {_what(v)}")
    if len(v) > limit:
        raise ValueError(f"{key}: {len(v)} entries (at most {limit})")


def _record_key(key, k):
    host, sep, ck = k.rpartition("|")
    if not sep or not _HOST.fullmatch(host) or not KEY.fullmatch(ck):
        raise ValueError(f"{key}: key is not '<host>|<counter>@<where>'")


def validate(v, key="congestion"):
    """None when v is a valid `congestion` field; ValueError naming the part that is not."""
    # A field this version does not know is a later version's (as `paths` was to the one before
    # it): ignored, so a newer writer's log stays readable; only the object's size is bounded.
    _obj(key, v, len(FIELDS) + MAX_FUTURE_FIELDS)
    for k in v:
        if k not in FIELDS and not _NAME.fullmatch(k):
            raise ValueError(f"{key}: field name {_what(k)} is not a field name")
    for k in ("source", "t_start", "t_end", "moved"):
        if k not in v:
            raise ValueError(f"{key}.{k}: missing")
    if v["source"] not in SOURCES or not isinstance(v["source"], str):
        raise ValueError(f"{key}.source: expected one of {', '.join(SOURCES)}")
    _num(f"{key}.t_start", v["t_start"], 0.0, MAX_TS)
    _num(f"{key}.t_end", v["t_end"], 0.0, MAX_TS)
    if v["t_end"] < v["t_start"]:
        raise ValueError(f"{key}.t_end: before t_start")
    if "hosts_read" in v:
        _int(f"{key}.hosts_read", v["hosts_read"], 0, MAX_HOSTS_READ)
    _obj(f"{key}.moved", v["moved"], MAX_MOVED)
    for k, d in v["moved"].items():
        _record_key(f"{key}.moved", k)
        _int(f"{key}.moved", d, 1)
    if "totals" in v:
        _obj(f"{key}.totals", v["totals"], MAX_TOTALS)
        for k, d in v["totals"].items():
            if not _NAME.fullmatch(k):
                raise ValueError(f"{key}.totals: key is not a counter name")
            _int(f"{key}.totals", d, 1)
    if "lost" in v:
        _obj(f"{key}.lost", v["lost"], MAX_LOST)
        for k, f in v["lost"].items():
            _record_key(f"{key}.lost", k)
            _num(f"{key}.lost", f, 0.0, 1.0)
    if "xmit_wait_tick_ns" in v:
        _num(f"{key}.xmit_wait_tick_ns", v["xmit_wait_tick_ns"], 1e-6, 1e6)
    if "skipped" in v:
        _obj(f"{key}.skipped", v["skipped"], MAX_HOST_ENTRIES)
        for h, n in v["skipped"].items():
            if not _HOST.fullmatch(h):
                raise ValueError(f"{key}.skipped: key is not a host name")
            _int(f"{key}.skipped", n, 1)
    if "faults" in v:
        _obj(f"{key}.faults", v["faults"], len(FAULTS))
        for f, n in v["faults"].items():
            if f not in FAULTS:
                raise ValueError(f"{key}.faults: expected keys {', '.join(FAULTS)}")
            _int(f"{key}.faults", n, 1)
    if "unread" in v:
        u = v["unread"]
        if not isinstance(u, list) or len(u) > MAX_HOST_ENTRIES:
            raise ValueError(f"{key}.unread: expected an array of at most {MAX_HOST_ENTRIES} host names")
        for h in u:
            if not isinstance(h, str) or not _HOST.fullmatch(h):
                raise ValueError(f"{key}.unread: expected host names, got {_what(h)}")
    if "dropped" in v:
        _int(f"{key}.dropped", v["dropped"], 0)
    if "paths" in v:
        _obj(f"{key}.paths", v["paths"], MAX_PATHS)
        for k, n in v["paths"].items():
            parts = path_key(k)
            if parts is None or parts[0] == parts[1]:
                raise ValueError(f"{key}.paths: key is not '<host>><peer>|<counter>' (tcp_* or qp_*) "
                                 f"with two different hosts")
            _num(f"{key}.paths", n, 0.0, MAX_PATH_VALUE)
