"""`ethtool -S` without the fork: the reader lives with the congestion counters
(collbench/congestion/ethtool_ioctl.py), which the built-in engine's Python side and this
exporter share."""

from collbench.congestion.ethtool_ioctl import (  # noqa: F401 -- this module's names, kept
    ETH_GSTRING_LEN, ETH_SS_STATS, ETHTOOL_GDRVINFO, ETHTOOL_GSSET_INFO, ETHTOOL_GSTATS, ETHTOOL_GSTRINGS,
    IFNAMSIZ, SIOCETHTOOL, EthtoolStatsReader, IoctlUnavailable, NoStats)
