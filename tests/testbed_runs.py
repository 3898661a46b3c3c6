"""collbench's verbs run on a namespace testbed, as the diagnose tests and
bench/diagnose_accuracy.py run them: `once` from the first host's namespace, `diagnose` against a
saved baseline, the engine ranks of one host moved into a CPU-quota cgroup, and a window of the
stress daemon's log cut out by seq."""

import json
import os
import subprocess
import sys

from cgroup_helpers import RankMover
from collbench.results.record_parser import is_record, parse_record

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def collbench(*args, netns=None, timeout=180):
    """`python -m collbench ARGS` (in the namespace `netns` if given), its output captured."""
    pre = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run(pre + [sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def once(bed, results, *args, timeout=300):
    """`collbench once` from the testbed's first host, appending to `results`; asserts it ran."""
    r = collbench("once", "--config", bed["config"], "--results", results, "--quiet", *args,
                  netns=bed["hosts"][0]["netns"], timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return results


def diagnose(bed, results, baseline="quiet", timeout=120):
    """(exit code, JSON document) of `collbench diagnose RESULTS --baseline NAME` (results: a path or
    a list of them); asserts it found or cleared a regression (exit 0 or 1), not bad input."""
    paths = [results] if isinstance(results, (str, os.PathLike)) else list(results)
    r = collbench("diagnose", *paths, "--baseline", baseline, "--config", bed["config"], "--format", "json",
                  timeout=timeout)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def host_throttler(cgroup, netns):
    """A RankMover of every engine rank running in one testbed host's network namespace."""
    inode = os.stat(f"/run/netns/{netns}").st_ino
    return RankMover(cgroup, lambda proc: b"collbench-engine" in (proc / "cmdline").read_bytes()
                     and os.stat(proc / "ns" / "net").st_ino == inode)


def seq_window(log, first_seq, last_seq, path):
    """The stress daemon's lines of seq first..last, unchanged, as a file of their own (from the
    rotated log.1 too: a window may straddle a rotation); its number of lines."""
    n = 0
    with open(path, "wb") as out:
        for name in (log + ".1", log):
            try:
                src = open(name, "rb")
            except FileNotFoundError:
                continue
            with src:
                for line in src:
                    rec = parse_record(line)       # the project's one validator: any line, never a raise
                    seq = rec.get("seq") if is_record(rec) else None
                    if isinstance(seq, int) and first_seq <= seq <= last_seq:
                        out.write(line)
                        n += 1
    return n
