"""KernelGym/PrefillAttention-v0: pick a causal prefill-attention launch config for a packed batch of prompts."""

from __future__ import annotations

from kernel_gym.envs._doc import COMMON
from kernel_gym.envs.base import KernelConfigEnv


class PrefillAttentionEnv(KernelConfigEnv):
    __doc__ = (
        """
    ## Description

    One causal grouped-query prefill-attention call over variable-length prompts packed in one batch (cu_seqlens).
    The agent picks the launch config (BLOCK_M, BLOCK_N, warps, stages). Short ragged batches favour small query
    tiles (less masked work), long prompts large ones.

    ## Observation Space

    `Box(-4, 4, (8,), float32)`: features of kernel_gym.dispatch.observation, each mapped linearly from the range
    below to [-1, 1] and clipped to [-4, 4].

    | Num | Observation            | Range    |
    |-----|------------------------|----------|
    | 0   | log2 total tokens      | 0 .. 15  |
    | 1   | log2 longest sequence  | 0 .. 15  |
    | 2   | log2 number of seqs    | 0 .. 8   |
    | 3   | log2 causal pairs      | 0 .. 28  |
    | 4   | log2 query heads       | 0 .. 7   |
    | 5   | GQA group (H / Hkv)    | 1 .. 16  |
    | 6   | log2 head dim          | 5 .. 9   |
    | 7   | dtype bytes            | 1 .. 4   |
"""
        + COMMON
    )

    kernel = "prefill_attention"
