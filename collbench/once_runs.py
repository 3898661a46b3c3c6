"""Run `collbench once` as a subprocess and read back its records: the report's two-rank peak
test and `baseline save|compare --runs N` measure through the same CLI a user runs, so their
numbers are the numbers `once` gives (same launcher, config, engine, OSU iteration rules).
"""

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from collbench.errors import UserError
from collbench.results.file_reader import FileStats, read_file


@dataclass
class OnceRun:
    returncode: int
    records: list          # checked records (results_reader), in file order
    stderr: str            # the last lines of once's stderr
    stats: FileStats


def run_once(args, config=None, timeout=None, env=None):
    """Run `collbench once ARGS --quiet --results TMP [--config F]`; its OnceRun.

    Exit 2 from once (a config or flag error) is a UserError carrying its message; Ctrl-C in
    once (exit 130) becomes KeyboardInterrupt here. Exit 1 (a step failed) is returned: the
    failure records say what failed.
    """
    with tempfile.TemporaryDirectory(prefix="collbench-once-") as tmp:
        results = os.path.join(tmp, "results.jsonl")
        argv = [sys.executable, "-m", "collbench", "once", "--quiet", "--results", results]
        if config:
            argv += ["--config", config]
        argv += list(args)
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                               errors="replace")
        except subprocess.TimeoutExpired:
            raise UserError(f"collbench once {' '.join(args)}: no result within {timeout:.0f}s") from None
        tail = "\n".join(p.stderr.strip().splitlines()[-20:])
        if p.returncode == 130:
            raise KeyboardInterrupt()
        if p.returncode == 2:
            last = tail.splitlines()[-1] if tail else "exit code 2"
            raise UserError(f"collbench once {' '.join(args)}: {last.replace('collbench: error: ', '')}")
        stats = FileStats(results)
        records = list(read_file(results, stats)) if os.path.exists(results) else []
        return OnceRun(returncode=p.returncode, records=records, stderr=tail, stats=stats)
