"""collbench.results.lines, the one line splitter and backwards reader every results reader uses,
against a plain reference (bytes.split) on random data: lines of every length around the cap,
empty lines, chunk and block sizes down to one byte, any end position."""

import os
import random

from collbench.results.lines import LineSplitter, lines_backwards, open_log, open_regular, read_lines_backwards
from collbench.results.record_parser import ParseError

MAX = 40


def random_data(rnd, n_lines):
    parts = []
    for _ in range(n_lines):
        n = rnd.choice([0, 1, 5, MAX - 1, MAX, MAX + 1, 2 * MAX, 3 * MAX + 7, rnd.randrange(0, 4 * MAX)])
        parts.append(bytes(rnd.choice(b"abcxyz{}\":,") for _ in range(n)))
    data = b"\n".join(parts)
    if rnd.random() < 0.5:
        data += b"\n"          # else: the last piece is unterminated (a writer mid-record)
    return data


def reference(data, start=0):
    """[(offset, bytes or 'long')] of the complete lines of data, and the unterminated tail."""
    out, pos = [], 0
    pieces = data.split(b"\n")
    for piece in pieces[:-1]:
        out.append((start + pos, "long" if len(piece) > MAX else piece))
        pos += len(piece) + 1
    return out, pieces[-1]


def plain(items):
    return [(off, "long" if isinstance(x, ParseError) else x) for off, x in items]


def test_splitter_matches_split_for_any_chunking():
    rnd = random.Random(18)
    for trial in range(300):
        data = random_data(rnd, rnd.randrange(0, 30))
        start = rnd.choice([0, 1000])
        s = LineSplitter(start, max_line=MAX)
        got, pos = [], 0
        while pos < len(data):
            n = rnd.choice([1, 2, 3, 7, MAX, MAX + 1, 100, 4096])
            got += s.feed(data[pos:pos + n])
            pos += n
        want, tail = reference(data, start)
        if len(tail) > MAX:       # reported as soon as it passes the cap, before its newline comes
            want.append((start + len(data) - len(tail), "long"))
        assert plain(got) == want, trial
        assert all(str(x) == f"line longer than {MAX} bytes" for _, x in got if isinstance(x, ParseError))
        # the unterminated tail: held while it fits, its start known; dropped (skipping) past the cap
        if len(tail) <= MAX:
            assert s.pending == len(tail) and s.pending_offset == start + len(data) - len(tail)
            assert s.take_pending() == ((start + len(data) - len(tail), tail) if tail else None)
        else:
            assert s.pending == 0 and s.take_pending() is None
        assert s.pending == 0 and s.offset == start + len(data)


def test_backwards_matches_split_for_any_block_and_end(tmp_path):
    rnd = random.Random(19)
    path = tmp_path / "log"
    for trial in range(200):
        data = random_data(rnd, rnd.randrange(0, 30))
        path.write_bytes(data)
        end = rnd.randrange(0, len(data) + 1)
        block = rnd.choice([1, 2, 5, MAX, MAX + 3, 64, 4096])
        fd = open_regular(str(path))
        try:
            got = plain(lines_backwards(fd, end, block, max_line=MAX))
        finally:
            os.close(fd)
        want, _tail = reference(data[:end])
        assert got == list(reversed(want)), (trial, end, block)


def test_read_lines_backwards_keeps_the_budget_and_skips_empty_and_long(tmp_path):
    rnd = random.Random(20)
    path = tmp_path / "log"
    for trial in range(100):
        data = random_data(rnd, rnd.randrange(1, 30))
        path.write_bytes(data)
        budget = rnd.randrange(0, len(data) + 2)
        got = list(read_lines_backwards(str(path), budget, chunk=rnd.choice([3, 64]), max_line=MAX))
        want, _ = reference(data)
        want = [x for off, x in reversed(want) if len(data) - off <= budget and x and x != "long"]
        assert got == want, trial


def test_only_regular_files_are_opened(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert open_log(str(fifo)) is None                  # O_NONBLOCK: no wait for a writer
    assert open_log(str(tmp_path)) is None              # a directory
    assert open_log(str(tmp_path / "missing")) is None
    assert list(read_lines_backwards(str(fifo), 1 << 20)) == []
    (tmp_path / "f").write_bytes(b"a\nb\n")
    with open_log(str(tmp_path / "f")) as f:
        assert f.read() == b"a\nb\n"
