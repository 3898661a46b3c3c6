"""NCCL/RCCL log parser and census: every log variant of the fixtures, the fast path against the
plain parser, input handling (gz, directories, stdin, binary, huge lines) and the real
`collbench nccl census` command with its formats and exit codes."""

import csv
import gzip
import io
import json
import os
import random
import subprocess
import sys

import pytest

from collbench.nccl.census import NoCollectivesError, iter_calls, run_census
from collbench.nccl.log_input import LogInputError
from collbench.nccl.log_parser import (CollLine, InitLine, KernelLine, Malformed, TuningLine, normalize_chunk,
                                       parse_kernel_name, parse_line)
from conftest import FIXTURES, REPO

NCCL = FIXTURES / "nccl"
COLLBENCH = REPO / ".venv" / "bin" / "collbench"
CLI_TIMEOUT = 120


def fixture_lines(name):
    return (NCCL / name).read_bytes().split(b"\n")


def first(name, pred):
    for line in fixture_lines(name):
        rec = parse_line(line)
        if rec is not None and pred(rec):
            return rec
    raise AssertionError(f"no matching line in {name}")


def group(c, **key):
    found = [g for g in c.groups if all(getattr(g, k) == v for k, v in key.items())]
    assert len(found) == 1, (key, [g.key() for g in c.groups])
    return found[0]


# --- line parser, one test per log variant ------------------------------------------------------

def test_nccl_24_coll_and_init_lines():
    rec = first("nccl-2.4-tf-1proc-2gpu.log", lambda r: type(r) is CollLine)
    assert (rec.host, rec.pid, rec.tid, rec.dev) == ("gpu7", 20211, 20590, 0)
    assert (rec.op.name, rec.op_name, rec.opcount, rec.count) == ("AllReduce", "AllReduce", 0, 256)
    assert (rec.datatype, rec.type_size, rec.redop, rec.root, rec.nranks) == ("float32", 4, "sum", 0, 2)
    assert rec.comm == "0x7f3a2c0017e0" and rec.inplace is False and rec.globalrank is None
    hexed = first("nccl-2.4-tf-1proc-2gpu.log", lambda r: type(r) is CollLine and r.opcount == 0xb)
    assert (hexed.count, hexed.datatype, hexed.redop) == (1, "int64", "max")
    init = first("nccl-2.4-tf-1proc-2gpu.log", lambda r: type(r) is InitLine and r.rank == 1)
    assert (init.comm, init.nranks, init.cuda_dev, init.comm_id, init.bus_id) == ("0x7f3a240017e0", 2, 1, None, None)


def test_nccl_212_send_recv_convention():
    send = first("nccl-2.12-sendrecv.log", lambda r: type(r) is CollLine and r.op.name == "Send")
    assert send.root == 1 and send.count == 2097152 and send.datatype == "bfloat16" and not send.inplace
    assert send.redop is None   # op 0 of a Send is not a reduction
    recv = first("nccl-2.12-sendrecv.log", lambda r: type(r) is CollLine and r.op.name == "Recv")
    assert recv.root == 0 and recv.pid == 4102
    one = first("nccl-2.12-sendrecv.log", lambda r: type(r) is CollLine and r.nranks == 1)
    assert one.op.name == "AllReduce" and one.inplace
    init = first("nccl-2.12-sendrecv.log", lambda r: type(r) is InitLine)
    assert (init.rank, init.nranks, init.bus_id, init.comm_id) == (0, 2, "1b000", None)


def test_nccl_223_init_and_split_lines():
    init = first("nccl-2.23-init-split.log", lambda r: type(r) is InitLine and r.func == "ncclCommInitRank")
    assert init.comm_id == "0x3c2b9a7e51d04f18" and init.nranks == 4 and init.parent is None
    split = first("nccl-2.23-init-split.log", lambda r: type(r) is InitLine and r.func == "ncclCommSplit"
                  and r.host == "dgx-02" and r.rank == 1)
    assert split.nranks == 2 and split.comm_id == "0x1f7a3e9c5d2b8e46" and split.parent == "0x55aa10003000"
    # in-place AllGather: rank 1's sendbuff is its recvbuff + 1*count*size
    ag = [r for r in map(parse_line, fixture_lines("nccl-2.23-init-split.log"))
          if type(r) is CollLine and r.op.name == "AllGather"]
    assert len(ag) == 8 and all(r.inplace for r in ag)
    rs = [r for r in map(parse_line, fixture_lines("nccl-2.23-init-split.log"))
          if type(r) is CollLine and r.op.name == "ReduceScatter"]
    assert len(rs) == 8 and not any(r.inplace for r in rs)
    avg = first("nccl-2.23-init-split.log", lambda r: type(r) is CollLine and r.redop == "avg")
    assert avg.count == 4 and avg.nranks == 4


def test_nccl_226_timestamps_tuning_and_new_names():
    recs = [r for r in map(parse_line, fixture_lines("nccl-2.28-timestamps-tuning.log")) if r is not None]
    colls = [r for r in recs if type(r) is CollLine]
    assert len(colls) == 14 and {r.host for r in colls} == {"gb-0"} and {r.pid for r in colls} == {9001, 9002}
    assert {r.op.name for r in colls} == {"AllReduce", "AlltoAll", "Gather", "Scatter"}
    assert {r.datatype for r in colls} >= {"float8e4m3", "float8e5m2", "bfloat16", "float16"}
    gather = next(r for r in colls if r.op.name == "Gather")
    assert gather.root == 1 and gather.redop is None
    assert next(r for r in colls if r.count == 4096).redop == "premulsum"
    tuning = [r for r in recs if type(r) is TuningLine]
    assert [(t.op.name, t.nbytes, t.algorithm, t.protocol) for t in tuning] == [
        ("AllReduce", 4, "TREE", "LL"), ("AllReduce", 33554432, "RING", "SIMPLE"),
        ("AllReduce", 4, "TREE", "LL"), ("AllReduce", 8192, "RING", "LL128")]
    assert all(t.pid == 9001 for t in tuning)


def test_rccl_rocm5_devredop_suffix():
    recs = [r for r in map(parse_line, fixture_lines("rccl-rocm5-devredop.log")) if type(r) is CollLine]
    assert len(recs) == 12
    red = next(r for r in recs if r.op.name == "Reduce")
    assert (red.root, red.redop, red.datatype, red.count) == (1, "max", "uint64", 64)
    assert sum(1 for r in recs if r.op.name == "AllReduce") == 4


def test_rccl_rocm6_task_globalrank_and_kernel_trace():
    recs = [r for r in map(parse_line, fixture_lines("rccl-rocm6-kerneltrace.log")) if r is not None]
    colls = [r for r in recs if type(r) is CollLine]
    assert sorted(r.globalrank for r in colls) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert {r.task for r in colls} == {0} and {r.dev for r in colls} == {3}
    kl = [r for r in recs if type(r) is KernelLine and r.record == "KL"]
    ke = [r for r in recs if type(r) is KernelLine and r.record == "KE"]
    assert len(kl) == 8 and len(ke) == 8
    k = next(r for r in kl if r.rank == 2 and r.opcount == 1)
    assert (k.coll.name, k.algorithm, k.protocol, k.datatype, k.nranks, k.bus_id) == \
           ("AllReduce", "RING", "LL128", "float16", 4, "38000")
    assert next(r for r in kl if r.opcount == 2).algorithm == "TREE"


def test_rccl_rocm_systems_acc_field_and_alltoall_names():
    recs = [r for r in map(parse_line, fixture_lines("rccl-rocm-systems-acc.log")) if r is not None]
    colls = [r for r in recs if type(r) is CollLine]
    assert len(colls) == 12
    assert {r.op_name for r in colls if r.op.name == "AlltoAll"} == {"AlltoAll", "AlltoAllPivot"}
    assert sum(1 for r in colls if r.op.name == "AllReduce" and r.inplace) == 4
    t = next(r for r in recs if type(r) is TuningLine)
    assert (t.op, t.nbytes, t.algorithm, t.protocol) == (None, 4194304, "RING", "SIMPLE")


def test_msccl_names_map_onto_nccl_ops():
    colls = [r for r in map(parse_line, fixture_lines("rccl-msccl.log")) if type(r) is CollLine]
    names = {(r.op_name, r.op.name) for r in colls}
    assert names == {("mscclFuncAllReduce", "AllReduce"), ("AllReduce", "AllReduce"),
                     ("mscclFuncAllGather", "AllGather"), ("mscclFuncAllToAll", "AlltoAll")}
    assert all(r.inplace for r in colls if r.op.name == "AllGather")     # offset rank*count*size
    assert {r.globalrank for r in colls if r.op_name.startswith("msccl")} == {None}


def test_wrapper_prefixes():
    ray = first("ray-wrapper.log", lambda r: type(r) is CollLine)
    assert (ray.host, ray.pid, ray.tid, ray.opcount) == ("r24-worker-l4-fqztx", 615, 18953, 0x139d)
    assert first("ray-wrapper.log", lambda r: type(r) is InitLine).comm_id == "0x4a0d7be912c35f60"
    recs = [r for r in map(parse_line, fixture_lines("wrappers.log")) if r is not None]
    assert len(recs) == 12 and all(type(r) is CollLine for r in recs)
    assert {(r.host, r.pid) for r in recs} == {("h100-0", 51000), ("h100-0", 51001), ("h100-1", 51002),
                                                ("h100-1", 51003)}
    assert {r.datatype for r in recs} == {"int8"}


def test_garbage_lines():
    lines = fixture_lines("garbage.log")
    kinds = [type(parse_line(line)).__name__ for line in lines[:-1]]
    assert kinds == ["CollLine", "CollLine", "Malformed", "Malformed", "Malformed", "Malformed", "CollLine",
                     "NoneType", "NoneType", "CollLine", "CollLine", "NoneType", "NoneType", "Malformed",
                     "Malformed", "Malformed"]
    glued = parse_line(lines[1])
    assert (glued.host, glued.pid, glued.tid) == ("node-a", 1002, 1002)
    stripped = parse_line(lines[10])
    assert stripped.host is None and stripped.count == 16
    reasons = [parse_line(lines[i]).reason for i in (2, 3, 4, 5, 13, 14, 15)]
    assert "truncated" in reasons[0] and "garbled" in reasons[1] and "datatype 42" in reasons[2]
    assert "AllRedux" in reasons[3] and "rank 5" in reasons[4] and "root 3" in reasons[5]
    assert "nranks=0" in reasons[6]


def test_kernel_name_variants():
    assert parse_kernel_name("ncclFunction_AllReduce_RING_LL_Sum_float")[1:] == ("RING", "LL", "float32")
    assert parse_kernel_name("ncclDevFunc_AllReduce_RING_LL_Sum_f32")[1:] == ("RING", "LL", "float32")
    assert parse_kernel_name("ncclDevFunc_ReduceScatter_PAT_SIMPLE_Sum_bf16_4")[1:] == ("PAT", "SIMPLE", "bfloat16")
    got = parse_kernel_name("ncclDevFunc_AllGather_COLLNET_DIRECT_LL128_Sum_rccl_float8")
    assert (got[0].name, got[1], got[2], got[3]) == ("AllGather", "COLLNET_DIRECT", "LL128", "float8e4m3")
    assert parse_kernel_name("ncclDevFunc_AllReduce_NVLS_TREE_SIMPLE_Sum_hip_bfloat16")[1] == "NVLS_TREE"
    assert parse_kernel_name("ncclDevFunc_SendRecv_RING_SIMPLE_Sum_int8_t")[0] is None
    assert parse_kernel_name("ncclDevFunc_AllReduce_WARP_LL_Sum_float") is None
    assert parse_kernel_name("mscclKernel_Sum_half_Simple_false") is None


def test_fast_path_normalization_agrees_with_the_plain_parser():
    """Every COLL line of every fixture parses to the same call raw and normalized."""
    checked = 0
    for path in sorted(NCCL.glob("*.log")):
        raw = path.read_bytes()
        raw_lines = raw.split(b"\n")
        norm_lines = normalize_chunk(raw).split(b"\n")
        assert len(raw_lines) == len(norm_lines), path.name
        for a, b in zip(raw_lines, norm_lines):
            ra, rb = parse_line(a), parse_line(b)
            if type(ra) is CollLine:
                assert type(rb) is CollLine, (path.name, a, b)
                fields = ("host", "pid", "tid", "op", "op_name", "count", "datatype", "redop", "root", "comm",
                          "nranks", "stream", "task", "globalrank", "inplace")
                assert [getattr(ra, f) for f in fields] == [getattr(rb, f) for f in fields], (path.name, a)
                assert rb.opcount is None
                checked += 1
            else:
                assert type(ra) is type(rb), (path.name, a)
    assert checked > 150


def test_parser_never_raises_on_mangled_lines():
    rnd = random.Random(7)
    sources = [line for p in sorted(NCCL.glob("*.log")) for line in p.read_bytes().split(b"\n") if line]
    results = set()
    for _ in range(3000):
        line = bytearray(rnd.choice(sources))
        how = rnd.randrange(4)
        if how == 0:
            line = line[:rnd.randrange(len(line) + 1)]
        elif how == 1:
            for _ in range(rnd.randrange(1, 6)):
                line[rnd.randrange(len(line))] = rnd.randrange(256)
        elif how == 2:
            line = line + rnd.choice(sources)
        else:
            line = bytes(rnd.randrange(256) for _ in range(rnd.randrange(300)))
        for form in (bytes(line), normalize_chunk(bytes(line) + b"\n")[:-1]):
            rec = parse_line(form)
            assert rec is None or type(rec) in (CollLine, InitLine, KernelLine, TuningLine, Malformed)
            results.add(type(rec).__name__)
    assert {"CollLine", "Malformed", "NoneType"} <= results


# --- census on the fixtures -----------------------------------------------------------------------

def test_census_counts_calls_bytes_and_shares():
    c = run_census([str(NCCL / "nccl-2.4-tf-1proc-2gpu.log")])
    assert c.totals["lines"] == 35 and c.totals["collective_lines"] == 24 and c.totals["malformed_lines"] == 0
    assert c.totals["init_lines"] == 2
    big = group(c, count=151552)
    assert (big.rank_calls, big.calls, big.bytes_per_call, big.total_bytes) == (8, 4, 606208, 2424832)
    small = group(c, count=1)
    assert (small.datatype, small.redop, small.bytes_per_call, small.total_bytes) == ("int64", "max", 8, 32)
    total = 2424832 + 4096 + 32
    assert c.totals["total_bytes"] == total
    assert big.share == pytest.approx(2424832 / total)
    assert [g.count for g in c.groups] == [151552, 256, 1]      # largest share first
    assert {(m["rank"], m["comm"]) for m in c.communicators} == {(0, "0x7f3a2c0017e0"), (1, "0x7f3a240017e0")}
    assert c.sets == [{"key": "nranks=2 #0", "source": "inferred", "nranks": 2, "members": 2,
                       "ranks_seen": [0, 1], "status": "consistent", "note": ""}]
    assert c.desync == []


def test_census_bytes_per_call_follow_nccl_tests():
    c = run_census([str(NCCL / "nccl-2.23-init-split.log")])
    ag = group(c, op="AllGather")
    assert (ag.inplace, ag.nranks, ag.bytes_per_call, ag.calls, ag.rank_calls) == (True, 2, 1048576 * 2 * 2, 2, 8)
    rs = group(c, op="ReduceScatter")
    assert (rs.inplace, rs.bytes_per_call, rs.redop) == (False, 4194304, "sum")
    assert group(c, op="Broadcast").bytes_per_call == 4000
    assert [s["key"] for s in c.sets] == ["commId 0x3c2b9a7e51d04f18", "commId 0x8d1e4f2a6b3c7d90",
                                          "commId 0x1f7a3e9c5d2b8e46"]
    assert all(s["status"] == "consistent" for s in c.sets)
    assert {h["host"]: h["processes"] for h in c.hosts} == {"dgx-01": 2, "dgx-02": 2}
    world = [m for m in c.communicators if m["comm_id"] == "0x3c2b9a7e51d04f18"]
    assert sorted(m["rank"] for m in world) == [0, 1, 2, 3] and {m["init"] for m in world} == {"ncclCommInitRank"}
    tp = [m for m in c.communicators if m["init"] == "ncclCommSplit"]
    assert len(tp) == 4 and all(m["parent"] for m in tp)


def test_census_p2p_and_single_rank_communicators():
    c = run_census([str(NCCL / "nccl-2.12-sendrecv.log")])
    for op in ("Send", "Recv"):
        g = group(c, op=op)
        assert (g.rank_calls, g.calls, g.bytes_per_call, g.roots, g.collbench_op) == (6, 3, 4194304, [0, 1], "")
    one = group(c, nranks=1)
    assert (one.rank_calls, one.calls, one.ranks) == (6, 3, 2)
    sets = {s["key"]: s for s in c.sets}
    assert sets["nranks=2 #0"]["status"] == "consistent"
    assert sets["nranks=1 #0"]["status"] == "unchecked"
    assert c.desync == []


def test_census_algorithms_from_kernel_trace_and_tuning():
    c = run_census([str(NCCL / "rccl-rocm6-kerneltrace.log")])
    half = group(c, datatype="float16")
    assert [(a.algorithm, a.protocol, a.count, a.source) for a in half.algorithms] == \
        [("RING", "LL128", 4, "kernel-trace")]
    dbl = group(c, datatype="float64")
    assert [(a.algorithm, a.protocol, a.count) for a in dbl.algorithms] == [("TREE", "LL", 4)]
    assert c.totals["kernel_trace_lines"] == 16 and c.totals["kernel_trace_attributed"] == 8
    assert sorted(m["rank"] for m in c.communicators) == [0, 1, 2, 3]

    t = run_census([str(NCCL / "nccl-2.28-timestamps-tuning.log")])
    small = group(t, op="AllReduce", count=1)
    assert [(a.algorithm, a.protocol, a.count, a.source) for a in small.algorithms] == [("TREE", "LL", 2, "tuning")]
    assert group(t, op="AllReduce", count=4096).algorithms[0].protocol == "LL128"
    assert group(t, op="AlltoAll").algorithms == []

    r = run_census([str(NCCL / "rccl-rocm-systems-acc.log")])
    ar = group(r, op="AllReduce")
    assert (ar.rank_calls, ar.calls) == (4, 2)
    assert [(a.algorithm, a.protocol, a.count) for a in ar.algorithms] == [("RING", "SIMPLE", 2)]
    a2a = group(r, op="AlltoAll")
    assert a2a.op_names == ["AlltoAll", "AlltoAllPivot"] and a2a.bytes_per_call == 131072 * 2 * 2


def test_census_msccl_and_partial_communicator():
    c = run_census([str(NCCL / "rccl-msccl.log")])
    ar = group(c, op="AllReduce")
    assert ar.op_names == ["AllReduce", "mscclFuncAllReduce"] and (ar.rank_calls, ar.calls) == (8, 4)
    assert sorted(m["rank"] for m in c.communicators) == [3, 4]
    assert c.sets[0]["members"] == 2 and c.sets[0]["nranks"] == 8 and c.sets[0]["status"] == "consistent"


def test_census_garbage_counts_and_samples():
    c = run_census([str(NCCL / "garbage.log")])
    assert c.totals["collective_lines"] == 5 and c.totals["malformed_lines"] == 7
    assert c.totals["nccl_warn_lines"] == 1
    assert [m["line"] for m in c.malformed] == [3, 4, 5, 6, 14, 15, 16]
    assert all(m["source"].endswith("garbage.log") for m in c.malformed)
    assert "\\xff" not in c.malformed[0]["text"]
    assert any("no host:pid:tid prefix" in w for w in c.warnings)
    unattributed = [s for s in c.sets if s["source"] == "unattributed"]
    assert unattributed and unattributed[0]["status"] == "unchecked"
    assert c.desync == []


def test_block_size_does_not_change_the_census(tmp_path):
    paths = [str(NCCL / n) for n in ("nccl-2.23-init-split.log", "rccl-rocm6-kerneltrace.log",
                                     "p2p-alltoall-group.log", "garbage.log", "rccl-429-mismatch.log")]
    whole = run_census(paths).document()
    tiny = run_census(paths, block=97).document()
    for key in ("groups", "communicators", "communicator_sets", "desync", "collective_lines", "malformed_lines",
                "kernel_trace_attributed"):
        assert whole[key] == tiny[key], key


def test_iter_calls_streams_in_log_order():
    calls = list(iter_calls([str(NCCL / "nccl-2.4-tf-1proc-2gpu.log")]))
    assert len(calls) == 24
    assert [c.line for c in calls[:2]] == [9, 10]
    assert [c.call.opcount for c in calls[::2]] == list(range(12))
    assert all(c.source.endswith("nccl-2.4-tf-1proc-2gpu.log") for c in calls)
    rank1 = list(iter_calls([str(NCCL / "nccl-2.4-tf-1proc-2gpu.log")], comm="0x7f3a240017e0"))
    assert [c.call.opcount for c in rank1] == list(range(12)) and {c.call.dev for c in rank1} == {1}


# --- input handling -----------------------------------------------------------------------------

def test_gzip_directory_and_overlong_lines(tmp_path):
    d = tmp_path / "job"
    (d / "node0").mkdir(parents=True)
    (d / "node0" / "rank0.log.gz").write_bytes(gzip.compress((NCCL / "nccl-2.23-init-split.log").read_bytes()))
    (d / "node0" / "core.bin").write_bytes(b"\x7fELF\0\0\0" * 100)
    long_line = b"x" * (200 << 10)
    (d / "app.log").write_bytes(b"start\n" + long_line + b"\n" + (NCCL / "ray-wrapper.log").read_bytes()
                                + long_line)
    c = run_census([str(d)])
    assert c.totals["collective_lines"] == 28 + 8
    assert c.totals["overlong_lines"] == 2
    inputs = {os.path.basename(i["path"]): i for i in c.inputs}
    assert inputs["rank0.log.gz"]["compressed"] and inputs["core.bin"]["skipped"].startswith("binary")
    assert any("core.bin: skipped: binary" in w for w in c.warnings)
    assert inputs["app.log"]["lines"] == 2 + 16 + 1


def test_bad_inputs_are_user_errors(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    with pytest.raises(LogInputError, match="empty.log: empty log"):
        run_census([str(empty)])
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 40)
    with pytest.raises(LogInputError, match="weights.bin: binary file"):
        run_census([str(binary)])
    init_only = tmp_path / "init.log"
    init_only.write_bytes(b"".join(l + b"\n" for l in fixture_lines("nccl-2.23-init-split.log")
                                   if b"Init COMPLETE" in l))
    with pytest.raises(NoCollectivesError, match="init.log: no NCCL collective lines in 8 lines; found 8 NCCL "
                                                 "INFO lines.*NCCL_DEBUG_SUBSYS"):
        run_census([str(init_only)])
    app = tmp_path / "app.txt"
    app.write_text("epoch 1\nepoch 2\n")
    with pytest.raises(NoCollectivesError, match="no NCCL lines at all"):
        run_census([str(app)])
    with pytest.raises(LogInputError, match="nope.log: no such file"):
        run_census([str(tmp_path / "nope.log")])
    bad_gz = tmp_path / "cut.log.gz"
    bad_gz.write_bytes(gzip.compress((NCCL / "nccl-2.4-tf-1proc-2gpu.log").read_bytes())[:-30])
    c = run_census([str(bad_gz)])         # a cut .gz keeps the lines before the cut and says so
    assert c.totals["collective_lines"] > 0 and any("cut.log.gz" in w and "gzip" in w for w in c.warnings)


# --- the real command -----------------------------------------------------------------------------

def cli(*args, stdin=None, env=None):
    exe = [str(COLLBENCH)] if COLLBENCH.exists() else [sys.executable, "-m", "collbench"]
    return subprocess.run(exe + ["nccl", "census", *args], input=stdin, capture_output=True,
                          timeout=CLI_TIMEOUT, cwd=REPO, env=None if env is None else {**os.environ, **env})


def test_cli_table_csv_json():
    path = str(NCCL / "nccl-2.23-init-split.log")
    table = cli(path)
    assert table.returncode == 0, table.stderr
    out = table.stdout.decode()
    assert "AllGather      1048576  bfloat16" in out and "commId 0x3c2b9a7e51d04f18" in out
    assert "Desync: none found (3 of 3 communicators" in out

    rows = list(csv.DictReader(io.StringIO(cli(path, "--format", "csv").stdout.decode())))
    assert len(rows) == 4
    ag = next(r for r in rows if r["op"] == "AllGather")
    assert (ag["count"], ag["inplace"], ag["bytes_per_call"], ag["calls"], ag["rank_calls"]) == \
           ("1048576", "1", "4194304", "2", "8")

    doc = json.loads(cli(path, "--format", "json").stdout)
    assert {"groups", "communicators", "desync", "lines", "collective_lines", "malformed_lines"} <= set(doc)
    assert (doc["lines"], doc["collective_lines"], doc["malformed_lines"], doc["desync"]) == (36, 28, 0, [])
    g = doc["groups"][0]
    assert set(g) >= {"op", "count", "datatype", "redop", "nranks", "inplace", "rank_calls", "calls",
                      "bytes_per_call", "total_bytes"}


def test_cli_desync_exit_codes_and_output_file(tmp_path):
    path = str(NCCL / "rccl-429-mismatch.log")
    plain = cli(path)
    assert plain.returncode == 0
    assert "collective #4 differs: ranks 0-1,3 issued AllReduce count=2000 float32 sum; rank 2 issued " \
           "AllGather count=500 float32" in plain.stdout.decode()
    failing = cli(path, "--fail-on-desync", "--format", "csv")
    assert failing.returncode == 1 and b"desync: communicator" in failing.stderr
    out = tmp_path / "census.json"
    done = cli(path, "--format", "json", "-o", str(out), "--fail-on-desync")
    assert done.returncode == 1 and done.stdout == b""
    finding = json.loads(out.read_text())["desync"][0]
    assert (finding["kind"], finding["position"], finding["sides"][1]["ranks"]) == ("mismatch", 4, [2])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".census.json")]   # no temp file left


def test_cli_stdin_and_verbose_malformed():
    data = gzip.compress((NCCL / "garbage.log").read_bytes() + (NCCL / "ray-wrapper.log").read_bytes())
    r = cli("-", "-v", stdin=data)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "<stdin>:3: truncated" in out and "Malformed lines (first 7)" in out
    assert "r24-worker-l4-srrss:22754" in out       # -v lists every rank handle


def test_cli_bad_input_exit_2_without_traceback(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    binary = tmp_path / "blob.log"
    binary.write_bytes(os.urandom(4096) + b"\0" * 16)
    subsys = tmp_path / "coll-missing.log"
    subsys.write_text("h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\nh:1:1 [0] NCCL INFO Channel 00/02 : 0 1\n")
    for path, want in ((empty, "empty log"), (binary, "binary file"), (subsys, "NCCL_DEBUG_SUBSYS"),
                       (tmp_path / "missing.log", "no such file")):
        r = cli(str(path))
        err = r.stderr.decode()
        assert r.returncode == 2, (path, err)
        assert str(path) in err and want in err and "Traceback" not in err
    r = cli(str(NCCL / "garbage.log"), "--format", "yaml")
    assert r.returncode == 2 and b"invalid choice" in r.stderr


def test_cli_never_tracebacks_on_random_bytes(tmp_path):
    rnd = random.Random(3)
    src = (NCCL / "rccl-rocm6-kerneltrace.log").read_bytes() + (NCCL / "garbage.log").read_bytes()
    data = bytearray(src * 3)
    for _ in range(400):
        data[rnd.randrange(len(data))] = rnd.choice(b" \n:[]0x-=~\xff")
    path = tmp_path / "mangled.log"
    path.write_bytes(bytes(data))
    r = cli(str(path), "--format", "json")
    assert r.returncode in (0, 2) and b"Traceback" not in r.stderr
    if r.returncode == 0:
        doc = json.loads(r.stdout)
        assert doc["collective_lines"] + doc["malformed_lines"] > 0



def test_kernel_trace_attribution_over_many_calls(tmp_path):
    """Every call gets its kernel's algorithm, also when a line of the input happens to contain the
    fast path's marker text and when pointers never repeat."""
    rnd = random.Random(5)
    lines = []
    for opc in range(1, 301):
        algo, proto, dt, ctype = ("RING", "LL128", 6, "half") if opc % 3 else ("TREE", "LL", 8, "double")
        for r in range(4):
            b = hex(rnd.randrange(1 << 44))
            lines.append(f"mi300-7:7310:7310 [3] NCCL INFO AllReduce: opCount {opc:x} sendbuff {b} recvbuff {b} "
                         f"count {1024 * opc} datatype {dt} op 0 root 0 comm {hex(0x4f1e000 + r * 0x16a00)} "
                         f"[nranks=4] stream 0x4b3d000 task 0 globalrank {r}")
        if opc == 150:
            lines.append("mi300-7:7310:7310 [3] NCCL INFO note: opCount = 7 in a message of the application")
        for r in (3, 1, 0, 2):
            head = f"mi300-7:7310:{7400 + r} [0] NCCL INFO ## [{512 + opc / 1000:012.6f}] [{r:02d}:00] {opc:06x}"
            lines.append(f"{head} KL HWID 4230{r:04x} ncclDevFunc_AllReduce_{algo}_{proto}_Sum_{ctype} nw 4 bi 0 "
                         f"nc 0 busId {0xc000 + r * 0x16000:x} nRanks 4")
            lines.append(f"{head} KE busId {0xc000 + r * 0x16000:x} nRanks 4")
    path = tmp_path / "trace.log"
    path.write_text("\n".join(lines) + "\n")
    for block in (1 << 20, 4096):
        c = run_census([str(path)], block=block)
        assert c.totals["kernel_trace_lines"] == 2400 and c.totals["kernel_trace_attributed"] == 1200, block
        for g in c.groups:
            want = ("TREE", "LL") if g.datatype == "float64" else ("RING", "LL128")
            assert [(a.algorithm, a.protocol, a.count) for a in g.algorithms] == [want + (4,)], (block, g)


def test_huge_numbers_are_malformed_not_errors():
    """int() refuses strings of more than 4300 digits; a 64 KiB line can hold one in any field."""
    base = (b"h:1:1 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x1 count 8 datatype 7 op 0 root 0 "
            b"comm 0x5 [nranks=2] stream 0x6 task 0 globalrank 1")
    assert type(parse_line(base)) is CollLine
    huge = b"9" * 5000
    for field in (b"count 8", b"datatype 7", b"op 0", b"root 0", b"[nranks=2]", b"opCount 1", b"globalrank 1",
                  b"h:1:1", b"[0] NCCL"):
        mangled = base.replace(field, field.replace(b"8", huge).replace(b"7", huge).replace(b"0", huge)
                               .replace(b"2", huge).replace(b"1", huge), 1)
        assert mangled != base
        for form in (mangled, normalize_chunk(mangled + b"\n")[:-1]):
            rec = parse_line(form)
            assert rec is None or type(rec) in (CollLine, Malformed), field
    assert type(parse_line(b"h:1:1 [0] NCCL INFO comm 0x5 rank " + huge + b" nranks 2 - Init COMPLETE")) is Malformed
    tuning = parse_line(b"h:1:1 [0] NCCL INFO AllReduce: " + huge + b" Bytes -> Algo 1 proto 2 time 1.0")
    assert type(tuning) is Malformed
    kernel = parse_line(b"h:1:1 [0] NCCL INFO ## [1.0] [" + huge + b":00] 000001 KE busId c000 nRanks 4")
    assert type(kernel) is Malformed


def test_a_file_given_twice_is_read_once(tmp_path):
    path = str(NCCL / "rccl-429-mismatch.log")
    c = run_census([path, str(NCCL), path])
    assert sum(1 for i in c.inputs if i["path"].endswith("rccl-429-mismatch.log")) == 1
    assert any("given more than once" in w for w in c.warnings)
    assert [f["position"] for f in c.desync] == [4]     # not a doubled sequence


def test_timestamped_lines_hit_the_cache_and_count_the_same(tmp_path, monkeypatch):
    from collbench.nccl import scanner as census_mod     # the streaming pass calls the parser
    lines = (NCCL / "nccl-2.23-init-split.log").read_bytes().split(b"\n")[:-1]
    init = [l for l in lines if b"Init COMPLETE" in l]
    plain = b"".join(l + b"\n" for l in init + [l for l in lines if l not in init] * 5)
    stamped = b"".join(b"[2025-06-01 08:15:%02d.%03d] " % (i // 1000 % 60, i % 1000) + line + b"\n"
                       for i, line in enumerate(plain.split(b"\n")[:-1]))
    (tmp_path / "plain.log").write_bytes(plain)
    (tmp_path / "stamped.log").write_bytes(stamped)
    parsed = []
    real = census_mod.parse_coll
    monkeypatch.setattr(census_mod, "parse_coll", lambda line: parsed.append(line) or real(line))
    a = run_census([str(tmp_path / "plain.log")]).document()
    n_plain = len(parsed)
    parsed.clear()
    b = run_census([str(tmp_path / "stamped.log")]).document()
    for key in ("groups", "communicators", "communicator_sets", "desync", "collective_lines"):
        assert a[key] == b[key], key
    assert a["collective_lines"] == 5 * 28 and a["desync"] == []
    assert len(parsed) == n_plain < 28              # distinct calls are parsed, stamped or not


def test_gunzip_members_padding_and_cut():
    from collbench.nccl.log_input import Gunzip

    def read_all(data, n):
        g = Gunzip(io.BytesIO(data))
        out = []
        while True:
            x = g.read(n)
            if not x:
                return b"".join(out), g.truncated
            out.append(x)
    a = b"".join(b"line %d of member one\n" % i for i in range(50000))
    b = b"".join(b"line %d of member two\n" % i for i in range(70000))
    data = gzip.compress(a) + gzip.compress(b)
    for n in (7, 4096, 1 << 20, len(gzip.compress(a))):     # a member ending exactly at a read, too
        assert read_all(data, n) == (a + b, False), n
    assert read_all(data + b"\0\0\0\0 trailing bytes", 4096) == (a + b, False)
    got, truncated = read_all(gzip.compress(a)[:-100], 4096)
    assert truncated and a.startswith(got) and len(got) > len(a) - 4096


def test_cli_reads_a_named_pipe(tmp_path):
    """`collbench nccl census <(zcat log.gz)` hands over a pipe: read once, spooled, gunzipped."""
    import threading
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    data = gzip.compress((NCCL / "rccl-429-mismatch.log").read_bytes())

    def feed():
        with open(fifo, "wb") as f:
            f.write(data)
    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    spool_dir = tmp_path / "tmp"
    spool_dir.mkdir()
    r = cli(str(fifo), "--format", "json", env={"TMPDIR": str(spool_dir)})
    writer.join(timeout=30)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["inputs"][0]["compressed"] and doc["collective_lines"] == 16
    assert [f["position"] for f in doc["desync"]] == [4]
    assert list(spool_dir.iterdir()) == []      # the spool is gone
