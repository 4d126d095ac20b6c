"""The observation every kernel env and the logged policy share: a workload's features, scaled to about [-1, 1].

Imports only the standard library and numpy, and nothing from kernel_gym: the MLflow pyfunc model bundles this file
verbatim (code_paths) so that a logged policy computes exactly the observation it was trained on, anywhere.

Raw features are `workload.features()` plus the shape numbers that are constant within one model but let one policy
tell models apart (hidden size, experts, heads, head dim, dtype width). Each is mapped linearly from a fixed range
(lo, hi) to [-1, 1] and clipped to [-CLIP, CLIP]: fixed ranges, not statistics of the training data, so the encoding
never depends on which workloads a run happened to see.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

CLIP = 4.0
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# kernel -> ((feature name, lo, hi), ...). Order is the observation order; bump the env version when it changes.
FEATURES: dict[str, tuple[tuple[str, float, float], ...]] = {
    "fused_moe": (
        ("log2_tokens", 0.0, 14.0),
        ("skew", 0.0, 2.0),
        ("log2_slots_per_expert", -6.0, 14.0),
        ("log2_num_experts", 0.0, 8.0),
        ("log2_top_k", 0.0, 4.0),
        ("log2_hidden", 8.0, 14.0),
        ("log2_intermediate", 8.0, 15.0),
        ("dtype_bytes", 1.0, 4.0),
    ),
    "decode_attention": (
        ("log2_batch", 0.0, 9.0),
        ("log2_context", 0.0, 16.0),
        ("gqa_group", 1.0, 16.0),
        ("log2_num_kv_heads", 0.0, 7.0),
        ("log2_head_dim", 5.0, 9.0),
        ("dtype_bytes", 1.0, 4.0),
    ),
    "prefill_attention": (
        ("log2_total_tokens", 0.0, 15.0),
        ("log2_max_len", 0.0, 15.0),
        ("log2_num_seqs", 0.0, 8.0),
        ("log2_causal_pairs", 0.0, 28.0),
        ("log2_num_heads", 0.0, 7.0),
        ("gqa_group", 1.0, 16.0),
        ("log2_head_dim", 5.0, 9.0),
        ("dtype_bytes", 1.0, 4.0),
    ),
    # chunked prefill over a paged prefix: the prefill features plus the prefix axis (KV already cached per request)
    "prefix_prefill": (
        ("log2_total_tokens", 0.0, 15.0),
        ("log2_max_chunk", 0.0, 15.0),
        ("log2_num_seqs", 0.0, 8.0),
        ("log2_causal_pairs", 0.0, 32.0),
        ("log2_mean_prefix", 0.0, 17.0),
        ("log2_max_prefix", 0.0, 17.0),
        ("log2_num_heads", 0.0, 7.0),
        ("gqa_group", 1.0, 16.0),
        ("log2_head_dim", 5.0, 9.0),
        ("dtype_bytes", 1.0, 4.0),
    ),
}


def feature_names(kernel: str) -> list[str]:
    if kernel not in FEATURES:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {sorted(FEATURES)}")
    return [name for name, _, _ in FEATURES[kernel]]


def raw_features(workload: Any) -> dict[str, float]:
    """Unscaled features of a workload object (any of kernel_gym.kernels.workloads' dataclasses, duck-typed)."""
    kernel = workload.kernel
    f = dict(workload.features())
    f["dtype_bytes"] = float(DTYPE_BYTES[workload.dtype])
    if kernel == "fused_moe":
        f["log2_num_experts"] = math.log2(workload.num_experts)
        f["log2_top_k"] = math.log2(workload.top_k)
        f["log2_hidden"] = math.log2(workload.hidden)
        f["log2_intermediate"] = math.log2(workload.intermediate)
    elif kernel == "decode_attention":
        f["log2_num_kv_heads"] = math.log2(workload.num_kv_heads)
        f["log2_head_dim"] = math.log2(workload.head_dim)
    elif kernel in ("prefill_attention", "prefix_prefill"):
        lens = workload.seq_lens if kernel == "prefill_attention" else workload.chunk_lens
        f["log2_num_seqs"] = math.log2(len(lens))
        if kernel == "prefix_prefill":
            f["log2_max_prefix"] = math.log2(1.0 + max(workload.prefix_lens))
        f["log2_num_heads"] = math.log2(workload.num_heads)
        f["gqa_group"] = float(workload.num_heads // workload.num_kv_heads)
        f["log2_head_dim"] = math.log2(workload.head_dim)
    else:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {sorted(FEATURES)}")
    return {name: float(f[name]) for name in feature_names(kernel)}


def encode(kernel: str, raw: Mapping[str, float]) -> np.ndarray:
    """Scale raw features (a mapping with every name of feature_names(kernel)) to the float32 observation."""
    missing = [name for name in feature_names(kernel) if name not in raw]
    if missing:
        raise ValueError(f"{kernel} observation needs features {missing}; have {sorted(raw)}")
    out = np.empty(len(FEATURES[kernel]), dtype=np.float32)
    for i, (name, lo, hi) in enumerate(FEATURES[kernel]):
        out[i] = 2.0 * (float(raw[name]) - lo) / (hi - lo) - 1.0
    return np.clip(out, -CLIP, CLIP)


def observe(workload: Any) -> np.ndarray:
    """The observation of one workload."""
    return encode(workload.kernel, raw_features(workload))


def actor_logits(params: Mapping[str, np.ndarray], activation: str, obs: np.ndarray) -> np.ndarray:
    """Forward pass of an exported actor (tracking.export_policy_arrays): hidden layers W{i}, b{i} with `activation`,
    then the action head. Here, beside the observation, so that the logged model and `kernel-gym tune` (on a GPU
    machine without MLflow) score a policy with the same numpy code."""
    act = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0)}[activation]
    x = np.asarray(obs, dtype=np.float32)
    i = 0
    while f"W{i}" in params:
        x = act(x @ params[f"W{i}"].T + params[f"b{i}"])
        i += 1
    return x @ params["W_out"].T + params["b_out"]
