"""`ethtool -S` without the fork: the driver statistics (string set ETH_SS_STATS) read with the
SIOCETHTOOL ioctl on an AF_INET socket, as the ethtool binary does (ETHTOOL_GSSET_INFO for the
count, ETHTOOL_GSTRINGS for the names, ETHTOOL_GSTATS for the values). Stdlib only.

The ioctl acts in the socket's network namespace (the process's, like ethtool's) and needs no
privilege for these three commands. Names and values are those `ethtool -S` prints.

The kernel writes as many names/values as the driver has *now*, whatever the buffer we pass
says; a driver reconfigured between the count and the read (more channels, more per-queue
counters) would write past an exact-size buffer (ethtool allocates exactly). Our buffers have
room for twice the count, and a read whose count does not match the names is read again.
"""

import array
import errno
import fcntl
import socket
import struct

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x00000003
ETHTOOL_GSTRINGS = 0x0000001b
ETHTOOL_GSTATS = 0x0000001d
ETHTOOL_GSSET_INFO = 0x00000037
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
_DRVINFO_SIZE = 196           # struct ethtool_drvinfo
_DRVINFO_N_STATS = 180        # offset of its n_stats
_MAX_STATS = 1 << 20          # a count beyond this is not believed (32 MB of names)

# No statistics on this netdev: what `ethtool -S` reports as an error too.
_NO_STATS = {errno.ENODEV: "no such device", errno.EOPNOTSUPP: "no statistics (not supported)",
             errno.ENXIO: "no such device"}


class NoStats(Exception):
    """The netdev does not exist or has no driver statistics (ethtool -S would fail too)."""


class IoctlUnavailable(Exception):
    """The ioctl cannot be used here (no socket, refused, unexpected error): use `ethtool -S`."""


def _ifreq(netdev, buf):
    name = netdev.encode("utf-8", "surrogateescape")
    if not name or len(name) >= IFNAMSIZ or b"\0" in name or b"/" in name:
        raise NoStats(f"{netdev!r} is not a network interface name")
    addr, _ = buf.buffer_info()
    # struct ifreq: ifr_name[16], then the union whose ifr_data points at our buffer; 40 bytes.
    return struct.pack("16sP", name, addr).ljust(40, b"\0")


class EthtoolStatsReader:
    """Reads ETH_SS_STATS of netdevs through one socket. `select` (names tuple -> the indices
    to keep) picks the statistics wanted; it runs again only when a netdev's names change, so
    a read of a driver with thousands of statistics converts only the few kept. Not
    thread-safe: one reader per refreshing thread."""

    def __init__(self, select=None):
        self.select = select
        self._sock = None
        self._names = {}          # netdev -> (raw names bytes, names tuple, kept indices)

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _ioctl(self, netdev, buf):
        if self._sock is None:
            try:
                self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            except OSError as e:
                raise IoctlUnavailable(f"no AF_INET socket for SIOCETHTOOL: {e.strerror}") from None
        try:
            fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, _ifreq(netdev, buf))
        except OSError as e:
            if e.errno in _NO_STATS:
                raise NoStats(_NO_STATS[e.errno]) from None
            raise IoctlUnavailable(f"SIOCETHTOOL on {netdev}: {e.strerror or e}") from None

    def count(self, netdev):
        """Number of ETH_SS_STATS entries (0: none)."""
        buf = array.array("B", struct.pack("=IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS, 0))
        try:
            self._ioctl(netdev, buf)
        except IoctlUnavailable:
            # Kernels before 2.6.33 have no GSSET_INFO: the count is in the driver info.
            buf = array.array("B", struct.pack("=I", ETHTOOL_GDRVINFO) + bytes(_DRVINFO_SIZE - 4))
            self._ioctl(netdev, buf)
            return struct.unpack_from("=I", buf, _DRVINFO_N_STATS)[0]
        _, _, mask, n = struct.unpack_from("=IIQI", buf)
        return n if mask & (1 << ETH_SS_STATS) else 0

    def _names_of(self, netdev, n):
        """(count the kernel wrote, names tuple, kept indices)."""
        cap = 2 * n + 64
        buf = array.array("B", struct.pack("=III", ETHTOOL_GSTRINGS, ETH_SS_STATS, n) + bytes(cap * ETH_GSTRING_LEN))
        self._ioctl(netdev, buf)
        got = struct.unpack_from("=I", buf, 8)[0]
        raw = buf.tobytes()[12:12 + min(got, cap) * ETH_GSTRING_LEN]
        cached = self._names.get(netdev)
        if cached is None or cached[0] != raw:
            names = tuple(raw[i:i + ETH_GSTRING_LEN].split(b"\0", 1)[0].decode("ascii", "replace")
                          for i in range(0, len(raw), ETH_GSTRING_LEN))
            kept = tuple(range(len(names))) if self.select is None else tuple(self.select(names))
            cached = self._names[netdev] = (raw, names, kept)
        return got, cached[1], cached[2]

    def read(self, netdev):
        """[(name, value)] of the netdev's statistics (those `select` keeps), in the driver's
        order, as `ethtool -S` prints them. NoStats if it has none; IoctlUnavailable if the
        ioctl cannot be used (run `ethtool -S` instead)."""
        for _ in range(3):     # the driver was reconfigured between our calls: read again
            n = self.count(netdev)
            if n <= 0:
                raise NoStats("no statistics")
            if n > _MAX_STATS:
                raise IoctlUnavailable(f"{netdev}: the driver reports {n} statistics")
            got, names, kept = self._names_of(netdev, n)
            if got != n:
                continue
            buf = array.array("B", struct.pack("=II", ETHTOOL_GSTATS, n) + bytes((2 * n + 64) * 8))
            self._ioctl(netdev, buf)
            if struct.unpack_from("=I", buf, 4)[0] != n:
                continue
            values = memoryview(buf)[8:8 + 8 * n].cast("Q")
            return [(names[i], values[i]) for i in kept]
        raise IoctlUnavailable(f"{netdev}: the statistics changed size on every read")
