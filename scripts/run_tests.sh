#!/usr/bin/env bash
# Run the whole test suite (installs first if needed; idempotent and quick when done).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
# Two workers: the real-part tests (marked mpi, slow or netns) one at a time on one, the quick
# files on the other (tests/conftest.py groups them); --durations names the slowest.
exec .venv/bin/python -m pytest -q -ra -n 2 --dist loadgroup --durations=20 "$@"
