"""Every host's congestion counters as Prometheus scraped them from the per-host counters
exporters (`collbench exporter --counters-only`, a `host` label per target): per host and
counter, the increase over each interval of a time range, read with range queries of the HTTP API
(/api/v1/query_range of `sum by (host, <labels>) (increase(<metric>[STEP]))`), and named as the
engine names them in a record's `congestion` field ("<host>|<counter>@<where>", docs/LOG_FORMAT.md),
so `diagnose` weighs them with its own rules.

The answer is untrusted: bounded in size and time, every value checked; a server that cannot be
reached or answers an error is a PrometheusError naming the URL and the query.
"""

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request

MAX_RESPONSE = 64 << 20
TIMEOUT_S = 20.0
MAX_POINTS = 11000            # Prometheus refuses more points per series than 11,000
MAX_SERIES = 100_000
_HOST = re.compile(r"[A-Za-z0-9_.:\-\[\]]{1,255}")
_WHERE = re.compile(r"[A-Za-z0-9_.:/+\-]{1,80}")
_METRIC = re.compile(r"collbench_(rdma|netstat|ethtool)_[a-z0-9_]{1,120}_total")

# exported metric -> (the labels that say where, a function (labels) -> (counter name, where, scale))
NETSTAT = {"collbench_netstat_ip_in_ce_packets_total": "InCEPkts",
           "collbench_netstat_ip_in_ect0_packets_total": "InECT0Pkts",
           "collbench_netstat_ip_in_ect1_packets_total": "InECT1Pkts",
           "collbench_netstat_ip_in_noect_packets_total": "InNoECTPkts",
           "collbench_netstat_tcp_delivered_ce_packets_total": "TCPDeliveredCE"}
ETHTOOL = {
    "collbench_ethtool_pause_frames_total": (("netdev", "direction", "priority"),
                                             lambda l: (f"{l['direction']}_prio{l['priority']}_pause", l["netdev"], 1)),
    "collbench_ethtool_pause_duration_seconds_total": (
        ("netdev", "direction", "priority"),
        lambda l: (f"{l['direction']}_prio{l['priority']}_pause_duration", l["netdev"], 1e6)),
    "collbench_ethtool_pause_ctrl_frames_total": (("netdev", "direction"),
                                                  lambda l: (f"{l['direction']}_pause_ctrl_phy", l["netdev"], 1)),
    "collbench_ethtool_rx_discards_phy_total": (("netdev",), lambda l: ("rx_discards_phy", l["netdev"], 1)),
    "collbench_ethtool_pause_storm_warning_events_total": (("netdev",),
                                                           lambda l: ("tx_pause_storm_warning_events", l["netdev"], 1)),
    "collbench_ethtool_pause_storm_error_events_total": (("netdev",),
                                                         lambda l: ("tx_pause_storm_error_events", l["netdev"], 1)),
}


class PrometheusError(Exception):
    """The server could not answer the query; str() names the URL and why."""


def counter_of(metric, labels):
    """(counter name, where, scale) of one exported counter series, or None (not a counter the
    congestion table knows)."""
    if metric in NETSTAT:
        return NETSTAT[metric], "netstat", 1
    if metric in ETHTOOL:
        need, f = ETHTOOL[metric]
        return f(labels) if all(k in labels for k in need) else None
    if metric.startswith("collbench_rdma_") and metric.endswith("_total") and "device" in labels and "port" in labels:
        name = metric[len("collbench_rdma_"):-len("_total")]
        if name.endswith("_bytes"):
            return None                   # traffic, not a signal
        return name, f"{labels['device']}/{labels['port']}", 1
    return None


def _labels_of(metric):
    if metric in NETSTAT:
        return ()
    if metric in ETHTOOL:
        return ETHTOOL[metric][0]
    return ("device", "port")


class Prometheus:
    """A Prometheus HTTP API at `url` (http://host:9090)."""

    def __init__(self, url, timeout_s=TIMEOUT_S):
        if not re.fullmatch(r"https?://[A-Za-z0-9_.:\-\[\]]+(/[A-Za-z0-9_.\-/]*)?", url or ""):
            raise PrometheusError(f"--prometheus: expected http(s)://HOST:PORT, got {str(url)[:80]!r}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path, params):
        full = f"{self.url}{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(full, timeout=self.timeout_s) as r:
                body = r.read(MAX_RESPONSE + 1)
        except urllib.error.HTTPError as e:
            detail = e.read(2000).decode("utf-8", "replace")
            raise PrometheusError(f"{self.url}{path}: HTTP {e.code} ({_error_of(detail)})") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise PrometheusError(f"{self.url}: cannot reach it ({getattr(e, 'reason', e)})") from None
        if len(body) > MAX_RESPONSE:
            raise PrometheusError(f"{self.url}{path}: answer larger than {MAX_RESPONSE >> 20} MB")
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise PrometheusError(f"{self.url}{path}: the answer is not JSON (is it a Prometheus?)") from None
        if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(doc.get("data"), (dict, list)):
            raise PrometheusError(f"{self.url}{path}: {_error_of(doc)}")
        return doc["data"]

    def metric_names(self):
        """The counters exporters' counter metrics Prometheus holds."""
        data = self._get("/api/v1/label/__name__/values", {})
        if not isinstance(data, list):
            raise PrometheusError(f"{self.url}: label values: expected a list")
        return sorted(n for n in data if isinstance(n, str) and _METRIC.fullmatch(n)
                      and (n in NETSTAT or n in ETHTOOL or n.startswith("collbench_rdma_")))

    def increases(self, start, end, step):
        """{t: {"<host>|<counter>@<where>": delta}} for t on the grid start+step .. end (multiples of
        step): each counter's increase per host over (t - step, t], rounded, only those > 0."""
        if not step > 0 or not end >= start:
            raise PrometheusError("a time range with a positive step expected")
        t0 = math.floor(start / step) * step
        t1 = math.ceil(end / step) * step
        if (t1 - t0) / step > MAX_POINTS:
            raise PrometheusError(f"{(t1 - t0) / step:.0f} intervals of {step:g} s: at most {MAX_POINTS} per query "
                                  "(a longer step, or a shorter job window)")
        out = {}
        for metric in self.metric_names():
            by = ", ".join(("host",) + tuple(_labels_of(metric)))
            query = f"sum by ({by}) (increase({metric}[{_dur(step)}]))"
            data = self._get("/api/v1/query_range", {"query": query, "start": f"{t0 + step:.3f}", "end": f"{t1:.3f}",
                                                      "step": _dur(step)})
            result = data.get("result") if isinstance(data, dict) else None
            if not isinstance(result, list) or len(result) > MAX_SERIES:
                raise PrometheusError(f"{self.url}: {query}: expected a matrix")
            for series in result:
                labels = series.get("metric") if isinstance(series, dict) else None
                values = series.get("values") if isinstance(series, dict) else None
                if not isinstance(labels, dict) or not isinstance(values, list):
                    continue
                host = labels.get("host")
                if not isinstance(host, str) or not _HOST.fullmatch(host):
                    continue            # a series without the counters exporters' host label
                if not all(isinstance(v, str) for v in labels.values()):
                    continue
                named = counter_of(metric, labels)
                if named is None or not _WHERE.fullmatch(str(named[1])):
                    continue
                name, where, scale = named
                key = f"{host}|{name}@{where}"
                for point in values[:MAX_POINTS + 1]:
                    if not (isinstance(point, list) and len(point) == 2):
                        continue
                    try:
                        t, v = float(point[0]), float(point[1])
                    except (TypeError, ValueError):
                        continue
                    if not (math.isfinite(t) and math.isfinite(v)):
                        continue
                    d = int(round(v * scale))
                    if d > 0:
                        slot = out.setdefault(round(t, 3), {})
                        slot[key] = slot.get(key, 0) + d
        return out


def _dur(seconds):
    return f"{int(seconds * 1000)}ms"


def _error_of(doc):
    if isinstance(doc, dict):
        return f"{doc.get('errorType', 'error')}: {str(doc.get('error', doc.get('status')))[:200]}"
    return str(doc)[:200]
