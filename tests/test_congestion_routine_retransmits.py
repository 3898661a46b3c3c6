"""Routine TCP retransmissions (< 1 % of the packets the host delivered in the step; out-of-order
arrivals: of those it received) are no evidence, by one rule (congestion.attribution.signals) for
the exporter's top host — the series the CollbenchLatencyShift alert's suspect comes from — and
for `collbench diagnose`: neither names a host for them; beyond the share, both do."""

import json

from collbench.congestion import attribution
from collbench.diagnose.load import load
from collbench.exporter.results_state import series_from_record
from collbench.results.file_reader import ResultsInput
from collbench.results.record_parser import parse_record

HOSTS = ["h1", "h2", "h3", "h4"]


def record(i, moved):
    ts = 1795400000.0 + i
    totals = {}
    for k, d in moved.items():
        name = k.split("|", 1)[1].split("@", 1)[0]
        totals[name] = totals.get(name, 0) + d
    return {"schema": 1, "ts": ts, "type": "result", "run_id": "20261123T100000-0badcafe", "hosts": HOSTS,
            "nodes": 4, "ranks": 4, "engine": "builtin", "transport": "ob1-tcp", "op": "allreduce",
            "size": "1MB", "size_bytes": 1 << 20, "latency_avg_us": 1000.0 + i, "seq": i + 1,
            "congestion": {"source": "engine", "t_start": ts - 0.5, "t_end": ts, "hosts_read": 4,
                           "moved": moved, "totals": totals}}


def exporter_top(rec):
    """The exporter's attribution of one log line: what collbench_step_congestion_top exports."""
    parsed = parse_record(json.dumps(rec))
    return [(r.host, r.counter) for r in series_from_record(parsed).congestion_top]


def diagnose_hosts(tmp_path, rec):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    steps = next(iter(load(ResultsInput([str(path)])).series.values()))
    # the evidence diagnose takes from a step: its signals less routine loss recovery (flagged: a
    # counter's normal counts them, a slow step's evidence does not)
    return sorted({(h, k) for h, k, _, routine in steps[0].moved if not routine})


def test_routine_retransmissions_name_no_host_in_the_exporter_or_diagnose(tmp_path):
    # 40 fast retransmissions beside 48,000 delivered packets on h2 (0.08 %), every host delivering
    moved = {f"{h}|TCPDelivered@netstat": 48000 for h in HOSTS}
    moved["h2|TCPFastRetrans@netstat"] = 40
    rec = record(0, moved)
    assert exporter_top(rec) == []
    assert diagnose_hosts(tmp_path, rec) == []
    assert attribution.top_host(rec["congestion"]) is None


def test_retransmissions_beyond_the_routine_share_are_named_by_both(tmp_path):
    moved = {f"{h}|TCPDelivered@netstat": 48000 for h in HOSTS}
    moved["h2|TCPFastRetrans@netstat"] = 4000           # 8 %: a bad link
    rec = record(0, moved)
    assert exporter_top(rec) == [("h2", "TCPFastRetrans@netstat")]
    assert diagnose_hosts(tmp_path, rec) == [("h2", "TCPFastRetrans@netstat")]


def test_without_delivered_packets_to_compare_retransmissions_count(tmp_path):
    # a host whose TCPDelivered did not move (or a source without it): never called routine
    rec = record(0, {"h3|TCPLostRetransmit@netstat": 5})
    assert exporter_top(rec) == [("h3", "TCPLostRetransmit@netstat")]
    assert diagnose_hosts(tmp_path, rec) == [("h3", "TCPLostRetransmit@netstat")]


def test_the_rule_is_per_host_and_place(tmp_path):
    # h2's retransmissions are routine beside its own deliveries, not beside h1's
    moved = {"h1|TCPDelivered@netstat": 480000, "h2|TCPDelivered@netstat": 100,
             "h2|TCPFastRetrans@netstat": 40, "h1|TCPFastRetrans@netstat": 40}
    rec = record(0, moved)
    assert exporter_top(rec) == [("h2", "TCPFastRetrans@netstat")]
    assert diagnose_hosts(tmp_path, rec) == [("h2", "TCPFastRetrans@netstat")]
    assert attribution.routine_retransmits("TCPFastRetrans", 40, 480000)
    assert not attribution.routine_retransmits("TCPFastRetrans", 40, None)
    assert not attribution.routine_retransmits("InCEPkts", 1, 480000)      # not a retransmission counter


def test_out_of_order_arrivals_are_weighed_against_the_packets_the_host_received(tmp_path):
    """TCPOFOQueue is the receiver's count: a bcast leaf receives ~700 packets of a 1MB step and
    delivers (TCPDelivered, its own sends acked) almost none. One out-of-order arrival there is
    routine (seen on the testbed: a quiet run's one TCPOFOQueue named a host link_errors); beside
    no received packets, or beyond the share, it still counts."""
    moved = {"h1|TCPDelivered@netstat": 2100, "h4|InECT0Pkts@netstat": 700, "h4|InNoECTPkts@netstat": 12,
             "h4|TCPOFOQueue@netstat": 1}
    rec = record(0, moved)
    assert exporter_top(rec) == [] and diagnose_hosts(tmp_path, rec) == []
    moved["h4|TCPOFOQueue@netstat"] = 60                                     # 8 %
    assert exporter_top(record(0, moved)) == [("h4", "TCPOFOQueue@netstat")]
    rec = record(0, {"h1|TCPDelivered@netstat": 2100, "h4|TCPOFOQueue@netstat": 1})
    assert diagnose_hosts(tmp_path, rec) == [("h4", "TCPOFOQueue@netstat")]
