"""Layer kinds: ModelSpec.moe_layers / attention_layers / dense_intermediate, read from the config.json keys of the
families whose layers are not all attention + MoE, and every consumer charging each part for the layers that run it.
Before, every one of num_layers layers was priced as attention (with a KV cache) + routed MoE: DeepSeek-V3's dense
layers as MoE ones, Maverick's expert weights twice over, Jamba's KV cache 8 times. Numbers are the published
models' config.json values."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest

from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload
from kernel_gym.modelspec import ModelSpec, SpecWarning, spec_from_dict, spec_from_hf_config

DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
               "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
               "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
               "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512,
               "qk_rope_head_dim": 64, "v_head_dim": 128, "torch_dtype": "bfloat16"}
JAMBA_V01 = {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "num_experts": 16, "num_experts_per_tok": 2, "attn_layer_period": 8, "attn_layer_offset": 4,
             "expert_layer_period": 2, "expert_layer_offset": 1, "mamba_d_state": 16, "mamba_expand": 2,
             "torch_dtype": "bfloat16"}
MAVERICK = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
            "text_config": {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                            "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                            "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 128,
                            "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "torch_dtype": "bfloat16",
                            "attention_chunk_size": 8192}}
SMALL = ModelSpec("small", num_layers=4, hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, num_experts=4, top_k=2,
                  intermediate=512)


def _read(cfg: dict, quiet: bool = True) -> ModelSpec:
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("error", SpecWarning)
        return spec_from_hf_config(cfg, "config.json", "m")


def test_deepseek_v3_reads_58_moe_layers_of_61_and_the_dense_width():
    spec = _read(DEEPSEEK_V3)  # everything it says is modelled now: no warning
    assert (spec.num_layers, spec.moe_layers, spec.n_moe_layers, spec.attention_layers) == (61, 58, 58, 0)
    assert (spec.dense_intermediate, spec.n_dense_layers, spec.n_attention_layers) == (18432, 3, 61)
    all_moe = replace(spec, moe_layers=0, dense_intermediate=0)
    per_moe = (7168 * 256 + (256 + 1) * 3 * 7168 * 2048) * 2  # router + routed and shared experts, bf16
    assert all_moe.weight_bytes - spec.weight_bytes == 3 * per_moe - 3 * 3 * 7168 * 18432 * 2


def test_jamba_reads_4_attention_layers_of_32_and_an_eighth_of_the_kv_cache():
    with pytest.warns(SpecWarning, match="28 layers without full attention .* mixer kernels are not priced.*their "
                      "state, 8.3 MiB per request, is counted"):
        spec = _read(JAMBA_V01, quiet=False)
    assert (spec.attention_layers, spec.moe_layers, spec.dense_intermediate) == (4, 16, 14336)
    assert spec.mixer_state_bytes == 28 * (8192 * 3 + 8192 * 16) * 2  # Mamba: 2 x 4096 channels, conv 4, state 16
    every = replace(spec, attention_layers=0)
    assert spec.kv_bytes_per_token * 8 == every.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert spec.n_dense_layers == 16
    # 52B parameters published (the Mamba mixers' ~3B not counted); all layers as MoE counted ~90B
    assert 45e9 < spec.weight_bytes / 2 < 52e9 < 85e9 < replace(spec, moe_layers=0).weight_bytes / 2


def test_llama4_maverick_has_half_its_layers_moe_and_weights_follow():
    spec = _read(MAVERICK)
    assert (spec.num_layers, spec.moe_layers, spec.dense_intermediate, spec.n_dense_layers) == (48, 24, 16384, 24)
    every = replace(spec, moe_layers=0)
    moe_layer = (5120 * 128 + (128 + 1) * 3 * 5120 * 8192) * 2  # router, 128 routed + 1 shared expert
    assert every.weight_bytes - spec.weight_bytes == 24 * moe_layer - 24 * 3 * 5120 * 16384 * 2
    assert 390e9 < spec.weight_bytes / 2 < 410e9 < 700e9 < every.weight_bytes / 2  # published: 400B
    from kernel_gym.parallel.layout import Layout, gpu_weight_bytes

    assert gpu_weight_bytes(spec, Layout(1, 1)) == pytest.approx(spec.weight_bytes)
    assert gpu_weight_bytes(spec, Layout(8, 1)) < gpu_weight_bytes(every, Layout(8, 1)) / 1.7


def test_layer_counts_are_validated_and_default_to_all():
    assert (SMALL.n_moe_layers, SMALL.n_attention_layers, SMALL.n_dense_layers, SMALL.uniform_layers) == (4, 4, 0, True)
    assert replace(SMALL, moe_layers=4, attention_layers=4).uniform_layers
    with pytest.raises(ValueError, match="moe_layers .5. exceeds num_layers"):
        replace(SMALL, moe_layers=5)
    with pytest.raises(ValueError, match="attention_layers must be a non-negative integer"):
        replace(SMALL, attention_layers=-1)
    stored = {k: v for k, v in json.loads(json.dumps(SMALL.__dict__)).items()
              if k not in ("moe_layers", "attention_layers", "dense_intermediate")}
    assert spec_from_dict(stored) == SMALL  # a spec JSON written before the fields means what it meant


class _Fixed:
    """Kernel time by family: decode 1 ms, prefill 2 ms, fused MoE 10 ms (any shape)."""

    def time_s(self, kernel, workload, config) -> float:
        return 10e-3 if isinstance(workload, MoEWorkload) else 1e-3 if isinstance(workload, DecodeWorkload) else 2e-3


def _sim(spec: ModelSpec):
    from kernel_gym.traffic.routing import UniformRouting
    from kernel_gym.traffic.simulator import KVLayout, Simulator, StaticChooser
    from kernel_gym.traffic.traces import Trace

    ch = StaticChooser({"prefill_attention": Config(BLOCK_M=64), "decode_attention": Config(PAGE_SIZE=16, LAYOUT="NHD"),
                        "fused_moe": Config(BLOCK_M=32)})
    tr = Trace("one", np.array([0.0]), np.array([100]), np.array([2]))
    mem = (spec.weight_bytes + (1 << 16) * spec.kv_bytes_per_token) / 0.9
    return Simulator(spec, tr, _Fixed(), ch, UniformRouting(4, 2), kv_layout=KVLayout(16, "NHD"),
                     gpu_memory_bytes=mem, chunk_attention="equivalent")


def test_price_step_charges_the_moe_per_moe_layer_and_attention_per_attention_layer():
    from kernel_gym.measure.roofline import dense_step_s

    half = replace(SMALL, moe_layers=2)
    kernel_all, dense_all = _sim(SMALL).price_step([], 8, 300.0, 8, [])
    kernel_half, dense_half = _sim(half).price_step([], 8, 300.0, 8, [])
    assert kernel_all == pytest.approx(4 * (1e-3 + 10e-3))
    assert kernel_half == pytest.approx(4 * 1e-3 + 2 * 10e-3)  # the MoE half as often, attention as before
    assert dense_half < dense_all  # the router on 2 layers, not 4
    one_attention = replace(SMALL, attention_layers=1)
    kernel_att, _ = _sim(one_attention).price_step([(0, 64, 0)], 8, 300.0, 8, [])
    assert kernel_att == pytest.approx(1 * (2e-3 + 1e-3) + 4 * 10e-3)
    # a dense-MLP layer's MLP is priced as the other untuned ops: at its roofline, in the dense seconds
    dense_mlp = replace(half, dense_intermediate=1024)
    assert dense_step_s(dense_mlp, 64, 8) > dense_step_s(half, 64, 8)
    assert _sim(dense_mlp).price_step([], 8, 300.0, 8, [])[0] == pytest.approx(kernel_half)


def test_replay_guard_and_parallel_report_count_each_kernel_over_its_layers():
    from kernel_gym.evaluate.replay import GuardedChooser
    from kernel_gym.kernels import profiles

    half = replace(SMALL, moe_layers=2, attention_layers=1)
    assert (profiles.layers_of("fused_moe", half), profiles.layers_of("decode_attention", half),
            profiles.layers_of("prefill_attention", half)) == (2, 1, 1)
    assert profiles.layers_of("fused_moe", SMALL) == profiles.layers_of("decode_attention", SMALL) == 4
    guard = GuardedChooser(object(), None, 4, kernel_layers={"fused_moe": 2, "decode_attention": 4})
    assert guard.kernel_layers == {"fused_moe": 2}  # only where it differs from num_layers
    from kernel_gym.parallel.layout import Layout
    from kernel_gym.parallel.step_time import StepPricer

    pricer = StepPricer(half, Layout(1, 1), backend="recorded", kernels_only=True)
    pricer._book("fused_moe", 1.0, True)
    pricer._book("decode_attention", 3.0, False)
    rep = pricer.report_all_layers()
    assert (rep["fused_moe_s"], rep["decode_attention_s"], rep["step_parts_s"]) == (2.0, 3.0, 5.0)
    assert rep["estimated_share"] == pytest.approx(2.0 / 5.0)
    uniform = StepPricer(SMALL, Layout(1, 1), backend="recorded", kernels_only=True)
    uniform._book("fused_moe", 1.0, True)
    uniform._book("decode_attention", 3.0, False)
    assert uniform.report_all_layers()["step_parts_s"] == 16.0 and uniform.report_all_layers()[
        "estimated_share"] == uniform.report()["estimated_share"]


def test_the_defaults_price_exactly_as_one_layer_kind():
    """A spec at the defaults takes the arithmetic it always took: the step price of mixtral is (attention + MoE) x
    layers to the last bit, and its memory figures equal the one-layer-kind formulas (a published replay / plan
    figure unchanged: scripts/check_readme_figures.py)."""
    from kernel_gym.measure.roofline import dense_layer_ops, dense_step_ops, dense_step_s, op_s
    from kernel_gym.models import load_model
    from kernel_gym.parallel.layout import Layout, gpu_weight_bytes

    m = load_model("mixtral-8x7b")
    assert m.uniform_layers and (m.moe_layers, m.attention_layers, m.dense_intermediate) == (0, 0, 0)
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    qkv = 4096 * (32 + 16) * 128 + 32 * 128 * 4096
    assert m.weight_bytes == 32 * (qkv + 4096 * 8 + 8 * 3 * 4096 * 14336) * 2 == 92880764928
    lay = Layout(2, 4)
    experts = 8 / 4 * 3 * 4096 * 14336 / 2
    assert gpu_weight_bytes(m, lay) == 32 * (qkv / 2 + 4096 * 8 + experts) * 2
    for t in (1, 96, 4096):
        per_layer = sum(op_s(f, nb) for f, nb in dense_layer_ops(m, t).values())
        per_step = sum(op_s(f, nb) for f, nb in dense_step_ops(m, t, 7).values())
        assert dense_step_s(m, t, 7) == 32 * per_layer + per_step
    spec = replace(SMALL, num_layers=32)
    kernel_s, _ = _sim(spec).price_step([(0, 64, 0)], 8, 300.0, 8, [])
    assert kernel_s == (2e-3 + 1e-3 + 10e-3) * 32  # bit for bit: one sum x layers


def test_tp_all_reduces_follow_every_mixer_and_every_mlp_not_only_the_moe_layers():
    """vLLM and SGLang all-reduce after each layer's mixer and each MLP, dense ones too; the MoE call carries them
    (the simulator charges that part per MoE layer), so Maverick at TP 8 (48 layers, 24 MoE, 24 dense MLP) books
    96 all-reduces a step, not 48."""
    from kernel_gym.parallel.layout import Layout
    from kernel_gym.parallel.step_time import StepPricer

    spec = _read(MAVERICK)
    pricer = StepPricer(spec, Layout(8, 1), backend="recorded", kernels_only=True)
    assert pricer.all_reduces_per_moe_layer * spec.n_moe_layers == 96
    assert StepPricer(SMALL, Layout(2, 1), backend="recorded", kernels_only=True).all_reduces_per_moe_layer == 2


def test_layer_lists_past_the_model_and_jambas_default_offsets():
    """A moe_layers list naming layers the model lacks was counted whole and refused with a message naming no key;
    Jamba's offsets default as its modelling code does (attention at 4 of 8, MoE at 1 of 2)."""
    from kernel_gym.modelspec import hf_layer_counts

    llama = {"num_hidden_layers": 4, "moe_layers": [1, 3, 3, 5, 7], "intermediate_size_mlp": 64}
    assert hf_layer_counts(llama, 4, "x")["moe_layers"] == 2
    jamba = {"attn_layer_period": 8, "expert_layer_period": 2, "intermediate_size": 64}
    with pytest.warns(SpecWarning):
        got = hf_layer_counts(jamba, 36, "x")
    assert (got["attention_layers"], got["moe_layers"]) == (4, 18)


def test_zoo_names_count_the_layer_kinds_their_config_json_does():
    """`--model llama-4-maverick` priced 776B of weights where its config.json read 399B: the zoo entries of models
    whose layers are not all attention + MoE carry the reader's counts."""
    from kernel_gym.zoo import ZOO

    maverick = _read(MAVERICK)
    for field in ("num_layers", "moe_layers", "attention_layers", "dense_intermediate", "hidden", "num_experts"):
        assert getattr(ZOO["llama-4-maverick"], field) == getattr(maverick, field), field
    assert ZOO["deepseek-v3"].n_moe_layers == 58 and ZOO["qwen3-next-80b-a3b"].n_attention_layers == 12
    assert ZOO["jamba-1.5-large"].n_attention_layers * 8 == ZOO["jamba-1.5-large"].num_layers
