"""The one definition of "the congestion counters": every counter collbench reads around a step
and the exporter's collectors describe, with what it counts, on which side of a flow, in which
unit. docs/CONGESTION.md is this table in prose.

Sources:
  rdma_hw    <sysfs>/class/infiniband/<dev>/ports/<port>/hw_counters/<name>  (driver counters)
  rdma_port  <sysfs>/class/infiniband/<dev>/ports/<port>/counters/<name>     (IB PMA counters)
  ethtool    `ethtool -S <netdev>` statistics (SIOCETHTOOL), mlx5 names
  netstat    /proc/net/netstat (per network namespace), section IpExt or TcpExt

Per-path counters (PATH_COUNTERS, the record's congestion.paths "<host>><peer>|<counter>"):
  tcp_info   the kernel's tcp_info of each TCP socket (netlink inet_diag), summed per peer
  rdma_qp    per-QP counters (`rdma statistic qp`) of the QPs to each peer (`rdma res show qp`)

Sides (the diagnosis names the congested *path*, not only the host whose counter moved):
  np     notification point: the receiver of a congested flow (it saw the ECN marks, sent CNPs)
  rp     reaction point: the sender of a congested flow (it got CNPs / ECE and slowed down)
  link   the local port / link itself (pauses, waits, discards, errors): this host's own link

Families: each row states the cause a movement of the counter is evidence of (FAMILIES; the
diagnosis's cause classes, collbench/diagnose/ranking.py CAUSES), or TRAFFIC for the counters
that measure how much moved rather than trouble (the denominators of routine loss). A row
without a family is refused (tests/test_diagnose_causes.py): never silently filed as a cause.
"""

from typing import NamedTuple

NP, RP, LINK = "np", "rp", "link"
CONGESTION, PFC, LINK_ERRORS, TRAFFIC = "congestion", "pfc", "link_errors", "traffic"
FAMILIES = {CONGESTION: "ECN marks, CNPs, CE echoes: queues on a path and the senders' reaction",
            PFC: "link-level pauses, blocked transmit time, receive buffers that could not drain",
            LINK_ERRORS: "errors, losses and the retransmissions they cost: a bad cable, optic or link",
            TRAFFIC: "how much moved (no evidence on its own: the packets a loss or mark share is of)"}
SIDES = {NP: "notification point (receiver of the congested flow)",
         RP: "reaction point (sender of the congested flow)",
         LINK: "this host's own port or link"}
SOURCES = ("rdma_hw", "rdma_port", "ethtool", "netstat")
PRIORITIES = range(8)


class Counter(NamedTuple):
    name: str        # the counter's own name, as the source spells it
    source: str      # one of SOURCES (PATH_SOURCES for PATH_COUNTERS)
    side: str        # NP, RP or LINK
    family: str      # one of FAMILIES: the cause its movement is evidence of
    unit: str        # packets, frames, events, microseconds, ticks, words, ...
    meaning: str
    section: str = ""   # netstat only: IpExt or TcpExt


def _rows():
    rows = [
        # RDMA hw_counters (mlx5 RoCE congestion control, DCQCN)
        Counter("np_ecn_marked_roce_packets", "rdma_hw", NP, CONGESTION, "packets",
                "RoCE packets received with ECN CE set: a switch on the path into this host marked them"),
        Counter("np_cnp_sent", "rdma_hw", NP, CONGESTION, "packets",
                "CNPs this host sent back to senders after receiving CE-marked packets"),
        Counter("rp_cnp_handled", "rdma_hw", RP, CONGESTION, "packets",
                "CNPs this host received and acted on: it slowed its sending (a path out of it is congested)"),
        Counter("rp_cnp_ignored", "rdma_hw", RP, CONGESTION, "packets",
                "CNPs this host received and ignored (congestion control off for the priority)"),
        Counter("out_of_sequence", "rdma_hw", NP, LINK_ERRORS, "packets",
                "packets received out of sequence: drops or reordering on the path into this host"),
        Counter("packet_seq_err", "rdma_hw", RP, LINK_ERRORS, "events",
                "NAK sequence errors received: the peer missed packets this host sent"),
        Counter("implied_nak_seq_err", "rdma_hw", RP, LINK_ERRORS, "events",
                "implied NAK sequence errors: responses showed packets this host sent were lost"),
        Counter("duplicate_request", "rdma_hw", NP, LINK_ERRORS, "packets",
                "duplicate requests received: the sender retransmitted (lost ACKs or packets)"),
        Counter("local_ack_timeout_err", "rdma_hw", RP, LINK_ERRORS, "events",
                "ACK timeouts on this host's QPs: packets or ACKs lost, each one a retransmission"),
        Counter("rnr_nak_retry_err", "rdma_hw", RP, PFC, "events",
                "receiver-not-ready NAKs received (the peer had no receive posted)"),
        Counter("out_of_buffer", "rdma_hw", NP, PFC, "packets",
                "packets dropped for lack of a receive WQE (the receiving application fell behind)"),
        Counter("roce_adp_retrans", "rdma_hw", RP, LINK_ERRORS, "events",
                "adaptive retransmissions (packet loss on the path out of this host)"),
        Counter("roce_adp_retrans_to", "rdma_hw", RP, LINK_ERRORS, "events",
                "adaptive retransmission timeouts"),
        Counter("roce_slow_restart", "rdma_hw", RP, LINK_ERRORS, "events",
                "slow restarts after loss (the QP's rate dropped to its minimum)"),
        Counter("roce_slow_restart_cnps", "rdma_hw", RP, CONGESTION, "packets",
                "CNPs generated while in slow restart"),
        Counter("roce_slow_restart_trans", "rdma_hw", RP, LINK_ERRORS, "events",
                "transitions into slow restart"),
        Counter("rx_icrc_encapsulated", "rdma_hw", NP, LINK_ERRORS, "packets",
                "RoCE packets received with an ICRC error (corruption on the path in)"),
        # RDMA port counters (IB PMA)
        Counter("port_xmit_wait", "rdma_port", LINK, PFC, "ticks",
                "ticks the port had data to send but could not (no credits / paused): blocked link time"),
        Counter("port_xmit_discards", "rdma_port", LINK, PFC, "packets",
                "outbound packets discarded (port down or congested for too long)"),
        Counter("port_rcv_errors", "rdma_port", LINK, LINK_ERRORS, "packets", "received packets with errors"),
        Counter("port_rcv_remote_physical_errors", "rdma_port", LINK, LINK_ERRORS, "packets",
                "received packets marked bad by a remote physical error"),
        Counter("port_rcv_switch_relay_errors", "rdma_port", LINK, LINK_ERRORS, "packets",
                "received packets discarded because they could not be forwarded"),
        Counter("symbol_error", "rdma_port", LINK, LINK_ERRORS, "events", "minor link errors (symbol errors)"),
        Counter("link_downed", "rdma_port", LINK, LINK_ERRORS, "events", "times the link went down"),
        Counter("link_error_recovery", "rdma_port", LINK, LINK_ERRORS, "events", "link error recoveries (retraining)"),
        Counter("local_link_integrity_errors", "rdma_port", LINK, LINK_ERRORS, "events", "local link integrity errors"),
        Counter("excess_buffer_overrun_errors", "rdma_port", LINK, LINK_ERRORS, "events", "buffer overruns"),
        Counter("VL15_dropped", "rdma_port", LINK, LINK_ERRORS, "packets", "VL15 (management) packets dropped"),
        # ethtool (mlx5): link-level and physical-port statistics
        Counter("rx_pause_ctrl_phy", "ethtool", LINK, PFC, "frames",
                "link-level (global) pause frames received: the peer asked this port to stop sending"),
        Counter("tx_pause_ctrl_phy", "ethtool", LINK, PFC, "frames",
                "link-level (global) pause frames sent: this port asked the peer to stop sending"),
        Counter("rx_discards_phy", "ethtool", LINK, PFC, "packets",
                "packets the NIC dropped for lack of receive buffer (congestion at this host's port)"),
        Counter("rx_out_of_buffer", "ethtool", LINK, PFC, "packets",
                "packets dropped for lack of a receive descriptor (the host fell behind)"),
        Counter("tx_pause_storm_warning_events", "ethtool", LINK, PFC, "events",
                "pause storm warnings: the port kept sending pause frames"),
        Counter("tx_pause_storm_error_events", "ethtool", LINK, PFC, "events",
                "pause storm errors: the device stopped sending pause frames"),
        # netstat: kernel stack (TCP transports), per network namespace
        Counter("InCEPkts", "netstat", NP, CONGESTION, "packets",
                "IP packets received with ECN CE: a hop on the path into this host marked them", "IpExt"),
        Counter("InECT0Pkts", "netstat", NP, TRAFFIC, "packets", "IP packets received ECN-capable, ECT(0)", "IpExt"),
        Counter("InECT1Pkts", "netstat", NP, TRAFFIC, "packets", "IP packets received ECN-capable, ECT(1)", "IpExt"),
        Counter("InNoECTPkts", "netstat", NP, TRAFFIC, "packets", "IP packets received not ECN-capable", "IpExt"),
        Counter("TCPDeliveredCE", "netstat", RP, CONGESTION, "packets",
                "packets this host sent that the receiver saw CE-marked (echoed back): the path out of it "
                "is congested", "TcpExt"),
        Counter("TCPDelivered", "netstat", RP, TRAFFIC, "packets", "packets delivered (acknowledged) to peers", "TcpExt"),
        Counter("TCPECNRehash", "netstat", RP, CONGESTION, "events", "rehashes after ECN-signalled congestion", "TcpExt"),
        Counter("TCPLostRetransmit", "netstat", RP, LINK_ERRORS, "packets", "retransmissions that were lost again", "TcpExt"),
        Counter("TCPFastRetrans", "netstat", RP, LINK_ERRORS, "packets", "fast retransmissions (loss on the path out)",
                "TcpExt"),
        Counter("TCPSlowStartRetrans", "netstat", RP, LINK_ERRORS, "packets", "retransmissions in slow start", "TcpExt"),
        Counter("TCPTimeouts", "netstat", RP, LINK_ERRORS, "events", "retransmission timeouts", "TcpExt"),
        Counter("TCPSpuriousRTOs", "netstat", RP, LINK_ERRORS, "events", "retransmission timeouts found spurious",
                "TcpExt"),
        Counter("TCPRetransFail", "netstat", RP, LINK_ERRORS, "packets", "retransmissions that failed to be sent", "TcpExt"),
        Counter("TCPSynRetrans", "netstat", RP, LINK_ERRORS, "packets", "SYN retransmissions", "TcpExt"),
        Counter("TCPOFOQueue", "netstat", NP, LINK_ERRORS, "packets",
                "packets received out of order and queued (loss or reordering on the path in)", "TcpExt"),
        Counter("TCPRcvQDrop", "netstat", NP, PFC, "packets", "packets dropped: receive queue full", "TcpExt"),
    ]
    # ethtool per-priority PFC statistics (mlx5): rx = pause frames this port received (its peer
    # is congested and paused it), tx = pause frames it sent (this host's receive side is congested)
    for p in PRIORITIES:
        for d, who in (("rx", "received: the peer paused this port's sending"),
                       ("tx", "sent: this port paused its peer (its receive buffer filled)")):
            rows.append(Counter(f"{d}_prio{p}_pause", "ethtool", LINK, PFC, "frames",
                                f"PFC pause frames on priority {p} {who}"))
            rows.append(Counter(f"{d}_prio{p}_pause_duration", "ethtool", LINK, PFC, "microseconds",
                                f"time paused on priority {p} ({d}); mlx5 counts microseconds"))
            rows.append(Counter(f"{d}_prio{p}_pause_transition", "ethtool", LINK, PFC, "events",
                                f"pause state transitions on priority {p} ({d})"))
    return tuple(rows)


COUNTERS = _rows()
BY_KEY = {(c.source, c.name): c for c in COUNTERS}
_BY_NAME = {}
for _c in COUNTERS:
    _BY_NAME.setdefault(_c.name, _c)

def names(source, section=None):
    """The counter names of one source (and netstat section), in table order."""
    return [c.name for c in COUNTERS if c.source == source and (section is None or c.section == section)]


def lookup(source, name):
    """The Counter row of a source's counter, or None (a counter this table does not know)."""
    return BY_KEY.get((source, name))


def row(name):
    """The Counter row of a counter name in any host source, or None."""
    return _BY_NAME.get(name)


def family(name):
    """The family of a host counter name (FAMILIES), or None for a counter the table does not know."""
    c = _BY_NAME.get(name)
    return c.family if c else None


def describe(source, name):
    """One line for a counter: its meaning and side, for help texts and docs."""
    c = lookup(source, name)
    if c is None:
        return ""
    return f"{c.meaning} [{c.side}: {SIDES[c.side]}; {c.unit}]"


# ---------------------------------------------------------------- per-path counters
# Read per socket or QP by the engine (engines/engine_paths.c, which spells the tcp_* names) and
# summed per peer: the record's congestion.paths["<host>><peer>|<name>"], <host> the host whose
# sockets or QPs were read. Deltas over the step except PATH_GAUGES (a value at the step's end).
PATH_SOURCES = ("tcp_info", "rdma_qp")
QP_PREFIX = "qp_"


def _path_rows():
    rows = [
        Counter("tcp_retrans_segs", "tcp_info", RP, LINK_ERRORS, "packets",
                "segments <host> retransmitted to <peer> (tcpi_total_retrans): loss on the path, or "
                "its ACKs lost on the way back"),
        Counter("tcp_lost", "tcp_info", RP, LINK_ERRORS, "packets",
                "segments <host>'s sockets to <peer> held as lost at the step's end (tcpi_lost, a gauge)"),
        Counter("tcp_delivered_ce", "tcp_info", RP, CONGESTION, "packets",
                "segments <host> sent that <peer> received CE-marked (tcpi_delivered_ce): the path out is "
                "congested"),
        Counter("tcp_reord_seen", "tcp_info", RP, LINK_ERRORS, "events",
                "reordering events <host> saw on its sockets to <peer> (tcpi_reord_seen)"),
        Counter("tcp_segs_out", "tcp_info", RP, TRAFFIC, "packets",
                "segments <host> sent to <peer> (tcpi_segs_out): how busy the path was"),
        Counter("tcp_bytes_retrans", "tcp_info", RP, TRAFFIC, "bytes",
                "bytes <host> retransmitted to <peer> (tcpi_bytes_retrans): the size of tcp_retrans_segs, "
                "not separate evidence"),
        Counter("tcp_dsack_dups", "tcp_info", RP, TRAFFIC, "packets",
                "segments <host> retransmitted that <peer> reported it already had (tcpi_dsack_dups): "
                "spurious retransmissions (a late ACK, a descheduled receiver), not loss"),
        Counter("tcp_rcv_ooopack", "tcp_info", NP, LINK_ERRORS, "packets",
                "packets <host> received from <peer> out of order (tcpi_rcv_ooopack): loss or "
                "reordering on the path in"),
        Counter("tcp_rtt_us_max", "tcp_info", LINK, CONGESTION, "microseconds",
                "the largest smoothed RTT of <host>'s sockets to <peer> at the step's end (tcpi_rtt, a "
                "gauge): queueing on the path"),
    ]
    # a QP's counters are the device's hw_counters, counted for the QPs bound to them
    rows += [Counter(QP_PREFIX + c.name, "rdma_qp", c.side, c.family, c.unit,
                     c.meaning + " (on <host>'s QPs to <peer>)")
             for c in COUNTERS if c.source == "rdma_hw"]
    return tuple(rows)


PATH_COUNTERS = _path_rows()
PATH_BY_NAME = {c.name: c for c in PATH_COUNTERS}
# values at the step's end, not counts of events: shown, never put to the count test
PATH_GAUGES = frozenset({"tcp_lost", "tcp_rtt_us_max"})


def path_row(name):
    """The Counter row of a per-path counter name (tcp_*, qp_<hw counter>), or None."""
    return PATH_BY_NAME.get(name)


def weighed_path_counter(name):
    """Whether a per-path counter is weighed as evidence and kept in a normal: a loss or marking
    counter, not traffic and not a gauge (a value at the snapshot, not a movement)."""
    row = PATH_BY_NAME.get(name)
    return row is not None and row.family != TRAFFIC and name not in PATH_GAUGES
