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

Sysfs is untrusted input: only regular files are read (a FIFO or a device in a counters
directory is refused and counted in collbench_collector_errors_total, reason not_regular_file),
64 bytes at most, opened non-blocking; files whose names give one series (`np-cnp_sent`,
`NP_CNP_SENT`, `np_cnp_sent_total`) are one series: the file whose name is already the metric's
is read, the others refused and counted (reason duplicate_series), since Prometheus rejects a
whole scrape holding a series twice. A read the kernel does not complete (a NIC whose firmware
stopped answering) is the collector deadline's (collectors/__init__.py).
"""

import os
import re
import threading
import time
import weakref

from prometheus_client.core import CounterMetricFamily

from collbench.bounded_file import UntrustedFileError, read_limited_text
from collbench.congestion import counters
from collbench.congestion.snapshot import parse_value
from collbench.exporter.collectors import Collector, DeviceFilter, NoData, file_error_reason, register

# Files in hw_counters that are settings, not counters.
NOT_COUNTERS = {"lifespan"}
# Port counters in 4-byte words, exported in bytes under these names.
WORD_COUNTERS = {"port_xmit_data": "collbench_rdma_port_xmit_data_bytes",
                 "port_rcv_data": "collbench_rdma_port_rcv_data_bytes"}
_BAD_CHARS = re.compile(r"[^a-z0-9_]")
MAX_VALUE_BYTES = 64        # a counter file: one number
MAX_NETDEV_BYTES = 256      # a GID ndevs entry: one interface name (IFNAMSIZ is 16)


def infiniband_dir(sysfs_root):
    return os.path.join(sysfs_root, "class", "infiniband")


def rdma_devices(sysfs_root, device_filter=None):
    """Sorted RDMA device names under sysfs, filtered; [] when there are none."""
    try:
        names = sorted(os.listdir(infiniband_dir(sysfs_root)))
    except OSError:
        return []
    return [n for n in names if _good_name(n) and (device_filter is None or device_filter(n))]


def device_netdevs(sysfs_root, dev, on_error=None):
    """The Ethernet netdevs of an RDMA device (RoCE): each port's gid_attrs/ndevs, else the
    PCI function's net/ directory. An ndevs entry that is not a small regular text file (a FIFO,
    /dev/zero) is refused: on_error(reason) counts it."""
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
                name = read_limited_text(os.path.join(ndevs, e), MAX_NETDEV_BYTES).strip()
            except UntrustedFileError as err:
                # unset GID entries return EINVAL: not an error; a FIFO or a device is
                if on_error is not None and "cannot read" not in str(err):
                    on_error(file_error_reason(err))
                continue
            if not name:
                continue    # an unset GID
            if not _good_name(name):
                if on_error is not None:
                    on_error("unreadable")
                continue
            if name and name not in found:
                found.append(name)
                break
    if not found:
        try:
            found = sorted(n for n in os.listdir(os.path.join(base, "device", "net")) if _good_name(n))
        except OSError:
            pass
    return found


def _good_name(name):
    """A device or file name fit for a label value: printable, valid UTF-8 (os.listdir hands
    undecodable bytes through as surrogates, which the exposition cannot encode)."""
    if not name or len(name) > 255 or not name.isprintable():
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True



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
        self._current = None     # the layout entry being read (formatted only when /health asks)
        self._finalizer = weakref.finalize(self, _close_all, self._dir_fds)

    @property
    def reading(self):
        entry = self._current
        return None if entry is None else os.path.join(entry[7], entry[1])

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
        seen = set()     # (metric name, device, port): one file per series
        for dev in devices:
            ports_dir = os.path.join(root, dev, "ports")
            try:
                ports = sorted((p for p in os.listdir(ports_dir) if _good_name(p)),
                               key=lambda p: int(p) if p.isdigit() else 0)
            except OSError:
                continue
            for port in ports:
                hw = os.path.join(ports_dir, port, "hw_counters")
                found = []
                for counter in self._counter_files(hw):
                    if counter not in NOT_COUNTERS:
                        found.append((counter, metric_name("collbench_rdma_", counter),
                                      _help(f"RDMA hw_counters/{counter} of the port (driver counter).",
                                            "rdma_hw", counter), 1))
                self._add_dir(entries, seen, hw, found, dev, port)
                pc = os.path.join(ports_dir, port, "counters")
                found = []
                for counter in self._counter_files(pc):
                    if counter in WORD_COUNTERS:
                        found.append((counter, WORD_COUNTERS[counter],
                                      f"RDMA port counters/{counter} in bytes (the file counts 4-byte words).", 4))
                    else:
                        short = counter[len("port_"):] if counter.lower().startswith("port_") else counter
                        found.append((counter, metric_name("collbench_rdma_port_", short),
                                      _help(f"RDMA port counters/{counter} (IB port counter).", "rdma_port",
                                            counter), 1))
                self._add_dir(entries, seen, pc, found, dev, port)
        return (self.clock(), devices, entries)

    def _counter_files(self, path):
        """Names of the regular files in a counters directory, sorted; the others (FIFOs, devices,
        directories, undecodable names) counted and left out."""
        try:
            with os.scandir(path) as it:
                listed = list(it)
        except OSError:
            return []
        names = []
        for entry in listed:
            try:
                regular = entry.is_file()
            except OSError:
                regular = False
            if not regular:
                self.count_error("not_regular_file")
            elif not _good_name(entry.name):
                self.count_error("unreadable")
            else:
                names.append(entry.name)
        return sorted(names, key=lambda n: (metric_name("", n) != n, n))   # canonical names first

    def _add_dir(self, entries, seen, path, found, dev, port):
        if not found:
            return
        fd = self._open_dir(path)
        if fd is None:
            return
        for counter, name, help_text, scale in found:
            if (name, dev, port) in seen:
                self.count_error("duplicate_series")
                continue
            seen.add((name, dev, port))
            entries.append((fd, counter, name, help_text, dev, port, scale, path))

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
        bad = [n for n in listed if not _good_name(n)]
        if bad:     # undecodable bytes cannot be a label value: the whole scrape would fail
            self.count_error("unreadable", len(bad))
        devices = sorted(n for n in listed if _good_name(n) and self.device_filter(n))
        if not devices:
            raise NoData(f"no RDMA device in {root} passes the device filters")
        layout = self._layout
        if layout is None or layout[1] != devices or self.clock() - layout[0] >= self.layout_seconds:
            layout = self._layout = self._build_layout(devices)
        families = {}
        vanished = False
        for entry in layout[2]:
            dir_fd, counter, name, help_text, dev, port, scale, _ = entry
            self._current = entry    # for /health, should this read never return
            try:
                # O_NONBLOCK: a file turned into a FIFO since the layout answers at once (empty)
                fd = os.open(counter, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                vanished = True
                continue
            except OSError:
                continue
            try:
                raw = os.read(fd, MAX_VALUE_BYTES)
            except OSError:
                continue    # e.g. EINVAL while the port is down
            finally:
                os.close(fd)
            value = parse_value(raw)
            if value is None:
                continue    # "N/A (no PMA)"
            fam = families.get(name)
            if fam is None:
                fam = families[name] = CounterMetricFamily(name, help_text, labels=["device", "port"])
            fam.add_metric([dev, port], value * scale)
        self._current = None
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




@register("rdma_sysfs", counters=True)
def _rdma_sysfs(ex, device_filter):
    return RdmaSysfsCollector(ex.settings.sysfs_root, device_filter)
