"""Output files and untrusted files, tried as an adversarial operator would (issue 19 items 8, 10).

One table row per case: what is set up, the command, the exit code expected, a fragment of the
message expected, and what must be left on disk afterwards. Every row failed on the code before
the one output writer (atomic_file) and these checks; each is a real `python -m collbench` (or a
real Python process using the writer) on real files, FIFOs, character devices and full tmpfs
file systems mounted by the test (root, as the suite runs).

This file imports nothing of collbench itself: the same table can be run against any checkout.
"""

import json
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = 4096


# ------------------------------------------------------------------------------------ helpers

def run(argv, cwd=REPO, stdout=subprocess.PIPE, timeout=300, shell_redirect=None):
    """`python -m collbench ARGV`; shell_redirect: a shell redirection of stdout (">&-")."""
    cmd = [sys.executable, "-m", "collbench", *argv]
    if shell_redirect:
        cmd = ["sh", "-c", f'exec "$@" {shell_redirect}', "sh", *cmd]
    return subprocess.run(cmd, cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=timeout)


def result_record(op, size, lat, run_id="r1", ts=1795400000.0, transport="ucx"):
    sizes = {0: "-", 1024: "1KB", 4096: "4KB", 65536: "64KB", 1 << 20: "1MB"}
    return {"schema": 1, "time": "2026-11-22T15:58:48.140Z", "ts": ts, "type": "result", "run_id": run_id,
            "hosts": ["n1", "n1"], "nodes": 1, "ranks": 2, "engine": "builtin",
            "mpi": "mpirun (Open MPI) 4.1.4", "transport": transport, "op": op,
            "datatype": "float" if op == "allreduce" else "char", "size": sizes[size], "size_bytes": size,
            "latency_avg_us": lat, "latency_min_us": lat * 0.95, "latency_max_us": lat * 1.05,
            "iterations": 100, "warmup": 10, "algbw_bytes_per_s": size / lat * 1e6 if size else None,
            "busbw_bytes_per_s": size / lat * 1e6 if size else None, "validation": "off", "straggler_rank": 1,
            "verdict": None, "status": "ok"}


def results_file(path, keys=(("allreduce", 1024, 12.0), ("allreduce", 1 << 20, 300.0), ("bcast", 65536, 40.0),
                             ("barrier", 0, 3.0)), runs=3, seed=1):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for r in range(runs):
            for op, size, lat in keys:
                f.write(json.dumps(result_record(op, size, round(lat * rng.uniform(0.97, 1.03), 3), f"run{r}",
                                                 1795400000.0 + r)) + "\n")
    return str(path)


def baseline_doc(**top):
    entry = {"op": "allreduce", "size": "4KB", "size_bytes": 4096, "ranks": 2, "nodes": 1, "transport": "ucx",
             "engine": "builtin", "algorithm": None, "variant": "", "datatype": "float", "n": 3,
             "latency_avg_us": {"median": 10.0, "mad": 0.1}, "busbw_bytes_per_s": None}
    entry.update(top.pop("entry", {}))
    doc = {"format": "collbench-baseline", "version": 1, "name": "b", "created_ts": 1795462831.4,
           "entries": [entry]}
    doc.update(top)
    return doc


def save_baseline(state, name, doc):
    os.makedirs(os.path.join(state, "baselines"), exist_ok=True)
    with open(os.path.join(state, "baselines", f"{name}.json"), "w") as f:
        json.dump(doc, f)


def matrix_json(path, p, seed, hosts_prefix="h"):
    rng = random.Random(seed)
    lat = [[None if i == j else round(rng.uniform(1.0, 10.0), 3) for j in range(p)] for i in range(p)]
    with open(path, "w") as f:
        json.dump({"hosts": [f"{hosts_prefix}{i}" for i in range(p)], "latency_us": lat}, f)
    return str(path)


def is_chardev(path):
    return stat.S_ISCHR(os.lstat(path).st_mode)


def is_fifo(path):
    return stat.S_ISFIFO(os.lstat(path).st_mode)


def listing(d):
    return sorted(os.listdir(d))


def snapshot(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in listing(d)}


class Tmpfs:
    """Small tmpfs file systems, mounted for one row and unmounted after it."""

    def __init__(self):
        self.mounted = []

    def mount(self, path, size):
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
        self.mounted.append(str(path))
        return str(path)

    @staticmethod
    def fill(path, leave_bytes):
        """A filler file taking all but about leave_bytes of the file system holding path."""
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize
        with open(os.path.join(path, "filler"), "wb") as f:
            f.write(b"\0" * max(0, free - leave_bytes))
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    def unmount_all(self):
        for path in reversed(self.mounted):
            subprocess.run(["umount", path], check=False)
        self.mounted.clear()


class FifoReader(threading.Thread):
    """Opens a FIFO for reading and reads it to the end (bounded by the test's timeouts)."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = path
        self.data = b""

    def run(self):
        with open(self.path, "rb") as f:
            self.data = f.read()


# ------------------------------------------------------------------------------------ the table

@dataclass
class Case:
    id: str
    setup: Callable            # (ctx) -> None: makes files; ctx is a dict with "tmp" and "tmpfs"
    argv: Callable             # (ctx) -> argv of collbench, or ("python", code, args...) for the writer API
    rc: int                    # expected exit code (negative: killed by that signal)
    fragment: str              # expected in stderr (or stdout when in_stdout)
    left: Callable             # (ctx, proc) -> None: asserts what is on disk afterwards
    in_stdout: bool = False
    stdout: str = None         # "/dev/full", ">&-" (closed) or None (a pipe)
    during: Callable = None    # (ctx, popen) -> None: acts on the running process (signals)
    absent: tuple = ("Traceback",)
    extra: dict = field(default_factory=dict)


def _report_args(ctx, out, *extra):
    return ["report", ctx["results"], "-o", out, "--no-peak", *extra]


def _setup_results(ctx):
    ctx["results"] = results_file(os.path.join(ctx["tmp"], "results.jsonl"))


# --- destructive: devices, FIFOs, symlinks, sockets

def _setup_nul(ctx):
    _setup_results(ctx)
    ctx["nul"] = os.path.join(ctx["tmp"], "nul")
    os.mknod(ctx["nul"], stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of the test's own


def _left_nul(ctx, proc):
    assert is_chardev(ctx["nul"]), "the character device was replaced by a file"
    assert listing(ctx["tmp"]) == ["nul", "results.jsonl"], listing(ctx["tmp"])


def _left_dev_null(ctx, proc):
    assert is_chardev("/dev/null") and os.stat("/dev/null").st_rdev == os.makedev(1, 3)


def _setup_fifo(ctx, reader):
    _setup_results(ctx)
    ctx["fifo"] = os.path.join(ctx["tmp"], "fifo")
    os.mkfifo(ctx["fifo"])
    if reader:
        ctx["reader"] = FifoReader(ctx["fifo"])
        ctx["reader"].start()


def _left_fifo_read(ctx, proc):
    ctx["reader"].join(30)
    assert is_fifo(ctx["fifo"]), "the FIFO was replaced by a file"
    assert b"<html" in ctx["reader"].data[:2000].lower(), ctx["reader"].data[:200]
    assert listing(ctx["tmp"]) == ["fifo", "results.jsonl"], listing(ctx["tmp"])


def _left_fifo_only(ctx, proc):
    assert is_fifo(ctx["fifo"]), "the FIFO was replaced by a file"
    assert listing(ctx["tmp"]) == ["fifo", "results.jsonl"], listing(ctx["tmp"])


def _setup_symlink(ctx):
    _setup_results(ctx)
    os.mkdir(os.path.join(ctx["tmp"], "real"))
    ctx["target"] = os.path.join(ctx["tmp"], "real", "page.html")
    ctx["link"] = os.path.join(ctx["tmp"], "link.html")
    os.symlink(ctx["target"], ctx["link"])


def _left_symlink(ctx, proc):
    assert os.path.islink(ctx["link"]), "the symlink was replaced by a file"
    assert b"<html" in open(ctx["target"], "rb").read(2000).lower()
    assert listing(os.path.join(ctx["tmp"], "real")) == ["page.html"]


def _setup_appended_stdout(ctx):
    _setup_results(ctx)
    ctx["log"] = os.path.join(ctx["tmp"], "log.txt")
    with open(ctx["log"], "w") as f:
        f.write("earlier output\n")


def _left_appended_stdout(ctx, proc):
    text = open(ctx["log"]).read()
    assert text.startswith("earlier output\n<!doctype html>"), text[:200]
    assert listing(ctx["tmp"]) == ["log.txt", "results.jsonl"], listing(ctx["tmp"])


def _setup_socket(ctx):
    import socket
    _setup_results(ctx)
    ctx["sock"] = os.path.join(ctx["tmp"], "sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(ctx["sock"])
    ctx["socket"] = s


def _left_socket(ctx, proc):
    assert stat.S_ISSOCK(os.lstat(ctx["sock"]).st_mode), "the socket was replaced by a file"
    assert listing(ctx["tmp"]) == ["results.jsonl", "sock"], listing(ctx["tmp"])


# --- the writer API under SIGTERM (a process killed while writing leaves no temporary file)

SLOW_WRITE = """
import sys, time
from collbench.atomic_file import write_atomic
def chunks():
    yield "first part\\n"
    print("writing", flush=True)
    time.sleep(120)
    yield "never\\n"
write_atomic(sys.argv[1], chunks())
"""

BIG_WRITE = """
import sys
from collbench.atomic_file import write_atomic
print("writing", flush=True)
write_atomic(sys.argv[1], ["x" * (8 << 20)])
"""


def _term_when_writing(ctx, popen):
    line = popen.stdout.readline()
    assert "writing" in line, line
    time.sleep(0.5)
    popen.send_signal(signal.SIGTERM)


def _setup_fifo_stalled_reader(ctx):
    ctx["fifo"] = os.path.join(ctx["tmp"], "fifo")
    os.mkfifo(ctx["fifo"])
    # a reader that opens and never reads: the writer blocks once the pipe is full
    ctx["held"] = os.open(ctx["fifo"], os.O_RDONLY | os.O_NONBLOCK)


def _left_nothing_but(*names):
    def check(ctx, proc):
        assert listing(ctx["tmp"]) == sorted(names), listing(ctx["tmp"])
    return check


def _left_fifo_no_temp(ctx, proc):
    os.close(ctx["held"])
    assert is_fifo(ctx["fifo"]), "the FIFO was replaced by a file"
    assert listing(ctx["tmp"]) == ["fifo"], listing(ctx["tmp"])


# --- appending: in place, never reading the old content

def _setup_big_append(ctx):
    ctx["log"] = os.path.join(ctx["tmp"], "results.jsonl")
    with open(ctx["log"], "wb") as f:
        f.truncate(1 << 30)  # 1 GB, sparse: reading it costs time and memory, appending nothing
        f.seek((1 << 30) - 1)
        f.write(b"\n")
    ctx["inode"] = os.stat(ctx["log"]).st_ino


# the peak RSS of this process image (VmHWM; getrusage's maxrss would include the forking pytest's)
APPEND = """
import sys
from collbench.atomic_file import write_atomic
write_atomic(sys.argv[1], ['{"seq": 1}\\n'], keep_existing=True)
hwm = [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
print("maxrss_kb", hwm)
"""


def _left_appended_in_place(ctx, proc):
    st = os.stat(ctx["log"])
    assert st.st_ino == ctx["inode"], "the file was rewritten (a new inode), not appended to"
    assert st.st_size == (1 << 30) + len('{"seq": 1}\n')
    with open(ctx["log"], "rb") as f:
        f.seek(-12, os.SEEK_END)
        assert f.read() == b'\n{"seq": 1}\n'
    rss_kb = int(proc.stdout.split("maxrss_kb")[1].split()[0])
    assert rss_kb < 200_000, f"{rss_kb} kB peak RSS appending to a 1 GB file"


def _setup_sweep_big_report(ctx):
    ctx["out"] = os.path.join(ctx["tmp"], "out")
    os.mkdir(ctx["out"])
    ctx["log"] = os.path.join(ctx["out"], "metrics_report.jsonl")
    with open(ctx["log"], "wb") as f:
        f.truncate(1 << 30)
        f.seek((1 << 30) - 1)
        f.write(b"\n")
    ctx["inode"] = os.stat(ctx["log"]).st_ino


def _left_sweep_appended(ctx, proc):
    st = os.stat(ctx["log"])
    assert st.st_ino == ctx["inode"], "metrics_report.jsonl was rewritten (a new inode), not appended to"
    with open(ctx["log"], "rb") as f:
        f.seek(1 << 30)
        tail = f.read().decode()
    lines = [json.loads(x) for x in tail.splitlines()]
    assert len(lines) == 2 and all("metrics" in x for x in lines), tail[:300]  # one line per size


def _setup_append_full_disk(ctx):
    d = ctx["tmpfs"].mount(os.path.join(ctx["tmp"], "fs"), "256k")
    ctx["fs"] = d
    ctx["log"] = os.path.join(d, "results.jsonl")
    with open(ctx["log"], "w") as f:
        f.write('{"seq": 0}\n' * 100)
    ctx["before"] = open(ctx["log"], "rb").read()
    ctx["inode"] = os.stat(ctx["log"]).st_ino
    Tmpfs.fill(d, 2 * PAGE)


FULL_APPEND = """
import sys
from collbench.atomic_file import write_atomic
try:
    write_atomic(sys.argv[1], ['{"seq": 1, "pad": "' + "x" * 100 + '"}\\n'] * 2000, keep_existing=True)
except OSError as e:
    print("OSError", e.strerror, file=sys.stderr)
    sys.exit(2)
"""


def _left_append_cut_back(ctx, proc):
    assert open(ctx["log"], "rb").read() == ctx["before"], "a failed append left part of its lines"
    assert os.stat(ctx["log"]).st_ino == ctx["inode"]
    assert listing(ctx["fs"]) == ["filler", "results.jsonl"], listing(ctx["fs"])


# --- sets of files on a full disk: all or nothing

def _setup_topo_nearly_full(ctx):
    d = ctx["tmpfs"].mount(os.path.join(ctx["tmp"], "fs"), "2m")
    ctx["fs"] = d
    ctx["out"] = os.path.join(d, "out")
    old = matrix_json(os.path.join(ctx["tmp"], "old.json"), 3, seed=1)
    ctx["matrix"] = matrix_json(os.path.join(ctx["tmp"], "new.json"), 400, seed=2)
    p = run(["topo", "map", "--pattern", "ring", "--matrix", old, "--out-dir", ctx["out"]])
    assert p.returncode == 0, p.stderr
    ctx["before"] = snapshot(ctx["out"])
    # 3 pages free: the new rankfile (8 KB) fits, then each 1-page file in turn, but not the new
    # mapping.json (8 KB) with the rankfile in place: written one by one, the set ends up mixed
    Tmpfs.fill(d, 3 * PAGE)


def _left_topo_old_set(ctx, proc):
    assert snapshot(ctx["out"]) == ctx["before"], "the set is mixed: some files of the new order, some old"
    assert "order (" in proc.stdout, "the result was not printed"


def _setup_report_full(ctx):
    _setup_results(ctx)
    d = ctx["tmpfs"].mount(os.path.join(ctx["tmp"], "fs"), "1m")
    ctx["fs"] = d
    Tmpfs.fill(d, 64 * 1024)  # room for the HTML page (~40 KB), not for the PNGs beside it


def _left_report_nothing(ctx, proc):
    assert listing(ctx["fs"]) == ["filler"], listing(ctx["fs"])


def _setup_measure_full(ctx):
    d = ctx["tmpfs"].mount(os.path.join(ctx["tmp"], "fs"), "512k")
    ctx["fs"] = d
    ctx["out"] = os.path.join(d, "out")
    os.mkdir(ctx["out"])
    ctx["config"] = os.path.join(ctx["tmp"], "c.yaml")
    with open(ctx["config"], "w") as f:
        f.write("ranks: 3\ntransport: shm\nstep_timeout: 120\n")
    ctx["results"] = os.path.join(ctx["tmp"], "r.jsonl")
    Tmpfs.fill(d, PAGE)  # room for the first small file only


def _left_measurement_kept(ctx, proc):
    doc = json.loads(proc.stdout)  # the result is printed
    assert len(doc["hosts"]) == 3 and doc["latency_us"][0][1] > 0
    events = [json.loads(x)["event"] for x in open(ctx["results"])]  # and --results appended
    assert events.count("topo_pair") == 3 and events[-1] == "topo_measure", events
    assert listing(ctx["out"]) == [], listing(ctx["out"])  # the set: none of it, no temporary file


def _setup_once_results_full(ctx):
    d = ctx["tmpfs"].mount(os.path.join(ctx["tmp"], "fs"), "256k")
    ctx["fs"] = d
    ctx["results"] = os.path.join(d, "results.jsonl")
    ctx["tsv"] = os.path.join(ctx["tmp"], "table.tsv")
    Tmpfs.fill(d, 0)


def _left_once_tsv_and_table(ctx, proc):
    assert "collbench once: run" in proc.stdout, proc.stdout[-500:]  # the table is printed
    lines = open(ctx["tsv"]).read().splitlines()  # the other file is still written
    assert lines[0].startswith("run_id\t") and len(lines) == 3, lines
    assert listing(ctx["fs"]) == ["filler"], listing(ctx["fs"])


# --- stdout that cannot be written

def _setup_baselines(ctx):
    ctx["state"] = os.path.join(ctx["tmp"], "state")
    save_baseline(ctx["state"], "good", baseline_doc())


# --- baseline files

def _setup_bad_baseline(**doc):
    def setup(ctx):
        ctx["state"] = os.path.join(ctx["tmp"], "state")
        save_baseline(ctx["state"], "good", baseline_doc(name="good"))
        save_baseline(ctx["state"], "bad", baseline_doc(name="bad", **doc))
    return setup


def _write_state_file(ctx, name, text):
    ctx["state"] = os.path.join(ctx["tmp"], "state")
    os.makedirs(os.path.join(ctx["state"], "baselines"))
    with open(os.path.join(ctx["state"], "baselines", f"{name}.json"), "w") as f:
        f.write(text)


def _left_unchanged_state(ctx, proc):
    assert listing(os.path.join(ctx["state"], "baselines")) == ["bad.json", "good.json"]


def _current(ctx):
    """A results file with one record matching baseline_doc's entry."""
    path = os.path.join(ctx["tmp"], "current.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps(result_record("allreduce", 4096, 10.1)) + "\n")
    return path


def _left_list_names_good_and_bad(ctx, proc):
    assert "good" in proc.stdout and "bad" in proc.stdout, proc.stdout
    _left_unchanged_state(ctx, proc)


def _setup_inf_ratio(ctx):
    ctx["state"] = os.path.join(ctx["tmp"], "state")
    save_baseline(ctx["state"], "tiny", baseline_doc(entry={"latency_avg_us": {"median": 1e-300, "mad": 0.0}}))
    ctx["current"] = os.path.join(ctx["tmp"], "current.jsonl")
    with open(ctx["current"], "w") as f:
        f.write(json.dumps(result_record("allreduce", 4096, 1e10)) + "\n")


def _left_valid_json(ctx, proc):
    def no_constant(name):
        raise ValueError(f"{name} in the output: not JSON")
    doc = json.loads(proc.stdout, parse_constant=no_constant)
    row = doc["rows"][0]
    assert row["ratio"] is None and row["non_finite"] == {"ratio": "Infinity"}, row


def _setup_escape(ctx):
    ctx["state"] = os.path.join(ctx["tmp"], "state")
    save_baseline(ctx["state"], "esc", baseline_doc(entry={"transport": "ucx\x1b]0;owned\x07\x1b[2J"}))


def _left_no_escape(ctx, proc):
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout, repr(proc.stdout)


def _setup_intermixed(ctx):
    ctx["state"] = os.path.join(ctx["tmp"], "state")
    save_baseline(ctx["state"], "b", baseline_doc())
    ctx["current"] = os.path.join(ctx["tmp"], "current.jsonl")
    with open(ctx["current"], "w") as f:
        f.write(json.dumps(result_record("allreduce", 4096, 10.1)) + "\n")


# --- matrix files

def _setup_matrix(text):
    def setup(ctx):
        ctx["matrix"] = os.path.join(ctx["tmp"], "m.json")
        with open(ctx["matrix"], "w") as f:
            f.write(text)
        ctx["out"] = os.path.join(ctx["tmp"], "out")
    return setup


def _left_no_out(ctx, proc):
    assert not os.path.exists(ctx["out"]) or listing(ctx["out"]) == [], listing(ctx["out"])


def _topo_map(ctx, *extra):
    return ["topo", "map", "--pattern", "ring", "--matrix", ctx["matrix"], "--out-dir", ctx["out"], *extra]


OK_MATRIX = '{"hosts": ["a", "b", "c"], "latency_us": [[null, 1, 2], [1, null, 3], [2, 3, null]]}'


def _nothing(ctx, proc):
    pass


CASES = [
    # destructive: a device, a FIFO, a symlink or a socket named as an output is never replaced
    Case("report_o_chardev", _setup_nul, lambda c: _report_args(c, c["nul"]), 0, "report written", _left_nul),
    Case("report_o_real_dev_null", _setup_results, lambda c: _report_args(c, "/dev/null"), 0, "report written",
         _left_dev_null),
    Case("report_o_fifo_with_reader", lambda c: _setup_fifo(c, True), lambda c: _report_args(c, c["fifo"]), 0,
         "report written", _left_fifo_read),
    Case("report_o_fifo_no_reader", lambda c: _setup_fifo(c, False), lambda c: _report_args(c, c["fifo"]), 2,
         "FIFO has no reader", _left_fifo_only),
    Case("report_o_symlink_writes_target", _setup_symlink, lambda c: _report_args(c, c["link"]), 0,
         "report written", _left_symlink),
    Case("report_o_descriptor_appends", _setup_appended_stdout, lambda c: _report_args(c, "/proc/self/fd/1", "-q"),
         0, "", _left_appended_stdout, stdout="log>>"),
    Case("report_o_socket_refused", _setup_socket, lambda c: _report_args(c, c["sock"]), 2, "is a socket",
         _left_socket),
    # a writer killed by SIGTERM leaves no temporary file (and a FIFO stays a FIFO)
    Case("sigterm_mid_write_no_temp", lambda c: None,
         lambda c: ("python", SLOW_WRITE, os.path.join(c["tmp"], "out.txt")), -signal.SIGTERM, "",
         _left_nothing_but(), during=_term_when_writing),
    Case("sigterm_fifo_blocked_no_temp", _setup_fifo_stalled_reader,
         lambda c: ("python", BIG_WRITE, c["fifo"]), -signal.SIGTERM, "", _left_fifo_no_temp,
         during=_term_when_writing),
    # appending appends in place: a 1 GB file is neither read nor rewritten
    Case("append_1gb_in_place", _setup_big_append, lambda c: ("python", APPEND, c["log"]), 0, "maxrss_kb",
         _left_appended_in_place, in_stdout=True),
    Case("sweep_into_1gb_metrics_report", _setup_sweep_big_report,
         lambda c: ["sweep", "--np", "2", "--op", "allreduce", "--sizes", "8,1KB", "-n", "5", "--out-dir", c["out"],
                    "--quiet"], 0, "", _left_sweep_appended),
    # a set of files on a full disk: all or nothing, the result still printed
    Case("topo_map_out_dir_nearly_full", _setup_topo_nearly_full, lambda c: _topo_map(c, "--time-limit", "0.2"),
         2, "No space left on device", _left_topo_old_set),
    Case("report_png_full_disk", _setup_report_full,
         lambda c: _report_args(c, os.path.join(c["fs"], "r.html"), "--png", c["fs"]), 2,
         "No space left on device", _left_report_nothing),
    Case("once_results_full_still_writes_tsv", _setup_once_results_full,
         lambda c: ["once", "--np", "2", "--ops", "allreduce", "--sizes", "8,1KB", "--iterations", "5",
                    "--results", c["results"], "--tsv", c["tsv"]],
         2, "--results", _left_once_tsv_and_table),
    Case("topo_measure_out_dir_full_keeps_measurement", _setup_measure_full,
         lambda c: ["topo", "measure", "--config", c["config"], "--iterations", "20", "--bw-size", "64KB",
                    "--out-dir", c["out"], "--picture", "svg", "--format", "json", "--results", c["results"]],
         2, "No space left on device", _left_measurement_kept),
    # stdout that cannot be written: one clear line, exit 1, no traceback
    Case("stdout_dev_full_baseline_list", _setup_baselines, lambda c: ["baseline", "list", "--state-dir", c["state"]],
         1, "cannot write to standard output: No space left on device", _nothing, stdout="/dev/full"),
    Case("stdout_dev_full_help", lambda c: None, lambda c: ["topo", "--help"], 1,
         "cannot write to standard output", _nothing, stdout="/dev/full"),
    Case("stdout_closed_topo_map", _setup_matrix(OK_MATRIX), lambda c: _topo_map(c, "--format", "json"), 1,
         "standard output is closed", _nothing, stdout=">&-"),
    # baseline files: bad timestamps name the file and key, `list` still lists the good ones
    Case("baseline_show_created_ts_1e20", _setup_bad_baseline(created_ts=1e20),
         lambda c: ["baseline", "show", "bad", "--state-dir", c["state"]], 2, "created_ts: expected a Unix time",
         _left_unchanged_state),
    Case("baseline_show_created_ts_minus_1e300", _setup_bad_baseline(created_ts=-1e300),
         lambda c: ["baseline", "show", "bad", "--state-dir", c["state"]], 2, "created_ts: expected a Unix time",
         _left_unchanged_state),
    Case("baseline_list_one_bad_file", _setup_bad_baseline(created_ts=1e20),
         lambda c: ["baseline", "list", "--state-dir", c["state"]], 0, "bad.json: created_ts",
         _left_list_names_good_and_bad),
    Case("baseline_compare_bad_created_ts", _setup_bad_baseline(created_ts=-1e300),
         lambda c: ["baseline", "compare", "bad", _current(c), "--state-dir", c["state"]],
         2, "created_ts", _left_unchanged_state),
    Case("baseline_created_ts_yesterday", _setup_bad_baseline(created_ts="yesterday"),
         lambda c: ["baseline", "show", "bad", "--state-dir", c["state"]], 2, "created_ts: expected a Unix time",
         _left_unchanged_state),
    Case("baseline_size_disagrees_with_size_bytes", _setup_bad_baseline(entry={"size": "1GB"}),
         lambda c: ["baseline", "show", "bad", "--state-dir", c["state"]], 2,
         "entries[0].size: '1GB' does not match size_bytes 4096", _left_unchanged_state),
    Case("baseline_duplicate_json_key", lambda c: _write_state_file(
             c, "bad", '{"format": "collbench-baseline", "version": 1, "created_ts": 1, "created_ts": 2e9, '
                       '"entries": []}'),
         lambda c: ["baseline", "show", "bad", "--state-dir", c["state"]], 2, "key 'created_ts' given twice",
         _nothing),
    Case("baseline_compare_json_infinite_ratio", _setup_inf_ratio,
         lambda c: ["baseline", "compare", "tiny", c["current"], "--state-dir", c["state"], "--format", "json"], 1,
         "regression", _left_valid_json),
    Case("baseline_transport_escape_sequences", _setup_escape,
         lambda c: ["baseline", "show", "esc", "--state-dir", c["state"]], 0, "ucx\\x1b]0;owned\\x07",
         _left_no_escape, in_stdout=True),
    Case("baseline_compare_intermixed_args", _setup_intermixed,
         lambda c: ["baseline", "compare", "b", "--state-dir", c["state"], c["current"]], 0, "1 ok", _nothing,
         in_stdout=True),
    # matrix files
    Case("matrix_string_cell", _setup_matrix('{"hosts": ["a", "b"], "latency_us": [[null, "1e5"], [2, null]]}'),
         _topo_map, 2, "latency_us[0][1] (a -> b): got '1e5', a string: expected a number", _left_no_out),
    Case("matrix_duplicate_hosts", _setup_matrix('{"hosts": ["x", "y"], "hosts": ["a", "b"], '
                                                 '"latency_us": [[null, 1], [2, null]]}'),
         _topo_map, 2, "'hosts': key given twice", _left_no_out),
    Case("matrix_version_10_400", _setup_matrix('{"version": 1' + "0" * 400 + ', "hosts": ["a", "b"], '
                                                '"latency_us": [[null, 1], [2, null]]}'),
         _topo_map, 2, "version: got 10000000000000000... (401 digits), expected 1", _left_no_out,
         absent=("Traceback", "_Unparsed")),
    Case("topo_map_time_limit_0", _setup_matrix(OK_MATRIX), lambda c: _topo_map(c, "--time-limit", "0"), 2,
         "expected seconds above 0", _left_no_out),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_adversarial_output(case, tmp_path):
    ctx = {"tmp": str(tmp_path / "t"), "tmpfs": Tmpfs()}
    os.mkdir(ctx["tmp"])
    try:
        case.setup(ctx)
        argv = case.argv(ctx)
        if argv and argv[0] == "python":
            popen = subprocess.Popen([sys.executable, "-c", argv[1], *argv[2:]], cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
            if case.during:
                case.during(ctx, popen)
            out, err = popen.communicate(timeout=120)
            proc = subprocess.CompletedProcess(popen.args, popen.returncode, out, err)
        elif case.stdout == "/dev/full":
            with open("/dev/full", "w") as full:
                proc = run(argv, stdout=full)
        elif case.stdout == "log>>":  # stdout appended to ctx["log"] (a shell's >>)
            proc = run(argv, stdout=None, shell_redirect=f'>> "{ctx["log"]}"')
        elif case.stdout:
            proc = run(argv, stdout=None, shell_redirect=case.stdout)
        else:
            proc = run(argv)
        text = (proc.stdout if case.in_stdout else proc.stderr) or ""
        assert proc.returncode == case.rc, (proc.returncode, proc.stderr[-2000:])
        assert case.fragment in text, text[-2000:]
        for bad in case.absent:
            assert bad not in (proc.stderr or "") + (proc.stdout or ""), (proc.stderr or "")[-2000:]
        case.left(ctx, proc)
    finally:
        if "socket" in ctx:
            ctx["socket"].close()
        ctx["tmpfs"].unmount_all()


def test_append_on_a_full_disk_is_cut_back(tmp_path):
    """Appending in place (the rows above) keeps what copying gave: a failed append on a full disk
    leaves the file as it was, not with part of the new lines (nor a temporary file)."""
    ctx = {"tmp": str(tmp_path), "tmpfs": Tmpfs()}
    try:
        _setup_append_full_disk(ctx)
        proc = subprocess.run([sys.executable, "-c", FULL_APPEND, ctx["log"]], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and "No space left" in proc.stderr, proc.stderr
        _left_append_cut_back(ctx, proc)
    finally:
        ctx["tmpfs"].unmount_all()
