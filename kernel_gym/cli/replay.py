"""`kernel-gym replay`: the options of kernel_gym.evaluate.replay.run_replay."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    from kernel_gym.dispatch.baselines import SEARCH_BUDGET
    from kernel_gym.evaluate import replay
    from kernel_gym.evaluate.replay import POLICY_NAMES
    from kernel_gym.evaluate.replay_report import DEFAULT_ROUTING

    p = argparse.ArgumentParser(prog="kernel-gym replay", description=replay.__doc__.splitlines()[0])
    p.add_argument("--trace", default="bundled", help="trace name (azure-conv, azure-code, bundled, ...) or path")
    p.add_argument("--model", default="mixtral-8x7b", help="model spec: built-in name or ModelSpec JSON file")
    p.add_argument("--policies", default=",".join(POLICY_NAMES),
                   help=f"comma-separated, from {','.join(POLICY_NAMES)}")
    p.add_argument("--json", type=Path, required=True, help="results JSON; .md and .png files are written beside it")
    p.add_argument("--routing", default=DEFAULT_ROUTING,
                   help="expert routing: uniform, zipf:EXP, drift:EXP[:DWELL_S] (default zipf:1.2, the skew the demo "
                        "and the README's replay figures use)")
    p.add_argument("--model-uri", action="append", default=[], metavar="[KERNEL=]URI",
                   help="learned policy per kernel (repeatable); default: the latest registered "
                        "kernel-gym-<env>-<model> policies, else kernel-gym-<env>")
    p.add_argument("--table", default="", help="learned: a dispatch_table.json instead of MLflow models")
    p.add_argument("--budget", type=int, default=SEARCH_BUDGET, help="random/tpe: measurements per new shape")
    p.add_argument("--seed", type=int, default=0, help="seed of routing and search baselines")
    p.add_argument("--window", default="", metavar="START:END",
                   help="replay only arrivals in [START, END) seconds from the trace's first request (each trace "
                        "starts at 0)")
    p.add_argument("--rate-scale", type=float, default=1.0,
                   help="compress arrival times by this factor (2 = twice the trace's request rate): tokens/s only "
                        "separates policies when the server is saturated")
    p.add_argument("--backend", default="recorded", help="recorded (H200 store) or a store path")
    p.add_argument("--device", default="",
                   help="the GPU whose rows price the replay (needed when the store holds several devices)")
    p.add_argument("--steps-json", type=Path, default=None,
                   help="also write per-step workloads, configs and predicted kernel times of default, learned and "
                        "oracle (input of benchmarks/live_replay/run.py)")
    p.add_argument("--steps", type=int, default=2000, help="--steps-json: steps recorded per policy")
    p.add_argument("--untimed-plan", type=Path, default=None, metavar="FILE",
                   help="also write the configs the policies chose that the data could not time (each fell back) as "
                        "a measurement plan: measure it on the GPU with `kernel-gym collect --plan FILE`, merge the "
                        "rows (`kernel-gym data --merge`), replay again")
    p.add_argument("--decode-waves", action="store_true",
                   help="price each decode batch from its sequences' contexts as the kernel's programs fill the GPU "
                        "(kernel_gym.traffic.decode_waves; the live check's pricing, docs/live.md) instead of at the "
                        "batch's mean context")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("--tracking-uri", default="", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or mlruns/)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kernel_gym.evaluate.replay import run_replay

    run_replay(json_path=args.json, trace=args.trace, model=args.model, policies=args.policies, routing=args.routing,
               model_uris=args.model_uri, table=args.table, budget=args.budget, seed=args.seed, window=args.window,
               rate_scale=args.rate_scale, backend=args.backend, device=args.device, steps_json=args.steps_json,
               steps=args.steps, no_mlflow=args.no_mlflow, tracking_uri=args.tracking_uri,
               untimed_plan=args.untimed_plan, decode_waves=args.decode_waves)
    return 0
