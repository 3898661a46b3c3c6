"""The Grafana dashboards: generated = checked in, and their structure is sound.

No Grafana server is installable here; tests/test_monitoring_e2e.py runs every panel query
against a real Prometheus. This file checks what Grafana itself would reject or mis-render, and
that the dashboards built with grafana-foundation-sdk show every panel and query of the
hand-built ones they replaced (tests/fixtures/dashboard-before-sdk/, their last output).
"""

import json
import re
import subprocess
import sys

import pytest

from collbench.config import load_config
from collbench.monitoring.dashboard import LEGACY_UID, SCHEMA_VERSION, TOP_K, UID, build_dashboard, render
from collbench.ops import OPS
from conftest import REPO

FILES = {False: REPO / "grafana" / "collbench-dashboard.json",
         True: REPO / "grafana" / "collbench-dashboard-legacy.json"}
BEFORE_SDK = {legacy: REPO / "tests" / "fixtures" / "dashboard-before-sdk" / f.name for legacy, f in FILES.items()}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms",
                    "__all", "__dashboard", "__org", "__user", "__from", "__to", "timeFilter"}
VAR_REF = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
DS_REF = {"type": "prometheus", "uid": "${datasource}"}
# Metric names the exporter exports (docs/DESIGN.md, "Exporter metrics"); RDMA counters are
# named after the driver's sysfs files, so they are checked by prefix.
KNOWN_METRICS = re.compile(
    r"^(collbench_(latency_(avg|min|max)_seconds|algbw_bytes_per_second|busbw_bytes_per_second|"
    r"result_timestamp_seconds|last_update_timestamp_seconds|results_age_seconds|stress_running|"
    r"stress_iteration|last_run_success|benchmark_failures_total|results_parse_errors_total|"
    r"results_records_total|collector_success|collector_duration_seconds|"
    r"baseline_latency_seconds|baseline_busbw_bytes_per_second|"
    r"rdma_\w+_total|ethtool_pause_frames_total|ethtool_pause_duration_seconds_total|"
    r"ethtool_pause_ctrl_frames_total|ethtool_rx_discards_phy_total|ethtool_pause_storm_warning_events_total|"
    r"ethtool_pause_storm_error_events_total|netstat_ip_in_(ce|ect0|ect1|noect)_packets_total|"
    # the inspector collector (NCCL Inspector records of a production job)
    r"inspector_(latency_seconds|busbw_bytes_per_second|slowest_host_latency_seconds|latency_shift|"
    r"newest_record_age_seconds))|"
    # the recording rules of prometheus/collbench-rules.yml (collbench rules)
    r"collbench:(pause|xmit_wait)_lost_link_time:ratio|"
    r"mpi_stress_test_running|mpi_stress_test_iteration|mpi_benchmark_last_update_timestamp|"
    r"mpi_\$\{op\}_latency_us|mpi_(" + "|".join(op.legacy_name for op in OPS.values() if op.legacy_name)
    + r")_latency_us|up|ALERTS)$")
METRIC_TOKEN = re.compile(r"\b((?:collbench|mpi)_[\w${}]+|collbench:[\w:]+|up|ALERTS)\s*(?=\{|\[|\)|$|\s)")


def load(legacy):
    return json.loads(FILES[legacy].read_text())


def refs(text):
    return {a or b for a, b in VAR_REF.findall(text)}


@pytest.mark.parametrize("legacy", [False, True])
def test_checked_in_dashboard_is_generated(legacy):
    args = ["--legacy"] if legacy else []
    out = subprocess.run([sys.executable, "-m", "collbench.monitoring.dashboard_cli", *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == FILES[legacy].read_text(), \
        f"{FILES[legacy].name} is stale: run `python -m collbench.monitoring.dashboard_cli {' '.join(args)} -o {FILES[legacy]}`"
    assert render(load_config(None), legacy) == out.stdout


@pytest.mark.parametrize("legacy", [False, True])
def test_dashboard_structure(legacy):
    d = load(legacy)
    assert d["uid"] == (LEGACY_UID if legacy else UID)
    assert d["schemaVersion"] == SCHEMA_VERSION and 38 <= SCHEMA_VERSION <= 41
    assert "id" not in d, "a provisioned dashboard must not carry a database id"
    panels = d["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)

    # grid: inside 24 columns, no two panels overlap
    cells = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]

    variables = d["templating"]["list"]
    names = [v["name"] for v in variables]
    assert len(names) == len(set(names)) and names[0] == "datasource"
    assert variables[0]["type"] == "datasource" and variables[0]["query"] == "prometheus"
    for i, v in enumerate(variables[1:], 1):
        if v["type"] == "query":
            assert v["datasource"] == DS_REF, v["name"]
            query = v["query"]["query"]
            assert query.startswith("label_values(")
            # a variable may only use the ones defined before it (Grafana resolves in order)
            assert refs(query) <= set(names[:i]), v["name"]

    defined = set(names) | GRAFANA_BUILTINS
    rows = [p for p in panels if p["type"] == "row"]
    assert rows and all(p["panels"] == [] and not p["collapsed"] for p in rows)
    queries = 0
    for p in panels:
        assert refs(p["title"]) <= defined, p["title"]
        if p["type"] in ("row", "text"):
            assert "targets" not in p
            continue
        assert p["datasource"] == DS_REF, p["title"]
        assert p["targets"], p["title"]
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in p["targets"]:
            queries += 1
            assert t["datasource"] == DS_REF
            assert t["expr"].strip() and refs(t["expr"]) <= defined, (p["title"], t["expr"])
            assert refs(t["legendFormat"]) <= defined
            for metric in METRIC_TOKEN.findall(t["expr"]):
                assert KNOWN_METRICS.match(metric), f"{p['title']}: {metric} is no exporter metric"
        if "repeat" in p:
            var = next(v for v in variables if v["name"] == p["repeat"])
            assert var["multi"] and var["includeAll"], p["repeat"]
            assert f"${p['repeat']}" in p["title"]
        for step in p["fieldConfig"]["defaults"]["thresholds"]["steps"][1:]:
            assert isinstance(step["value"], (int, float))
        values = [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"][1:]]
        assert values == sorted(values), p["title"]
    assert queries >= 20


def _stat(d, title):
    return next(p for p in d["panels"] if p["title"] == title)


def test_panels_cover_the_issue():
    d = load(False)
    titles = {p["title"] for p in d["panels"]}
    for title in ("$op latency by size", "$bwop bus bandwidth", "Stress daemon", "Iteration", "Results age",
                  "Failures in range", "ECN-marked packets (RoCE)", "CNPs ignored",
                  "PFC pause frames by priority", "Time paused by priority", "Retransmits and ack timeouts",
                  "What the ops mean"):
        assert title in titles
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "job", "instance", "op", "size"} <= variables
    text = _stat(d, "What the ops mean")["options"]["content"]
    for op in OPS.values():
        assert op.training_use in text
    assert "| Allreduce 1MB | < 10ms | 10ms-20ms | > 20ms |" in text
    assert "| ECN rate | < 100/s | 100-500/s | > 500/s |" in text


def test_stat_panels_follow_the_configured_thresholds(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("thresholds:\n  latency:\n    allreduce:\n      1MB: {warning: 3ms, critical: 7ms}\n"
                        "    reduce_scatter:\n      2MB: {warning: 12ms, critical: 30ms}\n"
                        "alerts:\n  nodes: 16\n  link_gbps: 100\n  stale_after: 120\n")
    cfg = load_config(str(cfg_file))
    d = build_dashboard(cfg)
    steps = _stat(d, "Allreduce 1MB")["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [(s["color"], s["value"]) for s in steps] == [("green", None), ("#EAB839", 0.003), ("red", 0.007)]
    rs = _stat(d, "Reduce_scatter 2MB")
    assert rs["targets"][0]["expr"] == \
        'collbench_latency_avg_seconds{job=~"$job",instance=~"$instance",op="reduce_scatter",size="2MB"}'
    assert "(16 nodes at 100 Gb/s)" in rs["description"]
    # seed defaults stay for the pairs the config does not override
    steps = _stat(d, "Broadcast 1MB")["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 0.010, 0.015]
    age = _stat(d, "Results age")["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in age] == [None, 60.0, 120.0]
    bw = _stat(d, "$bwop bus bandwidth")["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert bw[1]["value"] == 100e9 / 8
    # legacy: no mpi_* name for reduce_scatter, so no stat panel for it
    legacy = build_dashboard(cfg, legacy=True)
    assert not any(p["title"] == "Reduce_scatter 2MB" for p in legacy["panels"])
    assert _stat(legacy, "Allreduce 1MB")["targets"][0]["expr"] == \
        'mpi_allreduce_latency_us{job=~"$job",instance=~"$instance",size="1MB"}'
    steps = _stat(legacy, "Allreduce 1MB")["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 3000.0, 7000.0]


def test_dashboard_cli_writes_file_and_rejects_bad_config(tmp_path):
    out = tmp_path / "d.json"
    res = subprocess.run([sys.executable, "-m", "collbench.monitoring.dashboard_cli", "-o", str(out)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["uid"] == UID
    bad = tmp_path / "bad.yaml"
    bad.write_text("thresholds:\n  latency:\n    allreduce:\n      1MB: {warning: fast, critical: 7ms}\n")
    res = subprocess.run([sys.executable, "-m", "collbench.monitoring.dashboard_cli", "--config", str(bad), "-o", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "thresholds.latency.allreduce.1MB.warning" in res.stderr and str(bad) in res.stderr
    assert json.loads(out.read_text())["uid"] == UID   # the previous file is intact


# ---------------------------------------------------------------- the SDK build shows what the hand-built one did

def _panel_facts(p):
    """What a panel shows: title, type, place, queries, units, thresholds, colours, layout options."""
    defaults = p.get("fieldConfig", {}).get("defaults", {})
    custom = defaults.get("custom", {})
    options = p.get("options", {})
    return {
        "title": p["title"], "type": p["type"], "gridPos": p["gridPos"], "description": p.get("description"),
        "collapsed": p.get("collapsed"), "row panels": p.get("panels"),
        "datasource": p.get("datasource"),
        "targets": [{k: t.get(k) for k in ("refId", "expr", "legendFormat", "instant", "range", "datasource")}
                    for t in p.get("targets", [])],
        "unit": defaults.get("unit"), "decimals": defaults.get("decimals"),
        "thresholds": defaults.get("thresholds"), "mappings": defaults.get("mappings"),
        "color": defaults.get("color"),
        "custom": {k: custom.get(k) for k in ("drawStyle", "lineWidth", "fillOpacity", "showPoints", "spanNulls",
                                               "thresholdsStyle", "scaleDistribution")},
        "repeat": p.get("repeat"), "maxPerRow": p.get("maxPerRow"),
        "repeatDirection": p.get("repeatDirection") if p.get("repeat") else None,
        "content": options.get("content"), "mode": options.get("mode"),
        "legend": {k: options.get("legend", {}).get(k) for k in ("displayMode", "placement", "showLegend")},
        "tooltip": options.get("tooltip"), "reduceOptions": options.get("reduceOptions"),
        "stat": {k: options.get(k) for k in ("colorMode", "graphMode", "textMode", "justifyMode", "orientation")},
    }


# Fields the hand-built dashboards wrote that Grafana's schema types (the SDK) have no place for
# or fill themselves: the query variables' `definition` (the UI's display copy of query.query) and
# the data source variable's empty current/options and refresh (Grafana's defaults).
DROPPED_BY_THE_SDK = {"schemaVersion", "templating.list[].definition", "templating.list[0].current",
                      "templating.list[0].options", "templating.list[0].refresh"}


def _missing_or_changed(old, new, path=""):
    """Paths where `old` has a value that `new` lacks or differs in (new may add fields)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [m for k in old for m in
                (_missing_or_changed(old[k], new[k], f"{path}.{k}".lstrip(".")) if k in new
                 else [f"{path}.{k}".lstrip(".")])]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [m for i, (a, b) in enumerate(zip(old, new)) for m in _missing_or_changed(a, b, f"{path}[{i}]")]
    return [] if old == new and type(old) is type(new) else [path]


# What the dashboard gained after the SDK rebuild, deliberately (issue 20: every host's counters):
# one row before "Reference" and the `host` variable after the others. The comparison below takes
# them out again, moves what follows back up, and checks the rest is still the hand-built dashboard.
ADDED_ROW = f"Congestion on every host (top {TOP_K})"
ADDED_PANELS = {
    "Host exporters": ['min by (host) (up{host=~"$host"})'],
    "ECN-marked packets by host and port": [
        'topk(10, max by (host, device, port) (rate(collbench_rdma_np_ecn_marked_roce_packets_total{host=~"$host"}[$__rate_interval])))'],
    "CNPs handled by host and port": [
        'topk(10, max by (host, device, port) (rate(collbench_rdma_rp_cnp_handled_total{host=~"$host"}[$__rate_interval])))'],
    "Kernel IP CE by host": [
        'topk(10, max by (host) (rate(collbench_netstat_ip_in_ce_packets_total{host=~"$host"}[$__rate_interval])))'],
    "PFC pause frames by host and priority": [
        'topk(10, max by (host, netdev, direction, priority) (rate(collbench_ethtool_pause_frames_total{host=~"$host"}[$__rate_interval])))'],
    "Lost link time: paused, by host and priority": [
        'topk(10, max by (host, netdev, direction, priority) (collbench:pause_lost_link_time:ratio{host=~"$host"}))'],
    "Lost link time: xmit_wait, by host and port": [
        'topk(10, max by (host, device, port) (collbench:xmit_wait_lost_link_time:ratio{host=~"$host"}))'],
}
ADDED_VARIABLES = ["host"]


def without_added(d):
    """The dashboard as it was before the per-host row: that row and the host variable taken out,
    the panels after it moved up and renumbered as they were."""
    d = json.loads(json.dumps(d))
    for row in (INSPECTOR_ROW, ADDED_ROW):
        _without_row(d, row)
    d["templating"]["list"] = [v for v in d["templating"]["list"] if v["name"] not in ADDED_VARIABLES]
    return d


INSPECTOR_ROW = "Production job (NCCL Inspector)"   # added after the per-host row (issue 29)


def _without_row(d, title):
    panels = d["panels"]
    start = next((i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title), None)
    if start is not None:
        end = next((i for i in range(start + 1, len(panels)) if panels[i]["type"] == "row"), len(panels))
        removed = panels[start:end]
        height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in removed) - removed[0]["gridPos"]["y"]
        for p in panels[end:]:
            p["gridPos"]["y"] -= height
            p["id"] -= len(removed)
        d["panels"] = panels[:start] + panels[end:]
    return d["panels"]


def test_the_per_host_congestion_row_is_what_was_added():
    now = build_dashboard(load_config(None))
    titles = [p["title"] for p in now["panels"]]
    start = titles.index(ADDED_ROW)
    assert titles[start + 1:start + 1 + len(ADDED_PANELS)] == list(ADDED_PANELS)
    assert titles[start + 1 + len(ADDED_PANELS)] in ("Reference", INSPECTOR_ROW)
    for p in now["panels"][start + 1:start + 1 + len(ADDED_PANELS)]:
        assert [t["expr"] for t in p["targets"]] == ADDED_PANELS[p["title"]], p["title"]
        assert "{{host}}" in p["targets"][0]["legendFormat"]
    (host,) = [v for v in now["templating"]["list"] if v["name"] == "host"]
    assert host["query"]["query"] == 'label_values(collbench_collector_success{collector=~"rdma_sysfs|ethtool|netstat"}, host)'
    assert host["multi"] and host["includeAll"] and host["allValue"] == ".+"
    assert [v["name"] for v in now["templating"]["list"]][-1] == "host"
    # the legacy dashboard did not change
    assert ADDED_ROW not in {p["title"] for p in build_dashboard(load_config(None), legacy=True)["panels"]}


def _allowed(path):
    return path in DROPPED_BY_THE_SDK or re.sub(r"\[\d+\]", "[]", path) in DROPPED_BY_THE_SDK


@pytest.mark.parametrize("legacy", [False, True])
def test_sdk_dashboard_shows_every_panel_and_query_of_the_hand_built_one(legacy):
    before = json.loads(BEFORE_SDK[legacy].read_text())
    now = without_added(build_dashboard(load_config(None), legacy))
    assert [_panel_facts(p) for p in now["panels"]] == [_panel_facts(p) for p in before["panels"]]
    assert [(v["name"], v["type"], v.get("label"), v.get("query"), v.get("hide")) for v in now["templating"]["list"]] \
        == [(v["name"], v["type"], v.get("label"), v.get("query"), v.get("hide")) for v in before["templating"]["list"]]
    # and nothing else the old file said is lost or changed, beyond the SDK's own defaults
    lost = [p for p in _missing_or_changed(before, now) if not _allowed(p)]
    assert not lost, f"differs from the hand-built dashboard at: {lost}"
    assert now["schemaVersion"] >= before["schemaVersion"]


def test_comparison_sees_a_changed_legend_unit_or_threshold():
    """The comparison above fails when one query's legend, one unit or one threshold moves."""
    before = json.loads(BEFORE_SDK[False].read_text())
    for mutate in (lambda d: d["panels"][2]["targets"][0].update(legendFormat="{{job}}"),
                   lambda d: d["panels"][3]["fieldConfig"]["defaults"].update(unit="ms"),
                   lambda d: d["panels"][3]["fieldConfig"]["defaults"]["thresholds"]["steps"][1].update(value=1),
                   lambda d: d["templating"]["list"][1]["query"].update(query="label_values(up, job)")):
        now = without_added(build_dashboard(load_config(None)))
        mutate(now)
        assert _missing_or_changed(before, now) and \
            not all(_allowed(p) for p in _missing_or_changed(before, now))
