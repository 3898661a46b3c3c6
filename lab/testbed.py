"""A multi-host testbed on one Linux machine: N network namespaces on a bridge, an sshd in each.

    python -m lab.testbed up N [--dir DIR] [--rate-limit RATE] [--link-rate hI=RATE ...] [--full-plan]
                                     [--racks R --inter-rack-rate RATE] [--ecn-mark hI=RATE ...]
    python -m lab.testbed ecn-mark DIR hI=RATE ... | ecn-clear DIR [hI ...]
    python -m lab.testbed loss DIR hI=PERMILLE [--peer hJ] | loss-clear DIR [hI ...]
    python -m lab.testbed env DIR | down DIR | list

For tests, and for trying collbench without a cluster (needs root). Each host is a network
namespace with one interface (eth0) on a private bridge, an address in 198.18.0.0/24 (the
benchmarking range of RFC 2544), its own UTS host name and its own sshd (generated host key,
root login by a generated key only). The testbed directory holds everything to use it:

    hostfile        OpenMPI hostfile of the hosts' addresses
    ssh_config      Host h1..hN (and the addresses) -> key, user root, known_hosts, strict checking
    known_hosts     the hosts' generated keys
    id_ed25519      the client key
    collbench.yaml  a config: master = h1 over SSH, ranks on every host, ob1 over TCP, and
                    a short plan (QUICK_PLAN: first results within seconds; --full-plan
                    leaves it out, so the defaults apply: the plan of the prototype
                    this project replaces)
    testbed.json    what `down` removes

Several testbeds can run at once: names carry a random id, and each takes its own aligned
block of 198.18.0.0/24 (allocated under a lock). `down` kills every process in the namespaces,
deletes them and the bridge, and is idempotent. Per-link rate limits use tc (tbf or htb) on
both ends of a host's link, so later work can build uneven topologies.

Racks (`--racks R`, for the topology work, docs/TOPO.md): one bridge per rack, each joined to a
spine bridge by an uplink (a veth pair) shaped on both ends at `--inter-rack-rate`, so every
flow between two racks shares its racks' uplinks, as on an oversubscribed fabric. Host hI sits
in rack (I-1) mod R: the hostfile lists h1..hN in order and therefore interleaves the racks the
way a scheduler hands out nodes. The root namespace's address is on the spine.

ECN marking (`--ecn-mark hI=RATE`, or `ecn-mark`/`ecn-clear` on a running testbed): an
ECN-marking switch port in front of host hI. An nftables rule on the egress of hI's eth0 (table
`collbench_ecn`, in hI's namespace) sets CE on every ECN-capable IP packet sent beyond RATE
(bytes per second, e.g. 2mbytes; burst 128 kbytes), and `up` sets net.ipv4.tcp_ecn=1 in every
namespace so TCP negotiates ECN. The marks are real congestion signals to the kernel: the
receivers count them in IpExt InCEPkts, and hI in TcpExt TCPDeliveredCE once they are echoed
back (docs/CONGESTION.md). Needs nft (nftables; scripts/install.sh installs it).

Congestion control: marks slow TCP only under an ECN-reactive congestion control (as DCQCN reacts
on RoCE); a namespace inherits the machine's default, which may be bbr (it ignores CE). `up` pins
`cubic` in every namespace (CONGESTION_CONTROL), adding it to the root namespace's
net.ipv4.tcp_allowed_congestion_control when missing (a namespace may only choose a listed one).

Loss (`loss DIR hI=PERMILLE [--peer hJ]`, `loss-clear`): a bad cable or optic. An nftables rule
drops PERMILLE per 1000 of hI's egress packets at random (`numgen random mod 1000 lt N drop`), or
only those toward hJ (`ip daddr hJ`: one lossy link), on the wire: at the ingress of hI's veth's
bridge end (root namespace, netdev table `collbench_loss_<veth>`), so hI's TCP sees real loss.
"""

import argparse
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time

from collbench import proctree

SUBNET = ipaddress.ip_network("198.18.0.0/24")
LOCK_FILE = "/run/collbench-testbed.lock"
REGISTRY = "/run/collbench-testbed.d"      # <id> -> testbed directory, for `list`
SSHD = "/usr/sbin/sshd"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The generated config's plan: a few small sizes and few iterations, so that `once` ends and the
# daemon's first records show within seconds on namespaces sharing a laptop's cores. Seed 001's
# plan (4MB steps, 500 iterations) is what a real fabric needs: `up --full-plan`.
QUICK_PLAN = [
    {"op": "allreduce", "sizes": ["1MB", "64KB", "1KB"], "iterations": 20, "warmup": 2},
    {"op": "bcast", "sizes": ["1MB"], "iterations": 20, "warmup": 2},
    {"op": "alltoall", "sizes": ["64KB"], "iterations": 20, "warmup": 2},
]


ECN_TABLE = "collbench_ecn"          # the nftables table --ecn-mark adds in a host's namespace
# ECN marks slow TCP only under a congestion control that reacts to them; bbr (this machine's
# default, inherited by every namespace) ignores CE, cubic halves its window on an echo
CONGESTION_CONTROL = "cubic"
ECN_BURST = "128 kbytes"
_ECN_RATE = re.compile(r"^([1-9][0-9]{0,11})\s*(bytes|kbytes|mbytes)(?:/(?:second|s))?$")


class TestbedError(Exception):
    pass


def _run(argv, check=True, **kw):
    res = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and res.returncode != 0:
        raise TestbedError(f"{' '.join(map(shlex.quote, argv))} failed: {res.stderr.strip() or res.stdout.strip()}")
    return res


def _used_networks():
    """Networks of the addresses in SUBNET already on this machine's (root namespace) interfaces."""
    out = _run(["ip", "-4", "-o", "addr", "show"]).stdout
    nets = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            iface = ipaddress.ip_interface(parts[parts.index("inet") + 1])
            if iface.ip in SUBNET:
                nets.append(iface.network)
    return nets


def _allocate_block(n_hosts):
    """A free aligned block of SUBNET for a bridge + n_hosts (call with the lock held)."""
    size = 8
    while size < n_hosts + 3:   # network, bridge, hosts, broadcast
        size *= 2
    if size > SUBNET.num_addresses:
        raise TestbedError(f"{n_hosts} hosts do not fit {SUBNET} (at most {SUBNET.num_addresses - 3})")
    used = _used_networks()
    for block in SUBNET.subnets(new_prefix=32 - (size.bit_length() - 1)):
        if not any(block.overlaps(u) for u in used):
            return block
    raise TestbedError(f"no free block of {size} addresses left in {SUBNET}: tear down other testbeds "
                       f"(scripts/testbed.sh list)")


def _rate_limit(ns, dev, rate, shaper):
    """Shape egress of dev (in namespace ns, or the root namespace when ns is None)."""
    pre = ["ip", "netns", "exec", ns] if ns else []
    if shaper == "tbf":
        _run(pre + ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                    "burst", "256kb", "latency", "50ms"])
    else:
        _run(pre + ["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10"])
        _run(pre + ["tc", "class", "replace", "dev", dev, "parent", "1:", "classid", "1:10",
                    "htb", "rate", rate, "ceil", rate])


def _write(path, text, mode=0o644):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def up(n_hosts, directory=None, prefix="cbtb", rate_limit=None, link_rates=None, shaper="htb",
       slots=1, python=None, full_plan=False, racks=1, inter_rack_rate=None, ecn_marks=None):
    """Build the testbed; returns its description (dict, also in <dir>/testbed.json).

    ecn_marks: {alias or address: RATE}: mark CE on that host's egress beyond RATE (ecn_mark).

    racks > 1: one bridge per rack joined to a spine by uplinks shaped at inter_rack_rate (None:
    unshaped); host hI in rack (I-1) mod racks. On any failure everything built so far is torn
    down before the error is raised.
    """
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (network namespaces, bridges, sshd)")
    if not 1 <= n_hosts <= 64:
        raise TestbedError(f"got {n_hosts} hosts, expected 1..64")
    if not prefix.isalnum() or len(prefix) > 6:
        raise TestbedError(f"prefix {prefix!r}: expected up to 6 letters or digits")
    if not 1 <= racks <= min(n_hosts, 9):
        raise TestbedError(f"got {racks} racks for {n_hosts} hosts, expected 1..{min(n_hosts, 9)}")
    if inter_rack_rate and racks < 2:
        raise TestbedError("--inter-rack-rate needs --racks 2 or more")
    ecn_marks = dict(ecn_marks or {})
    for rate in ecn_marks.values():
        ecn_rate(rate)          # a bad rate is refused before anything is built
    tb_id = secrets.token_hex(3)
    directory = os.path.abspath(directory or f"/tmp/collbench-testbed-{tb_id}")
    os.makedirs(directory, exist_ok=True)
    if os.path.exists(os.path.join(directory, "testbed.json")):
        raise TestbedError(f"{directory} already holds a testbed (run `down {directory}` first)")
    desc = {"id": tb_id, "dir": directory, "bridge": f"{prefix[:4]}br{tb_id}", "hosts": [],
            "created": time.time(), "shaper": shaper, "racks": racks, "inter_rack_rate": inter_rack_rate,
            "rack_bridges": [], "uplinks": []}
    _save(desc)
    os.makedirs(REGISTRY, exist_ok=True)
    os.symlink(directory, os.path.join(REGISTRY, tb_id))
    try:
        _build(desc, n_hosts, prefix, rate_limit, dict(link_rates or {}), shaper, slots,
               python or sys.executable, full_plan, racks, inter_rack_rate)
        for host, rate in ecn_marks.items():
            _ecn_mark(desc, host, rate)
    except BaseException:
        down(directory)
        raise
    return desc


def _save(desc):
    tmp = os.path.join(desc["dir"], "testbed.json.tmp")
    _write(tmp, json.dumps(desc, indent=1) + "\n")
    os.replace(tmp, os.path.join(desc["dir"], "testbed.json"))


def _add_bridge(name):
    _run(["ip", "link", "add", name, "type", "bridge"])
    _run(["ip", "link", "set", name, "up"])


def _racks(desc, prefix, racks, rate, shaper):
    """One bridge per rack, each joined to the spine (desc["bridge"]) by a shaped uplink; the
    rack bridges' names in rack order."""
    tb_id = desc["id"]
    for r in range(racks):
        bridge = f"{prefix[:4]}r{r}{tb_id}"
        desc["rack_bridges"].append(bridge)
        _save(desc)
        _add_bridge(bridge)
        up_end, spine_end = f"{prefix[:3]}u{tb_id}{r}", f"{prefix[:3]}s{tb_id}{r}"
        desc["uplinks"].append(up_end)
        _save(desc)
        _run(["ip", "link", "add", up_end, "type", "veth", "peer", "name", spine_end])
        _run(["ip", "link", "set", up_end, "master", bridge])
        _run(["ip", "link", "set", spine_end, "master", desc["bridge"]])
        for dev in (up_end, spine_end):
            _run(["ip", "link", "set", dev, "up"])
            if rate:
                _rate_limit(None, dev, rate, shaper)   # rack -> spine and spine -> rack
    return desc["rack_bridges"]


def _build(desc, n, prefix, rate_limit, link_rates, shaper, slots, python, full_plan=False, racks=1,
           inter_rack_rate=None):
    d = desc["dir"]
    tb_id = desc["id"]
    desc["congestion_control"] = allow_congestion_control(CONGESTION_CONTROL)
    with open(LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        block = _allocate_block(n)
        addrs = list(block.hosts())
        desc["subnet"] = str(block)
        desc["bridge_addr"] = str(addrs[0])
        _run(["ip", "link", "add", desc["bridge"], "type", "bridge"])
        _save(desc)
        _run(["ip", "addr", "add", f"{addrs[0]}/{block.prefixlen}", "dev", desc["bridge"]])
        _run(["ip", "link", "set", desc["bridge"], "up"])
    rack_bridges = _racks(desc, prefix, racks, inter_rack_rate, shaper) if racks > 1 else [desc["bridge"]]
    for i in range(1, n + 1):
        name = f"{prefix}-{tb_id}-h{i}"
        rack = (i - 1) % racks
        host = {"alias": f"h{i}", "name": name, "netns": name, "addr": str(addrs[i]),
                "veth": f"{prefix[:3]}v{tb_id}{i}", "dir": os.path.join(d, "hosts", f"h{i}"), "rack": rack}
        desc["hosts"].append(host)
        _run(["ip", "netns", "add", host["netns"]])
        _save(desc)
        peer = f"{prefix[:3]}p{tb_id}{i}"
        _run(["ip", "link", "add", host["veth"], "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", host["netns"]])
        _run(["ip", "link", "set", host["veth"], "master", rack_bridges[rack]])
        _run(["ip", "link", "set", host["veth"], "up"])
        nsx = ["ip", "-n", host["netns"]]
        _run(nsx + ["link", "set", peer, "name", "eth0"])
        _run(nsx + ["addr", "add", f"{host['addr']}/{block.prefixlen}", "dev", "eth0"])
        _run(nsx + ["link", "set", "eth0", "up"])
        _run(nsx + ["link", "set", "lo", "up"])
        # TCP asks for ECN on its connections: a marking hop (--ecn-mark) then signals congestion
        # instead of dropping, and the kernel counts it (the default, 2, only answers requests)
        _run(["ip", "netns", "exec", host["netns"], "sysctl", "-q", "-w", "net.ipv4.tcp_ecn=1"])
        _run(["ip", "netns", "exec", host["netns"], "sysctl", "-q", "-w",
              f"net.ipv4.tcp_congestion_control={desc['congestion_control']}"])
        rate = link_rates.get(host["alias"]) or link_rates.get(host["addr"]) or rate_limit
        if rate:
            _rate_limit(host["netns"], "eth0", rate, shaper)   # host -> bridge
            _rate_limit(None, host["veth"], rate, shaper)      # bridge -> host
            host["rate"] = rate
    unknown = set(link_rates) - {h["alias"] for h in desc["hosts"]} - {h["addr"] for h in desc["hosts"]}
    if unknown:
        raise TestbedError(f"--link-rate names unknown hosts: {', '.join(sorted(unknown))}")
    _save(desc)
    _keys_and_files(desc, slots, python, full_plan)
    for host in desc["hosts"]:
        _start_sshd(desc, host)
    _save(desc)
    _wait_sshd(desc)


def allow_congestion_control(name):
    """Make `name` choosable in network namespaces: add it to the root namespace's
    net.ipv4.tcp_allowed_congestion_control when it is not listed (the module loads on first use).
    Returns the name."""
    path = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
    with open(path) as f:
        allowed = f.read().split()
    if name not in allowed:
        _run(["sysctl", "-q", "-w", f"net.ipv4.tcp_allowed_congestion_control={' '.join(allowed + [name])}"])
    return name


def congestion_control(host):
    """The TCP congestion control a host's namespace uses (what `up` pinned)."""
    return _run(["ip", "netns", "exec", host["netns"], "sysctl", "-n", "net.ipv4.tcp_congestion_control"]).stdout.strip()


def _loss_table(host):
    """The root namespace's netdev table of a host's loss rule (the veth name is unique per testbed)."""
    return f"collbench_loss_{host['veth']}"


def _root_nft(*args, check=True):
    try:
        return _run(["nft", *args], check=check)
    except FileNotFoundError:
        raise TestbedError("nft not found: install nftables (scripts/install.sh does)") from None


def loss(directory, name, permille, peer=None):
    """Drop `permille` per 1000 of a host's egress packets at random (a bad cable or optic), or
    only those toward `peer` (one lossy link); replaces the host's previous loss rule. Returns
    the host.

    The packets are dropped on the wire, after they left the host: at the ingress of its veth's
    bridge end in the root namespace (an nftables netdev table). A drop in the host's own
    postrouting hook is a local send failure its TCP sees and retries without a retransmission
    (measured: 21 of 36,000 segments dropped there, TCPFastRetrans 0), not a lossy cable."""
    desc = load(directory)
    host = _host(desc, name)
    if isinstance(permille, bool) or not isinstance(permille, int) or not 1 <= permille <= 1000:
        raise TestbedError(f"loss {permille!r}: expected packets per 1000 dropped, 1..1000")
    match = []
    to = None
    if peer is not None:
        to = _host(desc, peer)
        if to is host:
            raise TestbedError(f"loss on {host['alias']} toward itself")
        match = ["meta", "protocol", "ip", "ip", "daddr", to["addr"]]
    table = _loss_table(host)
    _root_nft("delete", "table", "netdev", table, check=False)
    _root_nft("add", "table", "netdev", table)
    host["loss"] = {"permille": permille, "peer": to["alias"] if to else None, "table": table}
    _save(desc)
    _root_nft("add", "chain", "netdev", table, "wire",
              f"{{ type filter hook ingress device {host['veth']} priority 0; }}")
    # `counter`: the packets dropped (lost_packets)
    _root_nft("add", "rule", "netdev", table, "wire", *match, "numgen", "random", "mod", "1000", "lt",
              str(permille), "counter", "drop")
    return host


def loss_clear(directory, names=None):
    """Remove the loss rule of the named hosts (None: all); returns the aliases cleared."""
    desc = load(directory)
    hosts = desc["hosts"] if not names else [_host(desc, n) for n in names]
    cleared = []
    for h in hosts:
        res = _root_nft("delete", "table", "netdev", _loss_table(h), check=False)
        if res.returncode == 0 or h.pop("loss", None):
            cleared.append(h["alias"])
        h.pop("loss", None)
    _save(desc)
    return cleared


def lost_packets(desc, name):
    """Packets the host's loss rule has dropped so far (None: no rule)."""
    res = _root_nft("list", "table", "netdev", _loss_table(_host(desc, name)), check=False)
    m = re.search(r"counter packets (\d+)", res.stdout) if res.returncode == 0 else None
    return int(m.group(1)) if m else None


def ecn_rate(rate):
    """nft's form of an --ecn-mark RATE ("2mbytes", "500 kbytes/second" -> "2 mbytes/second")."""
    m = _ECN_RATE.match(str(rate).strip())
    if not m:
        raise TestbedError(f"ECN marking rate {rate!r}: expected bytes per second such as 2mbytes, "
                           "512kbytes or 2mbytes/second")
    return f"{m.group(1)} {m.group(2)}/second"


def _host(desc, name):
    for h in desc["hosts"]:
        if name in (h["alias"], h["addr"], h["name"]):
            return h
    raise TestbedError(f"no host {name!r} in testbed {desc['id']} (hosts: "
                       f"{', '.join(h['alias'] for h in desc['hosts'])})")


def _nft(host, *args, check=True):
    try:
        return _run(["ip", "netns", "exec", host["netns"], "nft", *args], check=check)
    except FileNotFoundError:
        raise TestbedError("nft not found: install nftables (scripts/install.sh does)") from None


def _ecn_mark(desc, name, rate):
    host = _host(desc, name)
    nft_rate = ecn_rate(rate)
    _nft(host, "delete", "table", "ip", ECN_TABLE, check=False)   # replace a previous rate
    _nft(host, "add", "table", "ip", ECN_TABLE)
    host["ecn_mark"] = nft_rate
    _save(desc)
    _nft(host, "add", "chain", "ip", ECN_TABLE, "egress", "{ type filter hook postrouting priority 0; }")
    # `counter`: the packets marked, for ecn_marked_packets(); only ECN-capable packets can be
    # marked (CE on a Not-ECT packet would be a lie the receiver's kernel ignores)
    _nft(host, "add", "rule", "ip", ECN_TABLE, "egress", "oifname", "eth0", "ip", "ecn", "!=", "not-ect",
         "limit", "rate", "over", nft_rate, "burst", ECN_BURST, "counter", "ip", "ecn", "set", "ce")
    return host


def ecn_mark(directory, marks):
    """Mark CE on the egress of hosts of a running testbed: marks {alias or address: RATE}."""
    desc = load(directory)
    for name, rate in marks.items():
        ecn_rate(rate)
        _host(desc, name)
    return [_ecn_mark(desc, name, rate)["alias"] for name, rate in marks.items()]


def ecn_clear(directory, names=None):
    """Remove the marking of the named hosts (None: all); returns the aliases cleared."""
    desc = load(directory)
    hosts = desc["hosts"] if not names else [_host(desc, n) for n in names]
    cleared = []
    for h in hosts:
        res = _nft(h, "delete", "table", "ip", ECN_TABLE, check=False)
        if res.returncode == 0 or h.pop("ecn_mark", None):
            cleared.append(h["alias"])
        h.pop("ecn_mark", None)
    _save(desc)
    return cleared


def ecn_marked_packets(desc, name):
    """Packets the host's marking rule has marked so far (None: no rule)."""
    res = _nft(_host(desc, name), "list", "table", "ip", ECN_TABLE, check=False)
    m = re.search(r"counter packets (\d+)", res.stdout) if res.returncode == 0 else None
    return int(m.group(1)) if m else None


def _keygen(path, comment):
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])
    with open(path + ".pub") as f:
        return f.read().split()[:2]


def _keys_and_files(desc, slots, python, full_plan=False):
    d = desc["dir"]
    key = os.path.join(d, "id_ed25519")
    ktype, kb64 = _keygen(key, f"collbench-testbed-{desc['id']}")
    _write(os.path.join(d, "authorized_keys"), f"{ktype} {kb64} collbench-testbed\n", 0o600)
    known, cfg, hostfile = [], [], []
    for h in desc["hosts"]:
        os.makedirs(h["dir"], exist_ok=True)
        hk = os.path.join(h["dir"], "ssh_host_ed25519_key")
        htype, hb64 = _keygen(hk, h["name"])
        known.append(f"{h['addr']},{h['alias']},{h['name']} {htype} {hb64}")
        _write(os.path.join(h["dir"], "sshd_config"), "\n".join([
            f"ListenAddress {h['addr']}", "Port 22", f"HostKey {hk}",
            f"PidFile {os.path.join(h['dir'], 'sshd.pid')}",
            f"AuthorizedKeysFile {os.path.join(d, 'authorized_keys')}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PrintMotd no",
            "Subsystem sftp internal-sftp", "MaxStartups 200", "MaxSessions 100",
            "LogLevel ERROR", ""]))
        cfg.append("\n".join([
            f"Host {h['alias']} {h['name']} {h['addr']}", f"  HostName {h['addr']}", "  User root",
            "  Port 22", f"  IdentityFile {key}", "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {os.path.join(d, 'known_hosts')}", "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes", "  BatchMode yes", "  ConnectTimeout 10", "  LogLevel ERROR", ""]))
        hostfile.append(f"{h['addr']} slots={slots}")
    _write(os.path.join(d, "known_hosts"), "\n".join(known) + "\n")
    ssh_config = os.path.join(d, "ssh_config")
    _write(ssh_config, "\n".join(cfg))
    _write(os.path.join(d, "hostfile"), "\n".join(hostfile) + "\n")
    master = desc["hosts"][0]
    subnet = desc["subnet"]
    config = {
        "hosts": "hostfile",
        "transport": "ob1-tcp",
        # The namespaces share this machine's few cores: ranks that busy-poll starve the veth
        # traffic (mpi_yield_when_idle), and binding each "host's" rank to its core 0 (a rank
        # order's rankfile would) piles them all onto one core (--bind-to none).
        "launcher_args": ["--mca", "plm_rsh_args", f"-F {ssh_config}",
                          "--mca", "oob_tcp_if_include", subnet, "--mca", "btl_tcp_if_include", subnet,
                          "--mca", "mpi_yield_when_idle", "1", "--bind-to", "none"],
        "state_dir": os.path.join(d, "state"),
        "exporter": {"listen": f"{master['addr']}:9105"},
        "master": {"host": master["alias"], "ssh_config": ssh_config, "hosts_ssh_config": ssh_config,
                   "remote_dir": REPO_ROOT, "remote_config": os.path.join(d, "master", "collbench.yaml"),
                   "python": python, "connect_timeout": 10},
    }
    if not full_plan:
        config["plan"] = QUICK_PLAN
    import yaml
    _write(os.path.join(d, "collbench.yaml"),
           "# generated by lab.testbed (scripts/testbed.sh) for testbed " + desc["id"] + "\n" + yaml.safe_dump(config, sort_keys=False))
    desc.update(ssh_config=ssh_config, hostfile=os.path.join(d, "hostfile"), key=key,
                known_hosts=os.path.join(d, "known_hosts"), config=os.path.join(d, "collbench.yaml"),
                master=master["alias"], master_addr=master["addr"], master_netns=master["netns"],
                # "seed 001": the prototype this project replaces (a value readers of testbed.json know)
                plan="seed 001 (full)" if full_plan else "quick")


def _start_sshd(desc, host):
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # sshd's privilege separation directory
    log = os.path.join(host["dir"], "sshd.log")
    # own UTS namespace: each host answers `hostname` with its own name, as real nodes do
    _run(["ip", "netns", "exec", host["netns"], "unshare", "--uts", "sh", "-c",
          'hostname "$1" && exec "$2" -f "$3" -E "$4"', "sh", host["name"], SSHD,
          os.path.join(host["dir"], "sshd_config"), log])


def _wait_sshd(desc, timeout=20.0):
    import socket
    deadline = time.monotonic() + timeout
    for h in desc["hosts"]:
        while True:
            pidfile = os.path.join(h["dir"], "sshd.pid")
            if os.path.exists(pidfile):
                try:
                    with socket.create_connection((h["addr"], 22), timeout=2) as s:
                        if s.recv(4).startswith(b"SSH-"):
                            with open(pidfile) as f:
                                h["sshd_pid"] = int(f.read().strip())
                            break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                log = os.path.join(h["dir"], "sshd.log")
                tail = open(log).read()[-500:] if os.path.exists(log) else ""
                raise TestbedError(f"sshd of {h['alias']} ({h['addr']}) did not come up: {tail}")
            time.sleep(0.1)
    _save(desc)


def load(directory):
    path = os.path.join(os.path.abspath(directory), "testbed.json")
    with open(path) as f:
        return json.load(f)


def shape_link(host, rate):
    """tbf at `rate` on a host's eth0 (its egress) and on its veth in the root namespace (its
    ingress), no ECN marking and no pauses; rate None removes both (locate's and the alert's
    testbed tests, bench/locate_probes.py)."""
    for pre, dev in ((["ip", "netns", "exec", host["netns"]], "eth0"), ([], host["veth"])):
        if rate:
            _run(pre + ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "256kb",
                        "latency", "50ms"])
        else:
            _run(pre + ["tc", "qdisc", "del", "dev", dev, "root"])


def netns_pids(ns):
    res = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in res.stdout.split() if p.isdigit()] if res.returncode == 0 else []


def down(directory, grace=3.0):
    """Tear the testbed down: processes, namespaces, bridge, directory. Safe to repeat."""
    directory = os.path.abspath(directory)
    try:
        desc = load(directory)
    except FileNotFoundError:
        return False
    except ValueError:
        raise TestbedError(f"{directory}/testbed.json is unreadable; remove its namespaces by hand "
                           "(ip netns list)") from None
    namespaces = [h["netns"] for h in desc.get("hosts", [])]
    existing = set(_run(["ip", "netns", "list"], check=False).stdout.split())
    namespaces = [ns for ns in namespaces if ns in existing]
    proctree.stop_tree(lambda: [pid for ns in namespaces for pid in netns_pids(ns)], grace, kill_wait=grace)
    for h in desc.get("hosts", []):
        if h.get("loss"):
            _run(["nft", "delete", "table", "netdev", _loss_table(h)], check=False)
        _run(["ip", "link", "del", h["veth"]], check=False)
    for ns in namespaces:
        _run(["ip", "netns", "del", ns], check=False)
    for dev in desc.get("uplinks", []) + desc.get("rack_bridges", []):
        _run(["ip", "link", "del", dev], check=False)
    _run(["ip", "link", "del", desc["bridge"]], check=False)
    left = set(_run(["ip", "netns", "list"], check=False).stdout.split()) & set(namespaces)
    if left:
        raise TestbedError(f"namespaces still present after teardown: {', '.join(sorted(left))}")
    shutil.rmtree(directory, ignore_errors=True)
    try:
        os.unlink(os.path.join(REGISTRY, desc["id"]))
    except FileNotFoundError:
        pass
    return True


def registered():
    """[(id, directory, alive)] of the testbeds `up` made on this machine since boot."""
    out = []
    try:
        names = sorted(os.listdir(REGISTRY))
    except FileNotFoundError:
        return out
    for tb_id in names:
        target = os.readlink(os.path.join(REGISTRY, tb_id))
        out.append((tb_id, target, os.path.isfile(os.path.join(target, "testbed.json"))))
    return out


def env_lines(desc):
    return [f"COLLBENCH_TESTBED={shlex.quote(desc['dir'])}",
            f"COLLBENCH_TESTBED_CONFIG={shlex.quote(desc['config'])}",
            f"COLLBENCH_TESTBED_HOSTFILE={shlex.quote(desc['hostfile'])}",
            f"COLLBENCH_TESTBED_SSH_CONFIG={shlex.quote(desc['ssh_config'])}",
            f"COLLBENCH_TESTBED_KEY={shlex.quote(desc['key'])}",
            f"COLLBENCH_TESTBED_MASTER={desc['master_addr']}",
            f"COLLBENCH_TESTBED_MASTER_NETNS={shlex.quote(desc.get('master_netns') or desc['hosts'][0]['netns'])}"]


def collbench_command():
    """How to run this checkout's collbench from any shell: the venv's script when there is one."""
    script = os.path.join(REPO_ROOT, ".venv", "bin", "collbench")
    if os.access(script, os.X_OK):
        return shlex.quote(script)
    return f"{shlex.quote(sys.executable)} -m collbench"


def main(argv=None):
    p = argparse.ArgumentParser(prog="testbed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="verb", required=True)
    u = sub.add_parser("up", help="build N hosts")
    u.add_argument("n", type=int)
    u.add_argument("--dir", help="testbed directory (default /tmp/collbench-testbed-<id>)")
    u.add_argument("--prefix", default="cbtb", help="name prefix of namespaces (up to 6 characters)")
    u.add_argument("--rate-limit", metavar="RATE", help="tc rate of every link, e.g. 1gbit")
    u.add_argument("--link-rate", action="append", default=[], metavar="hI=RATE",
                   help="rate of one host's link (repeatable), e.g. h2=100mbit")
    u.add_argument("--shaper", choices=("htb", "tbf"), default="htb")
    u.add_argument("--slots", type=int, default=1, help="slots per host in the hostfile")
    u.add_argument("--racks", type=int, default=1, metavar="R",
                   help="R racks: a bridge each, joined to a spine by an uplink; host hI in rack (I-1) mod R, "
                        "so the hostfile interleaves the racks (default 1: one bridge)")
    u.add_argument("--inter-rack-rate", metavar="RATE",
                   help="tc rate of each rack's uplink, both directions, e.g. 200mbit (default unshaped)")
    u.add_argument("--full-plan", action="store_true",
                   help="generated config without the short plan: the prototype's (4MB steps, 500 iterations; "
                        "minutes per pass on a small machine)")
    u.add_argument("--ecn-mark", action="append", default=[], metavar="hI=RATE",
                   help="mark ECN CE on host hI's egress beyond RATE bytes/s (repeatable), e.g. h2=2mbytes: "
                        "an ECN-marking switch port in front of hI")
    for verb in ("down", "env"):
        s = sub.add_parser(verb)
        s.add_argument("dir")
    s = sub.add_parser("ecn-mark", help="mark ECN CE on hosts' egress beyond RATE on a running testbed")
    s.add_argument("dir")
    s.add_argument("marks", nargs="+", metavar="hI=RATE")
    s = sub.add_parser("ecn-clear", help="remove the ECN marking of hosts (default: all)")
    s.add_argument("dir")
    s.add_argument("hosts", nargs="*", metavar="hI")
    s = sub.add_parser("loss", help="drop PERMILLE/1000 of a host's egress packets at random (a lossy cable)")
    s.add_argument("dir")
    s.add_argument("loss", metavar="hI=PERMILLE", help="e.g. h2=30 (3 %%)")
    s.add_argument("--peer", metavar="hJ", help="only the packets toward hJ: one lossy link")
    s = sub.add_parser("loss-clear", help="remove the loss rule of hosts (default: all)")
    s.add_argument("dir")
    s.add_argument("hosts", nargs="*", metavar="hI")
    sub.add_parser("list", help="testbeds on this machine: id, directory, hosts, subnet")
    args = p.parse_args(argv)

    def host_rates(items, flag):
        rates = {}
        for item in items:
            k, sep, v = item.partition("=")
            if not sep or not k or not v:
                p.error(f"{flag} {item!r}: expected hI=RATE")
            rates[k] = v
        return rates
    try:
        if args.verb == "up":
            rates = host_rates(args.link_rate, "--link-rate")
            desc = up(args.n, args.dir, args.prefix, args.rate_limit, rates, args.shaper, args.slots,
                      full_plan=args.full_plan, racks=args.racks, inter_rack_rate=args.inter_rack_rate,
                      ecn_marks=host_rates(args.ecn_mark, "--ecn-mark"))
            print("\n".join(env_lines(desc)))
            config = shlex.quote(desc["config"])
            print(f"# {args.n} hosts up in {desc['subnet']}; master h1 = {desc['master_addr']}; "
                  f"plan: {desc['plan']}", file=sys.stderr)
            print(f"# TCP congestion control {desc['congestion_control']} in every namespace (ECN marks slow "
                  "it; added to the root namespace's net.ipv4.tcp_allowed_congestion_control)", file=sys.stderr)
            for h in desc["hosts"]:
                if h.get("ecn_mark"):
                    print(f"# {h['alias']}: ECN CE marked on its egress beyond {h['ecn_mark']}", file=sys.stderr)
            if args.racks > 1:
                print(f"# {args.racks} racks (host hI in rack (I-1) mod {args.racks}), uplinks "
                      f"{args.inter_rack_rate or 'unshaped'}", file=sys.stderr)
            print(f"# try: {collbench_command()} ctl deploy --config {config} && "
                  f"{collbench_command()} ctl start --config {config}", file=sys.stderr)
            print(f"# tear down: {shlex.quote(os.path.join(REPO_ROOT, 'scripts', 'testbed.sh'))} down "
                  f"{shlex.quote(desc['dir'])}", file=sys.stderr)
        elif args.verb == "down":
            print("removed" if down(args.dir) else "nothing to remove", file=sys.stderr)
        elif args.verb == "ecn-mark":
            for alias in ecn_mark(args.dir, host_rates(args.marks, "ecn-mark")):
                print(f"{alias}: ECN CE marked on its egress beyond "
                      f"{_host(load(args.dir), alias)['ecn_mark']}", file=sys.stderr)
        elif args.verb == "ecn-clear":
            cleared = ecn_clear(args.dir, args.hosts)
            print(f"ECN marking removed: {', '.join(cleared)}" if cleared else "no ECN marking to remove",
                  file=sys.stderr)
        elif args.verb == "loss":
            name, sep, n = args.loss.partition("=")
            if not sep or not n.isdigit():
                p.error(f"loss {args.loss!r}: expected hI=PERMILLE")
            h = loss(args.dir, name, int(n), args.peer)
            toward = f" toward {h['loss']['peer']}" if h["loss"]["peer"] else ""
            print(f"{h['alias']}: {int(n) / 10:g} % of its egress packets{toward} dropped at random", file=sys.stderr)
        elif args.verb == "loss-clear":
            cleared = loss_clear(args.dir, args.hosts)
            print(f"loss removed: {', '.join(cleared)}" if cleared else "no loss rule to remove", file=sys.stderr)
        elif args.verb == "env":
            print("\n".join(env_lines(load(args.dir))))
        elif args.verb == "list":
            for tb_id, directory, alive in registered():
                if alive:
                    desc = load(directory)
                    print(f"{tb_id}  {directory}  {len(desc.get('hosts', []))} hosts  {desc.get('subnet', '?')}")
                else:
                    listed = _run(["ip", "netns", "list"], check=False).stdout.split()
                    orphans = [ns for ns in listed if f"-{tb_id}-h" in ns]
                    if orphans:
                        print(f"{tb_id}  {directory}  DIRECTORY GONE; remove by hand: "
                              + "; ".join(f"ip netns del {ns}" for ns in orphans))
                    else:
                        os.unlink(os.path.join(REGISTRY, tb_id))   # gone with its directory
    except (TestbedError, FileNotFoundError) as e:
        print(f"testbed: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
