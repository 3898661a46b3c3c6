"""`diagnose --inspector` (issue 29 item 3) without a testbed: a job's Inspector files (the
stand-in writer) whose allreduce shifts up half-way, explained with the counters of a stress
loop's results log that ran beside it (`--counters-from`): the host whose sender-side counter
moved in the slow minutes only is named; a job with no shift names nobody; no counters source, a
Prometheus that cannot be reached, or no Inspector record exit 2. The same with a real Prometheus
and real congestion: tests/test_inspector_testbed_e2e.py."""

import json
import subprocess
import sys

from conftest import REPO
from lab.inspector_writer import InspectorWriter

from collbench.results.records import dumps

T0 = 1_790_000_000.0
HOSTS = ("h1", "h2", "h3", "h4")


def collbench(*args):
    return subprocess.run([sys.executable, "-m", "collbench", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def job(tmp_path, slow_from=None, n=60):
    """One AllReduce of 4 MB per second over 4 hosts (one rank each, verbose traces); from
    collective `slow_from` on, 3x slower."""
    d = tmp_path / "nccl-inspector-31"
    d.mkdir()
    writers = [InspectorWriter(str(d), h, 100 + r, shape="2.30", clock=lambda: T0 + n + 5) for r, h in enumerate(HOSTS)]
    for sn in range(1, n + 1):
        t = T0 + sn
        for r, w in enumerate(writers):
            us = (3000 if slow_from and sn >= slow_from else 1000) + 7 * ((sn * 3 + r) % 5)
            start = int(t * 1e6)
            w.record(comm_id="0xabcdef01234567", comm_name="dp", rank=r, n_ranks=4, nnodes=4, func="AllReduce",
                     sn=sn, msg_bytes=4 << 20, exec_us=us,
                     trace=dict(start_sn=1, stop_sn=2, start_ts=start, stop_ts=start + 5,
                                kernels=[(3, 9, 8, start + 20, start + 20 + us, start + 20 + us)]))
    for w in writers:
        w.dump()
    return d


def stress_log(tmp_path, congested_from=None, n=60):
    """A stress loop's results: one step every 2 s beside the job, each with the counters that
    moved; h3's TCPDeliveredCE moves from `congested_from` on (its outgoing path marked), InCEPkts on
    the receivers a little always."""
    from collbench.config import load_config
    from collbench.results.records import RunContext, result_record
    ctx = RunContext(load_config(None), "builtin", "Open MPI 4.1.4")
    lines = []
    for i in range(n // 2 + 2):
        t = T0 + 2 * i
        rec = result_record(ctx, "allreduce", 1 << 20, "float", 500.0, 450.0, 550.0, 10, 2, ts=t + 2)
        moved = {"h1|InCEPkts@netstat": 3, "h2|InCEPkts@netstat": 2}
        if congested_from is not None and t >= T0 + congested_from:
            moved.update({"h3|TCPDeliveredCE@netstat": 4000, "h4|InCEPkts@netstat": 3000, "h1|InCEPkts@netstat": 900})
        rec.update(seq=i + 1, t_start=t, t_end=t + 2,
                   congestion={"source": "engine", "t_start": t, "t_end": t + 2, "moved": moved})
        lines.append(dumps(rec) + "\n")
    p = tmp_path / "stress.jsonl"
    p.write_text("".join(lines))
    return p


def test_a_shifted_job_names_the_host_whose_counters_moved_in_the_slow_minutes(tmp_path):
    d = job(tmp_path, slow_from=35)
    log = stress_log(tmp_path, congested_from=34)
    r = collbench("diagnose", "--inspector", str(d), "--counters-from", str(log), "--format", "json")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["regressions"] and doc["regressions"][0]["op"] == "allreduce", doc["regressions"]
    top = doc["suspects"][0]
    # h3's sender side and h4's receiver side both concentrate: the path h3 -> h4 (diagnose's rule)
    assert top["cause"] == "congestion" and (top["host"], top["link"]) == (None, ["h3", "h4"]), doc["suspects"]
    assert [(c["host"], c["counter"]) for c in top["evidence"]["counters"]] == \
        [("h3", "TCPDeliveredCE"), ("h4", "InCEPkts")]
    assert not [s for s in doc["suspects"] if s["host"] not in (None, "h3")]
    assert "60 collective(s)" in r.stderr
    # the same from the records `import nccl-inspector` wrote
    results = tmp_path / "job.jsonl"
    assert collbench("import", "nccl-inspector", str(d), "--results", str(results)).returncode == 0
    r = collbench("diagnose", "--inspector", str(results), "--counters-from", str(log), "--format", "json")
    assert r.returncode == 1 and "60 result record(s)" in r.stderr, r.stdout + r.stderr
    assert json.loads(r.stdout)["suspects"][0]["link"] == ["h3", "h4"]
    # the plugin's lines in a .jsonl file (as perf_summary_exporter globs them) are read as Inspector lines
    lines = tmp_path / "all-ranks.jsonl"
    lines.write_text("".join(p.read_text() for p in sorted(d.glob("*.log"))))
    r = collbench("diagnose", "--inspector", str(lines), "--counters-from", str(log), "--format", "json")
    assert r.returncode == 1 and "1 Inspector file(s), 60 collective(s)" in r.stderr, r.stdout + r.stderr


def test_a_steady_job_names_nobody_and_bad_sources_exit_2(tmp_path):
    d = job(tmp_path)
    log = stress_log(tmp_path, congested_from=34)
    r = collbench("diagnose", "--inspector", str(d), "--counters-from", str(log), "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["verdict"] == "no regression"
    r = collbench("diagnose", "--inspector", str(d))
    assert r.returncode == 2 and "--prometheus URL" in r.stderr
    r = collbench("diagnose", "--inspector", str(d), "--prometheus", "http://127.0.0.1:9")
    assert r.returncode == 2 and "cannot reach it" in r.stderr, r.stderr
    r = collbench("diagnose", "--inspector", str(d), "--prometheus", "file:///etc/passwd")
    assert r.returncode == 2 and "expected http(s)://HOST:PORT" in r.stderr, r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = collbench("diagnose", "--inspector", str(empty), "--counters-from", str(log))
    assert r.returncode == 2 and "no NCCL Inspector collective" in r.stderr, r.stderr


def test_a_prometheus_answer_is_untrusted(tmp_path):
    """What comes back from --prometheus is checked: not JSON, an error status, a wrong shape, values
    that are not numbers, series without a host label -- each a clear exit 2 or skipped, never a
    traceback; a good answer's counters are named as the engine names them."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from collbench.congestion.from_prometheus import Prometheus, PrometheusError
    answers = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?")[0]
            body = answers.get(path, b"{}")
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        names = json.dumps({"status": "success", "data": ["collbench_netstat_tcp_delivered_ce_packets_total",
                                                         "collbench_rdma_np_cnp_sent_total", "up"]}).encode()
        answers["/api/v1/label/__name__/values"] = b"<html>not prometheus</html>"
        try:
            Prometheus(url).increases(T0, T0 + 10, 5)
            raise AssertionError("no error")
        except PrometheusError as e:
            assert "not JSON" in str(e)
        answers["/api/v1/label/__name__/values"] = names
        answers["/api/v1/query_range"] = json.dumps({"status": "error", "errorType": "bad_data",
                                                     "error": "parse error"}).encode()
        try:
            Prometheus(url).increases(T0, T0 + 10, 5)
            raise AssertionError("no error")
        except PrometheusError as e:
            assert "bad_data: parse error" in str(e)
        answers["/api/v1/query_range"] = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"host": "h3", "device": "mlx5_0", "port": "1"}, "values": [[T0 + 5, "12.4"], [T0 + 10, "NaN"]]},
            {"metric": {"device": "mlx5_0", "port": "1"}, "values": [[T0 + 5, "7"]]},          # no host: skipped
            {"metric": {"host": "h4"}, "values": [[T0 + 5, "x"], "bad", [T0 + 10, "3"]]},
            {"metric": {"host": "bad host!"}, "values": [[T0 + 5, "1"]]}]}}).encode()
        got = Prometheus(url).increases(T0, T0 + 10, 5)
        assert got[T0 + 5] == {"h3|TCPDeliveredCE@netstat": 12, "h3|np_cnp_sent@mlx5_0/1": 12}
        # (the same answer for both metrics: an RDMA series without device and port names no port)
        assert got[T0 + 10] == {"h4|TCPDeliveredCE@netstat": 3}
        d = job(tmp_path)
        answers["/api/v1/query_range"] = b"[" * 100000
        r = collbench("diagnose", "--inspector", str(d), "--prometheus", url)
        assert r.returncode == 2 and "not JSON" in r.stderr and "Traceback" not in r.stderr, r.stderr
    finally:
        srv.shutdown()


def test_against_a_baseline_of_the_job_on_a_good_day(tmp_path):
    """--baseline: a baseline saved from a good day's imported records and the stress loop beside
    them; a job slow all along (no shift within it to find) regresses against it, and the counters,
    weighed against the good day's, name the path."""
    (tmp_path / "good").mkdir()
    good = job(tmp_path / "good")
    results = tmp_path / "good.jsonl"
    assert collbench("import", "nccl-inspector", str(good), "--results", str(results)).returncode == 0
    # the good day's counters' normal: the stress loop that ran beside the job then (a slow-all-along
    # job has no good steps of its own to weigh the counters against)
    (tmp_path / "good-stress").mkdir()
    quiet = stress_log(tmp_path / "good-stress")
    state = tmp_path / "state"
    r = collbench("baseline", "save", "good-day", "--from", str(results), str(quiet), "--state-dir", str(state))
    assert r.returncode == 0, r.stderr
    (tmp_path / "bad").mkdir()
    bad = job(tmp_path / "bad", slow_from=1)
    log = stress_log(tmp_path, congested_from=0)
    r = collbench("diagnose", "--inspector", str(bad), "--counters-from", str(log), "--baseline", "good-day",
                  "--state-dir", str(state), "--format", "json")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["method"] == "baseline" and doc["regressions"][0]["ratio"] > 2, doc["regressions"]
    assert doc["suspects"][0]["link"] == ["h3", "h4"], doc["suspects"]
