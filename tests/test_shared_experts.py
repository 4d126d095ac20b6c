"""Shared experts (DeepSeek, Qwen-MoE, Llama-4, GLM, ERNIE, Hunyuan): a dense MLP every token passes in every MoE
layer, outside the fused-MoE kernel. Before, they counted in the weights but their time was never charged: a step of
DeepSeek-V3 priced 58 layers' shared MLP at nothing, and the zoo's specs of those models carried none, so
`--model qwen2-57b-a14b` and its config.json disagreed by 3.7 GB of weights."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from kernel_gym.measure.roofline import dense_step_s, mlp_s
from kernel_gym.modelspec import ModelSpec, SpecWarning, spec_from_hf_config
from kernel_gym.parallel.layout import Layout, attention_spec, gpu_weight_bytes
from kernel_gym.zoo import ZOO, shard, tp_problem

QWEN2_57B = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 3584,
             "intermediate_size": 18944, "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480,
             "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "num_experts": 64,
             "num_experts_per_tok": 8, "torch_dtype": "bfloat16"}


def _no_shared(spec: ModelSpec) -> ModelSpec:
    return dataclasses.replace(spec, num_shared_experts=0, shared_intermediate=0)


@pytest.mark.parametrize("name", ["qwen2-57b-a14b", "deepseek-v3", "llama-4-maverick", "qwen3-next-80b-a3b"])
def test_a_step_is_charged_the_shared_mlp_in_every_moe_layer(name):
    spec = ZOO[name]
    for tokens in (1, 256, 8192):
        extra = dense_step_s(spec, tokens, 8) - dense_step_s(_no_shared(spec), tokens, 8)
        assert extra == pytest.approx(spec.n_moe_layers * mlp_s(spec, tokens, spec.shared_width), rel=1e-9)
        assert extra > 0


def test_models_without_shared_experts_price_as_before():
    from kernel_gym.measure.roofline import dense_layer_ops, dense_step_ops, op_s

    spec = ZOO["mixtral-8x7b"]
    assert spec.shared_width == 0 and mlp_s(spec, 512, 0) == 0.0
    for tokens in (1, 512):  # the arithmetic before shared experts were priced, bit for bit
        before = spec.num_layers * sum(op_s(f, b) for f, b in dense_layer_ops(spec, tokens).values()) + \
            sum(op_s(f, b) for f, b in dense_step_ops(spec, tokens, 8).values())
        assert dense_step_s(spec, tokens, 8) == before
    assert gpu_weight_bytes(spec, Layout(2, 1)) == 32 * ((4096 * 48 * 128 + 32 * 128 * 4096) / 2 + 4096 * 8
                                                          + 8 * 3 * 4096 * 14336 / 2) * 2


def test_the_zoo_and_the_config_json_agree_on_the_shared_expert():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        read = spec_from_hf_config(QWEN2_57B, "config.json", "qwen2-57b-a14b")
    zoo = ZOO["qwen2-57b-a14b"]
    assert (read.num_shared_experts, read.shared_intermediate) == (zoo.num_shared_experts, zoo.shared_intermediate)
    assert read.weight_bytes == zoo.weight_bytes
    assert zoo.shared_width == 20480


def test_a_shard_splits_the_shared_mlp_and_a_width_that_does_not_split_is_refused():
    spec = ZOO["qwen2-57b-a14b"]
    assert shard(spec, 4).shared_intermediate == 5120
    assert attention_spec(spec, Layout(4, 2)).shared_width == 5120  # the per-GPU spec the parallel pricer charges
    odd = dataclasses.replace(spec, shared_intermediate=20484)
    assert "shared_intermediate 20484 is not a multiple of 8" in tp_problem(odd, 8)
    with pytest.raises(ValueError, match="shared_intermediate"):
        shard(odd, 8)
    dense = dataclasses.replace(ZOO["deepseek-v3"], dense_intermediate=18436)  # a dense layer's MLP splits too
    assert "dense_intermediate 18436 is not a multiple of 8" in tp_problem(dense, 8)


@pytest.mark.parametrize("name", ["qwen2-57b-a14b", "deepseek-v3", "llama-4-maverick", "jamba-1.5-large"])
def test_one_gpu_holds_the_whole_model_and_tp_slices_the_shared_mlp_not_ep(name):
    spec = ZOO[name]
    assert gpu_weight_bytes(spec, Layout(1, 1)) == spec.weight_bytes
    shared = spec.n_moe_layers * 3 * spec.hidden * spec.shared_width * spec.dtype_bytes
    plain = _no_shared(spec)
    for lay in (Layout(2, 1), Layout(1, 2), Layout(2, 4)):
        assert gpu_weight_bytes(spec, lay) - gpu_weight_bytes(plain, lay) == pytest.approx(shared / lay.tp)


def test_arctics_residual_mlp_is_read_as_a_shared_mlp_of_hidden_width():
    cfg = {"architectures": ["ArcticForCausalLM"], "model_type": "arctic", "hidden_size": 7168,
           "intermediate_size": 4864, "num_hidden_layers": 35, "num_attention_heads": 56, "num_key_value_heads": 8,
           "num_local_experts": 128, "num_experts_per_tok": 2, "moe_layer_frequency": 1, "use_residual": True,
           "torch_dtype": "bfloat16"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        read = spec_from_hf_config(cfg, "config.json", "snowflake-arctic")
        plain = spec_from_hf_config({**cfg, "use_residual": False}, "config.json", "snowflake-arctic")
    assert (read.num_shared_experts, read.shared_width) == (1, 7168) and plain.shared_width == 0
    assert read.weight_bytes == ZOO["snowflake-arctic"].weight_bytes
    assert read.weight_bytes - plain.weight_bytes == 35 * 3 * 7168 * 7168 * 2


@pytest.mark.parametrize("name,cfg", [
    ("glm-4.5-air", {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 4096,
                     "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 46,
                     "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128, "n_routed_experts": 128,
                     "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
                     "torch_dtype": "bfloat16"}),
    ("ernie-4.5-300b-a47b", {"architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe",
                             "hidden_size": 8192, "intermediate_size": 28672, "moe_intermediate_size": 3584,
                             "num_hidden_layers": 54, "num_attention_heads": 64, "num_key_value_heads": 8,
                             "moe_num_experts": 64, "moe_num_shared_experts": 0, "moe_k": 8,
                             "moe_layer_start_index": 3, "moe_layer_end_index": 53, "moe_layer_interval": 1,
                             "torch_dtype": "bfloat16"}),
])
def test_the_zoo_carries_the_dense_layers_and_shared_experts_its_config_json_has(name, cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        read = spec_from_hf_config(cfg, "config.json", name)
    zoo = ZOO[name]
    fields = ("moe_layers", "dense_intermediate", "shared_width", "intermediate")
    assert [getattr(read, f) for f in fields] == [getattr(zoo, f) for f in fields]
    assert read.weight_bytes == zoo.weight_bytes
