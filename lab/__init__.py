"""The lab: what tests, benches and the walk-throughs build on one machine, never part of what
runs on a cluster (not packaged with collbench).

    testbed.py   N hosts as network namespaces on a bridge, an sshd each (scripts/testbed.sh)
"""
