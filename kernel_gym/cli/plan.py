"""`kernel-gym plan`: the options of kernel_gym.deploy.plan.plan_deployment."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    from kernel_gym.deploy import plan
    from kernel_gym.deploy.plan import SLO_HELP

    p = argparse.ArgumentParser(prog="kernel-gym plan", description=plan.__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model spec: a zoo name (kernel-gym data lists them) or a JSON file; "
                                                  "the whole model (plan chooses the parallelism: no NAME@tpN shard)")
    p.add_argument("--gpus", type=int, required=True,
                   help="H200 GPUs of the deployment (1-8; replicas count, e.g. 3 x TP1 on 3; where no deployment of "
                        "all of them fits, the plan uses the most that one fits)")
    p.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    p.add_argument("--engine-version", default="",
                   help="the release you launch, whose defaults (block size, KV memory) the plan prices: vLLM 0.34.0 "
                        "(default) or 0.33.0, SGLang 0.5.23")
    p.add_argument("--trace", required=True, help="azure-conv, azure-code, mooncake, burstgpt (KERNEL_GYM_TRACES), "
                                                  "bundled, or a trace file")
    p.add_argument("--slo", default="ttft=2,tpot=0.1", help=SLO_HELP)
    p.add_argument("--rate-scale", type=float, default=1.0, help="compress the trace's time by this factor")
    p.add_argument("--window-s", type=float, default=60.0, help="simulated seconds per window")
    p.add_argument("--routing", default="zipf:1.2", help="uniform, zipf:EXPONENT or drift:EXPONENT[:DWELL_S]")
    p.add_argument("--train-steps", type=int, default=64, help="MaskablePPO environment steps (0: no agent)")
    p.add_argument("--samples", type=int, default=2, help="policy draws per training window besides the greedy one")
    p.add_argument("--refine-rounds", type=int, default=1,
                   help="coordinate-search passes over the knobs from the agent's best proposal (0: none)")
    p.add_argument("--next", type=int, default=3, help="next-best layouts to list (each at its best knobs)")
    p.add_argument("--model-id", default="", help="the model name in the launch commands (default: its HF id)")
    p.add_argument("--json", default="", help="write the plan here")
    p.add_argument("--no-mlflow", action="store_true",
                   help="skip the MLflow run and its goodput-vs-load plot (the held-out window at 0.5x-4x the load; "
                        "shorter windows where the held-out part is too short; --json is written before it)")
    p.add_argument("--tracking-uri", default="")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=0,
                   help="the engine's context limit, prompt + output tokens (default 32768, or the model's own "
                        "max_position_embeddings where lower; never above it): passed in the launch "
                        "commands; each deployment's KV cache must hold one such request, longer requests are "
                        "refused")
    p.add_argument("--backend", default="recorded",
                   help="recorded (the packaged H200 data) or a measurement store path (what tune / collect --db "
                        "wrote for a model the data does not hold)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kernel_gym.deploy.plan import plan_deployment

    try:
        from kernel_gym.kernels.vllm_tables import engine_with_version

        engine = engine_with_version(args.engine, args.engine_version or "")
        return plan_deployment(model=args.model, gpus=args.gpus, trace=args.trace, engine=engine, slo=args.slo,
                               rate_scale=args.rate_scale, window_s=args.window_s, routing=args.routing,
                               train_steps=args.train_steps, samples=args.samples, refine_rounds=args.refine_rounds,
                               next_best=args.next, model_id=args.model_id, json_path=args.json,
                               no_mlflow=args.no_mlflow, tracking_uri=args.tracking_uri, seed=args.seed,
                               max_model_len=args.max_model_len, backend=args.backend)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"kernel-gym plan: error: {exc}", file=sys.stderr)
        return 2
