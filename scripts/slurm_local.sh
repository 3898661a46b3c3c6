#!/bin/sh
# A real small Slurm cluster on this machine (needs root): one slurmd per network-namespace host,
# slurmctld and munged with their own key, state and logs in DIR, and DIR/collbench.yaml with
# `launcher: srun`. See scripts/slurm_local.py and docs/SETUP.md ("Slurm").
#
#   scripts/slurm_local.sh up DIR [--nodes 4] [--cpus 4] [--partition debug]
#   scripts/slurm_local.sh down DIR
#   scripts/slurm_local.sh env DIR
set -eu
here=$(cd "$(dirname "$0")" && pwd)
python=${COLLBENCH_PYTHON:-"$here/../.venv/bin/python"}
[ -x "$python" ] || python=python3
exec "$python" "$here/slurm_local.py" "$@"
