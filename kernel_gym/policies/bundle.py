"""Policy bundles for `kernel-gym tune --policy-dir`: a policy as plain files (KERNEL.json + KERNEL.npz), so a GPU
machine without MLflow can rank candidates with the same numpy forward pass as the logged model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def policy_bundle(uri: str, kernel: str) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """(meta, actor arrays, provenance) of a logged pyfunc policy (needs MLflow)."""
    import mlflow

    from kernel_gym.policies.export import load_policy

    _, _, provenance = load_policy(uri, kernel)
    inner = mlflow.pyfunc.load_model(uri).unwrap_python_model()
    return dict(inner.meta), dict(inner.params), provenance


def save_bundle(folder: Path, kernel: str, meta: dict[str, Any], params: dict[str, np.ndarray],
                provenance: dict[str, Any]) -> None:
    """KERNEL.json (catalogue, activation, provenance) and KERNEL.npz (actor): all `tune` needs, without MLflow."""
    folder.mkdir(parents=True, exist_ok=True)
    keep = {k: meta[k] for k in ("kernel", "configs", "activation") if k in meta}
    (folder / f"{kernel}.json").write_text(json.dumps({**keep, "provenance": provenance}, indent=1))
    np.savez(folder / f"{kernel}.npz", **params)


def load_bundle(folder: Path, kernel: str) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    paths = [folder / f"{kernel}.json", folder / f"{kernel}.npz"]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise ValueError(f"--policy-dir {folder}: missing {missing}; write them with `kernel-gym tune --model M "
                         f"--save-policies {folder}` where the MLflow store is")
    meta = json.loads(paths[0].read_text())
    if meta.get("kernel") != kernel:
        raise ValueError(f"{paths[0]} holds a {meta.get('kernel')!r} policy, not {kernel!r}")
    with np.load(paths[1]) as data:
        params = {k: data[k] for k in data.files}
    return meta, params, meta.get("provenance", {})
