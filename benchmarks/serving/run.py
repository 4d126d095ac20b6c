"""Serving-v0 benchmark: MaskablePPO on KernelGym/Serving-v0 with the recorded H200 backend, evaluated on held-out
windows of the Azure conversation trace against the default configs and the per-workload oracle (switching costs
counted for all three). Writes serving_v0.json, serving_v0.md and serving_v0_curve.png under --out-dir and logs the run
to MLflow (default store unless MLFLOW_TRACKING_URI is set).

    python benchmarks/serving/run.py [--timesteps 400] [--rate-scale 1.0] [--windows 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def estimated_cell(res: dict, who: str) -> str:
    """'12.3% (a%/b%/c%)': the policy's estimated share of tuned-kernel time, overall and per prefill/decode/MoE."""
    parts = "/".join(f"{100 * res[f'{who}_estimated_share.{k}']:.0f}%"
                     for k in ("prefill_attention", "decode_attention", "fused_moe"))
    return f"{100 * res[f'{who}_estimated_share']:.1f}% ({parts})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timesteps", type=int, default=400, help="PPO timesteps (one = one 20 s control interval)")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="compress the trace's time (more load)")
    ap.add_argument("--interval-s", type=float, default=20.0)
    ap.add_argument("--num-intervals", type=int, default=10)
    ap.add_argument("--windows", type=int, default=3, help="held-out evaluation windows")
    ap.add_argument("--n-steps", type=int, default=50, help="PPO rollout length")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the target: 2 CPU cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default="benchmarks/serving")
    ap.add_argument("--data", default="", help="measurement store (.jsonl.gz snapshot or .sqlite); default: the "
                    "packaged H200 dataset")
    ap.add_argument("--no-mlflow", action="store_true")
    args = ap.parse_args()

    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback

    from kernel_gym.dispatch.serving_rules import build_serving_catalogue
    from kernel_gym.envs.serving import ServingEnv
    from kernel_gym.evaluate.serving_eval import evaluate_serving
    from kernel_gym.measure import make_backend

    torch.set_num_threads(args.threads)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    backend = make_backend("recorded", path=args.data or None)
    catalogue = build_serving_catalogue(backend, "mixtral-8x7b", "azure-conv", rate_scale=args.rate_scale)
    t_cat = time.perf_counter() - t0
    kw = dict(backend=backend, trace="azure-conv", rate_scale=args.rate_scale, interval_s=args.interval_s,
              num_intervals=args.num_intervals, catalogue=catalogue)
    env = ServingEnv(**kw)
    print(f"catalogue in {t_cat:.0f} s: rules per family {catalogue.sizes()}, "
          f"nominal {catalogue.nominal_tokens_per_s:.0f} tok/s")

    curve: list[dict] = []

    class Curve(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.ep_tokens, self.ep_time = 0, 0.0
            self.t_start = time.perf_counter()

        def _on_step(self) -> bool:
            info = self.locals["infos"][0]
            self.ep_tokens += info["tokens"]
            self.ep_time += info["sim_time_s"]
            if self.locals["dones"][0]:
                curve.append({"timesteps": self.num_timesteps, "train_s": time.perf_counter() - self.t_start,
                              "episode_tokens_per_s": self.ep_tokens / max(self.ep_time, 1e-9)})
                print(f"  t={self.num_timesteps} {curve[-1]['train_s']:.0f}s ep tok/s "
                      f"{curve[-1]['episode_tokens_per_s']:.0f}", flush=True)
                self.ep_tokens, self.ep_time = 0, 0.0
            return True

    model = MaskablePPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=args.n_steps, n_epochs=10,
                        learning_rate=1e-3, gamma=0.9, ent_coef=0.01, seed=args.seed, verbose=0,
                        policy_kwargs={"net_arch": [64, 64]})
    t1 = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, callback=Curve())
    train_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    res = evaluate_serving(kw, model, num_windows=args.windows)
    eval_s = time.perf_counter() - t2
    env_steps_s = train_s / max(args.timesteps, 1)
    record = {
        "model": "mixtral-8x7b", "trace": "azure-conv", "backend": "recorded (CoveredBackend proxy outside the grid)",
        "dataset_hash": getattr(backend, "dataset_hash", ""),
        "rate_scale": args.rate_scale, "interval_s": args.interval_s, "num_intervals": args.num_intervals,
        "heldout_windows": args.windows, "timesteps": args.timesteps, "train_s": train_s, "catalogue_s": t_cat,
        "eval_s": eval_s, "train_s_per_timestep": env_steps_s, "threads": args.threads,
        "rules": {k: [r.name for r in v] for k, v in catalogue.rules.items()},
        "agent_tokens_per_s": res["agent_tokens_per_s"], "default_tokens_per_s": res["default_tokens_per_s"],
        "oracle_tokens_per_s": res["oracle_tokens_per_s"], "agent_over_oracle": res["agent_over_oracle"],
        "default_over_oracle": res["default_over_oracle"], "target_agent_over_oracle": 0.97,
        "target_met": res["agent_over_oracle"] >= 0.97 and train_s < 1200,
        **{k: v for k, v in res.items() if k.endswith(("_stall_s", "_proxied_share", "_fallbacks", "_tuned_kernel_s"))
           or "_estimated_share" in k},
        "oracle_kv": res["oracle_kv"], "windows": res["windows"],
        "agent_rules_first_window": res["agent_rules"][: args.num_intervals], "curve": curve,
    }
    (out / "serving_v0.json").write_text(json.dumps(record, indent=2, default=float) + "\n")
    md = [
        "# Serving-v0 on the recorded H200 backend (mixtral-8x7b, Azure conversation trace)", "",
        f"Held-out windows: {args.windows} x {args.num_intervals} x {args.interval_s:g} s from the last 20% of the "
        f"trace, rate_scale {args.rate_scale:g}. Compile and KV re-layout stalls counted for every policy. Data: "
        f"{args.data or 'the packaged H200 dataset'} (sha256 {record['dataset_hash'] or 'n/a'}).", "",
        "| policy | tokens/s | / oracle | stall s per window | kernel calls outside the measured grid | "
        "estimated kernel time (all; prefill/decode/MoE) |",
        "|---|---|---|---|---|---|",
    ]
    for who in ("agent", "default", "oracle"):
        md.append(f"| {who} | {res[who + '_tokens_per_s']:.0f} | "
                  f"{res[who + '_tokens_per_s'] / res['oracle_tokens_per_s']:.3f} | {res[who + '_stall_s']:.2f} | "
                  f"{res[who + '_proxied_share']:.1%} | {estimated_cell(res, who)} |")
    md += ["", "Estimated kernel time: the share of each policy's tuned-kernel seconds whose times are estimates "
           "(interpolated between measured shapes, proxied from a nearest measured shape, or borrowed from another "
           "shape and roofline-scaled) rather than measurements of that exact workload and config.",
           "", f"Training: {args.timesteps} timesteps in {train_s:.0f} s ({env_steps_s:.2f} s per 20 s interval, "
           f"{args.threads} torch threads); catalogue built in {t_cat:.0f} s. Target agent/oracle >= 0.97 in under "
           f"20 min: {'met' if record['target_met'] else 'missed'}.", "",
           "Command: `python benchmarks/serving/run.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
               if k not in ("no_mlflow", "out_dir") and (k != "data" or v))
           + "`", "", "![learning curve](serving_v0_curve.png)", ""]
    (out / "serving_v0.md").write_text("\n".join(md))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if curve:
        ax.plot([c["timesteps"] for c in curve], [c["episode_tokens_per_s"] for c in curve], "o-",
                label="agent (training episodes)")
    for who, style in (("default", "--"), ("oracle", ":")):
        ax.axhline(res[who + "_tokens_per_s"], ls=style, color="k" if who == "oracle" else "r",
                   label=f"{who} (held-out)")
    ax.axhline(res["agent_tokens_per_s"], ls="-.", color="g", label="agent (held-out)")
    ax.set_xlabel("timesteps (20 s intervals)")
    ax.set_ylabel("output tokens/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "serving_v0_curve.png", dpi=120)
    print(json.dumps({k: record[k] for k in ("agent_tokens_per_s", "default_tokens_per_s", "oracle_tokens_per_s",
                                             "agent_over_oracle", "train_s", "timesteps")}, indent=1))
    if not args.no_mlflow:
        import mlflow

        from kernel_gym.train.tracking import get_or_create_experiment, setup_tracking

        uri = setup_tracking()
        with mlflow.start_run(experiment_id=get_or_create_experiment("serving-v0-bench", uri)):
            mlflow.log_params({k: getattr(args, k) for k in ("timesteps", "rate_scale", "windows", "n_steps", "seed")})
            mlflow.log_metrics({k: float(record[k]) for k in ("agent_tokens_per_s", "default_tokens_per_s",
                                                              "oracle_tokens_per_s", "agent_over_oracle", "train_s",
                                                              "agent_estimated_share", "default_estimated_share",
                                                              "oracle_estimated_share")})
            for c in curve:
                mlflow.log_metric("episode_tokens_per_s", c["episode_tokens_per_s"], step=c["timesteps"])
            for f in ("serving_v0.json", "serving_v0.md", "serving_v0_curve.png"):
                mlflow.log_artifact(str(out / f))


if __name__ == "__main__":
    main()
