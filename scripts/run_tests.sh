#!/usr/bin/env bash
# Run the whole test suite (installs first if needed; idempotent and quick when done).
#   ./scripts/run_tests.sh              the whole suite, in two phases (below)
#   ./scripts/run_tests.sh ARGS...      one plain pytest run with ARGS (a file, -k, -m ...)
# Phase 1 runs every test not marked `alone` on two pytest-xdist workers, a test file to a worker
# (--dist loadfile: a module's fixtures, such as the Slurm cluster, are built once): the suite
# spends about half its time waiting on daemons, namespaces and timeouts, not on the CPUs.
# Phase 2 runs the `alone` tests (those asserting on timing or quietness: pyproject.toml) in one
# process with nothing beside them: run beside other tests, their quiet runs were not quiet.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh || exit
pytest=(.venv/bin/python -m pytest -q -ra)
if [ $# -gt 0 ]; then
  exec "${pytest[@]}" --durations=20 "$@"
fi
start=$SECONDS
"${pytest[@]}" --durations=15 -n 2 --dist loadfile -m "not alone"
shared=$?
echo "phase 1 (two workers, not alone): exit $shared after $((SECONDS - start)) s"
"${pytest[@]}" --durations=15 -m alone
alone=$?
echo "phase 2 (alone): exit $alone; the suite took $((SECONDS - start)) s"
[ "$shared" -eq 0 ] && [ "$alone" -eq 0 ]
