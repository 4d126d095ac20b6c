"""`kernel-gym bench` candidate selection, the SDPA anchors' variant checks and the markdown verdicts (the timing
itself needs the H200)."""

from __future__ import annotations

import pytest

from kernel_gym import bench
from kernel_gym.kernels import get_family
from kernel_gym.kernels import prefill_attention as pa
from kernel_gym.kernels.fused_moe import bench_cases
from kernel_gym.kernels.workloads import PrefillWorkload
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


def _fake_timing(monkeypatch, ms: dict) -> None:
    """bench._time returns each fake variant's own time (the CPU cannot run the benchmark timing)."""
    monkeypatch.setattr(bench, "_time", lambda fn: bench.Timed(ms[fn], 0.0, 1))


def test_fastest_correct_times_only_right_variants_and_keeps_why_the_others_lost(monkeypatch):
    def refuses():
        raise RuntimeError("No available kernel.\nmore detail")

    right_slow, right_fast, wrong = (lambda: 1.0), (lambda: 1.0), (lambda: 2.0)
    _fake_timing(monkeypatch, {right_slow: 0.5, right_fast: 0.2, wrong: 0.01})
    res = bench.fastest_correct({"slow": right_slow, "wrong": wrong, "refuses": refuses, "fast": right_fast},
                                lambda out: None if out == 1.0 else f"got {out}", 2e9, "w")
    assert res["variant"] == "fast" and res["ms"] == 0.2 and res["tflops"] == 2e9 / 0.2e-3 / 1e12
    assert res["variants"] == {"slow": 0.5, "wrong": "wrong result: got 2.0", "refuses": "RuntimeError: No available "
                               "kernel.", "fast": 0.2}


def test_fastest_correct_without_a_right_variant_raises(monkeypatch):
    wrong = lambda: 2.0  # noqa: E731
    _fake_timing(monkeypatch, {wrong: 0.1})
    with pytest.raises(RuntimeError, match="no SDPA variant ran correctly for w.*wrong result"):
        bench.fastest_correct({"wrong": wrong}, lambda out: "off", 1.0, "w")


def test_sdpa_anchor_checks_every_variant_on_the_familys_gqa_inputs(monkeypatch):
    """On the CPU: the prefill anchor lays the family's packed inputs out as [B, H, N, D], tries each backend with the
    kv heads repeated and with enable_gqa, and only variants matching the fp32 reference are timed; torch's own
    dispatch is right in both layouts."""
    monkeypatch.setattr(bench, "_time", lambda fn: bench.Timed(1.0, 0.0, 1))
    w = PrefillWorkload(8, 2, 16, (6, 6, 6), "float32")
    res = bench.sdpa_anchor(w, 1e9, seed=3, device="cpu")
    specs = ("cudnn_causal", "flash_causal", "efficient_causal", "default_causal")
    assert set(res["variants"]) == {f"{s}_{heads}" for s in specs for heads in ("mha", "gqa")}
    assert res["variants"]["default_causal_mha"] == res["variants"]["default_causal_gqa"] == 1.0
    assert res["variants"][res["variant"]] == res["ms"] == 1.0
    mha = bench.sdpa_anchor(PrefillWorkload(4, 4, 16, (5, 5)), 1e9, device="cpu")["variants"]
    assert set(mha) == {f"{s}_mha" for s in specs}  # no GQA, no enable_gqa variants
    with pytest.raises(ValueError, match="equal-length"):
        bench.sdpa_anchor(PrefillWorkload(8, 2, 16, (6, 7), "float32"), 1e9, device="cpu")


def test_sdpa_anchor_records_a_wrong_layout_as_wrong(monkeypatch):
    """The check is the family's reference: SDPA without the causal mask is not the prefill result."""
    monkeypatch.setattr(bench, "_time", lambda fn: bench.Timed(1.0, 0.0, 1))
    w = PrefillWorkload(4, 2, 16, (6, 6), "float32")
    family = get_family("prefill_attention")
    inputs = family.make_inputs(w, "cpu", 0)
    q, k, v = (bench._heads_first(x, 2, 6) for x in (inputs.q, inputs.k, inputs.v))
    variants = bench.sdpa_variants(q, k, v, {"full": (None, {}), "causal": (None, {"is_causal": True})})
    res = bench.fastest_correct(variants, bench._reference_check(family, inputs), 1e9, w.key())
    assert res["variant"] in ("causal_mha", "causal_gqa")
    assert res["variants"]["full_mha"].startswith("wrong result") and res["variants"]["full_gqa"].startswith("wrong")


def test_sdpa_prefix_anchor_keeps_its_variants(monkeypatch):
    """sdpa_prefix_anchor through the shared helpers: the same variant names as before, with and without a prefix,
    and the default dispatch matches the reference under the bottom-right mask."""
    from kernel_gym.kernels.workloads import PrefixPrefillWorkload

    monkeypatch.setattr(bench, "_time", lambda fn: bench.Timed(1.0, 0.0, 1))
    heads = ("mha", "gqa")
    res = bench.sdpa_prefix_anchor(PrefixPrefillWorkload(4, 2, 16, (5, 5), (7, 7), "float32"), 1e9, device="cpu")
    assert set(res["variants"]) == {f"{s}_{h}" for s in ("cudnn_mask", "flash_lower_right", "efficient_lower_right",
                                                         "default_mask") for h in heads}
    assert res["variants"]["default_mask_mha"] == res["variants"]["default_mask_gqa"] == 1.0
    res = bench.sdpa_prefix_anchor(PrefixPrefillWorkload(4, 2, 16, (5, 5), (0, 0), "float32"), 1e9, device="cpu")
    assert set(res["variants"]) == {f"{s}_{h}" for s in ("cudnn_causal", "flash_causal", "default_causal")
                                    for h in heads}
    assert res["variants"]["default_causal_gqa"] == 1.0


def test_every_prefill_case_targets_the_sdpa_anchor():
    """Issue 29: >= 1.0 of the SDPA anchor at every prefill benchmark case, the short prefills included."""
    cases = [case for case, _ in pa.bench_cases()]
    assert "prefill_b64_h32kv4_n128_d128" in cases
    assert {k: v for k, v in bench.targets().items() if k[1] == "sdpa"} == {(c, "sdpa"): 1.0 for c in cases}
    record = {"kernel": "prefill_attention", "case": "prefill_b16_h32kv8_n512_d128", "anchor": "sdpa", "ms": 0.1,
              "metric": "TFLOP/s", "value": 400.0, "anchor_value": 500.0, "ratio_to_anchor": 0.8, "default_ms": 0.2}
    env = {"device": "test", "torch": "x", "triton": "y", "copy_bandwidth_tbs": 4.0}
    assert "| >= 1.00 MISSED by 0.20 |" in bench.to_markdown({"records": [record], "env": env})


@pytest.mark.gpu
def test_sdpa_anchor_on_the_gpu_finds_a_correct_variant():
    """bf16 GQA short prefill on the GPU: at least one SDPA backend is right and timed, every variant is accounted."""
    w = PrefillWorkload(32, 8, 128, (128,) * 4)
    res = bench.sdpa_anchor(w, get_family("prefill_attention").flops(w))
    assert res["ms"] > 0 and res["variant"] in res["variants"] and len(res["variants"]) == 8


@pytest.mark.parametrize("batch", [1, 3])
def test_torch_decode_variants_match_the_decode_reference_where_they_run(batch):
    """On the CPU only SDPA's default dispatch runs (the varlen kernels and the fused backends need CUDA); its
    variants must give the decode family's reference, padded past batch 1 (ragged contexts) and plain at batch 1."""
    from kernel_gym.kernels.workloads import DecodeWorkload
    from kernel_gym.measure.worker import compare

    fam = get_family("decode_attention")
    w = DecodeWorkload(8, 2, 32, batch, 40, "float32")
    inputs = fam.make_inputs(w, "cpu")
    ref = fam.reference(inputs)
    variants = bench.sdpa_decode_variants(inputs)
    assert {"flash_varlen", "efficient_varlen"} <= set(variants)
    suffix = "_padded" if batch > 1 else ""
    ran = [f"sdpa_default_mha{suffix}", f"sdpa_default_gqa{suffix}"]
    assert set(ran) <= set(variants)
    for name in ran:
        assert compare(fam, variants[name](), ref, w.dtype) is None, name
    if batch > 1:  # the padding is masked: without the mask the padded keys would change every shorter sequence
        assert len(set(inputs.context_lens.tolist())) > 1



def test_checked_variants_keeps_only_the_variants_that_run_and_match() -> None:
    """What fastest_correct and benchmarks/flush_mode/run.py time: only variants the check accepts; the others are
    kept with why."""
    checked_variants = bench.checked_variants

    def refuses() -> None:
        raise RuntimeError("No available kernel. Aborting execution.")

    ok, refused = checked_variants({"right": lambda: 1.0, "wrong": lambda: 2.0, "refuses": refuses},
                                   lambda out: None if out == 1.0 else f"off by {out - 1.0}")
    assert list(ok) == ["right"]
    assert refused == {"wrong": "wrong result: off by 1.0", "refuses": "RuntimeError: No available kernel. Aborting "
                                                                       "execution."}
