"""The scalable heuristic: greedy starts, then local search on the same lexicographic objective as
the exact search (patterns.py: predicted time first, total load second). Pure Python; every move
is accepted only when it makes the order strictly better, so the result is never worse than the
best start (the report's greedy heuristic, method `greedy`, and the identity order are always among the starts).

Ring (`improve_ring`), array tour with positions:
  1. bottleneck: take a slowest link and remove it by a 2-opt exchange, by moving one of its two
     ends elsewhere, or by one or two Posa rotations of the path left when it is cut, using only
     links faster than it; repeat until a slowest link cannot be removed.
  2. sum: 2-opt and Or-opt (segments of 1-3 ranks, either direction) over each rank's nearest
     neighbours, never adding a link slower than the bottleneck, with don't-look bits.
  The two alternate until neither improves or the time budget is spent.

Rounds patterns (`improve_rounds`, recursive doubling / Bruck): swap the hosts of two ranks. Moves
aimed at each round's slowest pair come first (swap one end with a rank whose host is among the
other end's nearest hosts), then the same neighbourhood over every pair for the tie-break sum; then
iterated local search (random 2-3 swap kicks from the best order) while the time budget lasts. A
swap is evaluated in O(rounds) from each round's few largest pair costs.
"""

import heapq
import random
import time

from collbench.topo.patterns import evaluate

EPS = 1e-12


def _lex_better(a, b):
    """a strictly better than b, both (primary, secondary), with a relative tolerance."""
    if a[0] < b[0] - EPS * abs(b[0]):
        return True
    return a[0] <= b[0] + EPS * abs(b[0]) and a[1] < b[1] - EPS * abs(b[1])


def best_start(starts, cost, rnds):
    best, best_v = None, None
    for s in starts:
        v = evaluate(s, cost, rnds)
        if best is None or _lex_better(v, best_v):
            best, best_v = list(s), v
    return best, best_v


def neighbour_lists(cost, k):
    p = len(cost)
    k = min(k, p - 1)
    out = []
    for i, row in enumerate(cost):
        near = heapq.nsmallest(k + 1, range(p), key=row.__getitem__)
        out.append([j for j in near if j != i][:k])
    return out


# --------------------------------------------------------------------------------------------- ring

class _Tour:
    def __init__(self, order, cost):
        self.t = list(order)
        self.p = len(order)
        self.pos = [0] * self.p
        for i, v in enumerate(self.t):
            self.pos[v] = i
        self.c = cost

    def set(self, order):
        self.t = list(order)
        for i, v in enumerate(self.t):
            self.pos[v] = i

    def succ(self, v):
        return self.t[(self.pos[v] + 1) % self.p]

    def pred(self, v):
        return self.t[self.pos[v] - 1]

    def links(self):
        t, c, p = self.t, self.c, self.p
        return [c[t[i]][t[(i + 1) % p]] for i in range(p)]

    def reverse(self, i, j):
        """Reverse the cyclic stretch of positions i..j (the shorter side: same ring)."""
        p, t, pos = self.p, self.t, self.pos
        n = (j - i) % p + 1
        if 2 * n > p:
            i, j, n = (j + 1) % p, (i - 1) % p, p - n
        for k in range(n // 2):
            x, y = (i + k) % p, (j - k) % p
            t[x], t[y] = t[y], t[x]
            pos[t[x]] = x
            pos[t[y]] = y

    def move_segment(self, first, last, after, reverse):
        """Move the stretch first..last (forward, by node) to sit between `after` and its successor."""
        t, p = self.t, self.p
        i, j = self.pos[first], self.pos[last]
        n = (j - i) % p + 1
        seg = [t[(i + k) % p] for k in range(n)]
        if reverse:
            seg.reverse()
        rest = [t[(j + 1 + k) % p] for k in range(p - n)]
        at = rest.index(after)
        self.t = rest[:at + 1] + seg + rest[at + 1:]
        for k, v in enumerate(self.t):
            self.pos[v] = k


def _ring_bottleneck_pass(tour, near, deadline):
    """Remove slowest links while possible. True if the tour improved."""
    p = tour.p
    improved = False
    stuck = set()
    while time.monotonic() < deadline:
        t = tour.t
        links = tour.links()
        b = max(links)
        todo = [i for i, x in enumerate(links) if x == b and (t[i], t[(i + 1) % p]) not in stuck]
        if not todo:
            break
        i = todo[0]
        a, bb = t[i], t[(i + 1) % p]
        move = _best_bottleneck_move(tour, i, b)
        if move is not None:
            kind, args = move
            if kind == "2opt":
                x, y = args
                tour.reverse((x + 1) % p, y)
            else:
                v, after = args
                tour.move_segment(v, v, after, False)
        else:
            cycle = _rotation_move(tour, i, b, near)
            if cycle is None:
                stuck.add((a, bb))
                continue
            tour.set(cycle)
        improved = True
        if max(tour.links()) < b:
            stuck.clear()
    return improved


def _best_bottleneck_move(tour, i, b):
    """The move that removes link i (cost b) with new links < b, the smallest new max first."""
    t, c, p = tour.t, tour.c, tour.p
    a, bb = t[i], t[(i + 1) % p]
    ca, cb = c[a], c[bb]
    best = None
    # 2-opt with link j: new links (a, t[j]) and (bb, t[j+1])
    for j in range(p):
        if j == i or j == (i - 1) % p or j == (i + 1) % p:
            continue
        x, y = t[j], t[(j + 1) % p]
        n1 = ca[x]
        if n1 >= b:
            continue
        n2 = cb[y]
        if n2 >= b:
            continue
        key = (max(n1, n2), n1 + n2 - c[x][y])
        if best is None or key < best[0]:
            best = (key, ("2opt", (i, j) if i < j else (j, i)))
    # move one end v of the link elsewhere: its neighbours u, w join, v goes between x and y
    for v in (a, bb):
        u, w = tour.pred(v), tour.succ(v)
        join = c[u][w]
        if join >= b:
            continue
        cv = c[v]
        for j in range(p):
            x, y = t[j], t[(j + 1) % p]
            if x == v or y == v:
                continue
            n1, n2 = cv[x], cv[y]
            if n1 >= b or n2 >= b:
                continue
            key = (max(n1, n2, join), n1 + n2 - c[x][y] + join - c[u][v] - c[v][w])
            if best is None or key < best[0]:
                best = (key, ("move", (v, x)))
    if best is None:
        return None
    kind, args = best[1]
    if kind == "2opt":
        x, y = args
        # reverse positions x+1..y: new links (t[x], t[y]) and (t[x+1], t[y+1])
        return kind, (x, y)
    return kind, args


def _rotation_move(tour, i, b, near):
    """Remove link i (cost b) by Posa rotations: cut it to get a path from its end `start` to its
    end `a`, rotate the path's far end once or twice (edge (v, end) added, the edge after v
    dropped, the tail reversed) and close back to `start`, all added links faster than b. Depth 1
    is a 2-opt move; depth 2 reaches 3-opt exchanges the direct scan does not. Each candidate is
    checked in O(1) through positions; the new ring (a list) or None."""
    t, c, p = tour.t, tour.c, tour.p
    for flip in (False, True):
        # path q[0..p-1]: q[0] = start, q[p-1] = a; with flip the same link from the other side
        if not flip:
            q = t[i + 1:] + t[:i + 1]
        else:
            q = (t[i + 1:] + t[:i + 1])[::-1]
        idx = {v: k for k, v in enumerate(q)}
        start, end = q[0], q[-1]
        cs = c[start]
        n = p

        def after1(j1, k):
            """Index in q of the node at position k of the path rotated once at j1."""
            return k if k <= j1 else n - 1 - (k - j1 - 1)

        ce = c[end]
        for v1 in near[end]:
            if ce[v1] >= b:
                break
            j1 = idx[v1]
            if j1 >= n - 2:
                continue
            e1 = q[j1 + 1]
            if cs[e1] < b:
                return q[:j1 + 1] + q[:j1:-1]
            # second rotation at the new end e1 (rotated path position n-1)
            c1 = c[e1]
            for v2 in near[e1]:
                if c1[v2] >= b:
                    break
                j2q = idx[v2]
                # v2's position in the rotated path
                k2 = j2q if j2q <= j1 else j1 + 1 + (n - 1 - j2q)
                if k2 >= n - 2:
                    continue
                e2 = q[after1(j1, k2 + 1)]
                if cs[e2] < b:
                    once = q[:j1 + 1] + q[:j1:-1]
                    return once[:k2 + 1] + once[:k2:-1]
    return None


def _ring_sum_pass(tour, near, cap, deadline):
    """2-opt and Or-opt on the sum of links, never adding a link above cap. True if improved."""
    p = tour.p
    improved = False
    active = list(range(p))
    queued = [True] * p
    steps = 0
    while active:
        steps += 1
        if steps & 63 == 0 and time.monotonic() > deadline:
            break
        a = active.pop()
        queued[a] = False
        if _improve_at(tour, a, near, cap):
            improved = True
            for v in (a, tour.pred(a), tour.succ(a)):
                if not queued[v]:
                    queued[v] = True
                    active.append(v)
            touched = tour.touched
            for v in touched:
                if not queued[v]:
                    queued[v] = True
                    active.append(v)
    return improved


def _improve_at(tour, a, near, cap):
    c = tour.c
    ca = c[a]
    # 2-opt, successor side: (a, b) + (x, y) -> (a, x) + (b, y)
    for forward in (True, False):
        b = tour.succ(a) if forward else tour.pred(a)
        d_ab = ca[b]
        for x in near[a]:
            d_ax = ca[x]
            if d_ax >= d_ab or d_ax > cap:
                break
            y = tour.succ(x) if forward else tour.pred(x)
            if x == b or y == a:
                continue
            d_by = c[b][y]
            if d_by > cap:
                continue
            if d_ax + d_by < d_ab + c[x][y] - 1e-12 * (d_ab + c[x][y]):
                pos = tour.pos
                if forward:
                    tour.reverse(pos[b], pos[x])
                else:
                    tour.reverse(pos[a], pos[y])
                tour.touched = (a, b, x, y)
                return True
    # Or-opt: move the segment starting at a (1..3 ranks, forward) next to one of a's neighbours
    p = tour.p
    if p < 6:
        return False
    seg_end = a
    for length in range(1, 4):
        if length > 1:
            seg_end = tour.succ(seg_end)
        u, w = tour.pred(a), tour.succ(seg_end)
        if w == a or u == seg_end:
            break
        join = c[u][w]
        if join > cap:
            continue
        gain = c[u][a] + c[seg_end][w] - join
        if gain <= 0:
            continue
        seg = set()
        v = a
        for _ in range(length):
            seg.add(v)
            v = tour.succ(v)
        for end, x_list in ((a, near[a]), (seg_end, near[seg_end])):
            for x in x_list:
                if c[end][x] >= gain:
                    break
                if x in seg:
                    continue
                for y in (tour.succ(x), tour.pred(x)):
                    if y in seg:
                        continue
                    # the segment goes between x and y; `end` touches x
                    other = seg_end if end == a else a
                    n1, n2 = c[end][x], c[other][y]
                    if n1 > cap or n2 > cap:
                        continue
                    add = n1 + n2 - c[x][y]
                    if add < gain - 1e-12 * (gain + c[x][y]):
                        # orientation: after `after`, the segment runs first..last
                        if y == tour.succ(x):
                            after, first = x, end
                        else:
                            after, first = y, other
                        tour.move_segment(a, seg_end, after, first != a)
                        tour.touched = (u, w, x, y, a, seg_end)
                        return True
    return False


def improve_ring(cost, starts, rnds, time_limit=5.0, neighbours=10):
    """The best ring found from the starts within time_limit seconds: order starting at rank 0."""
    p = len(cost)
    order, value = best_start(starts, cost, rnds)
    if p <= 3:
        return order
    deadline = time.monotonic() + time_limit
    tour = _Tour(order, cost)
    tour.touched = ()
    near = neighbour_lists(cost, neighbours)
    for _ in range(8):
        changed = _ring_bottleneck_pass(tour, near, deadline)
        cap = max(tour.links())
        changed |= _ring_sum_pass(tour, near, cap, deadline)
        if not changed or time.monotonic() > deadline:
            break
    result = _canonical_ring(tour.t, order[0])
    if _lex_better(evaluate(result, cost, rnds), value):
        return result
    return order


def _canonical_ring(t, first):
    """Rotate so `first` is rank 0, direction with the smaller neighbour at rank 1 (same ring)."""
    p = len(t)
    i = t.index(first)
    out = t[i:] + t[:i]
    if p > 2 and out[-1] < out[1]:
        out = [out[0]] + out[:0:-1]
    return out


# ------------------------------------------------------------------------------------ rounds (RD)

class _RoundsState:
    TOP = 6

    def __init__(self, order, cost, rnds):
        self.o = list(order)
        self.c = cost
        self.rnds = rnds
        self.w = [rd.weight for rd in rnds]
        p = len(order)
        self.rank_of = [0] * p
        for r, h in enumerate(self.o):
            self.rank_of[h] = r
        # incident[r]: list of (round, pair index, partner rank)
        self.incident = [[] for _ in range(p)]
        for k, rd in enumerate(rnds):
            for i, (a, b) in enumerate(rd.pairs):
                self.incident[a].append((k, i, b))
                self.incident[b].append((k, i, a))
        self.pc = [[cost[self.o[a]][self.o[b]] for a, b in rd.pairs] for rd in rnds]
        self.tops = [self._top(k) for k in range(len(rnds))]
        self.value = evaluate(self.o, cost, rnds)

    def _top(self, k):
        pc = self.pc[k]
        return heapq.nlargest(self.TOP, ((v, i) for i, v in enumerate(pc)))

    def swap_value(self, x, y):
        """(primary, secondary) after swapping the hosts of ranks x and y."""
        o, c = self.o, self.c
        hx, hy = o[y], o[x]                     # new hosts
        changed = {}                            # (k, i) -> new cost
        for r, h in ((x, hx), (y, hy)):
            ch = c[h]
            for k, i, other in self.incident[r]:
                if other == x:
                    oh = hx
                elif other == y:
                    oh = hy
                else:
                    oh = o[other]
                changed[(k, i)] = ch[oh]
        prim = 0.0
        sec = self.value[1]
        nr = len(self.rnds)
        newmax = [None] * nr
        for (k, i), v in changed.items():
            sec += self.w[k] * (v - self.pc[k][i])
            if newmax[k] is None or v > newmax[k]:
                newmax[k] = v
        for k in range(nr):
            top = self.tops[k]
            rest = None
            for v, i in top:
                if (k, i) not in changed:
                    rest = v
                    break
            if rest is None and len(top) < len(self.pc[k]):
                rest = max((v for i, v in enumerate(self.pc[k]) if (k, i) not in changed), default=0.0)
            m = newmax[k]
            if m is None or (rest is not None and rest > m):
                m = rest if rest is not None else 0.0
            prim += self.w[k] * m
        return prim, sec

    def apply(self, x, y, value):
        o = self.o
        o[x], o[y] = o[y], o[x]
        self.rank_of[o[x]] = x
        self.rank_of[o[y]] = y
        rounds_touched = set()
        for r in (x, y):
            for k, i, other in self.incident[r]:
                a, b = self.rnds[k].pairs[i]
                self.pc[k][i] = self.c[o[a]][o[b]]
                rounds_touched.add(k)
        for k in rounds_touched:
            self.tops[k] = self._top(k)
        self.value = value


def improve_rounds(cost, starts, rnds, time_limit=5.0, neighbours=12, kicks=300, seed=1):
    """The best rank order found for a rounds pattern from the starts within time_limit seconds.

    Descent (slowest pairs first, then every pair), then iterated local search while time is
    left: up to `kicks` times, 2-3 random swaps of the best order followed by a descent; a kick
    is kept only when it ends strictly better, and the search ends after max(30, 2P) kicks in a
    row without a gain (a fixed seed: the same input gives the same sequence of trials)."""
    p = len(cost)
    order, value = best_start(starts, cost, rnds)
    if p <= 2 or not rnds:
        return order
    deadline = time.monotonic() + time_limit
    near = neighbour_lists(cost, neighbours)
    st = _RoundsState(order, cost, rnds)
    _descend(st, near, deadline)
    best_o, best_v = list(st.o), st.value
    rng = random.Random(seed)
    stall = 0
    for _ in range(kicks if p > 3 else 0):
        if time.monotonic() > deadline or stall >= max(30, 2 * p):
            break
        stall += 1
        st = _RoundsState(best_o, cost, rnds)
        for _ in range(rng.choice((2, 3))):
            x, y = rng.sample(range(p), 2)
            st.apply(x, y, st.swap_value(x, y))
        _descend(st, near, deadline)
        if _lex_better(st.value, best_v):
            best_o, best_v = list(st.o), st.value
            stall = 0
    if _lex_better(evaluate(best_o, cost, rnds), value):
        return best_o
    return order


def _descend(st, near, deadline):
    """Swap moves until none improves (or the deadline)."""
    rnds = st.rnds

    def try_pair(k, i):
        """Best improving swap that moves one end of pair i of round k next to the other."""
        a, b = rnds[k].pairs[i]
        best = None
        for fixed, mover in ((a, b), (b, a)):
            hf = st.o[fixed]
            for g in near[hf]:
                y = st.rank_of[g]
                if y == mover or y == fixed:
                    continue
                v = st.swap_value(mover, y)
                if _lex_better(v, st.value) and (best is None or _lex_better(v, best[0])):
                    best = (v, mover, y)
        if best is None:
            return False
        st.apply(best[1], best[2], best[0])
        return True

    for _ in range(50):
        if time.monotonic() > deadline:
            break
        changed = False
        # 1. the slowest pair of each round, heaviest contribution first
        while time.monotonic() < deadline:
            order_k = sorted(range(len(rnds)), key=lambda k: -st.w[k] * st.tops[k][0][0])
            moved = False
            for k in order_k:
                for v, i in st.tops[k]:
                    if v < st.tops[k][0][0]:
                        break
                    if try_pair(k, i):
                        moved = True
                        break
                if moved:
                    break
            if not moved:
                break
            changed = True
        # 2. every pair, slowest first, for the tie-break sum (and any primary gain it finds)
        pairs = sorted(((st.w[k] * v, k, i) for k in range(len(rnds)) for i, v in enumerate(st.pc[k])),
                       reverse=True)
        for n, (_, k, i) in enumerate(pairs):
            if n & 31 == 0 and time.monotonic() > deadline:
                break
            if try_pair(k, i):
                changed = True
        if not changed:
            break
