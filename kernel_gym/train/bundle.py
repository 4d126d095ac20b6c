"""Policy bundles for `kernel-gym tune --policy-dir`: a policy as plain files (KERNEL.json + KERNEL.npz), so a GPU
machine without MLflow can rank candidates with the same numpy forward pass as the logged model.

A bundle is data only: the arrays load with allow_pickle=False after their headers and shapes are checked, the JSON's
configs, activation and provenance are checked (train/safe_policy.py); a crafted bundle fails in one line naming
the file, and nothing in it is executed.

Optional beside a fused_moe bundle: fused_moe.cost.npz + fused_moe.cost.json, the learned cost model
(kernel_gym/dispatch/cost_model.py) that re-ranks the zero-shot candidates; a bundle without it answers with the
policy's own top-1, as before."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

NPZ_DIGEST = "npz_sha256"  # KERNEL.json's key for the sha256 of KERNEL.npz


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

    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".{kernel}.{os.getpid()}.probe"
        probe.touch()
        probe.unlink()
    except OSError as exc:  # a file in the way, a read-only folder: said before any file of the bundle is replaced
        raise ValueError(f"--save-policies {folder}: cannot write there ({exc.strerror}: {exc.filename}): pass a "
                         "writable folder (a new one, or one written by --save-policies before)") from None
    if cost_model == "auto":
        cost_model = None
        if kernel == cm.KERNEL and provenance.get("model_conditioned") is True:
            cost_model = cm.packaged()
    if cost_model is not None and kernel == cm.KERNEL:
        cost_model.save(folder)
    keep = {k: meta[k] for k in ("kernel", "configs", "activation") if k in meta}
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in params.items()})
    arrays = buf.getvalue()
    # the JSON names its arrays' digest: a save cut between the two renames (new .npz, old .json) or a copy that
    # mixed two saves reads as an error, not as one policy's weights over another's catalogue
    text = json.dumps({**keep, NPZ_DIGEST: hashlib.sha256(arrays).hexdigest(), "provenance": provenance},
                      indent=1).encode()
    _atomic_write(folder / f"{kernel}.npz", lambda f: f.write(arrays))
    _atomic_write(folder / f"{kernel}.json", lambda f: f.write(text))


def load_bundle(folder: Path, kernel: str) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """(meta, arrays, provenance) of KERNEL.json/.npz in `folder`, checked as data (safe_policy.load_bundle_files)."""
    from kernel_gym.train.safe_policy import load_bundle_files

    paths = [Path(folder) / f"{kernel}.json", Path(folder) / f"{kernel}.npz"]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"--policy-dir {folder}: missing {missing}; write them with `kernel-gym tune --model M "
                         f"--save-policies {folder}` where the MLflow store is")
    meta, params, provenance = load_bundle_files(paths[0], paths[1], kernel)
    want = meta.get(NPZ_DIGEST)  # bundles written before the digest have none
    if want is not None and hashlib.sha256(paths[1].read_bytes()).hexdigest() != want:
        raise ValueError(f"--policy-dir {folder}: {paths[1].name} is not the array file {paths[0].name} was saved "
                         "with (the two come from different saves, or a save was cut off): write the bundle again "
                         f"with `kernel-gym tune --model M --save-policies {folder}` where the MLflow store is")
    return meta, params, provenance


def load_cost_model(folder: Path, kernel: str) -> Any:
    """The cost model beside a bundle (fused_moe.cost.npz/.json, read as data), or None where the folder has none or
    the kernel has no cost model: the caller then keeps the policy's own top-1."""
    from kernel_gym.dispatch import cost_model as cm

    if kernel != cm.KERNEL or not cm.exists(folder):
        return None
    return cm.load(folder)
