"""Is a host of the config this machine? One answer for every verb, and never a DNS query.

`stress servers`, `ctl servers` and `ctl deploy` ask it: a host that is this machine is looked at
directly (no SSH to ourselves, nothing deployed over ourselves). DNS may hang for seconds on a
cluster whose resolver is down, which is exactly when these verbs are needed, so names are
never resolved: a host is this machine if it is

* localhost or a loopback literal (127.0.0.1, ::1),
* this machine's host name (`hostname`),
* an address bound to one of our interfaces (checked by binding to it), or
* a name /etc/hosts gives one of those addresses (the usual place of a node's FQDN).
"""

import ipaddress
import socket

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
HOSTS_FILE = "/etc/hosts"
MAX_HOSTS_FILE_BYTES = 1 << 20


def is_local_address(text):
    """True for an IP address literal bound to one of this machine's interfaces."""
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return False
    if addr.is_loopback:
        return True
    try:
        with socket.socket(socket.AF_INET6 if addr.version == 6 else socket.AF_INET) as s:
            s.bind((str(addr), 0))   # only succeeds for an address of one of our interfaces
        return True
    except OSError:
        return False


def hosts_file_addresses(name, path=HOSTS_FILE):
    """The addresses /etc/hosts gives `name` (a file, not a resolver: no network, bounded)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_HOSTS_FILE_BYTES)
    except OSError:
        return []
    found = []
    for raw in data.decode("utf-8", "replace").splitlines():
        fields = raw.split("#", 1)[0].split()
        if len(fields) >= 2 and name in fields[1:]:
            found.append(fields[0])
    return found


def is_this_machine(host, hosts_file=HOSTS_FILE):
    """True if `host` (a config host name or address) is this machine; never queries DNS."""
    host = str(host).strip()
    if not host:
        return False
    if host in LOCAL_NAMES or host == socket.gethostname():
        return True
    if is_local_address(host):
        return True
    return any(is_local_address(a) for a in hosts_file_addresses(host, hosts_file))
