"""PFC / pause counters of `ethtool -S <netdev>` (mlx5 names), read at scrape time.

  rx|tx_prio<p>_pause            -> collbench_ethtool_pause_frames_total{netdev,direction,priority}
  rx|tx_prio<p>_pause_duration   -> collbench_ethtool_pause_duration_seconds_total (mlx5 counts microseconds)
  rx|tx_prio<p>_pause_transition -> collbench_ethtool_pause_transitions_total{netdev,direction,priority}
  rx|tx_pause_ctrl_phy           -> collbench_ethtool_pause_ctrl_frames_total{netdev,direction}
  rx_discards_phy                -> collbench_ethtool_rx_discards_phy_total{netdev}
  tx_pause_storm_warning_events  -> collbench_ethtool_pause_storm_warning_events_total{netdev}
  tx_pause_storm_error_events    -> collbench_ethtool_pause_storm_error_events_total{netdev}

Netdevs: `exporter.netdevs`, else the RDMA devices' netdevs from sysfs. The statistics are
those of the congestion table (collbench/congestion/counters.py), the one definition the
built-in engine reads around each step too.

How the statistics are read: with `exporter.ethtool` left at `ethtool` (the default), by the
SIOCETHTOOL ioctl that `ethtool -S` itself uses (`ethtool_ioctl.py`: three syscalls, no fork),
and by running `ethtool -S` only for a netdev where the ioctl cannot be used. Any other value
is a command run as `CMD -S NETDEV` (with a timeout) for every netdev: a wrapper, an ethtool at
another path, or the tests' stand-in printing captured mlx5 output.

Either way the driver is asked at most once per `cache_seconds` (1 s): mlx5 answers a
statistics query with firmware commands under the RTNL lock, so twenty scrapers must not
make twenty queries. The first scrape reads itself; later scrapes get the last reading and,
when it is due, start the next one in the background, so no scrape waits on the driver or a
fork. A netdev without these counters (lo, veth) gives no series; a missing ethtool or a
failing netdev is logged once.

The command runs in a process group of its own, for `timeout` seconds and MAX_OUTPUT bytes at
most; past either, the whole group (and any descendant that left it) is killed through
collbench/proctree.py, so a hung wrapper leaves no orphaned children, and the exporter's stop
kills a command in flight the same way.
"""

import logging
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import threading
import time

from prometheus_client.core import CounterMetricFamily

from collbench import proctree
from collbench.congestion import counters
from collbench.congestion.ethtool_ioctl import EthtoolStatsReader, IoctlUnavailable, NoStats
from collbench.exporter.collectors import Collector, DeviceFilter, LogOnce, NoData, register
from collbench.exporter.collectors.rdma_sysfs import device_netdevs, rdma_devices

_LINE = re.compile(r"^\s*([A-Za-z0-9_.\[\]-]+):\s*(-?\d+)\s*$")
_PRIO = re.compile(r"^(rx|tx)_prio(\d)_pause(_duration|_transition)?$")
_CTRL = re.compile(r"^(rx|tx)_pause_ctrl_phy$")
_SINGLE = {"rx_discards_phy": "discards", "tx_pause_storm_warning_events": "storm_warn",
           "tx_pause_storm_error_events": "storm_err"}
# mlx5: rx/tx_prio<p>_pause_duration in microseconds (the congestion table's unit)
MAX_OUTPUT = 4 << 20     # bytes of `CMD -S NETDEV` output read (an mlx5 port prints ~30 KB)
PAUSE_DURATION_UNIT = {"microseconds": 1e-6}[counters.lookup("ethtool", "rx_prio0_pause_duration").unit]


def parse_ethtool_stats(text):
    """{counter: int} from `ethtool -S` output ('NIC statistics:' then 'name: value' lines)."""
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def classify(name):
    """(family key, labels after netdev) of an exported statistic; None for the others (and for
    any statistic the congestion table, collbench/congestion/counters.py, does not define)."""
    if counters.lookup("ethtool", name) is None:
        return None
    m = _PRIO.match(name)
    if m:
        direction, prio, kind = m.groups()
        return {"_duration": "duration", "_transition": "transitions"}.get(kind, "frames"), (direction, prio)
    m = _CTRL.match(name)
    if m:
        return "ctrl", (m.group(1),)
    key = _SINGLE.get(name)
    return (key, ()) if key else None


def exported_indices(names):
    """Indices of the statistics this collector exports: the ioctl reader keeps only those."""
    return [i for i, name in enumerate(names) if classify(name) is not None]


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
    families = {"frames": frames, "duration": duration, "transitions": transitions, "ctrl": ctrl,
                "discards": discards, "storm_warn": storm_warn, "storm_err": storm_err}
    for netdev, stats in sorted(stats_by_netdev.items()):
        for name, value in sorted(stats.items()):
            kind = classify(name)
            if kind is not None:
                key, labels = kind
                families[key].add_metric([netdev, *labels], value * PAUSE_DURATION_UNIT if key == "duration" else value)
    return [f for f in (frames, duration, transitions, ctrl, discards, storm_warn, storm_err) if f.samples]


class EthtoolCollector(Collector):
    name = "ethtool"

    def __init__(self, command="ethtool", netdevs=None, sysfs_root="/sys", device_filter=None,
                 timeout=2.0, cache_seconds=1.0, use_ioctl=None):
        self.argv = shlex.split(command) if command else ["ethtool"]
        # The plain default means "ethtool's statistics": read by ioctl, forking ethtool only
        # where that is refused. Any other command is run as given.
        self.use_ioctl = self.argv == ["ethtool"] if use_ioctl is None else use_ioctl
        self.reader = EthtoolStatsReader(select=exported_indices) if self.use_ioctl else None
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
        self._procs = set()       # commands in flight: killed by close()
        self._procs_lock = threading.Lock()
        self._closed = False

    def target_netdevs(self):
        if self.netdevs is not None:
            names = list(self.netdevs)
        else:
            names = []
            for dev in rdma_devices(self.sysfs_root, self.device_filter):
                names += [n for n in device_netdevs(self.sysfs_root, dev, self.count_error) if n not in names]
        return [n for n in names if self.device_filter(n) or (self.netdevs is None)]

    def _read_ioctl(self, netdev):
        """{name: value}, None (no statistics), or IoctlUnavailable."""
        self.reading = f"SIOCETHTOOL ETHTOOL_GSTATS {netdev}"
        try:
            return dict(self.reader.read(netdev))
        except NoStats as e:
            self._log_once(logging.INFO, "ethtool statistics of %s: %s", netdev, e)
            return None

    def _run(self, netdev):
        """{name: value} from `CMD -S netdev`, or None."""
        try:
            code, out, err = self._command(self.argv + ["-S", netdev])
        except FileNotFoundError:
            self._log_once(logging.INFO, "%s not found (install ethtool or set exporter.ethtool)", self.argv[0])
            return None
        except subprocess.TimeoutExpired:
            self.count_error("command_timeout")
            self._log_once(logging.WARNING, "ethtool -S %s: no answer within %g s (its process group killed)",
                           netdev, self.timeout)
            return None
        except OverflowError:
            self.count_error("command_output_too_large")
            self._log_once(logging.WARNING, "ethtool -S %s: more than %d bytes of output (its process group "
                           "killed)", netdev, MAX_OUTPUT)
            return None
        if code != 0:
            lines = (err or out).strip().splitlines()
            self._log_once(logging.INFO, "ethtool -S %s: exit %d: %s", netdev, code, lines[-1] if lines else "no output")
            return None
        return parse_ethtool_stats(out)

    def _command(self, argv):
        """(exit code, stdout, stderr) of argv, run in a session of its own; TimeoutExpired or
        OverflowError (output past MAX_OUTPUT) after killing its whole tree."""
        self.reading = shlex.join(argv)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        with self._procs_lock:
            self._procs.add(proc)
            if self._closed:
                _kill_tree(proc)
        try:
            out, err = _read_bounded(proc, self.timeout, MAX_OUTPUT)
        except BaseException:
            _kill_tree(proc)
            raise
        finally:
            proc.stdout.close()
            proc.stderr.close()
            with self._procs_lock:
                self._procs.discard(proc)
        code = proc.wait()
        return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def close(self):
        with self._procs_lock:
            self._closed = True
            procs = list(self._procs)
        for proc in procs:
            _kill_tree(proc)

    def read_all(self):
        netdevs = self.target_netdevs()
        if not netdevs:
            raise NoData("no netdevs: set exporter.netdevs, or no RDMA device has one")
        stats = {}
        forked = []
        for n in netdevs:
            if self.reader is None:
                forked.append(n)
                continue
            try:
                s = self._read_ioctl(n)
            except IoctlUnavailable as e:
                self._log_once(logging.INFO, "ethtool statistics of %s: ioctl not possible (%s): "
                               "running %s -S instead", n, e, self.argv[0])
                forked.append(n)
                continue
            if s is not None:
                stats[n] = s
        if forked and shutil.which(self.argv[0]) is None:
            if not stats:
                raise NoData(f"{self.argv[0]} not found (install ethtool or set exporter.ethtool)")
            self._log_once(logging.INFO, "%s not found: no statistics for %s", self.argv[0], ", ".join(forked))
            forked = []
        for n in forked:
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
        # The first scrape reads itself. After that a scrape never waits on the driver or a
        # fork: it gets the last reading (at most cache_seconds + one reading old) and, if that
        # is due, starts the next one in the background. Concurrent scrapes share one either way.
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


@register("ethtool", counters=True)
def _ethtool(ex, device_filter):
    s = ex.settings
    return EthtoolCollector(s.ethtool, s.netdevs, s.sysfs_root, device_filter)


def _read_bounded(proc, timeout, max_bytes):
    """(stdout, stderr) of proc read to EOF within timeout s and max_bytes together."""
    deadline = time.monotonic() + timeout
    chunks = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total = 0
    with selectors.DefaultSelector() as sel:
        for fd in chunks:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            for key, _ in sel.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fd)
                    continue
                total += len(data)
                if total > max_bytes:
                    raise OverflowError(f"more than {max_bytes} bytes")
                chunks[key.fd].append(data)
    # output ended; the command itself gets what is left of the timeout to exit
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(proc.args, timeout) from None
    return b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])


def _kill_tree(proc):
    """SIGKILL the command's process group and any descendant that left it (proctree: the one
    place a process tree is signalled), then reap the command."""
    if proc.poll() is None:
        proctree.signal_tree(proc.pid, signal.SIGKILL, proctree.descendants(proc.pid))
    else:
        proctree.signal_tree(proc.pid, signal.SIGKILL)   # the leader is gone: its group may not be
    try:
        proc.wait(1.0)
    except subprocess.TimeoutExpired:
        pass
