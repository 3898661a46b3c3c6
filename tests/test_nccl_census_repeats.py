"""The census on logs that repeat themselves (issue 26, `nccl census` speed on the bench's fixtures
log: the fixture logs concatenated again and again): kernel-trace and malformed COLL lines are
parsed once per text, and lines of re-initialised pointers beyond a full handle table keep their
cache entry; every count stays what the census gives without those caches."""

from collbench.nccl import log_parser, scanner
from collbench.nccl.census import run_census
from conftest import FIXTURES

NCCL = FIXTURES / "nccl"


def counting(monkeypatch, name):
    """Count the calls of log_parser.<name> made by the scanner, by the type of their result."""
    calls = {}
    real = getattr(log_parser, name)

    def wrapped(line):
        got = real(line)
        calls[type(got).__name__] = calls.get(type(got).__name__, 0) + 1
        return got
    monkeypatch.setattr(scanner, name, wrapped)
    return calls


def uncached(monkeypatch, path, block=1 << 20):
    """The census with nothing kept by its text (every INIT, TUNING, kernel and malformed line parsed)."""
    with monkeypatch.context() as m:
        m.setattr(scanner.Scanner, "_keep_parsed", lambda self, line, parsed: None)
        return run_census([path], block=block).document()


def test_repeated_kernel_trace_and_garbage_lines_are_parsed_once(monkeypatch, tmp_path):
    data = b"".join((NCCL / n).read_bytes() for n in ("rccl-rocm6-kerneltrace.log", "garbage.log"))
    once, again = tmp_path / "once.log", tmp_path / "again.log"
    once.write_bytes(data)
    again.write_bytes(data * 30)
    kernel, coll = counting(monkeypatch, "parse_kernel"), counting(monkeypatch, "parse_coll")
    run_census([str(once)])
    first_kernel, first_bad = kernel.get("KernelLine", 0), coll.get("Malformed", 0)
    assert first_kernel >= 8 and first_bad >= 5     # the fixtures' KL lines and garbled COLL lines
    kernel.clear()
    coll.clear()
    doc = run_census([str(again)]).document()
    assert kernel.get("KernelLine", 0) == first_kernel
    assert coll.get("Malformed", 0) <= first_bad + 2     # (at most a wrapped line's join tried again)
    assert doc["malformed_lines"] == 30 * run_census([str(once)]).document()["malformed_lines"]
    for block in (4096, 1 << 20):
        assert run_census([str(again)], block=block).document() == uncached(monkeypatch, str(again), block)


def test_reinitialised_pointers_beyond_a_full_handle_table_keep_their_entries(monkeypatch, tmp_path):
    monkeypatch.setattr(scanner, "MEMBERS_MAX", 4)
    lines = []
    for rep in range(40):
        for k in range(8):
            comm = f"0x{0x5000 + k * 0x100:x}"
            lines.append(f"h:1:1 [0] NCCL INFO ncclCommInitRank comm {comm} rank 0 nranks 2 cudaDev 0 "
                         f"commId 0x{k + 1:016x} - Init COMPLETE")
            for c in range(3):
                lines.append(f"h:1:1 [0] NCCL INFO AllReduce: opCount {c:x} sendbuff 0x10 recvbuff 0x10 count "
                             f"{1024 << c} datatype 7 op 0 root 0 comm {comm} [nranks=2] stream 0x7000")
    path = tmp_path / "reinit.log"
    path.write_text("\n".join(lines) + "\n")
    made = []
    real = scanner.Scanner._switch_entry

    def switch_entry(self, switch, pointer):
        if len(self.members) >= scanner.MEMBERS_MAX and pointer in self.comm_tokens:
            made.append(pointer)        # (a pointer no handle has takes the switch's one spill entry)
        return real(self, switch, pointer)
    monkeypatch.setattr(scanner.Scanner, "_switch_entry", switch_entry)
    monkeypatch.setattr(scanner, "STRIP_START", -1.0)     # comm pointers out of every block
    monkeypatch.setattr(scanner, "STRIP_STAY", -1.0)
    doc = run_census([str(path)], block=8192).document()
    assert doc["untracked_lines"] > 0
    # once the table is full, each (line, pointer of a handle) gets its entry once, not on every one
    # of its 40 repetitions (4 pointers, 3 lines)
    assert 0 < len(made) <= 4 * 3, made
    monkeypatch.setattr(scanner, "STRIP_START", 2.0)      # and the same census without them
    plain = run_census([str(path)], block=8192).document()
    assert doc == plain
