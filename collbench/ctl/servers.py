"""`servers`: check every host of the hostfile in parallel, each within its own timeout.

Runs where the hosts are reachable from: on the master (the controller runs it there over SSH
and renders the JSON it prints). Each host gets one SSH connection (the master's own ssh setup,
or `master.hosts_ssh_config`) and one stdlib-only Python probe fed on stdin, so it works before
collbench is deployed on the hosts. A host that is down, slow or refuses us is a row with the
reason, never a hang: the check of each host is bounded by --timeout.
"""

import concurrent.futures
import inspect
import json
import os
import socket
import sys
import time

from collbench import proctree
from collbench.ctl import ssh
from collbench.hosts import is_this_machine
from collbench.results.lines import read_lines_backwards
from collbench.results.record_parser import is_record, parse_record
from collbench import bench_processes as processes
from collbench.results.state_dir import StatePaths
from collbench.tables import Column, format_duration, table_lines

RESULTS_TAIL_BYTES = 1 << 20


def rdma_ports(sysfs_root="/sys"):
    """[{device, port, state, phys_state, rate, link_layer, netdevs}] from /sys/class/infiniband."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    out = []
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return out

    def read(*parts):
        try:
            with open(os.path.join(*parts), encoding="utf-8", errors="replace") as f:
                return f.read().strip()
        except OSError:
            return None
    for dev in devices:
        try:
            netdevs = sorted(os.listdir(os.path.join(base, dev, "device", "net")))
        except OSError:
            netdevs = []
        try:
            ports = sorted(os.listdir(os.path.join(base, dev, "ports")), key=lambda p: int(p) if p.isdigit() else 0)
        except OSError:
            ports = []
        for port in ports:
            pdir = os.path.join(base, dev, "ports", port)
            state = read(pdir, "state") or "?"           # "4: ACTIVE"
            phys = read(pdir, "phys_state") or "?"       # "5: LinkUp"
            out.append({"device": dev, "port": port,
                        "state": state.split(":", 1)[-1].strip(),
                        "phys_state": phys.split(":", 1)[-1].strip(),
                        "rate": read(pdir, "rate"), "link_layer": read(pdir, "link_layer"),
                        "netdevs": netdevs})
    return out


def probe_local(sysfs_root="/sys", proc_root="/proc", interval=0.5):
    """What `servers` reports about the machine it runs on.

    Processes are those of this host's network namespace: hosts that share a kernel (a
    namespace testbed, containers) would otherwise all show every host's ranks. The engine
    processes of other namespaces are counted in other_netns_processes.
    """
    data = processes.collect(proc_root, interval)
    own = proctree.net_namespace("self", proc_root)
    mine = [p for p in data["processes"] if proctree.net_namespace(p["pid"], proc_root) in (own, None)]
    data["other_netns_processes"] = len(data["processes"]) - len(mine)
    data["processes"] = mine
    data["hostname"] = socket.gethostname()
    data["rdma"] = rdma_ports(sysfs_root)
    return data


def _probe_script():
    """A self-contained Python program printing probe_local()'s JSON (no collbench needed).

    It carries the source of the two stdlib-only modules the probe uses, proctree and
    bench_processes, registered under their own names so that `from collbench import proctree`
    inside processes resolves to the copy sent along, not to an installed collbench.
    """
    return "\n".join([
        "import json, os, socket, sys, time, types",
        "def _module(name, source):",
        "    mod = sys.modules[name] = types.ModuleType(name)",
        "    exec(compile(source, name, 'exec'), mod.__dict__)",
        "    return mod",
        "collbench = _module('collbench', '')",
        f"proctree = collbench.proctree = _module('collbench.proctree', {inspect.getsource(proctree)!r})",
        f"processes = _module('collbench.bench_processes', {inspect.getsource(processes)!r})",
        inspect.getsource(rdma_ports),
        inspect.getsource(probe_local),
        "json.dump(probe_local(), sys.stdout)",
        "print()",
    ])


def _error_kind(exc):
    return {ssh.HostUnreachableError: "unreachable", ssh.SSHTimeoutError: "timeout",
            ssh.AuthenticationFailedError: "auth", ssh.UnknownHostKeyError: "hostkey-unknown",
            ssh.HostKeyMismatchError: "hostkey-changed"}.get(type(exc), "error")


def check_host(host, master, timeout, accept_new_host_key=False):
    """One host's row (dict). Never raises for the host's own failures."""
    row = {"host": host, "reachable": False, "error": None, "error_kind": None}
    started = time.monotonic()
    try:
        if is_this_machine(host):
            data = probe_local()
        else:
            target = ssh.resolve_target(host, ssh_config=master.hosts_ssh_config,
                                        connect_timeout=timeout, what=f"host {host}")
            with ssh.connect(target, accept_new_host_key) as conn:
                left = max(1.0, timeout - (time.monotonic() - started))
                res = conn.run([master.python, "-"], timeout=left, input=_probe_script())
            if res.returncode != 0:
                raise ssh.SSHError(f"probe failed (exit {res.returncode}): "
                                   f"{(res.stderr.strip().splitlines() or ['no output'])[-1]}")
            data = json.loads(res.stdout.strip().splitlines()[-1])
        row.update(reachable=True, **{k: data.get(k) for k in
                                      ("hostname", "cpus", "loadavg", "processes", "rdma",
                                       "other_netns_processes")})
    except ssh.SSHError as e:
        row.update(error=str(e), error_kind=_error_kind(e))
    except Exception as e:  # a malformed answer is this host's problem, not the table's
        row.update(error=f"{type(e).__name__}: {e}", error_kind="error")
    row["check_seconds"] = round(time.monotonic() - started, 3)
    return row


def last_results(results_log, hosts):
    """{host: newest result record naming it} from the tail of the results log."""
    out = {}
    for line in read_lines_backwards(results_log, RESULTS_TAIL_BYTES):
        rec = parse_record(line)      # the log is untrusted: only valid records count
        if not is_record(rec) or rec["type"] != "result":
            continue
        for h in rec.get("hosts") or ():
            if h in hosts and h not in out:
                out[h] = {k: rec.get(k) for k in ("ts", "op", "size", "latency_avg_us", "verdict")}
        if len(out) == len(hosts):
            break
    return out


def results_log_path(cfg):
    return StatePaths.for_config(cfg).results_log


def check_all(cfg, timeout=10.0, accept_new_host_key=False):
    """Rows for every host of cfg, checked in parallel; each bounded by `timeout` seconds."""
    hosts = cfg.host_names
    rows = {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts))))
    futures = {pool.submit(check_host, h, cfg.master, timeout, accept_new_host_key): h for h in hosts}
    done, pending = concurrent.futures.wait(futures, timeout=timeout + 2.0)
    for f in done:
        rows[futures[f]] = f.result()
    for f in pending:
        h = futures[f]
        rows[h] = {"host": h, "reachable": False, "error_kind": "timeout",
                   "error": f"no answer within {timeout:g}s", "check_seconds": timeout}
    pool.shutdown(wait=False, cancel_futures=True)
    last = last_results(results_log_path(cfg), set(hosts))
    now = time.time()
    out = []
    for h in hosts:
        row = rows[h]
        lr = last.get(h)
        if lr and lr.get("ts"):
            lr["age_s"] = round(now - lr["ts"], 1)
        row["last_result"] = lr
        out.append(row)
    return {"checked_at": now, "hosts": out}


def format_table(report):
    """The console table: one row per host, unreachable ones with their reason."""
    columns = [Column(str(i), head, align="left") for i, head in enumerate(
        ("HOST", "STATE", "HOSTNAME", "ENGINE PROCS", "CPU%", "LOAD", "RDMA", "LAST RESULT"))]
    rows = []
    for r in report["hosts"]:
        lr = r.get("last_result")
        last = "-" if not lr else (f"{format_duration(lr.get('age_s'))} ago {lr.get('op')} {lr.get('size')} "
                                   f"{lr.get('verdict') or ''}").strip()
        if not r["reachable"]:
            rows.append((r["host"], r.get("error_kind") or "down", "-", "-", "-", "-", "-", last))
            continue
        procs = r.get("processes") or []
        names = {}
        for p in procs:
            names[p["name"]] = names.get(p["name"], 0) + 1
        plist = ", ".join(f"{n}x{c}" if c > 1 else n for n, c in sorted(names.items()))
        cpu = sum(p.get("cpu_percent") or 0 for p in procs)
        load = f"{r['loadavg'][0]:.2f}" if r.get("loadavg") else "?"
        rdma = ", ".join(f"{p['device']}/{p['port']} {p['state']}" for p in r.get("rdma") or []) or "none"
        rows.append((r["host"], "up", r.get("hostname") or "?", f"{len(procs)}" + (f" ({plist})" if plist else ""),
                     f"{cpu:.0f}", load, rdma, last))
    lines = table_lines(columns, [{str(i): x for i, x in enumerate(row)} for row in rows], rule=False)
    errors = [f"  {r['host']}: {r['error']}" for r in report["hosts"] if not r["reachable"]]
    if errors:
        lines += ["", "unreachable:"] + errors
    return "\n".join(lines)


def exit_status(report):
    """0 when every host answered, 1 otherwise."""
    return 0 if all(r["reachable"] for r in report["hosts"]) else 1


def main_local(cfg, timeout, as_json, accept_new_host_key=False, out=sys.stdout):
    report = check_all(cfg, timeout, accept_new_host_key)
    if as_json:
        json.dump(report, out)
        out.write("\n")
    else:
        print(format_table(report), file=out)
    return exit_status(report)
