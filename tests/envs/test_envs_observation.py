"""The shared observation: fixed-range scaling, and the bundle-ability the pyfunc model relies on."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from kernel_gym.dispatch import observation
from kernel_gym.kernels.workloads import model_workloads
from kernel_gym.models import BUILTIN_MODELS


@pytest.mark.parametrize("kernel", ["fused_moe", "decode_attention", "prefill_attention"])
def test_grid_workloads_map_into_the_unit_box(kernel):
    for model in BUILTIN_MODELS.values():
        obs = np.stack([observation.observe(w) for w in model_workloads(kernel, model)])
        assert obs.dtype == np.float32 and obs.shape[1] == len(observation.feature_names(kernel))
        assert np.all(np.abs(obs) <= 1.0 + 1e-6), "the fixed ranges must cover the built-in grids"
        assert len({tuple(o) for o in obs}) == len(obs), "distinct workloads must observe differently"


def test_encode_names_missing_features():
    with pytest.raises(ValueError, match="log2_tokens"):
        observation.encode("fused_moe", {"skew": 0.0})
    with pytest.raises(ValueError, match="unknown kernel 'gemm'"):
        observation.feature_names("gemm")


@pytest.mark.parametrize("module", ["dispatch/observation.py", "kernels/workloads.py"])
def test_bundled_modules_import_nothing_from_kernel_gym(module):
    path = Path(observation.__file__).resolve().parents[1] / module
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert not any(n.startswith("kernel_gym") for n in names), f"{module} imports {names}"
