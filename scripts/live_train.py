"""A short MaskablePPO run on real compile-and-measure, then its import into MLflow (kernel_gym.train.live_run).

On the GPU machine (no MLflow there; gymnasium and stable-baselines3 travel as wheels):
    python3 scripts/live_train.py run --out $OUT/live_moe.json --timesteps 256
Back here, into the MLflow store (experiment kernel-gym-live):
    .venv/bin/python scripts/live_train.py import benchmarks/h200_run3/live_moe.json
"""

from __future__ import annotations

import argparse

from kernel_gym.train import live_run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train on the live env (GPU) and write the JSON log")
    r.add_argument("--out", required=True, help="JSON log path (the policy zip is written beside it)")
    r.add_argument("--env-id", default="KernelGym/MoE-live-v0")
    r.add_argument("--model", default="mixtral-8x7b")
    r.add_argument("--timesteps", type=int, default=256)
    r.add_argument("--n-steps", type=int, default=32, help="steps per PPO update")
    r.add_argument("--train-workloads", type=int, default=8)
    r.add_argument("--eval-workloads", type=int, default=6)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--gpu", type=int, default=None)
    r.add_argument("--compile-workers", type=int, default=8)
    r.add_argument("--budget-s", type=float, default=300.0, help="stop training after this many seconds")
    i = sub.add_parser("import", help="import a live log into MLflow")
    i.add_argument("log", help="the JSON that `run` wrote")
    i.add_argument("--experiment", default="kernel-gym-live")
    args = ap.parse_args()
    if args.cmd == "run":
        live_run.run_live(args.out, args.env_id, args.model, args.timesteps, args.n_steps, args.train_workloads,
                          args.eval_workloads, args.seed, args.gpu, args.compile_workers, args.budget_s)
    else:
        print("MLflow run", live_run.import_log(args.log, args.experiment))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
