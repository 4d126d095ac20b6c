"""The replay benchmark behind benchmarks/replay/: learned policies vs every alternative, both traces, both models.

For each model: train the three kernel policies on the recorded H200 data (registered as
kernel-gym-<env>-<model>), then replay the Azure conversation and code traces (first --window seconds) with every
policy under skewed routing, and write the target check table.

    python benchmarks/replay/run.py --out benchmarks/replay --window 0:1200 --timesteps 30000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kernel_gym.evaluate import replay, replay_report
from kernel_gym.measure import make_backend
from kernel_gym.train.train import TrainArgs, train

ENVS = {"fused_moe": "KernelGym/MoE-v0", "decode_attention": "KernelGym/DecodeAttention-v0",
        "prefill_attention": "KernelGym/PrefillAttention-v0"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/replay"))
    p.add_argument("--models", default="mixtral-8x7b,olmoe-1b-7b")
    p.add_argument("--traces", default="azure-conv,azure-code")
    p.add_argument("--routing", default="zipf:1.2")
    p.add_argument("--window", default="0:1200", help="START:END seconds of each trace")
    p.add_argument("--timesteps", type=int, default=30_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    backend = make_backend("recorded")
    args.out.mkdir(parents=True, exist_ok=True)
    reports = []
    for model in args.models.split(","):
        uris = []
        for kernel, env_id in ENVS.items():
            t0 = time.time()
            res = train(TrainArgs(env_id=env_id, model=model, total_timesteps=args.timesteps, seed=args.seed,
                                  checkpoint_freq=0, progress_bar=False,
                                  model_name=f"kernel-gym-{env_id.split('/')[-1].lower()}-{model}"), backend=backend)
            print(f"{model} {kernel}: {res.model_uri} held-out {res.evaluation.geomean_policy:.3f} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
            uris.append(f"{kernel}={res.model_uri}")
        for trace in args.traces.split(","):
            name = f"{trace}_{model}_{args.routing.replace(':', '')}"
            path = args.out / f"{name}.json"
            replay.run_replay(trace=trace, model=model, routing=args.routing, window=args.window, seed=args.seed,
                              json_path=path, model_uris=uris)
            reports.append((name, json.loads(path.read_text())))
    summary = args.out / "summary.md"
    summary.write_text(replay_report.summary_markdown(reports))
    print(summary.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
