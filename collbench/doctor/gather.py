"""Every host's facts: read here from its tree (doctor.sysfs_root, or doctor.hosts' per-host
trees), or on the host itself over SSH (doctor.remote: `python -m collbench.doctor.facts` run in
master.remote_dir with master.python, through master.hosts_ssh_config, the way `ctl` reaches the
hosts). A host that cannot be reached, or whose answer is not facts, gets an `error` instead."""

import json
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor

from collbench.doctor import facts as facts_mod

MAX_ANSWER = 4 << 20
PARALLEL = 16


class HostFacts:
    def __init__(self, host, facts=None, error=None):
        self.host = host
        self.facts = facts
        self.error = error


def host_names(cfg):
    return [h.name for h in cfg.hosts]


def _local(cfg, host):
    d = cfg.doctor
    over = d.hosts.get(host, {})
    return facts_mod.host_facts(over.get("sysfs_root", d.sysfs_root), over.get("qos_dir", d.qos_dir), d.netdevs)


def remote_argv(cfg, host):
    m, d = cfg.master, cfg.doctor
    cmd = (f"cd {shlex.quote(m.remote_dir)} && {shlex.quote(m.python)} -m collbench.doctor.facts"
           f" --sysfs-root {shlex.quote(d.sysfs_root)}"
           + (f" --qos-dir {shlex.quote(d.qos_dir)}" if d.qos_dir else "")
           + (f" --netdevs {shlex.quote(','.join(d.netdevs))}" if d.netdevs else ""))
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(m.connect_timeout)}"]
    if m.hosts_ssh_config:
        argv += ["-F", m.hosts_ssh_config]
    return argv + ["--", host, cmd]


def _remote(cfg, host):
    timeout = cfg.master.connect_timeout + 30
    try:
        r = subprocess.run(remote_argv(cfg, host), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return HostFacts(host, error=f"unreachable: no answer over SSH in {timeout:g} s")
    except OSError as e:
        return HostFacts(host, error=f"unreachable: cannot run ssh: {e.strerror}")
    err = r.stderr.decode("utf-8", "replace").strip().splitlines()
    if r.returncode != 0:
        why = err[-1][:200] if err else f"exit {r.returncode}"
        return HostFacts(host, error=f"unreachable: ssh exit {r.returncode}: {why}")
    try:
        return HostFacts(host, json.loads(r.stdout[:MAX_ANSWER].decode("utf-8")))
    except (ValueError, RecursionError):     # RecursionError: nesting past Python's limit
        return HostFacts(host, error="its facts are not JSON (collbench missing or too old there?)")


def gather(cfg):
    """[HostFacts] in the config's host order."""
    hosts = host_names(cfg)
    if cfg.doctor.remote and not cfg.implicit_hosts:
        with ThreadPoolExecutor(min(PARALLEL, len(hosts))) as pool:
            return list(pool.map(lambda h: _remote(cfg, h), hosts))
    return [HostFacts(h, _local(cfg, h)) for h in hosts]
