"""ModelSpec, the built-in specs and their validation: the bottom of the spec floor, below both models.py and
zoo.py (the zoo builds its specs from ModelSpec; models.load_model looks names up in the zoo), so neither of
those two imports the other both ways. Imports only the standard library.
"""


from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# Upper bounds no real model reaches (the largest MoE models today: 384 experts, hidden 7168, 61 layers); a spec
# beyond them is a typo or a crafted file, and grids sized by it would exhaust memory.
SPEC_LIMITS = {"num_layers": 1024, "hidden": 131072, "num_heads": 1024, "num_kv_heads": 1024, "head_dim": 1024,
               "num_experts": 4096, "top_k": 256, "intermediate": 262144, "dtype_bytes": 4,
               "num_shared_experts": 64, "shared_intermediate": 262144, "kv_lora_rank": 16384, "rope_head_dim": 1024,
               "moe_layers": 1024, "attention_layers": 1024, "dense_intermediate": 262144,
               "mixer_state_bytes": 1 << 40, "mixer_layers": 1024, "max_context": 1 << 28, "fp8_block_n": 65536,
               "fp8_block_k": 65536}
OPTIONAL_ZERO = ("num_shared_experts", "shared_intermediate", "kv_lora_rank", "rope_head_dim", "moe_layers",
                 "attention_layers", "dense_intermediate", "mixer_state_bytes", "mixer_layers", "max_context",
                 "fp8_block_n", "fp8_block_k")
# ModelSpec.mixer's values and their names in messages. All but the windows hold a recurrent state whose size is fixed
# per layer: vLLM sizes its KV blocks so that one block of a layer holds it (deploy.engine_block_tokens). The windowed
# ones are softmax attention over the last `window_tokens` tokens (sliding) or within chunks of that many (chunked
# local: Llama-4's RoPE layers): their KV grows with a request up to the window, as vLLM's hybrid allocator holds it.
MIXERS = {"gated-deltanet": "Gated DeltaNet", "mamba2": "Mamba-2", "mamba": "Mamba", "lightning": "lightning attention",
          "sliding-window": "sliding-window attention", "chunked-local": "chunked local attention", "": "mixer"}
WINDOWED_MIXERS = ("sliding-window", "chunked-local")


# Its int field list has the shape of prefill_gluon's GluonVariant (duplicate scan): unrelated records.
@dataclass(frozen=True)
class ModelSpec:
    """Shape-defining numbers of a Mixture-of-Experts decoder."""

    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    top_k: int
    intermediate: int
    dtype_bytes: int = 2
    num_shared_experts: int = 0
    """Experts every token passes besides its top_k routed ones (DeepSeek, Qwen-MoE); not in the fused_moe kernel."""
    shared_intermediate: int = 0
    """Intermediate size of one shared expert (0: the routed experts' `intermediate`)."""
    attention: str = "gqa"
    """"gqa" (multi-head / grouped-query: what the attention kernels compute) or "mla" (latent attention: recorded,
    and its KV size counted, but the kernels still compute GQA over num_kv_heads x head_dim)."""
    kv_lora_rank: int = 0
    """MLA: width of the compressed KV latent per token (0 for gqa)."""
    rope_head_dim: int = 0
    """MLA: width of the decoupled rotary key per token (0 for gqa)."""
    expert_quant: str = ""
    """The experts' quantization method where it is neither a float dtype nor fp8 (mxfp4, awq, gptq, ...; "" for
    none): the engines run such experts through another MoE kernel than the one kernel_gym measures, so engine
    config files are not written for it (engine_export.engine_dtype)."""
    moe_layers: int = 0
    """Layers with the routed MoE (0: all num_layers). The others have a dense MLP of width dense_intermediate, or
    none counted where that is 0 (DeepSeek's first_k_dense_replace layers, Llama-4-Maverick's every other layer)."""
    attention_layers: int = 0
    """Layers with softmax attention over the KV cache (0: all num_layers). The others' mixers (Mamba, linear or
    sliding-window attention: Jamba, Qwen3-Next, Nemotron-H) hold no growing KV cache; their mixer kernels and state are
    not priced (the attention projections stand in for theirs)."""
    dense_intermediate: int = 0
    """Width of the dense MLP of the num_layers - moe_layers layers without MoE (0: none counted)."""
    mixer_state_bytes: int = 0
    """Bytes of state one running request holds in the layers without full attention, all of them together (Mamba's
    conv and SSM state, linear attention's recurrent state; a window's K and V when full): a fixed size per request,
    not per token, sliced by tensor parallelism. The simulators hold a recurrent state in the KV pool while the
    request runs and charge its read and write each step; a window's KV as the window holds it (window_tokens); 0:
    none counted."""
    mixer: str = ""
    """What those layers run (MIXERS): "gated-deltanet", "mamba2", "mamba", "lightning" (a recurrent state),
    "sliding-window" or "chunked-local" (softmax attention within a window: WINDOWED_MIXERS); "": not said, read as a
    recurrent state."""
    mixer_layers: int = 0
    """Layers that hold mixer_state_bytes (0: the num_layers - attention_layers without full attention; Nemotron-H's
    MoE-only layers hold none)."""
    max_context: int = 0
    """The longest request (prompt + output tokens) the model serves: config.json's max_position_embeddings, which
    vLLM and SGLang refuse a longer --max-model-len / --context-length than (0: not known). plan's context limit
    stays within it."""
    fp8_block_n: int = 0
    fp8_block_k: int = 0
    """An fp8 checkpoint's weight blocks (quantization_config.weight_block_size [n, k]: DeepSeek-V3's [128, 128]), 0
    for per-tensor or per-channel scales: the engines' fp8 fused-MoE config files carry it in their names
    (,block_shape=[n,k])."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or len(self.name) > 200:
            raise ValueError(f"model spec name must be a non-empty string of at most 200 characters, got {self.name!r}")
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type != "int":
                continue
            low = 0 if field.name in OPTIONAL_ZERO else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                kind = "a non-negative" if low == 0 else "a positive"
                raise ValueError(f"model spec {self.name!r}: {field.name} must be {kind} integer, got {value!r}")
            if value > SPEC_LIMITS.get(field.name, 1 << 20):
                raise ValueError(f"model spec {self.name!r}: {field.name}={value} is beyond any real model (limit "
                                 f"{SPEC_LIMITS.get(field.name, 1 << 20)}): check the spec")
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"model spec {self.name!r}: dtype_bytes must be 1, 2 or 4 (fp8, bf16/fp16, fp32), got "
                             f"{self.dtype_bytes}")
        if not isinstance(self.expert_quant, str) or len(self.expert_quant) > 40 or (
                self.expert_quant and not self.expert_quant.replace("_", "").replace("-", "").isalnum()):
            raise ValueError(f"model spec {self.name!r}: expert_quant must be a quantization method's name such as "
                             f"\"awq\" (or \"\" for none), got {self.expert_quant!r}")
        if bool(self.fp8_block_n) != bool(self.fp8_block_k) or (self.fp8_block_n and self.dtype_bytes != 1):
            raise ValueError(f"model spec {self.name!r}: fp8_block_n / fp8_block_k are an fp8 checkpoint's weight "
                             "blocks: set both with dtype_bytes 1, or leave both 0, got "
                             f"{self.fp8_block_n} / {self.fp8_block_k} with dtype_bytes {self.dtype_bytes}")
        if self.attention not in ("gqa", "mla"):
            raise ValueError(f"model spec {self.name!r}: attention must be \"gqa\" or \"mla\", got {self.attention!r}")
        if self.attention == "gqa" and (self.kv_lora_rank or self.rope_head_dim):
            raise ValueError(f"model spec {self.name!r}: kv_lora_rank / rope_head_dim are MLA fields: set "
                             "\"attention\": \"mla\" or leave them 0")
        if self.attention == "mla" and not self.kv_lora_rank:
            raise ValueError(f"model spec {self.name!r}: attention \"mla\" needs kv_lora_rank (the KV latent width)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model spec {self.name!r}: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.top_k > self.num_experts:
            raise ValueError(f"model spec {self.name!r}: top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        if self.mixer not in MIXERS:
            raise ValueError(f"model spec {self.name!r}: mixer must be one of {sorted(MIXERS)}, got {self.mixer!r}")
        if self.mixer in WINDOWED_MIXERS and (not self.attention_layers or not self.n_mixer_layers
                                              or self.mixer_state_bytes % (self.n_mixer_layers
                                                                           * self.layer_kv_bytes_per_token)):
            raise ValueError(f"model spec {self.name!r}: a {MIXERS[self.mixer]} mixer needs attention_layers (the "
                             "full-attention layers, fewer than num_layers) and mixer_state_bytes = the window's K and "
                             "V in all its layers (layers x window tokens x one token's KV in one layer), got "
                             f"mixer_state_bytes={self.mixer_state_bytes}")
        for field in ("moe_layers", "attention_layers", "mixer_layers"):
            if getattr(self, field) > self.num_layers:
                raise ValueError(f"model spec {self.name!r}: {field} ({getattr(self, field)}) exceeds num_layers "
                                 f"({self.num_layers}); 0 means all layers")

    @property
    def n_moe_layers(self) -> int:
        """Layers that run the routed MoE (fused_moe)."""
        return self.moe_layers or self.num_layers

    @property
    def n_attention_layers(self) -> int:
        """Layers that run softmax attention over the KV cache (the prefill / decode attention kernels)."""
        return self.attention_layers or self.num_layers

    @property
    def n_dense_layers(self) -> int:
        """Layers with a dense MLP of width dense_intermediate instead of the MoE (0 where that width is 0)."""
        return self.num_layers - self.n_moe_layers if self.dense_intermediate else 0

    @property
    def n_mixer_layers(self) -> int:
        """Layers that hold the mixer state (mixer_layers, else every layer without full attention)."""
        return self.mixer_layers or self.num_layers - self.n_attention_layers

    @property
    def mixer_page_bytes(self) -> int:
        """One request's mixer state in one layer (vLLM's mamba page; 0 where none is counted)."""
        return -(-self.mixer_state_bytes // max(1, self.n_mixer_layers))

    @property
    def window_tokens(self) -> int:
        """Tokens a windowed mixer's layers attend over (WINDOWED_MIXERS: the sliding window or the chunk), read off
        mixer_state_bytes, the full window's K and V in n_mixer_layers layers; 0 for any other mixer."""
        if self.mixer not in WINDOWED_MIXERS or not self.mixer_state_bytes:
            return 0
        return max(1, self.mixer_state_bytes // (self.n_mixer_layers * self.layer_kv_bytes_per_token))

    @property
    def layer_kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token in one attention layer."""
        if self.attention == "mla":
            return (self.kv_lora_rank + self.rope_head_dim) * self.activation_bytes
        return 2 * self.num_kv_heads * self.head_dim * self.activation_bytes

    @property
    def uniform_layers(self) -> bool:
        """Every layer is attention + MoE (the defaults): the consumers keep their one-layer-kind arithmetic, so
        every published figure of such a spec is what it was before layer kinds were counted."""
        return self.n_moe_layers == self.n_attention_layers == self.num_layers

    @property
    def expert_weight_bytes(self) -> int:
        """Bytes of one expert's gate/up and down weights (3 matrices hidden x intermediate)."""
        return 3 * self.hidden * self.intermediate * self.dtype_bytes

    @property
    def activation_bytes(self) -> int:
        """Bytes of one activation or KV-cache element: an fp8 checkpoint (dtype_bytes 1) computes and caches in bf16
        (the engines' default kv-cache dtype "auto" follows the activations), so 2 there; else dtype_bytes."""
        return 2 if self.dtype_bytes == 1 else self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across the attention layers (K and V; MLA: the latent plus the rotary
        key); the other layers' state (Mamba, linear attention) does not grow with the context and is not counted."""
        return self.n_attention_layers * self.layer_kv_bytes_per_token

    @property
    def shared_width(self) -> int:
        """Width of the dense MLP the shared experts form in each MoE layer (0: none): every token passes it, outside
        the fused-MoE kernel (vLLM and SGLang run DeepSeek's n shared experts as one MLP n x as wide)."""
        return self.num_shared_experts * (self.shared_intermediate or self.intermediate)

    def weight_parts(self) -> dict[str, tuple[int, int]]:
        """(layers, parameters per layer) of each part of the weights: the attention projections in every layer
        (they stand in for a Mamba or linear-attention mixer's in and out projections), the router, routed experts and
        shared experts in the MoE layers, the dense MLP in the dense layers. weight_bytes sums them;
        parallel.layout.gpu_weight_bytes splits each over the GPUs that share it."""
        qkv = self.hidden * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        moe = self.n_moe_layers
        return {"attention": (self.num_layers, qkv + self.num_heads * self.head_dim * self.hidden),
                "router": (moe, self.hidden * self.num_experts),
                "experts": (moe, self.num_experts * 3 * self.hidden * self.intermediate),
                "shared": (moe, 3 * self.hidden * self.shared_width),
                "dense": (self.n_dense_layers, 3 * self.hidden * self.dense_intermediate)}

    @property
    def weight_bytes(self) -> int:
        """Approximate parameter bytes (weight_parts summed; integers: the defaults give num_layers x (attention +
        MoE) exactly)."""
        return sum(layers * n for layers, n in self.weight_parts().values()) * self.dtype_bytes


BUILTIN_MODELS: dict[str, ModelSpec] = {
    "mixtral-8x7b": ModelSpec(
        name="mixtral-8x7b", num_layers=32, hidden=4096, num_heads=32, num_kv_heads=8, head_dim=128,
        num_experts=8, top_k=2, intermediate=14336, max_context=32768,
    ),
    "olmoe-1b-7b": ModelSpec(
        name="olmoe-1b-7b", num_layers=16, hidden=2048, num_heads=16, num_kv_heads=16, head_dim=128,
        num_experts=64, top_k=8, intermediate=1024, max_context=4096,
    ),
}


def window_pool_bytes(spec: Any, free_bytes: float, ratio: float) -> float:
    """Of `free_bytes` of KV memory, the bytes a windowed mixer's own pool takes when it holds `ratio` x as many
    tokens as the full layers' pool (SGLang's hybrid SWA pool, --swa-full-tokens-ratio); 0 without a window or a
    ratio. A token costs spec.kv_bytes_per_token in the full layers' pool and mixer_state_bytes / window_tokens in
    the window's, so the window's share is ratio x that / (kv_bytes_per_token + ratio x that)."""
    window = int(getattr(spec, "window_tokens", 0) or 0)
    if not ratio or not window:
        return 0.0
    w = spec.mixer_state_bytes / window * float(ratio)
    return float(free_bytes) * w / (spec.kv_bytes_per_token + w)


def spec_from_dict(data: object, where: str = "model spec") -> ModelSpec:
    """A ModelSpec from a JSON object, every field checked (one-line errors naming `where`)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a model spec is a JSON object with the fields of kernel_gym.models.ModelSpec")
    fields = dataclasses.fields(ModelSpec)
    names = {f.name for f in fields}
    optional = {f.name for f in fields if f.default is not dataclasses.MISSING}
    missing = names - set(data) - optional
    unknown = set(data) - names
    if missing or unknown:
        raise ValueError(
            f"{where}: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}; expected {sorted(names)}"
        )
    return ModelSpec(**data)


# the routed expert count and top-k, by model family (ERNIE-4.5: moe_num_experts, moe_k; Hunyuan: moe_topk; gpt-oss
# also writes experts_per_token; DBRX and Step3: moe_top_k; Kimi-Linear: num_experts_per_token)
HF_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
HF_TOP_K_KEYS = ("num_experts_per_tok", "moe_k", "moe_topk", "experts_per_token", "moe_top_k", "num_experts_per_token")
HF_READ_KEYS = {*HF_EXPERT_KEYS, *HF_TOP_K_KEYS, "n_shared_experts", "num_shared_experts", "moe_num_shared_experts",
                "num_shared_expert"}
# where a multimodal or omni wrapper keeps its language model's config (Llama-4, Kimi-VL: text_config; InternVL:
# llm_config; DeepSeek-VL2: language_config; Qwen3-Omni: thinker_config.text_config)
HF_NESTS = ("text_config", "llm_config", "language_config", "thinker_config")
# other names of the same numbers (DBRX: d_model, n_heads, n_layers, attn_config.kv_n_heads, ffn_config.*; Step3:
# num_attention_groups KV heads; JetMoE: kv_channels, the head size), read where the usual key is absent
HF_ALIASES = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
              "kv_n_heads": "num_key_value_heads", "num_attention_groups": "num_key_value_heads",
              "ffn_hidden_size": "intermediate_size", "kv_channels": "head_dim"}


def hf_language_config(data: dict) -> dict:
    """The language model's keys of a config.json, flat: a wrapper's nested config (HF_NESTS) over its top level,
    DBRX's attn_config / ffn_config merged in, and the HF_ALIASES names under their usual keys. Without this a
    wrapped or DBRX MoE config was called 'not a mixture-of-experts model'."""
    cfg = data
    while (key := next((k for k in HF_NESTS if isinstance(cfg.get(k), dict)), None)) is not None:
        cfg = {**{k: v for k, v in cfg.items() if k not in HF_NESTS}, **cfg[key]}
    for key in ("attn_config", "ffn_config"):
        if isinstance(cfg.get(key), dict):
            cfg = {**cfg[key], **cfg}
    return {**{new: cfg[old] for old, new in HF_ALIASES.items() if old in cfg and new not in cfg}, **cfg}


def _layer_indices(cfg: dict, layers: int) -> tuple[list[int] | None, list[int] | None, str, str]:
    """(MoE layers, full-attention layers, the keys that say each) of a config.json whose layers are not all attention
    + MoE; None where every layer is. Each family's rule as its modelling code applies it; a value of another type
    than the family writes is left unread."""
    def get(key: str, default=None, kind: type = int):
        value = cfg.get(key)
        return value if isinstance(value, kind) and not isinstance(value, bool) else default

    moe = att = None
    keys: list[str] = []  # those of the MoE layers, then of the attention layers
    akeys: list[str] = []
    pattern = get("hybrid_override_pattern", kind=str)  # Nemotron-H: a mixer per layer, M(amba) E(MoE) *(attention)
    if pattern:
        moe, att = [i for i, c in enumerate(pattern) if c == "E"], [i for i, c in enumerate(pattern) if c == "*"]
        keys.append("hybrid_override_pattern")
        akeys.append("hybrid_override_pattern")
    if get("first_k_dense_replace") is not None or get("moe_layer_freq") is not None:  # DeepSeek, GLM, Kimi, Ling
        k, freq = get("first_k_dense_replace", 0), max(1, get("moe_layer_freq", 1))
        moe = [i for i in range(layers) if i >= k and i % freq == 0]
        keys.append("first_k_dense_replace")
    if get("decoder_sparse_step") is not None or get("mlp_only_layers", kind=list):  # Qwen-MoE
        step, dense = max(1, get("decoder_sparse_step", 1)), set(get("mlp_only_layers", [], list))
        moe = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
        keys.append("decoder_sparse_step / mlp_only_layers")
    if get("moe_layers", kind=list) or get("interleave_moe_layer_step") is not None:  # Llama-4
        step = max(1, get("interleave_moe_layer_step", 1))
        moe = list(get("moe_layers", kind=list) or range(step - 1, layers, step))
        keys.append("interleave_moe_layer_step")
    if get("moe_layer_start_index") is not None or get("moe_layer_interval") is not None:  # ERNIE-4.5
        start, step, end = get("moe_layer_start_index", 0), max(1, get("moe_layer_interval", 1)), \
            get("moe_layer_end_index", -1)
        moe = [i for i in range(layers) if start <= i <= (end if end >= 0 else layers) and (i + 1) % step == 0]
        keys.append("moe_layer_start_index / moe_layer_interval")
    if get("moe_layer_frequency") is not None:  # Arctic
        moe = [i for i in range(layers) if (i + 1) % max(1, get("moe_layer_frequency")) == 0]
        keys.append("moe_layer_frequency")
    if get("expert_layer_period") is not None:  # Jamba
        moe = [i for i in range(layers) if i % max(1, get("expert_layer_period")) == get("expert_layer_offset", 1)]
        keys.append("expert_layer_period")
    if get("num_dense_layers") is not None:  # LFM2-MoE: its first num_dense_layers layers have a dense MLP
        moe = list(range(get("num_dense_layers"), layers))
        keys.append("num_dense_layers")
    if get("moe_layers_enum", kind=str):  # Step3: "4,5,...,59"
        moe = [int(x) for x in get("moe_layers_enum", kind=str).split(",") if x.strip().isdigit()]
        keys.append("moe_layers_enum")
    if get("attn_layer_period") is not None:  # Jamba: the other layers are Mamba
        att = [i for i in range(layers) if i % max(1, get("attn_layer_period")) == get("attn_layer_offset", 4)]
        akeys.append("attn_layer_period")
    if get("full_attention_interval") is not None:  # Qwen3-Next: the other layers are linear attention
        att = [i for i in range(layers) if (i + 1) % max(1, get("full_attention_interval")) == 0]
        akeys.append("full_attention_interval")
    if get("attn_type_list", kind=list):  # MiniMax-Text-01: 1 softmax attention, 0 lightning (linear)
        att = [i for i, t in enumerate(get("attn_type_list", kind=list)) if t == 1]
        akeys.append("attn_type_list")
    if get("layer_group_size") is not None and str(cfg.get("model_type", "")).startswith("bailing"):
        # Ring-linear: the last layer of each group and any layers past the last whole group are softmax attention,
        # the others linear (lightning) attention, as its modelling code places them
        group = max(1, get("layer_group_size"))
        att = [i for i in range(layers) if (i + 1) % group == 0 or i >= layers // group * group]
        akeys.append("layer_group_size")
    linear = get("linear_attn_config", {}, dict)  # Kimi-Linear: KDA layers listed 1-based, the others MLA
    kda = linear.get("kda_layers")
    if isinstance(kda, list) and kda and all(isinstance(i, int) and not isinstance(i, bool) for i in kda):
        base, kda = 0 if linear.get("kda_layer_index_base") == 0 else 1, set(kda)  # vLLM: layer_idx + 1 in kda_layers
        att = [i for i in range(layers) if i + base not in kda]
        akeys.append("linear_attn_config.kda_layers")
    if get("attention_chunk_size"):  # Llama-4: its RoPE layers attend within chunks, its NoPE layers (no_rope_layers
        rope = get("no_rope_layers", kind=list)  # 0, by default every 4th) over the whole context, as vLLM runs them
        att = [i for i, f in enumerate(rope) if not f] if rope else \
            [i for i in range(layers) if (i + 1) % max(1, get("no_rope_layer_interval", 4)) == 0]
        akeys.append("attention_chunk_size / no_rope_layers")
    types = [str(t) for t in get("layer_types", [], list)]  # Granite-4 hybrid: attention / mamba; gpt-oss: sliding
    if any(t not in ("attention", "full_attention") for t in types):
        att = [i for i, t in enumerate(types) if t in ("attention", "full_attention")]
        akeys.append("layer_types")
    def inside(idx: list[int] | None) -> list[int] | None:
        """The listed layers the model has (a list or pattern may run past num_hidden_layers), each once."""
        return None if idx is None else sorted({i for i in idx if 0 <= i < layers})

    return inside(moe), inside(att), ", ".join(keys), ", ".join(akeys)


def hf_mixer_state(cfg: dict, hidden: int, heads: int, kv_heads: int, head_dim: int, act_bytes: int) -> tuple[int, str]:
    """(bytes of state one request holds in one layer without full attention, the mixer: MIXERS) from the config's
    mixer keys, as vLLM sizes its state caches; (0, "") where the config names no mixer kernel_gym reads. Gated DeltaNet
    (Qwen3-Next, Qwen3.5): a conv state over q, k and v and a key x value state per value head; Kimi Delta Attention
    (Kimi-Linear's linear_attn_config): the same with as many key as value heads, its state float32 as vLLM keeps it;
    Mamba-2 (Nemotron-H, Granite-4 hybrid): a conv state over x, B and C and a head_dim x d_state state per head; Mamba
    (Jamba): the same over expand x hidden channels; lightning attention (MiniMax-Text-01, Ring-linear): a head_dim x
    head_dim state per head; sliding-window attention (gpt-oss) and Llama-4's chunked local attention: the window's
    (the chunk's) K and V. LFM2's short convolution is
    none of these: not read (its state, a few KiB per layer, is said not modelled). Conv state and KV at the
    activations' dtype (`act_bytes`), the SSM or recurrent state at `mamba_ssm_cache_dtype` (or `mamba_ssm_dtype`)
    where the config sets it, else float32 for Nemotron-H (vLLM's default for it) and the activations' dtype for the
    others."""
    def get(*keys: str) -> int:
        return next((cfg[k] for k in keys if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool)
                     and cfg[k] > 0), 0)

    ssm_dtype = str(cfg.get("mamba_ssm_cache_dtype") or cfg.get("mamba_ssm_dtype") or
                    ("float32" if str(cfg.get("model_type", "")).startswith("nemotron_h") else ""))
    ssm_bytes = HF_DTYPE_BYTES.get(ssm_dtype, act_bytes)
    linear = cfg.get("linear_attn_config") if isinstance(cfg.get("linear_attn_config"), dict) else {}
    kda_heads, kda_dim = (linear.get(k) for k in ("num_heads", "head_dim"))
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (kda_heads, kda_dim)):
        # Kimi Delta Attention: Gated DeltaNet's state with as many key as value heads (vLLM's kda_state_shape: q, k
        # and v conv states, a head_dim^2 state per head), the recurrent state always float32 (kda_state_dtype)
        conv = linear.get("short_conv_kernel_size")
        conv = conv if isinstance(conv, int) and not isinstance(conv, bool) and conv > 1 else 4
        return 3 * kda_heads * kda_dim * (conv - 1) * act_bytes + kda_heads * kda_dim * kda_dim * 4, "gated-deltanet"
    if get("linear_num_value_heads") and get("linear_key_head_dim"):
        nk, nv = get("linear_num_key_heads") or get("linear_num_value_heads"), get("linear_num_value_heads")
        dk, dv, conv = get("linear_key_head_dim"), get("linear_value_head_dim") or get("linear_key_head_dim"), \
            get("linear_conv_kernel_dim") or 4
        return (2 * nk * dk + nv * dv) * (conv - 1) * act_bytes + nv * dk * dv * ssm_bytes, "gated-deltanet"
    m_heads, m_dim = get("mamba_num_heads", "mamba_n_heads"), get("mamba_head_dim", "mamba_d_head")
    state = get("ssm_state_size", "mamba_d_state")
    if m_heads and m_dim and state:
        inner, groups, conv = m_heads * m_dim, get("n_groups", "mamba_n_groups") or 1, \
            get("conv_kernel", "mamba_d_conv") or 4
        return (inner + 2 * groups * state) * (conv - 1) * act_bytes + inner * state * ssm_bytes, "mamba2"
    if state:
        inner, conv = (get("mamba_expand") or 2) * hidden, get("mamba_d_conv", "conv_kernel") or 4
        return inner * (conv - 1) * act_bytes + inner * state * ssm_bytes, "mamba"
    if isinstance(cfg.get("attn_type_list"), list) or (
            get("layer_group_size") and str(cfg.get("model_type", "")).startswith("bailing")):  # Ring-linear too
        return heads * head_dim * head_dim * act_bytes, "lightning"
    if get("attention_chunk_size"):
        return 2 * kv_heads * head_dim * get("attention_chunk_size") * act_bytes, "chunked-local"
    if get("sliding_window") and any(str(t) == "sliding_attention" for t in cfg.get("layer_types") or ()):
        return 2 * kv_heads * head_dim * get("sliding_window") * act_bytes, "sliding-window"
    return 0, ""


def hf_layer_counts(cfg: dict, layers: int, where: str, mixer: tuple[int, str] = (0, "")) -> dict[str, Any]:
    """ModelSpec's moe_layers, attention_layers and dense_intermediate of a config.json whose layers are not all
    attention + MoE (all 0, the defaults, where they are), from each family's keys (_layer_indices). The dense
    layers' MLP width: Llama-4's intermediate_size_mlp, else intermediate_size (Nemotron-H's pattern gives each layer
    one mixer: its non-MoE layers have no MLP counted). What stays unmodelled is said once (SpecWarning): the other
    layers' mixers (Mamba, linear or sliding-window attention: their kernels are not priced, and their state only
    where `mixer` = (state bytes per layer, kind: hf_mixer_state) knows it), a dense MLP whose
    width the config does not give, a layer count of 0 (a spec counts 0 as all layers)."""
    moe, att, keys, akeys = _layer_indices(cfg, layers)
    moe = None if moe is None or len(moe) == layers else len(moe)
    att = None if att is None or len(att) == layers else len(att)
    out: dict[str, Any] = {"moe_layers": 0, "attention_layers": 0, "dense_intermediate": 0}
    said: list[str] = []
    pattern = cfg.get("hybrid_override_pattern") if isinstance(cfg.get("hybrid_override_pattern"), str) else ""
    if moe == 0:
        said.append(f"0 MoE layers ({keys}): expert weights and MoE time counted for all {layers} layers")
    elif moe is not None:
        out["moe_layers"] = moe
        width = next((cfg[k] for k in ("intermediate_size_mlp", "intermediate_size")
                      if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool) and cfg[k] > 0), 0)
        if pattern:
            mlp = pattern.count("-")
            if mlp:
                said.append(f"{mlp} dense-MLP layers (hybrid_override_pattern '-') not counted")
        elif width:
            out["dense_intermediate"] = width
        else:
            said.append(f"{layers - moe} dense-MLP layers ({keys}) not counted: the config gives no intermediate_size "
                        "(their width)")
    if att == 0:
        said.append(f"0 full-attention layers ({akeys}): KV cache counted for all {layers} layers")
    elif att is not None:
        out["attention_layers"] = att
        mixers = pattern.count("M") if pattern else layers - att  # Nemotron-H: its E and - layers have no mixer
        per_layer, kind = mixer
        if per_layer and kind in WINDOWED_MIXERS:  # softmax attention within a window: priced, no caveat
            out.update(mixer_state_bytes=mixers * per_layer, mixer=kind,
                       mixer_layers=mixers if mixers != layers - att else 0)
        elif per_layer:
            out.update(mixer_state_bytes=mixers * per_layer, mixer=kind,
                       mixer_layers=mixers if mixers != layers - att else 0)
            said.append(f"{mixers} layers without full attention ({akeys}: {MIXERS[kind]}) whose mixer kernels are not "
                        f"priced (the attention projections stand in for their projections); their state, "
                        f"{out['mixer_state_bytes'] / 2**20:.1f} MiB per request, is counted")
        else:
            said.append(f"{mixers} layers without full attention ({akeys}: Mamba, linear or sliding-window "
                        "attention) whose mixer kernels and state are not priced (the attention projections stand in "
                        "for their projections)")
    if said:
        import warnings

        counts = " and ".join([f"{moe} MoE layers ({keys})"] * (moe is not None)
                              + [f"{att} full-attention layers ({akeys})"] * (att is not None))
        warnings.warn(f"{where}: of its {layers} layers the model has {counts}, counted as such; not modelled: "
                      f"{'; '.join(said)} (docs/agent.md, Your own model)", SpecWarning, stacklevel=3)
    return out


HF_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def is_hf_config(data: object) -> bool:
    """A Hugging Face config.json rather than a ModelSpec: it names the architecture or its layers the HF way."""
    return isinstance(data, dict) and any(k in data for k in ("model_type", "architectures", "num_hidden_layers"))


def spec_from_hf_config(data: dict, where: str, name: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face MoE config.json, by the mapping docs/agent.md tables ("Your own model"): the
    routed experts, one expert's intermediate size, shared experts (DeepSeek's n_shared_experts, Qwen-MoE's one) and
    MLA where kv_lora_rank is set. A multimodal config's language part (hf_language_config) is the language model's;
    layers that are not all attention + MoE are counted (hf_layer_counts)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a Hugging Face config.json is a JSON object, got {type(data).__name__}")
    cfg = hf_language_config(data)

    def number(key: str) -> int | None:
        value = cfg.get(key)
        if value is None:
            return None
        if isinstance(value, list) and value and len(set(map(repr, value))) == 1:
            value = value[0]  # one value per layer, all equal (Hunyuan's moe_topk, moe_intermediate_size)
        elif isinstance(value, list) and value:
            raise ValueError(f"{where}: {key} holds several values ({sorted(set(map(repr, value)))}, per layer or "
                             "per modality): kernel_gym models one MoE shape per model; write the model as a ModelSpec "
                             "JSON with the language model's value (docs/agent.md, Your own model)")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: {key} must be an integer, got {value!r}: fix the config.json (a Hugging Face "
                             "config writes sizes and counts as JSON integers)")
        return value

    def need(*keys: str) -> int:
        for k in keys:
            value = number(k)
            if value is not None:
                return value
        # keys that may count experts or top-k under another name (a size such as moe_intermediate_size alone makes
        # no MoE): named, so that an unread family is not called dense
        expertish = sorted(k for k in cfg if ("expert" in k.lower() or k.lower().startswith("moe"))
                           and not k.lower().endswith("size") and k not in HF_READ_KEYS
                           and cfg[k] not in (None, 0, [], False)) if keys in (HF_EXPERT_KEYS, HF_TOP_K_KEYS) else []
        if keys == HF_EXPERT_KEYS and not expertish:
            why = "not a mixture-of-experts model (kernel_gym tunes MoE serving)"
        else:
            why = (f"its MoE fields {expertish[:8]} are not ones kernel_gym reads; " if expertish else "") + \
                "write the model as a ModelSpec JSON (docs/agent.md, Your own model)"
        raise ValueError(f"{where}: a Hugging Face config.json without {' or '.join(keys)}: {why}")

    experts = need(*HF_EXPERT_KEYS)  # first: a dense model is told so before anything else about its config
    if experts <= 1:
        raise ValueError(f"{where}: {experts} expert(s): not a mixture-of-experts model (kernel_gym tunes MoE serving)")
    hidden, heads = need("hidden_size"), need("num_attention_heads")
    if heads < 1:
        raise ValueError(f"{where}: num_attention_heads must be positive, got {heads}: fix the config.json")
    mla = number("kv_lora_rank") is not None and cfg.get("use_mla") is not False  # DeepSeek-VL2-Tiny: MHA
    # MLA: v_head_dim first (Kimi-Linear also writes head_dim 72, hidden / heads, a size no MLA head has)
    head_dim = (number("v_head_dim") if mla else None) or number("head_dim") or number("attention_head_dim")
    if head_dim is None and hidden % heads:  # hidden // heads would be a head size the model does not have
        raise ValueError(f"{where}: no head_dim, and hidden_size {hidden} is not a multiple of num_attention_heads "
                         f"{heads}: add the model's head_dim to the config.json")
    head_dim = head_dim or hidden // heads
    if number("n_shared_experts"):  # DeepSeek: shared experts as wide as a routed one (Nemotron-H: its own width)
        shared = need("n_shared_experts")
        shared_inter = need("moe_shared_expert_intermediate_size", "moe_intermediate_size")
    elif number("num_shared_experts"):  # Bailing / Ling, Kimi-Linear: the same, under another key (Ling may give
        shared = need("num_shared_experts")  # the shared expert its own width: vLLM's bailing_moe reads it)
        shared_inter = need("moe_shared_expert_intermediate_size", "moe_intermediate_size")
    elif number("moe_num_shared_experts"):  # ERNIE-4.5: the same, under another key
        shared, shared_inter = need("moe_num_shared_experts"), need("moe_intermediate_size")
    elif number("shared_expert_intermediate_size"):  # Qwen-MoE: one shared expert of its own width
        shared, shared_inter = 1, need("shared_expert_intermediate_size")
    elif number("num_shared_expert"):  # Hunyuan: the same, per layer (its shared MLP: moe width x count)
        shared, shared_inter = need("num_shared_expert"), need("moe_intermediate_size", "intermediate_size")
    elif number("shared_intermediate_size"):  # Granite-MoE shared / hybrid (MiniMax-M2 writes 0: none)
        shared, shared_inter = 1, need("shared_intermediate_size")
    elif number("share_expert_dim"):  # Step3
        shared, shared_inter = 1, need("share_expert_dim")
    elif str(cfg.get("model_type", "")).startswith("llama4"):  # Llama-4: one shared expert in every MoE layer,
        shared, shared_inter = 1, need("intermediate_size")  # as wide as a routed one; no key says so
    elif cfg.get("use_residual") is True and cfg.get("model_type") == "arctic":  # Arctic's residual MLP beside the
        shared, shared_inter = 1, hidden  # MoE in every MoE layer: a dense MLP of width hidden_size (vLLM arctic.py)
    else:
        shared, shared_inter = 0, 0
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    layers = need("num_hidden_layers")
    dtype_bytes, kv_heads = hf_weight_bytes(cfg, dtype, where), number("num_key_value_heads") or heads
    act_bytes = 2 if dtype_bytes == 1 else dtype_bytes  # the activations' dtype (ModelSpec.activation_bytes)
    kinds = hf_layer_counts(cfg, layers, where, hf_mixer_state(cfg, hidden, heads, kv_heads, head_dim, act_bytes))
    hf_attention_notes(cfg, layers, where)
    return ModelSpec(
        name=name, num_layers=layers, hidden=hidden, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, num_experts=experts,
        top_k=need(*HF_TOP_K_KEYS), intermediate=need("moe_intermediate_size", "intermediate_size"),
        dtype_bytes=dtype_bytes, expert_quant=hf_expert_quant(cfg), **hf_fp8_block(cfg, dtype_bytes, where),
        num_shared_experts=shared, shared_intermediate=shared_inter,
        attention="mla" if mla else "gqa", kv_lora_rank=need("kv_lora_rank") if mla else 0,
        rope_head_dim=(number("qk_rope_head_dim") or 0) if mla else 0,
        max_context=hf_max_context(cfg), **kinds)


def hf_max_context(cfg: dict) -> int:
    """The context limit a config.json gives its engine, as vLLM 0.34 derives it (config/model.py,
    _get_and_verify_max_len): the least of the length keys it has (max_position_embeddings; DBRX's max_seq_len), times
    the RoPE scaling factor for the scalings that do not already count it (linear, dynamic; not YaRN, LongRoPE or
    Llama-3's); 0 where it gives none."""
    lengths = [cfg[k] for k in HF_LENGTH_KEYS if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool)
               and cfg[k] > 0]
    if not lengths:
        return 0
    value = float(min(lengths))
    rope = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else cfg.get("rope_parameters")
    if isinstance(rope, dict):
        kind = str(rope.get("rope_type") or rope.get("type") or "default")
        factor = rope.get("factor")
        if kind not in HF_ROPE_SCALED and isinstance(factor, (int, float)) and not isinstance(factor, bool) \
                and factor > 0:
            value *= factor
    return int(min(value, SPEC_LIMITS["max_context"]))


HF_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                  "max_seq_length", "seq_len")  # vLLM's possible_keys for the model's length
HF_ROPE_SCALED = ("default", "su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def hf_attention_notes(cfg: dict, layers: int, where: str) -> None:
    """Say once (SpecWarning) which attention a config names that the spec counts as full attention over the context:
    DeepSeek's sparse attention (`index_topk`: an indexer picks the keys, and keeps a key cache of its own)."""
    said = []
    topk = cfg.get("index_topk")
    if isinstance(topk, int) and not isinstance(topk, bool) and topk > 0:
        said.append(f"sparse attention over the top {topk} keys an indexer picks (index_topk): attention is priced "
                    "over every key, and the indexer's own key cache is not counted")
    if said:
        import warnings

        warnings.warn(f"{where}: not modelled: {'; '.join(said)} (docs/agent.md, Your own model)", SpecWarning,
                      stacklevel=3)


class SpecWarning(UserWarning):
    """A spec was read, but part of the model it describes is not modelled (said once, on stderr)."""


def hf_weight_bytes(cfg: dict, dtype: str, where: str) -> int:
    """Bytes per weight of a Hugging Face config: its quantization_config's where kernel_gym models it (fp8: 1 byte,
    so the weights' memory is sized as deployed, with KV and activations in bf16: ModelSpec.activation_bytes; and the
    engines' fp8 MoE files are named), else torch_dtype's. Any
    other method (mxfp4, AWQ, GPTQ, ...) is counted at torch_dtype's size with a SpecWarning: its weights take less
    memory than counted, and the engine runs another MoE kernel than the bf16 one kernel_gym measures."""
    size = HF_DTYPE_BYTES.get(dtype, 2)
    quant = cfg.get("quantization_config")
    if not isinstance(quant, dict):
        return size
    method = str(quant.get("quant_method") or "").lower()
    if hf_fp8(quant):
        return 1
    import warnings

    warnings.warn(f"{where}: quantization_config {method or '(no quant_method)'!r} is not modelled: weights counted "
                  f"at {dtype} ({size} bytes each), more memory than they take (so less KV room), and the engine's "
                  "MoE kernel for these weights is not the bf16 one kernel_gym measures, so engine config files are "
                  "not written for it; for a bf16 deployment of this model drop quantization_config and the figures "
                  "hold as they are", SpecWarning, stacklevel=3)
    return size


FP8_METHODS = ("fp8", "fbgemm_fp8", "ptpc_fp8")  # quant_method values whose weights are fp8 throughout


def hf_fp8(quant: dict) -> bool:
    """Whether a quantization_config stores the weights in fp8, which the engines run through their fp8_w8a8 fused
    MoE: the fp8 methods by name, compressed-tensors whose weight groups are 8-bit floats, ModelOpt's FP8 algorithm."""
    method = str(quant.get("quant_method") or "").lower()
    if method in FP8_METHODS:
        return True
    if method == "compressed-tensors":
        groups = quant.get("config_groups")
        weights = [g.get("weights") for g in groups.values() if isinstance(g, dict)] if isinstance(groups, dict) else []
        return bool(weights) and all(isinstance(w, dict) and str(w.get("type", "")).lower() == "float"
                                     and w.get("num_bits") == 8 for w in weights)
    return method == "modelopt" and "fp8" in str(quant.get("quant_algo") or "").lower()


def hf_fp8_block(cfg: dict, dtype_bytes: int, where: str) -> dict[str, int]:
    """ModelSpec's fp8_block_n / fp8_block_k of an fp8 config.json: quantization_config.weight_block_size, which vLLM
    and SGLang read as the fused MoE's block_shape (none: per-tensor or per-channel scales)."""
    quant = cfg.get("quantization_config")
    block = quant.get("weight_block_size") if isinstance(quant, dict) and dtype_bytes == 1 else None
    if block is None:
        return {}
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= 65536 for b in block)):
        raise ValueError(f"{where}: quantization_config.weight_block_size must be two positive integers [n, k] "
                         f"(DeepSeek-V3: [128, 128]), got {block!r}: check the checkpoint's config.json")
    return {"fp8_block_n": block[0], "fp8_block_k": block[1]}


def hf_expert_quant(cfg: dict) -> str:
    """ModelSpec.expert_quant of a Hugging Face config: its quantization_config's method unless fp8 (hf_fp8:
    modelled as dtype_bytes 1) or absent; "unknown" for a quantization_config that names none."""
    quant = cfg.get("quantization_config")
    if not isinstance(quant, dict) or hf_fp8(quant):
        return ""
    method = "".join(ch for ch in str(quant.get("quant_method") or "unknown").lower() if ch.isalnum() or ch in "_-")
    return method[:40] or "unknown"
