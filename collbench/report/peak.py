"""The fabric's point-to-point peak, the yardstick of the report's "% of peak" column.

Where it comes from, in order of preference (the report says which):
  --peak-from FILE   a `topo measure` bandwidth matrix (collbench.pair_matrix's JSON or CSV):
                     its fastest pair;
  --peak-gbps N      a number the user knows (GB/s = 10^9 bytes/s, as busbw is shown);
  (default)          measured now: a two-rank broadcast with the built-in engine, `collbench
                     once`'s plan through the harness (progress, Ctrl-C) in this process (a
                     2-rank bcast is one rank sending to the other, so its busbw is the
                     point-to-point bandwidth); between two different hosts when the config
                     has two;
  --no-peak          none: the report shows busbw without a percentage.
"""

import copy
import math
import os
from dataclasses import dataclass, field

from collbench.errors import UserError

PEAK_OPS = "bcast"
PEAK_SIZES = "256KB,1MB,4MB,16MB"
PEAK_ITERATIONS = 20


@dataclass
class Peak:
    bytes_per_s: float            # None: no peak (the report shows no percentages)
    source: str                   # matrix, value, measured, none, failed
    text: str                     # one sentence for the report: where the number came from
    hosts: list = field(default_factory=list)
    transport: str = None
    engine: str = None
    mpi: str = None

    def as_dict(self):
        return {"bytes_per_s": self.bytes_per_s, "source": self.source, "text": self.text, "hosts": self.hosts,
                "transport": self.transport, "engine": self.engine, "mpi": self.mpi}


def peak_from_value(gbps):
    if not (isinstance(gbps, float) and math.isfinite(gbps) and gbps > 0):
        raise UserError(f"--peak-gbps {gbps}: expected a number of GB/s > 0")
    return Peak(gbps * 1e9, "value", f"given with --peak-gbps: {gbps:g} GB/s")


def no_peak():
    return Peak(None, "none", "no peak (--no-peak): busbw is shown without a percentage")


# ------------------------------------------------------------------ topo measure matrix

def peak_from_matrix(path):
    """The fastest pair of a `topo measure` bandwidth matrix (collbench.pair_matrix's CSV or
    JSON, GB/s); each pair counts at its slower direction. MatrixError (exit 2) on a bad file."""
    from collbench.pair_matrix import MatrixError, load_matrix
    m = load_matrix(path, "bandwidth")
    pairs = [(m.pair_value(i, j), i, j) for i in range(m.size) for j in range(i + 1, m.size)]
    pairs = [p for p in pairs if p[0] and p[0] > 0]
    if not pairs:
        raise MatrixError(path, None, "the bandwidth matrix has no pair (one host?)")
    best, i, j = max(pairs, key=lambda p: p[0])
    values = sorted(v for v, _, _ in pairs)
    med = values[len(values) // 2]
    text = (f"from the topo measure matrix {os.path.basename(path)}: fastest pair {m.labels[i]} ↔ {m.labels[j]} "
            f"{best:.3g} GB/s (slower direction; median pair {med:.3g} GB/s, {m.size} ranks)")
    return Peak(best * 1e9, "matrix", text, hosts=[m.labels[i], m.labels[j]])


# ------------------------------------------------------------------ measured now

def two_host_config(cfg):
    """A copy of the config whose two ranks run on two different hosts, or None when the config
    has one host (or already places 2 ranks on two)."""
    names = list(dict.fromkeys(cfg.host_names))
    if cfg.implicit_hosts or len(names) < 2:
        return None
    probe = copy.copy(cfg)
    probe.ranks = 2
    if len(set(probe.placement())) >= 2:
        return None
    from collbench.config.model import Host
    probe.hosts, probe.hostfile, probe.ranks_per_node, probe.hosts_order = [Host(n) for n in names[:2]], None, None, None
    return probe


def measure_peak(config=None, quiet=False):
    """Measure the peak now (see the module doc); a Peak with source 'failed' if it could not.
    harness.Stopped when Ctrl-C or SIGTERM stopped it."""
    from collbench import harness
    from collbench.config import load_config
    try:
        cfg = load_config(config)
        cfg = two_host_config(cfg) or cfg
        steps = harness.once_plan(cfg, engine="builtin", np=2, ops=PEAK_OPS, sizes=PEAK_SIZES,
                                  iterations=PEAK_ITERATIONS)
        engine, ctx = harness.prepare(cfg, steps)
    except UserError as e:
        return Peak(None, "failed", f"the two-rank peak test could not run: {e}")
    records, job = harness.run_plan("report", engine, cfg, steps, ctx, quiet=quiet, on_stop="no report written")
    if job.stopped:
        raise harness.Stopped(job.exit_code)
    results = [r for r in records if r.get("type") == "result" and r.get("busbw_bytes_per_s")]
    if not results:
        failures = [r.get("error") for r in records if r.get("type") == "failure"]
        return Peak(None, "failed", f"the two-rank peak test failed: {failures[0] if failures else 'no result'}")
    best = max(results, key=lambda r: r["busbw_bytes_per_s"])
    hosts = list(best.get("hosts") or [])
    where = (f"between {hosts[0]} and {hosts[1]}" if len(hosts) >= 2
             else f"on {hosts[0]} (both ranks on one host: an intra-node peak)" if hosts else "")
    text = (f"measured for this report: a two-rank broadcast (one rank sends to the other) {where}, "
            f"transport {best.get('transport', '?')}, engine {best.get('engine', '?')}; best of "
            f"{PEAK_SIZES.replace(',', '/')} = {best['busbw_bytes_per_s'] / 1e9:.3g} GB/s "
            f"({best.get('size', '?')})")
    return Peak(best["busbw_bytes_per_s"], "measured", text, hosts=hosts, transport=best.get("transport"),
                engine=best.get("engine"), mpi=best.get("mpi"))
