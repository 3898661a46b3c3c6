"""The results log tail: only new bytes, every rotation/truncation case, garbage, start-up backfill.

Each case checks the exact sequence of records read: none lost, none twice.
"""

import os
import shutil
import time
from types import SimpleNamespace

from exporter_helpers import append, event_line, failure_line, result_line, seqs

from collbench.exporter.app import Exporter
from collbench.exporter.results_state import ResultsState
from collbench.results.lines import ReadFingerprint, read_lines_backwards
from collbench.results.tailer import LogTailer


def lines(n0, n1, **kw):
    return "".join(result_line(i, **kw) for i in range(n0, n1 + 1))


def poll(tailer):
    return seqs(tailer.poll())


def test_missing_log_then_created(tmp_path):
    log = tmp_path / "results.jsonl"
    t = LogTailer(str(log))
    assert poll(t) == []
    assert poll(t) == []
    append(log, lines(1, 3))
    assert poll(t) == [1, 2, 3]
    assert poll(t) == []
    append(log, lines(4, 4))
    assert poll(t) == [4]


def test_reads_only_new_bytes(tmp_path):
    log = tmp_path / "results.jsonl"
    append(log, lines(1, 50))
    t = LogTailer(str(log))
    assert poll(t) == list(range(1, 51))
    size = log.stat().st_size
    assert t.offset == size
    append(log, lines(51, 52))
    assert poll(t) == [51, 52]
    assert t.offset == log.stat().st_size


def test_partial_last_line_waits_for_its_newline(tmp_path):
    log = tmp_path / "results.jsonl"
    rec = result_line(2)
    append(log, result_line(1) + rec[:40])
    t = LogTailer(str(log))
    assert poll(t) == [1]
    assert poll(t) == []
    append(log, rec[40:-1])          # still no newline
    assert poll(t) == []
    append(log, "\n" + result_line(3)[:10])
    assert poll(t) == [2]
    append(log, result_line(3)[10:])
    assert poll(t) == [3]


def test_rename_rotation_finishes_old_file_first(tmp_path):
    log = tmp_path / "results.jsonl"
    append(log, lines(1, 5))
    t = LogTailer(str(log))
    assert poll(t) == [1, 2, 3, 4, 5]
    append(log, lines(6, 8))                     # written, not yet polled
    os.rename(log, str(log) + ".1")
    append(log, lines(9, 10))
    assert poll(t) == [6, 7, 8, 9, 10]
    assert t.rotations == 1
    append(log, lines(11, 11))
    assert poll(t) == [11]


def test_rotation_with_unterminated_last_line_in_old_file(tmp_path):
    log = tmp_path / "results.jsonl"
    append(log, lines(1, 2))
    t = LogTailer(str(log))
    assert poll(t) == [1, 2]
    append(log, result_line(3)[:-1])             # the writer died before the newline
    os.rename(log, str(log) + ".1")
    append(log, lines(4, 4))
    assert poll(t) == [3, 4]


def test_two_rotations_between_polls(tmp_path):
    log = str(tmp_path / "results.jsonl")
    append(log, lines(1, 3))
    t = LogTailer(log)
    assert poll(t) == [1, 2, 3]

    def rotate():
        for i in (2, 1):
            if os.path.exists(f"{log}.{i}"):
                os.rename(f"{log}.{i}", f"{log}.{i + 1}")
        os.rename(log, f"{log}.1")

    append(log, lines(4, 4))
    rotate()
    append(log, lines(5, 6))
    rotate()
    append(log, lines(7, 7))
    assert poll(t) == [4, 5, 6, 7]


def test_log_moved_away_then_recreated(tmp_path):
    log = tmp_path / "results.jsonl"
    append(log, lines(1, 2))
    t = LogTailer(str(log))
    assert poll(t) == [1, 2]
    append(log, lines(3, 3))
    os.rename(log, tmp_path / "elsewhere")
    assert poll(t) == [3]                        # finished through the open descriptor
    assert poll(t) == []
    append(log, lines(4, 5))
    assert poll(t) == [4, 5]


def test_copytruncate_recovers_lines_from_the_copy(tmp_path):
    log = tmp_path / "results.jsonl"
    append(log, lines(1, 5))
    t = LogTailer(str(log))
    assert poll(t) == [1, 2, 3, 4, 5]
    append(log, lines(6, 7))                     # after our poll, before logrotate's copy
    shutil.copyfile(log, str(log) + ".1")        # logrotate copytruncate: copy, then cut in place
    with open(log, "r+") as f:
        f.truncate(0)
    append(log, lines(8, 8))
    assert poll(t) == [6, 7, 8]
    assert t.truncations == 1
    append(log, lines(9, 9))
    assert poll(t) == [9]


T0 = 1795000000.123    # one timestamp for records written "in the same millisecond"


def same_start(a, b, n=ReadFingerprint.HEAD):
    """The two texts begin with the same first line (and more: the whole fingerprinted head)."""
    return a.encode()[:n] == b.encode()[:n] and a.split("\n")[0] != b.split("\n")[0]


def test_truncated_and_regrown_past_offset(tmp_path):
    """copytruncate (no copy kept) and the writer regrows the file past our offset before we poll,
    its first line the same as the old file's up to its seq (two writes in one millisecond): the
    first bytes and the size both look like an append; only the bytes before our offset differ."""
    log = tmp_path / "results.jsonl"
    before, after = lines(1, 2, ts=T0), lines(3, 12, ts=T0)
    assert same_start(before, after)             # the case is built on purpose, not hoped for
    append(log, before)
    t = LogTailer(str(log))
    assert poll(t) == [1, 2]
    with open(log, "r+") as f:
        f.truncate(0)
    append(log, after)                           # longer than before: size alone would miss it
    assert poll(t) == list(range(3, 13))
    assert t.truncations == 1
    append(log, lines(13, 13, ts=T0))
    assert poll(t) == [13] and t.truncations == 1


def test_truncated_and_regrown_with_another_first_line(tmp_path):
    log = tmp_path / "results.jsonl"
    append(log, lines(1, 2, ts=T0))
    t = LogTailer(str(log))
    assert poll(t) == [1, 2]
    with open(log, "r+") as f:
        f.truncate(0)
    append(log, lines(3, 12, ts=T0 + 1))
    assert poll(t) == list(range(3, 13))
    assert t.truncations == 1


def test_copytruncate_same_first_line_regrown_past_offset_recovers_from_the_copy(tmp_path):
    """logrotate copytruncate while records stream: what came after our poll is in the copy,
    then the cut file regrows past our offset with records written in the same millisecond."""
    log = tmp_path / "results.jsonl"
    append(log, lines(1, 5, ts=T0))
    t = LogTailer(str(log))
    assert poll(t) == [1, 2, 3, 4, 5]
    append(log, lines(6, 7, ts=T0))
    shutil.copyfile(log, str(log) + ".1")
    with open(log, "r+") as f:
        f.truncate(0)
    append(log, lines(8, 30, ts=T0))
    assert log.stat().st_size > t.offset
    assert poll(t) == list(range(6, 31))
    assert t.truncations == 1


def test_partial_line_cut_and_regrown_with_the_same_start(tmp_path):
    """We hold the first bytes of record 3 (its writer is mid-line) when the file is cut and
    rewritten: the partial line is dropped, not glued to the middle of the new content."""
    log = tmp_path / "results.jsonl"
    rec3 = result_line(3, ts=T0)
    append(log, lines(1, 2, ts=T0) + rec3[:300])
    t = LogTailer(str(log))
    assert poll(t) == [1, 2]
    with open(log, "r+") as f:
        f.truncate(0)
    append(log, lines(4, 9, ts=T0))
    assert poll(t) == list(range(4, 10))
    assert t.truncations == 1


def test_older_rotation_that_starts_alike_is_not_taken_for_the_copy(tmp_path):
    """A truncation without a copy, next to a path.1 left by an earlier rotation whose first
    line is the same as ours: reading it from our offset would yield another file's records."""
    log = tmp_path / "results.jsonl"
    append(str(log) + ".1", lines(100, 140, ts=T0))
    append(log, lines(1, 5, ts=T0))
    assert same_start(lines(100, 140, ts=T0), lines(1, 5, ts=T0))
    t = LogTailer(str(log))
    assert poll(t) == [1, 2, 3, 4, 5]
    with open(log, "r+") as f:
        f.truncate(0)
    append(log, lines(6, 7, ts=T0 + 5))
    assert poll(t) == [6, 7]
    assert t.truncations == 1


def test_cut_between_the_check_and_the_read_is_not_read_as_new_lines(tmp_path):
    """The truncation lands after this poll's check and before its read (the writer regrows the
    file past our offset in between): the chunk read is checked again before it is used."""
    log = tmp_path / "results.jsonl"
    append(log, lines(1, 3, ts=T0))
    t = LogTailer(str(log))
    assert poll(t) == [1, 2, 3]
    check = t._truncated

    def check_then_cut():
        found = check()
        with open(log, "r+") as f:
            f.truncate(0)
        append(log, lines(4, 20, ts=T0))
        return found

    t._truncated = check_then_cut
    assert poll(t) == list(range(4, 21))
    assert t.truncations == 1


def test_append_is_never_taken_for_a_truncation(tmp_path):
    """Appends in small pieces, partial lines and records alike: every record once, no restart."""
    log = tmp_path / "results.jsonl"
    t = LogTailer(str(log))
    text = lines(1, 40, ts=T0)
    got = []
    for i in range(0, len(text), 97):
        append(log, text[i:i + 97])
        got += poll(t)
    assert got == list(range(1, 41))
    assert t.truncations == 0 and t.rotations == 0


def test_overlong_line_dropped_and_reported(tmp_path):
    log = tmp_path / "results.jsonl"
    bad = []
    t = LogTailer(str(log), max_line=2000, on_bad_line=bad.append)
    append(log, result_line(1) + "x" * 5000)
    assert poll(t) == [1]
    append(log, "y" * 5000 + "\n" + result_line(2))
    assert poll(t) == [2]
    assert len(bad) == 1 and "longer than 2000" in bad[0]


def test_garbage_lines_counted_never_fatal(tmp_path):
    log = tmp_path / "results.jsonl"
    now = time.time()
    state = ResultsState(max_age=900)
    t = LogTailer(str(log), max_line=4096, on_bad_line=state.bad_line)
    garbage = [
        "not json at all",
        "\x00\x01\x02\xff binary",
        "[1, 2, 3]",
        '{"type": "result"}',                                         # no ts
        '{"type": "weird", "ts": 1}',
        '{"type": "result", "ts": 1, "op": "allreduce"}',             # missing fields
        result_line(99, ts=now).replace('"latency_avg_us":100.0', '"latency_avg_us":"fast"').rstrip("\n"),
        result_line(98, ts=now).replace('"op":"allreduce"', '"op":"allsing"').rstrip("\n"),
        "z" * 10000,
        "",
    ]
    text = result_line(1, ts=now) + "\n".join(garbage) + "\n" + failure_line(2, ts=now) + event_line(3, ts=now) \
        + result_line(4, op="bcast", ts=now)
    with open(log, "wb") as f:
        f.write(text.encode("utf-8", "surrogateescape").replace(b"\\xff", b"\xff"))
    for line in t.poll():
        state.ingest(line)
    snap = state.snapshot()
    # 9 bad lines (the empty one is not JSON either: it counts too), 4 good records
    assert snap["parse_errors"] == 10
    assert snap["records"] == {"result": 2, "failure": 1, "event": 1}
    assert snap["failures"]["alltoall"] == 1
    assert {(s.op, s.size) for s in state.fresh_series(now)} == {("allreduce", "4MB"), ("bcast", "4MB")}


def test_read_lines_backwards(tmp_path):
    log = tmp_path / "results.jsonl"
    append(log, lines(1, 300) + result_line(301)[:30])
    got = seqs(read_lines_backwards(str(log), budget=1 << 30, chunk=997))
    assert got == list(range(300, 0, -1))        # newest first, partial last line left out
    one = len(result_line(1).encode())
    budget = 10 * one
    got = seqs(read_lines_backwards(str(log), budget=budget, chunk=512))
    assert 8 <= len(got) <= 11 and got == list(range(300, 300 - len(got), -1))
    data = log.read_bytes()
    end = 0
    for _ in range(100):
        end = data.index(b"\n", end) + 1        # just after the 100th record
    assert seqs(read_lines_backwards(str(log), budget=1 << 30, end=end, chunk=4096)) == list(range(100, 0, -1))


def _settings(log, tmp_path, **kw):
    base = dict(results_log=str(log), state_dir=str(tmp_path), max_age=900.0, poll_interval=0.05,
                legacy_metrics=False, collectors=["results"], sysfs_root="/sys", procfs_root="/proc",
                ethtool="ethtool", netdevs=None, device_include=None, device_exclude=None)
    base.update(kw)
    return SimpleNamespace(**base)


def test_startup_backfill_recovers_latest_without_reading_whole_log(tmp_path):
    log = tmp_path / "results.jsonl"
    now = time.time()
    # 20000 old records (a day ago) then the recent window: the backfill must stop at max_age
    old = "".join(result_line(i, op="allgather", size_bytes=128 << 10, ts=now - 86400 + i) for i in range(1, 20001))
    recent = (result_line(20001, avg_us=111.0, ts=now - 60, iteration=7)
              + result_line(20002, op="bcast", avg_us=222.0, ts=now - 50, iteration=7)
              + result_line(20003, avg_us=333.0, ts=now - 40, iteration=8)
              + failure_line(20004, ts=now - 30, iteration=8))
    append(log, old + recent + result_line(20005, ts=now)[:25])   # a partial record at the end
    ex = Exporter(_settings(log, tmp_path))
    ex.backfill()
    # used: the failure, allreduce@333, bcast; the older allreduce is skipped (its series is
    # filled), and the scan stops at the first record past max_age
    assert ex.backfilled == 3
    series = {(s.op, s.size): s for s in ex.state.fresh_series()}
    assert set(series) == {("allreduce", "4MB"), ("bcast", "4MB")}    # allgather is older than max_age
    assert abs(series[("allreduce", "4MB")].avg_s - 333e-6) < 1e-12    # the newest, not the first seen
    snap = ex.state.snapshot()
    assert snap["last_success"][0] is False and snap["last_iteration"] == 8
    assert abs(snap["last_update"] - (now - 40)) < 0.01
    assert snap["records"] == {"result": 0, "failure": 0, "event": 0}   # counters count from start
    # the partial record is completed after start-up: read once, by the tailer
    append(log, result_line(20005, ts=now)[25:] + result_line(20006, ts=now))
    ex.poll_once()
    assert ex.state.snapshot()["records"]["result"] == 2


def test_startup_after_rotation_backfills_from_previous_file(tmp_path):
    log = tmp_path / "results.jsonl"
    now = time.time()
    append(str(log) + ".1", result_line(1, op="reduce", size_bytes=1 << 20, ts=now - 20))
    append(log, event_line(2, ts=now - 10))
    ex = Exporter(_settings(log, tmp_path))
    ex.backfill()
    assert [(s.op, s.size) for s in ex.state.fresh_series()] == [("reduce", "1MB")]


def test_concurrent_writer_with_real_rotation_loses_nothing(tmp_path):
    """The stress daemon's own ResultsLog writes and rotates (~40 rotations) while the tailer
    polls in another thread: every seq is read exactly once, in order."""
    import threading

    from collbench.results.records import event_record
    from collbench.results.results_log import ResultsLog

    path = str(tmp_path / "results.jsonl")
    total = 1500
    got = []
    done = threading.Event()
    t = LogTailer(path)

    def tail():
        while True:
            finished = done.is_set()
            got.extend(seqs(t.poll()))
            if finished:
                return
            time.sleep(0.002)

    reader = threading.Thread(target=tail)
    reader.start()
    with ResultsLog(path, rotate_bytes=8 << 10, rotate_keep=30) as writer:
        for i in range(total):
            writer.append(event_record("relaunch", pid=1, detail="x" * 100))
            if i % 10 == 0:
                time.sleep(0.001)
        rotations = writer.rotations
    done.set()
    reader.join(timeout=30)
    assert rotations >= 30
    assert got == list(range(1, total + 1))


def test_atomic_rewrite_keeping_old_content_is_not_read_twice(tmp_path):
    """`once --results` appends by writing old + new records to a temp file and renaming it."""
    log = tmp_path / "results.jsonl"
    append(log, lines(1, 3))
    t = LogTailer(str(log))
    assert poll(t) == [1, 2, 3]
    tmp = tmp_path / "results.jsonl.tmp"
    tmp.write_bytes(log.read_bytes() + lines(4, 5).encode())
    os.replace(tmp, log)
    assert poll(t) == [4, 5]
    assert t.rewrites == 1 and t.rotations == 0
    # a rewrite that changed what we read is a new file: read from its start
    tmp.write_bytes(lines(6, 7).encode())
    os.replace(tmp, log)
    assert poll(t) == [6, 7]
    assert t.rotations == 1
