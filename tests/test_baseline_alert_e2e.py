"""CollbenchLatencyRegression end to end: a real `collbench sweep` (2 ranks) writes the results,
three real exporters serve them, each with another baseline, and a real Prometheus scrapes them
and evaluates the rules `collbench rules` generated (1 s scrape and evaluation, `for: 2s`):

- fast:     a baseline 2x faster than the live results  -> the alert fires for every (op, size)
- matching: the baseline saved from those same results  -> live / baseline is 1: never pending
- missing:  a baseline file that does not exist          -> no baseline series, the collector
            reports its failure, the scrape and the live series go on; the alert never pending

Every wait is bounded; Prometheus and the exporters are stopped by their pids at teardown.
"""

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from conftest import REPO, unused_port, wait_for
from exporter_helpers import ExporterProcess
from prometheus_helpers import Prometheus

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.alone]

OPS, SIZES = ("allreduce", "bcast"), ("1KB", "64KB")
KEYS = {(op, size) for op in OPS for size in SIZES}
ALERT = "CollbenchLatencyRegression"



def collbench(*args, timeout=300):
    res = subprocess.run([sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                         timeout=timeout, cwd=REPO)
    assert res.returncode == 0, f"collbench {' '.join(args)}: {res.stdout}{res.stderr}"
    return res


def faster(baseline_path, out_path, factor=2.0):
    """The baseline file with every latency statistic divided by factor (busbw multiplied)."""
    data = json.loads(baseline_path.read_text())
    for e in data["entries"]:
        e["latency_avg_us"] = {k: (v / factor if k != "n" else v) for k, v in e["latency_avg_us"].items()}
        if e.get("busbw_bytes_per_s"):
            e["busbw_bytes_per_s"]["median"] *= factor
    out_path.write_text(json.dumps(data))
    return out_path


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baseline-alert")
    results = tmp / "results.jsonl"
    collbench("sweep", "--np", "2", "--op", ",".join(OPS), "--sizes", ",".join(SIZES), "--iterations", "20",
              "--results", str(results), "--out-dir", str(tmp / "sweep"), "--quiet")
    collbench("baseline", "save", str(tmp / "matching.json"), "--from", str(results))
    baselines = {"fast": faster(tmp / "matching.json", tmp / "fast.json"),
                 "matching": tmp / "matching.json",
                 "missing": tmp / "no-such-baseline.json"}

    cfg = tmp / "collbench.yaml"
    cfg.write_text(yaml.safe_dump({"alerts": {"for": "2s", "regression_ratio": 1.5, "job": "collbench"}}))
    rules = tmp / "rules.yml"
    collbench("rules", "--config", str(cfg), "-o", str(rules))

    exporters, prom = {}, None
    try:
        for name, baseline in baselines.items():
            ex = ExporterProcess(["--config", str(cfg), "--results-log", str(results), "--max-age", "86400",
                                  "--collectors", "results", "--state-dir", str(tmp / "state"),
                                  "--baseline", str(baseline)], unused_port())
            exporters[name] = ex
            ex.wait_ready(timeout=60)
        prom = Prometheus(tmp, {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "collbench", "static_configs": [
                {"targets": [f"127.0.0.1:{ex.port}" for ex in exporters.values()]}]}],
        }, unused_port())
        env = {"prom": prom.url, "prometheus": prom,
               "instances": {name: f"127.0.0.1:{ex.port}" for name, ex in exporters.items()},
               "results": results, "start": time.time()}
        yield env
    finally:
        if prom is not None:
            prom.stop()
        for ex in exporters.values():
            ex.stop()


def try_query(env, expr):
    return env["prometheus"].try_query(expr)


def by_instance(samples):
    out = {}
    for s in samples or []:
        out.setdefault(s["metric"]["instance"], []).append(s)
    return out


def test_regression_alert_fires_on_a_2x_faster_baseline_and_stays_silent_on_a_matching_one(stack):
    inst = stack["instances"]
    # Every target scraped: 4 live series each; baseline series from fast and matching only.
    scraped = wait_for(lambda: (len(try_query(stack, 'collbench_latency_avg_seconds{job="collbench"}') or []) == 12
                                and len(try_query(stack, "collbench_baseline_latency_seconds") or []) == 8),
                       timeout=90, interval=0.5)
    assert scraped, f"not scraped: {try_query(stack, 'up')}"

    ratios = by_instance(try_query(stack, "collbench_latency_avg_seconds / collbench_baseline_latency_seconds"))
    assert sorted(float(s["value"][1]) for s in ratios[inst["fast"]]) == [2.0] * 4
    assert sorted(float(s["value"][1]) for s in ratios[inst["matching"]]) == [1.0] * 4
    assert inst["missing"] not in ratios
    # The missing baseline is that collector's failure, not the scrape's.
    success = {(s["metric"]["instance"], s["metric"]["collector"]): s["value"][1]
               for s in try_query(stack, "collbench_collector_success")}
    assert success[(inst["missing"], "baseline")] == "0"
    assert success[(inst["fast"], "baseline")] == "1" and success[(inst["matching"], "baseline")] == "1"
    assert all(s["value"][1] == "1" for s in try_query(stack, "up"))

    def firing():
        alerts = try_query(stack, f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}') or []
        return alerts if {(a["metric"]["op"], a["metric"]["size"]) for a in alerts} == KEYS else None
    alerts = wait_for(firing, timeout=60, interval=0.5)
    assert alerts, f"{ALERT} did not fire for every key: {try_query(stack, 'ALERTS')}"
    assert {a["metric"]["instance"] for a in alerts} == {inst["fast"]}
    for a in alerts:
        m = a["metric"]
        assert (m["severity"], m["job"], m["nodes"], m["ranks"]) == ("warning", "collbench", "1", "2")

    # The rule's annotations through Prometheus' own API: the ratio rendered from the value.
    groups = json.loads(urllib.request.urlopen(stack["prom"] + "/api/v1/alerts", timeout=10).read())["data"]
    summaries = {a["annotations"]["summary"] for a in groups["alerts"] if a["labels"]["alertname"] == ALERT}
    assert summaries == {f"{op} {size} latency on {inst['fast']} is 2.00x its baseline (alert above 1.5x for 2s)"
                         for op, size in KEYS}

    # A few more evaluations, then: never pending or firing for the matching or missing baseline
    # over the whole test (ALERTS has a sample at every evaluation an alert is pending or firing).
    time.sleep(3)
    window = f"{int(time.time() - stack['start']) + 60}s"
    quiet = try_query(stack, f'count_over_time(ALERTS{{alertname="{ALERT}",'
                             f'instance=~"{inst["matching"]}|{inst["missing"]}"}}[{window}])')
    assert quiet == [], quiet
    # ... while the rule was evaluated, healthy, all along
    rules = json.loads(urllib.request.urlopen(stack["prom"] + "/api/v1/rules", timeout=10).read())["data"]
    rule = next(r for g in rules["groups"] for r in g["rules"] if r["name"] == ALERT)
    assert rule["health"] == "ok" and rule["state"] == "firing", rule
