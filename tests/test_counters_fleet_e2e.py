"""Counters on every host, end to end on a 4-host namespace testbed (issue 20 item 2):
`collbench ctl deploy --counters-exporter` from the root namespace installs the counters exporter
unit on every host through the master (systemd cannot run here: a stand-in systemctl starts the
unit's ExecStart in that host's namespace), `collbench scrape-config` writes the file_sd targets
and job, `collbench rules` the lost link time recording rules, and a real Prometheus (Debian
package) scrapes every host: each target up with its `host` label, and every query of the
dashboard's per-host congestion row returns data for every host. The RDMA sysfs and ethtool
counters are fixture trees (no namespace has a NIC), driven upward while Prometheus scrapes;
netstat is each namespace's own.
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
import urllib.request

import pytest
import yaml

from conftest import FIXTURES, REPO, is_root, unused_port, wait_for
from lab import testbed
from prometheus_helpers import Prometheus

pytestmark = [pytest.mark.netns, pytest.mark.slow]

PORT = 9106
# Scrapes every 2 s: the ethtool collector shares one reading for 1 s (docs/METRICS.md), so two
# scrapes closer than that can see the same reading and irate() (the lost time rules) 0.
SCRAPE = "2s"
RATE = "10s"       # for $__rate_interval


def collbench(*args, timeout=120):
    res = subprocess.run([sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                         timeout=timeout, cwd=REPO)
    assert res.returncode == 0, f"collbench {' '.join(args)}: {res.stdout}{res.stderr}"
    return res



def per_host_row_queries():
    """(title, expr) of every query in the checked-in dashboard's per-host congestion row."""
    from collbench.monitoring.dashboard import TOP_K
    d = json.loads((REPO / "grafana" / "collbench-dashboard.json").read_text())
    titles = [p["title"] for p in d["panels"]]
    start = titles.index(f"Congestion on every host (top {TOP_K})")
    out = []
    for p in d["panels"][start + 1:]:
        if p["type"] == "row":
            break
        out += [(p["title"], t["expr"]) for t in p["targets"]]
    (host,) = [v for v in d["templating"]["list"] if v["name"] == "host"]
    return out, host


class Bumper:
    """Drives the fixture counters upward (as a busy port would) until stopped."""

    def __init__(self, sysfs, ethtool_dir):
        self.xmit_wait = sysfs / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters" / "port_xmit_wait"
        self.stats = ethtool_dir / "mlx5_ens1f0np0.txt"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        lines = self.stats.read_text().splitlines()
        start = {line.split(":")[0].strip(): int(line.split(":")[1]) for line in lines if ":" in line
                 and line.split(":")[0].strip() in ("rx_prio3_pause_duration", "rx_prio3_pause")}
        wait, pause_us, frames = int(self.xmit_wait.read_text()), start["rx_prio3_pause_duration"], start["rx_prio3_pause"]
        while not self.stop.wait(0.25):
            wait += 12_500_000                 # 0.1 s of 8 ns ticks per 0.25 s: 40 % blocked
            pause_us += 50_000                 # 0.05 s paused per 0.25 s on rx priority 3: 20 %
            frames += 100
            tmp = self.xmit_wait.with_suffix(".tmp")
            tmp.write_text(f"{wait}\n")
            os.replace(tmp, self.xmit_wait)
            moved = {"rx_prio3_pause_duration": pause_us, "rx_prio3_pause": frames}
            out = [f"     {line.split(':')[0].strip()}: {moved[line.split(':')[0].strip()]}"
                   if line.split(":")[0].strip() in moved else line for line in lines]
            tmp = self.stats.with_suffix(".tmp")
            tmp.write_text("\n".join(out) + "\n")
            os.replace(tmp, self.stats)

    def close(self):
        self.stop.set()
        self.thread.join(5)


def test_counters_exporters_on_every_testbed_host_scraped_by_prometheus(tmp_path):
    assert is_root(), "the testbed needs root"
    sysfs = tmp_path / "sysfs"
    shutil.copytree(FIXTURES / "sysfs-mlx5", sysfs, symlinks=True)
    ethtool_dir = tmp_path / "ethtool"
    shutil.copytree(FIXTURES / "ethtool", ethtool_dir)
    assert "rx_prio3_pause_duration:" in (ethtool_dir / "mlx5_ens1f0np0.txt").read_text()
    units = tmp_path / "units"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f"#!/bin/sh\nexec {sys.executable} {FIXTURES / 'systemctl_standin.py'} "
                         f"--unit-dir {units} \"$@\"\n")
    systemctl.chmod(0o755)

    bed = testbed.up(4, str(tmp_path / "tb"), python=sys.executable)
    prom, bumper = None, None
    try:
        cfg = bed["config"]
        data = yaml.safe_load(open(cfg))
        data["exporter"].update(sysfs_root=str(sysfs), ethtool=str(ethtool_dir / "fake_ethtool"))
        with open(cfg, "w") as f:
            yaml.safe_dump(data, f, sort_keys=False)
        addrs = [h["addr"] for h in bed["hosts"]]

        # deploy: through the master (h1) to every host, the master's own unit included
        res = collbench("ctl", "deploy", "--config", cfg, "--no-build", "--counters-exporter",
                        "--unit-dir", str(units), "--systemctl", str(systemctl), timeout=240)
        for a in addrs:
            assert f"{a}: counters exporter running ({units / 'collbench-counters.service'}, :{PORT})" in res.stderr, \
                res.stderr
        # each host's exporter runs in that host's namespace
        for h in bed["hosts"]:
            cmdlines = [open(f"/proc/{p}/cmdline", "rb").read() for p in testbed.netns_pids(h["netns"])
                        if os.path.exists(f"/proc/{p}/cmdline")]
            assert any(b"--counters-only" in c for c in cmdlines), h["alias"]

        targets = tmp_path / "targets.json"
        collbench("scrape-config", "--config", cfg, "-o", str(targets))
        job = yaml.safe_load(collbench("scrape-config", "--format", "job", "--targets-path", str(targets)).stdout)
        rules = tmp_path / "rules.yml"
        collbench("rules", "--config", cfg, "-o", str(rules))
        bumper = Bumper(sysfs, ethtool_dir)
        prom = Prometheus(tmp_path, {"global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
                                     "rule_files": [str(rules)], "scrape_configs": job}, unused_port())
        query, prom_url = prom.query, prom.url

        def all_up():
            up = prom.try_query('up{job="collbench-counters"}')
            return up if up is not None and sorted((u["metric"].get("host"), u["value"][1]) for u in up) == \
                sorted((a, "1") for a in addrs) else None
        up = wait_for(all_up, 40, interval=0.5)
        assert up, query("up")
        for u in up:
            assert u["metric"]["instance"] == f"{u['metric']['host']}:{PORT}"

        # every query of the per-host row, at the host variable's All value: data for every host
        # (top-k panels: the driven series of every host rank above the idle ones)
        queries, host_var = per_host_row_queries()
        assert len(queries) == 7
        host_values = urllib.request.urlopen(f"{prom_url}/api/v1/label/host/values?" + urllib.parse.urlencode(
            {"match[]": host_var["query"]["query"][len("label_values("):-len(", host)")]}), timeout=10).read()
        assert sorted(json.loads(host_values)["data"]) == sorted(addrs)

        def every_query_has_every_host():
            missing = []
            for title, expr in queries:
                expr = expr.replace("$host", host_var["allValue"]).replace("$__rate_interval", RATE)
                result = query(expr)
                hosts = {r["metric"].get("host") for r in result}
                if hosts != set(addrs):
                    missing.append(f"{title}: {expr} -> hosts {sorted(h for h in hosts if h)}")
            return missing
        missing = wait_for(lambda: not every_query_has_every_host(), 30, interval=1)
        assert missing, every_query_has_every_host()

        # the lost link time rules see the driven counters: ~40 % blocked (xmit_wait on mlx5_0),
        # ~20 % paused on rx priority 3 (ens1f0np0), on every host; idle ports at 0
        def lost_time():
            xw = query('collbench:xmit_wait_lost_link_time:ratio{device="mlx5_0"}')
            pz = query('collbench:pause_lost_link_time:ratio{netdev="ens1f0np0",priority="3",direction="rx"}')
            ok = (len(xw) == len(pz) == 4 and all(0.2 < float(r["value"][1]) <= 0.6 for r in xw)
                  and all(0.05 < float(r["value"][1]) <= 0.4 for r in pz))
            return (xw, pz) if ok else None
        got = wait_for(lost_time, 20, interval=0.5)
        assert got, (query("collbench:xmit_wait_lost_link_time:ratio"),
                     query('collbench:pause_lost_link_time:ratio{priority="3"}'))
        assert {r["metric"]["host"] for r in got[0]} == set(addrs)
        idle = query('collbench:xmit_wait_lost_link_time:ratio{device="mlx5_1"}')
        assert len(idle) == 4 and all(float(r["value"][1]) == 0 for r in idle)
    finally:
        if bumper is not None:
            bumper.close()
        if prom is not None:
            prom.stop()
        testbed.down(bed["dir"])
    # nothing left: the exporters died with their namespaces
    left = subprocess.run(["pgrep", "-af", str(tmp_path)], capture_output=True, text=True).stdout
    assert left == "", left
