"""Gymnasium environments: one per kernel family, plus (later) the serving environment.

`register_envs()` (called by `import kernel_gym` when gymnasium is installed) registers every id in ENV_IDS.
Recorded-backend ids are deterministic; `-live-` ids time configs on the GPU and are registered nondeterministic=True.
Adding an env is one line in ENV_IDS.
"""

from __future__ import annotations

# id -> (entry point, default kwargs, nondeterministic)
ENV_IDS: dict[str, tuple[str, dict, bool]] = {
    "KernelGym/MoE-v0": ("kernel_gym.envs.moe:MoEEnv", {"backend": "recorded"}, False),
    "KernelGym/DecodeAttention-v0": (
        "kernel_gym.envs.decode_attention:DecodeAttentionEnv", {"backend": "recorded"}, False
    ),
    "KernelGym/PrefillAttention-v0": (
        "kernel_gym.envs.prefill_attention:PrefillAttentionEnv", {"backend": "recorded"}, False
    ),
    "KernelGym/PrefixPrefill-v0": ("kernel_gym.envs.prefix_prefill:PrefixPrefillEnv", {"backend": "recorded"}, False),
    "KernelGym/Serving-v0": ("kernel_gym.envs.serving:ServingEnv", {"backend": "recorded"}, False),
    "KernelGym/ServingTPEP-v0": ("kernel_gym.envs.parallel_serving:ParallelServingEnv", {"backend": "recorded"}, False),
    "KernelGym/ServingPlan-v0": ("kernel_gym.envs.parallel_serving:ServingPlanEnv", {"backend": "recorded"}, False),
    "KernelGym/MoE-live-v0": ("kernel_gym.envs.moe:MoEEnv", {"backend": "live"}, True),
    "KernelGym/Serving-live-v0": ("kernel_gym.envs.serving:ServingEnv", {"backend": "live"}, True),
    "KernelGym/DecodeAttention-live-v0": (
        "kernel_gym.envs.decode_attention:DecodeAttentionEnv", {"backend": "live"}, True
    ),
    "KernelGym/PrefillAttention-live-v0": (
        "kernel_gym.envs.prefill_attention:PrefillAttentionEnv", {"backend": "live"}, True
    ),
    "KernelGym/PrefixPrefill-live-v0": ("kernel_gym.envs.prefix_prefill:PrefixPrefillEnv", {"backend": "live"}, True),
}

# env id -> kernel family, for the kernel envs (training, evaluation and export look the kernel up here)
ENV_KERNELS: dict[str, str] = {  # the kernel env ids (Serving-v0 sets all three families)
    "KernelGym/MoE-v0": "fused_moe",
    "KernelGym/DecodeAttention-v0": "decode_attention",
    "KernelGym/PrefillAttention-v0": "prefill_attention",
    "KernelGym/PrefixPrefill-v0": "prefix_prefill",
    "KernelGym/MoE-live-v0": "fused_moe",
    "KernelGym/DecodeAttention-live-v0": "decode_attention",
    "KernelGym/PrefillAttention-live-v0": "prefill_attention",
    "KernelGym/PrefixPrefill-live-v0": "prefix_prefill",
}


def register_envs() -> None:
    """Register every id in ENV_IDS with gymnasium (idempotent)."""
    import gymnasium

    for env_id, (entry_point, kwargs, nondeterministic) in ENV_IDS.items():
        if env_id in gymnasium.registry:
            continue
        gymnasium.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs), nondeterministic=nondeterministic)


__all__ = ["ENV_IDS", "ENV_KERNELS", "register_envs"]
