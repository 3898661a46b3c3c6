"""`collbench doctor` on fixture sysfs trees and mlnx_qos outputs (mlx5 settings exist nowhere
here): healthy hosts, PFC without ECN, ECN without PFC, MTUs that differ, a port down, settings
against the config's expectations and the UCX_*/NCCL_IB_* env, hostile facts and results, bad
input exit 2. The real `collbench doctor` process runs in every case."""

import json
import os
import subprocess
import sys

import pytest

from collbench.doctor import checks, facts
from conftest import REPO

QOS = ("DCBX mode: OS controlled\nPriority trust state: {trust}\ndscp2prio mapping:\n"
       "\tprio:0 dscp:07,06,05,04,03,02,01,00,\nCable len: 7\nPFC configuration:\n"
       "\tpriority    0   1   2   3   4   5   6   7\n\tenabled     {pfc}\n\tbuffer      0   0   0   1   0   0   0   0\n"
       "tc: 0 ratelimit: unlimited, tsa: vendor\n")


def _w(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def make_host(root, mtu=4200, pfc=(3,), ecn_np=(3,), ecn_rp=(3,), trust="dscp", state="4: ACTIVE",
              phys="5: LinkUp", rate="100 Gb/sec (4X EDR)", operstate="up", v2_index=3, netdev="eth2"):
    """A host's sysfs tree under root/sys and its mlnx_qos output in root/qos/<netdev>."""
    sysfs, net = os.path.join(root, "sys"), os.path.join(root, "sys", "class", "net", netdev)
    _w(f"{net}/mtu", f"{mtu}\n")
    _w(f"{net}/operstate", f"{operstate}\n")
    for p in range(8):
        _w(f"{net}/ecn/roce_np/enable/{p}", f"{int(p in ecn_np)}\n")
        _w(f"{net}/ecn/roce_rp/enable/{p}", f"{int(p in ecn_rp)}\n")
    _w(f"{net}/ecn/roce_np/cnp_802p_prio", "6\n")
    _w(f"{net}/ecn/roce_np/cnp_dscp", "48\n")
    port = os.path.join(sysfs, "class", "infiniband", "mlx5_0", "ports", "1")
    for name, text in (("state", state), ("phys_state", phys), ("rate", rate), ("link_layer", "Ethernet")):
        _w(f"{port}/{name}", text + "\n")
    for i in range(v2_index + 2):
        gid = "0000:0000:0000:0000:0000:ffff:c612:0001" if i >= 2 else "fe80:0000:0000:0000:0202:c9ff:fe00:0001"
        _w(f"{port}/gids/{i}", gid + "\n")
        _w(f"{port}/gid_attrs/types/{i}", ("RoCE v2" if i % 2 == v2_index % 2 else "IB/RoCE v1") + "\n")
        _w(f"{port}/gid_attrs/ndevs/{i}", netdev + "\n")
    _w(f"{port}/gids/{v2_index + 2}", "0000:0000:0000:0000:0000:0000:0000:0000\n")
    _w(os.path.join(root, "qos", netdev), QOS.format(trust=trust, pfc="   ".join(str(int(p in pfc)) for p in range(8))))
    return {"sysfs_root": sysfs, "qos_dir": os.path.join(root, "qos")}


def write_config(tmp_path, hosts, extra=""):
    lines = ["hosts: [" + ", ".join(hosts) + "]", f"state_dir: {tmp_path / 'state'}", "doctor:", "  hosts:"]
    for name, roots in hosts.items():
        lines.append(f"    {name}: {{sysfs_root: {roots['sysfs_root']}, qos_dir: {roots['qos_dir']}}}")
    path = tmp_path / "collbench.yaml"
    path.write_text("\n".join(lines) + "\n" + extra)
    return str(path)


def doctor(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "collbench", "doctor", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def verdicts(r):
    doc = json.loads(r.stdout)
    return {h["host"]: (h["verdict"], [x["reason"] for x in h["reasons"]]) for h in doc["hosts"]}


def fleet(tmp_path, n=4, **odd):
    """n hosts alike; host n{k} gets make_host's keywords from odd['n{k}']."""
    return {f"n{k}": make_host(str(tmp_path / f"n{k}"), **odd.get(f"n{k}", {})) for k in range(1, n + 1)}


def test_healthy_fleet_exit_0_in_every_format(tmp_path):
    cfg = write_config(tmp_path, fleet(tmp_path), "  mtu: 4200\n  link_gbps: 100\n  link_width: 4X\n"
                       "  pfc_priorities: [3]\n  ecn_priorities: [3]\n  trust: dscp\n  cnp_802p_prio: 6\n"
                       "  cnp_dscp: 48\n  gid_index: 3\nenv: {NCCL_IB_GID_INDEX: '3', NCCL_IB_HCA: mlx5_0, NCCL_IB_TC: '106'}\n")
    r = doctor("--config", cfg, "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert verdicts(r) == {f"n{k}": ("healthy", []) for k in range(1, 5)}
    r = doctor("--config", cfg)
    assert r.returncode == 0 and "4 of 4 host(s) healthy" in r.stdout, r.stdout
    r = doctor("--config", cfg, "--format", "csv")
    assert r.returncode == 0 and r.stdout.splitlines() == ["host,verdict,reasons"] + [f"n{k},healthy," for k in range(1, 5)]


def test_pfc_without_ecn_names_the_priority_and_side(tmp_path):
    cfg = write_config(tmp_path, fleet(tmp_path, n1={"ecn_rp": ()}))
    r = doctor("--config", cfg, "--format", "json")
    assert r.returncode == 1, r.stdout + r.stderr
    v = verdicts(r)
    assert v["n1"][0] == "degraded" and any("PFC without ECN on priority 3 (roce_rp off)" in x for x in v["n1"][1]), v
    assert all(v[h] == ("healthy", []) for h in ("n2", "n3", "n4")), v


def test_ecn_without_pfc_on_the_traffic_priority(tmp_path):
    # every host alike, none with PFC: ECN on priority 3 alone, where NCCL_IB_TC=106 (DSCP 26) sends
    cfg = write_config(tmp_path, fleet(tmp_path, n=3, n1={"pfc": ()}, n2={"pfc": ()}, n3={"pfc": ()}),
                       "env: {NCCL_IB_TC: '106'}\n")
    r = doctor("--config", cfg, "--format", "json")
    assert r.returncode == 1
    for h, (verdict, reasons) in verdicts(r).items():
        assert verdict == "degraded" and any("ECN on priority 3 without PFC (the traffic's priority, NCCL_IB_TC=106)"
                                             in x for x in reasons), (h, reasons)


def test_mtu_mismatch_names_the_odd_host(tmp_path):
    cfg = write_config(tmp_path, fleet(tmp_path, n3={"mtu": 1500}))
    r = doctor("--config", cfg, "--format", "json")
    v = verdicts(r)
    assert r.returncode == 1 and v["n3"][0] == "degraded", v
    assert any("MTU 1500 differs from other hosts' 4200" in x for x in v["n3"][1]), v
    assert [h for h, (verdict, _) in v.items() if verdict != "healthy"] == ["n3"]


def test_port_down_is_failed(tmp_path):
    cfg = write_config(tmp_path, fleet(tmp_path, n2={"state": "1: DOWN", "phys": "3: Disabled"}, n4={"operstate": "down"}))
    r = doctor("--config", cfg)
    assert r.returncode == 1
    assert "n2  FAILED" in r.stdout and "mlx5_0 port 1: state 1: DOWN" in r.stdout, r.stdout
    assert "n4  FAILED" in r.stdout and "eth2: link is down (operstate)" in r.stdout, r.stdout
    assert "n1  HEALTHY" in r.stdout and "look at n2, n4" in r.stdout


def test_expectations_and_env_against_the_hosts(tmp_path):
    cfg = write_config(tmp_path, fleet(tmp_path, n=2, n2={"rate": "50 Gb/sec (2X HDR)", "trust": "pcp"}),
                       "  link_gbps: 100\n  trust: dscp\nenv: {NCCL_IB_GID_INDEX: '2', NCCL_IB_HCA: mlx5_1}\n")
    v = verdicts(doctor("--config", cfg, "--format", "json"))
    n1, n2 = v["n1"][1], v["n2"][1]
    assert any("GID index 2 (NCCL_IB_GID_INDEX=2) is IB/RoCE v1, the RoCE v2 GIDs are at [1, 3]" in x for x in n1), n1
    assert any("NCCL_IB_HCA names mlx5_1" in x for x in n1) and v["n1"][0] == "failed", n1
    assert any("50 Gb/s, the config expects 100" in x for x in n2), n2
    assert any("trust mode pcp, the config expects dscp" in x for x in n2), n2


def test_results_failures_and_the_waited_for_host(tmp_path):
    hosts = fleet(tmp_path, n=3)
    cfg = write_config(tmp_path, hosts)
    log = tmp_path / "results.jsonl"

    def result(i, **extra):
        return json.dumps({"type": "result", "schema": 1, "ts": 1000 + i, "op": "allreduce", "size": "1MB",
                           "size_bytes": 1 << 20, "latency_avg_us": 10.0, "latency_min_us": 9.0,
                           "latency_max_us": 12.0, "hosts": ["n1", "n2", "n3"], "ranks": 3, "iterations": 10,
                           "warmup": 1, "nodes": 3, **extra})
    # n2's rank was on its CPU 5 % of each loop, its peers 90 %: the others waited for it; n1's
    # rank was the slowest (it waited longest), which says nothing against n1
    lines = [result(i, straggler_rank=0, offcpu_rank=1, offcpu_share_max=0.95, offcpu_share_avg=0.4)
             for i in range(6)]
    lines.append("{not json")
    lines.append(json.dumps({"type": "failure", "schema": 1, "ts": 2000, "op": "bcast", "size": "1MB",
                             "hosts": ["n3"], "ranks": 1, "error": "rank 0 exited 1", "status": "failed"}))
    log.write_text("\n".join(lines) + "\n")
    r = doctor("--config", cfg, "--results", str(log), "--format", "json")
    v = verdicts(r)
    assert r.returncode == 1, r.stderr
    assert any("the others waited for its rank (kept off its CPU) in 6 of its 6 latest steps" in x
               for x in v["n2"][1]), v
    assert any("the latest step it ran in failed" in x and "rank 0 exited 1" in x for x in v["n3"][1]), v
    assert v["n1"] == ("healthy", []), v
    # the slowest rank alone (an older log, no off-CPU fields) marks no host
    log.write_text("\n".join(result(i, straggler_rank=1) for i in range(6)) + "\n")
    v = verdicts(doctor("--config", cfg, "--results", str(log), "--format", "json"))
    assert v["n2"] == ("healthy", []), v


def test_bad_input_exit_2(tmp_path):
    hosts = fleet(tmp_path, n=2)
    for extra, key in (("  pfc_priorities: [9]\n", "doctor.pfc_priorities"), ("  trust: maybe\n", "doctor.trust"),
                       ("  hosts: {n1: {sysfs_root: relative}}\n", "doctor.hosts"), ("  bogus: 1\n", "doctor.bogus")):
        path = tmp_path / "bad.yaml"
        path.write_text(f"hosts: [n1, n2]\ndoctor:\n{extra}")
        r = doctor("--config", str(path))
        assert r.returncode == 2 and key in r.stderr and "Traceback" not in r.stderr, (extra, r.stderr)
    r = doctor("--config", write_config(tmp_path, hosts), "--results", str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2 and "missing.jsonl" in r.stderr and not r.stdout, r.stderr
    r = doctor("--config", write_config(tmp_path, hosts), "--format", "xml")
    assert r.returncode == 2


def test_hostile_facts_and_files_never_raise(tmp_path):
    """A host's answer (doctor.remote) of any shape is judged, never a traceback; garbage in sysfs
    files reads as unreadable."""
    from types import SimpleNamespace
    from collbench.config.loader import build_config
    from collbench.doctor.gather import HostFacts
    cfg = build_config({"hosts": ["a", "b", "c", "d"]}, "t", str(tmp_path))
    bad = [HostFacts("a", [1, 2]), HostFacts("b", {"rdma": {"x": 1}, "netdevs": {"eth0": {"mtu": "9000", "operstate": 5,
                                                                                   "ecn_np": [1], "pfc": "all"}}}),
           HostFacts("c", {"rdma": [{"gids": [{"index": True, "type": 3}], "rate": None}], "netdevs": {"e": None,
                                                                                              "f": {"pfc": [{}], "trust": []}}}),
           HostFacts("d", error="unreachable: ssh exit 255: Connection refused")]
    got = {v.host: v for v in checks.judge(bad, cfg)}
    assert got["a"].verdict == "failed" and "no network interface" in got["a"].reasons[0][1]
    assert got["b"].verdict == "failed" and any("MTU unreadable" in t for _, t in got["b"].reasons)
    assert got["c"].verdict == "failed" and got["d"].reasons == [("failed", "unreachable: ssh exit 255: Connection refused")]
    root = make_host(str(tmp_path / "g"))["sysfs_root"]
    with open(os.path.join(root, "class", "net", "eth2", "mtu"), "wb") as f:
        f.write(b"\xff\xfe" * 5000)
    assert facts.host_facts(root)["netdevs"]["eth2"]["mtu"] is None
    assert SimpleNamespace   # the import above is the module's public shape


def test_parse_mlnx_qos_and_rate():
    text = QOS.format(trust="dscp", pfc="0   0   0   1   1   0   0   0")
    assert facts.parse_mlnx_qos(text) == {"trust": "dscp", "pfc": [3, 4]}
    assert facts.parse_mlnx_qos("nothing here") == {}
    assert checks.parse_rate("100 Gb/sec (4X EDR)") == (100.0, "4X")
    assert checks.parse_rate("garbage") == (None, None)


@pytest.mark.parametrize("env,prio", [({"NCCL_IB_TC": "106"}, 3), ({"UCX_IB_TRAFFIC_CLASS": "160"}, 5),
                                      ({"NCCL_IB_SL": "4"}, 4), ({}, None)])
def test_traffic_priority_from_env(env, prio):
    assert checks.traffic_priority(env, None)[0] == prio


def test_one_host_has_no_peers_and_down_non_rdma_interfaces_are_notes(tmp_path):
    """A host's own interfaces are not its peers: two MTUs on one host are no mismatch; without
    RDMA ports every netdev is looked at, and one that is down (an unused ifb) is a note."""
    root = str(tmp_path / "solo")
    make_host(root, netdev="eth2", mtu=9000)
    net = os.path.join(root, "sys", "class", "net")
    _w(f"{net}/eth3/mtu", "1500\n")
    _w(f"{net}/eth3/operstate", "up\n")
    cfg = tmp_path / "solo.yaml"
    cfg.write_text(f"hosts: [solo]\ndoctor:\n  sysfs_root: {root}/sys\n  qos_dir: {root}/qos\n  netdevs: [eth2, eth3]\n")
    r = doctor("--config", str(cfg), "--format", "json")
    assert r.returncode == 0 and verdicts(r) == {"solo": ("healthy", [])}, r.stdout
    import shutil
    shutil.rmtree(os.path.join(root, "sys", "class", "infiniband"))
    _w(f"{net}/ifb0/mtu", "1500\n")
    _w(f"{net}/ifb0/operstate", "down\n")
    cfg.write_text(f"hosts: [solo]\ndoctor:\n  sysfs_root: {root}/sys\n  qos_dir: {root}/qos\n")
    doc = json.loads(doctor("--config", str(cfg), "--format", "json").stdout)["hosts"][0]
    assert doc["verdict"] == "healthy" and any(n.startswith("ifb0: down") for n in doc["notes"]), doc
