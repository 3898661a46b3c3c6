"""Shared test fixtures. Area-specific helpers live beside their tests."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:   # the lab package (lab/testbed.py) lives beside collbench, unpackaged
    sys.path.insert(0, str(REPO))
FIXTURES = REPO / "tests" / "fixtures"
# A suite started in the background by a non-interactive shell (`./scripts/run_tests.sh &`, nohup)
# inherits SIGINT ignored, and so would every command the tests start, which then never see the
# Ctrl-C the interrupt tests send. A handled signal is reset to the default on exec: handle it here.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Real OSU 7.4 output, captured once and kept in the repository (a clone has nothing beside it).
OSU_FIXTURES = FIXTURES / "osu-7.4"


@pytest.fixture
def repo():
    return REPO


def unused_port():
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port():
    return unused_port()


@pytest.fixture
def collbench_cmd():
    """argv prefix that runs this checkout's collbench CLI with the current interpreter."""
    return [sys.executable, "-m", "collbench"]


def require_tool(name):
    """The path of a tool the suite installs (scripts/install.sh); a missing one is a failure, not a skip."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run scripts/install.sh")
    return path


def is_root():
    return os.geteuid() == 0


def wait_for(predicate, timeout=10.0, interval=0.05):
    """Poll predicate() until it is truthy or timeout s have passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def stop_process(proc, timeout=10.0):
    """SIGTERM a Popen, SIGKILL it if it has not exited within timeout s; reaped either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def namespace_testbed(n, directory, config_extra="", **kw):
    """A testbed of n hosts in network namespaces (lab/testbed.py up), config_extra appended to its
    config; torn down on the way out whatever happened, and checked gone: no namespace of it is
    left in `ip netns list`."""
    from lab import testbed
    assert is_root(), "the testbed needs root"
    desc = testbed.up(n, str(directory), python=sys.executable, **kw)
    try:
        if config_extra:
            with open(desc["config"], "a") as f:
                f.write(config_extra)
        yield desc
    finally:
        namespaces = [h["netns"] for h in desc["hosts"]]
        testbed.down(desc["dir"])
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [ns for ns in namespaces if ns in listed]
