"""collbench.hosts: one "is this host this machine?" answer, with no DNS query."""

import socket
import subprocess
import sys

from collbench import hosts


def test_local_names_and_addresses():
    for name in ("localhost", "127.0.0.1", "::1", socket.gethostname(), "127.0.0.2"):
        assert hosts.is_this_machine(name), name
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine
    for name in ("192.0.2.1", "", "   ", "node-that-is-not-here", "2001:db8::1"):
        assert not hosts.is_this_machine(name), name


def test_an_address_of_an_interface_is_local():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:   # the address of the interface the default route leaves by (no packet is sent)
            s.connect(("192.0.2.1", 9))
            mine = s.getsockname()[0]
        except OSError:
            mine = "127.0.0.1"
    assert hosts.is_this_machine(mine)


def test_hosts_file_names_count_without_dns(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("127.0.0.1 localhost\n"
                 "127.0.1.1 node07.cluster.example node07   # this machine\n"
                 "192.0.2.8 node08.cluster.example node08\n"
                 "# 127.0.0.1 commented.example\n")
    assert hosts.is_this_machine("node07.cluster.example", hosts_file=str(f))
    assert hosts.is_this_machine("node07", hosts_file=str(f))
    assert not hosts.is_this_machine("node08.cluster.example", hosts_file=str(f))
    assert not hosts.is_this_machine("commented.example", hosts_file=str(f))
    assert not hosts.is_this_machine("node07", hosts_file=str(tmp_path / "missing"))


NO_DNS = """
import socket, sys
def refuse(*a, **k):
    raise AssertionError("a name was resolved")
socket.getaddrinfo = socket.gethostbyname = socket.gethostbyname_ex = socket.getfqdn = refuse
from collbench import hosts
print([hosts.is_this_machine(h) for h in sys.argv[1:]])
"""


def test_never_resolves_a_name():
    names = ["localhost", socket.gethostname(), "some-node.invalid", "10.255.255.1"]
    out = subprocess.run([sys.executable, "-c", NO_DNS, *names], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[True, True, False, False]"
