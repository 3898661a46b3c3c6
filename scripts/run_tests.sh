#!/usr/bin/env bash
# Run the whole test suite (installs first if needed; idempotent and quick when done).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
# One process: the real-part tests (testbeds, Prometheus, timing) must not share the CPUs with
# other tests (two pytest-xdist workers made quiet-run assertions fail); --durations names the slowest.
exec .venv/bin/python -m pytest -q -ra --durations=20 "$@"
