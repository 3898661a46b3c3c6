"""Monitoring generated from the config: what Prometheus alerts on and what Grafana shows.

    rules.py            alerting rules from the thresholds (rules_cli.py: `collbench rules`)
    prometheus_rule.py  the same groups as a Prometheus Operator PrometheusRule resource
    dashboard.py        the Grafana dashboard from one panel table (dashboard_cli.py:
                        `collbench dashboard`, also `python -m collbench.monitoring.dashboard_cli`)
"""
