"""`topo compare`'s measurement: a collective with ring and recursive doubling forced, in the
original rank order and in a new one, and the speed-up with a confidence interval.

Orders. The original order is the config's hosts as listed (the scheduler's order), each host
as many times as the new order uses it. The new order comes from an order file (any form `topo
map` writes: PAT.hosts_order.yaml, PAT.mapping.json, PAT.rankfile, PAT.hostfile,
PAT.machinefile, PAT.slurm_hostfile), from `topo map` run now on a matrix (one order per
pattern), or from the config's `hosts_order`. Each order is applied with the launcher's
`hosts_order` (a rankfile, machinefile or SLURM_HOSTFILE: engines/rank_order.py).

Jobs. An algorithm is forced per MPI job (engines/algorithms/), so each (pattern, order)
runs in its own job(s), every op and size of the comparison in it. With `rounds` > 1 the jobs
alternate between the two orders (A B A B ...), so slow drift of the machine weighs on both.

Statistics. A point (pattern, op, size) gets `iterations` timed calls per order (the
topology-aware collectives report's rule: at least 100), run as `blocks` plan steps of iterations/blocks calls each; each step's
average latency is one sample. Per order the point's time is the median of its block samples;
the speed-up is median(original) / median(new). Its confidence interval is a percentile
bootstrap: both orders' blocks are resampled with replacement (independently, 2000 times,
fixed seed: the same data give the same interval) and the 2.5th and 97.5th percentiles of the
resampled ratio of medians are the 95 % interval (collbench/stats.py, shared with `compare`).
"""

import copy
import json
import os
import re
from dataclasses import dataclass, field

from collbench.bounded_file import read_text
from collbench.config import Step
from collbench.engines import algorithms as algs
from collbench.engines import get_engine
from collbench.engines.mpi_job import JobRunner
from collbench.errors import UserError
from collbench.ops import DATATYPES, default_datatype, get_op
from collbench.pair_matrix import split_label
from collbench.stats import bootstrap_speedup

PATTERNS = ("ring", "recursive-doubling")
# the MPI algorithm each pattern forces (Open MPI's tuned names and MPICH's CVAR values agree)
PATTERN_ALGORITHM = {"ring": "ring", "recursive-doubling": "recursive_doubling"}
OPS = ("allgather", "allreduce")
REPORT_MIN_ITERATIONS = 100     # the topology-aware collectives report's least timed calls per point
MAX_ORDER_FILE = 4 << 20


# ---------------------------------------------------------------- order files

_RANKFILE = re.compile(r"^rank\s+(\d+)\s*=\s*(\S+?)(?:\s+slot=\S+)?\s*$")
_MACHINE = re.compile(r"^([^\s:]+)(?::(\d+))?$")


def load_order(path, cfg):
    """The host of each rank from an order file; UserError (exit 2) naming the file and entry."""
    text = read_text(path, MAX_ORDER_FILE, f"--order {path}", "a rank order")
    name = os.path.basename(path)
    if name.endswith((".yaml", ".yml")):
        hosts = _yaml_order(path, text)
    elif name.endswith(".json"):
        hosts = _json_order(path, text)
    elif name.endswith(".machinefile"):
        hosts = _machinefile_order(path, text)
    else:
        hosts = _line_order(path, text)
    return check_order(hosts, cfg, f"--order {path}")


def _yaml_order(path, text):
    from collbench.bounded_yaml import YAMLRefused, load_bounded
    try:
        data = load_bounded(text)
    except YAMLRefused as e:
        raise UserError(f"--order {path}: {e.message}") from None
    except Exception as e:   # yaml.YAMLError and anything its parser raises on bad text
        raise UserError(f"--order {path}: not valid YAML: {str(e)[:200]}") from None
    if not isinstance(data, dict) or "hosts_order" not in data:
        raise UserError(f"--order {path}: expected a mapping with `hosts_order:` (a list of hosts)")
    return data["hosts_order"]


def _json_order(path, text):
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise UserError(f"--order {path}: not valid JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict) or "hosts_order" not in data:
        raise UserError(f"--order {path}: expected an object with \"hosts_order\" (topo map's mapping.json)")
    return data["hosts_order"]


def _lines(text):
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            yield n, line


def _machinefile_order(path, text):
    hosts = []
    for n, line in _lines(text):
        m = _MACHINE.match(line)
        if not m or (m.group(2) is not None and not 1 <= int(m.group(2)) <= 1 << 20):
            raise UserError(f"--order {path}: line {n}: expected host or host:count, got {line[:80]!r}")
        hosts += [m.group(1)] * int(m.group(2) or 1)
    return hosts


def _line_order(path, text):
    """A rankfile (`rank r=host slot=k`) or one host per line (hostfile, Slurm hostfile)."""
    lines = list(_lines(text))
    if lines and lines[0][1].startswith("rank"):
        by_rank = {}
        for n, line in lines:
            m = _RANKFILE.match(line)
            if not m:
                raise UserError(f"--order {path}: line {n}: expected `rank N=host slot=...`, got {line[:80]!r}")
            r = int(m.group(1))
            if r in by_rank:
                raise UserError(f"--order {path}: line {n}: rank {r} given twice")
            by_rank[r] = m.group(2)
        if sorted(by_rank) != list(range(len(by_rank))):
            raise UserError(f"--order {path}: the ranks are not 0..{len(by_rank) - 1}")
        return [by_rank[r] for r in range(len(by_rank))]
    # hostfile lines may carry `slots=N` after the host: the host is the first word
    return [line.split()[0] for _, line in lines]


def check_order(hosts, cfg, where):
    """hosts as a list of config host names (a `host:k` label counts as its host); UserError
    naming the entry otherwise."""
    if not isinstance(hosts, list) or len(hosts) < 2:
        raise UserError(f"{where}: expected a list of at least 2 hosts, one per rank")
    known = {h.name: h.slots for h in cfg.hosts}
    out = []
    for i, h in enumerate(hosts):
        name = split_label(h)[0] if isinstance(h, str) else None
        if name not in known:
            shown = ", ".join(list(known)[:8]) + (", ..." if len(known) > 8 else "")
            raise UserError(f"{where}: entry {i}: {str(h)[:80]!r} is not a host of {cfg.source} ({shown})")
        out.append(name)
    if not cfg.oversubscribe:
        for name in dict.fromkeys(out):
            if out.count(name) > known[name]:
                raise UserError(f"{where}: host {name} runs {out.count(name)} ranks but has {known[name]} "
                                f"slot(s) (add slots, or set oversubscribe: true)")
    return out


def original_order(cfg, new_order):
    """The same hosts in the config's order (the scheduler's), each as often as in new_order."""
    index = {h.name: i for i, h in enumerate(cfg.hosts)}
    return sorted(new_order, key=lambda h: index[h])


# ---------------------------------------------------------------- running

@dataclass
class Point:
    pattern: str
    op: str
    size_bytes: int
    algorithm: str
    original: list = field(default_factory=list)   # block samples (us), original order
    new: list = field(default_factory=list)        # block samples (us), new order
    errors: list = field(default_factory=list)
    note: str = ""

    def stats(self):
        return bootstrap_speedup(self.original, self.new)


@dataclass
class Settings:
    patterns: tuple = ("ring", "recursive-doubling")
    ops: tuple = ("allgather",)
    sizes: tuple = (1 << 20,)
    iterations: int = REPORT_MIN_ITERATIONS
    blocks: int = 10
    warmup: int = 10
    rounds: int = 1
    datatype: str = None


def block_steps(s, op, algorithm):
    """The plan steps of one (pattern, order) job for one op: `blocks` steps per size."""
    per_block = -(-s.iterations // s.blocks)
    dt = s.datatype or default_datatype(get_op(op))
    out = []
    for size in s.sizes:
        for b in range(s.blocks):
            out.append(Step(op, size, per_block, s.warmup if b == 0 else 1, dt, algorithm=algorithm))
    return out


def order_config(cfg, order):
    """A copy of cfg whose jobs run rank r on order[r]."""
    out = copy.copy(cfg)
    out.hosts_order = list(order)
    out.ranks = len(order)
    out.ranks_per_node = None
    return out


def availability(cfg, op, pattern, nranks, count):
    """(runs, note): False with the reason when this MPI has no such algorithm for op; True with
    a note when it runs but the library substitutes another (e.g. recursive doubling on a
    non-power-of-two number of ranks runs as Bruck in Open MPI)."""
    name = PATTERN_ALGORITHM[pattern]
    try:
        cat = algs.catalogue(cfg)
        cat.find(op, name)
    except UserError as e:
        return False, str(e)
    return True, algs.known_constraint(cat.flavour, op, name, nranks, count)


def run(cfg, orders, s, ctx, on_progress=None, runner=None, on_plan=None, on_record=None, points=None, recs=None):
    """Measure every (pattern, op, size) in both orders of each pattern.

    orders: {pattern: (original order, new order, new order's label)}. Yields nothing; returns
    (points, records): one Point per (pattern, op, size) in the table's order, and every result
    and failure record (each with `algorithm`, `order` and `pattern`). points/recs: lists to fill
    instead, so a caller stopped half-way keeps what finished. on_plan(pattern, ops): the ops a
    pattern runs (the others are not available); on_record(pattern, which, rec): after each record.
    """
    engine = get_engine("builtin")
    runner = runner or JobRunner()
    points = [] if points is None else points
    recs = [] if recs is None else recs
    for pattern in s.patterns:
        original, new, new_label = orders[pattern]
        algorithm = PATTERN_ALGORITHM[pattern]
        ops = []
        for op in s.ops:
            dt_size = DATATYPES[s.datatype or default_datatype(get_op(op))]
            runs = True
            for size in s.sizes:
                runs, note = availability(cfg, op, pattern, len(new), size // dt_size)
                points.append(Point(pattern, op, size, algorithm, note=note if runs else f"not run: {note}"))
            if runs:
                ops.append(op)
        if on_plan:
            on_plan(pattern, list(ops))
        if not ops:
            continue
        by_key = {(p.op, p.size_bytes): p for p in points if p.pattern == pattern}
        steps = [st for op in ops for st in block_steps(s, op, algorithm)]
        parts = [steps] if s.rounds <= 1 else _split_rounds(steps, s)
        for part in parts:
            for which, order, label in (("original", original, "original"), ("new", new, new_label)):
                job_cfg = order_config(cfg, order)
                job_ctx = copy.copy(ctx)
                job_ctx.hosts = list(dict.fromkeys(order))
                job_ctx.nodes = len(job_ctx.hosts)
                job_ctx.ranks = len(order)
                if on_progress:
                    on_progress(pattern, which, len(part))
                for item in engine.measure(job_cfg, part, job_ctx, runner):
                    rec = item.record
                    rec["order"] = label
                    rec["pattern"] = pattern
                    rec.setdefault("algorithm", algorithm)
                    recs.append(rec)
                    step = part[item.index] if 0 <= item.index < len(part) else None
                    if step is not None:
                        point = by_key[(step.op, step.size_bytes)]
                        if rec["type"] == "result":
                            (point.original if which == "original" else point.new).append(rec["latency_avg_us"])
                        else:
                            point.errors.append(f"{which} order: {rec.get('error', '')}")
                    if on_record:       # after the point holds it: a stop from here on keeps it
                        on_record(pattern, which, rec)
    return points, recs


def _split_rounds(steps, s):
    """The steps cut into s.rounds parts, each holding about blocks/rounds blocks of every point."""
    per_point = s.blocks
    groups = [steps[i:i + per_point] for i in range(0, len(steps), per_point)]
    parts = [[] for _ in range(s.rounds)]
    for g in groups:
        for k in range(s.rounds):
            chunk = g[k * per_point // s.rounds:(k + 1) * per_point // s.rounds]
            if k > 0 and chunk:   # a later job warms up again
                chunk[0] = Step(chunk[0].op, chunk[0].size_bytes, chunk[0].iterations, s.warmup,
                                chunk[0].datatype, algorithm=chunk[0].algorithm)
            parts[k] += chunk
    return [p for p in parts if p]
