"""topo measure, hosts_order and the rank-order launch files, topo compare's statistics and order
files: the pieces on their own, real mpirun jobs on this machine, and a namespace testbed where
one host's link is shaped slower than the rest (measure must name that host).

The end-to-end proof on a two-rack testbed is test_topo_e2e.py.
"""

import json
import os
import subprocess
import sys

import pytest

from collbench.config import build_config, load_config
from collbench.engines import rank_order
from collbench.engines.launcher import build_command
from collbench.errors import ConfigError, UserError
from collbench.results.record_parser import is_record, parse_record
from collbench.topo import compare, measure
from collbench.pair_matrix import load_matrices
from conftest import REPO, is_root

# ---------------------------------------------------------------- hosts_order in the config


def _cfg(tmp_path, **data):
    return build_config(data, str(tmp_path / "c.yaml"), str(tmp_path))


def test_hosts_order_sets_the_ranks_and_keeps_repeats(tmp_path):
    cfg = _cfg(tmp_path, hosts=["a:2", "b", "c"], hosts_order=["b", "a", "c", "a"])
    assert cfg.ranks == 4
    assert cfg.hosts_order == ["b", "a", "c", "a"]
    assert rank_order.slots(cfg.hosts_order) == [0, 0, 0, 1]


@pytest.mark.parametrize("data, key, words", [
    ({"hosts": ["a", "b"], "hosts_order": ["a", "x"]}, "hosts_order[1]", "'x'"),
    ({"hosts": ["a", "b"], "hosts_order": ["a", 7]}, "hosts_order[1]", "7"),
    ({"hosts": ["a", "b"], "hosts_order": "a,b"}, "hosts_order", "a list of host names"),
    ({"hosts": ["a", "b"], "hosts_order": []}, "hosts_order", "a list of host names"),
    ({"hosts": ["a", "b"], "hosts_order": [["a"]]}, "hosts_order[0]", "expected one of"),
    ({"hosts": ["a", "b"], "hosts_order": ["a", "a"]}, "hosts_order", "host a has 2 ranks but 1 slot"),
    ({"hosts": ["a", "b"], "ranks": 3, "hosts_order": ["a", "b"]}, "hosts_order", "2 entries for 3 ranks"),
    ({"hosts_order": ["localhost"]}, "hosts_order", "needs `hosts`"),
])
def test_bad_hosts_order_names_the_entry(tmp_path, data, key, words):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, **data)
    assert e.value.exit_code == 2
    assert f": {key}: " in str(e.value) and words in str(e.value), str(e.value)


def test_hosts_order_may_oversubscribe_when_allowed(tmp_path):
    cfg = _cfg(tmp_path, hosts=["a", "b"], oversubscribe=True, hosts_order=["a", "a", "b"])
    assert cfg.ranks == 3


def test_a_bad_hosts_order_is_exit_2_on_the_command_line(tmp_path):
    (tmp_path / "c.yaml").write_text("hosts: [a, b]\nhosts_order: [b, nodeX]\n")
    r = subprocess.run([sys.executable, "-m", "collbench", "once", "--config", str(tmp_path / "c.yaml")],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2
    assert "hosts_order[1]: got 'nodeX', expected one of the config's hosts (a, b)" in r.stderr


# ---------------------------------------------------------------- the launch files


def test_mpirun_gets_a_rankfile_in_rank_order(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    cfg = _cfg(tmp_path, hosts=["a:2", "b", "c"], hosts_order=["c", "a", "b", "a"],
               launcher_args=["--bind-to", "core"])
    argv, _ = build_command(cfg, ["prog"])
    assert argv[argv.index("-np") + 1] == "4"
    assert "--map-by" not in argv
    text = open(argv[argv.index("--rankfile") + 1]).read()
    assert [ln for ln in text.splitlines() if not ln.startswith("#")] == [
        "rank 0=c slot=0", "rank 1=a slot=0", "rank 2=b slot=0", "rank 3=a slot=1"]
    assert argv[-1] == "prog"


def test_unbound_launches_get_every_core(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    for extra in ({}, {"launcher_args": ["--bind-to", "none"]}, {"oversubscribe": True}):
        cfg = _cfg(tmp_path, hosts=["a", "b"], hosts_order=["b", "a"], **extra)
        argv, _ = build_command(cfg, ["prog"])
        text = open(argv[argv.index("--rankfile") + 1]).read()
        assert "rank 0=b slot=*:*" in text and "rank 1=a slot=*:*" in text, (extra, text)


def test_srun_gets_a_slurm_hostfile(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    cfg = _cfg(tmp_path, hosts=["a", "b", "c"], hosts_order=["c", "a", "b"], launcher="srun",
               launcher_path=str(srun))
    argv, env = build_command(cfg, ["prog"])
    assert "--distribution=arbitrary" in argv and "--nodelist" not in argv
    assert open(env["SLURM_HOSTFILE"]).read() == "c\na\nb\n"


def test_mpich_gets_a_machinefile(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    cfg = _cfg(tmp_path, hosts=["a:2", "b"], hosts_order=["a", "a", "b"], launcher_path="mpirun.mpich")
    argv, _ = build_command(cfg, ["prog"])
    assert "-hosts" not in argv
    assert open(argv[argv.index("-f") + 1]).read().splitlines()[-2:] == ["a:2", "b:1"]


def test_a_job_of_another_size_than_the_order_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    cfg = _cfg(tmp_path, hosts=["a", "b"], hosts_order=["b", "a"])
    with pytest.raises(UserError, match="hosts_order lists 2 ranks, but the job runs 3"):
        build_command(cfg, ["prog"], ranks=3)


def test_launch_files_are_shared_by_content_and_written_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    a = rank_order.write_order_file("x\n", "rankfile")
    assert rank_order.write_order_file("x\n", "rankfile") == a
    b = rank_order.write_order_file("y\n", "rankfile")
    assert a != b and open(a).read() == "x\n" and open(b).read() == "y\n"
    with open(a, "w") as f:      # a damaged file is rewritten, not trusted
        f.write("garbage")
    assert open(rank_order.write_order_file("x\n", "rankfile")).read() == "x\n"
    assert not [n for n in os.listdir(os.path.dirname(a)) if n.endswith(".tmp")]


# ---------------------------------------------------------------- the engine's pair lines


def test_pair_lines_are_checked():
    ok = measure.parse_pair_line('CBPAIR {"a":0,"b":2,"round":1,"lat_us":3.5,"bw_bytes_per_s":1e9}', 3)
    assert ok == {"a": 0, "b": 2, "round": 1, "lat_us": 3.5, "bw_bytes_per_s": 1e9}
    assert measure.parse_pair_line("CBREC {}", 3) is None
    assert measure.parse_pair_line("some MPI warning", 3) is None
    for bad in ('CBPAIR {"a":0,"b":3,"round":1,"lat_us":3.5,"bw_bytes_per_s":1e9}',     # out of range
                'CBPAIR {"a":1,"b":1,"round":1,"lat_us":3.5,"bw_bytes_per_s":1e9}',     # not a pair
                'CBPAIR {"a":0,"b":1,"round":1,"lat_us":0,"bw_bytes_per_s":1e9}',       # zero
                'CBPAIR {"a":0,"b":1,"round":1,"lat_us":"3","bw_bytes_per_s":1e9}',     # string
                'CBPAIR {"a":true,"b":1,"round":1,"lat_us":3,"bw_bytes_per_s":1e9}',    # bool
                'CBPAIR {"a":0,"b":1,"round":1,"lat_us":3}',                            # missing
                'CBPAIR [1,2]', 'CBPAIR {"a":0,', 'CBPAIR ' + "x" * 5000):
        with pytest.raises(ValueError):
            measure.parse_pair_line(bad, 3)


def test_reported_names_get_slots_when_a_host_repeats():
    assert measure.labels_from_reported(["n1", "n2"]) == ["n1", "n2"]
    assert measure.labels_from_reported(["n1", "n1", "n2"]) == ["n1:0", "n1:1", "n2"]


def test_measure_places_ranks_per_host_in_config_order(tmp_path):
    cfg = _cfg(tmp_path, hosts=["b:2", "a:2"])
    job, labels = measure.measure_config(cfg, 2)
    assert job.hosts_order == ["b", "b", "a", "a"] and job.ranks == 4
    assert labels == ["b:0", "b:1", "a:0", "a:1"]
    with pytest.raises(UserError, match="--ranks-per-host 3: host b has 2 slot"):
        measure.measure_config(cfg, 3)
    with pytest.raises(UserError, match="no pair to measure"):
        measure.measure_config(_cfg(tmp_path, hosts=["a"]), 1)


# ---------------------------------------------------------------- compare: orders and statistics


def test_order_files_of_every_form_give_the_same_order(tmp_path):
    from collbench.topo import order_files
    cfg = _cfg(tmp_path, hosts=["h0", "h1", "h2", "h3"])
    labels = ["h2", "h0", "h3", "h1"]
    order_files.write_order_files(str(tmp_path / "o"), "ring", labels, {"hosts_order": labels})
    for suffix in order_files.SUFFIXES:
        assert compare.load_order(str(tmp_path / "o" / f"ring.{suffix}"), cfg) == labels, suffix
    assert compare.original_order(cfg, labels) == ["h0", "h1", "h2", "h3"]


@pytest.mark.parametrize("name, text, words", [
    ("o.yaml", "hosts_order: [h0, hX]\n", "entry 1: 'hX' is not a host"),
    ("o.yaml", "order: [h0]\n", "expected a mapping with `hosts_order:`"),
    ("o.yaml", "a: *x\n", "--order"),
    ("o.json", '{"hosts_order": "h0"}', "expected a list of at least 2 hosts"),
    ("o.json", "[", "not valid JSON"),
    ("o.rankfile", "rank 0=h0 slot=0\nrank 0=h1 slot=0\n", "rank 0 given twice"),
    ("o.rankfile", "rank 0=h0 slot=0\nrank 2=h1 slot=0\n", "not 0..1"),
    ("o.rankfile", "rank 0=h0 slot=0\nbogus\n", "line 2"),
    ("o.machinefile", "h0:2\n", "host h0 runs 2 ranks but has 1 slot"),
    ("o.machinefile", "h0:x\n", "line 1"),
    ("o.hostfile", "h0\n", "at least 2 hosts"),
])
def test_bad_order_files_are_exit_2_naming_the_problem(tmp_path, name, text, words):
    cfg = _cfg(tmp_path, hosts=["h0", "h1"])
    (tmp_path / name).write_text(text)
    with pytest.raises(UserError) as e:
        compare.load_order(str(tmp_path / name), cfg)
    assert e.value.exit_code == 2 and words in str(e.value) and name in str(e.value), str(e.value)


def test_bootstrap_interval_brackets_the_speedup_and_narrows_with_agreement():
    tight = compare.bootstrap_speedup([100.0, 101, 99, 100, 102, 98], [50.0, 50.5, 49.5, 50, 51, 49])
    assert tight[0] == pytest.approx(2.0, rel=0.02)
    assert tight[1] <= tight[0] <= tight[2] and tight[2] - tight[1] < 0.15
    loose = compare.bootstrap_speedup([100.0, 150, 60, 120, 80, 140], [50.0, 90, 30, 70, 40, 60])
    assert loose[1] <= loose[0] <= loose[2] and (loose[2] - loose[1]) > (tight[2] - tight[1])
    assert compare.bootstrap_speedup([1.0, 2.0], [1.0, 2.0]) == compare.bootstrap_speedup([1.0, 2.0], [1.0, 2.0])
    assert compare.bootstrap_speedup([5.0], [2.5]) == (2.0, None, None)


def test_blocks_cover_the_iterations_with_the_algorithm():
    s = compare.Settings(sizes=(1024, 4096), iterations=100, blocks=8, warmup=7)
    steps = compare.block_steps(s, "allgather", "ring")
    assert len(steps) == 16 and all(st.algorithm == "ring" for st in steps)
    assert sum(st.iterations for st in steps if st.size_bytes == 1024) >= 100
    assert [st.warmup for st in steps[:8]] == [7] + [1] * 7
    s2 = compare.Settings(sizes=(1024,), iterations=100, blocks=10, warmup=7, rounds=2)
    parts = compare._split_rounds(compare.block_steps(s2, "allgather", "ring"), s2)
    assert [len(p) for p in parts] == [5, 5] and parts[1][0].warmup == 7


# ---------------------------------------------------------------- real jobs on this machine


@pytest.mark.mpi
def test_measure_on_this_machine_writes_matrices_pictures_and_records(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ranks: 3\ntransport: shm\nstep_timeout: 120\n")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "collbench", "topo", "measure", "--config", str(cfg),
                        "--iterations", "20", "--bw-size", "64KB", "--out-dir", str(out), "--picture", "svg",
                        "--format", "json", "--results", str(tmp_path / "r.jsonl")],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    host = os.uname().nodename
    assert doc["hosts"] == [f"{host}:0", f"{host}:1", f"{host}:2"]
    assert doc["meta"]["ranks"] == 3 and doc["meta"]["bw_size"] == 65536
    ms = load_matrices(str(out / "matrix.json"))
    assert set(ms) == {"latency", "bandwidth"}
    for m in ms.values():
        assert m.size == 3 and all(m.values[i][j] > 0 for i in range(3) for j in range(3) if i != j)
    assert (out / "latency.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    assert (out / "bandwidth.csv").read_text().startswith("bandwidth_GBps,")
    recs = [parse_record(line) for line in open(tmp_path / "r.jsonl")]
    assert all(is_record(x) for x in recs)
    pairs = [x for x in recs if x["event"] == "topo_pair"]
    assert len(pairs) == 3 and {(x["a"], x["b"]) for x in pairs} == {
        (doc["hosts"][0], doc["hosts"][1]), (doc["hosts"][0], doc["hosts"][2]), (doc["hosts"][1], doc["hosts"][2])}
    assert recs[-1]["event"] == "topo_measure" and recs[-1]["run_id"] == pairs[0]["run_id"]


@pytest.mark.mpi
def test_a_failed_measurement_is_exit_1_with_a_failure_record_and_no_files(tmp_path):
    cfg = tmp_path / "c.yaml"
    # a host that does not resolve: mpirun cannot start its daemon there
    cfg.write_text("hosts: [localhost, no-such-host.invalid]\ntransport: ob1-tcp\nstep_timeout: 60\n"
                   "launcher_args: [--mca, plm_rsh_args, '-o BatchMode=yes -o ConnectTimeout=5']\n")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "collbench", "topo", "measure", "--config", str(cfg),
                        "--iterations", "5", "--out-dir", str(out), "--results", str(tmp_path / "r.jsonl")],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "topo measure: the measurement job exited with code" in r.stderr
    assert not (out / "matrix.json").exists()
    rec = parse_record(open(tmp_path / "r.jsonl").read().splitlines()[-1])
    assert is_record(rec) and rec["type"] == "failure" and rec["error"].startswith("topo measure:")


@pytest.mark.mpi
def test_hosts_order_runs_ranks_where_it_says(tmp_path, monkeypatch):
    """Two ranks on this machine in a configured order; the engine reports where each ran."""
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    host = os.uname().nodename
    cfg = _cfg(tmp_path, hosts=[f"{host}:2"], hosts_order=[host, host], transport="shm")
    from collbench.engines.build import ensure_engine
    argv, env = build_command(cfg, [ensure_engine(cfg), "--pairs", "--iterations", "3", "--bw-size", "1024",
                                    "--report-hosts"])
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f'CBHOSTS {{"hosts":["{host}","{host}"]}}' in r.stdout


# ---------------------------------------------------------------- a testbed with one slow host


PREFIX = "cbtm13"    # namespaces of this file's testbeds (others' testbeds use other prefixes)


@pytest.fixture
def slow_host_bed(tmp_path):
    assert is_root(), "the testbed needs root"
    from lab import testbed
    # every link shaped (a CPU-bound veth is noisy), h4's much slower
    desc = testbed.up(6, str(tmp_path / "tb"), prefix=PREFIX, rate_limit="200mbit", link_rates={"h4": "30mbit"},
                      python=sys.executable)
    try:
        yield desc
    finally:
        testbed.down(desc["dir"])
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [h for h in desc["hosts"] if h["netns"] in listed]


@pytest.mark.netns
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.alone     # the slow link is found by timing
def test_measure_names_the_host_whose_link_is_slow(slow_host_bed, tmp_path):
    bed = slow_host_bed
    slow = next(h["addr"] for h in bed["hosts"] if h["alias"] == "h4")
    out = tmp_path / "m"
    r = subprocess.run([sys.executable, "-m", "collbench", "topo", "measure", "--config", bed["config"],
                        "--iterations", "10", "--bw-size", "256KB", "--out-dir", str(out), "--format", "json",
                        "--outlier-metric", "bandwidth", "--fail-on-outlier", "--timeout", "120"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr        # outliers found
    doc = json.loads(r.stdout)
    assert doc["hosts"] == [h["addr"] for h in bed["hosts"]]
    found = doc["outliers"]["bandwidth"]["hosts"]
    assert [h["host"] for h in found] == [slow], found
    assert found[0]["factor"] > 2.0
    # the evidence: every link of the slow host is slower than every other link
    bw = load_matrices(str(out / "matrix.json"))["bandwidth"]
    i = bw.labels.index(slow)
    slow_links = [bw.pair_value(i, j) for j in range(bw.size) if j != i]
    others = [bw.pair_value(a, b) for a in range(bw.size) for b in range(a + 1, bw.size) if i not in (a, b)]
    assert max(slow_links) < min(others), (slow_links, others)
    report = json.loads((out / "outliers.json").read_text())
    assert report["bandwidth"]["hosts"][0]["host"] == slow
    assert (out / "bandwidth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.mpi
def test_compare_on_this_machine_forces_both_algorithms_in_both_orders(tmp_path):
    """hosts_order of the config as the new order (ranks swapped between the two slots of this
    machine's two host names): every point measured in both orders, records labelled."""
    host = os.uname().nodename
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text({"hosts": [f"{host}:2", "localhost:2"], "transport": "shm", "step_timeout": 120,
                              "oversubscribe": True,
                              "hosts_order": ["localhost", host, "localhost", host]}))
    results = tmp_path / "r.jsonl"
    r = subprocess.run([sys.executable, "-m", "collbench", "topo", "compare", "--config", str(cfg),
                        "--ops", "allgather,allreduce", "--sizes", "4KB", "--iterations", "12", "--blocks", "3",
                        "--format", "json", "--results", str(results)],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    for pattern in ("ring", "recursive-doubling"):
        assert doc["orders"][pattern] == {"original": [host, host, "localhost", "localhost"],
                                          "new": ["localhost", host, "localhost", host], "label": "hosts_order"}
    assert [(p["pattern"], p["op"]) for p in doc["points"]] == [
        ("ring", "allgather"), ("ring", "allreduce"), ("recursive-doubling", "allgather"),
        ("recursive-doubling", "allreduce")]
    for p in doc["points"]:
        assert p["blocks_original"] == p["blocks_new"] == 3 and not p["errors"], p
        assert p["speedup"] > 0 and p["ci_low"] <= p["speedup"] <= p["ci_high"]
        assert p["predicted_speedup"] is None      # no matrix, no prediction
    recs = [parse_record(line) for line in open(results)]
    assert all(is_record(x) for x in recs)
    res = [x for x in recs if x["type"] == "result"]
    assert len(res) == 4 * 2 * 3
    assert {(x["pattern"], x["algorithm"], x["order"]) for x in res} == {
        (p, a, o) for p, a in (("ring", "ring"), ("recursive-doubling", "recursive_doubling"))
        for o in ("original", "hosts_order")}
    assert len({x["run_id"] for x in res}) == 1
    assert recs[-1]["event"] == "topo_compare"


def test_compare_without_a_new_order_is_exit_2(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("hosts: [a, b]\n")
    r = subprocess.run([sys.executable, "-m", "collbench", "topo", "compare", "--config", str(cfg)],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "no new order" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "collbench", "topo", "compare", "--config", str(cfg),
                        "--order", str(cfg), "--patterns", "ring,butterfly"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "--patterns" in r.stderr, r.stderr


@pytest.mark.mpi
def test_concurrent_measurement_of_four_ranks(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ranks: 4\ntransport: shm\nstep_timeout: 120\n")
    r = subprocess.run([sys.executable, "-m", "collbench", "topo", "measure", "--config", str(cfg), "--concurrent",
                        "--iterations", "10", "--bw-size", "16KB", "--out-dir", str(tmp_path / "o"), "--format", "csv"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert rows[0] == "a,b,round,latency_us,bandwidth_GBps,latency_outlier,bandwidth_outlier"
    assert len(rows) == 1 + 6
    assert sorted({int(x.split(",")[2]) for x in rows[1:]}) == [0, 1, 2]     # 3 rounds of 2 pairs
    assert load_matrices(str(tmp_path / "o" / "matrix.json"))["latency"].meta["concurrent"] is True


def yaml_text(data):
    import yaml
    return yaml.safe_dump(data)


@pytest.mark.mpi
def test_compare_with_a_host_that_cannot_be_reached_is_exit_1_with_the_error_on_its_row(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("hosts: [localhost, no-such-host.invalid]\ntransport: ob1-tcp\nstep_timeout: 60\n"
                   "hosts_order: [no-such-host.invalid, localhost]\n"
                   "launcher_args: [--mca, plm_rsh_args, '-o BatchMode=yes -o ConnectTimeout=5']\n")
    results = tmp_path / "r.jsonl"
    r = subprocess.run([sys.executable, "-m", "collbench", "topo", "compare", "--config", str(cfg), "--patterns",
                        "ring", "--sizes", "1KB", "--iterations", "2", "--blocks", "2", "--format", "json",
                        "--results", str(results)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    (point,) = json.loads(r.stdout)["points"]
    assert point["speedup"] is None and point["blocks_original"] == point["blocks_new"] == 0
    assert point["errors"] and point["errors"][0].startswith("original order: ")
    fails = [parse_record(line) for line in open(results)]
    fails = [x for x in fails if x["type"] == "failure"]
    assert fails and all(x["order"] in ("original", "hosts_order") and x["pattern"] == "ring" for x in fails)
