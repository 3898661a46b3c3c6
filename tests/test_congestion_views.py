"""Where people look at the congestion counters (issue 20 items 4, 5): the one choice of "the host
whose counters moved most" (collbench/congestion/attribution.py) and the exporter's bounded top
series, through a real exporter subprocess tailing a results log. (The tables, report and stress
log: test_congestion_views_tables.py; real ECN marks on the testbed: test_congestion_testbed_e2e.py.)
"""

import json
import time

import pytest

from collbench.congestion import attribution, record_field
from collbench.congestion.deltas import HostDelta
from exporter_helpers import ExporterProcess, append, result_line, sample

H = ["h1", "h2", "h3", "h4"]


def field(moved_by_host, hosts=H):
    """A record's congestion field built the way the engine builds it (record_field.build)."""
    deltas = {h: HostDelta(dict(moved_by_host.get(h, {})), {}, 1, 0.5, 1) for h in hosts}
    f = record_field.build(deltas, 1000.0, 1000.5, hosts=hosts)
    assert record_field.validate(f) is None
    return f


# The shape the 4-host testbed produced with h2's egress CE-marked (an alltoall 1MB step):
# every host's volume counters move; h2 alone holds TCPDeliveredCE, each peer a third of InCEPkts;
# one stray fast retransmit on h1.
MARKED_H2 = {
    "h1": {"InECT0Pkts@netstat": 32357, "TCPDelivered@netstat": 48125, "InCEPkts@netstat": 15754,
           "TCPFastRetrans@netstat": 45},
    "h2": {"InECT0Pkts@netstat": 48024, "TCPDelivered@netstat": 48078, "TCPDeliveredCE@netstat": 36531,
           "InNoECTPkts@netstat": 711},
    "h3": {"InECT0Pkts@netstat": 32352, "TCPDelivered@netstat": 48031, "InCEPkts@netstat": 15699},
    "h4": {"InECT0Pkts@netstat": 32318, "TCPDelivered@netstat": 48037, "InCEPkts@netstat": 15725},
}
UNMARKED = {h: {"InECT0Pkts@netstat": 32000 + i, "TCPDelivered@netstat": 48000 + i,
                "InNoECTPkts@netstat": 300 + i} for i, h in enumerate(H)}


def test_the_marked_sender_is_named_not_its_receivers_or_a_stray_retransmit():
    f = field(MARKED_H2)
    rows = attribution.ranked(f)
    assert [r.host for r in rows] == ["h2", "h1", "h4", "h3"]
    top = rows[0]
    assert (top.counter, top.delta, top.share, top.side) == ("TCPDeliveredCE@netstat", 36531, 1.0, "rp")
    # h1's 45 fast retransmissions beside its 48,125 delivered packets are routine loss recovery
    # (attribution.ROUTINE_RETRANS_SHARE, the rule diagnose applies too): its InCEPkts lead
    assert rows[1].counter == "InCEPkts@netstat" and rows[1].delta == 15754
    assert "TCPFastRetrans@netstat" not in attribution.signals(f).get("h1", {})
    assert rows[2].counter == "InCEPkts@netstat" and rows[2].side == "np"
    assert abs(rows[2].share - 15725 / (15754 + 15699 + 15725)) < 1e-12
    assert attribution.top_host(f) == "h2"
    assert attribution.label(f) == "h2 TCPDeliveredCE=36531"
    assert [r.host for r in attribution.ranked(f, 2)] == ["h2", "h1"]


def test_traffic_counters_alone_name_nobody():
    f = field(UNMARKED)
    assert f["moved"]                                   # the volume counters did move ...
    assert attribution.ranked(f) == [] and attribution.top_host(f) is None and attribution.label(f) == ""
    for nothing in (None, {}, {"moved": {}}, "garbage", {"moved": None}, {"moved": ["h1|InCEPkts@netstat"]},
                    {"moved": {"h1|InCEPkts@netstat": 0}}, {"moved": {"h1|InCEPkts@netstat": "9"}},
                    {"moved": {"h1|InCEPkts@netstat": True, 3: 4}}):
        assert attribution.ranked(nothing) == [] and attribution.top(nothing) is None


def test_an_incast_receiver_is_named_over_its_senders_whatever_the_units():
    # RDMA incast into h3: h3 received all the CE marks and sent the CNPs; each sender handled a
    # third of them; h4's port also waited a few thousand ticks (another unit: not summed with packets)
    f = field({"h3": {"np_ecn_marked_roce_packets@mlx5_0/1": 9000, "np_cnp_sent@mlx5_0/1": 3000},
               "h1": {"rp_cnp_handled@mlx5_0/1": 1000},
               "h2": {"rp_cnp_handled@mlx5_0/1": 1000},
               "h4": {"rp_cnp_handled@mlx5_0/1": 1000, "port_xmit_wait@mlx5_0/1": 4000}})
    rows = attribution.ranked(f)
    assert rows[0].host == "h3" and rows[0].counter == "np_ecn_marked_roce_packets@mlx5_0/1"
    assert rows[0].signals == 2 and rows[0].side == "np"
    assert rows[1].host == "h4" and rows[1].counter == "port_xmit_wait@mlx5_0/1" and rows[1].side == "link"
    assert {r.host for r in rows[2:]} == {"h1", "h2"}   # 1/3 each: ties broken by name, stable
    assert [r.host for r in rows[2:]] == ["h1", "h2"]


def test_a_pfc_paused_port_keeps_its_port_and_priority():
    f = field({"h2": {"rx_prio3_pause@ens1f0np0": 40, "rx_prio3_pause_duration@ens1f0np0": 120000},
               "h1": {"rx_prio3_pause@ens1f0np0": 10}})
    top = attribution.top(f)
    assert top.host == "h2" and top.counter == "rx_prio3_pause_duration@ens1f0np0" and top.side == "link"


def test_bounded_at_1024_hosts():
    hosts = [f"n{i:04d}" for i in range(1024)]
    moved = {h: {"InCEPkts@netstat": 10 + i, "InECT0Pkts@netstat": 1000} for i, h in enumerate(hosts)}
    moved["n0500"]["TCPDeliveredCE@netstat"] = 5000
    f = field(moved, hosts)
    t0 = time.perf_counter()
    rows = attribution.ranked(f, attribution.MAX_K)
    assert time.perf_counter() - t0 < 1.0
    assert len(rows) == attribution.MAX_K and rows[0].host == "n0500"


def test_volume_counters_are_rows_of_the_counter_table():
    from collbench.congestion import counters
    assert all(counters.lookup("netstat", name) for name in attribution.VOLUME)


# --------------------------------------------------------------- the exporter's top series

def _with_congestion(line, cong):
    rec = json.loads(line)
    rec["congestion"] = cong
    return json.dumps(rec) + "\n"


def _top(m, op="alltoall", size="1MB"):
    """{rank: (host, counter, value, share)} of the top series of one op and size."""
    out = {}
    for (name, labels), v in m.items():
        lab = dict(labels)
        if name == "collbench_step_congestion_top" and lab["op"] == op and lab["size"] == size:
            share = sample(m, "collbench_step_congestion_top_share", **lab)
            out[int(lab["rank"])] = (lab["host"], lab["counter"], v, share)
    return out


def _wait(ex, cond, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        m = ex.metrics()
        if cond(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


@pytest.fixture
def exporter(tmp_path, free_port):
    def start(k=None):
        cfg = tmp_path / "c.yaml"
        cfg.write_text("exporter:\n  collectors: [results, congestion_top]\n"
                       + (f"  congestion_top_k: {k}\n" if k is not None else ""))
        log = tmp_path / "results.jsonl"
        log.touch()
        ex = ExporterProcess(["--config", str(cfg), "--results-log", str(log), "--state-dir", str(tmp_path),
                              "--poll-interval", "0.1"], free_port)
        started.append(ex)
        ex.wait_ready(timeout=60)
        return ex, log
    started = []
    yield start
    for ex in started:
        ex.stop()


def test_exporter_names_the_marked_host_bounded_by_k_and_cleared_by_a_clean_step(exporter):
    ex, log = exporter()
    now = time.time()
    mb = 1 << 20
    append(log, _with_congestion(result_line(1, op="alltoall", size_bytes=mb, ts=now), field(MARKED_H2))
           + _with_congestion(result_line(2, op="allreduce", size_bytes=mb, ts=now), field(UNMARKED)))
    m = _wait(ex, lambda m: _top(m))
    top = _top(m)
    assert sorted(top) == [1, 2, 3]                                  # k = 3 of the 4 hosts
    assert top[1] == ("h2", "TCPDeliveredCE@netstat", 36531, 1.0)
    assert top[2][0] == "h1" and top[3][0] == "h4"
    assert _top(m, "allreduce") == {}                               # nothing but traffic moved
    assert sample(m, "collbench_collector_success", collector="congestion_top") == 1
    # the next step of the same op and size moved no signal: the series go
    append(log, _with_congestion(result_line(3, op="alltoall", size_bytes=mb, ts=now + 1), field(UNMARKED)))
    m = _wait(ex, lambda m: not _top(m))
    assert _top(m) == {}
    assert sample(m, "collbench_latency_avg_seconds", op="alltoall", size="1MB", size_bytes=mb, nodes=1,
                  ranks=4) is not None


def test_series_grow_with_k_never_with_hosts_and_a_hostile_field_is_a_parse_error(exporter):
    ex, log = exporter(k=2)
    now = time.time()
    hosts = [f"n{i:04d}" for i in range(1024)]
    moved = {h: {"InCEPkts@netstat": 10 + i} for i, h in enumerate(hosts)}
    moved["n0007"]["TCPDeliveredCE@netstat"] = 9999
    big = field(moved, hosts)
    lines = "".join(_with_congestion(result_line(10 + j, op="bcast", size_bytes=1 << (10 + j), ts=now), big)
                    for j in range(3))
    hostile = dict(big, moved={"n1|InCEPkts@netstat": -5})
    lines += _with_congestion(result_line(20, op="alltoall", size_bytes=1 << 20, ts=now), hostile)
    append(log, lines)
    m = _wait(ex, lambda m: sample(m, "collbench_results_parse_errors_total") == 1
              and sum(n == "collbench_step_congestion_top" for n, _ in m) == 6)
    tops = [dict(lab) for n, lab in m if n == "collbench_step_congestion_top"]
    assert len(tops) == 3 * 2                                       # 3 sizes x k=2, not x 1024 hosts
    assert {t["host"] for t in tops if t["rank"] == "1"} == {"n0007"}
    assert sample(m, "collbench_results_parse_errors_total") == 1
    assert _top(m, "alltoall") == {}


def test_top_k_is_checked_like_every_config_key(tmp_path):
    import subprocess
    import sys
    from conftest import REPO
    cfg = tmp_path / "c.yaml"
    for bad in ("0", "17", "three", "2.5"):
        cfg.write_text(f"exporter:\n  congestion_top_k: {bad}\n")
        r = subprocess.run([sys.executable, "-m", "collbench", "exporter", "--config", str(cfg),
                            "--listen", "127.0.0.1:1"], capture_output=True, text=True, cwd=str(REPO), timeout=60)
        assert r.returncode == 2 and "congestion_top_k" in r.stderr and "1 to 16" in r.stderr, (bad, r.stderr)


def test_a_failing_attribution_does_not_break_the_scrape():
    from prometheus_client import CollectorRegistry, generate_latest
    from collbench.exporter.collectors import CollectorSet
    from collbench.exporter.collectors.congestion_top import CongestionTopCollector
    from exporter_helpers import parse_exposition

    class BrokenState:
        def fresh_series(self, now):
            raise RuntimeError("bug")

    reg = CollectorRegistry(auto_describe=False)
    reg.register(CollectorSet([CongestionTopCollector(BrokenState())]))
    m = parse_exposition(generate_latest(reg).decode())
    assert sample(m, "collbench_collector_success", collector="congestion_top") == 0
    assert not [n for n, _ in m if n.startswith("collbench_step_congestion_top")]
