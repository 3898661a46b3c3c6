"""The counters around a whole run, for an engine that cannot be instrumented from inside (OSU):
the launching host's counters, read before the run's launch and after it ended (launch and
MPI start-up included), as the record's `congestion` with source "osu-run". The other hosts'
counters are not read: the OSU engine's records say nothing about them (docs/CONGESTION.md)."""

import socket

from collbench.congestion import deltas, record_field, sources
from collbench.congestion.snapshot import HostReader


class AroundRun:
    def __init__(self, cfg):
        self.cfg = cfg
        self.host = socket.gethostname()
        self.reader = (HostReader(sources.host_sources(cfg, self.host), netstat=sources.reads_netstat(cfg))
                       if sources.enabled(cfg) else None)

    def run(self, fn, record_hosts=None):
        """fn() -> a record; that record with `congestion` when the config asks for it."""
        if self.reader is None:
            return fn()
        before = self.reader.snapshot()
        record = fn()
        after = self.reader.snapshot()
        if isinstance(record, dict):
            record["congestion"] = record_field.build(
                {self.host: deltas.delta(before, after)}, before.wall, after.wall, source="osu-run",
                hosts=record_hosts, xmit_wait_tick_ns=sources.xmit_wait_tick_ns(self.cfg))
        return record
