"""`collbench dashboard`: write the Grafana dashboard JSON (also `python -m collbench.monitoring.dashboard_cli`)."""

import argparse
import sys

from collbench.atomic_file import write_output
from collbench.cli import add_config_arg
from collbench.config import load_config
from collbench.errors import UserError


def _run(args):
    # the SDK's models take ~50 ms to import: only when a dashboard is written, not for --help
    from collbench.monitoring.dashboard import render
    write_output(args.output, render(load_config(args.config), args.legacy))
    return 0


def register(subparsers):
    p = subparsers.add_parser(
        "dashboard", help="write the Grafana dashboard JSON (thresholds from the config)",
        description="Write the collbench Grafana dashboard (file-provisionable JSON, fixed uid) with "
                    "the stat panels coloured by the config's thresholds.")
    add_config_arg(p)
    p.add_argument("--legacy", action="store_true",
                   help="the variant for the prototype's mpi_* metric names (exporter.legacy_metrics)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (atomically) instead of stdout")
    p.set_defaults(func=_run)


def main(argv=None):
    """`python -m collbench.monitoring.dashboard_cli [--config] [--legacy] [-o]`, the same as `collbench dashboard`."""
    parser = argparse.ArgumentParser(prog="python -m collbench.monitoring.dashboard_cli")
    register(parser.add_subparsers())
    args = parser.parse_args(["dashboard"] + list(sys.argv[1:] if argv is None else argv))
    try:
        return args.func(args)
    except UserError as e:
        print(f"collbench: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
