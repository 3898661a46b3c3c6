"""collbench.cli_values: one parser per kind of flag value, the same bounds and words in every verb."""

import argparse
import re
import subprocess
import sys

import pytest

from collbench import cli_values
from collbench.errors import UserError
from conftest import REPO


def test_ops_sizes_ranges_counts():
    assert cli_values.op_names(["allreduce,bcast", "allreduce", " barrier "]) == ["allreduce", "bcast", "barrier"]
    assert cli_values.op_names("allgather", allowed=("allgather", "allreduce")) == ["allgather"]
    assert cli_values.size_list("1MB,1KB,1KB") == [1024, 1 << 20]
    assert cli_values.size_list("1MB,1KB,1KB", as_given=True) == [1 << 20, 1024, 1024]   # once's plan as written
    assert cli_values.number("2.5", "--margin", 0, 100, "a percentage") == 2.5
    assert cli_values.datatype(None) is None and cli_values.datatype("int", allowed=("int",)) == "int"
    assert cli_values.ratio_type("2")("1.5") == 1.5 and cli_values.ratio_type("2")("1000") == 1000.0
    for bad, words in (("1", "got '1', expected a number above 1 (e.g. 2)"), ("x", "got 'x', expected a number above 1"),
                       ("1001", "got '1001', expected a number above 1")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(words)):
            cli_values.ratio_type("2")(bad)
    seconds = cli_values.number_type(0, 3600, "seconds above 0, up to 3600", above_low=True)
    assert seconds("0.2") == 0.2 and seconds("3600") == 3600.0
    for bad in ("0", "-1", "3601", "nan", "soon"):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(f"got '{bad}', expected seconds above 0, up to 3600")):
            seconds(bad)
    assert cli_values.size_range("1KB", "8KB", 2) == [1024, 2048, 4096, 8192]
    assert cli_values.size_range("4", "1MB", 4)[-1] == 1 << 20
    assert cli_values.count(5, "--blocks") == 5 and cli_values.count(None, "--blocks") is None
    assert cli_values.count(0, "--warmup", low=0) == 0
    assert [cli_values.duration(v, "--every") for v in ("30", "1.5s", "5m", "2h", "250ms")] == [30, 1.5, 300, 7200, 0.25]


@pytest.mark.parametrize("call, words", [
    (lambda: cli_values.op_names("allreduce,nope", "--op"), "--op 'nope': unknown op 'nope' (expected one of:"),
    (lambda: cli_values.op_names("bcast", "--ops", allowed=("allgather",)), "--ops 'bcast': unknown op"),
    (lambda: cli_values.op_names("a,b", "--op", one=True), "--op: expected one op of:"),
    (lambda: cli_values.op_names(",", "--op"), "--op: expected an op or a comma list of:"),
    (lambda: cli_values.size_list("1KB,lots"), "--sizes: 'lots' is not a size"),
    (lambda: cli_values.size_list("3GB"), "--sizes: '3GB' is out of range: above the 2 GB limit"),
    (lambda: cli_values.size_range("1KB", "512", 2), "--max-bytes 512B is below --min-bytes 1KB"),
    (lambda: cli_values.size_range("1", "1KB", (1 << 30) + 1), "--factor: got 1073741825, expected a whole number from 2"),
    (lambda: cli_values.size_range("1", "1KB", True), "--factor: got True"),
    (lambda: cli_values.count(0, "--iterations"), "--iterations: got 0, expected a whole number from 1 to 1000000000000"),
    (lambda: cli_values.count(10 ** 13, "--iterations"), "--iterations: got 10000000000000"),
    (lambda: cli_values.duration("soon", "--every"), "--every: got 'soon', expected a duration"),
    (lambda: cli_values.duration("nan", "--every"), "--every: got 'nan'"),
    (lambda: cli_values.name_list("ring,butterfly", ("ring",), "--patterns"), "--patterns: got 'ring,butterfly'"),
    (lambda: cli_values.datatype("quad"), "--datatype: got 'quad', expected one of:"),
    (lambda: cli_values.datatype("long", allowed=("float", "int")), "--datatype: got 'long', expected one of: float, int"),
    (lambda: cli_values.number("-5", "--margin", 0, 100, "a percentage from 0 to 100"),
     "--margin: got '-5', expected a percentage from 0 to 100"),
    (lambda: cli_values.number("nan", "--margin", 0, 100, "a percentage"), "--margin: got 'nan', expected a percentage"),
    (lambda: cli_values.number("soon", "--time-budget", 1, 60, "seconds"), "--time-budget: got 'soon', expected seconds"),
])
def test_bad_values_name_the_flag(call, words):
    with pytest.raises(UserError) as e:
        call()
    assert words in str(e.value) and e.value.exit_code == 2, str(e.value)


def test_a_huge_value_is_shown_cut_to_a_line():
    with pytest.raises(UserError) as e:
        cli_values.op_names("x" * 100_000, "--ops")
    assert len(str(e.value)) < 400


def _verb(tmp_path, *args):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("hosts: [a, b]\nhosts_order: [b, a]\n")
    return subprocess.run([sys.executable, "-m", "collbench", *args, "--config", str(cfg)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("verb", [["sweep"], ["compare"], ["topo", "compare"]])
def test_every_verb_says_the_same_about_the_same_bad_value(tmp_path, verb):
    """sweep, compare and topo compare parse --ops/--sizes through cli_values: one message each."""
    r = _verb(tmp_path, *verb, "--ops", "allgather,nope")
    assert r.returncode == 2 and "'nope': unknown op 'nope' (expected one of:" in r.stderr, r.stderr
    r = _verb(tmp_path, *verb, "--ops", "allgather", "--sizes", "1KB,3GB")
    assert r.returncode == 2 and "--sizes: '3GB' is out of range: above the 2 GB limit" in r.stderr, r.stderr
