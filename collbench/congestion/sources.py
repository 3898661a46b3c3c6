"""Where one host's congestion counters are read, and the source spec the built-in engine reads
them by (so the counter table in counters.py stays the one definition: the engine gets the names
from here, never its own list).

Per host (config `congestion`, docs/CONGESTION.md):
  sysfs_root    RDMA counters under <sysfs_root>/class/infiniband (default /sys)
  netstat       the netstat file (default /proc/net/netstat: the reader's network namespace),
                read only for TCP transports (ob1-tcp, ucx-tcp: TCP_TRANSPORTS)
  ethtool_root  unset: ethtool statistics by the SIOCETHTOOL ioctl; set: a directory holding one
                file per netdev with `ethtool -S` output (a fixture tree, or a capture)
  netdevs       the netdevs whose ethtool statistics are read (default: the files in ethtool_root,
                else the RDMA devices' netdevs, <sysfs_root>/class/infiniband/*/device/net/*)
  rdma_qp_root  a tree of per-QP counters and peers (engines/engine_paths.c; unset: no QP read)
`congestion.hosts: {hostname: {sysfs_root, netstat, ethtool_root, netdevs, rdma_qp_root}}`
overrides them per host. `congestion.paths` (default true): tcp_info per peer for TCP transports.
"""

import os
from typing import NamedTuple, Optional, Tuple

from collbench.bounded_repr import bounded_repr
from collbench.congestion import counters
from collbench.errors import UserError

SPEC_VERSION = 1
DEFAULT_SYSFS_ROOT = "/sys"
DEFAULT_NETSTAT = "/proc/net/netstat"
# what the engine accepts in a spec token (engine_counters.c's CONG_MAX_PATH / CONG_MAX_NAME)
MAX_PATH = 1024
MAX_NAME = 64
MAX_NETDEVS = 16
MAX_HOSTS = 65536
MAX_SPEC = 256 * 1024    # collbench_engine.c's CONG_MAX_SPEC: a larger spec fails every launch


class HostSources(NamedTuple):
    sysfs_root: str = DEFAULT_SYSFS_ROOT
    netstat: str = DEFAULT_NETSTAT
    ethtool_root: Optional[str] = None
    netdevs: Optional[Tuple[str, ...]] = None
    rdma_qp_root: Optional[str] = None


def _section(cfg):
    return getattr(cfg, "congestion", None)


def enabled(cfg):
    sec = _section(cfg)
    return bool(sec is not None and getattr(sec, "enabled", False))


def host_sources(cfg, host=None):
    """The HostSources of host (None: the defaults) from the config's `congestion` section."""
    sec = _section(cfg)
    if sec is None:
        return HostSources()
    base = HostSources(getattr(sec, "sysfs_root", None) or DEFAULT_SYSFS_ROOT,
                       getattr(sec, "netstat", None) or DEFAULT_NETSTAT,
                       getattr(sec, "ethtool_root", None) or None,
                       tuple(sec.netdevs) if getattr(sec, "netdevs", None) else None,
                       getattr(sec, "rdma_qp_root", None) or None)
    over = (getattr(sec, "hosts", None) or {}).get(host) if host is not None else None
    if not over:
        return base
    return base._replace(**{k: (tuple(v) if k == "netdevs" else v) for k, v in over.items()
                            if k in HostSources._fields and v is not None})


# transports whose traffic goes through the kernel's TCP stack: only their steps move netstat's
# counters (RoCE and shared memory bypass it), so only they pay for reading it (~25-60 µs a read)
TCP_TRANSPORTS = ("ob1-tcp", "ucx-tcp")


def reads_netstat(cfg):
    """Whether a run of cfg reads /proc/net/netstat around its steps (None: the whole table)."""
    return cfg is None or getattr(cfg, "transport", None) in TCP_TRANSPORTS


def reads_tcp_paths(cfg):
    """Whether a run of cfg reads tcp_info per peer around its steps (a TCP transport, and
    congestion.paths not false)."""
    sec = _section(cfg)
    return reads_netstat(cfg) and (sec is None or getattr(sec, "paths", True) is not False)


def xmit_wait_tick_ns(cfg):
    sec = _section(cfg)
    return float(getattr(sec, "xmit_wait_tick_ns", 8.0) or 8.0) if sec is not None else 8.0


def _token(kind, value):
    if not value or any(ch.isspace() for ch in value) or len(value.encode("utf-8")) >= MAX_PATH:
        raise ValueError(f"congestion {kind} {bounded_repr(value)}: expected a non-empty path without spaces, "
                         f"below {MAX_PATH} bytes")
    return value


def _host_line(prefix, s):
    parts = [prefix, "sysfs_root", _token("sysfs_root", s.sysfs_root), "netstat", _token("netstat", s.netstat)]
    if s.ethtool_root:
        parts += ["ethtool_root", _token("ethtool_root", s.ethtool_root)]
    if s.rdma_qp_root:
        parts += ["rdma_qp_root", _token("rdma_qp_root", s.rdma_qp_root)]
    if s.netdevs:
        for n in s.netdevs[:MAX_NETDEVS]:
            parts += ["netdev", _token("netdev", n)]
    return " ".join(parts)


def spec_text(cfg):
    """The engine's source spec (collbench-engine --congestion FILE): which counters, and where
    each host reads them. Line format (space separated, '#' comments):
        defaults sysfs_root PATH netstat PATH [ethtool_root PATH] [rdma_qp_root PATH] [netdev NAME]...
        host NAME sysfs_root PATH netstat PATH [ethtool_root PATH] [rdma_qp_root PATH] [netdev NAME]...
        rdma_hw NAME...  |  rdma_port NAME...  |  ethtool NAME...  |  netstat SECTION NAME...
        paths tcp        (tcp_info per peer: reads_tcp_paths)
    """
    lines = [f"# collbench congestion sources v{SPEC_VERSION} (collbench/congestion/sources.py)",
             _host_line("defaults", host_sources(cfg))]
    sec = _section(cfg)
    for host in sorted((getattr(sec, "hosts", None) or {}) if sec is not None else {}):
        _token("host", host)
        lines.append(_host_line(f"host {host}", host_sources(cfg, host)))
    for source in ("rdma_hw", "rdma_port", "ethtool"):
        lines.append(" ".join([source] + counters.names(source)))
    for section in ("IpExt", "TcpExt") if reads_netstat(cfg) else ():
        lines.append(" ".join(["netstat", section] + counters.names("netstat", section)))
    if reads_tcp_paths(cfg):
        lines.append("paths tcp")
    return "\n".join(lines) + "\n"


def check_spec(cfg):
    """The spec text of cfg, or a UserError (exit 2, before anything is launched) naming the
    config's congestion section when the engine would refuse it: a token it cannot hold, or a
    spec past MAX_SPEC (a YAML anchor repeats per-host paths cheaply: 100 hosts of 1,000-character
    paths is 300 KB), which would otherwise fail one launch per step."""
    where = f"{getattr(cfg, 'source', None) or 'the config'}: congestion"
    try:
        text = spec_text(cfg)
    except ValueError as e:
        raise UserError(f"{where}: {e}") from None
    size = len(text.encode("utf-8"))
    if size > MAX_SPEC:
        hosts = len(getattr(_section(cfg), "hosts", None) or {})
        raise UserError(f"{where}: the counter sources of its {hosts} per-host entries (congestion.hosts) make a "
                        f"spec of {size} bytes, the engine reads at most {MAX_SPEC} (256 KB): give the hosts that "
                        "share paths none of their own (congestion.sysfs_root, netstat, ethtool_root serve them "
                        "all), or shorter paths")
    return text


def write_spec(cfg, path):
    """Write the spec to path (atomically) and return path."""
    text = spec_text(cfg)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path
