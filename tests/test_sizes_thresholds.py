"""Sizes, durations and the seed-001 verdicts."""

import pytest

from collbench.sizes import format_size, parse_size
from collbench.thresholds import Thresholds, parse_duration_us


@pytest.mark.parametrize("text,nbytes", [
    ("1024", 1024), (1024, 1024), ("64KB", 65536), ("4MB", 4194304), ("4mb", 4194304),
    ("1K", 1024), ("1.5KB", 1536), ("2GB", 2147483648), ("1 MiB", 1048576), ("7B", 7),
])
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("bad", ["", "4XB", "-1", "0", "1.3B", "3GB", True, "MB", "1e6"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize("nbytes,label", [(1, "1B"), (1000, "1000B"), (1024, "1KB"), (131072, "128KB"),
                                          (4194304, "4MB"), (1536, "1536B"), (1 << 30, "1GB")])
def test_format_size_roundtrips(nbytes, label):
    assert format_size(nbytes) == label
    assert parse_size(label) == nbytes


@pytest.mark.parametrize("text,us", [("100us", 100.0), ("10ms", 10000.0), ("1.5s", 1.5e6), (250, 250.0)])
def test_parse_duration(text, us):
    assert parse_duration_us(text) == us


@pytest.mark.parametrize("bad", ["10", "ten ms", "0ms", -5, "5 min"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        parse_duration_us(bad)


def test_seed_verdicts_for_allreduce_1mb():
    t = Thresholds()
    mb = 1 << 20
    assert t.verdict("allreduce", mb, 9999.0) == "Good"
    assert t.verdict("allreduce", mb, 10000.0) == "Warning"
    assert t.verdict("allreduce", mb, 20000.0) == "Warning"
    assert t.verdict("allreduce", mb, 20000.1) == "Critical"
    assert t.verdict("bcast", mb, 15001.0) == "Critical"
    assert t.verdict("allreduce", 12345, 1e9) is None  # no threshold, no verdict


def test_custom_thresholds_replace_seed():
    t = Thresholds({("broadcast", "2MB"): (5.0, 6.0)})
    assert t.verdict("bcast", 2 << 20, 5.5) == "Warning"
    assert t.bounds("allreduce", 1 << 20) is None
