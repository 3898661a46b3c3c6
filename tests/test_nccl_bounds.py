"""The census' tables are bounded (issue 19 item 9): with each limit set small, a log with more
distinct handles, configurations, INIT lines, TUNING keys, counters or malformed reasons than the
limit is read to the end, what did not fit is counted and reported, and what did is exact. Also
the fast path for fresh buffer pointers on every line (issue 19 item 5) against the plain parser,
and wrapped COLL lines (item 6) at every block boundary."""

import random
from collections import Counter

import pytest

from collbench.nccl import scanner
from collbench.nccl.census import iter_calls, run_census
from collbench.nccl.log_parser import CollLine, parse_line
from conftest import FIXTURES

NCCL = FIXTURES / "nccl"


def coll(pid, op, count, comm, nranks, send, recv, dt=7, host="h", opcount=0):
    return (f"{host}:{pid}:{pid} [0] NCCL INFO {op}: opCount {opcount:x} sendbuff {send:#x} recvbuff {recv:#x} "
            f"count {count} datatype {dt} op 0 root 0 comm {comm} [nranks={nranks}] stream 0x7000")


def init(pid, comm, rank, nranks, comm_id, host="h"):
    return (f"{host}:{pid}:{pid} [0] NCCL INFO ncclCommInitRank comm {comm} rank {rank} nranks {nranks} "
            f"cudaDev 0 commId {comm_id} - Init COMPLETE")


def write(tmp_path, lines, name="a.log"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_rank_handles_beyond_the_table_are_counted_not_tracked(tmp_path, monkeypatch):
    monkeypatch.setattr(scanner, "MEMBERS_MAX", 20)
    lines = []
    for k in range(50):                 # 50 communicators of one process, two calls each
        comm = f"0x{0x5000 + k:x}"
        lines += [init(1, comm, 0, 1, f"0x{k + 1:x}"), coll(1, "AllReduce", 8, comm, 1, 0x10, 0x10),
                  coll(1, "AllReduce", 8, comm, 1, 0x10, 0x10, opcount=1)]
    c = run_census([write(tmp_path, lines)])
    assert len(c.communicators) == 20 and c.totals["collective_lines"] == 40
    assert c.totals["overflow"]["rank_handles"] == 60 and c.totals["untracked_lines"] == 60
    (g,) = c.groups
    assert g.rank_calls == 100 and g.calls == 2        # every line in the rank lines; calls from the tracked
    assert any("rank handles beyond the first 20" in w for w in c.warnings)


def test_configurations_beyond_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(scanner, "RECS_MAX", 5)
    lines = [coll(1, "AllReduce", 100 + k, "0x5", 1, 0x10, 0x10, opcount=k) for k in range(12)]
    c = run_census([write(tmp_path, lines)])
    assert sorted(g.count for g in c.groups) == [100, 101, 102, 103, 104]
    assert c.totals["overflow"]["configurations"] == 7
    assert any("configurations beyond the first 5" in w for w in c.warnings)


def test_pending_init_lines_tuning_keys_counters_and_reasons(tmp_path, monkeypatch):
    monkeypatch.setattr(scanner, "INIT_PENDING_MAX", 3)
    monkeypatch.setattr(scanner, "TUNING_KEYS_MAX", 4)
    monkeypatch.setattr(scanner, "COUNTERS_MAX", 6)
    monkeypatch.setattr(scanner, "REASONS_MAX", 3)
    lines = [init(1, f"0x{0x900 + k:x}", 0, 2, f"0x{k + 1:x}") for k in range(10)]     # never call
    lines += [f"h:1:1 [0] NCCL INFO AllReduce: {1024 * (k + 1)} Bytes -> Algo 1 proto 2 time 3.0" for k in range(9)]
    lines += [coll(1, "AllReduce", 10 + k, "0x5", 1, 0x10, 0x10, opcount=k) for k in range(10)]
    lines += [coll(1, f"Bogus{k}", 8, "0x5", 1, 0x10, 0x10) for k in range(8)]
    c = run_census([write(tmp_path, lines)])
    over = c.totals["overflow"]
    assert over["init_lines"] == 7 and over["tuning_keys"] == 5 and over["counters"] == 4
    assert len(c.totals["malformed_reasons"]) == 4 and c.totals["malformed_reasons"]["other reasons"] == 5
    assert c.totals["malformed_lines"] == 8
    assert sum(g.rank_calls for g in c.groups) == 10 and sum(g.calls for g in c.groups) == 6


def test_long_fields_cannot_make_large_table_entries(tmp_path):
    long = "0x" + "f" * 5000
    lines = [coll(1, "AllReduce", 8, long, 1, 0x10, 0x10), coll(1, "AllReduce", 8, "0x5", 1, 0x10, 0x10),
             init(1, "0x6", 0, 1, long)]
    c = run_census([write(tmp_path, lines)])
    assert c.totals["collective_lines"] == 1 and c.totals["malformed_lines"] == 2
    assert any("longer than 64 characters" in r for r in c.totals["malformed_reasons"])


# --- fresh pointers on every line --------------------------------------------------------------

def fresh_pointer_log(seed=3, ranks=4, steps=60):
    """Every call with new buffers: AllGather in place (send = recv + rank*count*size) and not,
    ReduceScatter in place (recv = send + rank*count*size) and not, AllReduce; `(nil)` too."""
    rnd = random.Random(seed)
    per_rank = []
    for r in range(ranks):
        out, ptr = [], 0x7f0000000000 + r * 0x10000000000
        for k in range(steps):
            ptr += rnd.randrange(1, 1 << 20) * 256
            count = (512, 4096)[k % 2]
            unit = count * 2
            for op, inplace in (("AllGather", True), ("AllGather", False), ("ReduceScatter", True),
                                ("ReduceScatter", False), ("AllReduce", True)):
                recv = ptr + 0x1000000
                if op == "AllGather" and inplace:
                    send = recv + r * unit
                elif op == "ReduceScatter" and inplace:
                    send, recv = recv, recv + r * unit
                elif inplace:
                    send = recv
                else:
                    send = ptr + rnd.randrange(1 << 30)
                out.append(coll(100 + r, op, count, f"0x5{r}", ranks, send, recv, dt=9, opcount=k))
            out.append(coll(100 + r, "AllGather", 8, f"0x5{r}", ranks, 0x10, 0x20).replace("sendbuff 0x10",
                                                                                            "sendbuff (nil)"))
        per_rank.append(out)
    merged = []
    its = [iter(x) for x in per_rank]
    order = [r for r, x in enumerate(per_rank) for _ in x]
    rnd.shuffle(order)
    for r in order:                     # interleaved, as a merged srun stdout gives them
        merged.append(next(its[r]))
    return merged


def plain_counts(lines):
    got = Counter()
    for line in lines:
        rec = parse_line(line.encode())
        if type(rec) is CollLine:
            got[(rec.op.name, rec.count, rec.inplace)] += 1
    return got


@pytest.mark.parametrize("block", [1 << 20, 4096, 997])
def test_fresh_pointers_counted_as_the_plain_parser_does(tmp_path, block):
    lines = fresh_pointer_log()
    want = plain_counts(lines)
    assert want[("AllGather", 512, True)] == 4 * 30 and want[("ReduceScatter", 4096, True)] == 4 * 30
    c = run_census([write(tmp_path, lines)], block=block)
    got = Counter({(g.op, g.count, g.inplace): g.rank_calls for g in c.groups})
    assert got == want and c.totals["malformed_lines"] == 0 and c.desync == []


# --- wrapped lines -------------------------------------------------------------------------------

def wrap(text, words):
    """Each COLL line wrapped after the words, as a terminal or an issue tracker shows it."""
    out = []
    for line in text.split("\n"):
        if ": opCount " in line:
            for word in words:
                line = line.replace(f" {word} 0x", f" {word}\n0x")
        out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("words", [("comm",), ("stream",), ("comm", "stream")])
def test_wrapped_lines_count_once_at_every_block_boundary(tmp_path, words):
    text = (NCCL / "rccl-429-mismatch.log").read_text()
    plain = run_census([write(tmp_path, text.splitlines(), "plain.log")]).document()
    path = write(tmp_path, wrap(text, words).splitlines(), "wrapped.log")
    for block in (1 << 20, 64, 150, 211, 333):
        doc = run_census([path], block=block).document()
        for key in ("groups", "communicator_sets", "desync", "collective_lines", "malformed_lines"):
            assert doc[key] == plain[key], (words, block, key)
        assert doc["wrapped_lines_joined"] == plain["collective_lines"]
    calls = [c.call for c in iter_calls([path])]
    assert len(calls) == plain["collective_lines"]


def test_a_line_cut_for_good_is_not_joined(tmp_path):
    good = coll(1, "AllReduce", 8, "0x5", 1, 0x10, 0x10)
    cut = good[:good.index(" 0x5 ")]                   # ends in " comm", the next line is another record
    c = run_census([write(tmp_path, [cut, good, cut])])
    assert c.totals["collective_lines"] == 1 and c.totals["malformed_lines"] == 2
    assert c.totals["wrapped_lines_joined"] == 0


def test_a_comm_pointer_reinitialised_inside_a_block_starts_a_new_handle(tmp_path):
    lines = [init(1, "0x5", 0, 1, "0xa")] + [coll(1, "AllReduce", 8, "0x5", 1, 0x10, 0x10, opcount=k)
                                             for k in range(3)]
    lines += [init(1, "0x5", 0, 1, "0xb")] + [coll(1, "AllReduce", 8, "0x5", 1, 0x10, 0x10, opcount=k)
                                              for k in range(4)]
    c = run_census([write(tmp_path, lines)])      # one block: the cached lines must not reach the old handle
    assert [(m["comm_id"], m["collectives"]) for m in c.communicators] == [("0xa", 3), ("0xb", 4)]


def test_a_communicator_per_step_is_counted_without_parsing_every_line(tmp_path, monkeypatch):
    """Lines that differ only in their comm and stream pointers (a job that makes a communicator
    per step) take a parsed line of the same shape: the same census, a handful of parses."""
    lines = []
    for k in range(40):
        for r in range(2):
            comm, stream = f"0x{0x5000 + 16 * k + r:x}", f"0x{0x9000 + 16 * k + r:x}"
            lines.append(init(100 + r, comm, r, 2, f"0x{k + 1:x}"))
            for j in range(3):
                recv = 0x7f0000000000 + (k << 24) + (j << 16)
                line = coll(100 + r, "AllGather", 64, comm, 2, recv + r * 64 * 4, recv, opcount=j)
                lines.append(line.replace("stream 0x7000", f"stream {stream}"))
    path = write(tmp_path, lines)
    parsed = []
    real = scanner.parse_coll
    monkeypatch.setattr(scanner, "parse_coll", lambda line: parsed.append(line) or real(line))
    fast = run_census([path]).document()
    n_fast = len(parsed)
    monkeypatch.setattr(scanner, "coll_shape", lambda line: (None, None, None))
    slow = run_census([path]).document()
    for key in ("groups", "communicators", "communicator_sets", "desync", "collective_lines"):
        assert fast[key] == slow[key], key
    assert fast["collective_lines"] == 240 and len(fast["communicators"]) == 80
    assert [(g["op"], g["inplace"], g["rank_calls"]) for g in fast["groups"]] == [("AllGather", True, 240)]
    assert n_fast < 10 < len(parsed) - n_fast
