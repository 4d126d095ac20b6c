"""experiments/exp_prefill_variants.py: every prefill-attention variant (pointer loads with L2 sections, host and device
TMA descriptors, persistent grid, warp specialisation, lazy rescaling, pipelined QK^T) matches the fp32 reference on a
ragged GQA batch under the interpreter, and the work table covers each (sequence, q block, head) once in the intended
order."""

from __future__ import annotations

import pytest

from kernel_gym.kernels import prefill_attention as pa
from tests.script_module import load_experiment

ex = load_experiment("exp_prefill_variants")


@pytest.mark.parametrize("variant", sorted(ex.tiny_variants()))
def test_tiny_variant_matches_reference(variant: str) -> None:
    records = ex.tiny_check([variant])
    assert records, f"no tiny configs ran for {variant}"
    unsupported = [r for r in records if r.status == "unsupported" or "NotImplementedError" in r.reason]
    if unsupported:
        pytest.skip(f"{variant} cannot run here (interpreter/backend unsupported): {unsupported[0].reason[:200]}")
    label = lambda r: ex.VariantConfig(**r.config).label()
    bad = [f"{r.case} {label(r)}: {r.status} {r.reason}" for r in records if r.status != "ok"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("section", [0, 1, 3, 8])
def test_work_table_covers_every_tile_once_in_section_order(section: int) -> None:
    seq_lens, heads, kv_heads, bm = (37, 100, 5), 4, 2, 16
    table = ex.work_table(seq_lens, heads, kv_heads, bm, section)
    expected = {(s, b, h) for s, n in enumerate(seq_lens) for b in range(-(-n // bm)) for h in range(heads)}
    assert len(table) == len(expected) and set(table) == expected
    group = heads // kv_heads
    sec = [(s * kv_heads + h // group) // section if section else 0 for s, _, h in table]
    assert sec == sorted(sec), "sections must run one after another"
    weights = [min((b + 1) * bm, seq_lens[s]) for s, b, _ in table]
    for i in range(1, len(table)):
        if sec[i] == sec[i - 1]:
            assert weights[i] <= weights[i - 1], f"not heaviest-first inside section {sec[i]} at item {i}"


def test_bad_section_and_mode_are_rejected() -> None:
    with pytest.raises(ValueError, match="section must be >= 0"):
        ex.work_table((8,), 2, 2, 16, -1)
    inputs = pa.FAMILY.make_inputs(pa.PrefillWorkload(2, 2, 64, (8,), "float32"), "cpu")
    with pytest.raises(ValueError, match="mode 7 unknown"):
        ex.prepare_variant(inputs, ex.VariantConfig(7, 16, 16, 4, 2))
