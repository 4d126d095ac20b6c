"""Export a learned policy for a deployment: a dispatch table (JSON) and vLLM fused-MoE config files.

`kernel-gym export --model-uri models:/kernel-gym-moe-v0-mixtral-8x7b/1 --format dispatch|vllm --out DIR` loads each
policy (an MLflow pyfunc, kernel_gym.train.pyfunc_model), asks it for a config on a grid of workload buckets per
kernel (the model's collection grid, plus routing skews for MoE) and writes:
- dispatch: DIR/dispatch_table.json (kernel_gym.dispatch.dispatcher.DispatchTable: buckets, configs, device,
  versions, the policy each kernel came from);
- vllm / sglang: the engine's fused-MoE config file, chosen among configs measured in the vllm_fused_moe family
  (vLLM's own kernel) with the engine's shipped entry always a candidate: kernel_gym.deploy.engine_export.
Both are plain JSON: loading them needs no pickle and no kernel_gym.

The dispatch table's `meta.rests_on` says per kernel what its choices rest on (measured / zero-shot with the policy's
identity / tuned / estimate / absent: kernel_basis), and the command prints one line per kernel it leaves out, since
a deployment then runs that family's default config there. `--policy-dir DIR` reads policy bundles (KERNEL.json +
KERNEL.npz, train/bundle.py) instead of MLflow: the zoo policies the repository ships are in
benchmarks/generalisation/policies.
"""

from __future__ import annotations

import functools
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from kernel_gym import zoo
from kernel_gym.dispatch.baselines import unmeasured_kernels
from kernel_gym.dispatch.dispatcher import (  # noqa: F401 - the bucket grid and KV-layout choice, re-exported
    AXES,
    EXPORT_SKEWS,
    LAYOUT_COVERAGE,
    DispatchTable,
    KernelTable,
    bucket_grid,
    cell_workload,
    fixed_dims,
    grid_centers,
    layout_scores,
    pick_layout,
    prefill_lens,
    put_on_layout,
)
from kernel_gym.kernels import profiles
from kernel_gym.kernels.space import Config

# A predictor maps workloads to configs (one call per kernel: a pyfunc predict, a backend's oracle, a test function).
Predictor = Callable[[list[Any]], list[Config]]

DEFAULT_DEVICE = "NVIDIA H200"
TABLE_FILE = "dispatch_table.json"


def build_kernel_table(kernel: str, model: Any, predict: Predictor, policy: dict[str, Any],
                       dtype: str = "bfloat16", kv_layout: tuple[int, str] | None = None,
                       scorer: Any = None) -> KernelTable:
    """Query the predictor on every bucket of the kernel's grid. Decode: every config is put on one KV layout
    (dispatcher.put_on_layout: the one given, else the best on the measured data `scorer`, else the most frequent)."""
    c0, c1, wls = bucket_grid(kernel, model, dtype)
    configs = list(predict(wls))
    if len(configs) != len(wls):
        raise ValueError(f"{kernel}: the policy returned {len(configs)} configs for {len(wls)} workloads")
    configs, layout = put_on_layout(kernel, configs, wls, kv_layout, scorer)
    unique = list(dict.fromkeys(configs))
    index = {c: i for i, c in enumerate(unique)}
    return KernelTable(kernel, (c0, c1), unique, [index[c] for c in configs], fixed_dims(kernel, model, dtype),
                       policy, layout)


@functools.lru_cache(maxsize=1)
def recorded_backend() -> Any:
    """The packaged recorded data, loaded once per process (about 2 s)."""
    from kernel_gym.measure import make_backend

    return make_backend("recorded")


def default_scorer(device: str) -> Any:
    """The packaged recorded data when it was measured on `device` (it ranks the decode layouts), else None."""
    backend = recorded_backend()
    return backend if backend.device == device else None


def table_from_registry(model: Any, model_uris: Sequence[str] = (), device: str = DEFAULT_DEVICE,
                        kv_layout: tuple[int, str] | None = None, policy_dir: Path | None = None) -> DispatchTable:
    """The dispatch table of the given (or latest registered, or --policy-dir) policies, exactly as `kernel-gym
    export` writes it: the decode KV layout, unless given, chosen on the packaged measurements when they are of
    `device`; meta.rests_on filled (kernel_basis)."""
    if policy_dir is not None and model_uris:
        raise ValueError("--policy-dir and --model-uri both name the policies: pass one of them")
    policies = load_policy_dir(policy_dir, model) if policy_dir is not None else load_policies(model_uris, model)
    scorer = default_scorer(device) if kv_layout is None and any(profiles.profile(k).follows_kv for k in policies) \
        else None
    table = build_table(model, policies, device, kv_layout=kv_layout, scorer=scorer, rests_on=True)
    if model_uris:  # a kernel left out of an explicit --model-uri list may have a registered policy: say which
        registered = latest_model_uris(getattr(model, "name", None))
        for k, basis in table.meta.get("rests_on", {}).items():
            if basis.get("basis") == "absent" and k in registered and "fix" in basis:
                basis["fix"] = (f"pass --model-uri {k}={registered[k]} as well (registered in the store), or leave "
                                "--model-uri out to export every kernel's latest registered policy")
    return table


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for mod in ("kernel_gym", "triton", "torch", "mlflow"):
        try:
            out[mod] = str(__import__(mod).__version__)
        except Exception:  # noqa: BLE001 - a version we cannot read is left out, not invented
            pass
    try:
        from kernel_gym.train.tracking import git_commit

        out["git_commit"] = git_commit()
    except Exception:  # noqa: BLE001
        pass
    return out


def build_table(model: Any, predictors: dict[str, tuple[Predictor, dict[str, Any]]], device: str = DEFAULT_DEVICE,
                dtype: str = "bfloat16", kv_layout: tuple[int, str] | None = None, scorer: Any = None,
                rests_on: bool = True) -> DispatchTable:
    """A DispatchTable from one (predictor, policy provenance) per kernel (`scorer`: see build_kernel_table). With
    `rests_on` (reads the packaged data once), meta.rests_on says per kernel of TABLE_KERNELS what the choices rest on,
    including the kernels left out (kernel_basis)."""
    if not predictors:
        raise ValueError("no policy to export: pass at least one --model-uri")
    unable = {k: why for k in predictors if (why := cannot_run(k, model))}
    from kernel_gym.kernels.profiles import profile

    # only an attention kernel is left out (its head_dim rule); any other failure stops the export
    if any("head_dim" not in profile(k).fixed_fields for k in unable) or len(unable) == len(predictors):
        raise ValueError("; ".join(f"{k} cannot run {getattr(model, 'name', model)}'s shape ({why})"
                                   for k, why in unable.items()))
    kernels = {k: build_kernel_table(k, model, p, meta, dtype, kv_layout, scorer)
               for k, (p, meta) in predictors.items() if k not in unable}
    meta: dict[str, Any] = {}
    if rests_on:
        meta["rests_on"] = {k: kernel_basis(k, predictors.get(k, (None, None))[1], model, device,
                                            getattr(predictors.get(k, (None,))[0], "measured_cells", None),
                                            len(kernels[k].cells) if k in kernels else None)
                            for k in (*TABLE_KERNELS, *[k for k in predictors if k not in TABLE_KERNELS])}
    return DispatchTable(kernels, device, asdict(model), versions(), meta)


TABLE_KERNELS = tuple(AXES)  # the kernels with dispatch axes (their profiles'), in registration order


def cannot_run(kernel: str, model: Any) -> str:
    """Why the family cannot run the model's shape at all ('' when it can): the attention kernels take power-of-two
    head dims only, so a head_dim 96 model's attention table is left out of an export, its MoE table kept."""
    from kernel_gym.kernels import get_family

    try:
        get_family(kernel).default_config(bucket_grid(kernel, model)[2][0])
    except ValueError as exc:
        return str(exc)
    return ""


def model_arg(model: Any) -> str:
    """How a command line names the model: a built-in or zoo name as is; a JSON spec by its path, which a table does
    not keep ("SPEC.json")."""
    name = getattr(model, "name", str(model))
    try:
        from kernel_gym.models import load_model

        load_model(name)
        return name
    except (ValueError, FileNotFoundError, OSError):
        return "SPEC.json"


def train_command(kernel: str, model: Any) -> str:
    """The command that trains a policy for this kernel on the model's measured rows."""
    from kernel_gym.envs import env_id_for

    return f"kernel-gym train --env-id {env_id_for(kernel) or '...'} --model {model_arg(model)}"


def absent_fix(kernel: str, model: Any) -> str:
    """How to give a left-out kernel a policy: one trained on the model's measured rows, else the model-conditioned
    policy (MoE and decode only: no zoo prefill policy exists), else measure first."""
    from kernel_gym.envs import env_id_for

    env, as_arg = env_id_for(kernel) or "...", model_arg(model)
    if measured_model(kernel, model):
        return f"train one ({train_command(kernel, model)}) and export again"
    if kernel in zoo.TEST_MODELS:  # the kernels the model-conditioned policy is trained and tested on
        return (f"train the model-conditioned policy (kernel-gym train --model zoo --env-id {env}) or pass "
                f"--policy-dir {shipped_policy_dir()}, and export again")
    return (f"no model-conditioned {kernel} policy exists and the packaged data has no {kernel} rows of this shape: "
            f"measure them on a GPU (kernel-gym collect --model {as_arg} --kernels {kernel}), then "
            f"{train_command(kernel, model)}")


def policy_identity(provenance: dict[str, Any]) -> dict[str, Any]:
    """Where a kernel's choices came from, short enough for a table's meta: URI, run, bundle folder, training specs,
    and the recorded dataset it learned from (what a later reader of the table checks it against: stale_dataset)."""
    specs = provenance.get("model_specs") or []
    keys = ("model_uri", "run_id", "env_id", "policy_dir", "cost_model", "dataset_sha256_16")
    out = {k: provenance[k] for k in keys if provenance.get(k)}
    out["model_conditioned"] = bool(provenance.get("model_conditioned"))
    if specs:
        out["trained_on"] = len(specs) if len(specs) > 3 else [s.get("name", "?") for s in specs]
    return out


def stale_dataset(kernel: str, trained_on: str, model: Any) -> dict[str, Any]:
    """{"stale": ...} when a policy learned from another recorded dataset (`trained_on`, its 16-hex hash) than the
    packaged one: the packaged rows were re-timed, added or merged since, or the policy came from a newer package;
    either way its choices do not reflect these rows. The live runs' table, exported on 2026-11-30, chose fused-MoE
    configs 6-23% slower than the measured best at 256-4096 tokens; policies retrained on the current data 0-2.5%
    (benchmarks/live_e2e/tables/). {} when equal or unknown (a policy logged without the hash, outside the store)."""
    now = str(getattr(recorded_backend(), "dataset_hash", "") or "")
    if not trained_on or not now or trained_on == now:
        return {}
    return {"stale": {"trained_on_dataset": trained_on, "packaged_dataset": now,
                      "fix": f"retrain on the packaged data ({train_command(kernel, model)}, about a minute on 2 "
                             "cores) and export again"}}


def kernel_basis(kernel: str, provenance: dict[str, Any] | None, model: Any, device: str = DEFAULT_DEVICE,
                 measured_cells: int | None = None, cells: int | None = None) -> dict[str, Any]:
    """What one kernel's choices rest on, for the table's meta and the printed summary.

    basis: "measured" (a policy trained on measured rows of this model's shape), "zero-shot" (a model-conditioned
    policy that never trained on this shape: its choices follow from the shape's features), "tuned" (tune measured
    the policy's candidates at `measured_cells` of the grid's cells, the rest zero-shot), "estimate" (learned from
    another device's data, or a policy trained for the model without rows of its shape), "absent" (no policy: the
    Dispatcher answers with the family's default config)."""
    name = getattr(model, "name", str(model))
    why_not = cannot_run(kernel, model)
    if why_not:
        return {"basis": "absent", "deployment_runs": f"the engine's own {kernel} (kernel_gym's cannot run this shape; "
                "replay and plan price it zero-padded: models.kernel_spec)", "why": why_not,
                "fix": "for its tables, export a spec with the padded head_dim: they apply to the zero-padded call"}
    if provenance is None:
        return {"basis": "absent", "deployment_runs": "the family's default config (the Dispatcher's fallback)",
                "why": f"no {kernel} policy was exported", "fix": absent_fix(kernel, model)}
    ident = policy_identity(provenance)
    if provenance.get("tuned"):
        return {"basis": "tuned", "policy": ident, "measured_cells": measured_cells, "cells": cells,
                "why": f"tune measured the policy's candidates at {measured_cells} of {cells} cells; the other cells "
                       "hold its zero-shot choices"}
    data_device = recorded_backend().device
    measured = measured_model(kernel, model)
    specs = _trained_for(provenance)
    want = asdict(model) if hasattr(model, "__dataclass_fields__") else {"name": name}
    trained_here = None if specs is None else any(
        _same_kernels(s, want) or (set(s) == {"name"} and s.get("name") == name) for s in specs)
    if device != data_device:
        return {"basis": "estimate", "policy": ident,
                "why": f"the policy learned from {data_device} measurements; nothing was measured on {device}"}
    if measured and trained_here is not False:
        return {"basis": "measured", "policy": ident,
                "why": f"the policy trained on measured {data_device} rows of {name}'s {kernel} shape",
                **stale_dataset(kernel, str(provenance.get("dataset_sha256_16") or ""), model)}
    if provenance.get("model_conditioned"):
        seen = " (the packaged data has rows of this shape, but the policy never trained on them)" if measured else ""
        return {"basis": "zero-shot", "policy": ident,
                "why": f"the model-conditioned policy never trained on {name}{seen}: its choices follow from the "
                       "shape's features (measured quality on unseen models: docs/generalisation.md); "
                       "`kernel-gym tune` measures its candidates"}
    return {"basis": "estimate", "policy": ident,
            "why": f"the packaged data has no {kernel} rows of {name}'s shape: the policy's choices there are "
                   "extrapolated, not measured"}


# ---- MLflow pyfunc policies ------------------------------------------------------------------------------------------


def registered_kernel_names() -> dict[str, str]:
    """Registered model name stem (kernel-gym-<env>; -<model> and -conditioned are added to it) -> kernel."""
    from kernel_gym.envs import ENV_KERNELS

    return {f"kernel-gym-{env.split('/')[-1].lower()}": k for env, k in ENV_KERNELS.items()}


def load_policy(uri: str, kernel: str | None = None) -> tuple[str, Predictor, dict[str, Any]]:
    """(kernel, predictor, provenance) of a logged policy; the kernel comes from the model itself. Read as data
    (train/safe_policy.py: policy.json + policy.npz, checked, allow_pickle off): no code in the model runs, so a
    model folder, file:// URI or shared store received from someone else is safe to export, replay or tune."""
    from kernel_gym.train.safe_policy import load_safe_policy

    policy = load_safe_policy(uri)
    if kernel is not None and kernel != policy.kernel:
        raise ValueError(f"--model-uri {kernel}={uri}: that policy is for {policy.kernel!r}, not {kernel!r}")
    from kernel_gym.dispatch.cost_model import KERNEL as COST_MODEL_KERNEL

    if policy.kernel == COST_MODEL_KERNEL and policy.provenance.get("model_conditioned"):
        return policy.kernel, *reranked_zero_shot(policy)
    return policy.kernel, policy.predict, policy.provenance


def reranked_zero_shot(policy: Any) -> tuple[Predictor, dict[str, Any]]:
    """A model-conditioned fused_moe policy as `export --policy-dir` answers with the cost model the repository's
    bundles ship: at a workload it was trained on, its own choice (the measured configs' mask); anywhere else the
    whole valid space re-ranked by the packaged dataset's cost model (tune.zero_shot_ranker; fitted once, about a
    minute, then cached), because far from its training shapes the argmax alone fell to 0.917 / p5 0.680."""
    from kernel_gym.dispatch import cost_model as cm
    from kernel_gym.train.candidates import NearestWinners, zero_shot_ranker

    cost = cm.packaged()
    rank = zero_shot_ranker(policy.kernel, policy.meta, policy.params, cost, NearestWinners())

    def predict(workloads: list[Any]) -> list[Config]:
        return [policy.choose(w) if w.key() in policy.known_masks else next(iter(rank(w)), None)
                or policy.family.default_config(w) for w in workloads]

    return predict, {**policy.provenance, "cost_model": {
        "rerank": "unseen workloads: the whole valid space (with the policy's catalogue, nearest shapes' winners and "
                  "engine entry) ranked by the cost model", "dataset_sha256": cost.meta.get("dataset_sha256", "")}}


def _trained_for(provenance: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The model spec(s) a policy was trained for: its own metadata, else (policies logged before it carried them)
    the `model` parameter of its training run; None when neither says."""
    if provenance.get("model_specs"):
        return [_with_defaults(s) for s in provenance["model_specs"]]
    run_id = provenance.get("run_id") or ""
    try:
        import mlflow

        name = mlflow.tracking.MlflowClient().get_run(run_id).data.params.get("model") if run_id else None
    except Exception:  # noqa: BLE001 - a run that is gone (or never was) leaves the model unknown
        name = None
    if not name:
        return None
    try:
        from kernel_gym.models import load_model

        return [asdict(load_model(name))]
    except (ValueError, FileNotFoundError, OSError):
        return [{"name": name}]


# spec fields that shape no kernel a policy chooses for: how many layers of each kind, the experts' storage format,
# the shared experts (a dense MLP outside the fused MoE), the other layers' mixer state, the context limit. A policy
# trained for a spec that differs only in them (read from the same config.json before the reader learned them) is the
# model's policy still
OUTSIDE_KERNELS = ("moe_layers", "attention_layers", "dense_intermediate", "expert_quant", "num_shared_experts",
                   "shared_intermediate", "mixer_state_bytes", "mixer", "mixer_layers", "max_context", "fp8_block_n",
                   "fp8_block_k")


def _same_kernels(stored: Any, want: dict[str, Any]) -> bool:
    """Whether a stored spec and the model's agree on every field that shapes a kernel (OUTSIDE_KERNELS aside)."""
    if not isinstance(stored, dict) or set(stored) == {"name"}:
        return False
    keys = (set(stored) | set(want)) - set(OUTSIDE_KERNELS)
    return all(stored.get(k) == want.get(k) for k in keys)


def _with_defaults(spec: Any) -> Any:
    """A stored spec with the fields added to ModelSpec since it was logged at their defaults, so that a policy
    logged before a new field still matches its model; a spec that no longer reads stays as it was stored."""
    if not isinstance(spec, dict) or set(spec) == {"name"}:
        return spec
    try:
        from kernel_gym.models import spec_from_dict

        return asdict(spec_from_dict(spec))
    except (TypeError, ValueError):
        return spec


def check_policy_model(kernel: str, provenance: dict[str, Any], model: Any) -> str:
    """One line naming the policy (name, version, model) for `model` (a ModelSpec); ValueError, one line, when the
    policy was trained for another model and is not model-conditioned."""
    uri = provenance.get("model_uri", "")
    name, version = uri, "-"
    if uri.startswith("models:/"):
        name, _, version = uri[len("models:/"):].rpartition("/")
    specs = _trained_for(provenance)
    conditioned = bool(provenance.get("model_conditioned"))
    trained = "unknown (logged without a model spec)" if specs is None else ",".join(s.get("name", "?") for s in specs)
    if specs is not None and conditioned and len(specs) > 3:
        trained = f"{len(specs)} specs: {specs[0].get('name', '?')}, ..., {specs[-1].get('name', '?')}"
    if specs is not None and not conditioned and model is not None:
        want = asdict(model)
        match = any(_same_kernels(s, want) or (set(s) == {"name"} and s["name"] == want["name"]) for s in specs)
        if not match:
            same = [s for s in specs if s.get("name") == want["name"]]
            differ = sorted(k for k in want if k not in OUTSIDE_KERNELS and same and same[0].get(k) != want[k])
            raise ValueError(
                f"policy {uri} ({kernel}) was trained for model {trained}"
                + (f" with other {', '.join(differ)}" if differ else "") + f", not {want['name']}: pass --model "
                f"{trained} or a policy trained for {want['name']} (kernel-gym train --model {want['name']})")
    return (f"policy {kernel}: {name} version {version} (model {trained}"
            f"{', model-conditioned' if conditioned else ''})")


def latest_model_uris(model_name: str | None = None) -> dict[str, str]:
    """kernel -> models:/NAME/VERSION of the latest version of each registered kernel-gym-* policy in the store. With
    a model name, a policy trained for that model (kernel-gym-<env>-<model>) comes first, then the model-conditioned
    kernel-gym-<env>-conditioned, then the bare kernel-gym-<env> of older stores."""
    import mlflow

    client = mlflow.tracking.MlflowClient()
    out: dict[str, str] = {}
    names = registered_kernel_names()
    specific = [(f"{base}-{model_name}", k) for base, k in names.items()] if model_name else []
    conditioned = [(f"{base}-conditioned", k) for base, k in names.items()]
    candidates = specific + conditioned + list(names.items())
    for name, kernel in candidates:  # every model-specific name first, then the generic ones
        if kernel in out:
            continue
        try:
            versions_ = client.search_model_versions(f"name='{name}'")
        except Exception:  # noqa: BLE001 - an empty or fresh store has no registry rows
            versions_ = []
        if versions_:
            v = max(versions_, key=lambda mv: int(mv.version))
            out[kernel] = f"models:/{name}/{v.version}"
    return out


def parse_model_uris(items: Sequence[str]) -> dict[str | None, str]:
    """--model-uri values: "URI" (kernel read from the model) or "KERNEL=URI"."""
    from kernel_gym.kernels import FAMILY_NAMES

    out: dict[str | None, str] = {}
    for item in items:
        kernel, uri = None, item
        head, sep, tail = item.partition("=")
        if sep and head in FAMILY_NAMES:
            kernel, uri = head, tail
        elif sep and "://" not in head and ":" not in head:
            raise ValueError(f"--model-uri {item!r}: {head!r} is not a kernel; use KERNEL=URI with KERNEL one of "
                             f"{list(FAMILY_NAMES)}, or just the URI")
        if not uri:
            raise ValueError(f"--model-uri {item!r} has no URI")
        out[kernel if kernel else f"?{len(out)}"] = uri  # type: ignore[index]
    return out


def load_policies(items: Sequence[str], model: Any = None) -> dict[str, tuple[Predictor, dict[str, Any]]]:
    """Predictors per kernel from --model-uri values; with none given, the latest registered kernel-gym-* models
    (those trained for `model` first). With a ModelSpec `model`, prints one line per policy (name, version, model) to
    stderr and refuses a policy trained for another model unless it is model-conditioned."""
    model_name = getattr(model, "name", model)
    uris = parse_model_uris(items) if items else latest_model_uris(model_name)
    if not uris:
        raise NoPolicyError(no_policy_message(model_name))
    out: dict[str, tuple[Predictor, dict[str, Any]]] = {}
    for key, uri in uris.items():
        kernel = key if key and not key.startswith("?") else None
        k, predict, meta = load_policy(uri, kernel)
        if k in out:
            raise ValueError(f"two policies for {k}: {out[k][1]['model_uri']} and {uri}; pass one per kernel")
        if model is not None and not isinstance(model, str):
            print(check_policy_model(k, meta, model), file=sys.stderr, flush=True)
        out[k] = (predict, meta)
    return out


SHIPPED_POLICIES = Path("benchmarks") / "generalisation" / "policies"


def shipped_policy_dir() -> str:
    """The zoo policies the repository ships, as a --policy-dir that works from where the command runs: relative at
    the repository's root, else the repository's absolute path (where the package runs from a clone)."""
    if SHIPPED_POLICIES.is_dir():
        return str(SHIPPED_POLICIES)
    in_repo = Path(__file__).resolve().parents[2] / SHIPPED_POLICIES
    return str(in_repo if in_repo.is_dir() else SHIPPED_POLICIES)


class NoPolicyError(ValueError):
    """The MLflow store holds no policy usable for the model (no_policy_message says what to do)."""


def no_policy_message(model_name: str | None, command: str = "export") -> str:
    """The one-line error when the store has no policy usable for the model, naming the fixes that work: after the
    demo the store holds policies for the demo's model only, and a model without its own policy needs the
    model-conditioned one (trained by `train --model zoo`, or shipped as bundles in the repository)."""
    others = registered_policy_names()
    held = f"the store holds {', '.join(others[:4])}{', ...' if len(others) > 4 else ''} (trained for other models)" \
        if others else "the store holds no kernel-gym-* policy"
    return (f"no registered kernel-gym-* policy for {model_name or 'this model'} in the MLflow store "
            f"(MLFLOW_TRACKING_URI or mlruns/): {held}; for a model without its own policy train the model-conditioned "
            "policy (`kernel-gym train --model zoo --env-id KernelGym/MoE-v0`, and the same with "
            "--env-id KernelGym/DecodeAttention-v0), or "
            + (f"pass `--policy-dir {shipped_policy_dir()}` (the zoo policies the repository ships)"
               if command == "export" else
               "export the zoo policies the repository ships (`kernel-gym export --model SPEC --policy-dir "
               f"{shipped_policy_dir()} --out DIR`) and pass --table DIR/{TABLE_FILE}")
            + "; or pass --model-uri")


def registered_policy_names() -> list[str]:
    """Names of the registered kernel-gym-* models in the store (empty when it cannot be read)."""
    try:
        import mlflow

        return sorted(m.name for m in mlflow.tracking.MlflowClient().search_registered_models()
                      if m.name.startswith("kernel-gym-"))
    except Exception:  # noqa: BLE001 - an empty or unreadable store lists nothing
        return []


def load_policy_dir(folder: Path, model: Any = None) -> dict[str, tuple[Predictor, dict[str, Any]]]:
    """Predictors per kernel from the policy bundles in `folder` (KERNEL.json + KERNEL.npz: train/bundle.py),
    without MLflow: tune.zero_shot_ranker's first choice (with the fused_moe cost model the folder ships, the
    candidates re-ranked by it; without, the masked argmax of the logged model under the knob-space rules), the family
    default where no catalogue config is valid. Prints one line per policy like load_policies."""
    from kernel_gym.kernels import get_family
    from kernel_gym.train.bundle import load_bundle, load_cost_model
    from kernel_gym.train.candidates import NearestWinners, zero_shot_ranker

    folder = Path(folder)
    found = [k for k in TABLE_KERNELS if (folder / f"{k}.json").exists()]
    if not folder.is_dir() or not found:
        raise ValueError(f"--policy-dir {folder}: {'no such folder' if not folder.is_dir() else 'no KERNEL.json'} "
                         f"with a policy bundle; pass {shipped_policy_dir()} (the zoo policies the "
                         "repository ships) or a folder written by `kernel-gym tune --save-policies DIR`")
    out: dict[str, tuple[Predictor, dict[str, Any]]] = {}
    for kernel in found:
        meta, params, provenance = load_bundle(folder, kernel)
        cost = load_cost_model(folder, kernel)  # fused_moe: the re-ranking cost model shipped beside the policy
        rank = zero_shot_ranker(kernel, meta, params, cost, NearestWinners() if cost is not None else None)
        family = get_family(kernel)

        def predict(workloads: list[Any], rank: Any = rank, family: Any = family) -> list[Config]:
            return [next(iter(rank(w)), None) or family.default_config(w) for w in workloads]

        provenance = {**provenance, "policy_dir": str(folder)}
        if cost is not None:
            provenance["cost_model"] = {"rerank": "policy's valid catalogue + nearest shapes' winners + engine entry",
                                        "dataset_sha256": cost.meta.get("dataset_sha256", "")}
        if model is not None and not isinstance(model, str):
            print(f"{check_policy_model(kernel, provenance, model)} from {folder}", file=sys.stderr, flush=True)
        out[kernel] = (predict, provenance)
    return out


# ---- vLLM ------------------------------------------------------------------------------------------------------------


def vllm_file_name(num_experts: int, intermediate: int, device: str) -> str:
    """vLLM's get_config_file_name for unquantised experts: E=..,N=..,device_name=<name with _ for spaces>.json."""
    return f"E={num_experts},N={intermediate},device_name={device.replace(' ', '_')}.json"


def vllm_configs(table: DispatchTable, skew: float = 0.0) -> tuple[str, dict[str, dict[str, int]]]:
    """(file name, content) of a vLLM fused-MoE config file from the table's fused_moe buckets at one routing skew:
    vLLM keys only on the batch size M, so the skew the deployment sees is fixed at export."""
    from kernel_gym.kernels.fused_moe import vllm_config_entry

    t = table.kernels.get("fused_moe")
    if t is None:
        raise ValueError("the vllm format needs a fused_moe policy; pass --model-uri for kernel-gym-moe-v0-<model>")
    content = {str(int(m)): vllm_config_entry(t.lookup(m, skew)) for m in t.centers[0]}
    return vllm_file_name(t.fixed["num_experts"], t.fixed["intermediate"], table.device), content


def write_vllm(table: DispatchTable, out: Path, skew: float = 0.0) -> Path:
    from kernel_gym.deploy.engine_export import write_atomic

    name, content = vllm_configs(table, skew)
    path = out / name
    write_atomic(path, json.dumps(content, indent=4) + "\n")  # a kill mid-write keeps the earlier file whole
    return path


def check_out_folder(out: Path) -> None:
    """Refuse, before any work, an --out that export cannot write its folder to: an existing file, a new path named
    like a file (export writes dispatch_table.json or engine files INTO the folder), or a folder it may not write."""
    import os

    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: export writes a folder (dispatch_table.json, or the engine's config "
                         "files); pass a folder path")
    if not out.exists() and out.suffix.lower() == ".json":
        raise ValueError(f"--out {out}: export writes a folder that holds dispatch_table.json (or the engine's files),"
                         f" not one JSON file; pass a folder, e.g. --out {out.with_suffix('')}")
    base = out.absolute()
    while not base.exists():  # the folder is made when the files are written; nothing is created here
        base = base.parent
    if not base.is_dir():
        raise ValueError(f"--out {out}: {base} is a file, so no folder can be made under it; pass a folder path")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: {base} is not writable; pass a writable folder")


def parse_kv_layout(text: str) -> tuple[int, str] | None:
    if not text:
        return None
    ps, sep, lay = text.partition(":")
    if not sep or not ps.isdigit() or lay not in ("NHD", "HND"):
        raise ValueError(f"--kv-layout {text!r}: use PAGE_SIZE:LAYOUT, e.g. 16:NHD (layouts NHD, HND)")
    return int(ps), lay


def export_files(*, out: Path, fmt: str = "dispatch", model: str = "mixtral-8x7b", model_uris: Sequence[str] = (),
                 device: str = DEFAULT_DEVICE, skew: float = 0.0, tp: int = 1, ep: int = 1, engine_version: str = "",
                 confirmations: Sequence[str] = (), policy_dir: Path | None = None, routing: str = "",
                 stores: Sequence[str] = (), force: bool = False, min_gain: float = 0.01, triton_version: str = "",
                 kv_layout: str = "", tracking_uri: str = "") -> int:
    """`kernel-gym export` (module docstring): the dispatch table from the policies (`model_uris`, else the latest
    registered, or the bundles in `policy_dir`), or the engine's file (fmt vllm / sglang: engine_export, from
    `stores`, default the packaged dataset); prints what each kernel rests on and a JSON summary."""
    from kernel_gym.train.tracking import setup_tracking

    if skew < 0:
        raise ValueError(f"--skew must be >= 0 (a Zipf exponent), got {skew}")
    check_out_folder(Path(out))
    if fmt in ("vllm", "sglang") and policy_dir is not None:
        raise ValueError(f"--policy-dir is for --format dispatch: {fmt} files are chosen among measured "
                         "vllm_fused_moe configs, not by a policy; drop --policy-dir")
    if fmt in ("vllm", "sglang"):  # measured vllm_fused_moe configs, not a policy (issue 15)
        from kernel_gym.deploy import engine_export
        from kernel_gym.measure.store import PACKAGED_SNAPSHOT

        return engine_export.export_and_print(
            model=model, fmt=fmt, out=out, device=device, tp=tp, ep=ep, routing=routing, skew=skew,
            stores=list(stores) or [str(PACKAGED_SNAPSHOT)], force=force, min_gain=min_gain,
            triton_version=triton_version, engine_version=engine_version, confirmations=confirmations)
    if policy_dir is None:
        setup_tracking(tracking_uri or None)
    spec = sharded_model(model, tp)
    from kernel_gym.models import spec_caveats

    for line in spec_caveats(spec):
        print(f"note: {line}", file=sys.stderr)
    table = table_from_registry(spec, model_uris, device, parse_kv_layout(kv_layout), policy_dir)
    if fmt == "dispatch":
        replaced_model_note(out / TABLE_FILE, spec.name)
        path = table.save(out / TABLE_FILE)
    else:
        path = write_vllm(table, out, skew)
    rests = table.meta.get("rests_on", {})
    print_basis_notes(rests)
    cov = None
    if "fused_moe" in table.kernels and rests.get("fused_moe", {}).get("basis") != "measured":
        from kernel_gym.dispatch.shape_coverage import coverage, trained_shapes

        cov = coverage(spec, trained_shapes(table.kernels["fused_moe"].policy))  # how far from what it trained on
        print(cov.line(), file=sys.stderr)
    print(json.dumps({"format": fmt, "path": str(path), "model": spec.name,
                      **({"fused_moe_coverage": cov.as_dict()} if cov else {}), "kernels": {
        k: {"basis": rests.get(k, {}).get("basis", "?"),
            "policy": t.policy.get("model_uri", "") or t.policy.get("policy_dir", ""), "buckets": len(t.cells),
            "configs": len(t.configs)}
        for k, t in table.kernels.items()},
        "left_out": [k for k, r in rests.items() if r["basis"] == "absent"]}, indent=1))
    return 0


def replaced_model_note(path: Path, model_name: str) -> None:
    """One stderr line when an export replaces a table written for another model (a folder shared by mistake)."""
    if not path.exists():
        return
    try:
        held = json.loads(path.read_text()).get("model", {}).get("name")
    except (OSError, ValueError, AttributeError):
        held = None
    if held != model_name:
        print(f"export: replacing {path}, " + (f"the table of another model ({held})" if held else
                                                 "which was not a readable dispatch table"), file=sys.stderr)


def print_basis_notes(rests: dict[str, Any]) -> None:
    """One stderr line per kernel of a table's meta.rests_on that a user should act on: left out, not measured, or
    learned from an older recorded dataset than the packaged one."""
    for k, r in rests.items():
        if r["basis"] == "absent":
            print(f"export: {k} left out ({r['why']}): the deployment runs {r['deployment_runs']} there; "
                  f"{r['fix']}", file=sys.stderr)
        elif r["basis"] != "measured":
            print(f"note: {k} is {r['basis']}: {r['why']}", file=sys.stderr)
        if r.get("stale"):
            print(stale_line(k, r["stale"]), file=sys.stderr)


def stale_line(kernel: str, stale: dict[str, Any]) -> str:
    """The note for a kernel whose policy learned from another recorded dataset (stale_dataset's entry)."""
    return (f"note: {kernel}'s policy learned from recorded dataset {stale['trained_on_dataset']}, which differs "
            f"from the packaged {stale['packaged_dataset']}: its choices do not reflect these rows; {stale['fix']}")


def sharded_model(name: str, tp: int) -> Any:
    """The model spec one GPU runs: --model NAME (or a JSON spec) at --tp N, the same as NAME@tpN; refused in one
    line when both say a degree or the shape does not split."""
    from kernel_gym.models import load_model
    from kernel_gym.zoo import shard

    if tp < 1:
        raise ValueError(f"--tp must be >= 1 (a tensor-parallel degree), got {tp}")
    model = load_model(name)
    if tp == 1:
        return model
    if "@tp" in model.name:
        raise ValueError(f"--model {name} already names a shard ({model.name}) and --tp {tp} another: pass one of them")
    return shard(model, tp)


def measured_model(kernel: str, model: Any) -> bool:
    """Whether the packaged data holds the kernel at any workload of this model's grid: the same question replay and
    demo ask of any backend before they start (dispatch.baselines.unmeasured_kernels), asked of the packaged data."""
    backend = recorded_backend()
    return kernel in backend.kernels() and not unmeasured_kernels(backend, model, (kernel,))
