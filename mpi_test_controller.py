#!/usr/bin/env python3
"""Seed 001's controller verbs: once | start | stop | status (see `collbench ctl --help`)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VENV_PY = os.path.join(HERE, ".venv", "bin", "python")
# Run inside the project's venv (where collbench's dependencies are) when there is one.
if os.path.exists(VENV_PY) and os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(HERE, ".venv")):
    os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__)] + sys.argv[1:])
sys.path.insert(0, HERE)

from collbench.cli import main  # noqa: E402

VERBS = {"once": ["once"]}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in VERBS:
        print(f"usage: {sys.argv[0]} {{{'|'.join(VERBS)}}} [options]", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(VERBS[sys.argv[1]] + sys.argv[2:]))
