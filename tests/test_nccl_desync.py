"""Desync finder: real mismatches are found and located exactly; consistent logs give no finding
however their ranks' lines are interleaved (shuffled, per-rank files, one file after another on
stdin), with communicators known by commId or only inferred, and with the digests' block merging."""

import json
import random
import subprocess
import sys

import pytest

from collbench.nccl import desync
from collbench.nccl.census import run_census
from conftest import REPO

COLLBENCH = REPO / ".venv" / "bin" / "collbench"
NRANKS = 8
TP = 2
WORLD_ID = "0x7a3b9c1d2e4f5061"


class Rank:
    def __init__(self, r):
        self.r = r
        self.host = f"node{r // 4}"
        self.pid = 40000 + r
        self.prefix = f"{self.host}:{self.pid}:{self.pid} [{r % 4}] NCCL INFO "
        self.world = hex(0x55d000000000 + r * 0x10000)
        self.tp = hex(0x55e000000000 + r * 0x10000)
        self.stream = hex(0x55f000000000 + r * 0x100)
        self.opc = 0


def coll(rk, comm, nranks, op, count, dt, redop=0, root=0, inplace=True):
    rk.opc += 1
    send = 0x7f0000000000 + rk.r * 0x100000000 + (rk.opc % 97) * 0x100000
    recv = send if inplace else send + 0x40000
    return (f"{rk.prefix}{op}: opCount {rk.opc:x} sendbuff {hex(send)} recvbuff {hex(recv)} count {count} "
            f"datatype {dt} op {redop} root {root} comm {comm} [nranks={nranks}] stream {rk.stream}")


def p2p(rk, op, peer, count):
    rk.opc += 1
    buf = hex(0x7e0000000000 + rk.r * 0x100000000 + peer * 0x1000)
    return (f"{rk.prefix}{op}: opCount {rk.opc:x} sendbuff (nil) recvbuff {buf} count {count} datatype 7 op 0 "
            f"root {peer} comm {rk.world} [nranks={NRANKS}] stream {rk.stream}")


def make_job(steps, init=True, tp_counts=None, p2p_every=10, edit=None):
    """Per-rank line lists of a job: world AllReduce, tensor-parallel AllGather/ReduceScatter, every
    p2p_every steps an all-to-all as a Send/Recv group (each rank from its own rank on).
    edit(rank, step, lines_of_this_step) may change a rank's lines (to make a desync)."""
    ranks = [Rank(r) for r in range(NRANKS)]
    out = {}
    for rk in ranks:
        lines = []
        if init:
            lines.append(f"{rk.prefix}ncclCommInitRank comm {rk.world} rank {rk.r} nranks {NRANKS} cudaDev "
                         f"{rk.r % 4} nvmlDev {rk.r % 4} busId {0x1000 * (rk.r + 1):x} commId {WORLD_ID} "
                         f"- Init COMPLETE")
            lines.append(f"{rk.prefix}ncclCommSplit comm {rk.tp} rank {rk.r % TP} nranks {TP} cudaDev {rk.r % 4} "
                         f"nvmlDev {rk.r % 4} busId {0x1000 * (rk.r + 1):x} parent {rk.world} splitCount 1 color "
                         f"{rk.r // TP} key {rk.r % TP} commId 0x{0x5100 + rk.r // TP:016x} - Init COMPLETE")
        for step in range(steps):
            cur = []
            ag = (tp_counts or {}).get(rk.r // TP, 4096)
            cur.append(coll(rk, rk.tp, TP, "AllGather", ag * (1 + step % 3), 9, inplace=False))
            cur.append(coll(rk, rk.tp, TP, "ReduceScatter", ag, 9, inplace=False))
            cur.append(coll(rk, rk.world, NRANKS, "AllReduce", 1000 + step % 7, 7))
            if step % p2p_every == p2p_every - 1:
                for j in range(NRANKS):
                    peer = (rk.r + j) % NRANKS
                    cur.append(p2p(rk, "Send", peer, 64))
                    cur.append(p2p(rk, "Recv", peer, 64))
            if step % 50 == 0:
                cur.append(f"{rk.prefix}Channel 00/02 :    0   1   2   3   4   5   6   7")
            if edit:
                cur = edit(rk, step, cur)
            lines.extend(cur)
        out[rk.r] = lines
    return out


def shuffled(per_rank, seed=1):
    """One merged log: a random interleaving that keeps each rank's own order."""
    rnd = random.Random(seed)
    idx = {r: 0 for r in per_rank}
    live = [r for r in per_rank if per_rank[r]]
    out = []
    while live:
        r = rnd.choice(live)
        burst = rnd.randrange(1, 40)
        out.extend(per_rank[r][idx[r]:idx[r] + burst])
        idx[r] += burst
        if idx[r] >= len(per_rank[r]):
            live.remove(r)
    return out


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def layouts(tmp_path, per_rank):
    """The same job as one shuffled file, and as a directory of per-rank files (read one after another)."""
    merged = write(tmp_path / "merged.log", shuffled(per_rank))
    d = tmp_path / "ranks"
    d.mkdir()
    for r, lines in per_rank.items():
        write(d / f"node{r // 4}.{40000 + r}.log", lines)
    return {"merged": [merged], "per-rank files": [str(d)]}


def cli(args, stdin=None):
    exe = [str(COLLBENCH)] if COLLBENCH.exists() else [sys.executable, "-m", "collbench"]
    return subprocess.run(exe + ["nccl", "census", *args], input=stdin, capture_output=True, timeout=300, cwd=REPO)


# --- consistent logs: no false positives ------------------------------------------------------------

def test_consistent_job_has_no_findings_in_any_layout(tmp_path):
    per_rank = make_job(steps=700)
    for name, paths in layouts(tmp_path, per_rank).items():
        c = run_census(paths)
        assert c.desync == [], (name, c.desync)
        sets = {s["key"]: s for s in c.sets}
        assert sets[f"commId {WORLD_ID}"]["status"] == "consistent" and sets[f"commId {WORLD_ID}"]["members"] == 8
        assert sum(1 for s in c.sets if s["source"] == "commId") == 1 + NRANKS // TP
        assert all(s["status"] == "consistent" for s in c.sets), name
        send = next(g for g in c.groups if g.op == "Send")
        assert (send.rank_calls, send.calls) == (70 * 8 * 8, 70 * 8)
    # every rank's file after the other on stdin: the worst order for a bounded window
    cat = "\n".join(line for r in sorted(per_rank) for line in per_rank[r]) + "\n"
    r = cli(["-", "--format", "json", "--fail-on-desync"], stdin=cat.encode())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["desync"] == []


def test_inferred_communicators_without_init_lines(tmp_path):
    # pipeline-like: each tensor-parallel group gathers a different size; without commIds the four
    # groups share one inferred set, which must read as four communicators, not as a desync
    per_rank = make_job(steps=300, init=False, tp_counts={0: 1024, 1: 2048, 2: 3072, 3: 4096})
    for name, paths in layouts(tmp_path, per_rank).items():
        c = run_census(paths)
        assert c.desync == [], (name, c.desync)
        sets = {s["key"]: s for s in c.sets}
        tp = sets["nranks=2 #0"]
        assert tp["source"] == "inferred" and tp["members"] == 8 and "4 communicators" in tp["note"]
        world = sets["nranks=8 #0"]
        assert world["status"] == "consistent" and "Send/Recv not checked" in world["note"]


# --- real desyncs, located exactly ------------------------------------------------------------------

def test_mismatch_is_located_in_every_layout(tmp_path):
    def edit(rk, step, lines):
        if rk.r == 5 and step == 612:
            lines[2] = lines[2].replace("count 1003 ", "count 1004 ")
        return lines
    per_rank = make_job(steps=700, edit=edit)
    for name, paths in layouts(tmp_path, per_rank).items():
        c = run_census(paths)
        assert len(c.desync) == 1, (name, c.desync)
        f = c.desync[0]
        assert (f["kind"], f["set"], f["position"], f["exact"]) == ("mismatch", f"commId {WORLD_ID}", 613, True)
        majority, minority = f["sides"]
        assert majority["ranks"] == [0, 1, 2, 3, 4, 6, 7] and minority["ranks"] == [5]
        assert majority["issued"] == {"op": "AllReduce", "count": 1003, "datatype": "float32", "redop": "sum",
                                      "root": None}
        assert minority["issued"]["count"] == 1004
        assert minority["members"][0] == {"host": "node1", "pid": 40005, "comm": per_rank_world(5), "rank": 5}
        assert "collective #613 differs: ranks 0-4,6-7 issued AllReduce count=1003" in f["message"]
        assert {s["key"]: s["status"] for s in c.sets}[f"commId {WORLD_ID}"] == "desync"
    cat = "\n".join(line for r in sorted(per_rank) for line in per_rank[r]) + "\n"
    r = cli(["-", "--format", "json", "--fail-on-desync"], stdin=cat.encode())
    assert r.returncode == 1, r.stderr
    assert [f["position"] for f in json.loads(r.stdout)["desync"]] == [613]


def per_rank_world(r):
    return hex(0x55d000000000 + r * 0x10000)


def test_rank_that_stopped_is_the_hang_suspect(tmp_path):
    def edit(rk, step, lines):
        if rk.r == 3 and step >= 450:
            return [] if step > 450 else lines[:2]  # rank 3 did its TP calls of step 450, then nothing
        return lines
    per_rank = make_job(steps=500, edit=edit)
    c = run_census([write(tmp_path / "job.log", shuffled(per_rank, seed=5))])
    world = [f for f in c.desync if f["set"] == f"commId {WORLD_ID}" and f["kind"] == "stopped"]
    assert len(world) == 1, c.desync
    f = world[0]
    assert f["position"] == 451 and f["exact"]
    short = next(s for s in f["sides"] if s["ranks"] == [3])
    assert short["issued"] is None and short["collectives"] == 450
    assert "rank 3 stopped after 450 collectives while ranks 0-2,4-7 went on to collective #451 (AllReduce " \
           "count=1002 float32 sum)" in f["message"]
    # its tensor-parallel partner (rank 2) went on without it too; every finding involves its process
    def pids(f):
        found = {f[k]["pid"] for k in ("sender", "receiver") if k in f}
        return found | {m["pid"] for s in f.get("sides", ()) for m in s["members"]}
    assert all(40003 in pids(f) for f in c.desync)
    tp = [f for f in c.desync if f["set"] == "commId 0x0000000000005101"]
    assert [(f["kind"], f["position"]) for f in tp] == [("stopped", 903)]
    stopped = next(s for s in tp[0]["sides"] if s["members"][0]["pid"] == 40003)
    assert stopped["ranks"] == [1] and stopped["issued"] is None and stopped["collectives"] == 902


def test_p2p_mismatch_and_unmatched_receive(tmp_path):
    def edit(rk, step, lines):
        if rk.r == 2 and step == 129:           # the 13th all-to-all: rank 2 sends 65 floats to rank 6
            lines = [l.replace("count 64 ", "count 65 ") if "Send:" in l and "root 6 " in l else l for l in lines]
        if rk.r == 1 and step == 199:           # rank 1 posts one receive from rank 4 nobody sends
            lines.append(p2p(rk, "Recv", 4, 64))
        return lines
    per_rank = make_job(steps=250, edit=edit)
    for name, paths in layouts(tmp_path, per_rank).items():
        c = run_census(paths)
        kinds = sorted((f["kind"], f["sender"]["rank"], f["receiver"]["rank"], f["position"]) for f in c.desync)
        assert kinds == [("p2p_mismatch", 2, 6, 13), ("p2p_unmatched", 4, 1, 26)], (name, c.desync)
        mism = next(f for f in c.desync if f["kind"] == "p2p_mismatch")
        assert mism["sent"] == {"op": "Send/Recv", "count": 65, "datatype": "float32"}
        assert mism["received"]["count"] == 64
        unm = next(f for f in c.desync if f["kind"] == "p2p_unmatched")
        assert (unm["sends"], unm["receives"]) == (25, 26)
        assert "rank 1 posted receive #26 from rank 4" in unm["message"]


def test_desync_inside_an_inferred_set(tmp_path):
    def edit(rk, step, lines):
        if rk.r == 6 and step == 77:
            lines[1] = lines[1].replace("ReduceScatter", "AllReduce")
        return lines
    per_rank = make_job(steps=120, init=False, edit=edit)
    c = run_census([write(tmp_path / "job.log", shuffled(per_rank, seed=9))])
    assert len(c.desync) == 1, c.desync
    f = c.desync[0]
    assert (f["set"], f["source"], f["position"]) == ("nranks=2 #0", "inferred", 2 * 77 + 2)
    assert f["sides"][1]["members"][0]["pid"] == 40006 and f["sides"][1]["issued"]["op"] == "AllReduce"
    assert "(inferred)" in f["message"]


# --- the digests: block merging keeps the answer exact ---------------------------------------------

@pytest.mark.parametrize("where", [0, 5, 333, 1499, 1500])
def test_small_blocks_and_merging_locate_exactly(tmp_path, monkeypatch, where):
    monkeypatch.setattr(desync, "BLOCK0", 4)
    monkeypatch.setattr(desync, "MAX_BLOCKS", 4)

    def edit(rk, step, lines):
        if rk.r == 7 and step == where:
            lines[2] = lines[2].replace("datatype 7 op 0", "datatype 8 op 0")
        return lines
    per_rank = make_job(steps=1501, edit=edit, p2p_every=100000)
    d = tmp_path / "ranks"
    d.mkdir()
    for r, lines in per_rank.items():
        write(d / f"rank{r}.log", lines)
    c = run_census([str(d)])
    assert [(f["kind"], f["position"], f["sides"][1]["ranks"]) for f in c.desync] == [("mismatch", where + 1, [7])]
    assert c.desync[0]["sides"][1]["issued"]["datatype"] == "float64"


def test_small_blocks_consistent(tmp_path, monkeypatch):
    monkeypatch.setattr(desync, "BLOCK0", 4)
    monkeypatch.setattr(desync, "MAX_BLOCKS", 4)
    per_rank = make_job(steps=900, p2p_every=7)
    c = run_census([write(tmp_path / "job.log", shuffled(per_rank, seed=3))])
    assert c.desync == [] and all(s["status"] == "consistent" for s in c.sets)


def test_sequence_digest_window_holds_the_first_difference(monkeypatch):
    monkeypatch.setattr(desync, "BLOCK0", 2)
    monkeypatch.setattr(desync, "MAX_BLOCKS", 2)
    rnd = random.Random(4)
    for _ in range(200):
        n = rnd.randrange(1, 300)
        a = [rnd.randrange(3) for _ in range(n)]
        b = list(a)
        pos = rnd.randrange(n + 1)
        if pos == n:
            b.append(9)             # b goes on after a ends
        else:
            b[pos] = 9
            if rnd.random() < 0.5:
                b = b[:rnd.randrange(pos + 1, n + 1)]
        da, db = desync.SequenceDigest(), desync.SequenceDigest()
        for seq, d in ((a, da), (b, db)):
            i = 0
            while i < len(seq):     # feed in random slices, as blocks of a log would
                k = rnd.randrange(1, 50)
                d.feed(seq[i:i + k])
                i += k
        assert da.fingerprint() != db.fingerprint()
        lo, hi = desync.window(da, db)
        assert lo <= pos < hi, (n, pos, lo, hi)
        same = desync.SequenceDigest()
        same.feed(list(a))
        assert same.fingerprint() == da.fingerprint()
