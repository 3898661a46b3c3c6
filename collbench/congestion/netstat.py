"""/proc/net/netstat: pairs of header and value lines per section (IpExt, TcpExt, ...)."""

# bytes of the file read at most (a real one is ~4 KB): a bigger one, or /dev/zero, is refused
MAX_NETSTAT_BYTES = 1 << 20


def parse_netstat(text):
    """{'IpExt': {'InCEPkts': 0, ...}, 'TcpExt': {...}}: pairs of header and value lines. A value
    that is not a whole number is left out (the caller counts what it expected and missed)."""
    out = {}
    lines = [line.split() for line in text.splitlines() if line.strip()]
    for header, values in zip(lines[::2], lines[1::2]):
        if not header or not values or header[0] != values[0] or not header[0].endswith(":"):
            continue
        section = header[0][:-1]
        fields = {}
        for name, v in zip(header[1:], values[1:]):
            try:
                fields[name] = int(v)
            except ValueError:
                pass
        out[section] = fields
    return out


def section_fields(text, section):
    """The fields of one section ({'InCEPkts': 0, ...}), {} if absent: what parse_netstat gives
    for it, without splitting the other sections (TcpExt alone has over a hundred fields)."""
    prefix = section + ":"
    lines = [line for line in text.split("\n") if line.startswith(prefix)]
    return parse_netstat("\n".join(lines[:2])).get(section, {})


def raw_section(text, section):
    """{name: raw value text} of one section, garbage included (the snapshot counts it)."""
    prefix = section + ":"
    lines = [line.split() for line in text.split("\n") if line.startswith(prefix)][:2]
    if len(lines) < 2:
        return {}
    return dict(zip(lines[0][1:], lines[1][1:]))
