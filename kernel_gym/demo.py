"""`kernel-gym demo`: the main job end to end on the embedded defaults, CPU only.

1. train a MaskablePPO policy per kernel family on the recorded H200 dataset (held-out workloads evaluated, MLflow run
   and registered model per family);
2. export the learned policies as a dispatch table and vLLM fused-MoE config files;
3. replay the bundled Azure trace excerpt through the serving simulator with every policy a user could run;
4. print the comparison table. Everything stays in MLflow (`kernel-gym ui` to browse) and under --out.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from kernel_gym.dispatch.dispatcher import AXES
from kernel_gym.envs import env_id_for

# the kernels a dispatch table holds (those with dispatch axes) -> the env that trains each (its KERNEL_ENVS line)
KERNEL_ENVS = {k: env_id_for(k) for k in AXES}


def run_demo(*, out: Path = Path("out/demo"), model: str = "mixtral-8x7b", timesteps: int = 30_000,
             trace: str = "bundled", routing: str = "zipf:1.2", seed: int = 0) -> int:
    """The demo (module docstring): `timesteps` training steps per kernel family, the exports and the replay of
    `trace` under `routing`, everything under `out`."""
    if timesteps < 512:
        raise ValueError(f"--timesteps must be >= 512 (one PPO rollout), got {timesteps}")
    from kernel_gym.deploy.export import export_files
    from kernel_gym.evaluate.replay import run_replay
    from kernel_gym.measure import make_backend
    from kernel_gym.train.train import TrainArgs, train

    t0 = time.time()
    say = lambda msg: print(f"[demo {time.time() - t0:5.0f}s] {msg}", flush=True)  # noqa: E731
    backend = make_backend("recorded")
    from kernel_gym.dispatch.baselines import unmeasured_kernels, unmeasured_message
    from kernel_gym.models import kernel_spec, load_model

    spec = kernel_spec(load_model(model))
    missing = unmeasured_kernels(backend, spec)
    if missing:  # before minutes of training, not after
        raise ValueError(unmeasured_message(model, missing, "then replay with --backend STORE (the demo reads the "
                                            "packaged data only, which holds every kernel of mixtral-8x7b and "
                                            "olmoe-1b-7b)"))
    from kernel_gym.evaluate.replay import routing_profile
    from kernel_gym.traffic.traces import load_trace

    load_trace(trace)  # the replay's inputs checked before training registers policies and exports files
    routing_profile(routing, spec, seed)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: pass a folder for the exported files and the replay")
    out.mkdir(parents=True, exist_ok=True)
    uris: dict[str, str] = {}
    evaluations: dict[str, dict] = {}
    for kernel, env_id in KERNEL_ENVS.items():
        say(f"training {env_id} for {timesteps} steps on the recorded H200 data")
        result = train(TrainArgs(env_id=env_id, model=model, total_timesteps=timesteps, seed=seed,
                                 eval_freq=max(2048, timesteps // 4), checkpoint_freq=0,
                                 checkpoint_dir=str(out / "checkpoints" / env_id.split("/")[-1].lower()),
                                 run_name=f"demo-{env_id.split('/')[-1].lower()}"), backend=backend)
        uris[kernel] = result.model_uri
        evaluations[kernel] = result.evaluation.to_dict()
        ev = result.evaluation
        say(f"  {kernel}: registered {result.model_uri}; held-out throughput vs oracle (geomean): learned "
            f"{ev.geomean_policy:.3f}, default {ev.geomean_default:.3f}, best static {ev.geomean_static:.3f}")
    model_uris = [f"{k}={u}" for k, u in uris.items()]
    say("exporting the dispatch table and vLLM config files")
    export_files(out=out / "dispatch", fmt="dispatch", model=model, model_uris=model_uris)
    # vLLM files come from vllm_fused_moe measurements; the packaged data has none, so this is vLLM's own table,
    # marked as an estimate in the sidecar (docs/deployment.md)
    export_files(out=out / "vllm", fmt="vllm", force=True, model=model)
    say(f"replaying trace {trace!r} with every policy (routing {routing})")
    run_replay(json_path=out / "replay.json", trace=trace, model=model, routing=routing, seed=seed,
               model_uris=model_uris)
    (out / "training.json").write_text(json.dumps(evaluations, indent=2))
    say(f"done: results in {out}/, runs in MLflow (browse with `kernel-gym ui`)")
    return 0
