"""engine: nccl-tests under REAL mpirun (and launcher: none) with stand-in binaries.

No GPU here, so the jobs run tests/nccl_tests_standin/<op>_perf: scripts that take nccl-tests'
options and print nccl-tests 2.19's output with the times of a published run
(tests/fixtures/nccl_tests/version_line_dstack.txt). scripts/gpu_check.sh runs the real binaries.
"""

import os
import subprocess
import sys

import pytest

from collbench.config import Step, load_config
from collbench.engines import get_engine
from collbench.engines import nccl_tests as nt
from collbench.errors import UserError
from collbench.results.record_parser import is_record, parse_record
from collbench.results.records import RunContext, dumps
from conftest import FIXTURES, REPO

STANDIN = REPO / "tests" / "nccl_tests_standin"
pytestmark = pytest.mark.mpi


def published_times():
    """size -> (out-of-place us, in-place us) of the run the stand-in borrows its times from."""
    times = {}
    for line in (FIXTURES / "nccl_tests" / "version_line_dstack.txt").read_text().splitlines():
        f = line.split()
        if len(f) == 13 and f[0].isdigit():
            times[int(f[0])] = (float(f[5]), float(f[9]))
    return times


def make_cfg(tmp_path, text="", ranks=2, step_timeout=60):
    path = tmp_path / "gpu.yaml"
    path.write_text(f"engine: nccl-tests\nnccl_tests_dir: {STANDIN}\nranks: {ranks}\n"
                    f"step_timeout: {step_timeout}\n" + text)
    return load_config(str(path))


def run(cfg, steps, monkeypatch=None, **env):
    if monkeypatch is not None:
        for k, v in env.items():
            monkeypatch.setenv(k, str(v))
    ctx = RunContext(cfg, "nccl-tests", "test-mpi", run_id="t")
    recs = list(get_engine("nccl-tests").run_steps(cfg, steps, ctx))
    for r in recs:   # every record is one the results log's readers accept
        assert is_record(parse_record(dumps(r))), parse_record(dumps(r))
    return recs


def marks(path):
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def step(op, size, iterations=5, warmup=1, datatype="float", **kw):
    return Step(op, size, iterations, warmup, datatype, **kw)


def test_geometric_sizes_are_one_job_and_records_carry_its_figures(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path, "validate: true\n")
    mark = tmp_path / "mark"
    recs = run(cfg, [step("allreduce", s) for s in (8, 16)] + [step("allreduce", 1 << 20, inplace=True)],
               monkeypatch, NCCL_STANDIN_MARK=mark)
    # 8..1M is not one geometric range of the plan's sizes: 8,16 (f=2) would need 32..512K too
    calls = marks(mark)
    assert sorted(c[1] for c in calls) == ["0", "0", "0", "1", "1", "1"]
    argvs = sorted(" ".join(c[2:]) for c in calls if c[1] == "0")
    assert "-b 8 -e 8 -f 2 -g 1 -n 5 -w 1 -d float -c 1 -o sum" in argvs
    assert "-b 1048576 -e 1048576 -f 2 -g 1 -n 5 -w 1 -d float -c 1 -o sum" in argvs
    times = published_times()
    assert [r["type"] for r in recs] == ["result"] * 3
    assert [r["latency_avg_us"] for r in recs] == [times[8][0], times[16][0], times[1048576][1]]
    assert recs[2]["inplace"] is True and "inplace" not in recs[0]
    assert all(r["validation"] == "pass" and r["wrong_elements"] == 0 for r in recs)
    assert recs[0]["engine"] == "nccl-tests" and recs[0]["ranks"] == 2
    assert recs[0]["hosts"] == [os.uname().nodename]
    assert recs[0]["nccl_version"] == "2.28.3"        # the stand-in's nccl-library=22803


def test_one_job_for_a_size_range_and_per_rank_sizes_of_allgather(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path)
    mark = tmp_path / "mark"
    recs = run(cfg, [step("allgather", s, datatype="char") for s in (1024, 2048, 4096)], monkeypatch,
               NCCL_STANDIN_MARK=mark)
    calls = [c for c in marks(mark) if c[1] == "0"]
    assert len(calls) == 1
    # nccl-tests' all_gather size is the whole buffer: 2 ranks x the per-rank block
    assert calls[0][2:8] == ["-b", "2048", "-e", "8192", "-f", "2"]
    assert "-c" in calls[0] and calls[0][calls[0].index("-c") + 1] == "0" and "-o" not in calls[0]
    assert [(r["size_bytes"], r["validation"]) for r in recs] == [(1024, "off"), (2048, "off"), (4096, "off")]
    assert "wrong_elements" not in recs[0]
    # algbw as nccl-tests computes it: the whole buffer over the time
    assert recs[0]["algbw_bytes_per_s"] == pytest.approx(2048 / (recs[0]["latency_avg_us"] * 1e-6), rel=1e-3)


def test_root_and_wrong_elements_fail_validation(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path, "validate: true\n")
    mark = tmp_path / "mark"
    recs = run(cfg, [step("bcast", 4096, datatype="char", root=1), step("reduce", 4096, root=1)], monkeypatch,
               NCCL_STANDIN_MARK=mark, NCCL_STANDIN_WRONG=4096)
    calls = {c[0]: c[2:] for c in marks(mark) if c[1] == "0"}
    assert calls["broadcast_perf"][-2:] == ["-r", "1"] and "-o" not in calls["broadcast_perf"]
    assert calls["reduce_perf"][-4:] == ["-o", "sum", "-r", "1"]
    assert [r["validation"] for r in recs] == ["fail", "fail"]
    assert recs[0]["wrong_elements"] == 1048580      # nccl-tests printed %6g: 1.04858e+06
    assert recs[0]["root"] == 1


def test_mid_table_failure_keeps_the_rows_before_and_says_why(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path)
    recs = run(cfg, [step("allreduce", s) for s in (1024, 2048, 4096)], monkeypatch, NCCL_STANDIN_FAIL_AT=2048)
    assert [r["type"] for r in recs] == ["result", "failure", "failure"]
    f = recs[1]
    assert f["op"] == "allreduce" and f["size_bytes"] == 2048 and f["exit_code"] != 0
    assert f["error"].startswith("all_reduce_perf 2KB: nccl-tests NCCL failure at common.cu:1204")
    assert "unhandled cuda error" in f["error"]


def test_tag_output_prefixes_from_real_mpirun_are_read(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path, "launcher_args: [--tag-output]\n")
    recs = run(cfg, [step("alltoall", 1 << 20, datatype="char")])
    assert recs[0]["type"] == "result", recs[0]
    assert recs[0]["latency_avg_us"] == published_times()[2097152][0]   # 2 ranks x 1 MB: the 2 MB row


def test_published_outputs_printed_by_the_binary_become_records(tmp_path, monkeypatch):
    # a 4-rank run (NVIDIA/nccl#1039) as the binary's whole stdout, launched at 4 ranks
    cfg = make_cfg(tmp_path, ranks=4)
    recs = run(cfg, [step("allreduce", s) for s in (8, 16, 32, 64)], monkeypatch,
               NCCL_STANDIN_PRINT=FIXTURES / "nccl_tests" / "v213_group_nccl-1039.txt")
    assert [r["latency_avg_us"] for r in recs] == [19.12, 17.72, 18.08, 18.59]
    assert recs[0]["hosts"] == ["job-1111-2222-0"] and recs[0]["ranks"] == 4


def test_published_mid_table_failure_printed_by_the_binary(tmp_path, monkeypatch):
    # NVIDIA/nccl-tests#322: rows up to 16 GB, then "Test NCCL failure ... unhandled cuda error"
    cfg = make_cfg(tmp_path)
    sizes = [1 << 30, 2 << 30, 4 << 30, 8 << 30, 16 << 30, 32 << 30]
    recs = run(cfg, [step("allreduce", s) for s in sizes], monkeypatch, NCCL_STANDIN_RC=3,
               NCCL_STANDIN_PRINT=FIXTURES / "nccl_tests" / "midtable_failure_nccl-tests-322.txt")
    assert [r["type"] for r in recs] == ["result"] * 5 + ["failure"]
    assert recs[4]["latency_avg_us"] == 93457.0 and recs[4]["size"] == "16GB"
    assert recs[5]["error"] == ("all_reduce_perf 32GB: nccl-tests NCCL failure at common.cu:1204 on HCA-128: "
                                "unhandled cuda error (run with NCCL_DEBUG=INFO for details)")
    assert recs[5]["exit_code"] != 0


def test_records_stream_in_plan_order_as_jobs_finish(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path)
    mark = tmp_path / "mark"
    monkeypatch.setenv("NCCL_STANDIN_MARK", str(mark))
    ctx = RunContext(cfg, "nccl-tests", "test-mpi", run_id="t")
    gen = get_engine("nccl-tests").run_steps(cfg, [step("allreduce", 1024), step("bcast", 1024, datatype="char")], ctx)
    first = next(gen)
    assert first["op"] == "allreduce"
    assert {c[0] for c in marks(mark)} == {"all_reduce_perf"}     # the bcast job has not started
    assert next(gen)["op"] == "bcast" and {c[0] for c in marks(mark)} == {"all_reduce_perf", "broadcast_perf"}


def test_a_build_without_mpi_is_named(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path)
    recs = run(cfg, [step("allreduce", 1024)], monkeypatch, NCCL_STANDIN_NOMPI=1)
    assert recs[0]["type"] == "failure"
    assert "1 rank(s) per communicator for a job of 2" in recs[0]["error"] and "MPI=1" in recs[0]["error"]


def test_a_hung_binary_is_stopped_at_step_timeout(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path, step_timeout=1)
    recs = run(cfg, [step("allreduce", 1024)], monkeypatch, NCCL_STANDIN_HANG=1)
    assert recs[0]["type"] == "failure" and "no result within step_timeout 1s" in recs[0]["error"]


def test_launcher_none_runs_one_process_without_mpirun(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path, "launcher: none\n", ranks=1)
    mark = tmp_path / "mark"
    monkeypatch.setenv("PATH", "/usr/bin:/bin")     # no mpirun needed... and none used:
    argv, _ = nt.build_command(cfg, ["x"])
    assert argv == ["x"]
    recs = run(cfg, [step("allreduce", 1024), step("bcast", 8, datatype="char")], monkeypatch,
               NCCL_STANDIN_MARK=mark)
    assert [r["type"] for r in recs] == ["result", "result"]
    assert [r["ranks"] for r in recs] == [1, 1]
    assert sorted(c[1] for c in marks(mark)) == ["0", "0"]
    with pytest.raises(UserError, match="launcher: none starts one process"):
        nt.build_command(make_cfg(tmp_path, "launcher: none\n", ranks=2), ["x"])


def test_preflight_rejects_what_nccl_tests_cannot_run(tmp_path):
    cfg = make_cfg(tmp_path)
    engine = get_engine("nccl-tests")
    with pytest.raises(UserError, match="no barrier"):
        engine.preflight(cfg, [step("barrier", 0)])
    with pytest.raises(UserError, match="datatype 'short'"):
        engine.preflight(cfg, [step("allreduce", 1024, datatype="short")])
    with pytest.raises(UserError, match="NCCL_ALGO"):
        engine.preflight(cfg, [step("allreduce", 1024, algorithm="ring")])
    with pytest.raises(UserError, match="root 5"):
        engine.preflight(cfg, [step("bcast", 1024, datatype="char", root=5)])
    cfg.nccl_tests_dir = str(tmp_path / "nowhere")
    with pytest.raises(UserError) as e:
        engine.preflight(cfg, [step("allreduce", 1024)])
    assert str(tmp_path / "nowhere" / "build" / "all_reduce_perf_mpi") in str(e.value)
    assert "nccl_tests_dir" in str(e.value)


def test_found_on_path_with_the_mpi_suffix(tmp_path):
    cfg = make_cfg(tmp_path)
    cfg.nccl_tests_dir = None
    (tmp_path / "all_reduce_perf_mpi").symlink_to(STANDIN / "all_reduce_perf")
    assert nt.find_binary(cfg, "all_reduce_perf", environ={"PATH": str(tmp_path)}) == \
        str(tmp_path / "all_reduce_perf_mpi")
    with pytest.raises(UserError, match=r"\$PATH"):
        nt.find_binary(cfg, "all_gather_perf", environ={"PATH": str(tmp_path)})


def test_once_cli_end_to_end(tmp_path):
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text(f"engine: nccl-tests\nnccl_tests_dir: {STANDIN}\nranks: 2\nvalidate: true\n"
                   "plan:\n  - {op: allreduce, sizes: [1KB, 2KB], iterations: 5, warmup: 1}\n")
    results = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "collbench", "once", "-c", str(cfg), "--results", str(results)],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "engine nccl-tests" in p.stdout and "Allreduce" in p.stdout
    recs = [parse_record(line) for line in results.read_text().splitlines()]
    assert [(r["size_bytes"], r["validation"]) for r in recs] == [(1024, "pass"), (2048, "pass")]
