"""Helpers shared by the exporter tests: records in the results-log format, a running exporter."""

import json
import os
import subprocess
import sys
import time
import urllib.request

from collbench.results import records
from collbench.config import load_config
from conftest import REPO, stop_process
_CTX = records.RunContext(load_config(None), "builtin", "Open MPI 4.1.4")


def result_line(seq, op="allreduce", size_bytes=4 << 20, avg_us=100.0, ts=None, nodes=None, ranks=4,
                iteration=1, validation="pass"):
    """One result record line (with newline), built by collbench.results.records like the daemon does."""
    rec = records.result_record(_CTX, op, size_bytes, "float", avg_us, avg_us * 0.9, avg_us * 1.1, 100, 10,
                                validation=validation, ranks=ranks, ts=ts)
    if nodes is not None:
        rec["nodes"] = nodes
    rec["iteration"] = iteration
    rec["seq"] = seq
    return records.dumps(rec) + "\n"


def failure_line(seq, op="alltoall", ts=None, iteration=1):
    rec = records.failure_record(_CTX, "mpirun exited with code 1", "rank 1 died", op_name=op,
                                 size_bytes=1 << 20 if op else None, exit_code=1, ts=ts)
    rec.update(iteration=iteration, seq=seq)
    return records.dumps(rec) + "\n"


def event_line(seq, event="start", ts=None):
    rec = records.event_record(event, pid=1234, detail="test", ts=ts)
    rec["seq"] = seq
    return records.dumps(rec) + "\n"


def append(path, text, mode="a"):
    with open(path, mode, encoding="utf-8") as f:
        f.write(text)
        f.flush()


def seqs(lines):
    return [json.loads(line)["seq"] for line in lines]


def parse_exposition(text):
    """{(name, frozenset(labels.items())): value} from Prometheus text format."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def sample(metrics, name, **labels):
    return metrics.get((name, frozenset({k: str(v) for k, v in labels.items()}.items())))


def names(metrics):
    return {n for n, _ in metrics}


class ExporterProcess:
    """`collbench exporter` (or mpi_benchmark_exporter.py) as a real subprocess on loopback."""

    def __init__(self, args, port, argv0=None, env=None, scheme="http"):
        self.port = port
        self.url = f"{scheme}://127.0.0.1:{port}"
        cmd = argv0 or [sys.executable, "-m", "collbench", "exporter"]
        self.proc = subprocess.Popen(cmd + ["--listen", f"127.0.0.1:{port}", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=str(REPO), env={**os.environ, **(env or {})})

    def wait_ready(self, timeout=20.0, context=None):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"exporter exited {self.proc.returncode}: {self.proc.stderr.read()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2, context=context) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("exporter did not become healthy")

    def get(self, path="/metrics", headers=None, context=None):
        req = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, dict(r.headers), r.read().decode()

    def metrics(self, context=None):
        return parse_exposition(self.get(context=context)[2])

    def stop(self):
        stop_process(self.proc, timeout=10)
        self.proc.stdout.close()
        self.proc.stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

