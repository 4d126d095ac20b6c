"""A short MaskablePPO run on real compile-and-measure (a `-live-` kernel env on a GPU), and its import into MLflow.

The GPU machine has no MLflow, so the run is split in two:
- `run_live()` (GPU machine; needs torch, triton, numpy, gymnasium, stable-baselines3, sb3-contrib) trains on the
  live env and writes one JSON log: every step (workload, config, measured ms, best known ms, reward, wall time),
  SB3's update metrics, and a live evaluation in which the policy's choice, the recorded oracle's config and the
  default config are timed side by side in the same process, so their ratios need no cross-session comparison.
- `import_log()` (any machine with MLflow) turns that log into an MLflow run: parameters, per-step curves, the
  evaluation, a learning-curve PNG, and the raw log and policy as artifacts.

Workloads, their split and the config catalogue come from the recorded H200 data (the same ones the recorded agent
uses); only the rewards are live. The reward's denominator starts at the recorded best time and drops whenever a live
measurement beats it (envs.base.is_live).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

LOG_FORMAT = "kernel_gym-live-run"


def _spread(refs: list[Any], n: int) -> list[Any]:
    """n references spread evenly over the list sorted by workload key (small to large shapes), at most all of them."""
    if n >= len(refs):
        return list(refs)
    ordered = sorted(refs, key=lambda r: r.key)
    idx = np.unique(np.linspace(0, len(ordered) - 1, n).round().astype(int))
    return [ordered[i] for i in idx]


# Its keyword list has the shape of ServingEnv.__init__'s (duplicate scan): plain keywords, each forwarded as it is.
def run_live(
    out: str | Path,
    env_id: str = "KernelGym/MoE-live-v0",
    model: str = "mixtral-8x7b",
    timesteps: int = 256,
    n_steps: int = 32,
    train_workloads: int = 8,
    eval_workloads: int = 6,
    seed: int = 0,
    gpu: int | None = None,
    compile_workers: int = 8,
    budget_s: float = 300.0,
    backend: Any = None,
) -> dict[str, Any]:
    """Train MaskablePPO on the live env for `timesteps` steps (or until `budget_s`), evaluate live, write the log
    to `out` (JSON) and the policy beside it (`<out stem>_policy.zip`). Returns the log. `backend` replaces the
    LiveBackend on GPU `gpu` (tests pass a stand-in that answers like one)."""
    import gymnasium
    import torch
    import triton
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import KVWriter, Logger

    import kernel_gym  # noqa: F401  (registers the env ids)
    from kernel_gym.envs import ENV_KERNELS
    from kernel_gym.kernels import get_family
    from kernel_gym.measure.live import LiveBackend
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.train.train import policy_chooser, prepare_data

    if "-live-" not in env_id or env_id not in ENV_KERNELS:
        raise ValueError(f"{env_id!r} is not a live kernel env; use one of "
                         f"{sorted(e for e in ENV_KERNELS if '-live-' in e)}")
    if backend is None and not torch.cuda.is_available():
        raise SystemExit("run_live needs a CUDA GPU (the live backend times real kernels); run it on the GPU machine")
    kernel = ENV_KERNELS[env_id]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    recorded = RecordedBackend()
    data = prepare_data(kernel, recorded, model)
    train_refs = _spread(data.train, train_workloads)
    eval_refs = _spread(data.heldout, eval_workloads)
    family = get_family(kernel)
    live = backend if backend is not None else LiveBackend(gpu=gpu, compile_workers=compile_workers)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else getattr(live, "device", "cpu")
    log: dict[str, Any] = {
        "format": LOG_FORMAT, "version": 1, "env_id": env_id, "kernel": kernel, "model": model,
        "device": device, "torch": torch.__version__, "triton": triton.__version__,
        "args": {"timesteps": timesteps, "n_steps": n_steps, "train_workloads": len(train_refs),
                 "eval_workloads": len(eval_refs), "seed": seed, "budget_s": budget_s},
        "catalogue": [str(c) for c in data.catalogue.configs],
        "train_workloads": [r.key for r in train_refs], "eval_workloads": [r.key for r in eval_refs],
        "steps": [], "updates": [], "evaluation": [],
    }

    # Compile the whole catalogue once on the CPU pool, so training steps time kernels instead of waiting on Triton.
    if hasattr(live, "precompile"):
        t = time.time()
        compiled = live.precompile(kernel, train_refs[0].workload, list(data.catalogue.configs),
                                   timeout_s=max(60.0, budget_s / 2))
        log["precompile"] = {"configs": len(compiled), "wall_s": time.time() - t,
                             "errors": sum(1 for s, _, _ in compiled.values() if s is not None)}
        print(f"[live] precompiled {len(compiled)} configs in {time.time() - t:.1f} s", flush=True)

    env = gymnasium.make(env_id, backend=live, references=train_refs, catalogue=data.catalogue)
    steps, updates = log["steps"], log["updates"]

    class Recorder(BaseCallback):
        """Keeps every step's info; stops training when the time budget is spent."""

        def _on_step(self) -> bool:
            info, reward = self.locals["infos"][0], float(self.locals["rewards"][0])
            steps.append({"step": int(self.num_timesteps), "wall_s": round(time.time() - t0, 3), "reward": reward,
                          **{k: info[k] for k in ("workload", "config", "time_ms", "best_ms", "error_type", "reason")
                             if k in info}})
            if len(steps) % 16 == 0:
                recent = [s["reward"] for s in steps[-16:]]
                print(f"[live] step {len(steps)}/{timesteps}  mean reward (last 16) {np.mean(recent):.3f}  "
                      f"{time.time() - t0:.0f} s", flush=True)
            return time.time() - t0 < budget_s

    class Updates(KVWriter):
        def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
            updates.append({"step": int(step), **{k: float(v) for k, v in key_values.items()
                                                  if isinstance(v, (int, float, np.floating, np.integer))}})

    agent = MaskablePPO("MlpPolicy", env, learning_rate=1e-3, n_steps=n_steps, batch_size=n_steps, n_epochs=10,
                        ent_coef=0.01, seed=seed, device="cpu", verbose=0, policy_kwargs={"net_arch": [64, 64]})
    agent.set_logger(Logger(folder=None, output_formats=[Updates()]))
    agent.learn(total_timesteps=timesteps, callback=Recorder())
    log["train_wall_s"] = time.time() - t0

    # Live evaluation: policy choice vs the recorded oracle's config vs the default, timed together per workload.
    choose, heldout_keys = policy_chooser(agent, data.catalogue, family.space), {r.key for r in eval_refs}
    for ref in [*eval_refs, *train_refs]:
        named = {"policy": choose(ref), "recorded_oracle": ref.best_config, "default": ref.default}
        distinct = list(dict.fromkeys(named.values()))
        ms = dict(zip(distinct, live.measure_many(kernel, ref.workload, distinct)))
        row = {"workload": ref.key, "split": "heldout" if ref.key in heldout_keys else "train"}
        for name, cfg in named.items():
            m = ms[cfg]
            row[name] = {"config": str(cfg), "status": m.status, "ms": m.median_ms if m.ok else None,
                         "recorded_ms": ref.times.get(cfg)}
        log["evaluation"].append(row)
    log["summary"] = summarize(log)
    log["wall_s"] = time.time() - t0
    if backend is None:
        live.close()
    out.write_text(json.dumps(log, indent=1))
    agent.save(out.with_name(out.stem + "_policy.zip"))
    print(json.dumps(log["summary"], indent=1))
    return log


def summarize(log: dict[str, Any]) -> dict[str, Any]:
    """Headline numbers of a live log: mean reward in the first and last quarter of training, failures, and the
    live-evaluation geomeans (recorded oracle's config time / policy time, and / default time) per split."""
    rewards = [s["reward"] for s in log["steps"]]
    q = max(1, len(rewards) // 4)
    out: dict[str, Any] = {
        "steps": len(rewards),
        "mean_reward_first_quarter": float(np.mean(rewards[:q])) if rewards else None,
        "mean_reward_last_quarter": float(np.mean(rewards[-q:])) if rewards else None,
        "failed_steps": sum(1 for s in log["steps"] if "error_type" in s),
    }
    for split in ("heldout", "train"):
        rows = [r for r in log["evaluation"] if r["split"] == split
                and all(r[k]["ms"] for k in ("policy", "recorded_oracle", "default"))]
        if rows:
            for name in ("policy", "default"):
                ratios = [r["recorded_oracle"]["ms"] / r[name]["ms"] for r in rows]
                out[f"{split}_live_geomean_{name}_vs_recorded_oracle"] = float(np.exp(np.mean(np.log(ratios))))
            out[f"{split}_workloads"] = len(rows)
    return out


def import_log(path: str | Path, experiment: str = "kernel-gym-live", tracking_uri: str | None = None) -> str:
    """Create an MLflow run from a live log (and its policy zip, when it lies beside it); returns the run id."""
    import tempfile

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow

    from kernel_gym.train import tracking

    path = Path(path)
    try:
        log = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable live-run log ({exc}); pass the JSON that run_live wrote") from exc
    if log.get("format") != LOG_FORMAT:
        raise ValueError(f"{path}: format {log.get('format')!r} is not {LOG_FORMAT!r}; pass the JSON run_live wrote")
    uri = tracking.setup_tracking(tracking_uri)
    experiment_id = tracking.get_or_create_experiment(experiment, uri)
    short = log["env_id"].split("/")[-1].lower()
    with mlflow.start_run(experiment_id=experiment_id, run_name=f"{short}-{log['device'].replace(' ', '_')}") as run:
        mlflow.log_params({"env_id": log["env_id"], "kernel": log["kernel"], "model": log["model"],
                           "catalogue_size": len(log["catalogue"]), **log["args"]})
        mlflow.set_tags({"device": log["device"], "torch": log["torch"], "triton": log["triton"],
                         "nondeterministic": "True", "data.backend": "live", "imported_from": path.name,
                         "git_commit": tracking.git_commit()})
        for s in log["steps"]:
            m = {"live/reward": s["reward"]}
            if s.get("time_ms"):
                m.update({"live/time_ms": s["time_ms"], "live/best_ms": s["best_ms"]})
            mlflow.log_metrics(m, step=s["step"])
        for u in log["updates"]:
            mlflow.log_metrics({k: v for k, v in u.items() if k != "step"}, step=u["step"])
        mlflow.log_metrics({f"final/{k}": float(v) for k, v in log["summary"].items()
                            if isinstance(v, (int, float)) and v is not None})
        with tempfile.TemporaryDirectory() as tmp:
            png = Path(tmp) / "live_learning_curve.png"
            plot_live_curve(log, png, plt)
            mlflow.log_artifact(str(png), artifact_path="plots")
        mlflow.log_artifact(str(path))
        policy = path.with_name(path.stem + "_policy.zip")
        if policy.exists():
            mlflow.log_artifact(str(policy))
        return run.info.run_id


def plot_live_curve(log: dict[str, Any], path: Path, plt: Any) -> None:
    """Reward per step (points) with a 16-step rolling mean."""
    steps = [s["step"] for s in log["steps"]]
    rewards = np.array([s["reward"] for s in log["steps"]])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps, rewards, ".", alpha=0.35, label="reward (best known ms / measured ms)")
    if len(rewards) >= 16:
        ax.plot(steps[15:], np.convolve(rewards, np.ones(16) / 16, mode="valid"), label="16-step mean")
    ax.set_xlabel("environment step (one live compile-and-measure each)")
    ax.set_ylabel("reward")
    ax.set_title(f"{log['env_id']} on {log['device']}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
