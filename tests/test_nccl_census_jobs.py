"""The census on logs of many short jobs (issue 26, `nccl census` speed on the bench's mixed log):
a new job's COLL lines differ from an earlier job's only in their host:pid:tid and pointers, so
they are not parsed again (the parsed line is kept by its shape without those), and a new job's
lines, which miss the caches because of their pids, do not make the scanner take the comm pointers
out of the next blocks; every count stays what the census gives without that cache."""

from collbench.nccl import scanner
from collbench.nccl.census import run_census


def jobs_log(tmp_path, jobs=40, ranks=4, steps=6, stamp=False):
    """`jobs` jobs one after the other, each of `ranks` new processes (new pids) with one
    communicator (a pointer and commId per job), AllReduce, Broadcast and an AllGather whose buffers
    are NCCL's in-place offset on even steps; with stamp, NCCL's timestamp before every line."""
    lines = []
    for j in range(jobs):
        comm = f"0x{0x7f00a000 + 0x100 * j:x}"
        for r in range(ranks):
            pid = 1000 + j * ranks + r
            lines.append(f"node{r % 2}:{pid}:{pid + 7} [{r}] NCCL INFO ncclCommInitRank comm {comm} rank {r} "
                         f"nranks {ranks} cudaDev {r} busId {r}000 commId 0x{j + 1:x} - Init COMPLETE")
        for s in range(steps):
            for r in range(ranks):
                pid = 1000 + j * ranks + r
                head = f"node{r % 2}:{pid}:{pid + 7} [{r}] NCCL INFO "
                tail = f"comm {comm} [nranks={ranks}] stream 0x{0x9000 + r:x}"
                recv = 0x7e0000000000 + 0x100000 * j
                send = recv + (r * 64 * 4 if s % 2 == 0 else 0x80000)
                for k, text in enumerate((
                        f"AllReduce: opCount {s:x} sendbuff 0x10 recvbuff 0x10 count {1024 << (s % 3)} datatype 7 "
                        f"op 0 root 0 {tail}",
                        f"Broadcast: opCount {s:x} sendbuff 0x20 recvbuff 0x30 count 99 datatype 0 op 0 root 1 {tail}",
                        f"AllGather: opCount {s:x} sendbuff {send:#x} recvbuff {recv:#x} count 64 datatype 7 op 0 "
                        f"root 0 {tail}")):
                    prefix = f"[2024-05-01 10:{j % 60:02d}:{s:02d}.{r}{k}0] " if stamp else ""
                    lines.append(prefix + head + text)
    path = tmp_path / ("stamped.log" if stamp else "jobs.log")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def without_job_shapes(monkeypatch, path, block):
    """The census with a parsed line kept only by its whole shape (host:pid:tid included)."""
    with monkeypatch.context() as m:
        m.setattr(scanner, "job_shape", lambda shape: None)
        return run_census([path], block=block).document()


def test_a_new_jobs_lines_are_not_parsed_again(monkeypatch, tmp_path):
    path = jobs_log(tmp_path)
    parsed = []
    real = scanner.parse_coll
    monkeypatch.setattr(scanner, "parse_coll", lambda line: parsed.append(line) or real(line))
    doc = run_census([path]).document()
    # at most 6 line forms (AllReduce's 3 sizes, Broadcast, AllGather in place and at an offset) on
    # each of 4 devices: the first job's lines are parsed; the old scanner parsed every job's (40 times)
    assert 0 < len(parsed) <= 4 * 6, len(parsed)
    comms = doc["communicators"]
    assert len(comms) == 40 * 4
    # each handle is its own process's, with the calls it made
    assert sorted(c["pid"] for c in comms) == list(range(1000, 1000 + 160))
    assert {c["collectives"] for c in comms} == {6 * 3}
    for block in (4096, 65536, 1 << 20):
        assert run_census([path], block=block).document() == without_job_shapes(monkeypatch, path, block)


def test_new_jobs_do_not_take_the_comm_pointers_out(monkeypatch, tmp_path):
    """New jobs' lines (new pids, a new timestamp on every line) miss the caches, but not because of
    their comm pointers: no block is stripped. A process that makes a communicator per step still is."""
    calls = []
    real = scanner.strip_comms
    monkeypatch.setattr(scanner, "strip_comms", lambda chunk, out: calls.append(1) or real(chunk, out))
    for stamp in (False, True):
        path = jobs_log(tmp_path, jobs=60, steps=4, stamp=stamp)
        got = run_census([path], block=8192).document()
        assert calls == [], stamp
        with monkeypatch.context() as m:
            m.setattr(scanner, "STRIP_START", -1.0)       # the same census with every block stripped
            m.setattr(scanner, "STRIP_STAY", -1.0)
            assert run_census([path], block=8192).document() == got
        calls.clear()
    lines = [f"h:1:1 [0] NCCL INFO AllReduce: opCount {k:x} sendbuff 0x10 recvbuff 0x10 count 8 datatype 7 op 0 "
             f"root 0 comm 0x{0x5000 + 16 * k:x} [nranks=1] stream 0x7000" for k in range(400)]
    path = tmp_path / "per-step.log"
    path.write_text("\n".join(lines) + "\n")
    run_census([str(path)], block=8192)
    assert len(calls) >= 5


def test_marker_text_check_is_the_three_searches():
    """The block check for normalize_chunk's markers written in the log itself (memchr for `~` and
    `^` first) answers as the three searches do."""
    from collbench.nccl.log_parser import MARKER_TEXTS, marker_text_in
    line = b"h:1:1 [0] NCCL INFO AllReduce: opCount 3 sendbuff 0x10 recvbuff 0x10 count 8 datatype 7 op 0\n"
    for extra in (b"", b" opCount = ", b" opCount ~ ", b" opCount ^ ", b"~^ opCount  ^", b"opCount ~", b"a ~ b ^ c"):
        for chunk in (line * 50 + extra, extra + line, extra):
            assert marker_text_in(chunk) == any(m in chunk for m in MARKER_TEXTS), chunk[-20:]
    assert marker_text_in(b"x opCount ~ y") and not marker_text_in(b"x opCount 1 ~ ^")
