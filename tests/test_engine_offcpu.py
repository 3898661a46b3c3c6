"""The engine's per-step off-CPU rank (`offcpu_rank`, `offcpu_share_max`, `offcpu_share_avg`:
docs/LOG_FORMAT.md): real mpirun ranks, one of them held to 5 % of a CPU by a cgroup cpu quota,
is named as the rank the others waited for; CBREC lines without the fields (an older engine)
still make records, without them; values out of range are left out."""

import json

import pytest

from collbench.config import Step
from collbench.engines import builtin as builtin_engine, launcher
from collbench.results import records
from engine_helpers import engine_bin, engine_cfg  # noqa: F401
from cgroup_helpers import Cgroup, RankMover, environ, rank_of

RANKS = 4
THROTTLED = 2


def ctx_for(cfg):
    return records.RunContext(cfg, "builtin", launcher.mpi_version(cfg))


def rank_throttler(cgroup, exe, rank):
    """A RankMover of rank `rank` of this test's engine (its private binary)."""
    rank = str(rank).encode()
    return RankMover(cgroup, lambda proc: str((proc / "exe").readlink()) == exe and rank_of(environ(proc)) == rank)


def plan():
    return [Step(op, 65536, 50, 2, "char" if op in ("bcast", "allgather", "alltoall") else "float")
            for op in ("allreduce", "bcast", "allgather", "alltoall") * 2]


def test_every_record_carries_the_off_cpu_rank(tmp_path, engine_bin):  # noqa: F811
    cfg = engine_cfg(tmp_path, engine_bin, ranks=RANKS)
    recs = list(builtin_engine.run_steps(cfg, plan()[:4], ctx_for(cfg)))
    assert [r["type"] for r in recs] == ["result"] * 4, recs
    for r in recs:
        assert 0 <= r["offcpu_rank"] < RANKS, r
        assert 0.0 <= r["offcpu_share_avg"] <= r["offcpu_share_max"] <= 1.0, r


@pytest.mark.alone     # the throttled rank must be the one the others wait for
def test_a_cpu_throttled_rank_is_the_off_cpu_rank(tmp_path, engine_bin):  # noqa: F811
    cfg = engine_cfg(tmp_path, engine_bin, ranks=RANKS)
    # 5 % of a CPU in 20 ms periods: a step's loop spans many periods, so no step runs on one
    # period's unspent quota alone
    cg = Cgroup(1000, period_us=50000)
    t = rank_throttler(cg, engine_bin, THROTTLED)
    t.start()
    try:
        recs = list(builtin_engine.run_steps(cfg, plan(), ctx_for(cfg)))
    finally:
        t.stop.set()
        t.join()
        cg.remove()
    assert len(t.moved) == 1, "the rank was not throttled"
    assert [r["type"] for r in recs] == ["result"] * len(recs), recs
    named = [r["offcpu_rank"] for r in recs]
    slowest = [r["straggler_rank"] for r in recs]
    print(f"off-CPU rank per step: {named}; slowest rank: {slowest}; shares (max, avg): "
          f"{[(r['offcpu_share_max'], r['offcpu_share_avg']) for r in recs]}")
    # the first step may start before the throttler moved the rank
    assert named.count(THROTTLED) >= len(recs) - 1, (named, slowest)
    # held to 5 % of a CPU, the rank's thread was off its CPU at least ~95 % of each loop (the
    # measurement is CPU time against wall time; a little slack for the period at each end)
    assert all(r["offcpu_share_max"] >= 0.9 for r in recs[1:] if r["offcpu_rank"] == THROTTLED), recs


GOOD = {"op": "allreduce", "size_bytes": 1024, "datatype": "float", "iterations": 3, "warmup": 1,
        "avg_us": 1.5, "min_us": 1.0, "max_us": 2, "max_rank": 1, "validation": "pass", "loop": 0,
        "step": 0, "t_start": 1.0, "t_end": 2.0, "ranks": 4}


def _result(tmp_path, payload):
    cfg = engine_cfg(tmp_path, "/nonexistent/engine", ranks=4)
    rec = builtin_engine.parse_line("CBREC " + json.dumps(payload))
    return None if rec is None else builtin_engine.to_result(records.RunContext(cfg, "builtin", "mpi"), rec)


def test_records_carry_the_fields_when_the_engine_sends_them(tmp_path):
    r = _result(tmp_path, dict(GOOD, offcpu_rank=3, offcpu_max=0.95, offcpu_avg=0.3))
    assert (r["straggler_rank"], r["offcpu_rank"], r["offcpu_share_max"], r["offcpu_share_avg"]) == (1, 3, 0.95, 0.3)
    # an engine older than the fields: the record is made, without them
    old = _result(tmp_path, GOOD)
    assert old["straggler_rank"] == 1 and not {"offcpu_rank", "offcpu_share_max", "offcpu_share_avg"} & set(old)
    # out of range: left out (a rank beyond the job, a share above 1, a mean above the maximum)
    for bad in ({"offcpu_rank": 4}, {"offcpu_rank": -1}, {"offcpu_max": 1.5}, {"offcpu_avg": 0.99}):
        r = _result(tmp_path, {**GOOD, "offcpu_rank": 3, "offcpu_max": 0.95, "offcpu_avg": 0.3, **bad})
        assert "offcpu_rank" not in r and "offcpu_share_max" not in r, bad
    # a wrong type: not a record at all (as any other CBREC field)
    assert _result(tmp_path, dict(GOOD, offcpu_rank="3", offcpu_max=0.95, offcpu_avg=0.3)) is None
