"""The one rotating, reopening append-only writer: the results log and mpi-output.log.

Every write is one write(2) of whole lines on an O_APPEND descriptor, so a reader never sees
half a record at the end of a file it has already read past. Rotation happens only between
writes and past `rotate_bytes`: the live file is renamed to `.1` (older ones shift to `.2` ...
`.N`, N = rotate_keep; the oldest past N is deleted) and a new live file is created. A line is
therefore in exactly one file.

The writer survives what an operator or logrotate does to its file: before each write it checks
(one stat) that `path` still names the file it holds open. Renamed away or deleted, it reopens
`path` and reports `log_reopened`; a write that went into a file deleted during the write is
written again. A rotation that fails (a name it cannot rename or delete) is reported as
`rotate_failed`, retried once the file has grown by a tenth of the limit, and writing goes on
in the file it has. There is always an open descriptor.

Reports go to `on_event(event, detail, **fields)`, called with the writer's lock held, after the
reopened file is in place: the results log writes them as event records (through `write_now`),
the daemon queues mpi-output.log's for the results log.
"""

import logging
import os
import threading

log = logging.getLogger("collbench.stress")


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class RotatingAppender:
    """Append bytes to `path`; rotate past `rotate_bytes` (0: never) keeping `rotate_keep` old
    files; reopen `path` when it is renamed or deleted under us. Thread-safe."""

    def __init__(self, path, rotate_bytes, rotate_keep, on_event=None, what="results log"):
        self.path = path
        self.rotate_bytes = rotate_bytes
        self.rotate_keep = rotate_keep
        self.on_event = on_event or (lambda event, detail, **fields: None)
        self.what = what                # how log messages name the file
        self.rotations = 0
        self.reopens = 0
        self.rotate_failures = 0
        self._rotate_retry_at = 0       # after a failed rotation: the size at which to try again
        self._lock = threading.RLock()
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
            # A crash mid-write can leave a line without its newline: end it, so the next line
            # starts on a line of its own (the fragment stays one unparsable line for readers).
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                write_all(fd, b"\n")
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
        with self._lock:
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
        """Reopen `path` if our file was renamed or deleted (also between writes, from a timer).

        True if it reopened. A path that cannot be opened leaves the old descriptor in use
        (logged); the next write tries again.
        """
        with self._lock:
            reason = self.moved()
            return self._reopen(reason) if reason else False

    def _reopen(self, reason, first=b""):
        """Open `path` anew; write `first` (what the deleted file swallowed), then report."""
        try:
            fd = self._open_new()
        except OSError as e:
            log.error("%s %s was %s and cannot be reopened: %s; still writing the old file",
                      self.what, self.path, reason, e)
            return False
        self._adopt(fd)
        self.reopens += 1
        if first:
            write_all(self._fd, first)
        log.warning("%s %s was %s while open: reopened it", self.what, self.path, reason)
        self.on_event("log_reopened", f"{self.path} was {reason} while open; reopened it and carried on",
                      file=self.path, reason=reason)
        return True

    # ------------------------------------------------------------------ writing

    @property
    def lock(self):
        """Held across check(), write_now() and finish_write() by a caller that numbers its lines."""
        return self._lock

    def write(self, data):
        """Append `data` (whole lines) with one write(2); rotate if past the size."""
        with self._lock:
            self.check()
            self.write_now(data)
            self.finish_write(data)

    def write_now(self, data):
        """Append `data` to the file held now: no check, no rotation (on_event's reports, or
        between check() and finish_write())."""
        with self._lock:
            write_all(self._fd, data)

    def finish_write(self, data):
        """After write_now(data): write it again if the file was deleted meanwhile; rotate."""
        with self._lock:
            if os.fstat(self._fd).st_nlink == 0:
                # deleted between the check and the write: the data went with the file
                self._reopen("deleted", first=data)
            self._maybe_rotate()

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
            log.error("cannot rotate %s %s: %s", self.what, self.path, e)
            self.on_event("rotate_failed", f"cannot rotate {self.path}: {e}; still writing to it, "
                                           "trying again later", file=self.path, error=str(e))
            return
        self._rotate_retry_at = 0

    def rotate(self):
        """Rename rotation: live -> .1 -> .2 ... -> .N; the oldest beyond N is deleted.

        Raises OSError if a rename or delete fails; the open descriptor is kept until the new
        live file is open, so writing goes on either way.
        """
        with self._lock:
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
                log.error("%s %s rotated but cannot be created again: %s", self.what, self.path, e)
                return
            self._adopt(fd)
