"""The OSU engine: locating binaries, OSU command lines, and real mpirun jobs.

OSU itself cannot be built here (no source in any reachable registry), so the jobs run
tests/osu_standin/osu_<op>: scripts that accept OSU 7.4's options and print the captured OSU
7.4 output (tests/fixtures/osu-7.4) for the requested size, launched by REAL mpirun at 2 ranks.
"""

import os
import stat
import time

import pytest

from collbench.engines import osu as osu_engine
from collbench.config import Step, apply_overrides, load_config
from collbench.errors import UserError
from collbench.results.records import RunContext
from conftest import REPO

STANDIN = REPO / "tests" / "osu_standin"
pytestmark = pytest.mark.mpi


def make_cfg(tmp_path, text=""):
    path = tmp_path / "osu.yaml"
    path.write_text(f"engine: osu\nosu_path: {STANDIN}\nranks: 2\n" + text)
    return load_config(str(path))


def run(cfg, steps):
    ctx = RunContext(cfg, "osu", "test-mpi", run_id="t")
    started = []
    recs = list(osu_engine.run_steps(cfg, steps, ctx, on_progress=lambda i, n, s: started.append((i, n, s.op))))
    assert started == [(i, len(steps), s.op) for i, s in enumerate(steps)]
    return recs


# ------------------------------------------------------------------ finding the binaries

def test_finds_configured_directory(tmp_path):
    cfg = make_cfg(tmp_path)
    assert osu_engine.find_osu_dir(cfg, ["allreduce", "barrier"], environ={}) == str(STANDIN)


def test_configured_prefix_is_searched_for_the_install_layout(tmp_path):
    blocking = tmp_path / "prefix" / "libexec" / "osu-micro-benchmarks" / "mpi" / "collective" / "blocking"
    blocking.mkdir(parents=True)
    (blocking / "osu_bcast").symlink_to(STANDIN / "osu_bcast")
    cfg = make_cfg(tmp_path)
    cfg.osu_path = str(tmp_path / "prefix")
    assert osu_engine.find_osu_dir(cfg, ["bcast"], environ={}) == str(blocking)


def test_missing_binaries_list_every_place_looked(tmp_path):
    cfg = make_cfg(tmp_path)
    cfg.osu_path = str(tmp_path / "nowhere")
    with pytest.raises(UserError) as e:
        osu_engine.find_osu_dir(cfg, ["allreduce", "bcast"], environ={"OSU_PATH": str(STANDIN)})
    msg = str(e.value)
    assert "osu_allreduce, osu_bcast" in msg
    assert f"{tmp_path / 'nowhere'}  (osu_path in {tmp_path / 'osu.yaml'})" in msg
    assert f"{tmp_path / 'nowhere' / 'libexec/osu-micro-benchmarks/mpi/collective/blocking'}" in msg
    # an explicit osu_path is the only place searched: OSU_PATH is not a silent fallback
    assert str(STANDIN) not in msg
    assert "OSU_PATH" in msg and "osu_path" in msg


def test_osu_path_environment_and_standard_roots(tmp_path, monkeypatch):
    assert "/usr/local" in osu_engine.STANDARD_ROOTS
    # stand-ins for the standard roots, so an OSU installed on this machine cannot change the outcome
    roots = (str(tmp_path / "usr-local"), str(tmp_path / "opt-osu"))
    monkeypatch.setattr(osu_engine, "STANDARD_ROOTS", roots)
    cfg = make_cfg(tmp_path)
    cfg.osu_path = None
    assert osu_engine.find_osu_dir(cfg, ["reduce"], environ={"OSU_PATH": str(STANDIN)}) == str(STANDIN)
    with pytest.raises(UserError) as e:
        osu_engine.find_osu_dir(cfg, ["reduce"], environ={"PATH": str(tmp_path)})
    msg = str(e.value)
    for root in roots:
        assert f"{root}/libexec/osu-micro-benchmarks/mpi/collective/blocking  (standard install root)" in msg
        assert f"{root}/libexec/osu-micro-benchmarks/mpi/collective  (standard install root)" in msg
    blocking = tmp_path / "opt-osu" / "libexec" / "osu-micro-benchmarks" / "mpi" / "collective" / "blocking"
    blocking.mkdir(parents=True)
    (blocking / "osu_reduce").symlink_to(STANDIN / "osu_reduce")
    assert osu_engine.find_osu_dir(cfg, ["reduce"], environ={"PATH": str(tmp_path)}) == str(blocking)
    blocking.joinpath("osu_reduce").unlink()
    # on $PATH counts too
    assert osu_engine.find_osu_dir(cfg, ["reduce"], environ={"PATH": f"{tmp_path}:{STANDIN}"}) == str(STANDIN)


def test_all_binaries_must_be_in_one_directory_and_executable(tmp_path):
    d = tmp_path / "osu"
    d.mkdir()
    (d / "osu_allreduce").symlink_to(STANDIN / "osu_allreduce")
    (d / "osu_bcast").write_text("#!/bin/sh\n")  # not executable
    os.chmod(d / "osu_bcast", stat.S_IRUSR | stat.S_IWUSR)
    cfg = make_cfg(tmp_path)
    cfg.osu_path = str(d)
    assert osu_engine.find_osu_dir(cfg, ["allreduce"], environ={}) == str(d)
    with pytest.raises(UserError, match="osu_allreduce, osu_bcast"):
        osu_engine.find_osu_dir(cfg, ["allreduce", "bcast"], environ={})


# ------------------------------------------------------------------ command lines

def test_osu_argv_per_op():
    argv = osu_engine.osu_argv("/o/osu_allreduce", Step("allreduce", 1048576, 100, 10, "float"), True, 8)
    assert argv == ["/o/osu_allreduce", "-m", "1048576:1048576", "-i", "100", "-x", "10", "-f",
                    "-c", "-T", "mpi_float"]
    # char needs no -T (which OSU 5.x lacks); no -c without validation
    assert osu_engine.osu_argv("b", Step("bcast", 4096, 50, 5, "char"), False, 2) == [
        "b", "-m", "4096:4096", "-i", "50", "-x", "5", "-f"]
    # barrier takes neither a size, -c nor -T
    assert osu_engine.osu_argv("b", Step("barrier", 0, 1000, 100, "char"), True, 2) == [
        "b", "-i", "1000", "-x", "100", "-f"]


def test_large_alltoall_raises_osu_memory_limit():
    # 64MB x 16 ranks = 1 GiB of receive buffer, past OSU's 512 MB default (-M)
    argv = osu_engine.osu_argv("a", Step("alltoall", 64 << 20, 10, 1, "char"), False, 16)
    assert argv[argv.index("-M") + 1] == str(2 * 16 * (64 << 20))
    assert "-M" not in osu_engine.osu_argv("a", Step("allreduce", 64 << 20, 10, 1, "char"), False, 16)


def test_double_is_rejected_before_running():
    with pytest.raises(UserError, match=r"datatype 'double'.*char, int, float"):
        osu_engine.check_plan([Step("allreduce", 1024, 10, 1, "double")])
    osu_engine.check_plan([Step("barrier", 0, 10, 1, "double")])  # barrier has no datatype


# ------------------------------------------------------------------ real mpirun jobs

def test_runs_each_step_and_reads_osu_figures(tmp_path, monkeypatch):
    mark = tmp_path / "mark"
    monkeypatch.setenv("OSU_STANDIN_MARK", str(mark))
    cfg = make_cfg(tmp_path)
    apply_overrides(cfg, ops="allreduce,alltoall,barrier", sizes="1KB,1MB", iterations=20)
    recs = run(cfg, cfg.plan)
    assert [(r["type"], r["op"], r["size_bytes"]) for r in recs] == [
        ("result", "allreduce", 1024), ("result", "allreduce", 1048576),
        ("result", "alltoall", 1024), ("result", "alltoall", 1048576), ("result", "barrier", 0)]
    big = recs[1]
    # allreduce_np2_full.txt, 1048576 row: 195.53 / 195.36 / 195.70
    assert (big["latency_avg_us"], big["latency_min_us"], big["latency_max_us"]) == (195.53, 195.36, 195.70)
    assert big["iterations"] == 20 and big["datatype"] == "float" and big["engine"] == "osu"
    assert big["straggler_rank"] is None and big["validation"] == "off"
    assert big["busbw_bytes_per_s"] == round(1048576 / 195.53e-6, 1)       # n=2: factor 1
    a2a = recs[3]
    assert a2a["latency_avg_us"] == 159.84
    assert a2a["busbw_bytes_per_s"] == round(2 * 1048576 / 159.84e-6 * 0.5, 1)
    assert recs[4]["latency_avg_us"] == 0.32 and recs[4]["busbw_bytes_per_s"] is None
    # both ranks of every job ran, with OSU's flags
    lines = mark.read_text().splitlines()
    assert len(lines) == 2 * len(recs)
    assert "allreduce 0 -m 1048576:1048576 -i 20 -x 2 -f -T mpi_float" in lines


def test_validation_pass_and_fail(tmp_path, monkeypatch):
    monkeypatch.setenv("OSU_STANDIN_BADVALID", "reduce")
    cfg = make_cfg(tmp_path, "validate: true\n")
    apply_overrides(cfg, ops="allreduce,reduce", sizes="4KB", iterations=10)
    recs = run(cfg, cfg.plan)
    assert [(r["op"], r["type"], r["validation"]) for r in recs] == [
        ("allreduce", "result", "pass"), ("reduce", "result", "fail")]


def test_failed_step_is_recorded_and_later_steps_still_run(tmp_path, monkeypatch):
    monkeypatch.setenv("OSU_STANDIN_FAIL", "bcast")
    cfg = make_cfg(tmp_path)
    apply_overrides(cfg, ops="bcast,allgather", sizes="2KB", iterations=10)
    recs = run(cfg, cfg.plan)
    fail, ok = recs
    assert fail["type"] == "failure" and fail["status"] == "failed"
    assert (fail["op"], fail["size_bytes"]) == ("bcast", 2048)
    assert fail["exit_code"] != 0
    assert fail["error"].startswith("osu_bcast 2KB: exit code")
    assert "simulated rank failure" in fail["error"] and "simulated rank failure" in fail["stderr_tail"]
    assert ok["type"] == "result" and ok["op"] == "allgather" and ok["latency_avg_us"] == 1.30


def test_rejected_option_names_osu_5(tmp_path, monkeypatch):
    monkeypatch.setenv("OSU_STANDIN_REJECT", "T")
    cfg = make_cfg(tmp_path)
    apply_overrides(cfg, ops="reduce", sizes="1KB", iterations=5)
    (rec,) = run(cfg, cfg.plan)
    assert rec["type"] == "failure"
    assert "Invalid option [-T]" in rec["error"] and "OSU 5.x has no -T" in rec["error"]


def test_hung_step_is_killed_at_step_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("OSU_STANDIN_HANG", "allreduce")
    cfg = make_cfg(tmp_path, "step_timeout: 2s\n")
    apply_overrides(cfg, ops="allreduce,barrier", sizes="1KB", iterations=5)
    t0 = time.monotonic()
    hung, after = run(cfg, cfg.plan)
    assert time.monotonic() - t0 < 30
    assert hung["type"] == "failure" and "no result within step_timeout 2s" in hung["error"]
    assert after["type"] == "result" and after["op"] == "barrier"
    # no stand-in is left sleeping
    left = [p for p in os.listdir("/proc") if p.isdigit() and "osu_standin/osu_allreduce" in _cmdline(p)]
    assert left == []


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
