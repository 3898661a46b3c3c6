"""Lost link time: the fraction of a window that a port was paused or blocked.

  rx|tx_prio<p>_pause_duration   mlx5 counts microseconds paused per priority (rx: the peer paused
                                 this port's sending; tx: this port paused its peer)
  port_xmit_wait                 ticks the port had data to send and sent nothing. The tick is the
                                 NIC's, not the standard's (IBTA leaves it to the implementation):
                                 NVIDIA's ib-traffic-monitor maintainers give (7+1) units for recent
                                 ConnectX generations and (31+1) for older ones (issue #3 there), read
                                 here as 8 ns and 32 ns; `congestion.xmit_wait_tick_ns` (default 8)
                                 sets it, and the record carries the tick it used, so a reader can
                                 rescale. Treat the xmit_wait fraction as an estimate within ~4x.

A fraction above 1 (counter granularity, a tick set too long) is reported as 1.
"""

from collbench.congestion.keys import priority, split

DEFAULT_XMIT_WAIT_TICK_NS = 8.0


def fraction(counter_name, delta, seconds, xmit_wait_tick_ns=DEFAULT_XMIT_WAIT_TICK_NS):
    """The fraction of `seconds` that delta of counter_name stands for, or None (not a time)."""
    if seconds <= 0:
        return None
    if counter_name == "port_xmit_wait":
        busy = delta * xmit_wait_tick_ns * 1e-9
    else:
        p = priority(counter_name)
        if p is None or not counter_name.endswith("_pause_duration"):
            return None
        busy = delta * 1e-6
    return round(min(1.0, busy / seconds), 6)


def lost(moved, seconds, xmit_wait_tick_ns=DEFAULT_XMIT_WAIT_TICK_NS):
    """{key: fraction of the window} for the keys of moved ({key: delta}) that measure time."""
    out = {}
    for k, d in moved.items():
        f = fraction(split(k)[0], d, seconds, xmit_wait_tick_ns)
        if f is not None:
            out[k] = f
    return out
