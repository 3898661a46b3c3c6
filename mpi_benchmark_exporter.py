#!/usr/bin/env python3
"""The seed prototype's entry point, kept for its users: same as `collbench exporter ARGS`.

Runs under the repo's .venv when there is one (prometheus_client lives there).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VENV_PYTHON = os.path.join(HERE, ".venv", "bin", "python")

if __name__ == "__main__":
    if (os.path.exists(VENV_PYTHON) and os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(HERE, ".venv"))
            and not os.environ.get("COLLBENCH_NO_REEXEC")):
        os.environ["COLLBENCH_NO_REEXEC"] = "1"
        os.execv(VENV_PYTHON, [VENV_PYTHON, os.path.abspath(__file__), *sys.argv[1:]])
    sys.path.insert(0, HERE)
    from collbench.cli import main
    sys.exit(main(["exporter", *sys.argv[1:]]))
