"""The stress daemon's results log: append-only JSON Lines with size-based rename rotation.

Contract (docs/LOG_FORMAT.md): every record is written with one write(2) of a whole
`\\n`-terminated line on an O_APPEND descriptor (collbench.results.appender: rotation,
reopening), so a reader never sees half a record at the end of a file it has already read
past. A record is in exactly one file, and `seq` (1, 2, 3 ...) runs on without a gap or a
repeat across rotations and across daemon restarts: on open, the log resumes from the highest
`seq` found at the end of the newest file that holds one.

Reading: every reader parses lines with collbench.results.record_parser (the one validator) and
splits them with collbench.results.lines, in bounded chunks. `on_bad(path, offset, reason)`,
when given, is called once for every line that is not a record (offset: the line's first byte
in that file). A last line without its newline is still being written: it is not a line yet,
and not reported.
"""

import os

from collbench.results.appender import RotatingAppender
from collbench.results.lines import BLOCK, LineSplitter, lines_backwards, open_log
from collbench.results.record_parser import ParseError, parse_record
from collbench.results.records import dumps, event_record

# How far back from the end of a file to look for the last record's seq on open. Records are
# well under 4 KB; the window is generous so a burst of unparsable lines does not hide it.
_TAIL_WINDOW = 256 * 1024


class ResultsLog:
    """Append records to `path`, giving each the next `seq`; rotate past `rotate_bytes`.

    The file's own troubles (renamed or deleted under us, a rotation that fails) become
    `log_reopened` / `rotate_failed` event records in the log itself, carrying `event_fields`
    (pid, run_id); a record that went into a file deleted during the write is written again
    (same seq). There is always an open descriptor, and seq never skips or repeats.
    """

    def __init__(self, path, rotate_bytes, rotate_keep, event_fields=None):
        self.path = path
        # pid, run_id ... of the log's own events (log_reopened, rotate_failed)
        self.event_fields = dict(event_fields or {"pid": os.getpid()})
        self.written = 0                # records written by this object, its own events included
        os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        self.last_seq = last_seq_in([path] + [f"{path}.{i}" for i in range(1, rotate_keep + 1)
                                              if os.path.isfile(f"{path}.{i}")])
        self._file = RotatingAppender(path, rotate_bytes, rotate_keep, on_event=self._file_event)

    @property
    def rotate_keep(self):
        return self._file.rotate_keep

    @property
    def rotations(self):
        return self._file.rotations

    @property
    def reopens(self):
        return self._file.reopens

    @property
    def rotate_failures(self):
        return self._file.rotate_failures

    def rotated_paths(self, include_live=False):
        return self._file.rotated_paths(include_live)

    def moved(self):
        return self._file.moved()

    def check(self):
        """Reopen `path` if our file was renamed or deleted (the daemon's guard calls it too)."""
        return self._file.check()

    def rotate(self):
        self._file.rotate()

    def close(self):
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def append(self, record):
        """Give `record` the next seq, write it as one line; rotate if past the size.

        Returns the record (with seq). The caller's dict is updated in place.
        """
        with self._file.lock:
            self._file.check()
            data = self._write(record)
            self._file.finish_write(data)
        return record

    def _write(self, record):
        record["seq"] = self.last_seq + 1
        data = (dumps(record) + "\n").encode("utf-8")
        self._file.write_now(data)
        self.last_seq = record["seq"]
        self.written += 1
        return data

    def _file_event(self, event, detail, **fields):
        self._write(event_record(event, detail=detail, **fields, **self.event_fields))


# ------------------------------------------------------------------ reading

def records_of(path, items, on_bad):
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
    f = open_log(path)
    if f is None:
        return None
    best = None
    with f:
        size = os.fstat(f.fileno()).st_size
        for offset, line in lines_backwards(f.fileno(), size):
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
        f = open_log(p)
        if f is None:
            continue
        with f:
            splitter = LineSplitter()
            while True:
                data = f.read(BLOCK)
                if not data:
                    break
                out += records_of(p, splitter.feed(data), on_bad)
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
    f = open_log(path)
    if f is None:
        return []
    with f:
        size = os.fstat(f.fileno()).st_size
        for offset, line in lines_backwards(f.fileno(), size):
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
