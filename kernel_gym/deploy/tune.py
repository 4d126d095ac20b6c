"""`kernel-gym tune`: about a minute of GPU for a model the policy never saw: measure a few candidates at every cell
of the spec's dispatch grid, keep the fastest, export the dispatch table.

The candidates come from four sources, so that a policy that is wrong at a shape far from its training cannot
mislead the result (at a TP-8 shard with N = 64 every one of an earlier policy's top 8 was a tile wider than N):

1. the `--top-k` most preferred configs among those the knob-space rules allow (default 4): where the policy folder
   ships the fused_moe cost model, its top k of the whole valid space (zero_shot_ranker: what `export --policy-dir`
   answers zero-shot), else the policy's own ranking of its catalogue;
2. the fastest stored config at each of the 3 measured shapes nearest to this one (the coverage measure's cube,
   kernel_gym.dispatch.shape_coverage), at the nearest M and skew;
3. the engine's own entry (vLLM's shipped H200 table, else its default rule) translated to the kernel: the pick is
   the fastest measured candidate, so no cell is kept slower than what the engine runs where that entry was measured;
4. round 2, a local search: `--local` one-knob steps (tile sizes first) around each cell's fastest round-1 config.

All of it runs through the usual collection (isolated workers, reference check, SQLite store: a rerun resumes and
measures nothing twice) within one `--budget-s`; each cell gets its fastest measured candidate, cells without a
measurement keep the policy's zero-shot choice. Prints the coverage of the spec, progress and the GPU-seconds spent.

    kernel-gym tune --model my_moe.json --budget-s 120 --out deploy/tuned_table.json          # GPU
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from kernel_gym.dispatch.baselines import TUNE_KERNELS
from kernel_gym.kernels.space import Config
from kernel_gym.train.bundle import load_bundle, policy_bundle, save_bundle  # noqa: F401 (re-exported)
from kernel_gym.train.candidates import (  # noqa: F401 (re-exported: callers use tune.ranker etc.)
    NEAREST_SHAPES,
    NearestWinners,
    _snapped_block_m,
    engine_candidate,
    ranker,
    zero_shot_ranker,
)

KERNELS = TUNE_KERNELS  # the kernels with a model-conditioned policy to rank candidates (dispatch/baselines.py)


LOCAL_STEPS = 4  # one-knob neighbours of the best measured config, measured in the second round
# A collection's start (worker process, CUDA context, first compiles) took ~10 s before its first chunk on the H200:
# round 2 started with 1 s of budget left ran 11 s (benchmarks/generalisation/tune_run11_far2), so it needs this much
ROUND_MIN_S = 12.0
_LOCAL_ORDER = ("BLOCK_N", "BLOCK_M", "BLOCK_K", "num_warps", "num_stages", "GROUP_M", "FUSE_SILU", "SPLIT_K",
                "TMA_LOADS", "FUSE_WEIGHT", "FUSE_SUM")


def local_steps(config: Config, workload: Any, space: Any, limit: int = LOCAL_STEPS,
                exclude: set[Config] | frozenset = frozenset()) -> list[Config]:
    """One-knob steps from `config` (the neighbouring value of a knob, tile sizes first), valid under the rules and
    not in `exclude`: the local-search round."""
    out: list[Config] = []
    knobs = {k.name: k for k in space.knobs}
    for name in _LOCAL_ORDER:
        knob = knobs.get(name)
        if knob is None:
            continue
        values = list(knob.values)
        current = space.value(config, name)
        if current not in values:
            continue
        i = values.index(current)
        for j in (i - 1, i + 1):
            if 0 <= j < len(values):
                cand = space.config({**{k: space.value(config, k) for k in knobs if k in config or
                                        knobs[k].legacy is not None}, name: values[j]})
                if cand not in exclude and cand not in out and space.is_valid(cand, workload):
                    out.append(cand)
        if len(out) >= limit:
            break
    return out[:limit]


def first_round(workload: Any, rank: Any, top_k: int, nearest: Any = None) -> list[Config]:
    """Round-1 candidates of a cell: the policy's top_k, the nearest shapes' winners, the engine's own entry."""
    from kernel_gym.kernels import get_family

    space = get_family(workload.kernel).space
    cands = list(rank(workload)[:top_k])
    if nearest is not None and workload.kernel == "fused_moe":
        cands += [c for c in nearest(workload) if space.is_valid(c, workload)]
    engine = engine_candidate(workload)
    if engine is not None:
        cands.append(engine)
    return list(dict.fromkeys(cands))


def tune_plan(kernel: str, model: Any, rank: Any, top_k: int, nearest: Any = None) -> list[dict[str, Any]]:
    """`collect --plan` entries of round 1: each dispatch-grid cell's candidates (`first_round`; with `nearest=None`
    only the policy's top_k and the engine's entry)."""
    from kernel_gym.deploy.export import bucket_grid

    _, _, workloads = bucket_grid(kernel, model)
    plan = []
    for w in dict((w.key(), w) for w in workloads).values():
        configs = first_round(w, rank, top_k, nearest) if kernel == "fused_moe" else rank(w)[:top_k]
        if configs:
            plan.append({"kernel": kernel, "workload": w.key(), "configs": [str(c) for c in configs]})
    return plan


def local_plan(kernel: str, plan: list[dict[str, Any]], times: dict[tuple[str, str], float],
               limit: int = LOCAL_STEPS) -> list[dict[str, Any]]:
    """Round 2: per cell, the one-knob steps around the fastest config measured in round 1 (none where nothing was
    measured yet: a budget cut)."""
    from kernel_gym.kernels import get_family
    from kernel_gym.measure.worker import workload_from_key

    fam = get_family(kernel)
    out = []
    for e in plan:
        measured = [(times[(e["workload"], c)], c) for c in e["configs"] if (e["workload"], c) in times]
        if not measured:
            continue
        best = Config.parse(min(measured)[1])
        w = workload_from_key(fam, e["workload"])
        steps = local_steps(best, w, fam.space, limit, exclude={Config.parse(c) for c in e["configs"]})
        if steps:
            out.append({"kernel": kernel, "workload": e["workload"], "configs": [str(c) for c in steps]})
    return out


def merge_plans(*plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per cell, configs of every plan in order."""
    cells: dict[str, dict[str, Any]] = {}
    for plan in plans:
        for e in plan:
            cell = cells.setdefault(e["workload"], {**e, "configs": []})
            cell["configs"] = list(dict.fromkeys([*cell["configs"], *e["configs"]]))
    return list(cells.values())


def tuned_predictor(plan: list[dict[str, Any]], times: dict[tuple[str, str], float], fallback: Any) -> Any:
    """predict(workloads) for export.build_table: the fastest measured candidate of the cell, else `fallback`."""
    best: dict[str, Config] = {}
    for e in plan:
        measured = [(times[(e["workload"], c)], c) for c in e["configs"] if (e["workload"], c) in times]
        if measured:
            best[e["workload"]] = Config.parse(min(measured)[1])

    def predict(workloads: list[Any]) -> list[Config]:
        zero_shot = fallback(workloads)
        return [best.get(w.key(), z) for w, z in zip(workloads, zero_shot)]

    predict.measured_cells = len(best)  # type: ignore[attr-defined]
    return predict


def engine_kept(plan: list[dict[str, Any]], times: dict[tuple[str, str], float]) -> dict[str, Any]:
    """Where the engine's own entry was measured: in how many cells it stayed the pick, and the geomean gain of the
    pick over it (>= 1 by construction: it is one of the candidates the pick is the fastest of)."""
    import math

    from kernel_gym.kernels import get_family
    from kernel_gym.measure.worker import workload_from_key

    fam = get_family("fused_moe")
    measured = kept = 0
    logs = []
    for e in plan:
        engine = engine_candidate(workload_from_key(fam, e["workload"]))
        t_engine = times.get((e["workload"], str(engine))) if engine is not None else None
        ts = [times[(e["workload"], c)] for c in e["configs"] if (e["workload"], c) in times]
        if t_engine is None or not ts:
            continue
        measured += 1
        kept += min(ts) == t_engine
        logs.append(math.log(t_engine / min(ts)))
    return {"measured": measured, "kept": kept, "geomean_gain": math.exp(sum(logs) / len(logs)) if logs else 1.0}


def stored_times(db: str, kernel: str, device_name: str) -> dict[tuple[str, str], float]:
    """(workload key, config) -> median ms of the ok rows of this kernel's current source on this device."""
    from kernel_gym.measure.collect import contexts_for
    from kernel_gym.measure.store import MeasurementStore

    ctx = contexts_for([kernel], device_name)[kernel]
    store = MeasurementStore(db)
    try:
        return {(r["workload"], r["config"]): float(r["median_ms"]) for r in store.rows(kernel)
                if r["status"] == "ok" and r["median_ms"] and r["source_hash"] == ctx.source_hash
                and r["device"] == ctx.device}
    finally:
        store.close()


def check_kernels_run(spec: Any, kernels: Sequence[str]) -> None:
    """Refuse, before any policy is read or any GPU second spent, a kernel whose family cannot run the spec's shape
    (head_dim 80, 96 or 192 for the attention kernels): its plan would be empty and the table, written after the
    measurements, would fail on its zero-shot cells."""
    from kernel_gym.deploy.export import cannot_run

    for kernel in kernels:
        why = cannot_run(kernel, spec)
        if why:
            others = [k for k in kernels if k != kernel]
            rest = (f"tune the others alone with --kernels {','.join(others)}" if others else
                    "there is nothing else to tune")
            raise ValueError(f"{spec.name}: {kernel} cannot run this shape ({why}); {rest}")


def policy_uris(model_name: str, kernels: Sequence[str], model_uris: Sequence[str]) -> dict[str, str]:
    """kernel -> the MLflow policy tune ranks with (--model-uri, else the latest registered for the model); a
    kernel without one is refused here, before the plan's slower work, naming the shipped policies."""
    from kernel_gym.deploy.export import latest_model_uris, parse_model_uris, shipped_policy_dir

    given = parse_model_uris(model_uris)
    bare = [uri for k, uri in given.items() if k is None or k.startswith("?")]
    if bare:  # tune takes each kernel's policy by name
        raise ValueError(f"--model-uri {bare[0]}: tune needs the kernel it is for, as KERNEL=URI (e.g. "
                         f"fused_moe={bare[0]}); without it the latest registered policy was taken in its place")
    latest = latest_model_uris(model_name) if any(k not in given for k in kernels) else {}
    uris = {k: given.get(k) or latest.get(k) for k in kernels}
    missing = [k for k, uri in uris.items() if not uri]
    if missing:
        others = [k for k in kernels if k not in missing]
        subset = f", or leave them out (--kernels {','.join(others)})" if others else ""
        raise ValueError(f"no {', '.join(missing)} policy in the MLflow store: pass --policy-dir "
                         f"{shipped_policy_dir()} (the zoo policies the repository ships), train one (kernel-gym "
                         f"train --model zoo --env-id ...), pass --model-uri {missing[0]}=URI" + subset)
    return uris


def tune_model(*, model: str, kernels: Sequence[str] = KERNELS, top_k: int = 4, budget_s: float = 120.0,
               db: str = "tune.sqlite", model_uris: Sequence[str] = (), policy_dir: Path | None = None,
               save_policies: Path | None = None, out: Path = Path("deploy/tuned_table.json"),
               tracking_uri: str = "", local: int = LOCAL_STEPS, no_nearest: bool = False, dry_run: bool = False,
               device: str = "cuda") -> int:
    """`kernel-gym tune` (module docstring): the plan for the model spec `model`, measured within `budget_s` into
    `db` (a rerun resumes), the tuned dispatch table written to `out`. `dry_run` prints the plan size only;
    `save_policies` writes the MLflow policies there for `policy_dir` on the GPU machine, and stops."""
    from kernel_gym.deploy.export import build_table, check_policy_model
    from kernel_gym.models import load_model, spec_caveats

    if top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {top_k}")
    if budget_s <= 0:
        raise ValueError(f"--budget-s must be > 0, got {budget_s}")
    spec = load_model(model)
    for line in spec_caveats(spec):
        print(f"[tune] note: {line}", flush=True)
    if device == "cuda" and not (dry_run or save_policies):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("tune measures configs on a CUDA GPU and this machine has none: run it on the GPU "
                             "machine (policies saved here with --save-policies DIR, read there with --policy-dir "
                             "DIR), print the plan with --dry-run, or write the zero-shot table on the CPU with "
                             "`kernel-gym export`")
    if not policy_dir:
        from kernel_gym.train import tracking

        tracking.setup_tracking(tracking_uri or None)
    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        raise ValueError(f"--kernels: cannot tune {bad}; tune supports {list(KERNELS)}")
    check_kernels_run(spec, kernels)
    uris = {} if policy_dir else policy_uris(spec.name, kernels, model_uris)  # every policy found before any work
    plans, rankers = {}, {}
    nearest = None
    for kernel in kernels:
        cost = None
        if policy_dir:
            from kernel_gym.train.bundle import load_cost_model

            meta, params, provenance = load_bundle(policy_dir, kernel)
            cost = load_cost_model(policy_dir, kernel)  # fused_moe: ranks round 1 as `export` ranks zero-shot
        else:
            meta, params, provenance = policy_bundle(uris[kernel], kernel)
            from kernel_gym.dispatch import cost_model as cm

            if kernel == cm.KERNEL and provenance.get("model_conditioned"):
                cost = cm.packaged()  # as `export` re-ranks this policy (export.reranked_zero_shot)
            if save_policies:
                save_bundle(save_policies, kernel, meta, params, provenance, cost_model=cost)
        print(check_policy_model(kernel, provenance, spec), flush=True)
        if kernel == "fused_moe":
            from kernel_gym.dispatch.shape_coverage import coverage, trained_shapes

            print(f"[tune] {coverage(spec, trained_shapes(provenance)).line()}", flush=True)
            if nearest is None and not no_nearest:
                nearest = NearestWinners()
        if cost is not None:
            rank = zero_shot_ranker(kernel, meta, params, cost, nearest)
            print(f"[tune] {kernel}: round 1 takes the cost model's top {top_k} of the whole valid space "
                  f"({f'shipped in {policy_dir}' if policy_dir else 'the packaged cost model'}), as `export` ranks "
                  "its zero-shot choice", flush=True)
        else:
            rank = ranker(kernel, meta, params)
        rankers[kernel] = (rank, provenance)
        plans[kernel] = tune_plan(kernel, spec, rankers[kernel][0], top_k, nearest)
    total = sum(len(e["configs"]) for p in plans.values() for e in p)
    cells = sum(len(p) for p in plans.values())
    print(f"[tune] {spec.name}: {cells} grid cells, {total} round-1 candidates (the policy's top {top_k}, "
          f"the nearest measured shapes' winners, the engine's own entry; then up to {local} one-knob steps "
          "around each cell's best)", flush=True)
    if save_policies:
        print(f"[tune] policies saved to {save_policies}: run `kernel-gym tune --model {model} "
              f"--policy-dir {save_policies}` on the GPU machine")
    from kernel_gym.measure.collect import CollectOptions, collect

    def options(plan: list[dict[str, Any]], seconds: float, tmp: str) -> CollectOptions:
        plan_path = Path(tmp) / "tune_plan.json"
        plan_path.write_text(json.dumps(plan))
        return CollectOptions(models=[], kernels=list(kernels), plan_file=str(plan_path), db=db, budget_s=seconds,
                              device=device)

    def run(plan: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            return collect(options(plan, seconds, tmp))

    if dry_run:
        from kernel_gym.measure.collect import dry_run as collect_dry_run

        with tempfile.TemporaryDirectory() as tmp:
            est = collect_dry_run(options([e for p in plans.values() for e in p], budget_s, tmp))
        lo, hi = est["projected_range_s"]
        fits = ("fits" if hi <= budget_s else "may not fit: a rerun with the same --db resumes, or raise --budget-s"
                if est["projected_s"] <= budget_s else
                f"is more than the budget: about {budget_s / est['projected_s']:.0%} of it is measured before "
                f"the budget ends; a rerun with the same --db resumes, or raise --budget-s")
        held = (f"; {est['already_stored']} of its {est['configs']} configs are already in --db "
                f"({'; '.join(f'{k} from {v}' for k, v in est['stored_on'].items())}) and are skipped on that machine"
                if est["already_stored"] else "")
        print(f"[tune] round 1 projected at about {est['projected_s']:.0f} s on one H200 ({lo:.0f}-{hi:.0f} s at past "
              f"runs' pace) against --budget-s {budget_s:g}: it {fits}; the one-knob steps use what is left{held}",
              flush=True)
    if dry_run or save_policies:
        return 0

    t0 = time.time()
    device_name = "cpu-interpreter" if device == "cpu" else __import__("torch").cuda.get_device_name(0)
    res = run([e for p in plans.values() for e in p], budget_s)
    written = res["written"]
    left = budget_s - (time.time() - t0)
    if local > 0 and left >= ROUND_MIN_S and not res.get("stopped_by_budget"):
        round2 = {k: local_plan(k, plans[k], stored_times(db, k, device_name), local) for k in kernels}
        n_local = sum(len(e["configs"]) for p in round2.values() for e in p)
        print(f"[tune] round 2 (local search): {n_local} one-knob steps around the cells' best", flush=True)
        res = run([e for p in round2.values() for e in p], left)
        written += res["written"]
        plans = {k: merge_plans(plans[k], round2[k]) for k in kernels}
    res = {**res, "written": written}
    gpu_s = time.time() - t0
    predictors, report = {}, {}
    for kernel in kernels:
        rank, provenance = rankers[kernel]

        def zero_shot(workloads: list[Any], rank: Any = rank, kernel: str = kernel) -> list[Config]:
            from kernel_gym.kernels import get_family

            fam = get_family(kernel)
            return [next(iter(rank(w)), None) or fam.default_config(w) for w in workloads]

        times = stored_times(db, kernel, device_name)
        predict = tuned_predictor(plans[kernel], times, zero_shot)
        predictors[kernel] = (predict, {**provenance, "tuned": {"db": db, "top_k": top_k,
                                                                 "local": local, "gpu_s": round(gpu_s, 1)}})
        report[kernel] = {"cells": len(plans[kernel]), "measured_cells": predict.measured_cells}
        if kernel == "fused_moe":
            report[kernel]["engine"] = engine_kept(plans[kernel], times)
    table = build_table(spec, predictors, device_name)
    path = table.save(out)
    for kernel, r in report.items():
        print(f"[tune] {kernel}: {r['measured_cells']}/{r['cells']} cells tuned on measurements, the rest zero-shot")
        if "engine" in r:
            e = r["engine"]
            print(f"[tune] {kernel}: the engine's own entry was measured at {e['measured']} cells and kept at "
                  f"{e['kept']} (no pick is slower than it where it was measured); geomean gain over it "
                  f"{e['geomean_gain']:.3f}", flush=True)
    print(f"[tune] {res['written']} configs measured in {gpu_s:.0f} GPU-seconds"
          f"{' (budget reached: rerun to resume)' if res.get('stopped_by_budget') else ''}; table -> {path}")
    return 0
