"""Hostile configs, hostfiles and flags through the real CLI: exit 2, at once, with one bounded
line naming the file and the key -- never a traceback, a hang or a megabyte of message.

Most cases run `collbench rules --config F` (the cheapest verb that loads and validates the
whole config, hostfile included); flag cases run `collbench once` with values that must be
refused before any rank starts. "At once" is measured as the child's CPU time against a control
run of a valid config in the same session (the alias bombs here take minutes and gigabytes
without the loader's bound; wall time on a shared machine says little).
"""

import ctypes
import math
import os
import random
import resource
import subprocess
import sys
import time

import pytest
import yaml

from collbench import cli, config
from collbench.config import BOOL, PATH, STR, STR_LIST, TOP_KEYS, apply_overrides, load_config
from collbench.errors import UserError
from conftest import REPO

MAX_MESSAGE = 1500          # characters of stderr a refused config may print
CPU_ALLOWANCE = 1.0         # seconds of CPU beyond the control run
WALL_TIMEOUT = 60           # only a guard against a hang on a loaded machine


def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_cli(args, cwd=None, timeout=WALL_TIMEOUT, **popen):
    """(returncode, stdout, stderr, cpu seconds) of `python -m collbench ARGS`."""
    before = _children_cpu()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("OSU_PATH", None)
    p = subprocess.run([sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                       errors="replace", cwd=cwd or REPO, env=env, timeout=timeout, **popen)
    return p.returncode, p.stdout, p.stderr, _children_cpu() - before


@pytest.fixture(scope="module")
def control_cpu(tmp_path_factory):
    """CPU seconds of `rules` on a valid config: start-up, imports, validation, rendering."""
    path = tmp_path_factory.mktemp("control") / "ok.yaml"
    path.write_text("ranks: 2\nstress:\n  stop_grace: 5\n")
    costs = []
    for _ in range(2):
        rc, out, err, cpu = run_cli(["rules", "--config", str(path)])
        assert rc == 0 and "groups:" in out, err
        costs.append(cpu)
    return min(costs)


def assert_refused(result, control_cpu, *pieces):
    rc, out, err, cpu = result
    assert rc == 2, (rc, err[:2000])
    assert "Traceback" not in err, err[:2000]
    assert err.startswith("collbench: error: ") or "error: argument" in err, err[:500]
    assert len(err) <= MAX_MESSAGE, f"{len(err)} characters: {err[:300]}..."
    for piece in pieces:
        assert str(piece) in err, f"{piece!r} not in {err!r}"
    assert cpu <= control_cpu + CPU_ALLOWANCE, f"{cpu:.2f} s of CPU (control {control_cpu:.2f} s)"


def refuse_config(tmp_path, control_cpu, text, *pieces, about_config=True, capsys=None):
    """Run `rules` on the config `text`; the message starts with the config's path unless the
    error is about another file (a hostfile's line). With capsys: in this process (the many
    per-key cases; a subprocess each would cost the suite minutes), CPU time measured on it."""
    path = tmp_path / "c.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    if capsys is not None:
        capsys.readouterr()
        before = time.process_time()
        code, out, err = run_main(["rules", "--config", str(path)], capsys)
        result = (code, out, err, time.process_time() - before)
        # in process there is no interpreter start-up to allow for: the control is 0
        assert_refused(result, 0.0, *((f"collbench: error: {path}: ",) if about_config else ()), *pieces)
        return err
    result = run_cli(["rules", "--config", str(path)])
    assert_refused(result, control_cpu, *((f"collbench: error: {path}: ",) if about_config else ()), *pieces)
    return result[2]


# ------------------------------------------------------------------ alias bombs

def billion_laughs(key, levels=9, width=9):
    """`key` holding anchors that each alias the previous one `width` times: width**levels items."""
    names = "abcdefghijklmnopqrstuvwxyz"
    lines = [f'{key}: [&a [{",".join(["lol"] * width)}],']
    for i in range(1, levels):
        lines.append(f'&{names[i]} [{",".join([f"*{names[i - 1]}"] * width)}],')
    lines.append(f"*{names[levels - 1]}]")
    return "\n".join(lines) + "\n"


def mapping_laughs(levels=8, width=8):
    """Mappings of mappings under a real key (env): width**levels pairs."""
    lines = ["x0: &m0 {" + ", ".join(f"k{j}: v" for j in range(width)) + "}"]
    for i in range(1, levels):
        lines.append(f"x{i}: &m{i} {{" + ", ".join(f"k{j}: *m{i - 1}" for j in range(width)) + "}")
    lines.append(f"env: *m{levels - 1}")
    return "\n".join(lines) + "\n"


def merge_laughs(levels=20):
    """Merge keys: each mapping merges the previous one twice over, in a thresholds table."""
    lines = ["thresholds:", "  latency:", "    allreduce:",
             "      1KB: &t0 {warning: 1ms, critical: 2ms}"]
    for i in range(1, levels):
        lines.append(f"      {1 << i}KB: &t{i} {{<<: [*t{i - 1}, *t{i - 1}], warning: 1ms}}")
    return "\n".join(lines) + "\n"


BOMBS = {
    # the classic: 9 anchors of 9 aliases, 9**9 = 387 million strings from ~400 bytes
    "billion laughs in hosts": (billion_laughs("hosts"), 9 ** 9),
    "nested lists in launcher_args": (billion_laughs("launcher_args", levels=12, width=4), 4 ** 12),
    "mappings in env": (mapping_laughs(), 8 ** 8),
    "merge keys in thresholds": (merge_laughs(), 2 ** 19),
    "one wide anchor aliased often": ("plan: &p [" + ", ".join(["{op: barrier}"] * 1500) + "]\n"
                                      "stress:\n  plan: [" + ", ".join(["*p"] * 12) + "]\n", 1500 * 12),
}


@pytest.mark.parametrize("case", list(BOMBS))
def test_alias_bomb_is_refused_at_once(tmp_path, control_cpu, case):
    text, expansion = BOMBS[case]
    assert expansion > 10_000   # each shape really does expand past the bound
    err = refuse_config(tmp_path, control_cpu, text, "aliases expand to more than 10000 nodes", "line ")
    assert "*" in err   # names the alias where the bound was crossed


def test_billion_laughs_is_a_400_byte_file(tmp_path, control_cpu):
    text, expansion = BOMBS["billion laughs in hosts"]
    assert len(text) <= 400 and expansion * 3 > 10 ** 9   # ~1 GB of "lol" once expanded


@pytest.mark.parametrize("text,alias", [
    ("plan: &p [*p]\n", "*p"),
    ("env: &e {A: *e}\n", "*e"),
    ("hosts: &h [a, [b, *h]]\n", "*h"),
])
def test_recursive_alias_is_refused(tmp_path, control_cpu, text, alias):
    refuse_config(tmp_path, control_cpu, text, f"line 1: alias {alias} is inside the node it refers to (a recursive structure)")


def test_moderate_aliases_still_load(tmp_path):
    """The bound is on expansion, not on anchors: a plan shared by once and stress loads."""
    path = tmp_path / "c.yaml"
    path.write_text("plan: &p\n  - {op: allreduce, sizes: [1KB, 1MB], iterations: 10}\n"
                    "stress:\n  plan: *p\n")
    cfg = load_config(str(path))
    assert cfg.stress_plan() == cfg.once_plan() and len(cfg.once_plan()) == 2


def test_deep_nesting_is_refused(tmp_path, control_cpu):
    refuse_config(tmp_path, control_cpu, "launcher_args: " + "[" * 50_000 + "]" * 50_000 + "\n",
                  "line 1: nested deeper than 64 levels")


# ------------------------------------------------------------------ duplicate keys

DUPLICATES = {
    "top level": ("ranks: 2\noversubscribe: true\nranks: 4\n", 3, "'ranks'", 1),
    "nested block": ("stress:\n  pause: 1\n  stop_grace: 5\n  pause: 2\n", 4, "'pause'", 2),
    "nested flow": ("exporter: {listen: ':9105', max_age: 60, listen: ':9106'}\n", 1, "'listen'", 1),
    "plan step": ("plan:\n  - op: allreduce\n    sizes: [1KB]\n    op: bcast\n", 4, "'op'", 2),
    "thresholds size": ("thresholds:\n  latency:\n    allreduce:\n      1KB: {warning: 1ms, critical: 2ms}\n"
                        "      1KB: {warning: 5ms, critical: 9ms}\n", 5, "'1KB'", 4),
    "equal values, different spelling": ("validate: yes\nvalidate: true\n", 2, "'validate'", 1),
    "merge then a repeated explicit key": ("base: &b {pause: 1}\nstress:\n  <<: *b\n  stop_grace: 3\n"
                                           "  stop_grace: 4\n", 5, "'stop_grace'", 4),
}


@pytest.mark.parametrize("case", list(DUPLICATES))
def test_duplicate_key_is_refused(tmp_path, control_cpu, case):
    text, line, key, first = DUPLICATES[case]
    refuse_config(tmp_path, control_cpu, text, f"line {line}: duplicate key {key} (first at line {first})")


def test_merge_key_override_is_not_a_duplicate(tmp_path):
    """An explicit key overriding a merged one (<<) is YAML's intended use, not a duplicate."""
    path = tmp_path / "c.yaml"
    path.write_text("plan:\n  - &step {op: allreduce, sizes: [1KB], iterations: 10}\n"
                    "  - {<<: *step, iterations: 20}\n  - {<<: *step, op: bcast, sizes: [1MB]}\n")
    plan = load_config(str(path)).once_plan()
    assert [(s.op, s.size_bytes, s.iterations) for s in plan] == [
        ("allreduce", 1024, 10), ("allreduce", 1024, 20), ("bcast", 1 << 20, 10)]


# ------------------------------------------------------------------ numbers: NaN, Inf, ranges

def nest(dotted, value):
    """{'a': {'b': value}} for 'a.b'."""
    data = value
    for part in reversed(dotted.split(".")):
        data = {part: data}
    return data


def _numeric(schema):
    return [k for k, (kind, _) in schema.items() if kind not in (STR, PATH, BOOL, STR_LIST)]


# Every section's schema (config.STRESS_SCHEMA -> "stress", ...): a section or key added later is
# covered without touching this file.
SECTIONS = {name[:-len("_SCHEMA")].lower(): schema for name, schema in vars(config).items()
            if name.endswith("_SCHEMA") and isinstance(schema, dict) and name[:-len("_SCHEMA")].lower() in TOP_KEYS}
# every number-valued key: the sections' and the rest, as (dotted key in the message, config data
# holding the value)
SECTION_NUMBER_KEYS = [f"{name}.{key}" for name, schema in SECTIONS.items() for key in _numeric(schema)]
OTHER_NUMBER_KEYS = {
    "ranks": lambda v: {"ranks": v},
    "ranks_per_node": lambda v: {"ranks_per_node": v, "oversubscribe": True},
    "step_timeout": lambda v: {"step_timeout": v},
    "hosts[0].slots": lambda v: {"hosts": [{"host": "n1", "slots": v}]},
    "plan[0].iterations": lambda v: {"plan": [{"op": "allreduce", "sizes": ["1KB"], "iterations": v}]},
    "plan[0].warmup": lambda v: {"plan": [{"op": "allreduce", "sizes": ["1KB"], "warmup": v}]},
    "plan[0].sizes[0]": lambda v: {"plan": [{"op": "bcast", "sizes": [v]}]},
    "stress.plan[0].iterations": lambda v: {"stress": {"plan": [{"op": "bcast", "sizes": ["1KB"], "iterations": v}]}},
    "thresholds.latency.allreduce.1KB.warning": lambda v: {
        "thresholds": {"latency": {"allreduce": {"1KB": {"warning": v, "critical": "2ms"}}}}},
    "thresholds.latency.allreduce.1KB.critical": lambda v: {
        "thresholds": {"latency": {"allreduce": {"1KB": {"warning": "1ms", "critical": v}}}}},
    "thresholds.ecn_rate.warning": lambda v: {"thresholds": {"ecn_rate": {"warning": v, "critical": 10}}},
    "thresholds.ecn_rate.critical": lambda v: {"thresholds": {"ecn_rate": {"warning": 1, "critical": v}}},
}
ALL_NUMBER_KEYS = SECTION_NUMBER_KEYS + list(OTHER_NUMBER_KEYS)


def config_with(dotted, value):
    if dotted in OTHER_NUMBER_KEYS:
        return OTHER_NUMBER_KEYS[dotted](value)
    return nest(dotted, value)


def test_every_section_number_key_is_covered():
    assert {"stress", "exporter", "master", "alerts"} <= set(SECTIONS)
    assert {"stress.stop_grace", "stress.pause", "stress.duty_cycle", "stress.rotate_keep", "exporter.max_age",
            "exporter.poll_interval", "master.port", "master.connect_timeout", "alerts.nodes",
            "alerts.link_gbps"} <= set(SECTION_NUMBER_KEYS)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("key", ALL_NUMBER_KEYS)
def test_nan_and_inf_are_refused(tmp_path, capsys, key, value):
    text = yaml.safe_dump(config_with(key, "@@")).replace("'@@'", value)
    assert value in text
    refuse_config(tmp_path, None, text, f"{key}: ", capsys=capsys)


OUT_OF_RANGE = [
    # (key, value, piece of the message)
    ("ranks", 0, "expected a positive whole number"),
    ("ranks", -3, "expected a positive whole number"),
    ("ranks", 2 ** 31, "at most 2147483647"),
    ("ranks", 10 ** 30, "at most 2147483647"),
    ("ranks_per_node", 2 ** 31, "at most 2147483647"),
    ("hosts[0].slots", 2 ** 31, "at most 2147483647"),
    ("hosts[0].slots", 0, "positive whole number"),
    ("plan[0].iterations", 0, "positive whole number"),
    ("plan[0].iterations", 10 ** 12 + 1, "at most 10^12, the engine's limit"),
    ("plan[0].warmup", -1, "a whole number >= 0"),
    ("plan[0].warmup", 10 ** 12 + 1, "at most 10^12, the engine's limit"),
    ("stress.plan[0].iterations", 2 ** 63, "at most 10^12"),
    ("plan[0].sizes[0]", 0, "out of range"),
    ("plan[0].sizes[0]", "2GB", "the 2 GB limit"),
    ("plan[0].sizes[0]", "4GB", "the 2 GB limit"),
    ("plan[0].sizes[0]", 2 ** 31, "the 2 GB limit"),
    ("plan[0].sizes[0]", 10 ** 40, "the 2 GB limit"),
    ("stress.rotate_keep", 10001, "from 0 to 10000"),
    ("stress.rotate_keep", -1, "from 0 to 10000"),
    ("stress.stop_grace", 0, "a positive number of seconds"),
    ("stress.stop_grace", 1e10, "a year"),
    ("stress.pause", -1, "seconds >= 0"),
    ("stress.duty_cycle", 1.5, "a number in (0, 1]"),
    ("stress.duty_cycle", 0, "a number in (0, 1]"),
    ("master.port", 0, "from 1 to 65535"),
    ("master.port", 65536, "from 1 to 65535"),
    ("exporter.poll_interval", 1e300, "a year"),
    ("alerts.link_gbps", 1e12, "at most 1e9"),
    ("alerts.nodes", 2 ** 40, "at most 2147483647"),
    ("step_timeout", "100000h", "at most a year"),
    ("step_timeout", "9" * 60, "at most a year"),
    ("thresholds.latency.allreduce.1KB.warning", "9" * 60 + "s", "at most a year"),
    ("thresholds.ecn_rate.warning", -5, "a positive number"),
]


@pytest.mark.parametrize("key,value,piece", OUT_OF_RANGE, ids=[f"{k}={str(v)[:12]}" for k, v, _ in OUT_OF_RANGE])
def test_out_of_range_number_is_refused(tmp_path, capsys, key, value, piece):
    refuse_config(tmp_path, None, yaml.safe_dump(config_with(key, value)), f"{key}: ", piece, capsys=capsys)


def test_stop_grace_nan_names_the_key_and_expectation(tmp_path, control_cpu):
    """The issue's case: `stop_grace: .nan` made `stress stop` SIGKILL at once."""
    refuse_config(tmp_path, control_cpu, "stress:\n  stop_grace: .nan\n",
                  "stress.stop_grace: got nan, expected a positive number of seconds")


def test_slots_over_int_in_host_string_and_hostfile(tmp_path, control_cpu):
    refuse_config(tmp_path, control_cpu, "hosts: ['n1:2147483648']\n", "hosts[0]: got 'n1:2147483648'",
                  "slots from 1 to 2147483647")
    refuse_config(tmp_path, control_cpu, "hosts: ['n1:²']\n", "hosts[0]: got 'n1:²'")
    (tmp_path / "hosts").write_text("n1 slots=4\nn2 slots=99999999999\n")
    (tmp_path / "c.yaml").write_text("hosts: hosts\n")
    run = run_cli(["rules", "--config", str(tmp_path / "c.yaml")])
    assert_refused(run, control_cpu, f"error: {tmp_path}/hosts: line 2: got 'n2 slots=99999999999'",
                   "N from 1 to 2147483647")


def test_default_ranks_past_int_from_slots_is_refused(tmp_path, control_cpu):
    refuse_config(tmp_path, control_cpu, "hosts: ['a:2147483647', 'b:2147483647']\n",
                  "ranks: not set, and the hosts' 4294967294 slots", "set ranks")


def test_numbers_of_too_many_digits_are_refused(tmp_path, control_cpu):
    err = refuse_config(tmp_path, control_cpu, "ranks: 2\nstress:\n  rotate_keep: " + "9" * 5000 + "\n",
                        "line 3: a number of 5000 characters (at most 100)")
    assert "9" * 100 not in err


# ------------------------------------------------------------------ flags

FLAG_CASES = [
    (["--np", "0"], "--np: got 0, expected a whole number from 1 to 2147483647"),
    (["--np", "2147483648"], "--np: got 2147483648, expected a whole number from 1 to 2147483647"),
    (["--np", "9" * 25], "--np: got 9999999999999999999999999"),
    (["--np", "9" * 5000], "argument --np: invalid int value: '999"),
    (["--iterations", "1000000000001"], "--iterations: got 1000000000001, expected a whole number from 1 to 1000000000000"),
    (["--iterations", "-1"], "--iterations: got -1"),
    (["--sizes", "1KB,4GB"], "--sizes: '4GB' is out of range: above the 2 GB limit"),
    (["--sizes", "2GB"], "--sizes: '2GB' is out of range: above the 2 GB limit (at most 2147483647 B"),
    (["--sizes", "nan"], "--sizes: 'nan' is not a size"),
    (["--sizes", "9" * 400 + "KB"], "--sizes: '999"),
    (["--ops", "x" * 100_000], "--ops 'xxx"),
]


@pytest.mark.parametrize("flags,piece", FLAG_CASES, ids=[" ".join(f)[:30] for f, _ in FLAG_CASES])
def test_flag_out_of_range_is_refused_before_anything_runs(tmp_path, control_cpu, flags, piece):
    results = tmp_path / "r.jsonl"
    run = run_cli(["once", "--results", str(results), *flags], cwd=tmp_path)
    assert_refused(run, control_cpu, piece)
    assert run[1] == "" and not results.exists()


# ------------------------------------------------------------------ hostfiles and config files

def test_non_utf8_hostfile(tmp_path, control_cpu):
    (tmp_path / "hosts").write_bytes(b"n1 slots=2\nn\xe9ud2 slots=2\n")
    refuse_config(tmp_path, control_cpu, "hosts: hosts\n",
                  f"hosts: hostfile {tmp_path}/hosts is not UTF-8 text (byte 0xe9 on line 2)")


def test_non_utf8_config(tmp_path, control_cpu):
    refuse_config(tmp_path, control_cpu, b"ranks: 2\n# caf\xe9\n", "config file is not UTF-8 text (byte 0xe9 on line 2)")


def test_hostfile_that_is_a_directory(tmp_path, control_cpu):
    (tmp_path / "hosts.d").mkdir()
    refuse_config(tmp_path, control_cpu, "hosts: hosts.d\n", f"hosts: hostfile {tmp_path}/hosts.d is a directory "
                  "(expected a hostfile path or a list of hosts)")


def test_config_that_is_a_directory(tmp_path, control_cpu):
    (tmp_path / "conf.d").mkdir()
    run = run_cli(["rules", "--config", str(tmp_path / "conf.d")])
    assert_refused(run, control_cpu, f"{tmp_path}/conf.d: config file is a directory, expected a YAML config file")
    assert "does not exist" not in run[2]


def test_hostfile_and_config_that_are_fifos_are_not_waited_on(tmp_path, control_cpu):
    """A FIFO with no writer blocks an open() for ever: refused, not read (the timeout guards it)."""
    os.mkfifo(tmp_path / "hosts")
    refuse_config(tmp_path, control_cpu, "hosts: hosts\n",
                  f"hosts: hostfile {tmp_path}/hosts is not a regular file (a FIFO, socket or device)")
    os.mkfifo(tmp_path / "fifo.yaml")
    run = run_cli(["rules", "--config", str(tmp_path / "fifo.yaml")], timeout=30)
    assert_refused(run, control_cpu, f"{tmp_path}/fifo.yaml: config file is not a regular file")


def test_hostfile_under_a_file_path(tmp_path, control_cpu):
    (tmp_path / "plain").write_text("x\n")
    refuse_config(tmp_path, control_cpu, "hosts: plain/hosts\n",
                  f"hostfile {tmp_path}/plain/hosts does not exist (a part of its path is not a directory)")


def test_hostfile_path_with_nul(tmp_path, control_cpu):
    refuse_config(tmp_path, control_cpu, 'hosts: "a\\0b"\n', "hosts: got 'a\\x00b', expected a path")


def test_too_large_hostfile_and_config(tmp_path, control_cpu):
    (tmp_path / "hosts").write_text("# padding\n" * 120_000)   # 1.2 MB
    refuse_config(tmp_path, control_cpu, "hosts: hosts\n", f"hostfile {tmp_path}/hosts is 1200000 bytes, over the 1024 KB limit")
    refuse_config(tmp_path, control_cpu, "ranks: 2\n" + "# padding\n" * 30_000, "config file is 300009 bytes, over the 256 KB limit")


def _without_file_permission_override():
    """preexec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set, so the
    child (still root, so it can run the venv's interpreter under /root) obeys mode bits."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):   # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:   # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_unreadable_hostfile_and_config(tmp_path, control_cpu):
    """Permission denied (root reads a mode-000 file regardless: the child runs without the
    capabilities that let it)."""
    (tmp_path / "hosts").write_text("n1 slots=1\n")
    (tmp_path / "hosts").chmod(0)
    (tmp_path / "c.yaml").write_text("hosts: hosts\n")
    (tmp_path / "secret.yaml").write_text("ranks: 2\n")
    (tmp_path / "secret.yaml").chmod(0)
    # control: the same child reads a readable config and hostfile, so a refusal is about the mode
    (tmp_path / "ok-hosts").write_text("n1 slots=1\n")
    (tmp_path / "ok.yaml").write_text("hosts: ok-hosts\n")
    ok = run_cli(["rules", "--config", str(tmp_path / "ok.yaml")], preexec_fn=_without_file_permission_override)
    assert ok[0] == 0, ok[2]
    run = run_cli(["rules", "--config", str(tmp_path / "c.yaml")], preexec_fn=_without_file_permission_override)
    assert_refused(run, control_cpu, f"{tmp_path}/c.yaml: hosts: hostfile {tmp_path}/hosts cannot be read "
                                     "(Permission denied)")
    run = run_cli(["rules", "--config", str(tmp_path / "secret.yaml")], preexec_fn=_without_file_permission_override)
    assert_refused(run, control_cpu, f"{tmp_path}/secret.yaml: config file cannot be read (Permission denied)")


# ------------------------------------------------------------------ huge values

HUGE = "x" * 200_000


@pytest.mark.parametrize("text,pieces", [
    (f"transport: {HUGE}\n", ["transport: got 'xxx", "expected one of: shm"]),
    (f"? {HUGE}\n: 1\n", ["unknown key (allowed: hosts"]),
    (f"stress:\n  ? {HUGE}\n  : 1\n", ["stress.xxx", "unknown key (allowed: pause"]),
    (f"{HUGE}: 1\n", ["not valid YAML"]),   # a plain key past 1024 characters is not YAML
    (f"hosts: [{HUGE}]\n", ["hosts[0]: got 'xxx", "expected a host name"]),
    (f"state_dir: {HUGE}\n", ["state_dir: got 'xxx", "at most 4096 characters"]),
    (f"env: {{A: {HUGE}}}\n", ["env: got {'A': 'xxx", "at most 32768 characters"]),
    (f"plan: [{{op: {HUGE}}}]\n", ["plan[0].op: got 'xxx"]),
    (f"thresholds:\n  latency:\n    ? {HUGE}\n    : {{}}\n", ["thresholds.latency.xxx", "unknown op"]),
    ("launcher_args: [" + ", ".join(["[1, 2, 3]"] * 2_000) + "]\n", ["launcher_args: got [[1, 2, 3]"]),
    ("launcher_args: [" + ", ".join(["[1, 2, 3]"] * 5_000) + "]\n", ["line 1: more than 10000 values"]),
    # root, key and list are 3 nodes: the 10,001st is the 9,998th host, on line 9999
    ("hosts:\n" + "- n1\n" * 20_000, ["line 9999: more than 10000 values", "hostfile"]),
])
def test_huge_values_give_a_bounded_message(tmp_path, control_cpu, text, pieces):
    err = refuse_config(tmp_path, control_cpu, text, *pieces)
    assert "x" * 200 not in err


def test_huge_hostfile_line_gives_a_bounded_message(tmp_path, control_cpu):
    (tmp_path / "hosts").write_text("n1 slots=1\n" + "n2 " + "y" * 500_000 + "\n")
    refuse_config(tmp_path, control_cpu, "hosts: hosts\n", f"collbench: error: {tmp_path}/hosts: line 2: got 'n2 yyy",
                  about_config=False)


# ------------------------------------------------------------------ launcher_path advice

@pytest.mark.parametrize("value,piece", [
    ("/nonexistent/mpirun", "does not exist (set it to the full path of an executable mpirun, "
                            "or remove launcher_path to use the mpirun on PATH)"),
    ("{tmp}", "is a directory (set it to the full path"),
    ("no-such-mpirun", "not found on PATH (give the full path of mpirun, or remove launcher_path"),
])
def test_launcher_path_error_gives_advice_that_applies(tmp_path, control_cpu, value, piece):
    value = value.format(tmp=tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"engine": "osu", "osu_path": str(REPO / "tests" / "osu_standin"),
                                   "ranks": 2, "launcher_path": value,
                                   "plan": [{"op": "allreduce", "sizes": ["1KB"], "iterations": 5}]}))
    run = run_cli(["once", "--config", str(cfg)])
    assert_refused(run, control_cpu, f"launcher_path {value!r} in {cfg}: {piece}")
    assert "set launcher_path in the config" not in run[2] and "install openmpi-bin" not in run[2]


# ------------------------------------------------------------------ seeded random fuzz

PLAN_KEYS = config.PLAN_STEP_KEYS


def fuzz_value(rng, depth=0):
    """One value of a random YAML type, hostile or plain."""
    pick = rng.randrange(30)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, -1, 1, 2, 7, 4096, 2 ** 31 - 1, 2 ** 31, 2 ** 63, 10 ** 12, 10 ** 12 + 1, 10 ** 99])
    if pick == 3:
        return rng.choice([0.0, -0.5, 0.5, 1.5, 1e-300, 1e9, 1e300, math.nan, math.inf, -math.inf])
    if pick == 4:
        return rng.choice(["", " ", "x", "4MB", "2GB", "1KB", "10ms", "30s", "5m", "nan", "inf", "-1", "0",
                           "allreduce", "float", "long", "localhost", "n1:2", "ucx", "osu", "builtin", "a\0b",
                           "~", "é", "\u202e", "${HOME}", "$(reboot)", "*x", "&x", "!!python/object"])
    if pick == 5:
        return "z" * rng.choice([100, 5000, 70_000])
    if pick == 6 and depth < 3:
        return [fuzz_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if pick == 7 and depth < 3:
        return {rng.choice(["op", "sizes", "host", "slots", "warning", "critical", "A", "x", 1]):
                fuzz_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if pick == 8:
        value = []
        for _ in range(rng.randrange(5, 80)):
            value = [value]
        return value
    if pick == 9:
        import datetime
        return datetime.date(2024, 1, 1)
    if pick == 10:
        return b"\x00\xff"
    return rng.choice([1, "1KB", 2, "x", None, [1], {"a": 1}])


def fuzz_config(rng):
    """A plausible config with a few keys given random values at random depths."""
    data = {"ranks": 2, "plan": [{"op": "allreduce", "sizes": ["1KB"], "iterations": 3}]}
    for _ in range(rng.randrange(1, 4)):
        where = rng.randrange(6)
        if where == 0:
            data[rng.choice(TOP_KEYS)] = fuzz_value(rng)
        elif where == 1:
            name = rng.choice(list(SECTIONS))
            section = data.setdefault(name, {}) if isinstance(data.get(name), dict) else {}
            data[name] = section
            section[rng.choice(list(SECTIONS[name]))] = fuzz_value(rng)
        elif where == 2 and isinstance(data.get("plan"), list) and data["plan"] and isinstance(data["plan"][0], dict):
            data["plan"][0][rng.choice(PLAN_KEYS)] = fuzz_value(rng)
        elif where == 3:
            data["thresholds"] = {"latency": {rng.choice(["allreduce", "bcast", "x"]): {
                rng.choice(["1KB", "4MB", 7, "x"]): {"warning": fuzz_value(rng), "critical": fuzz_value(rng)}}},
                rng.choice(["ecn_rate", "seed_defaults"]): fuzz_value(rng)}
        elif where == 4:
            data["hosts"] = [rng.choice(["n1", "n1:2", {"host": fuzz_value(rng), "slots": fuzz_value(rng)},
                                         fuzz_value(rng)]) for _ in range(rng.randrange(1, 3))]
            data["oversubscribe"] = True
        else:
            data["stress"] = {"plan": [{"op": rng.choice(["bcast", "barrier", "alltoall"]),
                                        rng.choice(PLAN_KEYS): fuzz_value(rng)}]}
    return data


YAML_NOISE = ["&a ", "*a", "!!str ", "!!int ", "!!float ", "!!binary ", "!!set ", "!!python/object ", "<<: ",
              "? ", "- ", "{", "}", "[", "]", ": ", "\n", "'", '"', "#", "%YAML 1.1\n", "---\n", "...\n",
              "\t", "\0", "\x85", "\ufeff", "0x7fffffffffffffff", ".nan", "1e999", "2024-13-45"]


def fuzz_text(rng):
    text = yaml.safe_dump(fuzz_config(rng), allow_unicode=True, default_flow_style=rng.random() < 0.3)
    for _ in range(rng.randrange(4)):   # some raw syntax noise at random places
        i = rng.randrange(len(text) + 1)
        text = text[:i] + rng.choice(YAML_NOISE) + text[i:]
    return text


def run_main(argv, capsys):
    """The CLI's own entry point in this process: its exit code; any other exception propagates."""
    try:
        code = cli.main(argv)
    except SystemExit as e:   # argparse
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_seeded_fuzz_over_keys_and_value_types(tmp_path, capsys):
    """1200 generated configs through `rules` in-process: exit 0 or 2, a bounded message, never a
    traceback (an exception escaping main() fails here with the seed and the text)."""
    rng = random.Random(9)
    path = tmp_path / "fuzz.yaml"
    seen = {0: 0, 2: 0}
    for case in range(1200):
        text = fuzz_text(rng)
        path.write_text(text, errors="surrogatepass")
        try:
            code, out, err = run_main(["rules", "--config", str(path)], capsys)
        except Exception as e:  # noqa: BLE001 - the point: nothing but exit codes may come out
            pytest.fail(f"case {case}: {type(e).__name__}: {e}\n--- config ---\n{text[:2000]}")
        assert code in (0, 2), (case, code, err[:500], text[:2000])
        if code == 2:
            assert err.startswith("collbench: error: ") and len(err) <= MAX_MESSAGE, (case, err[:2000])
            assert str(path) in err, (case, err[:500])
        seen[code] += 1
    assert seen[0] > 10 and seen[2] > 500, seen   # both outcomes really occur


def test_seeded_fuzz_through_the_real_cli(tmp_path, control_cpu):
    """A sample of the same generator through `python -m collbench`: no traceback, exit 0 or 2."""
    rng = random.Random(99)
    path = tmp_path / "fuzz.yaml"
    codes = []
    for case in range(25):
        text = fuzz_text(rng)
        path.write_text(text, errors="surrogatepass")
        rc, out, err, cpu = run_cli(["rules", "--config", str(path)])
        assert rc in (0, 2) and "Traceback" not in err, (case, rc, err[-2000:], text[:2000])
        assert len(err) <= MAX_MESSAGE and cpu <= control_cpu + CPU_ALLOWANCE + 1.0, (case, len(err), cpu)
        codes.append(rc)
    assert 2 in codes


def test_seeded_fuzz_of_flag_overrides(tmp_path):
    """--np / --iterations / --sizes / --ops / --datatype values through apply_overrides (what
    `once` calls before anything runs): applied within the engine's limits, or a UserError."""
    rng = random.Random(5)
    ints = [0, 1, 2, -1, 2 ** 31 - 1, 2 ** 31, 10 ** 12, 10 ** 12 + 1, 10 ** 30]
    strs = ["1KB", "2GB", "4GB", "0", "1.5KB", "3", "nan", "1e3", ",", "", "9" * 400, "1KB," * 50, "x" * 5000]
    ops = ["allreduce", "bcast,barrier", "nope", ",", "", "x" * 5000, "ALLREDUCE"]
    applied = refused = 0
    for case in range(1500):
        cfg = load_config(None)
        flags = {"np": rng.choice(ints), "iterations": rng.choice(ints), "sizes": rng.choice(strs),
                 "ops": rng.choice(ops), "datatype": rng.choice(["float", "char", "long", "x", ""])}
        flags = {k: v for k, v in flags.items() if rng.random() < 0.4}   # a few flags at a time
        try:
            apply_overrides(cfg, **flags)
        except UserError as e:
            assert len(str(e)) <= MAX_MESSAGE and str(e).startswith("--"), (case, flags, str(e)[:300])
            refused += 1
            continue
        assert 1 <= cfg.ranks <= 2 ** 31 - 1, (case, flags)
        for s in cfg.once_plan():
            assert 1 <= s.iterations <= 10 ** 12 and 0 <= s.warmup <= 10 ** 12, (case, flags, s)
            assert 0 <= s.size_bytes <= 2 ** 31 - 1, (case, flags, s)
        applied += 1
    assert applied > 50 and refused > 500, (applied, refused)
