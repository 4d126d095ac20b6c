"""One model-conditioned policy per kernel family, trained on the shape zoo, and its zero-shot choices.

Why: a user brings a model the project never measured. The observation already carries the shape's own features
(MoE: experts, hidden, intermediate, top-k, tokens per expert, skew; decode: heads, KV heads, head dim, batch,
context), so one policy trained over many architectures can answer for any spec. Two things make its training match
what a deployment sees:

- the workloads are every zoo training shard's (kernel_gym.zoo: published MoE models at TP 1/2/4) plus the built-in
  models' full grids, never a row of a test model's workloads;
- its action catalogue is drawn only from the configs measured at (almost) every zoo shape, so the mask it trains
  under (measured and valid) is the mask a deployment has (valid by the knob-space rules) wherever it trains.

Zero-shot choice (`choose`): the actor's argmax over the catalogue entries the knob-space rules allow at the
workload: what the exported policy does for an unseen spec (pyfunc_model's "rules" mask). `ranked` lists the same
entries by the actor's preference: the candidates `kernel-gym tune` measures. Given a fused_moe cost model (`cost`),
both re-rank the product's zero-shot candidates with it (tune.zero_shot_ranker), as `export --policy-dir` does with
the cost model shipped beside the bundle.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any, Sequence

from kernel_gym.dispatch.catalogue import WorkloadReference
from kernel_gym.kernels import profiles
from kernel_gym.kernels.space import Config

ZOO_MODEL = "zoo"  # TrainArgs.model value that selects the model-conditioned zoo training
COMMON_SHARE = 0.9  # a config joins the candidates when measured at this share of the zoo shapes where it is valid


def zoo_specs(kernel: str, exclude: Sequence[str] = ()) -> list[Any]:
    """The training shards (ModelSpecs) of the zoo for a kernel: every training model at TP 1, 2, 4, and for fused_moe
    the space-filling design's shapes (zoo.DESIGN: per-shard shapes, not sharded again). `exclude` takes zoo model
    names and design shape names (design-NN: leave-one-out over the design)."""
    from kernel_gym import zoo

    unknown = [m for m in exclude if m not in zoo.ZOO and m not in zoo.DESIGN]
    if unknown:
        raise ValueError(f"exclude_models: unknown zoo model(s) {unknown}; the zoo has {sorted(zoo.ZOO)} and the "
                         f"design design-00..design-{len(zoo.DESIGN) - 1:02d}")
    shards = [s for s in zoo.zoo_shards([m for m in zoo.training_models(kernel) if m not in exclude])
              if s.name not in zoo.TOO_LARGE]
    if profiles.profile(kernel).moe:  # the space-filling design shapes are MoE shapes
        shards += [s for name, s in zoo.DESIGN.items() if name not in exclude]
    return shards


def excluded_keys(kernel: str, models: Sequence[str]) -> set[str]:
    """Every workload key the named zoo models produce for a kernel (all shards, both zoo grids, and the built-in
    collection grid for built-in models)."""
    from kernel_gym import zoo
    from kernel_gym.kernels.workloads import model_workloads
    from kernel_gym.models import BUILTIN_MODELS

    keys: set[str] = set()
    for name in models:
        if name in zoo.DESIGN and profiles.profile(kernel).moe:
            keys.update(w.key() for w in zoo.shard_workloads(kernel, zoo.DESIGN[name], "zoo"))
    for spec in zoo.zoo_shards([m for m in models if m not in zoo.DESIGN]):
        for grid in ("zoo", "eval"):
            keys.update(w.key() for w in zoo.shard_workloads(kernel, spec, grid))
    for name in models:
        if name in BUILTIN_MODELS:
            keys.update(w.key() for w in model_workloads(kernel, BUILTIN_MODELS[name], "default"))
    return keys


def zoo_profile(kernel: str, exclude: Sequence[str] = ()) -> Any:
    """The model-conditioned training profile: zoo shards' sampled shapes plus the built-in models' full grids, minus
    every workload a test model (or an `exclude`d model: leave-one-model-out) produces. Anchors (always in training)
    are the zoo shapes."""
    from kernel_gym import zoo
    from kernel_gym.envs.base import WorkloadProfile
    from kernel_gym.kernels.workloads import model_workloads
    from kernel_gym.models import BUILTIN_MODELS

    test = zoo.test_workload_keys(kernel) | excluded_keys(kernel, exclude)
    workloads: dict[str, Any] = {}
    for spec in BUILTIN_MODELS.values():
        for w in model_workloads(kernel, spec, "default"):
            workloads.setdefault(w.key(), w)
    anchors = []
    for spec in zoo_specs(kernel, exclude):
        for w in zoo.shard_workloads(kernel, spec, "zoo"):
            workloads.setdefault(w.key(), w)
            anchors.append(w.key())
    kept = [w for k, w in workloads.items() if k not in test]
    return WorkloadProfile(ZOO_MODEL, kept, anchors=[k for k in dict.fromkeys(anchors) if k not in test])


def common_configs(refs: Sequence[WorkloadReference], anchors: set[str], space: Any,
                   share: float = COMMON_SHARE) -> set[Config]:
    """Configs measured (ok or failed) at >= `share` of the anchor (zoo) workloads where the rules allow them."""
    zoo_refs = [r for r in refs if r.key in anchors]
    if not zoo_refs:
        return set()
    measured: Counter = Counter()
    valid: Counter = Counter()
    seen = {c for r in zoo_refs for c in (*r.times, *r.failures)}
    for r in zoo_refs:
        have = set(r.times) | set(r.failures)
        for c in seen:
            if space.is_valid(c, r.workload):
                valid[c] += 1
                measured[c] += c in have
    return {c for c in seen if valid[c] and measured[c] / valid[c] >= share}


def restrict(refs: Sequence[WorkloadReference], allowed: set[Config]) -> list[WorkloadReference]:
    """The references with only `allowed` configs (and the default) left as catalogue candidates."""
    out = []
    for r in refs:
        times = {c: t for c, t in r.times.items() if c in allowed or c == r.default}
        if times:
            out.append(replace(r, times=times))
    return out


def ranked(model: Any, catalogue: Any, workload: Any, cost: Any = None, nearest: Any = None) -> list[Config]:
    """Catalogue entries valid at the workload, most preferred first (the first is `choose`'s answer): the trained
    model's actor exported as it is logged (tracking.export_policy_arrays) and ranked by tune.zero_shot_ranker, the
    same numpy forward pass and rules-only mask the deployed model and `kernel-gym tune` use. With a fused_moe `cost`
    model (dispatch/cost_model.py; `nearest`: a tune.NearestWinners) the product's zero-shot candidates re-ranked by
    it. None by default: a held-out evaluation must pass a cost model fitted without its held-out rows, never the
    packaged one (cost_model.packaged() saw every recorded shape)."""
    from kernel_gym.train.candidates import zero_shot_ranker
    from kernel_gym.train.tracking import export_policy_arrays

    params, activation = export_policy_arrays(model)
    meta = {"configs": [dict(c) for c in catalogue.configs], "activation": activation}
    return zero_shot_ranker(catalogue.kernel, meta, params, cost, nearest)(workload)


def choose(model: Any, catalogue: Any, workload: Any, default: Config, cost: Any = None, nearest: Any = None
           ) -> Config:
    """The zero-shot choice; the default config where no catalogue entry is valid (what the Dispatcher does)."""
    top = ranked(model, catalogue, workload, cost, nearest)
    return top[0] if top else default
