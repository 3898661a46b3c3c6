"""nccl replay --engine nccl-tests under REAL mpirun with the stand-in nccl-tests binaries.

tests/fixtures/nccl/gpu-replay-tiny.log: one 2-rank communicator, AllReduce bfloat16 sum and
float16 max, AllGather float8e4m3, ReduceScatter float32 avg, Broadcast from root 1, a Send/Recv
pair; every call twice. The stand-ins note each rank's arguments (NCCL_STANDIN_MARK).
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import FIXTURES, REPO

STANDIN = REPO / "tests" / "nccl_tests_standin"
LOG = FIXTURES / "nccl" / "gpu-replay-tiny.log"
COLLBENCH = [sys.executable, "-m", "collbench"]
pytestmark = pytest.mark.mpi


def replay(tmp_path, *args, ranks=2, **env):
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text(f"engine: nccl-tests\nnccl_tests_dir: {STANDIN}\nranks: {ranks}\nstep_timeout: 60\n"
                   "launcher_args: [--oversubscribe]\n")
    e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONPATH=str(REPO),
             NCCL_STANDIN_MARK=str(tmp_path / "marks"), **{k: str(v) for k, v in env.items()})
    return subprocess.run(COLLBENCH + ["nccl", "replay", "--engine", "nccl-tests", "-c", str(cfg)] + list(args),
                          capture_output=True, text=True, env=e, cwd=tmp_path, timeout=300)


def marks(tmp_path):
    p = tmp_path / "marks"
    return [line.split() for line in p.read_text().splitlines()] if p.exists() else []


def opt(mark, flag):
    return mark[mark.index(flag) + 1] if flag in mark else None


def test_log_configurations_run_with_their_types_reductions_roots_and_ranks(tmp_path):
    res = tmp_path / "r.jsonl"
    p = replay(tmp_path, str(LOG), "--iterations", "5", "--warmup", "1", "--validate", "--results", str(res),
               "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    runs = {}
    for m in marks(tmp_path):
        runs.setdefault((m[0], opt(m, "-d"), opt(m, "-o"), opt(m, "-r"), opt(m, "-b")), set()).add(m[1])
    # every configuration on both ranks of the log's communicator, with its own datatype, op and root
    assert runs == {("all_reduce_perf", "bfloat16", "sum", None, str(1048576 * 2)): {"0", "1"},
                    ("all_reduce_perf", "half", "max", None, str(4096 * 2)): {"0", "1"},
                    ("all_gather_perf", "f8e4m3", None, None, str(65536 * 2)): {"0", "1"},
                    ("reduce_scatter_perf", "float", "avg", None, str(16384 * 4 * 2)): {"0", "1"},
                    ("broadcast_perf", "float", None, "1", str(1024 * 4)): {"0", "1"}}
    assert all(opt(m, "-n") == "5" and opt(m, "-w") == "1" and opt(m, "-c") == "1" for m in marks(tmp_path))
    doc = json.loads(p.stdout)
    rows = {(r["op"], r["datatype"]): r for r in doc["rows"]}
    assert not rows[("Send", "float32")]["replayed"] and "point-to-point" in rows[("Send", "float32")]["error"]
    timed = [r for r in doc["rows"] if r["replayed"]]
    assert len(timed) == 5 and all(r["time_us"] > 0 and r["replay_nranks"] == 2 for r in timed)
    assert rows[("AllReduce", "bfloat16")]["total_us"] == pytest.approx(rows[("AllReduce", "bfloat16")]["time_us"] * 2)
    recs = [json.loads(line) for line in res.read_text().splitlines()]
    assert sorted(r["nccl_datatype"] for r in recs) == ["bfloat16", "float16", "float32", "float32", "float8e4m3"]
    bf = next(r for r in recs if r["nccl_datatype"] == "bfloat16")
    assert bf["type"] == "result" and bf["ranks"] == 2 and bf["validation"] == "pass" and bf["nccl_redop"] == "sum"
    assert bf["size_bytes"] == 1048576 * 2 and bf["engine"] == "nccl-tests"


def test_fewer_ranks_than_the_log_said_and_root_folded(tmp_path):
    p = replay(tmp_path, str(LOG), "--np", "1", "--iterations", "2", "--warmup", "0", ranks=1)
    assert p.returncode == 0, p.stdout + p.stderr
    assert all(m[1] == "0" for m in marks(tmp_path)) and len(marks(tmp_path)) == 5
    bcast = next(m for m in marks(tmp_path) if m[0] == "broadcast_perf")
    assert opt(bcast, "-r") == "0"
    assert "replayed at 1 ranks (the log's communicator has 2)" in p.stderr
    assert "root 1 timed as root 0" in p.stderr
    assert "2->1" in p.stdout


def test_failed_configuration_is_a_failure_record_others_timed(tmp_path):
    res = tmp_path / "r.jsonl"
    p = replay(tmp_path, str(LOG), "--iterations", "2", "--warmup", "0", "--results", str(res),
               NCCL_STANDIN_FAIL_AT=str(4096 * 2))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAILED: nccl-tests NCCL failure at common.cu:1204" in p.stdout
    recs = [json.loads(line) for line in res.read_text().splitlines()]
    assert [r["type"] for r in recs].count("failure") == 1 and [r["type"] for r in recs].count("result") == 4
    assert "unhandled cuda error" in next(r for r in recs if r["type"] == "failure")["error"]


def test_bad_requests_exit_2_nothing_run(tmp_path):
    p = replay(tmp_path, str(LOG), "--order", "log")
    assert p.returncode == 2 and "--order grouped" in p.stderr
    p = replay(tmp_path, str(LOG), ranks=1)
    assert p.returncode == 2 and "2-rank communicators" in p.stderr
    sends = tmp_path / "sends.log"
    sends.write_text("\n".join(line for line in LOG.read_text().splitlines() if "Send:" in line or "Recv:" in line
                               or "Init COMPLETE" in line) + "\n")
    p = replay(tmp_path, str(sends))
    assert p.returncode == 2 and "nothing to replay" in p.stderr
    assert marks(tmp_path) == []
