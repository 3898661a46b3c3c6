"""`collbench nccl replay`: an NCCL log's collectives timed with the built-in engine through real
mpirun (2 and 4 ranks, ob1 `shm` and UCX `ucx-tcp`), in log order (the RCCL replayer's CSV) and
grouped (the estimate of the log's collective time); the op/size/datatype mapping against
hand-computed bytes; the nranks warning, the --max-bytes cap; bad input exits 2 with nothing written.

The logs are generated here in NCCL 2.23's format (NCCL's COLL INFO printf,
the `ncclCommInitRank ... commId` INIT line), one process per rank.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from collbench.nccl import replay_plan
from collbench.nccl.replay_plan import EngineCall, NotReplayed, plan_call
from collbench.results.record_parser import ParseError, parse_record
from conftest import REPO, wait_for
from engine_helpers import engine_bin, is_gone, pids_of_exe  # noqa: F401

DT = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6, "float32": 7,
      "float64": 8, "bfloat16": 9, "float8e4m3": 10, "float8e5m2": 11}
SIZE = {"int8": 1, "int32": 4, "int64": 8, "float16": 2, "float32": 4, "float64": 8, "bfloat16": 2}
REDOP = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
RCCL_DT = {"int8": "Int8", "int32": "Int32", "int64": "Int64", "float16": "Float16", "float32": "Float32",
           "float64": "Float64", "bfloat16": "Bfloat16"}
RCCL_OP = {"sum": "Sum", "prod": "Product", "max": "Max", "min": "Min", "avg": "Average"}
CSV_HEADER = ("callNumber, functionName, inPlace, count(numElements), datatype, op, root, time(msec), "
              "groupCallBusBandwidth(GB/s)")


def calls_for(n):
    """One rank's sequence: (op, count, datatype, redop, root or peer offset, in place). Send/Recv
    go to the next / come from the previous rank."""
    return [
        ("AllReduce", 4096, "float16", "sum", 0, True),
        ("AllGather", 1000, "bfloat16", "sum", 0, True),
        ("Send", 256, "float32", "sum", "next", False),
        ("Recv", 256, "float32", "sum", "prev", False),
        ("ReduceScatter", 1500, "float32", "sum", 0, False),
        ("Broadcast", 777, "int8", "sum", n - 1, True),
        ("Reduce", 333, "int64", "max", n - 1, False),
        ("AlltoAll", 64, "int32", "sum", 0, False),
        ("AllReduce", 10, "float64", "avg", 0, False),
    ]


def make_log(path, n, sequence, repeat=1, comm_id="0x5eed00c0ffee0001"):
    """Per-rank lines of an n-rank communicator (INIT + COLL, NCCL 2.23 format), rank by rank."""
    lines = []
    for r in range(n):
        host, pid, comm = f"gpu-{r // 8}", 4000 + r, f"0x55{r:02x}00000000"
        pre = f"{host}:{pid}:{pid} [{r % 8}] NCCL INFO "
        lines.append(f"{pre}ncclCommInitRank comm {comm} rank {r} nranks {n} cudaDev {r % 8} nvmlDev {r % 8} "
                     f"busId 1b000 commId {comm_id} - Init COMPLETE")
        k = 0
        for _ in range(repeat):
            for op, count, dt, redop, root, inplace in sequence:
                if root == "next":
                    root = (r + 1) % n
                elif root == "prev":
                    root = (r - 1) % n
                send = 0x7f0000000000 + (r << 32) + k * 0x100000
                recv = send if inplace else send + 0x80000
                if op in ("Send", "Recv"):
                    send_text, recv_text = "(nil)", hex(recv)
                else:
                    send_text, recv_text = hex(send), hex(recv)
                lines.append(f"{pre}{op}: opCount {k:x} sendbuff {send_text} recvbuff {recv_text} count {count} "
                             f"datatype {DT[dt]} op {REDOP[redop]} root {root} comm {comm} [nranks={n}] "
                             f"stream 0x7000")
                k += 1
    path.write_text("\n".join(lines) + "\n")
    return path


def config(tmp_path, engine, ranks, transport):
    p = tmp_path / f"cfg-{ranks}-{transport}.yaml"
    p.write_text(f"ranks: {ranks}\ntransport: {transport}\nengine_path: {engine}\nstep_timeout: 300\n")
    return str(p)


def replay(*args, stdin=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "collbench", "nccl", "replay", *args], capture_output=True,
                          text=True, cwd=REPO, input=stdin, timeout=timeout)


def records_of(path):
    out = []
    for line in path.read_text().splitlines():
        rec = parse_record(line)
        assert not isinstance(rec, ParseError), (rec, line)     # every reader's validator accepts them
        out.append(rec)
    return out


# --- bytes, by hand ------------------------------------------------------------------------------

def hand_s(op, count, dt, n):
    """nccl-tests' S (src/*.cu *GetBw): count*ts for AllReduce/Broadcast/Reduce, count*ts*n for
    AllGather/ReduceScatter/AlltoAll."""
    ts = SIZE[dt]
    return count * ts * (n if op in ("AllGather", "ReduceScatter", "AlltoAll") else 1)


def hand_factor(op, n):
    return {"AllReduce": 2 * (n - 1) / n, "Broadcast": 1.0, "Reduce": 1.0}.get(op, (n - 1) / n)


def hand_engine_size(op, count, dt, n):
    """OSU's bytes per rank: each rank's part (allgather), the whole send buffer (reduce_scatter),
    the bytes to each peer (alltoall)."""
    return count * SIZE[dt] * (n if op == "ReduceScatter" else 1)


ENGINE_OP = {"AllReduce": "allreduce", "AllGather": "allgather", "ReduceScatter": "reduce_scatter",
             "Broadcast": "bcast", "Reduce": "reduce", "AlltoAll": "alltoall"}
ENGINE_DT = {"float16": "short", "bfloat16": "short", "float32": "float", "int8": "char", "int64": "long",
             "int32": "int", "float64": "double"}


@pytest.mark.parametrize("n", [2, 4, 8])
def test_mapping_bytes_by_hand(n):
    for op, count, dt, redop, root, inplace in calls_for(n):
        call = plan_call(op, count, dt, n, inplace, root if isinstance(root, int) else 0, 1 << 30)
        if op in ("Send", "Recv"):
            assert isinstance(call, NotReplayed) and "point-to-point" in call.reason
            continue
        assert isinstance(call, EngineCall)
        assert call.op == ENGINE_OP[op] and call.datatype == ENGINE_DT[dt]
        assert call.size_bytes == hand_engine_size(op, count, dt, n)
        assert call.bytes_per_call == call.measured_bytes == hand_s(op, count, dt, n)
        assert call.scale == 1.0 and not call.capped and call.inplace == inplace
        assert call.root == (root if op in ("Broadcast", "Reduce") else 0)
        t_us = 123.0
        algbw, busbw = call.bandwidth(t_us)
        assert algbw == pytest.approx(hand_s(op, count, dt, n) / 123e-6)
        assert busbw == pytest.approx(hand_s(op, count, dt, n) / 123e-6 * hand_factor(op, n))
    # the per-element examples of the brief: AllGather's part, ReduceScatter's whole send buffer, per-peer AlltoAll
    assert plan_call("AllGather", 1000, "float32", 4, False, 0, 1 << 30).size_bytes == 4000
    assert plan_call("ReduceScatter", 1000, "float16", 4, False, 0, 1 << 30).size_bytes == 8000
    assert plan_call("AlltoAll", 10, "int64", 4, False, 0, 1 << 30).size_bytes == 80
    assert plan_call("AlltoAll", 10, "int64", 4, False, 0, 1 << 30).bytes_per_call == 320


def test_mapping_datatypes_stand_ins_and_not_replayed():
    for dt, (engine, stand_in) in {"int8": ("char", False), "uint8": ("char", False), "float8e4m3": ("char", True),
                                   "float8e5m2": ("char", True), "float16": ("short", True),
                                   "bfloat16": ("short", True), "int32": ("int", False), "uint32": ("int", False),
                                   "float32": ("float", False), "int64": ("long", False),
                                   "uint64": ("long", False), "float64": ("double", False)}.items():
        call = plan_call("AllReduce", 3, dt, 2, False, 0, 1 << 20)
        assert call.datatype == engine and bool(call.stand_in) == stand_in, dt
    for op, word in (("Gather", "Gather"), ("Scatter", "Scatter"), ("Send", "point-to-point"),
                     ("Recv", "point-to-point"), ("PutSignal", "one-sided")):
        got = plan_call(op, 8, "float32", 4, False, 0, 1 << 20)
        assert isinstance(got, NotReplayed) and word in got.reason, op
    assert plan_call("AllReduce", 0, "float32", 4, False, 0, 1 << 20) == NotReplayed(replay_plan.ZERO_COUNT_REASON)
    # a root beyond the replayed ranks wraps, and says so
    b = plan_call("Broadcast", 8, "float32", 4, False, 6, 1 << 20)
    assert b.root == 2 and "root 6" in b.root_note


def test_max_bytes_cap_by_hand():
    # the seed's 268M-element fp16 AllReduce: 512 MB per rank, capped at 64 MB: 1/8 of the elements
    big = plan_call("AllReduce", 268435456, "float16", 8, True, 0, replay_plan.DEFAULT_MAX_BYTES)
    assert big.bytes_per_call == 512 << 20 and big.measured_count == 33554432
    assert big.size_bytes == 64 << 20 and big.scale == 8.0 and big.capped
    # the cap is on nccl-tests' S: AllGather's gathered buffer, ReduceScatter's send buffer, AlltoAll's
    ag = plan_call("AllGather", 1 << 20, "float32", 4, False, 0, 1 << 20)     # S = 16 MB -> 1 MB
    assert ag.measured_bytes == 1 << 20 and ag.size_bytes == (1 << 20) // 4 and ag.scale == 16.0
    rs = plan_call("ReduceScatter", 1 << 20, "float32", 4, False, 0, 1 << 20)
    assert rs.size_bytes == rs.measured_bytes == 1 << 20 and rs.measured_count == 65536 and rs.scale == 16.0
    a2a = plan_call("AlltoAll", 3000, "int8", 3, False, 0, 1000)             # S = 9000 -> 999 (333 per peer)
    assert a2a.measured_count == 333 and a2a.measured_bytes == 999 and a2a.scale == pytest.approx(9000 / 999)


# --- log order with real mpirun ------------------------------------------------------------------

def check_csv_against_log(text, n):
    lines = text.splitlines()
    assert lines[0] == CSV_HEADER
    rows = [line.split(", ") for line in lines[1:]]
    seq = calls_for(n)
    expected = [(i + 1, c) for i, c in enumerate(seq) if c[0] not in ("Send", "Recv")]
    assert [int(r[0]) for r in rows] == [pos for pos, _ in expected]      # order; Send/Recv (3, 4) left out
    for row, (pos, (op, count, dt, redop, root, inplace)) in zip(rows, expected):
        assert len(row) == 9
        assert row[1] == op and row[2] == str(int(inplace)) and row[3] == str(count)
        assert row[4] == RCCL_DT[dt] and row[5] == RCCL_OP[redop] and row[6] == str(root)
        t_ms, busbw = float(row[7]), float(row[8])
        assert t_ms > 0
        # busBW from the time column, the log's count and nranks, nccl-tests' factor
        want = hand_s(op, count, dt, n) / (t_ms / 1e3) * hand_factor(op, n) / 1e9
        assert busbw == pytest.approx(want, rel=2e-4), (row, want)
    return rows


@pytest.mark.mpi
@pytest.mark.parametrize("n,transport", [(2, "shm"), (4, "ucx-tcp")])
def test_log_order_csv_rows_match_the_log(tmp_path, engine_bin, n, transport):  # noqa: F811
    log = make_log(tmp_path / "nccl.log", n, calls_for(n))
    out, results = tmp_path / "replay.csv", tmp_path / "r.jsonl"
    args = ["--order", "log", "--config", config(tmp_path, engine_bin, n, transport), "--format", "csv",
            "-o", str(out), "--results", str(results), "--iterations", "2", "--warmup", "1", "-q"]
    if n == 2:      # the log on stdin: spooled, read twice (census, then the sequence)
        p = replay("-", *args, stdin=log.read_text())
    else:
        p = replay(str(log), *args)
    assert p.returncode == 0, p.stderr
    rows = check_csv_against_log(out.read_text(), n)
    assert "warning: bfloat16/float16: MPI has no such datatype" in p.stderr     # the stand-in is said

    recs = records_of(results)
    results_ = [r for r in recs if r["type"] == "result"]
    event = [r for r in recs if r["type"] == "event"]
    assert len(event) == 1 and event[0]["event"] == "nccl_replay" and event[0]["order"] == "log"
    assert all(r["run_id"] == event[0]["run_id"] and r["run_id"].startswith("nccl-replay-") for r in recs)
    # one record per configuration of the sequence (each called once here): op, size, datatype as measured
    got = {(r["op"], r["size_bytes"], r["datatype"], r.get("inplace", False), r.get("root", 0)) for r in results_}
    want = {(ENGINE_OP[op], hand_engine_size(op, count, dt, n), ENGINE_DT[dt], inplace,
             root if op in ("Broadcast", "Reduce") else 0)
            for op, count, dt, redop, root, inplace in calls_for(n) if op not in ("Send", "Recv")}
    assert got == want
    assert all(r["ranks"] == n and r["iterations"] == 2 and r["warmup"] == 1 for r in results_)
    # the records' latency is the CSV's time (one call per configuration, not capped)
    by_size = {(r["op"], r["size_bytes"]): r["latency_avg_us"] for r in results_}
    for row, (op, count, dt, *_rest) in zip(rows, [c for c in calls_for(n) if c[0] not in ("Send", "Recv")]):
        assert float(row[7]) * 1000 == pytest.approx(by_size[(ENGINE_OP[op], hand_engine_size(op, count, dt, n))],
                                                     rel=1e-4)
    stand = [c for c in event[0]["configurations"] if c["nccl_datatype"] in ("float16", "bfloat16")]
    assert stand and all(c["datatype"] == "short" and "2-byte" in c["stand_in"] for c in stand)
    assert {c["nccl_op"] for c in event[0]["configurations"] if "not_replayed" in c} == {"Send", "Recv"}


# --- grouped with real mpirun --------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("n,transport", [(2, "ucx-tcp"), (4, "shm")])
def test_grouped_shares_totals_and_records(tmp_path, engine_bin, n, transport):  # noqa: F811
    seq = calls_for(n)
    log = make_log(tmp_path / "nccl.log", n, seq, repeat=3)
    results = tmp_path / "r.jsonl"
    p = replay(str(log), "--config", config(tmp_path, engine_bin, n, transport), "--format", "json",
               "--results", str(results), "--iterations", "4", "--warmup", "1", "-q")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["order"] == "grouped" and doc["iterations"] == 4 and doc["warmup"] == 1
    confs = doc["configurations"]
    done = [c for c in confs if c["status"] == "replayed"]
    assert len(done) == 7
    assert {(c["op"], c["reason"].split(":")[0]) for c in confs if c["status"] == "not replayed"} == \
        {("Send", "point-to-point"), ("Recv", "point-to-point")}
    assert sum(c["share"] for c in done) == pytest.approx(1.0)
    assert sum(c["total_s"] for c in done) == pytest.approx(doc["total_time_s"])
    for c in done:
        assert c["calls"] == 3 and c["timed"] == 4 and c["replay_nranks"] == n
        assert c["total_s"] == pytest.approx(c["calls"] * c["mean_us"] / 1e6)
        assert c["min_us"] <= c["median_us"] <= c["max_us"] and c["min_us"] <= c["mean_us"] <= c["max_us"]
        assert c["bytes_per_call"] == hand_s(c["op"], c["count"], c["datatype"], n)
        assert c["size_bytes"] == hand_engine_size(c["op"], c["count"], c["datatype"], n)
        algbw = c["bytes_per_call"] / (c["mean_us"] * 1e-6)
        assert c["algbw_bytes_per_s"] == pytest.approx(algbw)
        assert c["busbw_bytes_per_s"] == pytest.approx(algbw * hand_factor(c["op"], n))
    table = replay(str(log), "--config", config(tmp_path, engine_bin, n, transport), "--iterations", "2",
                   "--warmup", "0", "-q")
    assert table.returncode == 0, table.stderr
    assert "Estimated time of the log's collectives on this fabric" in table.stdout
    assert "bfloat16/float16: MPI has no such datatype" in table.stdout

    recs = records_of(results)
    res = [r for r in recs if r["type"] == "result"]
    assert len(res) == 7 and all(r["iterations"] == 4 and r["ranks"] == n for r in res)
    for r in res:
        c = next(c for c in done if c["collbench_op"] == r["op"] and c["size_bytes"] == r["size_bytes"])
        # the record keeps 4 decimals of a microsecond: a sub-microsecond mean differs by up to 5e-5
        assert r["latency_avg_us"] == pytest.approx(c["mean_us"], rel=1e-4, abs=5e-5)
        assert r["datatype"] == c["engine_datatype"]
        assert r["latency_p50_us"] <= r["latency_p90_us"] <= r["latency_pmax_us"]
    ev = [r for r in recs if r["type"] == "event"]
    assert len(ev) == 1 and ev[0]["total_time_s"] == pytest.approx(doc["total_time_s"], rel=1e-6, abs=1e-9)


@pytest.mark.mpi
def test_nranks_mismatch_needs_np_then_warns_in_output_and_records(tmp_path, engine_bin):  # noqa: F811
    seq = [("AllReduce", 2048, "float32", "sum", 0, True)]
    log = make_log(tmp_path / "nccl8.log", 4, seq)
    cfg = config(tmp_path, engine_bin, 2, "shm")
    results, out = tmp_path / "r.jsonl", tmp_path / "out.txt"
    p = replay(str(log), "--config", cfg, "--results", str(results), "-o", str(out), "-q")
    assert p.returncode == 2
    assert "4-rank communicators" in p.stderr and "provides 2 ranks" in p.stderr and "--np" in p.stderr
    assert not results.exists() and not out.exists()

    p = replay(str(log), "--config", cfg, "--np", "2", "--results", str(results), "--iterations", "2", "-q")
    assert p.returncode == 0, p.stderr
    assert "replayed at 2 ranks (--np 2), but the log's communicators have 4 ranks" in p.stdout
    assert "  2!  " in p.stdout     # the ranks column is marked
    recs = records_of(results)
    res = [r for r in recs if r["type"] == "result"]
    assert len(res) == 1 and res[0]["ranks"] == 2 and res[0]["size_bytes"] == 8192
    ev = next(r for r in recs if r["type"] == "event")
    assert any("replayed at 2 ranks" in w for w in ev["warnings"]) and "replayed at 2 ranks" in ev["detail"]
    assert ev["configurations"][0]["log_nranks"] == 4 and ev["configurations"][0]["ranks"] == 2


@pytest.mark.mpi
def test_max_bytes_cap_reports_and_scales(tmp_path, engine_bin):  # noqa: F811
    seq = [("AllReduce", 262144, "float32", "sum", 0, True),       # 1 MB per rank
           ("AllGather", 100, "float32", "sum", 0, False)]         # small: not capped
    log = make_log(tmp_path / "nccl.log", 2, seq)
    cfg = config(tmp_path, engine_bin, 2, "shm")
    results = tmp_path / "r.jsonl"
    p = replay(str(log), "--config", cfg, "--order", "log", "--max-bytes", "64KB", "--format", "json",
               "--results", str(results), "--iterations", "2", "-q")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["max_bytes"] == 65536
    big, small = doc["calls"]
    assert big["measured_count"] == 16384 and big["scale"] == 16.0 and big["estimated"] is True
    assert big["size_bytes"] == 65536 and big["time_us"] == pytest.approx(big["measured_us"] * 16)
    assert small["estimated"] is False and small["time_us"] == small["measured_us"]
    assert any("--max-bytes 64KB" in w and "estimate" in w for w in doc["warnings"])
    assert "warning: 1 call exceeds --max-bytes 64KB" in p.stderr
    # the record is the measurement (64 KB), the event says how it was scaled
    recs = records_of(results)
    assert {r["size_bytes"] for r in recs if r["type"] == "result"} == {65536, 400}
    ev = next(r for r in recs if r["type"] == "event")
    conf = next(c for c in ev["configurations"] if c["nccl_op"] == "AllReduce")
    assert conf["estimated"] is True and conf["scale"] == 16.0

    # grouped, the seed's 268M-element fp16 AllReduce (512 MB per rank), capped at 1 MB for the test
    big_log = make_log(tmp_path / "big.log", 2, [("AllReduce", 268435456, "float16", "sum", 0, True)])
    p = replay(str(big_log), "--config", cfg, "--max-bytes", "1MB", "--iterations", "2", "-q")
    assert p.returncode == 0, p.stderr
    assert "1 configuration exceeds --max-bytes 1MB" in p.stdout and "an estimate" in p.stdout
    assert "~" in p.stdout.split("Estimated time")[0]


# --- bad input -----------------------------------------------------------------------------------

def test_bad_input_exits_2_and_writes_nothing(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    no_coll = tmp_path / "init-only.log"
    no_coll.write_text("gpu-0:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 "
                       "busId 1b000 commId 0x2 - Init COMPLETE\n")
    binary = tmp_path / "core.log"
    binary.write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    p2p = make_log(tmp_path / "p2p.log", 2, [("Send", 8, "float32", "sum", "next", False),
                                             ("Recv", 8, "float32", "sum", "prev", False)])
    good = make_log(tmp_path / "good.log", 2, [("AllReduce", 8, "float32", "sum", 0, True)])
    results, out, csv_out = tmp_path / "r.jsonl", tmp_path / "out.txt", tmp_path / "c.csv"
    outputs = ["--results", str(results), "-o", str(out), "--csv", str(csv_out)]
    cases = [
        ([str(empty)], "empty log"),
        ([str(no_coll)], "no NCCL collective lines"),
        ([str(binary)], "binary file"),
        ([str(tmp_path / "missing.log")], "missing.log"),
        ([str(p2p)], "nothing to replay"),
        ([str(p2p), "--order", "log"], "nothing to replay"),
        ([str(good), "--order", "log", "--comm", "0xdeadbeef"], "no such communicator"),
        ([str(good), "--comm", "0xdeadbeef"], "--comm picks the communicator of --order log"),
        ([str(good), "--max-bytes", "lots"], "--max-bytes"),
        ([str(good), "--max-bytes", "3GB"], "--max-bytes"),
        ([str(good), "--iterations", "0"], "--iterations: got 0, expected a whole number from 1 to 1000000"),
        ([str(good), "--np", "0"], "--np: got 0, expected a whole number from 1 to 1048576"),
        ([str(good), "--results", str(tmp_path / "no" / "r.jsonl")], "does not exist"),
    ]
    for args, words in cases:
        p = replay(*outputs, *args, "-q", timeout=120)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert words in p.stderr, (args, p.stderr)
        assert "Traceback" not in p.stderr
        assert not results.exists() and not out.exists() and not csv_out.exists(), args
    p = replay(str(good), "--iterations", "x", "-q", timeout=120)      # argparse's own error: exit 2 too
    assert p.returncode == 2


@pytest.mark.mpi
def test_validation_failure_is_recorded_and_exit_1(tmp_path, engine_bin):  # noqa: F811
    """--validate checks the replayed results; a wrong one (the engine's test hook spoils rank 1's
    result) fails the run with exit 1, and the records and the output still come out."""
    log = make_log(tmp_path / "nccl.log", 2, [("AllReduce", 64, "float32", "sum", 0, True)])
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"ranks: 2\ntransport: shm\nengine_path: {engine_bin}\nstep_timeout: 300\n"
                   f"env: {{COLLBENCH_ENGINE_CORRUPT_RANK: '1'}}\n")
    results = tmp_path / "r.jsonl"
    p = replay(str(log), "--config", str(cfg), "--validate", "--iterations", "2", "--results", str(results), "-q")
    assert p.returncode == 1, p.stderr
    assert "AllReduce" in p.stdout
    res = [r for r in records_of(results) if r["type"] == "result"]
    assert [r["validation"] for r in res] == ["fail"]
    p = replay(str(log), "--config", config(tmp_path, engine_bin, 2, "shm"), "--validate", "--iterations", "2",
               "--results", str(results), "-q")
    assert p.returncode == 0, p.stderr
    assert [r["validation"] for r in records_of(results) if r["type"] == "result"] == ["fail", "pass"]


@pytest.mark.mpi
def test_grouped_replays_each_communicator_at_its_own_size(tmp_path, engine_bin):  # noqa: F811
    """The 2.23 fixture: a 4-rank communicator (Broadcast, AllReduce avg) and two 2-rank splits
    (bfloat16 AllGather in place by offset, ReduceScatter): one job per size, each at its size."""
    fixture = REPO / "tests" / "fixtures" / "nccl" / "nccl-2.23-init-split.log"
    p = replay(str(fixture), "--config", config(tmp_path, engine_bin, 4, "shm"), "--format", "json",
               "--iterations", "2", "--warmup", "0")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    got = {(c["op"], c["nranks"], c["replay_nranks"], c["inplace"], c["size_bytes"]) for c in doc["configurations"]}
    assert got == {("AllGather", 2, 2, True, 1048576 * 2), ("ReduceScatter", 2, 2, False, 1048576 * 2 * 2),
                   ("Broadcast", 4, 4, True, 4000), ("AllReduce", 4, 4, True, 16)}
    assert "at 2 ranks" in p.stderr and "at 4 ranks" in p.stderr        # one job per size
    assert any("avg" in w and "MPI_SUM" in w for w in doc["warnings"])
    assert not any("replayed at" in w for w in doc["warnings"])


@pytest.mark.mpi
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_replay_stops_mpi_and_writes_nothing(tmp_path, engine_bin, sig, code):  # noqa: F811
    log = make_log(tmp_path / "nccl.log", 2, [("AllReduce", 1 << 16, "float32", "sum", 0, True)])
    results, out = tmp_path / "r.jsonl", tmp_path / "out.txt"
    results.write_text('{"kept": true}\n')
    proc = subprocess.Popen([sys.executable, "-m", "collbench", "nccl", "replay", str(log), "--config",
                             config(tmp_path, engine_bin, 2, "shm"), "--iterations", "1000000", "--results",
                             str(results), "-o", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert "collbench: replay:" in proc.stderr.readline()       # the job is being started
        running = wait_for(lambda: pids_of_exe(engine_bin), timeout=120)
        assert running
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert "nothing written" in err
    assert wait_for(lambda: all(is_gone(p) for p in running), timeout=30)     # the ranks were stopped
    assert results.read_text() == '{"kept": true}\n' and not out.exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []
