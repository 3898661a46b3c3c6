"""The start of the repo's top-level scripts (mpi_test_controller.py and the prototype's other script names).

Standard library only, and nothing of collbench's is imported before reexec_in_venv() ran: a
script started by the system python3 gets here before the venv that holds paramiko, PyYAML
and prometheus_client is in use.
"""

import os
import sys


def reexec_in_venv(script):
    """Re-run `script` with the .venv beside it, where collbench's dependencies are, if there is one.

    Returns (doing nothing) when this interpreter is already that venv's, when there is no venv,
    or when COLLBENCH_NO_REEXEC is set (which the re-exec sets, so it can never loop).
    """
    script = os.path.abspath(script)
    venv = os.path.join(os.path.dirname(script), ".venv")
    python = os.path.join(venv, "bin", "python")
    if (os.path.exists(python) and os.path.realpath(sys.prefix) != os.path.realpath(venv)
            and not os.environ.get("COLLBENCH_NO_REEXEC")):
        os.environ["COLLBENCH_NO_REEXEC"] = "1"
        os.execv(python, [python, script, *sys.argv[1:]])
