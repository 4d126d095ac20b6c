"""KernelGym/PrefixPrefill-v0: pick a launch config for chunked prefill over a paged KV prefix.

A separate id beside PrefillAttention-v0 rather than prefix workloads inside it: the prefix kernel is another family
(its own knobs: KV page size and layout, key splits) with its own catalogue and action space, and a policy trained on
one id keeps one action space; PrefillAttention-v0's observation and policies stay as they were.
"""

from __future__ import annotations

from kernel_gym.envs._doc import COMMON
from kernel_gym.envs.base import KernelConfigEnv


class PrefixPrefillEnv(KernelConfigEnv):
    __doc__ = (
        """
    ## Description

    One chunked-prefill call over a paged KV cache: each request prefills a chunk of new tokens after a prefix
    already cached (earlier chunks, or a shared prompt prefix; 0 for a fresh request). A chunk's queries attend
    causally within the chunk and fully to its prefix. The agent picks the launch config (query and key blocks,
    warps, stages, key splits, KV page size and layout). Long prefixes behind short chunks favour key splits and
    large key blocks; short chunks without a prefix favour small query tiles.

    ## Observation Space

    `Box(-4, 4, (10,), float32)`: features of kernel_gym.dispatch.observation, each mapped linearly from the range
    below to [-1, 1] and clipped to [-4, 4].

    | Num | Observation              | Range    |
    |-----|--------------------------|----------|
    | 0   | log2 chunk tokens        | 0 .. 15  |
    | 1   | log2 longest chunk       | 0 .. 15  |
    | 2   | log2 number of requests  | 0 .. 8   |
    | 3   | log2 attended pairs      | 0 .. 32  |
    | 4   | log2 (1 + mean prefix)   | 0 .. 17  |
    | 5   | log2 (1 + longest prefix)| 0 .. 17  |
    | 6   | log2 query heads         | 0 .. 7   |
    | 7   | GQA group (H / Hkv)      | 1 .. 16  |
    | 8   | log2 head dim            | 5 .. 9   |
    | 9   | dtype bytes              | 1 .. 4   |

    The packaged H200 data holds 44 of the grid's 50 shapes for mixtral-8x7b (chunks 128..4096 tokens, prefixes
    0..32768, one request or four mixed; the 4096-token chunks at prefixes 0 and 512 only), 7 configs each.
"""
        + COMMON
    )

    kernel = "prefix_prefill"
