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


BUNDLED = {"dispatch/observation.py": "kernel_gym_observation", "kernels/workloads.py": "kernel_gym_workloads",
           "kernels/profiles.py": "kernel_gym_profiles"}


@pytest.mark.parametrize("module", sorted(BUNDLED))
def test_bundled_modules_import_from_kernel_gym_only_each_other(module):
    """What the pyfunc model bundles imports from kernel_gym only the other bundled modules (with a bundled
    fallback); profiles.py imports nothing from kernel_gym at all."""
    path = Path(observation.__file__).resolve().parents[1] / module
    allowed = set() if module == "kernels/profiles.py" else {"kernel_gym.kernels", "kernel_gym.kernels.profiles",
                                                              *BUNDLED.values()}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert all(n in allowed for n in names if n.startswith("kernel_gym")), f"{module} imports {names}"


def test_the_bundle_computes_the_same_observation_without_kernel_gym(tmp_path):
    """The three files copied as the pyfunc model bundles them observe a workload exactly as kernel_gym does, with
    kernel_gym not importable."""
    import shutil
    import subprocess
    import sys

    root = Path(observation.__file__).resolve().parents[1]
    for module, name in BUNDLED.items():
        shutil.copy(root / module, tmp_path / f"{name}.py")
    code = ("import sys; sys.modules['kernel_gym'] = None\n"
            "import kernel_gym_observation as o, kernel_gym_workloads as w\n"
            "wl = w.workload_from_key('fused_moe', w.MoEWorkload(64, 8, 2, 4096, 14336, 0.6).key())\n"
            "print(list(map(float, o.observe(wl))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    from kernel_gym.kernels.workloads import MoEWorkload

    assert eval(out.stdout) == [float(x) for x in observation.observe(MoEWorkload(64, 8, 2, 4096, 14336, 0.6))]
