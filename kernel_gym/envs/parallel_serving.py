"""KernelGym/ServingTPEP-v0 (ParallelServingEnv): choose how a MoE model is split over G GPUs (tensor vs expert
parallelism) for the traffic a deployment will serve, scored by goodput at a TTFT/TPOT SLO.

Why one decision per episode: serving engines fix the layout at launch (vLLM's --tensor-parallel-size,
--data-parallel-size and --enable-expert-parallel, SGLang's --tp/--ep place the weights once; changing them means
restarting the engine and reloading every weight, minutes of downtime). So the realistic choice is per deployment:
the agent sees what the traffic looked like just before (arrival rate, prompt and output lengths, how skewed the
expert routing is) and picks the layout that then serves a window of the trace. The step times come from
kernel_gym.parallel (sharded kernels measured on one GPU, collectives from the measured table, EP imbalance from the
step's sampled routing); without a measured collectives table the collectives come from aiconfigurator's labelled
prior (kernel_gym.parallel.collectives.load_prior), and each step's info says how much of it rests on the prior.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from kernel_gym.measure import resolve_backend
from kernel_gym.measure.coverage import cover
from kernel_gym.parallel.collectives import resolve_table
from kernel_gym.parallel.layout import MAX_GPUS, Layout, layouts_for, why_invalid
from kernel_gym.parallel.step_time import StepPricer, serve
from kernel_gym.traffic.routing import entropy_norm
from kernel_gym.traffic.simulator import GPU_MEMORY_UTILIZATION, H200_MEMORY_BYTES
from kernel_gym.traffic.windows import resolve_model, resolve_trace, slice_window

CLIP = 4.0
SPLITS = ("train", "heldout")
FEATURES = ("arrival_rate", "prompt_p50", "prompt_p90", "output_p50", "output_p90", "max_expert_share",
            "routing_entropy")



def split_bounds(duration_s: float, holdout: float, split: str) -> tuple[float, float]:
    """[lo, hi) trace seconds of a split: the first 1 - holdout of the trace ("train") or the rest ("heldout")."""
    train_end = duration_s * (1 - holdout)
    return (0.0, train_end) if split == "train" else (train_end, duration_s)


def window_start_range(duration_s: float, holdout: float, split: str, window_s: float, warmup_s: float,
                       context_s: float, rate_scale: float) -> tuple[float, float]:
    """The window starts (trace seconds) whose context, warm-up and window lie inside the split; empty (hi < lo) when
    the split is too short."""
    lo, hi = split_bounds(duration_s, holdout, split)
    return (max(lo, context_s * rate_scale) + warmup_s * rate_scale, hi - window_s * rate_scale)

class ParallelServingEnv(gym.Env):
    """
    ## Description

    A serving engine on `gpus` GPUs replays a window of a request trace under the layout the agent picks
    (kernel_gym.parallel.layout: TP = G, EP = G, or the mixed tp x ep = G). One step per episode.

    ## Action Space

    `Discrete(len(layouts_for(gpus)))`: index into `env.unwrapped.layouts` (pure TP first, pure EP last).
    `action_masks()` is False for layouts the model cannot use on G GPUs (heads or intermediate not divisible by
    tp, experts not by ep, weights that leave no KV cache), MaskablePPO's convention.

    ## Observation Space

    `Box(-4, 4, (7,), float32)` over the `context_s` seconds of trace before the window: arrival rate / the
    split's mean rate, log2(1 + prompt tokens) p50 and p90 / 14, log2(1 + output tokens) p50 and p90 / 14, and the
    routing profile's max-expert share and normalised entropy at the window's start.

    ## Rewards

    Goodput (requests per second finishing within both SLOs) / offered requests per second of the window: 1 when
    every request meets the SLO and the engine keeps up, less otherwise.

    ## Starting State

    A window of `window_s` seconds (after `warmup_s` of the same trace, served too and counted) drawn (seeded) from
    the split: the first 1 - holdout of the trace ("train") or the rest ("heldout"); `reset(options={"start_s": t})`
    fixes it.

    ## Episode End

    Terminated after the one step.

    ## Arguments

    `backend` ("recorded"), `model`, `trace` ("bundled"; any load_trace name or a Trace), `gpus` (8), `table` (the
    collectives table: path, dict or CollectiveTable; None: benchmarks/multigpu/collectives.json), `routing` (a
    RoutingProfile; None = uniform), `split`, `holdout` (0.2), `window_s` (60), `warmup_s` (10), `context_s` (60),
    `rate_scale` (1), `ttft_slo_s` (2.0), `tpot_slo_s` (0.1), `sim_kwargs` (Simulator arguments).

    ## Version History

    - v0: initial version (layout per deployment, goodput reward).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, backend: Any = "recorded", model: Any = "mixtral-8x7b", trace: Any = "bundled", gpus: int = 8,
                 table: Any = None, routing: Any = None, split: str = "train", holdout: float = 0.2,
                 window_s: float = 60.0, warmup_s: float = 10.0, context_s: float = 60.0, rate_scale: float = 1.0,
                 ttft_slo_s: float = 2.0, tpot_slo_s: float = 0.1, sim_kwargs: dict[str, Any] | None = None,
                 render_mode: str | None = None) -> None:
        if split not in SPLITS:
            raise ValueError(f"split {split!r} is not one of {list(SPLITS)}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not one of {self.metadata['render_modes']}")
        if window_s <= 0 or warmup_s < 0 or context_s <= 0 or rate_scale <= 0 or not 0 < holdout < 1:
            raise ValueError("need window_s > 0, warmup_s >= 0, context_s > 0, rate_scale > 0, 0 < holdout < 1")
        self.render_mode = render_mode
        self.table = resolve_table(table) if gpus > 1 else None
        self.backend = cover(resolve_backend(backend))
        self.model = resolve_model(model)
        self.trace = resolve_trace(trace)
        self.gpus = int(gpus)
        self.routing = routing
        self.window_s, self.warmup_s, self.context_s = float(window_s), float(warmup_s), float(context_s)
        self.rate_scale = float(rate_scale)
        self.split = split
        self.slo = (float(ttft_slo_s), float(tpot_slo_s))
        self.sim_kwargs = dict(sim_kwargs or {})
        self.layouts: list[Layout] = layouts_for(self.gpus)
        # the memory the serving simulator sizes this env's KV pool with (step_time.serve's defaults)
        self.reasons = [why_invalid(self.model, lay, self.gpus, H200_MEMORY_BYTES, GPU_MEMORY_UTILIZATION)
                        for lay in self.layouts]
        self._mask = np.array([not r for r in self.reasons], dtype=bool)
        self._refuse_unfit()
        self._pricers: dict[Layout, StepPricer] = {}
        lo, hi = split_bounds(self.trace.duration_s, holdout, split)
        span = (self.warmup_s + self.window_s) * self.rate_scale
        self._range = window_start_range(self.trace.duration_s, holdout, split, self.window_s, self.warmup_s,
                                         self.context_s, self.rate_scale)
        if self._range[1] < self._range[0]:
            ctx = max(lo, self.context_s * self.rate_scale) - lo  # trace seconds of context inside the split
            need = ctx + span
            n = len(self.trace)
            instant = ("" if self.trace.duration_s > 0 else "; it holds one request" if n == 1 else
                       f"; all {n} requests arrive at one instant")
            parts = (f"context + warm-up + window ({ctx / self.rate_scale:g} + " if ctx > 0 else
                     "warm-up + window (") + f"{self.warmup_s:g} + {self.window_s:g} simulated s"
            raise ValueError(f"the {split} part of trace {self.trace.name!r} ({hi - lo:g} s of its "
                             f"{self.trace.duration_s:g} s{instant}) is shorter than {parts} at rate scale "
                             f"{self.rate_scale:g}: {need:g} s of trace); use a shorter --window-s, a lower "
                             "--rate-scale, or a trace spanning more time")
        lo_i, hi_i = np.searchsorted(self.trace.arrival_s, [lo, hi])
        self.nominal_req_per_s = (hi_i - lo_i) / max(hi - lo, 1e-9) * self.rate_scale
        self.observation_space = gym.spaces.Box(-CLIP, CLIP, (len(FEATURES),), np.float32)
        self.action_space = gym.spaces.Discrete(len(self.layouts))
        self.start_s = 0.0
        self._obs = np.zeros(len(FEATURES), np.float32)
        self._last: dict[str, Any] = {}

    def _refuse_unfit(self) -> None:
        """One server on all the GPUs is this env's only action: refuse a model no such layout fits."""
        if not self._mask.any():
            raise ValueError(f"{self.model.name} fits no layout on {self.gpus} GPUs: " + "; ".join(self.reasons))

    def action_masks(self) -> np.ndarray:
        return self._mask.copy()

    def action_of(self, layout: Layout) -> int:
        """The action that launches `layout` (the fixed-layout baselines: TP = G, EP = G, mixed)."""
        return self.layouts.index(layout)

    def _features(self, start_s: float) -> np.ndarray:
        tr = self.trace
        lo, hi = np.searchsorted(tr.arrival_s, [start_s - self.context_s * self.rate_scale, start_s])
        rate = (hi - lo) / self.context_s / max(self.nominal_req_per_s, 1e-9)
        lg = lambda x: math.log2(1.0 + float(x)) / 14.0
        p = tr.prompt_tokens[lo:hi] if hi > lo else np.ones(1)
        o = tr.output_tokens[lo:hi] if hi > lo else np.ones(1)
        if self.routing is None:
            max_share, entropy = 1.0 / self.model.num_experts, 1.0
        else:
            shares = self.routing.load_shares(start_s / self.rate_scale)
            max_share, entropy = float(np.max(shares)), entropy_norm(shares)
        f = [rate, lg(np.percentile(p, 50)), lg(np.percentile(p, 90)), lg(np.percentile(o, 50)),
             lg(np.percentile(o, 90)), max_share, entropy]
        return np.clip(np.asarray(f, dtype=np.float32), -CLIP, CLIP)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Draw a window start (trace seconds); options={"start_s": t} fixes it."""
        super().reset(seed=seed)
        if options and "start_s" in options:
            start = float(options["start_s"])
            lo = self.warmup_s * self.rate_scale
            if not lo <= start <= self.trace.duration_s:
                raise ValueError(f"start_s {start} must lie in [{lo:g}, {self.trace.duration_s:g}]")
        else:
            start = float(self.np_random.uniform(*self._range))
        self.start_s = start
        self._obs = self._features(start)
        return self._obs.copy(), {"start_s": start, "action_mask": self.action_masks()}

    def serve_layout(self, layout: Layout) -> dict[str, Any]:
        """Goodput and the step-time breakdown of the current window under `layout` (the env's reward source)."""
        t0 = self.start_s - self.warmup_s * self.rate_scale
        requests = slice_window(self.trace, t0, self.start_s + self.window_s * self.rate_scale, self.rate_scale)
        pricer = self._pricers.get(layout)
        if pricer is None:
            pricer = self._pricers[layout] = StepPricer(self.model, layout, self.backend, self.table)
        out = serve(self.model, requests, layout, routing=self.routing, ttft_slo_s=self.slo[0],
                    tpot_slo_s=self.slo[1], pricer=pricer, span_s=self.warmup_s + self.window_s, **self.sim_kwargs)
        out["offered_req_per_s"] = len(requests.arrival_s) / (self.warmup_s + self.window_s)
        return out

    def step(self, action: Any):
        a = int(np.asarray(action).reshape(-1)[0])
        if not 0 <= a < len(self.layouts):
            raise ValueError(f"action {action!r} is outside Discrete({len(self.layouts)})")
        layout = self.layouts[a]
        if not self._mask[a]:
            raise ValueError(f"action {a} ({layout}) is masked: {self.reasons[a]}")
        info = self.serve_layout(layout)
        reward = info["goodput_req_per_s"] / max(info["offered_req_per_s"], 1e-9)
        info.update(start_s=self.start_s, action_mask=self.action_masks())
        self._last = info
        return self._obs.copy(), float(reward), True, False, info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            keys = ("layout", "goodput_req_per_s", "slo_attainment", "estimated_share", "collective_share")
            return ", ".join(f"{k}={self._last[k]}" for k in keys if k in self._last) or "(no step yet)"
        return None


class ServingPlanEnv(ParallelServingEnv):
    """
    ## Description

    KernelGym/ServingPlan-v0: the whole serving decision on `gpus` GPUs for one engine release (vLLM 0.34 / 0.33,
    SGLang 0.5.23): how many replicas, the TP / EP layout of each, and the engine knobs (KV block size, the
    chunked-prefill token budget, the running-sequence limit, the CUDA-graph size), scored on a window of a trace by
    goodput at a TTFT/TPOT SLO (kernel_gym.parallel.deploy). One step per episode, like ServingTPEP-v0 (engines fix
    all of this at launch).

    ## Action Space

    `MultiDiscrete([len(layout_choices(gpus)), len(BLOCK_SIZES), len(BATCHED_TOKENS), len(MAX_SEQS),
    len(GRAPH_MAX)])`. `action_masks()` (MaskablePPO's per-dimension convention, concatenated) is False for layouts
    that never fit (weights, divisibility, a layout the engine cannot express, no KV for one max-length request at
    the smallest step, collectives the table has no rows for, e.g. EP3); a knob combination that pushes a layout's
    memory over is refused at step time with reward 0 and `info["invalid"]` naming why. Where no deployment of all
    `gpus` GPUs fits (a model that needs TP4, on 5 or 6 GPUs), the choices are those of the most GPUs one fits
    (`used_gpus`).

    ## Observation Space

    ServingTPEP-v0's 7 traffic features plus the offered request rate per GPU / 4 (clipped to [-4, 4]).

    ## Rewards

    Goodput (requests per second meeting both SLOs) / offered requests per second of the window.

    ## Arguments

    ServingTPEP-v0's, plus `engine` ("vllm", or a release: "vllm-0.33.0"), `max_model_len` (32768; longer requests
    are refused by the engine).

    ## Version History

    - v0: initial version.
    """

    def __init__(self, *args: Any, engine: str = "vllm", max_model_len: int = 32768, pricer: Any = None,
                 **kw: Any) -> None:
        """pricer: a DeploymentPricer of the same model to share (its layouts' prices are memoised)."""
        from kernel_gym.parallel.deploy import (
            BATCHED_TOKENS,
            BLOCK_SIZES,
            GRAPH_MAX,
            MAX_SEQS,
            Deployment,
            DeploymentPricer,
            layout_choices,
            split_engine,
            why_invalid_deployment,
        )

        split_engine(engine)  # refuses an unknown engine or release before anything is priced
        super().__init__(*args, **kw)
        self.engine = engine
        self.grids = (BLOCK_SIZES, BATCHED_TOKENS, MAX_SEQS, GRAPH_MAX)
        self._Deployment, self._why_deployment = Deployment, why_invalid_deployment
        self.pricer = pricer if pricer is not None else DeploymentPricer(
            self.model, self.backend, self.table if self.gpus > 1 else None, self.routing, max_model_len)
        first = ""
        for used in range(self.gpus, 0, -1):  # all the GPUs; where no deployment of them fits, the most that do
            self.choices = layout_choices(used)
            lenient = [Deployment(engine, r, lay.tp, lay.ep, BLOCK_SIZES[0], BATCHED_TOKENS[0], MAX_SEQS[0], 0)
                       for r, lay in self.choices]
            self.choice_reasons = [why_invalid_deployment(self.model, d, max_model_len) or self._unpriced(d.layout)
                                   for d in lenient]
            self._choice_mask = np.array([not r for r in self.choice_reasons], dtype=bool)
            first = first or "; ".join(self.choice_reasons)
            if self._choice_mask.any():
                break
        else:
            fewer = " (nor on fewer)" if self.gpus > 1 else ""
            more = "more --gpus" if self.gpus < MAX_GPUS else (
                "a lighter checkpoint: an fp8 or quantized config.json (or a spec with \"dtype_bytes\": 1); one host "
                f"has at most {MAX_GPUS} GPUs")
            fix = ("; pass a smaller --max-model-len (the longest prompt + output you serve) or " + more
                   if "-token request" in first else "; give " + more if "weights" in first else "")
            raise ValueError(f"{self.model.name} fits no deployment on {self.gpus} GPUs{fewer} with {engine}: "
                             + first + fix)
        self.used_gpus = used  # the GPUs the choices use: all of them unless no deployment of all of them fits
        self.unfit_reasons = first if used < self.gpus else ""  # why none on all of them does
        self.action_space = gym.spaces.MultiDiscrete([len(self.choices), *(len(g) for g in self.grids)])
        self.observation_space = gym.spaces.Box(-CLIP, CLIP, (len(FEATURES) + 1,), np.float32)
        self._memo: dict[tuple[float, Any], dict[str, Any]] = {}

    def _refuse_unfit(self) -> None:
        """Replicas count here, and fewer GPUs than given (3 x TP1 on 3 GPUs): __init__ checks its own choices."""

    def _unpriced(self, lay: Layout) -> str:
        """Why the collectives table cannot price the layout ('' when it can): a group of n GPUs needs its n-GPU
        rows (the prior and the measurement hold 2, 4 and 8)."""
        for op, n in (("all_reduce", lay.tp), ("all_to_all", lay.ep)):
            if n > 1 and not self.pricer.table.has(op, n):
                return (f"{lay}: the collectives table has no {op} on {n} GPUs (it holds {self.pricer.table.gpu_counts}"
                        f"); measure them: python3 benchmarks/multigpu/run_collectives.py --gpus {n} --out DIR")
        return ""

    def _why(self, model: Any, dep: Any, max_model_len: int) -> str:
        """'' when the env replays `dep`, else why: a (replicas, layout) outside its choices or masked, or knobs
        whose memory does not fit (deploy.why_invalid_deployment)."""
        if (dep.replicas, dep.layout) not in self.choices:
            return f"{dep.layout_name} is not a deployment on {self.used_gpus} GPUs (plan's choices here)"
        why = self.choice_reasons[self.choices.index((dep.replicas, dep.layout))]
        return why or self._why_deployment(model, dep, max_model_len)

    def action_masks(self) -> np.ndarray:
        return np.concatenate([self._choice_mask, *(np.ones(len(g), bool) for g in self.grids)])

    def deployment_of(self, action: Any) -> Any:
        a = [int(x) for x in np.asarray(action).reshape(-1)]
        if len(a) != 5 or any(not 0 <= x < n for x, n in zip(a, self.action_space.nvec)):
            raise ValueError(f"action {action!r} is outside MultiDiscrete({list(self.action_space.nvec)})")
        r, lay = self.choices[a[0]]
        bs, mbt, seqs, gm = (g[i] for g, i in zip(self.grids, a[1:]))
        return self._Deployment(self.engine, r, lay.tp, lay.ep, bs, mbt, seqs, gm)

    def action_of_deployment(self, dep: Any) -> np.ndarray:
        """The action of a deployment on the grids (KeyError-free: ValueError naming the knob off the grid)."""
        try:
            i = self.choices.index((dep.replicas, dep.layout))
            rest = [g.index(v) for g, v in zip(self.grids, (dep.block_size, dep.max_batched_tokens, dep.max_seqs,
                                                            dep.graph_max))]
        except ValueError as exc:
            raise ValueError(f"{dep.name} is not on the env's knob grids {self.grids}") from exc
        return np.array([i, *rest])

    def _features(self, start_s: float) -> np.ndarray:
        base = super()._features(start_s)
        tr = self.trace
        lo, hi = np.searchsorted(tr.arrival_s, [start_s - self.context_s * self.rate_scale, start_s])
        per_gpu = (hi - lo) / self.context_s / self.gpus / 4.0
        return np.clip(np.append(base, np.float32(per_gpu)), -CLIP, CLIP).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """As ServingTPEP-v0; a drawn start moves to the next arrival (bursty traces idle longer than a window)."""
        obs, info = super().reset(seed=seed, options=options)
        if not (options and "start_s" in options):
            arr = self.trace.arrival_s
            i = int(np.searchsorted(arr, self.start_s))
            if i < len(arr) and arr[i] <= self._range[1]:
                self.start_s = float(arr[i])
                self._obs = self._features(self.start_s)
                obs, info["start_s"] = self._obs.copy(), self.start_s
        return obs, info

    def window(self) -> Any:
        t0 = self.start_s - self.warmup_s * self.rate_scale
        return slice_window(self.trace, t0, self.start_s + self.window_s * self.rate_scale, self.rate_scale)

    def serve_deployment(self, dep: Any) -> dict[str, Any]:
        key = (self.start_s, dep)
        hit = self._memo.get(key)
        if hit is None:
            requests = self.window()
            hit = self.pricer.serve(requests, dep, *self.slo, span_s=self.warmup_s + self.window_s)
            hit["offered_req_per_s"] = len(requests.arrival_s) / (self.warmup_s + self.window_s)
            self._memo[key] = hit
        return dict(hit)

    def step(self, action: Any):
        dep = self.deployment_of(action)
        a0 = int(np.asarray(action).reshape(-1)[0])
        if not self._choice_mask[a0]:
            raise ValueError(f"action {action!r} ({dep.layout_name}) is masked: {self.choice_reasons[a0]}")
        why = self._why(self.model, dep, self.pricer.max_model_len)
        if why:
            info = {"invalid": why, "deployment": dep.to_dict(), "start_s": self.start_s}
            self._last = info
            return self._obs.copy(), 0.0, True, False, info
        info = self.serve_deployment(dep)
        reward = info["goodput_req_per_s"] / max(info["offered_req_per_s"], 1e-9)
        info.update(start_s=self.start_s, action_mask=self.action_masks())
        self._last = info
        return self._obs.copy(), float(reward), True, False, info
