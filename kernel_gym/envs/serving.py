"""KernelGym/Serving-v0: control the kernel configs of a serving engine over a replayed trace, paying for switches.

Each action picks, per kernel family, a *dispatch rule* (a table bucket-of-shape -> config, or the family default)
from a catalogue built once from the training part of the trace. The rules, their catalogue and the choosers the
simulator runs them through live in kernel_gym/dispatch/serving_rules.py (why rules and not single configs is said
there); running the simulator over trace windows in kernel_gym/traffic/windows.py; evaluation against the default
rules and the per-workload oracle in kernel_gym/evaluate/serving_eval.py; export of chosen rules as a Dispatcher
table in kernel_gym/deploy/serving_export.py.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from kernel_gym.dispatch.serving_rules import (
    DispatchRule,
    ServingCatalogue,
    _Answers,
    _RuleChooser,
    build_serving_catalogue,
)
from kernel_gym.kernels.profiles import follows_kv, layers_of
from kernel_gym.kernels.space import Config
from kernel_gym.measure import resolve_backend
from kernel_gym.measure.coverage import cover
from kernel_gym.measure.roofline import COPY_BW
from kernel_gym.traffic.features import traffic_features
from kernel_gym.traffic.simulator import COMPILE_S_DEFAULT, KERNELS, Simulator
from kernel_gym.traffic.windows import resolve_model, resolve_trace, window_simulator

CLIP = 4.0
SPLITS = ("train", "heldout")


# ---- the environment ----------------------------------------------------------------------------------------------

class ServingEnv(gym.Env):
    """
    ## Description

    An LLM serving engine (continuous batching, chunked prefill, paged KV cache; kernel_gym.traffic.Simulator)
    replays a window of a request trace. Every step is one control interval (default 20 s of simulated time) in
    which the agent sets, for each tuned kernel family (prefill attention, paged decode attention, fused MoE), the
    *dispatch rule* that picks the launch config of every engine step: the family's default heuristic, an
    oracle-like table (bucket of shape -> best config on the training traffic), or a table of at most 1, 2 or 4
    configs that needs fewer compiles. Decode rules also set the KV-cache page size and layout. Kernel times come
    from the backend (recorded H200 measurements or live timing). Changing costs what it costs a deployment: the
    first use of a config not compiled before stalls the server for its compile time (measured, else 0.27 s), and
    changing the KV page size or layout stalls it for a re-layout of the live cache (2 x live KV bytes / 4.27 TB/s).

    ## Action Space

    `MultiDiscrete([n_prefill, n_decode, n_moe])`: one index per family into
    `env.unwrapped.catalogue.rules[kernel]` (index 0 = the default rule). `action_masks()` returns the
    concatenated per-dimension masks (MaskablePPO's MultiDiscrete convention); every rule of the catalogue is
    usable, so all entries are True (a rule whose config the backend cannot answer for a shape falls back to the
    default config, counted in `info["fallbacks"]`).

    ## Observation Space

    `Box(-4, 4, (12 + 2 * (n_prefill + n_decode + n_moe) + 1,), float32)`, clipped to [-4, 4]:

    | Num          | Observation                                         | Scaling                        |
    |--------------|-----------------------------------------------------|--------------------------------|
    | 0            | arrival rate (req/s) over the last interval         | / nominal request rate         |
    | 1, 2         | prompt length p50, p90 of arrivals                  | log2(1 + x) / 14               |
    | 3, 4         | decode mean context p50, p90 per step               | log2(1 + x) / 16               |
    | 5, 6         | decode batch p50, p90 per step                      | log2(1 + x) / 9                |
    | 7, 8         | routing entropy, max-expert share                   | as is (fractions)              |
    | 9            | KV-cache occupancy (time-weighted)                  | as is (fraction)               |
    | 10           | waiting queue length (time-weighted)                | log2(1 + x) / 10               |
    | 11           | re-layout stall if the KV layout changed now        | seconds / interval_s           |
    | 12 ..        | one-hot of the rule in force, per family            | 0 / 1                          |
    | next block   | compile stall of each rule's not-yet-compiled configs | seconds / interval_s         |
    | last         | fraction of the episode elapsed                     | 0 .. 1                         |

    ## Rewards

    Output tokens served in the interval / (interval_s x nominal output-token rate of the training traffic): about 1
    when the server keeps up with demand, less when it falls behind, and lower still in an interval that pays
    compile or re-layout stalls (the server serves nothing while stalled).

    ## Starting State

    A window of `num_intervals` intervals drawn (seeded) from the chosen split of the trace (training part: the
    first 1 - holdout of it; held-out: the rest), preceded by `warmup_s` of the same trace served with the default
    rules (so the first observation sees live traffic). The default rules are in force and their configs compiled.
    `reset(options={"start_s": t})` picks the window start (trace seconds).

    ## Episode End

    Terminated after `num_intervals` steps. No truncation.

    ## Arguments

    - `backend`: "recorded" (default; CPU, deterministic), "live" (GPU timing; register nondeterministic) or a Backend.
    - `model`: built-in model name or ModelSpec. `trace`: trace name/path (load_trace) or a Trace.
    - `split`: "train" | "heldout"; `holdout` (0.2): the last share of the trace held out.
    - `interval_s` (20), `num_intervals` (10), `warmup_s` (20): simulated seconds.
    - `rate_scale` (1): compress the trace's time by this factor (more load). `routing`: a RoutingProfile.
    - `catalogue`: a ServingCatalogue to reuse (training passes one so every env shares it); otherwise built by
      `build_serving_catalogue` from the training part (`profile_s`, `profile_windows`, `decode_layouts`,
      `near`, `max_configs`).
    - `sim_kwargs`: extra Simulator arguments (max_num_batched_tokens, step_overhead_s, gpu_memory_bytes, ...).

    ## Version History

    - v0: initial version (dispatch-rule actions, tokens-served reward with compile and re-layout stalls).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    # Same-shape keyword list as KernelConfigEnv.__init__, run_live and build_serving_catalogue (duplicate scan): each
    # forwards its own options; a shared options object would hide what each entry point accepts.
    def __init__(
        self,
        backend: Any = "recorded",
        model: Any = "mixtral-8x7b",
        trace: Any = "bundled",
        split: str = "train",
        holdout: float = 0.2,
        interval_s: float = 20.0,
        num_intervals: int = 10,
        warmup_s: float = 20.0,
        rate_scale: float = 1.0,
        routing: Any = None,
        catalogue: ServingCatalogue | None = None,
        profile_s: float = 600.0,
        profile_windows: int = 4,
        decode_layouts: int = 2,
        near: float = 0.02,
        max_configs: int = 16,
        sim_kwargs: dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split {split!r} is not one of {list(SPLITS)}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not one of {self.metadata['render_modes']}")
        if interval_s <= 0 or num_intervals < 1 or warmup_s < 0:
            raise ValueError(
                f"need interval_s > 0, num_intervals >= 1, warmup_s >= 0; got {interval_s}, {num_intervals}, {warmup_s}"
            )
        if not 0 < holdout < 1 or rate_scale <= 0:
            raise ValueError(f"need 0 < holdout < 1 and rate_scale > 0; got holdout={holdout}, rate_scale={rate_scale}")
        self.render_mode = render_mode
        self.backend = cover(resolve_backend(backend))
        self.model = resolve_model(model)
        self.trace = resolve_trace(trace)
        self.split, self.holdout = split, float(holdout)
        self.interval_s, self.num_intervals, self.warmup_s = float(interval_s), int(num_intervals), float(warmup_s)
        self.rate_scale = float(rate_scale)
        self.routing = routing
        self.sim_kwargs = dict(sim_kwargs or {})
        if catalogue is None:
            catalogue = build_serving_catalogue(
                self.backend, self.model, self.trace, holdout, rate_scale, routing, profile_s, profile_windows,
                decode_layouts, near, max_configs, self.sim_kwargs,
            )
        self.catalogue = catalogue
        self.compile_table = dict(catalogue.compile_s)
        self.answers = _Answers(self.backend, self.compile_table)
        self.sizes = catalogue.sizes()
        span_trace = (self.warmup_s + self.interval_s * self.num_intervals) * self.rate_scale
        train_end = self.trace.duration_s * (1 - self.holdout)
        warm = self.warmup_s * self.rate_scale
        lo, hi = (0.0, train_end) if split == "train" else (train_end, self.trace.duration_s)
        self._range = (lo + warm, hi - span_trace + warm)  # window starts (trace seconds), after the warm-up
        if self._range[1] < self._range[0]:
            raise ValueError(
                f"the {split} part of trace {self.trace.name!r} is shorter than warmup + {num_intervals} x "
                f"{interval_s} s (x rate_scale {rate_scale}); use fewer or shorter intervals or a longer trace"
            )
        self.nominal_req_per_s = len(self.trace) / max(self.trace.duration_s, 1e-9) * self.rate_scale
        n_obs = 12 + 2 * sum(self.sizes) + 1
        self.observation_space = gym.spaces.Box(-CLIP, CLIP, (n_obs,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete(self.sizes)
        self._masks = np.ones(sum(self.sizes), dtype=bool)
        self.sim: Simulator | None = None
        self.chooser: _RuleChooser | None = None
        self._current = [0, 0, 0]
        self._interval = 0
        self._t0 = 0.0
        self._last: dict[str, Any] = {}
        self.start_s = 0.0

    # ---- helpers ----

    def default_action(self) -> np.ndarray:
        return np.zeros(3, dtype=np.int64)

    def action_masks(self) -> np.ndarray:
        """Concatenated per-family masks (MaskablePPO's MultiDiscrete convention)."""
        return self._masks.copy()

    def rule_names(self, action: Any) -> list[str]:
        return [self.catalogue.rules[k][int(a)].name for k, a in zip(KERNELS, action)]

    def _compile_cost(self, kernel: str, c: Config) -> float:
        return self.compile_table.get((kernel, c), COMPILE_S_DEFAULT)

    def _pending_compile_s(self, rule: DispatchRule) -> float:
        compiled = self.sim.compiled if self.sim is not None else set()
        return sum(self._compile_cost(rule.kernel, c) for c in rule.configs() if (rule.kernel, c) not in compiled)

    def _relayout_s(self) -> float:
        sim = self.sim
        running = sim._running()
        return 2.0 * float(sim.kv[running].sum()) * self.model.kv_bytes_per_token / COPY_BW

    def _obs(self) -> np.ndarray:
        f = traffic_features(self.sim, self.interval_s)
        lg = lambda x, d: math.log2(1.0 + max(float(x), 0.0)) / d
        feats = [f[0] / self.nominal_req_per_s, lg(f[1], 14), lg(f[2], 14), lg(f[3], 16), lg(f[4], 16),
                 lg(f[5], 9), lg(f[6], 9), f[7], f[8], f[9], lg(f[10], 10), self._relayout_s() / self.interval_s]
        onehot: list[float] = []
        pending: list[float] = []
        for k, cur in zip(KERNELS, self._current):
            rules = self.catalogue.rules[k]
            onehot += [1.0 if i == cur else 0.0 for i in range(len(rules))]
            pending += [self._pending_compile_s(r) / self.interval_s for r in rules]
        obs = np.array(feats + onehot + pending + [self._interval / self.num_intervals], dtype=np.float32)
        return np.clip(np.nan_to_num(obs, nan=0.0), -CLIP, CLIP)

    def make_simulator(self, start_s: float, chooser: Any) -> Simulator:
        """A simulator over [start_s - warmup, start_s + num_intervals x interval) of the trace (trace seconds),
        served by `chooser`, with the default rules' configs precompiled; advanced through the warm-up."""
        return window_simulator(self.model, self.trace, self.backend, chooser, start_s, self.warmup_s,
                                self.interval_s * self.num_intervals, self.rate_scale, self.routing,
                                self._compile_cost, self.catalogue.precompiled, self.sim_kwargs)

    # ---- gym API ----

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Draw a window from the split; options={"start_s": t} fixes its start (trace seconds)."""
        super().reset(seed=seed)
        if options and "start_s" in options:
            start = float(options["start_s"])
            lo = self.warmup_s * self.rate_scale
            hi = self.trace.duration_s - self.interval_s * self.num_intervals * self.rate_scale
            if not lo <= start <= hi:
                raise ValueError(f"start_s {start} must lie in [{lo:g}, {hi:g}] (room for warm-up and the window)")
        else:
            start = float(self.np_random.uniform(*self._range))
        self.start_s = start
        self._current = [0, 0, 0]
        self.chooser = _RuleChooser(self.answers, {k: self.catalogue.rules[k][0] for k in KERNELS})
        self.sim = self.make_simulator(start, self.chooser)
        self._interval = 0
        self._t0 = self.sim.clock
        self._last = {}
        return self._obs(), {"start_s": start, "action_mask": self.action_masks()}

    def apply_rules(self, rules: dict[str, DispatchRule]) -> float:
        """Put rules in force (switching the KV layout if the decode rule's differs). Returns the re-layout stall."""
        relayout = 0.0
        kv = next(r.kv for k, r in rules.items() if follows_kv(k))  # the decode rule's layout
        if kv != self.sim.kv_layout:
            relayout = self.sim.set_kv_layout(kv.page_size, kv.layout)
        self.chooser.rules = dict(rules)
        return relayout

    def step(self, action: Any):
        if self.sim is None:
            raise RuntimeError("call reset() before step()")
        a = np.asarray(action).reshape(-1)
        if a.shape != (3,) or not self.action_space.contains(a.astype(np.int64)):
            raise ValueError(
                f"action {action!r} is outside MultiDiscrete({self.sizes}); give one rule index per family"
            )
        a = [int(x) for x in a]
        rules = {k: self.catalogue.rules[k][i] for k, i in zip(KERNELS, a)}
        fb0 = self.chooser.fallbacks
        calls0, prox0 = self.chooser.coverage.snapshot()
        ks0, est0 = self.chooser.coverage.seconds()
        relayout = self.apply_rules(rules)
        self._current = a
        t_end = self._t0 + self.interval_s * (self._interval + 1)
        st = self.sim.run_until(t_end)
        self._interval += 1
        reward = st.output_tokens / (self.interval_s * self.catalogue.nominal_tokens_per_s)
        compile_stall = sum(s for _, s, why in st.stalls if why.startswith("compile"))
        ks1, est1 = self.chooser.coverage.seconds()
        info = {
            "tokens": st.output_tokens,
            "tokens_per_s": st.output_tokens / max(st.t_end - st.t_start, 1e-9),
            "stall_s": st.stall_s,
            "compile_stall_s": compile_stall,
            "relayout_stall_s": relayout,
            "rules": self.rule_names(a),
            "fallbacks": self.chooser.fallbacks - fb0,
            "kernel_calls": self.chooser.coverage.snapshot()[0] - calls0,
            "proxied_calls": self.chooser.coverage.snapshot()[1] - prox0,
            # tuned-kernel seconds served in the interval (all layers), per family, and the part on estimated times
            "tuned_kernel_s": st.tuned_kernel_s,
            "kernel_s": {k: (ks1[k] - ks0[k]) * layers_of(k, self.model) for k in KERNELS},
            "estimated_kernel_s": {k: (est1[k] - est0[k]) * layers_of(k, self.model) for k in KERNELS},
            "sim_time_s": st.t_end - st.t_start,
            "action_mask": self.action_masks(),
        }
        self._last = info
        terminated = self._interval >= self.num_intervals
        return self._obs(), float(reward), terminated, False, info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return ", ".join(f"{k}={v}" for k, v in self._last.items() if k != "action_mask") or "(no step yet)"
        return None
