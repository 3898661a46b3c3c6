"""Every pair's ping-pong latency and bandwidth between the ranks of one MPI job, over given
hosts: the job `topo measure` runs over all of the config's hosts and `locate` over a suspect
group (shared here, below both verbs).

One job over the config's hosts, one rank per host (or `ranks_per_host`), runs the built-in
engine's `--pairs` mode (collbench_engine.c): P-1 rounds of disjoint pairs (the circle method),
each pair ping-pongs a small message (latency, half the round trip) then a large one (bandwidth,
bytes / half the round trip); one pair at a time, or every pair of a round at once
(`concurrent`). Rank 0 prints one `CBPAIR {json}` line per pair when all rounds are done.

Where each rank runs is fixed, not left to the launcher's fill: the job is launched with
`hosts_order` set to the config's hosts (each repeated ranks_per_host times, consecutively), so
rank r's label is hosts_order[r] (`host:k` for the k-th rank of a host when there are several).
Without configured hosts (this machine only, or Slurm choosing the nodes) the labels are the
host names the ranks report (the engine's CBHOSTS line).

The engine's output is checked like any input: a pair line that is not as written, a pair
missing, a value that is not a positive finite number is a MeasureError (a runtime fault: the
job's stderr reason, exit 1), never a matrix with holes.
"""

import copy
import json
import math
import time
from dataclasses import dataclass, field

from collbench.engines import launcher
from collbench.engines.build import ensure_engine
from collbench.engines.builtin import HOSTS_PREFIX, parse_hosts_line
from collbench.engines.mpi_job import JobRunner, describe_exit, stderr_reason
from collbench.errors import UserError
from collbench.pair_matrix import TopoMatrix

PAIR_PREFIX = "CBPAIR "
MAX_PAIR_LINE = 4096


class MeasureError(Exception):
    """The measurement job failed (a rank died, a host unreachable, output missing). Exit 1."""

    def __init__(self, message, stderr_tail="", exit_code=None):
        super().__init__(message)
        self.stderr_tail = stderr_tail
        self.exit_code = exit_code


@dataclass
class Settings:
    ranks_per_host: int = 1
    lat_size: int = 8
    bw_size: int = 1 << 20
    iterations: int = 100
    warmup: int = 10
    concurrent: bool = False
    timeout: float = 600.0      # seconds the job may stay silent (it prints only at the end)


@dataclass
class Measurement:
    labels: list                  # label of each rank
    pairs: dict                   # (a, b) with a < b -> {"round", "lat_us", "bw_bytes_per_s"}
    settings: Settings
    reported_hosts: list = field(default_factory=list)   # the ranks' own host names (CBHOSTS)
    seconds: float = 0.0

    @property
    def size(self):
        return len(self.labels)

    def matrices(self, meta=None):
        """(latency TopoMatrix in us, bandwidth TopoMatrix in GB/s); both directions of a pair
        carry its one measurement."""
        p = self.size
        lat = [[None] * p for _ in range(p)]
        bw = [[None] * p for _ in range(p)]
        for (a, b), v in self.pairs.items():
            lat[a][b] = lat[b][a] = v["lat_us"]
            bw[a][b] = bw[b][a] = v["bw_bytes_per_s"] / 1e9
        meta = dict(meta or {})
        return (TopoMatrix.from_rows(self.labels, "latency", lat, "topo measure", meta),
                TopoMatrix.from_rows(self.labels, "bandwidth", bw, "topo measure", meta))


def measure_config(cfg, ranks_per_host=1):
    """A copy of cfg whose job runs ranks_per_host ranks on each configured host, in the config's
    host order; (config, labels) with labels None when the ranks' reported names must be used."""
    cfg = copy.copy(cfg)
    n = ranks_per_host
    if cfg.implicit_hosts:   # this machine (or Slurm's choice): as many ranks as asked, names reported
        cfg.hosts_order = None
        cfg.ranks = max(2, cfg.ranks if n == 1 else n)
        return cfg, None
    if not cfg.oversubscribe:
        short = [h for h in cfg.hosts if h.slots < n]
        if short:
            raise UserError(f"--ranks-per-host {n}: host {short[0].name} has {short[0].slots} slot(s) in "
                            f"{cfg.hostfile or cfg.source} (add slots, or set oversubscribe: true)")
    order = [h.name for h in cfg.hosts for _ in range(n)]
    if len(order) < 2:
        raise UserError(f"{cfg.source}: one host with one rank has no pair to measure "
                        f"(add hosts, or --ranks-per-host 2)")
    cfg.hosts_order = order
    cfg.ranks = len(order)
    cfg.ranks_per_node = None
    labels = order if n == 1 else [f"{h}:{k}" for h in [x.name for x in cfg.hosts] for k in range(n)]
    return cfg, labels


def labels_from_reported(names):
    """Labels from the ranks' own host names: the name, or name:k when a host runs several ranks."""
    counts = {}
    for h in names:
        counts[h] = counts.get(h, 0) + 1
    seen, out = {}, []
    for h in names:
        k = seen.get(h, 0)
        seen[h] = k + 1
        out.append(h if counts[h] == 1 else f"{h}:{k}")
    return out


def engine_argv(engine, s):
    argv = [engine, "--pairs", "--lat-size", str(s.lat_size), "--bw-size", str(s.bw_size),
            "--iterations", str(s.iterations), "--warmup", str(s.warmup), "--report-hosts"]
    if s.concurrent:
        argv.append("--concurrent")
    return argv


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_pair_line(line, nranks):
    """The payload of a CBPAIR line as {a, b, round, lat_us, bw_bytes_per_s}, or None for any
    other line; ValueError for a CBPAIR line that is not as the engine writes it."""
    line = line.strip()
    if not line.startswith(PAIR_PREFIX):
        return None
    if len(line) > MAX_PAIR_LINE:
        raise ValueError(f"a CBPAIR line of {len(line)} characters")
    try:
        rec = json.loads(line[len(PAIR_PREFIX):])
    except ValueError:
        raise ValueError(f"a CBPAIR line that is not JSON: {line[:120]!r}") from None
    if not isinstance(rec, dict):
        raise ValueError(f"a CBPAIR line that is not an object: {line[:120]!r}")
    a, b, rnd = rec.get("a"), rec.get("b"), rec.get("round")
    for key, v in (("a", a), ("b", b), ("round", rnd)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"CBPAIR {key}: got {str(v)[:40]!r}, expected a rank number")
    if not (0 <= a < b < nranks):
        raise ValueError(f"CBPAIR pair ({a}, {b}) outside ranks 0..{nranks - 1}")
    out = {"a": a, "b": b, "round": rnd}
    for key in ("lat_us", "bw_bytes_per_s"):
        v = rec.get(key)
        if not _num(v) or v <= 0:
            raise ValueError(f"CBPAIR {key} of pair ({a}, {b}): got {str(v)[:40]!r}, expected a positive number")
        out[key] = float(v)
    return out


def run(cfg, settings, runner=None, on_line=None):
    """Run the measurement job; a Measurement, or MeasureError when the job fails.

    cfg: the config (measure_config is applied here); runner: a JobRunner (default a plain one).
    """
    job_cfg, labels = measure_config(cfg, settings.ranks_per_host)
    engine = ensure_engine(job_cfg)
    argv, env = launcher.build_command(job_cfg, engine_argv(engine, settings))
    nranks = job_cfg.ranks
    pairs, reported, bad = {}, [], []

    def line_seen(line):
        if on_line:
            on_line(line)
        if line.startswith(HOSTS_PREFIX):
            reported[:] = parse_hosts_line(line) or []
            return
        try:
            rec = parse_pair_line(line, nranks)
        except ValueError as e:
            bad.append(str(e))
            return
        if rec is not None:
            pairs[(rec["a"], rec["b"])] = rec

    t0 = time.monotonic()
    res = (runner or JobRunner()).run(argv, env, settings.timeout, line_seen)
    seconds = time.monotonic() - t0
    expected = nranks * (nranks - 1) // 2
    if res.timed_out:
        raise MeasureError(f"no output for {settings.timeout:g}s (--timeout): the measurement job was "
                           f"stopped", res.stderr_tail, res.returncode)
    if res.returncode != 0:
        reason = stderr_reason(res.stderr_tail)
        raise MeasureError(f"the measurement job {describe_exit(res.returncode)}"
                           + (f": {reason}" if reason else ""), res.stderr_tail, res.returncode)
    if bad:
        raise MeasureError(f"the engine's output is damaged: {bad[0]}", res.stderr_tail, res.returncode)
    if len(pairs) != expected:
        raise MeasureError(f"the job reported {len(pairs)} of the {expected} pairs of {nranks} ranks",
                           res.stderr_tail, res.returncode)
    if labels is None:
        if len(reported) != nranks:
            raise MeasureError(f"the job reported the hosts of {len(reported)} of its {nranks} ranks",
                               res.stderr_tail, res.returncode)
        labels = labels_from_reported(reported)
    return Measurement(labels, pairs, settings, reported, seconds)
