"""Which hosts' congestion counters moved most during a step: the one choice every view makes
(once/sweep tables, report's heat map, stress log, the exporter's top series), from a record's
`congestion` field (record_field.py).

Only congestion *signals* count: the counters that measure traffic rather than trouble
(VOLUME: ECT-capable packets received, packets delivered) move on every host of every step
and name nothing. Counters differ in unit (packets, microseconds, ticks), so hosts are not
ranked by raw sums: each host's signal counters are weighed by the host's *share* of that
counter's movement over all hosts, and a host ranks by its leading counter, the one with the
largest share (ties: the larger delta). A host alone in a counter holds all of it: the marked
sender's TCPDeliveredCE, or the incast receiver's np_ecn_marked_roce_packets, where each peer
holds only a part of the other side's counter (InCEPkts, rp_cnp_handled). That names the end
of the congested path where the signal concentrates; its side (counters.SIDES) says whether the
path runs into the host (np) or out of it (rp), or is its own link.
"""

from functools import lru_cache
from typing import NamedTuple

from collbench.congestion import counters
from collbench.congestion.keys import split
from collbench.congestion.record_field import host_of

# counted on every packet of every flow: how much traffic, not whether it was congested
VOLUME = frozenset({"InECT0Pkts", "InECT1Pkts", "InNoECTPkts", "TCPDelivered"})
MAX_K = 16          # the most hosts any view asks for (exporter.congestion_top_k's bound)

# TCP loss recovery that every busy host shows: below this share of the packets the host moved in
# the step, retransmissions and out-of-order arrivals are no evidence (a loaded veth or NIC loses
# or reorders a few). The packets are counted on the counter's side, at the same place: a sender's
# retransmissions against what it delivered (TCPDelivered), a receiver's out-of-order queueing
# against what it received (IpExt In*Pkts: every IP packet has one ECN codepoint) -- a receiving
# leaf of a bcast delivers almost nothing itself. The one rule for every view: the exporter's top
# host (and so the CollbenchLatencyShift alert's suspect) and `collbench diagnose` both read
# signals() below.
TCP_RETRANS = frozenset({"TCPFastRetrans", "TCPLostRetransmit", "TCPSlowStartRetrans", "TCPOFOQueue",
                         "TCPSpuriousRTOs", "TCPRetransFail"})
TCP_RECEIVED = frozenset({"TCPOFOQueue"})                 # of those, counted by the receiver
RECEIVED = ("InNoECTPkts", "InECT0Pkts", "InECT1Pkts", "InCEPkts")
ROUTINE_RETRANS_SHARE = 0.01


def routine_retransmits(name, delta, packets):
    """True when `delta` of TCP retransmission counter `name` is routine loss recovery beside the
    `packets` the host moved on that side (None: unknown, never routine)."""
    return (name in TCP_RETRANS and isinstance(packets, int) and not isinstance(packets, bool)
            and delta < ROUTINE_RETRANS_SHARE * packets)


class HostMoved(NamedTuple):
    host: str
    counter: str     # the leading counter's key, "<counter>@<where>"
    delta: int       # its delta during the step
    share: float     # its share (0..1] of that counter's delta summed over hosts
    signals: int     # congestion signal counters that moved on the host
    side: str        # counters.NP / RP / LINK of the leading counter ("" when the table has no row)


def _side(name):
    for source in counters.SOURCES:
        row = counters.lookup(source, name)
        if row is not None:
            return row.side
    return ""


@lru_cache(maxsize=1 << 16)
def _parts(record_key):
    """(host, counter key, the record keys of the packets its routine share is of, or None) of a
    signal's record key "<host>|<counter>@<where>"; None for a traffic counter. Cached: the same few
    thousand keys come back in every step, and the cached strings are shared by every step that
    holds them."""
    host, k = host_of(record_key)
    name, where = split(k)
    if name in VOLUME:
        return None
    if name in TCP_RECEIVED:
        return host, k, tuple(f"{host}|{r}@{where}" for r in RECEIVED)
    return host, k, (f"{host}|TCPDelivered@{where}",) if name in TCP_RETRANS else None


def _packets(moved, keys):
    """The packets of `keys` in a step's moved counters (None when none of them moved)."""
    got = [moved[key] for key in keys if type(moved.get(key)) is int]
    return sum(got) if got else None


def signal_items(field):
    """(host, counter key, delta) of every congestion signal in a valid `congestion` field (None or
    a field without moved counters: none); routine TCP retransmissions left out."""
    for host, k, delta, routine in flagged_signal_items(field):
        if not routine:
            yield host, k, delta


def flagged_signal_items(field):
    """(host, counter key, delta, routine) of every congestion signal in a valid `congestion`
    field: routine True for TCP retransmissions within routine loss recovery (a counter's normal
    counts them; the evidence of a slow step does not)."""
    moved = field.get("moved") if isinstance(field, dict) else None
    for rk, delta in (moved.items() if isinstance(moved, dict) else ()):
        # record_parser validated the field; a caller's unchecked dict is still no traceback
        if type(rk) is not str or type(delta) is not int or delta <= 0:
            continue
        parts = _parts(rk)
        if parts is None:
            continue
        host, k, volume = parts
        routine = volume is not None and routine_retransmits(split(k)[0], delta, _packets(moved, volume))
        yield host, k, delta, routine


def signals(field):
    """{host: {counter key: delta}} of the congestion signals in a valid `congestion` field
    (None or a field without moved counters: {}); routine TCP retransmissions left out."""
    out = {}
    for host, k, delta in signal_items(field):
        out.setdefault(host, {})[k] = delta
    return out


def ranked(field, k=None):
    """HostMoved rows of the hosts whose signal counters moved, best first (k: the first k)."""
    per_host = signals(field)
    total = {}
    for moved in per_host.values():
        for key, d in moved.items():
            name = split(key)[0]
            total[name] = total.get(name, 0) + d
    rows = []
    for host, moved in per_host.items():
        key, d = max(moved.items(), key=lambda kv: (kv[1] / total[split(kv[0])[0]], kv[1], kv[0]))
        name = split(key)[0]
        rows.append(HostMoved(host, key, d, d / total[name], len(moved), _side(name)))
    rows.sort(key=lambda r: (-r.share, -r.delta, r.host))
    return rows if k is None else rows[:k]


def top(field):
    """The HostMoved of the host whose counters moved most, or None when no signal moved."""
    rows = ranked(field, 1)
    return rows[0] if rows else None


def top_host(field):
    """The name of the host whose counters moved most, or None."""
    row = top(field)
    return row.host if row else None


def label(field):
    """Short text for a table cell: "h2 TCPDeliveredCE=3021", "" when nothing moved."""
    row = top(field)
    return "" if row is None else f"{row.host} {split(row.counter)[0]}={row.delta}"


# ------------------------------------------------------------- the tables' column (once, sweep)

COLUMN_KEY = "congested"
COLUMN_NOTE = ("congested: the host whose congestion counters moved most during the step, its leading "
               "counter and delta (docs/CONGESTION.md, reading the views)")


def table_column(records):
    """The once/sweep tables' column naming, per step, the host whose counters moved most
    (collbench/tables.py Column, row key COLUMN_KEY: cell(record)); None when no step of
    `records` moved a congestion signal, so a quiet run's table stays as it was."""
    from collbench.tables import Column
    if not any(top(r.get("congestion")) for r in records if isinstance(r, dict)):
        return None
    return Column(COLUMN_KEY, "congested (most moved)", align="left")


def cell(record):
    """The column's cell of one record: label() of its congestion field, "-" when none moved."""
    return label(record.get("congestion")) or "-"
