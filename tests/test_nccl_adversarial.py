"""`collbench nccl census` and `collbench nccl replay` tried as an adversarial operator would
(issue 19 items 8 and 10): one table, each row an input, the exit code, a fragment of the message
and what must be left on disk afterwards. Every command is the real CLI in its own process; the
full-disk rows run on a small tmpfs mounted here (as root) and unmounted at the end; the
unreadable directory is read with the DAC-override capabilities dropped (root reads anything).
"""

import os
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

import pytest

from conftest import FIXTURES, REPO, is_root
from engine_helpers import engine_bin  # noqa: F401

NCCL = FIXTURES / "nccl"
TIMEOUT = 120
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
          "--inh-caps=-dac_override,-dac_read_search", "--"]


# --- logs ----------------------------------------------------------------------------------------

def coll(host, pid, op, count, comm, nranks, dt=7, redop=0, root=0, send=0x7f0000001000, recv=0x7f0000001000,
         opcount=0):
    return (f"{host}:{pid}:{pid} [0] NCCL INFO {op}: opCount {opcount:x} sendbuff {send:#x} recvbuff {recv:#x} "
            f"count {count} datatype {dt} op {redop} root {root} comm {comm} [nranks={nranks}] stream 0x7000")


def init(host, pid, comm, rank, nranks, comm_id):
    return (f"{host}:{pid}:{pid} [0] NCCL INFO ncclCommInitRank comm {comm} rank {rank} nranks {nranks} "
            f"cudaDev 0 busId 1b000 commId {comm_id} - Init COMPLETE")


def pair_log(path, count=1024, calls=3):
    """A consistent 2-rank job (INIT + AllReduce calls): census and replay read it."""
    lines = []
    for r in range(2):
        lines.append(init(f"gpu-{r}", 100 + r, f"0x55{r}0000", r, 2, "0xc0ffee"))
        lines += [coll(f"gpu-{r}", 100 + r, "AllReduce", count, f"0x55{r}0000", 2, opcount=k) for k in range(calls)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


# --- the table -------------------------------------------------------------------------------------

@dataclass
class Run:
    """What one row runs: `collbench nccl <verb> <args>` with its stdin and environment."""
    args: list
    verb: str = "census"
    stdin: Optional[bytes] = None
    env: dict = field(default_factory=dict)
    prefix: list = field(default_factory=list)
    close: tuple = ()           # standard fds the shell closed (`>&-` is 1, `<&-` is 0)


@dataclass
class Case:
    id: str
    setup: Callable             # (tmp_path, ctx) -> Run
    code: int
    fragment: str               # in stderr (or stdout, `where="out"`)
    after: Callable = None      # (tmp_path, result) -> None: asserts what is left on disk
    where: str = "err"
    replay: bool = False        # needs the engine and a config (runs real mpirun)


def _symlink_loop(tmp, ctx):
    os.symlink("b", tmp / "a")
    os.symlink("a", tmp / "b")
    return Run([str(tmp / "a")])


def _broken_symlink(tmp, ctx):
    os.symlink("gone.log", tmp / "link.log")
    return Run([str(tmp / "link.log")])


def _unreadable_dir(tmp, ctx):
    d = tmp / "locked"
    (d / "sub").mkdir(parents=True)
    pair_log(d / "sub" / "a.log")
    os.chmod(d, 0)
    ctx["restore"].append(lambda: os.chmod(d, 0o755))
    return Run([str(d)], prefix=NO_DAC if is_root() else [])


def _five_byte_gz(tmp, ctx):
    (tmp / "cut.log.gz").write_bytes(b"\x1f\x8b\x08\x00\x00")
    return Run([str(tmp / "cut.log.gz")])


def _stdin_full_tmpdir(tmp, ctx):
    data = (NCCL / "nccl-2.23-init-split.log").read_bytes() * 40
    return Run(["-"], stdin=data, env={"TMPDIR": str(ctx["full"]())})


def _no_spool_left(tmp, result):
    assert sorted(os.listdir(tmp / "full")) == ["filler"]


def _fifo_no_writer(tmp, ctx):
    os.mkfifo(tmp / "in.fifo")
    return Run([str(tmp / "in.fifo")])


def _stdout_closed(tmp, ctx):
    return Run([str(pair_log(tmp / "a.log"))], close=(1,))


def _stdin_closed(tmp, ctx):
    (tmp / "spool").mkdir()
    return Run(["-"], close=(0,), env={"TMPDIR": str(tmp / "spool")})


def _nothing_in(name):
    def check(tmp, result):
        assert os.listdir(tmp / name) == []
    return check


def _out_chardev(tmp, ctx):
    os.mknod(tmp / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))     # /dev/null's twin
    return Run([str(pair_log(tmp / "a.log")), "-o", str(tmp / "null")])


def _still_chardev(name):
    def check(tmp, result):
        assert stat.S_ISCHR(os.lstat(tmp / name).st_mode)
        assert not [n for n in os.listdir(tmp) if n.endswith(".tmp")]
    return check


def _out_fifo(tmp, ctx):
    os.mkfifo(tmp / "out.fifo")
    return Run([str(pair_log(tmp / "a.log")), "-o", str(tmp / "out.fifo")])


def _still_fifo(name):
    def check(tmp, result):
        assert stat.S_ISFIFO(os.lstat(tmp / name).st_mode)
        assert not [n for n in os.listdir(tmp) if n.endswith(".tmp")]
    return check


def _out_symlink(tmp, ctx):
    (tmp / "real.txt").write_text("old\n")
    os.symlink("real.txt", tmp / "link.txt")
    return Run([str(pair_log(tmp / "a.log")), "--format", "json", "-o", str(tmp / "link.txt")])


def _link_kept(suffix=None):
    def check(tmp, result):
        assert os.path.islink(tmp / "link.txt") and os.readlink(tmp / "link.txt") == "real.txt"
        text = (tmp / "real.txt").read_text()
        assert '"kind": "nccl_census"' in text if suffix is None else suffix in text
    return check


def _huge_count(tmp, ctx):
    lines = [coll("h", 1, "AllReduce", 8, "0x5", 1), coll("h", 1, "AllReduce", 2 ** 64, "0x5", 1)]
    return Run([str(write_lines(tmp / "a.log", lines)), "-v"])


def _nranks_conflict(tmp, ctx):
    lines = [init("h", 1, "0x5", 0, 2, "0xabc"), coll("h", 1, "AllReduce", 8, "0x5", 4)]
    return Run([str(write_lines(tmp / "a.log", lines))])


def _duplicate_rank(tmp, ctx):
    lines = []
    for pid in (1, 2):      # two processes, both "rank 0" of commId 0xabc
        lines += [init("h", pid, "0x5", 0, 2, "0xabc"), coll("h", pid, "AllReduce", 8, "0x5", 2)]
    return Run([str(write_lines(tmp / "a.log", lines))])


def _ranks_listed_once(tmp, ctx):
    """Three 2-rank jobs without INIT lines (one inferred set `nranks=2 #0`, ranks from RCCL's
    globalrank): job A's rank 1 issues another collective, so the finding lists the five others."""
    lines = []
    for job in "ABC":
        for r in range(2):
            host, pid, comm = f"{job}-{r}", 10 + r, f"0x{ord(job):x}{r}0"
            for k in range(3):
                count = 99 if (job, r, k) == ("A", 1, 1) else 8
                lines.append(coll(host, pid, "AllReduce", count, comm, 2, opcount=k) + f" task 0 globalrank {r}")
    return Run([str(write_lines(tmp / "a.log", lines))])


def _escape_sequences(tmp, ctx):
    lines = [init("evil\x1b[31m", 1, "0x5\x1b]0;owned\x07", 0, 1, "0xabc"),
             coll("evil\x1b[31m", 1, "AllReduce", 8, "0x5\x1b]0;owned\x07", 1)]
    return Run([str(write_lines(tmp / "a.log", lines)), "-v"])


def _no_raw_escape(tmp, result):
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout


def _wrapped(tmp, ctx):
    text = (NCCL / "nccl-2.23-init-split.log").read_text()
    wrapped = "\n".join(line.replace(" comm 0x", " comm\n0x").replace(" stream 0x", " stream\n0x")
                         if ": opCount " in line else line for line in text.split("\n"))
    return Run([str(write_lines(tmp / "wrapped.log", wrapped.splitlines()))])


def _replay(tmp, ctx, *extra):
    return Run([str(pair_log(tmp / "a.log")), "--config", ctx["config"](), "--iterations", "1", "--warmup", "0",
                "-q", *extra], verb="replay")


def _results_chardev(tmp, ctx):
    os.mknod(tmp / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return _replay(tmp, ctx, "--results", str(tmp / "null"))


def _results_fifo(tmp, ctx):
    os.mkfifo(tmp / "r.fifo")
    return _replay(tmp, ctx, "--results", str(tmp / "r.fifo"))


def _results_symlink(tmp, ctx):
    (tmp / "real.txt").write_text("")
    os.symlink("real.txt", tmp / "link.txt")
    return _replay(tmp, ctx, "--results", str(tmp / "link.txt"))


GIB = 1 << 30


def _results_1gb(tmp, ctx):
    big = tmp / "big.jsonl"
    with open(big, "wb") as f:      # sparse: a 1 GiB results log costs no disk
        f.write(b'{"type": "event"}\n')
        f.truncate(GIB)
        f.seek(GIB - 1)
        f.write(b"\n")
    ctx["inode"] = os.stat(big).st_ino
    return _replay(tmp, ctx, "--results", str(big))


def _appended_in_place(ctx):
    def check(tmp, result):
        st = os.stat(tmp / "big.jsonl")
        assert st.st_ino == ctx["inode"] and st.st_size > GIB
        with open(tmp / "big.jsonl", "rb") as f:
            assert f.read(18) == b'{"type": "event"}\n'
            f.seek(GIB)
            tail = f.read().decode()
        assert '"nccl_replay"' in tail and '"result"' in tail
    return check


def _o_full(tmp, ctx):
    return _replay(tmp, ctx, "-o", str(ctx["full"]() / "out.txt"))


def _results_full(tmp, ctx):
    return _replay(tmp, ctx, "--results", str(ctx["full"]() / "r.jsonl"))


def _full_left_whole(tmp, result):
    assert sorted(os.listdir(tmp / "full")) == ["filler"]     # no output, no temporary, no empty file


CASES = [
    Case("symlink-loop", _symlink_loop, 2, "symlink loop"),
    Case("broken-symlink", _broken_symlink, 2, "broken symlink (its target gone.log does not exist)"),
    Case("unreadable-directory", _unreadable_dir, 2, "cannot list directory: Permission denied"),
    Case("five-byte-gz", _five_byte_gz, 2, "gzip data cut short before its first line"),
    Case("stdin-full-tmpdir", _stdin_full_tmpdir, 2, "No space left on device; set TMPDIR", _no_spool_left),
    Case("fifo-without-writer", _fifo_no_writer, 2, "no process wrote to this FIFO within"),
    Case("stdout-closed", _stdout_closed, 2, "standard output is closed"),
    Case("stdin-closed", _stdin_closed, 2, "<stdin>: cannot open: standard input is closed", _nothing_in("spool")),
    Case("out-char-device", _out_chardev, 0, "", _still_chardev("null")),
    Case("out-fifo-without-reader", _out_fifo, 2, "FIFO has no reader", _still_fifo("out.fifo")),
    Case("out-symlink", _out_symlink, 0, "", _link_kept()),
    Case("count-above-2^64", _huge_count, 0, "count 18446744073709551616 above 2^64-1", where="out"),
    Case("init-nranks-vs-coll", _nranks_conflict, 0,
         "its INIT line says rank 0 of nranks 2 but its COLL lines say nranks=4", where="out"),
    Case("two-processes-rank-0", _duplicate_rank, 0, "rank 0 is claimed by two processes", where="out"),
    Case("ranks-listed-once", _ranks_listed_once, 0, "ranks 0-1 (5 rank handles) issued", where="out"),
    Case("escape-sequences", _escape_sequences, 0, "evil\\x1b[31m", _no_raw_escape, where="out"),
    Case("wrapped-lines", _wrapped, 0, "28 collective lines, 0 malformed, 28 joined from wrapped lines", where="out"),
    Case("replay-results-char-device", _results_chardev, 0, "", _still_chardev("null"), replay=True),
    Case("replay-results-fifo-without-reader", _results_fifo, 2, "--results", _still_fifo("r.fifo"), replay=True),
    Case("replay-results-symlink", _results_symlink, 0, "", _link_kept('"nccl_replay"'), replay=True),
    Case("replay-results-1gb-appended-in-place", _results_1gb, 0, "", None, replay=True),
    Case("replay-o-full-disk", _o_full, 2, "No space left on device", _full_left_whole, replay=True),
    Case("replay-results-full-disk", _results_full, 2, "No space left on device", _full_left_whole, replay=True),
]


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs at tmp_path/full, filled up; unmounted afterwards."""
    mounted = []

    def make():
        if mounted:
            return mounted[0]
        if not is_root():
            pytest.fail("the full-disk rows mount a tmpfs: run the suite as root")
        d = tmp_path / "full"
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], check=True)
        mounted.append(d)
        fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while os.write(fd, b"x" * 512):
                pass
        except OSError:     # ENOSPC: full
            pass
        finally:
            os.close(fd)
        return d
    yield make
    for d in mounted:
        subprocess.run(["umount", str(d)], check=True)


def run_case(run, tmp):
    env = dict(os.environ, **run.env)
    closing = run.close

    def preexec():
        for fd in closing:
            os.close(fd)
    argv = [*run.prefix, sys.executable, "-m", "collbench", "nccl", run.verb, *run.args]
    stdin = subprocess.PIPE if run.stdin is not None else None if 0 in closing else subprocess.DEVNULL
    return subprocess.run(argv, input=run.stdin, stdin=None if run.stdin is not None else stdin,
                          stdout=None if 1 in closing else subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                          env=env, timeout=TIMEOUT, preexec_fn=preexec if closing else None)


def check_case(case, tmp, ctx):
    run = case.setup(tmp, ctx)
    try:
        p = run_case(run, tmp)
    finally:
        for restore in ctx["restore"]:
            restore()
    out = (p.stdout or b"").decode("utf-8", "replace")
    err = (p.stderr or b"").decode("utf-8", "replace")
    p = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    assert p.returncode == case.code, (case.id, p.returncode, err[-2000:])
    assert case.fragment in (out if case.where == "out" else err), (case.id, out[-2000:], err[-2000:])
    assert "Traceback" not in err, (case.id, err)
    if case.after is not None:
        case.after(tmp, p)
    return p


@pytest.mark.parametrize("case", [c for c in CASES if not c.replay], ids=lambda c: c.id)
def test_census_adversarial(case, tmp_path, full_disk):
    check_case(case, tmp_path, {"full": full_disk, "restore": []})


@pytest.mark.mpi
@pytest.mark.parametrize("case", [c for c in CASES if c.replay], ids=lambda c: c.id)
def test_replay_adversarial(case, tmp_path, full_disk, engine_bin):  # noqa: F811
    def config():
        path = tmp_path / "cfg.yaml"
        path.write_text(f"ranks: 2\ntransport: shm\nengine_path: {engine_bin}\nstep_timeout: 120\n")
        return str(path)
    ctx = {"full": full_disk, "restore": [], "config": config}
    if case.id == "replay-results-1gb-appended-in-place":
        case = Case(case.id, case.setup, case.code, case.fragment, _appended_in_place(ctx), replay=True)
    check_case(case, tmp_path, ctx)


@pytest.mark.mpi
def test_replay_results_fifo_sigterm_leaves_no_temporary_file(tmp_path, engine_bin):  # noqa: F811
    """SIGTERM while the finished replay waits for a reader of its --results FIFO: it dies of the
    signal without hanging, the FIFO is still a FIFO and no temporary file is left beside it (the
    old writer opened the FIFO to read it, blocked forever, with its temporary copy made)."""
    import signal
    import time

    from collbench import proctree
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"ranks: 2\ntransport: shm\nengine_path: {engine_bin}\nstep_timeout: 120\n")
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "r.fifo")
    argv = [sys.executable, "-m", "collbench", "nccl", "replay", str(pair_log(tmp_path / "a.log")), "--config",
            str(cfg), "--iterations", "1", "--warmup", "0", "-q", "--results", str(out / "r.fifo")]
    p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + TIMEOUT
        seen_job = False
        while time.monotonic() < deadline and p.poll() is None:    # the MPI job comes and goes ...
            kids = proctree.child_pids(p.pid)
            seen_job = seen_job or bool(kids)
            if seen_job and not kids:
                break
            time.sleep(0.02)
        assert seen_job and p.poll() is None, p.stderr.read() if p.poll() is not None else "no MPI job seen"
        time.sleep(0.5)                                           # ... then the writer waits for a reader
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert rc in (-signal.SIGTERM, 143), rc
    assert os.listdir(out) == ["r.fifo"] and stat.S_ISFIFO(os.lstat(out / "r.fifo").st_mode)


def test_census_fifo_whose_writer_comes_late_is_read(tmp_path):
    """The FIFO is opened without blocking, but a writer that opens it a second later (within the
    wait) is still read to its end, as <(ssh node cat log) gives it."""
    import threading
    import time
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    data = pair_log(tmp_path / "a.log", calls=50).read_bytes()

    def feed():
        time.sleep(1.0)
        with open(fifo, "wb") as f:
            for k in range(0, len(data), 1000):     # in pieces, with pauses
                f.write(data[k:k + 1000])
                f.flush()
                time.sleep(0.01)
    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    p = run_case(Run([str(fifo), "--format", "json"]), tmp_path)
    writer.join(timeout=30)
    assert p.returncode == 0, p.stderr
    assert b'"collective_lines": 100' in p.stdout
