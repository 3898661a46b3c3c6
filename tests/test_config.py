"""Config and flag errors through `collbench once`: exit code 2, a message naming the file, the
key and what is allowed, and nothing run or written.

"Nothing ran" is observed, not assumed: the configs use the OSU engine with the stand-in
binaries (tests/osu_standin), which append a line to $OSU_STANDIN_MARK whenever mpirun starts
them. A control run of the same base config shows the mark does appear when a run happens.
"""

import os
import subprocess
import sys

import pytest
import yaml

from collbench.config import load_config
from collbench.errors import ConfigError
from collbench.ops import DATATYPES, OPS
from collbench.sizes import format_size, parse_size
from conftest import REPO

STANDIN = REPO / "tests" / "osu_standin"
ALL_OPS = ", ".join(OPS)


def base_config():
    return {"engine": "osu", "osu_path": str(STANDIN), "ranks": 2,
            "plan": [{"op": "allreduce", "sizes": ["1KB"], "iterations": 5}]}


def run_once(tmp_path, data=None, flags=(), raw=None):
    """Write the config, run `collbench once` on it; (process, config path, mark, results, tsv)."""
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(raw if raw is not None else yaml.safe_dump(data if data is not None else base_config()))
    mark, results, tsv = tmp_path / "mark", tmp_path / "out" / "r.jsonl", tmp_path / "out" / "r.tsv"
    results.parent.mkdir(exist_ok=True)
    env = dict(os.environ, OSU_STANDIN_MARK=str(mark))
    env.pop("OSU_PATH", None)
    p = subprocess.run([sys.executable, "-m", "collbench", "once", "--config", str(cfg),
                        "--results", str(results), "--tsv", str(tsv), *flags],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    return p, cfg, mark, results, tsv


def assert_rejected(tmp_path, p, mark, results, tsv, expected):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    msg = p.stderr
    assert msg.startswith("collbench: error: ") or "error:" in msg
    for piece in expected:
        assert piece in msg, f"{piece!r} not in {msg!r}"
    assert p.stdout == ""                       # no table: no step ran
    assert not mark.exists()                    # and no rank was ever started
    assert not results.exists() and not tsv.exists()
    assert os.listdir(results.parent) == []     # not even a temporary file


def test_control_run_leaves_a_mark(tmp_path):
    p, cfg, mark, results, tsv = run_once(tmp_path)
    assert p.returncode == 0, p.stderr
    assert mark.read_text().count("allreduce") == 2   # both ranks ran
    assert results.exists() and tsv.exists()


def with_(**changes):
    data = base_config()
    for key, value in changes.items():
        data[key] = value
    return data


CONFIG_CASES = {
    "unknown top-level key": (with_(bogus_key=1), ["bogus_key: unknown key (allowed: hosts, ranks, "]),
    "unknown section key": (with_(stress={"pauze": 5}), ["stress.pauze: unknown key (allowed: pause, duty_cycle"]),
    "unknown plan key": (with_(plan=[{"op": "allreduce", "sizes": ["1KB"], "iters": 5}]),
                         ["plan[0].iters: unknown key (allowed: op, sizes, iterations, warmup, datatype, algorithm)"]),
    "wrong type: ranks": (with_(ranks="four"), ["ranks: got 'four', expected a positive whole number"]),
    "wrong type: validate": (with_(validate="sometimes"), ["validate: got 'sometimes', expected true or false"]),
    "wrong type: step_timeout": (with_(step_timeout="soon"), ["step_timeout: got 'soon'", "30s"]),
    "wrong type: env": (with_(env=["UCX_TLS"]), ["env: got ['UCX_TLS'], expected a mapping of NAME: value"]),
    "bad size": (with_(plan=[{"op": "allreduce", "sizes": ["3XB"]}]),
                 ["plan[0].sizes[0]: '3XB' is not a size (expected e.g. 1024, 64KB, 4MB)"]),
    "size out of range": (with_(plan=[{"op": "bcast", "sizes": ["4GB"]}]), ["plan[0].sizes[0]", "out of range"]),
    "size not a whole element": (with_(plan=[{"op": "allreduce", "sizes": [6]}]),
                                 ["plan[0].sizes[0]", "not a multiple of the float size (4 B)"]),
    "bad threshold size": (with_(thresholds={"latency": {"allreduce": {"2XB": {"warning": "1ms", "critical": "2ms"}}}}),
                           ["thresholds.latency.allreduce.2XB: '2XB' is not a size (expected e.g. 1024, 64KB, 4MB)"]),
    "unknown op": (with_(plan=[{"op": "allscatter", "sizes": ["1KB"]}]),
                   [f"plan[0].op: got 'allscatter', expected one of: {ALL_OPS}"]),
    "unknown op in thresholds": (with_(thresholds={"latency": {"allscatter": {}}}),
                                 [f"thresholds.latency.allscatter: unknown op (expected one of: {ALL_OPS})"]),
    "unknown datatype": (with_(datatype="quad"), [f"datatype: got 'quad', expected one of: {', '.join(DATATYPES)}"]),
    "unknown transport": (with_(transport="rdma"), ["transport: got 'rdma', expected one of: shm, ob1-tcp, ucx, ucx-tcp, none"]),
    "unknown engine": (with_(engine="nccl"), ["engine: got 'nccl', expected one of: builtin, osu, nccl-tests"]),
    "missing hostfile": (with_(hosts="nohosts.txt"),
                         ["hosts: hostfile {dir}/nohosts.txt does not exist (expected a hostfile path or a list of hosts)"]),
    "bad host entry": (with_(hosts=["node1:x"]), ["hosts[0]: got 'node1:x', expected name or name:slots"]),
    "more ranks than slots": (with_(hosts=["node1:1"], ranks=2), ["ranks: 2 ranks exceed the 1 slots", "oversubscribe: true"]),
    "osu binaries missing": (with_(osu_path="no-osu-here"),
                             ["osu_allreduce", "{dir}/no-osu-here  (osu_path in {cfg})", "OSU_PATH"]),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_config_error(tmp_path, case):
    data, expected = CONFIG_CASES[case]
    p, cfg, mark, results, tsv = run_once(tmp_path, data)
    expected = [e.format(dir=tmp_path, cfg=cfg) for e in expected]
    if "osu binaries" not in case:
        expected.append(f"{cfg}: ")   # the message starts with the file it is about
    assert_rejected(tmp_path, p, mark, results, tsv, expected)


def test_bad_hostfile_line_names_the_hostfile(tmp_path):
    (tmp_path / "hosts.txt").write_text("node1 slots=1\nnode2 slotz=2\n")
    p, cfg, mark, results, tsv = run_once(tmp_path, with_(hosts="hosts.txt"))
    assert_rejected(tmp_path, p, mark, results, tsv,
                    [f"{tmp_path}/hosts.txt: line 2: got 'node2 slotz=2', expected 'host slots=N'"])


@pytest.mark.parametrize("raw,expected", [
    ("ranks: [2\n", "not valid YAML"),
    ("- just\n- a list\n", "expected a mapping of settings at the top level"),
])
def test_unreadable_config(tmp_path, raw, expected):
    p, cfg, mark, results, tsv = run_once(tmp_path, raw=raw)
    assert_rejected(tmp_path, p, mark, results, tsv, [f"{cfg}: ", expected])


def test_missing_config_file(tmp_path):
    missing = tmp_path / "absent.yaml"
    p = subprocess.run([sys.executable, "-m", "collbench", "once", "--config", str(missing)],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 2 and f"{missing}: config file does not exist" in p.stderr and p.stdout == ""


FLAG_CASES = {
    "--ops": (["--ops", "allreduce,allscatter"], [f"--ops 'allscatter': unknown op 'allscatter' (expected one of: {ALL_OPS})"]),
    "--sizes": (["--sizes", "1KB,12QB"], ["--sizes: '12QB' is not a size (expected e.g. 1024, 64KB, 4MB)"]),
    "--sizes element": (["--sizes", "6"], ["--sizes: 6 B is not a multiple of the float size (4 B)"]),
    "--np": (["--np", "0"], ["--np: got 0, expected a whole number from 1 to 2147483647"]),
    "--np type": (["--np", "two"], ["argument --np: invalid int value: 'two'"]),
    "--iterations": (["--iterations", "0"], ["--iterations: got 0, expected a whole number from 1 to 1000000000000"]),
    "--datatype": (["--datatype", "quad"], [f"--datatype: got 'quad', expected one of: {', '.join(DATATYPES)}"]),
    "--datatype double with osu": (["--datatype", "double"], ["cannot run allreduce 1KB with datatype 'double'", "char, int, float"]),
    "--engine": (["--engine", "nccl"], ["argument --engine: invalid choice: 'nccl' (choose from 'builtin', 'nccl-tests', 'osu')"]),
}


@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_flag_error(tmp_path, case):
    flags, expected = FLAG_CASES[case]
    p, cfg, mark, results, tsv = run_once(tmp_path, flags=flags)
    assert_rejected(tmp_path, p, mark, results, tsv, expected)


def test_unwritable_results_path_is_refused_before_running(tmp_path):
    p, cfg, mark, results, tsv = run_once(tmp_path, flags=["--results", str(tmp_path / "nodir" / "r.jsonl")])
    assert_rejected(tmp_path, p, mark, results, tsv, [f"--results {tmp_path}/nodir/r.jsonl: directory {tmp_path}/nodir does not exist"])


# ------------------------------------------------------------------ sizes and the example config

@pytest.mark.parametrize("text,nbytes", [
    ("1", 1), ("1024", 1024), (4096, 4096), ("1KB", 1024), ("64KB", 65536), ("64 kb", 65536), ("1K", 1024),
    ("4MB", 4194304), ("1MiB", 1048576), ("1.5KB", 1536), ("2GB", 2147483648)])
def test_size_parsing(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("bad", ["0", "-1", "3XB", "1.5B", "KB", "", "2.5GB", True, "1e3"])
def test_size_parsing_rejects(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_size_labels():
    assert [format_size(n) for n in (1, 1000, 1024, 1536, 65536, 4194304)] == [
        "1B", "1000B", "1KB", "1536B", "64KB", "4MB"]


def test_example_config_loads():
    cfg = load_config(str(REPO / "config" / "collbench.example.yaml"))
    assert cfg.ranks == 8 and cfg.ranks_per_node == 1 and cfg.transport == "ucx" and cfg.engine == "builtin"
    assert cfg.hostfile.endswith("config/hostfile_rdma.example") and len(cfg.hosts) == 8
    assert cfg.nodes == 8
    plan = [(s.op, format_size(s.size_bytes) if s.size_bytes else "-", s.iterations) for s in cfg.once_plan()]
    assert plan == [("allreduce", "4MB", 500), ("allreduce", "1MB", 500), ("allreduce", "64KB", 500),
                    ("allreduce", "1KB", 500), ("bcast", "4MB", 500), ("bcast", "1MB", 500),
                    ("alltoall", "1MB", 300), ("allgather", "128KB", 500), ("reduce", "1MB", 500)]
    assert cfg.thresholds.bounds("allreduce", 1048576) == (10000.0, 20000.0)
    assert cfg.step_timeout == 600.0


def test_config_error_is_a_user_error_with_its_parts(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("plan:\n  - {op: allscatter, sizes: [1KB]}\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert (e.value.source, e.value.key, e.value.exit_code) == (str(path), "plan[0].op", 2)


@pytest.mark.parametrize("key", ["default_latency", "seed_defaults"])
def test_thresholds_default_latency_and_its_older_name(tmp_path, capsys, key):
    """thresholds.default_latency: false drops the default latency table; seed_defaults, its older
    name, does the same and warns on stderr, naming the new key."""
    path = tmp_path / "c.yaml"
    path.write_text(f"thresholds:\n  {key}: false\n  latency:\n    bcast:\n"
                    "      1KB: {warning: 1ms, critical: 2ms}\n")
    cfg = load_config(str(path))
    assert cfg.thresholds.latency_us == {("bcast", 1024): (1000.0, 2000.0)}
    err = capsys.readouterr().err
    warned = f"{path}: thresholds.seed_defaults is deprecated, use thresholds.default_latency" in err
    assert warned == (key == "seed_defaults"), err
    path.write_text(f"thresholds:\n  {key}: true\n")
    assert load_config(str(path)).thresholds.bounds("allreduce", 1048576) == (10000.0, 20000.0)


def test_thresholds_default_latency_under_both_names_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("thresholds:\n  default_latency: false\n  seed_defaults: false\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert e.value.key == "thresholds.seed_defaults" and "older name of thresholds.default_latency" in str(e.value)
