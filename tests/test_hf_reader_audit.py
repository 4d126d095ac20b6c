"""spec_from_hf_config against the published config.json of recent MoE and hybrid models the other tests do not cover,
each field checked by hand against what vLLM serves. Before, Kimi-Linear's config was refused (its top-k key is
num_experts_per_token) and, read, would have counted its 20 KDA layers as MLA with head_dim 72; LFM2's 2 dense-MLP
layers were priced as MoE; Ring-linear's 16 lightning-attention layers held KV cache and no state. Each config holds
only the keys the reader could use (plus the architecture), copied from the file at the URL in its comment."""

from __future__ import annotations

import warnings

import pytest

from kernel_gym.modelspec import ModelSpec, SpecWarning, spec_from_hf_config
from kernel_gym.zoo import ZOO

# https://huggingface.co/Qwen/Qwen3.5-35B-A3B/blob/main/config.json (text_config; 3 linear_attention : 1 full)
QWEN35_35B = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", "text_config": {
    "model_type": "qwen3_5_moe_text", "dtype": "bfloat16", "hidden_size": 2048, "num_hidden_layers": 40,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "num_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "full_attention_interval": 4,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "mamba_ssm_dtype": "float32"}}
# https://huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct/blob/main/config.json (KDA layers 1-based)
KIMI_LINEAR = {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "dtype": "bfloat16",
               "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 27, "num_attention_heads": 32,
               "num_key_value_heads": 32, "head_dim": 72, "kv_lora_rank": 512, "q_lora_rank": None,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
               "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1, "moe_intermediate_size": 1024,
               "first_k_dense_replace": 1, "moe_layer_freq": 1,
               "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128,
                                      "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23,
                                                     25, 26], "num_heads": 32, "short_conv_kernel_size": 4}}
# https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16/blob/main/config.json
NEMOTRON3_NANO = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "torch_dtype": "bfloat16",
                  "hidden_size": 2688, "num_hidden_layers": 52, "num_attention_heads": 32, "num_key_value_heads": 2,
                  "head_dim": 128, "intermediate_size": 1856, "n_routed_experts": 128, "num_experts_per_tok": 6,
                  "moe_intermediate_size": 1856, "n_shared_experts": 1, "moe_shared_expert_intermediate_size": 3712,
                  "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
                  "mamba_num_heads": 64, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
                  "mamba_ssm_cache_dtype": "float32"}
# https://huggingface.co/ibm-granite/granite-4.0-h-tiny/blob/main/config.json
GRANITE4_H_TINY = {"architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
                   "torch_dtype": "bfloat16", "hidden_size": 1536, "num_hidden_layers": 40, "num_attention_heads": 12,
                   "num_key_value_heads": 4, "intermediate_size": 512, "shared_intermediate_size": 1024,
                   "num_local_experts": 64, "num_experts_per_tok": 6, "mamba_d_state": 128, "mamba_n_groups": 1,
                   "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_expand": 2, "mamba_d_conv": 4,
                   "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 9
                   + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 4}
# https://huggingface.co/MiniMaxAI/MiniMax-M2/blob/main/config.json (attn_type_list all 1: every layer softmax)
MINIMAX_M2 = {"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "hidden_size": 3072,
              "intermediate_size": 1536, "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8,
              "head_dim": 128, "num_local_experts": 256, "num_experts_per_tok": 8, "shared_intermediate_size": 0,
              "attn_type_list": [1] * 62, "quantization_config": {"quant_method": "fp8", "fmt": "float8_e4m3fn",
                                                                  "weight_block_size": [128, 128]}}
# https://huggingface.co/zai-org/GLM-4.6/blob/main/config.json
GLM46 = {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "torch_dtype": "bfloat16",
         "hidden_size": 5120, "intermediate_size": 12288, "num_hidden_layers": 92, "num_attention_heads": 96,
         "num_key_value_heads": 8, "head_dim": 128, "n_routed_experts": 160, "num_experts_per_tok": 8,
         "n_shared_experts": 1, "moe_intermediate_size": 1536, "first_k_dense_replace": 3}
# https://huggingface.co/deepseek-ai/DeepSeek-V3.2-Exp/blob/main/config.json
DEEPSEEK_V32 = {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "torch_dtype": "bfloat16",
                "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61, "num_attention_heads": 128,
                "num_key_value_heads": 128, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256, "num_experts_per_tok": 8,
                "n_shared_experts": 1, "moe_intermediate_size": 2048, "first_k_dense_replace": 3,
                "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64,
                "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}
# https://huggingface.co/inclusionAI/Ring-mini-linear-2.0/blob/main/config.json (every 5th layer softmax attention)
RING_MINI_LINEAR = {"architectures": ["BailingMoeLinearV2ForCausalLM"], "model_type": "bailing_moe_linear",
                    "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 20, "num_attention_heads": 16,
                    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 256, "num_experts_per_tok": 8,
                    "num_shared_experts": 1, "moe_intermediate_size": 512, "moe_shared_expert_intermediate_size": 512,
                    "first_k_dense_replace": 1, "layer_group_size": 5, "group_norm_size": 4}
# https://huggingface.co/LiquidAI/LFM2-8B-A1B/blob/main/config.json (short-conv and attention layers)
LFM2_8B = {"architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "hidden_size": 2048,
           "intermediate_size": 7168, "moe_intermediate_size": 1792, "num_hidden_layers": 24, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_dense_layers": 2, "num_experts": 32, "num_experts_per_tok": 4,
           "conv_L_cache": 3, "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "conv",
                                              "full_attention", "conv", "conv", "conv", "full_attention", "conv",
                                              "conv", "conv", "full_attention", "conv", "conv", "conv",
                                              "full_attention", "conv", "conv", "full_attention", "conv", "conv"]}
# https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json
GPT_OSS_120B = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "torch_dtype": "bfloat16",
                "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
                "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4,
                "experts_per_token": 4, "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"] * 18,
                "quantization_config": {"quant_method": "mxfp4"}}
# https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E-Instruct/blob/main/config.json (text_config)
LLAMA4_SCOUT = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": {
    "model_type": "llama4_text", "torch_dtype": "bfloat16", "hidden_size": 5120, "intermediate_size": 8192,
    "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
    "head_dim": 128, "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
    "attention_chunk_size": 8192}}
# https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
QWEN3_30B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "torch_dtype": "bfloat16",
             "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
             "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": []}
# https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json
QWEN3_235B = {**QWEN3_30B, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
              "num_hidden_layers": 94, "num_attention_heads": 64}
# https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "torch_dtype": "bfloat16",
           "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None}

GDN_35 = (2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 4  # Qwen3.5: conv over q, k, v; fp32 state (its config)
KDA = 3 * 32 * 128 * 3 * 2 + 32 * 128 * 128 * 4  # q, k, v conv states over 32 x 128, a float32 128^2 state per head
MAMBA2_NANO = (64 * 64 + 2 * 8 * 128) * 3 * 2 + 64 * 64 * 128 * 4  # conv over x, B, C; float32 SSM state
MAMBA2_TINY = (48 * 64 + 2 * 1 * 128) * 3 * 2 + 48 * 64 * 128 * 2  # Granite: SSM state at bf16 (no cache dtype set)
LIGHTNING_RING = 16 * 128 * 128 * 2  # one 128 x 128 state per head
WINDOW_OSS = 2 * 8 * 64 * 128 * 2  # K and V of 128 tokens, 8 KV heads of 64
CHUNK_LLAMA4 = 2 * 8 * 128 * 8192 * 2  # K and V of an 8,192-token chunk, 8 KV heads of 128

FIELDS = ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "num_experts", "top_k", "intermediate",
          "dtype_bytes", "num_shared_experts", "shared_width", "attention", "kv_lora_rank", "rope_head_dim",
          "n_moe_layers", "n_attention_layers", "dense_intermediate", "mixer_state_bytes", "mixer", "n_mixer_layers")
# name, config, the FIELDS as vLLM serves the model, a phrase its SpecWarning must hold ("" : none expected)
CASES = [
    ("qwen3.5-35b-a3b", QWEN35_35B, (40, 2048, 16, 2, 256, 256, 8, 512, 2, 1, 512, "gqa", 0, 0, 40, 10, 0, 30 * GDN_35,
                                     "gated-deltanet", 30), "Gated DeltaNet"),
    ("kimi-linear-48b-a3b", KIMI_LINEAR, (27, 2304, 32, 32, 128, 256, 8, 1024, 2, 1, 1024, "mla", 512, 64, 26, 7, 9216,
                                          20 * KDA, "gated-deltanet", 20), "linear_attn_config.kda_layers"),
    ("nemotron-3-nano-30b-a3b", NEMOTRON3_NANO, (52, 2688, 32, 2, 128, 128, 6, 1856, 2, 1, 3712, "gqa", 0, 0, 23, 6, 0,
                                                 23 * MAMBA2_NANO, "mamba2", 23), "Mamba-2"),
    ("granite-4.0-h-tiny", GRANITE4_H_TINY, (40, 1536, 12, 4, 128, 64, 6, 512, 2, 1, 1024, "gqa", 0, 0, 40, 4, 0,
                                             36 * MAMBA2_TINY, "mamba2", 36), "Mamba-2"),
    ("minimax-m2", MINIMAX_M2, (62, 3072, 48, 8, 128, 256, 8, 1536, 1, 0, 0, "gqa", 0, 0, 62, 62, 0, 0, "", 0), ""),
    ("glm-4.6", GLM46, (92, 5120, 96, 8, 128, 160, 8, 1536, 2, 1, 1536, "gqa", 0, 0, 89, 92, 12288, 0, "", 0), ""),
    ("deepseek-v3.2-exp", DEEPSEEK_V32, (61, 7168, 128, 128, 128, 256, 8, 2048, 1, 1, 2048, "mla", 512, 64, 58, 61,
                                         18432, 0, "", 0), "sparse attention over the top 2048 keys"),
    ("ring-mini-linear-2.0", RING_MINI_LINEAR, (20, 2048, 16, 4, 128, 256, 8, 512, 2, 1, 512, "gqa", 0, 0, 19, 4, 5120,
                                                16 * LIGHTNING_RING, "lightning", 16), "lightning attention"),
    ("lfm2-8b-a1b", LFM2_8B, (24, 2048, 32, 8, 64, 32, 4, 1792, 2, 0, 0, "gqa", 0, 0, 22, 6, 7168, 0, "", 18),
     "kernels and state are not priced"),
    ("gpt-oss-120b", GPT_OSS_120B, (36, 2880, 64, 8, 64, 128, 4, 2880, 2, 0, 0, "gqa", 0, 0, 36, 18, 0, 18 * WINDOW_OSS,
                                    "sliding-window", 18), "mxfp4"),
    ("llama-4-scout", LLAMA4_SCOUT, (48, 5120, 40, 8, 128, 16, 1, 8192, 2, 1, 8192, "gqa", 0, 0, 48, 12, 0,
                                     36 * CHUNK_LLAMA4, "chunked-local", 36), ""),  # every 4th layer global (NoPE)
    ("qwen3-30b-a3b", QWEN3_30B, (48, 2048, 32, 4, 128, 128, 8, 768, 2, 0, 0, "gqa", 0, 0, 48, 48, 0, 0, "", 0), ""),
    ("qwen3-235b-a22b", QWEN3_235B, (94, 4096, 64, 4, 128, 128, 8, 1536, 2, 0, 0, "gqa", 0, 0, 94, 94, 0, 0, "", 0),
     ""),
    ("mixtral-8x7b", MIXTRAL, (32, 4096, 32, 8, 128, 8, 2, 14336, 2, 0, 0, "gqa", 0, 0, 32, 32, 0, 0, "", 0), ""),
]


def _read(cfg: dict, name: str = "m") -> tuple[ModelSpec, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SpecWarning)
        spec = spec_from_hf_config(cfg, "config.json", name)
    return spec, [str(w.message) for w in caught]


@pytest.mark.parametrize("name,cfg,want,said", CASES, ids=[c[0] for c in CASES])
def test_each_published_config_reads_as_vllm_serves_the_model(name, cfg, want, said):
    spec, warned = _read(cfg, name)
    assert dict(zip(FIELDS, (getattr(spec, f) for f in FIELDS))) == dict(zip(FIELDS, want))
    if said:
        assert any(said in w for w in warned), warned
    else:
        assert not warned, warned
    if name in ZOO:  # the zoo's spec of the same model agrees on its weights (gpt-oss's keeps one layer kind)
        assert spec.weight_bytes == ZOO[name].weight_bytes


def test_the_hybrids_kv_cache_is_their_full_attention_layers_only():
    kimi, _ = _read(KIMI_LINEAR)  # 7 MLA layers of a 512 latent and a 64-wide rotary key, bf16
    assert kimi.kv_bytes_per_token == 7 * (512 + 64) * 2
    ring, _ = _read(RING_MINI_LINEAR)  # 4 softmax layers of 4 KV heads x 128
    assert ring.kv_bytes_per_token == 2 * 4 * 4 * 128 * 2
    assert ring.mixer_page_bytes == LIGHTNING_RING and kimi.mixer_page_bytes == KDA


def test_a_shared_expert_of_its_own_width_is_read_where_bailing_gives_one():
    spec, _ = _read({**RING_MINI_LINEAR, "moe_shared_expert_intermediate_size": 1024})  # vLLM's bailing_moe reads it
    assert (spec.num_shared_experts, spec.shared_width) == (1, 1024)


@pytest.mark.parametrize("cfg", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_a_missing_size_is_a_one_line_error_naming_its_key(cfg):
    inner = cfg.get("text_config", cfg)
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers"):
        broken = {k: v for k, v in inner.items() if k != key}
        with pytest.raises(ValueError, match=key) as err:
            _read({**cfg, "text_config": broken} if "text_config" in cfg else broken)
        assert "\n" not in str(err.value)


def test_a_config_that_is_not_an_object_is_refused_in_one_line():
    with pytest.raises(ValueError, match="is a JSON object, got list"):
        spec_from_hf_config([QWEN3_30B], "config.json", "m")
