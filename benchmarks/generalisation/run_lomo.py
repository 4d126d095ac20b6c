"""Leave-one-model-out on the recorded zoo data: for each zoo training model, the model-conditioned policy trained
without any of its rows, choosing zero-shot at its zoo shapes with the knob-space rules as the only mask.

Why recorded: the test models are timed live (benchmarks/generalisation/run.py); the other zoo models were measured at
the same candidate configs at every zoo shape (scripts/plan_zoo.py), so a rules-only choice among the policy's catalogue
almost always has a recorded time there. The oracle is the best recorded config of that shape (a few dozen configs,
not a 256-config sweep: an easier bar than the live one), and a choice without a recorded time is counted and left
out of the geomean, never priced from a neighbour.

    python benchmarks/generalisation/run_lomo.py --out benchmarks/generalisation/lomo_recorded.json  # CPU, ~1 min/model
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

KERNEL_ENVS = {"fused_moe": "KernelGym/MoE-v0", "decode_attention": "KernelGym/DecodeAttention-v0"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/generalisation/lomo_recorded.json"))
    p.add_argument("--kernels", nargs="+", default=list(KERNEL_ENVS), choices=list(KERNEL_ENVS))
    p.add_argument("--models", nargs="*", default=None, help="zoo training models to leave out (default: all)")
    p.add_argument("--timesteps", type=int, default=30_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tracking-uri", default="", help="MLflow store of the runs (default: mlruns/)")
    args = p.parse_args(argv)

    from sb3_contrib import MaskablePPO

    from kernel_gym import zoo
    from kernel_gym.kernels import get_family
    from kernel_gym.measure import make_backend
    from kernel_gym.train import zoo_policy
    from kernel_gym.train.train import TrainArgs, train

    backend = make_backend("recorded")
    out = json.loads(args.out.read_text()) if args.out.exists() else {"kernels": {}}
    out["meta"] = {"command": "python benchmarks/generalisation/run_lomo.py " + " ".join(sys.argv[1:]),
                   "dataset_sha256": getattr(backend, "dataset_hash", ""), "timesteps": args.timesteps,
                   "seed": args.seed}
    for kernel in args.kernels:
        fam = get_family(kernel)
        models = args.models or [m for m in zoo.training_models(kernel) if m not in zoo.TOO_LARGE]
        per_kernel = out["kernels"].setdefault(kernel, {})
        for model in models:
            if model in per_kernel:  # resumable: a finished model is kept
                continue
            ckpt = Path("out/checkpoints") / f"lomo-{kernel}-{model}"
            res = train(TrainArgs(env_id=KERNEL_ENVS[kernel], model=zoo_policy.ZOO_MODEL, exclude_models=model,
                                  holdout=0.1, seed=args.seed, total_timesteps=args.timesteps, eval_freq=0,
                                  checkpoint_freq=0, checkpoint_dir=str(ckpt), experiment="kernel-gym-lomo",
                                  run_name=f"lomo-{kernel}-{model}", tracking_uri=args.tracking_uri,
                                  progress_bar=False,
                                  log_model=False, register_model=False), backend=backend)
            policy = MaskablePPO.load(ckpt / "latest.zip", device="cpu")
            rows, unmeasured = [], 0
            for spec in zoo.zoo_shards([model]):
                for w in zoo.shard_workloads(kernel, spec, "zoo"):
                    times = {}
                    for c in backend.available_configs(kernel, w):
                        m = backend.measure(kernel, w, c)
                        if m.ok and m.median_ms:
                            times[c] = m.median_ms
                    if not times:
                        continue
                    choice = zoo_policy.choose(policy, res.catalogue, w, fam.default_config(w))
                    if choice not in times:
                        unmeasured += 1
                        continue
                    rows.append({"shard": spec.name, "workload": w.key(), "chosen": str(choice),
                                 "ratio": min(times.values()) / times[choice], "configs_recorded": len(times)})
            ratios = sorted(r["ratio"] for r in rows)
            per_kernel[model] = {
                "workloads": len(rows), "unmeasured_choices": unmeasured,
                "geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
                "p5": ratios[max(0, math.ceil(0.05 * len(ratios)) - 1)] if ratios else None, "rows": rows}
            print(f"{kernel} without {model}: geomean {per_kernel[model]['geomean']} over {len(rows)} shapes "
                  f"({unmeasured} choices without a recorded time)", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1))
        allr = sorted(r["ratio"] for v in per_kernel.values() for r in v["rows"])
        if allr:
            out.setdefault("summary", {})[kernel] = {
                "models": len(per_kernel), "geomean": math.exp(sum(map(math.log, allr)) / len(allr)),
                "p5": allr[max(0, math.ceil(0.05 * len(allr)) - 1)],
                "unmeasured_choices": sum(v["unmeasured_choices"] for v in per_kernel.values()),
                "scored": len(allr)}
        args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out.get("summary", {}), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
