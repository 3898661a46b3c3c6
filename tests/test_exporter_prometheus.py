"""A real Prometheus (the Debian package) scrapes the real exporter on loopback; its query API
returns the latency series, and a series the exporter drops goes stale in Prometheus too."""

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request

from conftest import require_tool, stop_process, wait_for
from exporter_helpers import ExporterProcess, append, result_line


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(prom_port, expr):
    url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
    except OSError:
        return None
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_scrapes_exporter(tmp_path, free_port):
    prometheus = require_tool("prometheus")
    log = tmp_path / "results.jsonl"
    append(log, result_line(1, avg_us=44977.66, nodes=8, ts=time.time()))
    prom_port = _free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: collbench\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{free_port}']\n")
    with ExporterProcess(["--results-log", str(log), "--state-dir", str(tmp_path), "--max-age", "6",
                          "--poll-interval", "0.2"], free_port) as ex:
        ex.wait_ready()
        prom_log = open(tmp_path / "prometheus.log", "w")
        prom = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                                stdout=subprocess.DEVNULL, stderr=prom_log)
        try:
            up = wait_for(lambda: _query(prom_port, 'up{job="collbench"} == 1'), timeout=40, interval=0.5)
            assert up, "Prometheus never scraped the exporter: " + (tmp_path / "prometheus.log").read_text()
            # a fresh result now, so a slow start on a loaded host cannot let it age out first
            append(log, result_line(2, avg_us=44977.66, nodes=8, ts=time.time()))
            result = wait_for(lambda: _query(prom_port, 'collbench_latency_avg_seconds{op="allreduce"}'),
                              timeout=30, interval=0.5)
            assert result, "Prometheus never returned the latency series: " + (tmp_path / "prometheus.log").read_text()
            (series,) = result
            assert series["metric"]["job"] == "collbench"
            assert series["metric"]["size"] == "4MB" and series["metric"]["nodes"] == "8"
            assert series["metric"]["size_bytes"] == str(4 << 20) and series["metric"]["ranks"] == "4"
            assert abs(float(series["value"][1]) - 0.04497766) < 1e-9
            ok = _query(prom_port, 'collbench_collector_success{collector="results"}')
            assert ok and ok[0]["value"][1] == "1"
            # the exporter drops the series past max_age; Prometheus marks it stale, no zero appears
            gone = wait_for(lambda: _query(prom_port, "collbench_latency_avg_seconds") == [], timeout=30, interval=0.5)
            assert gone, "the dropped series is still returned by Prometheus"
            zeros = _query(prom_port, "min_over_time(collbench_latency_avg_seconds[1m])")
            assert zeros and float(zeros[0]["value"][1]) > 0
        finally:
            stop_process(prom, timeout=15)
            prom_log.close()
