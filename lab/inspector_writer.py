"""A stand-in for the NCCL Inspector plugin's writer (plugins/profiler/inspector of NVIDIA/nccl:
inspector_json.cc, json.cc, inspector_prom.cc, inspector.cc), for tests and benches that cannot
run NCCL: lines written exactly as the plugin writes them -- compact JSON, keys in the writer's
order, unsigned and int values as %lu/%d, doubles as %lf (six decimals), NaN as "nan", strings
escaped as json.cc escapes them -- into <dir>/<hostname>-pid<pid>.log, opened with "w" (truncated)
on the first dump and appended to after; Prometheus textfiles (2.30 buckets) rewritten each dump
and unlinked at finalize. `shape` picks a release: "2.28" (no timing source: the README's first
sample), "2.29" (timing source, no comm_name; every dump repeats each communicator's latest
collective), "2.30" (comm_name, ring buffers: every op dumped once, p2p_perf records).

tests/test_inspector_import.py checks this writer's lines against the published samples
(tests/fixtures/inspector/).
"""

import math
import os


def _str(s):
    out = []
    for ch in s:
        if ch in '"\\/':
            out.append("\\" + ch)
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20:
            raise ValueError("the plugin's writer aborts on other control characters")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _dbl(x):
    return '"nan"' if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:f}"


def _obj(pairs):
    return "{" + ",".join(f"{_str(k)}:{v}" for k, v in pairs) + "}"


BUS_FACTOR = {"AllReduce": lambda n: 2 * (n - 1) / n, "AllGather": lambda n: (n - 1) / n,
              "ReduceScatter": lambda n: (n - 1) / n}


def op_bandwidth(func, msg_bytes, n_ranks, exec_us):
    """(algbw, busbw) in GB/s as inspectorComputeOpBw computes them."""
    if exec_us <= 0:
        return 0.0, 0.0
    traffic = msg_bytes * n_ranks if func in ("AllGather", "AllGatherV", "ReduceScatter") else msg_bytes
    algbw = traffic / 1e9 / (exec_us / 1e6)
    return algbw, algbw * BUS_FACTOR.get(func, lambda n: 1.0)(n_ranks)


def format_line(op, shape="2.30", hostname="host", pid=1, dump_us=0, git_rev="v2.30.3-1",
                rec_mechanism="nccl_profiler_interface"):
    """One line (with its newline) for op, a dict: comm_id, comm_name, rank, n_ranks, nnodes,
    kind (coll|p2p), func, sn, msg_bytes, exec_us, timing_source, [peer], [trace: dict with
    start_sn, stop_sn, start_ts, stop_ts, kernels: [(start_sn, stop_sn, record_sn, start_ts,
    stop_ts, record_ts)]], [algbw, busbw: override the computed GB/s]."""
    header = [("id", _str(op["comm_id"]))]
    if shape == "2.30":
        header.append(("comm_name", _str(op.get("comm_name") or "unknown")))
    header += [("rank", f"{op['rank']:d}"), ("n_ranks", f"{op['n_ranks']:d}"), ("nnodes", f"{op['nnodes']:d}")]
    meta = [("inspector_output_format_version", _str("v4.0")), ("git_rev", _str(git_rev)),
            ("rec_mechanism", _str(rec_mechanism)), ("dump_timestamp_us", f"{dump_us:d}"),
            ("hostname", _str(hostname)), ("pid", f"{pid:d}")]
    p = "coll" if op.get("kind", "coll") == "coll" else "p2p"
    algbw, busbw = op_bandwidth(op["func"], op["msg_bytes"], op["n_ranks"], op["exec_us"])
    algbw, busbw = op.get("algbw", algbw), op.get("busbw", busbw)
    perf = [(p, _str(op["func"])), (f"{p}_sn", f"{op['sn']:d}")]
    if p == "p2p":
        perf.append(("p2p_peer", f"{op['peer']:d}"))
    perf += [(f"{p}_msg_size_bytes", f"{op['msg_bytes']:d}"), (f"{p}_exec_time_us", f"{op['exec_us']:d}")]
    if shape != "2.28":
        perf.append((f"{p}_timing_source", _str(op.get("timing_source", "kernel_gpu"))))
    perf += [(f"{p}_algobw_gbs", _dbl(algbw)), (f"{p}_busbw_gbs", _dbl(busbw))]
    tr = op.get("trace")
    if tr:
        ks = tr.get("kernels", [])
        perf.append(("event_trace_sn", _obj([
            (f"{p}_start_sn", f"{tr['start_sn']:d}"), (f"{p}_stop_sn", f"{tr['stop_sn']:d}"),
            ("kernel_events", "[" + ",".join(_obj([("channel_id", f"{i:d}"), ("kernel_start_sn", f"{k[0]:d}"),
                                                   ("kernel_stop_sn", f"{k[1]:d}"), ("kernel_record_sn", f"{k[2]:d}")])
                                             for i, k in enumerate(ks)) + "]")])))
        perf.append(("event_trace_ts", _obj([
            (f"{p}_start_ts", f"{tr['start_ts']:d}"), (f"{p}_stop_ts", f"{tr['stop_ts']:d}"),
            ("kernel_events", "[" + ",".join(_obj([("channel_id", f"{i:d}"), ("kernel_start_ts", f"{k[3]:d}"),
                                                   ("kernel_stop_ts", f"{k[4]:d}"), ("kernel_record_ts", f"{k[5]:d}")])
                                             for i, k in enumerate(ks)) + "]")])))
    return _obj([("header", _obj(header)), ("metadata", _obj(meta)), (f"{p}_perf", _obj(perf))]) + "\n"


class InspectorWriter:
    """One process's Inspector output: record() ops as they complete, dump() as the dump thread
    does, finalize() at the job's end."""

    def __init__(self, dump_dir, hostname, pid, shape="2.30", git_rev=None, clock=None, prom=False, gpu="GPU0",
                 uuid="00000000-0000-0000-0000-000000000000", job_id="unknown"):
        import time
        self.dir, self.hostname, self.pid, self.shape = dump_dir, hostname, pid, shape
        self.git_rev = git_rev if git_rev is not None else {"2.28": "", "2.29": "v2.29.7-1"}.get(shape, "v2.30.3-1")
        self.clock = clock or time.time
        self.path = os.path.join(dump_dir, f"{hostname}-pid{pid}.log")
        self.prom_path = os.path.join(dump_dir, f"nccl_inspector_metrics_{uuid}.prom") if prom else None
        self.gpu, self.job_id = gpu, job_id
        self.pending = []        # 2.30: the rings, drained by a dump
        self.latest = {}         # 2.28/2.29: comm_id -> its latest completed collective
        self.opened = False

    def record(self, **op):
        if self.shape == "2.30":
            self.pending.append(op)
        elif op.get("kind", "coll") == "coll":
            self.latest[op["comm_id"]] = op

    def dump(self):
        now_us = int(self.clock() * 1e6)
        ops = self.pending if self.shape == "2.30" else list(self.latest.values())
        lines = "".join(format_line(op, self.shape, self.hostname, self.pid, now_us, self.git_rev) for op in ops)
        with open(self.path, "a" if self.opened else "w") as f:
            f.write(lines)
        if not self.opened:
            os.chmod(self.path, 0o666)
            self.opened = True
        if self.prom_path and self.shape == "2.30" and ops:
            self._prom(ops)
        self.pending = []

    def _prom(self, ops):
        from collbench.inspector.parse import size_bucket_label
        buckets = {}
        for op in ops:
            kind = op.get("kind", "coll")
            key = (kind, op["n_ranks"], op["nnodes"], op["func"], size_bucket_label(op["msg_bytes"]),
                   op.get("comm_name") or "unknown", op.get("algo_proto", "RING_SIMPLE"))
            buckets.setdefault(key, []).append(op)
        out = []
        for (kind, n, nn, func, size, name, ap), group in sorted(buckets.items()):
            bws = [op_bandwidth(op["func"], op["msg_bytes"], n, op["exec_us"])[1] for op in group]
            bws = [b for b in bws if b > 0]
            geo = math.exp(sum(math.log(b) for b in bws) / len(bws)) if bws else 0.0
            mean = sum(op["exec_us"] for op in group) / len(group)
            base = (f'version="v5.1",slurm_job_id="{self.job_id}",node="{self.hostname}",gpu="{self.gpu}",'
                    f'comm_name="{name}",n_nodes="{nn}",nranks="{n}"')
            if kind == "coll":
                labels = base + f',collective="{func}",message_size="{size}",algo_proto="{ap}"'
                out += [f"nccl_bus_bandwidth_gbs{{{labels}}} {geo:.6g}",
                        f"nccl_collective_exec_time_microseconds{{{labels}}} {mean:.6g}"]
            else:
                labels = base + f',p2p_operation="{func}",message_size="{size}"'
                out += [f"nccl_p2p_bus_bandwidth_gbs{{{labels}}} {geo:.6g}",
                        f"nccl_p2p_exec_time_microseconds{{{labels}}} {mean:.6g}"]
        with open(self.prom_path, "w") as f:
            f.write("\n".join(out) + "\n")

    def finalize(self):
        """The job's end: the Prometheus file is unlinked (~inspectorDumpThread); the JSON log stays."""
        if self.prom_path and os.path.exists(self.prom_path):
            os.unlink(self.prom_path)
