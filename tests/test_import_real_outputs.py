"""`collbench import nccl-tests` on real published nccl-tests / rccl-tests outputs (issue 26):
tests/fixtures/nccl_tests_real/README.md names each one's source. Every check is read off the
file itself: the op its table or its own lines say, its sizes, its rank count, and the busbw it
printed against the busbw of the records made from it."""

import json
import subprocess
import sys

import pytest

from collbench.engines.nccl_tests_parser import parse
from collbench.import_results.infer import infer, infer_from_table
from collbench.results.record_parser import parse_record
from conftest import FIXTURES, REPO

REAL = FIXTURES / "nccl_tests_real"


def collbench(*args):
    return subprocess.run([sys.executable, "-m", "collbench", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def imported(tmp_path, name, *args):
    """(summary rows, records) of importing one fixture; every record valid for every reader."""
    out = tmp_path / f"{name}.jsonl"
    out.unlink(missing_ok=True)
    p = collbench("import", "nccl-tests", REAL / name, *args, "--results", out, "--format", "json")
    assert p.returncode == 0, p.stderr
    recs = [parse_record(line) for line in out.read_text().splitlines()]
    assert all(isinstance(r, dict) for r in recs), recs
    return json.loads(p.stdout), recs


def printed_rows(name, skip=0):
    """(size, out-of-place time, algbw, busbw) of the table rows in a fixture, as printed."""
    rows = []
    for line in (REAL / name).read_text().splitlines()[skip:]:
        fields = line.split()
        if fields and fields[0].endswith(":"):     # srun -l
            fields = fields[1:]
        if len(fields) >= 11 and fields[0].isdigit() and fields[1].isdigit():
            at = {13: 5, 12: 4, 11: 3}[len(fields)]
            rows.append((int(fields[0]), float(fields[at]), float(fields[at + 1]), float(fields[at + 2])))
    return rows


def assert_busbw_as_printed(recs, rows):
    """Each record's busbw is the busbw nccl-tests printed for its row (2 decimals, GB/s)."""
    results = [r for r in recs if r["type"] == "result"]
    assert len(results) == len(rows)
    for rec, (_size, _t, _algbw, busbw) in zip(results, rows):
        assert rec["busbw_bytes_per_s"] / 1e9 == pytest.approx(busbw, abs=0.0051 + busbw * 2e-3), (rec, busbw)


def test_sendrecv_named_only_by_its_binary_is_inferred_from_its_table(tmp_path):
    name = "binname_2ranks_a40_nccl-tests-214.txt"
    [s], recs = imported(tmp_path, name)
    assert (s["op"], s["ranks"], s["hosts"], s["records"]) == ("sendrecv", 2, "gpu23,gpu24", 5)
    assert s["op_from"] == ("inferred from the table: redop sum, root -1, in-place #wrong N/A (never checked), "
                            "busbw/algbw 1.000 at 2 ranks")
    assert [r["size_bytes"] for r in recs] == [256, 512, 1024, 2048, 4096]
    assert_busbw_as_printed(recs, printed_rows(name))


def test_ambiguous_table_asks_for_op_naming_what_it_fits(tmp_path):
    name = "binname_ambiguous_nccl-tests-128.txt"
    p = collbench("import", "nccl-tests", REAL / name)
    assert p.returncode == 2 and "give --op" in p.stderr and name in p.stderr
    assert "the table fits allreduce, reduce_scatter (redop sum, root -1, in-place #wrong checked" in p.stderr
    [s], recs = imported(tmp_path, name, "--op", "reduce_scatter")
    assert (s["op"], s["op_from"], s["records"]) == ("reduce_scatter", "--op", 7)
    assert "unknown (no device lines" in s["ranks_from"] and "ranks" in recs[0]["unknown"]
    assert [r["size_bytes"] for r in recs] == [0, 0, 0, 0, 0, 128, 256]


def test_bfloat16_allgather_inferred_then_its_rows_skipped_by_datatype():
    name = "binname_bf16_2gpus_nccl-1435.txt"
    p = collbench("import", "nccl-tests", REAL / name)
    assert p.returncode == 2 and "7 row(s): datatype bfloat16" in p.stderr
    [out] = parse((REAL / name).read_bytes())
    inf = infer(out, name)
    # none/-1 leaves allgather, alltoall(v); a checked in-place #wrong leaves allgather; 77.10/154.20
    # is (n-1)/n at 2 ranks
    assert (inf.op, inf.ranks) == ("allgather", 2)
    assert inf.ranks_how == "2 ranks from busbw/algbw 0.500 ((n-1)/n of allgather)"


def test_allgather_without_device_lines_needs_ranks_for_one_ranks_block(tmp_path):
    name = "binname_srun_label_no_devices_rccl-1490.txt"
    p = collbench("import", "nccl-tests", REAL / name)
    assert p.returncode == 2 and "give --ranks" in p.stderr
    [s], recs = imported(tmp_path, name, "--ranks", "32")
    assert (s["op"], s["ranks"], s["ranks_from"]) == ("allgather", 32, "--ranks")
    rows = printed_rows(name)
    assert [r["size_bytes"] for r in recs] == [size // 32 for size, *_ in rows]   # one rank's block
    assert_busbw_as_printed(recs, rows)


def test_sendrecv_paste_without_device_lines_is_kept_with_ranks_unknown(tmp_path):
    name = "command_8gpu_no_devices_li-plus-playground.txt"
    [s], recs = imported(tmp_path, name)
    assert (s["op"], s["op_from"], s["records"]) == ("sendrecv", "the command line in it (sendrecv_perf)", 4)
    assert s["ranks_from"].startswith("unknown (no device lines") and "ranks" in s["unknown"].split(",")
    assert all("ranks" in r["unknown"] for r in recs)
    assert_busbw_as_printed(recs, printed_rows(name))     # sendrecv's busbw needs no rank count
    # the table alone says the same: a reduction's redop, root -1, an unchecked in-place result
    text = (REAL / name).read_text().split("\n", 1)[1]
    [out] = parse(text)
    assert infer_from_table(out).op == "sendrecv"


def test_hypercube_failure_before_any_row_is_a_failure_record(tmp_path):
    [first, second], recs = imported(tmp_path, "command_failure_nccl-tests-289.txt")
    assert [r["type"] for r in recs] == ["failure"]
    assert recs[0]["op"] == "hypercube" and "invalid device ordinal" in recs[0]["error"]
    assert first["ranks"] == 8 and "nThread x nGpus" in first["ranks_from"]
    assert (second["op"], second["ranks"], second["records"]) == ("hypercube", 2, 0)
    assert "no result rows" in second["skipped"]


def test_header_lines_without_hash_are_read():
    [out] = parse((REAL / "hashless_header_devices_nccl-583.txt").read_bytes())
    assert out.ranks == 8 and out.hosts == ["AI-A100-Beethoven01"]
    assert out.columns == ("size", "count", "type", "redop") and out.params["ngpus"] == 1
    assert out.command_test == "all_reduce_perf"


def test_several_collectives_one_after_another_each_get_their_op(tmp_path):
    name = "multi_2020_tests_nccl-tests-44.txt"
    runs, recs = imported(tmp_path, name)
    assert [(s["op"], s["ranks"], s["records"]) for s in runs] == [("allreduce", 2, 3), ("allgather", 2, 13),
                                                                   ("reduce", 2, 13)]
    assert runs[0]["op_from"] == "the command line in it (all_reduce_perf)"
    # all_gather before 2020-06: busbw = algbw, algbw x time / size = (n-1)/n
    assert "algbw x time / size 0.500" in runs[1]["op_from"]
    assert runs[1]["ranks_from"] == "the device lines of the run before it"
    assert "which the table rules out" in runs[2]["op_from"] and "broadcast_perf" in runs[2]["op_from"]
    rows = printed_rows(name)
    by_op = {op: [r for r in recs if r["op"] == op] for op in ("allreduce", "allgather", "reduce")}
    assert [r["size_bytes"] for r in by_op["allgather"]] == [size // 2 for size, *_ in rows[3:16]]
    assert_busbw_as_printed(by_op["allgather"], rows[3:16])
    assert_busbw_as_printed(by_op["reduce"], rows[16:])
    assert {r["run_id"] for r in by_op["allgather"]}.isdisjoint({r["run_id"] for r in by_op["reduce"]})


def test_quoted_multiline_command_sixteen_ranks_on_two_hosts(tmp_path):
    name = "quoted_command_16ranks_a3mega.txt"
    [s], recs = imported(tmp_path, name)
    assert (s["op"], s["ranks"], s["hosts"], s["records"]) == ("allreduce", 16, "ztan-mig-235z,ztan-mig-gq73", 31)
    assert recs[-1]["size_bytes"] == 8589934592 and recs[-1]["latency_avg_us"] == 47535
    assert_busbw_as_printed(recs, printed_rows(name))


def test_rccl_tests_allreduce_named_only_by_its_binary(tmp_path):
    name = "rccl_binname_mi300x_crickett-hpe-30.txt"
    [s], recs = imported(tmp_path, name)
    assert (s["op"], s["engine"], s["ranks"]) == ("allreduce", "rccl-tests", 8)
    assert s["op_from"].endswith("busbw/algbw 1.750 at 8 ranks")
    assert_busbw_as_printed(recs, printed_rows(name))


def test_rccl_tests_fragment_below_its_header_without_device_lines(tmp_path):
    name = "rccl_concluded_tail_no_devices_rccl-2075.txt"
    [s], recs = imported(tmp_path, name)
    assert (s["op"], s["engine"], s["records"]) == ("sendrecv", "rccl-tests", 9)
    assert s["op_from"] == "the output names its test (sendrecv_perf)"
    assert "ranks" in s["unknown"].split(",")
    assert_busbw_as_printed(recs, printed_rows(name))


def test_rccl_tests_alltoall_ranks_from_its_ratio(tmp_path):
    name = "rccl_concluded_tail2_no_devices_rccl-2075.txt"
    [s], recs = imported(tmp_path, name)
    assert (s["op"], s["ranks"], s["engine"]) == ("alltoall", 2, "rccl-tests")
    assert s["ranks_from"] == "2 ranks from busbw/algbw 0.500 ((n-1)/n of alltoall)"
    rows = printed_rows(name)
    assert [r["size_bytes"] for r in recs] == [size // 2 for size, *_ in rows]
    assert_busbw_as_printed(recs, rows)
