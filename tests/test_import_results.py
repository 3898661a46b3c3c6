"""`collbench import nccl-tests|osu`: published outputs and a run made by real mpirun become records
that the results log's readers, `report` and `baseline` accept."""

import json
import os
import subprocess
import sys

import pytest

from collbench.results.record_parser import parse_record
from conftest import FIXTURES, REPO

NCCL = FIXTURES / "nccl_tests"
OSU = FIXTURES / "osu-7.4"
STANDIN = REPO / "tests" / "nccl_tests_standin"


def collbench(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "collbench", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def imported(tmp_path, *args):
    out = tmp_path / "imported.jsonl"
    out.unlink(missing_ok=True)      # --results appends: each call's records alone
    p = collbench("import", *args, "--results", out, "--format", "json")
    assert p.returncode == 0, p.stderr
    recs = [parse_record(line) for line in out.read_text().splitlines()]
    assert all(isinstance(r, dict) for r in recs), recs      # every line valid for every reader
    return json.loads(p.stdout), recs


def test_nccl_tests_text_hosts_ranks_and_op_from_the_output(tmp_path):
    [summary], recs = imported(tmp_path, "nccl-tests", NCCL / "v213_group_nccl-1039.txt")
    assert summary["op"] == "allreduce" and summary["ranks"] == 4 and summary["records"] == 4
    assert [(r["size_bytes"], r["latency_avg_us"], r["validation"]) for r in recs] == [
        (8, 19.12, "pass"), (16, 17.72, "pass"), (32, 18.08, "pass"), (64, 18.59, "pass")]
    r = recs[0]
    assert (r["hosts"], r["nodes"], r["ranks"], r["engine"]) == (["job-1111-2222-0"], 1, 4, "nccl-tests")
    assert r["iterations"] == 20 and r["warmup"] == 5 and r["wrong_elements"] == 0
    assert r["unknown"] == ["transport"] and r["transport"] == "unknown"
    assert "inplace" not in r and r["imported_from"].endswith("v213_group_nccl-1039.txt")


def test_what_the_output_does_not_say_is_inferred_and_said_or_asked_for(tmp_path):
    f = NCCL / "srun_label_prefix_p4de.txt"
    # one row, no device lines, no test name: redop sum + root -1 + busbw/algbw 1.874 is allreduce
    # at 16 ranks (2(n-1)/n), and the summary says so
    [summary], recs = imported(tmp_path, "nccl-tests", f)
    assert summary["op"] == "allreduce" and summary["ranks"] == 16
    assert summary["op_from"] == ("inferred from the table: redop sum, root -1, in-place #wrong checked, "
                                  "busbw/algbw 1.874")
    assert summary["ranks_from"] == "16 ranks from busbw/algbw 1.874 (2(n-1)/n of allreduce)"
    # an op given that the table contradicts is the user's word; ranks are then not solved for it
    p = collbench("import", "nccl-tests", f, "--op", "bcast", "--format", "json")
    assert p.returncode == 0 and "unknown (no device lines" in json.loads(p.stdout)[0]["ranks_from"]
    [summary], recs = imported(tmp_path, "nccl-tests", f, "--op", "allreduce", "--ranks", "16")
    assert summary["hosts"] == "unknown" and summary["unknown"] == "hosts,nodes,iterations,warmup,transport"
    assert recs[0]["hosts"] == [] and recs[0]["ranks"] == 16
    assert recs[0]["unknown"] == ["hosts", "nodes", "iterations", "warmup", "transport"]
    # busbw from the 16 ranks given: 2(n-1)/n of algbw, as nccl-tests printed it (24.46 GB/s)
    assert recs[0]["busbw_bytes_per_s"] == pytest.approx(24.46e9, rel=2e-3)


def test_rows_records_cannot_hold_are_skipped_and_counted(tmp_path):
    [summary], recs = imported(tmp_path, "nccl-tests", NCCL / "pre2019_rows_nccl-120.txt", "--op", "allreduce",
                               "--ranks", "2")
    assert [(r["datatype"], r["size_bytes"]) for r in recs] == [("char", 10000000), ("int", 10000000)]
    assert "2 reduction prod" in summary["skipped"] and "2 datatype half" in summary["skipped"]
    assert recs[0]["max_error"] == 0.0 and "wrong_elements" not in recs[0]


def test_a_failed_run_gives_its_rows_and_a_failure_record(tmp_path):
    [summary], recs = imported(tmp_path, "nccl-tests", NCCL / "midtable_failure_nccl-tests-322.txt",
                               "--op", "allreduce", "--ranks", "16")
    assert [r["type"] for r in recs] == ["result"] * 5 + ["failure"]
    assert "unhandled cuda error" in recs[-1]["error"] and recs[-1]["op"] == "allreduce"
    assert summary["failures"].startswith("nccl-tests NCCL failure at common.cu:1204")
    [summary], recs = imported(tmp_path, "nccl-tests", NCCL / "pre2019_nccl1_failure_nccl-tests-5.txt")
    assert [r["type"] for r in recs] == ["failure"] and recs[0]["ranks"] == 8 and recs[0]["mpi"] == "NCCL 1.0"


def test_json_J_both_variants_and_rccl_json(tmp_path):
    [summary], recs = imported(tmp_path, "nccl-tests", NCCL / "json_J_from_source_2.19.json", "--variant", "both")
    assert summary["form"] == "json" and len(recs) == 8
    assert [r.get("inplace", False) for r in recs[:2]] == [False, True]
    assert recs[1]["latency_avg_us"] == 18.26 and recs[0]["mpi"] == "NCCL 2.28.3"
    [summary], recs = imported(tmp_path, "nccl-tests", NCCL / "rccl_json_lines_rccl-tests-93.jsonl")
    assert summary["engine"] == "rccl-tests" and summary["ranks"] == 4
    assert [r["latency_avg_us"] for r in recs] == [pytest.approx(19.18415), pytest.approx(19.42665)]


@pytest.mark.mpi
def test_a_run_made_by_real_mpirun_all_gather_sizes_per_rank(tmp_path):
    out = tmp_path / "all_gather_perf.log"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with open(out, "w") as f:
        subprocess.run(["mpirun", "--oversubscribe", "-np", "2", str(STANDIN / "all_gather_perf"), "-b", "2048",
                        "-e", "8192", "-f", "2", "-g", "1", "-n", "7", "-w", "2", "-d", "int8", "-c", "1"],
                       stdout=f, env=env, check=True, timeout=60)
    [summary], recs = imported(tmp_path, "nccl-tests", out)
    assert summary["op"] == "allgather" and summary["ranks"] == 2 and summary["unknown"] == "transport"
    # nccl-tests' size is the whole buffer: the records say one rank's block
    assert [(r["size_bytes"], r["datatype"], r["iterations"], r["warmup"]) for r in recs] == [
        (1024, "char", 7, 2), (2048, "char", 7, 2), (4096, "char", 7, 2)]
    assert recs[0]["hosts"] == [os.uname().nodename]


def test_osu_output_needs_ranks(tmp_path):
    f = OSU / "allreduce_np2_full.txt"
    p = collbench("import", "osu", f)
    assert p.returncode == 2 and "OSU does not print how many ranks ran" in p.stderr
    [summary], recs = imported(tmp_path, "osu", f, "--ranks", "2", "--hosts", "a,b", "--transport", "ucx")
    first = [line.split() for line in f.read_text().splitlines() if line[:1].isdigit()][0]
    assert (recs[0]["size_bytes"], recs[0]["latency_avg_us"], recs[0]["latency_min_us"]) == \
        (int(first[0]), float(first[1]), float(first[2]))
    assert recs[0]["hosts"] == ["a", "b"] and recs[0]["nodes"] == 2 and recs[0]["transport"] == "ucx"
    assert recs[0]["engine"] == "osu" and recs[0]["unknown"] == ["warmup"]


def test_a_bad_file_writes_nothing_and_names_it(tmp_path):
    bad = tmp_path / "garbage.txt"
    bad.write_bytes(bytes(range(256)) * 8)
    results = tmp_path / "r.jsonl"
    p = collbench("import", "nccl-tests", NCCL / "v213_group_nccl-1039.txt", bad, "--results", results)
    assert p.returncode == 2 and str(bad) in p.stderr and "not a nccl-tests or rccl-tests output" in p.stderr
    assert not results.exists()
    p = collbench("import", "nccl-tests", tmp_path / "missing.txt")
    assert p.returncode == 2 and "cannot read it" in p.stderr
    p = collbench("import", "nccl-tests", NCCL / "v213_group_nccl-1039.txt", "--results", tmp_path / "no" / "r.jsonl")
    assert p.returncode == 2 and "does not exist" in p.stderr
    p = collbench("import", "osu", NCCL / "v213_group_nccl-1039.txt", "--ranks", "2")
    assert p.returncode == 2 and "not an OSU collective output" in p.stderr


def test_baseline_and_report_read_imported_records(tmp_path):
    _, recs = imported(tmp_path, "nccl-tests", NCCL / "version_line_dstack.txt", "--ranks", "8",
                       "--hosts", "b200-1", "--transport", "ib")
    src = tmp_path / "imported.jsonl"
    p = collbench("baseline", "save", tmp_path / "b200.json", "--from", src)
    assert p.returncode == 0, p.stderr
    saved = json.loads((tmp_path / "b200.json").read_text())
    assert "6 entries" in p.stdout + p.stderr and json.dumps(saved).count("nccl-tests") >= 1
    p = collbench("report", src, "-o", tmp_path / "r.html")
    assert p.returncode == 0, p.stderr
    assert "Allreduce" in (tmp_path / "r.html").read_text()
