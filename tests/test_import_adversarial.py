"""`collbench import nccl-tests|osu` on hostile input (issue 26, "The other verbs: import").

One table row per case: the input built (FIFOs with no writer, a pipe that never writes, a
60-million-digit latency, nan/1e999, a quarter of a million rows), the command, the exit code
expected, fragments expected in its output, and what the results file must hold afterwards.
Each is a real `python -m collbench import` process; every row failed on the code before this
change (a hang, a record with `latency_avg_us: null`, a whole-file refusal, unbounded memory).

This file imports nothing of collbench itself: the same table can be run against any checkout.
"""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OSU_HEAD = "# OSU MPI Allreduce Latency Test v7.4\n# Datatype: MPI_FLOAT.\n# Size       Avg Latency(us)\n"
NCCL_HEAD = """# nThread 1 nGpus 2 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid 1717587 on       h1 device  0 [0x04] NVIDIA GeForce RTX 3090
#  Rank  1 Group  0 Pid 1717587 on       h1 device  1 [0x05] NVIDIA GeForce RTX 3090
#
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""


def nccl_row(size, time_text):
    return f"{size:>12}  {size // 4:>12}     float     sum      -1    {time_text}    0.00    0.00      0    53.00    0.00    0.00      0\n"


@dataclass
class Case:
    name: str
    build: Callable          # (tmp_path) -> (argv after `import`, stdin or None)
    rc: int
    says: tuple = ()         # fragments of stdout+stderr
    records: int = None      # result records the results file must hold (None: not checked)
    within_s: float = 60     # the process must have ended by then (a hang fails the row)
    max_rss_mb: float = None  # the process's peak resident memory


def fifo(tmp_path, name="out.txt"):
    path = tmp_path / name
    os.mkfifo(path)
    return path


def text_file(tmp_path, text, name="out.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def osu_rows(n):
    return OSU_HEAD + "".join(f"{4 * (i % 1000 + 1):<10d}{12.5 + i % 7:>18.2f}\n" for i in range(n))


CASES = [
    # a FIFO with no writer, named as a path: refused after --wait, never waited on for good
    Case("fifo-path-nccl-tests", lambda t: (["nccl-tests", fifo(t), "--wait", "1"], None), 2,
         ("nothing to read for 1 s",), within_s=20),
    Case("fifo-path-osu", lambda t: (["osu", fifo(t), "--ranks", "2", "--wait", "1"], None), 2,
         ("nothing to read for 1 s",), within_s=20),
    # the second form: '-' (standard input) from a pipe whose writer never writes
    Case("stdin-pipe-never-written", lambda t: (["nccl-tests", "-", "--wait", "1"], "hold"), 2,
         ("standard input: nothing to read for 1 s",), within_s=20),
    Case("stdin-read-twice", lambda t: (["osu", "-", "-", "--ranks", "2"], ""), 2, ("name it once",)),
    # '-' works: an output piped in is imported
    Case("stdin-output-piped-in", lambda t: (["osu", "-", "--ranks", "2"], OSU_HEAD + "4    1.52\n8    1.60\n"), 0,
         ("2 records appended",), records=2),
    # a 60-million-digit, nan, 1e999, inf or negative latency is a counted bad row, never a record
    # with latency_avg_us null; the good rows around it are imported
    Case("osu-latency-60-million-digits", lambda t: (["osu", text_file(t, OSU_HEAD + "4   1.52\n8   " + "9" * 60_000_000
                                                                        + "\n16   2.01\n"), "--ranks", "2"], None),
         0, ("more than 8192 characters",), records=2),
    Case("osu-latency-nan-1e999-inf-negative",
         lambda t: (["osu", text_file(t, OSU_HEAD + "4 1.5\n8 nan\n16 1e999\n32 inf\n64 -3.5\n128 2.0\n"),
                     "--ranks", "2", "--format", "json"], None),
         0, ('"bad_lines": 4', "'nan' is not a valid 'Avg Latency(us)' value (a finite number >= 0)",
             "'1e999' is not a valid"), records=2),
    Case("osu-only-bad-latencies", lambda t: (["osu", text_file(t, OSU_HEAD + "8 nan\n16 1e999\n"), "--ranks", "2"],
                                              None), 2, ("no result rows under 'Allreduce Latency Test' that could "
                                                         "be read (2 not",), records=0),
    Case("nccl-tests-time-60-million-digits-nan-1e999",
         lambda t: (["nccl-tests", text_file(t, NCCL_HEAD + nccl_row(8, "54.18") + nccl_row(16, "nan")
                                             + nccl_row(32, "1e999") + nccl_row(64, "7" * 60_000_000)),
                     "--op", "allreduce", "--format", "json"], None),
         0, ('"bad_lines": 3', "line of more than 8192 characters"), records=1),
    # more rows than a run keeps: streamed, the rows past 100000 counted and reported, memory
    # bounded (the code before held every line, row and record: 2.6 GB for a million OSU rows)
    Case("osu-120k-rows", lambda t: (["osu", text_file(t, osu_rows(120_000)), "--ranks", "2", "--format", "json"],
                                     None),
         0, ("20000 rows past the first 100000 of a file",), records=100_000, within_s=120, max_rss_mb=200),
    Case("nccl-tests-110k-rows",
         lambda t: (["nccl-tests", text_file(t, NCCL_HEAD + "".join(nccl_row(8 << (i % 20), "54.18")
                                                                    for i in range(110_000))),
                     "--op", "allreduce", "--format", "json"], None),
         0, ("10000 rows past the first 100000 of a run",), records=100_000, within_s=120, max_rss_mb=200),
]


# The child reports its own peak RSS (VmHWM of its address space) at exit: rusage's ru_maxrss
# is no use here, as Linux carries the forking parent's high-water mark across exec, so a child of a
# 340 MB pytest (late in the suite) "peaks" at 340 MB whatever it does.
REPORT_PEAK = """
import atexit, os, runpy, sys
def peak():
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(os.environ["CB_TEST_PEAK_FILE"], "w") as f:
        f.write(kb)
atexit.register(peak)
sys.argv[0] = "collbench"
runpy.run_module("collbench", run_name="__main__")
"""


def run_case(case, tmp_path):
    """(exit code, stdout+stderr, results path, peak RSS in MB of that one process)."""
    argv, stdin = case.build(tmp_path)
    results = tmp_path / "results.jsonl"
    peak_file = tmp_path / "peak_kb"
    cmd = [sys.executable, "-c", REPORT_PEAK, "import", *map(str, argv), "--results", str(results)]
    with open(tmp_path / "out", "w+") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "CB_TEST_PEAK_FILE": str(peak_file)})
        if stdin is not None and stdin != "hold":     # "hold": a writer that never writes
            proc.stdin.write(stdin)
            proc.stdin.close()
        try:
            proc.wait(case.within_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"{case.name}: still running after {case.within_s} s")
        if proc.stdin:
            proc.stdin.close()
        out.seek(0)
        peak_mb = int(peak_file.read_text()) / 1024 if peak_file.exists() else None
        return proc.returncode, out.read(), results, peak_mb


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_import_hostile_input(case, tmp_path):
    rc, output, results, rss_mb = run_case(case, tmp_path)
    assert rc == case.rc, output[-2000:]
    for fragment in case.says:
        assert fragment in output, (fragment, output[-2000:])
    assert "Traceback" not in output
    lines = results.read_text().splitlines() if results.exists() else []
    if case.records is not None:
        assert len(lines) == case.records
    for line in lines[:1000] + lines[-1000:]:
        rec = json.loads(line)
        assert isinstance(rec["latency_avg_us"], (int, float)) and rec["latency_avg_us"] >= 0, rec
    if case.max_rss_mb is not None:
        assert rss_mb is not None and rss_mb < case.max_rss_mb, f"peak RSS {rss_mb} MB"
