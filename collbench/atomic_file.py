"""The one writer for every output flag (-o, --results, --tsv, --out-dir, --png, ...).

What a path names decides how it is written:
- a regular file (or a new name): replaced atomically (a temporary file beside it, fsync'd,
  renamed over it), so a reader (Prometheus reloading rules, a person) sees the old content or
  the new, never half of either; appending (`append_lines`) appends in place, never reading or
  rewriting what is there, and a failed append is cut back to the old size;
- a character device (/dev/null, /dev/stdout, a terminal) or a FIFO: written through, never
  replaced (as root, `-o /dev/null` must leave /dev/null a device). A FIFO without a reader is
  waited for a bounded time (FIFO_WAIT_S), then refused with a clear error;
- a symlink: its target is written (as a shell's `>` does); the link itself stays;
- an open descriptor named as a path (/dev/stdout, /dev/fd/N): written through, appending;
- anything else (a directory, a socket, a block device): refused, exit 2, naming the path.

A set of files (`FileSet`: topo map --out-dir, report --png) is all or nothing: every member is
written to a temporary file first, and only when all of them are complete are they renamed.
`Outputs` lets a verb that measured something write every output it can, print its table, and
only then fail (exit 2) naming each file that could not be written.
"""

import errno
import fcntl
import os
import re
import stat
import sys
import tempfile
import time

from collbench import signals
from collbench.bounded_file import FIFO_POLL_S, FIFO_WAIT_S
from collbench.errors import UserError


class OutputError(UserError):
    """An output file that could not be written (exit 2); names the flag and the path."""

    def __init__(self, flag, path, reason):
        self.flag = flag
        self.path = path
        self.reason = reason
        super().__init__(f"{flag} {path}: cannot write: {reason}")


class NotWritableTarget(OSError):
    """The path names something that is never written (a directory, a socket, a block device)."""


# ---------------------------------------------------------------------------------------------
# what a path names


# an already open descriptor named as a path (`-o /dev/stdout`, `/dev/fd/3`): written through
# with O_APPEND, so a shell's `>>` file is appended to and a `>` file is not replaced behind it
_FD_PATH = re.compile(r"^/(dev/(stdout|stderr|fd/[0-9]+)|proc/(self|thread-self|[0-9]+)/fd/[0-9]+)$")


def _kind(path):
    """('new'|'regular'|'chardev'|'fifo'|'descriptor', the path to write); NotWritableTarget for
    anything else. A symlink is followed: its target is what gets written."""
    try:
        st = os.stat(path)  # follows symlinks (and /proc's descriptor links)
    except FileNotFoundError:
        return "new", os.path.realpath(path)  # a new name, or a symlink to one
    mode = st.st_mode
    if _FD_PATH.match(path) and (stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)
                                 or stat.S_ISSOCK(mode)):
        return "descriptor", path
    if stat.S_ISREG(mode):
        return "regular", os.path.realpath(path)
    if stat.S_ISCHR(mode):
        return "chardev", path
    if stat.S_ISFIFO(mode):
        return "fifo", path
    what = ("is a directory" if stat.S_ISDIR(mode) else "is a block device" if stat.S_ISBLK(mode)
            else "is a socket" if stat.S_ISSOCK(mode) else "is not a regular file")
    raise NotWritableTarget(errno.EINVAL, f"{what} (expected a regular file, a character device or a FIFO)", path)


def check_writable(path, flag, append=False):
    """Fail before a run (UserError, exit 2) if path cannot be written, so nothing measured is
    lost at the end; its absolute path. A character device or FIFO passes (it is written
    through); a symlink is checked at its target. `append` is kept for callers: appending no
    longer reads the file."""
    path = os.path.abspath(path)
    try:
        kind, real = _kind(path)
    except NotWritableTarget as e:
        raise UserError(f"{flag} {path}: {e.strerror}") from None
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot write: {e.strerror}") from None
    if kind in ("chardev", "fifo", "descriptor"):
        if not os.access(real, os.W_OK):
            raise UserError(f"{flag} {path}: is not writable")
        return path
    parent = os.path.dirname(real)
    if not os.path.isdir(parent):
        raise UserError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: directory {parent} is not writable")
    return path


# ---------------------------------------------------------------------------------------------
# low-level pieces


def _chunks(data):
    """str/bytes or an iterable of them -> bytes chunks."""
    if isinstance(data, (str, bytes, bytearray)):
        data = [data]
    for chunk in data:
        yield chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)


def _fsync_dir(parent):
    try:  # make a rename durable
        dfd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _open_through(real, kind, fifo_wait_s=None):
    """An fd writing through a character device or FIFO (never creating or truncating it). A FIFO
    without a reader is waited for at most fifo_wait_s (ENXIO until one opens it)."""
    wait = FIFO_WAIT_S if fifo_wait_s is None else fifo_wait_s
    deadline = time.monotonic() + wait
    append = os.O_APPEND if kind == "descriptor" else 0
    while True:
        try:
            fd = os.open(real, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | append)
            break
        except OSError as e:
            if kind != "fifo" or e.errno != errno.ENXIO:
                raise
            if time.monotonic() >= deadline:
                raise OSError(errno.ENXIO, f"FIFO has no reader (waited {wait:g} s)", real) from None
            time.sleep(FIFO_POLL_S)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)  # a reader is there: ordinary writes
    return fd


def _write_fd(fd, data):
    with os.fdopen(fd, "wb", closefd=True) as out:
        for chunk in _chunks(data):
            out.write(chunk)
        out.flush()


def _write_temp(real, data):
    """A complete, fsync'd temporary file beside real holding data; its path. Keeps an existing
    file's permission bits."""
    parent = os.path.dirname(real)
    try:
        mode = os.stat(real).st_mode & 0o7777
    except OSError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(real)}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in _chunks(data):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        _remove(tmp)
        raise
    return tmp


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _append_regular(real, data):
    flags = os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(real, flags | os.O_CREAT | os.O_EXCL, 0o644)
        created = True  # a failed append removes it again: nothing half-written, not even empty
    except FileExistsError:
        fd = os.open(real, flags)
        created = False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced by something else since it was looked at
            os.close(fd)
            fd = None
            return _write_file(real, data, append=True)
        size = st.st_size
        prefix = b""
        if size:
            try:  # a previous writer's torn last line stays on its own line: read one byte
                with open(real, "rb") as old:
                    old.seek(size - 1)
                    if old.read(1) != b"\n":
                        prefix = b"\n"
            except OSError:
                pass
        try:
            out = os.fdopen(fd, "wb", closefd=False)
            try:
                if prefix:
                    out.write(prefix)
                for chunk in _chunks(data):
                    out.write(chunk)
                out.flush()
            finally:
                try:
                    out.close()
                except OSError:
                    pass
            os.fsync(fd)
        except BaseException:
            try:  # nothing half-appended: cut back to the old size
                os.ftruncate(fd, size)
                if created:
                    os.unlink(real)
            except OSError:
                pass
            raise
    finally:
        if fd is not None:
            os.close(fd)
    return real


def _write_file(path, data, append=False, fifo_wait_s=None):
    """Write (or append) data to path by what it names (see the module docstring); the path
    written (a symlink's target). OSError when it cannot be."""
    kind, real = _kind(os.path.abspath(path))
    if kind in ("chardev", "fifo", "descriptor"):
        _write_fd(_open_through(real, kind, fifo_wait_s), data)
        return real
    with signals.writer_dies_cleanly():
        if append:
            return _append_regular(real, data)
        tmp = _write_temp(real, data)
        try:
            os.replace(tmp, real)
        except BaseException:
            _remove(tmp)
            raise
    _fsync_dir(os.path.dirname(real))
    return real


def _reason(e):
    return e.strerror or str(e)


# ---------------------------------------------------------------------------------------------
# the public API


def write_atomic(path, chunks, keep_existing=False):
    """Write the chunks (str, or bytes for binary files) to path; its absolute path (a symlink's
    target). OSError if it cannot be written. Kept for callers that handle OSError themselves;
    new code uses write_output / append_lines.

    keep_existing: append in place (the old content is never read or rewritten).
    """
    return _write_file(path, chunks, append=keep_existing)


def write_output(path, data, flag="-o", fifo_wait_s=None):
    """A command's output: to stdout when path is None or '-', else to path as described above
    (atomic replace of a regular file; written through a device or FIFO). data: str, bytes or an
    iterable of them. OutputError (exit 2) naming the flag and the path if it cannot be written;
    the path written otherwise."""
    if path in (None, "-"):
        for chunk in _chunks(data):
            if hasattr(sys.stdout, "buffer"):
                sys.stdout.flush()
                sys.stdout.buffer.write(chunk)
            else:
                sys.stdout.write(chunk.decode("utf-8", "replace"))
        sys.stdout.flush()
        return None
    try:
        return _write_file(path, data, fifo_wait_s=fifo_wait_s)
    except OSError as e:
        raise OutputError(flag, path, _reason(e)) from None


def append_lines(path, lines, flag="--results", fifo_wait_s=None):
    """Append lines (str or bytes, each ending in a newline) to path in place: the existing
    content is never read or rewritten (a 1 GB results log costs nothing), a torn last line of a
    previous writer is ended first, and a failed append (a full disk) is cut back to the old
    size. A device or FIFO is written through. OutputError (exit 2) naming flag and path."""
    try:
        return _write_file(path, lines, append=True, fifo_wait_s=fifo_wait_s)
    except OSError as e:
        raise OutputError(flag, path, _reason(e)) from None


class FileSet:
    """Files that belong together (topo map --out-dir, report -o with its --png charts): all are
    written or none is. `add` each member, then `commit()`: every regular member is written to a
    temporary file beside it; only when all are complete are they renamed over the old ones (a
    failure removes the temporaries and keeps the old set whole). Devices and FIFOs in a set are
    written through after the regular members are in place.

        files = FileSet("--out-dir")
        files.add(path, text)
        written = files.commit()    # {path: written path}; OutputError naming the failed file
    """

    def __init__(self, flag):
        self.flag = flag
        self.members = []  # (path, data)

    def add(self, path, data, flag=None):
        self.members.append((path, data, flag or self.flag))
        return path

    def commit(self):
        staged, through, written = [], [], {}
        with signals.writer_dies_cleanly():
            try:
                for path, data, flag in self.members:
                    try:
                        kind, real = _kind(os.path.abspath(path))
                        if kind in ("chardev", "fifo", "descriptor"):
                            through.append((path, data, flag))
                            continue
                        staged.append((path, real, _write_temp(real, data), flag))
                    except OSError as e:
                        raise OutputError(flag, path, _reason(e)) from None
                for i, (path, real, tmp, flag) in enumerate(staged):
                    try:
                        os.replace(tmp, real)
                    except OSError as e:
                        raise OutputError(flag, path, f"{_reason(e)} (renamed before it: "
                                          f"{', '.join(p for p, *_ in staged[:i]) or 'none'})") from None
                    written[path] = real
            finally:
                for _path, _real, tmp, _flag in staged:
                    if os.path.lexists(tmp):
                        _remove(tmp)
        for parent in {os.path.dirname(real) for _p, real, _t, _f in staged}:
            _fsync_dir(parent)
        for path, data, flag in through:
            written[path] = write_output(path, data, flag)
        return written


class Outputs:
    """Every output of one measurement, written as far as possible: a failure is recorded (and
    the rest still written) so the verb can print its table, then `raise_if_failed()` exits 2
    naming each file that failed.

        outs = Outputs()
        outs.append(results_path, lines, "--results")
        outs.write(tsv_path, text, "--tsv")
        print(table)
        outs.raise_if_failed()
    """

    def __init__(self):
        self.failed = []  # OutputError

    def _try(self, fn, *args):
        try:
            return fn(*args)
        except OutputError as e:
            self.failed.append(e)
            return None

    def write(self, path, data, flag="-o"):
        return self._try(write_output, path, data, flag)

    def append(self, path, lines, flag="--results"):
        return self._try(append_lines, path, lines, flag)

    def commit(self, fileset):
        return self._try(fileset.commit)

    def run(self, fn, *args, flag=None, path=None):
        """fn(*args), an output step of the verb's own; a UserError it raises is recorded, and so
        is an OSError (as OutputError naming flag and path)."""
        try:
            return fn(*args)
        except UserError as e:
            self.failed.append(e)
        except OSError as e:
            self.failed.append(OutputError(flag or "output", path or e.filename or "?", _reason(e)))
        return None

    def raise_if_failed(self):
        if not self.failed:
            return
        if len(self.failed) == 1:
            raise self.failed[0]
        raise UserError("; ".join(str(e) for e in self.failed))
