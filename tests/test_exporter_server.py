"""The exporter as users run it: a real `collbench exporter` process scraped over HTTP(S)."""

import base64
import gzip
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from conftest import FIXTURES, REPO, require_tool, wait_for
from exporter_helpers import ExporterProcess, append, failure_line, names, parse_exposition, result_line, sample

from collbench.proctree import start_ticks
from collbench.results.state_dir import StatePaths, write_json_atomic, write_pid_file

SYSFS = str(FIXTURES / "sysfs-mlx5")
FAKE_ETHTOOL = str(FIXTURES / "ethtool" / "fake_ethtool")
PROCFS = str(FIXTURES / "procfs")
SERIES = dict(op="allreduce", size="4MB", size_bytes=4 << 20, nodes=8, ranks=4)


def run_cli(*args, env=None, timeout=30):
    return subprocess.run([sys.executable, "-m", "collbench", "exporter", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=str(REPO), env={**os.environ, **(env or {})})


def test_live_tail_scrape_health_landing(tmp_path, free_port):
    log = tmp_path / "results.jsonl"
    now = time.time()
    append(log, result_line(1, avg_us=44977.66, nodes=8, ts=now - 5))
    with ExporterProcess(["--results-log", str(log), "--state-dir", str(tmp_path), "--poll-interval", "0.1",
                          "--collectors", "results"], free_port) as ex:
        ex.wait_ready()
        m = ex.metrics()
        # the record written before start-up is recovered; counters count from start
        assert sample(m, "collbench_latency_avg_seconds", **SERIES) == pytest.approx(0.04497766)
        assert sample(m, "collbench_results_records_total", type="result") == 0
        append(log, result_line(2, avg_us=50000.0, nodes=8, iteration=3) + failure_line(3, iteration=3)
               + "garbage\n" + result_line(4, op="bcast", size_bytes=1 << 20, avg_us=800.0, nodes=8, iteration=3))
        m = wait_for(lambda: (lambda m: m if sample(m, "collbench_results_records_total", type="result") == 2
                              else None)(ex.metrics()))
        assert m, "appended records never reached /metrics"
        assert sample(m, "collbench_latency_avg_seconds", **SERIES) == pytest.approx(0.05)
        assert sample(m, "collbench_latency_min_seconds", **SERIES) == pytest.approx(0.045)
        assert sample(m, "collbench_latency_max_seconds", **SERIES) == pytest.approx(0.055)
        # allreduce 4MB on 4 ranks at 50 ms: algbw = 4 MiB / 0.05 s, busbw x 2(n-1)/n
        assert sample(m, "collbench_algbw_bytes_per_second", **SERIES) == pytest.approx((4 << 20) / 0.05, rel=1e-6)
        assert sample(m, "collbench_busbw_bytes_per_second", **SERIES) == pytest.approx((4 << 20) / 0.05 * 1.5, rel=1e-6)
        assert sample(m, "collbench_latency_avg_seconds", op="bcast", size="1MB", size_bytes=1 << 20, nodes=8,
                      ranks=4) == pytest.approx(0.0008)
        assert sample(m, "collbench_results_records_total", type="failure") == 1
        assert sample(m, "collbench_benchmark_failures_total", op="alltoall") == 1
        assert sample(m, "collbench_benchmark_failures_total", op="allreduce") == 0
        assert sample(m, "collbench_results_parse_errors_total") == 1
        assert sample(m, "collbench_last_run_success") == 1        # the bcast result came after the failure
        assert sample(m, "collbench_stress_iteration") == 3
        assert sample(m, "collbench_stress_running") == 0
        assert 0 <= sample(m, "collbench_results_age_seconds") < 60
        assert sample(m, "collbench_collector_success", collector="results") == 1

        status, headers, body = ex.get("/health")
        assert status == 200 and '"status": "ok"' in body and str(log) in body
        status, headers, body = ex.get("/")
        assert status == 200 and 'href="/metrics"' in body and headers["Content-Type"].startswith("text/html")
        with pytest.raises(urllib.error.HTTPError) as e:
            ex.get("/nope")
        assert e.value.code == 404
        # content negotiation, compression, name[] filtering: prometheus_client's encoders
        status, headers, body = ex.get("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
        assert headers["Content-Type"].startswith("application/openmetrics-text") and body.endswith("# EOF\n")
        req_headers = {"Accept-Encoding": "gzip"}
        with urllib.request.urlopen(urllib.request.Request(ex.url + "/metrics", headers=req_headers)) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            assert b"collbench_latency_avg_seconds" in gzip.decompress(r.read())
        _, _, body = ex.get("/metrics?name[]=collbench_stress_running")
        assert names(parse_exposition(body)) == {"collbench_stress_running"}
    assert ex.proc.returncode == 0          # SIGTERM: clean exit


def test_stale_series_disappear_instead_of_zero(tmp_path, free_port):
    log = tmp_path / "results.jsonl"
    append(log, result_line(1, nodes=8, ts=time.time()))
    with ExporterProcess(["--results-log", str(log), "--state-dir", str(tmp_path), "--max-age", "1.5",
                          "--poll-interval", "0.1", "--collectors", "results", "--legacy-metrics"], free_port) as ex:
        ex.wait_ready()
        m = ex.metrics()
        assert sample(m, "collbench_latency_avg_seconds", **SERIES) == pytest.approx(1e-4)
        assert sample(m, "mpi_allreduce_latency_us", size="4MB", nodes=8) == pytest.approx(100.0)
        gone = wait_for(lambda: (lambda m: m if "collbench_latency_avg_seconds" not in names(m) else None)(
            ex.metrics()), timeout=10)
        assert gone, "stale series still exported"
        for n in ("collbench_latency_avg_seconds", "collbench_latency_min_seconds", "collbench_latency_max_seconds",
                  "collbench_algbw_bytes_per_second", "collbench_busbw_bytes_per_second",
                  "collbench_result_timestamp_seconds", "mpi_allreduce_latency_us"):
            assert n not in names(gone)
        # what is left says how old the data is, so "stale" is visible and alertable
        assert sample(gone, "collbench_results_age_seconds") >= 1.5
        assert sample(gone, "collbench_last_update_timestamp_seconds") is not None
        # a fresh result brings the series back
        append(log, result_line(2, nodes=8, avg_us=120.0))
        back = wait_for(lambda: (lambda m: m if sample(m, "collbench_latency_avg_seconds", **SERIES) else None)(
            ex.metrics()))
        assert sample(back, "collbench_latency_avg_seconds", **SERIES) == pytest.approx(1.2e-4)


def _fake_daemon_state(state_dir, pid, proc_start):
    """The state files exactly as the stress daemon writes them (its own functions)."""
    paths = StatePaths(str(state_dir))
    write_pid_file(paths, pid)
    write_json_atomic(paths.state, {"pid": pid, "proc_start": proc_start, "status": "running",
                                    "iteration": 5, "started": time.time(), "results_log": paths.results_log})


def test_stress_running_follows_the_process_never_stale(tmp_path, free_port):
    log = tmp_path / "results.jsonl"
    log.touch()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _fake_daemon_state(tmp_path, proc.pid, start_ticks(proc.pid))
        with ExporterProcess(["--results-log", str(log), "--state-dir", str(tmp_path),
                              "--collectors", "results", "--legacy-metrics"], free_port) as ex:
            ex.wait_ready()
            m = ex.metrics()
            assert sample(m, "collbench_stress_running") == 1
            assert sample(m, "mpi_stress_test_running") == 1
            assert sample(m, "collbench_stress_iteration") == 5          # from the state file: no records yet
            proc.kill()
            proc.wait()
            m = ex.metrics()                                              # the very next scrape
            assert sample(m, "collbench_stress_running") == 0
            assert sample(m, "mpi_stress_test_running") == 0
            # a live process that is not the daemon (recycled pid: other start time) is not running
            other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            try:
                _fake_daemon_state(tmp_path, other.pid, start_ticks(other.pid) - 100)
                assert sample(ex.metrics(), "collbench_stress_running") == 0
                _fake_daemon_state(tmp_path, other.pid, start_ticks(other.pid))
                assert sample(ex.metrics(), "collbench_stress_running") == 1
            finally:
                other.kill()
                other.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_legacy_names_via_prototype_entry_point(tmp_path, free_port):
    log = tmp_path / "results.jsonl"
    now = time.time()
    append(log, result_line(1, avg_us=44977.66, nodes=8, ts=now, iteration=2)
           + result_line(2, op="bcast", avg_us=22456.69, nodes=8, ts=now, iteration=2)
           + result_line(3, op="alltoall", size_bytes=1 << 20, avg_us=123488.25, nodes=8, ts=now, iteration=2)
           + result_line(4, op="allgather", size_bytes=2 << 20, avg_us=127229.43, nodes=8, ts=now, iteration=2)
           + result_line(5, op="reduce", size_bytes=1 << 20, avg_us=900.5, nodes=8, ts=now, iteration=2)
           + result_line(6, op="reduce_scatter", size_bytes=1 << 20, avg_us=1.0, nodes=8, ts=now, iteration=2))
    cfg = tmp_path / "collbench.yaml"
    cfg.write_text(f"exporter:\n  legacy_metrics: true\n  results_log: {log.name}\n  collectors: [results]\n"
                   f"state_dir: {tmp_path}\n")
    with ExporterProcess(["--config", str(cfg)], free_port, argv0=[str(REPO / "mpi_benchmark_exporter.py")]) as ex:
        ex.wait_ready()
        _, _, text = ex.get()
        m = parse_exposition(text)
    assert sample(m, "mpi_allreduce_latency_us", size="4MB", nodes=8) == pytest.approx(44977.66)
    assert sample(m, "mpi_broadcast_latency_us", size="4MB", nodes=8) == pytest.approx(22456.69)
    assert sample(m, "mpi_alltoall_latency_us", size="1MB", nodes=8) == pytest.approx(123488.25)
    assert sample(m, "mpi_allgather_latency_us", size="2MB", nodes=8) == pytest.approx(127229.43)
    assert sample(m, "mpi_reduce_latency_us", size="1MB", nodes=8) == pytest.approx(900.5)
    assert sample(m, "mpi_stress_test_running") == 0
    assert sample(m, "mpi_stress_test_iteration") == 2
    assert sample(m, "mpi_benchmark_last_update_timestamp") == int(now)
    assert not [n for n in names(m) if n.startswith("mpi_reduce_scatter")]   # the prototype had none
    assert sample(m, "collbench_latency_avg_seconds", **SERIES) == pytest.approx(0.04497766)  # new names too


def test_promtool_check_metrics_on_real_scrape(tmp_path, free_port):
    promtool = require_tool("promtool")
    log = tmp_path / "results.jsonl"
    append(log, result_line(1, ts=time.time()) + result_line(2, op="barrier", size_bytes=0, ts=time.time())
           + failure_line(3, op=None))
    with ExporterProcess(["--results-log", str(log), "--state-dir", str(tmp_path), "--sysfs-root", SYSFS,
                          "--procfs-root", PROCFS, "--ethtool", FAKE_ETHTOOL], free_port) as ex:
        ex.wait_ready()
        _, _, text = ex.get()
    m = parse_exposition(text)
    for c in ("results", "rdma_sysfs", "ethtool", "netstat"):
        assert sample(m, "collbench_collector_success", collector=c) == 1, c
    assert sample(m, "collbench_latency_avg_seconds", op="barrier", size="-", size_bytes=0, nodes=1, ranks=4)
    assert ("collbench_algbw_bytes_per_second", frozenset(
        dict(op="barrier", size="-", size_bytes="0", nodes="1", ranks="4").items())) not in m
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


def test_port_in_use_and_bad_addresses_exit_2(tmp_path, free_port):
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port))
        s.listen()
        r = run_cli("--listen", f"127.0.0.1:{free_port}", "--results-log", str(tmp_path / "r.jsonl"))
    assert r.returncode == 2 and "address already in use" in r.stderr and "Mesos" in r.stderr, r.stderr
    for bad, why in (("nonsense", "expected HOST:PORT"), ("127.0.0.1:99999", "expected HOST:PORT"),
                     ("no-such-host.invalid:9105", "not a local address"), ("192.0.2.1:9105", "not an address of this host")):
        r = run_cli("--listen", bad, "--results-log", str(tmp_path / "r.jsonl"))
        assert r.returncode == 2 and why in r.stderr and bad.split(":")[0] in r.stderr, (bad, r.stderr)
        assert "Traceback" not in r.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text("exporter:\n  listen: 9105\n")
    r = run_cli("--config", str(cfg))
    assert r.returncode == 2 and "exporter.listen" in r.stderr
    cfg.write_text("exporter:\n  lisen: 1.2.3.4:9105\n")
    r = run_cli("--config", str(cfg))
    assert r.returncode == 2 and "exporter.lisen" in r.stderr and "unknown key" in r.stderr
    r = run_cli("--device-include", "mlx5_[", "--results-log", str(tmp_path / "r.jsonl"))
    assert r.returncode == 2 and "device_include" in r.stderr
    r = run_cli("--collectors", "results,gpu", "--results-log", str(tmp_path / "r.jsonl"))
    assert r.returncode == 2 and "'gpu'" in r.stderr


def _self_signed(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([require_tool("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_tls_and_basic_auth(tmp_path, free_port):
    cert, key = _self_signed(tmp_path)
    pw = tmp_path / "password"
    pw.write_text("s3cret-for-test\n")
    pw.chmod(0o600)
    log = tmp_path / "results.jsonl"
    append(log, result_line(1, ts=time.time()))
    ctx = ssl.create_default_context(cafile=str(cert))
    with ExporterProcess(["--results-log", str(log), "--state-dir", str(tmp_path), "--collectors", "results",
                          "--tls-cert", str(cert), "--tls-key", str(key), "--basic-auth-user", "prom",
                          "--basic-auth-password-file", str(pw)], free_port, scheme="https") as ex:
        ex.wait_ready(context=ctx)                       # /health needs no credentials
        with pytest.raises(urllib.error.HTTPError) as e:
            ex.get(context=ctx)
        assert e.value.code == 401 and "Basic" in e.value.headers["WWW-Authenticate"]
        for user, password in (("prom", "wrong"), ("other", "s3cret-for-test"), ("prom", "s3cret-for-test\n")):
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            with pytest.raises(urllib.error.HTTPError) as e:
                ex.get(headers={"Authorization": f"Basic {token}"}, context=ctx)
            assert e.value.code == 401
        token = base64.b64encode(b"prom:s3cret-for-test").decode()
        status, _, body = ex.get(headers={"Authorization": f"Basic {token}"}, context=ctx)
        assert status == 200 and "collbench_latency_avg_seconds" in body
        # plain HTTP to the TLS port gets nothing, and the server keeps serving
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{free_port}/metrics", timeout=5).read()
        assert ex.get(headers={"Authorization": f"Basic {token}"}, context=ctx)[0] == 200


def test_auth_password_from_env_and_config_errors(tmp_path, free_port):
    log = tmp_path / "results.jsonl"
    with ExporterProcess(["--results-log", str(log), "--collectors", "results", "--basic-auth-user", "prom"],
                         free_port, env={"COLLBENCH_EXPORTER_PASSWORD": "from-env"}) as ex:
        ex.wait_ready()
        token = base64.b64encode(b"prom:from-env").decode()
        assert ex.get(headers={"Authorization": f"Basic {token}"})[0] == 200
    env = {"COLLBENCH_EXPORTER_PASSWORD": ""}
    r = run_cli("--basic-auth-user", "prom", "--results-log", str(log), env=env)
    assert r.returncode == 2 and "no password" in r.stderr
    r = run_cli("--basic-auth-user", "prom", "--basic-auth-password-file", str(tmp_path / "missing"),
                "--results-log", str(log), env=env)
    assert r.returncode == 2 and str(tmp_path / "missing") in r.stderr
    r = run_cli("--tls-cert", str(tmp_path / "c.pem"), "--results-log", str(log))
    assert r.returncode == 2 and "tls_key" in r.stderr
    (tmp_path / "c.pem").write_text("not a certificate\n")
    (tmp_path / "k.pem").write_text("not a key\n")
    r = run_cli("--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem"), "--results-log",
                str(log), "--listen", f"127.0.0.1:{free_port}")
    assert r.returncode == 2 and "c.pem" in r.stderr and "Traceback" not in r.stderr


def test_concurrent_scrapes_share_collections_collected_after_arrival():
    import threading

    from collbench.exporter.server import Coalescer
    calls = []

    def produce():
        start = time.monotonic()
        calls.append(start)
        time.sleep(0.05)
        return start

    c = Coalescer(produce)
    got = []

    def scrape():
        arrived = time.monotonic()
        got.append((arrived, c.get()))

    threads = [threading.Thread(target=scrape) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 20
    assert all(collected >= arrived for arrived, collected in got)     # never data older than the request
    assert len(calls) <= 4, len(calls)                                   # not one collection per scrape


@pytest.mark.mpi
def test_exporter_on_a_once_results_file(tmp_path, free_port):
    """`collbench once --results FILE` (real mpirun) writes the same records; the exporter serves
    them, and once's copy-and-rename append is not counted twice."""
    import json
    results = tmp_path / "once.jsonl"
    once = [sys.executable, "-m", "collbench", "once", "--np", "2", "--ops", "allreduce", "--sizes", "1KB",
            "--iterations", "5", "--results", str(results), "-q"]
    with ExporterProcess(["--results-log", str(results), "--collectors", "results", "--poll-interval", "0.1"],
                         free_port) as ex:
        ex.wait_ready()
        for run in (1, 2):
            r = subprocess.run(once, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
            assert r.returncode == 0, r.stderr
            rec = json.loads(results.read_text().splitlines()[-1])
            labels = dict(op="allreduce", size="1KB", size_bytes=1024, nodes=rec["nodes"], ranks=2)
            m = wait_for(lambda: (lambda m: m if sample(m, "collbench_results_records_total", type="result") == run
                                  else None)(ex.metrics()))
            assert m, f"run {run} not read once: {ex.metrics()}"
            assert sample(m, "collbench_latency_avg_seconds", **labels) == pytest.approx(rec["latency_avg_us"] / 1e6)
            assert sample(m, "collbench_last_update_timestamp_seconds") == pytest.approx(rec["ts"])
        assert sample(ex.metrics(), "collbench_results_records_total", type="result") == 2


@pytest.mark.mpi
def test_real_stress_daemon_running_rotating_then_stopped(tmp_path, free_port):
    """The real stress daemon (mpirun ranks, rotation every ~4 KB): the exporter reads every
    record exactly once across rotations and shows the daemon stopped at the next scrape."""
    import glob
    import json
    state = tmp_path / "state"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("ranks: 2\nplan:\n  - {op: allreduce, sizes: [1KB], iterations: 5}\n"
                   "  - {op: bcast, sizes: [1KB], iterations: 5}\n"
                   "stress:\n  pause: 0.1\n  rotate_bytes: 4KB\n  rotate_keep: 100\n")
    stress = [sys.executable, "-m", "collbench", "stress"]
    with ExporterProcess(["--config", str(cfg), "--state-dir", str(state), "--collectors", "results",
                          "--poll-interval", "0.1"], free_port) as ex:
        ex.wait_ready()
        assert sample(ex.metrics(), "collbench_stress_running") == 0
        r = subprocess.run(stress + ["start", "--config", str(cfg), "--state-dir", str(state)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        try:
            ok = wait_for(lambda: len(glob.glob(f"{state}/results.jsonl.*")) >= 3, timeout=60, interval=0.2)
            assert ok, "the daemon did not rotate its log"
            m = ex.metrics()
            assert sample(m, "collbench_stress_running") == 1
            assert sample(m, "collbench_latency_avg_seconds", op="allreduce", size="1KB", size_bytes=1024,
                          nodes=1, ranks=2) > 0
        finally:
            r = subprocess.run(stress + ["stop", "--state-dir", str(state)], capture_output=True, text=True,
                               timeout=120)
        assert r.returncode == 0, r.stderr
        assert sample(ex.metrics(), "collbench_stress_running") == 0          # the next scrape
        written = {"result": 0, "failure": 0, "event": 0}
        for path in glob.glob(f"{state}/results.jsonl*"):
            for line in open(path):
                written[json.loads(line)["type"]] += 1
        assert written["result"] >= 6

        def counted():
            m = ex.metrics()
            return {t: sample(m, "collbench_results_records_total", type=t) for t in written}
        assert wait_for(lambda: counted() == written, timeout=10), (counted(), written)
