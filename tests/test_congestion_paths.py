"""Per-peer evidence (issue 28 item 2), the parts that need no testbed: the record's
`congestion.paths` field validated like every outside input, the engine's CBCONG "p" entries
parsed and renamed to the record's hosts, the per-path counter table agreeing with the engine's
names, and per-QP RDMA counters read by real engine ranks from a fixture tree shaped like netlink
RDMA's objects (tests/fixtures/rdma-qp/README.md) while a thread drives one QP's counters.
The lossy-cable test on real TCP sockets is tests/test_congestion_paths_testbed.py."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from collbench.congestion import counters, engine_lines, record_field, sources
from collbench.results.record_parser import ParseError, parse_record

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ENGINE_PATHS_C = Path(__file__).resolve().parent.parent / "collbench" / "engines" / "engine_paths.c"


def _field(paths):
    return {"source": "engine", "t_start": 1.0, "t_end": 2.0, "moved": {}, "paths": paths}


def test_every_tcp_path_counter_the_engine_spells_has_a_row():
    src = ENGINE_PATHS_C.read_text()
    names = src[src.index("TCP_NAMES[T_N] = {"):]
    names = names[:names.index("};")]
    spelled = {n.strip().strip('"') for n in names.split("{", 1)[1].split(",")}
    rows = {c.name for c in counters.PATH_COUNTERS if c.source == "tcp_info"}
    assert spelled == rows and len(rows) >= 8
    for c in counters.PATH_COUNTERS:
        assert c.source in counters.PATH_SOURCES and c.side in counters.SIDES and c.unit and len(c.meaning) > 20
        assert c.name.startswith("tcp_" if c.source == "tcp_info" else "qp_")
    assert counters.PATH_BY_NAME["qp_out_of_sequence"].side == counters.NP


def test_the_paths_field_is_validated_as_untrusted_input():
    good = {"10.0.0.3>10.0.0.1|tcp_retrans_segs": 41, "h3>h1|tcp_delivered_ce": 0, "h3>h1|tcp_rtt_us_max": 812.0,
            "h3>fe80::1|qp_out_of_sequence": 3}
    assert record_field.validate(_field(good)) is None
    assert record_field.path_key("h3>h1|tcp_rtt_us_max") == ("h3", "h1", "tcp_rtt_us_max")
    bad = [
        ({"h3|tcp_retrans_segs": 1}, "paths: key is not"),             # no peer
        ({"h3>h1|TCPFastRetrans": 1}, "paths: key is not"),            # not a per-path counter
        ({"h3>h1>h2|tcp_lost": 1}, "paths: key is not"),
        ({"h3>h1|tcp_lost": -1}, "paths: expected a number"),
        ({"h3>h1|tcp_lost": "7"}, "paths: expected a number from 0 to"),
        ({"h3>h1|tcp_lost": True}, "got a boolean"),
        ({"h3>h1|tcp_lost": float("nan")}, "paths: expected a number"),
        ({"h3>h1|tcp_lost": 1e300}, "paths: expected a number"),
        ({f"h{i}>h1|tcp_lost": 1 for i in range(record_field.MAX_PATHS + 1)}, "entries (at most"),
        ([["h3>h1|tcp_lost", 1]], "paths: expected an object"),
    ]
    for paths, message in bad:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            record_field.validate(_field(paths))
    # through the record parser: a damaged field is a counted parse error naming it, never a crash
    rec = {"schema": 1, "ts": 1795363128.14, "type": "result", "op": "allreduce", "size_bytes": 1024,
           "latency_avg_us": 1.0, "ranks": 2, "nodes": 1}
    assert parse_record(json.dumps({**rec, "congestion": _field(good)}))["congestion"]["paths"] == good
    got = parse_record(json.dumps({**rec, "congestion": _field({"x|tcp_lost": 1})}))
    assert isinstance(got, ParseError) and "congestion.paths" in str(got)


def _cbcong(hosts):
    return "CBCONG " + json.dumps({"loop": 0, "step": 0, "t0": 10.0, "t1": 11.0, "hosts": hosts})


def _host(r, paths=None, **extra):
    h = {"dt": 1.0, "n": 3, "src": 1, "f": [0, 0, 0, 0], "drop": 0, "us": 50.0, "r": r, "d": {}}
    if paths is not None:
        h.update({"p": paths, "ps": 12, "pd": 0, "pf": 0, "pus": 80.5})
    h.update(extra)
    return h


def test_cbcong_paths_become_the_record_field_named_like_the_hosts():
    line = _cbcong({"nodeA": _host(0, {"nodeB|tcp_retrans_segs": 41, "nodeB|tcp_rtt_us_max": 812,
                                       "nodeB|tcp_lost": 0, "192.0.2.9|tcp_segs_out": 5}),
                    "nodeB": _host(1, {}), "nodeC": _host(2, {"nodeA|qp_out_of_sequence": 3}, pd=2)})
    payload = engine_lines.parse_line(line)
    field = engine_lines.record_congestion(payload, ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
                                           ranks=["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    assert field["paths"] == {"10.0.0.1>10.0.0.2|tcp_retrans_segs": 41, "10.0.0.1>10.0.0.2|tcp_rtt_us_max": 812.0,
                              "10.0.0.1>192.0.2.9|tcp_segs_out": 5, "10.0.0.3>10.0.0.1|qp_out_of_sequence": 3}
    assert isinstance(field["paths"]["10.0.0.1>10.0.0.2|tcp_rtt_us_max"], float)   # tcp_lost 0: left out
    assert field["dropped"] == 2 and record_field.validate(field) is None
    # without a rank map the engine's names stay; no "p" anywhere (an older engine): no field
    assert "nodeA>nodeB|tcp_retrans_segs" in engine_lines.record_congestion(payload)["paths"]
    old = engine_lines.parse_line(_cbcong({"nodeA": _host(0)}))
    assert "paths" not in engine_lines.record_congestion(old)
    # a damaged "p" makes the line damaged (ignored, the step keeps its result)
    for p in ([1], {"nodeB|tcp_lost": -1}, {"no-bar": 1}, {"nodeB|tcp_lost": "1"}):
        assert engine_lines.parse_line(_cbcong({"nodeA": _host(0, p)})) is None
    assert engine_lines.parse_line(_cbcong({"nodeA": _host(0, {}, pus=-1.0)})) is None


def test_the_spec_asks_for_tcp_paths_only_for_tcp_transports():
    class Sec:
        enabled, paths, rdma_qp_root, hosts = True, True, "/fx/qp", {}

    class Cfg:
        transport, congestion = "ob1-tcp", Sec()
    spec = sources.spec_text(Cfg())
    assert "\npaths tcp\n" in spec and "rdma_qp_root /fx/qp" in spec
    Cfg.transport = "ucx-rc"
    assert "paths tcp" not in sources.spec_text(Cfg())
    Cfg.transport, Sec.paths = "ob1-tcp", False
    assert "paths tcp" not in sources.spec_text(Cfg())


# ---------------------------------------------------------------- per-QP counters, real ranks

def _replace(path, text):
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


class QpDriver(threading.Thread):
    """Every ~2 ms: hB's QP 1234 (peer 192.0.2.11) counts out-of-sequence packets and ACK
    timeouts; its QP 1235 (peer 192.0.2.13) stays still; hA's tree never moves."""

    def __init__(self, root):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.dir = root / "mlx5_0" / "1" / "1234" / "counters"
        self.driven = 0

    def run(self):
        oos = int((self.dir / "out_of_sequence").read_text())
        tmo = int((self.dir / "local_ack_timeout_err").read_text())
        while not self.stop.is_set():
            oos, tmo = oos + 5, tmo + 1
            _replace(self.dir / "out_of_sequence", f"{oos}\n")
            _replace(self.dir / "local_ack_timeout_err", f"{tmo}\n")
            self.driven += 1
            time.sleep(0.002)


@pytest.mark.mpi
def test_qp_counters_are_summed_per_peer_from_the_rdma_tree(tmp_path):
    roots = {}
    for name in ("hA", "hB"):
        roots[name] = tmp_path / name / "qp"
        shutil.copytree(FIXTURES / "rdma-qp", roots[name], ignore=shutil.ignore_patterns("*.md"))
    # hA: one QP with garbage in a counter, one without a peer: both counted, neither a path
    (roots["hA"] / "mlx5_0/1/1234/counters/out_of_sequence").write_text("N/A\n")
    (roots["hA"] / "mlx5_0/1/1235/dst_addr").unlink()
    # hC reads no QP tree: the hosts' readers still agree on every collective
    config = {
        "ranks": 5, "transport": "shm", "step_timeout": 300,
        "env": {"COLLBENCH_ENGINE_HOST_OF_RANK": "hA,hA,hB,hB,hC"},
        "congestion": {"enabled": True, "sysfs_root": str(tmp_path / "no-rdma"),
                       "hosts": {n: {"rdma_qp_root": str(r)} for n, r in roots.items()}},
    }
    cfg = tmp_path / "collbench.yaml"
    cfg.write_text(yaml.safe_dump(config))
    results = tmp_path / "results.jsonl"
    driver = QpDriver(roots["hB"])
    driver.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "collbench", "once", "--config", str(cfg), "--results",
                               str(results), "--quiet", "--ops", "allreduce,alltoall", "--sizes", "1MB",
                               "--iterations", "30"], capture_output=True, text=True, timeout=600)
    finally:
        driver.stop.set()
        driver.join()
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [parse_record(line) for line in results.read_text().splitlines()]
    assert not [r for r in recs if isinstance(r, ParseError)], recs
    recs = [r for r in recs if r["type"] == "result"]
    assert len(recs) == 2 and driver.driven > 0
    for r in recs:
        paths = r["congestion"]["paths"]
        assert r["congestion"]["unread"] == ["hA", "hB", "hC"]    # every reader answered (no host counters here)
        # only the driven QP's peer, only from hB, only the counters that moved
        assert set(paths) == {"hB>192.0.2.11|qp_out_of_sequence", "hB>192.0.2.11|qp_local_ack_timeout_err"}, paths
        oos, tmo = paths["hB>192.0.2.11|qp_out_of_sequence"], paths["hB>192.0.2.11|qp_local_ack_timeout_err"]
        assert tmo > 0 and abs(oos - 5 * tmo) <= 5, paths    # the two files are replaced one after the other


def test_a_record_with_full_paths_at_1024_hosts_stays_bounded_and_keeps_the_worst_paths():
    from collbench.congestion import deltas
    hosts = [f"node{i:04d}.cluster.example" for i in range(1024)]
    many = {f"rx_prio{p}_pause{s}@ens{i}f0np0": 10_000 + i for p in range(8) for s in ("", "_duration")
            for i in range(3)}
    host_deltas = {h: deltas.HostDelta(dict(many), {"backwards": 1}, 60, 0.5) for h in hosts}
    names = [c.name for c in counters.PATH_COUNTERS if c.source == "tcp_info"]
    paths = {h: {f"{hosts[(i + j + 1) % 1024]}|{n}": (7 if (i, j) == (500, 3) and n == "tcp_retrans_segs" else 1)
                 for j in range(64) for n in names} for i, h in enumerate(hosts)}
    field = record_field.build(host_deltas, 1795363100.0, 1795363100.5, hosts=hosts, paths=paths)
    assert len(field["paths"]) == record_field.MAX_PATHS
    assert field["dropped"] == 1024 * 48 - record_field.MAX_MOVED + 1024 * 64 * len(names) - record_field.MAX_PATHS
    worst = f"{hosts[500]}>{hosts[504]}"
    assert field["paths"][f"{worst}|tcp_retrans_segs"] == 7 and f"{worst}|tcp_rtt_us_max" in field["paths"]
    assert record_field.validate(field) is None
    line = json.dumps({"type": "result", "congestion": field})
    assert len(line) < (1 << 20) * 0.8, len(line)


@pytest.mark.mpi
def test_a_tcp_job_on_one_host_has_no_paths_field(tmp_path):
    """ob1 over loopback: every socket is this host's own, no path to read, no field at all."""
    config = {"ranks": 2, "transport": "ob1-tcp", "step_timeout": 300,
              "congestion": {"enabled": True, "sysfs_root": str(tmp_path / "no-rdma")}}
    cfg = tmp_path / "collbench.yaml"
    cfg.write_text(yaml.safe_dump(config))
    results = tmp_path / "results.jsonl"
    proc = subprocess.run([sys.executable, "-m", "collbench", "once", "--config", str(cfg), "--results", str(results),
                           "--quiet", "--ops", "allreduce", "--sizes", "1MB", "--iterations", "10"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = [r for r in map(json.loads, results.read_text().splitlines()) if r["type"] == "result"]
    assert rec["congestion"]["hosts_read"] == 1 and "paths" not in rec["congestion"], rec["congestion"]
