"""The built-in engine's plan options and pair mode, with real mpirun ranks (ob1 and UCX):
in place, root, 2- and 8-byte datatypes, sustained timing, per-iteration percentiles,
--report-hosts and the --pairs distance matrix."""

import itertools
import json
import socket

import pytest

from collbench.results import records
from collbench.engines import builtin as builtin_engine, launcher
from collbench.config import Step
from collbench.ops import OPS, get_op
from collbench.engines.mpi_job import run_job
from engine_helpers import engine_bin, engine_cfg  # noqa: F401


def ctx_for(cfg):
    return records.RunContext(cfg, "builtin", launcher.mpi_version(cfg))


def run(cfg, steps):
    return list(builtin_engine.run_steps(cfg, steps, records.RunContext(cfg, "builtin", "test")))


@pytest.mark.mpi
@pytest.mark.parametrize("transport", ["shm", "ucx-tcp"])
def test_in_place_root_and_datatypes_validate_on_every_op(tmp_path, engine_bin, transport):
    """Every sized op of ops.OPS in place and out of place, at a root other than 0, on short and
    long: each result is checked element by element on every rank (validate: pass)."""
    cfg = engine_cfg(tmp_path, engine_bin, ranks=4, transport=transport, validate=True)
    steps = []
    for op in OPS.values():
        if not op.has_size:
            continue
        dt = "short" if op.reduction else "long"
        # odd element counts: reduce_scatter's uneven split and non-power-of-two counts
        for inplace in (False, True):
            steps.append(Step(op.name, 2 * 37 * (1 if dt == "short" else 4), 5, 1, dt, inplace=inplace,
                              root=2 if op.name in ("bcast", "reduce") else 0))
    recs = run(cfg, steps)
    assert [r["type"] for r in recs] == ["result"] * len(steps), [r.get("error") for r in recs]
    for step, rec in zip(steps, recs):
        assert rec["op"] == step.op and rec["datatype"] == step.datatype
        assert rec["validation"] == "pass", (step, rec)
        assert rec.get("inplace", False) == step.inplace
        assert rec.get("root", 0) == step.root


@pytest.mark.mpi
def test_corrupted_in_place_result_fails_validation(tmp_path, engine_bin):
    """In place, a wrong element is still caught (the check reads the buffer MPI wrote)."""
    cfg = engine_cfg(tmp_path, engine_bin, ranks=2, validate=True,
                     env={"COLLBENCH_ENGINE_CORRUPT_RANK": "1"})
    recs = run(cfg, [Step("allreduce", 64, 3, 1, "float", inplace=True)])
    assert [r["validation"] for r in recs if r["type"] == "result"] == ["fail"]


@pytest.mark.mpi
def test_sustained_timing_and_percentiles(tmp_path, engine_bin):
    cfg = engine_cfg(tmp_path, engine_bin, ranks=2)
    recs = run(cfg, [Step("allgather", 65536, 50, 5, "char", timing="sustained"),
                     Step("allreduce", 4096, 200, 10, "float", samples=True)])
    sustained, sampled = recs
    assert sustained["timing"] == "sustained" and "latency_p50_us" not in sustained
    assert 0 < sustained["latency_min_us"] <= sustained["latency_avg_us"] <= sustained["latency_max_us"]
    assert "timing" not in sampled  # OSU timing is the default and is not spelled out
    p = [sampled[f"latency_{k}_us"] for k in ("p50", "p90", "p99", "pmax")]
    assert all(v > 0 for v in p) and p == sorted(p)
    # the slowest rank's iteration is never faster than a rank's average... of the same loop
    assert p[-1] >= sampled["latency_min_us"]


@pytest.mark.mpi
def test_plan_options_are_written_only_when_set(tmp_path):
    plan = tmp_path / "plan.txt"
    builtin_engine.write_plan([Step("bcast", 64, 3, 1, "char"),
                               Step("reduce", 64, 3, 1, "int", inplace=True, root=1, timing="sustained",
                                    samples=True)], str(plan))
    lines = [line for line in plan.read_text().splitlines() if not line.startswith("#")]
    assert lines == ["bcast 64 3 1 char", "reduce 64 3 1 int inplace=1 root=1 timing=sustained samples=1"]


@pytest.mark.mpi
def test_report_hosts(tmp_path, engine_bin):
    cfg = engine_cfg(tmp_path, engine_bin, ranks=3)
    plan = tmp_path / "plan.txt"
    builtin_engine.write_plan([Step("barrier", 0, 2, 1, "char")], str(plan))
    argv, env = launcher.build_command(cfg, [engine_bin, "--plan", str(plan), "--report-hosts"])
    lines = []
    res = run_job(argv, env, idle_timeout=120, on_line=lines.append)
    assert res.returncode == 0, res.stderr_tail
    hosts = [builtin_engine.parse_hosts_line(x) for x in lines]
    hosts = [h for h in hosts if h is not None]
    assert hosts == [[socket.gethostname()] * 3]
    assert builtin_engine.parse_hosts_line('CBHOSTS {"hosts": [1]}') is None
    assert builtin_engine.parse_hosts_line("CBHOSTS [") is None


@pytest.mark.mpi
def test_report_hosts_names_the_slurm_job_the_ranks_run_in(tmp_path, engine_bin):
    """Under srun the ranks' SLURM_JOB_ID rides on the CBHOSTS line (only digits: the line is
    read as untrusted output); outside Slurm the line has none."""
    cfg = engine_cfg(tmp_path, engine_bin, ranks=2)
    plan = tmp_path / "plan.txt"
    builtin_engine.write_plan([Step("barrier", 0, 2, 1, "char")], str(plan))
    for job, expected in (("4242", "4242"), ("42; rm -rf", None), (None, None)):
        argv, env = launcher.build_command(cfg, [engine_bin, "--plan", str(plan), "--report-hosts"])
        env.pop("SLURM_JOB_ID", None)
        if job:
            env["SLURM_JOB_ID"] = job
            argv[1:1] = ["-x", "SLURM_JOB_ID"]
        lines = []
        res = run_job(argv, env, idle_timeout=120, on_line=lines.append)
        assert res.returncode == 0, res.stderr_tail
        (payload,) = [p for p in map(builtin_engine.parse_hosts_payload, lines) if p is not None]
        assert payload.get("slurm_job_id") == expected and payload["hosts"] == [socket.gethostname()] * 2
    for bad in ('{"hosts": ["a"], "slurm_job_id": 12}', '{"hosts": ["a"], "slurm_job_id": "1e3"}',
                '{"hosts": ["a"], "slurm_job_id": "' + "9" * 40 + '"}'):
        assert builtin_engine.parse_hosts_payload("CBHOSTS " + bad) == {"hosts": ["a"]}


def pairs(tmp_path, engine_bin, ranks, *extra):
    cfg = engine_cfg(tmp_path, engine_bin, ranks=ranks)
    argv, env = launcher.build_command(
        cfg, [engine_bin, "--pairs", "--lat-size", "8", "--bw-size", "65536", "--iterations", "20",
              *extra])
    lines = []
    res = run_job(argv, env, idle_timeout=120, on_line=lines.append)
    assert res.returncode == 0, res.stderr_tail
    return [json.loads(x[len("CBPAIR "):]) for x in lines if x.startswith("CBPAIR ")]


@pytest.mark.mpi
@pytest.mark.parametrize("ranks,extra", [(2, ()), (4, ()), (5, ()), (4, ("--concurrent",))])
def test_pairs_cover_every_pair_once_in_rounds_of_disjoint_pairs(tmp_path, engine_bin, ranks, extra):
    got = pairs(tmp_path, engine_bin, ranks, *extra)
    assert sorted((p["a"], p["b"]) for p in got) == list(itertools.combinations(range(ranks), 2))
    rounds = {}
    for p in got:
        assert p["lat_us"] > 0 and p["bw_bytes_per_s"] > 0
        assert p["concurrent"] == (1 if extra else 0)
        rounds.setdefault(p["round"], []).append((p["a"], p["b"]))
    # P-1 rounds (P rounds with a bye when P is odd), each rank at most once per round
    assert len(rounds) == (ranks - 1 if ranks % 2 == 0 else ranks)
    for members in rounds.values():
        flat = [r for pair in members for r in pair]
        assert len(flat) == len(set(flat))


@pytest.mark.mpi
def test_pairs_need_two_ranks(tmp_path, engine_bin):
    cfg = engine_cfg(tmp_path, engine_bin, ranks=1)
    argv, env = launcher.build_command(cfg, [engine_bin, "--pairs"])
    res = run_job(argv, env, idle_timeout=120, on_line=lambda line: None)
    assert res.returncode == 2 and "--pairs needs at least 2 ranks" in res.stderr_tail


def test_engine_datatypes_match_the_op_table():
    """ops.DATATYPES is what the engine accepts (its usage text lists its own table)."""
    from pathlib import Path
    src = (Path(__file__).resolve().parent.parent / "collbench" / "engines" / "collbench_engine.c").read_text()
    table = src[src.index("} DATATYPES[DT_COUNT] = {"):]
    table = table[:table.index("};")]
    for name in ("char", "short", "int", "float", "double", "long"):
        assert f'"{name}"' in table
    assert get_op("allreduce").name in src
