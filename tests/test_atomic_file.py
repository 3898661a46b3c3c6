"""collbench.atomic_file's public API, the one writer every verb's output flags use: FileSet (all
or nothing), Outputs (go on after a failure, then name every failed file), write_output to stdout,
append_lines through a FIFO, check_writable on what is not a regular file. The command-level cases
(devices, full disks, SIGTERM) are the table in test_outputs_adversarial.py."""

import os
import socket
import stat
import threading

import pytest

from collbench.atomic_file import FileSet, OutputError, Outputs, append_lines, check_writable, write_output
from collbench.errors import UserError


def test_fileset_writes_every_member_and_keeps_an_existing_mode(tmp_path):
    old = tmp_path / "a.txt"
    old.write_text("old a\n")
    old.chmod(0o600)
    files = FileSet("--out-dir")
    files.add(str(old), "new a\n")
    files.add(str(tmp_path / "b.bin"), b"\x00\x01")
    written = files.commit()
    assert old.read_text() == "new a\n" and (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert stat.S_IMODE(old.stat().st_mode) == 0o600
    assert set(written) == {str(old), str(tmp_path / "b.bin")}
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.bin"]


def test_fileset_failure_keeps_the_old_set_and_names_the_member(tmp_path):
    (tmp_path / "a.txt").write_text("old a\n")
    files = FileSet("--out-dir")
    files.add(str(tmp_path / "a.txt"), "new a\n")
    files.add(str(tmp_path / "missing" / "b.txt"), "new b\n", "--png")
    with pytest.raises(OutputError) as e:
        files.commit()
    assert str(e.value).startswith(f"--png {tmp_path / 'missing' / 'b.txt'}: cannot write: No such file")
    assert (tmp_path / "a.txt").read_text() == "old a\n"
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]  # no temporary file left


def test_outputs_go_on_after_a_failure_and_name_each_failed_file(tmp_path):
    outs = Outputs()
    assert outs.write(str(tmp_path / "no" / "x.tsv"), "x\n", "--tsv") is None
    assert outs.append(str(tmp_path / "r.jsonl"), ['{"a": 1}\n'], "--results") is not None
    assert outs.write(str(tmp_path), "x\n", "-o") is None  # a directory
    assert (tmp_path / "r.jsonl").read_text() == '{"a": 1}\n'
    with pytest.raises(UserError) as e:
        outs.raise_if_failed()
    text = str(e.value)
    assert "--tsv " in text and "x.tsv: cannot write" in text and f"-o {tmp_path}: cannot write: is a directory" in text


def test_write_output_dash_is_stdout(capfd):
    write_output("-", ["text, ", b"bytes\n"])
    assert capfd.readouterr().out == "text, bytes\n"


def test_append_lines_through_a_fifo_keeps_the_fifo(tmp_path):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    append_lines(fifo, ["one\n", "two\n"], fifo_wait_s=30)
    reader.join(30)
    assert got == [b"one\ntwo\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_append_ends_a_torn_last_line_first(tmp_path):
    log = tmp_path / "r.jsonl"
    log.write_bytes(b'{"a": 1}\n{"torn')
    append_lines(str(log), ['{"b": 2}\n'])
    assert log.read_bytes() == b'{"a": 1}\n{"torn\n{"b": 2}\n'


def test_check_writable_passes_a_fifo_and_refuses_a_socket_and_a_missing_directory(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    assert check_writable(str(tmp_path / "fifo"), "-o") == str(tmp_path / "fifo")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(UserError, match="is a socket"):
            check_writable(str(tmp_path / "sock"), "-o")
    finally:
        s.close()
    os.symlink(tmp_path / "nowhere" / "x", tmp_path / "dangling")
    with pytest.raises(UserError, match=f"directory {tmp_path / 'nowhere'} does not exist"):
        check_writable(str(tmp_path / "dangling"), "--results")
