"""Desync finder: on one communicator every rank must issue the same collectives in the same order.

Memory stays bounded whatever the interleaving of the input (ranks' lines mixed in any order, or
one rank's whole file after another's): each rank's sequence of collective signatures (op, count,
datatype, reduction op, root) is reduced to a `SequenceDigest`, block hashes whose block size
doubles so that at most 2*MAX_BLOCKS of them are kept, plus the not-yet-hashed tail. Two ranks
with equal sequences have equal digests; where digests differ, the first differing block bounds
the position, and a second pass over the input (or the tails still in memory) collects just that
window to name the exact call and what each rank issued.

Send/Recv are not positional: ranks that take no part in a pipeline stage's p2p issue none, and a
group's sends and receives may be logged in any order. NCCL matches the k-th send from s to d with
the k-th receive at d from s, so each ordered pair's sequence of (count, datatype) is hashed on both
sides (`PairDigest`) and compared: that is order-free across peers within a group and exact per pair.

Which ranks form one communicator: the commId of the INIT lines (NCCL >= 2.16) when present;
otherwise an inferred set, the k-th communicator of a process with that nranks (and rank, when
RCCL's globalrank or a pre-2.16 INIT line gives it). An inferred set can merge several real
communicators of the same size (tensor-parallel groups of different pipeline stages); such a set is
split into clusters of equal sequences, and clusters whose sizes are whole multiples of nranks are
taken for separate communicators, not a desync. Findings from inferred sets say so.
"""

BLOCK0 = 64             # first block size (calls); small logs locate from the digest alone
MAX_BLOCKS = 256        # blocks kept per rank (up to twice as many) before pairs merge and the size doubles
P2P_LOCATE_CAP = 200_000  # p2p signatures collected per side when locating a pair's mismatch
SHOW_MEMBERS = 16       # members listed per side of a finding


class SequenceDigest:
    """A rank's sequence of signature ids in bounded memory (see module doc)."""

    __slots__ = ("n", "bs", "blocks", "pend")

    def __init__(self):
        self.n = 0
        self.bs = BLOCK0
        self.blocks = []
        self.pend = []

    def feed(self, ids):
        pend = self.pend
        pend.extend(ids)
        self.n += len(ids)
        bs = self.bs
        if len(pend) < bs:
            return
        blocks = self.blocks
        off = 0
        while len(pend) - off >= bs:
            blocks.append(hash(tuple(pend[off:off + bs])))
            off += bs
            if len(blocks) == 2 * MAX_BLOCKS:
                blocks = self.blocks = [hash((blocks[i], blocks[i + 1])) for i in range(0, len(blocks), 2)]
                bs = self.bs = bs * 2
        del pend[:off]

    @property
    def tail_start(self):
        """Position of pend[0]: everything from here on is still in memory."""
        return len(self.blocks) * self.bs

    def fingerprint(self):
        return self.n, self.bs, tuple(self.blocks), tuple(self.pend)

    def blocks_at(self, bs):
        """Block hashes at a coarser block size (complete pairs only), as a longer rank made them."""
        blocks, cur = self.blocks, self.bs
        while cur < bs:
            blocks = [hash((blocks[i], blocks[i + 1])) for i in range(0, len(blocks) - 1, 2)]
            cur *= 2
        return blocks


def window(a, b):
    """[lo, hi) of positions that holds the first difference of two digests (not equal)."""
    bs = max(a.bs, b.bs)
    la, lb = a.blocks_at(bs), b.blocks_at(bs)
    common = min(len(la), len(lb))
    for i in range(common):
        if la[i] != lb[i]:
            return i * bs, (i + 1) * bs
    return common * bs, min(a.n, b.n) + 1


PAIR_BLOCK = 32         # p2p signatures per hashed block of a pair digest


def common_prefix(a, b):
    """How many leading calls two digests share: exact where both tails are in memory, else the
    start of the first differing block (a lower bound)."""
    lo, hi = window(a, b)
    if lo < a.tail_start or lo < b.tail_start:
        return lo
    x, y = a.pend[lo - a.tail_start:], b.pend[lo - b.tail_start:]
    n = 0
    for p, q in zip(x, y):
        if p != q:
            break
        n += 1
    return lo + n


class PairDigest:
    """One direction of one peer of a rank (its sends to d, or its receives from s): the count and a
    hash chain over fixed blocks of signatures, so that equal sequences give equal digests however
    the log's blocks cut them. `rids` holds the current block of lines, filled by the scanner."""

    __slots__ = ("rids", "n", "chain", "pend")

    def __init__(self):
        self.rids = []
        self.n = 0
        self.chain = 0
        self.pend = []

    def feed(self, ids):
        pend = self.pend
        pend.extend(ids)
        self.n += len(ids)
        if len(pend) >= PAIR_BLOCK:
            off = 0
            chain = self.chain
            while len(pend) - off >= PAIR_BLOCK:
                chain = hash((chain, hash(tuple(pend[off:off + PAIR_BLOCK]))))
                off += PAIR_BLOCK
            self.chain = chain
            del pend[:off]

    def fingerprint(self):
        return self.n, self.chain, tuple(self.pend)


class CommSet:
    """The members (per-rank communicator handles) that make up one communicator, as far as known."""

    def __init__(self, key, source, nranks):
        self.key = key          # text: "commId 0x..." or "nranks=8 #0 [rank-known]"
        self.source = source    # "commId" or "inferred"
        self.nranks = nranks
        self.members = []
        self.status = "consistent"
        self.note = ""
        self.rank_owner = {}    # commId sets: rank -> the first handle that claimed it
        self.conflicted = False  # two processes claimed one rank

    def label(self):
        return self.key if self.source == "commId" else f"{self.key} (inferred)"


def _ranks_text(members):
    """`ranks 0-2,5` / `rank 3` / `host:pid comm 0x..` for members without a known rank. A rank
    held by several handles (an inferred set of several communicators) is listed once, with the
    number of handles: `ranks 0-1 (6 rank handles)`."""
    known = [m.rank for m in members if m.rank is not None]
    ranks = sorted(set(known))
    unknown = [m for m in members if m.rank is None]
    parts = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    text = ""
    if ranks:
        text = ("rank " if len(ranks) == 1 else "ranks ") + ",".join(parts)
        if len(known) > len(ranks):
            text += f" ({len(known)} rank handles)"
    if unknown:
        shown = ", ".join(m.where() for m in unknown[:4])
        more = f" and {len(unknown) - 4} more" if len(unknown) > 4 else ""
        text = (text + "; " if text else "") + shown + more
    return text


def _member_list(members):
    return [m.identity() for m in members[:SHOW_MEMBERS]]


class Pending:
    """A divergence found from digests, waiting for its exact position."""

    def __init__(self, cset, majority, minority, lo, hi):
        self.cset = cset
        self.majority = majority    # list of members with equal sequences (the largest cluster)
        self.minority = minority
        self.lo, self.hi = lo, hi
        self.a, self.b = majority[0], minority[0]


class PendingPair:
    """Sender s's sends to d disagree with d's receives from s."""

    def __init__(self, cset, sender, receiver):
        self.cset = cset
        self.sender, self.receiver = sender, receiver


def plan(sets):
    """Check every set from the digests. Returns (pending collective divergences, pending pairs)."""
    pending, pairs = [], []
    for cset in sets:
        members = cset.members
        if len(members) < 2:
            cset.status = "unchecked"
            cset.note = "only one rank in the log"
            continue
        clusters = {}
        for m in members:
            clusters.setdefault(m.digest.fingerprint(), []).append(m)
        groups = sorted(clusters.values(), key=lambda c: (-len(c), c[0].index))
        ambiguous = cset.source == "inferred" and (
            len(members) > cset.nranks or len({m.rank for m in members}) < len(members))
        if len(groups) > 1:
            if ambiguous and all(len(g) % cset.nranks == 0 for g in groups):
                cset.note = (f"{len(members)} ranks of nranks={cset.nranks}: read as "
                             f"{len(members) // cset.nranks} communicators told apart by their calls "
                             f"(add INIT to NCCL_DEBUG_SUBSYS for commIds)")
            elif not ambiguous:
                cset.status = "desync"
                for minority in groups[1:]:
                    lo, hi = window(groups[0][0].digest, minority[0].digest)
                    pending.append(Pending(cset, groups[0], minority, lo, hi))
            else:
                # several communicators in one inferred set: a cluster that cannot be whole
                # communicators is compared with the cluster it agrees with longest (its siblings)
                cset.status = "desync"
                done = set()
                for odd in (g for g in groups if len(g) % cset.nranks):
                    partner = max((g for g in groups if g is not odd),
                                  key=lambda g: (common_prefix(odd[0].digest, g[0].digest), len(g)))
                    key = frozenset((id(odd), id(partner)))
                    if key in done:
                        continue
                    done.add(key)
                    big, small = (partner, odd) if len(partner) >= len(odd) else (odd, partner)
                    lo, hi = window(big[0].digest, small[0].digest)
                    pending.append(Pending(cset, big, small, lo, hi))
        elif ambiguous and len(members) > cset.nranks:
            cset.note = (f"{len(members)} ranks of nranks={cset.nranks}: several communicators of the "
                         f"same size, all with the same calls")
        pairs.extend(_plan_pairs(cset, ambiguous))
    return pending, pairs


def _plan_pairs(cset, ambiguous):
    members = cset.members
    if not any(m.pairs for m in members):
        return []
    extra = "; " if cset.note else ""
    if ambiguous or any(m.rank is None for m in members):
        cset.note += extra + "Send/Recv not checked: ranks unknown (add INIT to NCCL_DEBUG_SUBSYS)"
        return []
    if any(m.pairs_dropped for m in members):
        cset.note += extra + "Send/Recv partly checked: too many rank pairs to track"
    by_rank = {m.rank: m for m in members}
    out = []
    seen = set()
    for m in members:
        for (direction, peer), pd in m.pairs.items():
            other = by_rank.get(peer)
            if other is None:
                continue        # the peer's log is not in the input
            if direction == "send":
                sender, receiver, mirror = m, other, ("recv", m.rank)
            else:
                sender, receiver, mirror = other, m, ("send", m.rank)
            key = (sender.index, receiver.index)
            if key in seen:
                continue
            seen.add(key)
            mirrored = other.pairs.get(mirror)
            if mirrored is None and other.pairs_dropped:
                continue
            if mirrored is None or mirrored.fingerprint() != pd.fingerprint():
                cset.status = "desync"
                out.append(PendingPair(cset, sender, receiver))
    return out


def requests(pending, pairs):
    """What a second pass must collect: ({member index: (lo, hi)}, {(member index, dir, peer)}).
    Windows whose positions are all still in the digests' tails are filled without a second pass."""
    coll = {}
    for p in pending:
        for m in (p.a, p.b):
            if p.lo < m.digest.tail_start:
                lo, hi = coll.get(m.index, (p.lo, p.hi))
                coll[m.index] = (min(lo, p.lo), max(hi, p.hi))
    p2p = set()
    for p in pairs:
        p2p.add((p.sender.index, "send", p.receiver.rank))
        p2p.add((p.receiver.index, "recv", p.sender.rank))
    return coll, p2p


def _window_calls(member, lo, hi, collected):
    """The member's signature ids at positions lo.. (up to hi or its end), from memory or pass 2."""
    d = member.digest
    if lo >= d.tail_start:
        start = lo - d.tail_start
        return d.pend[start:start + (hi - lo)]
    got = collected.get(member.index)
    if got is None:
        return None
    got_lo, ids = got
    return ids[lo - got_lo:hi - got_lo]


def resolve(pending, pairs, collected_coll, collected_p2p, describe):
    """Findings (dicts) from the pending divergences and what the second pass collected."""
    findings = []
    for p in pending:
        a = _window_calls(p.a, p.lo, p.hi, collected_coll)
        b = _window_calls(p.b, p.lo, p.hi, collected_coll)
        pos = None
        if a is not None and b is not None:
            for i in range(max(len(a), len(b))):
                x = a[i] if i < len(a) else None
                y = b[i] if i < len(b) else None
                if x != y:
                    pos = p.lo + i
                    break
        findings.append(_coll_finding(p, pos, a, b, describe))
    for p in pairs:
        findings.append(_pair_finding(p, collected_p2p, describe))
    return findings


def _side(members, call, describe):
    return {"ranks": sorted(m.rank for m in members if m.rank is not None),
            "members": _member_list(members), "member_count": len(members),
            "collectives": members[0].digest.n,
            "issued": describe(call) if call is not None else None}


def _call_text(desc):
    if desc is None:
        return "nothing"
    text = f"{desc['op']} count={desc['count']} {desc['datatype']}"
    if desc.get("redop"):
        text += f" {desc['redop']}"
    if desc.get("root") is not None:
        text += f" root={desc['root']}"
    return text


def _coll_finding(p, pos, a, b, describe):
    cset = p.cset
    where = f"communicator {cset.label()}, nranks={cset.nranks}"
    if pos is None:         # not located (should not happen: every input is re-readable)
        msg = (f"{where}: {_ranks_text(p.minority)} issued a different sequence of collectives from "
               f"{_ranks_text(p.majority)} between collective #{p.lo + 1} and #{p.hi}")
        return {"kind": "mismatch", "set": cset.key, "source": cset.source, "nranks": cset.nranks,
                "position": None, "exact": False, "range": [p.lo + 1, p.hi],
                "sides": [_side(p.majority, None, describe), _side(p.minority, None, describe)],
                "message": msg}
    i = pos - p.lo
    x = a[i] if i < len(a) else None
    y = b[i] if i < len(b) else None
    sides = [_side(p.majority, x, describe), _side(p.minority, y, describe)]
    if x is None or y is None:
        short, long_, call = (p.majority, p.minority, y) if x is None else (p.minority, p.majority, x)
        kind = "stopped"
        msg = (f"{where}: {_ranks_text(short)} stopped after {pos} collectives while "
               f"{_ranks_text(long_)} went on to collective #{pos + 1} ({_call_text(describe(call))}); "
               f"a hang in #{pos + 1} waits on the ranks that never called it")
    else:
        kind = "mismatch"
        msg = (f"{where}: collective #{pos + 1} differs: {_ranks_text(p.majority)} issued "
               f"{_call_text(describe(x))}; {_ranks_text(p.minority)} issued {_call_text(describe(y))}")
    return {"kind": kind, "set": cset.key, "source": cset.source, "nranks": cset.nranks,
            "position": pos + 1, "exact": True, "sides": sides, "message": msg}


def _pair_finding(p, collected, describe):
    """Sends from s to d against d's receives from s, matched in order (NCCL's rule per pair)."""
    cset = p.cset
    s, r = p.sender, p.receiver
    n_sent = s.pairs[("send", r.rank)].n if ("send", r.rank) in s.pairs else 0
    n_got = r.pairs[("recv", s.rank)].n if ("recv", s.rank) in r.pairs else 0
    sent = collected.get((s.index, "send", r.rank), [])
    got = collected.get((r.index, "recv", s.rank), [])
    pos = x = y = None
    for i in range(max(len(sent), len(got))):
        x = sent[i] if i < len(sent) else None
        y = got[i] if i < len(got) else None
        if x != y:
            pos = i
            break
    where = f"communicator {cset.label()}, nranks={cset.nranks}"
    if pos is None:             # the difference lies beyond what was collected
        kind = "p2p_mismatch" if n_sent == n_got else "p2p_unmatched"
        msg = (f"{where}: rank {s.rank}'s {n_sent} sends to rank {r.rank} do not match rank {r.rank}'s {n_got} "
               f"receives from it (not located: more than {P2P_LOCATE_CAP} messages)")
    elif x is None:
        kind = "p2p_unmatched"
        msg = (f"{where}: rank {r.rank} posted receive #{pos + 1} from rank {s.rank} ({_p2p_text(describe(y))}) "
               f"but rank {s.rank} sent only {n_sent} messages to it")
    elif y is None:
        kind = "p2p_unmatched"
        msg = (f"{where}: rank {s.rank}'s send #{pos + 1} to rank {r.rank} ({_p2p_text(describe(x))}) has no "
               f"matching receive: rank {r.rank} posted only {n_got} receives from rank {s.rank}")
    else:
        kind = "p2p_mismatch"
        msg = (f"{where}: send #{pos + 1} from rank {s.rank} to rank {r.rank} is {_p2p_text(describe(x))} "
               f"but the matching receive is {_p2p_text(describe(y))}")
    return {"kind": kind, "set": cset.key, "source": cset.source, "nranks": cset.nranks,
            "position": None if pos is None else pos + 1, "exact": pos is not None,
            "sender": s.identity(), "receiver": r.identity(), "sends": n_sent, "receives": n_got,
            "sent": describe(x) if x is not None and pos is not None else None,
            "received": describe(y) if y is not None and pos is not None else None,
            "message": msg}


def _p2p_text(desc):
    return f"count={desc['count']} {desc['datatype']}" if desc else "nothing"
