"""KernelGym/MoE-v0: pick a fused-MoE launch config for a (tokens, routing skew) workload."""

from __future__ import annotations

from kernel_gym.envs._doc import COMMON
from kernel_gym.envs.base import KernelConfigEnv


class MoEEnv(KernelConfigEnv):
    __doc__ = (
        """
    ## Description

    One fused-MoE layer call (gate/up GEMM, SiLU-and-mul, down GEMM, top-k sum) of an MoE model: `num_tokens` tokens
    routed top-k over the experts with Zipf routing skew. The agent picks the kernel's launch config (tiles, warps,
    stages, GROUP_M, split-K, epilogue fusions) for it. The best config moves with the batch size and with routing
    skew (docs/architecture.md: uniform-tuned configs reach 0.81-0.87 of the best under skew at 64-256 tokens).

    ## Observation Space

    `Box(-4, 4, (8,), float32)`: features of kernel_gym.dispatch.observation, each mapped linearly from the range
    below to [-1, 1] and clipped to [-4, 4].

    | Num | Observation             | Range     |
    |-----|-------------------------|-----------|
    | 0   | log2 tokens             | 0 .. 14   |
    | 1   | routing skew (Zipf s)   | 0 .. 2    |
    | 2   | log2 token slots/expert | -6 .. 14  |
    | 3   | log2 experts            | 0 .. 8    |
    | 4   | log2 top-k              | 0 .. 4    |
    | 5   | log2 hidden             | 8 .. 14   |
    | 6   | log2 intermediate       | 8 .. 15   |
    | 7   | dtype bytes             | 1 .. 4    |
"""
        + COMMON
    )

    kernel = "fused_moe"
