"""A real Prometheus (the Debian package) scrapes the real exporter on loopback; its query API
returns the latency series, and a series the exporter drops goes stale in Prometheus too."""

import time

from conftest import unused_port, wait_for
from exporter_helpers import ExporterProcess, append, result_line
from prometheus_helpers import Prometheus


def test_prometheus_scrapes_exporter(tmp_path, free_port):
    log = tmp_path / "results.jsonl"
    append(log, result_line(1, avg_us=44977.66, nodes=8, ts=time.time()))
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [{"job_name": "collbench", "static_configs": [{"targets": [f"127.0.0.1:{free_port}"]}]}]}
    with ExporterProcess(["--results-log", str(log), "--state-dir", str(tmp_path), "--max-age", "6",
                          "--poll-interval", "0.2"], free_port) as ex:
        ex.wait_ready()
        with Prometheus(tmp_path, config, unused_port()) as prom:
            up = wait_for(lambda: prom.try_query('up{job="collbench"} == 1'), timeout=40, interval=0.5)
            assert up, "Prometheus never scraped the exporter: " + prom.log_tail()
            # a fresh result now, so a slow start on a loaded host cannot let it age out first
            append(log, result_line(2, avg_us=44977.66, nodes=8, ts=time.time()))
            result = wait_for(lambda: prom.try_query('collbench_latency_avg_seconds{op="allreduce"}'),
                              timeout=30, interval=0.5)
            assert result, "Prometheus never returned the latency series: " + prom.log_tail()
            (series,) = result
            assert series["metric"]["job"] == "collbench"
            assert series["metric"]["size"] == "4MB" and series["metric"]["nodes"] == "8"
            assert series["metric"]["size_bytes"] == str(4 << 20) and series["metric"]["ranks"] == "4"
            assert abs(float(series["value"][1]) - 0.04497766) < 1e-9
            ok = prom.query('collbench_collector_success{collector="results"}')
            assert ok and ok[0]["value"][1] == "1"
            # the exporter drops the series past max_age; Prometheus marks it stale, no zero appears
            gone = wait_for(lambda: prom.try_query("collbench_latency_avg_seconds") == [], timeout=30, interval=0.5)
            assert gone, "the dropped series is still returned by Prometheus"
            zeros = prom.query("min_over_time(collbench_latency_avg_seconds[1m])")
            assert zeros and float(zeros[0]["value"][1]) > 0
