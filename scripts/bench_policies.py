"""Policy quality benchmark: train each kernel env per built-in model on the recorded H200 data with fixed seeds, and
score the learned policy on held-out workloads against the oracle, the default config and the best static config.

    python scripts/bench_policies.py                       # all envs x both models, 30k steps each
    python scripts/bench_policies.py --timesteps 12000 --envs KernelGym/MoE-v0 --models olmoe-1b-7b

Writes benchmarks/policy_quality.json, benchmarks/policy_quality.md and benchmarks/policy_curves/<env>-<model>.png;
every run is an MLflow run (experiment kernel-gym-bench) like `kernel-gym train`. Held-out workloads are whole
primary-axis values (token counts, batch sizes, prompt totals) never seen in training; the policy decides from the
workload features alone (zero measurements), the recorded measurements only score the decision.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ENVS = ("KernelGym/MoE-v0", "KernelGym/DecodeAttention-v0", "KernelGym/PrefillAttention-v0")
MODELS = ("mixtral-8x7b", "olmoe-1b-7b")
TARGET = 0.97


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", nargs="+", default=list(ENVS))
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--timesteps", type=int, default=30_000, help="training steps per (env, model)")
    p.add_argument("--eval-freq", type=int, default=2_000, help="held-out evaluation every this many steps (curve)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks"))
    p.add_argument("--tracking-uri", default="", help="MLflow URI (default: MLFLOW_TRACKING_URI or mlruns/mlflow.db)")
    p.add_argument("--log-model", action=argparse.BooleanOptionalAction, default=False,
                   help="also log and register each policy (off: the benchmark measures quality, not export)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow
    import torch

    from kernel_gym.measure import make_backend
    from kernel_gym.policies.train import TrainArgs, train

    backend = make_backend("recorded")
    curves_dir = args.out / "policy_curves"
    curves_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for env_id in args.envs:
        for model in args.models:
            short = env_id.split("/")[-1].lower()
            targs = TrainArgs(env_id=env_id, model=model, total_timesteps=args.timesteps, seed=args.seed,
                              eval_freq=args.eval_freq, checkpoint_freq=0, experiment="kernel-gym-bench",
                              run_name=f"bench-{short}-{model}-seed{args.seed}", tracking_uri=args.tracking_uri,
                              checkpoint_dir=f"out/checkpoints/bench-{short}-{model}", progress_bar=False,
                              log_model=args.log_model, register_model=args.log_model)
            t0 = time.perf_counter()
            res = train(targs, backend=backend)
            seconds = time.perf_counter() - t0
            client = mlflow.tracking.MlflowClient()
            curve = [{"step": m.step, "geomean_policy": m.value}
                     for m in client.get_metric_history(res.run_id, "eval/geomean_policy")]
            e = res.evaluation
            row = {
                "env_id": env_id, "model": model, "seed": args.seed, "timesteps": res.num_timesteps,
                "train_seconds": round(seconds, 1), "heldout_workloads": e.num_workloads,
                "geomean_policy": e.geomean_policy, "geomean_default": e.geomean_default,
                "geomean_static": e.geomean_static, "policy_failures": e.policy_failures,
                "train_geomean_policy": res.metrics.get("final/train_geomean_policy"),
                "random_policy_geomean": res.metrics.get("final/random_policy_geomean"),
                "catalogue_size": len(res.catalogue), "static_config": e.static_config,
                "meets_target": e.geomean_policy >= TARGET, "run_id": res.run_id, "curve": curve,
                "heldout": [{k: r[k] for k in ("workload", "chosen", "ratio_policy", "ratio_default", "ratio_static")}
                            for r in e.rows],
            }
            results.append(row)
            print(f"{env_id} {model}: policy {e.geomean_policy:.3f} default {e.geomean_default:.3f} static "
                  f"{e.geomean_static:.3f} ({e.num_workloads} held-out, {seconds:.0f} s)", flush=True)
            fig, ax = plt.subplots(figsize=(6, 3.5))
            ax.plot([c["step"] for c in curve], [c["geomean_policy"] for c in curve], "o-", label="learned policy")
            ax.axhline(e.geomean_static, ls="--", color="C1", label="best static config")
            ax.axhline(e.geomean_default, ls=":", color="C2", label="default config")
            ax.axhline(TARGET, color="grey", lw=0.8, label=f"target {TARGET}")
            ax.set_xlabel("environment steps")
            ax.set_ylabel("held-out geomean vs oracle")
            ax.set_title(f"{short} / {model} ({seconds:.0f} s on {os.cpu_count()} cores)", fontsize=9)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
            fig.tight_layout()
            fig.savefig(curves_dir / f"{short}-{model}.png", dpi=80)
            plt.close(fig)
    doc = {
        "command": "python scripts/bench_policies.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "backend": "recorded", "dataset_hash": str(getattr(backend, "dataset_hash", "") or "n/a"),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "python": platform.python_version()},
        "target": TARGET, "results": results,
    }
    (args.out / "policy_quality.json").write_text(json.dumps(doc, indent=1))
    lines = [
        "# Policy quality on held-out workloads (recorded H200 data)", "",
        f"`{doc['command'].strip()}` on {os.cpu_count()} CPU cores. Geomean over held-out workloads of "
        "oracle time / chosen time (1.0 = the best measured config everywhere); held-out workloads are whole "
        "token-count / batch / prompt-total values never seen in training.", "",
        "| env | model | policy | default | best static | held-out | steps | train s | meets 0.97 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['env_id']} | {r['model']} | {r['geomean_policy']:.3f} | {r['geomean_default']:.3f} | "
                     f"{r['geomean_static']:.3f} | {r['heldout_workloads']} | {r['timesteps']} | "
                     f"{r['train_seconds']:.0f} | {'yes' if r['meets_target'] else 'no'} |")
    lines += ["", "Learning curves: `policy_curves/<env>-<model>.png`; per-workload choices in policy_quality.json.",
              ""]
    (args.out / "policy_quality.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
