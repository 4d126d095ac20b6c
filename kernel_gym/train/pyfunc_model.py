"""The learned policy as a self-contained MLflow pyfunc model (MLflow "models from code").

`mlflow.pyfunc.load_model(uri).predict(rows)` maps workload rows to configs without kernel_gym, torch or
stable-baselines3 installed: the actor network is stored as numpy arrays (policy.npz), the catalogue, feature order and
validity masks as JSON (policy.json), and the two stdlib/numpy-only modules the observation needs travel as
code_paths (kernel_gym_observation.py, kernel_gym_workloads.py, kernel_gym_profiles.py).

Input rows (a pandas DataFrame), one per workload, either
- `workload_key`: the workload's canonical key (kernel_gym.kernels.workloads `workload.key()`), or
- the raw feature columns of kernel_gym.dispatch.observation.FEATURES[kernel] (e.g. log2_tokens, skew, ...).
An optional `kernel` column must match the model's kernel.

Output columns: `config` (canonical JSON of the knob values), `action` (catalogue index) and `mask_source`: which
validity mask was applied: "known" (a workload seen at training or evaluation: its exact mask), "rules" (kernel_gym
is importable: the knob space's rules) or "nearest" (the mask of the nearest known workload in observation space).

Loading it through MLflow runs this file (and whatever a crafted model ships instead): do that only for models you
made. kernel_gym's own commands never do; they read policy.json and policy.npz as data (train/safe_policy.py,
docs/integrity.md), with the same forward pass and masking as this class.

Imports at module level only the standard library, numpy and mlflow.
"""

from __future__ import annotations

import json
from typing import Any

import mlflow
import numpy as np
from mlflow.pyfunc import PythonModel


def _observation_module():
    try:
        import kernel_gym_observation as mod  # bundled with the logged model (code_paths)
    except ImportError:
        from kernel_gym.dispatch import observation as mod
    return mod


def _workloads_module():
    try:
        import kernel_gym_workloads as mod  # bundled with the logged model (code_paths)
    except ImportError:
        from kernel_gym.kernels import workloads as mod
    return mod


def actor_logits(params: dict[str, np.ndarray], activation: str, obs: np.ndarray) -> np.ndarray:
    """The actor's forward pass: the bundled observation module's (one implementation for the model and for tune)."""
    return _observation_module().actor_logits(params, activation, obs)


class KernelPolicyModel(PythonModel):
    """Workload rows -> configs, by the trained actor's masked argmax (deterministic)."""

    def load_context(self, context):
        with open(context.artifacts["policy_json"]) as f:
            self.meta = json.load(f)
        with np.load(context.artifacts["policy_npz"]) as data:
            self.params = {k: data[k] for k in data.files}
        self.kernel = self.meta["kernel"]
        self.configs = [json.dumps(c, separators=(",", ":"), sort_keys=True) for c in self.meta["configs"]]
        self.known_masks = {k: np.array(m, dtype=bool) for k, m in self.meta["known_masks"].items()}
        self.known_obs = {k: np.array(o, dtype=np.float32) for k, o in self.meta["known_obs"].items()}
        self.obs_mod = _observation_module()
        self.wl_mod = _workloads_module()

    def _rule_mask(self, workload: Any) -> np.ndarray | None:
        try:
            from kernel_gym.dispatch.catalogue import rule_mask
            from kernel_gym.kernels import get_family
            from kernel_gym.kernels.space import Config

            space = get_family(self.kernel).space
        except Exception:  # noqa: BLE001 - kernel_gym (or triton) absent: fall back to stored masks
            return None
        return rule_mask(space, [Config(c) for c in self.meta["configs"]], workload)

    def _mask(self, key: str | None, workload: Any, obs: np.ndarray) -> tuple[np.ndarray, str]:
        if key is not None and key in self.known_masks:
            return self.known_masks[key], "known"
        if workload is not None:
            mask = self._rule_mask(workload)
            if mask is not None and mask.any():
                return mask, "rules"
        nearest = min(self.known_obs, key=lambda k: float(np.sum((self.known_obs[k] - obs) ** 2)))
        return self.known_masks[nearest], "nearest"

    def predict(self, context, model_input, params=None):  # no type hints: MLflow would infer a wrong schema
        import pandas as pd

        df = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        names = self.obs_mod.feature_names(self.kernel)
        out = []
        for _, row in df.iterrows():
            if "kernel" in row and isinstance(row["kernel"], str) and row["kernel"] != self.kernel:
                raise ValueError(f"row kernel {row['kernel']!r} but this policy is for {self.kernel!r}")
            key, workload = None, None
            if "workload_key" in row and isinstance(row["workload_key"], str) and row["workload_key"]:
                key = row["workload_key"]
                workload = self.wl_mod.workload_from_key(self.kernel, key)
                raw = self.obs_mod.raw_features(workload)
            else:
                missing = [n for n in names if n not in row or pd.isna(row[n])]
                if missing:
                    raise ValueError(
                        f"row {dict(row)} has neither a workload_key nor the feature columns {missing} "
                        f"({self.kernel} needs {names})"
                    )
                raw = {n: float(row[n]) for n in names}
            obs = self.obs_mod.encode(self.kernel, raw)
            mask, source = self._mask(key, workload, obs)
            logits = actor_logits(self.params, self.meta["activation"], obs[None, :])[0]
            action = int(np.argmax(np.where(mask, logits, -np.inf)))
            out.append({"config": self.configs[action], "action": action, "mask_source": source})
        return pd.DataFrame(out, columns=["config", "action", "mask_source"])


mlflow.models.set_model(KernelPolicyModel())
