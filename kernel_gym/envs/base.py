"""The shared one-step (contextual bandit) kernel-config environment; moe.py, decode_attention.py and
prefill_attention.py specialise it per kernel family and document it.

One step per episode because the decision is made with zero measurements: in a deployment the dispatcher sees a
workload and must answer at once, so the agent learns a map workload -> config, not a search procedure.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from kernel_gym.dispatch.catalogue import (
    MAX_CATALOGUE,
    Catalogue,
    WorkloadReference,
    action_mask,
    build_catalogue,
    measure_reference,
    rule_mask,
    split_references,
)
from kernel_gym.dispatch.observation import CLIP, encode, feature_names, observe, raw_features
from kernel_gym.kernels import get_family, profiles
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import model_workloads
from kernel_gym.measure import resolve_backend
from kernel_gym.measure.types import INVALID, UNAVAILABLE

FAILURE_PENALTY = -1.0
PROFILES = ("grid", "eval", "small")
# obs_jitter: per kernel, the workload axes it moves: a workload field and the raw features (log2 units) that move with
# it, each with its slope (prefill: every length scaled by 2^d moves the causal pairs by 2^(2d))
# (each profile's jitter_axes, kernels/profiles.py)
# obs_jitter: kernels whose action mask follows the jittered observation (profile jitter_mask: the knob space's rules
# applied at the moved workload too). Measured on the recorded H200 data (docs/agent.md): MoE held-out 0.963 -> 0.987
# (the fused top-k sum's 96-token limit); decode held-out unchanged (0.95) but its replayed kernel time up to 8.5%
# slower (its split rules track the grid size, and a mask moving with a factor-2 jitter blurs what the policy learns
# at exact batches).
SPLITS = ("train", "heldout", "all")


@dataclass
class WorkloadProfile:
    """A traffic profile for a kernel env: the workloads an episode may draw and their relative weights.

    `anchors`: workload keys that always stay in training (the "grid" profile anchors its exhaustively measured
    eval-grid points: their oracle is over every config, while the other grid points share one config sample)."""

    name: str
    workloads: list[Any]
    weights: list[float] | None = None
    anchors: list[str] = field(default_factory=list)


def resolve_profile(profile: Any, kernel: str, model: Any) -> WorkloadProfile:
    """A WorkloadProfile as is, or a name: "grid" (the model's collection grid, uniform), "eval" (the exhaustively
    measured evaluation grid) or "small" (CPU-interpreter shapes)."""
    if isinstance(profile, WorkloadProfile):
        return profile
    if profile not in PROFILES:
        raise ValueError(f"unknown traffic profile {profile!r}: use one of {list(PROFILES)} or a WorkloadProfile")
    from kernel_gym.models import load_model

    spec = load_model(model) if isinstance(model, str) else model
    grid = {"grid": "default", "eval": "eval", "small": "small"}[profile]
    anchors = [w.key() for w in model_workloads(kernel, spec, "eval")] if profile == "grid" else []
    return WorkloadProfile(profile, list(model_workloads(kernel, spec, grid)), anchors=anchors)


def unmeasured_profile_message(backend: Any, kernel: str, model: Any, profile: Any) -> str:
    """Why an env or a training run cannot start on a model the backend never measured, and the commands that fix it
    (measure into a store, then train on it), said before a catalogue or a reference is built."""
    name = getattr(model, "name", model)
    return (f"the {getattr(backend, 'name', 'given')} backend has no {kernel} measurement of any of {name}'s "
            f"{len(profile.workloads)} workloads (profile {profile.name!r}; the packaged data covers the zoo's "
            f"shapes): measure them on a GPU (kernel-gym collect --model SPEC --kernels {kernel} --db STORE), then "
            "train on them with --backend STORE (Python: backend=\"STORE\")")


def split_profile(
    backend: Any, family: Any, profile: WorkloadProfile, holdout: float = 0.25, split_seed: int = 0
) -> tuple[list[WorkloadReference], list[WorkloadReference]]:
    """Measure every workload of the profile (recorded: lookups) and split the measured ones into training and
    held-out references (catalogue.split_workloads: whole primary-axis values held out, anchors kept in training)."""
    refs = measure_reference(backend, family, profile.workloads)
    return split_references(refs, holdout, split_seed, profile.anchors)


def is_live(backend: Any) -> bool:
    """Live timing is noisy: never cache its answers, and let the best known time improve as it is seen."""
    return getattr(backend, "name", "") == "live" or not getattr(backend, "deterministic", True)


class KernelConfigEnv(gym.Env):
    """Pick a launch config for one workload; reward = oracle time / measured time. See the subclasses' docstrings."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    kernel = ""

    def __init__(
        self,
        backend: Any = "recorded",
        model: Any = "mixtral-8x7b",
        profile: Any = "grid",
        split: str = "train",
        holdout: float = 0.25,
        split_seed: int = 0,
        catalogue: Catalogue | None = None,
        references: Sequence[WorkloadReference] | None = None,
        near: float = 0.0,
        max_catalogue: int = MAX_CATALOGUE,
        catalogue_depth: int = 2,
        obs_jitter: float = 0.0,
        render_mode: str | None = None,
        kernel: str | None = None,
    ) -> None:
        if kernel is not None:  # a family without an env class of its own (its KERNEL_ENVS line passes it)
            self.kernel = kernel
        if split not in SPLITS:
            raise ValueError(f"split {split!r} is not one of {list(SPLITS)}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not one of {self.metadata['render_modes']}")
        if not math.isfinite(obs_jitter) or obs_jitter < 0:
            raise ValueError(f"obs_jitter must be >= 0 (a standard deviation in log2 units), got {obs_jitter}")
        if obs_jitter and not profiles.profile(self.kernel).jitter_axes:
            raise ValueError(f"obs_jitter={obs_jitter}: {self.kernel} has no workload axes to jitter (its profile's "
                             "jitter_axes); use 0")
        self.render_mode = render_mode
        self.obs_jitter = float(obs_jitter)
        self.family = get_family(self.kernel)
        self.backend = resolve_backend(backend)
        self.live = is_live(self.backend)
        self.profile = resolve_profile(profile, self.kernel, model)
        if references is None:
            train, heldout = split_profile(self.backend, self.family, self.profile, holdout, split_seed)
            if not train and not heldout:  # a model the data never measured: say so, not "check the backend"
                raise ValueError(unmeasured_profile_message(self.backend, self.kernel, model, self.profile))
            references = {"train": train, "heldout": heldout, "all": train + heldout}[split]
            if catalogue is None:
                catalogue = build_catalogue(self.kernel, train, near, max_catalogue, catalogue_depth)
        if catalogue is None:
            catalogue = build_catalogue(self.kernel, references, near, max_catalogue, catalogue_depth)
        if catalogue.kernel != self.kernel:
            raise ValueError(f"catalogue is for {catalogue.kernel!r}, this env is {self.kernel!r}")
        self.catalogue = catalogue
        self._config_str = [str(c) for c in catalogue.configs]
        weights = dict(zip((w.key() for w in self.profile.workloads), self.profile.weights or []))
        self.references: list[WorkloadReference] = []
        self.masks: list[np.ndarray] = []
        self._obs: list[np.ndarray] = []  # per reference: observation and key, computed once (the step hot path)
        self._keys: list[str] = []
        self.dropped: list[str] = []  # workloads where no catalogue config is valid and available
        for ref in references:
            mask = self._mask(ref)
            if mask.any():
                self.references.append(ref)
                self.masks.append(mask)
                self._obs.append(observe(ref.workload))
                self._keys.append(ref.key)
            else:
                self.dropped.append(ref.key)
        if not self.references:
            raise ValueError(
                f"{self.kernel}: no workload of profile {self.profile.name!r} (split {split!r}) has a valid, measured "
                "catalogue config; check the backend's data for this model"
            )
        p = np.array([weights.get(k, 1.0) for k in self._keys], dtype=np.float64)
        self._p = p / p.sum()
        self._best = [r.best_time for r in self.references]
        self.observation_space = gym.spaces.Box(-CLIP, CLIP, (len(feature_names(self.kernel)),), np.float32)
        self.action_space = gym.spaces.Discrete(len(self.catalogue))
        self._index = 0
        self._mask_now = self.masks[0]
        self._last: dict[str, Any] = {}

    def _mask(self, ref: WorkloadReference) -> np.ndarray:
        return action_mask(self.family.space, self.catalogue.configs, ref)

    @property
    def workload(self) -> Any:
        return self.references[self._index].workload

    def action_masks(self) -> np.ndarray:
        """Valid (knob-space rules) and available (backend) catalogue entries for the current workload (with
        obs_jitter: also valid at the moved workload the observation shows)."""
        return self._mask_now.copy()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Draw a workload from the profile; options={"workload_index": i} picks one (evaluation sweeps)."""
        super().reset(seed=seed)
        if options and "workload_index" in options:
            i = int(options["workload_index"])
            if not 0 <= i < len(self.references):
                raise ValueError(f"workload_index {i} out of range [0, {len(self.references)})")
            self._index = i
        else:
            self._index = int(self.np_random.choice(len(self.references), p=self._p))
        obs, self._mask_now = self._observation()
        return obs, {"workload": self._keys[self._index], "action_mask": self.action_masks()}

    def _observation(self) -> tuple[np.ndarray, np.ndarray]:
        """The workload's observation and action mask; with obs_jitter, its workload axes moved by Gaussian noise
        (log2 units), one draw per axis. Training only: the reward still comes from the exact workload, so a config
        that wins across neighbouring grid points earns more than one that wins on a single point, and the learned
        decision regions reach between grid points instead of flipping at arbitrary places there (held-out shapes lie
        between). For the kernels whose profile has jitter_mask the mask follows the observation: entries the knob space
        rejects at the moved workload are masked too, so the choice the policy learns where a rule switches a config off
        (the fused top-k sum above 96 tokens) is the one that is best at the exact neighbours it was trained on."""
        index = self._index
        if not self.obs_jitter:
            return self._obs[index].copy(), self.masks[index]
        workload = self.references[index].workload
        raw = raw_features(workload)
        scale = {}  # workload field -> factor it moved by
        for field_name, moves in profiles.profile(self.kernel).jitter_axes:
            delta = float(self.np_random.normal(0.0, self.obs_jitter))
            for name, slope in moves:
                raw[name] += slope * delta
            scale[field_name] = 2.0 ** delta
        obs = encode(self.kernel, raw)
        if not profiles.profile(self.kernel).jitter_mask:
            return obs, self.masks[index]
        moved = dataclasses.replace(workload, **{f: max(1, round(getattr(workload, f) * x)) for f, x in scale.items()})
        space = self.family.space
        mask = self.masks[index] & rule_mask(space, self.catalogue.configs, moved)
        return obs, (mask if mask.any() else self.masks[index])

    def step(self, action: Any):
        i = int(action)
        if not 0 <= i < len(self.catalogue):
            raise ValueError(f"action {action!r} is outside Discrete({len(self.catalogue)})")
        ref, config = self.references[self._index], self.catalogue.configs[i]
        obs = self._obs[self._index].copy()
        info: dict[str, Any] = {"workload": self._keys[self._index], "config": self._config_str[i], "action": i}
        if not self._mask_now[i]:
            reason = self.family.space.why_invalid(config, ref.workload)
            if not reason and self.masks[self._index][i]:
                reason = "invalid at the workload this episode's jittered observation shows (obs_jitter)"
            info.update(
                error_type=INVALID if reason else UNAVAILABLE,
                reason=reason or "the backend has no measurement for this config on this workload",
            )
            return self._end(obs, FAILURE_PENALTY, info)
        if self.live or config not in ref.times:
            m = self.backend.measure(self.kernel, ref.workload, config)
            time_ms = m.median_ms if m.ok else None
            if not m.ok:
                info.update(error_type=m.status, reason=m.reason or m.status)
        else:
            time_ms = ref.times[config]
        if time_ms is None or time_ms <= 0:
            info.setdefault("error_type", "bad_time")
            info.setdefault("reason", f"backend returned no positive time ({time_ms!r})")
            return self._end(obs, FAILURE_PENALTY, info)
        if time_ms < self._best[self._index]:  # live timing found something faster than the best known
            self._best[self._index] = time_ms
        best = self._best[self._index]
        reward = best / time_ms
        info.update(time_ms=time_ms, best_ms=best, ratio=reward)
        return self._end(obs, float(reward), info)

    def _end(self, obs: np.ndarray, reward: float, info: dict[str, Any]):
        self._last = info
        return obs, reward, True, False, info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return ", ".join(f"{k}={v}" for k, v in self._last.items()) or "(no step yet)"
        return None

    def config_of(self, action: int) -> Config:
        return self.catalogue.configs[int(action)]
