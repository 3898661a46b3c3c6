"""The testbed's generated files without building namespaces: the config loads, carries the
short plan by default and seed 001's with --full-plan; the hints printed by `up` work from any
shell. (The namespaces, sshd and a real run: test_testbed_e2e.py.)"""

import os
import shlex
import subprocess
import sys

from conftest import REPO

from lab import testbed
from collbench.config import PROTOTYPE_PLAN, default_plan, load_config


def _generate(tmp_path, full_plan):
    d = tmp_path / ("full" if full_plan else "quick")
    d.mkdir()
    desc = {"id": "abc123", "dir": str(d), "subnet": "198.18.0.8/29",
            "hosts": [{"alias": f"h{i}", "name": f"cbtb-abc123-h{i}", "netns": f"cbtb-abc123-h{i}",
                       "addr": f"198.18.0.{9 + i}", "dir": str(d / "hosts" / f"h{i}")} for i in (1, 2, 3)]}
    testbed._keys_and_files(desc, slots=1, python=sys.executable, full_plan=full_plan)
    return desc, load_config(desc["config"])


def test_generated_config_has_a_short_plan(tmp_path):
    desc, cfg = _generate(tmp_path, full_plan=False)
    assert desc["plan"] == "quick"
    for plan in (cfg.once_plan(), cfg.stress_plan()):
        assert 3 <= len(plan) <= 6
        assert all(s.iterations <= 20 and s.warmup <= 2 for s in plan)
        assert max(s.size_bytes for s in plan) <= 1 << 20
        assert "allreduce" in {s.op for s in plan}
    assert [h.name for h in cfg.hosts] == ["198.18.0.10", "198.18.0.11", "198.18.0.12"]


def test_full_plan_flag_leaves_the_seed_plan(tmp_path):
    desc, cfg = _generate(tmp_path, full_plan=True)
    assert desc["plan"] == "seed 001 (full)"
    assert cfg.stress_plan() == default_plan(PROTOTYPE_PLAN, cfg.datatype)
    assert max(s.size_bytes for s in cfg.stress_plan()) == 4 << 20
    assert "plan:" not in open(desc["config"]).read()


def test_env_lines_name_the_master_namespace(tmp_path):
    desc, _ = _generate(tmp_path, full_plan=False)
    out = subprocess.run(["sh", "-c", "\n".join(testbed.env_lines(desc)) + '\necho "$COLLBENCH_TESTBED_MASTER_NETNS"'],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "cbtb-abc123-h1"


def test_printed_commands_work_outside_the_venv(tmp_path):
    """`up` prints commands by full path: they run from another directory with a bare PATH
    (no venv activated, no `python` on it)."""
    collbench = shlex.split(testbed.collbench_command())
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    r = subprocess.run([*collbench, "--help"], capture_output=True, text=True, cwd=tmp_path, env=bare, timeout=60)
    assert r.returncode == 0 and "ctl" in r.stdout, r.stderr
    script = os.path.join(str(REPO), "scripts", "testbed.sh")
    r = subprocess.run([script, "down", str(tmp_path / "no-such-testbed")], capture_output=True, text=True,
                       cwd=tmp_path, env=bare, timeout=60)
    assert r.returncode == 0 and "nothing to remove" in r.stderr, r.stderr
