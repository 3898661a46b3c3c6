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
VENV_PY = os.path.join(HERE, ".venv", "bin", "python")

VERBS = ("once", "start", "stop", "status")

if __name__ == "__main__":
    # Run inside the project's venv (where collbench's dependencies are) when there is one.
    if (os.path.exists(VENV_PY) and os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(HERE, ".venv"))
            and not os.environ.get("COLLBENCH_NO_REEXEC")):
        os.environ["COLLBENCH_NO_REEXEC"] = "1"
        os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__)] + sys.argv[1:])
    sys.path.insert(0, HERE)
    from collbench.ctl.seed_scripts import run  # noqa: E402
    sys.exit(run(sys.argv, VERBS, HERE))
