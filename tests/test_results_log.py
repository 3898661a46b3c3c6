"""The results log: append + flush per record, rename rotation, seq across rotations and restarts,
and a follower that reads every record exactly once while the writer rotates under it."""

import json
import os
import shutil
import threading
import time

from collbench.proctree import start_ticks
from collbench.results.records import dumps, event_record
from collbench.results.follower import LogFollower
from collbench.results.results_log import ResultsLog, read_records, tail_records
from collbench.results.state_dir import (CRASHED, RUNNING, STOPPED, StatePaths, daemon_status, write_json_atomic,
                                    write_pid_file)


def rec(i, pad=100):
    """A documented record (readers validate every line: collbench.results.record_parser) carrying the
    test's own fields; about as long as {"type": "result", "i": i, "pad": "x" * pad}."""
    return event_record("test", i=i, pad="x" * max(0, pad - 60))


def lines(path):
    with open(path, "rb") as f:
        return f.read().splitlines()


def test_append_flushes_each_record_as_one_line(tmp_path):
    p = tmp_path / "results.jsonl"
    log = ResultsLog(str(p), rotate_bytes=0, rotate_keep=3)
    for i in range(3):
        out = log.append(rec(i))
        assert out["seq"] == i + 1
        # visible to another reader at once, whole and parseable, without closing the log
        got = [json.loads(x) for x in lines(p)]
        assert [g["seq"] for g in got] == list(range(1, i + 2)) and got[-1]["i"] == i
    assert p.read_bytes().endswith(b"\n")
    log.close()


def test_rotation_keeps_n_files_and_every_record_once(tmp_path):
    p = tmp_path / "results.jsonl"
    log = ResultsLog(str(p), rotate_bytes=2000, rotate_keep=3)
    for i in range(200):
        log.append(rec(i))
    log.close()
    names = sorted(x.name for x in tmp_path.iterdir())
    assert names == ["results.jsonl", "results.jsonl.1", "results.jsonl.2", "results.jsonl.3"]
    kept = read_records(str(p))
    seqs = [r["seq"] for r in kept]
    # the kept files hold the newest records, contiguous, ending at the last one written
    assert seqs == list(range(seqs[0], 201)) and seqs[0] > 1
    for name in names[1:]:
        size = (tmp_path / name).stat().st_size
        assert 2000 <= size < 2000 + 200   # rotated at the first record past the size


def test_rotation_with_enough_files_loses_nothing(tmp_path):
    p = tmp_path / "results.jsonl"
    log = ResultsLog(str(p), rotate_bytes=1500, rotate_keep=1000)
    for i in range(500):
        log.append(rec(i))
    log.close()
    assert len(list(tmp_path.iterdir())) > 30
    got = read_records(str(p), rotate_keep=1000)
    assert [r["i"] for r in got] == list(range(500))
    assert [r["seq"] for r in got] == list(range(1, 501))


def test_keep_zero_deletes_at_rotation(tmp_path):
    p = tmp_path / "results.jsonl"
    log = ResultsLog(str(p), rotate_bytes=500, rotate_keep=0)
    for i in range(20):
        log.append(rec(i))
    log.close()
    assert [x.name for x in tmp_path.iterdir()] == ["results.jsonl"]
    assert log.rotations >= 3


def test_seq_continues_after_restart_even_right_after_a_rotation(tmp_path):
    p = tmp_path / "results.jsonl"
    log = ResultsLog(str(p), rotate_bytes=1000, rotate_keep=5)
    while log.rotations == 0:
        log.append(rec(0))
    last = log.last_seq
    log.close()
    assert p.stat().st_size == 0          # rotated on the last append: the live file is empty
    log = ResultsLog(str(p), rotate_bytes=1000, rotate_keep=5)
    assert log.append(rec(1))["seq"] == last + 1
    log.close()


def test_torn_last_line_is_ended_and_seq_resumes(tmp_path):
    p = tmp_path / "results.jsonl"
    log = ResultsLog(str(p), rotate_bytes=0, rotate_keep=1)
    log.append(rec(0))
    log.append(rec(1))
    log.close()
    with open(p, "ab") as f:
        f.write(b'{"type":"result","seq":3,"op":"allre')   # a crash mid-write
    log = ResultsLog(str(p), rotate_bytes=0, rotate_keep=1)
    assert log.append(rec(2))["seq"] == 3
    log.close()
    raw = lines(p)
    assert len(raw) == 4 and raw[2].startswith(b'{"type":"result","seq":3,"op":"allre')
    assert json.loads(raw[3])["seq"] == 3 and json.loads(raw[3])["i"] == 2


def test_tail_records_reads_back_through_rotations(tmp_path):
    p = tmp_path / "results.jsonl"
    log = ResultsLog(str(p), rotate_bytes=1000, rotate_keep=10)
    for i in range(60):
        log.append(rec(i))
    log.close()
    assert [r["seq"] for r in tail_records(str(p), 25)] == list(range(36, 61))
    assert tail_records(str(p), 0) == []


def test_follower_sees_every_record_once_while_the_writer_rotates(tmp_path):
    p = tmp_path / "results.jsonl"
    log = ResultsLog(str(p), rotate_bytes=3000, rotate_keep=10000)
    log.append(rec(-1))
    follower = LogFollower(str(p))   # starts at the end, as `stress log -f`
    n = 4000

    def write():
        for i in range(n):
            log.append(rec(i, pad=150))
            if i % 40 == 0:
                time.sleep(0.002)

    seen = []
    writer = threading.Thread(target=write)
    writer.start()
    while writer.is_alive():
        seen += [r["seq"] for r in follower.poll()]
        time.sleep(0.05)     # slower than the rotations: several happen between polls
    seen += [r["seq"] for r in follower.poll()]
    follower.close()
    log.close()
    assert log.rotations > 100
    assert seen == list(range(2, n + 2))


def stamped(first, last, ts=1795000000.123):
    """Records seq first..last as the daemon writes them, all in one millisecond: their lines
    begin with the same bytes up to the seq at their end."""
    return "".join(dumps({**event_record("test", pid=1, detail="x" * 100, ts=ts), "seq": s}) + "\n"
                   for s in range(first, last + 1))


def _write(path, text, mode="a"):
    with open(path, mode) as f:
        f.write(text)


def test_follower_copytruncate_regrown_past_its_position_with_the_same_first_line(tmp_path):
    """logrotate copytruncate while the daemon writes: the records after our poll are in the
    copy; the cut file regrows past our position before we look, starting like the old one."""
    p = tmp_path / "results.jsonl"
    _write(p, stamped(1, 3))
    assert stamped(1, 3)[:200] == stamped(4, 40)[:200]
    bad = []
    follower = LogFollower(str(p), from_start=True, on_bad=lambda *a: bad.append(a))
    assert [r["seq"] for r in follower.poll()] == [1, 2, 3]
    _write(p, stamped(4, 5))
    shutil.copyfile(p, str(p) + ".1")
    _write(p, stamped(6, 40), "w")                 # truncated in place, then regrown
    assert p.stat().st_size > len(stamped(1, 5))
    assert [r["seq"] for r in follower.poll()] == list(range(4, 41))
    assert bad == [] and follower.truncations == 1
    _write(p, stamped(41, 41))
    assert [r["seq"] for r in follower.poll()] == [41]


def test_follower_truncated_to_less_than_its_position(tmp_path):
    """A truncation not regrown past our position: the new records are read from the start (a
    reader that only reads on from its position would wait until the file outgrew it)."""
    p = tmp_path / "results.jsonl"
    _write(p, stamped(1, 20))
    follower = LogFollower(str(p), from_start=True)
    assert [r["seq"] for r in follower.poll()] == list(range(1, 21))
    _write(p, stamped(21, 22), "w")
    assert [r["seq"] for r in follower.poll()] == [21, 22]
    assert follower.truncations == 1
    _write(p, stamped(23, 23))
    assert [r["seq"] for r in follower.poll()] == [23]


def test_status_running_stopped_crashed_from_files(tmp_path):
    paths = StatePaths(str(tmp_path))
    assert daemon_status(paths).state == STOPPED
    # this test process plays the daemon: its real start time makes it "ours"
    me = os.getpid()
    write_pid_file(paths, me)
    write_json_atomic(paths.state, {"pid": me, "proc_start": start_ticks(me), "status": "running"})
    assert daemon_status(paths).state == RUNNING
    # same pid, other start time: the pid was reused by another process -> stale
    write_json_atomic(paths.state, {"pid": me, "proc_start": start_ticks(me) - 1, "status": "running"})
    st = daemon_status(paths)
    assert st.state == CRASHED and "another process" in st.reason and st.exit_code == 1
    os.unlink(paths.pid)
    assert daemon_status(paths).state == CRASHED      # state says running, nobody is
    write_json_atomic(paths.state, {"pid": me, "status": "stopped"})
    assert daemon_status(paths).exit_code == 3
