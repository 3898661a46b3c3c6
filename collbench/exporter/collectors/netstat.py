"""The host's IP ECN counters from <procfs>/net/netstat (IpExt), present on any Linux host.

InCEPkts counts packets that arrived marked Congestion Experienced: for traffic over the
kernel stack (TCP transports), the host-side view of ECN marking. Counters are those of the
exporter's network namespace.
"""

import os

from prometheus_client.core import CounterMetricFamily

from collbench.exporter.collectors import Collector, NoData

IPEXT_COUNTERS = (
    ("InCEPkts", "collbench_netstat_ip_in_ce_packets", "IP packets received with ECN Congestion Experienced (CE)."),
    ("InECT0Pkts", "collbench_netstat_ip_in_ect0_packets", "IP packets received ECN-capable, ECT(0)."),
    ("InECT1Pkts", "collbench_netstat_ip_in_ect1_packets", "IP packets received ECN-capable, ECT(1)."),
    ("InNoECTPkts", "collbench_netstat_ip_in_noect_packets", "IP packets received not ECN-capable."),
)


def parse_netstat(text):
    """{'IpExt': {'InCEPkts': 0, ...}, 'TcpExt': {...}}: pairs of header and value lines."""
    out = {}
    lines = [line.split() for line in text.splitlines() if line.strip()]
    for header, values in zip(lines[::2], lines[1::2]):
        if not header or not values or header[0] != values[0] or not header[0].endswith(":"):
            continue
        section = header[0][:-1]
        fields = {}
        for name, v in zip(header[1:], values[1:]):
            try:
                fields[name] = int(v)
            except ValueError:
                pass
        out[section] = fields
    return out


def section_fields(text, section):
    """The fields of one section ({'InCEPkts': 0, ...}), {} if absent: what parse_netstat gives
    for it, without splitting the other sections (TcpExt alone has over a hundred fields)."""
    prefix = section + ":"
    lines = [line for line in text.split("\n") if line.startswith(prefix)]
    return parse_netstat("\n".join(lines[:2])).get(section, {})


class NetstatCollector(Collector):
    name = "netstat"

    def __init__(self, procfs_root="/proc"):
        self.path = os.path.join(procfs_root, "net", "netstat")

    def collect(self):
        try:
            with open(self.path, encoding="ascii", errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            raise NoData(f"{self.path} does not exist") from None
        ipext = section_fields(text, "IpExt")
        if not ipext:
            raise NoData(f"{self.path} has no IpExt section")
        fams = []
        for field, name, help_text in IPEXT_COUNTERS:
            if field in ipext:
                fams.append(CounterMetricFamily(name, help_text, value=ipext[field]))
        return fams
