"""RDMA congestion and error counters from sysfs, read at scrape time.

  <sysfs>/class/infiniband/<dev>/ports/<port>/hw_counters/<name>  -> collbench_rdma_<name>_total
  <sysfs>/class/infiniband/<dev>/ports/<port>/counters/<name>     -> collbench_rdma_port_<name>_total

hw_counters are the driver's (mlx5: np_ecn_marked_roce_packets, np_cnp_sent, rp_cnp_handled,
out_of_sequence, ...); every file there is exported, so a newer driver's counters appear without
a code change. What a counter means (and on which side of a flow it counts) is the congestion table's
(collbench/congestion/counters.py), which the built-in engine reads around each step too.
Port counters are the IB PMA counters; port_xmit_data / port_rcv_data count
4-byte words (IBTA), exported in bytes. A counter file that cannot be read (some return EINVAL
while the port is down, some say "N/A (no PMA)") is skipped, not fatal.
"""

import os
import re
import threading
import time
import weakref

from prometheus_client.core import CounterMetricFamily

from collbench.congestion import counters
from collbench.exporter.collectors import Collector, DeviceFilter, NoData

# Files in hw_counters that are settings, not counters.
NOT_COUNTERS = {"lifespan"}
# Port counters in 4-byte words, exported in bytes under these names.
WORD_COUNTERS = {"port_xmit_data": "collbench_rdma_port_xmit_data_bytes",
                 "port_rcv_data": "collbench_rdma_port_rcv_data_bytes"}
_BAD_CHARS = re.compile(r"[^a-z0-9_]")


def infiniband_dir(sysfs_root):
    return os.path.join(sysfs_root, "class", "infiniband")


def rdma_devices(sysfs_root, device_filter=None):
    """Sorted RDMA device names under sysfs, filtered; [] when there are none."""
    try:
        names = sorted(os.listdir(infiniband_dir(sysfs_root)))
    except OSError:
        return []
    return [n for n in names if device_filter is None or device_filter(n)]


def device_netdevs(sysfs_root, dev):
    """The Ethernet netdevs of an RDMA device (RoCE): each port's gid_attrs/ndevs, else the
    PCI function's net/ directory."""
    base = os.path.join(infiniband_dir(sysfs_root), dev)
    found = []
    try:
        ports = sorted(os.listdir(os.path.join(base, "ports")))
    except OSError:
        ports = []
    for port in ports:
        ndevs = os.path.join(base, "ports", port, "gid_attrs", "ndevs")
        try:
            entries = sorted(os.listdir(ndevs), key=lambda x: int(x) if x.isdigit() else 0)
        except OSError:
            continue
        for e in entries[:4]:   # GID 0 names the port's netdev; reading the rest costs a syscall each
            try:
                with open(os.path.join(ndevs, e), encoding="ascii") as f:
                    name = f.read().strip()
            except OSError:
                continue    # unset GID entries return EINVAL
            if name and name not in found:
                found.append(name)
                break
    if not found:
        try:
            found = sorted(os.listdir(os.path.join(base, "device", "net")))
        except OSError:
            pass
    return found


def metric_name(prefix, counter):
    name = _BAD_CHARS.sub("_", counter.lower())
    if name.endswith("_total"):
        name = name[:-len("_total")]
    return f"{prefix}{name}"


class RdmaSysfsCollector(Collector):
    """Reads every counter file on each scrape. Which files exist (the directory listings, the
    metric name and help of each) is worked out once and kept: a scrape then costs one open and
    read per counter instead of two listdirs, sorts and path joins per port. The layout is rebuilt
    when the device list changes (checked every scrape, one listdir), when a counter file has
    vanished, and every `layout_seconds` (a driver reload can change a port's counter set).

    The layout also holds an open descriptor of each counters directory, and counter files are
    opened relative to it: the kernel then resolves one name instead of the whole
    /sys/class/infiniband/<dev>/ports/<port>/... path (a symlink and eight components) per
    counter. A directory removed with its device makes those opens fail, which rebuilds the
    layout. Collections of one collector run one at a time (a lock): a rebuild closes the
    descriptors another collection might still use."""

    name = "rdma_sysfs"

    def __init__(self, sysfs_root="/sys", device_filter=None, layout_seconds=60.0, clock=time.monotonic):
        self.sysfs_root = sysfs_root
        self.device_filter = device_filter or DeviceFilter()
        self.layout_seconds = layout_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._layout = None      # (built at, device names, [(dir fd, file, family, help, dev, port, scale)])
        self._dir_fds = []       # descriptors the layout holds; closed on rebuild and when collected
        self._finalizer = weakref.finalize(self, _close_all, self._dir_fds)

    def _drop_layout(self):
        self._layout = None
        _close_all(self._dir_fds)

    def _open_dir(self, path):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        self._dir_fds.append(fd)
        return fd

    def _build_layout(self, devices):
        self._drop_layout()
        root = infiniband_dir(self.sysfs_root)
        entries = []
        for dev in devices:
            ports_dir = os.path.join(root, dev, "ports")
            try:
                ports = sorted(os.listdir(ports_dir), key=lambda p: int(p) if p.isdigit() else 0)
            except OSError:
                continue
            for port in ports:
                hw = os.path.join(ports_dir, port, "hw_counters")
                counters = [c for c in _listdir(hw) if c not in NOT_COUNTERS]
                hw_fd = self._open_dir(hw) if counters else None
                if hw_fd is not None:
                    for counter in counters:
                        entries.append((hw_fd, counter, metric_name("collbench_rdma_", counter),
                                        _help(f"RDMA hw_counters/{counter} of the port (driver counter).",
                                              "rdma_hw", counter), dev, port, 1))
                pc = os.path.join(ports_dir, port, "counters")
                counters = _listdir(pc)
                pc_fd = self._open_dir(pc) if counters else None
                if pc_fd is None:
                    continue
                for counter in counters:
                    if counter in WORD_COUNTERS:
                        entries.append((pc_fd, counter, WORD_COUNTERS[counter],
                                        f"RDMA port counters/{counter} in bytes (the file counts 4-byte words).",
                                        dev, port, 4))
                    else:
                        short = counter[len("port_"):] if counter.lower().startswith("port_") else counter
                        entries.append((pc_fd, counter, metric_name("collbench_rdma_port_", short),
                                        _help(f"RDMA port counters/{counter} (IB port counter).", "rdma_port",
                                              counter), dev, port, 1))
        return (self.clock(), devices, entries)

    def collect(self):
        with self._lock:
            return self._collect()

    def _collect(self):
        root = infiniband_dir(self.sysfs_root)
        try:
            listed = os.listdir(root)
        except OSError:
            self._drop_layout()
            if not os.path.isdir(root):
                raise NoData(f"{root} does not exist (no RDMA devices on this host)") from None
            listed = []
        devices = sorted(n for n in listed if self.device_filter(n))
        if not devices:
            raise NoData(f"no RDMA device in {root} passes the device filters")
        layout = self._layout
        if layout is None or layout[1] != devices or self.clock() - layout[0] >= self.layout_seconds:
            layout = self._layout = self._build_layout(devices)
        families = {}
        vanished = False
        for dir_fd, counter, name, help_text, dev, port, scale in layout[2]:
            try:
                fd = os.open(counter, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                vanished = True
                continue
            except OSError:
                continue
            try:
                raw = os.read(fd, 64)
            except OSError:
                continue    # e.g. EINVAL while the port is down
            finally:
                os.close(fd)
            try:
                value = int(raw)
            except ValueError:
                continue    # "N/A (no PMA)"
            fam = families.get(name)
            if fam is None:
                fam = families[name] = CounterMetricFamily(name, help_text, labels=["device", "port"])
            fam.add_metric([dev, port], value * scale)
        if vanished:
            self._drop_layout()     # a port or counter went away: list again on the next scrape
        return [families[k] for k in sorted(families)]


def _help(base, source, counter):
    """The help text: the file, and what the congestion table says it counts (collbench/congestion)."""
    meaning = counters.describe(source, counter)
    return f"{base} {meaning}." if meaning else base


def _close_all(fds):
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
