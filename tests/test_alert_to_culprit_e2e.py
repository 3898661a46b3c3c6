"""From an alert to the culprit, end to end with real parts (issue 21 item 5).

An 8-host namespace testbed (own netns, address, sshd; one rank per host, ob1 over TCP) runs the
stress loop (one long-lived `collbench-engine --loop` job: alltoall 1MB steps, each with every
host's netstat read around it). Every host runs its own counters-only exporter in its namespace
(file_sd targets from `collbench scrape-config`), the master's exporter serves the results with
the latency_shift and congestion_top collectors, a real Prometheus (1 s scrape and evaluation,
the rules `collbench rules` generated, `for:` FOR below) sends to a real Alertmanager. Then:

  1. warm-up: the shift test's reference is taken; no CollbenchLatencyShift;
  2. a quiet run about as long as a fault phase takes (QUIET_S): no shift alert firing, and `diagnose`
     on that window's records names no suspect. It runs before the fault, not after it: in 2
     of 4 runs here (both with two busy loops beside) the steps stayed 10-30 % slower for tens of
     seconds after h3's marking and queue were removed (17-20 ms against a 15.2 ms reference;
     the ranks' off-CPU share was unchanged, the slowest rank on no one host; TCP windows backed
     off by the marks are a candidate cause, not established), so a window after the fault is
     not a quiet run;
  3. congestion: h3's egress is ECN-marked for real (`testbed.ecn_mark`, nftables) and queued
     behind a 400 Mbit/s tbf bottleneck -> the alert fires in Alertmanager naming h3's address
     in its summary, and `collbench diagnose` on the daemon's results names h3 with
     cause `congestion`. Why the queue: a marking switch port marks because its queue is building;
     marking alone on an idle veth under bbr added no delay (256 kbytes/s marking, every packet
     CE, slowed the 1MB alltoall steps by ~8 %, within this machine's noise). Re-measured since
     `testbed.up` pins cubic (issue 28): marking alone at 256 kbytes/s made 1MB alltoall 5.1x and
     allreduce 2.1x slower (4 hosts, docs/SETUP.md), so the queue is no longer needed for the
     slowdown; the congested port keeps both, its queue and its marks, as a real one has;
  4. the marking removed -> the alert resolves (gone from Alertmanager, no longer firing);
  5. the daemon stopped (`stress stop`). A link shaped with no marking, which the counters cannot
     see, is `collbench locate`'s: tests/test_locate_testbed.py names it on an 8-host testbed.

Eight hosts, as the issue asks: the whole test takes ~80-90 s on this 2-core machine under load.
The time from the fault to the shift, the alert and each named culprit is printed (FIGURES line,
shown by `pytest -s` and in `-rA`'s captured output).
Every wait has a deadline; the daemon, the exporters, Prometheus, Alertmanager and the testbed are
stopped whatever happens (the daemon by `stress stop`, else its process group by its pid file).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from conftest import REPO, is_root, require_tool, unused_port, wait_for
from lab import testbed
from prometheus_helpers import Prometheus, Service
from testbed_runs import seq_window

pytestmark = [pytest.mark.netns, pytest.mark.mpi, pytest.mark.slow, pytest.mark.alone]

HOSTS = 8
CONGESTED = 2                     # index of h3
MARK_RATE = "256kbytes"           # ECN-mark h3's egress beyond this (its TCP senders back off)
QUEUE_RATE = "400mbit"            # ... and queued behind a bottleneck of this rate (see the docstring)
COUNTERS_PORT = 9106
ALERT = "CollbenchLatencyShift"
FIRING = f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}'
# The alert's `for:` (alerts.for). The namespaces share this machine's two cores with whatever else
# runs: another process's burst of CPU load slows a few consecutive quiet steps by 30-45 %, which the
# CUSUM rightly calls a shift for some seconds (measured here: on for ~8 s). The alert's `for:` is
# what keeps such a transient from paging anyone, so it is set above that, as an operator would.
FOR = "15s"
# alerts.shift_ratio: how big a lasting rise must be to be a shift. The quiet steps' level wanders
# here: in three quiet runs the median of 8 steps reached 1.05, 1.09 and 1.24x that of the first
# 30 (after a fault, 1.34x), so the threshold is set above that, as an operator of such a machine
# would; the fault makes the steps ~8x slower (15 -> 125 ms).
SHIFT_RATIO = 1.5
# The quiet run's length: twice the alert's `for:` -- a transient must outlast `for:` to page, and
# this window holds two such -- and about the fault phase's length (fault -> alert -> cleared ->
# resolved: 27-52 s in the runs measured here, 33 s in the last).
QUIET_S = 30
PLAN = ("stress:\n  stop_grace: 5\n  plan:\n"
        "    - {op: alltoall, sizes: [1MB], iterations: 10, warmup: 1}\n")


def _collbench(*args, netns=None, timeout=120):
    pre = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run(pre + [sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def _latencies(path):
    """[(seq, ms)] of the results: what an assertion message shows of the series."""
    return [(x["seq"], round(x["latency_avg_us"] / 1e3, 1)) for x in _results(path)]



def _get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


def _results(path, after=0):
    try:
        with open(path) as f:
            recs = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
    return [r for r in recs if r.get("type") == "result" and r.get("seq", 0) > after]


class Stack:
    def __init__(self, bed, tmp):
        self.bed, self.tmp = bed, tmp
        self.cfg = bed["config"]
        self.state = os.path.join(bed["dir"], "state")
        self.log = os.path.join(self.state, "results.jsonl")
        self.services = []
        self.prom = self.am = None

    def query(self, expr):
        self.check()
        try:
            body = _get(f"{self.prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        except OSError:
            return None
        assert body["status"] == "success", body
        return body["data"]["result"]

    def am_alerts(self):
        """Alertmanager's active alerts named ALERT (resolved ones leave this list)."""
        self.check()
        try:
            alerts = _get(f"{self.am}/api/v2/alerts?" + urllib.parse.urlencode({"filter": f'alertname="{ALERT}"'}))
        except OSError:
            return None
        return [a for a in alerts if a["status"]["state"] == "active"]

    def check(self):
        for s in self.services:
            s.check_alive()

    def diagnose(self, results):
        r = _collbench("diagnose", results, "--config", self.cfg, "--format", "json", timeout=120)
        assert r.returncode in (0, 1) and r.stdout.startswith("{"), r.stderr
        return r.returncode, json.loads(r.stdout)

    def window(self, first_seq, last_seq, name):
        """The results of seq first..last as a file of their own (the daemon's lines, unchanged)."""
        path = os.path.join(self.tmp, name)
        seq_window(self.log, first_seq, last_seq, path)
        return path


def _stop_daemon(cfg, state):
    stop = _collbench("stress", "stop", "--config", cfg, timeout=60)
    pid_file = os.path.join(state, "stress.pid")
    if stop.returncode != 0 and os.path.exists(pid_file):
        try:     # the daemon's pid is its process group: end the group it leads, and only that
            os.killpg(int(open(pid_file).read().strip()), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass
    return stop


@pytest.fixture
def stack(tmp_path):
    assert is_root(), "the testbed needs root"
    alertmanager = require_tool("prometheus-alertmanager")
    tmp = str(tmp_path)
    bed = testbed.up(HOSTS, os.path.join(tmp, "tb"), python=sys.executable)
    st = Stack(bed, tmp)
    try:
        with open(bed["config"], "a") as f:
            f.write(f"step_timeout: 60s\ncongestion:\n  enabled: true\nalerts:\n  for: {FOR}\n"
                    f"  shift_ratio: {SHIFT_RATIO}\n" + PLAN)
        os.makedirs(st.state, exist_ok=True)
        rules = os.path.join(tmp, "rules.yml")
        r = _collbench("rules", "--config", bed["config"], "-o", rules)
        assert r.returncode == 0, r.stderr
        targets = os.path.join(tmp, "counters.json")
        r = _collbench("scrape-config", "--config", bed["config"], "--port", str(COUNTERS_PORT), "-o", targets)
        assert r.returncode == 0, r.stderr
        r = _collbench("scrape-config", "--format", "job", "--targets-path", targets)
        assert r.returncode == 0, r.stderr
        counters_job = yaml.safe_load(r.stdout)

        # a counters-only exporter in every host's namespace, on its own address
        for h in bed["hosts"]:
            st.services.append(Service(f"counters exporter {h['alias']}", [
                sys.executable, "-m", "collbench", "exporter", "--counters-only", "--config", bed["config"],
                "--listen", f"{h['addr']}:{COUNTERS_PORT}"], os.path.join(tmp, f"counters-{h['alias']}.log"),
                cwd=REPO, netns=h["netns"]))
        # the master's exporter: the daemon's results, the shift test and the top congested host
        ex_port, prom_port, am_port = unused_port(), unused_port(), unused_port()
        st.services.append(Service("exporter", [
            sys.executable, "-m", "collbench", "exporter", "--config", bed["config"], "--results-log", st.log,
            "--state-dir", st.state, "--poll-interval", "0.2", "--listen", f"127.0.0.1:{ex_port}",
            "--collectors", "results,congestion_top,latency_shift"], os.path.join(tmp, "exporter.log"), cwd=REPO))

        with open(os.path.join(tmp, "alertmanager.yml"), "w") as f:
            yaml.safe_dump({"route": {"receiver": "null", "group_by": ["alertname"], "group_wait": "1s",
                                      "group_interval": "1s", "repeat_interval": "1h"},
                            "receivers": [{"name": "null"}]}, f)
        st.services.append(Service("alertmanager", [
            alertmanager, f"--config.file={tmp}/alertmanager.yml", f"--storage.path={tmp}/am-data",
            f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=", "--log.level=warn"],
            os.path.join(tmp, "alertmanager.log"), cwd=REPO))
        # resend-delay 1s: an alert sent before Prometheus found Alertmanager is resent in 1 s, not 1 min
        st.services.append(Prometheus(tmp_path, {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [rules],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "collbench", "static_configs": [
                {"targets": [f"127.0.0.1:{ex_port}"]}]}] + counters_job}, prom_port, "--rules.alert.resend-delay=1s"))
        st.prom, st.am = f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}"

        def all_up():
            up = st.query("up") or []
            return len(up) == HOSTS + 1 and all(u["value"][1] == "1" for u in up)
        assert wait_for(all_up, 60, interval=0.5), st.query("up")
        yield st
    finally:
        try:
            testbed.ecn_clear(bed["dir"])
        finally:
            _stop_daemon(bed["config"], st.state)
            for s in reversed(st.services):
                s.stop()
            namespaces = [h["netns"] for h in bed["hosts"]]
            if os.path.exists(st.log):      # kept beside the test's other logs for a post-mortem
                shutil.copy(st.log, os.path.join(tmp, "results.jsonl"))
            testbed.down(bed["dir"])
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [ns for ns in namespaces if ns in listed]


def queue(host, rate):
    """The congested port's queue: a tbf bottleneck on the host's egress only (None removes it)."""
    pre = ["ip", "netns", "exec", host["netns"], "tc", "qdisc"]
    if rate:
        subprocess.run(pre + ["replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "256kb",
                              "latency", "50ms"], check=True)
    else:
        subprocess.run(pre + ["del", "dev", "eth0", "root"], check=True)


def test_congestion_alert_names_the_host_and_diagnose_names_the_culprit(stack):
    st, bed = stack, stack.bed
    congested = bed["hosts"][CONGESTED]
    figures = {}
    shift_series = f'collbench_latency_shift{{op="alltoall",size="1MB"}}'

    # ---- 1. warm-up: the daemon's steps reach the shift test, whose reference is then set
    r = _collbench("stress", "start", "--config", st.cfg, netns=bed["hosts"][0]["netns"])
    assert r.returncode == 0, r.stderr
    t_start = time.monotonic()
    ready = wait_for(lambda: st.query(shift_series), 90, interval=0.5)
    assert ready and ready[0]["value"][1] == "0", (ready, _results(st.log)[-2:])
    time.sleep(3)           # a few steps past the reference
    assert st.query(FIRING) == [] and st.am_alerts() == []

    def in_control():       # each phase starts from a test in control (a load burst may have moved it)
        cusum = st.query(f'collbench_latency_shift_cusum{{op="alltoall",size="1MB"}}') or []
        return cusum and float(cusum[0]["value"][1]) < 5 and st.query(shift_series)[0]["value"][1] == "0"
    assert wait_for(in_control, 60, interval=0.5), (st.query("collbench_latency_shift_cusum"), _latencies(st.log))
    warm_steps = len(_results(st.log))

    # ---- 2. a quiet run: never firing, no suspect
    first_quiet = max(x["seq"] for x in _results(st.log)) + 1
    t_quiet = time.monotonic()
    while time.monotonic() - t_quiet < QUIET_S:
        assert st.query(FIRING) == [] and st.am_alerts() == [], \
            f"{st.query('collbench_latency_shift_cusum')} first quiet seq {first_quiet}: {_latencies(st.log)}"
        time.sleep(1)
    window = f"{max(1, round(time.monotonic() - t_quiet))}s"
    assert st.query(f"count_over_time({FIRING}[{window}])") == [], st.query(f"count_over_time({FIRING}[{window}])")
    quiet = [x for x in _results(st.log) if x["seq"] >= first_quiet]
    assert quiet and all(x["congestion"]["hosts_read"] == HOSTS for x in quiet), quiet[-1:]
    rc, doc = st.diagnose(st.window(first_quiet, quiet[-1]["seq"], "quiet.jsonl"))
    # a load burst may still be a regression to diagnose (then `unexplained`, as in
    # tests/test_diagnose_testbed.py); what must never happen on a quiet run is a named culprit
    assert doc["verdict"] in ("no regression", "unexplained"), doc
    assert [s for s in doc["suspects"] if s["host"] or s["link"]] == [], json.dumps(doc["suspects"])
    # the warm-up was quiet too
    rc, doc = st.diagnose(st.window(0, first_quiet - 1, "warmup.jsonl"))
    assert [s for s in doc["suspects"] if s["host"] or s["link"]] == [], json.dumps(doc["suspects"])
    assert wait_for(in_control, 60, interval=0.5), (st.query("collbench_latency_shift_cusum"), _latencies(st.log))

    # ---- 3. congestion: h3's egress ECN-marked
    testbed.ecn_mark(bed["dir"], {congested["alias"]: MARK_RATE})
    queue(congested, QUEUE_RATE)
    t_fault = time.monotonic()

    def alert_names_host():
        if "fault_to_shift_s" not in figures and any(x["value"][1] == "1" for x in st.query(shift_series) or []):
            figures["fault_to_shift_s"] = time.monotonic() - t_fault
        alerts = st.am_alerts() or []
        # the suspect is in the summary, not a label: the alert keeps one identity while the top host
        # changes (prometheus/tests/shift.test.yml)
        named = [a for a in alerts if f"top suspect host: {congested['addr']} (" in a["annotations"].get("summary", "")]
        return named or None
    alerts = wait_for(alert_names_host, 60, interval=0.25)
    figures["fault_to_alert_s"] = time.monotonic() - t_fault
    assert alerts, (st.am_alerts(), st.query("collbench_latency_shift_cusum"),
                    st.query("collbench_step_congestion_top"), _results(st.log)[-2:])
    a = alerts[0]
    assert (a["labels"]["op"], a["labels"]["size"]) == ("alltoall", "1MB"), a
    assert f"top suspect host: {congested['addr']} (" in a["annotations"]["summary"], a

    # every host's own counters exporter saw the marks on its side: h3's peers received CE-marked
    # packets (InCEPkts), h3 itself none (its peers' egress is not marked)
    ce = {r["metric"]["host"]: float(r["value"][1]) for r in st.query(
        'increase(collbench_netstat_ip_in_ce_packets_total{job="collbench-counters"}[10s])') or []}
    assert sorted(h for h, v in ce.items() if v > 0) == sorted(h["addr"] for h in bed["hosts"] if h is not congested) \
        and ce.get(congested["addr"]) == 0, ce

    rc, doc = st.diagnose(st.log)
    figures["fault_to_diagnose_s"] = time.monotonic() - t_fault
    assert rc == 1 and doc["regressions"], doc
    top = doc["suspects"][0]
    assert top["cause"] == "congestion", json.dumps(doc["suspects"])
    # h3's egress is marked: its outgoing path, or the link out of it
    assert congested["addr"] in (top["host"], (top["link"] or [None])[0]), json.dumps(doc["suspects"])

    # ---- 4. the marking removed: the shift clears and the alert resolves
    testbed.ecn_clear(bed["dir"], [congested["alias"]])
    queue(congested, None)
    t_clear = time.monotonic()
    # resolved: the shift test back in control, nothing firing, nothing active in Alertmanager (the
    # shift flag is what says the latency came back)
    resolved = wait_for(lambda: (st.query(shift_series) or [{"value": [0, "1"]}])[0]["value"][1] == "0"
                        and st.am_alerts() == [] and st.query(FIRING) == [], 90, interval=0.5)
    figures["clear_to_resolved_s"] = time.monotonic() - t_clear
    assert resolved, (st.am_alerts(), st.query("collbench_latency_shift_cusum"), _latencies(st.log))
    figures["fault_phase_s"] = time.monotonic() - t_fault

    # ---- 5. the daemon stops cleanly (a link shaped with no marking, which the counters cannot see,
    # is `collbench locate`'s: tests/test_locate_testbed.py names it on an 8-host testbed like this one)
    stop = _stop_daemon(st.cfg, st.state)
    assert stop.returncode == 0, stop.stderr

    figures.update(hosts=HOSTS, warmup_steps=warm_steps, quiet_run_s=QUIET_S,
                   quiet_steps=len(quiet), total_s=round(time.monotonic() - t_start, 1))
    print("\nFIGURES " + json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in figures.items()}))
