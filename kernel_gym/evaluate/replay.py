"""Replay evaluation: a trace through the serving simulator with each policy a user could run, side by side.

`kernel-gym replay --trace azure-conv --model mixtral-8x7b --policies default,static,vllm-table,autotune,random,tpe,
learned,oracle --json out/replay.json` replays the trace once per policy (kernel times from the backend: the recorded
H200 store by default) and writes {"trace", "model", "policies": {NAME: {tokens_per_s, tuned_kernel_s, tuning_gpu_s,
ttft_p50_s, ttft_p99_s, tpot_p50_s, tpot_p99_s, ...}}}, a markdown table (.md) and plots (.png: tokens/s over time,
config switches) beside the JSON, and logs all of it to MLflow (the reporting and the check of the project's targets:
replay_report.py). The baselines are defined in dispatch/baselines.py; "learned" is the exported policy served through
the Dispatcher (no measurement at serving time).

A policy that offers `choose_within` (the learned Dispatcher) is given the configs the data holds for the workload
(valid, on the KV layout in force, answered "ok" by the backend: a data-availability mask as in training, no timing)
and keeps its choice inside them (nearest config in knob space when its bucket's config is not among them; counted in
`snapped`). A config the backend cannot answer for a workload still falls back to the family's default config, as a
dispatcher would, and is counted in `fallbacks`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from kernel_gym.dispatch.baselines import (
    BASELINE_NAMES,
    SEARCH_BUDGET,
    OraclePolicy,
    Policy,
    make_baselines,
    unmeasured_kernels,
    unmeasured_message,
)
from kernel_gym.dispatch.rules import fastest
from kernel_gym.evaluate.replay_report import DEFAULT_ROUTING, log_mlflow, markdown, write_outputs
from kernel_gym.kernels import profiles
from kernel_gym.kernels.space import Config
from kernel_gym.measure.coverage import CoveredBackend
from kernel_gym.measure.types import MEASURED_SOURCES, is_estimated  # noqa: F401 - MEASURED_SOURCES re-exported
from kernel_gym.traffic.simulator import DEFAULT_KV, KERNELS, BackendTimer, KVLayout, SimResult, Simulator

POLICY_NAMES = ("default", "static", "vllm-table", "autotune", "random", "tpe", "learned", "oracle")
METRICS = ("tokens_per_s", "tuned_kernel_s", "tuned_kernel_s_same_traffic", "tuning_gpu_s", "ttft_p50_s",
           "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")


# the simulator's three, plus the kernels it charges a stand-in for when untimed (prefix chunks: "auto"/"prefix")
CHOSEN_KERNELS = (*KERNELS, *[k for k, p in profiles.PROFILES.items() if p.stand_in and k not in KERNELS])


def _stands_in(kernel: str) -> bool:
    p = profiles.get(kernel)
    return p is not None and bool(p.stand_in)


def _on_layout_only(kernel: str) -> bool:
    """A kernel whose configs carry the KV layout but which choosers do not move onto it (prefix_prefill): its
    candidates are the configs on the layout in force (decode's are moved there: rules.follow_kv)."""
    return profiles.reads_kv(kernel) and not profiles.follows_kv(kernel)


class GuardedChooser:
    """Wraps a policy: answers only with configs the backend can time (else the default, else the slowest available
    one), accumulates tuned-kernel seconds per kernel, and optionally records per-step workloads for the live check.

    prefix_prefill (the simulator's chunks over a cached prefix): a policy built before the kernel (no choice for it:
    KeyError, AttributeError, NotImplementedError) is served the family default, as an untuned deployment runs it
    (counted in `prefix_untuned`); a config on another KV layout is moved onto the layout in force (the oracle: the
    fastest config there), since the kernel reads the cache as it is laid out. `peek` answers without charging (the
    simulator asks it before choosing the prefix kernel), and `standin` counts the stand-in prefill time of chunks
    with a prefix as estimated (the simulator charges it when the data has no prefix_prefill time)."""

    def __init__(self, policy: Any, backend: Any, num_layers: int, record_steps: int = 0,
                 kernel_layers: dict[str, int] | None = None) -> None:
        """kernel_layers: per kernel, the layers that call it where they differ from num_layers (a model whose layers
        are not all attention + MoE: profiles.layers_of); the seconds it sums are per call x those layers."""
        from kernel_gym.dispatch.baselines import Oracle

        self.policy = policy
        self.backend = backend
        self.layers = num_layers
        self.kernel_layers = {k: n for k, n in (kernel_layers or {}).items() if n != num_layers}
        self.kv_layout = getattr(policy, "kv_layout", None)
        self.precompiled = set(getattr(policy, "precompiled", ()) or ())
        self._oracle = Oracle(backend)
        self._ok: dict[tuple, tuple[Config, float]] = {}
        self._avail: dict[tuple, list[Config]] = {}
        self._within = getattr(policy, "choose_within", None)
        self.snapped = 0
        self.fallbacks = 0
        self.layout_fallbacks = 0
        self.prefix_untuned = 0  # prefix_prefill workloads the policy had no config for (served the default)
        self.kernel_s = dict.fromkeys(CHOSEN_KERNELS, 0.0)
        self.estimated_s = dict.fromkeys(CHOSEN_KERNELS, 0.0)  # the part of kernel_s whose times are not measured ones
        self.standin_s = 0.0  # prefill_attention seconds standing in for chunks with a prefix (all in estimated_s)
        self.calls: dict[tuple[str, Any, int], int] = {}  # (kernel, workload, layers: 0 = the kernel's) -> calls
        # (kernel, workload key) -> (workload, configs): valid choices the backend could not time (each fell back);
        # measurement_plans.untimed_plan turns them into a `collect --plan`
        self.untimed: dict[tuple[str, str], tuple[Any, set[str]]] = {}
        # per kernel, whether the last call resolved was served a fallback (the policy's config untimed there): the
        # simulator then prices no more than the fallback's time (Simulator._decode_s)
        self.last_fallback: dict[str, bool] = {}
        self.last_choice: dict[str, Config] = {}  # per kernel, the policy's own config in the last call resolved
        self.record_steps = record_steps
        self.steps: list[dict[str, Any]] = []
        self.sim: Any = None

    def _layers(self, kernel: str) -> tuple[int, int]:
        """(layers the call being chosen runs in, its key in `calls`: 0 for the kernel's own layers): a windowed
        layer's attention call (Simulator.window_call) runs in the windowed layers."""
        sim = self.sim
        if sim is not None and getattr(sim, "window_call", False):
            return sim.call_layers, sim.call_layers
        return self.kernel_layers.get(kernel, self.layers), 0

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        hit = self.resolve(kernel, workload, kv)
        layers, which = self._layers(kernel)
        self.kernel_s[kernel] += hit[1] * layers
        if hit[2]:
            self.estimated_s[kernel] += hit[1] * layers
        ckey = (kernel, workload, which)
        self.calls[ckey] = self.calls.get(ckey, 0) + 1
        if self.record_steps and len(self.steps) < self.record_steps * len(KERNELS):
            self.steps.append({"t_s": self.sim.clock if self.sim is not None else 0.0, "kernel": kernel,
                               "workload": workload.key(), "config": dict(hit[0]), "predicted_s": hit[1]})
        return hit[0]

    def peek(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        """The config `choose` would serve, without charging it (LookupError: none can be timed on this layout)."""
        return self.resolve(kernel, workload, kv)[0]

    def standin(self, kernel: str, workload: Any, kv: KVLayout) -> None:
        """The call just chosen stands in for chunks with a prefix (no prefix_prefill time): its seconds are an
        estimate of those chunks, whatever its own source."""
        _, seconds, estimated = self.resolve(kernel, workload, kv)
        layers = self._layers(kernel)[0]
        self.standin_s += seconds * layers
        if not estimated:
            self.estimated_s[kernel] += seconds * layers

    def price(self, calls: dict[tuple[str, Any], int], kv: KVLayout) -> float | None:
        """Seconds of kernel time this policy's choices take on a given multiset of calls (x layers): the
        tuned-kernel time on identical traffic, so policies are compared on the same workloads. None when some
        call cannot be timed on this policy's KV layout (no comparable number)."""
        total, own = 0.0, 0.0  # seconds per layer of the kernels every layer calls; all seconds of the others
        for (k, w, layers), n in calls.items():
            try:
                t = n * self.resolve(k, w, kv)[1]
            except LookupError:
                return None
            if layers:  # a windowed layer's call: its own layer count
                own += t * layers
            elif k in self.kernel_layers:
                own += t * self.kernel_layers[k]
            else:
                total += t
        return total * self.layers + own

    def available(self, kernel: str, workload: Any, kv: KVLayout) -> list[Config]:
        """Configs the data holds for the workload: listed by the backend, valid by the family's rules, on the KV
        layout in force (decode). Availability only: no time is read, so the learned path stays zero-measurement."""
        key = (kernel, workload, kv if profiles.reads_kv(kernel) else None)
        out = self._avail.get(key)
        if out is None:
            from kernel_gym.kernels import get_family

            space = get_family(kernel).space
            out = self._avail[key] = [
                c for c in self.backend.available_configs(kernel, workload)
                if (key[2] is None or (c["PAGE_SIZE"] == kv.page_size and c["LAYOUT"] == kv.layout))
                and space.is_valid(c, workload)]
        return out

    def resolve(self, kernel: str, workload: Any, kv: KVLayout) -> tuple[Config, float, bool]:
        """(config served, its time in s, whether that time is estimated rather than measured): the policy's choice
        (inside the available configs when the policy takes a mask), or the fallback when the backend cannot time it."""
        self.last_fallback[kernel] = False
        if _stands_in(kernel):
            return self._resolve_stand_in(kernel, workload, kv)
        if self._within is not None:
            cfg = self._within(kernel, workload, kv, self.available(kernel, workload, kv))
        else:
            cfg = self.policy.choose(kernel, workload, kv)
        key = (kernel, workload, cfg)
        hit = self._ok.get(key)
        if hit is None:
            if self._within is not None and self.policy.choose(kernel, workload, kv) != cfg:
                self.snapped += 1
            hit = self._ok[key] = self._timed(kernel, workload, kv, cfg)
        self.last_fallback[kernel] = hit[0] != cfg
        self.last_choice[kernel] = cfg
        return hit

    def _timed(self, kernel: str, workload: Any, kv: KVLayout, cfg: Config) -> tuple[Config, float, bool]:
        """(config, seconds, estimated) for a choice: itself when the backend times it, else the fallback (the
        default on the layout, else the slowest config the data holds there)."""
        t = self._oracle.time_ms(kernel, workload, cfg)
        out = cfg
        if t is None:
            self.fallbacks += 1
            self._note_untimed(kernel, workload, cfg)
            from kernel_gym.dispatch.rules import fallback_config

            def time_of(c: Config) -> float | None:
                return self._oracle.time_ms(kernel, workload, c)

            if _on_layout_only(kernel):
                cands: Callable[[], list[Config]] = lambda: self.available(kernel, workload, kv)  # noqa: E731
            else:
                cands = lambda: self._oracle.candidates(kernel, workload, kv)  # noqa: E731
            out = fallback_config(self._default(kernel, workload, kv), time_of, cands)
            if out is None:
                raise LookupError(untimeable(kernel, workload, kv))
            t = time_of(out)
        source = self.backend.measure(kernel, workload, out).source
        return out, t * 1e-3, is_estimated(source)

    def _note_untimed(self, kernel: str, workload: Any, cfg: Config) -> None:
        """Keep a choice the data cannot time, when the family's rules accept it there (a refused one is no
        measurement to make)."""
        from kernel_gym.kernels import get_family

        if get_family(kernel).space.is_valid(cfg, workload):
            self.untimed.setdefault((kernel, workload.key()), (workload, set()))[1].add(str(cfg))

    @staticmethod
    def _default(kernel: str, workload: Any, kv: KVLayout) -> Config:
        """The family default on the KV layout in force (prefix_prefill's moved there when valid)."""
        from kernel_gym.dispatch.rules import default_for

        cfg = default_for(kernel, workload, kv)
        if _on_layout_only(kernel) and kv is not None:
            from kernel_gym.kernels import get_family

            moved = cfg.replace(PAGE_SIZE=kv.page_size, LAYOUT=kv.layout)
            if get_family(kernel).space.is_valid(moved, workload):
                return moved
        return cfg

    def _resolve_stand_in(self, kernel: str, workload: Any, kv: KVLayout) -> tuple[Config, float, bool]:
        memo = (kernel, workload, kv)
        hit = self._ok.get(memo)
        if hit is not None:
            return hit
        avail = self.available(kernel, workload, kv)
        timed = [c for c in avail if self._oracle.time_ms(kernel, workload, c) is not None]
        if not timed:  # before any counting: the simulator asks first (peek) and charges the stand-in instead
            raise LookupError(untimeable(kernel, workload, kv))
        try:
            if self._within is not None:
                cfg = self._within(kernel, workload, kv, avail)
            else:
                cfg = self.policy.choose(kernel, workload, kv)
        except (KeyError, AttributeError, NotImplementedError, LookupError):  # a policy built before the kernel
            self.prefix_untuned += 1
            cfg = self._default(kernel, workload, kv)
        if kv is not None and (cfg.get("PAGE_SIZE"), cfg.get("LAYOUT")) != (kv.page_size, kv.layout):
            self.layout_fallbacks += 1
            if getattr(self.policy, "name", "") == "oracle":
                cfg = fastest(timed, lambda c: self._oracle.time_ms(kernel, workload, c))
            else:
                cfg = cfg.replace(PAGE_SIZE=kv.page_size, LAYOUT=kv.layout)
        hit = self._ok[memo] = self._timed(kernel, workload, kv, cfg)
        return hit


@dataclass
class PolicyRun:
    name: str
    result: SimResult
    metrics: dict[str, float]
    steps: list[dict[str, Any]] = field(default_factory=list)
    guard: GuardedChooser | None = None
    kv: KVLayout | None = None


def routing_profile(spec: str, model: Any, seed: int = 0) -> Any:
    """"uniform", "zipf:EXPONENT" or "drift:EXPONENT[:DWELL_S]" for the model's experts; a bare "zipf" or "drift"
    takes 1.2, the default routing's exponent."""
    from kernel_gym.traffic.routing import DriftingHotRouting, UniformRouting, ZipfRouting

    kind, _, rest = spec.partition(":")
    if any(part.strip().lower() in ("nan", "inf", "+inf", "-inf", "infinity") for part in rest.split(":")):
        raise ValueError(f"--routing {spec!r}: give finite numbers, e.g. zipf:1.2")
    try:
        if kind == "uniform":
            return UniformRouting(model.num_experts, model.top_k, seed)
        if kind == "zipf":
            return ZipfRouting(model.num_experts, model.top_k, seed, exponent=float(rest or 1.2))
        if kind == "drift":
            exp, _, dwell = rest.partition(":")
            return DriftingHotRouting(model.num_experts, model.top_k, seed, exponent=float(exp or 1.2),
                                      dwell_s=float(dwell or 60.0))
    except ValueError as exc:
        why = "give numbers, " if "could not convert" in str(exc) else f"{exc}; "
        raise ValueError(f"--routing {spec!r}: {why}e.g. zipf:1.2 or drift:1.2:60") from exc
    raise ValueError(f"--routing {spec!r}: use uniform, zipf:EXPONENT or drift:EXPONENT[:DWELL_S]")


def run_policy(name: str, policy: Policy | Any, model: Any, trace: Any, routing: Any, backend: Any,
               record_steps: int = 0, **sim_kw: Any) -> PolicyRun:
    """Replay the trace under one policy; metrics include the issue's set plus stalls, fallbacks and switches."""
    guard = GuardedChooser(policy, backend, model.num_layers, record_steps,
                           {k: profiles.layers_of(k, model) for k in CHOSEN_KERNELS})
    kv = getattr(policy, "kv_layout", None) or DEFAULT_KV
    sim = Simulator(model, trace, BackendTimer(backend), guard, routing, kv_layout=kv, **sim_kw)
    guard.sim = sim
    if hasattr(policy, "attach"):
        policy.attach(sim)
    res = sim.run()
    s = res.summary
    metrics = {k: float(s[k]) for k in ("tokens_per_s", "tuned_kernel_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                                         "tpot_p99_s", "stall_s", "config_switches", "configs_used", "preemptions",
                                         "sim_time_s", "steps")}
    metrics["tuning_gpu_s"] = float(getattr(policy, "tuning_gpu_s", 0.0))
    metrics["measurements"] = float(getattr(policy, "measurements", 0))
    metrics["fallbacks"] = float(guard.fallbacks)
    metrics["snapped"] = float(guard.snapped)
    metrics["layout_fallbacks"] = float(guard.layout_fallbacks)
    kernel_s, estimated_s = dict(guard.kernel_s), dict(guard.estimated_s)
    if sim.decode_waves:  # --decode-waves: the guard booked the mean-context prices; the wave model moved decode's, and
        # its prices of choices the data cannot time are estimates
        kernel_s["decode_attention"] += s["decode_waves_s"]
        estimated_s["decode_attention"] += s["decode_waves_untimed_s"]
        metrics["decode_waves_s"] = float(s["decode_waves_s"])
        metrics["decode_waves_untimed_s"] = float(s["decode_waves_untimed_s"])
        metrics["decode_waves_sibling_configs"] = float(s["decode_waves_sibling_configs"])
    for k, v in kernel_s.items():
        metrics[f"tuned_kernel_s.{k}"] = v
        metrics[f"estimated_share.{k}"] = min(1.0, estimated_s[k] / v) if v > 0 else 0.0
    total = sum(kernel_s.values())
    metrics["estimated_share"] = min(1.0, sum(estimated_s.values()) / total) if total > 0 else 0.0
    metrics["kv_page_size"] = float(kv.page_size)
    for k in ("prefix_hit_rate", "prefix_hit_tokens", "prefix_block_tokens", "prefix_evicted_blocks"):
        if k in s:  # a trace with hash_ids: the prefix cache's work (Simulator._prefix_summary)
            metrics[k] = float(s[k])
    return PolicyRun(name, res, metrics, guard.steps, guard, kv)


def learned_policy(model: Any, model_uris: Sequence[str] = (), table_path: str | None = None) -> Any:
    """The Dispatcher over a dispatch table: from a file, or exported now from the given (or latest) policies."""
    from kernel_gym.deploy.export import (
        NoPolicyError,
        no_policy_message,
        print_basis_notes,
        stale_dataset,
        stale_line,
        table_from_registry,
    )
    from kernel_gym.dispatch.dispatcher import Dispatcher, DispatchTable

    if not table_path:
        try:
            table = table_from_registry(model, model_uris)
        except NoPolicyError:  # the fixes as replay's own flags name them
            raise NoPolicyError(no_policy_message(model.name, "replay")) from None
        print_basis_notes({k: r for k, r in table.meta.get("rests_on", {}).items() if k in table.kernels})
        return Dispatcher(table)
    from kernel_gym.dispatch.dispatcher import check_table_for

    table = DispatchTable.load(table_path)
    check_table_for(table, model, f"--table {table_path}")  # its model, shapes and every bucket's config
    for k, t in table.kernels.items():
        print(f"policy {k}: table {table_path} ({t.policy.get('model_uri', '?')}, model {model.name})",
              file=sys.stderr, flush=True)
    for k, t in table.kernels.items():  # a table file is a snapshot: its policies may predate the packaged rows
        stale = stale_dataset(k, str(t.policy.get("dataset_sha256_16") or ""), model).get("stale")
        if stale:
            print(stale_line(k, stale), file=sys.stderr, flush=True)
    return Dispatcher(table)


def replay(trace: Any, model: Any, factories: dict[str, Callable[[], Any]], backend: Any, routing: Any,
           record_steps: dict[str, int] | None = None, progress: bool = True, **sim_kw: Any) -> dict[str, PolicyRun]:
    """Run each policy (a fresh one from its factory) over the trace; returns name -> PolicyRun."""
    runs = {}
    for i, (name, factory) in enumerate(factories.items()):
        t0 = time.perf_counter()
        runs[name] = run_policy(name, factory(), model, trace, routing, backend,
                                (record_steps or {}).get(name, 0), **sim_kw)
        if progress:
            m = runs[name].metrics
            print(f"[{i + 1}/{len(factories)}] {name}: {m['tokens_per_s']:.1f} tok/s, tuned kernels "
                  f"{m['tuned_kernel_s']:.1f} s, tuning {m['tuning_gpu_s']:.1f} GPU-s "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
    same_traffic(runs)
    return runs


def same_traffic(runs: dict[str, PolicyRun], reference: str = "oracle") -> None:
    """Add `tuned_kernel_s_same_traffic`: each policy's kernel seconds on the reference run's calls (the oracle's if
    it ran, else the first policy's). Total tuned-kernel time depends on how each policy's own run batched requests;
    this one compares every policy on identical workloads. Search policies may tune shapes they had not seen; that
    extra tuning is not added to their metrics."""
    ref = runs.get(reference) or next(iter(runs.values()), None)
    if ref is None or ref.guard is None:
        return
    calls = dict(ref.guard.calls)
    # The paged-prefix kernel's data is dense on 16-token NHD pages only: where a policy's KV layout leaves some
    # prefix call untimed, every policy is priced without the prefix calls instead (said in the metrics), so the
    # comparison stays on identical workloads for all of them.
    without_prefix = {kw: n for kw, n in calls.items() if not _stands_in(kw[0])}
    for attempt in (calls, without_prefix):
        priced = {name: _priced(r, attempt) for name, r in runs.items()}
        if all(v is not None for v in priced.values()) or len(attempt) == len(without_prefix):
            break
    for name, r in runs.items():
        if priced[name] is not None:
            r.metrics["tuned_kernel_s_same_traffic"] = priced[name]
            if attempt is without_prefix and len(without_prefix) < len(calls):
                r.metrics["same_traffic_excludes"] = ",".join(sorted({kw[0] for kw in calls if _stands_in(kw[0])}))


def _priced(run: PolicyRun, calls: dict[tuple[str, Any], int]) -> float | None:
    """A run's kernel seconds on `calls`. The oracle is priced on the KV layout best for these calls (it deploys the
    one best on the training grid, which a given trace need not favour): it is the lower bound of every policy on
    the same traffic, whatever layout each deploys."""
    if run.guard is None:
        return None
    kv = run.kv or DEFAULT_KV
    if not isinstance(run.guard.policy, OraclePolicy):
        return run.guard.price(calls, kv)
    oracle = run.guard.policy.oracle
    layouts = {kv} | {KVLayout(int(c["PAGE_SIZE"]), str(c["LAYOUT"])) for (k, w, _) in calls if profiles.follows_kv(k)
                      for c in oracle.candidates(k, w)}
    prices = [t for t in (run.guard.price(calls, lay) for lay in sorted(layouts, key=str)) if t is not None]
    return min(prices) if prices else None


def report(trace_name: str, model_name: str, runs: dict[str, PolicyRun], extra: dict[str, Any] | None = None) -> dict:
    ref = "oracle" if "oracle" in runs else next(iter(runs), "")
    return {"trace": trace_name, "model": model_name, **(extra or {}), "same_traffic_reference": ref,
            "policies": {n: {**{k: r.metrics[k] for k in METRICS if k in r.metrics},
                             **{k: v for k, v in r.metrics.items() if k not in METRICS}} for n, r in runs.items()}}


def parse_policies(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad or not names:
        raise ValueError(f"--policies {text!r}: unknown {bad}; choose from {','.join(POLICY_NAMES)}")
    return list(dict.fromkeys(names))


def run_replay(*, json_path: Path, trace: str = "bundled", model: str = "mixtral-8x7b",
               policies: str = ",".join(POLICY_NAMES), routing: str = DEFAULT_ROUTING, model_uris: Sequence[str] = (),
               table: str = "", budget: int = SEARCH_BUDGET, seed: int = 0, window: str = "", rate_scale: float = 1.0,
               backend: Any = "recorded", device: str = "", steps_json: Path | None = None, steps: int = 2000,
               no_mlflow: bool = False, tracking_uri: str = "", untimed_plan: Path | None = None,
               decode_waves: bool = False) -> dict[str, Any]:
    """`kernel-gym replay` (module docstring): the trace replayed once per policy of the comma list `policies`;
    writes `json_path` and the .md and .png files beside it, logs to MLflow unless `no_mlflow`, prints the table and
    returns the report. `backend`: "recorded" (the H200 store), a store path, or a Backend object (tests).
    `decode_waves`: price each decode batch from its own contexts (Simulator's decode_waves)."""
    from kernel_gym.models import kernel_spec, load_model, spec_caveats
    from kernel_gym.parallel.deploy import MAX_MODEL_LEN
    from kernel_gym.traffic.traces import load_trace

    names = parse_policies(policies)
    for flag, path in (("--json", json_path), ("--steps-json", steps_json), ("--untimed-plan", untimed_plan)):
        # before the replay runs, not after
        if path is not None and (path.is_dir() or str(path).endswith(("/", "\\"))):
            raise ValueError(f"{flag} {path}: a directory; pass a file name, e.g. {flag} {path / 'replay.json'}")
    if tracking_uri:
        from kernel_gym.train.tracking import check_tracking_uri

        check_tracking_uri(tracking_uri)
    if budget < 1:
        raise ValueError(f"--budget must be >= 1, got {budget}")
    params = {"trace": trace, "model": model, "policies": policies, "json": json_path, "routing": routing,
              "model_uri": list(model_uris), "table": table, "budget": budget, "seed": seed, "window": window,
              "rate_scale": rate_scale, "device": device, "steps_json": steps_json, "steps": steps,
              "tracking_uri": tracking_uri, "decode_waves": decode_waves,
              "backend": backend if isinstance(backend, str) else getattr(backend, "name", "")}
    spec = load_model(model)
    for line in spec_caveats(spec):
        print(f"note: {line}", file=sys.stderr, flush=True)
    spec = kernel_spec(spec)
    replayed = load_trace(trace)
    dropped = {k: v for k, v in replayed.repairs.items() if v}
    if dropped:
        why = {"zero_token_rows_dropped": "zero prompt or output tokens: failed requests, as BurstGPT records them"}
        print(f"trace {replayed.name}: " + ", ".join(f"{v} rows dropped ({why.get(k, k)})" for k, v in dropped.items()),
              file=sys.stderr, flush=True)
    if window:
        try:
            start, end = (float(x) for x in window.split(":"))
        except ValueError as exc:
            raise ValueError(f"--window {window!r}: use START:END in seconds, e.g. 0:300") from exc
        if start < 0 or end <= start:
            raise ValueError(f"--window {window!r}: START and END are seconds from the trace's first request (every "
                             f"trace starts at 0, whatever its timestamps' origin), with 0 <= START < END; its "
                             f"{len(replayed)} requests span 0 to {replayed.arrival_s[-1]:g} s")
        replayed = replayed.window(start, end)
    over_limit = int(np.count_nonzero(replayed.prompt_tokens + replayed.output_tokens > MAX_MODEL_LEN))
    if over_limit:
        print(f"note: {over_limit} of the {len(replayed)} requests are longer than {MAX_MODEL_LEN:,} tokens (prompt + "
              f"output, plan's default --max-model-len): an engine started with that limit refuses them; the "
              f"replay serves them as given", file=sys.stderr, flush=True)
    if not 0 < rate_scale < math.inf:
        raise ValueError(f"--rate-scale {rate_scale:g}: give a positive number (1: the trace's own arrival rate, 2: "
                         "twice as fast)")
    if rate_scale != 1.0:
        replayed = replayed.scale_rate(rate_scale)
    if isinstance(backend, (str, os.PathLike)):
        from kernel_gym.measure import recorded_backend

        # Scoring keeps the rows too noisy to rank configs by (recorded.MAX_SPREAD): a noisy median is an upper bound
        # of the kernel's time (host delays only add to it), so scoring a deployed config with it is conservative,
        # while leaving it out would make the replay substitute another config for the one the table deploys.
        backend = recorded_backend(backend, max_spread=math.inf, **({"device": device} if device else {}))
    priced_by = backend.describe() if hasattr(backend, "describe") else {"device": getattr(backend, "device", "?")}
    if hasattr(backend, "describe_line"):
        print(backend.describe_line(), file=sys.stderr, flush=True)
    covered = CoveredBackend(backend)
    params["dataset_sha256_16"] = str(getattr(backend, "dataset_hash", "") or "")  # the rows every policy is priced by
    missing = unmeasured_kernels(covered, spec)
    if missing:
        raise ValueError(unmeasured_message(spec.name, missing))
    factories: dict[str, Callable[[], Any]] = {}
    base = make_baselines([n for n in names if n in BASELINE_NAMES], covered, spec, budget, seed)
    for n in names:
        if n == "learned":
            if not table:
                from kernel_gym.train.tracking import setup_tracking

                setup_tracking(tracking_uri or None)
            disp = learned_policy(spec, model_uris, table or None)
            factories[n] = lambda disp=disp: _fresh(disp)
            params["learned_policies"] = {k: t.policy.get("model_uri") or t.policy.get("policy_dir") or "?"
                                          for k, t in disp.table.kernels.items()}  # what "learned" ran, not "[]"
        else:
            factories[n] = base[n]
    profile = routing_profile(routing, spec, seed)
    print(f"routing profile: {routing} ({type(profile).__name__}, {spec.num_experts} experts, top-{spec.top_k}, "
          f"seed {seed})", file=sys.stderr, flush=True)
    from kernel_gym.kernels.workloads import MOE_SKEWS

    if getattr(profile, "exponent", 0.0) > max(MOE_SKEWS) + 0.05:  # the coverage layer clamps to the measured skews
        print(f"note: routing skew {profile.exponent:g} is beyond the largest measured ({max(MOE_SKEWS):g}): fused-MoE "
              f"times are priced at skew {max(MOE_SKEWS):g} (counted in the estimated share), so skews above it "
              "replay alike", file=sys.stderr, flush=True)
    record = {n: steps for n in ("default", "learned", "oracle")} if steps_json else {}
    runs = replay(replayed, spec, factories, covered, profile, record, decode_waves=decode_waves)
    rep = report(replayed.name, spec.name, runs, {"routing": routing, "backend": getattr(backend, "name", ""),
                                                  "priced_by": priced_by,
                                                  "proxied_workloads": len(covered.proxied),
                                                  "borrowed_answers": len(covered.borrowed),
                                                  "dataset_sha256_16": params["dataset_sha256_16"],
                                                  "decode_waves": decode_waves,
                                                  **load_info(replayed, rate_scale, window)})
    paths = write_outputs(rep, runs, json_path)
    if steps_json:
        steps_json.parent.mkdir(parents=True, exist_ok=True)
        steps_json.write_text(json.dumps({
            "trace": replayed.name, "model": spec.name, "num_layers": spec.num_layers,
            **({} if getattr(spec, "uniform_layers", True) else {  # predicted_s is per layer: the layers per kind
                "moe_layers": spec.n_moe_layers, "attention_layers": spec.n_attention_layers}),
            "policies": {n: runs[n].steps for n in record if n in runs}}))
        paths.append(steps_json)
    if untimed_plan is not None:
        paths.append(write_untimed_plan([r.guard for r in runs.values()], backend, untimed_plan))
    if not no_mlflow:
        run_id = log_mlflow(rep, paths, params, tracking_uri or None)
        print(f"logged to MLflow run {run_id}")
    print(markdown(rep))
    return rep


def write_untimed_plan(guards: Sequence[GuardedChooser | None], backend: Any, path: Path) -> Path:
    """Write the guards' untimed choices as a `collect --plan` (measurement_plans.untimed_plan); say what it holds."""
    from kernel_gym.train.measurement_plans import untimed_plan, write_plan

    plan, counts = untimed_plan([g for g in guards if g is not None], backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_plan(plan, path)
    print(f"untimed choices: {counts['calls']} calls the data could not time -> {path}: {counts['configs']} configs "
          f"at {counts['workloads']} stored shapes"
          + (f"; {counts['unbracketed']} calls outside the measured grid left out" if counts["unbracketed"] else "")
          + (f"; {counts['stored_not_ok']} configs already stored there as failed or too noisy to rank"
             if counts["stored_not_ok"] else "")
          + ("; measure them with `kernel-gym collect --plan " + str(path) + "` on the GPU" if plan else ""),
          file=sys.stderr, flush=True)
    return path


def untimeable(kernel: str, workload: Any, kv: Any) -> str:
    """Why a replay stops at a call no config of which the data can time, and what to do."""
    return (f"the backend can time no config of {kernel} on {workload.key()} with KV layout {kv}: the recorded data "
            "has no time for that shape (a model never measured, or a batch / context length beyond the measured "
            "ones or between ones whose neighbours are missing); collect measurements for this model at that shape "
            "(kernel-gym collect --model MODEL on a GPU), or replay a lighter load (a lower --rate-scale, a shorter "
            "--window)")


def load_info(trace: Any, rate_scale: float = 1.0, window: str = "") -> dict[str, Any]:
    """The offered load beside the numbers: request rate, output tokens/s offered, duration, rate scale."""
    dur = float(trace.duration_s) if len(trace) else 0.0
    out_tok = float(np.sum(trace.output_tokens))
    tail = f"rate x{rate_scale:g}{', window ' + window + ' s' if window else ''}"
    if dur <= 0:  # one request, or all at one instant: no rate to state (None in the JSON, not 0 or infinity)
        what = "1 request" if len(trace) == 1 else f"{len(trace)} requests, all at one instant"
        return {"requests": len(trace), "duration_s": dur, "rate_scale": rate_scale, "window": window,
                "offered_req_per_s": None, "offered_output_tokens_per_s": None,
                "load": f"{what} (the trace spans 0 s: no arrival rate; {out_tok:.0f} output tokens offered; {tail})"}
    rate = len(trace) / dur
    offered = out_tok / dur
    return {"requests": len(trace), "duration_s": dur, "rate_scale": rate_scale, "window": window,
            "offered_req_per_s": rate, "offered_output_tokens_per_s": offered,
            "load": f"{len(trace)} requests over {dur:.0f} s ({rate:.2f} req/s, {offered:.0f} output tok/s offered; "
                    f"{tail})"}


def _fresh(disp: Any) -> Any:
    """A Dispatcher over the same table with fresh memo state for each replay."""
    from kernel_gym.dispatch.dispatcher import Dispatcher

    return Dispatcher(disp.table)


__all__ = ["POLICY_NAMES", "GuardedChooser", "PolicyRun", "learned_policy", "replay", "report", "routing_profile",
           "run_policy", "run_replay"]
