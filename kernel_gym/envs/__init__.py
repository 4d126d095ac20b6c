"""Gymnasium environments: one per kernel family (a line in KERNEL_ENVS), plus the serving environments.

`register_envs()` (called by `import kernel_gym` when gymnasium is installed) registers every id in ENV_IDS.
Recorded-backend ids are deterministic; `-live-` ids time configs on the GPU and are registered nondeterministic=True.
Adding a kernel family's env is one line in KERNEL_ENVS.
"""

from __future__ import annotations

from collections.abc import Mapping

# The kernel envs, one line per kernel family: id stem -> (entry point, kernel, extra kwargs). Each registers a recorded
# id "KernelGym/<stem>-v0" and a live one "KernelGym/<stem>-live-v0" (ENV_IDS, ENV_KERNELS). A family without an env
# class of its own uses the shared one: ("kernel_gym.envs.base:KernelConfigEnv", "<kernel>", {"kernel": "<kernel>"}).
KERNEL_ENVS: dict[str, tuple[str, str, dict]] = {
    "MoE": ("kernel_gym.envs.moe:MoEEnv", "fused_moe", {}),
    "DecodeAttention": ("kernel_gym.envs.decode_attention:DecodeAttentionEnv", "decode_attention", {}),
    "PrefillAttention": ("kernel_gym.envs.prefill_attention:PrefillAttentionEnv", "prefill_attention", {}),
    "PrefixPrefill": ("kernel_gym.envs.prefix_prefill:PrefixPrefillEnv", "prefix_prefill", {}),
}
# The serving envs: id -> (entry point, default kwargs, nondeterministic).
SERVING_ENVS: dict[str, tuple[str, dict, bool]] = {
    "KernelGym/Serving-v0": ("kernel_gym.envs.serving:ServingEnv", {"backend": "recorded"}, False),
    "KernelGym/ServingTPEP-v0": ("kernel_gym.envs.parallel_serving:ParallelServingEnv", {"backend": "recorded"}, False),
    "KernelGym/ServingPlan-v0": ("kernel_gym.envs.parallel_serving:ServingPlanEnv", {"backend": "recorded"}, False),
    "KernelGym/Serving-live-v0": ("kernel_gym.envs.serving:ServingEnv", {"backend": "live"}, True),
}


class _Ids(Mapping):
    """A mapping built on each read from KERNEL_ENVS (so an added line, or a test's, is seen at once)."""

    def __init__(self, build):  # type: ignore[no-untyped-def]
        self._build = build

    def __getitem__(self, key: str):  # type: ignore[no-untyped-def]
        return self._build()[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build())


def _env_ids() -> dict[str, tuple[str, dict, bool]]:
    out: dict[str, tuple[str, dict, bool]] = {}
    for live in (False, True):
        for stem, (entry, _, kwargs) in KERNEL_ENVS.items():
            out[f"KernelGym/{stem}{'-live' if live else ''}-v0"] = (
                entry, {"backend": "live" if live else "recorded", **kwargs}, live)
    return {**out, **SERVING_ENVS}


def _env_kernels() -> dict[str, str]:
    return {f"KernelGym/{stem}{live}-v0": kernel for live in ("", "-live") for stem, (_, kernel, _) in
            KERNEL_ENVS.items()}


# id -> (entry point, default kwargs, nondeterministic)
ENV_IDS: Mapping[str, tuple[str, dict, bool]] = _Ids(_env_ids)
# env id -> kernel family, for the kernel envs (training, evaluation and export look the kernel up here)
ENV_KERNELS: Mapping[str, str] = _Ids(_env_kernels)


def env_id_for(kernel: str) -> str | None:
    """The recorded-backend env id that trains on a kernel (None: no env line for it)."""
    return next((e for e, k in ENV_KERNELS.items() if k == kernel and "-live-" not in e), None)


def register_envs() -> None:
    """Register every id in ENV_IDS with gymnasium (idempotent)."""
    import gymnasium

    for env_id, (entry_point, kwargs, nondeterministic) in ENV_IDS.items():
        if env_id in gymnasium.registry:
            continue
        gymnasium.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs), nondeterministic=nondeterministic)


__all__ = ["ENV_IDS", "ENV_KERNELS", "KERNEL_ENVS", "register_envs"]
