"""Which files a process opens, as it opens them: Linux inotify through ctypes (no package needed).

A test that must act between two reads of a file another process makes (delete a counter after the
engine's before-step read, bring it back after the after-step read) waits for those reads instead
of guessing their timing."""

import ctypes
import os
import select
import struct

IN_OPEN = 0x20
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_EVENT = struct.Struct("iIII")   # wd, mask, cookie, len; then len bytes of NUL-padded name

_libc = ctypes.CDLL(None, use_errno=True)


class OpenWatch:
    """`with OpenWatch([dir, ...]) as w:` then `w.next(timeout)` -> (dir, name) of the next file
    opened in one of the dirs, or None when none was opened within timeout seconds."""

    def __init__(self, dirs):
        self.fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.dir_of = {}
        for d in dirs:
            wd = _libc.inotify_add_watch(self.fd, os.fsencode(str(d)), IN_OPEN)
            if wd < 0:
                err = ctypes.get_errno()
                os.close(self.fd)
                raise OSError(err, f"inotify_add_watch {d}")
            self.dir_of[wd] = d
        self.pending = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)

    def next(self, timeout):
        if not self.pending:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return None
            data = os.read(self.fd, 65536)
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size:at + _EVENT.size + size].rstrip(b"\0").decode()
                at += _EVENT.size + size
                if mask & IN_OPEN and name and wd in self.dir_of:
                    self.pending.append((self.dir_of[wd], name))
            if not self.pending:
                return None
        return self.pending.pop(0)
