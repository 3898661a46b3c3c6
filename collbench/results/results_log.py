"""The stress daemon's results log: append-only JSON Lines with size-based rename rotation.

Contract (docs/LOG_FORMAT.md): every record is written with one write(2) of a whole
`\\n`-terminated line on an O_APPEND descriptor, so a reader never sees half a record at the
end of a file it has already read past. Rotation happens only between records: the live file
is renamed to `.1` (older ones shift to `.2` ... `.N`, the oldest past N is deleted) and a new
live file is created. A record is therefore in exactly one file, and `seq` (1, 2, 3 ...) runs
on without a gap or a repeat across rotations and across daemon restarts: on open, the log
resumes from the highest `seq` found at the end of the newest file that holds one.
"""

import logging
import os
import stat

from collbench.results.record_parser import MAX_LINE_BYTES, ParseError, parse_record
from collbench.results.records import dumps, event_record

log = logging.getLogger("collbench.stress")

# How far back from the end of a file to look for the last record's seq on open. Records are
# well under 4 KB; the window is generous so a burst of unparsable lines does not hide it.
_TAIL_WINDOW = 256 * 1024


class ResultsLog:
    """Append records to `path`, giving each the next `seq`; rotate past `rotate_bytes`.

    The log survives what an operator or logrotate does to it: before each record it checks
    (one stat) that `path` still names the file it holds open. Renamed away or deleted, it
    reopens `path` and writes a `log_reopened` event first; a record that went into a file
    deleted during the write is written again (same seq). A rotation that fails (a name it
    cannot rename or delete) becomes a `rotate_failed` event and the log keeps writing the
    file it has. There is always an open descriptor, and seq never skips or repeats.
    """

    def __init__(self, path, rotate_bytes, rotate_keep, event_fields=None):
        self.path = path
        self.rotate_bytes = rotate_bytes
        self.rotate_keep = rotate_keep
        # pid, run_id ... of the log's own events (log_reopened, rotate_failed)
        self.event_fields = dict(event_fields or {"pid": os.getpid()})
        self.rotations = 0
        self.reopens = 0
        self.rotate_failures = 0
        self.written = 0                # records written by this object, its own events included
        self._rotate_retry_at = 0       # after a failed rotation: the size at which to try again
        os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        self.last_seq = last_seq_in(self.rotated_paths(include_live=True))
        self._fd = None
        self._id = None                 # (st_dev, st_ino) of the file self._fd is
        self._adopt(self._open_new())

    # ------------------------------------------------------------------ files

    def rotated_paths(self, include_live=False):
        """Newest first: the live file (if asked), then .1, .2 ... .N that exist (as files)."""
        paths = [self.path] if include_live else []
        return paths + [f"{self.path}.{i}" for i in range(1, self.rotate_keep + 1)
                        if os.path.isfile(f"{self.path}.{i}")]

    def _open_new(self):
        """A descriptor on `path` (created, with its directory, if missing); raises OSError."""
        os.makedirs(os.path.dirname(os.path.abspath(self.path)) or ".", exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            # A crash mid-write can leave a line without its newline: end it, so the next record
            # starts on a line of its own (the fragment stays one unparsable line for readers).
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                _write_all(fd, b"\n")
        except OSError:
            os.close(fd)
            raise
        return fd

    def _adopt(self, fd):
        """Write to fd from now on; close the previous descriptor (never before: no moment without one)."""
        st = os.fstat(fd)
        old, self._fd, self._id = self._fd, fd, (st.st_dev, st.st_ino)
        if old is not None:
            os.close(old)

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ renamed or deleted under us

    def moved(self):
        """None while `path` is the file we write; else 'deleted' or 'renamed' (what became of ours)."""
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._id:
                return None
        except FileNotFoundError:
            pass
        except OSError:
            return None              # cannot tell (permissions, I/O): keep writing what we have
        return "deleted" if os.fstat(self._fd).st_nlink == 0 else "renamed"

    def check(self):
        """Reopen `path` if our file was renamed or deleted (also between records, from a timer).

        True if it reopened. A path that cannot be opened leaves the old descriptor in use
        (logged); the next record tries again.
        """
        reason = self.moved()
        return self._reopen(reason) if reason else False

    def _reopen(self, reason, first=b""):
        """Open `path` anew; write `first` (a record the deleted file swallowed), then the event."""
        try:
            fd = self._open_new()
        except OSError as e:
            log.error("results log %s was %s and cannot be reopened: %s; still writing the old file",
                      self.path, reason, e)
            return False
        self._adopt(fd)
        self.reopens += 1
        if first:
            _write_all(self._fd, first)
        log.warning("results log %s was %s under the daemon: reopened it", self.path, reason)
        self._write(event_record("log_reopened", detail=f"{self.path} was {reason} while open; "
                                                        "reopened it and carried on",
                                 file=self.path, reason=reason, **self.event_fields))
        return True

    # ------------------------------------------------------------------ writing

    def append(self, record):
        """Give `record` the next seq, write it as one line, flush; rotate if past the size.

        Returns the record (with seq). The caller's dict is updated in place.
        """
        self.check()
        data = self._write(record)
        if os.fstat(self._fd).st_nlink == 0:
            # deleted between the check and the write: the record went with the file
            self._reopen("deleted", first=data)
        self._maybe_rotate()
        return record

    def _write(self, record):
        record["seq"] = self.last_seq + 1
        data = (dumps(record) + "\n").encode("utf-8")
        _write_all(self._fd, data)
        self.last_seq = record["seq"]
        self.written += 1
        return data

    def _maybe_rotate(self):
        if not self.rotate_bytes:
            return
        size = os.fstat(self._fd).st_size
        if size < max(self.rotate_bytes, self._rotate_retry_at):
            return
        try:
            self.rotate()
        except OSError as e:
            # Keep writing the file we have; try again once it has grown by a tenth of the limit.
            self._rotate_retry_at = size + max(self.rotate_bytes // 10, 4096)
            self.rotate_failures += 1
            log.error("cannot rotate results log %s: %s", self.path, e)
            self._write(event_record("rotate_failed", detail=f"cannot rotate {self.path}: {e}; still "
                                                             "writing to it, trying again later",
                                     file=self.path, error=str(e), **self.event_fields))
            return
        self._rotate_retry_at = 0

    def rotate(self):
        """Rename rotation: live -> .1 -> .2 ... -> .N; the oldest beyond N is deleted.

        Raises OSError if a rename or delete fails; the open descriptor is kept until the new
        live file is open, so writing goes on either way.
        """
        if self.moved():     # someone moved our file already: start a new one, rename nothing
            self.check()
            return
        keep = self.rotate_keep
        existing = 0                       # .1 ... .existing exist (a contiguous run)
        while os.path.lexists(f"{self.path}.{existing + 1}"):
            existing += 1
        for i in range(existing, keep - 1, -1):   # past the kept count (also after keep shrank)
            if i >= 1:
                os.unlink(f"{self.path}.{i}")
        if keep == 0:
            os.unlink(self.path)
        else:
            for i in range(min(existing, keep - 1), 0, -1):   # oldest first: no name is overwritten
                os.rename(f"{self.path}.{i}", f"{self.path}.{i + 1}")
            os.rename(self.path, f"{self.path}.1")
        self.rotations += 1
        try:
            fd = self._open_new()
        except OSError as e:     # renamed but no new file: keep the old one; the next check retries
            log.error("results log %s rotated but cannot be created again: %s", self.path, e)
            return
        self._adopt(fd)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# ------------------------------------------------------------------ reading
#
# Every reader parses lines with collbench.results.record_parser (the one validator) and reads in
# bounded chunks: a line longer than MAX_LINE_BYTES is reported and skipped, never held whole.
# `on_bad(path, offset, reason)`, when given, is called once for every line that is not a
# record (offset: the line's first byte in that file). A last line without its newline is still
# being written: it is not a line yet, and not reported.

_BLOCK = 64 * 1024
_OVERLONG = f"line longer than {MAX_LINE_BYTES} bytes"


def _open_log(path):
    """`path` opened for reading if it is a regular file, else None (missing, a directory, a
    FIFO: O_NONBLOCK, so a FIFO in the log's place cannot block a reader in open(2))."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


class _LineSplitter:
    """Complete lines out of a stream of chunks, as (offset, bytes) -- or (offset, ParseError)
    for an over-long line, whose bytes are dropped as they come."""

    def __init__(self, offset=0):
        self.offset = offset      # file offset of the first byte not yet consumed
        self._buf = bytearray()
        self._start = offset      # file offset of _buf's first byte (or of the skipped line)
        self._skipping = False

    def feed(self, data):
        out = []
        pos = 0
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                rest = len(data) - pos
                if not self._skipping:
                    if len(self._buf) + rest > MAX_LINE_BYTES:
                        self._buf.clear()
                        self._skipping = True
                        out.append((self._start, ParseError(_OVERLONG)))
                    else:
                        self._buf += data[pos:]
                self.offset += len(data)
                return out
            if self._skipping:
                self._skipping = False
            else:
                if len(self._buf) + nl - pos > MAX_LINE_BYTES:
                    out.append((self._start, ParseError(_OVERLONG)))
                else:
                    self._buf += data[pos:nl]
                    out.append((self._start, bytes(self._buf)))
            self._buf.clear()
            self._start = self.offset + nl + 1
            pos = nl + 1

    @property
    def pending(self):
        """Bytes held of an unterminated line (0 while skipping an over-long one)."""
        return len(self._buf)


def _parsed(path, items, on_bad):
    """Records of (offset, line) items, reporting the bad ones."""
    out = []
    for offset, line in items:
        rec = line if isinstance(line, ParseError) else parse_record(line)
        if isinstance(rec, ParseError):
            if on_bad is not None:
                on_bad(path, offset, rec.reason)
        else:
            out.append(rec)
    return out


def _lines_backwards(f, end, block=_BLOCK):
    """(offset, line) of the complete lines of open file `f` before byte `end`, newest first;
    an over-long line is (offset, ParseError). The unterminated piece after the last newline is
    left out. Memory: one block plus at most MAX_LINE_BYTES of a line."""
    pos = end
    carry = b""               # the first bytes of this block: the end of a line begun before it
    tail_piece = True         # carry is the unterminated end of the file: not a line
    overlong = False          # carry was dropped: the line it belongs to is too long
    while pos > 0:
        n = min(block, pos)
        pos -= n
        f.seek(pos)
        data = f.read(n)
        parts = data.split(b"\n")
        if len(parts) == 1:   # no newline in this block: the line goes on
            if not overlong:
                carry = data + carry
                if len(carry) > MAX_LINE_BYTES:
                    carry, overlong = b"", True
            continue
        # parts[-1] + carry is a whole line that starts just after this block's last newline
        last_start = pos + len(data) - len(parts[-1])
        if tail_piece:
            tail_piece = False
        elif overlong or len(parts[-1]) + len(carry) > MAX_LINE_BYTES:
            yield last_start, ParseError(_OVERLONG)
        else:
            yield last_start, parts[-1] + carry
        overlong = False
        offset = last_start - 1
        for piece in reversed(parts[1:-1]):
            offset -= len(piece)
            yield offset, (piece if len(piece) <= MAX_LINE_BYTES else ParseError(_OVERLONG))
            offset -= 1
        carry = parts[0]
        if len(carry) > MAX_LINE_BYTES:
            carry, overlong = b"", True
    if not tail_piece:        # the first line of the file
        yield 0, (ParseError(_OVERLONG) if overlong else carry)


def last_seq_in(paths):
    """The highest seq at the end of the first file (newest first) that holds one; 0 if none."""
    for path in paths:
        seq = _last_seq_of_file(path)
        if seq is not None:
            return seq
    return 0


def _last_seq_of_file(path):
    """The highest seq among the valid records of the last _TAIL_WINDOW bytes; further back
    (one pass, bounded memory) only when that window holds no valid record at all -- a burst of
    garbage must not make the daemon reuse old sequence numbers."""
    f = _open_log(path)
    if f is None:
        return None
    best = None
    with f:
        size = os.fstat(f.fileno()).st_size
        for offset, line in _lines_backwards(f, size):
            if best is not None and size - offset > _TAIL_WINDOW:
                break
            rec = line if isinstance(line, ParseError) else parse_record(line)
            if not isinstance(rec, ParseError) and "seq" in rec:
                best = rec["seq"] if best is None else max(best, rec["seq"])
    return best


def read_records(path, rotate_keep=64, on_bad=None):
    """Every record of a log and its rotations, oldest first (for status, `log`, tests)."""
    files = [f"{path}.{i}" for i in range(rotate_keep, 0, -1) if os.path.exists(f"{path}.{i}")]
    if os.path.exists(path):
        files.append(path)
    out = []
    for p in files:
        f = _open_log(p)
        if f is None:
            continue
        with f:
            splitter = _LineSplitter()
            while True:
                data = f.read(_BLOCK)
                if not data:
                    break
                out += _parsed(p, splitter.feed(data), on_bad)
    return out


def tail_records(path, count, max_files=8, on_bad=None, max_bytes=None):
    """The last `count` records (oldest first), reading back through rotations as needed, and
    at most `max_bytes` of them (None: no limit). Bad lines met on the way are reported."""
    out = []
    budget = [max_bytes]
    paths = [path] + [f"{path}.{i}" for i in range(1, max_files)]
    for p in paths:
        if not os.path.exists(p):
            if p == path:
                continue
            break
        recs = _tail_file(p, count - len(out), on_bad, budget)
        out = recs + out
        if len(out) >= count or budget[0] is not None and budget[0] <= 0:
            break
    return out[-count:] if count else []


def _tail_file(path, count, on_bad=None, budget=None):
    """Up to the last `count` records of one file, read backwards in blocks."""
    if count <= 0:
        return []
    recs = []
    bad = []
    f = _open_log(path)
    if f is None:
        return []
    with f:
        size = os.fstat(f.fileno()).st_size
        for offset, line in _lines_backwards(f, size):
            if budget is not None and budget[0] is not None and budget[0] - (size - offset) < 0:
                budget[0] = 0     # spent: no older file is read either
                break
            rec = line if isinstance(line, ParseError) else parse_record(line)
            if isinstance(rec, ParseError):
                bad.append((offset, rec.reason))
            else:
                recs.append(rec)
                if len(recs) >= count:
                    break
        else:
            offset = 0
        if budget is not None and budget[0]:
            budget[0] -= size - offset
    if on_bad is not None:
        for offset, reason in reversed(bad):
            on_bad(path, offset, reason)
    recs.reverse()
    return recs


class LogFollower:
    """Read records as they are appended, across rename rotations, each exactly once.

    A reader slower than the rotation rate can find the live file rotated several times since
    it last looked. So on rotation the follower does not jump to the live file: it finishes
    the file it had open (the writer never touches it again), then opens the file that came
    next in the chain (the one now at `.k-1` if ours is at `.k`, found by inode), and so on up
    to the live file. Records whose seq it has already passed are skipped, so a chain it cannot
    reconstruct (files deleted past rotate_keep) still yields no duplicates.
    """

    def __init__(self, path, from_start=False, on_bad=None):
        self.path = path
        self.on_bad = on_bad      # on_bad(path, offset, reason) for each line that is not a record
        self.last_seq = None
        self._f = None
        self._ino = None
        self._opened = None       # the name the open file had when it was opened
        self._split = _LineSplitter()
        if os.path.exists(path):
            self._open(path, seek_end=not from_start)

    def _open(self, path, seek_end=False, expect_ino=None):
        f = _open_log(path)
        if f is None:
            return False
        ino = os.fstat(f.fileno()).st_ino
        if expect_ino is not None and ino != expect_ino:
            f.close()           # renamed under us: the caller rescans
            return False
        if self._f is not None:
            self._f.close()
        self._f, self._ino, self._opened = f, ino, path
        self._split = _LineSplitter(f.seek(0, os.SEEK_END) if seek_end else 0)
        return True

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None

    def _drain(self, out):
        got = False
        while True:
            chunk = self._f.read(_BLOCK)
            if not chunk:
                return got
            got = True
            for rec in _parsed(self._opened, self._split.feed(chunk), self.on_bad):
                seq = rec.get("seq")
                if seq is not None:
                    if self.last_seq is not None and seq <= self.last_seq:
                        continue
                    self.last_seq = seq
                out.append(rec)

    def _chain(self):
        """[(path, inode)] newest first: the live file, .1, .2 ... as they exist right now.

        A rotation in progress renames .k -> .k+1 from the oldest down, so one index can be
        briefly missing: the scan steps over a single gap and stops at two.
        """
        chain, missing = [], 0
        for i in range(0, 1 << 20):
            p = self.path if i == 0 else f"{self.path}.{i}"
            try:
                chain.append((p, os.stat(p).st_ino))
                missing = 0
            except FileNotFoundError:
                missing += 1
                if missing >= 2:
                    break
        return chain

    def _first_seq(self, path):
        try:
            f = _open_log(path)
            if f is None:
                return None
            with f:
                rec = parse_record(f.readline(MAX_LINE_BYTES + 1))
        except OSError:
            return None
        return None if isinstance(rec, ParseError) else rec.get("seq")

    def poll(self):
        """Every record appended since the last call (possibly none)."""
        out = []
        for _ in range(1 << 16):    # one file of the chain per round; bounded
            if self._f is None:
                if not self._open(self.path):
                    return out
            self._drain(out)
            chain = self._chain()
            if not chain or chain[0][0] != self.path:
                return out          # between a rename and the new live file: next poll
            if chain[0][1] == self._ino:
                return out          # we hold the live file and have read all of it
            self._drain(out)        # anything written before the rename
            inodes = [ino for _p, ino in chain]
            deleted = os.fstat(self._f.fileno()).st_nlink == 0
            if self._ino in inodes and inodes.index(self._ino) > 0:
                nxt_path, nxt_ino = chain[inodes.index(self._ino) - 1]
            elif deleted:           # ours went past rotate_keep: the oldest file left
                nxt_path, nxt_ino = chain[-1]
            else:
                return out          # caught mid-rotation: look again next poll
            first = self._first_seq(nxt_path)
            if (not deleted and first is not None and self.last_seq is not None
                    and first > self.last_seq + 1):
                return out          # the scan raced a rotation and overshot: next poll
            self._open(nxt_path, expect_ino=nxt_ino)
        return out
