"""The time of one engine step on G GPUs under a Layout, and the serving simulator that uses it.

Per layer of a step (kernel_gym.parallel.layout says which shapes each GPU runs):

    prefill attention + decode attention at the busiest data-parallel rank's shapes (heads / tp)
  + fused MoE at the busiest GPU's shape (EP: the GPU whose experts received the most token-slots of the step's
    sampled routing, so the EP load imbalance is in the kernel time)
  + collectives from the measured table: 2 all-reduces over tp ranks (after attention, after the MoE) and 2
    all-to-alls over ep ranks (dispatch, combine)

Kernel times are the fastest config the backend answers for each sharded shape (the deployment runs tuned kernels;
kernel_gym's dispatch table approximates that oracle), measured on one GPU. A shard the data has no rows for is, with
`estimate_missing`, priced from the same model's unsharded shape scaled by the roofline ratio of the two shapes (a
labelled estimate), else refused with the command that measures it. Every second is booked as measured or estimated
(`StepPricer.report`), like Serving-v0's estimated share.

`ParallelSimulator` is traffic.simulator.Simulator with that pricing: the untuned ops per GPU (ceil(T / ep) tokens at
heads / tp), the KV pool of the layout, configs precompiled at launch (no compile stalls).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from kernel_gym.dispatch.rules import fastest
from kernel_gym.kernels import get_family, profiles
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.measure import resolve_backend
from kernel_gym.measure.coverage import cover
from kernel_gym.measure.roofline import DEFAULT_VOCAB, dense_step_s, kernel_roofline, op_s
from kernel_gym.measure.types import is_estimated
from kernel_gym.parallel.collectives import CollectiveTable, resolve_table
from kernel_gym.parallel.layout import (
    Layout,
    attention_spec,
    decode_shard,
    moe_shard,
    pool_memory_bytes,
    prefill_shard,
    why_invalid,
)
from kernel_gym.traffic.routing import uniform_for
from kernel_gym.traffic.simulator import (
    GPU_MEMORY_UTILIZATION,
    H200_MEMORY_BYTES,
    KERNELS,
    KVLayout,
    SimResult,
    Simulator,
)

PLAN_COMMAND = "python3 benchmarks/multigpu/run_parallel_replay.py plan --model MODEL --gpus G --out plan.json"
GRAPH_MODES = ("tokens", "decode")
# Eager (no CUDA graph) steps: kernel launches per layer (norms, QKV / output GEMMs, rope, attention, router, top-k,
# MoE align, two expert GEMMs, activation, sum, collectives) and the host's cost per launch. Assumptions, not
# measurements of this project (docs/parallelism.md): they price the CUDA-graph knob, never a kernel.
LAUNCHES_PER_LAYER = 16
EAGER_LAUNCH_S = 5e-6
PARTS = (*KERNELS, "all_reduce", "all_to_all")


class ShardUnmeasured(LookupError):
    """A sharded kernel shape without data (and no estimate asked for)."""


class StepPricer:
    """Per-layer seconds of each part of a step under one layout, with the measured / estimated bookkeeping."""

    def __init__(self, spec: Any, layout: Layout, backend: Any = "recorded", table: Any = None,
                 estimate_missing: bool = True, dtype: str = "bfloat16", kernels_only: bool = False,
                 roofline_missing: bool = False) -> None:
        """kernels_only: price kernels without a collectives table (benchmarks/multigpu/run_live_parallel.py's plan
        step).
        roofline_missing: a shape with no data even at the model's unsharded shape is priced at its roofline time
        (estimated) instead of refused (the deployment plan; `roofline_priced` names the kernels it happened to)."""
        self.roofline_missing = roofline_missing
        self.roofline_priced: set[str] = set()
        self.spec, self.layout, self.dtype = spec, layout, dtype
        self.table: CollectiveTable | None = None if layout.gpus == 1 or kernels_only else resolve_table(table)
        if self.table is not None:
            for op, deg in (("all_reduce", layout.tp), ("all_to_all", layout.ep)):
                if deg > 1:
                    self.table._curve(op, deg)  # refuses a GPU count the table lacks, before any replay
        self.backend = cover(resolve_backend(backend))
        self.estimate_missing = estimate_missing
        self.attn = attention_spec(spec, layout)
        self._best: dict[tuple[str, Any, Any], tuple[Config, float, bool] | None] = {}
        self._priced: dict[tuple[str, Any, Any], tuple[Config, float, bool]] = {}
        self.seconds = dict.fromkeys(PARTS, 0.0)  # per layer, summed over steps
        self.estimated = dict.fromkeys(PARTS, 0.0)
        self.prior_s = 0.0  # seconds priced from a labelled prior table (collectives), inside self.seconds
        self.imbalance: list[float] = []

    def reset_counts(self) -> None:
        """Zero the bookkeeping, keep the memoised prices (a new replay under the same layout)."""
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.estimated = dict.fromkeys(PARTS, 0.0)
        self.prior_s = 0.0
        self.imbalance = []

    # ---- kernels ----

    def _fastest(self, kernel: str, wl: Any, kv: KVLayout | None) -> tuple[Config, float, bool] | None:
        """(config, seconds, estimated) of the fastest config the backend answers "ok" for wl (the oracle's rule,
        dispatch.rules.fastest, over the valid answered configs on the KV layout `kv`)."""
        key = (kernel, wl, kv)
        if key not in self._best:
            space = get_family(kernel).space
            timed = {}
            for c in self.backend.available_configs(kernel, wl):
                if kv is not None and (c.get("PAGE_SIZE") != kv.page_size or c.get("LAYOUT") != kv.layout):
                    continue
                if not space.is_valid(c, wl):
                    continue
                m = self.backend.measure(kernel, wl, c)
                if m.ok and m.median_ms:
                    timed[c] = m
            best = fastest(timed, lambda c: timed[c].median_ms * 1e-3) if timed else None
            self._best[key] = None if best is None else (best, timed[best].median_ms * 1e-3,
                                                         is_estimated(timed[best].source))
        return self._best[key]

    def _unsharded(self, kernel: str, wl: Any) -> Any:
        """The one-GPU shape of the same model doing the same rows: the source of an estimate."""
        s = self.spec
        if not profiles.profile(kernel).moe:  # attention: the model's own heads (its profile's fixed fields)
            return replace(wl, **{f: getattr(s, f) for f in profiles.profile(kernel).fixed_fields})
        rows = wl.num_tokens * wl.top_k
        return MoEWorkload(max(1, -(-rows // s.top_k)), s.num_experts, s.top_k, s.hidden, s.intermediate, wl.skew,
                           wl.dtype)

    def price(self, kernel: str, wl: Any, kv: KVLayout | None = None) -> tuple[Config, float, bool]:
        """(config, seconds per call, estimated) of a sharded shape."""
        key = (kernel, wl, kv)
        hit = self._priced.get(key)
        if hit is not None:
            return hit
        best = self._fastest(kernel, wl, kv)
        src = self._unsharded(kernel, wl)
        if self.estimate_missing and src != wl and (best is None or self.backend.is_proxied(kernel, wl)):
            # the shard's own rows do not bracket it: the same model's unsharded shape, when its rows do, scaled by
            # the roofline ratio is the closer estimate (the proxy rule never scales a time down)
            base = self._fastest(kernel, src, kv)
            if base is not None and (best is None or not self.backend.is_proxied(kernel, src)):
                ratio = op_s(*kernel_roofline(kernel, wl)) / op_s(*kernel_roofline(kernel, src))
                best = (base[0], base[1] * ratio, True)
        if best is None and self.estimate_missing and self.roofline_missing:
            # no row of this model's shape at all (e.g. a head layout the prefill data never measured): the
            # roofline time of the shape, labelled estimated, as the simulator prices its untuned ops
            best = (get_family(kernel).default_config(wl), op_s(*kernel_roofline(kernel, wl)), True)
            self.roofline_priced.add(kernel)
        if best is None:
            raise ShardUnmeasured(
                f"{kernel}: no data for the {self.layout} shard {wl.key()}"
                + ("" if self.estimate_missing else " (estimate_missing=False)")
                + f"; measure the layout's shards on one GPU: {PLAN_COMMAND}, then python3 scripts/collect.py "
                "--plan plan.json --kernels fused_moe"
            )
        self._priced[key] = best
        return best

    def _book(self, part: str, seconds: float, estimated: bool, weight: float = 1.0) -> float:
        """Count `seconds` of one call per layer of its part; `weight`: the call's layers over the part's (a windowed
        layer's attention call: ModelSpec.n_mixer_layers / n_attention_layers)."""
        self.seconds[part] += seconds * weight
        if estimated:
            self.estimated[part] += seconds * weight
        return seconds

    def prefill_s(self, seq_lens: tuple[int, ...], kv: KVLayout, weight: float = 1.0) -> tuple[Config, float]:
        c, t, est = self.price("prefill_attention", prefill_shard(self.spec, self.layout, seq_lens, self.dtype))
        return c, self._book("prefill_attention", t, est, weight)

    def decode_s(self, batch: int, context_len: int, kv: KVLayout, weight: float = 1.0) -> tuple[Config, float]:
        wl = decode_shard(self.spec, self.layout, batch, context_len, self.dtype)
        c, t, est = self.price("decode_attention", wl, kv)
        return c, self._book("decode_attention", t, est, weight)

    def moe_s(self, num_tokens: int, skew: float, slot_counts: np.ndarray | None,
              graphed: bool = True) -> tuple[Config | None, float]:
        """The busiest GPU's fused MoE plus every collective of the layer (they sit on the MoE's path). graphed=False:
        a step outside the engine's CUDA graphs, whose all-reduce runs in eager mode (`all_reduce_eager` when the
        table has it: the engines' custom all-reduce is slower outside a graph)."""
        sh = moe_shard(self.spec, self.layout, num_tokens, skew, slot_counts, self.dtype, self.spec.activation_bytes)
        total, cfg = 0.0, None
        if sh.workload is not None:
            cfg, t, est = self.price("fused_moe", sh.workload)
            total += self._book("fused_moe", t, est)
        if self.layout.ep > 1:
            self.imbalance.append(sh.imbalance)
        for op, deg, nbytes in (("all_reduce", self.layout.tp, sh.all_reduce_bytes),
                                ("all_to_all", self.layout.ep, sh.all_to_all_bytes)):
            if nbytes:  # two per layer: after attention and after the MoE / dispatch and combine
                top = "all_reduce_eager" if op == "all_reduce" and not graphed and \
                    self.table.has("all_reduce_eager", deg) else op
                t = (self.all_reduces_per_moe_layer if op == "all_reduce" else 2) * self.table.time_s(top, deg, nbytes)
                total += self._book(op, t, not self.table.measured_at(top, deg, nbytes))
                if self.table.is_prior:
                    self.prior_s += t
        return cfg, total

    def report(self) -> dict[str, float]:
        """Per-layer seconds per part summed over the steps so far, and the estimated share of each and of all."""
        total = sum(self.seconds.values())
        out = {f"{p}_s": self.seconds[p] for p in PARTS}
        out.update({f"{p}_estimated_share": self.estimated[p] / self.seconds[p] if self.seconds[p] else 0.0
                    for p in PARTS})
        out["step_parts_s"] = total
        out["estimated_share"] = sum(self.estimated.values()) / total if total else 0.0
        out["collective_share"] = (self.seconds["all_reduce"] + self.seconds["all_to_all"]) / total if total else 0.0
        out["prior_s"] = self.prior_s
        out["prior_share"] = self.prior_s / total if total else 0.0  # of the kernel + collective seconds
        imb = np.asarray(self.imbalance) if self.imbalance else np.ones(1)
        out["ep_imbalance_mean"] = float(imb.mean())
        out["ep_imbalance_p99"] = float(np.percentile(imb, 99))
        return out

    @property
    def all_reduces_per_moe_layer(self) -> float:
        """TP all-reduces charged with each MoE call: the engines all-reduce after every layer's mixer and after every
        MLP, MoE or dense, and the simulator charges this part per MoE layer, so a step's (num_layers + MLP layers)
        all-reduces are spread over its MoE layers (2 where every layer is attention + MoE)."""
        spec = self.spec
        if getattr(spec, "uniform_layers", True):
            return 2
        return (spec.num_layers + spec.n_moe_layers + spec.n_dense_layers) / spec.n_moe_layers

    def part_layers(self) -> dict[str, int]:
        """Layers each part runs in: the attention kernels the attention layers, fused MoE the MoE layers, and the
        collectives, booked with the MoE (moe_s), the MoE layers too (ParallelSimulator charges them so)."""
        moe = profiles.layers_of("fused_moe", self.spec)
        return {p: profiles.layers_of(p, self.spec) if p in KERNELS else moe for p in PARTS}

    def report_all_layers(self) -> dict[str, float]:
        """report() over all the model's layers: each part's seconds times the layers it runs in (part_layers), the
        shares of those sums. A spec whose every layer is attention + MoE: every seconds figure x num_layers."""
        rep = self.report()
        if getattr(self.spec, "uniform_layers", True):
            layers = self.spec.num_layers
            return {k: v * layers if k.endswith("_s") and not k.startswith("ep_") else v for k, v in rep.items()}
        n = self.part_layers()
        secs = {p: self.seconds[p] * n[p] for p in PARTS}
        est = sum(self.estimated[p] * n[p] for p in PARTS)
        total = sum(secs.values())
        prior = self.prior_s * n["all_reduce"]
        rep.update({f"{p}_s": secs[p] for p in PARTS})
        rep["step_parts_s"] = total
        rep["estimated_share"] = est / total if total else 0.0
        rep["collective_share"] = (secs["all_reduce"] + secs["all_to_all"]) / total if total else 0.0
        rep["prior_s"] = prior
        rep["prior_share"] = prior / total if total else 0.0
        return rep


class _Unused:
    """The base Simulator's chooser and timer slots: ParallelSimulator prices every kernel itself."""

    precompiled = ()

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        raise RuntimeError("ParallelSimulator prices kernels through its StepPricer")

    def time_s(self, kernel: str, workload: Any, config: Config) -> float:
        raise RuntimeError("ParallelSimulator prices kernels through its StepPricer")


class _PerGPUDense(dict):
    """The base Simulator's memo of untuned-op seconds per (tokens, logits), answering for one GPU of the layout:
    ceil(T / ep) tokens of its data-parallel rank at heads / tp."""

    def __init__(self, spec: Any, ep: int, vocab: int) -> None:
        super().__init__()
        self.spec, self.ep, self.vocab = spec, ep, vocab

    def get(self, key: tuple[int, int], default: Any = None) -> float:
        hit = dict.get(self, key)
        if hit is None:
            tokens, logits = key
            hit = self[key] = dense_step_s(self.spec, -(-tokens // self.ep), -(-logits // self.ep), self.vocab)
        return hit


class ParallelSimulator(Simulator):
    """The serving simulator on `layout.gpus` GPUs (module docstring). Sampled routing per step
    (`routing.loads(clock, tokens)`) feeds the EP imbalance."""

    def __init__(self, spec: Any, requests: Any, layout: Layout, pricer: StepPricer | None = None,
                 routing_profile: Any = None, *, backend: Any = "recorded", table: Any = None,
                 gpu_memory_bytes: float = H200_MEMORY_BYTES,
                 gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION, vocab_size: int = DEFAULT_VOCAB,
                 graph: tuple[str, int] | None = None, **kw: Any) -> None:
        """graph: (mode, max size) of the engine's CUDA graphs; None = every step graphed (the pricing before the
        knob existed). mode "tokens": steps of up to max tokens replay a graph (vLLM's piecewise graphs cover mixed
        prefill + decode steps); "decode": decode-only steps of up to max requests (SGLang's graphs); max 0 = eager.
        A step outside a graph pays EAGER_LAUNCH_S per kernel launch not hidden behind GPU work, and its
        all-reduces run eager."""
        if graph is not None and (graph[0] not in GRAPH_MODES or int(graph[1]) < 0):
            raise ValueError(f"graph must be (mode in {GRAPH_MODES}, max size >= 0), got {graph!r}")
        self.graph = graph
        self._step_prefill = False
        self._step_layer_s = 0.0
        why = why_invalid(spec, layout, layout.gpus, gpu_memory_bytes, gpu_memory_utilization)
        if why:
            raise ValueError(why)
        self.spec, self.layout = spec, layout
        self.pricer = pricer or StepPricer(spec, layout, backend, table)
        routing = routing_profile if routing_profile is not None else uniform_for(spec)
        mem = pool_memory_bytes(spec, layout, gpu_memory_bytes, gpu_memory_utilization)
        super().__init__(attention_spec(spec, layout), requests, _Unused(), _Unused(), routing,
                         gpu_memory_bytes=mem, gpu_memory_utilization=gpu_memory_utilization,
                         vocab_size=vocab_size, compile_s=lambda kernel, config: 0.0, **kw)
        self._dense_memo = _PerGPUDense(self.pricer.attn, layout.ep, vocab_size)
        self.state_ranks = layout.ep

    def _kernel_s(self, kernel: str, key: tuple, stall: list) -> float:
        p = self.pricer
        weight = self.call_layers / self.spec.n_attention_layers  # a windowed layer's call is booked per its layers
        if kernel == "prefill_attention":
            cfg, t = p.prefill_s(key[1], self.kv_layout, weight)
            self._step_prefill = True
            self._step_layer_s += t
        elif kernel == "decode_attention":
            cfg, t = p.decode_s(key[1], key[2], self.kv_layout, weight)
            self._step_layer_s += t
        else:  # the step's last call: it decides whether the step ran inside a CUDA graph
            tokens = key[1]
            graphed = self._graphed(tokens)
            counts = self.routing.loads(self.clock, tokens) if self.layout.ep > 1 else None
            cfg, t = p.moe_s(tokens, key[2], counts, graphed)
            if not graphed:  # launch-bound layers: the host's launches not hidden behind the layer's GPU time
                per_call = self.spec.num_layers / profiles.layers_of("fused_moe", self.spec)  # every layer launches
                t += max(0.0, per_call * LAUNCHES_PER_LAYER * EAGER_LAUNCH_S - (self._step_layer_s + t))
            self._step_prefill, self._step_layer_s = False, 0.0
        if cfg is not None:
            self.configs_used[kernel][cfg] += 1
        return t

    def _graphed(self, tokens: int) -> bool:
        if self.graph is None:
            return True
        mode, size = self.graph
        if mode == "tokens":
            return tokens <= size
        return not self._step_prefill and tokens <= size


def arrival_span_s(arrival_s: Any, finish_s: Any) -> float:
    """Seconds the arrivals cover: (last - first) x n / (n - 1), the span plus one mean gap, so that n requests at
    rate r give n / r. One request, or all at one instant: until the last finishes (no rate to read)."""
    arr = np.asarray(arrival_s, dtype=float)
    n = len(arr)
    if n >= 2 and arr[-1] > arr[0]:
        return float(arr[-1] - arr[0]) * n / (n - 1)
    fin = np.asarray(finish_s, dtype=float)
    return max(float(np.nanmax(fin)) - float(arr[0]), 1e-12) if n and not np.isnan(fin).all() else math.inf


def goodput(result: SimResult, ttft_slo_s: float, tpot_slo_s: float, span_s: float | None = None) -> dict[str, float]:
    """Requests that finished within both SLOs (TTFT <= ttft_slo_s; TPOT <= tpot_slo_s, one-token requests pass on
    TTFT alone): per second of the arrivals' span, their output tokens per second, and their share of requests.

    Per second of ARRIVALS (last - first arrival, plus one mean gap), not until the last request finishes: every
    request here meets its SLO or not by itself, so a deployment that serves all of them within it has the offered
    rate as goodput. Counting the drain of the window's longest request would rank two such deployments by how fast
    that one request ends (a 10-s window with a 16-s drain more than halves the figure). `span_s`: the window's
    length where the caller knows it (the environments do), else read from the arrivals."""
    done = ~np.isnan(result.finish_s)
    ttft_ok = result.ttft_s <= ttft_slo_s
    tpot = result.tpot_s
    tpot_ok = np.isnan(tpot) | (tpot <= tpot_slo_s)
    good = done & ttft_ok & tpot_ok
    span = float(span_s) if span_s else arrival_span_s(result.arrival_s, result.finish_s)
    return {"goodput_req_per_s": float(good.sum()) / span,
            "goodput_tokens_per_s": float(result.generated_tokens[good].sum()) / span,
            "slo_attainment": float(good.mean()),
            "ttft_slo_s": float(ttft_slo_s), "tpot_slo_s": float(tpot_slo_s)}


def serve(spec: Any, requests: Any, layout: Layout, *, backend: Any = "recorded", table: Any = None,
          routing: Any = None, ttft_slo_s: float = 2.0, tpot_slo_s: float = 0.1, estimate_missing: bool = True,
          pricer: StepPricer | None = None, span_s: float | None = None, **sim_kwargs: Any) -> dict[str, Any]:
    """Replay `requests` to completion under `layout`: the simulator's summary, goodput at the SLO, and the pricer's
    report (seconds per part, estimated shares, EP imbalance). A `pricer` of that layout is reused (its prices
    memoised, its counts zeroed)."""
    if pricer is None:
        pricer = StepPricer(spec, layout, backend, table, estimate_missing)
    elif pricer.layout != layout:
        raise ValueError(f"pricer is for {pricer.layout}, not {layout}")
    pricer.reset_counts()
    sim = ParallelSimulator(spec, requests, layout, pricer, routing, **sim_kwargs)
    res = sim.run()
    rep = pricer.report_all_layers()
    busy = res.summary["busy_s"]
    # of all the step time (kernels, collectives, untuned ops, overhead): what rests on the labelled prior
    rep["prior_step_share"] = rep["prior_s"] / busy if busy > 0 else 0.0
    keep = ("tokens_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "finished", "requests",
            "preemptions", "kv_pages", "busy_s")
    return {"layout": layout.name, "tp": layout.tp, "ep": layout.ep, "gpus": layout.gpus,
            **{k: res.summary[k] for k in keep}, **goodput(res, ttft_slo_s, tpot_slo_s, span_s), **rep}
