"""`topo measure`'s job: every pair's ping-pong latency and bandwidth in one MPI job, as matrices.

The job itself (the engine's `--pairs` mode, where each rank runs, the checked output) is
collbench/pair_probe.py, shared with `locate`; here is what `topo measure` makes of it: the
matrices' meta, the results-log events and the failure record.
"""

import time

from collbench.pair_probe import (MAX_PAIR_LINE, PAIR_PREFIX, MeasureError, Measurement, Settings,  # noqa: F401
                                  engine_argv, labels_from_reported, measure_config, parse_pair_line, run)
from collbench.results import records


def meta(measurement, ctx, cfg):
    """How the matrices were measured (the JSON file's `meta`)."""
    s = measurement.settings
    return {"tool": "collbench topo measure", "run_id": ctx.run_id, "time": records._stamp()["time"],
            "config": cfg.source, "mpi": ctx.mpi, "transport": cfg.transport,
            "ranks": measurement.size, "ranks_per_host": s.ranks_per_host,
            "rounds": measurement.size - 1 + (measurement.size % 2),
            "concurrent": s.concurrent, "lat_size": s.lat_size, "bw_size": s.bw_size,
            "iterations": s.iterations, "bw_iterations": s.iterations // 4 + 1, "warmup": s.warmup,
            "seconds": round(measurement.seconds, 3), "reported_hosts": list(measurement.reported_hosts)}


def pair_events(measurement, ctx):
    """The measurement as results-log records: one `topo_pair` event per pair (the record
    format's events take per-event fields; readers skip events they do not know)."""
    s = measurement.settings
    out = []
    now = time.time()
    for (a, b), v in sorted(measurement.pairs.items()):
        out.append(records.event_record(
            "topo_pair", ts=now, run_id=ctx.run_id, a=measurement.labels[a], b=measurement.labels[b],
            round=v["round"], latency_us=v["lat_us"], bandwidth_bytes_per_s=v["bw_bytes_per_s"],
            lat_size=s.lat_size, bw_size=s.bw_size, iterations=s.iterations, concurrent=s.concurrent,
            hosts=list(measurement.labels), mpi=ctx.mpi, transport=ctx.transport))
    return out


def summary_event(measurement, ctx, outlier_reports, files):
    """One `topo_measure` event: the outliers found (hosts and links, per metric) and the files."""
    found = {}
    for name, rep in outlier_reports.items():
        found[name] = {"hosts": [{"host": h.host, "factor": round(h.factor, 4)} for h in rep.hosts][:64],
                       "links": [{"a": lk.a, "b": lk.b, "factor": round(lk.factor, 4)} for lk in rep.links][:64]}
    any_found = any(r.any for r in outlier_reports.values())
    return records.event_record(
        "topo_measure", run_id=ctx.run_id, detail=f"{measurement.size} ranks, "
        f"{'outliers found' if any_found else 'no outliers'}", hosts=list(measurement.labels),
        ranks=measurement.size, outliers=found, files=dict(files), seconds=round(measurement.seconds, 3))


def failure(ctx, error):
    """A failure record for a measurement job that failed."""
    return records.failure_record(ctx, f"topo measure: {error}", error.stderr_tail, None, None, error.exit_code)
