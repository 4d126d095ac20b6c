"""Train a MaskablePPO agent on a kernel env, evaluate it on held-out workloads, and track everything in MLflow.

`train(TrainArgs(...))` is what `kernel-gym train` and scripts/train_agent.py call. A run:
1. measures the reference data through the backend (recorded: lookups) and splits the profile's workloads into
   training and held-out workloads (deterministic per split_seed);
2. builds the config catalogue (the action set) and the best single static config from the training workloads only;
3. trains MaskablePPO with a progress bar, evaluating the deterministic policy on the held-out workloads every
   eval_freq steps and checkpointing every checkpoint_freq steps (resume=True continues the same MLflow run);
4. logs parameters, SB3's metrics, evaluation metrics, data and code versions, plots, the catalogue and the policy
   (a self-contained pyfunc registered as kernel-gym-<env>-<model>, e.g. kernel-gym-moe-v0-mixtral-8x7b; a policy
   trained on several models is kernel-gym-<env>-conditioned, with the tag policy.model_conditioned=true).
Seeded runs on a deterministic (recorded) backend are reproducible.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kernel_gym.dispatch.catalogue import (
    MAX_CATALOGUE,
    Catalogue,
    Evaluation,
    NoMeasurementsError,
    WorkloadReference,
    action_mask,
    best_static_config,
    build_catalogue,
    evaluate_choices,
)
from kernel_gym.dispatch.observation import observe
from kernel_gym.train import zoo_policy

# Default obs_jitter per kernel (log2 units; each profile's obs_jitter, kernels/profiles.py), from held-out sweeps on
# the recorded H200 data (docs/agent.md): decode 0.5 since its grid gained batches 3, 6, 12, 24, 48 (neighbours 0.4-0.6
# apart in log2 batch; 1.0 suited the powers of two: 0.913 -> 0.963 then); MoE 0.5 with the mask following the jittered
# observation (profile jitter_mask): olmoe 0.963 -> 0.987 (seeds 0-2: 0.987, 0.986, 0.986; 0.962 at 1.0); prefill 1.0 on
# its sequence lengths since the Gluon kernel's rows made the winner change with length (seeds 0-2: mixtral 0.992,
# 0.992, 0.985, olmoe 0.990, 0.989, 0.989; 0.944-0.971 without).


@dataclass
class TrainArgs:
    env_id: str = "KernelGym/MoE-v0"
    """Gymnasium id of a kernel env (KernelGym/MoE-v0, KernelGym/DecodeAttention-v0, KernelGym/PrefillAttention-v0,
    KernelGym/PrefixPrefill-v0; each also as -live-v0: real compile-and-measure on a GPU)."""
    backend: str = "recorded"
    """Measurement backend: "recorded" (the packaged H200 data, CPU), the path of a measurement store (the --db tune
    and collect write: your own model's rows) or "live" (GPU); tests pass a Backend object to train()."""
    model: str = "mixtral-8x7b"
    """Model spec whose shapes make the workload grid: a built-in or zoo name (NAME@tpN for a tensor-parallel shard), a
    ModelSpec JSON file, or "zoo": one model-conditioned policy over every zoo training model (kernel_gym/zoo.py)."""
    exclude_models: str = ""
    """With --model zoo: comma list of zoo models whose rows (every shard's) stay out of training (leave-one-out)."""
    profile: str = "grid"
    """Traffic profile the episodes draw workloads from: grid | eval | small."""
    total_timesteps: int = 30_000
    """Environment steps (= episodes: one config choice each) to train for."""
    seed: int = 0
    """Seed of the agent, the env and torch: same seed + recorded backend = same run."""
    holdout: float = 0.25
    """Share of the profile's workloads held out of training and used for evaluation."""
    split_seed: int = 0
    """Seed of the train / held-out split (keep it fixed to compare runs)."""
    near: float = 0.0
    """Catalogue: the greedy cover stops once every training workload has a config within this fraction of its best."""
    max_catalogue: int = MAX_CATALOGUE
    """Catalogue: at most this many configs (the action space size)."""
    catalogue_depth: int = 2
    """Catalogue: also add each training workload's this many fastest configs (spares where a winner is unmeasured)."""
    obs_jitter: float = -1.0
    """Training observations: Gaussian noise (std, log2 units) on the workload axes (the profile's jitter_axes);
    -1: the kernel's default (its profile's obs_jitter)."""
    learning_rate: float = 1e-3
    """Adam learning rate."""
    n_envs: int = 8
    """Parallel copies of the env (one process, batched policy forward: several times faster than one env)."""
    n_steps: int = 64
    """Steps per env per rollout before each PPO update (a rollout is n_envs * n_steps steps)."""
    batch_size: int = 128
    """Minibatch size of the PPO update."""
    n_epochs: int = 10
    """PPO epochs per update."""
    ent_coef: float = 0.01
    """Entropy bonus (keeps exploring configs early)."""
    net_arch: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the actor and critic MLPs (tanh)."""
    eval_freq: int = 2_000
    """Evaluate on held-out workloads every this many steps (0: only at the end)."""
    checkpoint_freq: int = 5_000
    """Save a resumable checkpoint every this many steps (0: only at the end or on interruption)."""
    checkpoint_dir: str = ""
    """Checkpoint directory (default: a folder per run, out/checkpoints/<env>-<model>-seed<seed>/<run id>)."""
    resume: bool = False
    """Continue from the checkpoint in checkpoint_dir (same MLflow run) instead of starting over; with no directory,
    the latest checkpoint of this env, model and seed under out/checkpoints."""
    trust_artifacts: bool = False
    """--resume: load the checkpoint with stable-baselines3's full loader, which unpickles code from the zip (only for a
    checkpoint you made yourself). Default: weights only (torch weights_only), nothing in the zip is executed."""
    experiment: str = "kernel-gym"
    """MLflow experiment name."""
    run_name: str = ""
    """MLflow run name (default <env>-<model>-seed<seed>)."""
    tracking_uri: str = ""
    """MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite mlruns/mlflow.db in the working directory)."""
    log_model: bool = True
    """Log the policy as an MLflow pyfunc model (off: quick experiments and tests)."""
    register_model: bool = True
    """Register the logged policy in the MLflow model registry."""
    model_name: str = ""
    """Registered model name (default kernel-gym-<env>-<model>, e.g. kernel-gym-moe-v0-mixtral-8x7b)."""
    progress_bar: bool = True
    """Show a progress bar while training."""
    torch_threads: int = 1
    """torch CPU threads (1 keeps runs reproducible and leaves a core for the env)."""

    def __post_init__(self) -> None:
        from kernel_gym.envs import ENV_KERNELS

        if self.env_id not in ENV_KERNELS:
            raise ValueError(f"env_id {self.env_id!r} is not a kernel env; use one of {sorted(ENV_KERNELS)}")
        for name in ("total_timesteps", "n_steps", "n_envs", "batch_size", "n_epochs", "max_catalogue",
                     "catalogue_depth", "torch_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_freq", "checkpoint_freq"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.holdout < 1:
            raise ValueError(f"holdout must be in [0, 1), got {self.holdout}")
        if self.obs_jitter != -1.0 and not self.obs_jitter >= 0:
            raise ValueError(f"obs_jitter must be >= 0, or -1 for the kernel's default, got {self.obs_jitter}")
        self.net_arch = tuple(int(n) for n in self.net_arch)

    @property
    def resolved_obs_jitter(self) -> float:
        if self.obs_jitter >= 0:
            return self.obs_jitter
        from kernel_gym.kernels.profiles import profile

        return profile(self.kernel).obs_jitter or 0.0

    @property
    def short(self) -> str:
        return self.env_id.split("/")[-1].lower()

    @property
    def kernel(self) -> str:
        from kernel_gym.envs import ENV_KERNELS

        return ENV_KERNELS[self.env_id]

    @property
    def model_label(self) -> str:
        """The model part of run and folder names: a spec's name ("zoo" with -minus-<models> for leave-out runs)."""
        if self.model == zoo_policy.ZOO_MODEL:
            excl = [m.strip() for m in self.exclude_models.split(",") if m.strip()]
            label = "zoo" + ("-minus-" + "-".join(sorted(excl)) if excl else "")
        else:
            from kernel_gym.models import load_model

            label = load_model(self.model).name
        return re.sub(r"[^A-Za-z0-9._@-]", "_", label)[:120]

    @property
    def run_label(self) -> str:
        return f"{self.short}-{self.model_label}-seed{self.seed}"


@dataclass
class TrainResult:
    """What a training run produced."""

    run_id: str
    model_uri: str
    evaluation: Evaluation
    catalogue: Catalogue
    checkpoint_dir: str
    num_timesteps: int
    metrics: dict[str, float] = field(default_factory=dict)


# ---- data preparation ------------------------------------------------------------------------------------------------


@dataclass
class PreparedData:
    """References, catalogue and static baseline of one (kernel, profile, split)."""

    kernel: str
    train: list[WorkloadReference]
    heldout: list[WorkloadReference]
    catalogue: Catalogue
    static: Any


def prepare_data(
    kernel: str, backend: Any, model: Any = "mixtral-8x7b", profile: Any = "grid", holdout: float = 0.25,
    split_seed: int = 0, near: float = 0.0, max_catalogue: int = MAX_CATALOGUE, depth: int = 2,
    exclude_models: Sequence[str] = (),
) -> PreparedData:
    """Measure the profile's workloads through the backend, split them, and build catalogue and static baseline from
    the training part only (model "zoo": without the rows of `exclude_models` too)."""
    from kernel_gym.envs.base import resolve_profile, split_profile, unmeasured_profile_message
    from kernel_gym.kernels import get_family

    family = get_family(kernel)
    if model == zoo_policy.ZOO_MODEL:  # the model-conditioned policy: every zoo training shard, test models left out
        profile = zoo_policy.zoo_profile(kernel, exclude_models)
    elif exclude_models:
        raise ValueError("exclude_models applies to the zoo policy only (--model zoo)")
    resolved = resolve_profile(profile, kernel, model)
    train, heldout = split_profile(backend, family, resolved, holdout, split_seed)
    if not train and not heldout:
        raise NoMeasurementsError(unmeasured_profile_message(backend, kernel, model, resolved))
    candidates = train
    if model == zoo_policy.ZOO_MODEL:  # actions only among configs measured at (almost) every zoo shape
        common = zoo_policy.common_configs(train, set(resolved.anchors), family.space)
        candidates = zoo_policy.restrict(train, common)
    catalogue = build_catalogue(kernel, candidates, near, max_catalogue, depth)
    return PreparedData(kernel, train, heldout, catalogue, best_static_config(train))


# ---- evaluation ----------------------------------------------------------------------------------------------------


def policy_chooser(model: Any, catalogue: Catalogue, space: Any) -> Any:
    """A chooser (WorkloadReference -> Config) for evaluate_choices: the deterministic masked policy; the default
    config when no catalogue entry is valid and available for the workload (what a dispatcher falls back to)."""

    def choose(ref: WorkloadReference):
        mask = action_mask(space, catalogue.configs, ref)
        if not mask.any():
            return ref.default
        action, _ = model.predict(observe(ref.workload), action_masks=mask, deterministic=True)
        return catalogue.configs[int(action)]

    return choose


def evaluate_model(model: Any, data: PreparedData, on: str = "heldout") -> Evaluation:
    """Geomean oracle_time / chosen_time on the held-out (or training) workloads for the policy, the default and the
    best static config. Decisions use no measurement; the backend's times only score them."""
    from kernel_gym.kernels import get_family

    refs = data.heldout if on == "heldout" else data.train
    if not refs:
        raise ValueError(f"no {on} workloads to evaluate on (holdout=0?)")
    return evaluate_choices(refs, policy_chooser(model, data.catalogue, get_family(data.kernel).space), data.static)


def random_policy_geomean(data: PreparedData, on: str = "heldout", samples: int = 64, seed: int = 0) -> float:
    """Expected geomean ratio of choosing uniformly among valid, available catalogue entries (a learning baseline)."""
    from kernel_gym.kernels import get_family

    space = get_family(data.kernel).space
    rng = np.random.default_rng(seed)
    refs = data.heldout if on == "heldout" else data.train
    logs = []
    for ref in refs:
        configs = data.catalogue.configs
        ok = [c for c, m in zip(configs, action_mask(space, configs, ref, with_default=False)) if m] or [ref.default]
        picks = rng.integers(0, len(ok), samples)
        logs.append(np.mean([math.log(ref.ratio_with_fallback(ok[i])[0]) for i in picks]))
    return float(math.exp(np.mean(logs)))


# ---- plots ---------------------------------------------------------------------------------------------------------


def plot_learning_curve(history: dict[str, list], eval_history: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    rew = history.get("rollout/ep_rew_mean", [])
    if rew:
        ax.plot([s for s, _ in rew], [v for _, v in rew], label="training reward (mean ratio to oracle)")
    if eval_history:
        steps = [e["step"] for e in eval_history]
        ax.plot(steps, [e["eval/geomean_policy"] for e in eval_history], "o-", label="held-out: policy")
        ax.plot(steps, [e["eval/geomean_static"] for e in eval_history], "--", label="held-out: best static")
        ax.plot(steps, [e["eval/geomean_default"] for e in eval_history], ":", label="held-out: default")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("oracle time / chosen time (geomean)")
    ax.set_ylim(top=1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_chosen_configs(evaluation: Evaluation, catalogue: Catalogue, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = evaluation.rows
    index = {str(c): i for i, c in enumerate(catalogue.configs)}
    labels = [_short_key(r["workload"]) for r in rows]
    x = np.arange(len(rows))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(7, 0.35 * len(rows) + 2), 7), sharex=True)
    w = 0.27
    ax1.bar(x - w, [r["ratio_policy"] for r in rows], w, label="policy")
    ax1.bar(x, [r["ratio_static"] for r in rows], w, label="best static")
    ax1.bar(x + w, [r["ratio_default"] for r in rows], w, label="default")
    ax1.set_ylabel("oracle / chosen time")
    ax1.set_ylim(0, 1.05)
    ax1.legend(fontsize=8, ncol=3)
    ax1.set_title(f"held-out workloads: chosen configs ({catalogue.kernel})")
    ax2.scatter(x, [index.get(r["chosen"], -1) for r in rows], marker="o", label="policy's catalogue entry")
    ax2.scatter(x, [index.get(r["oracle_config"], -1) for r in rows], marker="x", label="oracle (-1: not in catalogue)")
    ax2.set_ylabel("catalogue index")
    ax2.set_xticks(x, labels, rotation=70, fontsize=7)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _short_key(key: str) -> str:
    d = json.loads(key)
    skip = {"kernel", "dtype", "hidden", "intermediate", "num_experts", "top_k", "num_heads", "num_kv_heads",
            "head_dim"}
    return ",".join(f"{k}={v}" for k, v in d.items() if k not in skip)


# ---- training ------------------------------------------------------------------------------------------------------


def _state_path(ckpt: Path) -> Path:
    return ckpt / "state.json"


CHECKPOINT_ROOT = Path("out/checkpoints")


def default_checkpoint_dir(args: TrainArgs, run_id: str) -> Path:
    """A folder per run: two runs (even of one env, model and seed) never share checkpoints."""
    return CHECKPOINT_ROOT / args.run_label / run_id


def find_resume_dir(args: TrainArgs) -> Path:
    """--resume without a directory: the most recently written checkpoint of this env, model and seed."""
    base = CHECKPOINT_ROOT / args.run_label
    states = sorted(base.glob("*/state.json"), key=lambda p: p.stat().st_mtime) if base.is_dir() else []
    if not states:
        raise ValueError(f"--resume: no checkpoint of {args.run_label} under {base}: pass --resume DIR (the folder "
                         "holding state.json and latest.zip), or drop --resume to start a new run")
    print(f"[train] resuming {states[-1].parent}", file=sys.stderr, flush=True)
    return states[-1].parent


class FolderLock:
    """An exclusive lock on a folder (flock on FOLDER/.lock, released when the process ends, even by kill -9): a second
    writer is refused in one line instead of interleaving checkpoints with the first."""

    def __init__(self, folder: Path, what: str) -> None:
        import fcntl

        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / ".lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            raise ValueError(f"{what} {folder} is in use by another process (pid {holder}): wait for it, or pass "
                             "another --checkpoint-dir") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def _save_checkpoint(model: Any, ckpt: Path, run_id: str, args: TrainArgs, eval_history: list) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    tmp_zip = ckpt / "latest.tmp.zip"  # same folder, then os.replace: an interruption never leaves half a zip
    model.save(tmp_zip)
    os.replace(tmp_zip, ckpt / "latest.zip")
    state = {"run_id": run_id, "num_timesteps": int(model.num_timesteps), "env_id": args.env_id, "seed": args.seed,
             "model": args.model_label, "exclude_models": args.exclude_models,
             "actions": int(model.action_space.n), "obs_jitter": args.resolved_obs_jitter,
             "eval_history": eval_history}
    tmp = _state_path(ckpt).with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, _state_path(ckpt))  # atomic: an interruption never leaves a half-written state


def train(args: TrainArgs, backend: Any = None) -> TrainResult:
    """Run one training run (see the module docstring); `backend` overrides args.backend with a Backend object."""
    import gymnasium
    import mlflow
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger

    import kernel_gym  # noqa: F401  (registers the env ids)
    from kernel_gym.envs.base import is_live, resolve_backend
    from kernel_gym.train import tracking

    torch.set_num_threads(args.torch_threads)
    backend = resolve_backend(backend if backend is not None else args.backend)
    t_prep = __import__("time").time()  # the zoo's references and catalogue take ~30 s before the progress bar
    print(f"[train] {args.kernel} on {args.model}: building workload references and the action catalogue ...",
          flush=True)
    data = prepare_data(args.kernel, backend, args.model, args.profile, args.holdout, args.split_seed, args.near,
                        args.max_catalogue, args.catalogue_depth,
                        [m.strip() for m in args.exclude_models.split(",") if m.strip()])
    print(f"[train] {len(data.train)} training and {len(data.heldout)} held-out workloads, "
          f"{len(data.catalogue.configs)} actions ({__import__('time').time() - t_prep:.0f} s)", flush=True)
    eval_on = "heldout" if data.heldout else "train"
    ckpt: Path | None = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    if args.resume and ckpt is None:
        ckpt = find_resume_dir(args)
    if args.resume and not (_state_path(ckpt).exists() and (ckpt / "latest.zip").exists()):
        raise ValueError(f"--resume: no checkpoint in {ckpt} (state.json and latest.zip): pass the --checkpoint-dir "
                         "of an earlier run, or drop --resume to start a new one")
    state = read_state(ckpt) if args.resume else None
    if state is not None and state["env_id"] != args.env_id:
        raise ValueError(
            f"checkpoint in {ckpt} is for {state['env_id']}, not {args.env_id}: pass another --checkpoint-dir"
        )
    if state is not None and state.get("model", args.model_label) != args.model_label:
        raise ValueError(f"checkpoint in {ckpt} was trained for model {state['model']}, not {args.model_label}: "
                         f"pass --model {state['model']} to resume it, or another --checkpoint-dir")
    if state is not None and state.get("actions", len(data.catalogue)) != len(data.catalogue):
        raise ValueError(f"checkpoint in {ckpt} has {state['actions']} actions, this run's catalogue "
                         f"{len(data.catalogue)}: it was trained on other data or catalogue options; resume with "
                         "the same --model/--profile/--max-catalogue, or pass another --checkpoint-dir")
    if state is not None and state.get("obs_jitter", args.resolved_obs_jitter) != args.resolved_obs_jitter:
        raise ValueError(f"checkpoint in {ckpt} trained with obs_jitter={state['obs_jitter']}, this run has "
                         f"{args.resolved_obs_jitter}: resume with --obs-jitter {state['obs_jitter']}")

    zoo = args.model == zoo_policy.ZOO_MODEL
    excluded = [m.strip() for m in args.exclude_models.split(",") if m.strip()]
    specs = zoo_policy.zoo_specs(args.kernel, excluded) if zoo else tracking.model_specs(args.model)
    identity = tracking.policy_identity(args.env_id, specs, str(getattr(backend, "dataset_hash", "") or ""))
    uri = tracking.setup_tracking(args.tracking_uri or None)
    experiment_id = tracking.get_or_create_experiment(args.experiment, uri)

    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    make_env = lambda: Monitor(gymnasium.make(args.env_id, backend=backend,  # noqa: E731  (Monitor: ep_rew_mean)
                                              references=data.train, catalogue=data.catalogue,
                                              obs_jitter=args.resolved_obs_jitter))
    env = DummyVecEnv([make_env] * args.n_envs)
    eval_history: list[dict[str, float]] = list(state["eval_history"]) if state else []

    if state is not None and args.trust_artifacts:
        print(f"warning: --trust-artifacts: loading {ckpt / 'latest.zip'} with stable-baselines3's full loader, "
              "which unpickles (runs) code stored in it; do this only for checkpoints you made",
              file=sys.stderr, flush=True)
        model = MaskablePPO.load(ckpt / "latest.zip", env=env, device="cpu")
    else:
        model = MaskablePPO(
            "MlpPolicy", env, learning_rate=args.learning_rate, n_steps=args.n_steps, batch_size=args.batch_size,
            n_epochs=args.n_epochs, ent_coef=args.ent_coef, seed=args.seed, device="cpu", verbose=0,
            policy_kwargs={"net_arch": list(args.net_arch)},
        )
        if state is not None:  # weights only, checked before the MLflow run is touched
            load_weights(model, ckpt / "latest.zip")
    done = int(state["num_timesteps"]) if state is not None else 0
    model.num_timesteps = done
    if state is not None:
        try:
            mlflow.tracking.MlflowClient().get_run(state["run_id"])
        except Exception as exc:  # noqa: BLE001 - MlflowException: the run is not in this store
            raise ValueError(f"checkpoint in {ckpt} belongs to MLflow run {state['run_id']}, which is not in the "
                             f"tracking store {uri}: pass the --tracking-uri it was trained with") from exc
    lock = FolderLock(ckpt, "checkpoint folder") if ckpt is not None else None
    try:
        if state is not None:
            run = mlflow.start_run(run_id=state["run_id"])
        else:
            run = mlflow.start_run(experiment_id=experiment_id, run_name=args.run_name or args.run_label)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    run_id = run.info.run_id
    if ckpt is None:
        ckpt = default_checkpoint_dir(args, run_id)
        lock = FolderLock(ckpt, "checkpoint folder")
    try:
        if state is None:
            params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(args).items()}
            params.update(obs_jitter=args.resolved_obs_jitter, catalogue_size=len(data.catalogue),
                          train_workloads=len(data.train),
                          heldout_workloads=len(data.heldout), static_config=str(data.static),
                          backend_name=getattr(backend, "name", str(backend)))
            mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
            mlflow.set_tags({
                "git_commit": tracking.git_commit(),
                "data.reference_hash": tracking.references_hash(data.train + data.heldout),
                "data.dataset_hash": str(getattr(backend, "dataset_hash", "") or "n/a"),
                "data.backend": getattr(backend, "name", str(backend)),
                "nondeterministic": str(is_live(backend)),
                "kernel": args.kernel,
                **identity,
            })
            with tempfile.TemporaryDirectory() as tmp:
                data.catalogue.save(Path(tmp) / "catalogue.json")
                mlflow.log_artifact(str(Path(tmp) / "catalogue.json"))

        writer = tracking.MLflowOutputFormat(run_id)
        model.set_logger(Logger(folder=None, output_formats=[writer]))

        class Periodic(BaseCallback):
            """Evaluate / checkpoint when num_timesteps (which grows by n_envs a step) crosses a multiple."""

            def _on_step(self) -> bool:
                n, prev = self.model.num_timesteps, self.model.num_timesteps - args.n_envs
                crossed = lambda f: f and n // f > prev // f  # noqa: E731
                if crossed(args.eval_freq):
                    ev = evaluate_model(self.model, data, eval_on)
                    m = ev.metrics()
                    mlflow.log_metrics(m, step=n)
                    eval_history.append({"step": n, **m})
                if crossed(args.checkpoint_freq):
                    _save_checkpoint(self.model, ckpt, run_id, args, eval_history)
                return True

        remaining = max(0, args.total_timesteps - done)
        rollout = args.n_envs * args.n_steps  # PPO runs whole rollouts: the progress bar's total says so
        remaining = -(-remaining // rollout) * rollout
        try:
            if remaining:
                model.learn(total_timesteps=remaining, callback=Periodic(), progress_bar=args.progress_bar,
                            reset_num_timesteps=state is None)
        except KeyboardInterrupt:
            _save_checkpoint(model, ckpt, run_id, args, eval_history)
            mlflow.end_run(status="KILLED")
            raise
        _save_checkpoint(model, ckpt, run_id, args, eval_history)

        evaluation = evaluate_model(model, data, eval_on)
        final = evaluation.metrics("final/")
        final["final/random_policy_geomean"] = random_policy_geomean(data, eval_on)
        final["final/train_geomean_policy"] = evaluate_model(model, data, "train").geomean_policy
        mlflow.log_metrics(final, step=int(model.num_timesteps))
        if not eval_history or eval_history[-1]["step"] != model.num_timesteps:
            eval_history.append({"step": int(model.num_timesteps), **evaluation.metrics()})
        with tempfile.TemporaryDirectory() as tmp:
            t = Path(tmp)
            (t / "evaluation.json").write_text(json.dumps({"on": eval_on, **evaluation.to_dict()}, indent=1))
            plot_learning_curve(writer.history, eval_history, t / "learning_curve.png")
            plot_chosen_configs(evaluation, data.catalogue, t / "chosen_configs.png")
            for name in ("evaluation.json", "learning_curve.png", "chosen_configs.png"):
                mlflow.log_artifact(str(t / name), artifact_path="plots" if name.endswith(".png") else None)
        model_uri = ""
        if args.log_model:
            model_uri = _log_model(model, args, data, backend, run_id, specs)
            mlflow.set_tag("model_uri", model_uri)
            tracking.tag_model_version(model_uri, identity)
    except BaseException:
        if mlflow.active_run() is not None:
            mlflow.end_run(status="FAILED")
        raise
    finally:
        if lock is not None:
            lock.release()
    mlflow.end_run()
    return TrainResult(run_id, model_uri, evaluation, data.catalogue, str(ckpt), int(model.num_timesteps), final)


def read_state(ckpt: Path) -> dict[str, Any]:
    """state.json of a checkpoint, checked as data (one line naming the file when it is not one)."""
    path = _state_path(ckpt)
    try:
        state = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}): not a kernel_gym checkpoint") from exc
    ok = (isinstance(state, dict) and isinstance(state.get("run_id"), str) and isinstance(state.get("env_id"), str)
          and isinstance(state.get("num_timesteps"), int) and not isinstance(state.get("num_timesteps"), bool)
          and state["num_timesteps"] >= 0 and isinstance(state.get("eval_history", []), list))
    if not ok:
        raise ValueError(f"{path}: missing or malformed run_id / env_id / num_timesteps: not a kernel_gym checkpoint")
    return state


def load_weights(model: Any, path: Path) -> None:
    """Put a checkpoint's policy and optimizer weights into `model` without unpickling anything: stable-baselines3's
    set_parameters reads only the .pth members, with torch.load(weights_only=True); the pickled "data" member (where
    a crafted zip would carry code) is never read."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"{path}: not a stable-baselines3 checkpoint zip ({exc})") from exc
    if "policy.pth" not in names:
        raise ValueError(f"{path}: no policy.pth inside: not a stable-baselines3 checkpoint")
    try:
        model.set_parameters(str(path), exact_match=True, device="cpu")
    except Exception as exc:  # noqa: BLE001 - torch/SB3 raise many types for a wrong or crafted file
        raise ValueError(f"{path}: its weights do not fit this run's policy ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}): resume with the run's own --model and options, or "
                         "pass another --checkpoint-dir") from exc


def _log_model(model: Any, args: TrainArgs, data: PreparedData, backend: Any, run_id: str, specs: list) -> str:
    import gymnasium

    from kernel_gym.train import tracking

    space = gymnasium.make(
        args.env_id, backend=backend, references=data.train + data.heldout, catalogue=data.catalogue
    ).unwrapped
    known = [(r.key, observe(r.workload), m) for r, m in zip(space.references, space.masks)]
    name = (args.model_name or tracking.registered_policy_name(args.env_id, specs)) if args.register_model else None
    return tracking.log_policy_model(
        model, args.kernel, args.env_id, data.catalogue, known, name,
        extra={"static_config": dict(data.static), "run_id": run_id,
               "model_specs": [asdict(s) for s in specs], "model_conditioned": len(specs) > 1,
               # the data it learned from: export says when the packaged data has moved on since
               "dataset_sha256_16": str(getattr(backend, "dataset_hash", "") or "")},
    )


def evaluate_logged_policy(
    model_uri: str, kernel: str, backend: Any, model: Any = "mixtral-8x7b", profile: Any = "grid",
    holdout: float = 0.25, split_seed: int = 0, near: float = 0.0, max_catalogue: int = MAX_CATALOGUE, depth: int = 2,
) -> Evaluation:
    """Score a logged pyfunc policy on the held-out workloads of the same split (benchmarks write .to_dict() as JSON).

    The static baseline and the oracle are recomputed from the backend; the policy only sees workload keys."""
    from kernel_gym.envs.base import resolve_backend
    from kernel_gym.train.safe_policy import load_safe_policy

    data = prepare_data(kernel, resolve_backend(backend), model, profile, holdout, split_seed, near, max_catalogue,
                        depth)
    refs = data.heldout or data.train
    policy = load_safe_policy(model_uri)  # read as data: no code in the logged model runs
    chosen = {r.key: c for r, c in zip(refs, policy.predict([r.workload for r in refs]))}
    return evaluate_choices(refs, lambda r: chosen[r.key], data.static)
