"""The observation every kernel env and the logged policy share: a workload's features, scaled to about [-1, 1].

Imports only the standard library, numpy and the kernel profiles (kernels/profiles.py, which import nothing from
kernel_gym): the MLflow pyfunc model bundles this file and the profiles verbatim (code_paths: kernel_gym_observation.py
and kernel_gym_profiles.py) so that a logged policy computes exactly the observation it was trained on, anywhere.

Raw features are `workload.features()` plus the shape numbers that are constant within one model but let one policy
tell models apart (hidden size, experts, heads, head dim, dtype width). Each is mapped linearly from a fixed range
(lo, hi) to [-1, 1] and clipped to [-CLIP, CLIP]: fixed ranges, not statistics of the training data, so the encoding
never depends on which workloads a run happened to see.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

if __name__ == "kernel_gym_observation":  # bundled beside a logged model: the profiles bundled with it
    import kernel_gym_profiles as _profiles  # type: ignore[import-not-found]
else:
    from kernel_gym.kernels import profiles as _profiles

CLIP = 4.0
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


# A live Mapping over the profile registry, as kernels.FAMILY_MODULES is (duplicate scan: the same __iter__ and
# __len__): each maps a profile to a different field, and these are the methods Mapping asks for.
class _Features(Mapping):
    """kernel -> ((feature name, lo, hi), ...): each profile's `features`, read live (kernels/profiles.py). Order is
    the observation order; bump the env version when it changes."""

    def __getitem__(self, kernel: str) -> tuple[tuple[str, float, float], ...]:
        p = _profiles.PROFILES.get(kernel)
        if p is None:
            raise KeyError(kernel)
        return p.features

    def __iter__(self) -> Iterator[str]:
        return iter(list(_profiles.PROFILES))

    def __len__(self) -> int:
        return len(_profiles.PROFILES)


FEATURES: Mapping[str, tuple[tuple[str, float, float], ...]] = _Features()


def feature_names(kernel: str) -> list[str]:
    if kernel not in FEATURES:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {sorted(FEATURES)}")
    return [name for name, _, _ in FEATURES[kernel]]


def raw_features(workload: Any, kernel: str | None = None) -> dict[str, float]:
    """Unscaled features of a workload object (any of kernel_gym.kernels.workloads' dataclasses, duck-typed): its
    features() plus its profile's extra_features (the shape numbers) and the dtype width. `kernel`: the profile to
    read (default: the workload's own kernel field)."""
    kernel = kernel or workload.kernel
    if kernel not in FEATURES:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {sorted(FEATURES)}")
    f = dict(workload.features())
    f["dtype_bytes"] = float(DTYPE_BYTES[workload.dtype])
    f.update(_profiles.PROFILES[kernel].extra_features(workload))
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
