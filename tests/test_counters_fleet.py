"""Counters on every host (issue 20 item 2), the parts that run here without a testbed: the
counters-only exporter for real, the file_sd target list and scrape job, the systemd unit (its
command line read back the way systemd reads it), and `ctl deploy --counters-exporter` on this
machine with the systemctl stand-in. tests/test_counters_fleet_e2e.py runs it on every host of a
namespace testbed, scraped by a real Prometheus."""

import json
import subprocess
import sys
import urllib.request

import pytest
import yaml

from collbench.config import load_config
from collbench.ctl import counters_unit
from conftest import FIXTURES, REPO, require_tool, stop_process, unused_port, wait_for

sys.path.insert(0, str(FIXTURES))
from systemctl_standin import exec_start, split_command_line  # noqa: E402


def collbench(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)



def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


FIXTURE_FLAGS = ["--sysfs-root", str(FIXTURES / "sysfs-mlx5"), "--procfs-root", str(FIXTURES / "procfs"),
                 "--ethtool", str(FIXTURES / "ethtool" / "fake_ethtool")]


def test_counters_only_exporter_serves_the_congestion_counters_and_no_results(tmp_path):
    port = unused_port()
    # a state directory that does not exist and no results log: nothing of them is needed
    proc = subprocess.Popen([sys.executable, "-m", "collbench", "exporter", "--counters-only",
                             "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "none"),
                             *FIXTURE_FLAGS], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    try:
        body = wait_for(lambda: fetch(f"http://127.0.0.1:{port}/metrics"), 20, interval=0.2)
        assert body, proc.stderr.read1().decode() if proc.poll() is not None else "no answer"
        names = {line.split("{")[0].split()[0] for line in body.splitlines() if line and not line.startswith("#")}
        for name in ("collbench_rdma_np_ecn_marked_roce_packets_total", "collbench_rdma_port_xmit_wait_total",
                     "collbench_ethtool_pause_duration_seconds_total", "collbench_ethtool_pause_frames_total",
                     "collbench_netstat_ip_in_ce_packets_total"):
            assert name in names, name
        assert not [n for n in names if n.startswith(("collbench_stress", "collbench_results", "collbench_latency",
                                                      "collbench_last", "mpi_"))], names
        success = {line.split('"')[1]: line.split()[-1] for line in body.splitlines()
                   if line.startswith("collbench_collector_success{")}
        assert success == {"rdma_sysfs": "1.0", "ethtool": "1.0", "netstat": "1.0"}
        health = json.loads(fetch(f"http://127.0.0.1:{port}/health"))
        assert health["status"] == "ok" and health["counters_only"] is True
        assert not (tmp_path / "none").exists()
    finally:
        stop_process(proc)


@pytest.mark.parametrize("flags, expected", [
    (["--results-log", "/tmp/x.jsonl"], "--results-log reads the results log"),
    (["--baseline", "b.json"], "--baseline reads the results log"),
    (["--legacy-metrics"], "--legacy-metrics reads the results log"),
    (["--collectors", "results,netstat"], "--collectors: 'results' reads the results log"),
    (["--collectors", "netstat,congestion_top"], "--collectors: 'congestion_top' reads the results log"),
    (["--collectors", "netstat,bogus"], "unknown collector 'bogus'"),
])
def test_counters_only_refuses_what_needs_the_results_log(flags, expected):
    res = collbench("exporter", "--counters-only", *flags)
    assert res.returncode == 2 and expected in res.stderr, res.stderr


def test_scrape_config_targets_one_per_host_with_its_host_label(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# four nodes\nnode1 slots=8\nnode2 slots=8\n10.0.0.3\nnode1 slots=2\n")
    out = tmp_path / "targets.json"
    res = collbench("scrape-config", "--hostfile", str(hostfile), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text()) == [
        {"targets": ["node1:9106"], "labels": {"host": "node1"}},
        {"targets": ["node2:9106"], "labels": {"host": "node2"}},
        {"targets": ["10.0.0.3:9106"], "labels": {"host": "10.0.0.3"}}]
    # from the config's hosts, another port
    cfg = tmp_path / "c.yaml"
    cfg.write_text("hosts: hostfile\n")
    res = collbench("scrape-config", "--config", str(cfg), "--port", "9200")
    assert res.returncode == 0, res.stderr
    assert [g["targets"] for g in json.loads(res.stdout)] == [["node1:9200"], ["node2:9200"], ["10.0.0.3:9200"]]
    # the job that reads it, and Prometheus' own check of a config holding both
    res = collbench("scrape-config", "--format", "job", "--targets-path", str(out))
    assert res.returncode == 0, res.stderr
    job = yaml.safe_load(res.stdout)
    assert job == [{"job_name": "collbench-counters", "file_sd_configs": [{"files": [str(out)]}]}]
    prom = tmp_path / "prometheus.yml"
    prom.write_text(yaml.safe_dump({"scrape_configs": job}))
    check = subprocess.run([require_tool("promtool"), "check", "config", str(prom)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0 and "WARNING" not in check.stdout + check.stderr, check.stdout + check.stderr


@pytest.mark.parametrize("content, expected", [
    ("node1 slots=x\n", "line 1: got 'node1 slots=x'"),
    ("node1;rm -rf /\n", "line 1"),
    ("# nothing\n", "the hostfile lists no hosts"),
    (b"\xff\xfe\n", "is not UTF-8"),
])
def test_scrape_config_bad_hostfile_exits_2_naming_it_and_writes_nothing(tmp_path, content, expected):
    hostfile = tmp_path / "hostfile"
    hostfile.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "targets.json"
    out.write_text("previous\n")
    res = collbench("scrape-config", "--hostfile", str(hostfile), "-o", str(out))
    assert res.returncode == 2, res.stderr
    assert str(hostfile) in res.stderr and expected in res.stderr, res.stderr
    assert out.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostfile", "targets.json"]


def test_scrape_config_without_hosts_or_with_a_bad_port_exits_2(tmp_path):
    res = collbench("scrape-config")
    assert res.returncode == 2 and "names no hosts" in res.stderr
    (tmp_path / "h").write_text("n1\n")
    res = collbench("scrape-config", "--hostfile", str(tmp_path / "h"), "--port", "70000")
    assert res.returncode == 2 and "--port: got 70000" in res.stderr
    res = collbench("scrape-config", "--hostfile", str(tmp_path / "missing"))
    assert res.returncode == 2 and f"{tmp_path / 'missing'}: hostfile does not exist" in res.stderr


def test_checked_in_unit_is_the_generated_default():
    text = counters_unit.render_unit(load_config(None), "/opt/collbench/.venv/bin/python")
    assert (REPO / "deploy" / "collbench-counters.service").read_text() == text


def test_unit_command_line_reads_back_exactly_as_systemd_reads_it(tmp_path):
    """Values with spaces, quotes, backslashes, % and $ (a device regex) reach the exporter intact."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"exporter": {
        "sysfs_root": str(tmp_path / "sys root"), "device_include": r'^mlx5_[0-9]+$|"x"\d%h',
        "netdevs": ["eth0", "ens1f0np0"], "collectors": ["results", "rdma_sysfs", "netstat"],
        "collector_timeout": 1.5}}))
    c = load_config(str(cfg))
    unit = tmp_path / counters_unit.UNIT
    unit.write_text(counters_unit.render_unit(c, sys.executable, 9300))
    argv = exec_start(str(unit))
    assert argv == counters_unit.exporter_argv(c, sys.executable, 9300)
    assert argv[argv.index("--device-include") + 1] == r'^mlx5_[0-9]+$|"x"\d%h'
    assert argv[argv.index("--sysfs-root") + 1] == str(tmp_path / "sys root")
    assert argv[argv.index("--collectors") + 1] == "rdma_sysfs,netstat"
    assert argv[argv.index("--collector-timeout") + 1] == "1.5"
    assert "--listen" in argv and "0.0.0.0:9300" in argv and "--counters-only" in argv
    # and systemd's own reader accepts the unit (it refuses unbalanced quoting, unknown directives)
    analyze = subprocess.run([require_tool("systemd-analyze"), "verify", str(unit)], capture_output=True,
                             text=True, timeout=60)
    assert analyze.returncode == 0 and not analyze.stderr.strip(), analyze.stderr
    assert split_command_line('a "b c" "d\\"e" %%x $$y') == ["a", "b c", 'd"e', "%x", "$y"]


def test_unit_refuses_a_value_no_unit_file_can_hold(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"exporter": {"device_include": "mlx5\nExecStartPre=/bin/sh"}}))
    from collbench.errors import UserError
    with pytest.raises(UserError, match="without control characters"):
        counters_unit.render_unit(load_config(str(cfg)), "/opt/cb/.venv/bin/python")


def test_deploy_counters_exporter_on_this_machine(tmp_path):
    """`ctl deploy --local --counters-exporter`: the unit written, the stand-in systemctl starts it,
    deploy waits for /health; a second deploy restarts it; a failing systemctl is exit 1 naming the host."""
    units = tmp_path / "units"
    port = unused_port()
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f"#!/bin/sh\nexec {sys.executable} {FIXTURES / 'systemctl_standin.py'} --unit-dir {units} \"$@\"\n")
    systemctl.chmod(0o755)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"hosts": ["localhost"], "exporter": {
        "sysfs_root": str(FIXTURES / "sysfs-mlx5"), "ethtool": str(FIXTURES / "ethtool" / "fake_ethtool")}}))
    flags = ["ctl", "deploy", "--local", "--config", str(cfg), "--no-build", "--counters-exporter",
             "--counters-port", str(port), "--unit-dir", str(units), "--systemctl", str(systemctl)]
    try:
        res = collbench(*flags, timeout=120)
        assert res.returncode == 0, res.stderr
        assert f"localhost: counters exporter running ({units / counters_unit.UNIT}, :{port})" in res.stderr
        assert f"--listen 0.0.0.0:{port}" in (units / counters_unit.UNIT).read_text()
        body = fetch(f"http://127.0.0.1:{port}/metrics")
        assert body and "collbench_rdma_port_xmit_wait_total{" in body
        pid = int(next((units / ".standin").glob("*.pid")).read_text())
        res = collbench(*flags, timeout=120)
        assert res.returncode == 0, res.stderr
        assert int(next((units / ".standin").glob("*.pid")).read_text()) != pid   # restarted
        # a systemctl that fails: the host and the step are named, exit 1
        bad = tmp_path / "bad-systemctl"
        bad.write_text("#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n")
        bad.chmod(0o755)
        res = collbench(*flags[:-1], str(bad), timeout=120)
        assert res.returncode == 1
        assert "localhost: deploy failed: localhost: `" in res.stderr and "daemon-reload` failed (exit 1)" in res.stderr
    finally:
        subprocess.run([str(systemctl), "stop", counters_unit.UNIT], timeout=30)
    assert wait_for(lambda: fetch(f"http://127.0.0.1:{port}/health") is None, 10)


def test_deploy_refuses_bad_counters_flags(tmp_path):
    for flags, expected in ((["--counters-port", "0"], "--counters-port: got 0"),
                            (["--unit-dir", "relative/dir"], "--unit-dir: got 'relative/dir', expected an absolute path")):
        res = collbench("ctl", "deploy", "--local", "--no-build", "--counters-exporter", *flags)
        assert res.returncode == 2 and expected in res.stderr, res.stderr
