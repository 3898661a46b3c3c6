"""`collbench rules`: the generated file, promtool's checks and unit tests, scaling, bad input."""

import shutil
import subprocess
import sys

import pytest
import yaml

from collbench.config import load_config
from collbench.monitoring.rules import render
from collbench.thresholds import Thresholds
from conftest import REPO, require_tool

RULES = REPO / "prometheus" / "collbench-rules.yml"
UNIT_TESTS = sorted((REPO / "prometheus" / "tests").glob("*.test.yml"))


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "collbench", "rules", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def rules_of(text):
    return [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]


def alerts_of(text):
    return [r for r in rules_of(text) if "alert" in r]


def write_config(path, text):
    path.write_text(text)
    return str(path)


def test_checked_in_rules_are_the_generated_default():
    generated = run_cli()
    assert generated.returncode == 0, generated.stderr
    assert generated.stdout == RULES.read_text(), \
        "prometheus/collbench-rules.yml is stale: run `collbench rules -o prometheus/collbench-rules.yml`"
    assert render(load_config(None)) == generated.stdout


def test_promtool_check_rules_passes():
    promtool = require_tool("promtool")
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules_of(RULES.read_text()))} rules found" in out.stdout


def test_promtool_unit_tests_pass():
    promtool = require_tool("promtool")
    assert len(UNIT_TESTS) >= 3
    out = subprocess.run([promtool, "test", "rules", *map(str, UNIT_TESTS)], capture_output=True, text=True,
                         timeout=120, cwd=REPO / "prometheus" / "tests")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(UNIT_TESTS), out.stdout


def test_latency_unit_tests_are_generated_from_the_default_thresholds():
    out = subprocess.run([sys.executable, str(REPO / "prometheus" / "tests" / "make_latency_tests.py")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (REPO / "prometheus" / "tests" / "latency.test.yml").read_text(), \
        "latency.test.yml is stale: run prometheus/tests/make_latency_tests.py > prometheus/tests/latency.test.yml"


def test_every_alert_is_unit_tested_firing_and_silent():
    alerts = {r["alert"] for r in alerts_of(RULES.read_text())}
    firing, silent = {}, set()
    for path in UNIT_TESTS:
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                if case["exp_alerts"]:
                    firing.setdefault(case["alertname"], []).extend(a["exp_labels"] for a in case["exp_alerts"])
                else:
                    silent.add(case["alertname"])
    assert alerts - set(firing) == set(), "alerts never shown firing"
    assert alerts - silent == set(), "alerts never shown silent"
    # every (op, size) bound of the default thresholds, at both severities
    for op, _b, size, _w, _c in Thresholds().items():
        for name in ("CollbenchLatencyWarning", "CollbenchLatencyCritical"):
            assert any(l["op"] == op and l["size"] == size for l in firing[name]), (name, op, size)


def test_unit_tests_fail_against_rules_with_other_thresholds(tmp_path):
    """The unit tests measure the bounds: rules from doubled thresholds must fail them."""
    promtool = require_tool("promtool")
    by_op = {}   # one mapping per op: a repeated op key is a duplicate-key error
    for op, _b, size, w, c in Thresholds().items():
        by_op.setdefault(op, []).append(f"      {size}: {{warning: {w * 2:g}us, critical: {c * 2:g}us}}")
    latency = "\n".join(f"    {op}:\n" + "\n".join(lines) for op, lines in by_op.items())
    cfg = write_config(tmp_path / "c.yaml",
                       f"thresholds:\n  default_latency: false\n  ecn_rate: {{warning: 200, critical: 1000}}\n"
                       f"  latency:\n{latency}\n")
    (tmp_path / "prometheus").mkdir()
    tests = tmp_path / "prometheus" / "tests"
    tests.mkdir()
    out = run_cli("--config", cfg, "-o", str(tmp_path / "prometheus" / "collbench-rules.yml"))
    assert out.returncode == 0, out.stderr
    for name in ("latency", "congestion"):
        shutil.copy(REPO / "prometheus" / "tests" / f"{name}.test.yml", tests)
        res = subprocess.run([promtool, "test", "rules", f"{name}.test.yml"], cwd=tests,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode != 0, f"{name}: unit tests passed against doubled thresholds"
        assert "FAILED" in res.stdout + res.stderr


def test_rules_from_a_config(tmp_path):
    """The config's thresholds, `for`, job and stale_after reach the rules, and promtool fires on them."""
    promtool = require_tool("promtool")
    cfg = write_config(tmp_path / "c.yaml", """
thresholds:
  default_latency: false
  latency:
    allreduce:
      256KB: {warning: 3ms, critical: 7ms}
alerts:
  for: 0s
  job: mpi-bench
  stale_after: 45
  failure_window: 10m
""")
    out_file = tmp_path / "rules.yml"
    res = run_cli("--config", cfg, "-o", str(out_file))
    assert res.returncode == 0, res.stderr
    rules = {(r["alert"], r["labels"].get("op")): r for r in alerts_of(out_file.read_text())}
    assert rules[("CollbenchLatencyWarning", "allreduce")]["expr"] == \
        'collbench_latency_avg_seconds{op="allreduce",size="256KB"} >= 0.003'
    assert rules[("CollbenchLatencyCritical", "allreduce")]["expr"] == \
        'collbench_latency_avg_seconds{op="allreduce",size="256KB"} > 0.007'
    assert not any(k[0] in ("CollbenchLatencyWarning", "CollbenchLatencyCritical") and k[1] != "allreduce" for k in rules)
    assert rules[("CollbenchExporterDown", None)]["expr"] == 'up{job="mpi-bench"} == 0'
    assert rules[("CollbenchResultsStale", None)]["expr"] == "collbench_results_age_seconds > 45.0"
    assert "[10m]" in rules[("CollbenchBenchmarkFailures", None)]["expr"]
    assert all(r.get("for", "0s") == "0s" for r in rules.values())
    check = subprocess.run([promtool, "check", "rules", str(out_file)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    (tmp_path / "t.yml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [
            {"series": 'collbench_latency_avg_seconds{op="allreduce",size="256KB",instance="a"}',
             "values": "0.0029 0.005 0.0071"}],
            "alert_rule_test": [
                {"eval_time": "0m", "alertname": "CollbenchLatencyWarning", "exp_alerts": []},
                {"eval_time": "1m", "alertname": "CollbenchLatencyWarning", "exp_alerts": [{
                    "exp_labels": {"op": "allreduce", "size": "256KB", "instance": "a", "severity": "warning"},
                    "exp_annotations": {"summary": "allreduce 256KB latency 5ms on a (warning at 3ms)",
                                        "runbook_url": "docs/METRICS.md#alerts"}}]},
                {"eval_time": "1m", "alertname": "CollbenchLatencyCritical", "exp_alerts": []},
                {"eval_time": "2m", "alertname": "CollbenchLatencyCritical", "exp_alerts": [{
                    "exp_labels": {"op": "allreduce", "size": "256KB", "instance": "a", "severity": "critical"},
                    "exp_annotations": {"summary": "allreduce 256KB latency 7.1ms on a (critical at 7ms)",
                                        "runbook_url": "docs/METRICS.md#alerts"}}]},
            ]}]}))
    res = subprocess.run([promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_rules_from_the_example_config_pass_promtool(tmp_path):
    promtool = require_tool("promtool")
    out_file = tmp_path / "rules.yml"
    res = run_cli("--config", str(REPO / "config" / "collbench.example.yaml"), "-o", str(out_file))
    assert res.returncode == 0, res.stderr
    assert "collbench.example.yaml" in out_file.read_text().splitlines()[0]
    check = subprocess.run([promtool, "check", "rules", str(out_file)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_scaling_to_another_cluster_uses_the_busbw_model():
    """16 nodes at 100 Gb/s from seed 001's 8 nodes at 25 Gb/s, computed by hand:
    allreduce moves 2(n-1)/n x size over the link: (30/16 / 100) / (14/8 / 25) = 0.267857...;
    alltoall moves (n-1) x size: (15 / 100) / (7 / 25) = 0.535714...;
    bcast moves size: 25 / 100 = 0.25; 1KB is latency-bound and keeps its bounds."""
    res = run_cli("--nodes", "16", "--link-gbps", "100")
    assert res.returncode == 0, res.stderr
    assert "16 nodes at 100 Gb/s (scaled from 8 nodes at 25 Gb/s" in res.stdout
    exprs = {(r["alert"], r["labels"]["op"], r["labels"]["size"]): r["expr"]
             for r in alerts_of(res.stdout) if r["alert"] in ("CollbenchLatencyWarning", "CollbenchLatencyCritical")}

    def bound(alert, op, size):
        return float(exprs[(alert, op, size)].rsplit(" ", 1)[1])
    assert bound("CollbenchLatencyWarning", "allreduce", "1MB") == pytest.approx(0.010 * 0.267857, rel=1e-5)
    assert bound("CollbenchLatencyCritical", "allreduce", "4MB") == pytest.approx(0.060 * 0.267857, rel=1e-5)
    assert bound("CollbenchLatencyWarning", "alltoall", "1MB") == pytest.approx(0.100 * 0.535714, rel=1e-5)
    assert bound("CollbenchLatencyCritical", "bcast", "1MB") == pytest.approx(0.015 * 0.25, rel=1e-5)
    assert bound("CollbenchLatencyWarning", "allreduce", "1KB") == pytest.approx(100e-6)
    assert bound("CollbenchLatencyCritical", "allreduce", "1KB") == pytest.approx(200e-6)


@pytest.mark.parametrize("section, expected", [
    ("alerts:\n  for: 2 minutes\n", "alerts.for: got '2 minutes', expected a Prometheus duration"),
    ("alerts:\n  failure_window: soon\n", "alerts.failure_window: got 'soon'"),
    ("alerts:\n  nodes: 0\n", "alerts.nodes: got 0"),
    ("alerts:\n  stale: 5\n", "alerts.stale: unknown key"),
])
def test_bad_config_exits_2_and_writes_nothing(tmp_path, section, expected):
    cfg = write_config(tmp_path / "bad.yaml", section)
    out_file = tmp_path / "rules.yml"
    out_file.write_text("previous rules\n")
    res = run_cli("--config", cfg, "-o", str(out_file))
    assert res.returncode == 2
    assert expected in res.stderr and str(tmp_path / "bad.yaml") in res.stderr
    assert out_file.read_text() == "previous rules\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "rules.yml"]


def test_bad_flags_and_unwritable_output(tmp_path):
    res = run_cli("--link-gbps", "0")
    assert res.returncode == 2 and "--link-gbps: got 0.0, expected a positive number" in res.stderr
    res = run_cli("-o", str(tmp_path / "missing" / "rules.yml"))
    assert res.returncode == 2 and "missing/rules.yml: cannot write" in res.stderr


def test_every_alert_is_documented():
    """docs/METRICS.md (the rules' runbook_url) explains every alert the rules can fire."""
    docs = (REPO / "docs" / "METRICS.md").read_text()
    section = docs[docs.index("<!-- section: dashboard"):docs.index("<!-- end section: dashboard")]
    assert "### Alerts" in section
    for rule in alerts_of(RULES.read_text()):
        assert f"| {rule['alert']} |" in section, rule["alert"]
        assert rule["annotations"]["runbook_url"] == "docs/METRICS.md#alerts"


# ---------------------------------------------------------------- lost link time (recording rules)

def test_every_recording_rule_is_unit_tested_and_documented():
    records = {r["record"] for r in rules_of(RULES.read_text()) if "record" in r}
    assert records == {"collbench:pause_lost_link_time:ratio", "collbench:xmit_wait_lost_link_time:ratio",
                       "collbench:latency_shift:top_host", "collbench:host_sender_congestion:rate"}
    tested = {case["expr"].split("{")[0] for path in UNIT_TESTS for group in yaml.safe_load(path.read_text())["tests"]
              for case in group.get("promql_expr_test", [])}
    assert records <= tested
    docs = (REPO / "docs" / "METRICS.md").read_text()
    for name in records:
        assert f"`{name}`" in docs, name
    assert "CONGESTION.md" in docs


def test_xmit_wait_tick_from_the_config_reaches_the_rule_and_the_unit_tests_see_it(tmp_path):
    """congestion.xmit_wait_tick_ns scales port_xmit_wait; the unit tests (8 ns) fail against 32 ns."""
    promtool = require_tool("promtool")
    cfg = write_config(tmp_path / "c.yaml", "congestion:\n  xmit_wait_tick_ns: 32\n")
    (tmp_path / "prometheus" / "tests").mkdir(parents=True)
    out = run_cli("--config", cfg, "-o", str(tmp_path / "prometheus" / "collbench-rules.yml"))
    assert out.returncode == 0, out.stderr
    (rule,) = [r for r in rules_of((tmp_path / "prometheus" / "collbench-rules.yml").read_text())
               if r.get("record") == "collbench:xmit_wait_lost_link_time:ratio"]
    assert rule["expr"] == "clamp_max(irate(collbench_rdma_port_xmit_wait_total[1m]) * 3.2e-08, 1)"
    shutil.copy(REPO / "prometheus" / "tests" / "lost_link_time.test.yml", tmp_path / "prometheus" / "tests")
    res = subprocess.run([promtool, "test", "rules", "lost_link_time.test.yml"], cwd=tmp_path / "prometheus" / "tests",
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "FAILED" in res.stdout + res.stderr
    assert "xmit_wait_lost_link_time" in res.stdout + res.stderr
