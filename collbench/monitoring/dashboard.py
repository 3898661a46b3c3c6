"""The Grafana dashboard: one panel table, built with Grafana Labs' typed builders.

`grafana/collbench-dashboard.json` (the exporter's metric names) and
`grafana/collbench-dashboard-legacy.json` (the `mpi_*` names of the prototype this project replaces,
`exporter.legacy_metrics`) are both built here from the same rows; only the result panels differ.
The stat panels' colours come from the thresholds (config or the prototype's defaults), the
reference text from the op table. The rows below say what each panel shows; the last section turns
them into a dashboard with `grafana-foundation-sdk` (Grafana's own schema types, so a field Grafana
does not know cannot be written). `collbench dashboard [--config] [--legacy] [-o FILE]`
(dashboard_cli.py) writes them; the checked-in files are its output for the embedded default config
(tests/test_dashboard.py keeps them equal).
"""

import json
from dataclasses import dataclass, field

from grafana_foundation_sdk.builders import common as sdk_common
from grafana_foundation_sdk.builders import dashboard as sdk
from grafana_foundation_sdk.builders import prometheus as sdk_prometheus
from grafana_foundation_sdk.builders import stat as sdk_stat
from grafana_foundation_sdk.builders import text as sdk_text
from grafana_foundation_sdk.builders import timeseries as sdk_timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_model
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import text as text_model

from collbench.ops import OPS, get_op
from collbench.monitoring.rules import PAUSE_LOST_TIME, XMIT_WAIT_LOST_TIME, seconds_text

SCHEMA_VERSION = model.Dashboard().schema_version   # the SDK's target: Grafana 11.6 (41)
UID = "collbench"
LEGACY_UID = "collbench-legacy"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
GRID_WIDTH = 24

# Selector every panel query starts from: the job and instance variables.
SEL = 'job=~"$job",instance=~"$instance"'
RATE = "$__rate_interval"
FAILURES = "collbench_benchmark_failures_total{" + SEL + "}"
# The per-host rows select by the `host` label (the counters exporters' file_sd targets, and the
# master's exporter in the example prometheus.yml), not by job: every exporter that has one.
HOST_SEL = 'host=~"$host"'
TOP_K = 10          # series per per-host panel: the top k by rate at each point

GREEN, YELLOW, RED = "green", "#EAB839", "red"


@dataclass
class Target:
    expr: str
    legend: str = ""


@dataclass
class Panel:
    """One panel of the table: what it shows and how; layout is computed."""
    title: str
    kind: str                      # timeseries | stat | text
    targets: list = field(default_factory=list)
    description: str = ""
    unit: str = ""
    width: int = 8
    height: int = 8
    thresholds: list = None        # [(value or None, colour)], ascending
    threshold_lines: bool = False  # draw the thresholds on a time series
    mappings: list = None          # [(value, text, colour)]
    repeat: str = None             # variable to repeat the panel over
    log_scale: bool = False
    content: str = ""              # markdown for text panels
    decimals: int = None


@dataclass
class Row:
    title: str
    panels: list


# ---------------------------------------------------------------- variables

_ALL = model.VariableOption(selected=True, text=["All"], value=["$__all"])


def _query_variable(name, label, query, hide=model.VariableHide.DONT_HIDE):
    return (sdk.QueryVariable(name).label(label).datasource(DATASOURCE)
            .query({"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"})
            # on time range change: new ops/sizes appear as the plan changes
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True).include_all(True).all_value(".+").current(_ALL).options([])
            .hide(hide).regex("").sort(model.VariableSort.ALPHABETICAL_ASC))


def _custom_variable(name, label, values):
    return (sdk.CustomVariable(name).label(label).values(",".join(values))
            .multi(True).include_all(True).all_value("|".join(values)).current(_ALL)
            .options([model.VariableOption(selected=False, text=v, value=v) for v in values])
            .hide(model.VariableHide.DONT_HIDE))


def variables(legacy):
    ds = (sdk.DatasourceVariable("datasource").label("Data source").type("prometheus")
          .hide(model.VariableHide.DONT_HIDE).regex("").include_all(False).multi(False))
    if legacy:
        return [
            ds,
            _query_variable("job", "Job", "label_values(mpi_stress_test_running, job)"),
            _query_variable("instance", "Instance", 'label_values(mpi_stress_test_running{job=~"$job"}, instance)'),
            _custom_variable("op", "Op", [op.legacy_name for op in OPS.values() if op.legacy_name]),
            _query_variable("size", "Size",
                            'label_values({__name__=~"mpi_.+_latency_us",' + SEL + "}, size)"),
        ]
    return [
        ds,
        _query_variable("job", "Job", "label_values(collbench_stress_running, job)"),
        _query_variable("instance", "Instance", 'label_values(collbench_stress_running{job=~"$job"}, instance)'),
        _query_variable("op", "Op", "label_values(collbench_latency_avg_seconds{" + SEL + "}, op)"),
        _query_variable("size", "Size",
                        "label_values(collbench_latency_avg_seconds{" + SEL + ',op=~"$op"}, size)'),
        # The ops that have a bus bandwidth (barrier has none): the busbw panel repeats over them.
        _query_variable("bwop", "Bandwidth ops",
                        "label_values(collbench_busbw_bytes_per_second{" + SEL + ',op=~"$op"}, op)',
                        hide=model.VariableHide.HIDE_VARIABLE),
        # every host whose counters reach Prometheus with a host label (docs/SETUP.md, "Counters on every host")
        _query_variable("host", "Host",
                        'label_values(collbench_collector_success{collector=~"rdma_sysfs|ethtool|netstat"}, host)'),
    ]


# ---------------------------------------------------------------- the panel table

def _running_mappings():
    return [(0, "stopped", RED), (1, "running", GREEN)]


def status_row(cfg, legacy):
    stale = cfg.alerts.stale_after
    if legacy:
        return Row("Status", [
            Panel("Stress test", "stat", [Target(f"mpi_stress_test_running{{{SEL}}}", "{{instance}}")],
                  "1 while the stress test runs (legacy name of collbench_stress_running).",
                  mappings=_running_mappings(), width=6, height=4),
            Panel("Iteration", "stat", [Target(f"mpi_stress_test_iteration{{{SEL}}}", "{{instance}}")],
                  "Plan pass of the newest result.", width=6, height=4, decimals=0),
            Panel("Results age", "stat",
                  [Target(f"time() - mpi_benchmark_last_update_timestamp{{{SEL}}}", "{{instance}}")],
                  f"Seconds since the newest result; stale after {seconds_text(stale)} (alerts.stale_after).",
                  unit="s", thresholds=[(None, GREEN), (stale / 2, YELLOW), (stale, RED)], width=6, height=4),
            Panel("Exporter", "stat", [Target(f"up{{{SEL}}}", "{{instance}}")],
                  "Prometheus' scrape of the exporter: up or down.",
                  mappings=[(0, "down", RED), (1, "up", GREEN)], width=6, height=4),
        ])
    return Row("Status", [
        Panel("Stress daemon", "stat", [Target(f"collbench_stress_running{{{SEL}}}", "{{instance}}")],
              "1 while the stress daemon's process is alive (checked at every scrape).",
              mappings=_running_mappings(), width=4, height=4),
        Panel("Iteration", "stat", [Target(f"collbench_stress_iteration{{{SEL}}}", "{{instance}}")],
              "Plan pass of the stress daemon's newest record (from 1).", width=4, height=4, decimals=0),
        Panel("Results age", "stat", [Target(f"collbench_results_age_seconds{{{SEL}}}", "{{instance}}")],
              f"Seconds since the newest result was measured; the ResultsStale alert fires past "
              f"{seconds_text(stale)} (alerts.stale_after).",
              unit="s", thresholds=[(None, GREEN), (stale / 2, YELLOW), (stale, RED)], width=4, height=4),
        Panel("Failures in range", "stat",
              # The exporter creates an op's failure counter at its first failure, which increase()
              # cannot see: a series born in the range counts whole. No failure at all shows 0.
              [Target(f"sum by (instance) (({FAILURES} unless {FAILURES} offset $__range) "
                      f"or increase({FAILURES}[$__range])) "
                      f"or max by (instance) (collbench_stress_running{{{SEL}}}) * 0", "{{instance}}")],
              "Failed benchmark steps (failure records) in the dashboard's time range.",
              thresholds=[(None, GREEN), (1, RED)], width=4, height=4, decimals=0),
        Panel("Last run", "stat", [Target(f"collbench_last_run_success{{{SEL}}}", "{{instance}}")],
              "Whether the newest record is a passing result (ok) or a failure.",
              mappings=[(0, "failed", RED), (1, "ok", GREEN)], width=4, height=4),
        Panel("Firing alerts", "stat",
              [Target('count(ALERTS{alertname=~"Collbench.+",alertstate="firing",' + SEL + "}) or vector(0)")],
              "collbench alerts firing now in Prometheus (see docs/METRICS.md, Alerts).",
              thresholds=[(None, GREEN), (1, RED)], width=4, height=4, decimals=0),
        Panel("Exporter scrape", "stat", [Target(f"up{{{SEL}}}", "{{instance}}")],
              "Prometheus' scrape of the exporter: up or down.",
              mappings=[(0, "down", RED), (1, "up", GREEN)], width=8, height=4),
        Panel("Collectors", "stat", [Target(f"collbench_collector_success{{{SEL}}}", "{{instance}} {{collector}}")],
              "Each collector's last scrape: ok, or failed (the exporter log says why).",
              mappings=[(0, "failed", RED), (1, "ok", GREEN)], width=16, height=4),
    ])


def ordered_thresholds(thresholds):
    """Thresholds.items() in the op table's order, largest size first (the prototype's table order)."""
    order = list(OPS)
    return sorted(thresholds.items(), key=lambda item: (order.index(item[0]), -item[1]))


def key_latency_row(cfg, legacy):
    basis = f"{cfg.alerts.nodes} nodes at {cfg.alerts.link_gbps:g} Gb/s"
    panels = []
    for op_name, _size_bytes, size, warning_us, critical_us in ordered_thresholds(cfg.thresholds):
        op = get_op(op_name)
        if legacy:
            if not op.legacy_name:
                continue
            expr = f'mpi_{op.legacy_name}_latency_us{{{SEL},size="{size}"}}'
            unit, scale = "µs", 1.0
        else:
            expr = f'collbench_latency_avg_seconds{{{SEL},op="{op_name}",size="{size}"}}'
            unit, scale = "s", 1e-6
        w, c = (float(f"{v * scale:.6g}") for v in (warning_us, critical_us))
        panels.append(Panel(
            f"{op.title} {size}", "stat", [Target(expr, "{{instance}}")],
            f"Average latency. Good < {seconds_text(warning_us / 1e6)}, warning "
            f"{seconds_text(warning_us / 1e6)}-{seconds_text(critical_us / 1e6)}, critical > "
            f"{seconds_text(critical_us / 1e6)} ({basis}).",
            unit=unit, thresholds=[(None, GREEN), (w, YELLOW), (c, RED)], width=4, height=4))
    return Row(f"Key latencies ({basis})", panels)


def latency_row(legacy):
    if legacy:
        return Row("Latency", [
            Panel("$op latency by size", "timeseries",
                  [Target(f'mpi_${{op}}_latency_us{{{SEL},size=~"$size"}}', "{{size}} {{instance}}")],
                  "Average latency of each size, one panel per op.", unit="µs", repeat="op",
                  log_scale=True, width=12, height=8),
        ])
    return Row("Latency", [
        Panel("$op latency by size", "timeseries",
              [Target(f'collbench_latency_avg_seconds{{{SEL},op="$op",size=~"$size"}}', "{{size}} {{instance}}")],
              "Average latency of each message size (bytes per rank), one panel per op.",
              unit="s", repeat="op", log_scale=True, width=12, height=8),
        Panel("Slowest rank vs average", "timeseries",
              [Target(f'collbench_latency_max_seconds{{{SEL},op=~"$op",size=~"$size"}} / '
                      f'collbench_latency_avg_seconds{{{SEL},op=~"$op",size=~"$size"}}',
                      "{{op}} {{size}} {{instance}}")],
              "Max over ranks / average: 1 when the ranks agree; a rising ratio: ranks wait for "
              "another (a slow host, NIC or link); `collbench diagnose` names which.", unit="none", width=12, height=8, decimals=2),
    ])


def baseline_row(cfg):
    """Live against the exporter's baseline (exporter.baseline): the regression alert's ratio."""
    ratio = float(cfg.alerts.regression_ratio)
    return Row("vs baseline", [Panel(
        "Latency vs baseline", "timeseries",
        [Target(f'collbench_latency_avg_seconds{{{SEL},op=~"$op",size=~"$size"}} / '
                f'collbench_baseline_latency_seconds{{{SEL},op=~"$op",size=~"$size"}}',
                "{{op}} {{size}} {{instance}}")],
        f"Average latency / the baseline's median (exporter.baseline, saved with `collbench baseline save`), per "
        f"op and size: 1 = as fast as the baseline, 2 = twice as slow. Above {ratio:g} (alerts.regression_ratio, "
        f"the red line) and beyond the baseline's noise, CollbenchLatencyRegression fires. Empty when the "
        f"exporter serves no baseline.",
        unit="none", thresholds=[(None, GREEN), (ratio, RED)], threshold_lines=True, width=12, height=8,
        decimals=2),
        Panel("Bus bandwidth vs baseline", "timeseries",
              [Target(f'collbench_busbw_bytes_per_second{{{SEL},op=~"$op",size=~"$size"}} / '
                      f'collbench_baseline_busbw_bytes_per_second{{{SEL},op=~"$op",size=~"$size"}}',
                      "{{op}} {{size}} {{instance}}")],
              "busbw / the baseline's median busbw, per op and size: below 1 = less bandwidth than when the "
              "baseline was saved (barrier has none). Empty when the exporter serves no baseline.",
              unit="none", width=12, height=8, decimals=2),
    ])


def bandwidth_row(cfg):
    line_rate = cfg.alerts.link_gbps * 1e9 / 8
    return Row("Bandwidth", [
        Panel("$bwop bus bandwidth", "timeseries",
              [Target(f'collbench_busbw_bytes_per_second{{{SEL},op="$bwop",size=~"$size"}}', "{{size}} {{instance}}")],
              f"busbw (nccl-tests): comparable across ops and node counts, and with the line rate "
              f"({cfg.alerts.link_gbps:g} Gb/s, the red line). Large sizes should approach it.",
              unit="Bps", repeat="bwop", thresholds=[(None, GREEN), (line_rate, RED)], threshold_lines=True,
              width=12, height=8),
    ])


def congestion_row(cfg):
    ecn_warning, ecn_critical = cfg.thresholds.ecn_rate
    rdma = f"{{{SEL}}}"
    line_rate = cfg.alerts.link_gbps * 1e9 / 8
    by_port = "sum by (instance, device, port)"
    return Row("Congestion: ECN, CNP, PFC", [
        Panel("ECN-marked packets (RoCE)", "timeseries",
              [Target(f"{by_port} (rate(collbench_rdma_np_ecn_marked_roce_packets_total{rdma}[{RATE}]))",
                      "{{instance}} {{device}}/{{port}}")],
              f"RoCE packets that arrived with ECN Congestion Experienced, per second: a switch queue "
              f"passed its marking threshold. Good < {ecn_warning:g}/s, warning to {ecn_critical:g}/s, critical above.",
              unit="pps", thresholds=[(None, GREEN), (ecn_warning, YELLOW), (ecn_critical, RED)],
              threshold_lines=True, width=8),
        Panel("CNPs sent and handled", "timeseries",
              [Target(f"{by_port} (rate(collbench_rdma_np_cnp_sent_total{rdma}[{RATE}]))",
                      "sent {{instance}} {{device}}/{{port}}"),
               Target(f"{by_port} (rate(collbench_rdma_rp_cnp_handled_total{rdma}[{RATE}]))",
                      "handled {{instance}} {{device}}/{{port}}")],
              "Congestion Notification Packets: sent by this NIC as receiver of marked packets (np), "
              "and received and acted on as sender, slowing down (rp, DCQCN).", unit="pps", width=8),
        Panel("CNPs ignored", "timeseries",
              [Target(f"{by_port} (rate(collbench_rdma_rp_cnp_ignored_total{rdma}[{RATE}]))",
                      "{{instance}} {{device}}/{{port}}")],
              "CNPs the sender received but did not act on: congestion control is off for that "
              "priority or misconfigured. Should stay at 0.", unit="pps", width=8),
        Panel("PFC pause frames by priority", "timeseries",
              [Target(f"sum by (instance, netdev, direction, priority) "
                      f"(rate(collbench_ethtool_pause_frames_total{rdma}[{RATE}]))",
                      "{{instance}} {{netdev}} prio {{priority}} {{direction}}")],
              "Per-priority pause frames, per second: rx = the switch paused this NIC, tx = this NIC "
              "paused the switch (it could not drain its receive buffer).", unit="pps", width=8),
        Panel("Time paused by priority", "timeseries",
              [Target(f"sum by (instance, netdev, direction, priority) "
                      f"(rate(collbench_ethtool_pause_duration_seconds_total{rdma}[{RATE}]))",
                      "{{instance}} {{netdev}} prio {{priority}} {{direction}}")],
              "Share of the time the priority was paused. Above 50% the PfcPausedHigh alert fires: "
              "a pause storm in the making.", unit="percentunit",
              thresholds=[(None, GREEN), (0.5, RED)], threshold_lines=True, width=8),
        Panel("Pause storms and PHY discards", "timeseries",
              [Target(f"sum by (instance, netdev) (increase(collbench_ethtool_pause_storm_warning_events_total{rdma}[{RATE}]))",
                      "storm warning {{instance}} {{netdev}}"),
               Target(f"sum by (instance, netdev) (increase(collbench_ethtool_pause_storm_error_events_total{rdma}[{RATE}]))",
                      "storm error {{instance}} {{netdev}}"),
               Target(f"sum by (instance, netdev) (rate(collbench_ethtool_rx_discards_phy_total{rdma}[{RATE}]))",
                      "rx_discards_phy/s {{instance}} {{netdev}}")],
              "Pause-storm events of the NIC's stall prevention (any is an incident) and packets the "
              "port dropped for lack of buffer (lossless priorities must show none).", width=8),
        Panel("Retransmits and ack timeouts", "timeseries",
              [Target(f"{by_port} (rate(collbench_rdma_{name}_total{rdma}[{RATE}]))", f"{text} {{{{instance}}}} {{{{device}}}}")
               for name, text in (("local_ack_timeout_err", "ack timeout"),
                                  ("packet_seq_err", "NAK sequence error"),
                                  ("out_of_sequence", "out of sequence"),
                                  ("implied_nak_seq_err", "implied NAK"),
                                  ("duplicate_request", "duplicate request"))],
              "Transport recovery, per second: ack timeouts and sequence errors mean the RC transport "
              "retransmitted (drops, or a lossy priority).", unit="pps", width=8),
        Panel("Kernel IP ECN", "timeseries",
              [Target(f"sum by (instance) (rate(collbench_netstat_ip_in_{name}_packets_total{rdma}[{RATE}]))",
                      f"{name.upper()} {{{{instance}}}}") for name in ("ce", "ect0", "ect1")],
              "ECN codepoints of IP packets the kernel received (TCP transports; RoCE bypasses the "
              "kernel): CE = congestion experienced.", unit="pps", width=8),
        Panel("RDMA port traffic", "timeseries",
              [Target(f"{by_port} (rate(collbench_rdma_port_xmit_data_bytes_total{rdma}[{RATE}]))",
                      "tx {{instance}} {{device}}/{{port}}"),
               Target(f"{by_port} (rate(collbench_rdma_port_rcv_data_bytes_total{rdma}[{RATE}]))",
                      "rx {{instance}} {{device}}/{{port}}")],
              f"Bytes per second through the RDMA port, against the line rate ({cfg.alerts.link_gbps:g} Gb/s).",
              unit="Bps", thresholds=[(None, GREEN), (line_rate, RED)], threshold_lines=True, width=8),
    ])


def _top(by, expr):
    # max, not sum: the master's counters can reach Prometheus twice (its full exporter and its
    # counters exporter, both labelled with its host): the same counter, counted once
    return f"topk({TOP_K}, max by ({by}) ({expr}))"


def hosts_congestion_row(cfg):
    """Every host's counters (the counters exporters, `host` label): per host, port and priority,
    the top TOP_K series by rate where there are many."""
    ecn_warning, ecn_critical = cfg.thresholds.ecn_rate
    h = f"{{{HOST_SEL}}}"
    port, prio = "host, device, port", "host, netdev, direction, priority"
    top = f"the {TOP_K} highest at each point in time"
    return Row(f"Congestion on every host (top {TOP_K})", [
        Panel("Host exporters", "stat", [Target(f"min by (host) (up{h})", "{{host}}")],
              "Prometheus' scrape of each host's exporters (down if any of them is).",
              mappings=[(0, "down", RED), (1, "up", GREEN)], width=24, height=3),
        Panel("ECN-marked packets by host and port", "timeseries",
              [Target(_top(port, f"rate(collbench_rdma_np_ecn_marked_roce_packets_total{h}[{RATE}])"),
                      "{{host}} {{device}}/{{port}}")],
              f"RoCE packets received CE-marked, per second, per host and port ({top}): the path INTO "
              f"that host is congested. Lines at the ECN bounds ({ecn_warning:g}/s, {ecn_critical:g}/s).",
              unit="pps", thresholds=[(None, GREEN), (ecn_warning, YELLOW), (ecn_critical, RED)],
              threshold_lines=True, width=8),
        Panel("CNPs handled by host and port", "timeseries",
              [Target(_top(port, f"rate(collbench_rdma_rp_cnp_handled_total{h}[{RATE}])"),
                      "{{host}} {{device}}/{{port}}")],
              f"CNPs received and acted on, per second ({top}): that host SENDS into a congested path "
              "and slowed down (DCQCN).", unit="pps", width=8),
        Panel("Kernel IP CE by host", "timeseries",
              [Target(_top("host", f"rate(collbench_netstat_ip_in_ce_packets_total{h}[{RATE}])"), "{{host}}")],
              f"CE-marked IP packets the host's kernel received, per second ({top}; TCP transports).",
              unit="pps", width=8),
        Panel("PFC pause frames by host and priority", "timeseries",
              [Target(_top(prio, f"rate(collbench_ethtool_pause_frames_total{h}[{RATE}])"),
                      "{{host}} {{netdev}} prio {{priority}} {{direction}}")],
              f"Per-priority pause frames per second ({top}): rx = the switch paused this host's port, "
              "tx = this host paused the switch.", unit="pps", width=8),
        Panel("Lost link time: paused, by host and priority", "timeseries",
              [Target(_top(prio, f"{PAUSE_LOST_TIME}{h}"), "{{host}} {{netdev}} prio {{priority}} {{direction}}")],
              f"Fraction of each scrape interval the priority was paused (recording rule {PAUSE_LOST_TIME}; "
              f"{top}). rx: this port could not send.", unit="percentunit",
              thresholds=[(None, GREEN), (0.5, RED)], threshold_lines=True, width=8),
        Panel("Lost link time: xmit_wait, by host and port", "timeseries",
              [Target(_top(port, f"{XMIT_WAIT_LOST_TIME}{h}"), "{{host}} {{device}}/{{port}}")],
              f"Fraction of each scrape interval the port had data and sent nothing (port_xmit_wait x "
              f"its tick, recording rule {XMIT_WAIT_LOST_TIME}; {top}). An estimate: the tick depends "
              "on the NIC generation (docs/METRICS.md).", unit="percentunit",
              thresholds=[(None, GREEN), (0.5, RED)], threshold_lines=True, width=8),
    ])


def inspector_row(cfg):
    """A production job's collectives (NCCL Inspector records, the exporters' inspector collector;
    docs/INSPECTOR.md) beside the stress loop's: per op, size bucket and communicator."""
    h = f'{{{HOST_SEL},op=~"$op"}}'
    by = "op, size, comm_name"
    return Row("Production job (NCCL Inspector)", [
        Panel("Job collective latency p99", "timeseries",
              [Target(f'max by ({by}) (collbench_inspector_latency_seconds{{{HOST_SEL},op=~"$op",quantile="0.99"}})',
                      "{{op}} {{size}} {{comm_name}}")],
              "The 99th percentile over exporter.inspector_window of the job's per-rank collective times (the "
              "Inspector's coll_exec_time_us), the highest over hosts. Sizes are collbench's (bytes per rank), in "
              "power-of-two buckets.", unit="s", log_scale=True, width=12),
        Panel("Job bus bandwidth", "timeseries",
              [Target(f"min by ({by}) (collbench_inspector_busbw_bytes_per_second{h})", "{{op}} {{size}} {{comm_name}}")],
              "Median busbw of the job's collectives (collbench's bus factors), the lowest over hosts: compare with "
              "the stress loop's bandwidth above.", unit="Bps", width=12),
        Panel("Slowest host per collective", "timeseries",
              [Target(f"topk({TOP_K}, max by ({by}, slowest_host) (collbench_inspector_slowest_host_latency_seconds{h}))",
                      "{{slowest_host}}: {{op}} {{size}} {{comm_name}}")],
              "The median time of the host whose ranks are slowest, per collective (a rank that waits in the kernel "
              "for a late peer is slow too: `collbench import nccl-inspector` names the rank the others waited for).",
              unit="s", width=8),
        Panel("Job latency shift", "stat",
              [Target(f"max by ({by}) (collbench_inspector_latency_shift{h})", "{{op}} {{size}} {{comm_name}}")],
              "1: the collective's latency shifted up and stayed up (the change-point test of the stress loop's "
              "shift panel); CollbenchInspectorLatencyShift names the suspect host.",
              mappings=[(0, "steady", GREEN), (1, "shifted", RED)], width=8),
        Panel("Age of the newest Inspector record", "stat",
              [Target(f"max by (host) (collbench_inspector_newest_record_age_seconds{{{HOST_SEL}}})", "{{host}}")],
              "Seconds since the newest record was dumped, per host: grows when the job stopped or the plugin's dump "
              "thread is off (NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS).", unit="s",
              thresholds=[(None, GREEN), (300, YELLOW)], width=8),
    ])


def reference_text(cfg):
    lines = ["#### What each collective means for training", "",
             "| Op | Training use | busbw factor |", "|---|---|---|"]
    for op in OPS.values():
        lines.append(f"| {op.title} | {op.training_use} | {op.bus_factor_formula} |")
    lines += ["", "Allreduce is the critical path: it runs every training step.", "",
              f"#### What good looks like ({cfg.alerts.nodes} nodes at {cfg.alerts.link_gbps:g} Gb/s)", "",
              "| Metric | Good | Warning | Critical |", "|---|---|---|---|"]
    for op_name, _b, size, w, c in ordered_thresholds(cfg.thresholds):
        w_s, c_s = seconds_text(w / 1e6), seconds_text(c / 1e6)
        lines.append(f"| {get_op(op_name).title} {size} | < {w_s} | {w_s}-{c_s} | > {c_s} |")
    ew, ec = cfg.thresholds.ecn_rate
    lines.append(f"| ECN rate | < {ew:g}/s | {ew:g}-{ec:g}/s | > {ec:g}/s |")
    lines += ["", "Sizes are bytes per rank (OSU). Panels and alerts: docs/METRICS.md."]
    return "\n".join(lines)


def reference_row(cfg):
    return Row("Reference", [Panel("What the ops mean", "text", content=reference_text(cfg),
                                   width=24, height=14)])


def rows(cfg, legacy):
    if legacy:
        return [status_row(cfg, True), key_latency_row(cfg, True), latency_row(True),
                congestion_row(cfg), reference_row(cfg)]
    return [status_row(cfg, False), key_latency_row(cfg, False), latency_row(False), baseline_row(cfg),
            bandwidth_row(cfg), congestion_row(cfg), hosts_congestion_row(cfg), inspector_row(cfg), reference_row(cfg)]


# ---------------------------------------------------------------- Grafana, through the SDK

def _thresholds(steps):
    return (sdk.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE)
            .steps([model.Threshold(value=value, color=colour) for value, colour in steps]))


def _mappings(mappings):
    return [model.ValueMap(options={str(v): model.ValueMappingResult(text=text, color=colour, index=i)
                                    for i, (v, text, colour) in enumerate(mappings)})]


def _query(p, i, t):
    q = (sdk_prometheus.Dataquery().datasource(DATASOURCE).ref_id(chr(ord("A") + i)).expr(t.expr)
         .legend_format(t.legend or "__auto"))
    return q.range() if p.kind == "timeseries" else q.instant()


def _timeseries(p):
    scale = sdk_common.ScaleDistributionConfig()
    scale = scale.type(common_model.ScaleDistribution.LOG).log(10) if p.log_scale \
        else scale.type(common_model.ScaleDistribution.LINEAR)
    line_mode = common_model.GraphThresholdsStyleMode.LINE if p.threshold_lines \
        else common_model.GraphThresholdsStyleMode.OFF
    return (sdk_timeseries.Panel()
            .color_scheme(sdk.FieldColor().mode(model.FieldColorModeId.PALETTE_CLASSIC))
            .draw_style(common_model.GraphDrawStyle.LINE).line_width(1).fill_opacity(0)
            .show_points(common_model.VisibilityMode.AUTO).span_nulls(True)
            .thresholds_style(sdk_common.GraphThresholdsStyleConfig().mode(line_mode))
            .scale_distribution(scale)
            .legend(sdk_common.VizLegendOptions().display_mode(common_model.LegendDisplayMode.LIST)
                    .placement(common_model.LegendPlacement.BOTTOM).show_legend(True))
            .tooltip(sdk_common.VizTooltipOptions().mode(common_model.TooltipDisplayMode.MULTI)
                     .sort(common_model.SortOrder.DESCENDING)))


def _stat(p):
    return (sdk_stat.Panel()
            .color_scheme(sdk.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
            .reduce_options(sdk_common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
            .color_mode(common_model.BigValueColorMode.BACKGROUND)
            .graph_mode(common_model.BigValueGraphMode.NONE)
            .text_mode(common_model.BigValueTextMode.AUTO)
            .justify_mode(common_model.BigValueJustifyMode.AUTO)
            .orientation(common_model.VizOrientation.AUTO))


def panel_builder(p, pid, pos):
    """The SDK builder of one table panel, with its id and place on the grid."""
    if p.kind == "text":
        b = sdk_text.Panel().mode(text_model.TextMode.MARKDOWN).content(p.content)
    else:
        b = _timeseries(p) if p.kind == "timeseries" else _stat(p)
        b = (b.datasource(DATASOURCE).targets([_query(p, i, t) for i, t in enumerate(p.targets)])
             .unit(p.unit or "short").thresholds(_thresholds(p.thresholds or [(None, GREEN)]))
             .mappings(_mappings(p.mappings) if p.mappings else []))
        if p.decimals is not None:
            b = b.decimals(p.decimals)
        if p.repeat:
            b = b.repeat(p.repeat).repeat_direction("h").max_per_row(GRID_WIDTH // p.width)
    return b.id(pid).title(p.title).description(p.description).grid_pos(model.GridPos(**pos))


def build(cfg, legacy=False):
    """The dashboard as the SDK's typed model (model.Dashboard)."""
    title = "collbench: MPI collectives and RDMA congestion"
    d = (sdk.Dashboard(title + (" (legacy mpi_* metrics)" if legacy else ""))
         .uid(LEGACY_UID if legacy else UID)
         .description("MPI collective latency and bandwidth from the collbench stress daemon, with the "
                      "RoCE congestion counters (ECN, CNP, PFC) read by the collbench exporter.")
         .tags(["collbench", "mpi", "rdma"] + (["legacy"] if legacy else []))
         .version(1).editable().tooltip(model.DashboardCursorSync.CROSSHAIR)
         .time("now-6h", "now").refresh("1m").timezone("").fiscal_year_start_month(0).live_now(False)
         .week_start("").timepicker(sdk.TimePicker())
         .link(sdk.DashboardLink("collbench").type(model.DashboardLinkType.DASHBOARDS).tags(["collbench"])
               .as_dropdown(True).include_vars(True).keep_time(True))
         .annotation(sdk.AnnotationQuery().built_in(1).name("Annotations & Alerts").type("dashboard")
                     .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
                     .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)"))
         .variables(variables(legacy)))
    # Rows stay open (Grafana strips the panels of an open row), so each panel follows its row on
    # the top level. Placed here, left to right, a new line when the next panel would not fit.
    pid, y = 1, 0
    for row in rows(cfg, legacy):
        d = d.with_row(sdk.Row(row.title).id(pid).collapsed(False)
                       .grid_pos(model.GridPos(h=1, w=GRID_WIDTH, x=0, y=y)))
        pid, y, x, line_h = pid + 1, y + 1, 0, 0
        for p in row.panels:
            if x + p.width > GRID_WIDTH:
                x, y, line_h = 0, y + line_h, 0
            d = d.with_panel(panel_builder(p, pid, {"h": p.height, "w": p.width, "x": x, "y": y}))
            pid, x, line_h = pid + 1, x + p.width, max(line_h, p.height)
        y += line_h
    return d.build()


def build_dashboard(cfg, legacy=False):
    """The dashboard JSON as a dict (what Grafana reads)."""
    return json.loads(json.dumps(build(cfg, legacy), cls=JSONEncoder))


def render(cfg, legacy=False):
    return json.dumps(build_dashboard(cfg, legacy), indent=2, ensure_ascii=False) + "\n"
