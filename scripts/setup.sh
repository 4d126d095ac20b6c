#!/usr/bin/env bash
# Install kernel_gym into a virtual environment ($VENV, default .venv) on a CPU machine.
# torch==2.13.0 first: it is a CPU build on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
case "${1:-}" in -h|--help) sed -n "2,3p" "$0" | sed "s/^# \{0,1\}//"; echo "usage: [VENV=.venv] bash scripts/setup.sh"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q -e ".[test]"
echo "kernel_gym installed in $VENV"
