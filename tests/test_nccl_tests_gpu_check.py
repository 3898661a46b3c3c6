"""scripts/gpu_check.sh's run half on stand-in binaries (--bin), so the script cannot rot between
GPU runs: with an MPI (real mpirun, one rank per "GPU") and without (launcher: none, one GPU).
The build half needs nvcc and NCCL; it runs where a GPU is (docs/GPU.md)."""

import os
import subprocess

import pytest

from collbench.results.record_parser import parse_record
from conftest import REPO

STANDIN = REPO / "tests" / "nccl_tests_standin"


def gpu_check(tmp_path, gpus, mpi):
    env = dict(os.environ, GPU_CHECK_WORK=str(tmp_path / "work"), GPU_CHECK_GPUS=str(gpus),
               OUT=str(tmp_path / "out"), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if not mpi:
        env["GPU_CHECK_MPI"] = "0"
    (tmp_path / "out").mkdir()
    p = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--bin", str(STANDIN)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = [parse_record(line) for line in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    imported = [parse_record(line) for line in (tmp_path / "out" / "imported.jsonl").read_text().splitlines()]
    return p.stdout, recs, imported


@pytest.mark.mpi
def test_with_mpi_one_rank_per_gpu(tmp_path):
    out, recs, imported = gpu_check(tmp_path, gpus=2, mpi=True)
    assert "launcher: mpirun" in out and "=== collbench once --engine nccl-tests" in out
    assert [r["op"] for r in recs] == ["allreduce"] * 4 + ["allgather"] * 2 + ["bcast", "reduce_scatter", "alltoall"]
    assert all(r["type"] == "result" and r["ranks"] == 2 and r["validation"] == "pass" for r in recs)
    assert imported and all(r["op"] == "allreduce" and r["ranks"] == 2 for r in imported)
    # compare --engine nccl-tests: NCCL's tuner's candidates each timed; replay: the tiny log's 5 configurations
    assert "allreduce: NCCL's tuner enables" in out and "compare exit 0, replay exit 0" in out
    compared = [parse_record(line) for line in (tmp_path / "out" / "compare.jsonl").read_text().splitlines()]
    assert {r["algorithm"] for r in compared} >= {"default", "Ring/LL", "Ring/Simple"}
    replayed = [parse_record(line) for line in (tmp_path / "out" / "replay.jsonl").read_text().splitlines()]
    assert sorted(r["nccl_datatype"] for r in replayed) == ["bfloat16", "float16", "float32", "float32", "float8e4m3"]


def test_without_mpi_one_process(tmp_path):
    out, recs, imported = gpu_check(tmp_path, gpus=1, mpi=False)
    assert "MPI=0" in out and "launcher: none" in out
    assert len(recs) == 9 and all(r["type"] == "result" and r["ranks"] == 1 for r in recs)
    assert recs[0]["mpi"] == "none"
    assert "compare exit 0, replay exit 0" in out and "replayed at 1 ranks" in out
