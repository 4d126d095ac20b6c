"""The planning halves of two GPU scripts, on the packaged H200 data: scripts/plan_coverage.py (what `collect --plan`
should measure) and scripts/heldout_live_check.py (which held-out choices to time again, and how a paired round is
scored)."""

from __future__ import annotations

import json

import pytest
from script_module import load_script


def test_plan_coverage_lists_only_unstored_valid_candidates_in_collects_format(tmp_path):
    from kernel_gym.measure.collect import load_plan_file
    from kernel_gym.measure.recorded import RecordedBackend

    out = tmp_path / "plan.json"
    args = ["--kernels", "prefill_attention", "--models", "mixtral-8x7b", "--depth", "1", "--top", "2",
            "--out", str(out)]
    assert load_script("plan_coverage").main(args) == 0
    plan = json.loads(out.read_text())
    stored = RecordedBackend().stored_keys("prefill_attention")
    pairs = [(e["workload"], c) for e in plan for c in e["configs"]]
    assert pairs and not any(p in stored for p in pairs)  # nothing already measured is planned again
    chunks = load_plan_file(str(out), ["prefill_attention"])  # collect accepts it: every config valid there
    assert sorted((item.workload_key, c) for chunk in chunks for item in chunk for c in item.configs) == sorted(pairs)
    with pytest.raises(SystemExit):
        load_script("plan_coverage").main(["--depth", "0", "--out", str(out)])


def test_heldout_live_pairs_rounds_and_plans_every_heldout_workload(tmp_path):
    ex = load_script("heldout_live_check")
    rounds = {"a": [1.0, 2.0, 3.0], "b": [2.0, 1.0, 3.3]}
    assert ex._paired(rounds, "a") == 1.0  # per round: fastest / a = 1, 0.5, 1 -> median 1
    assert ex._paired(rounds, "b") == pytest.approx(3.0 / 3.3)  # 0.5, 1, 0.909 -> median 0.909
    assert ex._paired(rounds, "c") is None  # failed its check: not timed

    out = tmp_path / "plan.json"
    assert ex.main(["plan", "--envs", "KernelGym/MoE-v0", "--models", "olmoe-1b-7b", "--timesteps", "256",
                    "--runner-ups", "2", "--out", str(out), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
                    "--checkpoints", str(tmp_path / "ck")]) == 0
    entries = json.loads(out.read_text())["entries"]
    assert len(entries) == 15  # olmoe MoE's held-out workloads (benchmarks/policy_quality.md)
    for e in entries:
        assert e["configs"][0] == e["chosen"] and e["oracle"] in e["configs"] and len(e["configs"]) <= 4
        assert 0 < e["recorded_ratio"] <= 1
        assert e["recorded_ms"][e["oracle"]] == min(t for t in e["recorded_ms"].values() if t)

    result = {"results": [{"env_id": "E", "model": "m", "recorded_ratio": 0.8, "live_ratio": 0.9,
                           "oracle_live_ratio": 1.0},
                          {"env_id": "E", "model": "m", "recorded_ratio": 0.5, "live_ratio": None,
                           "oracle_live_ratio": 1.0}]}
    assert "| E | m | 1 | 0.800 | 0.900 | 1.000 |" in ex.report_table(result)
