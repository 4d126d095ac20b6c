"""experiments/exp_moe_tma.py: its variants (the fused MoE family's TMA_LOADS path: weights through descriptors,
activations gathered or in the aligned order) match the fp32 reference under the interpreter on a skewed, ragged
routing with padded groups."""

from __future__ import annotations

from tests.script_module import load_experiment


def test_tiny_variants_match_reference() -> None:
    rows = load_experiment("exp_moe_tma").tiny_check()
    assert len(rows) == 8
    bad = [f"{r['variant']} {r['dtype']}: {r['status']} {r['reason']}" for r in rows if r["status"] != "ok"]
    assert not bad, "\n".join(bad)


def test_ragged_dimensions_are_refused_with_the_reason() -> None:
    import pytest

    ex = load_experiment("exp_moe_tma")
    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.kernels.workloads import MoEWorkload

    inputs = fm.make_inputs(MoEWorkload(5, 4, 2, 48, 128, 0.0, "float32"), "cpu", seed=0)
    with pytest.raises(ValueError, match="hidden 48 must be a multiple of BLOCK_N=32"):
        ex.prepare_variant(inputs, ex.Variant(False, 16, 32, 32, 4, 3))
