"""CollbenchLatencyRegression in `collbench rules`: the config's ratio, k and duration reach the
rule; prometheus/tests/baseline.test.yml measures them (rules with another ratio or k fail it);
bad values are exit 2."""

import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, require_tool

ALERT = "CollbenchLatencyRegression"


def rules_cli(*args):
    return subprocess.run([sys.executable, "-m", "collbench", "rules", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def regression_rule(text):
    (rule,) = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    return rule


def test_default_rule():
    rule = regression_rule((REPO / "prometheus" / "collbench-rules.yml").read_text())
    assert rule["expr"] == ("(collbench_latency_avg_seconds / collbench_baseline_latency_seconds > 1.5) and "
                            "collbench_latency_avg_seconds > collbench_baseline_latency_seconds + "
                            "3.0 * collbench_baseline_latency_sigma_seconds")
    assert rule["for"] == "2m" and rule["labels"] == {"severity": "warning"}


def test_config_sets_ratio_k_and_duration(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("alerts:\n  for: 30s\n  regression_ratio: 1.25\n  regression_k: 0\n  regression_for: 15m\n")
    res = rules_cli("--config", str(cfg))
    assert res.returncode == 0, res.stderr
    rule = regression_rule(res.stdout)
    # k = 0: no noise term, the ratio alone
    assert rule["expr"] == "(collbench_latency_avg_seconds / collbench_baseline_latency_seconds > 1.25)"
    assert rule["for"] == "15m"
    assert "above 1.25x for 15m" in rule["annotations"]["summary"]
    cfg.write_text("alerts:\n  for: 30s\n")
    assert regression_rule(rules_cli("--config", str(cfg)).stdout)["for"] == "30s"   # default: alerts.for


@pytest.mark.parametrize("alerts, expected", [
    ("regression_ratio: 0", "alerts.regression_ratio: got 0"),
    ("regression_ratio: .nan", "alerts.regression_ratio: got nan"),
    ("regression_ratio: fast", "alerts.regression_ratio: got 'fast'"),
    ("regression_k: -1", "alerts.regression_k: got -1"),
    ("regression_for: soon", "alerts.regression_for: got 'soon', expected a Prometheus duration"),
    ("regression_for: [1m]", "alerts.regression_for: got ['1m']"),
])
def test_bad_values_exit_2_and_write_nothing(tmp_path, alerts, expected):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"alerts:\n  {alerts}\n")
    out = tmp_path / "rules.yml"
    out.write_text("previous\n")
    res = rules_cli("--config", str(cfg), "-o", str(out))
    assert res.returncode == 2, res.stdout + res.stderr
    assert expected in res.stderr and str(cfg) in res.stderr
    assert out.read_text() == "previous\n"


@pytest.mark.parametrize("alerts", [
    "regression_ratio: 2.5",     # the 2x step no longer fires
    "regression_ratio: 1.3",     # the 1.4x series fires
    "regression_k: 0",           # the noisy baseline's 2x fires early
    "regression_for: 10m",       # fires too late for the test's eval times
])
def test_baseline_unit_tests_fail_against_other_rules(tmp_path, alerts):
    """The unit tests measure the ratio, the noise term and the duration."""
    promtool = require_tool("promtool")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"alerts:\n  {alerts}\n")
    (tmp_path / "prometheus" / "tests").mkdir(parents=True)
    res = rules_cli("--config", str(cfg), "-o", str(tmp_path / "prometheus" / "collbench-rules.yml"))
    assert res.returncode == 0, res.stderr
    shutil.copy(REPO / "prometheus" / "tests" / "baseline.test.yml", tmp_path / "prometheus" / "tests")
    out = subprocess.run([promtool, "test", "rules", "baseline.test.yml"], cwd=tmp_path / "prometheus" / "tests",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "FAILED" in out.stdout + out.stderr, out.stdout


def test_baseline_unit_tests_pass_against_the_checked_in_rules():
    promtool = require_tool("promtool")
    out = subprocess.run([promtool, "test", "rules", "baseline.test.yml"], cwd=REPO / "prometheus" / "tests",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
