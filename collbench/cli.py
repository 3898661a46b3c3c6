"""The `collbench` console script. Each subcommand lives in its own module and registers itself."""

import argparse
import importlib
import sys

from collbench import __version__
from collbench.errors import UserError

# module -> it defines register(subparsers), adding its parser(s) with set_defaults(func=...)
COMMAND_MODULES = (
    "collbench.once",
    "collbench.engine_build",
    "collbench.stress.cli",
    "collbench.exporter.cli",
    "collbench.ctl.cli",
    "collbench.rules",
)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="collbench",
        description="MPI collective benchmarks, stress daemon and Prometheus exporter for RDMA clusters.")
    parser.add_argument("--version", action="version", version=f"collbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv=None):
    parser = build_parser()
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
