"""The layout refactor (issue 10) changes no behaviour a user or a scraper can see.

The fixtures under tests/fixtures/layout-contract/ were captured from the tree before the
refactor: the `--help` text of every command and subcommand registered in collbench/cli.py,
and the metric names (with their label names) of one exporter scrape of a results log with
results, a barrier and a failure, fixture sysfs/procfs/ethtool trees and legacy names on.

A CLI change that is meant (a new flag, a new verb) regenerates them, in the same commit:
    .venv/bin/python tests/test_layout_contract.py --update

Also: the package's layout rules, checked by grep and by the import graph, so they stay true:
no engine-name branch outside collbench/engines/ (`engine == "<any name>"`), no process-group
signalling outside collbench/proctree.py, no signal handler installed outside collbench/signals.py,
and imports point down: shared modules and engines
never import a verb, a verb never imports another verb (what two verbs share moves into a
shared module), config/ never imports engines/ (the engines register under the config's names),
and no module imports, through any chain, one that imports it back. Imports are read at any
depth of a file (a function-level import counts) and in both forms (`from . import x` counts).
Each rule has a self-test that shows it can fail.
"""

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from conftest import FIXTURES, REPO  # noqa: E402

CONTRACT = FIXTURES / "layout-contract"
HELP_WIDTH = "100"   # argparse wraps at $COLUMNS: fixed so the text does not depend on the terminal
SYSFS = str(FIXTURES / "sysfs-mlx5")
FAKE_ETHTOOL = str(FIXTURES / "ethtool" / "fake_ethtool")
PROCFS = str(FIXTURES / "procfs")


def _subparser_choices(parser):
    for action in parser._actions:   # argparse has no public API to list subcommands
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def help_texts():
    """{"collbench once": help text, ...} for the top-level parser and every (sub)subcommand."""
    from collbench.cli import build_parser
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        texts = {}

        def walk(name, parser):
            texts[name] = parser.format_help()
            for sub_name, sub in _subparser_choices(parser).items():
                walk(f"{name} {sub_name}", sub)

        walk("collbench", build_parser([]))
        return texts
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def scrape_metric_names(tmp_dir, port):
    """{metric sample name: sorted label names} of one scrape of a real exporter subprocess."""
    from exporter_helpers import ExporterProcess, append, failure_line, parse_exposition, result_line
    log = Path(tmp_dir) / "results.jsonl"
    now = time.time()
    append(log, result_line(1, ts=now) + result_line(2, op="barrier", size_bytes=0, ts=now)
           + result_line(3, op="bcast", size_bytes=1 << 20, ts=now)
           + result_line(4, op="reduce_scatter", size_bytes=1 << 20, ts=now) + failure_line(5, ts=now)
           + _with_congestion(result_line(6, op="alltoall", size_bytes=1 << 20, ts=now)))
    with ExporterProcess(["--results-log", str(log), "--state-dir", str(tmp_dir), "--sysfs-root", SYSFS,
                          "--procfs-root", PROCFS, "--ethtool", FAKE_ETHTOOL, "--legacy-metrics"], port) as ex:
        ex.wait_ready(timeout=60)
        _, _, text = ex.get()
    names = {}
    for name, labels in parse_exposition(text):
        if name.startswith(("collbench_", "mpi_")):
            names.setdefault(name, set()).update(k for k, _ in labels)
    return {name: sorted(labels) for name, labels in sorted(names.items())}


def _with_congestion(line):
    """A result whose step moved a host's ECN counter: the congestion_top collector's series."""
    rec = json.loads(line)
    rec["congestion"] = {"source": "engine", "t_start": rec["ts"] - 1, "t_end": rec["ts"],
                         "moved": {"h2|TCPDeliveredCE@netstat": 100, "h1|InCEPkts@netstat": 100}}
    return json.dumps(rec) + "\n"


def _help_file(name):
    return CONTRACT / "help" / (name.replace(" ", "_") + ".txt")


def write_fixtures():
    import socket
    import tempfile
    (CONTRACT / "help").mkdir(parents=True, exist_ok=True)
    for old in (CONTRACT / "help").glob("*.txt"):
        old.unlink()
    texts = help_texts()
    for name, text in texts.items():
        _help_file(name).write_text(text, encoding="utf-8")
    (CONTRACT / "commands.json").write_text(json.dumps(sorted(texts), indent=1) + "\n", encoding="utf-8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        metrics = scrape_metric_names(tmp, port)
    (CONTRACT / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(texts)} help texts and {len(metrics)} metric names to {CONTRACT}")


# --- the tests --------------------------------------------------------------------------------

def test_every_command_help_is_unchanged():
    expected_commands = json.loads((CONTRACT / "commands.json").read_text(encoding="utf-8"))
    texts = help_texts()
    assert sorted(texts) == expected_commands, "commands added or gone (a meant change: --update)"
    assert len(expected_commands) > 20          # the walk found the subcommands, not just the top
    changed = [name for name in expected_commands if texts[name] != _help_file(name).read_text(encoding="utf-8")]
    assert changed == [], "help text changed (a meant change: --update)"


def test_cli_help_in_a_subprocess_matches(collbench_cmd):
    """The console entry (python -m collbench, which imports one verb module) prints the same text."""
    import subprocess
    env = {**os.environ, "COLUMNS": HELP_WIDTH}
    for name in ("collbench", "collbench once", "collbench stress start", "collbench engine build",
                 "collbench exporter", "collbench ctl servers", "collbench rules"):
        r = subprocess.run([*collbench_cmd, *name.split()[1:], "--help"], capture_output=True, text=True,
                           env=env, cwd=str(REPO), timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout == _help_file(name).read_text(encoding="utf-8"), name


def test_scrape_metric_names_are_unchanged(tmp_path, free_port):
    expected = json.loads((CONTRACT / "metrics.json").read_text(encoding="utf-8"))
    got = scrape_metric_names(tmp_path, free_port)
    assert "collbench_latency_avg_seconds" in got and "mpi_allreduce_latency_us" in got
    assert got == expected


# --- layout rules, by grep ----------------------------------------------------------------------

PACKAGE = REPO / "collbench"


def _python_sources(exclude=()):
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not any(rel == e or rel.startswith(e.rstrip("/") + "/") for e in exclude):
            yield rel, path.read_text(encoding="utf-8")


def _engine_names():
    from collbench.engines import NAMES
    return NAMES


def engine_branch_pattern(names):
    """A comparison with an engine's name: `engine == "..."` (any string: a name added later is
    caught too), `cfg.engine != 'builtin'`, `.name in ("osu", ...)`, `"osu" == engine`."""
    known = "|".join(re.escape(n) for n in names)
    return re.compile(r"""engine\w*\s*(==|!=|\bin\b|\bnot in\b)\s*[\(\[{]?\s*["'][^"']*["']"""
                      r"""|\.name\s*(==|!=|\bin\b|\bnot in\b)\s*[\(\[{]?\s*["'](""" + known + r""")["']"""
                      r"""|["'][^"']*["']\s*(==|!=)\s*[\w.]*engine""")


def test_no_engine_name_branch_outside_engines():
    branch = engine_branch_pattern(_engine_names())
    offenders = [f"{rel}:{n}: {line.strip()}"
                 for rel, text in _python_sources(exclude=("engines/",))
                 for n, line in enumerate(text.splitlines(), 1) if branch.search(line)]
    assert offenders == []


def test_engine_branch_pattern_catches_a_branch():
    # the grep above can fail: it finds the forms the refactors removed, for any engine's name
    branch = engine_branch_pattern(_engine_names())
    for line in ('if cfg.engine == "osu":', "if engine != 'builtin':", 'if args.engine in ("osu", "x"):',
                 'elif "osu" == engine:', 'if args.engine == "nccl-tests":', 'if cfg.engine == "a-new-one":',
                 'if self.engine.name == "nccl-tests":', 'if "nccl-tests" != args.engine:'):
        assert branch.search(line), line
    for line in ('engine = get_engine(cfg.engine)', 'return RUNS[args.engine](args)',
                 'per_element = ts * n if ours.name == "reduce_scatter" else ts'):
        assert not branch.search(line), line


def test_process_group_signalling_only_in_proctree():
    offenders = [f"{rel}:{n}: {line.strip()}"
                 for rel, text in _python_sources(exclude=("proctree.py",))
                 for n, line in enumerate(text.splitlines(), 1)
                 if re.search(r"\bkillpg\b", line)]
    assert offenders == []
    assert "killpg" in (PACKAGE / "proctree.py").read_text(encoding="utf-8")


SIGNAL_HANDLERS_PENDING = set()   # files allowed their own signal.signal() call: none
INSTALLS_A_HANDLER = re.compile(r"\bsignal\.signal\s*\(")


def signal_handler_offenders(sources, pending=()):
    """Where a handler is installed outside collbench/signals.py (the one place that says what
    each kind of process does on SIGTERM and Ctrl-C)."""
    return [f"{rel}:{n}: {line.strip()}" for rel, text in sources if rel != "signals.py" and rel not in pending
            for n, line in enumerate(text.splitlines(), 1) if INSTALLS_A_HANDLER.search(line)]


def test_signal_handlers_only_in_signals():
    assert signal_handler_offenders(_python_sources(), SIGNAL_HANDLERS_PENDING) == []
    assert INSTALLS_A_HANDLER.search((PACKAGE / "signals.py").read_text(encoding="utf-8"))


def test_signal_handler_rule_catches_a_handler():
    sources = [("stress/daemon.py", "    signal.signal(signal.SIGTERM, on_term)\n"),
               ("signals.py", "previous = signal.signal(s, handler)\n"),
               ("ctl/agent.py", "signals.install(signals.AGENT, stop)\nsignal.alarm(3)\n")]
    assert signal_handler_offenders(sources) == ["stress/daemon.py:1: signal.signal(signal.SIGTERM, on_term)"]


# --- import direction ----------------------------------------------------------------------------

# A verb is a package that holds a command (collbench/cli.py's COMMAND_MODULES); every other
# package (config, engines, results, harness, ...) and every top-level module is shared. The
# `engine` command lives in engines/, a shared package: engines never import a verb.
SHARED_PACKAGES = {"engines"}


def _module_of(rel):
    """collbench.x.y of a source path relative to the package ("x/y.py", "x/__init__.py")."""
    parts = ["collbench"] + rel[:-len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(rel, text):
    """(line, dotted name) for every collbench name a source imports, at any depth in the file
    (function-level imports too), relative imports resolved against the file's package:
    `from collbench.x import y` and `from ..x import y` both give collbench.x.y."""
    import ast
    here = _module_of(rel).split(".")
    package = here if rel.endswith("__init__.py") else here[:-1]
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return [(line, name) for line, name in out if name.startswith("collbench.")]


def _imported_packages(rel, text):
    """(line, package) for every `collbench.<package>` a source imports."""
    return [(line, name.split(".")[1]) for line, name in _imports(rel, text)]


def import_direction_violations(sources, verbs):
    """Shared modules and engines never import a verb; a verb never imports another verb;
    config/ never imports engines/."""
    bad = []
    for rel, text in sources:
        parts = rel.split("/")
        home = parts[0] if len(parts) > 1 else None
        for line, pkg in _imported_packages(rel, text):
            if home == "config" and pkg == "engines":
                bad.append(f"{rel}:{line}: config imports engines (an engine registers under the config's names)")
            if pkg not in verbs or pkg == home:
                continue
            who = f"verb {home}" if home in verbs else "shared module"
            bad.append(f"{rel}:{line}: {who} imports verb {pkg}")
    return bad


def import_cycles(sources):
    """Every set of modules that import each other through some chain (Tarjan's strongly
    connected components of the import graph), each sorted; [] when the graph has no cycle."""
    sources = dict(sources)
    modules = {_module_of(rel): rel for rel in sources}

    def target(name):
        while name and name not in modules:     # collbench.x.y.attr -> collbench.x.y
            name = name.rpartition(".")[0]
        return name

    graph = {m: {t for _, n in _imports(rel, sources[rel]) for t in [target(n)] if t and t != m}
             for m, rel in modules.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def _verbs():
    from collbench.cli import COMMAND_MODULES
    return {m.split(".")[1] for m in COMMAND_MODULES.values()} - SHARED_PACKAGES


def test_imports_point_down():
    verbs = _verbs()
    assert {"once", "sweep", "compare", "topo", "nccl", "stress", "report", "baseline"} <= verbs
    assert import_direction_violations(_python_sources(), verbs) == []


def test_import_direction_rule_catches_a_wrong_arrow():
    verbs = {"once", "sweep", "topo"}
    sources = [("sweep/cli.py", "def run():\n    from collbench.once.cli import x\n"),
               ("engines/rank_order.py", "from collbench.topo import order_files\n"),
               ("tables.py", "import collbench.sweep.plan\n"),
               ("results/x.py", "from collbench import once\n"),
               ("sweep/plan.py", "from collbench import harness\nfrom collbench.sweep import table\n"),
               ("topo/cli.py", "from collbench.engines import launcher\n"),
               ("sweep/table.py", "from . import plan\nfrom .plan import x\n"),
               ("topo/heat.py", "def f():\n    from ..once import cli\n"),
               ("results/y.py", "from .. import sweep\n"),
               ("config/schema.py", "from collbench.engines import NAMES\n"),
               ("config/model.py", "def f():\n    from ..engines import launcher\n")]
    assert import_direction_violations(sources, verbs) == [
        "sweep/cli.py:2: verb sweep imports verb once",
        "engines/rank_order.py:1: shared module imports verb topo",
        "tables.py:1: shared module imports verb sweep",
        "results/x.py:1: shared module imports verb once",
        "topo/heat.py:2: verb topo imports verb once",
        "results/y.py:1: shared module imports verb sweep",
        "config/schema.py:1: config imports engines (an engine registers under the config's names)",
        "config/model.py:2: config imports engines (an engine registers under the config's names)"]


def test_no_import_cycles():
    assert import_cycles(_python_sources()) == []


def test_import_cycle_rule_catches_a_cycle():
    # the four shapes the tree had: a function-level import back, a relative one, a package's
    # __init__ in the loop, and a longer chain
    sources = [("compare/cli.py", "def run(a):\n    from collbench.compare import nccl_compare\n"),
               ("compare/nccl_compare.py", "def run(a):\n    from . import cli\n"),
               ("ctl/__init__.py", "from collbench.ctl.deploy import x\n"),
               ("ctl/deploy.py", "from collbench.ctl import ssh\n"),
               ("ctl/ssh.py", "from collbench import ctl\n"),
               ("nccl/a.py", "import collbench.nccl.b\n"), ("nccl/b.py", "from collbench.nccl.c import f\n"),
               ("nccl/c.py", "def g():\n    from .a import h\n"),
               ("topo/x.py", "from collbench.topo import y\n"), ("topo/y.py", "from collbench.tables import z\n"),
               ("tables.py", "")]
    assert import_cycles(sources) == [["collbench.compare.cli", "collbench.compare.nccl_compare"],
                                      ["collbench.ctl", "collbench.ctl.deploy", "collbench.ctl.ssh"],
                                      ["collbench.nccl.a", "collbench.nccl.b", "collbench.nccl.c"]]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        raise SystemExit("usage: tests/test_layout_contract.py --update   (rewrites the contract fixtures)")
    sys.path.insert(0, str(REPO))
    write_fixtures()
