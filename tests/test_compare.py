"""`collbench compare`: every algorithm the MPI offers side by side, real mpirun at 4 ranks.

Open MPI over ob1 shared memory and UCX (TCP) for allgather, allreduce, bcast and alltoall: every
algorithm ompi_info lists gets a measured row or a reasoned one; the rules file it writes is the
measurement's, Open MPI accepts it and it changes what runs (pml monitoring); MPICH with ring and
recursive doubling forced. Sizes and iterations are small: the machine is shared and MPICH
busy-polls.
"""

import csv
import io
import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import require_tool
from algorithm_helpers import mpich_engine, run_monitored, sends  # noqa: F401
from engine_helpers import engine_bin, engine_cfg  # noqa: F401

from collbench.compare import rules_file
from collbench.compare.runner import with_rules
from collbench.compare.table import CSV_FIELDS
from collbench.config import Step
from collbench.engines import algorithms as algs

OPS = ("allgather", "allreduce", "bcast", "alltoall")


def compare(tmp_path, args, cfg_data, timeout=1800):
    cfg_file = tmp_path / "compare.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg_data), encoding="utf-8")
    env = dict(os.environ, COLLBENCH_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "collbench", "compare", "-c", str(cfg_file), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def listed(ops=OPS):
    """ompi_info's algorithms per op, read independently of collbench's reader."""
    out = subprocess.run([require_tool("ompi_info"), "--param", "coll", "tuned", "--level", "9", "--parsable"],
                         capture_output=True, text=True, timeout=120).stdout
    found = {op: [] for op in ops}
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) == 9 and parts[5] == "enumerator" and parts[7] != "0":
            op = parts[4][len("coll_tuned_"):-len("_algorithm")]
            if op in found:
                found[op].append(parts[8])
    return found


@pytest.mark.parametrize("transport", ["shm", "ucx-tcp"])
def test_every_algorithm_runs_or_says_why(tmp_path, engine_bin, transport):
    results, tsv = tmp_path / "r.jsonl", tmp_path / "r.tsv"
    p = compare(tmp_path, ["--ops", ",".join(OPS), "--sizes", "4KB", "--iterations", "2", "--warmup", "1",
                           "--blocks", "1", "--format", "json", "--results", str(results), "--tsv", str(tsv), "-q"],
                {"ranks": 4, "transport": transport, "engine_path": engine_bin, "step_timeout": 300})
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["ranks"] == 4 and doc["transport"] == transport and doc["timing"] == "sustained"
    rows = doc["rows"]
    for op, names in listed().items():
        got = {r["algorithm"]: r for r in rows if r["op"] == op}
        assert set(got) == {"default", *names}, op
        assert got["default"]["status"] == "ok"
        for name, r in got.items():
            if r["status"] == "ok":
                assert r["validation"] == "pass" and r["avg_us"] > 0 and r["busbw_bytes_per_s"] > 0, r
            else:
                assert r["status"] in ("skipped", "failed") and len(r["reason"]) > 10, r
        if "two_proc" in got:        # Open MPI's two-process algorithms at 4 ranks
            assert got["two_proc"]["status"] == "skipped" and "2 ranks" in got["two_proc"]["reason"]
        fastest = [r for r in got.values() if r["fastest"]]
        assert len(fastest) == 1
        ok = [r for r in got.values() if r["status"] == "ok"]
        assert fastest[0]["avg_us"] == min(r["avg_us"] for r in ok)
    # JSONL: one record per measured row, each naming its algorithm; TSV: one line per row
    recs = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    measured = {(r["op"], r["algorithm"]) for r in rows if r["status"] == "ok"}
    assert {(r["op"], r["algorithm"]) for r in recs if r["type"] == "result"} == measured
    assert all(r["run_id"] == doc["run_id"] and r["ranks"] == 4 for r in recs)
    lines = tsv.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(rows) + 1 and lines[0].split("\t")[2] == "algorithm"


def test_table_shows_the_interval_and_marks_only_proven_wins(tmp_path, engine_bin):
    p = compare(tmp_path, ["--op", "allgather", "--sizes", "8KB,32KB", "--algorithms", "ring,bruck",
                           "--iterations", "3", "--warmup", "1", "--blocks", "5", "-q"],
                {"ranks": 4, "engine_path": engine_bin})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("Algorithm"))
    assert lines[head].split() == ["Algorithm", "Size(B)", "Count", "Avg(ms)", "Min(ms)", "Max(ms)",
                                   "AlgoBW(GB/s)", "BusBW(GB/s)", "Valid", "Blocks", "vs", "default",
                                   "[95%", "CI]", "Mark"]
    rows = [ln.split() for ln in lines[head + 2:] if ln.split()[:1] and ln.split()[0] in ("default", "ring", "bruck")]
    assert len(rows) == 6
    for size in ("8192", "32768"):
        group = {r[0]: r for r in rows if r[1] == size}
        assert [r[2] for r in group.values()] == [size] * 3        # count: char elements
        default = group["default"]
        assert default[9] == "5"
        kept = default[10:] == ["keep"]
        for name in ("ring", "bruck"):
            r = group[name]
            assert r[9] == "5"
            # "1.23x [1.10, 1.35]": the point is default's median over the algorithm's (5 blocks:
            # the Avg column is the median block's), the interval around it
            point, lo, hi = float(r[10].rstrip("x")), float(r[11].strip("[,")), float(r[12].rstrip("]"))
            assert point == pytest.approx(float(default[3]) / float(r[3]), rel=0.05, abs=0.02)
            assert lo <= hi
            mark = " ".join(r[13:])
            assert (mark.startswith("win")) == (lo > 1.0), r
            if mark == "win, rule":
                assert lo > 1.05 and not kept, r
        rules = [r for r in group.values() if " ".join(r[13:]) == "win, rule"]
        assert len(rules) == (0 if kept else 1)
    assert "Choice per size" in p.stdout
    c = compare(tmp_path, ["--op", "allgather", "--sizes", "8KB", "--algorithms", "ring", "--iterations", "2",
                           "--warmup", "1", "--blocks", "2", "--format", "csv", "-q"], {"ranks": 4, "engine_path": engine_bin})
    table = list(csv.DictReader(io.StringIO(c.stdout)))
    assert tuple(table[0]) == CSV_FIELDS and [r["algorithm"] for r in table] == ["default", "ring"]
    # 2 blocks cannot prove anything at 95 %: no interval, no win, the file would keep default
    assert table[1]["ci_low"] == "" and table[1]["win"] == "" and table[0]["chosen"] == "yes"


def test_in_place_datatype_and_osu_timing(tmp_path, engine_bin):
    results = tmp_path / "r.jsonl"
    p = compare(tmp_path, ["--op", "allreduce", "--sizes", "16KB", "--algorithms", "ring,recursive_doubling",
                           "--blocks", "1", "--in-place", "--datatype", "int", "--timing", "osu", "--iterations", "2", "--warmup", "1",
                           "--format", "json", "--results", str(results), "-q"],
                {"ranks": 4, "engine_path": engine_bin})
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["rows"]
    assert [(r["algorithm"], r["status"], r["validation"], r["count"], r["datatype"]) for r in rows] == [
        ("default", "ok", "pass", 4096, "int"), ("ring", "ok", "pass", 4096, "int"),
        ("recursive_doubling", "ok", "pass", 4096, "int")]
    recs = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    assert all(r["inplace"] is True and "timing" not in r and r["datatype"] == "int" for r in recs)


def test_rules_file_is_the_measurement_and_open_mpi_runs_it(tmp_path, engine_bin):
    rules = tmp_path / "tuned-rules.conf"
    p = compare(tmp_path, ["--op", "allgather", "--sizes", "4KB,64KB", "--algorithms", "ring,bruck,recursive_doubling",
                           "--iterations", "3", "--warmup", "1", "--blocks", "6", "--format", "json",
                           "--write-rules", str(rules), "--check-rules", str(rules), "-q"],
                {"ranks": 4, "engine_path": engine_bin})
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["rules_written"] == str(rules) and doc["rules_checked"] == str(rules) and doc["blocks"] == 6
    parsed = rules_file.read_ompi_rules(str(rules))
    cfg = engine_cfg(tmp_path, engine_bin, ranks=4)
    cat = algs.catalogue(cfg)
    forced = 0
    for chosen in doc["chosen"]:
        row = next(r for r in doc["rows"] if r["size_bytes"] == chosen["size_bytes"] and r["chosen"])
        assert row["algorithm"] == chosen["algorithm"]
        if chosen["algorithm"] == "default":
            want = 0
        else:
            forced += 1
            assert chosen["ci_low"] > 1.05           # forced only where proven above 1 + margin
            dropped = {d["size_bytes"] for d in doc["rules_check"]["dropped"]}
            want = 0 if chosen["size_bytes"] in dropped else int(cat.find("allgather", chosen["algorithm"]).value)
        assert rules_file.rule_for(parsed, rules_file.OMPI_COLLTYPE["allgather"], 4, chosen["size_bytes"] * 4) == want
    # other communicator sizes keep the library's own choice
    assert rules_file.rule_for(parsed, 0, 2, 4096 * 2) == 0 and rules_file.rule_for(parsed, 0, 8, 4096 * 8) == 0
    chk = doc["rules_check"]
    if forced:
        checked = [r for r in doc["rows"] if r["algorithm"] == "rules"]
        assert chk["ran"] and [r["status"] for r in checked] == ["ok", "ok"] and chk["pairs"] >= 4
        assert all(r["speedup"] for r in checked)
    else:
        assert not chk["ran"] and "forces nothing" in chk["reason"]
    assert doc["installed_quality"] == chk["installed_quality"]

    # What runs with a rules file: a choice unlike the default's at both sizes, proven by the
    # messages (ring below 32 KB of gathered data, bruck above), and without it the default's.
    hand = tmp_path / "hand.conf"
    hand.write_text(rules_file.render_ompi_rules(
        {"allgather": [rules_file.Choice(4096, "ring", cat.find("allgather", "ring").value),
                       rules_file.Choice(65536, "bruck", cat.find("allgather", "bruck").value)]}, 4), encoding="utf-8")
    steps = [Step("allgather", 4096, 3, 1, "char"), Step("allgather", 65536, 3, 1, "char")]
    recs, plain = run_monitored(tmp_path, cfg, steps, "plain")
    assert [r["type"] for r in recs] == ["result", "result"]
    recs, tuned = run_monitored(tmp_path, with_rules(cfg, str(hand)), steps, "tuned")
    assert [r["type"] for r in recs] == ["result", "result"]
    calls = 4
    assert sends(tuned, 4096) == {1: 3 * calls} and sends(tuned, 8192) == {}          # ring
    assert sends(tuned, 65536) == {3: calls} and sends(tuned, 131072) == {2: calls}   # bruck
    assert (sends(plain, 4096), sends(plain, 65536)) != (sends(tuned, 4096), sends(tuned, 65536))


def test_bad_input_is_exit_2_and_writes_nothing(tmp_path, engine_bin, monkeypatch, capsys):
    # the CLI's own entry point in this process (refusals are not about the process boundary)
    from collbench import cli
    monkeypatch.setenv("COLLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    cfg_file = tmp_path / "compare.yaml"
    cfg_file.write_text(yaml.safe_dump({"ranks": 4, "engine_path": engine_bin}), encoding="utf-8")
    results = tmp_path / "r.jsonl"
    malformed = tmp_path / "bad.conf"
    malformed.write_text("1\n0\n1\n4\n1\n64 4 0 0\n", encoding="utf-8")
    cases = [
        (["--op", "allgathr"], "unknown op 'allgathr'"),
        (["--op", "allgather", "--algorithms", "hypercube"], "available: allgather: default, "),
        (["--op", "allgather", "--sizes", "6", "--datatype", "float"], "not a multiple of the float size"),
        (["--op", "allgather", "--min-bytes", "1MB", "--max-bytes", "1KB"], "--max-bytes"),
        (["--op", "allgather", "--factor", "1"], "--factor"),
        (["--op", "allgather", "--sizes", "3GB"], "--sizes"),
        (["--op", "allgather", "--datatype", "quad"], "--datatype"),
        (["--op", "allgather", "--check-rules", str(malformed)], "the first message-size rule must start at 0"),
        (["--op", "allgather", "--check-rules", str(tmp_path / "missing.conf")], "cannot read the rules file"),
        (["--op", "allgather", "--tsv", str(tmp_path / "no" / "t.tsv")], "does not exist"),
    ]
    for args, message in cases:
        try:
            code = cli.main(["compare", "-c", str(cfg_file), *args, "--results", str(results)])
        except SystemExit as e:   # argparse
            code = e.code
        err = capsys.readouterr().err
        assert code == 2, (args, err)
        assert message in err, (args, err)
        assert not results.exists()


def test_mpich_ring_and_recursive_doubling(tmp_path, mpich_engine):
    """MPICH 4.0 at 4 ranks: allgather ring and recursive doubling, allreduce recursive doubling
    (4.0 has no allreduce ring: asking for it lists what there is), and its env-file tuning."""
    cfg = {"ranks": 4, "launcher_path": "mpirun.mpich", "engine_path": mpich_engine, "step_timeout": 600}
    env_file = tmp_path / "mpich.env"
    p = compare(tmp_path, ["--ops", "allgather,allreduce", "--sizes", "16KB", "--algorithms",
                           "ring,recursive_doubling", "--blocks", "2", "--iterations", "2", "--warmup", "1", "--format", "json",
                           "--write-rules", str(env_file), "--check-rules", str(env_file), "-q"], cfg)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["flavour"] == "mpich" and doc["mpi"].startswith("MPICH 4.")
    got = {(r["op"], r["algorithm"]): r for r in doc["rows"]}
    for key in [("allgather", "default"), ("allgather", "ring"), ("allgather", "recursive_doubling"),
                ("allreduce", "default"), ("allreduce", "recursive_doubling")]:
        assert got[key]["status"] == "ok" and got[key]["validation"] == "pass", got[key]
    ring = got[("allreduce", "ring")]
    assert ring["status"] == "skipped" and "offers no 'ring' for allreduce" in ring["reason"]
    env = algs.read_env_file(str(env_file))
    assert set(env) <= {"MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM", "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM",
                        "MPIR_CVAR_DEVICE_COLLECTIVES"}
    chosen = {c["op"]: c["algorithm"] for c in doc["chosen"]}
    for op, cvar in (("allgather", "MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM"),
                     ("allreduce", "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM")):
        dropped = {d["op"] for d in (doc["rules_check"] or {}).get("dropped", [])}
        want = None if chosen[op] == "default" or op in dropped else chosen[op]
        assert env.get(cvar) == want, (op, env, chosen)
    rules_rows = [r["status"] for r in doc["rows"] if r["algorithm"] == "rules"]
    assert rules_rows == (["ok", "ok"] if doc["rules_check"]["ran"] else [])
    p = compare(tmp_path, ["--op", "allreduce", "--algorithms", "ring", "--sizes", "16KB"], cfg, timeout=300)
    assert p.returncode == 2 and "recursive_doubling" in p.stderr and "'ring'" in p.stderr


def test_repeats_report_the_median_run(tmp_path, engine_bin):
    """--repeats, --blocks' older name: the row shows the median block, and carries every sample."""
    results = tmp_path / "r.jsonl"
    p = compare(tmp_path, ["--op", "allgather", "--sizes", "4KB", "--algorithms", "ring", "--repeats", "3",
                           "--iterations", "2", "--warmup", "1", "--format", "json", "--results", str(results), "-q"],
                {"ranks": 4, "engine_path": engine_bin})
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["repeats"] == 3
    recs = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    for row in doc["rows"]:
        runs = sorted(r["latency_avg_us"] for r in recs if r["algorithm"] == row["algorithm"])
        assert row["runs"] == 3 and len(runs) == 3
        assert row["avg_us"] == runs[1] and sorted(row["samples_us"]) == runs and row["blocks"] == 3
