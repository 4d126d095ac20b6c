"""The store keys a family's rows on its version (kernels/profiles.py), bumped by hand: this catches a forgotten bump.

Each family runs small fixed inputs (its "small" grid's first workload, fp32, seed 0) under Triton's CPU interpreter
with fixed configs (the default and two sampled valid ones on the paths the interpreter runs); a fingerprint of the
outputs is stored per family and version in tests/kernels/golden_outputs.json. When a kernel's outputs change and its
version did not, the stored rows would be read as measurements of the changed kernel: bump `version` in its profile
(the old rows then stay under the old key), then rewrite the file:

    KERNEL_GYM_GOLDEN_WRITE=1 .venv/bin/python -m pytest -q tests/kernels/test_golden_outputs.py

A change that alters timing but not outputs (a new tiling of the same math) is not caught here: bump the version by
hand then too (docs/architecture.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernel_gym.kernels import get_family, profiles
from kernel_gym.kernels.workloads import model_workloads

# the fingerprints are the CPU interpreter's (a GPU's fp32 paths round differently): the check runs where it does
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="golden outputs are the CPU interpreter's (TRITON_INTERPRET=1)")

GOLDEN = Path(__file__).with_name("golden_outputs.json")
SAMPLES = 16
RTOL, ATOL = 2e-3, 1e-4  # interpreter fp32 sums may differ in the last bits across numpy / triton builds


def golden_configs(family: Any, workload: Any) -> list[Any]:
    """The default config and two sampled valid ones whose optional knobs sit at their legacy values (the paths the
    CPU interpreter runs: no TMA descriptors, no Gluon)."""
    space = family.space
    optional = {k.name for k in space.knobs if k.legacy is not None}
    plain = [c for c in space.valid_configs(workload) if not optional & set(c)]
    picked = [family.default_config(workload)]
    for c in __import__("random").Random(0).sample(plain, min(2, len(plain))):
        if c not in picked:
            picked.append(c)
    return picked


def fingerprint(kernel: str, family: Any = None) -> dict[str, Any]:
    """What the outputs of a family's fixed runs look like: per config, the sum, the absolute sum and SAMPLES values
    at fixed positions (compared with a tolerance), and a digest of the outputs rounded to 3 decimals (shown)."""
    import torch

    family = family or get_family(kernel)
    workload = model_workloads(kernel, None, "small", dtype="float32")[0]
    runs = []
    digest = hashlib.sha256()
    for config in golden_configs(family, workload):
        inputs = family.make_inputs(workload, "cpu", seed=0)
        out = family.prepare(inputs, config)()
        x = np.asarray(out.detach().to(torch.float64).cpu().numpy(), dtype=np.float64).ravel()
        idx = np.linspace(0, len(x) - 1, SAMPLES).astype(int)
        runs.append({"config": str(config), "n": int(x.size), "sum": float(x.sum()),
                     "abs_sum": float(np.abs(x).sum()), "samples": [float(v) for v in x[idx]]})
        digest.update(str(config).encode())
        digest.update(np.round(x, 3).tobytes())
    return {"workload": workload.key(), "runs": runs, "digest": digest.hexdigest()[:16]}


def differs(stored: dict[str, Any], now: dict[str, Any]) -> str | None:
    """Why two fingerprints differ (configs, shapes or values beyond the tolerance), None when they agree."""
    if stored.get("workload") != now["workload"]:
        return f"the fixed workload changed ({stored.get('workload')} -> {now['workload']})"
    if [r["config"] for r in stored["runs"]] != [r["config"] for r in now["runs"]]:
        return "the fixed configs changed (default config or knob space)"
    for a, b in zip(stored["runs"], now["runs"]):
        va, vb = np.array([a["sum"], a["abs_sum"], *a["samples"]]), np.array([b["sum"], b["abs_sum"], *b["samples"]])
        if a["n"] != b["n"] or not np.allclose(va, vb, rtol=RTOL, atol=ATOL):
            return f"outputs of {b['config']} changed (digest {stored.get('digest')} -> {now['digest']})"
    return None


def check(kernel: str, golden: dict[str, Any], family: Any = None) -> str | None:
    """None when the family's outputs match the golden entry of its current version; else what to do."""
    p = profiles.profile(kernel)
    entry = golden.get(kernel)
    if entry is None or entry.get("version") != p.version:
        return (f"{kernel}: no golden outputs for version {p.version} (file has "
                f"{None if entry is None else entry.get('version')}): rewrite {GOLDEN.name} (module docstring)")
    why = differs(entry, fingerprint(kernel, family))
    if why:
        return (f"{kernel} version {p.version}: {why}. If the change alters what is measured, bump `version` in "
                f"kernels/profiles.py and rewrite {GOLDEN.name}; stored rows keyed v{p.version} describe the old code")
    return None


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.mark.parametrize("kernel", list(profiles.PROFILES))
def test_outputs_match_the_golden_outputs_of_the_version(kernel: str) -> None:
    if os.environ.get("KERNEL_GYM_GOLDEN_WRITE") == "1":
        golden = _golden()
        golden[kernel] = {"version": profiles.profile(kernel).version, **fingerprint(kernel)}
        GOLDEN.write_text(json.dumps(dict(sorted(golden.items())), indent=1) + "\n")
    problem = check(kernel, _golden())
    assert problem is None, problem


class _Changed:
    """A family whose kernel was edited: the same interface, outputs moved by 1%."""

    def __init__(self, family: Any) -> None:
        self._family = family

    def __getattr__(self, name: str) -> Any:
        return getattr(self._family, name)

    def prepare(self, inputs: Any, config: Any) -> Any:
        launch = self._family.prepare(inputs, config)
        return lambda: launch() * 1.01


def test_a_changed_kernel_without_a_bumped_version_is_caught(monkeypatch) -> None:
    kernel = "decode_attention"
    golden = _golden()
    assert check(kernel, golden) is None
    problem = check(kernel, golden, _Changed(get_family(kernel)))
    assert problem is not None and "bump `version`" in problem
    # bumped without rewriting the golden file: asked to rewrite it
    monkeypatch.setitem(profiles.PROFILES, kernel, profiles.KernelProfile(
        **{**profiles.profile(kernel).__dict__, "version": profiles.profile(kernel).version + 1}))
    assert "no golden outputs for version 2" in check(kernel, golden)
