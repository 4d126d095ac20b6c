"""Leave-out over the shape-space design, on its recorded H200 rows: does the policy answer well at shapes it never
saw, and what do the shape-relative tile rules add?

Two parts (ratio = best recorded config of the workload / the choice's recorded time; a choice without a recorded
time there is counted and left out, never priced from a neighbour; the design's rows hold ~33 configs per workload,
an easier bar than the live >= 256-config sweeps of scripts/zero_shot_live.py):

- `--part mask`: the policy bundle given by --policy-dir (default: the shipped one), choosing zero-shot at every design
  workload with two masks: the kernels' launch rules alone (fused_moe.LAUNCH_SPACE, what the mask was before the
  tile-fits rule) and the family space (with `_rule_tile_fits`). The shipped bundle never trained on a design shape.
- `--part folds`: K policies, each trained on the zoo and the design minus one fold of design shapes (every K-th),
  choosing at that fold's workloads with the family space.

    python scripts/design_loo.py --part mask --out benchmarks/generalisation/design_loo.json
    python scripts/design_loo.py --part folds --folds 2 --out benchmarks/generalisation/design_loo.json  # 10 min/fold
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np


def _summary(rows: list[dict], unmeasured: int) -> dict:
    r = sorted(x["ratio"] for x in rows)
    return {"workloads": len(rows), "unmeasured_choices": unmeasured,
            "geomean": math.exp(sum(map(math.log, r)) / len(r)) if r else None,
            "p5": r[max(0, math.ceil(0.05 * len(r)) - 1)] if r else None, "min": r[0] if r else None,
            "below_0.8": sum(x < 0.8 for x in r)}


def recorded_times(backend, w) -> dict:
    times = {}
    for c in backend.available_configs("fused_moe", w):
        m = backend.measure("fused_moe", w, c)
        if m.ok and m.median_ms:
            times[c] = m.median_ms
    return times


def score(choose, backend, workloads) -> tuple[list[dict], int]:
    rows, unmeasured = [], 0
    for name, w in workloads:
        times = recorded_times(backend, w)
        if not times:
            continue
        c = choose(w)
        if c not in times:
            unmeasured += 1
            continue
        rows.append({"shape": name, "workload": w.key(), "chosen": str(c), "ratio": min(times.values()) / times[c]})
    return rows, unmeasured


def part_mask(args, backend, out: dict) -> None:
    from kernel_gym import zoo
    from kernel_gym.dispatch import observation
    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.kernels.space import Config
    from kernel_gym.policies.bundle import load_bundle

    meta, params, prov = load_bundle(args.policy_dir, "fused_moe")
    configs = [Config(c) for c in meta["configs"]]
    workloads = [(s.name, w) for s in zoo.DESIGN.values() for w in zoo.shard_workloads("fused_moe", s, "zoo")]

    def chooser(space):
        def choose(w):
            mask = np.array([space.is_valid(c, w) for c in configs])
            if not mask.any():
                return fm.default_config(w)
            logits = observation.actor_logits(params, meta["activation"], observation.observe(w)[None, :])[0]
            return configs[int(np.argmax(np.where(mask, logits, -np.inf)))]
        return choose

    res = {}
    for label, space in (("launch_rules_only", fm.LAUNCH_SPACE), ("with_tile_fits", fm.LAYER_SPACE)):
        rows, unmeasured = score(chooser(space), backend, workloads)
        res[label] = {**_summary(rows, unmeasured), "rows": rows}
        print(f"mask {label}: {json.dumps(_summary(rows, unmeasured))}", flush=True)
    out["mask"] = {"policy": prov.get("model_uri", str(args.policy_dir)), "policy_dir": str(args.policy_dir),
                   "note": "a policy that never trained on a design shape, choosing zero-shot at all 320 design "
                           "workloads; the two masks differ only by the tile-fits rule", **res}


def part_folds(args, backend, out: dict) -> None:
    from sb3_contrib import MaskablePPO

    from kernel_gym import zoo
    from kernel_gym.kernels import get_family
    from kernel_gym.policies import zoo_policy
    from kernel_gym.policies.train import TrainArgs, train

    fam = get_family("fused_moe")
    names = list(zoo.DESIGN)
    folds = out.setdefault("folds", {})
    for k in range(args.folds):
        fold = names[k::args.folds]
        if str(k) in folds:  # resumable
            continue
        ckpt = args.checkpoints / f"design-fold{k}of{args.folds}"
        res = train(TrainArgs(env_id="KernelGym/MoE-v0", model=zoo_policy.ZOO_MODEL, exclude_models=",".join(fold),
                              holdout=0.1, seed=args.seed, total_timesteps=args.timesteps, eval_freq=0,
                              checkpoint_freq=0, checkpoint_dir=str(ckpt), experiment="kernel-gym-design-loo",
                              run_name=f"design-fold{k}of{args.folds}", tracking_uri=args.tracking_uri,
                              progress_bar=False, log_model=False, register_model=False), backend=backend)
        policy = MaskablePPO.load(ckpt / "latest.zip", device="cpu")
        workloads = [(n, w) for n in fold for w in zoo.shard_workloads("fused_moe", zoo.DESIGN[n], "zoo")]
        rows, unmeasured = score(lambda w, p=policy, cat=res.catalogue: zoo_policy.choose(p, cat, w,
                                                                                          fam.default_config(w)),
                                 backend, workloads)
        folds[str(k)] = {"left_out": fold, **_summary(rows, unmeasured), "rows": rows}
        print(f"fold {k}: {json.dumps(_summary(rows, unmeasured))}", flush=True)
        args.out.write_text(json.dumps(out, indent=1))
    allrows = [r for f in folds.values() for r in f["rows"]]
    out["folds_summary"] = {**_summary(allrows, sum(f["unmeasured_choices"] for f in folds.values())),
                            "folds": args.folds, "timesteps": args.timesteps, "seed": args.seed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("mask", "folds"), required=True)
    p.add_argument("--out", type=Path, default=Path("benchmarks/generalisation/design_loo.json"))
    p.add_argument("--policy-dir", type=Path, default=Path("benchmarks/generalisation/policies"))
    p.add_argument("--folds", type=int, default=2)
    p.add_argument("--timesteps", type=int, default=30_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tracking-uri", default="", help="MLflow store of the fold runs (default: mlruns/)")
    p.add_argument("--checkpoints", type=Path, default=Path("out/checkpoints"))
    args = p.parse_args(argv)
    from kernel_gym.measure import make_backend

    backend = make_backend("recorded")
    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    out.setdefault("meta", {})[args.part] = {"command": "python scripts/design_loo.py " + " ".join(sys.argv[1:]),
                                             "dataset_sha256": getattr(backend, "dataset_hash", "")}
    (part_mask if args.part == "mask" else part_folds)(args, backend, out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
