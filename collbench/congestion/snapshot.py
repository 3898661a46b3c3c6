"""One snapshot of one host's congestion counters (the Python reader: the OSU engine's runs,
bench/congestion_overhead.py; the built-in engine has the same reader in C, driven by the same
source spec, sources.spec_text).

A snapshot is {key: value} of what could be read, and {key: fault} of what could not
("unreadable": the file or statistic exists but reading it failed; "garbage": it does not hold a
whole number from 0 to 2^64-1). A counter that is absent is simply not in either (deltas.py
calls one that was there before and is gone after "vanished").
"""

import os
import re
import time
from typing import Dict, NamedTuple

from collbench.bounded_file import UntrustedFileError, read_limited
from collbench.congestion import counters
from collbench.congestion.keys import key
from collbench.congestion.netstat import MAX_NETSTAT_BYTES, raw_section

UNREADABLE, GARBAGE = "unreadable", "garbage"
MAX_VALUE = (1 << 64) - 1
_DIGITS = re.compile(rb"\s*(\d{1,20})\s*")
_ETHTOOL_LINE = re.compile(r"^\s*([A-Za-z0-9_.\[\]-]+):\s*(\S+)\s*$")


class Snapshot(NamedTuple):
    values: Dict[str, int]
    faults: Dict[str, str]
    wall: float          # time.time() when the snapshot was taken
    mono: float          # time.monotonic(), for the interval between two snapshots
    sources_read: int    # sources (counter directories, netdevs, netstat) that answered


def parse_value(raw):
    """The counter value of raw bytes, or None (garbage)."""
    m = _DIGITS.fullmatch(raw)
    if not m:
        return None
    v = int(m.group(1))
    return v if v <= MAX_VALUE else None


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


class HostReader:
    """Reads one host's counters (HostSources). Which directories exist is worked out on the
    first snapshot and again whenever a directory has vanished."""

    def __init__(self, sources, ethtool_reader=None, netstat=True):
        self.sources = sources
        self.read_netstat = netstat
        self._ethtool_reader = ethtool_reader
        self._hw = counters.names("rdma_hw")
        self._port = counters.names("rdma_port")
        self._ethtool = set(counters.names("ethtool"))
        self._netstat = {s: counters.names("netstat", s) for s in ("IpExt", "TcpExt")}
        self._layout = None

    def _build_layout(self):
        root = os.path.join(self.sources.sysfs_root, "class", "infiniband")
        dirs = []
        for dev in _listdir(root):
            ports = os.path.join(root, dev, "ports")
            for port in _listdir(ports):
                for sub, names in (("hw_counters", self._hw), ("counters", self._port)):
                    d = os.path.join(ports, port, sub)
                    if os.path.isdir(d):
                        dirs.append((d, f"{dev}/{port}", names))
        if self.sources.netdevs:
            netdevs = list(self.sources.netdevs)
        elif self.sources.ethtool_root:
            netdevs = _listdir(self.sources.ethtool_root)
        else:
            netdevs = []
            for dev in _listdir(root):
                netdevs += [n for n in _listdir(os.path.join(root, dev, "device", "net")) if n not in netdevs]
        return dirs, netdevs

    def snapshot(self):
        if self._layout is None:
            self._layout = self._build_layout()
        dirs, netdevs = self._layout
        values, faults, read = {}, {}, 0
        wall, mono = time.time(), time.monotonic()
        vanished_dir = False
        for d, where, names in dirs:
            try:
                dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                vanished_dir = True
                continue
            read += 1
            try:
                for name in names:
                    k = key(name, where)
                    try:
                        # O_NONBLOCK: a FIFO in a counters directory answers at once (and is
                        # garbage) instead of blocking the step it is read around
                        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dfd)
                    except FileNotFoundError:
                        continue
                    except OSError:
                        faults[k] = UNREADABLE
                        continue
                    try:
                        raw = os.read(fd, 64)
                    except OSError:
                        faults[k] = UNREADABLE
                        continue
                    finally:
                        os.close(fd)
                    v = parse_value(raw)
                    if v is None:
                        faults[k] = GARBAGE
                    else:
                        values[k] = v
            finally:
                os.close(dfd)
        for netdev in netdevs:
            if self._read_ethtool(netdev, values, faults):
                read += 1
        if self.read_netstat and self._read_netstat(values, faults):
            read += 1
        if vanished_dir:
            self._layout = None
        return Snapshot(values, faults, wall, mono, read)

    def _read_ethtool(self, netdev, values, faults):
        if self.sources.ethtool_root:
            try:   # a regular file of 1 MB at most: no FIFO, no /dev/zero
                text = read_limited(os.path.join(self.sources.ethtool_root, netdev), 1 << 20).decode("ascii", "replace")
            except UntrustedFileError:
                return False
            for line in text.splitlines():
                m = _ETHTOOL_LINE.match(line)
                if m and m.group(1) in self._ethtool:
                    k = key(m.group(1), netdev)
                    v = parse_value(m.group(2).encode())
                    if v is None:
                        faults[k] = GARBAGE
                    else:
                        values[k] = v
            return True
        if self._ethtool_reader is None:
            from collbench.congestion.ethtool_ioctl import EthtoolStatsReader
            wanted = self._ethtool
            self._ethtool_reader = EthtoolStatsReader(
                select=lambda names: [i for i, n in enumerate(names) if n in wanted])
        try:
            stats = self._ethtool_reader.read(netdev)
        except Exception:   # noqa: BLE001 -- NoStats, IoctlUnavailable: this netdev gives nothing
            return False
        for name, v in stats:
            values[key(name, netdev)] = v
        return True

    def _read_netstat(self, values, faults):
        try:
            text = read_limited(self.sources.netstat, MAX_NETSTAT_BYTES).decode("ascii", "replace")
        except UntrustedFileError:
            return False
        for section, names in self._netstat.items():
            raw = raw_section(text, section)
            for name in names:
                if name in raw:
                    k = key(name, "netstat")
                    v = parse_value(raw[name].encode())
                    if v is None:
                        faults[k] = GARBAGE
                    else:
                        values[k] = v
        return True
