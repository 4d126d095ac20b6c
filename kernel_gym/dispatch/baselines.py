"""The policies a user could run instead of the learned one, as simulator ConfigChoosers, for replay evaluation.

- default: FAMILY.default_config (what a user gets without tuning).
- static: the best single config per kernel over the training traffic (the model's collection grid, geomean ratio
  to the oracle, as in training's static baseline).
- vllm-table: fused MoE from a per-M table tuned offline on uniform routing, nearest M at run time (vLLM's
  get_moe_configs + try_get_optimal_moe_config); attention kernels have no per-M table in vLLM's format and use the
  static config (their offline-tuned equivalent).
- autotune: at the first sight of each new shape key, measure every valid config (Triton's autotuner); the stall
  (sum of compile + timing of every config) is charged to the waiting requests and counted as tuning GPU time.
- random / tpe: the same, but measuring only `budget` configs per new shape: uniformly sampled, or proposed by
  Optuna's TPE sampler over the knobs.
- oracle: the best measured config for every workload (no stall: an upper bound).
The learned policy is `dispatcher.Dispatcher` over an exported table.

Every policy has `kv_layout` (the KV layout the deployment starts with), `precompiled` (configs compiled at start-up)
and `tuning_gpu_s`. Decode configs always carry the layout in force. `measure.coverage.CoveredBackend` lets a recorded
backend answer every workload the simulator produces (see its docstring).
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, Iterable, Sequence

from kernel_gym.dispatch.rules import default_for, fastest, follow_kv, follows_kv, kv_key
from kernel_gym.kernels import get_family, profiles
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import MOE_TOKENS, MoEWorkload, model_workloads
from kernel_gym.traffic.simulator import COMPILE_S_DEFAULT, DEFAULT_KV, KERNELS, KVLayout

MOE = "fused_moe"  # the kernel vLLM's per-M tables (the vllm-table baseline) are for
AUTOTUNE_REPEATS = 100  # timing repeats per config when the store does not say (do_bench's 100 ms at >= 1 ms/run)
SEARCH_BUDGET = 4  # measurements per new shape for random and tpe


# ---- shared helpers ------------------------------------------------------------------------------------------------


class Oracle:
    """Per-workload candidates (valid, answerable, on the KV layout in force) and the fastest of them, memoised."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._cands: dict[tuple, list[Config]] = {}
        self._best: dict[tuple, Config | None] = {}
        self._times: dict[tuple, float | None] = {}

    def time_ms(self, kernel: str, workload: Any, config: Config) -> float | None:
        key = (kernel, workload, config)
        if key not in self._times:
            m = self.backend.measure(kernel, workload, config)
            self._times[key] = m.median_ms if m.ok and m.median_ms else None
        return self._times[key]

    def candidates(self, kernel: str, workload: Any, kv: KVLayout | None = None) -> list[Config]:
        key = (kernel, workload, kv_key(kernel, kv))
        out = self._cands.get(key)
        if out is None:
            space = get_family(kernel).space
            out = [c for c in self.backend.available_configs(kernel, workload)
                   if (key[2] is None or (c["PAGE_SIZE"] == kv.page_size and c["LAYOUT"] == kv.layout))
                   and space.is_valid(c, workload) and self.time_ms(kernel, workload, c) is not None]
            self._cands[key] = out
        return out

    def best(self, kernel: str, workload: Any, kv: KVLayout | None = None) -> Config | None:
        key = (kernel, workload, kv_key(kernel, kv))
        if key not in self._best:
            cands = self.candidates(kernel, workload, kv)
            self._best[key] = fastest(cands, lambda c: self.time_ms(kernel, workload, c)) if cands else None
        return self._best[key]


class Policy:
    """Base: a ConfigChooser with the replay bookkeeping every policy carries."""

    name = "policy"

    def __init__(self, kv_layout: KVLayout = DEFAULT_KV) -> None:
        self.kv_layout = kv_layout
        self.precompiled: set[tuple[str, Config]] = set()
        self.tuning_gpu_s = 0.0
        self.measurements = 0
        self.sim: Any = None

    def attach(self, sim: Any) -> None:
        """Called by replay before the run: policies that tune charge stalls to this simulator."""
        self.sim = sim

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        raise NotImplementedError


class DefaultPolicy(Policy):
    name = "default"

    def __init__(self, model: Any, kv_layout: KVLayout = DEFAULT_KV) -> None:
        super().__init__(kv_layout)
        self._memo: dict[tuple, Config] = {}
        for k in KERNELS:  # what a serving engine warms up: the defaults of the model's shape grid
            for w in model_workloads(k, model):
                self.precompiled.add((k, default_for(k, w, kv_layout)))

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        key = (kernel, workload, kv)
        cfg = self._memo.get(key)
        if cfg is None:
            cfg = self._memo[key] = default_for(kernel, workload, kv)
        return cfg


class TablePolicy(Policy):
    """Fixed choices per kernel: one static config, or a per-M table for fused MoE (nearest M, vLLM's rule)."""

    def __init__(self, name: str, static: dict[str, Config], moe_table: dict[int, Config] | None = None) -> None:
        dec = next(c for k, c in static.items() if follows_kv(k))  # the deployment's KV layout: decode's
        super().__init__(KVLayout(int(dec["PAGE_SIZE"]), str(dec["LAYOUT"])))
        self.name = name
        self.static = dict(static)
        self.moe_table = dict(sorted((moe_table or {}).items()))
        self._ms = list(self.moe_table)
        self._memo: dict[tuple, Config] = {}
        self.precompiled = {(k, c) for k, c in self.static.items()} | {(MOE, c) for c in self.moe_table.values()}

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        if kernel == MOE and self._ms:
            m = workload.num_tokens
            key = ("m", m)
            cfg = self._memo.get(key)
            if cfg is None:
                cfg = self._memo[key] = self.moe_table[min(self._ms, key=lambda x: abs(x - m))]
            return cfg
        cfg = self.static[kernel]
        if follows_kv(kernel):
            key = (cfg, kv, workload.head_dim)
            out = self._memo.get(key)
            if out is None:
                out = self._memo[key] = follow_kv(kernel, cfg, workload, kv)
            return out
        return cfg


class OraclePolicy(Policy):
    name = "oracle"

    def __init__(self, oracle: Oracle, kv_layout: KVLayout) -> None:
        super().__init__(kv_layout)
        self.oracle = oracle

    def attach(self, sim: Any) -> None:
        super().attach(sim)
        sim.compile_fn = lambda kernel, cfg: 0.0  # an upper bound: everything is compiled

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        cfg = self.oracle.best(kernel, workload, kv)
        return cfg if cfg is not None else default_for(kernel, workload, kv)


def shape_key(kernel: str, workload: Any) -> tuple:
    """The tuning key of the search baselines (its profile's tuning_key): M for MoE (routing is invisible to an
    autotuner's key), (batch, context) for decode, next powers of two of (total, longest) for prefill."""
    key = profiles.profile(kernel).tuning_key
    if key is None:  # a kernel the search baselines do not tune (prefix chunks: replay charges its default)
        raise LookupError(f"{kernel} has no tuning key (its profile's tuning_key)")
    return key(workload)


class SearchPolicy(Policy):
    """Tune at the first sight of each new shape key: measure configs, keep the fastest for that key.

    mode "exhaustive" (autotune: every candidate), "random" or "tpe" (`budget` measurements). Each measured config
    costs its compile time (the store's compile_s, else COMPILE_S_DEFAULT) plus median x repeats of timing; the sum
    is charged as a stall to the next engine step (requests wait) and counted in tuning_gpu_s."""

    def __init__(self, mode: str, oracle: Oracle, kv_layout: KVLayout = DEFAULT_KV, budget: int = SEARCH_BUDGET,
                 seed: int = 0) -> None:
        if mode not in ("exhaustive", "random", "tpe"):
            raise ValueError(f"search mode {mode!r}: use exhaustive, random or tpe")
        if budget < 1:
            raise ValueError(f"search budget must be >= 1 measurement per shape, got {budget}")
        super().__init__(kv_layout)
        self.name = {"exhaustive": "autotune"}.get(mode, mode)
        self.mode, self.oracle, self.budget, self.seed = mode, oracle, budget, seed
        self.winners: dict[tuple, Config] = {}
        self.shapes_tuned = 0
        self._rng = random.Random(seed)

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        key = (kernel, kv, shape_key(kernel, workload))
        cfg = self.winners.get(key)
        if cfg is None:
            cfg = self.winners[key] = self._tune(kernel, workload, kv)
        return cfg

    def _cost_s(self, kernel: str, workload: Any, cfg: Config) -> float:
        m = self.oracle.backend.measure(kernel, workload, cfg)
        compile_s = m.compile_s if m.compile_s else COMPILE_S_DEFAULT
        timing = (m.median_ms or 0.0) * 1e-3 * (m.repeats if m.repeats else AUTOTUNE_REPEATS)
        return compile_s + timing

    def _tune(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        cands = self.oracle.candidates(kernel, workload, kv)
        if not cands:
            return default_for(kernel, workload, kv)
        if self.mode == "exhaustive" or len(cands) <= self.budget:
            tried = list(cands)
        elif self.mode == "random":
            tried = self._rng.sample(cands, self.budget)
        else:
            tried = self._tpe(kernel, workload, cands)
        stall = sum(self._cost_s(kernel, workload, c) for c in tried)
        self.tuning_gpu_s += stall
        self.measurements += len(tried)
        self.shapes_tuned += 1
        if self.sim is not None:
            self.sim.add_stall(stall, f"{self.name} {kernel} {len(tried)} configs")
            self.sim.compiled.update((kernel, c) for c in tried)
        return fastest(tried, lambda c: self.oracle.time_ms(kernel, workload, c))

    def _tpe(self, kernel: str, workload: Any, cands: list[Config]) -> list[Config]:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        allowed = set(cands)
        # per-knob choices: the values some candidate has (the rest can never be measured here)
        space = get_family(kernel).space
        knobs = [(k.name, [v for v in k.values if any(space.value(c, k.name) == v for c in cands)])
                 for k in space.knobs]
        fixed = {}
        if follows_kv(kernel):
            fixed = {"PAGE_SIZE": cands[0]["PAGE_SIZE"], "LAYOUT": cands[0]["LAYOUT"]}
        sampler = optuna.samplers.TPESampler(seed=self._rng.randrange(2**31), n_startup_trials=max(1, self.budget // 2))
        study = optuna.create_study(direction="minimize", sampler=sampler)
        tried: list[Config] = []
        for _ in range(10 * self.budget):
            if len(tried) >= self.budget:
                break
            trial = study.ask()
            values = {n: fixed[n] if n in fixed else trial.suggest_categorical(n, vals) for n, vals in knobs}
            cfg = space.config(values)
            if cfg not in allowed or cfg in tried:  # invalid or unanswerable: masked, never measured
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            tried.append(cfg)
            study.tell(trial, math.log(self.oracle.time_ms(kernel, workload, cfg)))
        rest = [c for c in cands if c not in tried]
        while len(tried) < self.budget and rest:  # TPE kept proposing masked configs: fill at random
            tried.append(rest.pop(self._rng.randrange(len(rest))))
        return tried


# ---- building the baselines from training traffic ------------------------------------------------------------------


def training_references(backend: Any, model: Any, kernels: Iterable[str] = KERNELS) -> dict[str, list[Any]]:
    """Reference times of every answerable config on the model's collection grid (the training traffic)."""
    from kernel_gym.dispatch.catalogue import measure_reference

    return {k: measure_reference(backend, get_family(k), model_workloads(k, model)) for k in kernels}


TUNE_KERNELS = ("fused_moe", "decode_attention")  # the kernels `kernel-gym tune` measures (deploy/tune.py KERNELS)


def measure_commands(kernels: Sequence[str]) -> str:
    """The GPU commands that measure `kernels` at a model's shapes into a store (--backend STORE reads it): `tune`
    for the kernels it tunes, `collect` for the others."""
    tuned, rest = [k for k in kernels if k in TUNE_KERNELS], [k for k in kernels if k not in TUNE_KERNELS]
    cmds = [f"`kernel-gym {cmd} --model SPEC --kernels {','.join(ks)} --db STORE`"
            for cmd, ks in (("tune", tuned), ("collect", rest)) if ks]
    return " and ".join(cmds)


def unmeasured_message(model_name: str, kernels: Sequence[str], then: str = "then pass --backend STORE") -> str:
    """Why a model whose grid has no measured workload of `kernels` cannot be trained on or replayed, and what fixes
    it: measuring them (`then`: how the command reads the store), or `plan`, which prices a model without
    measurements from the roofline."""
    return (f"{model_name}: the data holds no measurement of {', '.join(kernels)} at this model's shapes, and "
            f"training and replay score configs on measured times only; measure them on a GPU "
            f"({measure_commands(kernels)}), {then}; or, without a GPU, estimate a serving plan from the roofline "
            "with `kernel-gym plan --model SPEC`")


def unmeasured_kernels(backend: Any, model: Any, kernels: Iterable[str] = KERNELS) -> list[str]:
    """The kernels of which `backend` stores no config at any workload of the model's grid (lookups only, no timing:
    a check before a replay or a training run, not after minutes of it)."""
    return [k for k in kernels if not any(backend.available_configs(k, w) for w in model_workloads(k, model))]


def static_configs(refs: dict[str, list[Any]], model_name: str = "this model") -> dict[str, Config]:
    from kernel_gym.dispatch.catalogue import best_static_config

    missing = [k for k, r in refs.items() if not r]
    if missing:
        raise ValueError(unmeasured_message(model_name, missing))
    return {k: best_static_config(r) for k, r in refs.items()}


def best_layout(decode_refs: list[Any]) -> KVLayout:
    """The KV layout whose per-workload best decode times sum lowest over the training grid (oracle's layout)."""
    layouts: dict[tuple[int, str], float] = {}
    for lay in {(int(c["PAGE_SIZE"]), str(c["LAYOUT"])) for r in decode_refs for c in r.times}:
        total = 0.0
        for r in decode_refs:
            ts = [t for c, t in r.times.items() if (c["PAGE_SIZE"], c["LAYOUT"]) == lay]
            if not ts:
                total = math.inf
                break
            total += min(ts)
        layouts[lay] = total
    if not layouts:
        return DEFAULT_KV
    ps, lay = min(layouts, key=lambda k: (layouts[k], k))
    return KVLayout(ps, lay)


def vllm_moe_table(oracle: Oracle, model: Any, dtype: str = "bfloat16") -> dict[int, Config]:
    """Per-M table tuned offline on uniform routing (skew 0), as vLLM's benchmark_moe.py writes it."""
    out = {}
    for m in MOE_TOKENS:
        w = MoEWorkload(m, model.num_experts, model.top_k, model.hidden, model.intermediate, 0.0, dtype)
        best = oracle.best(MOE, w)
        if best is not None:
            out[m] = best
    if not out:
        raise ValueError("no fused_moe measurement at uniform routing: cannot build the vllm-table baseline")
    return out


BASELINE_NAMES = ("default", "static", "vllm-table", "autotune", "random", "tpe", "oracle")


def make_baselines(names: Iterable[str], backend: Any, model: Any, budget: int = SEARCH_BUDGET, seed: int = 0,
                   refs: dict[str, list[Any]] | None = None) -> dict[str, Callable[[], Policy]]:
    """Factories (fresh state per replay) of the named baselines over a (covered) backend."""
    names = list(names)
    unknown = [n for n in names if n not in BASELINE_NAMES]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}: choose from {list(BASELINE_NAMES)} (and 'learned')")
    oracle = Oracle(backend)
    need_refs = {"static", "vllm-table", "oracle"} & set(names)
    if need_refs and refs is None:
        refs = training_references(backend, model)
    static = static_configs(refs, model.name) if {"static", "vllm-table"} & set(names) else {}
    out: dict[str, Callable[[], Policy]] = {}
    for n in names:
        if n == "default":
            out[n] = lambda: DefaultPolicy(model)
        elif n == "static":
            out[n] = lambda: TablePolicy("static", static)
        elif n == "vllm-table":
            table = vllm_moe_table(oracle, model)
            out[n] = lambda table=table: TablePolicy("vllm-table", static, table)
        elif n == "oracle":
            kv = best_layout(next(r for k, r in refs.items() if follows_kv(k)))
            out[n] = lambda kv=kv: OraclePolicy(oracle, kv)
        else:
            mode = "exhaustive" if n == "autotune" else n
            out[n] = lambda mode=mode: SearchPolicy(mode, oracle, DEFAULT_KV, budget, seed)
    return out
