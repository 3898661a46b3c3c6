"""Write a file so that a reader (Prometheus reloading rules, Grafana provisioning, a person) sees
the old content or the new, never half of either: a temporary file beside the target, fsync'd,
then renamed over it.
"""

import os
import sys
import tempfile

from collbench.errors import UserError


def write_atomic(path, chunks, keep_existing=False):
    """Write the chunks (str, or bytes for binary files) to path atomically; its absolute path.
    OSError if it cannot be written.

    keep_existing: the new file starts with the old one's bytes (and keeps its mode), so chunks
    are appended without ever leaving the old file half-appended.
    """
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    mode = None
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as out:
            if keep_existing and os.path.exists(path):
                mode = os.stat(path).st_mode & 0o7777
                with open(path, "rb") as old:
                    data = old.read()
                out.write(data)
                if data and not data.endswith(b"\n"):
                    out.write(b"\n")  # a previous writer's torn last line stays on its own line
            for chunk in chunks:
                out.write(chunk if isinstance(chunk, bytes) else chunk.encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode if mode is not None else 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path


def write_output(path, text, flag="-o"):
    """A generator command's output: to stdout when path is None or '-', else atomically to path.

    A file that cannot be written is a UserError (exit 2) naming the flag and the path.
    """
    if path in (None, "-"):
        sys.stdout.write(text)
        return
    try:
        write_atomic(path, [text])
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot write: {e.strerror}") from None


def check_writable(path, flag, append=False):
    """Fail before a run (UserError, exit 2) if path cannot be written, so nothing measured is
    lost at the end; its absolute path. append: the file is appended to, so it must be readable."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        raise UserError(f"{flag} {path}: is a directory (expected a file path)")
    if not os.path.isdir(parent):
        raise UserError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: directory {parent} is not writable")
    if append and os.path.exists(path) and not os.access(path, os.R_OK):
        raise UserError(f"{flag} {path}: exists and is not readable (it is appended to)")
    return path
