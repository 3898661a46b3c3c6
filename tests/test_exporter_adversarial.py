"""The per-host counters exporter (`collbench exporter --counters-only`) against a host whose
sysfs, procfs and ethtool an adversary (or a stuck driver) controls (issue 26, "The exporter").

One table row per case: how the fixture host is spoiled, and what must hold of a real exporter
process serving it. Every row checks the same promises besides its own: the first /metrics
answers within SCRAPE_TIMEOUT with a scrape Prometheus accepts (no series twice), and SIGTERM
ends the process within a second. A FIFO stands in for a stuck driver (its open or read never
returns); /dev/zero for an endless file. Each row failed on the code before this change (the
exporter hung for good, read gigabytes, served duplicate series, left ethtool's children
running, or ignored SIGTERM); the exporter runs under an address-space limit so that a row run
against such code fails instead of eating the machine.
"""

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Callable

import pytest

from conftest import FIXTURES, REPO, unused_port, wait_for
from exporter_helpers import parse_exposition, sample

SCRAPE_TIMEOUT = 5.0          # Prometheus' scrape_timeout here: the default collector deadline is 3 s
STOP_SECONDS = 1.0            # SIGTERM to exit
ADDRESS_SPACE = 2 << 30       # the exporter's RLIMIT_AS: reading /dev/zero whole fails fast instead
HW = "class/infiniband/mlx5_0/ports/1/hw_counters"
PORT = "class/infiniband/mlx5_0/ports/1/counters"
NDEVS = "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs"


# ------------------------------------------------------------------------------------ helpers

def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def get(url, timeout):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def health_code(url):
    """The status /health answers (a 503 is an answer, not an error)."""
    try:
        return get(url + "/health", 5)[0]
    except urllib.error.HTTPError as e:
        return e.code


def marker_pids(marker):
    """Pids of the processes whose command line holds marker (the row's own hung commands)."""
    marker = "\0" + marker + "\0"
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if marker.encode() in b"\0" + f.read():
                        out.append(int(d))
            except OSError:
                pass
    return out


def duplicate_series(text):
    seen, dups = set(), []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series = line.rsplit(" ", 1)[0]
            if series in seen:
                dups.append(series)
            seen.add(series)
    return dups


def vm_hwm_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


class Host:
    """A copy of the mlx5 fixture host (sysfs, procfs, ethtool stand-in) for one row to spoil."""

    def __init__(self, tmp):
        self.tmp = str(tmp)
        self.sysfs = os.path.join(self.tmp, "sys")
        self.procfs = os.path.join(self.tmp, "proc")
        shutil.copytree(FIXTURES / "sysfs-mlx5", self.sysfs, symlinks=True)
        shutil.copytree(FIXTURES / "procfs", self.procfs, symlinks=True)
        self.ethtool = str(FIXTURES / "ethtool" / "fake_ethtool")
        # the hung command's sleeps run this many seconds: a number no other process has in its argv
        self.marker = f"600.{uuid.uuid4().int % 10**9:09d}"
        self.flags = []
        self.fifos = []

    def path(self, rel):
        return os.path.join(self.sysfs, rel)

    def fifo(self, path):
        """A FIFO at path that nobody writes: its open (blocking) never returns, like a stuck read."""
        if os.path.lexists(path):
            os.remove(path)
        os.mkfifo(path)
        self.fifos.append(path)

    def link(self, path, target):
        if os.path.lexists(path):
            os.remove(path)
        os.symlink(target, path)

    def hung_ethtool(self):
        """An --ethtool command that never answers and leaves a child of its own holding its output,
        as a wrapper around a stuck driver query would."""
        script = os.path.join(self.tmp, "hung_ethtool")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\nsleep {self.marker} &\nexec sleep {self.marker}\n")
        os.chmod(script, 0o755)
        self.ethtool = script

    def argv(self, port):
        return [sys.executable, "-m", "collbench", "exporter", "--counters-only", "--listen", f"127.0.0.1:{port}",
                "--sysfs-root", self.sysfs, "--procfs-root", self.procfs, "--ethtool", self.ethtool, *self.flags]

    def unblock(self):
        """Open every FIFO for writing and close it: a thread still blocked on one returns."""
        for path in self.fifos:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass


class Exporter:
    def __init__(self, host):
        self.host = host
        self.port = unused_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(host.argv(self.port), cwd=str(REPO), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, preexec_fn=_limit_memory)

    def wait_listening(self):
        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"exporter exited {self.proc.returncode}: {self.proc.stderr.read()}")
            try:
                return get(self.url + "/health", 2)
            except OSError as e:
                return getattr(e, "code", None) and (e.code, "")
        assert wait_for(up, 30, 0.05), "the exporter did not answer /health"

    def scrape(self):
        """(seconds, exposition text); AssertionError when /metrics does not answer in time."""
        t0 = time.monotonic()
        try:
            status, text = get(self.url + "/metrics", SCRAPE_TIMEOUT)
        except OSError as e:
            raise AssertionError(f"/metrics did not answer within {SCRAPE_TIMEOUT} s: {e}") from None
        assert status == 200
        return time.monotonic() - t0, text

    def health(self):
        try:
            status, text = get(self.url + "/health", SCRAPE_TIMEOUT)
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        return status, json.loads(text)

    def sigterm(self):
        """Seconds from SIGTERM to exit; None if it had not exited within 5 s (then killed)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(5)
            return time.monotonic() - t0
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()


# ------------------------------------------------------------------------------------ the table

@dataclass
class Case:
    id: str
    spoil: Callable                  # (host) -> None
    check: Callable                  # (host, exporter, metrics dict, exposition text) -> None
    success: dict = field(default_factory=dict)   # collector -> expected collbench_collector_success
    errors: tuple = ()               # (collector, reason) that must be counted


def _hw_fifo(h):
    h.fifo(h.path(f"{HW}/np_cnp_sent"))


def _port_fifo(h):
    h.fifo(h.path(f"{PORT}/port_xmit_wait"))


def _netstat_fifo(h):
    h.fifo(os.path.join(h.procfs, "net", "netstat"))


def _ndevs_fifo(h):
    h.fifo(h.path(f"{NDEVS}/0"))


def _netstat_zero(h):
    h.link(os.path.join(h.procfs, "net", "netstat"), "/dev/zero")


def _ndevs_zero(h):
    h.link(h.path(f"{NDEVS}/0"), "/dev/zero")


def _netstat_huge(h):
    with open(os.path.join(h.procfs, "net", "netstat"), "ab") as f:
        f.truncate(64 << 20)         # sparse: 64 MB of NULs after the real text


def _duplicate_names(h):
    for name, value in (("np-cnp_sent", "7\n"), ("NP_CNP_SENT", "8\n"), ("np_cnp_sent_total", "9\n"),
                        ("Np.Cnp.Sent", "10\n")):
        with open(h.path(f"{HW}/{name}"), "w") as f:
            f.write(value)


def _device_name_not_utf8(h):
    bad = os.path.join(os.fsencode(h.path("class/infiniband")), b"mlx5_\xff\xfe")
    os.makedirs(os.path.join(bad, b"ports", b"1", b"hw_counters"))
    with open(os.path.join(bad, b"ports", b"1", b"hw_counters", b"np_cnp_sent"), "w") as f:
        f.write("5\n")


def _check_device_name(h, ex, m, text):
    assert sample(m, "collbench_rdma_np_cnp_sent_total", device="mlx5_0", port="1") == 48190
    assert not [k for k in m if dict(k[1]).get("device", "").startswith("mlx5_\ufffd")], "the bad name served"


def _regex_bomb(h):
    os.rename(h.path("class/infiniband/mlx5_1"), h.path("class/infiniband/" + "a" * 40 + "!"))
    h.flags += ["--device-include", "(a+)+"]


def _hung_ethtool(h):
    h.hung_ethtool()
    h.flags += ["--netdevs", "eth0,eth1,eth2", "--collectors", "ethtool,netstat"]   # 3 x the 2 s command timeout


def _check_hw_fifo(h, ex, m, text):
    # the other counters of the port are served; the FIFO is not read
    assert sample(m, "collbench_rdma_np_ecn_marked_roce_packets_total", device="mlx5_0", port="1") is not None
    assert sample(m, "collbench_rdma_np_cnp_sent_total", device="mlx5_0", port="1") is None


def _check_port_fifo(h, ex, m, text):
    assert sample(m, "collbench_rdma_port_xmit_data_bytes_total", device="mlx5_0", port="1") is not None
    assert sample(m, "collbench_rdma_port_xmit_wait_total", device="mlx5_0", port="1") is None


def _check_no_netstat(h, ex, m, text):
    assert sample(m, "collbench_netstat_ip_in_ce_packets_total") is None
    assert vm_hwm_mb(ex.proc.pid) < 300, "the exporter read the endless file"


def _check_ndevs(h, ex, m, text):
    # ndevs/1 names the same netdev: its statistics are still served
    assert sample(m, "collbench_ethtool_rx_discards_phy_total", netdev="ens1f0np0") is not None
    assert vm_hwm_mb(ex.proc.pid) < 300, "the exporter read the endless file"


def _check_duplicates(h, ex, m, text):
    # one series, from the file whose name is the metric's (np_cnp_sent: the fixture's value)
    assert sample(m, "collbench_rdma_np_cnp_sent_total", device="mlx5_0", port="1") == 48190


def _check_regex(h, ex, m, text):
    assert "a" * 40 + "!" not in text
    assert not [k for k in m if k[0].startswith("collbench_rdma_")], "no device matches (a+)+ whole"


def _check_hung_ethtool(h, ex, m, text):
    assert sample(m, "collbench_collector_timeouts_total", collector="ethtool") >= 1
    assert sample(m, "collbench_netstat_ip_in_ce_packets_total") is not None
    status, health = ex.health()          # consistent with /metrics: answering, the stuck one named
    assert status == 200 and health["status"] == "degraded", health
    assert "hung_ethtool -S eth" in health["stuck_collectors"]["ethtool"]["reading"], health  # what it waits on
    # the next scrape answers at once (the stuck collector is not started again) and counts it
    seconds, text2 = ex.scrape()
    assert seconds < 1.0, seconds
    m2 = parse_exposition(text2)
    assert sample(m2, "collbench_collector_timeouts_total", collector="ethtool") >= 2
    assert len(marker_pids(h.marker)) <= 4, "a stuck collector was started again"
    # each command is killed with its whole process group at its timeout: no child is left
    assert wait_for(lambda: not marker_pids(h.marker), 12, 0.1), "ethtool's children were left running"
    wait_for(lambda: not ex.health()[1]["stuck_collectors"], 5)
    m3 = parse_exposition(ex.scrape()[1])
    assert sample(m3, "collbench_collector_errors_total", collector="ethtool", reason="command_timeout") == 3


CASES = [
    Case("hw_counter_fifo", _hw_fifo, _check_hw_fifo, {"rdma_sysfs": 1, "ethtool": 1, "netstat": 1},
         (("rdma_sysfs", "not_regular_file"),)),
    Case("port_counter_fifo", _port_fifo, _check_port_fifo, {"rdma_sysfs": 1, "ethtool": 1, "netstat": 1},
         (("rdma_sysfs", "not_regular_file"),)),
    Case("netstat_fifo", _netstat_fifo, _check_no_netstat, {"rdma_sysfs": 1, "ethtool": 1, "netstat": 0},
         (("netstat", "not_regular_file"),)),
    Case("gid_ndevs_fifo", _ndevs_fifo, _check_ndevs, {"rdma_sysfs": 1, "ethtool": 1, "netstat": 1},
         (("ethtool", "not_regular_file"),)),
    Case("netstat_dev_zero", _netstat_zero, _check_no_netstat, {"rdma_sysfs": 1, "ethtool": 1, "netstat": 0},
         (("netstat", "not_regular_file"),)),
    Case("netstat_64mb", _netstat_huge, _check_no_netstat, {"rdma_sysfs": 1, "ethtool": 1, "netstat": 0},
         (("netstat", "too_large"),)),
    Case("gid_ndevs_dev_zero", _ndevs_zero, _check_ndevs, {"rdma_sysfs": 1, "ethtool": 1, "netstat": 1},
         (("ethtool", "not_regular_file"),)),
    Case("counter_names_sanitize_alike", _duplicate_names, _check_duplicates,
         {"rdma_sysfs": 1, "ethtool": 1, "netstat": 1}, (("rdma_sysfs", "duplicate_series"),)),
    Case("device_name_not_utf8", _device_name_not_utf8, _check_device_name,
         {"rdma_sysfs": 1, "ethtool": 1, "netstat": 1}, (("rdma_sysfs", "unreadable"),)),
    Case("device_include_backtracking", _regex_bomb, _check_regex, {"rdma_sysfs": 0, "ethtool": 0, "netstat": 1}),
    Case("ethtool_command_hangs_with_children", _hung_ethtool, _check_hung_ethtool, {"ethtool": 0, "netstat": 1}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_exporter_adversarial(case, tmp_path):
    host = Host(tmp_path)
    case.spoil(host)
    ex = Exporter(host)
    try:
        ex.wait_listening()
        seconds, text = ex.scrape()
        assert duplicate_series(text) == [], "a series twice: Prometheus rejects the whole scrape"
        m = parse_exposition(text)
        for collector, ok in case.success.items():
            assert sample(m, "collbench_collector_success", collector=collector) == ok, collector
        for collector, reason in case.errors:
            assert (sample(m, "collbench_collector_errors_total", collector=collector, reason=reason) or 0) >= 1, \
                (collector, reason)
        case.check(host, ex, m, text)
        took = ex.sigterm()
        assert took is not None and took < STOP_SECONDS, f"SIGTERM answered in {took} s"
        assert ex.proc.returncode == 0
    finally:
        host.unblock()
        ex.kill()
        for pid in marker_pids(host.marker):      # the row's own hung commands, by pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_sigterm_while_a_hung_command_runs_kills_its_tree(tmp_path):
    """SIGTERM while the ethtool collector waits on a hung command: the exporter exits within a
    second and takes the command's process group with it."""
    host = Host(tmp_path)
    host.hung_ethtool()
    host.flags += ["--netdevs", "eth0", "--collectors", "ethtool"]
    ex = Exporter(host)
    try:
        ex.wait_listening()
        def scrape():
            try:
                get(ex.url + "/metrics", SCRAPE_TIMEOUT)
            except OSError:
                pass        # the exporter went away under it: expected
        threading.Thread(target=scrape, daemon=True).start()
        assert wait_for(lambda: len(marker_pids(host.marker)) >= 2, 10), "the command did not start"
        took = ex.sigterm()
        assert took is not None and took < STOP_SECONDS, f"SIGTERM answered in {took} s"
        assert wait_for(lambda: not marker_pids(host.marker), 2), "the command's children outlived the exporter"
    finally:
        ex.kill()
        for pid in marker_pids(host.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_stuck_collector_is_not_started_again_until_it_returns():
    """CollectorSet: a collector blocked past its deadline is success 0 and counted on every
    collection, entered once however many collections come, and served again once it returns."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from collbench.exporter.collectors import Collector, CollectorSet

    release = threading.Event()

    class Stuck(Collector):
        name = "stuck"
        entered = 0

        def collect(self):
            Stuck.entered += 1
            self.reading = "/sys/class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent"
            release.wait(30)
            return [GaugeMetricFamily("stuck_value", "x", value=1)]

    class Quick(Collector):
        name = "quick"

        def collect(self):
            return [GaugeMetricFamily("quick_value", "x", value=2)]

    cs = CollectorSet([Stuck(), Quick()], timeout=0.2)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(cs)
    for n in range(1, 6):
        t0 = time.monotonic()
        m = parse_exposition(generate_latest(reg).decode())
        assert time.monotonic() - t0 < 1.0
        assert sample(m, "collbench_collector_success", collector="stuck") == 0
        assert sample(m, "collbench_collector_success", collector="quick") == 1
        assert sample(m, "quick_value") == 2 and sample(m, "stuck_value") is None
        assert sample(m, "collbench_collector_timeouts_total", collector="stuck") == n
    assert Stuck.entered == 1
    assert cs.stuck()["stuck"]["reading"].endswith("hw_counters/np_cnp_sent") and cs.stuck()["stuck"]["seconds"] > 0.2
    release.set()
    assert wait_for(lambda: not cs.stuck(), 5)
    m = parse_exposition(generate_latest(reg).decode())
    assert sample(m, "collbench_collector_success", collector="stuck") == 1 and sample(m, "stuck_value") == 1
    assert Stuck.entered == 2


def test_snapshot_reader_refuses_fifos_and_endless_files(tmp_path):
    """The congestion snapshot reader (OSU engine runs, bench) on the same spoiled host: it
    returns at once, the bad sources unread."""
    from collbench.congestion.snapshot import HostReader
    from collbench.congestion.sources import HostSources
    host = Host(tmp_path)
    _hw_fifo(host)
    _netstat_fifo(host)
    ethtool_root = tmp_path / "ethtool"
    ethtool_root.mkdir()
    os.symlink("/dev/zero", ethtool_root / "ens1f0np0")
    os.mkfifo(ethtool_root / "ens1f1np1")
    reader = HostReader(HostSources(host.sysfs, os.path.join(host.procfs, "net", "netstat"), str(ethtool_root)))
    done = {}
    worker = threading.Thread(target=lambda: done.update(snap=reader.snapshot()), daemon=True)
    worker.start()
    worker.join(5)
    host.unblock()
    assert "snap" in done, "the snapshot blocked on a FIFO"
    snap = done["snap"]
    assert snap.values["np_ecn_marked_roce_packets@mlx5_0/1"] > 0            # the rest is read
    assert "np_cnp_sent@mlx5_0/1" not in snap.values
    assert not [k for k in snap.values if k.endswith("@netstat") or "@ens1f" in k], snap.values
    assert stat.S_ISFIFO(os.lstat(host.path(f"{HW}/np_cnp_sent")).st_mode)


def test_health_is_503_while_a_metrics_collection_cannot_finish():
    """/health must not say 200 while /metrics cannot answer: a collection in flight past the
    exporter's limit (only a fault of the exporter itself gets there: collectors are cut at
    their deadline) turns it 503 with the reason."""
    from collbench.exporter.server import ExporterHTTPServer
    release = threading.Event()

    class Registry:
        def collect(self):
            release.wait(30)
            return iter(())

    class App:
        registry = Registry()
        metrics_stall_seconds = 0.3

        def health(self):
            return True, {"status": "ok", "reason": None}

        def describe(self):
            return {}

    server = ExporterHTTPServer(("127.0.0.1", 0), App())
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.port}"
    try:
        assert get(url + "/health", 5)[0] == 200
        threading.Thread(target=lambda: get(url + "/metrics", 30), daemon=True).start()
        time.sleep(0.6)
        with pytest.raises(urllib.error.HTTPError) as err:
            get(url + "/health", 5)
        assert err.value.code == 503
        assert "a /metrics collection has not finished" in json.loads(err.value.read())["reason"]
        release.set()
        # the collection's thread ends a moment after the release: until then /health stays 503
        assert wait_for(lambda: health_code(url) == 200, 5)
    finally:
        release.set()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("flag, pattern", [("--device-include", r"(mlx5)_\1"), ("--device-exclude", "(?!mlx5).*")])
def test_device_regex_re2_refuses_what_it_cannot_bound(flag, pattern, tmp_path):
    """Backreferences and lookaround (which need backtracking) are refused at start-up, exit 2,
    naming the setting, instead of being matched without a time bound."""
    host = Host(tmp_path)
    r = subprocess.run(host.argv(unused_port()) + [flag, pattern], cwd=str(REPO), capture_output=True, text=True,
                       timeout=20)
    assert r.returncode == 2, r.stderr
    assert "not a valid RE2 regular expression" in r.stderr and flag[2:].replace("-", "_") in r.stderr
    assert "Traceback" not in r.stderr


def test_concurrent_collections_share_a_collector_run_in_flight():
    """Two collections at once (e.g. /metrics in two formats): the second joins the collector's
    run in flight instead of calling it late."""
    from prometheus_client.core import GaugeMetricFamily
    from collbench.exporter.collectors import Collector, CollectorSet

    class Slow(Collector):
        name = "slow"
        entered = 0

        def collect(self):
            Slow.entered += 1
            time.sleep(0.3)
            return [GaugeMetricFamily("slow_value", "x", value=1)]

    cs = CollectorSet([Slow()], timeout=2.0)
    out = []
    threads = [threading.Thread(target=lambda: out.append(list(cs.collect()))) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(5)
    assert Slow.entered == 1
    for fams in out:
        m = {(f.name, s.labels.get("collector")): s.value for f in fams for s in f.samples}
        assert m[("collbench_collector_success", "slow")] == 1 and m[("slow_value", None)] == 1
