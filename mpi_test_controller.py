#!/usr/bin/env python3
"""Seed 001's controller: once | start | stop | status, on the master over SSH.

Same as `collbench ctl VERB`: with master.host in the config the verb runs on the master,
without it on this machine. The config is --config FILE, else $COLLBENCH_CONFIG, else
config/collbench.yaml beside this script when it exists. Options the controller does not know
are passed on to the command the verb runs (e.g. `once --ops allreduce --sizes 1MB`).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

VERBS = ("once", "start", "stop", "status")

if __name__ == "__main__":
    sys.path.insert(0, HERE)
    from collbench.entry import reexec_in_venv  # stdlib only: safe before the venv is in use
    reexec_in_venv(__file__)
    from collbench.ctl.prototype_scripts import run
    sys.exit(run(sys.argv, VERBS, HERE))
