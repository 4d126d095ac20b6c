"""Roofline times for the operations the agent does not tune, calibrated on the H200 ceilings in docs/architecture.md.

Every operation costs max(flops / MATMUL_PEAK_FLOPS, bytes / COPY_BW): bf16 dense matmul 792 TFLOP/s and device copy
4.27 TB/s (bytes read + bytes written), both measured on the H200. This is a lower bound for each op (no launch or
tail effects); the per-step fixed cost in the simulator (STEP_OVERHEAD_S) stands for what it leaves out.

`RooflineTimer` applies the same bound to the three tuned kernels, ignoring the config: a config-blind ideal, used by
the speed benchmark and as a sanity reference, never as a measurement.
"""

from __future__ import annotations

from typing import Any

from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload, PrefillWorkload

MATMUL_PEAK_FLOPS = 792e12  # bf16 8192^3 matmul on the H200 (docs/architecture.md)
COPY_BW = 4.27e12  # device-to-device copy, bytes read + written per second (docs/architecture.md)
DEFAULT_VOCAB = 32000  # Mixtral-8x7B's vocabulary; ModelSpec has no vocab field, so the LM head takes it as a parameter


def op_s(flops: float, nbytes: float) -> float:
    """Roofline time of one op."""
    return max(flops / MATMUL_PEAK_FLOPS, nbytes / COPY_BW)


def dense_layer_ops(model: Any, num_tokens: int) -> dict[str, tuple[float, float]]:
    """(flops, bytes) of the untuned ops of one decoder layer for num_tokens tokens in the step."""
    t, h, b, e = num_tokens, model.hidden, model.dtype_bytes, model.num_experts
    q = model.num_heads * model.head_dim
    kvd = model.num_kv_heads * model.head_dim
    return {
        "qkv_proj": (2.0 * t * h * (q + 2 * kvd), b * (h * (q + 2 * kvd) + t * h + t * (q + 2 * kvd))),
        "rope": (0.0, 2.0 * b * t * (q + kvd)),  # read + write Q and K
        "kv_cache_write": (0.0, 2.0 * b * t * 2 * kvd),  # read K, V; write them into pages
        "o_proj": (2.0 * t * q * h, b * (q * h + t * q + t * h)),
        "router": (2.0 * t * h * e, b * (h * e + t * h) + 2 * 4.0 * t * e),  # fp32 logits written, read by top-k
        "rmsnorm_x2": (0.0, 2 * 2.0 * b * t * h),  # two norms, each reads and writes the hidden state
        "residual_add_x2": (0.0, 2 * 3.0 * b * t * h),  # two adds, each reads two and writes one
    }


def dense_step_ops(model: Any, num_tokens: int, num_logits: int, vocab: int = DEFAULT_VOCAB) -> dict[str, tuple]:
    """(flops, bytes) of the once-per-step untuned ops: embedding, final norm, LM head on the sampled rows, sampling."""
    t, n, h, b = num_tokens, num_logits, model.hidden, model.dtype_bytes
    return {
        "embedding": (0.0, 2.0 * b * t * h),
        "final_norm": (0.0, 2.0 * b * n * h),
        "lm_head": (2.0 * n * h * vocab, b * (h * vocab + n * h) + 4.0 * n * vocab),
        "sampling": (0.0, 4.0 * n * vocab),
    }


# which layers run each untuned op of dense_layer_ops: the attention layers rope and the KV write, the MoE layers
# their router; the norms, residual adds and the q/k/v and output projections run in every layer (a Mamba or linear-
# attention mixer has in and out projections of about that size: the attention ones stand in for them)
ATTENTION_OPS = ("rope", "kv_cache_write")
MOE_OPS = ("router",)


def dense_mlp_ops(model: Any, num_tokens: int, width: int | None = None) -> dict[str, tuple[float, float]]:
    """(flops, bytes) of one dense MLP of `width` (default model.dense_intermediate: a dense layer's MLP; the shared
    experts pass model.shared_width): the gate/up GEMM, the activation, the down GEMM."""
    t, h, b = num_tokens, model.hidden, model.dtype_bytes
    d = model.dense_intermediate if width is None else width
    return {
        "mlp_gate_up": (2.0 * t * h * 2 * d, b * (h * 2 * d + t * h + t * 2 * d)),
        "mlp_act": (0.0, b * (t * 2 * d + t * d)),
        "mlp_down": (2.0 * t * d * h, b * (d * h + t * d + t * h)),
    }


def mlp_s(model: Any, num_tokens: int, width: int) -> float:
    """Roofline seconds of one dense MLP of `width` over num_tokens tokens (0 for width 0)."""
    return sum(op_s(f, nb) for f, nb in dense_mlp_ops(model, num_tokens, width).values()) if width else 0.0


def dense_step_s(model: Any, num_tokens: int, num_logits: int, vocab: int = DEFAULT_VOCAB) -> float:
    """Roofline seconds of all untuned ops of one engine step (every layer plus the per-step ops). A spec whose
    layers are not all attention + MoE (ModelSpec.uniform_layers) is charged each op for the layers that run it
    (ATTENTION_OPS, MOE_OPS) and the dense MLP for its dense layers; shared experts (ModelSpec.shared_width) are a
    dense MLP in every MoE layer."""
    if num_tokens <= 0:
        return 0.0
    ops = dense_layer_ops(model, num_tokens)
    per_step = sum(op_s(f, nb) for f, nb in dense_step_ops(model, num_tokens, num_logits, vocab).values())
    shared_s = mlp_s(model, num_tokens, getattr(model, "shared_width", 0))
    if getattr(model, "uniform_layers", True):
        per_layer = sum(op_s(f, nb) for f, nb in ops.values())
        return model.num_layers * (per_layer + shared_s) + per_step  # + 0.0 without shared experts: bit-identical
    # a windowed mixer's layers (ModelSpec.window_tokens: sliding or chunked local attention) rotate and write KV too
    attention = model.n_attention_layers + (model.n_mixer_layers if getattr(model, "window_tokens", 0) else 0)
    counts = {"attention": attention, "moe": model.n_moe_layers, "all": model.num_layers}
    total = sum(op_s(f, nb) * counts["attention" if k in ATTENTION_OPS else "moe" if k in MOE_OPS else "all"]
                for k, (f, nb) in ops.items())
    total += model.n_moe_layers * shared_s + model.n_dense_layers * mlp_s(model, num_tokens, model.dense_intermediate)
    return total + per_step


def kernel_roofline(kernel: str, workload: Any, dtype_bytes: int = 2) -> tuple[float, float]:
    """(flops, bytes) lower bounds of one tuned-kernel call (one layer)."""
    b = dtype_bytes
    if isinstance(workload, PrefillWorkload):
        w = workload
        t = w.total_tokens
        flops = 4.0 * w.num_heads * w.head_dim * w.causal_pairs()
        nbytes = b * t * w.head_dim * (2 * w.num_heads + 2 * w.num_kv_heads)
        return flops, nbytes
    if isinstance(workload, DecodeWorkload):
        w = workload
        ctx = w.batch * w.context_len
        flops = 4.0 * w.num_heads * w.head_dim * ctx
        nbytes = 2.0 * b * ctx * w.num_kv_heads * w.head_dim + 2.0 * b * w.batch * w.num_heads * w.head_dim
        return flops, nbytes
    if isinstance(workload, MoEWorkload):
        w = workload
        slots = w.num_tokens * w.top_k
        flops = 2.0 * slots * 3 * w.hidden * w.intermediate
        pop = w.expert_popularity()
        touched = sum(1.0 - (1.0 - min(1.0, p * w.top_k)) ** w.num_tokens for p in pop)  # expected experts hit
        nbytes = b * (touched * 3 * w.hidden * w.intermediate + 2 * slots * w.hidden + w.num_tokens * w.hidden)
        return flops, nbytes
    raise TypeError(f"no roofline for kernel {kernel!r} workload {workload!r}")


class RooflineTimer:
    """KernelTimer giving each tuned kernel its roofline time divided by `efficiency` (config-blind)."""

    def __init__(self, efficiency: float = 1.0) -> None:
        if not 0 < efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
        self.efficiency = efficiency
        self._memo: dict[tuple, float] = {}

    def time_s(self, kernel: str, workload: Any, config: Any) -> float:
        key = (kernel, workload)
        t = self._memo.get(key)
        if t is None:
            t = op_s(*kernel_roofline(kernel, workload)) / self.efficiency
            self._memo[key] = t
        return t
