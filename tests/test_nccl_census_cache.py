"""The census' line caches against the plain parse (issue 26, `nccl census` speed): lines that differ
only by their comm pointer (a communicator per step, pointers re-initialised all along) are cached
per pointer and not parsed again, and every count stays what the plain parse gives; COLL lines
without a host:pid:tid prefix are counted per line, cached or not; the pass makes no reference
cycles (it runs with the cyclic garbage collector off)."""

import gc

from collbench.nccl import scanner
from collbench.nccl.census import run_census
from collbench.nccl.log_input import expand_paths
from conftest import FIXTURES

NCCL = FIXTURES / "nccl"
KEYS = ("groups", "communicators", "communicator_sets", "desync", "collective_lines", "malformed_lines",
        "inconsistencies", "untracked_lines", "overflow", "warnings")


def coll(pid, op, count, comm, nranks, send, recv, opcount=0, prefix=None):
    head = f"h:{pid}:{pid} [0] NCCL INFO " if prefix is None else prefix
    return (f"{head}{op}: opCount {opcount:x} sendbuff {send:#x} recvbuff {recv:#x} count {count} datatype 7 "
            f"op 0 root 0 comm {comm} [nranks={nranks}] stream 0x7000")


def init(pid, comm, rank, nranks, comm_id):
    return (f"h:{pid}:{pid} [0] NCCL INFO ncclCommInitRank comm {comm} rank {rank} nranks {nranks} cudaDev 0 "
            f"commId {comm_id} - Init COMPLETE")


def write(tmp_path, lines, name="a.log"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def plain(monkeypatch, path, block=1 << 20):
    """The census with the comm pointers left in every block's lines (nothing cached per pointer)."""
    with monkeypatch.context() as m:
        m.setattr(scanner, "STRIP_START", 2.0)
        return run_census([path], block=block).document()


def test_lines_without_a_prefix_are_counted_every_time(tmp_path):
    """The warning counts every COLL line without a host:pid:tid prefix; the old scanner counted
    only those it parsed (1 of 7 here: the others came from the line cache)."""
    stripped = coll(1, "AllReduce", 8, "0x5000", 2, 0x10, 0x10, prefix="NCCL INFO ")
    lines = [coll(1, "AllReduce", 8, "0x5000", 2, 0x10, 0x10, opcount=k) for k in range(3)] + [stripped] * 7
    kernel = "h:1:1 [0] NCCL INFO ## [0.000000] [0:0] 0 KL HWID 42 ncclDevFunc_AllReduce_RING_LL_Sum_f32 nw 4"
    for name, log in (("plain.log", lines), ("kernel-trace.log", lines + [kernel])):
        c = run_census([write(tmp_path, log, name)])
        assert any(w.startswith("7 COLL lines had no host:pid:tid prefix") for w in c.warnings), (name, c.warnings)


def test_reinitialised_pointers_are_not_parsed_again(tmp_path, monkeypatch):
    """Two processes re-initialise the same two comm pointers 30 times (a log of the same job
    concatenated, or a job that re-creates its communicators): every handle counts its own calls,
    as with the pointers left in, and once the blocks miss the caches (the first block) and their
    pointers are taken out, a line takes the slow path once, not once a handle."""
    lines = []
    for k in range(30):
        for pid in (1, 2):
            comm = f"0x{0x5000 + 16 * (k % 2) + pid:x}"
            lines.append(init(pid, comm, pid - 1, 2, f"0x{k + 1:x}"))
            lines += [coll(pid, "AllReduce", 8 << j, comm, 2, 0x10, 0x10, opcount=j) for j in range(3)]
    path = write(tmp_path, lines)
    shaped = []         # every COLL line of the slow path (_coll) is looked up by its shape
    real = scanner.coll_shape
    monkeypatch.setattr(scanner, "coll_shape", lambda line: shaped.append(line) or real(line))
    fast = run_census([path], block=2048).document()
    n_fast = len(shaped)
    slow = plain(monkeypatch, path, block=2048)
    for key in KEYS:
        assert fast[key] == slow[key], key
    assert len(fast["communicators"]) == 60 and {m["collectives"] for m in fast["communicators"]} == {3}
    assert n_fast < 40 and len(shaped) - n_fast == 180, (n_fast, len(shaped) - n_fast)


def test_comm_marker_in_the_input_and_every_block_size(tmp_path, monkeypatch):
    """The marker strip_comms leaves, written in the log itself, and blocks that cut anywhere: the
    census the plain parse gives."""
    lines = []
    for k in range(40):
        comm = f"0x{0x5000 + k % 5:x}"
        if k % 7 == 0:
            lines.append(init(1, comm, 0, 2, f"0x{k + 1:x}"))
        lines.append(coll(1, "AllGather", 64, comm, 2, 0x7f0000001000 + k, 0x7f0000001000, opcount=k))
        lines.append(coll(1, "AllReduce", 8, comm, 2, 0x10, 0x10, opcount=k))
        if k == 20:
            lines.append(coll(1, "AllReduce", 8, "*", 2, 0x10, 0x10))    # `comm * [nranks=2]` as logged
    path = write(tmp_path, lines)
    want = plain(monkeypatch, path)
    for block in (1 << 20, 4096, 1024, 333):
        got = run_census([path], block=block).document()
        for key in KEYS:
            assert got[key] == want[key], (block, key)
    assert any(m["comm"] == "*" for m in want["communicators"])


def test_the_pass_makes_no_reference_cycles(tmp_path):
    """scan() turns the cyclic collector off: whatever a log holds (every fixture, again and again:
    re-initialised pointers, garbage, kernel traces, wrappers), nothing it made is left for the
    collector to find."""
    data = b"".join(p.read_bytes() for p in sorted(NCCL.glob("*.log")))
    log = tmp_path / "all.log"
    log.write_bytes(data * 20)
    sources = expand_paths([str(log)], [])
    gc.collect()
    s = scanner.Scanner()
    scanner.scan(sources, s, {}, [], 4096)
    assert gc.isenabled()
    assert gc.collect() == 0
    assert s.members and s.malformed and s.kernel_lines
