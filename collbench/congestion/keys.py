"""Counter keys: "<counter>@<where>", the counter's own name and where it was read.

  rdma      np_ecn_marked_roce_packets@mlx5_0/1      (device/port)
  ethtool   rx_prio3_pause@ens1f0np0                  (netdev; the priority is in the name)
  netstat   TCPDeliveredCE@netstat                    (the host's network namespace)

In a record a key is prefixed by its host: "<host>|<counter>@<where>" (record_field.py).
"""

import re

KEY = re.compile(r"[A-Za-z0-9_.:+-]{1,64}@[A-Za-z0-9_.:/+-]{1,80}")
_PRIO = re.compile(r"^(rx|tx)_prio([0-7])_pause(_duration|_transition)?$")


def key(name, where):
    return f"{name}@{where}"


def split(k):
    """(counter name, where) of a key."""
    name, _, where = k.partition("@")
    return name, where


def priority(name):
    """(direction, priority) of a per-priority pause counter, else None."""
    m = _PRIO.match(name)
    return (m.group(1), int(m.group(2))) if m else None
