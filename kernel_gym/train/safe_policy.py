"""Loading a policy without running anything it ships: the trust boundary of export, replay, tune and --policy-dir.

A logged kernel_gym policy is an MLflow "models from code" pyfunc: `mlflow.pyfunc.load_model` would execute the
Python file inside the model folder (and a crafted model can hold a cloudpickle payload instead). A policy a user
receives (a model folder, a file:// URI, a shared mlruns/ store) must never do that. So every user-facing path reads
only the two data files of the policy, `artifacts/policy.json` and `artifacts/policy.npz`, with
`np.load(allow_pickle=False)`, after checking them as data:

- the .npz: each member's .npy header is read (np.lib.format) and checked before any array is allocated: float
  dtype, the shapes of an MLP actor (W0 obs x hidden ... W_out actions), the observation width of the kernel, a
  bounded element count, a member size that matches its header; then every weight finite;
- the JSON: a known kernel and activation, configs with the kernel's knobs and allowed values, one per action,
  masks and observations of the right widths, and a provenance whose claims agree with each other
  (`model_conditioned` only with several model specs, each spec a valid ModelSpec; env id of this kernel).

Errors are one line naming the file. The forward pass and masking are kernel_gym's own code (dispatch/observation.py),
the same the logged model runs, so predictions equal the pyfunc's (tests/test_integrity_trust.py checks it).
"""

from __future__ import annotations

import functools
import json
import math
import tempfile
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

MAX_ELEMENTS = 1 << 24        # per array: 16 M floats (the project's actors have ~10^4)
MAX_TOTAL_ELEMENTS = 1 << 25
MAX_JSON_BYTES = 256 << 20
MAX_LAYERS = 16
MAX_ACTIONS = 1 << 16
ACTIVATIONS = ("tanh", "relu")
POLICY_JSON, POLICY_NPZ = "policy.json", "policy.npz"


class PolicyFileError(ValueError):
    """A policy file that is not a valid kernel_gym policy (one line, naming the file)."""


# ---- locating the files ----------------------------------------------------------------------------------------------


def _local_dir(uri: str) -> Path | None:
    """The folder of a path or file:// URI, else None (a store URI: models:/, runs:/, ...)."""
    if uri.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(uri).path))
    if "://" in uri or uri.startswith(("models:/", "runs:/")):
        return None
    return Path(uri)


def policy_files(uri: str, workdir: Path) -> tuple[Path, Path]:
    """(policy.json, policy.npz) of the logged policy at `uri`: read in place for a folder, else only these two files
    copied out of the MLflow store (download_artifacts copies files; nothing is imported or unpickled, and nothing
    else a crafted model holds is fetched)."""
    local = _local_dir(uri)
    if local is None:
        import mlflow

        files = []
        for name in (POLICY_JSON, POLICY_NPZ):
            try:
                files.append(Path(mlflow.artifacts.download_artifacts(
                    artifact_uri=f"{uri.rstrip('/')}/artifacts/{name}", dst_path=str(workdir / name[-4:]))))
            except Exception as exc:  # noqa: BLE001 - MLflow raises many types; the user needs the URI and the fix
                raise PolicyFileError(f"cannot load policy {uri!r} ({type(exc).__name__}: {str(exc)[:200]}); "
                                      "list the registered models with `kernel-gym ui`, or train one with "
                                      "`kernel-gym train` (a kernel_gym policy holds artifacts/policy.json and "
                                      "artifacts/policy.npz)") from exc
        return files[0], files[1]
    if not local.is_dir():
        raise PolicyFileError(f"policy {uri!r}: {local} is not a folder; pass a logged model's folder "
                              "(it holds artifacts/policy.json and artifacts/policy.npz) or a models:/NAME/VERSION URI")
    files = []
    for name in (POLICY_JSON, POLICY_NPZ):
        p = local / "artifacts" / name
        if p.is_symlink() or not p.is_file():
            raise PolicyFileError(f"policy {uri!r}: {p} is missing (or not a plain file): not a kernel_gym policy "
                                  "(a logged kernel_gym model holds artifacts/policy.json and artifacts/policy.npz)")
        files.append(p)
    return files[0], files[1]


# ---- checking the arrays ---------------------------------------------------------------------------------------------


def _npy_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """name -> (shape, dtype) of every member of an .npz, read from the headers only (nothing allocated)."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise PolicyFileError(f"{path}: not an .npz (zip) file ({exc}); write policies with kernel-gym") from exc
    with zf:
        for info in zf.infolist():
            name = info.filename
            if not name.endswith(".npy") or "/" in name or name[:-4] in out:
                raise PolicyFileError(f"{path}: unexpected member {name!r}; a policy .npz holds only W*.npy/b*.npy")
            with zf.open(info) as f:
                try:
                    version = np.lib.format.read_magic(f)
                    if version == (1, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                    elif version == (2, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                    else:
                        raise ValueError(f"npy format version {version}")
                    header_len = f.tell()
                except ValueError as exc:
                    raise PolicyFileError(f"{path}: member {name!r} has a bad .npy header ({exc})") from exc
            if dtype.kind != "f" or dtype.hasobject or dtype.itemsize not in (4, 8):
                raise PolicyFileError(f"{path}: member {name!r} has dtype {dtype}; policy weights are float32/64")
            n = math.prod(shape)
            if any(int(d) < 0 for d in shape) or n > MAX_ELEMENTS:
                raise PolicyFileError(f"{path}: member {name!r} claims shape {shape} ({n} elements, limit "
                                      f"{MAX_ELEMENTS}): not a kernel_gym policy")
            if info.file_size != header_len + n * dtype.itemsize:
                raise PolicyFileError(f"{path}: member {name!r} holds {info.file_size} bytes but its header says "
                                      f"{header_len + n * dtype.itemsize} (shape {shape}): a corrupt or crafted file")
            out[name[:-4]] = (tuple(int(d) for d in shape), dtype)
    if sum(math.prod(s) for s, _ in out.values()) > MAX_TOTAL_ELEMENTS:
        raise PolicyFileError(f"{path}: more than {MAX_TOTAL_ELEMENTS} weights in all: not a kernel_gym policy")
    return out


def check_actor_shapes(path: Path, shapes: dict[str, tuple[int, ...]], obs_dim: int, n_actions: int) -> None:
    """The arrays of an MLP actor: W0 (h0, obs_dim), b0 (h0,), W{i} (h_i, h_{i-1}), W_out (actions, h_last)."""
    hidden = 0
    while f"W{hidden}" in shapes:
        hidden += 1
    if hidden > MAX_LAYERS:
        raise PolicyFileError(f"{path}: {hidden} hidden layers (limit {MAX_LAYERS})")
    want = {f"W{i}" for i in range(hidden)} | {f"b{i}" for i in range(hidden)} | {"W_out", "b_out"}
    if set(shapes) != want:
        raise PolicyFileError(f"{path}: arrays {sorted(shapes)}, expected {sorted(want)}")
    width = obs_dim
    for i in range(hidden):
        w, b = shapes[f"W{i}"], shapes[f"b{i}"]
        if len(w) != 2 or w[1] != width or w[0] < 1 or b != (w[0],):
            raise PolicyFileError(f"{path}: W{i} {w} / b{i} {b} do not chain from width {width}")
        width = w[0]
    if shapes["W_out"] != (n_actions, width) or shapes["b_out"] != (n_actions,):
        raise PolicyFileError(f"{path}: W_out {shapes['W_out']} / b_out {shapes['b_out']}, expected "
                              f"({n_actions}, {width}) / ({n_actions},) for {n_actions} configs")


def load_arrays(path: Path, obs_dim: int, n_actions: int) -> dict[str, np.ndarray]:
    """The actor's arrays, checked (headers, shapes) before loading, finite after; never unpickles."""
    headers = _npy_headers(path)
    check_actor_shapes(path, {k: s for k, (s, _) in headers.items()}, obs_dim, n_actions)
    try:
        with np.load(path, allow_pickle=False) as data:
            params = {k: np.asarray(data[k], dtype=np.float32) for k in data.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise PolicyFileError(f"{path}: cannot read the arrays ({exc})") from exc
    bad = [k for k, a in params.items() if not np.isfinite(a).all()]
    if bad:
        raise PolicyFileError(f"{path}: non-finite weights (NaN or inf) in {sorted(bad)}: a broken or crafted policy")
    return params


# ---- checking the JSON -----------------------------------------------------------------------------------------------


def knob_problem(space: Any, config: Any) -> str | None:
    """Why a config's knobs are not the space's (names, allowed values), without a workload's rules; None if fine."""
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        return f"config {config!r} is not an object of knob values"
    optional = {k.name for k in space.knobs if k.legacy is not None}
    names = set(space.names)
    if not names - optional <= set(config) <= names:
        return f"config knobs {sorted(config)} differ from the space's knobs {sorted(names)}"
    for knob in space.knobs:
        if knob.name in config:
            v = config[knob.name]
            if isinstance(v, bool) or v not in knob.values:
                return f"{knob.name}={v!r} is not one of {list(knob.values)}"
    return None


def checked_specs(where: str, specs: Any) -> list[dict[str, Any]] | None:
    """A provenance's model specs, each validated as a ModelSpec (and written with today's fields), or None."""
    if specs is None:
        return None
    if not isinstance(specs, list) or not specs or not all(isinstance(s, dict) for s in specs):
        raise PolicyFileError(f"{where}: model_specs must be a non-empty list of model specs")
    from kernel_gym.models import spec_from_dict

    out = []
    for s in specs:
        if set(s) == {"name"}:  # the bare name older runs recorded
            out.append(dict(s))
            continue
        try:
            out.append(asdict(spec_from_dict(s, where)))
        except (TypeError, ValueError) as exc:
            raise PolicyFileError(f"{where}: model_specs: {exc}") from exc
    return out


def check_provenance(where: str, kernel: str, prov: dict[str, Any]) -> dict[str, Any]:
    """The provenance's claims checked against each other: env id of this kernel, specs valid, model_conditioned
    (which skips the model identity check at export) only for a policy trained on several model specs."""
    from kernel_gym.envs import ENV_KERNELS

    if not isinstance(prov, dict):
        raise PolicyFileError(f"{where}: provenance must be an object")
    out = dict(prov)
    env_id = prov.get("env_id") or ""
    if env_id and ENV_KERNELS.get(env_id) != kernel:
        raise PolicyFileError(f"{where}: env_id {env_id!r} is not an env of {kernel!r}")
    specs = checked_specs(where, prov.get("model_specs"))
    conditioned = prov.get("model_conditioned", False)
    if not isinstance(conditioned, bool):
        raise PolicyFileError(f"{where}: model_conditioned must be true or false, got {conditioned!r}")
    if conditioned and (specs is None or len(specs) < 2):
        raise PolicyFileError(f"{where}: claims model_conditioned but names {0 if specs is None else len(specs)} "
                              "model spec(s); a model-conditioned policy is trained on several (kernel-gym train "
                              "--model zoo)")
    if specs is not None and len(specs) > 1 and not conditioned:
        raise PolicyFileError(f"{where}: trained on {len(specs)} model specs but not marked model_conditioned")
    out["model_specs"], out["model_conditioned"] = specs, conditioned
    return out


def check_meta(path: Path, meta: Any, need_masks: bool) -> tuple[str, int]:
    """(kernel, observation width) of a policy JSON whose fields are checked; configs hold known knobs."""
    from kernel_gym.dispatch.observation import feature_names
    from kernel_gym.kernels import FAMILY_NAMES, get_family

    if not isinstance(meta, dict):
        raise PolicyFileError(f"{path}: not a policy (a JSON object expected)")
    kernel = meta.get("kernel")
    if kernel not in FAMILY_NAMES:
        raise PolicyFileError(f"{path}: kernel {kernel!r} is not one of {list(FAMILY_NAMES)}")
    if meta.get("activation", "tanh") not in ACTIVATIONS:
        raise PolicyFileError(f"{path}: activation {meta.get('activation')!r} is not one of {list(ACTIVATIONS)}")
    names = feature_names(kernel)
    if "feature_names" in meta and meta["feature_names"] != names:
        raise PolicyFileError(f"{path}: observation features {meta['feature_names']} differ from this kernel_gym's "
                              f"{names}: retrain the policy with this version")
    configs = meta.get("configs")
    if not isinstance(configs, list) or not 1 <= len(configs) <= MAX_ACTIONS:
        raise PolicyFileError(f"{path}: configs must be a list of 1..{MAX_ACTIONS} knob objects")
    space = get_family(kernel).space
    for i, c in enumerate(configs):
        problem = knob_problem(space, c)
        if problem:
            raise PolicyFileError(f"{path}: configs[{i}]: {problem} ({kernel})")
    if len({json.dumps(c, sort_keys=True) for c in configs}) != len(configs):
        raise PolicyFileError(f"{path}: configs repeat an entry")
    if need_masks:
        masks, obs = meta.get("known_masks"), meta.get("known_obs")
        if not isinstance(masks, dict) or not isinstance(obs, dict) or set(masks) != set(obs):
            raise PolicyFileError(f"{path}: known_masks and known_obs must be objects with the same workload keys")
        for k, m in masks.items():
            if not isinstance(m, list) or len(m) != len(configs) or not all(isinstance(x, bool) for x in m):
                raise PolicyFileError(f"{path}: known_masks[{k[:80]}] must be {len(configs)} booleans")
        for k, o in obs.items():
            if (not isinstance(o, list) or len(o) != len(names)
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                               for x in o)):
                raise PolicyFileError(f"{path}: known_obs[{k[:80]}] must be {len(names)} finite numbers")
    return kernel, len(names)


def read_json(path: Path) -> Any:
    if path.stat().st_size > MAX_JSON_BYTES:
        raise PolicyFileError(f"{path}: {path.stat().st_size} bytes, over the {MAX_JSON_BYTES} limit of a policy")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PolicyFileError(f"{path}: not valid JSON ({exc})") from exc


# ---- the policy ----------------------------------------------------------------------------------------------------


class SafePolicy:
    """A checked policy: workloads -> configs by the actor's masked argmax, as the logged pyfunc model answers
    (mask: the workload's stored mask when it was seen, else the knob-space rules, else the nearest seen one's)."""

    def __init__(self, meta: dict[str, Any], params: dict[str, np.ndarray], provenance: dict[str, Any]) -> None:
        from kernel_gym.kernels import get_family
        from kernel_gym.kernels.space import Config

        self.meta, self.params, self.provenance = meta, params, provenance
        self.kernel = meta["kernel"]
        self.family = get_family(self.kernel)
        self.configs = [Config(c) for c in meta["configs"]]
        self.known_masks = {k: np.array(m, dtype=bool) for k, m in (meta.get("known_masks") or {}).items()}
        self.known_obs = {k: np.array(o, dtype=np.float32) for k, o in (meta.get("known_obs") or {}).items()}

    def choose(self, workload: Any) -> Any:
        from kernel_gym.dispatch import observation

        obs = observation.observe(workload)
        mask = self.known_masks.get(workload.key())
        if mask is None:
            from kernel_gym.dispatch.catalogue import rule_mask

            mask = rule_mask(self.family.space, self.configs, workload)
            if not mask.any() and self.known_obs:
                near = min(self.known_obs, key=lambda k: float(np.sum((self.known_obs[k] - obs) ** 2)))
                mask = self.known_masks[near]
        if not mask.any():
            return self.family.default_config(workload)
        logits = observation.actor_logits(self.params, self.meta.get("activation", "tanh"), obs[None, :])[0]
        return self.configs[int(np.argmax(np.where(mask, logits, -np.inf)))]

    def predict(self, workloads: list[Any]) -> list[Any]:
        return [self.choose(w) for w in workloads]


def load_safe_policy(uri: str) -> SafePolicy:
    """The logged policy at `uri` (models:/NAME/VERSION, runs:/..., a model folder or file:// URI), checked as data."""
    with tempfile.TemporaryDirectory(prefix="kernel-gym-policy-") as tmp:
        json_path, npz_path = policy_files(uri, Path(tmp))
        meta = read_json(json_path)
        kernel, obs_dim = check_meta(json_path, meta, need_masks=True)
        params = load_arrays(npz_path, obs_dim, len(meta["configs"]))
    run_id = str(meta.get("run_id", ""))
    prov = check_provenance(str(json_path), kernel, {
        "model_uri": uri, "run_id": run_id, "env_id": meta.get("env_id", ""),
        "model_specs": meta.get("model_specs"), "model_conditioned": meta.get("model_conditioned", False),
        # a policy from the tracking store may predate the field: its run's tag says (a copied folder: unknown)
        "dataset_sha256_16": str(meta.get("dataset_sha256_16")
                                 or (run_dataset_hash(run_id) if uri.startswith(("models:/", "runs:/")) else ""))})
    return SafePolicy(meta, params, prov)


@functools.lru_cache(maxsize=256)  # one tracking-store call per run and process (export loads several policies)
def run_dataset_hash(run_id: str) -> str:
    """The recorded dataset a training run learned from (its `data.dataset_hash` tag), for policies logged before
    policy.json carried it; "" when the run is not in the tracking store or has no such tag."""
    if not run_id:
        return ""
    try:
        import mlflow

        tag = mlflow.get_run(run_id).data.tags.get("data.dataset_hash", "")
    except Exception:  # noqa: BLE001 - a run outside this store (a copied model folder): the hash is unknown
        return ""
    return "" if tag in ("", "n/a") else str(tag)


def load_bundle_files(json_path: Path, npz_path: Path, kernel: str) -> tuple[dict, dict, dict]:
    """(meta, arrays, provenance) of a `tune --policy-dir` bundle, checked like a logged policy."""
    meta = read_json(json_path)
    got, obs_dim = check_meta(json_path, meta, need_masks=False)
    if got != kernel:
        raise PolicyFileError(f"{json_path} holds a {got!r} policy, not {kernel!r}")
    params = load_arrays(npz_path, obs_dim, len(meta["configs"]))
    prov = check_provenance(str(json_path), kernel, meta.get("provenance", {}))
    return meta, params, prov
