"""Leave-out over the shape-space design, on its recorded H200 rows: does the policy answer well at shapes it never
saw, and what do the shape-relative tile rules add?

Two parts (ratio = best recorded config of the workload / the choice's recorded time; a choice without a recorded
time there is counted and left out, never priced from a neighbour; the design's rows hold ~33 configs per workload,
an easier bar than the live >= 256-config sweeps of benchmarks/generalisation/run.py):

- `--part mask`: the policy bundle given by --policy-dir (default: the shipped one), choosing zero-shot at every design
  workload with two masks: the kernels' launch rules alone (fused_moe.LAUNCH_SPACE, what the mask was before the
  tile-fits rule) and the family space (with `_rule_tile_fits`). The shipped bundle never trained on a design shape.
- `--part folds`: K policies, each trained on the zoo and the design minus one fold of design shapes (every K-th),
  choosing at that fold's workloads with the family space.
- `--part rerank`: the learned cost model (kernel_gym.dispatch.cost_model) re-ranking zero-shot candidates, fitted
  without a row of the held-out shapes, (a) over the same K design folds as `folds` and (b) leaving out one zoo
  training model at a time (every shard of it); candidates are the catalogue, the nearest measured shapes' winners
  (from the fit's rows only) and the engine's entry, with and without the held-out policy's own choice (the `folds`
  rows and lomo_recorded.json's rows: policies that never saw the shape). No fold policy's top 8 (PPO per fold is
  10 CPU-min; the held-out top-1 is what those runs recorded). Also the live far test (run8_far: 276-config sweeps).

    python benchmarks/generalisation/run_design_loo.py --part mask --out benchmarks/generalisation/design_loo.json
    python benchmarks/generalisation/run_design_loo.py --part folds --folds 2 \\
        --out benchmarks/generalisation/design_loo.json  # 10 min/fold
    python benchmarks/generalisation/run_design_loo.py --part rerank --folds 2 \\
        --out benchmarks/generalisation/design_loo.json  # ~3 min
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
    from kernel_gym.train.bundle import load_bundle

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
    from kernel_gym.train import zoo_policy
    from kernel_gym.train.train import TrainArgs, train

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


class _Without:
    """A recorded backend's fused_moe rows minus some shapes: what NearestWinners may look at in a held-out split."""

    def __init__(self, backend, shapes: set) -> None:
        import json as _json

        self._rows = {k: v for k, v in backend.rows("fused_moe").items()
                      if tuple(_json.loads(k)[f] for f in ("num_experts", "top_k", "hidden", "intermediate", "dtype"))
                      not in shapes}

    def rows(self, kernel):
        return self._rows if kernel == "fused_moe" else {}


def _rerank_split(backend, catalogue, left_out_shapes: set, workloads, policy_choice: dict, seed: int) -> dict:
    """Fit without the left-out shapes, choose at their workloads: re-ranked candidates vs the policy's choice."""
    from kernel_gym.deploy.tune import NearestWinners, engine_candidate
    from kernel_gym.dispatch import cost_model as cm
    from kernel_gym.kernels import get_family

    space = get_family("fused_moe").space
    model = cm.fit_packaged(backend, cm.FitOptions(seed=seed), exclude_shapes=left_out_shapes)
    nearest = NearestWinners(_Without(backend, left_out_shapes))
    rows = []
    for name, w in workloads:
        times = recorded_times(backend, w)
        if not times:
            continue
        best = min(times.values())
        base = [c for c in catalogue if space.is_valid(c, w)]
        base += [c for c in nearest(w) if space.is_valid(c, w)]
        engine = engine_candidate(w)
        base += [engine] if engine is not None else []
        base = list(dict.fromkeys(base))
        pol = policy_choice.get(w.key())
        with_policy = list(dict.fromkeys(([pol] if pol is not None and space.is_valid(pol, w) else []) + base))
        row = {"shape": name, "workload": w.key(), "candidates": len(with_policy),
               "candidates_recorded": sum(c in times for c in with_policy)}
        for label, cands in (("rerank", base), ("rerank_with_policy", with_policy), ("rank_recorded", list(times))):
            c = model.rank(w, cands)[0]
            row[label] = best / times[c] if c in times else None
            row[f"{label}_config"] = str(c)
        if pol is not None:
            row["policy"] = best / times[pol] if pol in times else None
        measured = [times[c] for c in with_policy if c in times]
        row["candidates_oracle"] = best / min(measured) if measured else None
        rows.append(row)
    return {"rows": rows, "fit": {k: model.meta[k] for k in ("workloads", "rows", "shapes", "final_loss")}}


def _compare(rows: list[dict]) -> dict:
    """Each chooser's summary over its own measured choices (a workload where a chooser has no choice at all, e.g. no
    recorded policy choice, is left out of its count), and the paired geomean where policy and re-ranker are both
    measured. rank_recorded: the cost model ranking every recorded config of the workload (its ranking quality alone,
    not a zero-shot candidate set: it knows which configs were measured there, never their times)."""
    out = {}
    for label in ("policy", "rerank", "rerank_with_policy", "rank_recorded", "candidates_oracle"):
        have = [r for r in rows if label in r]
        scored = [{"ratio": r[label]} for r in have if r[label] is not None]
        out[label] = _summary(scored, sum(r[label] is None for r in have))
    both = [r for r in rows if r.get("policy") is not None and r.get("rerank_with_policy") is not None]
    if both:
        out["paired_with_policy"] = {label: {k: v for k, v in _summary([{"ratio": r[label]} for r in both], 0).items()
                                             if k != "unmeasured_choices"}
                                     for label in ("policy", "rerank_with_policy")}
    return out


def _far_live(args, backend, catalogue) -> dict:
    """The live far test (16 workloads of 4 models never measured into the dataset, each with a >= 256-config sweep):
    the packaged cost model re-ranking each seed's top 8 (the tune list the plan recorded) + catalogue + nearest
    winners + engine entry, against that seed's own choice; ratio = the sweep's best / the choice's sweep time."""
    import ast

    from kernel_gym.deploy.tune import NearestWinners, engine_candidate
    from kernel_gym.dispatch import cost_model as cm
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.worker import workload_from_key

    def parse(v):
        return ast.literal_eval(v) if isinstance(v, str) and v[:1] in "{[" else v

    fam = get_family("fused_moe")
    data = json.loads(args.far.read_text())
    model = cm.fit_packaged(backend, cm.FitOptions(seed=args.seed))
    nearest = NearestWinners(backend)
    rows = []
    for r in data["results"]:
        if r.get("kernel") != "fused_moe":
            continue
        w = workload_from_key(fam, json.dumps(parse(r["workload"]), sort_keys=True, separators=(",", ":")))
        status = parse(r["status"])
        times = {Config.parse(c): t for c, t in parse(r["sweep_ms"]).items() if t and status.get(c) == "ok"}
        best = min(times.values())
        base = [c for c in catalogue if fam.space.is_valid(c, w)] + [c for c in nearest(w) if fam.space.is_valid(c, w)]
        engine = engine_candidate(w)
        base += [engine] if engine is not None else []
        for seed, top in parse(r["tune"]).items():
            top = [Config.parse(c) for c in top]
            pol = Config.parse(parse(r["choices"])[seed])
            cands = list(dict.fromkeys([c for c in top if fam.space.is_valid(c, w)] + base))
            c = model.rank(w, cands)[0]
            rows.append({"shard": r["shard"], "workload": w.key(), "seed": seed, "rerank_config": str(c),
                         "rerank_with_policy": best / times[c] if c in times else None,
                         "policy": best / times[pol] if pol in times else None,
                         "candidates_oracle": best / min([times[x] for x in cands if x in times] or [math.inf])})
    return {"source": str(args.far), **_compare(rows), "rows": rows}


def part_rerank(args, backend, out: dict) -> None:
    from kernel_gym import zoo
    from kernel_gym.dispatch.cost_model import shape_of
    from kernel_gym.kernels.space import Config
    from kernel_gym.train.bundle import load_bundle

    meta, _, _ = load_bundle(args.policy_dir, "fused_moe")
    catalogue = [Config(c) for c in meta["configs"]]
    res = {"catalogue": f"{args.policy_dir}/fused_moe.json ({len(catalogue)} configs)", "seed": args.seed}
    # (a) the design folds of `--part folds`, the policy's choices from its rows
    folds = out.get("folds", {})
    pol = {r["workload"]: Config.parse(r["chosen"]) for f in folds.values() for r in f["rows"]}
    names = list(zoo.DESIGN)
    design_rows = []
    for k in range(args.folds):
        fold = names[k::args.folds]
        workloads = [(n, w) for n in fold for w in zoo.shard_workloads("fused_moe", zoo.DESIGN[n], "zoo")]
        split = _rerank_split(backend, catalogue, {shape_of(w) for _, w in workloads}, workloads, pol, args.seed)
        design_rows += split["rows"]
        print(f"design fold {k}: {json.dumps(_compare(split['rows']))}", flush=True)
    res["design_folds"] = {"folds": args.folds, **_compare(design_rows), "rows": design_rows,
                           "policy_source": "design_loo.json folds rows (each fold's policy never saw the fold)"}
    # (b) leave one zoo training model out
    lomo = json.loads(args.lomo.read_text())["kernels"]["fused_moe"] if args.lomo.exists() else {}
    pol = {r["workload"]: Config.parse(r["chosen"]) for m in lomo.values() for r in m["rows"]}
    lomo_rows = []
    for model in [m for m in zoo.training_models("fused_moe") if m not in zoo.TOO_LARGE]:
        workloads = [(s.name, w) for s in zoo.zoo_shards([model]) for w in zoo.shard_workloads("fused_moe", s, "zoo")]
        split = _rerank_split(backend, catalogue, {shape_of(w) for _, w in workloads}, workloads, pol, args.seed)
        lomo_rows += [{**r, "model": model} for r in split["rows"]]
        print(f"without {model}: {json.dumps(_compare(split['rows']))}", flush=True)
    res["lomo"] = {**_compare(lomo_rows), "rows": lomo_rows,
                   "policy_source": f"{args.lomo} rows (each policy trained without that model)"}
    if args.far.exists():
        res["far_live"] = _far_live(args, backend, catalogue)
    out["rerank"] = res
    for key in ("design_folds", "lomo", "far_live"):
        if key not in res:
            continue
        print(key, json.dumps({k: v for k, v in res[key].items() if k != "rows"}, indent=1), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("mask", "folds", "rerank"), required=True)
    p.add_argument("--out", type=Path, default=Path("benchmarks/generalisation/design_loo.json"))
    p.add_argument("--policy-dir", type=Path, default=Path("benchmarks/generalisation/policies"))
    p.add_argument("--folds", type=int, default=2)
    p.add_argument("--timesteps", type=int, default=30_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tracking-uri", default="", help="MLflow store of the fold runs (default: mlruns/)")
    p.add_argument("--checkpoints", type=Path, default=Path("out/checkpoints"))
    p.add_argument("--lomo", type=Path, default=Path("benchmarks/generalisation/lomo_recorded.json"),
                   help="rerank: leave-one-model-out policy choices to compare with "
                        "(benchmarks/generalisation/run_lomo.py)")
    p.add_argument("--far", type=Path, default=Path("benchmarks/generalisation/run8_far/live_far.json"),
                   help="rerank: the live far test's results (benchmarks/generalisation/run.py time)")
    args = p.parse_args(argv)
    from kernel_gym.measure import make_backend

    backend = make_backend("recorded")
    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    command = "python benchmarks/generalisation/run_design_loo.py " + " ".join(sys.argv[1:])
    out.setdefault("meta", {})[args.part] = {"command": command,
                                             "dataset_sha256": getattr(backend, "dataset_hash", "")}
    {"mask": part_mask, "folds": part_folds, "rerank": part_rerank}[args.part](args, backend, out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
