"""The congestion counters of a host, read around each benchmark step (docs/CONGESTION.md).

  counters.py     the one definition: every counter, its source, meaning, side of a flow, unit
  sources.py      where a host's counters are read (sysfs root, netstat path, ethtool), and the
                  source spec the built-in engine reads them by
  snapshot.py     a snapshot of one host's counters (the Python reader: OSU runs, the bench)
  deltas.py       before/after -> what moved, faults skipped and counted (never negative)
  lost_time.py    the fraction of a window a port was paused or blocked
  record_field.py the result/failure record's `congestion` field: built, bounded, validated
"""
