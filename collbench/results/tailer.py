"""Incremental tail of the results log: each poll reads only the bytes appended since the last one.

Handles what a log the exporter does not own can do between two polls:
- not exist yet (or disappear): nothing to read, try again next poll;
- rename rotation (results.jsonl -> results.jsonl.1, a new results.jsonl): the old file is
  read to its end through the descriptor still open on it, then any rotated file that was never
  read (more than one rotation between polls), then the new file from its start;
- copytruncate (same inode cut to 0, maybe already regrown past our offset): detected by the
  size going below our offset or by the first bytes changing; the file is re-read from 0;
- an atomic rewrite that keeps the old content (copy + rename, as `once --results` appends):
  recognised by the new file starting with the bytes already read, and continued from there;
- a partial last line (the writer is mid-record): kept until its newline arrives;
- an over-long line: dropped (reported as a bad line), never held in memory past `max_line`;
- something other than a regular file at the path (a FIFO, a device): an OSError, never a
  read that blocks the poller (files are opened O_NONBLOCK and checked before reading).

Cost per poll is two fstat/stat calls, one small pread of the file head, and reading the new
bytes in fixed-size chunks; memory is one chunk plus the partial line.
"""

import errno
import os
import stat

from collbench.results.record_parser import MAX_LINE_BYTES

CHUNK = 1 << 20
HEAD_BYTES = 128          # fingerprint of the file start: changes when copytruncate rewrites it
MAX_ROTATED = 32          # rotated siblings (path.1 .. path.N) searched after a rename rotation


def open_regular(path):
    """A read-only descriptor of `path` if it is a regular file. O_NONBLOCK: opening a FIFO
    for reading would otherwise wait for a writer forever. OSError for anything else."""
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


class LogTailer:
    """Yields complete lines (bytes, without the newline) appended to `path` since the last poll.

    `on_bad_line(reason)` is called for every line dropped as too long or cut by a truncation.
    """

    def __init__(self, path, max_line=MAX_LINE_BYTES, on_bad_line=None):
        self.path = path
        self.max_line = max_line
        self.on_bad_line = on_bad_line or (lambda reason: None)
        self._fd = None
        self._ino = None          # (st_dev, st_ino) of the open file
        self._offset = 0          # bytes of the open file consumed (complete lines + partial)
        self._head = b""          # the first HEAD_BYTES we read from the open file
        self._partial = bytearray()
        self._skipping = False    # inside an over-long line: drop until its newline
        self.rotations = 0
        self.truncations = 0
        self.rewrites = 0

    # -------------------------------------------------------------- positioning

    def seek_end(self):
        """Start from the current end of the file (start-up after a backfill): old lines are not
        read again. The partial last line, if any, is read from its start so it is not lost."""
        self._close()
        if not self._open():
            return 0
        size = os.fstat(self._fd).st_size
        start = self._line_start_before(size)
        self._offset = start
        self._head = os.pread(self._fd, min(HEAD_BYTES, start), 0)
        return start

    def _line_start_before(self, size):
        """Offset just after the last newline at or before `size` (0 when there is none)."""
        pos = size
        while pos > 0:
            n = min(CHUNK, pos)
            block = os.pread(self._fd, n, pos - n)
            i = block.rfind(b"\n")
            if i >= 0:
                return pos - n + i + 1
            pos -= n
            if size - pos > self.max_line:
                return size   # an over-long partial line: skip it
        return 0

    # -------------------------------------------------------------- polling

    def poll(self):
        """Generator of the complete lines appended since the last poll."""
        if self._fd is None and not self._open():
            return
        try:
            st = os.stat(self.path)
            current = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            current = None   # moved away and not recreated yet: finish what we hold
        if current is not None and current != self._ino:
            yield from self._read_to_end()
            if self._adopt_if_extension():
                # An atomic rewrite that kept what we read (`once --results` appends by
                # copy + rename): carry on from the same offset in the new file.
                yield from self._read_to_end()
                return
            # Rename rotation: the old file is drained; then unread rotations, then the new file.
            yield from self._flush_partial("rotation")
            old = self._ino
            self._close()
            for rotated in self._unread_rotations(old):
                yield from self._read_whole(rotated)
            self.rotations += 1
            if not self._open():
                return
        elif self._truncated():
            # copytruncate: what was appended after our last poll and before the cut is in the
            # copy (path.1) if it was made from this file: finish from there, then start over.
            self.truncations += 1
            copy = self._copy_of_current()
            if copy is not None:
                yield from self._read_whole(copy, start=self._offset, partial=bytes(self._partial))
            self._partial.clear()
            self._skipping = False
            self._offset = 0
            self._head = b""
        yield from self._read_to_end()

    def _adopt_if_extension(self):
        """If the file now at `path` begins with exactly the bytes we read from the old one
        (same head, same bytes just before our offset), switch to it keeping our position."""
        try:
            fd = open_regular(self.path)
        except OSError:
            return False
        st = os.fstat(fd)
        n = min(HEAD_BYTES, self._offset)
        same = (self._offset > 0 and st.st_size >= self._offset
                and os.pread(fd, len(self._head), 0) == self._head
                and os.pread(fd, n, self._offset - n) == os.pread(self._fd, n, self._offset - n))
        if not same:
            os.close(fd)
            return False
        os.close(self._fd)
        self._fd, self._ino = fd, (st.st_dev, st.st_ino)
        self.rewrites += 1
        return True

    def _truncated(self):
        size = os.fstat(self._fd).st_size
        if size < self._offset:
            return True
        if self._head:
            now = os.pread(self._fd, len(self._head), 0)
            return now != self._head
        return False

    def _read_to_end(self):
        while True:
            data = os.pread(self._fd, CHUNK, self._offset)
            if not data:
                return
            self._offset += len(data)
            if len(self._head) < HEAD_BYTES:
                self._head = os.pread(self._fd, min(HEAD_BYTES, self._offset), 0)
            yield from self._split(data)

    def _split(self, data):
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                rest = data[start:]
                if self._skipping:
                    return
                if len(self._partial) + len(rest) > self.max_line:
                    self._partial.clear()
                    self._skipping = True
                    self.on_bad_line("line longer than %d bytes" % self.max_line)
                    return
                self._partial += rest
                return
            if self._skipping:
                self._skipping = False
            elif self._partial:
                self._partial += data[start:nl]
                if len(self._partial) > self.max_line:
                    self.on_bad_line("line longer than %d bytes" % self.max_line)
                else:
                    yield bytes(self._partial)
                self._partial.clear()
            elif nl - start > self.max_line:
                self.on_bad_line("line longer than %d bytes" % self.max_line)
            else:
                yield data[start:nl]
            start = nl + 1

    def _flush_partial(self, why):
        """A file that will not grow again: its unterminated last line is all there is of it."""
        if self._partial and not self._skipping:
            yield bytes(self._partial)
        self._partial.clear()
        self._skipping = False

    def _unread_rotations(self, old_ino):
        """Rotated files newer than the one we just finished (several rotations between polls),
        oldest first. Found by the finished file's inode among path.1 .. path.N."""
        found = []
        for i in range(1, MAX_ROTATED + 1):
            p = f"{self.path}.{i}"
            try:
                st = os.stat(p)
            except FileNotFoundError:
                break
            if (st.st_dev, st.st_ino) == old_ino:
                return list(reversed(found))
            found.append(p)
        return []   # our file is not among the rotations (deleted, other naming): nothing to add

    def _copy_of_current(self):
        """path.1 when it is a copy of what we were reading: same first bytes, at least as long."""
        if not self._head:
            return None
        p = f"{self.path}.1"
        try:
            with open(open_regular(p), "rb") as f:
                if f.read(len(self._head)) != self._head:
                    return None
                if os.fstat(f.fileno()).st_size < self._offset:
                    return None
        except OSError:
            return None
        return p

    def _read_whole(self, path, start=0, partial=b""):
        """Read a file that no longer grows from `start` to its end (a rotated file; a copy)."""
        try:
            fd = open_regular(path)
        except OSError:
            return
        saved = (self._fd, self._offset, self._head)
        self._fd, self._offset, self._head = fd, start, b"x" * HEAD_BYTES
        self._partial = bytearray(partial)
        try:
            yield from self._read_to_end()
            yield from self._flush_partial("rotation")
        finally:
            os.close(fd)
            self._fd, self._offset, self._head = saved

    # -------------------------------------------------------------- file handling

    def _open(self):
        try:
            fd = open_regular(self.path)
        except FileNotFoundError:
            return False
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EISDIR, errno.ENOTDIR, errno.EINVAL):
                raise
            return False
        st = os.fstat(fd)
        self._fd, self._ino, self._offset, self._head = fd, (st.st_dev, st.st_ino), 0, b""
        self._partial.clear()
        self._skipping = False
        return True

    def _close(self):
        if self._fd is not None:
            os.close(self._fd)
        self._fd = self._ino = None
        self._offset = 0

    def close(self):
        self._close()

    @property
    def offset(self):
        return self._offset


def read_lines_backwards(path, budget, end=None, chunk=CHUNK, max_line=MAX_LINE_BYTES):
    """Complete lines of `path` before byte `end` (default: the end), newest first, reading at
    most `budget` bytes.

    Used at start-up: the latest value of each series is near the end, so a huge log is never
    read whole. An unterminated last line (the writer is mid-record) is not returned: the
    tailer starts at its beginning and reads it once it is complete.
    """
    try:
        fd = open_regular(path)
    except OSError:
        return
    try:
        size = os.fstat(fd).st_size if end is None else min(end, os.fstat(fd).st_size)
        pos = size
        carry = b""
        in_partial = True               # the block's end belongs to a line we do not return
        while pos > 0 and size - pos < budget:
            n = min(chunk, pos)
            pos -= n
            block = os.pread(fd, n, pos) + carry
            lines = block.split(b"\n")
            carry = lines[0]            # may continue in the previous chunk
            tail = lines[1:]
            if in_partial:
                if not tail:
                    carry = carry if len(carry) <= max_line else b""
                    continue
                tail = tail[:-1]
                in_partial = False
            for line in reversed(tail):
                if line:
                    yield line
            if len(carry) > max_line:
                carry = b""             # an over-long line: skip the rest of it, like a partial
                in_partial = True
        if pos == 0 and carry and not in_partial:
            yield carry
    finally:
        os.close(fd)
