"""Lines of a results log as bytes: opening it safely, splitting a stream into lines, reading
backwards from the end. Every reader of the log (the daemon's seq scan, `stress log|status`,
the exporter's tail and backfill, `ctl servers`, `report`/`baseline` files) splits lines here.

A line is untrusted: one longer than `max_line` (MAX_LINE_BYTES by default, the validator's
cap) is reported as a ParseError("line longer than N bytes") and its bytes are dropped as they
come, never held whole. A last line without its newline is still being written: it is not a
line yet (the splitter keeps it as `pending`; the backwards reader leaves it out).
"""

import errno
import os
import stat

from collbench.results.record_parser import MAX_LINE_BYTES, ParseError

BLOCK = 64 * 1024


def overlong(max_line=MAX_LINE_BYTES):
    return ParseError(f"line longer than {max_line} bytes")


def open_regular(path):
    """A read-only descriptor of `path` if it is a regular file; OSError for anything else.
    O_NONBLOCK: a FIFO in the log's place cannot block a reader in open(2)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise OSError(errno.EISDIR, "is a directory", path)
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_log(path):
    """`path` opened for reading ("rb") if it is a regular file, else None (missing, a directory,
    a FIFO, a device). Other errors (permissions, I/O) are raised."""
    try:
        fd = open_regular(path)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno in (errno.EISDIR, errno.EINVAL):
            return None
        raise
    return os.fdopen(fd, "rb")


class ReadFingerprint:
    """What a tailing reader has consumed of a file, kept in two small pieces: the file's first
    bytes and the bytes just before the reader's offset (the end of the last line read, which
    carries that record's `seq`). `matches(fd, offset)` says whether the file still holds them.

    Between two reads of a file kept open on its inode, the bytes before our offset stay as they
    were on an append, and are replaced on a truncation (logrotate copytruncate, `: > log`) --
    even when the file has since regrown past our offset and its first line happens to be the
    same (two writers in one millisecond; a header): the records at our offset then carry other
    seqs. Appends never touch what lies before the offset, so this never fires on one.
    """

    HEAD = 128
    TAIL = 4096

    def __init__(self):
        self.head = b""
        self.tail = b""

    def reset(self):
        self.head = self.tail = b""

    def load(self, fd, offset):
        """Take the fingerprint of what lies before `offset` in `fd` (starting mid-file)."""
        self.head = os.pread(fd, min(self.HEAD, offset), 0)
        n = min(self.TAIL, offset)
        self.tail = os.pread(fd, n, offset - n)

    def consumed(self, fd, data, offset):
        """`data` was just read from `fd`, ending at `offset`."""
        if len(self.head) < self.HEAD:
            self.head = os.pread(fd, min(self.HEAD, offset), 0)
        self.tail = data[-self.TAIL:] if len(data) >= self.TAIL else (self.tail + data)[-self.TAIL:]

    def matches(self, fd, offset):
        """True when `fd` is at least `offset` long and still holds the fingerprinted bytes."""
        if os.fstat(fd).st_size < offset:
            return False
        if self.head and os.pread(fd, len(self.head), 0) != self.head:
            return False
        return not self.tail or os.pread(fd, len(self.tail), offset - len(self.tail)) == self.tail


class LineSplitter:
    """Complete lines out of a stream of chunks: feed(data) -> [(offset, line)], line being the
    bytes without the newline, or a ParseError for an over-long line (whose bytes are dropped)."""

    def __init__(self, offset=0, max_line=MAX_LINE_BYTES):
        self.max_line = max_line
        self.offset = offset      # file offset of the first byte not yet fed
        self._buf = bytearray()
        self._start = offset      # file offset of _buf's first byte (or of the line being skipped)
        self._skipping = False

    def feed(self, data):
        out = []
        pos = 0
        limit = self.max_line
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                rest = len(data) - pos
                if not self._skipping:
                    if len(self._buf) + rest > limit:
                        self._buf.clear()
                        self._skipping = True
                        out.append((self._start, overlong(limit)))
                    else:
                        self._buf += data[pos:]
                self.offset += len(data)
                return out
            if self._skipping:
                self._skipping = False
            elif self._buf:
                if len(self._buf) + nl - pos > limit:
                    out.append((self._start, overlong(limit)))
                else:
                    self._buf += data[pos:nl]
                    out.append((self._start, bytes(self._buf)))
                self._buf.clear()
            elif nl - pos > limit:
                out.append((self._start, overlong(limit)))
            else:
                out.append((self._start, data[pos:nl]))
            self._start = self.offset + nl + 1
            pos = nl + 1

    @property
    def pending(self):
        """Bytes held of an unterminated line (0 while skipping an over-long one)."""
        return len(self._buf)

    @property
    def pending_offset(self):
        """File offset where the unterminated line (if any) starts."""
        return self._start

    def take_pending(self):
        """The unterminated last line of a file that will not grow again, as (offset, bytes), or
        None; the splitter is empty afterwards."""
        got = (self._start, bytes(self._buf)) if self._buf and not self._skipping else None
        self.reset(self.offset)
        return got

    def reset(self, offset):
        """Forget any partial line; the next byte fed is at `offset`."""
        self._buf.clear()
        self._skipping = False
        self.offset = self._start = offset


def lines_backwards(fd, end, block=BLOCK, max_line=MAX_LINE_BYTES):
    """(offset, line) of the complete lines of open file `fd` before byte `end`, newest first;
    an over-long line is (offset, ParseError). The unterminated piece after the last newline
    before `end` is left out. Memory: one block plus at most max_line of a line."""
    pos = end
    carry = b""               # the first bytes of this block: the end of a line begun before it
    tail_piece = True         # carry is the unterminated end of the file: not a line
    long_carry = False        # carry was dropped: the line it belongs to is too long
    while pos > 0:
        n = min(block, pos)
        pos -= n
        data = os.pread(fd, n, pos)
        if len(data) < n:     # the file shrank under us (truncated): nothing before is trustworthy
            return
        parts = data.split(b"\n")
        if len(parts) == 1:   # no newline in this block: the line goes on
            if not long_carry:
                carry = data + carry
                if len(carry) > max_line:
                    carry, long_carry = b"", True
            continue
        # parts[-1] + carry is a whole line that starts just after this block's last newline
        last_start = pos + len(data) - len(parts[-1])
        if tail_piece:
            tail_piece = False
        elif long_carry or len(parts[-1]) + len(carry) > max_line:
            yield last_start, overlong(max_line)
        else:
            yield last_start, parts[-1] + carry
        long_carry = False
        offset = last_start - 1
        for piece in reversed(parts[1:-1]):
            offset -= len(piece)
            yield offset, (piece if len(piece) <= max_line else overlong(max_line))
            offset -= 1
        carry = parts[0]
        if len(carry) > max_line:
            carry, long_carry = b"", True
    if not tail_piece:        # the first line of the file
        yield 0, (overlong(max_line) if long_carry else carry)


def read_lines_backwards(path, budget, end=None, chunk=BLOCK, max_line=MAX_LINE_BYTES):
    """The non-empty complete lines (bytes) of `path` that start in the `budget` bytes before
    byte `end` (default: the end), newest first; over-long lines are left out, and so is an
    unterminated last line (its writer is mid-record). Nothing (no error) if `path` is not a
    readable regular file. For a latest-values scan of a huge log: it never reads it whole."""
    try:
        fd = open_regular(path)
    except OSError:
        return
    try:
        size = os.fstat(fd).st_size
        end = size if end is None else min(end, size)
        for offset, line in lines_backwards(fd, end, chunk, max_line):
            if end - offset > budget:
                return
            if line and not isinstance(line, ParseError):
                yield line
    finally:
        os.close(fd)
