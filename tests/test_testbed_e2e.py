"""End to end on a 4-host namespace testbed: the controller, from the root namespace, deploys,
starts the daemon on the master namespace, the MPI job spans all 4 hosts, `status` and
`servers` report them, the exporter on the master serves fresh results, `once` streams its
table, Ctrl-C on `once` and `stop` leave no process on any host, and teardown removes it all.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from lab import testbed
from conftest import REPO, is_root, wait_for

pytestmark = [pytest.mark.netns, pytest.mark.mpi, pytest.mark.slow]

# what may live in a testbed namespace when nothing runs: its sshd listener
IDLE_PROGRAMS = ("sshd",)


def _ctl(cfg, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "collbench", "ctl", *args, "--config", cfg],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _ns_processes(desc):
    """{alias: [(pid, program, cmdline)]} of every process in each host's namespace."""
    out = {}
    for h in desc["hosts"]:
        rows = []
        for pid in testbed.netns_pids(h["netns"]):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = [a.decode() for a in f.read().split(b"\0") if a]
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            rows.append((pid, comm, " ".join(argv)))
        out[h["alias"]] = rows
    return out


def _job_processes(desc):
    return {a: [r for r in rows if not r[1].startswith(IDLE_PROGRAMS) or "notty" in r[2]]
            for a, rows in _ns_processes(desc).items()}


def _records(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


@pytest.fixture
def bed(tmp_path):
    assert is_root(), "the testbed needs root"
    desc = testbed.up(4, str(tmp_path / "tb"), python=sys.executable)
    try:
        with open(desc["config"], "a") as f:
            # no pause: one long-lived loop job, so `servers` sees the job's processes on every host
            # at once (with a pause, each pass is a job of a fraction of a second)
            f.write("step_timeout: 60s\n"
                    "stress:\n  stop_grace: 5\n  plan:\n"
                    "    - {op: allreduce, sizes: [1KB], iterations: 20, warmup: 2}\n"
                    "    - {op: bcast, sizes: [4KB], iterations: 20, warmup: 2}\n")
        yield desc
    finally:
        namespaces = [h["netns"] for h in desc["hosts"]]
        testbed.down(desc["dir"])
        assert testbed.down(desc["dir"]) is False          # idempotent
        assert desc["id"] not in [i for i, _, _ in testbed.registered()]
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [ns for ns in namespaces if ns in listed]
        assert desc["bridge"] not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        leftovers = subprocess.run(["pgrep", "-af", desc["dir"]], capture_output=True, text=True).stdout
        assert leftovers == "", leftovers


def test_controller_on_a_4_host_testbed(bed):
    cfg = bed["config"]
    master = bed["hosts"][0]
    state_dir = os.path.join(bed["dir"], "state")
    results = os.path.join(state_dir, "results.jsonl")
    exporter = None
    try:
        # deploy: the tree is shared with every namespace, so nothing is copied; config uploaded
        res = _ctl(cfg, "deploy")
        assert res.returncode == 0, res.stderr
        for h in bed["hosts"][1:]:
            assert f"{h['addr']}: collbench at {REPO} is up to date" in res.stderr
        remote_config = os.path.join(bed["dir"], "master", "collbench.yaml")
        assert open(remote_config).read() == open(cfg).read()
        assert os.path.isfile(os.path.join(bed["dir"], "master", "hostfile"))

        # the exporter on the master (systemd's job in production; scripts/deploy_exporter.sh)
        exporter = subprocess.Popen(
            ["ip", "netns", "exec", master["netns"], sys.executable, "-m", "collbench", "exporter",
             "--config", remote_config, "--log-level", "warning"], stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(bed["dir"], "exporter.log"), "wb"), start_new_session=True)

        res = _ctl(cfg, "start")
        assert res.returncode == 0, res.stderr + res.stdout
        # the daemon runs in the master's namespace, not here
        assert any("stress" in cmd for _, _, cmd in _ns_processes(bed)["h1"])
        # results from a job with one rank on each of the 4 hosts
        recs = wait_for(lambda: [r for r in _records(results) if r.get("type") == "result"], 60, interval=0.3)
        assert recs, open(os.path.join(state_dir, "daemon.log")).read()[-2000:]
        assert sorted(recs[0]["hosts"]) == sorted(h["addr"] for h in bed["hosts"])
        assert recs[0]["ranks"] == 4 and recs[0]["nodes"] == 4

        res = _ctl(cfg, "status")
        assert res.returncode == 0 and "running" in res.stdout, res.stdout + res.stderr
        assert "allreduce" in res.stdout
        # the seed's script, same verb, machine-readable
        res = subprocess.run([sys.executable, str(REPO / "mpi_bandwidth_stress.py"), "status", "--json",
                              "--config", cfg], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        st = json.loads(res.stdout)
        assert st["state"] == "running" and st["state_dir"] == state_dir
        addrs = sorted(h["addr"] for h in bed["hosts"])
        assert st["last_results"] and all(sorted(r["hosts"]) == addrs for r in st["last_results"])
        res = _ctl(cfg, "log", "--", "-n", "5", "--json")
        assert res.returncode == 0, res.stderr
        logged = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
        assert any(r["type"] == "result" and sorted(r["hosts"]) == addrs for r in logged)

        # servers: every host answers, with its own host name; the job's processes on each
        def all_hosts_busy():
            r = _ctl(cfg, "servers", "--json")
            rep = json.loads(r.stdout)
            rows = {row["host"]: row for row in rep["hosts"]}
            busy = all(any(p["name"].startswith(("collbench-engine", "orted", "mpirun"))
                           for p in row.get("processes") or ()) for row in rows.values())
            return (r, rows) if busy else None
        got = wait_for(all_hosts_busy, 40, interval=0.5)
        assert got, _ctl(cfg, "servers").stdout
        r, rows = got
        assert r.returncode == 0
        for h in bed["hosts"]:
            assert rows[h["addr"]]["reachable"] and rows[h["addr"]]["hostname"] == h["name"]
            assert rows[h["addr"]]["last_result"]["op"] in ("allreduce", "bcast")
        table = _ctl(cfg, "servers").stdout
        assert all(h["name"] in table for h in bed["hosts"])

        # the exporter on the master serves results of the last minute
        def fresh_metrics():
            try:
                body = urllib.request.urlopen(f"http://{master['addr']}:9105/metrics", timeout=5).read().decode()
            except OSError:
                return None
            stamps = [float(line.split()[-1]) for line in body.splitlines()
                      if line.startswith("collbench_result_timestamp_seconds{") and 'nodes="4"' in line]
            return body if stamps and time.time() - max(stamps) < 60 else None
        body = wait_for(fresh_metrics, 30, interval=1)
        assert body, "exporter served no fresh results"
        assert 'collbench_latency_avg_seconds{' in body and 'op="allreduce"' in body

        res = _ctl(cfg, "stop")
        assert res.returncode == 0, res.stderr
        exporter.terminate()
        exporter.wait(10)
        # nothing of the job is left on any host; only the sshd listeners remain
        left = wait_for(lambda: not any(_job_processes(bed).values()), 15, interval=0.3)
        assert left, _job_processes(bed)
        res = _ctl(cfg, "status")
        assert res.returncode == 3 and "stopped" in res.stdout

        # once: the table streams back; then Ctrl-C on a long once leaves nothing running
        res = _ctl(cfg, "once", "--", "--ops", "allreduce", "--sizes", "1KB", "--iterations", "5")
        assert res.returncode == 0, res.stderr
        assert "Allreduce" in res.stdout and "4 ranks on 4 nodes" in res.stdout and " 1KB " in res.stdout
        proc = subprocess.Popen([sys.executable, "-m", "collbench", "ctl", "once", "--config", cfg, "--",
                                 "--ops", "allreduce", "--sizes", "1KB,2KB,4KB,8KB", "--iterations", "100000"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
        assert wait_for(lambda: any(c == "collbench-engin" or c.startswith("collbench-engin")
                                    for rows in _ns_processes(bed).values() for _, c, _ in rows), 40, interval=0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert b"cancelled" in err
        left = wait_for(lambda: not any(_job_processes(bed).values()), 20, interval=0.3)
        assert left, _job_processes(bed)
    finally:
        if exporter is not None and exporter.poll() is None:
            exporter.kill()
            exporter.wait(10)
        _ctl(cfg, "stop", timeout=60)


def _netns_names():
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


def test_testbeds_side_by_side_with_rate_limits(tmp_path):
    a = testbed.up(2, str(tmp_path / "a"), rate_limit="200mbit", shaper="tbf", python=sys.executable)
    try:
        b = testbed.up(3, str(tmp_path / "b"), link_rates={"h2": "50mbit"}, python=sys.executable)
        try:
            import ipaddress
            na, nb = ipaddress.ip_network(a["subnet"]), ipaddress.ip_network(b["subnet"])
            assert not na.overlaps(nb) and na.subnet_of(testbed.SUBNET) and nb.subnet_of(testbed.SUBNET)
            assert a["id"] != b["id"] and not {h["netns"] for h in a["hosts"]} & {h["netns"] for h in b["hosts"]}

            def qdisc(ns, dev="eth0", what="qdisc"):
                return subprocess.run(["ip", "netns", "exec", ns, "tc", what, "show", "dev", dev],
                                      capture_output=True, text=True).stdout
            assert "tbf" in qdisc(a["hosts"][0]["netns"]) and "200Mbit" in qdisc(a["hosts"][0]["netns"])
            root_side = subprocess.run(["tc", "qdisc", "show", "dev", a["hosts"][1]["veth"]],
                                       capture_output=True, text=True).stdout
            assert "tbf" in root_side and "200Mbit" in root_side          # both directions shaped
            assert "rate 50Mbit" in qdisc(b["hosts"][1]["netns"], what="class")
            assert "htb" not in qdisc(b["hosts"][0]["netns"])             # only h2's link is limited
            # each host is reachable over SSH with the generated config, under its own name
            out = subprocess.run(["ssh", "-F", b["ssh_config"], "h3", "hostname"], capture_output=True,
                                 text=True, timeout=30)
            assert out.stdout.strip() == b["hosts"][2]["name"], out.stderr
        finally:
            testbed.down(b["dir"])
    finally:
        testbed.down(a["dir"])
    assert not {h["netns"] for h in a["hosts"] + b["hosts"]} & _netns_names()
    assert not os.path.exists(a["dir"]) and not os.path.exists(b["dir"])


def _links():
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def test_failed_up_leaves_nothing_behind(tmp_path):
    netns, links = _netns_names(), _links()
    with pytest.raises(testbed.TestbedError, match="unknown hosts: h9"):
        testbed.up(2, str(tmp_path / "bad"), link_rates={"h9": "1mbit"}, python=sys.executable)
    assert not os.path.exists(tmp_path / "bad" / "testbed.json")
    # other helpers' testbeds may come and go meanwhile: none of ours (cbtb*) may be new
    assert not {n for n in _netns_names() - netns if n.startswith("cbtb")}
    assert not {n for n in _links() - links if n.startswith(("cbtb", "cbtv", "cbtp"))}
