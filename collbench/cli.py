"""The `collbench` console script. Each subcommand lives in its own module and registers itself."""

import argparse
import errno
import importlib
import io
import os
import sys

from collbench import __version__
from collbench.bounded_repr import bounded_lines, terminal_safe
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
    "scrape-config": "collbench.monitoring.scrape_config_cli",
    "report": "collbench.report.cli",
    "baseline": "collbench.baseline.cli",
    "diagnose": "collbench.diagnose.cli",
    "locate": "collbench.locate.cli",
    "doctor": "collbench.doctor.cli",
    "topo": "collbench.topo.cli",
    "nccl": "collbench.nccl.cli",
    "sweep": "collbench.sweep.cli",
    "compare": "collbench.compare.cli",
    "import": "collbench.import_results.cli",
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


class IntermixedArgumentParser(argparse.ArgumentParser):
    """A verb's parser that takes options between positionals (`baseline compare NAME --state-dir D
    results.jsonl`): plain argparse stops filling `RESULTS...` at the first option and calls what
    follows "unrecognized". For verbs without sub-verbs (add_subparsers(parser_class=...))."""

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._intermixing:  # parse_known_intermixed_args calls back in here
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def main(argv=None):
    saved = sys.stdout, sys.stdin
    out = sys.stdout = _WatchedStdout(sys.stdout if sys.stdout is not None else _ClosedStream("output"))
    if sys.stdin is None:
        sys.stdin = _ClosedStream("input")
    try:
        return _run(argv, out)
    finally:
        sys.stdout, sys.stdin = saved if saved[0] is not None else (out.stream, saved[1])


def _run(argv, out):
    try:
        try:
            parser = build_parser(argv)
            args = parser.parse_args(argv)
            code = args.func(args) or 0
        except UserError as e:  # its text may quote a file's bytes: shown, never obeyed by the terminal
            # and bounded: a value it quotes (a path, a flag) may be any length
            print(f"collbench: error: {terminal_safe(bounded_lines(str(e)), one_line=False)}", file=sys.stderr)
            code = e.exit_code
        except KeyboardInterrupt:
            print("collbench: interrupted", file=sys.stderr)
            code = 130
        except SystemExit:  # argparse's --help and usage errors: their output must reach stdout too
            out.flush()
            if out.failed is None:
                raise
            raise out.failed from None  # argparse swallows a failed write; it is reported below
        out.flush()  # a full or closed stdout fails here, not at exit after the message
        return code
    except BrokenPipeError:
        _stdout_gone()
        return 0  # a reader that stopped early (| head) is not an error
    except OSError as e:
        if out.failed is None:
            raise
        _stdout_gone()
        print(f"collbench: error: cannot write to standard output: {out.failed.strerror or out.failed}",
              file=sys.stderr)
        return 1


class _WatchedStdout:
    """sys.stdout, remembering whether a write to it failed, so a full disk, /dev/full or a
    closed descriptor under stdout is told apart from another OSError (and reported as one
    clear line, not a traceback at exit)."""

    def __init__(self, stream):
        self.stream = stream
        self.failed = None

    def _watch(self, fn, *args):
        try:
            return fn(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            self.failed = e
            raise

    def write(self, text):
        return self._watch(self.stream.write, text)

    def flush(self):
        return self._watch(self.stream.flush)

    @property
    def buffer(self):
        return _WatchedBuffer(self.stream.buffer, self)

    def __getattr__(self, name):
        return getattr(self.stream, name)


class _WatchedBuffer:
    def __init__(self, buffer, watched):
        self.raw_buffer = buffer
        self.watched = watched

    def write(self, data):
        return self.watched._watch(self.raw_buffer.write, data)

    def flush(self):
        return self.watched._watch(self.raw_buffer.flush)

    def __getattr__(self, name):
        return getattr(self.raw_buffer, name)


class _ClosedStream(io.TextIOBase):
    """Stands in for a standard stream the shell closed (`>&-`, `<&-`): any use is an OSError
    naming it, which main and the verbs report, instead of an AttributeError on None."""

    def __init__(self, name):
        super().__init__()
        self.stream_name = name
        self.buffer = self

    def _closed(self, *args, **kwargs):
        raise OSError(errno.EBADF, f"standard {self.stream_name} is closed")

    write = read = readline = readinto = read1 = fileno = _closed

    def readable(self):
        return self.stream_name == "input"

    def writable(self):
        return self.stream_name == "output"

    def flush(self):
        pass


def _stdout_gone():
    """Point fd 1 at /dev/null so the interpreter's flush at exit cannot print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def add_config_arg(parser):
    parser.add_argument("--config", "-c", metavar="FILE",
                        help="YAML config (default: run on this machine with the embedded defaults)")
