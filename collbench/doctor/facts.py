"""One host's RoCE facts, read from its sysfs tree (or a fixture tree of the same layout) and
`mlnx_qos` output: what `doctor` compares. Every file is untrusted: read bounded, parsed or
recorded as unreadable, never a traceback.

Layout (the kernel's and the mlx5 driver's):
    <sysfs>/class/net/<if>/{mtu,operstate}
    <sysfs>/class/net/<if>/ecn/roce_np/enable/<prio>      ECN at the notification point (0/1)
    <sysfs>/class/net/<if>/ecn/roce_rp/enable/<prio>      ECN at the reaction point (0/1)
    <sysfs>/class/net/<if>/ecn/roce_np/{cnp_802p_prio,cnp_dscp}
    <sysfs>/class/infiniband/<dev>/ports/<p>/{state,phys_state,rate,link_layer}
    <sysfs>/class/infiniband/<dev>/ports/<p>/gids/<N>, gid_attrs/types/<N>, gid_attrs/ndevs/<N>
    `mlnx_qos -i <if>`: "Priority trust state: dscp" and the "PFC configuration:" table's
    "enabled" row (one 0/1 per priority 0..7)

    python -m collbench.doctor.facts [--sysfs-root /sys] [--qos-dir DIR] [--netdevs a,b]
prints them as one JSON object: `doctor` runs it on each host over SSH (doctor.remote).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

from collbench.bounded_file import UntrustedFileError, read_limited_text
from collbench.bounded_repr import bounded_repr, bounded_text
from collbench.names import netdev_name_problem

MAX_FILE = 4096          # a sysfs attribute is a line
MAX_ENTRIES = 256        # netdevs, devices, ports, GIDs looked at
MAX_QOS = 64 << 10
READ_TIMEOUT_S = 2.0     # a sysfs read a stuck driver never answers costs this, then a parked thread
HOST_READ_BUDGET_S = 15.0  # all of one host's reads: a driver stuck on every file cannot cost 2 s x 1000 files
_budget = threading.local()
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"

# what each attribute may hold; anything else is garbage, reported (never read as absent)
_PATTERNS = {"mtu": r"[0-9]{1,9}", "operstate": r"[A-Za-z]{1,20}", "enable": r"[01]", "cnp_802p_prio": r"[0-7]",
             "cnp_dscp": r"[0-9]|[1-5][0-9]|6[0-3]", "state": r"[0-9]{1,3}: ?[A-Z_]{1,32}|[A-Z_]{1,32}",
             "phys_state": r"[0-9]{1,3}: ?[A-Za-z_ ]{1,40}|[A-Za-z_ ]{1,40}", "rate": r"[ -~]{1,64}",
             "link_layer": r"[A-Za-z]{1,32}", "type": r"[ -~]{1,32}", "gid": r"[0-9a-fA-F:]{1,64}"}


def _read(path, unreadable=None, key=None, kind=None):
    """The file's stripped text; None when absent. A file that is there but cannot be read
    within its bounds (a FIFO, a device, a read that never ends), or whose text is not what a
    `kind` (default: key's last part) may hold, is None too, and recorded in unreadable[key]."""
    kind = kind or (key.rsplit("/", 1)[-1] if key else "")
    try:
        deadline = getattr(_budget, "deadline", None)
        left = READ_TIMEOUT_S if deadline is None else min(READ_TIMEOUT_S, deadline - time.monotonic())
        if left <= 0:
            raise UntrustedFileError(f"not read: the host's {HOST_READ_BUDGET_S:g} s for its files were spent on "
                                     "reads that did not answer")
        text = read_limited_text(path, MAX_FILE, timeout_s=left).strip()
    except UntrustedFileError as e:
        # a GID's ndevs file of an InfiniBand port fails its read by design (no netdev)
        quiet = kind == "ndevs" and str(e).startswith("cannot read it")
        if unreadable is not None and os.path.lexists(path) and not quiet:
            unreadable[key] = str(e)
        return None
    pattern = _PATTERNS.get(kind)
    if pattern is not None and not re.fullmatch(pattern, text):
        if unreadable is not None:
            unreadable[key] = f"{bounded_repr(text, 40)} is not {_WHAT.get(kind, 'a value it can hold')}"
        return None
    return text


_WHAT = {"mtu": "an MTU", "operstate": "an operstate (up, down, ...)", "enable": "0 or 1",
         "cnp_802p_prio": "a priority 0..7", "cnp_dscp": "a DSCP value 0..63", "gid": "a GID"}


def _int(text):
    return int(text) if text is not None and re.fullmatch(r"[0-9]{1,9}", text) else None


def _list(path, problems=None, what=None):
    """The sorted names in a directory; [] when absent. One that is there but not a directory
    (or cannot be listed) is recorded in problems with `what` it should have been."""
    try:
        return sorted(os.listdir(path))[:MAX_ENTRIES]
    except OSError as e:
        if problems is not None and os.path.lexists(path):
            problems.append(f"{what}: {'not a directory' if isinstance(e, NotADirectoryError) else e.strerror}")
        return []


def rdma_ports(sysfs, problems=None):
    """[{device, port, state, phys_state, rate, link_layer, netdev, gids: [{index, gid, type, netdev}],
    unreadable: {file: why}}]; problems: what is there but is not what an RDMA class holds."""
    out = []
    base = os.path.join(sysfs, "class", "infiniband")
    for dev in _list(base, problems, "class/infiniband (expected the RDMA devices' directory)"):
        if not os.path.isdir(os.path.join(base, dev)):
            problems.append(f"class/infiniband/{bounded_repr(dev, 40)}: not a directory (expected an RDMA device)")
            continue
        for port in _list(os.path.join(base, dev, "ports"), problems,
                          f"class/infiniband/{bounded_repr(dev, 40)}/ports (expected an RDMA device's ports)"):
            p = os.path.join(base, dev, "ports", port)
            bad = {}
            gids = []
            for n in _list(os.path.join(p, "gids")):
                if not n.isascii() or not n.isdigit() or len(n) > 6:
                    continue
                gid = _read(os.path.join(p, "gids", n), bad, f"gids/{n}", "gid")
                if gid is None or gid == ZERO_GID:
                    continue
                ndev = _read(os.path.join(p, "gid_attrs", "ndevs", n), bad, f"gid_attrs/ndevs/{n}", "ndevs")
                if ndev is not None and netdev_name_problem(ndev):
                    bad[f"gid_attrs/ndevs/{n}"] = f"{bounded_repr(ndev, 40)}: {netdev_name_problem(ndev)}"
                    ndev = None
                gids.append({"index": int(n), "gid": gid[:64],
                             "type": (_read(os.path.join(p, "gid_attrs", "types", n), bad, f"gid_attrs/types/{n}", "type")
                                      or "")[:32] or None,
                             "netdev": ndev})
            gids.sort(key=lambda g: g["index"])
            netdevs = sorted({g["netdev"] for g in gids if g["netdev"]})
            out.append({"device": dev[:64], "port": port[:8], "state": (_read(os.path.join(p, "state"), bad, "state") or "")[:40] or None,
                        "phys_state": (_read(os.path.join(p, "phys_state"), bad, "phys_state") or "")[:40] or None,
                        "rate": (_read(os.path.join(p, "rate"), bad, "rate") or "")[:64] or None,
                        "link_layer": (_read(os.path.join(p, "link_layer"), bad, "link_layer") or "")[:32] or None,
                        "netdev": netdevs[0] if netdevs else None, "gids": gids[:MAX_ENTRIES],
                        "unreadable": bad})
    return out


def _per_prio(directory, unreadable, where):
    """{prio: 0/1} of an ecn .../enable directory; {} when there is none."""
    out = {}
    for n in _list(directory):
        if n.isascii() and n.isdigit() and int(n) <= 7:
            v = _int(_read(os.path.join(directory, n), unreadable, f"{where}/{n}", "enable"))
            if v is not None:
                out[int(n)] = v
    return out


def netdev_facts(sysfs, name):
    d = os.path.join(sysfs, "class", "net", name)
    ecn = os.path.join(d, "ecn")
    bad = {}
    facts = {"mtu": _int(_read(os.path.join(d, "mtu"), bad, "mtu")),
             "operstate": (_read(os.path.join(d, "operstate"), bad, "operstate") or "")[:20] or None,
             "ecn_np": _per_prio(os.path.join(ecn, "roce_np", "enable"), bad, "ecn/roce_np/enable"),
             "ecn_rp": _per_prio(os.path.join(ecn, "roce_rp", "enable"), bad, "ecn/roce_rp/enable"),
             "cnp_802p_prio": _int(_read(os.path.join(ecn, "roce_np", "cnp_802p_prio"), bad, "ecn/roce_np/cnp_802p_prio")),
             "cnp_dscp": _int(_read(os.path.join(ecn, "roce_np", "cnp_dscp"), bad, "ecn/roce_np/cnp_dscp")),
             "has_ecn": os.path.isdir(ecn)}
    facts["unreadable"] = bad
    return facts


def parse_mlnx_qos(text):
    """{trust, pfc: [enabled priorities]} from `mlnx_qos -i IF` output; a key absent when not found."""
    out = {}
    m = re.search(r"^\s*Priority trust (?:state|mode):\s*(\w+)", text, re.M)
    if m:
        out["trust"] = m.group(1).lower()[:8]
    m = re.search(r"PFC configuration:\s*\n\s*priority((?:\s+\d)+)\s*\n\s*enabled((?:\s+[01])+)", text)
    if m:
        prios = [int(x) for x in m.group(1).split()]
        flags = [int(x) for x in m.group(2).split()]
        if len(prios) == len(flags) and all(0 <= p <= 7 for p in prios):
            out["pfc"] = sorted(p for p, f in zip(prios, flags) if f)
    return out


def qos_facts(name, qos_dir):
    """mlnx_qos's view of one netdev: from qos_dir/<name> (a saved output), else the tool when
    installed; {} when neither (not an mlx5 host); {"qos_unreadable": why} when the saved
    output is there but cannot be read (a FIFO, a device, too large, binary)."""
    if qos_dir:
        path = os.path.join(qos_dir, name)
        if not os.path.lexists(path):
            return {}
        try:
            return parse_mlnx_qos(read_limited_text(path, MAX_QOS, timeout_s=READ_TIMEOUT_S))  # its own 2 s
        except UntrustedFileError as e:
            return {"qos_unreadable": f"{bounded_text(path, 160)}: {e}"}
    tool = shutil.which("mlnx_qos")
    if not tool:
        return {}
    try:
        r = subprocess.run([tool, "-i", name], capture_output=True, text=True, errors="replace", timeout=10,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return {"qos_unreadable": "mlnx_qos gave no answer within 10 s"}
    return parse_mlnx_qos(r.stdout[:MAX_QOS]) if r.returncode == 0 else {}


def host_facts(sysfs_root="/sys", qos_dir=None, netdevs=None):
    """Everything `doctor` knows of one host: {"rdma": [...], "netdevs": {name: {...}},
    "problems": [what is there but is not what it should be]}."""
    _budget.deadline = time.monotonic() + HOST_READ_BUDGET_S
    try:
        return _host_facts(sysfs_root, qos_dir, netdevs)
    finally:
        _budget.deadline = None


def _host_facts(sysfs_root, qos_dir, netdevs):
    problems = []
    ports = rdma_ports(sysfs_root, problems)
    names, chosen = list(netdevs or ()), "config"
    if not names:
        names, chosen = sorted({p["netdev"] for p in ports if p["netdev"]}), "rdma"
    if not names:
        names, chosen = [n for n in _list(os.path.join(sysfs_root, "class", "net"), problems,
                                          "class/net (expected the network interfaces' directory)") if n != "lo"], "all"
    nets = {}
    for n in names[:MAX_ENTRIES]:
        if netdev_name_problem(n):     # a listed directory entry, or a name from elsewhere
            problems.append(f"class/net/{bounded_repr(n, 40)}: {netdev_name_problem(n)}")
            continue
        f = netdev_facts(sysfs_root, n)
        f.update(qos_facts(n, qos_dir))
        f["chosen"] = chosen      # why it is looked at: doctor.netdevs, an RDMA port's, or every one
        nets[n] = f
    return {"rdma": ports, "netdevs": nets, "problems": problems}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m collbench.doctor.facts",
                                description="print this host's RoCE facts as JSON (collbench doctor)")
    p.add_argument("--sysfs-root", default="/sys")
    p.add_argument("--qos-dir")
    p.add_argument("--netdevs", default="")
    a = p.parse_args(argv)
    facts = host_facts(a.sysfs_root, a.qos_dir, [n for n in a.netdevs.split(",") if n])
    sys.stdout.write(json.dumps(facts) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
