"""Serving-v0's dispatch rules: shape buckets, the rule tables an action picks from, the choosers the simulator runs
them through, and the catalogue of rules built from the training traffic (`build_serving_catalogue`).

Why dispatch rules, not single configs: one engine step's shapes swing from a 1-token decode batch to an 8192-token
prefill inside one control interval, so a config fixed for 20 s cannot follow them the way a per-workload oracle
does. A *dispatch rule* is a small table bucket-of-shape -> config built from the training traffic (an oracle-like
table, tables restricted to 1, 2 or 4 configs that compile less, or the family's default heuristic). Rules are built
once from the backend's answers on the workloads the training part of the trace produces, with the kernel
catalogue's greedy cover (dispatch/catalogue.py) giving the candidate configs. The environment that picks among them
is kernel_gym/envs/serving.py; deploy/serving_export.py turns chosen rules into a Dispatcher table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from kernel_gym.dispatch.catalogue import WorkloadReference, build_catalogue, measure_reference
from kernel_gym.dispatch.rules import fallback_config, fastest, follows_kv, kv_key
from kernel_gym.kernels import get_family, profiles
from kernel_gym.kernels.profiles import half_octave  # noqa: F401 - re-exported (serving_export)
from kernel_gym.kernels.space import Config
from kernel_gym.measure import resolve_backend
from kernel_gym.measure.coverage import CoveredBackend, cover
from kernel_gym.measure.types import is_estimated
from kernel_gym.traffic.simulator import DEFAULT_KV, KERNELS, KVLayout
from kernel_gym.traffic.windows import resolve_model, resolve_trace, run_windows

TABLE_SIZES = (1, 2, 4)  # compact tables: at most this many distinct configs (fewer compiles)

# ---- shape buckets ------------------------------------------------------------------------------------------------

def _fastest_of(timed: Sequence[tuple[float, Config]]) -> Config:
    """The oracle's pick (rules.fastest) among (time, config) pairs: the lowest time, ties to the first."""
    times = {c: t for t, c in timed}
    return fastest([c for _, c in timed], times.__getitem__)


def bucket_of(kernel: str, workload: Any) -> tuple[float, ...]:
    """Coordinates of a workload's bucket (its profile's serving_bucket): half-octave steps of the size axes the
    recorded backend interpolates on."""
    return profiles.profile(kernel).serving_bucket(workload)


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
                if follows_kv(self.kernel):
                    c = c.replace(PAGE_SIZE=self.kv.page_size, LAYOUT=self.kv.layout)
            else:
                c = self.config_at(bucket_of(self.kernel, workload))
            self._memo[workload] = c
        return c

    def config_at(self, bucket: tuple[float, ...]) -> Config:
        """The config of a bucket (`bucket_of` coordinates): the table's entry, else the nearest bucket's (squared
        distance in bucket coordinates; ties: the table's order). Only for a rule with a table."""
        if not self.table:
            raise ValueError(f"rule {self.name!r} of {self.kernel} has no table: it picks the family default per "
                             "workload (choose)")
        c = self.table.get(bucket)
        if c is None:
            d = ((self._coords - np.asarray(bucket)) ** 2).sum(axis=1)
            c = self.table[self._keys[int(np.argmin(d))]]
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
    workload falls back as everywhere else (dispatch.rules.fallback_config: the family default, then the slowest
    available config, the conservative bound; counted in `fallbacks`)."""

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
        if follows_kv(kernel) and (c.get("PAGE_SIZE") != kv.page_size or c.get("LAYOUT") != kv.layout):
            c = c.replace(PAGE_SIZE=kv.page_size, LAYOUT=kv.layout)
        if get_family(kernel).space.is_valid(c, workload) and self.answers.time_ms(kernel, workload, c) is not None:
            return c
        self.fallbacks += 1
        space = get_family(kernel).space
        d = get_family(kernel).default_config(workload)
        if follows_kv(kernel):
            d = d.replace(PAGE_SIZE=kv.page_size, LAYOUT=kv.layout)

        def time_of(cfg: Config) -> float | None:
            return self.answers.time_ms(kernel, workload, cfg) if space.is_valid(cfg, workload) else None

        chosen = fallback_config(d, time_of, lambda: [c for _, c in self.answers.ranked(
            kernel, workload, kv_key(kernel, kv))])
        if chosen is None:
            raise RuntimeError(
                f"backend {getattr(self.answers.backend, 'name', '?')!r} has no ok config for {kernel} on "
                f"{workload.key()} (KV layout {kv}); the trace produces shapes outside the backend's data: use a "
                "shorter max_num_batched_tokens, a lower rate_scale or a backend that covers them"
            )
        return chosen


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
            ranked = self.answers.ranked(kernel, workload, kv_key(kernel, kv))
            if not ranked:
                raise RuntimeError(f"oracle: backend has no ok config for {kernel} on {workload.key()} ({kv})")
            t, c = ranked[0]
            hit = self._memo[key] = (c, t * 1e-3, self.answers.estimated(kernel, workload, c))
        self.coverage.charge(kernel, hit[1], hit[2])
        return hit[0]



# ---- the catalogue of rules from the training traffic -------------------------------------------------------------

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


# Its keyword list repeats part of ServingEnv.__init__'s (duplicate scan): the env forwards these to it by name.
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
    spec = resolve_model(model)
    tr = resolve_trace(trace)
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
    run_windows(spec, tr, backend, lambda: _Recorder(answers, defaults), train_end, n_win, win, rate_scale, routing,
                sim_kwargs)

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
        on_kv = follows_kv(kernel)
        if on_kv:
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
                if on_kv else (lambda c: True)
            tag = f"@{kv.page_size}{kv.layout}" if on_kv else ""
            if on_kv and kv != DEFAULT_KV:
                kernel_rules.append(DispatchRule(kernel, f"default{tag}", {}, kv))
            oracle_table: dict[tuple[float, ...], Config] = {}
            for b, r in zip(bks, refs):
                ok = [(t, c) for c, t in r.times.items() if match(c)]
                if ok:
                    oracle_table[b] = _fastest_of(ok)
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
                        table[b] = _fastest_of(ok)
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
