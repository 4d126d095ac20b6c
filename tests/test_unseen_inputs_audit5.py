"""The fifth audit of inputs the project never shipped: the config.json of MoE families the earlier audits did not
read (multimodal wrappers under llm_config / language_config / thinker_config, DBRX's nested ffn_config, Llama-4's
implicit shared expert, Granite's, Nemotron-H's and Step3's shared-expert keys, Step3's KV groups, JetMoE's head size,
DeepSeek-VL2's use_mla: false, layers that are not all attention + MoE), and engine releases written as pip and
`vllm.__version__` write them. Numbers are the published models'. Each test failed before its fix."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from kernel_gym.modelspec import SpecWarning

QWEN3_30B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
             "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
             "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "intermediate_size": 6144,
             "decoder_sparse_step": 1, "mlp_only_layers": [], "torch_dtype": "bfloat16"}
LLAMA4_SCOUT = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                "text_config": {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                                "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                                "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 16,
                                "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "torch_dtype": "bfloat16"},
                "vision_config": {"hidden_size": 1408, "num_attention_heads": 16, "num_hidden_layers": 34}}


def _load(tmp_path: Path, name: str, cfg: dict, quiet: bool = True):
    """The spec load_model reads from tmp_path/name/config.json; quiet: failing on any SpecWarning."""
    from kernel_gym.models import load_model

    (tmp_path / name).mkdir(exist_ok=True)
    (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("error", SpecWarning)
        return load_model(str(tmp_path / name / "config.json"))


def _shape(spec):
    return (spec.num_layers, spec.hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.num_experts,
            spec.top_k, spec.intermediate, spec.num_shared_experts, spec.shared_intermediate)


QWEN3_SHAPE = (48, 2048, 32, 4, 128, 128, 8, 768, 0, 0)


def test_a_language_model_nested_under_llm_config_or_thinker_config_is_read(tmp_path):
    # InternVL3.5-30B-A3B (llm_config) and Qwen3-Omni-30B-A3B (thinker_config.text_config) were called "not a
    # mixture-of-experts model"
    internvl = {"architectures": ["InternVLChatModel"], "model_type": "internvl_chat", "llm_config": QWEN3_30B,
                "vision_config": {"hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 24}}
    assert _shape(_load(tmp_path, "InternVL3_5-30B-A3B", internvl)) == QWEN3_SHAPE
    omni = {"model_type": "qwen3_omni_moe", "thinker_config": {"model_type": "qwen3_omni_moe_thinker",
                                                                "text_config": QWEN3_30B},
            "talker_config": {"text_config": {"hidden_size": 1024, "num_experts": 128, "num_experts_per_tok": 6}}}
    assert _shape(_load(tmp_path, "Qwen3-Omni-30B-A3B", omni)) == QWEN3_SHAPE


def test_dbrx_nested_ffn_and_attn_config_is_read_as_the_zoo_has_it(tmp_path):
    from kernel_gym.zoo import ZOO

    cfg = {"architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40,
           "max_seq_len": 32768, "attn_config": {"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
           "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4}, "torch_dtype": "bfloat16"}
    assert _shape(_load(tmp_path, "dbrx-instruct", cfg)) == _shape(ZOO["dbrx"])  # was "not a mixture-of-experts"


def test_llama4_shared_expert_is_counted(tmp_path):
    # every Llama-4 MoE layer runs one shared expert as wide as a routed one; no key says so, and it was dropped
    spec = _load(tmp_path, "Llama-4-Scout-17B-16E", LLAMA4_SCOUT)
    assert _shape(spec) == (48, 5120, 40, 8, 128, 16, 1, 8192, 1, 8192)


def test_granite_shared_intermediate_size_is_read(tmp_path):
    cfg = {"architectures": ["GraniteMoeSharedForCausalLM"], "model_type": "granitemoeshared", "hidden_size": 1024,
           "intermediate_size": 512, "shared_intermediate_size": 1024, "num_hidden_layers": 24,
           "num_attention_heads": 16, "num_key_value_heads": 8, "num_local_experts": 32, "num_experts_per_tok": 8}
    assert _load(tmp_path, "granite-shared", cfg).shared_intermediate == 1024  # was no shared expert
    assert _load(tmp_path, "minimax-m2", dict(cfg, shared_intermediate_size=0)).num_shared_experts == 0


def test_nemotron_h_shared_expert_has_its_own_width(tmp_path):
    cfg = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 2688,
           "num_hidden_layers": 4, "hybrid_override_pattern": "EEEE", "num_attention_heads": 32,
           "num_key_value_heads": 2, "head_dim": 128, "n_routed_experts": 128, "n_shared_experts": 1,
           "num_experts_per_tok": 6, "moe_intermediate_size": 1856, "moe_shared_expert_intermediate_size": 3712}
    with pytest.warns(SpecWarning, match="4 layers the model has 0 full-attention layers"):  # all MoE, no attention
        spec = _load(tmp_path, "nemotron", cfg, quiet=False)
    assert (spec.num_shared_experts, spec.shared_intermediate) == (1, 3712)  # was 1856, a routed expert's


def test_step3_top_k_kv_groups_and_shared_expert_are_read(tmp_path):
    # Step3's moe_top_k was unread (refused), and reading it alone would take 64 KV heads for its one KV group
    text = {"model_type": "step3_text", "hidden_size": 7168, "intermediate_size": 18432, "num_attention_heads": 64,
            "num_attention_groups": 1, "num_hidden_layers": 61, "moe_num_experts": 48, "moe_top_k": 3,
            "moe_intermediate_size": 5120, "share_expert_dim": 5120, "head_dim": 256}
    cfg = {"architectures": ["Step3VLForConditionalGeneration"], "model_type": "step3_vl", "text_config": text}
    assert _shape(_load(tmp_path, "step3", cfg)) == (61, 7168, 64, 1, 256, 48, 3, 5120, 1, 5120)


def test_jetmoe_head_size_is_kv_channels(tmp_path):
    from kernel_gym.zoo import ZOO

    cfg = {"architectures": ["JetMoEForCausalLM"], "model_type": "jetmoe", "hidden_size": 2048, "num_hidden_layers": 24,
           "num_attention_heads": 32, "num_key_value_heads": 16, "kv_channels": 128, "num_local_experts": 8,
           "num_experts_per_tok": 2, "intermediate_size": 5632}
    assert _shape(_load(tmp_path, "jetmoe-8b", cfg))[:8] == _shape(ZOO["jetmoe-8b"])[:8]  # head_dim was 2048 / 32


def test_use_mla_false_is_not_latent_attention(tmp_path):
    cfg = {"model_type": "deepseek_v2", "hidden_size": 1280, "num_hidden_layers": 12, "num_attention_heads": 10,
           "num_key_value_heads": 10, "n_routed_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 896,
           "n_shared_experts": 2, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 128, "use_mla": False}
    spec = _load(tmp_path, "deepseek-vl2-tiny", cfg)
    assert (spec.attention, spec.head_dim, spec.kv_lora_rank) == ("gqa", 128, 0)  # was read as MLA


@pytest.mark.parametrize("name, cfg, said", [
    ("DeepSeek-V3", {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
                     "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256,
                     "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1,
                     "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                     "v_head_dim": 128},  # no intermediate_size: the 3 dense layers' width is unknown
     r"58 MoE layers \(first_k_dense_replace\), counted as such; not modelled: 3 dense-MLP layers"),
    ("Jamba-1.5-Large", {"model_type": "jamba", "hidden_size": 8192, "intermediate_size": 24576,
                         "num_hidden_layers": 72, "num_attention_heads": 64, "num_key_value_heads": 8,
                         "num_experts": 16, "num_experts_per_tok": 2, "attn_layer_period": 8, "attn_layer_offset": 4,
                         "expert_layer_period": 2, "expert_layer_offset": 1},
     r"36 MoE layers \(expert_layer_period\) and 9 full-attention layers .* 63 layers without full attention"),
    ("Qwen3-Next", {**QWEN3_30B, "num_experts": 512, "full_attention_interval": 4},
     r"12 full-attention layers \(full_attention_interval\)"),
])
def test_dense_and_non_attention_layers_are_said(tmp_path, name, cfg, said):
    # all layers were priced as attention + MoE without a word: Maverick's experts twice over, Jamba's KV cache 8 times;
    # the counts are modelled now (tests/test_layer_kinds.py: Maverick reads without a warning), and what is not is said
    with pytest.warns(SpecWarning, match=said):
        spec = _load(tmp_path, name, cfg, quiet=False)
    assert spec.num_layers == cfg.get("num_hidden_layers", 48)
    _load(tmp_path, "qwen3", QWEN3_30B)  # every layer MoE and attention: nothing to say


def test_engine_versions_as_pip_writes_them_name_the_release_to_use():
    from kernel_gym.kernels.vllm_tables import parse_engine

    assert parse_engine("vllm-0.34.0+cu128").id == "vllm-0.34.0"  # a local build of the release: was refused
    for text, nearest in (("vllm-0.34.0rc1", "vllm-0.34.0"), ("vllm-0.34.0.dev123+gabc", "vllm-0.34.0"),
                          ("vllm-0.35.0", "vllm-0.34.0"), ("vllm-nightly", "vllm-0.34.0"),
                          ("vllm-0.33.0.post1", "vllm-0.33.0"), ("vllm-0.8.5", "vllm-0.33.0"),
                          ("sglang-0.6.0", "sglang-0.5.23")):
        with pytest.raises(ValueError, match=rf"nearest yours \({nearest} for "):
            parse_engine(text)  # was "name the known release nearest yours", naming none


def test_quantized_experts_get_no_engine_file_and_a_plan_says_what_the_engine_runs(tmp_path, capsys):
    """An AWQ / GPTQ / mxfp4 checkpoint: the engines run another MoE kernel, so an exported bf16 file would never be
    read. It was written with a warning only; now export refuses and names the fix, plan names no file."""
    from dataclasses import replace

    from kernel_gym.cli import main
    from kernel_gym.models import spec_caveats
    from kernel_gym.parallel.deploy import Deployment, moe_config_files

    awq = {**QWEN3_30B, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    spec = _load(tmp_path, "qwen3-awq", awq, quiet=False)
    assert spec.expert_quant == "awq" and any("awq-quantized" in line for line in spec_caveats(spec))
    fp8 = _load(tmp_path, "qwen3-fp8", {**QWEN3_30B, "quantization_config": {"quant_method": "fp8"}})
    assert (fp8.expert_quant, fp8.dtype_bytes) == ("", 1)
    path = str(tmp_path / "qwen3-awq" / "config.json")
    assert main(["export", "--model", path, "--format", "vllm", "--out", str(tmp_path / "out")]) == 2
    assert "awq-quantized" in capsys.readouterr().err and not list((tmp_path / "out").glob("E=*.json"))
    from kernel_gym.deploy.engine_export import engine_dtype

    with pytest.raises(ValueError, match="awq-quantized.*drop quantization_config"):
        engine_dtype(spec)
    files = moe_config_files(spec, Deployment("vllm", 1, 1, 1, 16, 8192, 256, 512))
    assert files[0]["file"].startswith("none for awq experts")
    assert engine_dtype(replace(spec, expert_quant="")) == "bfloat16"
    with pytest.raises(ValueError, match="expert_quant"):
        replace(spec, expert_quant="awq; rm -rf")


def test_a_policy_logged_before_a_spec_field_existed_still_matches_its_model():
    """Stored provenance lists model specs as they were logged; a field added to ModelSpec since (at its default)
    must not turn the policy into one 'trained for another model'."""
    from dataclasses import asdict

    from kernel_gym.deploy.export import check_policy_model
    from kernel_gym.models import load_model

    model = load_model("mixtral-8x7b")
    old = {k: v for k, v in asdict(model).items() if k != "expert_quant"}
    line = check_policy_model("fused_moe", {"model_uri": "models:/p/1", "model_specs": [old]}, model)
    assert "mixtral-8x7b" in line
    # the same config.json read before the reader counted layer kinds (GLM-4.5: 89 MoE layers of 92): same kernels
    from dataclasses import replace

    now = replace(model, moe_layers=30, dense_intermediate=14336, num_shared_experts=1)
    assert "mixtral-8x7b" in check_policy_model("fused_moe", {"model_uri": "models:/p/1", "model_specs": [old]}, now)
    with pytest.raises(ValueError, match="trained for model mixtral-8x7b with other hidden, not mixtral-8x7b"):
        check_policy_model("fused_moe", {"model_uri": "models:/p/1", "model_specs": [old]}, replace(now, hidden=2048))


def test_fp8_checkpoints_under_other_method_names_are_fp8():
    """Llama-4-Maverick-FP8 writes fbgemm_fp8, llm-compressor checkpoints compressed-tensors with float 8-bit
    weight groups: both were classed as 'another MoE kernel' at 2 bytes a weight, where the engines run fp8_w8a8."""
    import tempfile

    for quant in ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0},
                  {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
                      "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                      "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}}):
        with tempfile.TemporaryDirectory() as d:
            spec = _load(Path(d), "m", {**QWEN3_30B, "quantization_config": quant})
        assert (spec.dtype_bytes, spec.expert_quant) == (1, "")
    with tempfile.TemporaryDirectory() as d:  # 4-bit integer groups stay another kernel
        int4 = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4,
                                                                                            "type": "int"}}}}
        spec = _load(Path(d), "m", {**QWEN3_30B, "quantization_config": int4}, quiet=False)
    assert (spec.dtype_bytes, spec.expert_quant) == (2, "compressed-tensors")
