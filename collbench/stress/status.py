"""What `stress status` says: the daemon's state, the newest result per (op, size) and the
newest failure from the results log's tail (the Slurm backend renders its daemon part too)."""

import json
import sys
import time

from collbench.results.results_log import tail_records
from collbench.results.state_dir import CRASHED, RUNNING, daemon_status
from collbench import bench_processes as processes
from collbench.stress.log_view import BadLines, format_bandwidth, printable
from collbench.stress.resolve import results_path
from collbench.tables import Column, format_duration, format_us, table_lines


def report(args, cfg, paths):
    """`stress status` of the local daemon: running (0) / crashed (1) / stopped (3), like LSB
    init scripts; --json for machines."""
    st = daemon_status(paths, scan=True)
    info = st.info
    results = results_path(paths, info)
    last = last_results(results)
    leftovers = []
    if st.state != RUNNING and info.get("token"):
        leftovers = processes.token_pids(info["token"])
    if args.json:
        out = {"state": st.state, "pid": st.pid, "reason": st.reason, "state_dir": paths.state_dir,
               "results_log": results, "uptime_s": (time.time() - info["started"])
               if st.state == RUNNING and info.get("started") else None,
               "iteration": info.get("iteration"), "leftover_pids": leftovers,
               "daemon": info, "last_results": last["results"], "last_failure": last["failure"],
               "bad_lines": last["bad_lines"]}
        print(json.dumps(out, indent=1, sort_keys=True))
        return st.exit_code
    print("\n".join(render_status(st, paths, results, last, leftovers)))
    return st.exit_code


STATUS_TAIL_BYTES = 64 << 20    # status reads at most this much of the log's end


def last_results(results_path, max_records=20000):
    """The newest result per (op, size) and the newest failure, from the log's tail; and the
    lines met there that are not valid records (`bad_lines`: count, first)."""
    bad = BadLines(show=0)
    try:
        recs = tail_records(results_path, max_records, on_bad=bad, max_bytes=STATUS_TAIL_BYTES) \
            if results_path else []
    except OSError as e:   # status still reports the daemon; the log's fault is one more line
        print(f"collbench stress: cannot read the results log {results_path}: {e.strerror or e}",
              file=sys.stderr, flush=True)
        recs = []
    latest, failure, event = {}, None, None
    for r in recs:
        t = r.get("type")
        if t == "result":
            latest[(r.get("op"), r.get("size_bytes"))] = r
        elif t == "failure":
            failure = r
        elif t == "event":
            event = r
    return {"results": list(latest.values()), "failure": failure, "event": event,
            "bad_lines": {"count": bad.count, "first": bad.first}}


def render_status(st, paths, results, last, leftovers):
    info, now = st.info, time.time()
    lines = []
    if st.state == RUNNING:
        lines.append(f"collbench stress: running (pid {st.pid}, up {format_duration(now - info.get('started', now))}, "
                     f"iteration {info.get('iteration', 0)}, {info.get('status', '?')})")
        lines.append(f"  mode {info.get('mode')}, engine {info.get('engine')}, job pid {info.get('job_pid') or '-'}, "
                     f"relaunches {info.get('relaunches', 0)}, state updated {format_duration(now - info.get('updated', now))} ago")
        if st.reason:   # found in /proc by its lock, not by its files
            lines.append(f"  WARNING: {st.reason}; the daemon recreates it within seconds "
                         "(`collbench stress stop` stops it)")
    elif st.state == CRASHED:
        lines.append(f"collbench stress: crashed ({st.reason})")
        if info.get("updated"):
            lines.append(f"  last state update {format_duration(now - info['updated'])} ago at iteration {info.get('iteration', 0)}; "
                         "`collbench stress start` replaces the stale pid file, `stop` cleans up")
    else:
        lines.append("collbench stress: stopped")
        if info.get("updated"):
            lines.append(f"  last ran until {format_duration(now - info['updated'])} ago "
                         f"({info.get('stop_reason') or 'clean stop'}), iteration {info.get('iteration', 0)}")
    if leftovers:
        lines.append(f"  WARNING: {len(leftovers)} process(es) of the dead daemon still running: "
                     f"{', '.join(map(str, leftovers))} (`collbench stress stop` kills them)")
    lines.append(f"  state dir {paths.state_dir}")
    lines.append(f"  results   {results}")
    if info.get("config"):
        lines.append(f"  config    {info['config']}")
    fail = last["failure"]
    if fail:
        lines.append(f"  last failure {format_duration(now - fail.get('ts', now))} ago: "
                     f"{printable(fail.get('error'))}")
    bad = last.get("bad_lines") or {}
    if bad.get("count"):
        lines.append(f"  WARNING: {bad['count']} line(s) at the end of the results log are not valid records "
                     f"(skipped; first: {bad['first']})")
    res = sorted(last["results"], key=lambda r: (str(r.get("op")), r.get("size_bytes") or 0))
    if not res:
        lines.append("  no results yet")
        return lines
    lines.append("")
    columns = [Column("op", "OP", align="left"), Column("size", "SIZE"), Column("avg", "AVG", fmt=format_us),
               Column("max", "MAX", fmt=format_us), Column("busbw", "BUSBW", fmt=format_bandwidth),
               Column("verdict", "VERDICT", align="left"), Column("iteration", "ITER"), Column("age", "AGE")]
    rows = [{"op": r.get("op", "?"), "size": r.get("size", "?"), "avg": r.get("latency_avg_us"),
             "max": r.get("latency_max_us"), "busbw": r.get("busbw_bytes_per_s"),
             "verdict": str(r.get("verdict") or "-"), "iteration": str(r.get("iteration", "-")),
             "age": format_duration(now - r.get("ts", now))} for r in res]
    return lines + table_lines(columns, rows, indent="  ", rule=False)
