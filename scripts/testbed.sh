#!/usr/bin/env bash
# A multi-host testbed on this machine (root): N network namespaces on a bridge, an sshd in
# each, addresses in 198.18.0.0/24, a hostfile, an ssh config and a ready collbench config.
#
#   scripts/testbed.sh up 4 [--dir DIR]  # pins TCP cubic in every namespace (ECN marks slow it)
#                           [--rate-limit 1gbit] [--link-rate h2=100mbit] [--shaper htb|tbf]
#                           [--full-plan]   # generated config: the prototype's plan instead of a short one
#                           [--ecn-mark h2=2mbytes]   # CE-mark h2's egress beyond 2 MB/s (nftables), repeatable
#   scripts/testbed.sh ecn-mark DIR h2=2mbytes   # the same on a running testbed
#   scripts/testbed.sh ecn-clear DIR [h2]        # remove it (no host: every host's)
#   scripts/testbed.sh loss DIR h2=30 [--peer h3]   # drop 3 % of h2's egress (toward h3 only)
#   scripts/testbed.sh loss-clear DIR [h2]
#   scripts/testbed.sh env DIR      # shell variables: eval "$(scripts/testbed.sh env DIR)"
#   scripts/testbed.sh down DIR     # kill everything in it, delete namespaces and bridge (idempotent)
#   scripts/testbed.sh list
#
# See docs/SETUP.md (controller section) for a walk-through.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="$repo/.venv/bin/python"
[ -x "$py" ] || py=python3
cd "$repo"
exec "$py" -m lab.testbed "$@"
