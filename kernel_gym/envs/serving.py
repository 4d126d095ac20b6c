"""KernelGym/Serving-v0: control the kernel configs of a serving engine over a replayed trace, paying for switches.

Why dispatch rules, not single configs: one engine step's shapes swing from a 1-token decode batch to an 8192-token
prefill inside one control interval, so a config fixed for 20 s cannot follow them the way a per-workload oracle
does. Each action picks, per kernel family, a *dispatch rule*: a small table bucket-of-shape -> config built from the
training traffic (an oracle-like table, tables restricted to 1, 2 or 4 configs that compile less, or the family's
default heuristic). Rules are built once from the backend's answers on the workloads the training part of the trace
produces (`build_serving_catalogue`), with the kernel catalogue's greedy cover (policies/catalogue.py) giving the
candidate configs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from kernel_gym.dispatch.catalogue import WorkloadReference, build_catalogue, measure_reference
from kernel_gym.envs.base import resolve_backend
from kernel_gym.kernels import get_family
from kernel_gym.kernels.space import Config
from kernel_gym.measure.coverage import CoveredBackend, cover
from kernel_gym.measure.roofline import COPY_BW
from kernel_gym.measure.types import is_estimated
from kernel_gym.traffic.features import traffic_features
from kernel_gym.traffic.simulator import COMPILE_S_DEFAULT, KERNELS, BackendTimer, KVLayout, Simulator
from kernel_gym.traffic.traces import Trace, load_trace

DEFAULT_KV = KVLayout(16, "NHD")
CLIP = 4.0
SPLITS = ("train", "heldout")
TABLE_SIZES = (1, 2, 4)  # compact tables: at most this many distinct configs (fewer compiles)


# ---- shape buckets ------------------------------------------------------------------------------------------------

def bucket_of(kernel: str, workload: Any) -> tuple[float, ...]:
    """Coordinates of a workload's bucket: half-octave steps of the size axes the recorded backend interpolates on."""
    h = lambda x: round(2.0 * math.log2(max(float(x), 1.0))) / 2.0
    if kernel == "prefill_attention":
        return (h(workload.causal_pairs()),)
    if kernel == "decode_attention":
        return (h(workload.batch), h(workload.context_len))
    return (h(workload.num_tokens), round(float(workload.skew) * 4.0) / 4.0)


# ---- dispatch rules -----------------------------------------------------------------------------------------------

@dataclass
class DispatchRule:
    """Picks a config per workload: the config of the nearest bucket in `table`, or the family default when the table
    is empty. Decode rules carry the KV layout their configs use (`kv`)."""

    kernel: str
    name: str
    table: dict[tuple[float, ...], Config]
    kv: KVLayout = DEFAULT_KV
    _memo: dict[Any, Config] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._keys = list(self.table)
        self._coords = np.array(self._keys, dtype=np.float64) if self._keys else np.zeros((0, 1))

    @property
    def is_default(self) -> bool:
        return not self.table

    def configs(self) -> list[Config]:
        return list(dict.fromkeys(self.table.values()))

    def choose(self, workload: Any) -> Config:
        c = self._memo.get(workload)
        if c is None:
            if not self.table:
                c = get_family(self.kernel).default_config(workload)
                if self.kernel == "decode_attention":
                    c = c.replace(PAGE_SIZE=self.kv.page_size, LAYOUT=self.kv.layout)
            else:
                b = bucket_of(self.kernel, workload)
                c = self.table.get(b)
                if c is None:
                    d = ((self._coords - np.asarray(b)) ** 2).sum(axis=1)
                    c = self.table[self._keys[int(np.argmin(d))]]
            self._memo[workload] = c
        return c

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_memo"] = {}
        return state


@dataclass
class ServingCatalogue:
    """Per family the dispatch rules an action indexes (rules[kernel][0] is the default rule), compile times of
    their configs (seconds), the precompiled default configs, the oracle's decode layout, and the nominal output
    token rate (tokens/s) that normalises rewards."""

    rules: dict[str, list[DispatchRule]]
    compile_s: dict[tuple[str, Config], float]
    precompiled: frozenset[tuple[str, Config]]
    oracle_kv: KVLayout
    nominal_tokens_per_s: float
    meta: dict[str, Any] = field(default_factory=dict)

    def sizes(self) -> list[int]:
        return [len(self.rules[k]) for k in KERNELS]


# ---- choosers used inside the simulator ---------------------------------------------------------------------------

class _Answers:
    """Memoised ok-times and compile times of (kernel, workload, config) from a backend, and whether each ok time is
    an estimate (interpolated, proxied, borrowed: measure.types.is_estimated) rather than a measurement."""

    def __init__(self, backend: Any, compile_s: dict[tuple[str, Config], float]) -> None:
        self.backend = backend
        self.compile_s = compile_s
        self._ok: dict[tuple[str, Any, Config], float | None] = {}
        self._est: dict[tuple[str, Any, Config], bool] = {}
        self._avail: dict[tuple[str, Any, KVLayout | None], list[tuple[float, Config]]] = {}

    def time_ms(self, kernel: str, workload: Any, config: Config) -> float | None:
        key = (kernel, workload, config)
        if key not in self._ok:
            m = self.backend.measure(kernel, workload, config)
            ok = m.ok and m.median_ms is not None and m.median_ms > 0
            self._ok[key] = float(m.median_ms) if ok else None
            self._est[key] = is_estimated(m.source)
            if ok and m.compile_s is not None and (kernel, config) not in self.compile_s:
                self.compile_s[(kernel, config)] = float(m.compile_s)
        return self._ok[key]

    def estimated(self, kernel: str, workload: Any, config: Config) -> bool:
        """Whether the time of this (kernel, workload, config) is an estimate rather than a measurement."""
        key = (kernel, workload, config)
        if key not in self._est:
            self.time_ms(kernel, workload, config)
        return self._est[key]

    def ranked(self, kernel: str, workload: Any, kv: KVLayout | None) -> list[tuple[float, Config]]:
        """(time, config) of every available ok config, fastest first (decode: only those with layout kv)."""
        key = (kernel, workload, kv)
        out = self._avail.get(key)
        if out is None:
            space = get_family(kernel).space
            out = []
            for c in self.backend.available_configs(kernel, workload):
                if kv is not None and (c.get("PAGE_SIZE") != kv.page_size or c.get("LAYOUT") != kv.layout):
                    continue
                if not space.is_valid(c, workload):
                    continue
                t = self.time_ms(kernel, workload, c)
                if t is not None:
                    out.append((t, c))
            out.sort(key=lambda tc: tc[0])
            self._avail[key] = out
        return out


class _Coverage:
    """Counts kernel calls per family and those answered by a CoveredBackend proxy (outside the measured grid), and
    sums per family the kernel seconds of the configs served (one layer) and the part of them resting on estimated
    times (`charge`): the estimated share of tuned-kernel time, as replay reports it."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend if isinstance(backend, CoveredBackend) else None
        self.calls = dict.fromkeys(KERNELS, 0)
        self.proxied = dict.fromkeys(KERNELS, 0)
        self.kernel_s = dict.fromkeys(KERNELS, 0.0)
        self.estimated_s = dict.fromkeys(KERNELS, 0.0)
        self._flag: dict[tuple[str, Any], bool] = {}

    def count(self, kernel: str, workload: Any) -> None:
        self.calls[kernel] += 1
        if self.backend is None:
            return
        key = (kernel, workload)
        f = self._flag.get(key)
        if f is None:
            f = self._flag[key] = self.backend.is_proxied(kernel, workload)
        if f:
            self.proxied[kernel] += 1

    def charge(self, kernel: str, seconds: float, estimated: bool) -> None:
        self.kernel_s[kernel] += seconds
        if estimated:
            self.estimated_s[kernel] += seconds

    def snapshot(self) -> tuple[int, int]:
        return sum(self.calls.values()), sum(self.proxied.values())

    def seconds(self) -> tuple[dict[str, float], dict[str, float]]:
        """(kernel seconds, estimated kernel seconds) per family so far, one layer (copies)."""
        return dict(self.kernel_s), dict(self.estimated_s)


class _RuleChooser:
    """The simulator's ConfigChooser: the active rule per family; a config the backend cannot answer for this
    workload falls back to the family default, then to the fastest available config (counted in `fallbacks`)."""

    def __init__(self, answers: _Answers, rules: dict[str, DispatchRule]) -> None:
        self.answers = answers
        self.fallbacks = 0
        self._memos: dict[tuple[str, int], dict[Any, tuple[Config, float, bool]]] = {}
        self.rules = rules
        self.coverage = _Coverage(answers.backend)

    @property
    def rules(self) -> dict[str, DispatchRule]:
        return dict(self._rules)

    @rules.setter
    def rules(self, rules: dict[str, DispatchRule]) -> None:
        self._rules = dict(rules)
        self._active = {k: self._memos.setdefault((k, id(r)), {}) for k, r in self._rules.items()}

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        self.coverage.count(kernel, workload)
        memo = self._active[kernel]
        hit = memo.get(workload)
        if hit is None:
            c = self._resolve(self._rules[kernel], kernel, workload, kv)
            a = self.answers
            hit = memo[workload] = (c, a.time_ms(kernel, workload, c) * 1e-3, a.estimated(kernel, workload, c))
        self.coverage.charge(kernel, hit[1], hit[2])
        return hit[0]

    def _resolve(self, rule: DispatchRule, kernel: str, workload: Any, kv: KVLayout) -> Config:
        c = rule.choose(workload)
        if kernel == "decode_attention" and (c.get("PAGE_SIZE") != kv.page_size or c.get("LAYOUT") != kv.layout):
            c = c.replace(PAGE_SIZE=kv.page_size, LAYOUT=kv.layout)
        if get_family(kernel).space.is_valid(c, workload) and self.answers.time_ms(kernel, workload, c) is not None:
            return c
        self.fallbacks += 1
        d = get_family(kernel).default_config(workload)
        if kernel == "decode_attention":
            d = d.replace(PAGE_SIZE=kv.page_size, LAYOUT=kv.layout)
        if get_family(kernel).space.is_valid(d, workload) and self.answers.time_ms(kernel, workload, d) is not None:
            return d
        ranked = self.answers.ranked(kernel, workload, kv if kernel == "decode_attention" else None)
        if not ranked:
            raise RuntimeError(
                f"backend {getattr(self.answers.backend, 'name', '?')!r} has no ok config for {kernel} on "
                f"{workload.key()} (KV layout {kv}); the trace produces shapes outside the backend's data: use a "
                "shorter max_num_batched_tokens, a lower rate_scale or a backend that covers them"
            )
        return ranked[0][1]


class OracleChooser:
    """The per-workload oracle: the fastest config the backend can answer for each step's workload (decode: among
    configs of the layout in force). Not deployable (it needs every config measured on every shape); the yardstick."""

    def __init__(self, answers: _Answers) -> None:
        self.answers = answers
        self._memo: dict[tuple[str, Any, KVLayout], tuple[Config, float, bool]] = {}
        self.coverage = _Coverage(answers.backend)

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        self.coverage.count(kernel, workload)
        key = (kernel, workload, kv)
        hit = self._memo.get(key)
        if hit is None:
            ranked = self.answers.ranked(kernel, workload, kv if kernel == "decode_attention" else None)
            if not ranked:
                raise RuntimeError(f"oracle: backend has no ok config for {kernel} on {workload.key()} ({kv})")
            t, c = ranked[0]
            hit = self._memo[key] = (c, t * 1e-3, self.answers.estimated(kernel, workload, c))
        self.coverage.charge(kernel, hit[1], hit[2])
        return hit[0]


# ---- the catalogue of rules from the training traffic -------------------------------------------------------------

def _resolve_trace(trace: Any) -> Trace:
    if isinstance(trace, Trace):
        return trace
    if isinstance(trace, str):
        return load_trace(trace)
    raise TypeError(f"trace {trace!r} is neither a trace name/path nor a kernel_gym.traffic.Trace")


def _resolve_model(model: Any) -> Any:
    if isinstance(model, str):
        from kernel_gym.models import load_model

        return load_model(model)
    return model


def _slice(trace: Trace, t0: float, t1: float, rate_scale: float) -> Trace:
    """Requests arriving in [t0, t1) of the trace, with t0 at time 0 and time compressed by rate_scale."""
    lo, hi = np.searchsorted(trace.arrival_s, [t0, t1], side="left")
    if hi <= lo:
        raise ValueError(f"trace {trace.name!r} has no arrivals in [{t0:g}, {t1:g}) s; choose another window")
    return Trace(f"{trace.name}[{t0:g}:{t1:g}s]", (trace.arrival_s[lo:hi] - t0) / rate_scale,
                 trace.prompt_tokens[lo:hi], trace.output_tokens[lo:hi], trace.source)


def _greedy_table(refs: list[WorkloadReference], weights: list[float], candidates: Sequence[Config], k: int,
                  keep: Callable[[Config], bool]) -> list[Config]:
    """Up to k configs minimising the weighted sum over buckets of the best time among them (greedy)."""
    chosen: list[Config] = []
    big = 1e30
    cur = [big] * len(refs)
    pool = [c for c in dict.fromkeys(candidates) if keep(c)]
    while len(chosen) < k:
        best_c, best_total = None, sum(w * t for w, t in zip(weights, cur))
        for c in pool:
            if c in chosen:
                continue
            total = sum(w * min(t, r.times.get(c, big)) for w, t, r in zip(weights, cur, refs))
            if total < best_total - 1e-12:
                best_c, best_total = c, total
        if best_c is None:
            break
        chosen.append(best_c)
        cur = [min(t, r.times.get(best_c, big)) for t, r in zip(cur, refs)]
    return chosen


def build_serving_catalogue(
    backend: Any,
    model: Any = "mixtral-8x7b",
    trace: Any = "azure-conv",
    holdout: float = 0.2,
    rate_scale: float = 1.0,
    routing: Any = None,
    profile_s: float = 600.0,
    profile_windows: int = 4,
    decode_layouts: int = 2,
    near: float = 0.02,
    max_configs: int = 16,
    sim_kwargs: dict[str, Any] | None = None,
) -> ServingCatalogue:
    """Replay `profile_windows` evenly spaced windows (profile_s in all) of the training part of the trace with the
    default configs, bucket the workloads the engine produces, measure every available config at each bucket's most
    frequent workload, and build per family: the default rule, an oracle-like table (best config per bucket) and
    tables of at most 1, 2 and 4 configs (greedy over the kernel catalogue's candidates, weighted by how often each
    bucket occurs). Decode rules are built for the default layout and the best `decode_layouts - 1` other layouts."""
    backend = cover(resolve_backend(backend))
    spec = _resolve_model(model)
    tr = _resolve_trace(trace)
    if not 0 < holdout < 1:
        raise ValueError(f"holdout must be in (0, 1), got {holdout}")
    if rate_scale <= 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    train_end = tr.duration_s * (1 - holdout)
    n_win = max(1, int(profile_windows))
    win = min(profile_s / n_win, train_end / n_win)
    compile_s: dict[tuple[str, Config], float] = {}
    answers = _Answers(backend, compile_s)
    counts: dict[str, dict[tuple[float, ...], dict[Any, int]]] = {k: {} for k in KERNELS}

    class _Recorder(_RuleChooser):
        def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
            b = counts[kernel].setdefault(bucket_of(kernel, workload), {})
            b[workload] = b.get(workload, 0) + 1
            return super().choose(kernel, workload, kv)

    defaults = {k: DispatchRule(k, "default", {}) for k in KERNELS}
    for i in range(n_win):
        t0 = i * train_end / n_win
        rec = _Recorder(answers, defaults)
        sim = Simulator(spec, _slice(tr, t0, t0 + win * rate_scale, rate_scale), BackendTimer(backend), rec,
                        routing, **(sim_kwargs or {}))
        sim.run_until(win)

    rules: dict[str, list[DispatchRule]] = {}
    precompiled: set[tuple[str, Config]] = set()
    oracle_kv = DEFAULT_KV
    meta: dict[str, Any] = {"profile_s": win * n_win, "buckets": {}}
    for kernel in KERNELS:
        family = get_family(kernel)
        buckets = counts[kernel]
        reps = {b: max(ws, key=ws.__getitem__) for b, ws in buckets.items()}
        weight = {b: float(sum(ws.values())) for b, ws in buckets.items()}
        for ws in buckets.values():
            precompiled.update((kernel, defaults[kernel].choose(w)) for w in ws)
        refs_all = measure_reference(backend, family, reps.values())
        by_key = {r.key: r for r in refs_all}
        pairs = [(b, by_key[w.key()]) for b, w in reps.items() if w.key() in by_key]
        meta["buckets"][kernel] = len(pairs)
        kernel_rules = [defaults[kernel]]
        if not pairs:
            rules[kernel] = kernel_rules
            continue
        bks = [b for b, _ in pairs]
        refs = [r for _, r in pairs]
        wts = [weight[b] for b in bks]
        cand = build_catalogue(kernel, refs, near, max_configs).configs
        if kernel == "decode_attention":
            layouts = sorted({KVLayout(int(c["PAGE_SIZE"]), str(c["LAYOUT"])) for r in refs for c in r.times},
                             key=lambda kv: (kv.page_size, kv.layout))

            def total(kv: KVLayout, refs: list[WorkloadReference] = refs, wts: list[float] = wts) -> float:
                ts = [min((t for c, t in r.times.items() if c["PAGE_SIZE"] == kv.page_size
                           and c["LAYOUT"] == kv.layout), default=math.inf) for r in refs]
                return sum(w * t for w, t in zip(wts, ts))

            ranked = sorted(layouts, key=total)
            oracle_kv = ranked[0] if ranked and math.isfinite(total(ranked[0])) else DEFAULT_KV
            chosen_kvs = [DEFAULT_KV] + [kv for kv in ranked if kv != DEFAULT_KV][: max(0, decode_layouts - 1)]
            if decode_layouts >= 1 and oracle_kv not in chosen_kvs:
                chosen_kvs[-1] = oracle_kv
        else:
            chosen_kvs = [DEFAULT_KV]
        for kv in chosen_kvs:
            match = (lambda c, kv=kv: c.get("PAGE_SIZE") == kv.page_size and c.get("LAYOUT") == kv.layout) \
                if kernel == "decode_attention" else (lambda c: True)
            tag = f"@{kv.page_size}{kv.layout}" if kernel == "decode_attention" else ""
            if kernel == "decode_attention" and kv != DEFAULT_KV:
                kernel_rules.append(DispatchRule(kernel, f"default{tag}", {}, kv))
            oracle_table: dict[tuple[float, ...], Config] = {}
            for b, r in zip(bks, refs):
                ok = [(t, c) for c, t in r.times.items() if match(c)]
                if ok:
                    oracle_table[b] = min(ok, key=lambda tc: tc[0])[1]
            if not oracle_table:
                continue
            kernel_rules.append(DispatchRule(kernel, f"oracle_table{tag}", oracle_table, kv))
            pool = list(cand) + list(oracle_table.values())
            for k in TABLE_SIZES:
                sel = _greedy_table(refs, wts, pool, k, match)
                if not sel:
                    continue
                table = {}
                for b, r in zip(bks, refs):
                    ok = [(r.times[c], c) for c in sel if c in r.times]
                    if ok:
                        table[b] = min(ok, key=lambda tc: tc[0])[1]
                if table and set(table.values()) != set(oracle_table.values()):
                    kernel_rules.append(DispatchRule(kernel, f"table{k}{tag}", table, kv))
        rules[kernel] = kernel_rules
        for rule in kernel_rules:
            for c in rule.configs():
                if (kernel, c) not in compile_s:
                    for r in refs:  # a measured compile time on some bucket's workload
                        answers.time_ms(kernel, r.workload, c)
                        if (kernel, c) in compile_s:
                            break
    n_req_train = int(np.searchsorted(tr.arrival_s, train_end))
    out_train = float(tr.output_tokens[:n_req_train].sum())
    nominal = out_train / max(train_end, 1e-9) * rate_scale
    return ServingCatalogue(rules, compile_s, frozenset(precompiled), oracle_kv, nominal, meta)


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

    def __init__(
        self,
        backend: Any = "recorded",
        model: Any = "mixtral-8x7b",
        trace: Any = "azure-conv",
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
        self.model = _resolve_model(model)
        self.trace = _resolve_trace(trace)
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
        t0 = start_s - self.warmup_s * self.rate_scale
        t1 = start_s + self.interval_s * self.num_intervals * self.rate_scale
        sim = Simulator(self.model, _slice(self.trace, t0, t1, self.rate_scale), BackendTimer(self.backend), chooser,
                        self.routing, compile_s=self._compile_cost, precompiled=self.catalogue.precompiled,
                        **self.sim_kwargs)
        if self.warmup_s > 0:
            sim.run_until(self.warmup_s)
        return sim

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
        kv = rules["decode_attention"].kv
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
        layers = self.model.num_layers
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
            "kernel_s": {k: (ks1[k] - ks0[k]) * layers for k in KERNELS},
            "estimated_kernel_s": {k: (est1[k] - est0[k]) * layers for k in KERNELS},
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


# ---- evaluation ---------------------------------------------------------------------------------------------------

def _act(policy: Any, obs: np.ndarray, env: ServingEnv) -> np.ndarray:
    if isinstance(policy, str):
        if policy != "default":
            raise ValueError(f"policy {policy!r}: give 'default', a callable (obs, env) -> action or a model")
        return env.default_action()
    if hasattr(policy, "predict"):
        try:
            a, _ = policy.predict(obs, deterministic=True, action_masks=env.action_masks())
        except TypeError:  # a plain sb3 model takes no masks
            a, _ = policy.predict(obs, deterministic=True)
        return np.asarray(a)
    return np.asarray(policy(obs, env))


def estimated_shares(kernel_s: dict[str, dict[str, float]], estimated_s: dict[str, dict[str, float]],
                     windows: int = 1) -> dict[str, float]:
    """Per policy ("agent", ...): `<who>_tuned_kernel_s` (per window), `<who>_estimated_share` and
    `<who>_estimated_share.<kernel>`: estimated seconds / tuned-kernel seconds (0.0 when a family ran no kernel)."""
    out: dict[str, float] = {}
    for who, ks in kernel_s.items():
        es = estimated_s[who]
        total = sum(ks.values())
        out[f"{who}_tuned_kernel_s"] = total / max(windows, 1)
        out[f"{who}_estimated_share"] = sum(es.values()) / total if total > 0 else 0.0
        for k in KERNELS:
            out[f"{who}_estimated_share.{k}"] = es[k] / ks[k] if ks[k] > 0 else 0.0
    return out


def evaluate_serving(env_kwargs: dict[str, Any], policy: Any, start_s: Sequence[float] | None = None,
                     num_windows: int = 1) -> dict[str, Any]:
    """Tokens/s of `policy` (a callable (obs, env) -> action, an sb3 model, or "default"), of the default rules, and
    of the per-workload oracle chooser (fastest available config per step's workload, compile stalls counted, decode
    layout fixed to the catalogue's oracle layout) on the same windows. Windows: `start_s` (trace seconds) or
    `num_windows` evenly spaced over the env's split (default split "heldout"). Per policy (agent, default, oracle)
    also the share of its tuned-kernel seconds resting on estimated times, overall and per family
    (`estimated_shares`), and the share of kernel calls on proxied workloads (`<who>_proxied_share`)."""
    kw = dict(env_kwargs)
    kw.setdefault("split", "heldout")
    env = ServingEnv(**kw)
    if start_s is None:
        lo, hi = env._range
        start_s = [lo] if num_windows <= 1 else list(np.linspace(lo, hi, num_windows))
    span = env.interval_s * env.num_intervals
    totals = {"agent": 0.0, "default": 0.0, "oracle": 0.0}
    calls = {"agent": [0, 0, 0], "default": [0, 0, 0], "oracle": [0, 0, 0]}  # kernel calls, proxied, fallbacks
    stalls = {"agent": 0.0, "default": 0.0, "oracle": 0.0}
    # tuned-kernel seconds per family (all layers) and the part resting on estimated times
    kernel_s = {who: dict.fromkeys(KERNELS, 0.0) for who in calls}
    est_s = {who: dict.fromkeys(KERNELS, 0.0) for who in calls}
    rows: list[dict[str, Any]] = []
    actions: list[list[str]] = []
    for s in start_s:
        row: dict[str, Any] = {"start_s": float(s)}
        for who in ("agent", "default"):
            obs, _ = env.reset(options={"start_s": float(s)})
            tokens, stall, done = 0, 0.0, False
            while not done:
                a = env.default_action() if who == "default" else _act(policy, obs, env)
                obs, _, done, _, info = env.step(a)
                tokens += info["tokens"]
                stall += info["stall_s"]
                calls[who][0] += info["kernel_calls"]
                calls[who][1] += info["proxied_calls"]
                calls[who][2] += info["fallbacks"]
                for k in KERNELS:
                    kernel_s[who][k] += info["kernel_s"][k]
                    est_s[who][k] += info["estimated_kernel_s"][k]
                if who == "agent":
                    actions.append(info["rules"])
            elapsed = env.sim.clock - env._t0
            row[f"{who}_tokens_per_s"] = tokens / elapsed
            totals[who] += tokens / elapsed
            stalls[who] += stall
        oracle = OracleChooser(env.answers)
        sim = env.make_simulator(float(s), _RuleChooser(env.answers, {k: env.catalogue.rules[k][0] for k in KERNELS}))
        t0 = sim.clock
        kv = env.catalogue.oracle_kv
        relayout = sim.set_kv_layout(kv.page_size, kv.layout)
        sim.chooser = oracle
        st = sim.run_until(t0 + span)
        row["oracle_tokens_per_s"] = st.output_tokens / (sim.clock - t0)
        totals["oracle"] += row["oracle_tokens_per_s"]
        n_calls, n_prox = oracle.coverage.snapshot()
        calls["oracle"][0] += n_calls
        calls["oracle"][1] += n_prox
        ks, es = oracle.coverage.seconds()
        for k in KERNELS:
            kernel_s["oracle"][k] += ks[k] * env.model.num_layers
            est_s["oracle"][k] += es[k] * env.model.num_layers
        stalls["oracle"] += st.stall_s
        row["oracle_relayout_s"] = relayout
        row["oracle_compiles"] = sum(1 for _, _, why in st.stalls if why.startswith("compile"))
        rows.append(row)
    n = len(rows)
    out = {k + "_tokens_per_s": v / n for k, v in totals.items()}
    out.update({k + "_stall_s": v / n for k, v in stalls.items()})
    out["agent_over_oracle"] = out["agent_tokens_per_s"] / out["oracle_tokens_per_s"]
    out["default_over_oracle"] = out["default_tokens_per_s"] / out["oracle_tokens_per_s"]
    # honesty of the numbers: the share of kernel calls answered outside the measured grid (CoveredBackend proxy),
    # and of rule picks the backend could not answer (the chooser fell back to the default or fastest config)
    for who, (nc, npx, nfb) in calls.items():
        out[f"{who}_proxied_share"] = npx / nc if nc else 0.0
        out[f"{who}_fallbacks"] = nfb
    # and the share of each policy's tuned-kernel seconds whose times are estimates (interpolated between measured
    # shapes, proxied, or borrowed from another shape) rather than measurements of that workload and config
    out.update(estimated_shares(kernel_s, est_s, n))
    out["windows"] = rows
    out["agent_rules"] = actions
    out["oracle_kv"] = f"{env.catalogue.oracle_kv.page_size}/{env.catalogue.oracle_kv.layout}"
    return out
