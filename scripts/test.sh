#!/usr/bin/env bash
# The README's test command: install (if needed), lint, run the CPU test suite (GPU tests skip with a reason).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
bash scripts/setup.sh
"$VENV/bin/ruff" check kernel_gym scripts tests
"$VENV/bin/python" -m pytest -q -n 2 --durations=15 "$@"
