"""Inspector collectives -> result records (docs/LOG_FORMAT.md, "Records imported from the NCCL
Inspector"), so `report`, `baseline` and `diagnose` read a production job as a benchmark.

One record per collective (communicator, collective, sequence number) over the ranks whose
records were read: latency_avg/min/max_us the mean, fastest and slowest rank's time (the
Inspector's per-rank exec time), size in collbench's convention (bytes per rank: the Inspector's
coll_msg_size_bytes is type size x count, the per-rank count for AllGather; ReduceScatter's count
is the received block, so collbench's size, the whole send buffer, is it x n), algbw/busbw from
collbench's op table. What the records cannot say is in `unknown` (datatype; hosts when not every
node's files were read; the op's own time without verbose traces: `ts` is then the dump's).
"""

import hashlib

from collbench.inspector.parse import OPS
from collbench.ops import get_op
from collbench.results.records import result_record
from collbench.thresholds import Thresholds

ENGINE = "nccl-inspector"


class _Context:
    """A RunContext of a job seen through its Inspector records."""

    def __init__(self, run_id, hosts, nodes, ranks, mpi, job_id):
        self.run_id, self.hosts, self.nodes, self.ranks, self.mpi = run_id, hosts, nodes, ranks, mpi
        self.job_id = job_id
        self.thresholds = Thresholds()

    def common(self):
        out = {"run_id": self.run_id, "hosts": list(self.hosts), "nodes": self.nodes, "ranks": self.ranks,
               "engine": ENGINE, "mpi": self.mpi, "transport": "unknown"}
        if self.job_id:
            out["slurm_job_id"] = self.job_id
        return out


def collbench_size(op_name, msg_bytes, n_ranks):
    """collbench's size (bytes per rank, docs/METRICS.md) of an Inspector message size."""
    return msg_bytes * n_ranks if op_name == "reduce_scatter" else msg_bytes


def run_id(comm_id, job_id):
    """One run per communicator of a job: records of one communicator share it."""
    return "inspector-" + hashlib.sha256(f"{job_id}|{comm_id}".encode()).hexdigest()[:12]


def _mpi(op):
    rev = f" {op.git_rev}" if op.git_rev and op.git_rev not in ("unknown", "standalone-build") else ""
    return f"NCCL Inspector {op.version}{rev}"


def collective_record(c, job_id=None, source=None):
    """The result record of one Collective (spread.py); None for a collective collbench has no op for."""
    first = c.first
    op_name = OPS.get(c.func)
    if op_name is None:
        return None
    op = get_op(op_name)
    n = first.n_ranks
    sp = c.spread()
    ops = [c.ranks[r] for r in sorted(c.ranks)]
    hosts = list(dict.fromkeys(o.hostname for o in ops))
    unknown = ["datatype", "transport", "iterations", "warmup"]
    if len(hosts) < first.nnodes:
        unknown.append("hosts")
    traced = all(o.start_us is not None and o.stop_us is not None for o in ops)
    if traced:
        t_start = min(o.start_us for o in ops) / 1e6
        t_end = max(o.stop_us for o in ops) / 1e6
        ts = t_end
    else:
        ts = min(o.dump_us for o in ops) / 1e6
        unknown.append("time")       # the dump's time: the op ran at most one dump interval before
    ctx = _Context(run_id(c.comm_id, job_id), hosts, first.nnodes, n, _mpi(first), job_id)
    size = collbench_size(op_name, first.msg_bytes, n)
    rec = result_record(ctx, op_name, size, "char", sp["avg_us"], sp["min_us"], sp["max_us"], 1, 0,
                        straggler_rank=sp["slowest_rank"], ts=ts)
    del rec["datatype"]              # the Inspector does not say (only the bytes)
    if traced:
        rec["t_start"], rec["t_end"] = round(t_start, 6), round(t_end, 6)
    rec.update({"comm_id": c.comm_id, "coll_sn": c.sn, "ranks_reported": sp["ranks_reported"],
                "timing_source": first.timing_source or "unknown"})
    if first.comm_name is not None:
        rec["comm_name"] = first.comm_name
    if len(ops) == 1:
        rec["host"], rec["rank"] = first.hostname, first.rank
    if sp["waited_for_rank"] is not None:
        rec["waited_for_rank"] = sp["waited_for_rank"]
        rec["waited_for_host"] = c.ranks[sp["waited_for_rank"]].hostname
        rec["waited_for_by"] = sp["waited_for_by"]
    rec["straggler_host"] = c.ranks[sp["slowest_rank"]].hostname
    if first.busbw_gbs is not None:
        rec["inspector_busbw_gbs"] = first.busbw_gbs     # the plugin's own figure (rank lowest)
    if source:
        rec["imported_from"] = source
    rec["unknown"] = unknown
    return rec


def prom229_record(pc, source=None):
    """The result record of one 2.29 per-collective Prometheus sample set (one rank's view)."""
    op_name = OPS.get(pc.func)
    if op_name is None:
        return None
    ctx = _Context(run_id(pc.comm_id, pc.job_id), [pc.hostname], pc.nnodes, pc.n_ranks,
                   "NCCL Inspector prometheus 2.29", pc.job_id)
    size = collbench_size(op_name, pc.msg_bytes, pc.n_ranks)
    rec = result_record(ctx, op_name, size, "char", pc.exec_us, pc.exec_us, pc.exec_us, 1, 0,
                        ts=_iso_ts(pc.timestamp))
    del rec["datatype"]
    rec.update({"comm_id": pc.comm_id, "coll_sn": pc.sn, "ranks_reported": 1, "host": pc.hostname,
                "rank": pc.rank, "timing_source": "unknown"})
    unknown = ["datatype", "transport", "iterations", "warmup", "time"] + ([] if pc.size_exact else ["size"])
    if pc.nnodes > 1:
        unknown.append("hosts")
    rec["unknown"] = unknown
    if source:
        rec["imported_from"] = source
    return rec


def bucket_record(b, ts, source=None):
    """The result record of one 2.30 Prometheus bucket: the interval's mean time of its ops, at the
    bucket's lower size bound (unknown: size); None for p2p and ops collbench lacks."""
    op_name = OPS.get(b.func) if b.kind == "coll" else None
    if op_name is None:
        return None
    ctx = _Context(run_id(b.comm_name + "|" + b.node + "|" + b.gpu, b.job_id), [b.node] if b.node else [],
                   b.nnodes, b.n_ranks, f"NCCL Inspector prometheus {b.version}", b.job_id)
    size = collbench_size(op_name, b.size_low, b.n_ranks)
    rec = result_record(ctx, op_name, size, "char", b.exec_us, None, None, 0, 0, ts=ts, algorithm=b.algo_proto or None)
    del rec["datatype"]
    rec.update({"comm_name": b.comm_name, "size_range": b.size_label, "host": b.node, "gpu": b.gpu,
                "timing_source": "unknown"})
    if b.busbw_gbs is not None:
        rec["inspector_busbw_gbs"] = b.busbw_gbs
    rec["unknown"] = ["datatype", "transport", "iterations", "warmup", "size", "rank"] + \
        (["hosts"] if b.nnodes > 1 else [])
    if source:
        rec["imported_from"] = source
    return rec


def _iso_ts(text):
    from datetime import datetime, timezone
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None
