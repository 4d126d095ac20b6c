#!/usr/bin/env bash
# The README's test command: install (if needed), lint, run the CPU test suite (GPU tests skip with a reason).
case "${1:-}" in -h|--help) sed -n "2p" "$0" | sed "s/^# \{0,1\}//"; echo "usage: [VENV=.venv] bash scripts/test.sh [PYTEST ARGS...]"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
bash scripts/setup.sh
"$VENV/bin/python" -m pip install -q -e ".[ray]"  # the optional Ray extra (an 80 MB wheel): the farm's tests need it
"$VENV/bin/ruff" check kernel_gym scripts experiments tests benchmarks
# README/docs figures against the commands next to them (cheap CPU figures + GPU figures vs their committed JSON)
"$VENV/bin/python" scripts/check_readme_figures.py
# loadgroup: tests marked xdist_group (the Ray farm's, which share one local cluster) stay on one worker
"$VENV/bin/python" -m pytest -q -n 2 --dist loadgroup --durations=15 "$@"
