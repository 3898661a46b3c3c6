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

MAX_FILE = 4096          # a sysfs attribute is a line
MAX_ENTRIES = 256        # netdevs, devices, ports, GIDs looked at
MAX_QOS = 64 << 10
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _read(path):
    """The file's stripped text; None when absent or unreadable, or not text."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE)
    except OSError:
        return None
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        return None


def _int(text):
    return int(text) if text is not None and re.fullmatch(r"[0-9]{1,9}", text) else None


def _list(path):
    try:
        return sorted(os.listdir(path))[:MAX_ENTRIES]
    except OSError:
        return []


def rdma_ports(sysfs):
    """[{device, port, state, phys_state, rate, link_layer, netdev, gids: [{index, gid, type, netdev}]}]."""
    out = []
    base = os.path.join(sysfs, "class", "infiniband")
    for dev in _list(base):
        for port in _list(os.path.join(base, dev, "ports")):
            p = os.path.join(base, dev, "ports", port)
            gids = []
            for n in _list(os.path.join(p, "gids")):
                if not n.isdigit():
                    continue
                gid = _read(os.path.join(p, "gids", n))
                if gid is None or gid == ZERO_GID:
                    continue
                gids.append({"index": int(n), "gid": gid[:64],
                             "type": (_read(os.path.join(p, "gid_attrs", "types", n)) or "")[:32] or None,
                             "netdev": (_read(os.path.join(p, "gid_attrs", "ndevs", n)) or "")[:32] or None})
            gids.sort(key=lambda g: g["index"])
            netdevs = sorted({g["netdev"] for g in gids if g["netdev"]})
            out.append({"device": dev[:64], "port": port[:8], "state": (_read(os.path.join(p, "state")) or "")[:40] or None,
                        "phys_state": (_read(os.path.join(p, "phys_state")) or "")[:40] or None,
                        "rate": (_read(os.path.join(p, "rate")) or "")[:64] or None,
                        "link_layer": (_read(os.path.join(p, "link_layer")) or "")[:32] or None,
                        "netdev": netdevs[0] if netdevs else None, "gids": gids[:MAX_ENTRIES]})
    return out


def _per_prio(directory):
    """{prio: 0/1} of an ecn .../enable directory; {} when there is none."""
    out = {}
    for n in _list(directory):
        if n.isdigit() and int(n) <= 7:
            v = _int(_read(os.path.join(directory, n)))
            if v is not None:
                out[int(n)] = v
    return out


def netdev_facts(sysfs, name):
    d = os.path.join(sysfs, "class", "net", name)
    ecn = os.path.join(d, "ecn")
    return {"mtu": _int(_read(os.path.join(d, "mtu"))), "operstate": (_read(os.path.join(d, "operstate")) or "")[:20] or None,
            "ecn_np": _per_prio(os.path.join(ecn, "roce_np", "enable")),
            "ecn_rp": _per_prio(os.path.join(ecn, "roce_rp", "enable")),
            "cnp_802p_prio": _int(_read(os.path.join(ecn, "roce_np", "cnp_802p_prio"))),
            "cnp_dscp": _int(_read(os.path.join(ecn, "roce_np", "cnp_dscp"))),
            "has_ecn": os.path.isdir(ecn)}


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
    installed; {} when neither (not an mlx5 host)."""
    if qos_dir:
        try:
            with open(os.path.join(qos_dir, name), "rb") as f:
                return parse_mlnx_qos(f.read(MAX_QOS).decode("utf-8", "replace"))
        except OSError:
            return {}
    tool = shutil.which("mlnx_qos")
    if not tool:
        return {}
    try:
        r = subprocess.run([tool, "-i", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_mlnx_qos(r.stdout[:MAX_QOS]) if r.returncode == 0 else {}


def host_facts(sysfs_root="/sys", qos_dir=None, netdevs=None):
    """Everything `doctor` knows of one host: {"rdma": [...], "netdevs": {name: {...}}}."""
    ports = rdma_ports(sysfs_root)
    names, chosen = list(netdevs or ()), "config"
    if not names:
        names, chosen = sorted({p["netdev"] for p in ports if p["netdev"]}), "rdma"
    if not names:
        names, chosen = [n for n in _list(os.path.join(sysfs_root, "class", "net")) if n != "lo"], "all"
    nets = {}
    for n in names[:MAX_ENTRIES]:
        f = netdev_facts(sysfs_root, n)
        f.update(qos_facts(n, qos_dir))
        f["chosen"] = chosen      # why it is looked at: doctor.netdevs, an RDMA port's, or every one
        nets[n] = f
    return {"rdma": ports, "netdevs": nets}


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
