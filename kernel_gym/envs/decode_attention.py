"""KernelGym/DecodeAttention-v0: pick a paged decode-attention launch config for a (batch, context) workload."""

from __future__ import annotations

from kernel_gym.envs._doc import COMMON
from kernel_gym.envs.base import KernelConfigEnv


class DecodeAttentionEnv(KernelConfigEnv):
    __doc__ = (
        """
    ## Description

    One paged decode-attention call: a batch of single query tokens against a paged KV cache whose contexts differ
    within the batch. The agent picks the launch config (KV split count for flash-decoding, block sizes, warps,
    stages, KV page size and layout). Small batches with long contexts need many KV splits to fill the GPU; large
    batches need none.

    ## Observation Space

    `Box(-4, 4, (6,), float32)`: features of kernel_gym.dispatch.observation, each mapped linearly from the range
    below to [-1, 1] and clipped to [-4, 4].

    | Num | Observation          | Range    |
    |-----|----------------------|----------|
    | 0   | log2 batch           | 0 .. 9   |
    | 1   | log2 mean context    | 0 .. 16  |
    | 2   | GQA group (H / Hkv)  | 1 .. 16  |
    | 3   | log2 KV heads        | 0 .. 7   |
    | 4   | log2 head dim        | 5 .. 9   |
    | 5   | dtype bytes          | 1 .. 4   |
"""
        + COMMON
    )

    kernel = "decode_attention"
