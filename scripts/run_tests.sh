#!/usr/bin/env bash
# Run the whole test suite (installs first if needed; idempotent and quick when done).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
exec .venv/bin/python -m pytest -q -ra "$@"
