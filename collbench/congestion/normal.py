"""A counter's normal, and the test of whether a movement is beyond it.

A tally holds, per subject (a host, or a path "<host>><peer>") and counter, how much the counter
moved over a set of steps and how it spread from step to step; the subject's exposure is the
steps and seconds its counters were read. `collbench baseline save` keeps the tally of the
baseline's runs (the host's own normal); `collbench diagnose` builds one of the results' good
steps, and tests the slow steps' movement against whichever it has (docs/DIAGNOSIS.md, "How
sure").

The test respects counts, and looks at the normal two ways (diagnose/evidence.py judge takes the
smaller p, doubled):
  how many events: the slow steps' events K over their t seconds against the normal rate lambda
    (events / seconds of the reference, plus PSEUDO_EVENTS so a counter that never moved there
    still has a rate), as the upper tail P(X >= K) of a negative binomial with mean lambda x t and
    the step-to-step overdispersion of the reference (a counter that moves in bursts, as TCP loss
    recovery does, needs far more events to be proof than a steady one);
  in how many steps: the slow steps it moved in against the share of reference steps it moved in
    (Laplace-smoothed), as a binomial upper tail: one burst in a reference of 60 steps makes the
    overdispersion so large that no count is proof, while moving in 6 of 7 slow steps against 1
    of 60 still is.
A handful of events is never proof: MIN_EVENTS, MIN_SLOW_STEPS and MIN_CONTRAST come on top.
"""

import math

# One event the reference never saw, spread over its seconds: a counter that stayed at 0 in 30
# reference steps is not taken to have rate 0 (any movement would then be infinitely unlikely).
PSEUDO_EVENTS = 1.0
# Overdispersion (variance = mean + DISPERSION x mean^2 per step): the reference's own, estimated
# from at least MIN_REF_STEPS steps and MIN_REF_EVENTS events; never below PHI_FLOOR (loss and
# marking come in bursts even where a short reference happened to see them steady); PHI_UNKNOWN
# where it cannot be estimated (a burst every few steps: what a quiet testbed's TCP loss
# recovery showed, 300-500 retransmissions in one step of 24, none in the rest).
MIN_REF_STEPS = 8
MIN_REF_EVENTS = 3
PHI_FLOOR = 0.25
PHI_UNKNOWN = 4.0
MAX_SUBJECTS = 1 << 16          # tally entries kept from untrusted input (a baseline file)
MAX_TEXT = 400


class Tally:
    """Per (subject, counter key): events, steps it moved in, sum of squares and of x * t (for the
    dispersion); per kind of subject ("host" or "path"): steps, seconds and sum of t^2 of the steps
    whose records carried them."""

    def __init__(self):
        self.exposure = {"host": [0, 0.0, 0.0], "path": [0, 0.0, 0.0]}
        self.counts = {}            # (subject, key) -> [events, steps moved, sum x^2, sum x*t]
        self.dropped = 0

    def add_exposure(self, kind, seconds):
        e = self.exposure[kind]
        e[0] += 1
        e[1] += seconds
        e[2] += seconds * seconds

    def add(self, subject, key, delta, seconds):
        if delta <= 0:
            # a step it did not move in adds nothing (its exposure is counted apart): counted as
            # "moved", every read of a per-peer counter made the steps view see it move always
            return
        c = self.counts.get((subject, key))
        if c is None:
            if len(self.counts) >= MAX_SUBJECTS:
                self.dropped += 1
                return
            c = self.counts[(subject, key)] = [0, 0, 0.0, 0.0]
        c[0] += delta
        c[1] += 1
        c[2] += float(delta) * delta
        c[3] += delta * seconds

    def merge(self, other):
        for kind, e in other.exposure.items():
            mine = self.exposure[kind]
            for i in range(3):
                mine[i] += e[i]
        for k, c in other.counts.items():
            mine = self.counts.get(k)
            if mine is None:
                if len(self.counts) >= MAX_SUBJECTS:
                    self.dropped += 1
                    continue
                self.counts[k] = list(c)
            else:
                for i in range(4):
                    mine[i] += c[i]

    def reference(self, subject, key):
        """The Reference of one subject's counter, or None when no step carried such counters."""
        kind = "path" if ">" in subject else "host"
        steps, seconds, sum_t2 = self.exposure[kind]
        if steps <= 0 or seconds <= 0:
            return None
        events, moved, sum_x2, sum_xt = self.counts.get((subject, key), (0, 0, 0.0, 0.0))
        return Reference(steps, seconds, events, moved, dispersion(events, seconds, steps, sum_x2, sum_xt, sum_t2))

    def as_dict(self):
        """The baseline file's `counter_normal` (stable, JSON)."""
        out = {"exposure": {k: {"steps": e[0], "seconds": round(e[1], 6), "sum_t2": round(e[2], 9)}
                            for k, e in self.exposure.items()},
               "counters": {}}
        for (subject, key), (events, moved, sum_x2, sum_xt) in sorted(self.counts.items()):
            kind = "path" if ">" in subject else "host"
            steps, seconds, sum_t2 = self.exposure[kind]
            entry = {"events": events, "steps_moved": moved, "sum_x2": sum_x2, "sum_xt": round(sum_xt, 9),
                     "rate_per_s": round(events / seconds, 6) if seconds else None,
                     "dispersion": _round(dispersion(events, seconds, steps, sum_x2, sum_xt, sum_t2))}
            out["counters"][f"{subject}|{key}"] = entry
        return out


def _round(v):
    return None if v is None else round(v, 6)


def from_dict(d, where):
    """A Tally from a baseline file's `counter_normal` (untrusted): ValueError naming the part
    that is wrong."""
    t = Tally()
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected an object")
    exp = d.get("exposure")
    if not isinstance(exp, dict):
        raise ValueError(f"{where}.exposure: expected an object")
    for kind in t.exposure:
        e = exp.get(kind)
        if e is None:
            continue
        if not isinstance(e, dict):
            raise ValueError(f"{where}.exposure.{kind}: expected an object")
        t.exposure[kind] = [_count(e.get("steps"), f"{where}.exposure.{kind}.steps"),
                            _number(e.get("seconds"), f"{where}.exposure.{kind}.seconds"),
                            _number(e.get("sum_t2"), f"{where}.exposure.{kind}.sum_t2")]
    counters = d.get("counters")
    if not isinstance(counters, dict):
        raise ValueError(f"{where}.counters: expected an object")
    if len(counters) > MAX_SUBJECTS:
        raise ValueError(f"{where}.counters: {len(counters)} entries (at most {MAX_SUBJECTS})")
    for k, c in counters.items():
        subject, sep, key = k.rpartition("|")
        if not sep or not subject or not key or len(k) > MAX_TEXT:
            raise ValueError(f"{where}.counters: key is not '<host or path>|<counter>'")
        if not isinstance(c, dict):
            raise ValueError(f"{where}.counters[{k[:80]!r}]: expected an object")
        at = f"{where}.counters[{k[:80]!r}]"
        t.counts[(subject, key)] = [_count(c.get("events"), f"{at}.events"), _count(c.get("steps_moved"), f"{at}.steps_moved"),
                                    _number(c.get("sum_x2"), f"{at}.sum_x2"), _number(c.get("sum_xt"), f"{at}.sum_xt")]
    return t


def _count(v, where):
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62:
        raise ValueError(f"{where}: expected a whole number >= 0")
    return v


def _number(v, where):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}: expected a number >= 0")
    return float(v)


class Reference:
    """A subject's counter over reference steps: steps and seconds read, events, steps it moved in,
    and its overdispersion (None: too little to estimate)."""
    __slots__ = ("steps", "seconds", "events", "moved", "dispersion")

    def __init__(self, steps, seconds, events, moved, disp):
        self.steps, self.seconds, self.events, self.moved, self.dispersion = steps, seconds, events, moved, disp

    @property
    def rate(self):
        """Events per second, with PSEUDO_EVENTS: never 0."""
        return (self.events + PSEUDO_EVENTS) / self.seconds

    @property
    def step_share(self):
        """The share of reference steps it moved in, Laplace-smoothed: never 0 or 1."""
        return (self.moved + 1) / (self.steps + 2)

    @property
    def phi(self):
        return PHI_UNKNOWN if self.dispersion is None else max(self.dispersion, PHI_FLOOR)


def dispersion(events, seconds, steps, sum_x2, sum_xt, sum_t2):
    """Method-of-moments overdispersion phi of per-step counts x_i with exposures t_i around the
    rate events / seconds (Var x_i = mu_i + phi mu_i^2); None with too few steps or events."""
    if steps < MIN_REF_STEPS or events < MIN_REF_EVENTS or seconds <= 0 or sum_t2 <= 0:
        return None
    lam = events / seconds
    resid = sum_x2 - 2 * lam * sum_xt + lam * lam * sum_t2      # sum (x_i - lam t_i)^2
    return max(0.0, (resid - events) / (lam * lam * sum_t2))


def upper_tail(k, mean, phi, steps):
    """P(X >= k) for X the sum over `steps` steps of negative binomial counts of total mean `mean`
    and overdispersion phi (per step): a negative binomial of size steps / phi."""
    if k <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    size = max(steps, 1) / phi
    # X ~ NB(size, p) with p = size / (size + mean): P(X >= k) = I_{1-p}(k, size)
    return betainc(k, size, mean / (size + mean))


def steps_upper_tail(moved, steps, share):
    """P(at least `moved` of `steps` steps move) when each moves with probability `share`
    (binomial)."""
    if moved <= 0:
        return 1.0
    if moved > steps:
        return 0.0
    return betainc(moved, steps - moved + 1, share)


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    ln_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(ln_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln_front) * _betacf(b, a, 1 - x) / b


def _betacf(a, b, x, iterations=20000, eps=1e-14):
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, iterations + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h
