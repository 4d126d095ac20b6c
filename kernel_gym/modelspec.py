"""ModelSpec, the built-in specs and their validation: the bottom of the spec floor, below both models.py and
zoo.py (the zoo builds its specs from ModelSpec; models.load_model looks names up in the zoo), so neither of
those two imports the other both ways. Imports only the standard library.
"""


from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Upper bounds no real model reaches (the largest MoE models today: 384 experts, hidden 7168, 61 layers); a spec
# beyond them is a typo or a crafted file, and grids sized by it would exhaust memory.
SPEC_LIMITS = {"num_layers": 1024, "hidden": 131072, "num_heads": 1024, "num_kv_heads": 1024, "head_dim": 1024,
               "num_experts": 4096, "top_k": 256, "intermediate": 262144, "dtype_bytes": 4,
               "num_shared_experts": 64, "shared_intermediate": 262144, "kv_lora_rank": 16384, "rope_head_dim": 1024}
OPTIONAL_ZERO = ("num_shared_experts", "shared_intermediate", "kv_lora_rank", "rope_head_dim")


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
        """KV-cache bytes one token occupies across all layers (K and V; MLA: the latent plus the rotary key)."""
        if self.attention == "mla":
            return self.num_layers * (self.kv_lora_rank + self.rope_head_dim) * self.activation_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.activation_bytes

    @property
    def weight_bytes(self) -> int:
        """Approximate parameter bytes: attention projections plus all experts, per layer, times layers."""
        qkv = self.hidden * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        attn = qkv + self.num_heads * self.head_dim * self.hidden
        router = self.hidden * self.num_experts
        experts = self.num_experts * 3 * self.hidden * self.intermediate
        experts += self.num_shared_experts * 3 * self.hidden * (self.shared_intermediate or self.intermediate)
        return self.num_layers * (attn + router + experts) * self.dtype_bytes


BUILTIN_MODELS: dict[str, ModelSpec] = {
    "mixtral-8x7b": ModelSpec(
        name="mixtral-8x7b", num_layers=32, hidden=4096, num_heads=32, num_kv_heads=8, head_dim=128,
        num_experts=8, top_k=2, intermediate=14336,
    ),
    "olmoe-1b-7b": ModelSpec(
        name="olmoe-1b-7b", num_layers=16, hidden=2048, num_heads=16, num_kv_heads=16, head_dim=128,
        num_experts=64, top_k=8, intermediate=1024,
    ),
}


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
# also writes experts_per_token)
HF_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
HF_TOP_K_KEYS = ("num_experts_per_tok", "moe_k", "moe_topk", "experts_per_token")
HF_READ_KEYS = {*HF_EXPERT_KEYS, *HF_TOP_K_KEYS, "n_shared_experts", "num_shared_experts", "moe_num_shared_experts",
                "num_shared_expert"}
HF_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def is_hf_config(data: object) -> bool:
    """A Hugging Face config.json rather than a ModelSpec: it names the architecture or its layers the HF way."""
    return isinstance(data, dict) and any(k in data for k in ("model_type", "architectures", "num_hidden_layers"))


def spec_from_hf_config(data: dict, where: str, name: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face MoE config.json, by the mapping docs/agent.md tables ("Your own model"): the
    routed experts, one expert's intermediate size, shared experts (DeepSeek's n_shared_experts, Qwen-MoE's one) and
    MLA where kv_lora_rank is set. A multimodal config's text part (text_config) is the language model's."""
    cfg = {**data, **data["text_config"]} if isinstance(data.get("text_config"), dict) else data

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
    mla = number("kv_lora_rank") is not None
    head_dim = number("head_dim") or number("attention_head_dim") or (number("v_head_dim") if mla else None)
    if head_dim is None and hidden % heads:  # hidden // heads would be a head size the model does not have
        raise ValueError(f"{where}: no head_dim, and hidden_size {hidden} is not a multiple of num_attention_heads "
                         f"{heads}: add the model's head_dim to the config.json")
    head_dim = head_dim or hidden // heads
    if number("n_shared_experts"):  # DeepSeek: shared experts as wide as a routed one
        shared, shared_inter = need("n_shared_experts"), need("moe_intermediate_size")
    elif number("num_shared_experts"):  # Bailing / Ling: the same, under another key
        shared, shared_inter = need("num_shared_experts"), need("moe_intermediate_size")
    elif number("moe_num_shared_experts"):  # ERNIE-4.5: the same, under another key
        shared, shared_inter = need("moe_num_shared_experts"), need("moe_intermediate_size")
    elif number("shared_expert_intermediate_size"):  # Qwen-MoE: one shared expert of its own width
        shared, shared_inter = 1, need("shared_expert_intermediate_size")
    elif number("num_shared_expert"):  # Hunyuan: the same, per layer (its shared MLP: moe width x count)
        shared, shared_inter = need("num_shared_expert"), need("moe_intermediate_size", "intermediate_size")
    else:
        shared, shared_inter = 0, 0
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return ModelSpec(
        name=name, num_layers=need("num_hidden_layers"), hidden=hidden, num_heads=heads,
        num_kv_heads=number("num_key_value_heads") or heads, head_dim=head_dim, num_experts=experts,
        top_k=need(*HF_TOP_K_KEYS), intermediate=need("moe_intermediate_size", "intermediate_size"),
        dtype_bytes=hf_weight_bytes(cfg, dtype, where), num_shared_experts=shared, shared_intermediate=shared_inter,
        attention="mla" if mla else "gqa", kv_lora_rank=need("kv_lora_rank") if mla else 0,
        rope_head_dim=(number("qk_rope_head_dim") or 0) if mla else 0)


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
    if method == "fp8":
        return 1
    import warnings

    warnings.warn(f"{where}: quantization_config {method or '(no quant_method)'!r} is not modelled: weights counted "
                  f"at {dtype} ({size} bytes each), more memory than they take (so less KV room), and the engine's "
                  "MoE kernel for these weights is not the bf16 one kernel_gym measures; for a bf16 deployment of "
                  "this model the figures hold as they are", SpecWarning, stacklevel=3)
    return size
