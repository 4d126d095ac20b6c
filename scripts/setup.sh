#!/usr/bin/env bash
# Install kernel_gym into a virtual environment ($VENV, default .venv) on a CPU machine.
# torch==2.13.0 first: it is a CPU build on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
case "${1:-}" in -h|--help) sed -n "2,3p" "$0" | sed "s/^# \{0,1\}//"; echo "usage: [VENV=.venv] bash scripts/setup.sh"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
T0=$SECONDS
say() { echo "[setup $((SECONDS - T0))s] $*"; }  # one line per step: the installs run for minutes without output
if [ ! -x "$VENV/bin/python" ]; then say "creating the virtual environment $VENV"; python3 -m venv "$VENV"; fi
say "upgrading pip"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
say "installing torch==2.13.0 (CPU build, about 750 MB on disk; ~20 s when cached, minutes when downloaded)"
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
say "installing kernel_gym and its pinned dependencies (mlflow 3.17.2, triton, stable-baselines3, ...; ~1-2 min)"
"$VENV/bin/python" -m pip install -q -e ".[test]"
say "kernel_gym installed in $VENV (Ray, for collect --ray only, is not: pip install -e '.[ray]')"
