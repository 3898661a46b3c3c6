"""Untrusted files read with bounds, and the `NAME=value` settings files read through them.

Every file collbench reads from outside (sysfs and procfs counters, a state directory, another
tool's output, a tuning env file, a results log) may be missing, a directory, a FIFO that never
answers (a stand-in for a stuck driver), an endless device (/dev/zero), gigabytes, or binary.

- read_limited / read_limited_text: the one primitive. Regular files only unless devices are
  expected; at most max_bytes (one byte more tells a larger file apart); NUL bytes refused in text;
  an optional deadline (the read runs in a daemon thread, so a read the kernel never completes
  costs a parked thread, never the caller). Raises UntrustedFileError; the caller decides whether
  that is a counted error (the exporter) or a UserError (a verb's input).
- read_bytes / read_text: the same for a verb's input, failing with a UserError (exit 2) naming the
  file and what was expected, never a traceback.
- iter_lines_limited: the same bounds for an input read line by line (an imported output of
  millions of rows is never held whole); a pipe or FIFO (stdin, `<(...)`) when asked for, each read
  waited for at most idle_s; an over-long line comes back cut (the caller counts it), never buffered.
"""

import errno
import os
import re
import select
import stat
import threading

from collbench.errors import UserError

# how long a FIFO's other end is waited for, then refused with a clear error: a reader for one
# that is written (atomic_file), a writer for one that is read (nccl.log_input)
FIFO_WAIT_S = 5.0
FIFO_POLL_S = 0.05


class UntrustedFileError(Exception):
    """A file that could not be read within its bounds; str() says why, without the path (the
    caller names the file as its user knows it)."""


def _kind(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _open_untrusted(path):
    """A read-only fd of path that never waits to open."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting forever;
        # regular files ignore it, so a read is an ordinary one.
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except ValueError:
        raise UntrustedFileError("the path holds a NUL byte") from None
    except OSError as e:
        raise UntrustedFileError(f"cannot read it ({e.strerror or e})") from None


def _read_fd_limited(path, max_bytes, allow_devices):
    fd = _open_untrusted(path)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            if not (allow_devices and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode))):
                raise UntrustedFileError(f"{_kind(mode)}, not a regular file")
            os.set_blocking(fd, True)
        chunks, total = [], 0
        while total <= max_bytes:
            try:
                chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise UntrustedFileError(f"cannot read it ({e.strerror or e})") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UntrustedFileError(f"larger than {_size(max_bytes)}")
    return data


def read_limited(path, max_bytes, allow_devices=False, timeout_s=None):
    """The bytes of the file at path: a regular file (allow_devices: also a character device or
    FIFO, for a verb told to read one), at most max_bytes, within timeout_s seconds when given
    (None: no deadline, for files that cannot block). UntrustedFileError otherwise."""
    if timeout_s is None:
        return _read_fd_limited(path, max_bytes, allow_devices)
    box = {}

    def read():
        try:
            box["data"] = _read_fd_limited(path, max_bytes, allow_devices)
        except BaseException as e:   # handed to the caller's thread
            box["error"] = e

    worker = threading.Thread(target=read, name="bounded-read", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise UntrustedFileError(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["data"]


def read_limited_text(path, max_bytes, allow_devices=False, timeout_s=None):
    """read_limited decoded as UTF-8; NUL bytes (a binary file, or a device read by mistake) refused."""
    data = read_limited(path, max_bytes, allow_devices, timeout_s)
    if b"\0" in data:
        raise UntrustedFileError("holds NUL bytes, not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UntrustedFileError("not UTF-8 text") from None


def read_bytes(path, max_bytes, where, expected, allow_devices=False, timeout_s=None):
    """The bytes of the file at path; where: how the error names it (e.g. "--order FILE"),
    expected: what it should have been (e.g. "a rank order")."""
    try:
        return read_limited(path, max_bytes, allow_devices, timeout_s)
    except UntrustedFileError as e:
        raise UserError(f"{where}: {e} (expected {expected})") from None


def _open_stream(path, allow_pipes):
    """(fd, is_pipe) for path ('-': standard input, never closed here), checked like _read_fd_limited."""
    if path == "-":
        fd, own = 0, False
    else:
        fd, own = _open_untrusted(path), True
    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        if own:
            os.close(fd)
        raise UntrustedFileError(f"cannot read it ({e.strerror or e})") from None
    if stat.S_ISREG(mode):
        return fd, own, False
    if allow_pipes and (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return fd, own, True
    if own:
        os.close(fd)
    if path == "-" and stat.S_ISCHR(mode) and os.isatty(fd):
        raise UntrustedFileError("standard input is a terminal (pipe an output in, or name a file)")
    raise UntrustedFileError(f"{_kind(mode)}, not a regular file" + (" or a pipe" if allow_pipes else ""))


def _read_chunk(fd, size, is_pipe, idle_s):
    """One read of at most size bytes; b'' at the end. A pipe is polled: nothing for idle_s
    seconds (a FIFO or pipe whose writer never writes) is an UntrustedFileError, not a hang."""
    while True:
        if is_pipe and idle_s is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
            if not poller.poll(max(0, int(idle_s * 1000))):
                raise UntrustedFileError(f"nothing to read for {idle_s:g} s (a pipe or FIFO whose writer "
                                         f"never writes?)")
        try:
            return os.read(fd, size)
        except BlockingIOError:
            if idle_s is None:
                raise UntrustedFileError("a pipe with nothing to read") from None
            continue        # woken without data (another reader took it): poll again
        except OSError as e:
            if e.errno == errno.EINTR:
                continue
            raise UntrustedFileError(f"cannot read it ({e.strerror or e})") from None


def iter_lines_limited(path, max_bytes, max_line=65536, allow_pipes=False, idle_s=None, strip_nul=False):
    """The lines of the file at path (str, without their ends, decoded as UTF-8 with bad bytes
    replaced), read in chunks: path '-' is standard input. A regular file, or (allow_pipes) a pipe
    or FIFO, polled so that nothing for idle_s seconds raises; a FIFO with no writer reads as
    empty. At most max_bytes in all (UntrustedFileError past it, after the lines before); a line
    longer than max_line characters comes back cut to max_line + 1 characters (the caller sees
    that it is too long); NUL bytes raise (not text), or (strip_nul: a log a crash left padded with
    NULs) are dropped."""
    fd, own, is_pipe = _open_stream(path, allow_pipes)
    try:
        total, pending, skipping = 0, b"", False
        while True:
            chunk = _read_chunk(fd, 1 << 20, is_pipe, idle_s)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise UntrustedFileError(f"larger than {_size(max_bytes)}")
            if b"\0" in chunk:
                if not strip_nul:
                    raise UntrustedFileError("holds NUL bytes, not text")
                chunk = chunk.replace(b"\0", b"")
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                if nl < 0:
                    break
                piece = chunk[start:nl]
                start = nl + 1
                if skipping:
                    skipping = False
                    continue
                line = pending + piece if pending else piece
                pending = b""
                yield line[:max_line + 1].decode("utf-8", "replace").rstrip("\r")
            rest = chunk[start:]
            if skipping:
                continue
            if len(pending) + len(rest) > max_line:
                # an endless line: hand back its start (too long, counted by the caller), drop the rest
                yield (pending + rest)[:max_line + 1].decode("utf-8", "replace")
                pending, skipping = b"", True
            else:
                pending += rest
        if pending and not skipping:
            yield pending.decode("utf-8", "replace").rstrip("\r")
    finally:
        if own:
            os.close(fd)


def read_text(path, max_bytes, where, expected, allow_devices=False, timeout_s=None):
    """read_bytes decoded as UTF-8, NUL bytes refused."""
    try:
        return read_limited_text(path, max_bytes, allow_devices, timeout_s)
    except UntrustedFileError as e:
        raise UserError(f"{where}: {e} (expected {expected})") from None


def read_settings(path, names, where, expected, value=r"\S{1,1024}", max_bytes=1 << 20, required=True):
    """{NAME: value} of a settings file: `[export ]NAME=value` lines (NAME matching the regex
    `names`, value the regex `value`), blank lines and # comments; UserError naming the file and
    line of anything else, or (required) a file that sets nothing."""
    line_re = re.compile(rf"^(?:export\s+)?({names})=({value})$")
    out = {}
    for n, line in enumerate(read_text(path, max_bytes, where, expected).splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        if not m:
            raise UserError(f"{where}:{n}: expected {expected}, got {line[:80]!r}")
        out[m.group(1)] = m.group(2)
    if required and not out:
        raise UserError(f"{where}: sets nothing (expected {expected})")
    return out


def _size(n):
    return f"{n >> 20} MB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"
