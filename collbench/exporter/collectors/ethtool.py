"""PFC / pause counters from `ethtool -S <netdev>` (mlx5 names), run at scrape time.

  rx|tx_prio<p>_pause            -> collbench_ethtool_pause_frames_total{netdev,direction,priority}
  rx|tx_prio<p>_pause_duration   -> collbench_ethtool_pause_duration_seconds_total (mlx5 counts microseconds)
  rx|tx_prio<p>_pause_transition -> collbench_ethtool_pause_transitions_total{netdev,direction,priority}
  rx|tx_pause_ctrl_phy           -> collbench_ethtool_pause_ctrl_frames_total{netdev,direction}
  rx_discards_phy                -> collbench_ethtool_rx_discards_phy_total{netdev}
  tx_pause_storm_warning_events  -> collbench_ethtool_pause_storm_warning_events_total{netdev}
  tx_pause_storm_error_events    -> collbench_ethtool_pause_storm_error_events_total{netdev}

Netdevs: `exporter.netdevs`, else the RDMA devices' netdevs from sysfs. One ethtool run per
netdev with a timeout. Forking ethtool costs milliseconds, so scrapes share runs: a run is
reused for `cache_seconds` (1 s) and refreshed in the background, so twenty scrapers neither
fork twenty ethtools nor wait on one. A netdev without these counters (lo, veth) gives no
series; a missing ethtool or a failing netdev is logged once.
"""

import logging
import re
import shlex
import shutil
import subprocess
import threading
import time

from prometheus_client.core import CounterMetricFamily

from collbench.exporter.collectors import Collector, DeviceFilter, LogOnce, NoData
from collbench.exporter.collectors.rdma_sysfs import device_netdevs, rdma_devices

_LINE = re.compile(r"^\s*([A-Za-z0-9_.\[\]-]+):\s*(-?\d+)\s*$")
_PRIO = re.compile(r"^(rx|tx)_prio(\d)_pause(_duration|_transition)?$")
_CTRL = re.compile(r"^(rx|tx)_pause_ctrl_phy$")
PAUSE_DURATION_UNIT = 1e-6   # mlx5: rx/tx_prio<p>_pause_duration in microseconds


def parse_ethtool_stats(text):
    """{counter: int} from `ethtool -S` output ('NIC statistics:' then 'name: value' lines)."""
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def families_for(stats_by_netdev):
    frames = CounterMetricFamily("collbench_ethtool_pause_frames",
                                 "PFC pause frames per priority (ethtool -S rx/tx_prio<p>_pause).",
                                 labels=["netdev", "direction", "priority"])
    duration = CounterMetricFamily("collbench_ethtool_pause_duration_seconds",
                                   "Time paused per priority (ethtool -S rx/tx_prio<p>_pause_duration).",
                                   labels=["netdev", "direction", "priority"], unit="seconds")
    transitions = CounterMetricFamily("collbench_ethtool_pause_transitions",
                                      "Pause state transitions per priority (ethtool -S rx/tx_prio<p>_pause_transition).",
                                      labels=["netdev", "direction", "priority"])
    ctrl = CounterMetricFamily("collbench_ethtool_pause_ctrl_frames",
                               "Link-level (global) pause control frames (ethtool -S rx/tx_pause_ctrl_phy).",
                               labels=["netdev", "direction"])
    discards = CounterMetricFamily("collbench_ethtool_rx_discards_phy",
                                   "Packets the NIC dropped for lack of receive buffer (ethtool -S rx_discards_phy).",
                                   labels=["netdev"])
    storm_warn = CounterMetricFamily("collbench_ethtool_pause_storm_warning_events",
                                     "Pause storm warnings: the port kept sending pause frames "
                                     "(ethtool -S tx_pause_storm_warning_events).", labels=["netdev"])
    storm_err = CounterMetricFamily("collbench_ethtool_pause_storm_error_events",
                                    "Pause storm errors: the device stopped sending pause frames "
                                    "(ethtool -S tx_pause_storm_error_events).", labels=["netdev"])
    for netdev, stats in sorted(stats_by_netdev.items()):
        for name, value in sorted(stats.items()):
            m = _PRIO.match(name)
            if m:
                direction, prio, kind = m.groups()
                if kind == "_duration":
                    duration.add_metric([netdev, direction, prio], value * PAUSE_DURATION_UNIT)
                elif kind == "_transition":
                    transitions.add_metric([netdev, direction, prio], value)
                else:
                    frames.add_metric([netdev, direction, prio], value)
                continue
            m = _CTRL.match(name)
            if m:
                ctrl.add_metric([netdev, m.group(1)], value)
            elif name == "rx_discards_phy":
                discards.add_metric([netdev], value)
            elif name == "tx_pause_storm_warning_events":
                storm_warn.add_metric([netdev], value)
            elif name == "tx_pause_storm_error_events":
                storm_err.add_metric([netdev], value)
    return [f for f in (frames, duration, transitions, ctrl, discards, storm_warn, storm_err) if f.samples]


class EthtoolCollector(Collector):
    name = "ethtool"

    def __init__(self, command="ethtool", netdevs=None, sysfs_root="/sys", device_filter=None,
                 timeout=2.0, cache_seconds=1.0):
        self.argv = shlex.split(command) if command else ["ethtool"]
        self.netdevs = netdevs
        self.sysfs_root = sysfs_root
        self.device_filter = device_filter or DeviceFilter()
        self.timeout = timeout
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._first_run = threading.Lock()
        self._refreshing = False
        self._cache = None        # (monotonic time of the run, families, exception)
        self._log_once = LogOnce()

    def target_netdevs(self):
        if self.netdevs is not None:
            names = list(self.netdevs)
        else:
            names = []
            for dev in rdma_devices(self.sysfs_root, self.device_filter):
                names += [n for n in device_netdevs(self.sysfs_root, dev) if n not in names]
        return [n for n in names if self.device_filter(n) or (self.netdevs is None)]

    def _run(self, netdev):
        try:
            proc = subprocess.run(self.argv + ["-S", netdev], capture_output=True, timeout=self.timeout,
                                  text=True, errors="replace", stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise NoData(f"{self.argv[0]} not found (install ethtool or set exporter.ethtool)") from None
        except subprocess.TimeoutExpired:
            self._log_once(logging.WARNING, "ethtool -S %s: no answer within %.0f s", netdev, self.timeout)
            return None
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).strip().splitlines()
            self._log_once(logging.INFO, "ethtool -S %s: exit %d: %s", netdev, proc.returncode,
                           err[-1] if err else "no output")
            return None
        return parse_ethtool_stats(proc.stdout)

    def read_all(self):
        netdevs = self.target_netdevs()
        if not netdevs:
            raise NoData("no netdevs: set exporter.netdevs, or no RDMA device has one")
        if shutil.which(self.argv[0]) is None:
            raise NoData(f"{self.argv[0]} not found (install ethtool or set exporter.ethtool)")
        stats = {}
        for n in netdevs:
            s = self._run(n)
            if s is not None:
                stats[n] = s
        if not stats:
            raise NoData(f"ethtool -S gave no statistics for {', '.join(netdevs)}")
        return stats

    def _refresh(self):
        try:
            # Families are built once per run and shared by the scrapes it serves (read-only).
            result = (time.monotonic(), families_for(self.read_all()), None)
        except Exception as e:   # noqa: BLE001 -- shared with the scrapes in this window
            result = (time.monotonic(), None, e)
        with self._lock:
            self._cache = result
            self._refreshing = False

    def collect(self):
        # The first scrape runs ethtool itself. After that a scrape never waits on a fork: it
        # gets the last run (at most cache_seconds + one run old) and, if that is due, starts
        # the next run in the background. Concurrent scrapes share one run either way.
        with self._lock:
            if self._cache is None:
                self._refreshing = True
                first = True
            else:
                first = False
                if not self._refreshing and time.monotonic() - self._cache[0] >= self.cache_seconds:
                    self._refreshing = True
                    threading.Thread(target=self._refresh, name="ethtool-refresh", daemon=True).start()
        if first:
            self._first_run.acquire()      # scrapes arriving during the first run wait for it
            try:
                if self._cache is None:
                    self._refresh()
            finally:
                self._first_run.release()
        with self._lock:
            _, families, error = self._cache
        if error is not None:
            raise error
        return families
