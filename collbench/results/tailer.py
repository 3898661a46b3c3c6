"""Incremental tail of the results log: each poll reads only the bytes appended since the last one.

Handles what a log the exporter does not own can do between two polls:
- not exist yet (or disappear): nothing to read, try again next poll;
- rename rotation (results.jsonl -> results.jsonl.1, a new results.jsonl): the old file is
  read to its end through the descriptor still open on it, then any rotated file that was never
  read (more than one rotation between polls), then the new file from its start;
- copytruncate (same inode cut to 0, maybe already regrown past our offset): detected by the
  size going below our offset, or by the bytes before our offset no longer being the ones we
  read (ReadFingerprint: the file's first bytes and the last 4 KiB we read, which end with the
  last record's seq) -- the first line alone is not enough: a file rewritten within the same
  millisecond starts with the same bytes. Checked before each poll and again before each chunk
  is used, so a cut made while we read is not taken for new lines. The file is re-read from 0;
- an atomic rewrite that keeps the old content (copy + rename, as `once --results` appends):
  recognised by the new file starting with the bytes already read, and continued from there;
- a partial last line (the writer is mid-record): kept until its newline arrives;
- an over-long line: dropped (reported as a bad line), never held in memory past `max_line`;
- something other than a regular file at the path (a FIFO, a device): an OSError, never a
  read that blocks the poller (files are opened O_NONBLOCK and checked before reading).

Cost per poll is a stat, an fstat and two small preads (the fingerprint) per check, and reading
the new bytes in fixed-size chunks; memory is one chunk plus the partial line.
"""

import errno
import os

from collbench.results.lines import LineSplitter, ReadFingerprint, open_regular
from collbench.results.record_parser import MAX_LINE_BYTES, ParseError

CHUNK = 1 << 20
MAX_ROTATED = 32          # rotated siblings (path.1 .. path.N) searched after a rename rotation


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
        self._seen = ReadFingerprint()   # what we read of the open file: its start, and up to _offset
        self._cut = False         # a chunk was refused: the file was truncated while we read
        self._lines = LineSplitter(0, max_line)   # holds the partial last line
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
        self._lines.reset(start)
        self._seen.load(self._fd, start)
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
            yield from self._read_to_end(check=False)   # renamed away: nobody cuts it now
            if self._adopt_if_extension():
                # An atomic rewrite that kept what we read (`once --results` appends by
                # copy + rename): carry on from the same offset in the new file.
                yield from self._read_to_end(check=False)
                return
            # Rename rotation: the old file is drained; then unread rotations, then the new file.
            yield from self._flush_partial()
            old = self._ino
            self._close()
            for rotated in self._unread_rotations(old):
                yield from self._read_whole(rotated)
            self.rotations += 1
            if not self._open():
                return
        elif self._truncated():
            yield from self._start_over()
        for _ in range(2):
            yield from self._read_to_end()
            if not self._cut:
                return
            yield from self._start_over()     # cut while we read: the next poll goes on if cut again

    def _start_over(self):
        """copytruncate: what was appended after our last read and before the cut is in the copy
        (path.1) if it was made from this file: finish from there, then read the file from 0."""
        self.truncations += 1
        self._cut = False
        copy = self._copy_of_current()
        if copy is not None:
            yield from self._read_whole(copy, start=self._offset, splitter=self._lines)
        self._lines.reset(0)
        self._offset = 0
        self._seen.reset()

    def _adopt_if_extension(self):
        """If the file now at `path` begins with exactly the bytes we read from the old one
        (same head, same bytes just before our offset), switch to it keeping our position."""
        try:
            fd = open_regular(self.path)
        except OSError:
            return False
        st = os.fstat(fd)
        if not (self._offset > 0 and self._seen.matches(fd, self._offset)):
            os.close(fd)
            return False
        os.close(self._fd)
        self._fd, self._ino = fd, (st.st_dev, st.st_ino)
        self.rewrites += 1
        return True

    def _truncated(self):
        return not self._seen.matches(self._fd, self._offset)

    def _read_to_end(self, check=True):
        """Read the open file from our offset to its end. `check`: before a chunk is used, the
        bytes before it must still be the ones we read (else it may be the middle of what a
        truncation's writer wrote: refused, and _cut set)."""
        while True:
            data = os.pread(self._fd, CHUNK, self._offset)
            if not data:
                return
            if check and not self._seen.matches(self._fd, self._offset):
                self._cut = True
                return
            self._offset += len(data)
            self._seen.consumed(self._fd, data, self._offset)
            yield from self._split(data)

    def _split(self, data):
        for _offset, line in self._lines.feed(data):
            if isinstance(line, ParseError):
                self.on_bad_line(line.reason)
            else:
                yield line

    def _flush_partial(self):
        """A file that will not grow again: its unterminated last line is all there is of it."""
        last = self._lines.take_pending()
        if last is not None:
            yield last[1]

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
        """path.1 when it is a copy of what we were reading: at least as long, and holding the
        bytes we read (first bytes and those just before our offset) where we read them -- an
        older rotation that merely starts alike must not be read from our offset."""
        if self._offset == 0:
            return None
        p = f"{self.path}.1"
        try:
            fd = open_regular(p)
        except OSError:
            return None
        try:
            return p if self._seen.matches(fd, self._offset) else None
        except OSError:
            return None
        finally:
            os.close(fd)

    def _read_whole(self, path, start=0, splitter=None):
        """Read a file that no longer grows from `start` to its end (a rotated file; a copy),
        continuing the partial line `splitter` holds (a copy of the file we were reading)."""
        try:
            fd = open_regular(path)
        except OSError:
            return
        saved = (self._fd, self._offset, self._seen, self._lines)
        self._fd, self._offset, self._seen = fd, start, ReadFingerprint()
        self._lines = splitter or LineSplitter(start, self.max_line)
        try:
            yield from self._read_to_end(check=False)
            yield from self._flush_partial()
        finally:
            os.close(fd)
            self._fd, self._offset, self._seen, self._lines = saved

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
        self._fd, self._ino, self._offset = fd, (st.st_dev, st.st_ino), 0
        self._seen.reset()
        self._lines.reset(0)
        return True

    def _close(self):
        if self._fd is not None:
            os.close(self._fd)
        self._fd = self._ino = None
        self._offset = 0
        self._seen.reset()

    def close(self):
        self._close()

    @property
    def offset(self):
        return self._offset
