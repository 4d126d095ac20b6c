"""`kernel-gym demo`: the main job end to end on the embedded defaults, CPU only.

1. train a MaskablePPO policy per kernel family on the recorded H200 dataset (held-out workloads evaluated, MLflow run
   and registered model per family);
2. export the learned policies as a dispatch table and vLLM fused-MoE config files;
3. replay the bundled Azure trace excerpt through the serving simulator with every policy a user could run;
4. print the comparison table. Everything stays in MLflow (`kernel-gym ui` to browse) and under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kernel_gym.dispatch.dispatcher import AXES
from kernel_gym.envs import env_id_for

# the kernels a dispatch table holds (those with dispatch axes) -> the env that trains each (its KERNEL_ENVS line)
KERNEL_ENVS = {k: env_id_for(k) for k in AXES}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernel-gym demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("out/demo"), help="where the exported files and replay go")
    p.add_argument("--model", default="mixtral-8x7b", help="model spec: mixtral-8x7b, olmoe-1b-7b or a JSON file")
    p.add_argument("--timesteps", type=int, default=30_000, help="training steps per kernel family")
    p.add_argument("--trace", default="bundled", help="trace to replay (bundled: 10 min of Azure conversation)")
    p.add_argument("--routing", default="zipf:1.2", help="expert routing during replay (uniform, zipf:EXP, drift:EXP)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.timesteps < 512:
        raise ValueError(f"--timesteps must be >= 512 (one PPO rollout), got {args.timesteps}")
    from kernel_gym.deploy import export
    from kernel_gym.evaluate import replay
    from kernel_gym.measure import make_backend
    from kernel_gym.train.train import TrainArgs, train

    t0 = time.time()
    say = lambda msg: print(f"[demo {time.time() - t0:5.0f}s] {msg}", flush=True)  # noqa: E731
    backend = make_backend("recorded")
    args.out.mkdir(parents=True, exist_ok=True)
    uris: dict[str, str] = {}
    evaluations: dict[str, dict] = {}
    for kernel, env_id in KERNEL_ENVS.items():
        say(f"training {env_id} for {args.timesteps} steps on the recorded H200 data")
        result = train(TrainArgs(env_id=env_id, model=args.model, total_timesteps=args.timesteps, seed=args.seed,
                                 eval_freq=max(2048, args.timesteps // 4), checkpoint_freq=0,
                                 run_name=f"demo-{env_id.split('/')[-1].lower()}"), backend=backend)
        uris[kernel] = result.model_uri
        evaluations[kernel] = result.evaluation.to_dict()
        ev = result.evaluation
        say(f"  {kernel}: registered {result.model_uri}; held-out throughput vs oracle (geomean): learned "
            f"{ev.geomean_policy:.3f}, default {ev.geomean_default:.3f}, best static {ev.geomean_static:.3f}")
    uri_args = [a for k, u in uris.items() for a in ("--model-uri", f"{k}={u}")]
    say("exporting the dispatch table and vLLM config files")
    export.main([*uri_args, "--format", "dispatch", "--model", args.model, "--out", str(args.out / "dispatch")])
    # vLLM files come from vllm_fused_moe measurements; the packaged data has none, so this is vLLM's own table,
    # marked as an estimate in the sidecar (docs/deployment.md)
    export.main(["--format", "vllm", "--force", "--model", args.model, "--out", str(args.out / "vllm")])
    say(f"replaying trace {args.trace!r} with every policy (routing {args.routing})")
    json_path = args.out / "replay.json"
    replay.main(["--trace", args.trace, "--model", args.model, "--routing", args.routing, "--json", str(json_path),
                 "--seed", str(args.seed), *uri_args])
    (args.out / "training.json").write_text(json.dumps(evaluations, indent=2))
    say(f"done: results in {args.out}/, runs in MLflow (browse with `kernel-gym ui`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
