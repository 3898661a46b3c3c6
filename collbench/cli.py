"""The `collbench` console script. Each subcommand lives in its own module and registers itself."""

import argparse
import importlib
import sys

from collbench import __version__
from collbench.errors import UserError

# subcommand -> the module whose register(subparsers) adds it (with set_defaults(func=...))
COMMAND_MODULES = {
    "once": "collbench.once.cli",
    "engine": "collbench.engines.cli",
    "stress": "collbench.stress.cli",
    "exporter": "collbench.exporter.cli",
    "ctl": "collbench.ctl.cli",
    "rules": "collbench.monitoring.rules_cli",
    "dashboard": "collbench.monitoring.dashboard_cli",
    "report": "collbench.report.cli",
    "baseline": "collbench.baseline.cli",
    "topo": "collbench.topo.cli",
    "nccl": "collbench.nccl.cli",
    "sweep": "collbench.sweep.cli",
    "compare": "collbench.compare.cli",
}


def build_parser(argv=None):
    """The parser; with a known subcommand first in argv only its module is imported (start-up
    time matters for the exporter and for remote verbs; paramiko alone costs ~0.1 s)."""
    parser = argparse.ArgumentParser(
        prog="collbench",
        description="MPI collective benchmarks, stress daemon and Prometheus exporter for RDMA clusters.")
    parser.add_argument("--version", action="version", version=f"collbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    first = (sys.argv[1:] if argv is None else argv)[:1]
    names = first if first and first[0] in COMMAND_MODULES else list(COMMAND_MODULES)
    for name in names:
        importlib.import_module(COMMAND_MODULES[name]).register(sub)
    return parser


def main(argv=None):
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except UserError as e:
        print(f"collbench: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("collbench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def add_config_arg(parser):
    parser.add_argument("--config", "-c", metavar="FILE",
                        help="YAML config (default: run on this machine with the embedded defaults)")
