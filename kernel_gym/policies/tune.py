"""`kernel-gym tune`: a few minutes of GPU for a model the policy never saw: measure only the policy's top candidates
at every cell of the spec's dispatch grid, keep the fastest, export the dispatch table.

Why this is enough: on models never trained on, the model-conditioned policy's first choice reaches 0.95 of a
>= 256-config sweep on average, and its 8 most preferred valid configs hold 0.99 (benchmarks/generalisation.json), at
1/32 of the sweep's GPU time. So tuning measures, per cell of the grid the Dispatcher looks up (the same cells
`kernel-gym export` writes), the policy's top-k configs by its own preference among those the knob-space rules allow,
through the usual collection (isolated workers, reference check, SQLite store: a rerun resumes and measures nothing
twice), then "refits" the table: each cell gets its fastest measured candidate, cells without a measurement keep the
policy's zero-shot choice. Prints the GPU-seconds spent.

    kernel-gym tune --model my_moe.json --budget-s 300 --out deploy/tuned_table.json          # GPU
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kernel_gym.kernels.space import Config
from kernel_gym.policies.bundle import load_bundle, policy_bundle, save_bundle  # noqa: F401 (re-exported)

KERNELS = ("fused_moe", "decode_attention")


def ranker(kernel: str, meta: dict[str, Any], params: dict[str, np.ndarray]) -> Any:
    """rank(workload) -> the catalogue configs the knob-space rules allow there, the policy's most preferred first:
    the same masked logits the exported model's argmax uses for a workload it never saw."""
    from kernel_gym.dispatch import observation
    from kernel_gym.kernels import get_family

    space = get_family(kernel).space
    configs = [Config(c) for c in meta["configs"]]

    def rank(workload: Any) -> list[Config]:
        mask = np.array([space.is_valid(c, workload) for c in configs], dtype=bool)
        if not mask.any():
            return []
        logits = observation.actor_logits(params, meta["activation"], observation.observe(workload)[None, :])[0]
        order = np.argsort(-np.where(mask, logits, -np.inf), kind="stable")
        return [configs[int(i)] for i in order if mask[i]]

    return rank


def tune_plan(kernel: str, model: Any, rank: Any, top_k: int) -> list[dict[str, Any]]:
    """`collect --plan` entries: each dispatch-grid cell's top_k ranked configs."""
    from kernel_gym.policies.export import bucket_grid

    _, _, workloads = bucket_grid(kernel, model)
    plan = []
    for w in dict((w.key(), w) for w in workloads).values():
        configs = rank(w)[:top_k]
        if configs:
            plan.append({"kernel": kernel, "workload": w.key(), "configs": [str(c) for c in configs]})
    return plan


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernel-gym tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model spec: a built-in or zoo name, NAME@tpN, or a JSON file")
    p.add_argument("--kernels", default=",".join(KERNELS), help="comma list of kernels to tune")
    p.add_argument("--top-k", type=int, default=8, help="candidates measured per grid cell (most preferred first)")
    p.add_argument("--budget-s", type=float, default=300.0, help="GPU time budget; a rerun resumes where it stopped")
    p.add_argument("--db", default="tune.sqlite", help="measurement store (created; resumed when it exists)")
    p.add_argument("--model-uri", action="append", default=[], metavar="[KERNEL=]URI",
                   help="policy per kernel (default: the latest registered policy for the model, else the "
                        "model-conditioned one)")
    p.add_argument("--policy-dir", type=Path, default=None,
                   help="read the policies from KERNEL.json/.npz here (no MLflow needed: a GPU machine)")
    p.add_argument("--save-policies", type=Path, default=None,
                   help="write the MLflow policies to this folder for --policy-dir, print the plan, and exit")
    p.add_argument("--out", type=Path, default=Path("deploy/tuned_table.json"), help="dispatch table JSON")
    p.add_argument("--tracking-uri", default="", help="MLflow store holding the policies (default: mlruns/)")
    p.add_argument("--dry-run", action="store_true", help="print the plan size and exit (no GPU needed)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the interpreter (tests only)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kernel_gym.models import load_model
    from kernel_gym.policies.export import build_table, check_policy_model

    if args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    if args.budget_s <= 0:
        raise ValueError(f"--budget-s must be > 0, got {args.budget_s}")
    model = load_model(args.model)
    if not args.policy_dir:
        from kernel_gym.policies import tracking

        tracking.setup_tracking(args.tracking_uri or None)
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        raise ValueError(f"--kernels: cannot tune {bad}; tune supports {list(KERNELS)}")
    plans, rankers = {}, {}
    for kernel in kernels:
        if args.policy_dir:
            meta, params, provenance = load_bundle(args.policy_dir, kernel)
        else:
            from kernel_gym.policies.export import latest_model_uris, parse_model_uris

            given = parse_model_uris(args.model_uri)
            uri = given.get(kernel) or latest_model_uris(model.name).get(kernel)
            if not uri:
                raise ValueError(f"no {kernel} policy in the MLflow store: pass --policy-dir "
                                 "benchmarks/generalisation/policies (the zoo policies the repository ships), train "
                                 f"one (kernel-gym train --model zoo --env-id ...), or pass --model-uri {kernel}=URI")
            meta, params, provenance = policy_bundle(uri, kernel)
            if args.save_policies:
                save_bundle(args.save_policies, kernel, meta, params, provenance)
        print(check_policy_model(kernel, provenance, model), flush=True)
        rankers[kernel] = (ranker(kernel, meta, params), provenance)
        plans[kernel] = tune_plan(kernel, model, rankers[kernel][0], args.top_k)
    total = sum(len(e["configs"]) for p in plans.values() for e in p)
    cells = sum(len(p) for p in plans.values())
    print(f"[tune] {model.name}: {cells} grid cells, {total} candidate configs (top {args.top_k} each)", flush=True)
    if args.save_policies:
        print(f"[tune] policies saved to {args.save_policies}: run `kernel-gym tune --model {args.model} "
              f"--policy-dir {args.save_policies}` on the GPU machine")
    if args.dry_run or args.save_policies:
        return 0
    from kernel_gym.measure.collect import CollectOptions, collect

    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = Path(tmp) / "tune_plan.json"
        plan_path.write_text(json.dumps([e for p in plans.values() for e in p]))
        res = collect(CollectOptions(models=[], kernels=kernels, plan_file=str(plan_path), db=args.db,
                                     budget_s=args.budget_s, device=args.device))
    gpu_s = time.time() - t0
    device_name = "cpu-interpreter" if args.device == "cpu" else __import__("torch").cuda.get_device_name(0)
    predictors, report = {}, {}
    for kernel in kernels:
        rank, provenance = rankers[kernel]

        def zero_shot(workloads: list[Any], rank: Any = rank, kernel: str = kernel) -> list[Config]:
            from kernel_gym.kernels import get_family

            fam = get_family(kernel)
            return [next(iter(rank(w)), None) or fam.default_config(w) for w in workloads]

        predict = tuned_predictor(plans[kernel], stored_times(args.db, kernel, device_name), zero_shot)
        predictors[kernel] = (predict, {**provenance, "tuned": {"db": args.db, "top_k": args.top_k}})
        report[kernel] = {"cells": len(plans[kernel]), "measured_cells": predict.measured_cells}
    table = build_table(model, predictors, device_name)
    path = table.save(args.out)
    for kernel, r in report.items():
        print(f"[tune] {kernel}: {r['measured_cells']}/{r['cells']} cells tuned on measurements, the rest zero-shot")
    print(f"[tune] {res['written']} configs measured in {gpu_s:.0f} GPU-seconds"
          f"{' (budget reached: rerun to resume)' if res.get('stopped_by_budget') else ''}; table -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
