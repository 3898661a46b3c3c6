"""`collbench rules`: write the alerting rules (a rules file, or a PrometheusRule resource)."""

import argparse

from collbench.atomic_file import write_output
from collbench.bounded_repr import bounded_repr
from collbench.cli import add_config_arg
from collbench.config import POS_FLOAT, POS_INT, check_flag, int_flag, load_config
from collbench.monitoring.rules import basis_text, build_rules, render


def _run(args):
    cfg = load_config(args.config)
    for flag, kind, value in (("--nodes", POS_INT, args.nodes), ("--link-gbps", POS_FLOAT, args.link_gbps)):
        if value is not None:
            check_flag(flag, kind, value)   # as alerts.nodes / alerts.link_gbps: finite, in range
    if args.format == "prometheusrule":   # the same groups in the Prometheus Operator's resource
        from collbench.monitoring import prometheus_rule
        text = prometheus_rule.render(build_rules(cfg, args.nodes, args.link_gbps),
                                      basis_text(cfg, args.nodes, args.link_gbps), source_name=args.config,
                                      name=args.name, namespace=args.namespace,
                                      labels=prometheus_rule.parse_labels(args.label))
    else:
        text = render(cfg, args.nodes, args.link_gbps, source_name=args.config)
    # atomically: Prometheus reloading mid-write never sees half a file
    write_output(args.output, text)
    return 0


def _positive_int(text):
    try:
        return int_flag(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"got {bounded_repr(text)}, expected a whole number of nodes") from None


def register(subparsers):
    p = subparsers.add_parser(
        "rules", help="write Prometheus alerting rules from the config's thresholds",
        description="Write Prometheus alerting rules (latency per op and size, exporter health, "
                    "ECN/CNP/PFC congestion) built from the config's thresholds and alerts sections.")
    add_config_arg(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write here (atomically) instead of stdout")
    p.add_argument("--nodes", type=_positive_int, metavar="N",
                   help="rescale the latency bounds from alerts.nodes to N nodes (bandwidth-bound sizes)")
    p.add_argument("--link-gbps", type=float, metavar="G",
                   help="rescale the latency bounds from alerts.link_gbps to G Gb/s (bandwidth-bound sizes)")
    p.add_argument("--format", choices=("rules", "prometheusrule"), default="rules",
                   help="rules: a Prometheus rules file (default); prometheusrule: a Prometheus "
                        "Operator PrometheusRule resource for Kubernetes")
    p.add_argument("--name", default="collbench", help="prometheusrule: metadata.name (default collbench)")
    p.add_argument("--namespace", help="prometheusrule: metadata.namespace (default: none, kubectl's)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="prometheusrule: a metadata label, e.g. release=prometheus for the "
                        "Operator's ruleSelector (repeatable)")
    p.set_defaults(func=_run)
