"""The congestion counters' one definition, the snapshot reader, the fault rules of the deltas,
lost link time, and the records' `congestion` field: bounded at 1024 hosts and validated for every
reader (a hostile value is a counted parse error, never a traceback)."""

import json
import shutil
from pathlib import Path

import pytest

from collbench.congestion import attribution, counters, deltas, lost_time, record_field, sources
from collbench.congestion.snapshot import HostReader, Snapshot
from collbench.results.record_parser import ParseError, parse_record

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ENGINE_C = Path(__file__).resolve().parent.parent / "collbench" / "engines" / "collbench_engine.c"


def snap(values, faults=None, mono=0.0, sources_read=1):
    return Snapshot(dict(values), dict(faults or {}), 1000.0 + mono, mono, sources_read)


def test_every_counter_has_a_meaning_a_side_and_a_unit_and_the_engine_knows_none_by_name():
    assert len({(c.source, c.name) for c in counters.COUNTERS}) == len(counters.COUNTERS)
    for c in counters.COUNTERS:
        assert c.source in counters.SOURCES and c.side in counters.SIDES and c.unit and len(c.meaning) > 10
        assert (c.section in ("IpExt", "TcpExt")) == (c.source == "netstat")
    assert counters.lookup("rdma_hw", "np_ecn_marked_roce_packets").side == counters.NP
    assert counters.lookup("rdma_hw", "rp_cnp_handled").side == counters.RP
    assert counters.lookup("netstat", "TCPDeliveredCE").side == counters.RP
    assert counters.lookup("netstat", "InCEPkts").side == counters.NP
    assert counters.lookup("ethtool", "tx_prio7_pause_duration").unit == "microseconds"
    # the engine reads what the spec names: the table stays the one definition
    spec = sources.spec_text(None)
    engine = ENGINE_C.read_text()
    for c in counters.COUNTERS:
        assert f" {c.name}" in spec
        assert c.name not in engine, c.name


def test_deltas_skip_and_count_vanished_unreadable_garbage_and_backwards_never_negative():
    before = snap({"a@x": 10, "gone@x": 5, "back@x": 100, "same@x": 7, "later_bad@x": 1},
                  {"unread@x": "unreadable"}, mono=1.0)
    after = snap({"a@x": 25, "back@x": 3, "same@x": 7, "new@x": 9, "unread@x": 4},
                 {"later_bad@x": "garbage"}, mono=1.5)
    d = deltas.delta(before, after)
    assert d.moved == {"a@x": 15}
    assert d.faults == {"vanished": 1, "backwards": 1, "garbage": 1, "unreadable": 1}
    assert d.read == 3 and d.seconds == pytest.approx(0.5)
    assert all(v > 0 for v in d.moved.values())


def _tree(tmp_path):
    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sysfs-mlx5", sysfs, symlinks=True)
    eth = tmp_path / "eth"
    eth.mkdir()
    shutil.copy(FIXTURES / "ethtool" / "mlx5_ens1f0np0.txt", eth / "ens1f0np0")
    return sysfs, eth


def test_snapshot_reads_rdma_ethtool_and_netstat_keyed_by_counter_and_place(tmp_path):
    sysfs, eth = _tree(tmp_path)
    hw = sysfs / "class/infiniband/mlx5_0/ports/1/hw_counters"
    (hw / "rp_cnp_ignored").unlink()
    (hw / "rp_cnp_ignored").mkdir()             # exists, but reading it fails: unreadable
    (hw / "np_cnp_sent").write_text("12x\n")      # garbage
    reader = HostReader(sources.HostSources(str(sysfs), str(FIXTURES / "procfs/net/netstat"), str(eth)))
    s = reader.snapshot()
    assert s.values["np_ecn_marked_roce_packets@mlx5_0/1"] == int((hw / "np_ecn_marked_roce_packets").read_text())
    assert "port_xmit_wait@mlx5_1/1" in s.values
    assert s.values["rx_prio3_pause@ens1f0np0"] == 88213
    assert s.values["rx_prio3_pause_duration@ens1f0np0"] == 1502331
    assert "InCEPkts@netstat" in s.values and "TCPDeliveredCE@netstat" in s.values
    assert s.faults["rp_cnp_ignored@mlx5_0/1"] == "unreadable"
    assert s.faults["np_cnp_sent@mlx5_0/1"] == "garbage"
    assert "rx_prio3_bytes@ens1f0np0" not in s.values      # not a congestion counter of the table
    assert s.sources_read == 4 + 1 + 1                      # 2 devices x (hw_counters, counters), a netdev, netstat
    missing = HostReader(sources.HostSources(str(tmp_path / "none"), str(tmp_path / "none"), str(tmp_path / "none")))
    assert missing.snapshot().sources_read == 0


def test_lost_link_time_from_pause_durations_and_xmit_wait():
    assert lost_time.fraction("rx_prio3_pause_duration", 250_000, 1.0) == 0.25       # µs of 1 s
    assert lost_time.fraction("port_xmit_wait", 10_000_000, 1.0, 8.0) == 0.08         # 8 ns ticks
    assert lost_time.fraction("port_xmit_wait", 10_000_000, 1.0, 32.0) == 0.32
    assert lost_time.fraction("tx_prio0_pause_duration", 5_000_000, 1.0) == 1.0       # capped
    assert lost_time.fraction("rx_prio3_pause", 1000, 1.0) is None                   # frames, not time
    assert lost_time.fraction("rx_prio3_pause_duration", 5, 0.0) is None


def _result(**extra):
    return {"schema": 1, "ts": 1795363128.14, "type": "result", "op": "allreduce", "size_bytes": 1024,
            "latency_avg_us": 1.0, "ranks": 2, "nodes": 1, **extra}


def test_a_record_stays_bounded_and_valid_at_1024_hosts():
    hosts = [f"node{i:04d}.cluster.example" for i in range(1024)]
    many = {f"rx_prio{p}_pause{s}@ens{i}f0np0": 10_000 + i for p in range(8) for s in ("", "_duration")
            for i in range(3)}   # 48 moved counters per host
    host_deltas = {h: deltas.HostDelta(dict(many), {"backwards": 1}, 60, 0.5) for h in hosts}
    field = record_field.build(host_deltas, 1795363100.0, 1795363100.5, hosts=hosts)
    assert len(field["moved"]) == record_field.MAX_MOVED
    assert field["dropped"] == 1024 * 48 - record_field.MAX_MOVED
    per_host = {}
    for k in field["moved"]:
        per_host[k.rpartition("|")[0]] = per_host.get(k.rpartition("|")[0], 0) + 1
    assert max(per_host.values()) == record_field.MAX_PER_HOST
    assert len(field["lost"]) <= record_field.MAX_LOST and field["skipped"][hosts[0]] == 1
    line = json.dumps(_result(hosts=hosts, congestion=field), separators=(",", ":"))
    assert len(line) < 1 << 20
    rec = parse_record(line)
    assert not isinstance(rec, ParseError), rec
    assert rec["congestion"]["faults"] == {"backwards": 1024}


def test_names_map_to_the_record_hosts_and_top_host_names_the_most_moved():
    d = lambda moved: deltas.HostDelta(moved, {}, 5, 1.0)   # noqa: E731
    field = record_field.build({"n1": d({"np_cnp_sent@mlx5_0/1": 4}),
                                "n2.cluster": d({"np_ecn_marked_roce_packets@mlx5_0/1": 9, "np_cnp_sent@mlx5_0/1": 9}),
                                "n3": deltas.HostDelta({}, {}, 0, 1.0, 0)}, 1.0, 2.0, hosts=["n1", "n2", "n3"])
    assert set(field["moved"]) == {"n1|np_cnp_sent@mlx5_0/1", "n2|np_ecn_marked_roce_packets@mlx5_0/1",
                                   "n2|np_cnp_sent@mlx5_0/1"}
    assert field["unread"] == ["n3"] and field["hosts_read"] == 2
    assert attribution.top_host(field) == "n2"
    assert field["totals"] == {"np_cnp_sent": 13, "np_ecn_marked_roce_packets": 9}
    # one host read, one in the record: the same machine ("localhost" vs MPI's name)
    single = record_field.build({"vm-42": d({"TCPDelivered@netstat": 3})}, 1.0, 2.0, hosts=["localhost"])
    assert list(single["moved"]) == ["localhost|TCPDelivered@netstat"]


GOOD = {"source": "engine", "t_start": 1.0, "t_end": 2.0, "hosts_read": 1, "moved": {"h|a@b": 1},
        "totals": {"a": 1}}
def test_a_later_versions_field_is_passed_over():
    """The log is read by other versions: a field this one does not know (a newer writer's, as
    `paths` was new once) leaves the record valid."""
    assert record_field.validate({**GOOD, "later_field": {"x": [1, 2]}}) is None


HOSTILE = [
    [], "x", None, 1, {"source": "engine"},
    {**GOOD, "source": "nccl"}, {**GOOD, "ex tra\n": 1},
    {**GOOD, **{f"later_{i}": 1 for i in range(len(record_field.FIELDS) + record_field.MAX_FUTURE_FIELDS)}},
    {**GOOD, "moved": {"h|a@b": -1}}, {**GOOD, "moved": {"h|a@b": 0}}, {**GOOD, "moved": {"h|a@b": 1.5}},
    {**GOOD, "moved": {"h|a@b": True}}, {**GOOD, "moved": {"a@b": 1}}, {**GOOD, "moved": {"h|ab": 1}},
    {**GOOD, "moved": {"h\n|a@b": 1}}, {**GOOD, "moved": {"h|a@b\u202e": 1}}, {**GOOD, "moved": [["h|a@b", 1]]},
    {**GOOD, "moved": {f"h|a{i}@b": 1 for i in range(record_field.MAX_MOVED + 1)}},
    {**GOOD, "t_end": 0.5}, {**GOOD, "t_start": -1}, {**GOOD, "t_start": "1"}, {**GOOD, "t_start": 1e300},
    {**GOOD, "hosts_read": -1}, {**GOOD, "totals": {"a": "1"}}, {**GOOD, "totals": {"a b": 1}},
    {**GOOD, "lost": {"h|a@b": 1.5}}, {**GOOD, "lost": {"h|a@b": -0.1}}, {**GOOD, "lost": {"h|a@b": "0.1"}},
    {**GOOD, "xmit_wait_tick_ns": 0}, {**GOOD, "skipped": {"h": 0}}, {**GOOD, "skipped": {"h|x": 1}},
    {**GOOD, "faults": {"exploded": 1}}, {**GOOD, "faults": {"vanished": -2}},
    {**GOOD, "unread": "h"}, {**GOOD, "unread": [1]}, {**GOOD, "unread": ["h|"]}, {**GOOD, "dropped": -1},
    {**GOOD, "dropped": False},
]


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_congestion_value_is_a_parse_error(value):
    for rec in (_result(congestion=value), {"schema": 1, "ts": 1.0, "type": "failure", "congestion": value}):
        got = parse_record(json.dumps(rec))
        assert isinstance(got, ParseError) and got.reason.startswith("congestion"), got


def test_a_valid_field_parses_and_a_record_without_one_still_does():
    assert parse_record(json.dumps(_result(congestion=GOOD)))["congestion"] == GOOD
    assert "congestion" not in parse_record(json.dumps(_result()))
    huge = json.dumps(_result(congestion={**GOOD, "moved": {"h|a@b": 10 ** 30}}))
    assert isinstance(parse_record(huge), ParseError)
    with_lost = parse_record(json.dumps(_result(congestion={**GOOD, "lost": {"h|a@b": 0.5}})))
    assert with_lost["congestion"]["lost"] == {"h|a@b": 0.5}


def test_the_reading_page_lists_every_counter_of_the_table():
    page = (Path(__file__).resolve().parent.parent / "docs" / "CONGESTION.md").read_text()
    for c in counters.COUNTERS:
        shown = c.name
        if c.source == "ethtool" and "_prio" in c.name:
            shown = c.name[:7] + "<p>" + c.name[8:]          # rx_prio3_pause -> rx_prio<p>_pause
        assert f"| `{shown}` |" in page, shown


def test_engine_names_become_the_records_hosts_through_each_readers_rank(tmp_path):
    """The testbed's hostfile names addresses while MPI names the hosts h1..hN: each reader's rank
    and the config's placement map one onto the other, and only when that is one to one."""
    from collbench.config import build_config
    from collbench.congestion import engine_lines

    hosts = ["198.18.0.2:2", "198.18.0.3:2"]
    cfg = build_config({"hosts": hosts, "ranks": 4}, "<test>", str(tmp_path))
    ranks = engine_lines.rank_hosts(cfg)
    assert ranks == ["198.18.0.2", "198.18.0.2", "198.18.0.3", "198.18.0.3"]
    line = ('CBCONG {"loop":0,"step":0,"t0":1.0,"t1":2.0,"hosts":{'
            '"h1":{"dt":1.0,"n":3,"src":1,"f":[0,0,0,0],"drop":0,"us":50.0,"r":0,"d":{"InCEPkts@netstat":4}},'
            '"h2":{"dt":1.0,"n":3,"src":1,"f":[0,0,0,0],"drop":0,"us":50.0,"r":2,"d":{"TCPDeliveredCE@netstat":9}}}}')
    payload = engine_lines.parse_line(line)
    field = engine_lines.record_congestion(payload, ["198.18.0.2", "198.18.0.3"], 8.0, ranks)
    assert set(field["moved"]) == {"198.18.0.2|InCEPkts@netstat", "198.18.0.3|TCPDeliveredCE@netstat"}
    # both readers on one config host (emulated hosts on one machine): MPI's names stay
    field = engine_lines.record_congestion(payload, ["localhost"], 8.0, ["localhost"] * 4)
    assert set(field["moved"]) == {"h1|InCEPkts@netstat", "h2|TCPDeliveredCE@netstat"}
    assert engine_lines.rank_hosts(build_config({"ranks": 2}, "<test>", str(tmp_path))) is None
    for bad in ('CBCONG {"loop":0}', 'CBCONG [1]', "CBCONG {", line.replace('"r":2', '"r":-2'),
                line.replace('"n":3', '"n":"3"'), line.replace('"InCEPkts@netstat":4', '"InCEPkts@netstat":-4')):
        assert engine_lines.parse_line(bad) is None, bad


def test_netstat_is_read_only_for_tcp_transports(tmp_path):
    from collbench.config import build_config
    spec = {t: sources.spec_text(build_config({"transport": t, "congestion": {"enabled": True}}, "<test>",
                                              str(tmp_path))) for t in ("shm", "ucx", "ob1-tcp", "ucx-tcp")}
    assert [t for t, text in spec.items() if "\nnetstat TcpExt TCPDeliveredCE" in text] == ["ob1-tcp", "ucx-tcp"]
    assert all("\nrdma_hw np_ecn_marked_roce_packets" in text for text in spec.values())
