"""`kernel-gym bench` candidate selection and its markdown verdicts (the timing itself needs the H200)."""

from __future__ import annotations

from kernel_gym import bench
from kernel_gym.kernels import get_family
from kernel_gym.kernels.fused_moe import bench_cases
from kernel_gym.measure import make_backend
from kernel_gym.train.measurement_plans import with_new_knobs


def test_candidates_put_the_default_first_then_the_datasets_fastest_then_the_sample():
    family = get_family("fused_moe")
    workload = dict(bench_cases())["moe_mixtral_m1"]
    best = bench.recorded_best(family, workload, 5)
    assert len(best) == 5 and all(family.space.is_valid(c, workload) for c in best)
    recorded = make_backend("recorded")
    times = [recorded.measure("fused_moe", workload, c).median_ms for c in best]
    assert times == sorted(times)
    # nothing valid and measured at this workload is faster than the first pick
    assert all(recorded.measure("fused_moe", workload, c).median_ms >= times[0]
               for c in recorded.available_configs("fused_moe", workload)[:200] if family.space.is_valid(c, workload))
    picks = bench._candidates(family, workload, 20, seed=0, n_recorded=5)
    assert picks[0] == family.default_config(workload)
    assert [c for c in picks if c in best] == [c for c in best if c != picks[0]]
    assert len(picks) == len(set(map(str, picks)))
    assert bench._candidates(family, workload, 20, seed=0)[1:] != picks[1:]  # n_recorded=0: the sample only
    assert bench.recorded_best(family, workload, 0) == []


def test_markdown_marks_met_and_missed_targets():
    record = {"kernel": "fused_moe", "case": "moe_mixtral_m1", "anchor": "copy_bandwidth", "ms": 0.2, "metric": "TB/s",
              "value": 3.5, "anchor_value": 4.0, "ratio_to_anchor": 0.875, "default_ms": 0.4}
    env = {"device": "test", "torch": "x", "triton": "y", "copy_bandwidth_tbs": 4.0}
    md = bench.to_markdown({"records": [record], "env": env})
    assert ">= 0.85 met" in md and "2.00x" in md
    md = bench.to_markdown({"records": [{**record, "ratio_to_anchor": 0.80}], "env": env})
    assert "MISSED by 0.05" in md


def test_candidates_add_the_datasets_best_at_knob_values_added_since():
    """TMA_LOADS came after the MoE rows: the best recorded pointer-path configs are also tried with TMA_LOADS 1 and
    2; a recorded config that already sets the knob is not varied."""
    family = get_family("fused_moe")
    workload = dict(bench_cases())["moe_mixtral_m4096"]
    recorded = bench.recorded_best(family, workload, 12)
    best = [c for c in recorded if "TMA_LOADS" not in c][:3]
    assert best
    variants = with_new_knobs(family.space, best, workload)
    assert variants and all(family.space.is_valid(v, workload) for v in variants)
    assert {(v["TMA_LOADS"], str(family.space.config({**v, "TMA_LOADS": 0}))) for v in variants} <= {
        (mode, str(c)) for mode in (1, 2) for c in best}
    assert not with_new_knobs(family.space, [c for c in recorded if "TMA_LOADS" in c], workload)
    picks = bench._candidates(family, workload, 5, seed=0, n_recorded=12)
    assert set(with_new_knobs(family.space, recorded, workload)) <= set(picks)


def test_vllm_anchor_checks_then_times_vllms_own_config(monkeypatch):
    """The vllm_fused_moe anchor runs vLLM's kernel design with vLLM's own config (default rule here: no table for
    this shape), checked against the reference before it is timed."""
    from kernel_gym.kernels import fused_moe
    from kernel_gym.kernels.workloads import MoEWorkload

    monkeypatch.setattr(bench, "_time", lambda fn: bench.Timed(1.5, 0.0, 1))
    inputs = fused_moe.make_inputs(MoEWorkload(5, 4, 2, 64, 96, 0.0, "float32"), "cpu", 0)
    res = bench.vllm_anchor(inputs)
    # vLLM 0.33's default rule (kernels/vllm_tables.py): GROUP_SIZE_M 1 unless M // E > 128, BLOCK_SIZE_K 128 at M <= 64
    assert res["vllm_fused_moe_ms"] == 1.5 and res["vllm_fused_moe_config"]["GROUP_SIZE_M"] == 1
    assert res["vllm_fused_moe_config"]["BLOCK_SIZE_K"] == 128
