"""compare --engine nccl-tests under REAL mpirun with the stand-in nccl-tests binaries.

The stand-ins (tests/nccl_tests_standin) read NCCL_ALGO/NCCL_PROTO as NCCL 2.28 does (its
parseList, per-function syntax included), refuse unknown names with NCCL's WARN and nccl-tests'
"invalid usage", print NCCL's tuning table under NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING, and
time Ring/LL 2x faster than NCCL's own choice up to 64 KB and 3x slower above it.
"""

import json
import os
import subprocess
import sys

import pytest

from collbench.compare import nccl_candidates, nccl_env_file
from collbench.errors import UserError
from conftest import REPO

COLLBENCH = [sys.executable, "-m", "collbench"]

STANDIN = REPO / "tests" / "nccl_tests_standin"
sys.path.insert(0, str(STANDIN))
import nccl_tests_standin as standin  # noqa: E402

pytestmark = pytest.mark.mpi


def env():
    e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONPATH=str(REPO))
    for k in ("NCCL_ALGO", "NCCL_PROTO", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"):
        e.pop(k, None)
    return e


def config(tmp_path, extra=""):
    p = tmp_path / "gpu.yaml"
    p.write_text(f"engine: nccl-tests\nnccl_tests_dir: {STANDIN}\nranks: 2\nstep_timeout: 60\n"
                 f"launcher_args: [--oversubscribe]\n" + extra)
    return str(p)


def compare(tmp_path, *args, extra=""):
    return subprocess.run(COLLBENCH + ["compare", "--engine", "nccl-tests", "-c", config(tmp_path, extra),
                                             "-q"] + list(args),
                          capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=300)


def standin_tuning_text(prefix=""):
    p = subprocess.run([str(STANDIN / "all_reduce_perf"), "-b", "8", "-e", "8"], capture_output=True, text=True,
                       env=dict(env(), NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,TUNING"), timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return "\n".join(prefix + line for line in p.stdout.splitlines())


def expected_pairs(func):
    return [f"{a}/{p}" for a in standin.NCCL_ALGOS for p in standin.NCCL_PROTOS if standin.tuner_bw(func, a, p) > 0]


@pytest.mark.parametrize("prefix", ["", "[1,0]<stdout>:", "0: "])
def test_tuning_table_read_as_nccl_prints_it(prefix):
    tun = nccl_candidates.parse_tuning(standin_tuning_text(prefix))
    assert tun.algos == standin.NCCL_ALGOS and tun.protos == standin.NCCL_PROTOS
    for func in standin.NCCL_FUNCS:
        on, off = tun.candidates(func)
        assert [c.name for c in on] == expected_pairs(func)
        assert len(on) + len(off) == len(standin.NCCL_ALGOS) * len(standin.NCCL_PROTOS)
    # the last block has one algorithm (PAT) but NCCL prints three blocks' worth of protocols
    assert tun.table["AllGather"][("PAT", "Simple")] == (6.8, 120.0)


def test_no_table_and_hostile_names():
    assert nccl_candidates.parse_tuning("x NCCL INFO   Algorithm   | Tree |\nno table here\n") is None
    assert nccl_candidates.parse_tuning("\x00" * 1000) is None
    with pytest.raises(UserError, match="not ALGO or ALGO/PROTO"):
        nccl_candidates.parse_names("Ring/LL;rm -rf")
    assert [c.name for c in nccl_candidates.parse_names("default,Ring/LL,Tree")] == ["Ring/LL", "Tree"]


def test_candidates_come_from_nccls_tuner(tmp_path):
    p = compare(tmp_path, "--op", "allgather", "--sizes", "1KB", "--blocks", "1", "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert doc["algorithms"]["allgather"] == ["default"] + expected_pairs("AllGather")
    assert "PAT/Simple" in doc["algorithms"]["allgather"] and "Tree/LL" not in doc["algorithms"]["allgather"]
    assert any("disabled here (bandwidth 0)" in n and "NVLS/Simple" in n for n in doc["notes"])
    rows = {r["algorithm"]: r for r in doc["rows"]}
    assert set(rows) == set(doc["algorithms"]["allgather"]) and all(r["status"] == "ok" for r in rows.values())
    # Ring/LL is timed with NCCL_ALGO=Ring NCCL_PROTO=LL: the stand-in's 2x at 1 KB shows it ran so
    assert rows["Ring/LL"]["avg_us"] == pytest.approx(rows["default"]["avg_us"] * 0.5, rel=0.02)


@pytest.mark.alone     # the choice is proven by timing
def test_proven_choice_written_and_checked_refused_name_explained(tmp_path):
    out = tmp_path / "nccl.env"
    res = tmp_path / "r.jsonl"
    p = compare(tmp_path, "--op", "allreduce", "--sizes", "1KB,16KB", "--blocks", "6",
                "--algorithms", "Ring/LL,Tree,Bogus/Simple", "--write-rules", str(out), "--results", str(res))
    assert p.returncode == 0, p.stdout + p.stderr
    text = out.read_text()
    assert "NCCL_ALGO=allreduce:Ring\n" in text and "NCCL_PROTO=allreduce:LL\n" in text
    assert "installed-quality" in text
    assert nccl_env_file.read(str(out)) == {"NCCL_ALGO": "allreduce:Ring", "NCCL_PROTO": "allreduce:LL"}
    assert "FAILED: all_reduce_perf 1KB" in p.stdout and 'Unrecognized element token "Bogus"' in p.stdout
    assert "the file is installed-quality" in p.stdout
    recs = [json.loads(line) for line in res.read_text().splitlines()]
    with_file = [r for r in recs if r.get("check") == "with" and r["type"] == "result"]
    without = [r for r in recs if r.get("check") == "without" and r["type"] == "result"]
    assert with_file and without
    # the per-function NCCL_ALGO the file holds was accepted by NCCL's parser and selected Ring/LL
    assert min(r["latency_avg_us"] for r in with_file) < 0.6 * min(r["latency_avg_us"] for r in without)


def test_setting_slower_at_one_size_is_not_forced(tmp_path):
    out = tmp_path / "nccl.env"
    p = compare(tmp_path, "--op", "allreduce", "--sizes", "16KB,1MB", "--blocks", "5",
                "--algorithms", "Ring/LL", "--write-rules", str(out), "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    ring = {r["size_bytes"]: r for r in doc["rows"] if r["algorithm"] == "Ring/LL"}
    assert ring[16384]["ci_low"] > 1.5 and ring[1 << 20]["ci_high"] < 0.5
    text = out.read_text()
    assert not any(line.startswith(("NCCL_ALGO=", "NCCL_PROTO=")) for line in text.splitlines())
    assert "NCCL's own choice" in text


def test_bad_input_exit_2_nothing_run(tmp_path):
    p = compare(tmp_path, "--op", "allreduce", "--sizes", "1KB", extra="env: {NCCL_ALGO: Ring}\n")
    assert p.returncode == 2 and "sets NCCL_ALGO" in p.stderr
    p = compare(tmp_path, "--op", "alltoall", "--sizes", "1KB")
    assert p.returncode == 2 and "no algorithm choice for alltoall" in p.stderr
    bad = tmp_path / "bad.env"
    bad.write_text("NCCL_ALGO=Ring\nLD_PRELOAD=/evil.so\n")
    p = compare(tmp_path, "--op", "allreduce", "--sizes", "1KB", "--check-rules", str(bad))
    assert p.returncode == 2 and "bad.env:2" in p.stderr
    p = compare(tmp_path, "--op", "allreduce", "--sizes", "1KB", "--algorithms", "Ring/LL$(x)")
    assert p.returncode == 2 and "not ALGO or ALGO/PROTO" in p.stderr


def test_older_ncccls_one_line_table():
    # NCCL 2.12's format (src/graph/tuning.cc v2.12.12-1): "Latency/AlgBw |" then " %7s/%6s |" pairs
    pairs = [(a, p) for a in ("Tree", "Ring", "CollNet") for p in ("LL", "LL128", "Simple")]
    head = "Latency/AlgBw |" + "".join(f" {a:>7s}/{p:>6s} |" for a, p in pairs)
    bws = {"AllReduce": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0, 0.0], "Broadcast": [0.0] * 3 + [4.0, 5.0, 6.0] + [0.0] * 3}
    lines = [head, " Max NThreads |" + " 512 |" * 9]
    lines += [f"{f:>13s} |" + "".join(f"{6.5:8.1f}/{b:6.1f} |" for b in v) for f, v in bws.items()]
    text = "\n".join(f"[1,0]<stdout>:n1:12:12 [0] NCCL INFO {line}" for line in lines)
    tun = nccl_candidates.parse_tuning(text)
    assert tun.algos == ["Tree", "Ring", "CollNet"] and tun.protos == ["LL", "LL128", "Simple"]
    assert [c.name for c in tun.candidates("AllReduce")[0]] == [f"{a}/{p}" for a, p in pairs[:6]]
    assert [c.name for c in tun.candidates("Broadcast")[0]] == ["Ring/LL", "Ring/LL128", "Ring/Simple"]
