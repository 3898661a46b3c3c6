"""The host's IP ECN counters from <procfs>/net/netstat (IpExt), present on any Linux host.

InCEPkts counts packets that arrived marked Congestion Experienced: for traffic over the
kernel stack (TCP transports), the host-side view of ECN marking. Counters are those of the
exporter's network namespace. What each counter means is the congestion table's
(collbench/congestion/counters.py), the one the built-in engine reads around each step.
The file is read bounded (collbench/bounded_file.py): a regular file of MAX_NETSTAT_BYTES at
most; a FIFO, a device or a bigger file is refused and counted (collbench_collector_errors_total).
"""

import os

from prometheus_client.core import CounterMetricFamily

from collbench.bounded_file import UntrustedFileError, read_limited_text
from collbench.congestion import counters
from collbench.congestion.netstat import MAX_NETSTAT_BYTES, section_fields
from collbench.exporter.collectors import Collector, NoData, file_error_reason, register

# IpExt field -> exported name (the names are a contract: tests/test_layout_contract.py)
IPEXT_NAMES = {"InCEPkts": "collbench_netstat_ip_in_ce_packets", "InECT0Pkts": "collbench_netstat_ip_in_ect0_packets",
               "InECT1Pkts": "collbench_netstat_ip_in_ect1_packets",
               "InNoECTPkts": "collbench_netstat_ip_in_noect_packets"}
IPEXT_COUNTERS = tuple((field, IPEXT_NAMES[field], counters.describe("netstat", field))
                       for field in counters.names("netstat", "IpExt") if field in IPEXT_NAMES)
# TcpExt: the sender's side of ECN on TCP transports (the host whose outgoing path is marked);
# `diagnose --inspector --prometheus` and CollbenchInspectorLatencyShift name the host from it
TCPEXT_NAMES = {"TCPDeliveredCE": "collbench_netstat_tcp_delivered_ce_packets"}
TCPEXT_COUNTERS = tuple((field, TCPEXT_NAMES[field], counters.describe("netstat", field)) for field in TCPEXT_NAMES)


class NetstatCollector(Collector):
    name = "netstat"

    def __init__(self, procfs_root="/proc"):
        self.path = os.path.join(procfs_root, "net", "netstat")

    def collect(self):
        if not os.path.lexists(self.path):
            raise NoData(f"{self.path} does not exist")
        self.reading = self.path
        try:
            text = read_limited_text(self.path, MAX_NETSTAT_BYTES)
        except UntrustedFileError as e:
            self.count_error(file_error_reason(e))
            raise RuntimeError(f"{self.path}: {e}") from None
        ipext = section_fields(text, "IpExt")
        if not ipext:
            raise NoData(f"{self.path} has no IpExt section")
        fams = []
        for field, name, help_text in IPEXT_COUNTERS:
            if field in ipext:
                fams.append(CounterMetricFamily(name, help_text, value=ipext[field]))
        tcpext = section_fields(text, "TcpExt")
        for field, name, help_text in TCPEXT_COUNTERS:
            if field in tcpext:
                fams.append(CounterMetricFamily(name, help_text, value=tcpext[field]))
        return fams


@register("netstat", counters=True)
def _netstat(ex, _device_filter):
    return NetstatCollector(ex.settings.procfs_root)
