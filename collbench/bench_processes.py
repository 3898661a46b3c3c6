"""Benchmark processes on one host and their CPU, read from /proc (for `stress servers`).

`collect()` is a pure function of a /proc tree: `ctl servers` runs the same code on each remote
host and renders it with `format_host()`. Matching by program name here only *selects what to
show*; nothing is ever signalled by name (the daemon stops its job by process group and pid tree).

Standard library and collbench.proctree only: `ctl servers` sends this file's source and
proctree's to hosts where collbench is not installed (servers._probe_script).
"""

import argparse
import json
import os
import socket
import sys
import time

from collbench import proctree

# Programs that make up a benchmark job: launchers, OpenMPI/PRRTE daemons, the engines.
ENGINE_PROGRAMS = ("collbench-engine", "mpirun", "mpiexec", "orterun", "orted", "prterun", "prted", "srun")
ENGINE_PREFIXES = ("osu_", "collbench-engine")  # the cached build is collbench-engine-<key>
# The environment variable the stress daemon puts on every process it starts.
TOKEN_ENV = "COLLBENCH_STRESS_TOKEN"


def program_name(cmdline, comm):
    """argv[0]'s basename (comm is cut at 15 characters: 'collbench-engin')."""
    if cmdline:
        return os.path.basename(cmdline[0]) or comm
    return comm


def is_engine_program(name):
    return name in ENGINE_PROGRAMS or name.startswith(ENGINE_PREFIXES)


def _read(path, mode="rb"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def environ_token(pid, proc_root="/proc"):
    """The stress daemon token in a process's environment, or None (also when unreadable)."""
    data = _read(f"{proc_root}/{pid}/environ")
    if not data:
        return None
    prefix = TOKEN_ENV.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "replace")
    return None


def token_pids(token, proc_root="/proc"):
    """Pids whose environment carries the stress daemon `token`."""
    return [p for p in proctree.pids(proc_root) if environ_token(p, proc_root) == token]


def snapshot(proc_root="/proc", select=is_engine_program):
    """{pid: info} for processes whose program name `select` accepts (zombies left out)."""
    out = {}
    for pid in proctree.pids(proc_root):
        st = proctree.read_stat(pid, proc_root)
        if not proctree.is_running(st):
            continue
        cmdline = proctree.cmdline(pid, proc_root) or []
        name = program_name(cmdline, st.comm)
        if select is None or select(name):
            out[pid] = dict(st._asdict(), name=name, cmdline=cmdline)
    return out


def collect(proc_root="/proc", interval=0.5, token=None):
    """Benchmark processes with CPU% over `interval` seconds (as top), plus host load.

    Returns a JSON-ready dict: host, time, cpus, loadavg, processes [...] sorted by pid; each
    process has pid, ppid, pgid, name, state, cpu_percent, rss_bytes, elapsed_s, cmdline and
    `ours` (True when it carries the stress daemon `token`, None when no token was given).
    """
    tck = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    first = snapshot(proc_root)
    t0 = time.monotonic()
    if interval and first:
        time.sleep(interval)
    second = snapshot(proc_root)
    dt = max(time.monotonic() - t0, 1e-6)
    uptime = _uptime(proc_root)
    procs = []
    for pid, st in sorted(second.items()):
        before = first.get(pid)
        if before and before["start_ticks"] == st["start_ticks"] and interval:
            cpu = (st["cpu_ticks"] - before["cpu_ticks"]) / tck / dt * 100.0
        else:  # new since the first look (or no interval): average over its life
            life = max(uptime - st["start_ticks"] / tck, 1e-6) if uptime else None
            cpu = st["cpu_ticks"] / tck / life * 100.0 if life else None
        procs.append({
            "pid": pid, "ppid": st["ppid"], "pgid": st["pgid"], "name": st["name"],
            "state": st["state"],
            "cpu_percent": None if cpu is None else round(cpu, 1),
            "rss_bytes": st["rss_pages"] * page,
            "elapsed_s": None if not uptime else round(uptime - st["start_ticks"] / tck, 1),
            "cmdline": " ".join(st["cmdline"])[:300],
            "ours": None if token is None else environ_token(pid, proc_root) == token,
        })
    load = (_read(f"{proc_root}/loadavg", "r") or "").split()[:3]
    return {"host": socket.gethostname(), "time": time.time(), "cpus": os.cpu_count(),
            "loadavg": [float(x) for x in load] if load else None, "processes": procs}


def _uptime(proc_root):
    text = _read(f"{proc_root}/uptime", "r")
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


def format_host(label, data, error=None):
    """Lines for one host: a header with load and the engine CPU total, then one per process."""
    # collbench.tables is imported here, not at the top: ctl servers ships this module's source
    # alone to the hosts (stdlib only), where only collect() runs
    from collbench.tables import Column, format_duration, table_lines
    if error:
        return [f"{label}: unavailable: {error}"]
    procs = data["processes"]
    total = sum(p["cpu_percent"] or 0 for p in procs)
    load = "/".join(f"{x:.2f}" for x in data["loadavg"]) if data.get("loadavg") else "?"
    lines = [f"{label} ({data['host']}): {len(procs)} benchmark process(es), "
             f"{total:.0f}% CPU of {data['cpus'] * 100}%, load {load}"]
    if procs:
        columns = [Column("pid", "PID", width=6), Column("ppid", "PPID", width=6), Column("pgid", "PGID", width=6),
                   Column("cpu", "CPU%", width=5), Column("rss", "RSS", width=7), Column("age", "ELAPSED", width=7),
                   Column("program", "PROGRAM", align="left")]
        rows = [{"pid": p["pid"], "ppid": p["ppid"], "pgid": p["pgid"],
                 "cpu": "?" if p["cpu_percent"] is None else f"{p['cpu_percent']:.1f}",
                 "rss": f"{p['rss_bytes'] / 2**20:.1f}M", "age": format_duration(p["elapsed_s"]),
                 "program": p["name"] + ("" if p["ours"] is None else ("  [daemon]" if p["ours"] else "  [not the daemon's]"))}
                for p in procs]
        lines += table_lines(columns, rows, indent="   ", rule=False)
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m collbench.bench_processes",
                                description="Benchmark processes on this host and their CPU, from /proc.")
    p.add_argument("--json", action="store_true", help="print JSON (what the SSH controller reads)")
    p.add_argument("--interval", type=float, default=0.5, help="CPU sampling interval, seconds")
    p.add_argument("--token", help="mark processes carrying this stress daemon token")
    p.add_argument("--proc-root", default="/proc")
    args = p.parse_args(argv)
    data = collect(args.proc_root, args.interval, args.token)
    if args.json:
        json.dump(data, sys.stdout)
        sys.stdout.write("\n")
    else:
        print("\n".join(format_host("localhost", data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
