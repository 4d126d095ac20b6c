"""The short-prefill scripts' CPU parts: knob_ab.py's candidates, comparison, record merge and knob check, and
ncu_profile.py's config picks (their GPU parts run on the H200 only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.short_prefill import knob_ab, ncu_profile
from kernel_gym.kernels import get_family
from kernel_gym.kernels.workloads import PrefillWorkload

PACKED = '{"BLOCK_M":64,"BLOCK_N":32,"PACK_GQA":1,"num_stages":2,"num_warps":4}'
PLAIN = '{"BLOCK_M":64,"BLOCK_N":32,"num_stages":2,"num_warps":4}'
GLUON = '{"BLOCK_M":128,"BLOCK_N":128,"IMPL":"gluon_pingpong","num_stages":3,"num_warps":8}'
LONELY = '{"BLOCK_M":32,"BLOCK_N":32,"num_stages":2,"num_warps":4}'  # timed without its PACK_GQA twin


def _tried(times: dict[str, float | None]) -> list[dict]:
    return [{"config": c, "status": "ok" if ms else "error", "median_ms": ms} for c, ms in times.items()]


def test_candidates_vary_the_knob_only_where_the_case_has_gqa() -> None:
    fam = get_family("prefill_attention")
    gqa = knob_ab.candidates(fam, PrefillWorkload(32, 8, 128, (512,) * 4), "PACK_GQA")
    mha = knob_ab.candidates(fam, PrefillWorkload(32, 32, 128, (512,) * 4), "PACK_GQA")
    packed = {str(c) for c in gqa if "PACK_GQA" in c}
    assert packed and all(fam.space.is_valid(c, PrefillWorkload(32, 8, 128, (512,) * 4)) for c in gqa)
    assert not any("PACK_GQA" in c for c in mha) and any("IMPL" in c for c in mha)  # the Gluon configs ride along
    assert len(gqa) == len({str(c) for c in gqa})


def test_compare_reports_the_best_at_each_value_and_the_twins_speedup() -> None:
    """value0 takes any kernel (the Gluon config here); twin_speedup only configs timed at both values."""
    failing = '{"BLOCK_M":16,"BLOCK_N":16,"num_stages":1,"num_warps":4}'
    times = {PLAIN: 0.080, PACKED: 0.064, GLUON: 0.060, LONELY: 0.070, failing: None}
    result = {"details": {"case_a": {"sdpa": {"ms": 0.05, "variant": "cudnn"}, "tried": _tried(times)},
                          "case_b": {"error": "no SDPA variant ran"}}}
    row, failed = knob_ab.compare(result, "PACK_GQA")
    assert failed == {"case": "case_b", "error": "no SDPA variant ran"}
    assert (row["value0_ms"], row["value0_config"]) == (0.060, GLUON)
    assert (row["value1_ms"], row["value1_config"]) == (0.064, PACKED)
    assert row["value0_ratio"] == pytest.approx(0.05 / 0.060) and row["value1_ratio"] == pytest.approx(0.05 / 0.064)
    assert row["twin_speedup"] == pytest.approx(0.080 / 0.064)  # PLAIN against PACKED; GLUON and LONELY have no twin
    assert "twins" in knob_ab.table([row, failed], "PACK_GQA") and "no SDPA variant ran" in knob_ab.table([failed])


def test_merge_records_replaces_the_same_cases_and_keeps_the_rest(tmp_path: Path) -> None:
    run = tmp_path / "run9_prefix"
    run.mkdir()
    (run / "commit.txt").write_text("tree 107a8120 (...)")
    new = {"kernel": "prefix_prefill", "case": "c1", "anchor": "sdpa_prefix", "ratio_to_anchor": 0.86}
    (run / "prefix_prefill.json").write_text(json.dumps([new]))
    target = tmp_path / "records.json"
    kept = {"kernel": "prefill_attention", "case": "c1", "anchor": "sdpa", "run": "old"}
    target.write_text(json.dumps([{**new, "ratio_to_anchor": 0.85, "run": "old"}, kept]))
    assert knob_ab.merge_records(run, target) == 1
    assert json.loads(target.read_text()) == [kept, {**new, "run": "run9_prefix@107a8120"}]
    with pytest.raises(SystemExit, match="run this script on the GPU"):
        knob_ab.merge_records(tmp_path / "empty", target)


def test_a_knob_must_be_a_binary_knob_of_an_attention_family() -> None:
    assert knob_ab.families("PACK_GQA") == ("prefill_attention", "prefix_prefill")
    knob_ab.check_knob("PACK_GQA")
    for knob in ("NOPE", "BLOCK_M"):  # unknown; not 0/1
        with pytest.raises(SystemExit, match="values 0 and one other"):
            knob_ab.check_knob(knob)
    with pytest.raises(SystemExit, match="not an attention family with PACK_GQA"):
        knob_ab.main(["--families", "fused_moe", "--out", "unused"])


def test_ncu_profile_picks_the_fastest_triton_packed_and_gluon_configs() -> None:
    tried = _tried({PLAIN: 0.070, PACKED: 0.065, GLUON: 0.090, LONELY: 0.060, '{"BLOCK_M":16}': None})
    assert ncu_profile.picks(tried) == {"triton": LONELY, "triton_pack": PACKED, "gluon": GLUON}
    assert ncu_profile.picks(_tried({GLUON: 0.1})) == {"gluon": GLUON}
    # a config the current space refuses (a reverted experiment's) gives way to the next fastest of its group
    assert ncu_profile.picks(tried, lambda c: c != PACKED).get("triton_pack") is None
