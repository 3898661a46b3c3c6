"""The MPI's collective algorithms: listed by the installed MPI, forced per job, proven by the
messages they send (Open MPI's pml monitoring), MPICH's CVARs honoured and checked by MPICH itself.

Real ompi_info, mpivars, mpirun and mpirun.mpich at 4 ranks; the only fixture is an Open MPI 5.x
ompi_info listing (han above tuned), which cannot run here.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import require_tool
from algorithm_helpers import mpich_engine, run_monitored, sends  # noqa: F401
from engine_helpers import engine_bin, engine_cfg  # noqa: F401

from collbench.config import Step, build_config
from collbench.engines import algorithms as algs
from collbench.engines.algorithms import discovery
from collbench.engines import builtin, launcher, mpi_flavour
from collbench.engines.mpi_job import JobRunner
from collbench.errors import UserError
from collbench.results.records import RunContext

CALLS = 4          # 1 warm-up + 3 timed calls per step in the proofs below


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Algorithm lists cached per test (the cache file is part of what is tested)."""
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    discovery._MEMORY.clear()
    yield
    discovery._MEMORY.clear()


def ompi_cfg(tmp_path, engine, transport="shm", ranks=4):
    return engine_cfg(tmp_path, engine, ranks=ranks, transport=transport, step_timeout=300)


def mpich_cfg(tmp_path, engine, ranks=4):
    return build_config({"ranks": ranks, "launcher_path": "mpirun.mpich", "engine_path": engine,
                         "step_timeout": 300}, "<test>", str(tmp_path))


# ---------------------------------------------------------------- listing (Open MPI)

def test_open_mpi_list_is_ompi_infos_own(tmp_path):
    """Every coll_tuned_<op>_algorithm enumerator ompi_info prints, and nothing else, per op."""
    tool = require_tool("ompi_info")
    out = subprocess.run([tool, "--param", "coll", "tuned", "--level", "9", "--parsable"],
                         capture_output=True, text=True, timeout=120).stdout
    listed = {}
    for m in re.finditer(r"coll_tuned_(\w+?)_algorithm:enumerator:value:(\d+):(\S+)", out):
        if m.group(1) in ("allgather", "allreduce", "alltoall", "barrier", "bcast", "reduce", "reduce_scatter") \
                and m.group(2) != "0":
            listed.setdefault(m.group(1), []).append((m.group(3), m.group(2)))
    cat = algs.catalogue(build_config({}, "<test>", str(tmp_path)))
    assert cat.flavour == mpi_flavour.OPENMPI and "ompi_info" in cat.source
    assert set(cat.algorithms) == set(listed)
    for op, pairs in listed.items():
        assert [(a.name, a.value) for a in cat.algorithms[op]] == pairs
    # 0 ("ignore") is the library's own choice: never an algorithm to force
    assert all(a.value != "0" for algos in cat.algorithms.values() for a in algos)


def test_list_is_cached_per_install_and_a_damaged_cache_is_ignored(tmp_path):
    cfg = build_config({}, "<test>", str(tmp_path))
    first = algs.catalogue(cfg)
    files = list((tmp_path / "cache").glob("algorithms-*.json"))
    assert len(files) == 1
    # another process (empty memory) reads the file
    discovery._MEMORY.clear()
    assert algs.catalogue(cfg).to_json() == first.to_json()
    key = json.loads(files[0].read_text(encoding="utf-8"))["key"]
    damaged = ["{not json", json.dumps({"key": 1}), json.dumps([key]),
               json.dumps({"key": key, "catalogue": {"algorithms": {"allgather": [[1, 2]]}}}),
               json.dumps({"key": key, "catalogue": dict(first.to_json(), outranking=["^tuned"])}),
               json.dumps({"key": key, "catalogue": dict(first.to_json(), flavour="lam")})]
    for junk in damaged:
        files[0].write_text(junk, encoding="utf-8")
        discovery._MEMORY.clear()
        again = algs.catalogue(cfg)        # asks ompi_info again, never crashes on the file
        assert again.to_json() == first.to_json()
        assert json.loads(files[0].read_text(encoding="utf-8"))["catalogue"] == first.to_json()


OMPI5_LISTING = """\
mca:coll:han:param:coll_han_priority:value:35
mca:coll:tuned:param:coll_tuned_priority:value:30
mca:coll:adapt:param:coll_adapt_priority:value:0
mca:coll:self:param:coll_self_priority:value:75
mca:coll:tuned:param:coll_tuned_allgather_algorithm:enumerator:value:0:ignore
mca:coll:tuned:param:coll_tuned_allgather_algorithm:enumerator:value:1:linear
mca:coll:tuned:param:coll_tuned_allgather_algorithm:enumerator:value:4:ring
mca:coll:tuned:param:coll_tuned_allgather_algorithm:enumerator:value:8:direct_messaging
"""


def test_han_is_excluded_where_it_outranks_tuned():
    """Open MPI 5.x: han (35) takes collectives before tuned (30) sees them; forcing excludes it."""
    found, priorities = algs.parse_ompi_info(OMPI5_LISTING)
    assert [a.name for a in found["allgather"]] == ["linear", "ring", "direct_messaging"]
    assert algs.outranking_components(priorities) == ("han",)
    cat = algs.Catalogue(mpi_flavour.OPENMPI, "Open MPI 5.0.5", "fixture", found,
                         algs.outranking_components(priorities))
    s = algs.settings_for(cat, {"allgather": "Direct-Messaging"})
    assert ("coll_tuned_allgather_algorithm", "8") in s.mca and ("coll", "^han") in s.mca
    # 4.1 (this machine): han at 0, nothing excluded
    _, here = algs.parse_ompi_info(subprocess.run(
        [require_tool("ompi_info"), "--param", "coll", "all", "--level", "9", "--parsable"],
        capture_output=True, text=True, timeout=120).stdout)
    assert here.get("tuned") is not None
    assert algs.outranking_components(here) == tuple(
        c for c in algs.OUTRANKING_CANDIDATES if here.get(c, -1) > here["tuned"])


def test_forcing_translates_names_and_ids(tmp_path):
    cfg = build_config({}, "<test>", str(tmp_path))
    cat = algs.catalogue(cfg)
    ring = cat.find("allgather", "Ring")
    assert cat.find("allgather", ring.value) == ring              # Open MPI's id works too
    s = algs.launch_settings(cfg, {"allgather": "ring", "allreduce": "default", "bcast": None})
    assert s.mca[0] == ("coll_tuned_use_dynamic_rules", "1")
    assert ("coll_tuned_allgather_algorithm", ring.value) in s.mca
    assert not any("allreduce" in k or "bcast" in k for k, _ in s.mca)
    assert algs.launch_settings(cfg, {"allgather": "default"}).mca == []
    with pytest.raises(UserError) as e:
        cat.find("allgather", "rong")
    assert "available: default, " in str(e.value) and "ring" in str(e.value)


def test_one_job_never_forces_two_algorithms_of_one_op():
    a = Step("allgather", 4096, 1, 1, "char", algorithm="ring")
    b = Step("allreduce", 4096, 1, 1, "float", algorithm="recursive_doubling")
    c = Step("allgather", 8192, 1, 1, "char", algorithm="RING")
    d = Step("allgather", 8192, 1, 1, "char", algorithm="bruck")
    e = Step("allgather", 8192, 1, 1, "char")
    assert algs.job_algorithms([a, b, c]) == {"allgather": "ring", "allreduce": "recursive_doubling"}
    assert algs.same_job_prefix([a, b, c, d, a]) == [a, b, c]
    assert algs.same_job_prefix([e, a]) == [e]        # the default is not ring: two jobs
    assert algs.needs_separate_jobs([a, d]) and not algs.needs_separate_jobs([a, b, c])
    with pytest.raises(ValueError):
        algs.job_algorithms([a, e])


# ---------------------------------------------------------------- the proof: what really ran

# rank 0's messages per call at 4 ranks, {fraction of S: {peer: messages}}, from each algorithm's
# definition (coll_base_<op>.c): whom it talks to and how much it sends at each step
ALLGATHER_4 = {
    "ring": {1: {1: 3}, 2: {}},                   # n-1 steps to the right neighbour, S each
    "recursive_doubling": {1: {1: 1}, 2: {2: 1}},  # rank^1 with S, rank^2 with 2S
    "bruck": {1: {3: 1}, 2: {2: 1}},               # rank-1 with S, rank-2 with 2S
}


@pytest.mark.parametrize("transport", ["shm", "ucx-tcp"])
def test_allgather_runs_the_algorithm_asked_for(tmp_path, engine_bin, transport):
    cfg = ompi_cfg(tmp_path, engine_bin, transport)
    size = 8192
    for alg, expected in ALLGATHER_4.items():
        recs, prof = run_monitored(tmp_path, cfg, [Step("allgather", size, 3, 1, "char", algorithm=alg)], alg)
        assert [r["type"] for r in recs] == ["result"], recs
        assert recs[0]["algorithm"] == alg
        for factor, peers in expected.items():
            assert sends(prof, size * factor) == {p: n * CALLS for p, n in peers.items()}, (alg, factor)


def test_allreduce_bcast_alltoall_run_the_algorithm_asked_for(tmp_path, engine_bin):
    cfg = ompi_cfg(tmp_path, engine_bin)
    s = 16384
    cases = [
        # allreduce ring: reduce-scatter + allgather around the ring, blocks of S/4 to rank 1 only
        ("allreduce", "ring", "float", {s // 4: {1: 6}, s: {}}),
        # recursive doubling: the whole vector to rank^1 and rank^2
        ("allreduce", "recursive_doubling", "float", {s // 4: {}, s: {1: 1, 2: 1}}),
        # Rabenseifner: halving (S/2 to rank^1, S/4 to rank^2), then doubling back
        ("allreduce", "rabenseifner", "float", {s // 2: {1: 2}, s // 4: {2: 2}, s: {}}),
        # bcast from root 0: linear sends to every rank, binomial to its two children 1 and 2
        ("bcast", "basic_linear", "char", {s: {1: 1, 2: 1, 3: 1}}),
        ("bcast", "binomial", "char", {s: {1: 1, 2: 1}}),
        ("bcast", "pipeline", "char", {s: {1: 1}}),
        # alltoall pairwise: S to every peer; modified Bruck: 2 blocks to rank+1 and rank+2
        ("alltoall", "pairwise", "char", {s: {1: 1, 2: 1, 3: 1}, 2 * s: {}}),
        ("alltoall", "modified_bruck", "char", {s: {}, 2 * s: {1: 1, 2: 1}}),
    ]
    for op, alg, dt, expected in cases:
        recs, prof = run_monitored(tmp_path, cfg, [Step(op, s, 3, 1, dt, algorithm=alg)], f"{op}-{alg}")
        assert [r["type"] for r in recs] == ["result"], recs
        for size, peers in expected.items():
            assert sends(prof, size) == {p: n * CALLS for p, n in peers.items()}, (op, alg, size)


def test_two_algorithms_of_one_op_run_in_two_jobs(tmp_path, engine_bin):
    """Forcing is per job: the second step gets a job of its own (its profile replaces the
    first job's), and the stress loop's path runs them step by step."""
    cfg = ompi_cfg(tmp_path, engine_bin)
    steps = [Step("allgather", 4096, 3, 1, "char", algorithm="ring"),
             Step("allgather", 8192, 3, 1, "char", algorithm="recursive_doubling")]
    recs, prof = run_monitored(tmp_path, cfg, steps)
    assert [(r["type"], r["algorithm"]) for r in recs] == [("result", "ring"), ("result", "recursive_doubling")]
    assert sends(prof, 4096) == {}                          # the first job's messages are not in this one
    assert sends(prof, 8192) == {1: CALLS} and sends(prof, 16384) == {2: CALLS}
    loop = list(builtin.run_loop(cfg, steps, RunContext(cfg, "builtin", "test"), JobRunner(), passes=1))
    assert [(x.record["type"], x.record.get("algorithm"), x.step) for x in loop] == [
        ("result", "ring", 0), ("result", "recursive_doubling", 1)]


def test_bad_algorithm_in_a_plan_is_exit_2_listing_the_available_ones(tmp_path, engine_bin):
    cfg_file = tmp_path / "bench.yaml"
    cfg_file.write_text(f"ranks: 4\nengine_path: {engine_bin}\nplan:\n"
                        "  - {op: allgather, sizes: [4KB], iterations: 2, algorithm: ring}\n"
                        "  - {op: allreduce, sizes: [4KB], iterations: 2, algorithm: hypercube}\n", encoding="utf-8")
    results = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "collbench", "once", "-c", str(cfg_file), "--results", str(results)],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, COLLBENCH_CACHE_DIR=str(tmp_path / "cache")))
    assert p.returncode == 2, p.stderr
    assert "plan step allreduce 4KB" in p.stderr and "'hypercube'" in p.stderr
    cat = algs.catalogue(build_config({}, "<test>", str(tmp_path)))
    assert "available: " + ", ".join(["default"] + cat.names("allreduce")) in p.stderr
    assert not results.exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("plan:\n  - {op: allgather, sizes: [4KB], algorithm: 'ring; reboot'}\n", encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "collbench", "once", "-c", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "plan[0].algorithm" in p.stderr


# ---------------------------------------------------------------- MPICH

def test_mpich_list_comes_from_mpivars(tmp_path, mpich_engine):
    tool = require_tool("mpivars")
    out = subprocess.run([tool], capture_output=True, text=True, timeout=120).stdout
    cat = algs.catalogue(mpich_cfg(tmp_path, mpich_engine))
    assert cat.flavour == mpi_flavour.MPICH and cat.source.startswith("mpivars")
    assert cat.version.startswith("MPICH ")
    for op in ("allgather", "allreduce", "bcast", "alltoall", "reduce", "reduce_scatter", "barrier"):
        line = next(ln for ln in out.splitlines()
                    if ln.strip().split("\t")[0].startswith(f"MPIR_CVAR_{op.upper()}_INTRA_ALGORITHM"))
        assert cat.names(op), op
        for name in cat.names(op):
            assert re.search(rf"{re.escape(name)} +- Force", line), (op, name)
    # MPICH itself accepted every value (a fragment such as "ing" is refused in MPI_Init)
    assert "accepted by MPICH" in cat.source
    assert discovery._mpich_accepts(tool, "allgather", "ring") and not discovery._mpich_accepts(tool, "allgather", "ing")
    assert {"ring", "recursive_doubling"} <= set(cat.names("allgather"))
    assert "recursive_doubling" in cat.names("allreduce")


def test_mpivars_description_reader():
    aligned = ("Variable to select allgather algorithmauto               - Internal algorithm selection"
               "brucks             - Force brucks algorithmring               - Force ring algorithm")
    assert algs.mpich_names_from_description(aligned) == ["brucks", "ring"]
    assert algs.mpich_names_from_description("Variable to select nothing") is None
    assert algs.mpich_names_from_description(
        "Variable to select x algorithmauto - Internal (y)Bad-Name  - Force z") is None


def test_mpich_forcing_reaches_mpichs_selection(tmp_path, mpich_engine):
    """At 3 ranks MPICH refuses recursive doubling (it needs a power of two) where ring runs:
    the CVAR reached MPIR's selection, and FALLBACK=error makes the refusal visible."""
    cfg = mpich_cfg(tmp_path, mpich_engine, ranks=3)
    ctx = RunContext(cfg, "builtin", "test")
    ring = list(builtin.run_steps(cfg, [Step("allgather", 4096, 2, 1, "char", algorithm="ring")], ctx))
    assert [r["type"] for r in ring] == ["result"]
    step = Step("allgather", 4096, 2, 1, "char", algorithm="recursive_doubling")
    rd = list(builtin.run_steps(cfg, [step], ctx))
    assert rd[0]["type"] == "failure"
    assert algs.failure_reason(rd[0]["stderr_tail"], step).startswith("MPICH: the algorithm cannot serve this call")
    assert algs.known_constraint(mpi_flavour.MPICH, "allgather", "recursive_doubling", 3, 4096)
    assert not algs.known_constraint(mpi_flavour.MPICH, "allgather", "recursive_doubling", 4, 4096)


def test_mpich_refusal_reaches_every_failure_record(tmp_path, mpich_engine):
    """Issue 19: under load the refusal's failure record came with an empty stderr_tail. MPICH's
    own fatal handler aborts through Hydra, which can kill the rank's proxy before it forwards
    the rank's stderr; the engine's handler prints MPI's error text and exits instead, so the
    text precedes the exit. Every run (each in its own session, as JobRunner starts them) must
    carry the engine's line with MPICH's reason, from the rank that failed."""
    cfg = mpich_cfg(tmp_path, mpich_engine, ranks=3)
    ctx = RunContext(cfg, "builtin", "test")
    step = Step("allgather", 4096, 2, 1, "char", algorithm="recursive_doubling")
    for attempt in range(8):
        rec = list(builtin.run_steps(cfg, [step], ctx))[0]
        assert rec["type"] == "failure" and rec["exit_code"] != 0, attempt
        tail = rec["stderr_tail"]
        assert re.search(r"^collbench-engine: rank \d: Fatal error in an MPI call: ", tail, re.M), (attempt, tail)
        assert "User set collective algorithm is not usable" in tail, (attempt, tail)
        assert algs.failure_reason(tail, step).startswith("MPICH: the algorithm cannot serve this call")


def test_mpich_checks_every_value_itself(tmp_path, mpich_engine):
    """A value MPICH does not know fails MPI_Init: the run verifies the list."""
    cfg = mpich_cfg(tmp_path, mpich_engine, ranks=2)
    plan = tmp_path / "plan.txt"
    builtin.write_plan([Step("allgather", 4096, 1, 1, "char")], str(plan))
    argv, env = launcher.build_command(cfg, [mpich_engine, "--plan", str(plan)])
    assert "--mca" not in argv and "-x" not in argv            # Hydra's syntax, not Open MPI's
    env["MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM"] = "hypercube"
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert algs.failure_reason(p.stderr) == "MPICH does not know 'hypercube' for MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM"


def test_hydra_command_line(tmp_path):
    require_tool("mpirun.mpich")
    cfg = build_config({"hosts": ["a:2", "b:2"], "launcher_path": "mpirun.mpich", "ranks_per_node": 2,
                        "transport": "ucx-tcp", "env": {"FOO": "1"}}, "<test>", str(tmp_path))
    argv, env = launcher.build_command(cfg, ["prog", "--x"], algorithms={"allgather": "ring"})
    assert argv[0] == shutil.which("mpirun.mpich")
    assert argv[1:3] == ["-np", "4"] and argv[-2:] == ["prog", "--x"]
    assert argv[argv.index("-hosts") + 1] == "a:2,b:2" and argv[argv.index("-ppn") + 1] == "2"
    genv = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "-genv"}
    assert genv == {"FOO": "1", "UCX_TLS": "tcp,sm,self", "MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM": "ring",
                    "MPIR_CVAR_DEVICE_COLLECTIVES": "none", "MPIR_CVAR_COLLECTIVE_FALLBACK": "error",
                    "COLLBENCH_ENGINE_STOP_GRACE": "5"}
    assert env["MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM"] == "ring"
    assert launcher.mpi_version(cfg).startswith("MPICH ")
