"""Import a file of scripts/ or experiments/ as a module (neither is a package), for the tests that check their
pieces: `from tests.script_module import load_script, load_experiment`. The study harnesses under benchmarks/ need no
loader: they import as `benchmarks.<study>.run` (a namespace package from the repository root, which pytest puts on
sys.path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
EXPERIMENTS = ROOT / "experiments"


def load_script(name: str, folder: Path = SCRIPTS) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(mod)
    return mod


def load_experiment(name: str) -> ModuleType:
    """A script of experiments/ (the one-off experiments whose findings experiments/README.md records)."""
    return load_script(name, EXPERIMENTS)
