"""The shape zoo: real MoE architectures, their tensor-parallel shards, and the train / test split by model.

Why: a policy trained on two models answers well only for those two. The zoo lists the expert and attention shapes of
many published MoE models (numbers from each model's published config.json), at TP=1 and at the shards vLLM users
run (TP=2, 4: per-shard intermediate N / tp for the experts, heads / tp for attention), so that one model-conditioned
policy per kernel family can learn how the best config moves with the shape, and so that its zero-shot quality can be
measured on models it never saw.

The test split is fixed per kernel: models whose shapes no training row may share (rows of any workload that a test
model produces are left out of training, also when a training model produces the same workload), never looked at
while choosing hyper-parameters.

Imports only the standard library and kernel_gym.models / kernels.workloads (themselves standard library only): this
module runs on the GPU machine too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload
from kernel_gym.modelspec import BUILTIN_MODELS, WINDOWED_MIXERS, ModelSpec


def _spec(name: str, layers: int, hidden: int, heads: int, kv: int, head_dim: int, experts: int, top_k: int,
          inter: int, **kinds: int) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden=hidden, num_heads=heads, num_kv_heads=kv,
                     head_dim=head_dim, num_experts=experts, top_k=top_k, intermediate=inter,
                     max_context=ZOO_CONTEXT.get(name, 0), **kinds)


# The context limit of each published config.json (max_position_embeddings; DBRX: max_seq_len), where we read it:
# ModelSpec.max_context. A zoo model left out has none recorded (plan then keeps its default limit).
ZOO_CONTEXT = {"mixtral-8x22b": 65536, "dbrx": 32768, "qwen1.5-moe-a2.7b": 8192, "qwen3-235b-a22b": 40960,
               "qwen3-30b-a3b": 40960, "deepseek-v3": 163840, "phi-3.5-moe": 131072, "gpt-oss-20b": 131072,
               "gpt-oss-120b": 131072, "llama-4-scout": 10485760, "llama-4-maverick": 1048576,
               "granite-3.0-3b-a800m": 4096, "granite-3.0-1b-a400m": 4096, "jetmoe-8b": 4096,
               "ernie-4.5-21b-a3b": 131072, "ernie-4.5-300b-a47b": 131072, "glm-4.5-air": 131072,
               "snowflake-arctic": 4096, "qwen3-next-80b-a3b": 262144}


# Published configs (config.json on each model's hub page): layers, hidden, heads, kv heads, head dim, routed experts,
# top-k, per-expert intermediate size (moe_intermediate_size where the model also has a dense FFN or shared expert),
# and where not every layer is attention + MoE the layer kinds the config.json reader counts (ModelSpec.moe_layers,
# attention_layers, dense_intermediate), the shared experts it reads (num_shared_experts, shared_intermediate: a dense
# MLP every token passes, priced beside the routed experts) and the state of the mixers of the layers without full
# attention (mixer_state_bytes: modelspec.hf_mixer_state on the config.json). gpt-oss stays one kind here: its
# sliding-window layers run attention too (over 128 tokens), and the serving plans published for gpt-oss-20b were
# priced so.
# Llama-4's 36 RoPE layers attend within 8,192-token chunks (attention_chunk_size), its 12 NoPE layers (every 4th)
# over the whole context; the chunk's K and V at 8 KV heads of 128 in bf16
LLAMA4_CHUNKED: dict[str, Any] = {"attention_layers": 12, "mixer": "chunked-local",
                                  "mixer_state_bytes": 36 * 8192 * 2 * 8 * 128 * 2}
ZOO: dict[str, ModelSpec] = {
    "mixtral-8x7b": BUILTIN_MODELS["mixtral-8x7b"],
    "olmoe-1b-7b": BUILTIN_MODELS["olmoe-1b-7b"],
    "mixtral-8x22b": _spec("mixtral-8x22b", 56, 6144, 48, 8, 128, 8, 2, 16384),
    "dbrx": _spec("dbrx", 40, 6144, 48, 8, 128, 16, 4, 10752),
    "qwen1.5-moe-a2.7b": _spec("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, 128, 60, 4, 1408,
                               num_shared_experts=1, shared_intermediate=5632),
    "qwen2-57b-a14b": _spec("qwen2-57b-a14b", 28, 3584, 28, 4, 128, 64, 8, 2560, num_shared_experts=1,
                            shared_intermediate=20480),
    "qwen3-235b-a22b": _spec("qwen3-235b-a22b", 94, 4096, 64, 4, 128, 128, 8, 1536),
    "qwen3-30b-a3b": _spec("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 128, 8, 768),
    "deepseek-v3": _spec("deepseek-v3", 61, 7168, 128, 128, 128, 256, 8, 2048, moe_layers=58, dense_intermediate=18432,
                         num_shared_experts=1),
    "phi-3.5-moe": _spec("phi-3.5-moe", 32, 4096, 32, 8, 128, 16, 2, 6400),
    "gpt-oss-20b": _spec("gpt-oss-20b", 24, 2880, 64, 8, 64, 32, 4, 2880),
    "gpt-oss-120b": _spec("gpt-oss-120b", 36, 2880, 64, 8, 64, 128, 4, 2880),
    "llama-4-scout": _spec("llama-4-scout", 48, 5120, 40, 8, 128, 16, 1, 8192, num_shared_experts=1,
                           **LLAMA4_CHUNKED),
    "granite-3.0-3b-a800m": _spec("granite-3.0-3b-a800m", 32, 1536, 24, 8, 64, 40, 8, 512),
    "jetmoe-8b": _spec("jetmoe-8b", 24, 2048, 32, 16, 128, 8, 2, 5632),
    # FRESH_MODELS (below): added after the first zero-shot evaluation, never trained on or looked at before it ran
    "ernie-4.5-21b-a3b": _spec("ernie-4.5-21b-a3b", 28, 2560, 20, 4, 128, 64, 6, 1536,
                               num_shared_experts=2, moe_layers=27, dense_intermediate=12288),
    "hunyuan-a13b": _spec("hunyuan-a13b", 32, 4096, 32, 8, 128, 64, 8, 3072, num_shared_experts=1),
    "glm-4.5-air": _spec("glm-4.5-air", 46, 4096, 96, 8, 128, 128, 8, 1408, num_shared_experts=1,
                         moe_layers=45, dense_intermediate=10944),
    # FAR_TEST_MODELS (below): chosen for their distance from the training shapes, never trained on or timed before
    # their evaluation
    "llama-4-maverick": _spec("llama-4-maverick", 48, 5120, 40, 8, 128, 128, 1, 8192, moe_layers=24,
                              dense_intermediate=16384, num_shared_experts=1, **LLAMA4_CHUNKED),
    "snowflake-arctic": _spec("snowflake-arctic", 35, 7168, 56, 8, 128, 128, 2, 4864, num_shared_experts=1,
                              shared_intermediate=7168),  # its residual MLP, a dense MLP every token passes
    "qwen3-next-80b-a3b": _spec("qwen3-next-80b-a3b", 48, 2048, 16, 2, 256, 512, 10, 512, attention_layers=12,
                                 num_shared_experts=1, shared_intermediate=512,
                                 mixer="gated-deltanet",
                                 mixer_state_bytes=36 * 548864 * 2),  # Gated DeltaNet: 32 v heads of 128 x 128
    # (+ its conv state over q, k, v) in 36 layers
    "jamba-1.5-large": _spec("jamba-1.5-large", 72, 8192, 64, 8, 128, 16, 2, 24576, attention_layers=9,
                             moe_layers=36, dense_intermediate=24576,
                             mixer="mamba",
                             mixer_state_bytes=63 * 311296 * 2),  # Mamba: 16384 channels x (16 SSM + 3 conv) x 63
    # FAR2_TEST_MODELS (below): the second far split, chosen the same way after the first had been evaluated
    "minimax-text-01": _spec("minimax-text-01", 80, 6144, 64, 8, 128, 32, 2, 9216, attention_layers=10,
                             mixer="lightning",
                             mixer_state_bytes=70 * 64 * 128 * 128 * 2),  # lightning attention: 128 x 128 per head
    "ernie-4.5-300b-a47b": _spec("ernie-4.5-300b-a47b", 54, 8192, 64, 8, 128, 64, 8, 3584, moe_layers=51,
                                 dense_intermediate=28672),
    "skywork-moe": _spec("skywork-moe", 52, 4608, 36, 36, 128, 16, 2, 12288),
    "granite-3.0-1b-a400m": _spec("granite-3.0-1b-a400m", 24, 1024, 16, 8, 64, 32, 8, 512),
}

# Models whose attention the paged decode kernel does not implement (multi-head latent attention, or JetMoE's
# mixture of attention heads): their expert shapes join the zoo, their attention shapes do not.
NO_DECODE = frozenset({"deepseek-v3", "jetmoe-8b"})

TP_DEGREES = (1, 2, 4)

# Shards left out of collection: DeepSeek-V3's experts at TP=1 hold 22.5 GB per layer, more than the collection's
# compile processes can each hold on one GPU; nobody serves the 671B model without sharding it.
TOO_LARGE = frozenset({"deepseek-v3"})

# Test models per kernel: never trained on, never looked at while choosing hyper-parameters. The first three of each
# kernel were chosen before any zoo measurement, spread over the range (experts 16-60, top-k 2-4; GQA groups 2-7, head
# dims 64-128). The MoE ones' zero-shot gap (large M at TP 2-4) was seen in evaluation run 3, so they are no longer
# untouched; FRESH_MODELS were added after that run (top-6 routing, which no training model has; 64-128 experts), and
# no policy, plan or hyper-parameter choice had seen their shapes before their evaluation. They are decode test models
# too, except Hunyuan-A13B, whose attention (32 heads, 8 KV heads, dim 128) is Mixtral's, a training shape of the
# decode policy; ERNIE's GQA group of 5 and GLM's of 12 are new to it.
FRESH_MODELS = ("ernie-4.5-21b-a3b", "hunyuan-a13b", "glm-4.5-air")
# The far test split (MoE): published architectures picked, before any of their shapes was measured or any config
# chosen for them, as the ones farthest from the training shapes (zoo training shards + the design) by the coverage
# measure (kernel_gym.dispatch.shape_coverage), at the TP degrees they are served with: Llama-4-Maverick (128 experts,
# top-1), Snowflake Arctic (128 experts of N 4864, hidden 7168), Qwen3-Next-80B-A3B (512 experts, top-10, N 512) and
# Jamba-1.5-Large (16 experts, hidden 8192); at TP 4 and 8 their per-shard N is 64-3072. Their shards' percentiles are
# in docs/generalisation.md.
FAR_TEST_MODELS = ("llama-4-maverick", "snowflake-arctic", "qwen3-next-80b-a3b", "jamba-1.5-large")
# The second far split, picked by the same measure once the first had been timed (the policies and the cost model had
# been changed after seeing it): the published architectures farthest from the training shapes whose configs could be
# checked, at the TP degrees they are served with (Skywork-MoE's 36 heads do not divide by 8; Granite's 1B model is
# served on one or two GPUs). Their shards' percentiles are in docs/generalisation.md.
FAR2_TEST_MODELS = ("minimax-text-01", "ernie-4.5-300b-a47b", "skywork-moe", "granite-3.0-1b-a400m")
FAR_TEST_TP = {"llama-4-maverick": (4, 8), "snowflake-arctic": (4, 8), "qwen3-next-80b-a3b": (4, 8),
               "jamba-1.5-large": (8,), "minimax-text-01": (4, 8), "ernie-4.5-300b-a47b": (4, 8),
               "skywork-moe": (4,), "granite-3.0-1b-a400m": (1, 2)}
TEST_MODELS: dict[str, tuple[str, ...]] = {
    "fused_moe": ("phi-3.5-moe", "qwen1.5-moe-a2.7b", "gpt-oss-20b", *FRESH_MODELS, *FAR_TEST_MODELS,
                  *FAR2_TEST_MODELS),
    "decode_attention": ("qwen2-57b-a14b", "llama-4-scout", "granite-3.0-3b-a800m", "ernie-4.5-21b-a3b",
                         "glm-4.5-air"),
}

# Thinned grids for the training sample (the full grids are kernel_gym.kernels.workloads'): every octave of M for the
# uniform MoE case, skewed routing where skew moves the winner most (M = 64, 256); decode at six (batch, context)
# points spanning batch 1-256 and context 1k-16k (the built-in models' full grids teach the finer dependence).
ZOO_MOE_TOKENS = (1, 16, 64, 256, 1024, 4096)
ZOO_MOE_SKEWED = (64, 256)
ZOO_DECODE = ((1, 2048), (1, 16384), (16, 1024), (16, 8192), (128, 2048), (256, 4096))
# Evaluation shapes of the test models (wide sweeps, timed live).
EVAL_MOE_TOKENS = (1, 16, 64, 256, 1024, 4096)
EVAL_MOE_SKEWED = (64, 256)
EVAL_DECODE = ((1, 4096), (8, 16384), (32, 4096), (64, 2048), (128, 1024), (256, 4096))
DECODE_TOKEN_CAP = 64 * 32768


def _tp_splits(spec: ModelSpec, tp: int) -> list[str]:
    """What does not split tp ways (empty: the shard exists). The engines' rules: vLLM and SGLang split the experts'
    intermediate size (and a shared expert's or dense layer's MLP) and the query heads evenly over TP, and the KV
    heads evenly (kv % tp == 0) or, with fewer KV heads than GPUs, replicate each one tp / kv times (tp % kv == 0)."""
    bad = []
    if spec.intermediate % tp:
        bad.append(f"intermediate {spec.intermediate} is not a multiple of {tp}")
    for field in ("shared_intermediate", "dense_intermediate"):  # the shared experts' and dense layers' MLPs
        if getattr(spec, field) % tp:
            bad.append(f"{field} {getattr(spec, field)} is not a multiple of {tp}")
    if spec.num_heads % tp:
        bad.append(f"num_heads {spec.num_heads} is not a multiple of {tp}")
    kv = spec.num_kv_heads
    if kv % tp and tp % kv:
        bad.append(f"num_kv_heads {kv} is neither a multiple nor a divisor of {tp}")
    return bad


def tp_problem(spec: ModelSpec, tp: int) -> str:
    """'' when the model shards tp ways, else one line naming what does not split and the TP degrees that work."""
    if tp < 1:
        return f"{spec.name}: tp={tp}; a tensor-parallel degree is >= 1"
    bad = _tp_splits(spec, tp)
    if not bad:
        return ""
    ok = [t for t in (1, 2, 4, 8, 16) if not _tp_splits(spec, t)]
    return (f"{spec.name} does not split tp={tp} ways ({'; '.join(bad)}): vLLM and SGLang refuse it at that degree; "
            f"use tp in {ok}")


def shard(spec: ModelSpec, tp: int) -> ModelSpec:
    """The per-GPU shape of a model at tensor-parallel degree tp: experts' intermediate split tp ways (vLLM's N), query
    heads split, KV heads split down to one per GPU (replicated below that), dense-MLP layers' and shared experts'
    widths split, and the mixer state (its heads or channels split; a window's KV as the KV heads)."""
    if tp == 1:
        return spec
    why = tp_problem(spec, tp)
    if why:
        raise ValueError(why)
    kv = max(1, spec.num_kv_heads // tp)
    return dataclasses.replace(spec, name=f"{spec.name}@tp{tp}", intermediate=spec.intermediate // tp,
                               num_heads=spec.num_heads // tp, num_kv_heads=kv,
                               dense_intermediate=spec.dense_intermediate // tp,
                               shared_intermediate=spec.shared_intermediate // tp,
                               mixer_state_bytes=spec.mixer_state_bytes * kv // spec.num_kv_heads
                               if spec.mixer in WINDOWED_MIXERS else spec.mixer_state_bytes // tp)


def zoo_shards(models: Any = None, tps: tuple[int, ...] = TP_DEGREES) -> list[ModelSpec]:
    """Every (model, tp) shard of the named zoo models (default: all)."""
    names = list(ZOO) if models is None else list(models)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise ValueError(f"unknown zoo model(s) {unknown}; the zoo has {sorted(ZOO)}")
    return [shard(ZOO[n], tp) for n in names for tp in tps]


def base_model(shard_name: str) -> str:
    """'mixtral-8x7b@tp2' -> 'mixtral-8x7b'."""
    return shard_name.split("@", 1)[0]


def moe_workloads(spec: ModelSpec, tokens: tuple[int, ...], skewed: tuple[int, ...],
                  dtype: str = "bfloat16") -> list[MoEWorkload]:
    out = [MoEWorkload(t, spec.num_experts, spec.top_k, spec.hidden, spec.intermediate, 0.0, dtype) for t in tokens]
    out += [MoEWorkload(t, spec.num_experts, spec.top_k, spec.hidden, spec.intermediate, 1.2, dtype) for t in skewed]
    return out


def decode_workloads(spec: ModelSpec, pairs: Any, dtype: str = "bfloat16") -> list[DecodeWorkload]:
    return [DecodeWorkload(spec.num_heads, spec.num_kv_heads, spec.head_dim, b, c, dtype)
            for b, c in pairs if b * c <= DECODE_TOKEN_CAP]


def shard_workloads(kernel: str, spec: ModelSpec, grid: str = "zoo") -> list[Any]:
    """A shard's workloads: grid "zoo" (the thinned training sample) or "eval" (the test models' sweep shapes)."""
    if grid not in ("zoo", "eval"):
        raise ValueError(f"unknown zoo grid {grid!r}; use zoo or eval")
    if kernel == "fused_moe":
        if grid == "zoo":
            return moe_workloads(spec, ZOO_MOE_TOKENS, ZOO_MOE_SKEWED)
        return moe_workloads(spec, EVAL_MOE_TOKENS, EVAL_MOE_SKEWED)
    if kernel == "decode_attention":
        if base_model(spec.name) in NO_DECODE:
            return []
        if grid == "zoo":
            return decode_workloads(spec, ZOO_DECODE)
        return decode_workloads(spec, EVAL_DECODE)
    raise ValueError(f"the zoo covers fused_moe and decode_attention, not {kernel!r}")


def test_workload_keys(kernel: str, tps: tuple[int, ...] = TP_DEGREES) -> set[str]:
    """Every workload key any test model of this kernel produces, on either grid: rows with these keys never train."""
    keys: set[str] = set()
    shards = zoo_shards(TEST_MODELS[kernel], tps) + [shard(ZOO[m], tp) for m in TEST_MODELS[kernel]
                                                     for tp in FAR_TEST_TP.get(m, ()) if tp not in tps]
    for spec in shards:
        for grid in ("zoo", "eval"):
            keys.update(w.key() for w in shard_workloads(kernel, spec, grid))
    return keys


def training_models(kernel: str) -> list[str]:
    return [n for n in ZOO if n not in TEST_MODELS[kernel] and n not in FRESH_MODELS and n not in FAR_TEST_MODELS
            and n not in FAR2_TEST_MODELS and not (kernel == "decode_attention" and n in NO_DECODE)]


# ---- the space-filling design ------------------------------------------------------------------------------------
# Published models cluster (E 8-256, top-k 1-8, per-shard N >= 128 in the zoo); a user's TP-8 shard of a model with
# many small experts, or top-10 routing, falls outside every one of them. The design covers the whole MoE shape space
# instead: a scrambled Halton sequence (deterministic, standard library) over log2 experts, top-k, log2 hidden and
# log2 per-shard N, each point rounded to a shape a kernel would see (E and hidden to multiples of 8 / 256, N to a
# multiple of 16), keeping points whose expert weights fit one collection process on the GPU. Every design shape is
# measured at the zoo's thinned grid (ZOO_MOE_TOKENS, ZOO_MOE_SKEWED) and trains the model-conditioned MoE policy;
# none is ever a test shape.
DESIGN_RANGES = {"num_experts": (8, 512), "top_k": (1, 10), "hidden": (1024, 8192), "intermediate": (32, 16384)}
DESIGN_POINTS = 40
DESIGN_MAX_WEIGHT_BYTES = 6 * 2**30  # E x 3 x hidden x N x 2 bytes: one layer's experts, held by each compile process


def _halton(index: int, base: int) -> float:
    f, r = 1.0, 0.0
    while index > 0:
        f /= base
        r += f * (index % base)
        index //= base
    return r


def _round_to(x: float, step: int) -> int:
    return max(step, int(round(x / step)) * step)


def design_shapes(points: int = DESIGN_POINTS) -> list[ModelSpec]:
    """The design's MoE shapes as one-layer ModelSpecs named design-NN (N already per shard: never sharded again)."""
    import math

    lo_e, hi_e = (math.log2(v) for v in DESIGN_RANGES["num_experts"])
    lo_h, hi_h = (math.log2(v) for v in DESIGN_RANGES["hidden"])
    lo_n, hi_n = (math.log2(v) for v in DESIGN_RANGES["intermediate"])
    k_lo, k_hi = DESIGN_RANGES["top_k"]
    out: list[ModelSpec] = []
    i = 0
    while len(out) < points:
        i += 1
        u = [(_halton(i, b) + s) % 1.0 for b, s in zip((2, 3, 5, 7), (0.137, 0.519, 0.291, 0.733))]  # shifted Halton
        experts = _round_to(2 ** (lo_e + u[0] * (hi_e - lo_e)), 8)
        top_k = min(experts, k_lo + int(u[1] * (k_hi - k_lo + 1)))
        hidden = _round_to(2 ** (lo_h + u[2] * (hi_h - lo_h)), 256)
        inter = _round_to(2 ** (lo_n + u[3] * (hi_n - lo_n)), 16)
        if experts * 3 * hidden * inter * 2 > DESIGN_MAX_WEIGHT_BYTES:
            continue
        out.append(ModelSpec(name=f"design-{len(out):02d}", num_layers=1, hidden=hidden, num_heads=32,
                             num_kv_heads=8, head_dim=128, num_experts=experts, top_k=top_k, intermediate=inter))
    return out


DESIGN: dict[str, ModelSpec] = {s.name: s for s in design_shapes()}
