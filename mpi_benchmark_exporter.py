#!/usr/bin/env python3
"""The seed prototype's entry point, kept for its users: same as `collbench exporter ARGS`.

Runs under the repo's .venv when there is one (prometheus_client lives there).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    sys.path.insert(0, HERE)
    from collbench.entry import reexec_in_venv  # stdlib only: safe before the venv is in use
    reexec_in_venv(__file__)
    from collbench.cli import main
    sys.exit(main(["exporter", *sys.argv[1:]]))
