"""Hosts and links clearly slower than their peers in a measured matrix (the slow cable, the degraded NIC).

Method (docs/TOPO.md, "Outliers"), on each pair's cost (latency, or 1/bandwidth; the slower
direction of the pair), in log scale so that "slower" means a ratio:

1. Classes. Sort the pair costs; split wherever two neighbours differ by at least `gap_ratio`
   (default 1.5x); a group smaller than `min_class` pairs (default P: more than one host's P-1
   links) is merged into the neighbouring group it is closer to. On a two-rack fabric this gives
   the intra-rack and the inter-rack class; on a flat one, a single class.
2. Host effect. Each host's factor is the median, over its P-1 links, of (link cost / its class's
   median). A host is an outlier when its factor is at least `ratio` (default 1.5x) and far above
   the other hosts' factors (more than `mad_k` robust deviations): at least half its links are
   that much slower.
3. The outlier hosts' factors are divided out of their links and the classes are found again (a
   slow host's intra-rack links no longer pose as inter-rack ones); the hosts' factors are
   recomputed against these classes.
4. Link outliers: a link whose cost, with its ends' host factors divided out, is at least `ratio`
   times its class median and more than `mad_k` robust deviations of the class above it.

Evidence is given in the metric's unit: the value against its class's median. `groups` are the
sets of hosts joined by links of the fastest class (the racks, when the fabric has them).
"""

import math

DEFAULT_RATIO = 1.5
DEFAULT_GAP_RATIO = 1.5
DEFAULT_MAD_K = 5.0
_MAD_SCALE = 1.4826          # MAD -> standard deviation for normally distributed noise


def _median(xs):
    s = sorted(xs)
    n = len(s)
    if not n:
        return 0.0
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _spread(xs):
    m = _median(xs)
    return _MAD_SCALE * _median([abs(x - m) for x in xs])


class PairClass:
    """A class of pairs with similar cost. median/low/high in the metric's unit."""

    def __init__(self, index, pairs, median, low, high):
        self.index = index
        self.pairs = pairs
        self.median = median
        self.low = low
        self.high = high

    def to_dict(self):
        return {"class": self.index, "pairs": self.pairs, "median": self.median, "low": self.low,
                "high": self.high}


class HostOutlier:
    """factor: the median of the host's links' cost / class median (x slower than its peers)."""

    def __init__(self, host, factor, slow_links, links, worst):
        self.host = host
        self.factor = factor
        self.slow_links = slow_links
        self.links = links
        self.worst = worst           # (other host, value, class median) of its slowest link

    def to_dict(self):
        other, value, median = self.worst
        return {"host": self.host, "factor": self.factor, "slow_links": self.slow_links,
                "links": self.links, "worst_link": {"to": other, "value": value, "class_median": median}}


class LinkOutlier:
    """factor: cost / class median after its hosts' factors were divided out."""

    def __init__(self, a, b, value, pair_class, class_median, factor, host_adjusted):
        self.a = a
        self.b = b
        self.value = value
        self.pair_class = pair_class
        self.class_median = class_median
        self.factor = factor
        self.host_adjusted = host_adjusted

    def to_dict(self):
        return {"a": self.a, "b": self.b, "value": self.value, "class": self.pair_class,
                "class_median": self.class_median, "factor": self.factor,
                "host_adjusted": self.host_adjusted}


class OutlierReport:
    def __init__(self, metric, ratio, classes, groups, hosts, links):
        self.metric = metric
        self.ratio = ratio
        self.classes = classes
        self.groups = groups
        self.hosts = hosts
        self.links = links

    @property
    def any(self):
        return bool(self.hosts or self.links)

    def to_dict(self):
        return {"metric": self.metric.name, "unit": self.metric.unit, "ratio": self.ratio,
                "classes": [c.to_dict() for c in self.classes], "groups": self.groups,
                "hosts": [h.to_dict() for h in self.hosts], "links": [lk.to_dict() for lk in self.links]}

    def lines(self):
        """Readable evidence, one line each: classes, then hosts, then links."""
        u = self.metric.unit
        out = []
        for c in self.classes:
            out.append(f"class {c.index}: {c.pairs} pairs, median {c.median:.4g} {u} "
                       f"({c.low:.4g} to {c.high:.4g})")
        for h in self.hosts:
            other, value, median = h.worst
            out.append(f"slow host {h.host}: its links are {h.factor:.2f}x slower than their class "
                       f"medians ({h.slow_links} of {h.links} at least {self.ratio:g}x); slowest: to "
                       f"{other} {value:.4g} {u} vs class median {median:.4g} {u}")
        for lk in self.links:
            extra = " after its hosts' slowness is divided out" if lk.host_adjusted else ""
            out.append(f"slow link {lk.a} - {lk.b}: {lk.value:.4g} {u} vs class {lk.pair_class} median "
                       f"{lk.class_median:.4g} {u} ({lk.factor:.2f}x slower{extra})")
        if not self.any:
            out.append("no outliers")
        return out


def _classes(logs, min_class, gap):
    """Class index per pair (by position in logs), classes numbered fastest first."""
    order = sorted(range(len(logs)), key=logs.__getitem__)
    xs = [logs[i] for i in order]
    segs = []
    start = 0
    for k in range(1, len(xs)):
        if xs[k] - xs[k - 1] >= gap:
            segs.append([start, k])
            start = k
    segs.append([start, len(xs)])
    while len(segs) > 1:
        small = [i for i, (a, b) in enumerate(segs) if b - a < min_class]
        if not small:
            break
        i = min(small, key=lambda s: (segs[s][1] - segs[s][0], -s))
        a, b = segs[i]
        left = xs[a] - xs[a - 1] if i > 0 else math.inf
        right = xs[b] - xs[b - 1] if i + 1 < len(segs) else math.inf
        j = i - 1 if left <= right else i + 1
        lo, hi = min(i, j), max(i, j)
        segs[lo:hi + 1] = [[segs[lo][0], segs[hi][1]]]
    cls = [0] * len(logs)
    for c, (a, b) in enumerate(segs):
        for k in range(a, b):
            cls[order[k]] = c
    return cls, len(segs)


def _components(p, edges):
    """Connected-component id per host 0..p-1 over the (i, j) edges (union-find)."""
    parent = list(range(p))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in edges:
        parent[find(i)] = find(j)
    return [find(h) for h in range(p)]


def _structural(p, pairs, cls, ncls):
    """Class per pair by where its hosts meet: the fastest class c whose links (of class <= c)
    already join the two hosts. A slow cable inside a rack stays an intra-rack pair (its hosts are
    joined through their rack mates) instead of posing as an inter-rack one."""
    comp_levels = [_components(p, (pr for k, pr in enumerate(pairs) if cls[k] <= c))
                   for c in range(ncls - 1)]
    out = []
    for i, j in pairs:
        level = ncls - 1
        for c, comp in enumerate(comp_levels):
            if comp[i] == comp[j]:
                level = c
                break
        out.append(level)
    return out


def find_outliers(matrix, ratio=DEFAULT_RATIO, gap_ratio=DEFAULT_GAP_RATIO, min_class=None,
                  mad_k=DEFAULT_MAD_K):
    """An OutlierReport for a TopoMatrix (see the module doc)."""
    p = matrix.size
    labels = matrix.labels
    metric = matrix.metric
    cost = matrix.cost()
    pairs = [(i, j) for i in range(p) for j in range(i + 1, p)]
    raw = [math.log(cost[i][j]) for i, j in pairs]
    min_class = min_class or max(3, p)
    gap = math.log(gap_ratio)
    lim = math.log(ratio)
    pair_index = {}
    for k, (i, j) in enumerate(pairs):
        pair_index[(i, j)] = pair_index[(j, i)] = k

    def classify(logs):
        vcls, n = _classes(logs, min_class, gap)
        if n < 2:
            return vcls, n
        # a value class may be left without pairs (they all meet at a faster level): number the
        # classes that hold pairs, fastest first
        scls = _structural(p, pairs, vcls, n)
        used = {c: k for k, c in enumerate(sorted(set(scls)))}
        return [used[c] for c in scls], len(used)

    def host_effects(logs, cls, ncls):
        med = [_median([logs[k] for k in range(len(logs)) if cls[k] == c]) for c in range(ncls)]
        resid = [raw[k] - med[cls[k]] for k in range(len(pairs))]
        eff = [_median([resid[pair_index[(h, j)]] for j in range(p) if j != h]) for h in range(p)]
        return eff, resid, med

    if p < 3:
        cls, ncls = [0] * len(pairs), 1
        effects, slow_hosts = [0.0] * p, []
        adj = raw
    else:
        cls, ncls = classify(raw)
        effects, _, _ = host_effects(raw, cls, ncls)
        slow_hosts = _flag_hosts(effects, lim, mad_k)
        adj = raw
        if slow_hosts:
            # divide the slow hosts' factors out of their links, then find the classes again
            shift = [effects[h] if h in slow_hosts else 0.0 for h in range(p)]
            adj = [raw[k] - shift[i] - shift[j] for k, (i, j) in enumerate(pairs)]
            cls, ncls = classify(adj)
            effects, _, _ = host_effects(adj, cls, ncls)
            slow_hosts = [h for h in slow_hosts if effects[h] >= lim]
            if not slow_hosts:
                adj = raw
                cls, ncls = classify(raw)
                effects, _, _ = host_effects(raw, cls, ncls)

    members = [[k for k in range(len(pairs)) if cls[k] == c] for c in range(ncls)]
    med_log = [_median([adj[k] for k in m]) for m in members]
    spread = [_spread([adj[k] for k in m]) for m in members]
    classes = []
    slow_set = set(slow_hosts)
    for c, m in enumerate(members):
        # the range shown is the peers' (pairs without a slow host), the evidence's yardstick
        peers = [k for k in m if pairs[k][0] not in slow_set and pairs[k][1] not in slow_set] or m
        vals = [matrix.pair_value(*pairs[k]) for k in peers]
        classes.append(PairClass(c, len(m), metric.value_of_cost(math.exp(med_log[c])),
                                 min(vals), max(vals)))

    hosts = []
    for h in slow_hosts:
        links = [(j, raw[pair_index[(h, j)]] - med_log[cls[pair_index[(h, j)]]]) for j in range(p) if j != h]
        worst_j, _ = max(links, key=lambda t: t[1])
        kw = pair_index[(h, worst_j)]
        hosts.append(HostOutlier(labels[h], math.exp(effects[h]), sum(1 for _, z in links if z >= lim),
                                 len(links), (labels[worst_j], matrix.pair_value(h, worst_j),
                                              metric.value_of_cost(math.exp(med_log[cls[kw]])))))
    hosts.sort(key=lambda x: -x.factor)

    links = []
    flagged = set(slow_hosts)
    for k, (i, j) in enumerate(pairs):
        c = cls[k]
        z = adj[k] - med_log[c]
        if z >= lim and z > mad_k * spread[c]:
            links.append(LinkOutlier(labels[i], labels[j], matrix.pair_value(i, j), c,
                                     metric.value_of_cost(math.exp(med_log[c])),
                                     math.exp(raw[k] - med_log[c]) if not (i in flagged or j in flagged)
                                     else math.exp(z), i in flagged or j in flagged))
    links.sort(key=lambda x: -x.factor)
    groups = _groups(p, pairs, cls, labels) if ncls > 1 else [list(labels)]
    return OutlierReport(metric, ratio, classes, groups, hosts, links)


def _flag_hosts(effects, lim, mad_k):
    """Hosts whose factor is >= the ratio and clearly above the other hosts' factors."""
    centre = _median(effects)
    spread = _spread(effects)
    return [h for h, e in enumerate(effects) if e >= lim and e - centre > mad_k * spread]


def _groups(p, pairs, cls, labels):
    """Connected components of the fastest class's links, largest first."""
    comps = {}
    for h, root in enumerate(_components(p, (pr for k, pr in enumerate(pairs) if cls[k] == 0))):
        comps.setdefault(root, []).append(labels[h])
    return sorted(comps.values(), key=lambda g: (-len(g), g[0]))


def host_groups(matrix, gap_ratio=DEFAULT_GAP_RATIO, min_class=None, cost=None):
    """Group index per matrix rank: the hosts joined by fastest-class links (the racks), by the
    classes of step 1 alone (no outlier passes: cheap enough for P = 1024). All 0 when the pairs
    form a single class."""
    p = matrix.size
    if p < 3:
        return [0] * p
    cost = cost if cost is not None else matrix.cost()
    pairs = [(i, j) for i in range(p) for j in range(i + 1, p)]
    logs = [math.log(cost[i][j]) for i, j in pairs]
    cls, ncls = _classes(logs, min_class or max(3, p), math.log(gap_ratio))
    if ncls < 2:
        return [0] * p
    labels = list(range(p))
    comps = _groups(p, pairs, cls, labels)
    group = [0] * p
    for g, members in enumerate(comps):
        for h in members:
            group[h] = g
    return group


TIGHT_SPREAD = 0.10     # a class whose robust spread is at most ~10 % is one speed plus noise
SNAP_DEVIATIONS = 3.0


def snap_noise(matrix, cost=None, gap_ratio=DEFAULT_GAP_RATIO, min_class=None):
    """The cost matrix with measurement noise taken out of tight classes: a pair whose cost lies
    in a class of robust spread <= 10 % and within 3 spreads of the class median costs the median.

    Without it a few per cent of noise on the slowest link decide the bottleneck, and a ring
    over racks may cross between them more often than it must to save 3 % on one link (each
    crossing loads the shared inter-rack uplink, which the pairwise matrix cannot show). A wide
    class (a matrix without structure) is left as measured, and so is a link clearly slower than
    its class (a slow cable stays slow). Returns (cost matrix, number of pairs snapped)."""
    p = matrix.size
    cost = cost if cost is not None else matrix.cost()
    if p < 3:
        return cost, 0
    pairs = [(i, j) for i in range(p) for j in range(i + 1, p)]
    logs = [math.log(cost[i][j]) for i, j in pairs]
    cls, ncls = _classes(logs, min_class or max(3, p), math.log(gap_ratio))
    members = [[] for _ in range(ncls)]
    for k, c in enumerate(cls):
        members[c].append(logs[k])
    centre = [_median(m) for m in members]
    spread = [_spread(m) for m in members]
    out = [row[:] for row in cost]
    snapped = 0
    for k, (i, j) in enumerate(pairs):
        c = cls[k]
        if spread[c] <= TIGHT_SPREAD and abs(logs[k] - centre[c]) <= SNAP_DEVIATIONS * max(spread[c], 1e-3):
            v = math.exp(centre[c])
            out[i][j] = out[j][i] = v
            snapped += 1
    return out, snapped

