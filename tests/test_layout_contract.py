"""The layout refactor (issue 10) changes no behaviour a user or a scraper can see.

The fixtures under tests/fixtures/layout-contract/ were captured from the tree before the
refactor: the `--help` text of every command and subcommand registered in collbench/cli.py,
and the metric names (with their label names) of one exporter scrape of a results log with
results, a barrier and a failure, fixture sysfs/procfs/ethtool trees and legacy names on.

A CLI change that is meant (a new flag, a new verb) regenerates them, in the same commit:
    .venv/bin/python tests/test_layout_contract.py --update

Also: the package's layout rules, checked by grep, so they stay true:
no engine-name branch outside collbench/engines/, no process-group signalling outside
collbench/proctree.py, and imports point down: shared modules and engines never import a verb,
a verb never imports another verb (what two verbs share moves into a shared module).
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


# a comparison of something with an engine's name: engine == "osu", cfg.engine != 'builtin', ... in ("osu", ...)
ENGINE_BRANCH = re.compile(r"""(engine\w*|\.name)\s*(==|!=|\bin\b|\bnot in\b)\s*[\(\[{]?\s*["'](osu|builtin)["']"""
                           r"""|["'](osu|builtin)["']\s*(==|!=)\s*\w*engine""")


def test_no_engine_name_branch_outside_engines():
    offenders = [f"{rel}:{n}: {line.strip()}"
                 for rel, text in _python_sources(exclude=("engines/",))
                 for n, line in enumerate(text.splitlines(), 1) if ENGINE_BRANCH.search(line)]
    assert offenders == []


def test_engine_branch_pattern_catches_a_branch():
    # the grep above can fail: it finds the forms the refactor removed
    for line in ('if cfg.engine == "osu":', "if engine != 'builtin':", 'if args.engine in ("osu", "x"):',
                 'elif "osu" == engine:'):
        assert ENGINE_BRANCH.search(line), line
    assert not ENGINE_BRANCH.search('engine = get_engine(cfg.engine)')


def test_process_group_signalling_only_in_proctree():
    offenders = [f"{rel}:{n}: {line.strip()}"
                 for rel, text in _python_sources(exclude=("proctree.py",))
                 for n, line in enumerate(text.splitlines(), 1)
                 if re.search(r"\bkillpg\b", line)]
    assert offenders == []
    assert "killpg" in (PACKAGE / "proctree.py").read_text(encoding="utf-8")


# --- import direction ----------------------------------------------------------------------------

# A verb is a package that holds a command (collbench/cli.py's COMMAND_MODULES); every other
# package (config, engines, results, harness, ...) and every top-level module is shared. The
# `engine` command lives in engines/, a shared package: engines never import a verb.
SHARED_PACKAGES = {"engines"}


def _imported_packages(text):
    """(line, package) for every `collbench.<package>` a source imports, at any depth in the file."""
    import ast
    out = []
    for node in ast.walk(ast.parse(text)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "collbench" else [f"collbench.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "collbench" and len(parts) > 1:
                out.append((node.lineno, parts[1]))
    return out


def import_direction_violations(sources, verbs):
    """Shared modules and engines never import a verb; a verb never imports another verb."""
    bad = []
    for rel, text in sources:
        parts = rel.split("/")
        home = parts[0] if len(parts) > 1 else None
        for line, pkg in _imported_packages(text):
            if pkg not in verbs or pkg == home:
                continue
            who = f"verb {home}" if home in verbs else "shared module"
            bad.append(f"{rel}:{line}: {who} imports verb {pkg}")
    return bad


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
               ("topo/cli.py", "from collbench.engines import launcher\n")]
    assert import_direction_violations(sources, verbs) == [
        "sweep/cli.py:2: verb sweep imports verb once",
        "engines/rank_order.py:1: shared module imports verb topo",
        "tables.py:1: shared module imports verb sweep",
        "results/x.py:1: shared module imports verb once"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        raise SystemExit("usage: tests/test_layout_contract.py --update   (rewrites the contract fixtures)")
    sys.path.insert(0, str(REPO))
    write_fixtures()
