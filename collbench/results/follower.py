"""Follow the results log as it grows (`stress log -f`): each record once, across rotations and
truncations (logrotate copytruncate).

Lines are split by collbench.results.lines and parsed by collbench.results.record_parser;
`on_bad(path, offset, reason)` is called for each line that is not a record.
"""

import os

from collbench.results.lines import BLOCK, LineSplitter, ReadFingerprint, open_log
from collbench.results.record_parser import ParseError, parse_record
from collbench.results.results_log import records_of


class LogFollower:
    """Read records as they are appended, across rename rotations, each exactly once.

    A reader slower than the rotation rate can find the live file rotated several times since
    it last looked. So on rotation the follower does not jump to the live file: it finishes
    the file it had open (the writer never touches it again), then opens the file that came
    next in the chain (the one now at `.k-1` if ours is at `.k`, found by inode), and so on up
    to the live file. Records whose seq it has already passed are skipped, so a chain it cannot
    reconstruct (files deleted past rotate_keep) still yields no duplicates.

    A truncation keeps the inode: it is seen by the bytes before our position no longer being
    the ones we read (ReadFingerprint), checked after every read -- the file may have regrown
    past our position, even with the same first line. The rest of what we had not read is in
    the copy (`.1`) if logrotate made one from this file; then the file is read from its start.
    """

    def __init__(self, path, from_start=False, on_bad=None):
        self.path = path
        self.on_bad = on_bad      # on_bad(path, offset, reason) for each line that is not a record
        self.last_seq = None
        self._f = None
        self._ino = None
        self._opened = None       # the name the open file had when it was opened
        self._split = LineSplitter()
        self._seen = ReadFingerprint()   # what we read of the open file, up to _split.offset
        self.truncations = 0
        if os.path.exists(path):
            self._open(path, seek_end=not from_start)

    def _open(self, path, seek_end=False, expect_ino=None):
        f = open_log(path)
        if f is None:
            return False
        ino = os.fstat(f.fileno()).st_ino
        if expect_ino is not None and ino != expect_ino:
            f.close()           # renamed under us: the caller rescans
            return False
        if self._f is not None:
            self._f.close()
        self._f, self._ino, self._opened = f, ino, path
        self._split = LineSplitter(f.seek(0, os.SEEK_END) if seek_end else 0)
        self._seen.load(f.fileno(), self._split.offset)
        return True

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None

    def _drain(self, out):
        got = False
        restarts = 0
        while True:
            pos = self._split.offset
            chunk = self._f.read(BLOCK)
            # checked after the read: a chunk read after a cut is refused, even if the file
            # had regrown past `pos` by then
            if not self._seen.matches(self._f.fileno(), pos):
                restarts += 1
                self._start_over(pos, out)
                if restarts > 2:     # cut again and again: the next poll goes on
                    return True
                continue
            if not chunk:
                return got
            got = True
            self._seen.consumed(self._f.fileno(), chunk, pos + len(chunk))
            self._keep(records_of(self._opened, self._split.feed(chunk), self.on_bad), out)

    def _keep(self, recs, out):
        for rec in recs:
            seq = rec.get("seq")
            if seq is not None:
                if self.last_seq is not None and seq <= self.last_seq:
                    continue
                self.last_seq = seq
            out.append(rec)

    def _start_over(self, pos, out):
        """The open file was truncated: finish from logrotate's copy (`.1`) when it holds what
        we read where we read it, then read the file from its start."""
        self.truncations += 1
        copy_path = f"{self.path}.1"
        try:
            copy = open_log(copy_path) if self._opened == self.path else None
        except OSError:
            copy = None
        if copy is not None:
            with copy:
                if self._seen.matches(copy.fileno(), pos):
                    copy.seek(pos)
                    while chunk := copy.read(BLOCK):
                        self._keep(records_of(copy_path, self._split.feed(chunk), self.on_bad), out)
                    last = self._split.take_pending()
                    if last is not None:
                        self._keep(records_of(copy_path, [last], self.on_bad), out)
        self._f.seek(0)
        self._split = LineSplitter()
        self._seen.reset()

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
            f = open_log(path)
            if f is None:
                return None
            with f:
                splitter = LineSplitter()
                first = []
                while not first:
                    data = f.read(BLOCK)
                    if not data:
                        return None
                    first = splitter.feed(data)
        except OSError:
            return None
        line = first[0][1]
        rec = line if isinstance(line, ParseError) else parse_record(line)
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
