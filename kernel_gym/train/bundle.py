"""Policy bundles for `kernel-gym tune --policy-dir`: a policy as plain files (KERNEL.json + KERNEL.npz), so a GPU
machine without MLflow can rank candidates with the same numpy forward pass as the logged model.

A bundle is data only: the arrays load with allow_pickle=False after their headers and shapes are checked, the JSON's
configs, activation and provenance are checked (train/safe_policy.py); a crafted bundle fails in one line naming
the file, and nothing in it is executed.

Optional beside a fused_moe bundle: fused_moe.cost.npz + fused_moe.cost.json, the learned cost model
(kernel_gym/dispatch/cost_model.py) that re-ranks the zero-shot candidates; a bundle without it answers with the
policy's own top-1, as before."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def policy_bundle(uri: str, kernel: str) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """(meta, actor arrays, provenance) of a logged policy, read as data (safe_policy: no model code runs)."""
    from kernel_gym.train.safe_policy import load_safe_policy

    policy = load_safe_policy(uri)
    if policy.kernel != kernel:
        raise ValueError(f"--model-uri {kernel}={uri}: that policy is for {policy.kernel!r}, not {kernel!r}")
    return dict(policy.meta), dict(policy.params), policy.provenance


def _atomic_write(path: Path, write: Any) -> None:
    """Write through a temp file in the same folder, fsync, rename: a kill never leaves half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_bundle(folder: Path, kernel: str, meta: dict[str, Any], params: dict[str, np.ndarray],
                provenance: dict[str, Any], cost_model: Any = None) -> None:
    """KERNEL.json (catalogue, activation, provenance) and KERNEL.npz (actor): all `tune` needs, without MLflow.
    cost_model: a CostModel to write beside a fused_moe bundle; "auto" writes the packaged dataset's
    (cost_model.packaged(): fitted once, cached) beside a model-conditioned fused_moe policy, the one that answers
    zero-shot for models never measured; None (the default: a bundle's choices stay the policy's own unless asked)
    writes none."""
    from kernel_gym.dispatch import cost_model as cm  # cm.KERNEL: the kernel the re-ranking cost model is fitted for

    folder.mkdir(parents=True, exist_ok=True)
    if cost_model == "auto":
        cost_model = None
        if kernel == cm.KERNEL and provenance.get("model_conditioned") is True:
            cost_model = cm.packaged()
    if cost_model is not None and kernel == cm.KERNEL:
        cost_model.save(folder)
    keep = {k: meta[k] for k in ("kernel", "configs", "activation") if k in meta}
    text = json.dumps({**keep, "provenance": provenance}, indent=1).encode()
    _atomic_write(folder / f"{kernel}.npz", lambda f: np.savez(f, **{k: np.asarray(v) for k, v in params.items()}))
    _atomic_write(folder / f"{kernel}.json", lambda f: f.write(text))


def load_bundle(folder: Path, kernel: str) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """(meta, arrays, provenance) of KERNEL.json/.npz in `folder`, checked as data (safe_policy.load_bundle_files)."""
    from kernel_gym.train.safe_policy import load_bundle_files

    paths = [Path(folder) / f"{kernel}.json", Path(folder) / f"{kernel}.npz"]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"--policy-dir {folder}: missing {missing}; write them with `kernel-gym tune --model M "
                         f"--save-policies {folder}` where the MLflow store is")
    return load_bundle_files(paths[0], paths[1], kernel)


def load_cost_model(folder: Path, kernel: str) -> Any:
    """The cost model beside a bundle (fused_moe.cost.npz/.json, read as data), or None where the folder has none or
    the kernel has no cost model: the caller then keeps the policy's own top-1."""
    from kernel_gym.dispatch import cost_model as cm

    if kernel != cm.KERNEL or not cm.exists(folder):
        return None
    return cm.load(folder)
