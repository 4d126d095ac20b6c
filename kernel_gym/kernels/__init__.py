"""Triton kernel families. Each module exposes `FAMILY` (see space.KernelFamily); `get_family(name)` imports lazily
so that importing kernel_gym never imports triton."""

from __future__ import annotations

import importlib

from kernel_gym.kernels.space import Config, KernelFamily, Knob, KnobSpace

FAMILY_MODULES = {
    "prefill_attention": "kernel_gym.kernels.prefill_attention",
    "decode_attention": "kernel_gym.kernels.decode_attention",
    "fused_moe": "kernel_gym.kernels.fused_moe",
    "vllm_fused_moe": "kernel_gym.kernels.vllm_moe",  # vLLM's kernel design and tunables (issue 15)
    "prefix_prefill": "kernel_gym.kernels.prefix_prefill",  # chunked prefill over a paged KV prefix (issue 29)
}
FAMILY_NAMES = tuple(FAMILY_MODULES)


def get_family(name: str) -> KernelFamily:
    if name not in FAMILY_MODULES:
        raise ValueError(f"unknown kernel {name!r}: choose one of {list(FAMILY_NAMES)}")
    return importlib.import_module(FAMILY_MODULES[name]).FAMILY


__all__ = ["Config", "KernelFamily", "Knob", "KnobSpace", "FAMILY_NAMES", "get_family"]
