"""Result, failure and event records: the JSON Lines contract (docs/DESIGN.md, docs/LOG_FORMAT.md)."""

import json
import time
import uuid
from datetime import datetime, timezone

from collbench.ops import get_op
from collbench.slurm import in_allocation, planned_hosts
from collbench.sizes import format_size

SCHEMA_VERSION = 1


def new_run_id():
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def _stamp(ts=None):
    ts = time.time() if ts is None else ts
    iso = datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"schema": SCHEMA_VERSION, "time": iso, "ts": round(ts, 3)}


class RunContext:
    """What every record of one run shares: where, how, with what."""

    def __init__(self, cfg, engine, mpi_version, run_id=None):
        self.run_id = run_id or new_run_id()
        # srun: Slurm places the ranks; observe_hosts() takes what they report
        self.hosts = planned_hosts(cfg)
        self.nodes = len(self.hosts) if cfg.launcher == "srun" and cfg.implicit_hosts and self.hosts else cfg.nodes
        self.ranks = cfg.ranks
        self.engine = engine
        self.mpi = mpi_version
        self.transport = cfg.transport
        self.thresholds = cfg.thresholds
        self.launcher = cfg.launcher     # what started the ranks: mpirun, srun or none
        # the Slurm job the ranks run in: the allocation we are in, else what the ranks report
        self.slurm_job_id = in_allocation() if cfg.launcher == "srun" else None

    def observe_hosts(self, rank_hosts):
        """The host of every rank, as the ranks reported it (the engine's CBHOSTS line)."""
        hosts = list(dict.fromkeys(h for h in rank_hosts if isinstance(h, str) and h))
        if hosts:
            self.hosts = hosts
            self.nodes = len(hosts)

    def observe_slurm_job(self, job_id):
        """The Slurm job the ranks reported running in (srun outside an allocation makes one)."""
        self.slurm_job_id = job_id

    def common(self):
        out = {"run_id": self.run_id, "hosts": list(self.hosts), "nodes": self.nodes,
               "ranks": self.ranks, "engine": self.engine, "mpi": self.mpi,
               "transport": self.transport, "launcher": self.launcher}
        if self.slurm_job_id:
            out["slurm_job_id"] = self.slurm_job_id
        return out


# Optional result fields: set only when a run used them, so records of plain runs keep their shape.
OPTIONAL_RESULT_FIELDS = ("algorithm", "inplace", "root", "timing", "latency_p50_us",
                          "latency_p90_us", "latency_p99_us", "latency_pmax_us", "order", "pattern")


def result_record(ctx, op_name, size_bytes, datatype, avg_us, min_us, max_us, iterations, warmup,
                  validation="off", straggler_rank=None, ranks=None, ts=None, **optional):
    """One (op, size) measurement with its bandwidth and verdict (optional: OPTIONAL_RESULT_FIELDS)."""
    unknown = set(optional) - set(OPTIONAL_RESULT_FIELDS)
    if unknown:
        raise TypeError(f"unknown result fields: {', '.join(sorted(unknown))}")
    op = get_op(op_name)
    nranks = ranks or ctx.ranks
    algbw, busbw = op.bandwidth(size_bytes, nranks, avg_us)
    rec = _stamp(ts)
    rec.update({"type": "result"})
    rec.update(ctx.common())
    rec.update({
        "ranks": nranks,
        "op": op.name,
        "datatype": datatype,
        "size": format_size(size_bytes) if op.has_size else "-",
        "size_bytes": size_bytes if op.has_size else 0,
        "latency_avg_us": avg_us,
        "latency_min_us": min_us,
        "latency_max_us": max_us,
        "iterations": iterations,
        "warmup": warmup,
        "algbw_bytes_per_s": None if algbw is None else round(algbw, 1),
        "busbw_bytes_per_s": None if busbw is None else round(busbw, 1),
        "validation": validation,
        "straggler_rank": straggler_rank,
        "verdict": ctx.thresholds.verdict(op.name, size_bytes, avg_us),
        "status": "ok",
    })
    rec.update({k: v for k, v in optional.items() if v is not None})
    return rec


def failure_record(ctx, error, stderr_tail="", op_name=None, size_bytes=None, exit_code=None, ts=None):
    rec = _stamp(ts)
    rec.update({"type": "failure"})
    rec.update(ctx.common())
    rec.update({"status": "failed", "error": error, "stderr_tail": stderr_tail,
                "op": op_name, "size_bytes": size_bytes, "exit_code": exit_code})
    return rec


def event_record(event, pid=None, detail=None, ts=None, **extra):
    rec = _stamp(ts)
    rec.update({"type": "event", "event": event, "pid": pid, "detail": detail})
    rec.update(extra)
    return rec


def dumps(rec):
    """One line of JSON, no newline. Non-finite floats become null (JSON has none)."""
    return json.dumps(_finite(rec), separators=(",", ":"), ensure_ascii=False)


def _finite(rec):
    out = {}
    for k, v in rec.items():
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            v = None
        out[k] = v
    return out
