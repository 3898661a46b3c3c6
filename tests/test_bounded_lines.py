"""collbench.bounded_file.iter_lines_limited: an untrusted input read line by line within bounds
(the reader of `collbench import`): regular files, pipes with an idle deadline, FIFOs with no
writer, endless lines, NUL bytes, a size cap."""

import os
import subprocess
import sys
import threading
import time

import pytest

from collbench.bounded_file import UntrustedFileError, iter_lines_limited


def test_lines_without_their_ends_and_a_last_line_without_newline(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"one\r\ntwo\n\nthree")
    assert list(iter_lines_limited(str(f), 100)) == ["one", "two", "", "three"]


def test_an_endless_line_comes_back_cut_and_the_next_line_whole(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"a\n" + b"9" * (3 << 20) + b"\nb\n")       # longer than one 1 MB read
    lines = list(iter_lines_limited(str(f), 8 << 20, max_line=100))
    assert lines[0] == "a" and len(lines[1]) == 101 and lines[2] == "b" and len(lines) == 3


def test_size_cap_and_nul_bytes(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"x\n" * 100)
    with pytest.raises(UntrustedFileError, match="larger than 50 bytes"):
        list(iter_lines_limited(str(f), 50))
    f.write_bytes(b"a\0b\nc\n")
    with pytest.raises(UntrustedFileError, match="NUL"):
        list(iter_lines_limited(str(f), 100))
    assert list(iter_lines_limited(str(f), 100, strip_nul=True)) == ["ab", "c"]


def test_a_fifo_is_refused_unless_pipes_are_allowed_and_one_with_no_writer_never_hangs(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UntrustedFileError, match="a FIFO, not a regular file"):
        list(iter_lines_limited(str(fifo), 100))
    t0 = time.monotonic()
    with pytest.raises(UntrustedFileError, match="nothing to read for 0.5 s"):
        list(iter_lines_limited(str(fifo), 100, allow_pipes=True, idle_s=0.5))
    assert time.monotonic() - t0 < 5


def test_standard_input_pipe_read_as_it_comes_and_refused_when_silent():
    code = ("import sys; from collbench.bounded_file import iter_lines_limited as it, UntrustedFileError as E\n"
            "try: print(list(it('-', 1000, allow_pipes=True, idle_s=0.5)))\n"
            "except E as e: print('refused:', e)")
    p = subprocess.run([sys.executable, "-c", code], input="x\ny\n", capture_output=True, text=True, timeout=30)
    assert p.stdout.strip() == "['x', 'y']"
    # a writer that never writes: our end of its stdin stays open while the child reads
    silent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    guard = threading.Timer(30, silent.kill)     # a hang fails the test instead of stalling it
    guard.start()
    out = silent.stdout.read()          # ends when the child does (its idle deadline)
    guard.cancel()
    silent.stdin.close()
    silent.wait(timeout=30)
    assert out.startswith("refused: nothing to read for 0.5 s")
