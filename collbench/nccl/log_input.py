"""Where the log bytes come from: files, directories (recursively), gzip, stdin; read in blocks
that end at a line boundary, with a cap on line length so that no input can exhaust memory.

Named files must be NCCL-ish text: a binary file, an unreadable file or a broken gzip header is a
`LogInputError` (exit 2) naming the file and what actually happened (a symlink loop, a directory
that cannot be listed, a gzip file cut before its first line, a full $TMPDIR). Inside a directory
such files are skipped with a warning, because a job's log directory holds other things too. stdin
and pipes are spooled to a temporary file while they are read, so that a second pass (locating a
desync) can read them again. A FIFO is opened without blocking: one that no process opens for
writing within FIFO_WAIT_S is an error, not a hang.
"""

import errno
import os
import stat
import sys
import tempfile
import time
import zlib

from collbench.bounded_file import FIFO_POLL_S, FIFO_WAIT_S
from collbench.errors import UserError
from collbench.nccl.log_parser import join_wrapped, wrapped_tail

BLOCK = 1 << 20             # bytes per read, processed as one unit (bigger blocks fall out of the CPU caches)
MAX_LINE = 64 << 10         # longer lines are cut here (the rest of the line is dropped and counted)
SNIFF = 8192                # NUL bytes in the first SNIFF bytes mean a binary file
GZIP_MAGIC = b"\x1f\x8b"


class LogInputError(UserError):
    """A named input cannot be read as a log."""


class Source:
    """One input: `name` for messages, `open()` returns a binary file object (decompressed)."""

    def __init__(self, name, path=None, explicit=True, stream=False):
        self.name = name
        self.path = path                # None for stdin
        self.explicit = explicit        # named on the command line (errors) or found in a directory (warnings)
        self.stream = stream or path is None    # read once (stdin, a pipe such as <(zcat ...)): spooled
        self.spool = None               # the stream's copy, after the first pass
        self.compressed = False

    def open(self):
        if self.stream:
            if self.spool is not None:
                return open(self.spool, "rb")
            if self.path is None:
                _check_stdin()
                raw = sys.stdin.buffer
            else:
                raw = open_stream(self.path, self.name)
            return _Spool(self, raw, own=self.path is not None)
        raw = open(self.path, "rb")
        try:
            head = raw.read(2)
            raw.seek(0)
        except OSError:
            raw.close()
            raise
        if head == GZIP_MAGIC:
            self.compressed = True
            return Gunzip(raw)
        return raw

    def sniff(self, marker, size=1 << 20):
        """Whether marker occurs in the first `size` bytes (False for unread streams and unreadable files)."""
        if self.stream and self.spool is None:
            return False
        try:
            f = self.open()
            try:
                return marker in f.read(size)
            finally:
                f.close()
        except (OSError, EOFError, zlib.error):
            return False

    def cleanup(self):
        if self.spool is not None:
            try:
                os.unlink(self.spool)
            except OSError:
                pass
            self.spool = None


class Gunzip:
    """Streaming gunzip with read(n) that keeps every byte before a cut or corrupt point.

    gzip.GzipFile raises at a truncated end and drops what it decompressed in that call; a log
    compressed while it was still written ends like that. Here the output before the cut is
    returned, then EOF, and `truncated` says what happened. Concatenated members are read on;
    non-gzip bytes after a member (padding) end the stream.
    """

    def __init__(self, raw):
        self.raw = raw
        self.inflate = zlib.decompressobj(wbits=31)
        self.pending = b""          # compressed bytes not yet fed
        self.in_member = False
        self.members = 0            # members read to their end
        self.done = False
        self.truncated = False

    def read(self, n):
        while not self.done:
            data = self.pending or self.raw.read(n)
            self.pending = b""
            if not data:
                self.truncated = self.in_member
                self.done = True
                break
            if not self.in_member and self.members and data[:2] != GZIP_MAGIC:
                self.done = True            # padding or other bytes after the last member
                break
            self.in_member = True
            out = self.inflate.decompress(data, n)
            self.pending = self.inflate.unconsumed_tail
            if self.inflate.eof:
                self.pending = self.inflate.unused_data
                self.inflate = zlib.decompressobj(wbits=31)
                self.in_member = False
                self.members += 1
            if out:
                return out
        return b""

    def close(self):
        self.raw.close()


def _check_stdin():
    """OSError naming a standard input the shell closed (`<&-`), before a spool is made for it."""
    if sys.stdin is None:
        raise OSError(errno.EBADF, "standard input is closed")
    try:
        os.fstat(sys.stdin.fileno())
    except OSError as e:
        if e.errno == errno.EBADF:
            raise OSError(errno.EBADF, "standard input is closed") from None


def open_stream(path, name=None):
    """A binary reader of a FIFO or character device, opened without blocking: a FIFO that no
    process opens for writing within FIFO_WAIT_S is a LogInputError (a hang otherwise)."""
    name = name or path
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        first = b""
        if stat.S_ISFIFO(mode):
            deadline = time.monotonic() + FIFO_WAIT_S
            while True:
                try:
                    first = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break               # a writer is there, nothing written yet: read on, blocking
                if first:
                    break
                if time.monotonic() >= deadline:
                    raise LogInputError(f"{name}: no process wrote to this FIFO within {FIFO_WAIT_S:g} s "
                                        f"(nothing to read; start the writer first, e.g. <(zcat log.gz))")
                time.sleep(FIFO_POLL_S)
        elif not stat.S_ISCHR(mode) and not stat.S_ISREG(mode):
            raise LogInputError(f"{name}: not a file, pipe or directory")
        os.set_blocking(fd, True)
        raw = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return _Prefixed(first, raw)


class _Prefixed:
    """A reader that returns `first` (bytes already read) before the rest of raw."""

    def __init__(self, first, raw):
        self.first, self.raw = first, raw

    def peek(self, n):
        return self.first if self.first else self.raw.peek(n)

    def read(self, n):
        if self.first:
            out, self.first = self.first[:n], self.first[n:]
            return out
        return self.raw.read(n)

    def close(self):
        self.raw.close()


def spool_dir():
    """$TMPDIR as the user set it: tempfile would silently fall back to /tmp when it is full."""
    return os.environ.get("TMPDIR") or tempfile.gettempdir()


class SpoolError(LogInputError):
    """The temporary copy of stdin or a pipe cannot be written (a full or missing $TMPDIR)."""


class _Spool:
    """A stream (gunzipped when it starts with the gzip magic), copied to a temporary file as read."""

    def __init__(self, source, stream, own):
        self.source = source
        self.raw = stream if own else None
        try:
            head = stream.peek(2)[:2]
        except (AttributeError, OSError, ValueError):
            head = b""
        if head == GZIP_MAGIC:
            source.compressed = True
            stream = Gunzip(stream)
        self.stream = stream
        where = spool_dir()
        try:
            fd, path = tempfile.mkstemp(prefix="collbench-nccl-stdin.", suffix=".log", dir=where)
        except OSError as e:
            self._fail(e, where)
        self.fd = fd
        source.spool = path

    def _fail(self, e, where):
        if self.raw is not None:
            self.raw.close()
        raise SpoolError(f"{self.source.name}: cannot copy the input to a temporary file in {where} "
                         f"(a second pass may need it): {e.strerror or e}; set TMPDIR to a directory "
                         f"with room") from None

    @property
    def truncated(self):
        return getattr(self.stream, "truncated", False)

    def read(self, n):
        data = self.stream.read(n)
        view = memoryview(data)
        try:
            while view:                 # unbuffered: a full disk fails here, not silently at close
                view = view[os.write(self.fd, view):]
        except OSError as e:
            self._fail(e, os.path.dirname(self.source.spool))
        return data

    def close(self):
        os.close(self.fd)
        if self.raw is not None:
            self.raw.close()


def _stat_problem(arg, e):
    """What is wrong with a path os.stat refused, in words."""
    if e.errno == errno.ELOOP:
        return f"{arg}: symlink loop (too many levels of symbolic links)"
    if e.errno == errno.ENOENT and os.path.islink(arg):
        try:
            target = os.readlink(arg)
        except OSError:
            target = "?"
        return f"{arg}: broken symlink (its target {target} does not exist)"
    if e.errno == errno.ENOENT:
        return f"{arg}: no such file or directory"
    return f"{arg}: cannot read: {e.strerror or e}"


def expand_paths(paths, warnings):
    """Sources for the command-line paths: `-` is stdin, directories are walked in name order."""
    sources = []
    seen = set()
    stdin_seen = False

    def add(source):
        real = os.path.realpath(source.path)
        if real in seen:
            warnings.append(f"{source.name}: given more than once; read once")
            return
        seen.add(real)
        sources.append(source)
    for arg in paths:
        if arg == "-":
            if stdin_seen:
                raise LogInputError("-: stdin given twice")
            stdin_seen = True
            sources.append(Source("<stdin>"))
            continue
        try:
            mode = os.stat(arg).st_mode
        except OSError as e:
            raise LogInputError(_stat_problem(arg, e)) from None
        if stat.S_ISDIR(mode):
            found, errors = [], []

            def listing_failed(e):
                errors.append(e)
                warnings.append(f"{e.filename}: cannot list directory: {e.strerror}")
            for root, dirs, files in os.walk(arg, onerror=listing_failed):
                dirs.sort()
                for name in sorted(files):
                    path = os.path.join(root, name)
                    if os.path.isfile(path):
                        found.append(Source(path, path, explicit=False))
            if not found:
                if errors:
                    e = errors[0]
                    raise LogInputError(f"{e.filename}: cannot list directory: {e.strerror}"
                                        + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
                raise LogInputError(f"{arg}: directory contains no files")
            for source in found:
                add(source)
        elif stat.S_ISREG(mode):
            add(Source(arg, arg))
        elif stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):   # <(zcat log.gz), /dev/stdin
            sources.append(Source(arg, arg, stream=True))
        else:
            raise LogInputError(f"{arg}: not a file, pipe or directory")
    return sources


class SourceStats:
    """What reading one source found (bytes, lines, cut lines, why it was skipped). `lines` is
    counted by the consumer of the blocks, which splits them anyway."""

    __slots__ = ("bytes", "lines", "overlong", "joined", "skipped", "error")

    def __init__(self):
        self.bytes = 0
        self.lines = 0
        self.overlong = 0
        self.joined = 0         # wrapped COLL lines joined with their continuation
        self.skipped = None     # reason the whole source was not read (binary, unreadable)
        self.error = None       # reason reading stopped early (corrupt gzip, I/O error)


def read_blocks(source, stats, warnings, block=BLOCK, max_line=MAX_LINE):
    """Yield blocks of complete lines (each ending in b'\\n') from a source.

    A line longer than max_line is cut to max_line bytes (counted in stats.overlong). A binary
    source, or one that cannot be opened, raises LogInputError when named on the command line
    and is skipped with a warning when found in a directory. A read error part-way (a truncated
    gzip, an I/O error) ends the source with a warning: the lines before it count.
    """
    try:
        f = source.open()
    except OSError as e:
        _refuse(source, stats, warnings, f"cannot open: {e.strerror or e}")
        return
    except LogInputError as e:      # a FIFO nobody writes to, a spool that cannot be made
        stats.skipped = str(e)
        if source.explicit or isinstance(e, SpoolError):
            raise
        warnings.append(f"skipped: {e}")
        return
    try:
        carry = b""
        skipping = False        # inside the dropped rest of an overlong line
        first = True
        while True:
            try:
                data = f.read(block)
            except (OSError, EOFError, zlib.error) as e:
                why = "corrupt or truncated gzip data" if source.compressed else "read error"
                detail = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
                msg = f"{source.name}: {why} after {stats.bytes} bytes ({detail}); using the lines before it"
                if first:
                    _refuse(source, stats, warnings, f"{why}: {detail}")
                    return
                stats.error = msg
                warnings.append(msg)
                break
            if not data:
                break
            if first:
                first = False
                if b"\0" in data[:SNIFF]:
                    _refuse(source, stats, warnings, "binary file (NUL bytes near the start), not a text log")
                    return
            stats.bytes += len(data)
            if skipping:
                nl = data.find(b"\n")
                if nl < 0:
                    continue
                data = data[nl + 1:]
                skipping = False
            if carry:
                data = carry + data
                carry = b""
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > max_line:
                    stats.overlong += 1
                    yield data[:max_line] + b"\n"
                    skipping = True
                else:
                    carry = data
                continue
            carry = data[cut + 1:]
            yield data[:cut + 1]
            if len(carry) > max_line:
                stats.overlong += 1
                yield carry[:max_line] + b"\n"
                carry = b""
                skipping = True
        if carry and not skipping:
            yield carry + b"\n"
        if getattr(f, "truncated", False) and stats.bytes == 0:
            _refuse(source, stats, warnings, "gzip data cut short before its first line (nothing could be "
                                             "decompressed: the file ends inside the gzip header or first block)")
            return
        if getattr(f, "truncated", False):
            stats.error = (f"{source.name}: gzip data cut short after {stats.bytes} bytes; "
                           f"using the lines before the cut")
            warnings.append(stats.error)
    finally:
        try:
            f.close()
        except Exception:       # closing a half-read gzip can raise again; the data is already used
            pass


def _refuse(source, stats, warnings, reason):
    stats.skipped = reason
    if source.explicit:
        raise LogInputError(f"{source.name}: {reason}")
    warnings.append(f"{source.name}: skipped: {reason}")



def joined_blocks(blocks):
    """(block, joins) for each block of read_blocks, with COLL lines wrapped after `comm` or
    `stream` joined to their continuation (log_parser.join_wrapped); a block's wrapped last line
    waits for the next block. joins: how many lines were joined away (for line numbers)."""
    carry = b""
    for chunk in blocks:
        if carry:
            chunk = carry + chunk
            carry = b""
        if wrapped_tail(chunk):
            cut = chunk.rfind(b"\n", 0, len(chunk) - 1) + 1
            carry, chunk = chunk[cut:], chunk[:cut]
            if not chunk:
                continue
        yield join_wrapped(chunk)
    if carry:
        yield join_wrapped(carry)
