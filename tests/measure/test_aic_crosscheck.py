"""benchmarks/aic_crosscheck/run.py's CPU pieces: aiconfigurator's routings as re-implemented here, the factor table,
and
the committed rows file it reads."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.aic_crosscheck import run as ac
from tests.script_module import ROOT


def test_balanced_routing_matches_the_collector_rule():
    assert ac.balanced_ids(1, 8, 2) == [[0, 4]]
    ids = ac.balanced_ids(8, 8, 2)
    assert ids[0] == [0, 4] and ids[5] == [5, 1]
    assert Counter(e for row in ids for e in row) == Counter({e: 2 for e in range(8)})  # every expert equally loaded
    assert ac.balanced_ids(2, 8, 2) == [[0, 4], [2, 6]]  # M < stride: t * stride / M


@pytest.mark.parametrize("m", [1, 4, 64, 1024])
def test_power_law_routing_is_a_valid_assignment(m):
    ids = ac.power_law_ids(m, 8, 2, 1.01, seed=3)
    assert len(ids) == m and all(len(set(row)) == 2 for row in ids)  # no token takes an expert twice
    counts = Counter(e for row in ids for e in row)
    assert sum(counts.values()) == 2 * m and max(counts.values()) <= m
    if m >= 64:
        assert max(counts.values()) > 2 * m / 8  # skewed: the top expert holds more than its even share
    assert ac.power_law_ids(m, 8, 2, 1.01, seed=3) == ids  # seeded


def test_logits_pick_exactly_the_assigned_experts():
    from kernel_gym.kernels import fused_moe as fm

    ids = ac.power_law_ids(32, 8, 2, 1.01, seed=0)
    _, picked = fm.route(ac.logits_for(ids, 8, "cpu"), 2)
    assert [sorted(r) for r in picked.tolist()] == [sorted(r) for r in ids]


def test_factors_are_ratios_to_the_base():
    f = ac.factors({"base": 2.0, "eager": 3.0, "aic_balanced": 1.5, "aic_balanced_random_weights": 1.8})
    assert f["eager"] == 1.5 and f["aic_balanced"] == 0.75
    assert f["aic_weights_effect"] == pytest.approx(1.5 / 1.8)
    assert ac.factors({}) == {}


def test_committed_rows():
    rows = json.loads((ROOT / "benchmarks/aic_crosscheck/aic_rows.json").read_text())
    assert rows["aiconfigurator"] == "0.12.0" and rows["kernel_source"] == ac.AIC_SOURCE
    shapes = {(s["model"], s["tp"]): s for s in rows["shapes"]}
    for model, tp, ms in ac.POINTS:  # every point the GPU step times has outside rows
        lat = shapes[(model, tp)]["latency_ms"]
        assert all({"balanced", "power_law_1.01"} <= set(lat[str(m)]) for m in ms)
        name = f"E=8,N={shapes[(model, tp)]['n_shard']},device_name=NVIDIA_H200.json"
        cfg = rows["vllm_configs"]["files"][name]  # the rows ran vLLM 0.24's file, the same as kernel_gym's 0.33 data
        assert cfg["in_wheel"] and cfg["same_as_vllm_0_33"]
    assert rows["vllm_configs"]["small_batch_rule"]
    mix = shapes[("mixtral-8x7b", 1)]
    assert mix["n_shard"] == 14336 and mix["latency_ms"]["4096"]["balanced"] == pytest.approx(4.2218, abs=1e-3)


def test_cli_needs_one_step(capsys):
    with pytest.raises(SystemExit):
        ac.main(["--out", "x"])
    assert "exactly one of --extract" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ac.main(["--extract", str(Path("/nonexistent.parquet")), "--out", "x.json"])
