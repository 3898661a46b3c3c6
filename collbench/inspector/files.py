"""Inspector inputs: files, directories (walked, bounded) and .gz, read through the one bounded
reader; every file that cannot be read is a counted, named error, never a crash.

The plugin writes <dir>/<hostname>-pid<pid>.log (JSON lines) and, in Prometheus mode,
<dir>/nccl_inspector_metrics_<gpu uuid>.prom; <dir> defaults to nccl-inspector-<SLURM_JOBID>
(docs/INSPECTOR.md), which is where a job id is found when the records do not carry one.
"""

import os
import re
import zlib
from typing import NamedTuple

from collbench.bounded_file import UntrustedFileError, read_limited

MAX_FILE_BYTES = 1 << 30          # one process's JSON log: ~300 bytes per collective
MAX_FILES = 100_000
MAX_DEPTH = 8
SUFFIXES = (".log", ".jsonl", ".prom")
_JOB_DIR = re.compile(r"nccl-inspector-(\d{1,20})")


class Source(NamedTuple):
    path: str
    text: str           # None when it could not be read
    error: str          # why not
    job_id: str         # from a nccl-inspector-<jobid> directory on its path, or None


def wanted(name):
    """A file name the plugin writes (or its .gz)."""
    base = name[:-3] if name.endswith(".gz") else name
    return base.endswith(SUFFIXES)


def job_of(path):
    for part in reversed(os.path.abspath(path).split(os.sep)):
        m = _JOB_DIR.fullmatch(part)
        if m:
            return m.group(1)
    return None


def list_files(paths):
    """([files], [(path, error)]): explicit files as given, directories walked for the plugin's
    files (at most MAX_FILES, MAX_DEPTH deep, symlinks not followed)."""
    files, errors = [], []
    for path in paths:
        if os.path.isdir(path):
            base_depth = path.rstrip(os.sep).count(os.sep)
            for root, dirs, names in os.walk(path, onerror=lambda e: errors.append((e.filename, e.strerror))):
                if root.count(os.sep) - base_depth >= MAX_DEPTH:
                    dirs[:] = []
                dirs.sort()
                for name in sorted(names):
                    if wanted(name):
                        files.append(os.path.join(root, name))
                if len(files) > MAX_FILES:
                    errors.append((path, f"more than {MAX_FILES} files: the rest not read"))
                    return files[:MAX_FILES], errors
        else:
            files.append(path)
    return files, errors


def gunzip(data, max_bytes=MAX_FILE_BYTES):
    """The decompressed bytes of a gzip file, at most max_bytes; UntrustedFileError otherwise."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, max_bytes + 1)
    except zlib.error as e:
        raise UntrustedFileError(f"not gzip data ({e})") from None
    if len(out) > max_bytes or d.unconsumed_tail:
        raise UntrustedFileError(f"decompresses to more than {max_bytes >> 20} MB")
    return out


def read_source(path, max_bytes=MAX_FILE_BYTES):
    """A Source: the file's text, or why it could not be read."""
    try:
        data = read_limited(path, max_bytes)
        if path.endswith(".gz") or data[:2] == b"\x1f\x8b":
            data = gunzip(data, max_bytes)
        if b"\0" in data:
            raise UntrustedFileError("holds NUL bytes, not text")
        text = data.decode("utf-8", errors="replace")
    except UntrustedFileError as e:
        return Source(path, None, str(e), job_of(path))
    return Source(path, text, None, job_of(path))
