"""Plans of measurements for what the policies choose: `collect --plan` files (a JSON list of {"kernel", "workload",
"configs"}; kernel_gym.measure.collect.load_plan_file reads them). scripts/plan_coverage.py and scripts/plan_zoo.py
are their command lines; their docstrings say why each plan is made.

- `coverage_plan`: at every measured shape, the candidate configs a policy may pick that are not stored there (the
  training catalogues at every depth up to `depth`, and each shape's `top` fastest stored configs).
- `new_shapes_plan`: the collection grid's shapes at first-axis values no stored shape has, sampled like the shapes
  before them (collect's seeded sample, the default, the catalogue, the measured neighbours' fastest configs).
- `new_knobs_plan`: at every measured shape, the values of knobs added after its rows were stored.
- `zoo_plan`: the same candidate configs at every training shape of every zoo model (or of the shape-space design).
- `remaining`: the part of an earlier plan that the dataset does not hold yet, in priority order.
- `untimed_plan`: the configs a replay's policies chose that the data could not time (each fell back), at the stored
  shapes their answers read, so that the next replay prices what the policies deploy.

Imports of the training stack stay inside the functions: `with_new_knobs`, which `kernel-gym bench` uses on the GPU
machine, needs only the knob space.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

Log = Callable[[str], Any]


def read_plan(path: Path) -> list[dict]:
    """A plan file as written by write_plan (.json, or .json.gz)."""
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        return json.load(f)


def write_plan(plan: list[dict], out: Path) -> None:
    """A plan file for `collect --plan`: gzipped when `out` ends in .gz."""
    if out.suffix == ".gz":
        with gzip.open(out, "wt") as f:
            json.dump(plan, f)
    else:
        out.write_text(json.dumps(plan))


def round_robin(groups: list[list[dict]]) -> list[dict]:
    """Every group's first entry, then every group's second, ...: a collection cut by its budget still covers every
    group."""
    return [e for i in range(max(map(len, groups), default=0)) for g in groups if i < len(g) for e in [g[i]]]


def coverage_plan(backend: Any, kernels: list[str], models: list[str], depth: int, top: int,
                  log: Log = print) -> tuple[list[dict], dict]:
    """(plan, per-kernel summary): at every measured shape of `models`, the catalogue configs (depths 1..depth, as
    training builds them) and each shape's `top` fastest stored configs that are valid there and not stored."""
    from kernel_gym.dispatch.catalogue import MAX_CATALOGUE, build_catalogue
    from kernel_gym.kernels import get_family
    from kernel_gym.train.train import prepare_data

    plan, summary = [], {}
    for kernel in kernels:
        space = get_family(kernel).space
        candidates: dict = {}
        shapes: dict = {}
        for model in models:
            data = prepare_data(kernel, backend, model)
            for d in range(1, depth + 1):  # as training builds it (near 0, MAX_CATALOGUE) at each depth
                candidates.update(dict.fromkeys(build_catalogue(kernel, data.train, 0.0, MAX_CATALOGUE, d).configs))
            for ref in data.train + data.heldout:
                shapes[ref.key] = ref.workload
                candidates.update(dict.fromkeys(sorted(ref.times, key=ref.times.__getitem__)[:top]))
        stored = backend.stored_keys(kernel)
        n = 0
        for wkey, workload in sorted(shapes.items()):
            missing = [str(c) for c in candidates if (wkey, str(c)) not in stored and space.is_valid(c, workload)]
            if missing:
                plan.append({"kernel": kernel, "workload": wkey, "configs": missing})
                n += len(missing)
        summary[kernel] = {"candidates": len(candidates), "shapes": len(shapes), "to_measure": n}
        log(f"{kernel}: {len(candidates)} candidate configs x {len(shapes)} measured shapes: {n} not stored")
    return plan, summary


def neighbour_winners_plan(backend: Any, kernels: list[str], models: list[str], top: int,
                           log: Log = print) -> tuple[list[dict], dict]:
    """(plan, per-kernel summary): at every measured shape, the `top` fastest stored configs of its measured
    neighbours below and above along the primary axis (`neighbours`) that are valid there and not stored.

    Why: the policies are scored on whole held-out values of that axis, and a held-out shape's fastest config is
    often one its neighbours never measured (knob variants planned per shape: of Mixtral's 36 held-out decode
    shapes, 7 had their winner stored at both neighbours; benchmarks/policy_quality/neighbours.py). Then neither
    a policy nor interpolation can learn it there. Measuring each shape's winners at its neighbours makes a winner
    visible on both sides of the shapes between them."""
    from kernel_gym.kernels import get_family
    from kernel_gym.train.train import prepare_data

    plan, summary = [], {}
    for kernel in kernels:
        space = get_family(kernel).space
        stored = backend.stored_keys(kernel)
        refs: dict = {}
        for model in models:
            data = prepare_data(kernel, backend, model)
            refs.update({r.key: r for r in data.train + data.heldout})
        everyone = list(refs.values())
        n = 0
        for key, ref in sorted(refs.items()):
            wanted: dict = {}
            for near in neighbours(ref.workload, everyone):
                wanted.update(dict.fromkeys(sorted(near.times, key=near.times.__getitem__)[:top]))
            missing = [str(c) for c in wanted if (key, str(c)) not in stored and space.is_valid(c, ref.workload)]
            if missing:
                plan.append({"kernel": kernel, "workload": key, "configs": missing})
                n += len(missing)
        summary[kernel] = {"shapes": len(refs), "to_measure": n}
        log(f"{kernel}: the {top} fastest of each shape's neighbours, {n} not stored at {len(refs)} shapes")
    return plan, summary


def new_shapes_plan(backend: Any, kernels: list[str], models: list[str], per_shape: int, neighbour_top: int,
                    log: Log = print, fill: bool = False) -> tuple[list[dict], dict]:
    """Per grid shape without stored rows: collect's seeded sample, the default, the training catalogue, and the
    fastest stored configs of its nearest measured neighbours below and above along the first feature axis.
    fill: every such grid shape; else only those at first-axis values no stored shape has (the values the grid
    gained). Filling matters where interpolation needs the holes: it brackets a shape only when every corner of
    the grid cell around it is stored (decode at 64-256 sequences and short contexts, where a loaded server runs)."""
    from kernel_gym.dispatch.catalogue import primary_value
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import workload_from_key
    from kernel_gym.measure.collect import CollectOptions, build_plan
    from kernel_gym.train.train import prepare_data

    plan, summary = [], {}
    for kernel in kernels:
        fam = get_family(kernel)
        stored_shapes = {w for w, _ in backend.stored_keys(kernel)}
        sampled: dict[str, list[str]] = {}
        opts = CollectOptions(models=models, kernels=[kernel], grids=["default"], configs_per_shape=per_shape)
        for chunks in build_plan(opts):
            for item in chunks:
                if item.workload_key not in stored_shapes:
                    sampled.setdefault(item.workload_key, []).extend(item.configs)
        catalogue, refs = {}, []
        for model in models:
            data = prepare_data(kernel, backend, model)
            catalogue.update(dict.fromkeys(str(c) for c in data.catalogue.configs))
            refs += data.train + data.heldout
        # Only shapes at first-axis values that no stored shape has: the values the grid gained. Grid shapes left
        # unmeasured at old values (sampled out, or cut by a collection's budget) stay as they were.
        old_values = {primary_value(workload_from_key(kernel, w)) for w in stored_shapes}
        new = {w: workload_from_key(kernel, w) for w in sampled}
        if not fill:
            new = {w: wl for w, wl in new.items() if primary_value(wl) not in old_values}
        n = 0
        # Smallest values first (a collection cut by its budget keeps those: where decode's winners change fastest).
        for wkey, workload in sorted(new.items(), key=lambda kv: (primary_value(kv[1]), kv[0])):
            wanted = dict.fromkeys([*sampled[wkey], *catalogue])
            for ref in neighbours(workload, refs):
                fastest = sorted(ref.times, key=ref.times.__getitem__)[:neighbour_top]
                wanted.update(dict.fromkeys(str(c) for c in fastest))
            valid = [c for c in wanted if fam.space.is_valid(Config.parse(c), workload)]
            plan.append({"kernel": kernel, "workload": wkey, "configs": valid})
            n += len(valid)
        summary[kernel] = {"new_shapes": len(new), "to_measure": n}
        log(f"{kernel}: {len(new)} grid shapes without rows: {n} configs planned")
    return plan, summary


def with_new_knobs(space: Any, configs: list[Any], workload: Any) -> list[Any]:
    """The valid variants of these configs at every other value of the knobs added after they were measured (knobs
    with a legacy value, e.g. fused MoE's TMA_LOADS): the dataset cannot know those values yet."""
    out = []
    for c in configs:
        for knob in space.knobs:
            if knob.legacy is None or knob.name in c:
                continue
            for v in knob.values:
                variant = space.config({**c, knob.name: v})
                if v != knob.legacy and space.is_valid(variant, workload):
                    out.append(variant)
    return out


def new_knobs_plan(backend: Any, kernels: list[str], models: list[str], top: int,
                   log: Log = print, exhaustive: bool = True) -> tuple[list[dict], dict]:
    """Per measured shape, the configs that set a knob added after its rows were stored: for the families the
    benchmark searches exhaustively (prefill) every valid one (unless `exhaustive` is False: a plan cut to fit a
    budget), for the others each shape's `top` fastest stored configs at every new value (with_new_knobs, what
    `kernel-gym bench` times too)."""
    from kernel_gym.kernels import get_family, profiles
    from kernel_gym.train.train import prepare_data

    plan, summary = [], {}
    for kernel in kernels:
        space = get_family(kernel).space
        added = [k.name for k in space.knobs if k.legacy is not None]
        stored = backend.stored_keys(kernel)
        n = 0
        refs = {}
        for model in models:
            try:
                data = prepare_data(kernel, backend, model)
            except ValueError as exc:  # no measured shape of this model: nothing to vary
                log(f"{kernel}: {model} skipped ({exc})")
                continue
            refs.update({r.key: r for r in data.train + data.heldout})
        for wkey, ref in sorted(refs.items()):
            if exhaustive and profiles.PROFILES[kernel].bench_exhaustive:
                configs = [c for c in space.valid_configs(ref.workload) if any(k in c for k in added)]
            else:
                fastest = sorted(ref.times, key=ref.times.__getitem__)[:top]
                configs = with_new_knobs(space, fastest, ref.workload)
            missing = list(dict.fromkeys(str(c) for c in configs if (wkey, str(c)) not in stored))
            if missing:
                plan.append({"kernel": kernel, "workload": wkey, "configs": missing})
                n += len(missing)
        summary[kernel] = {"knobs": added, "shapes": len(refs), "to_measure": n}
        log(f"{kernel}: new knobs {added} at {len(refs)} measured shapes: {n} configs planned")
    return plan, summary


def neighbours(workload: Any, refs: list[Any]) -> list[Any]:
    """The measured references nearest below and above `workload` along its primary axis, all else equal (the
    workload keys differ in one field)."""
    from kernel_gym.dispatch.catalogue import primary_value

    x = primary_value(workload)
    fields = json.loads(workload.key())
    same = [r for r in refs if sum(v != fields.get(k) for k, v in json.loads(r.workload.key()).items()) == 1]
    below = [r for r in same if primary_value(r.workload) < x]
    above = [r for r in same if primary_value(r.workload) > x]
    return ([max(below, key=lambda r: primary_value(r.workload))] if below else []) + (
        [min(above, key=lambda r: primary_value(r.workload))] if above else [])


def zoo_candidates(kernel: str, backend: Any, seed: int = 0) -> tuple[list, list]:
    """(catalogue configs learned from the stored data, the seeded order of the whole space) for one kernel."""
    from kernel_gym.dispatch.catalogue import MAX_CATALOGUE, build_catalogue
    from kernel_gym.kernels import get_family
    from kernel_gym.measure.collect import _stable_seed
    from kernel_gym.train.train import prepare_data

    learned: dict = {}
    for model in ("mixtral-8x7b", "olmoe-1b-7b"):
        data = prepare_data(kernel, backend, model, holdout=0.0)
        for depth in (1, 2):
            learned.update(dict.fromkeys(build_catalogue(kernel, data.train, 0.0, MAX_CATALOGUE, depth).configs))
    order = list(get_family(kernel).space.all_configs())
    random.Random(_stable_seed(seed, kernel)).shuffle(order)  # collect's own order: the same sample as the grid
    return list(learned), order


# The design's M order: a budget cut keeps every shape's most informative cells (the two ends of M, then the middle).
DESIGN_M_ORDER = ((4096, 0.0), (1, 0.0), (256, 0.0), (64, 1.2), (1024, 0.0), (16, 0.0), (64, 0.0), (256, 1.2))


def zoo_plan(kernel: str, backend: Any, sample: int, max_candidates: int, design: bool = False) -> tuple[list, dict]:
    """(plan, summary) of one kernel at every training shape of the zoo (or of the design, `design`): each shape's
    default, the first `max_candidates` learned catalogue configs and the first `sample` valid configs of collect's
    seeded order, less what is stored; shards round-robin."""
    from kernel_gym import zoo
    from kernel_gym.kernels import get_family

    fam = get_family(kernel)
    learned, order = zoo_candidates(kernel, backend)
    learned = learned[:max_candidates]
    stored = backend.stored_keys(kernel) if kernel in backend.kernels() else set()
    per_shard: list[list[dict]] = []
    seen: set[str] = set()
    test_keys = zoo.test_workload_keys(kernel)
    shards = list(zoo.DESIGN.values()) if design else zoo.zoo_shards(zoo.training_models(kernel))
    for spec in shards:
        if spec.name in zoo.TOO_LARGE:
            continue
        entries = []
        workloads = zoo.shard_workloads(kernel, spec, "zoo")
        if design:  # a learned config the shape's rules reject is replaced by one more sampled config
            rank = {mk: i for i, mk in enumerate(DESIGN_M_ORDER)}
            workloads = sorted(workloads, key=lambda w: rank.get((w.num_tokens, w.skew), len(rank)))
            valid_learned = sum(fam.space.is_valid(c, workloads[0]) for c in learned) if workloads else 0
            sample_here = sample + max(0, len(learned) - valid_learned)
        else:
            sample_here = sample
        for wl in workloads:
            key = wl.key()
            if key in seen or key in test_keys:
                continue
            seen.add(key)
            sampled = []
            for c in order:
                if len(sampled) >= sample_here:
                    break
                if fam.space.is_valid(c, wl):
                    sampled.append(c)
            configs = [c for c in dict.fromkeys([fam.default_config(wl), *learned, *sampled])
                       if fam.space.is_valid(c, wl) and (key, str(c)) not in stored]
            if configs:
                entries.append({"kernel": kernel, "workload": key, "configs": [str(c) for c in configs],
                                "model": spec.name})
        per_shard.append(entries)
    plan = round_robin(per_shard)
    summary = {"kernel": kernel, "candidates_learned": len(learned), "sample": sample, "workloads": len(plan),
               "configs": sum(len(e["configs"]) for e in plan), "shards": len(per_shard)}
    return plan, summary


def remaining(plan: list[dict], backend: Any) -> list[dict]:
    """The entries of `plan` not yet in the backend's data and still valid: largest-M MoE cells first (of any MoE
    family), then the other uniform MoE cells, then skewed ones, then the other kernels (plan order within each)."""
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.worker import workload_from_key

    stored = {k: backend.stored_keys(k) for k in {e["kernel"] for e in plan} if k in backend.kernels()}
    rest = []
    for e in plan:
        fam = get_family(e["kernel"])
        wl = workload_from_key(fam, e["workload"])
        configs = [c for c in e["configs"] if (e["workload"], c) not in stored.get(e["kernel"], set())
                   and fam.space.is_valid(Config.parse(c), wl)]
        if configs:
            rest.append({**e, "configs": configs})

    def priority(e: dict) -> int:
        w = json.loads(e["workload"])
        if "num_tokens" not in w:  # not an MoE workload (its token count and routing skew order the cells)
            return 3
        return 0 if w["num_tokens"] >= 4096 else 2 if w.get("skew", 0.0) > 0 else 1

    return sorted(rest, key=priority)  # stable: plan order within a priority


def untimed_plan(guards: Any, backend: Any) -> tuple[list[dict], dict[str, int]]:
    """A `collect --plan` of the choices `guards` (replay's GuardedChoosers) could not time, and its counts.

    Each config goes to the stored workloads an answer for its call reads (the call's own when stored, else the
    workloads interpolation brackets it with: RecordedBackend.answer_workloads), never to a new shape: a shape
    stored with a few configs would stand in the way of the interpolation every other config gets there. Calls no
    stored shape brackets are counted as `unbracketed` and left out (collect that grid region first); configs stored
    there with another status (failed, too noisy to rank) as `stored_not_ok`."""
    inner = getattr(backend, "inner", backend)  # a CoveredBackend answers through the recorded one
    answer_workloads = getattr(inner, "answer_workloads", None)
    entries: dict[tuple[str, str], set[str]] = {}
    counts = {"calls": 0, "configs": 0, "unbracketed": 0}
    for guard in guards:
        for (kernel, _), (workload, configs) in guard.untimed.items():
            counts["calls"] += 1
            reads = answer_workloads(kernel, workload) if callable(answer_workloads) else []
            if not reads:
                counts["unbracketed"] += 1
                continue
            for wkey in reads:
                entries.setdefault((kernel, wkey), set()).update(configs)
    plan = [{"kernel": k, "workload": w, "configs": sorted(c)} for (k, w), c in sorted(entries.items())]
    planned = sum(len(e["configs"]) for e in plan)
    if hasattr(inner, "stored_keys"):
        plan = remaining(plan, inner)  # stored there already (failed, or too noisy to rank): not measured again
    counts["configs"] = sum(len(e["configs"]) for e in plan)
    counts["stored_not_ok"] = planned - counts["configs"]
    counts["workloads"] = len(plan)
    return plan, counts
