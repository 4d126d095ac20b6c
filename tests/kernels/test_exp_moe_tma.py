"""scripts/exp_moe_tma.py: the TMA-weight MoE variants (weights through descriptors; activations gathered or in the
aligned order) match the fp32 reference under the interpreter on a skewed, ragged routing with padded groups."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "exp_moe_tma.py"


def _load():
    spec = importlib.util.spec_from_file_location("exp_moe_tma", _SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_tiny_variants_match_reference() -> None:
    rows = _load().tiny_check()
    assert len(rows) == 8
    bad = [f"{r['variant']} {r['dtype']}: {r['status']} {r['reason']}" for r in rows if r["status"] != "ok"]
    assert not bad, "\n".join(bad)


def test_ragged_dimensions_are_refused_with_the_reason() -> None:
    import pytest

    ex = _load()
    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.kernels.workloads import MoEWorkload

    inputs = fm.make_inputs(MoEWorkload(5, 4, 2, 48, 128, 0.0, "float32"), "cpu", seed=0)
    with pytest.raises(ValueError, match="hidden 48 is not a multiple of 32"):
        ex.prepare_variant(inputs, ex.Variant(False, 16, 32, 32, 4, 2))
