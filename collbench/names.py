"""Names read from a config, a flag or a file that end up in a path or another program's input:
an interface name joined to a sysfs path, a host name written into Prometheus' target list.
Each check returns why the name is not one (a sentence fragment saying what was expected), or None."""

import ipaddress
import re

_LDH_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def netdev_name_problem(name):
    """Why `name` cannot be a Linux interface name (the kernel's dev_valid_name: at most 15
    bytes, not . or .., no / : or whitespace; printable ASCII here, and no comma, the list
    separator of doctor's --netdevs), or None: '../../etc' joined to a sysfs path must never be one."""
    if not isinstance(name, str) or not 1 <= len(name) <= 15 or name in (".", ".."):
        return "expected an interface name of 1 to 15 characters, not . or .."
    if not re.fullmatch(r"[!-~]+", name) or any(c in name for c in "/:,"):
        return "expected an interface name of printable ASCII without / : , or spaces"
    return None


def ip_address(name):
    """The ipaddress object of an IPv4 or IPv6 address written in ASCII, else None."""
    if not isinstance(name, str) or not name.isascii():
        return None
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def dns_name_problem(name):
    """Why `name` is neither a DNS host name (ASCII letters, digits and hyphens in labels of 1 to
    63 characters, not starting or ending with a hyphen, 253 characters in all; one trailing dot
    allowed) nor an IP address, or None. str.isalnum() would take 'hôst', '主机' and '٣٣'."""
    if ip_address(name) is not None:
        return None
    expected = "expected a DNS host name (ASCII letters, digits, hyphens and dots) or an IP address"
    if not isinstance(name, str) or not name or len(name) > 254:
        return expected
    labels = (name[:-1] if name.endswith(".") else name).split(".")
    if len(name.rstrip(".")) > 253 or not all(_LDH_LABEL.fullmatch(x) for x in labels):
        return expected
    if labels[-1].isdigit():         # 1.2.3 or 999.1.1.1: not an address, not a name either
        return expected
    return None
