"""Reference times, the config catalogue (the agent's action set) and policy evaluation against the oracle.

Why a catalogue: a knob space has hundreds to thousands of combinations and joint validity rules that per-knob
(MultiDiscrete) masks cannot express. The agent instead picks one entry of a flat list of configs worth choosing:
those that are fastest, or within `near` of fastest, on at least one training workload (chosen greedily so the
list stays short), plus every default config. It is built from the backend's measurements and stored with the policy.

Oracle: the best time over every config the backend can answer for a workload (`available_configs`). Rewards and
evaluation ratios are oracle_time / chosen_time in (0, 1], so they compare across shapes.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from kernel_gym.dispatch.rules import fallback_config, fastest
from kernel_gym.kernels.space import Config
from kernel_gym.measure.types import Measurement


@dataclass
class WorkloadReference:
    """Everything measured for one workload: ok times of available valid configs, failures, and the default."""

    workload: Any
    times: dict[Config, float]  # ok measurements (median ms)
    failures: dict[Config, Measurement]  # failed measurements with their status and reason
    default: Config
    available: frozenset[Config]

    @property
    def key(self) -> str:
        return self.workload.key()

    @property
    def best_time(self) -> float:
        return min(self.times.values())

    @property
    def best_config(self) -> Config:
        return fastest(self.times, self.times.__getitem__)

    def ratio(self, config: Config) -> float | None:
        """oracle_time / time(config), or None when the config has no ok measurement here."""
        t = self.times.get(config)
        return None if t is None else self.best_time / t

    def ratio_with_fallback(self, config: Config) -> tuple[float, bool]:
        """(ratio, failed): a config without an ok time falls back to the default config, as a dispatcher would;
        when the default has no ok time either, to the slowest ok config (the conservative bound):
        rules.fallback_config."""
        r = self.ratio(config)
        if r is not None:
            return r, False
        fallback = fallback_config(self.default, self.times.get, lambda: self.times)
        return self.best_time / self.times[fallback], True


def rule_mask(space: Any, configs: Sequence[Config], workload: Any) -> Any:
    """A deployment's action mask (numpy bool array): the catalogue entries the knob-space rules accept at the
    workload. Needs no data: what a logged or bundled policy masks with at a shape it never saw."""
    import numpy as np

    return np.array([space.is_valid(c, workload) for c in configs], dtype=bool)


def action_mask(space: Any, configs: Sequence[Config], ref: WorkloadReference, with_default: bool = True) -> Any:
    """Training's and evaluation's action mask (numpy bool array): the entries valid by the knob-space rules and
    available (answered by the backend) at the reference's workload, plus (with_default) the family default where
    it has a time. The one definition the envs, training's evaluation and its random baseline share."""
    import numpy as np

    w = ref.workload
    return np.array([(c in ref.available and space.is_valid(c, w)) or (with_default and c == ref.default
                                                                        and c in ref.times) for c in configs],
                    dtype=bool)


def measure_reference(
    backend: Any, family: Any, workloads: Iterable[Any], progress: Callable[[int, int], None] | None = None
) -> list[WorkloadReference]:
    """Measure every available, valid config of each workload (recorded backend: lookups; live: a full sweep).

    Workloads with no ok measurement at all are left out (nothing to compare against); `progress(done, total)` is
    called after each workload.
    """
    workloads = list(workloads)
    refs: list[WorkloadReference] = []
    for i, w in enumerate(workloads):
        available = [c for c in backend.available_configs(family.name, w) if family.space.is_valid(c, w)]
        default = family.default_config(w)
        times: dict[Config, float] = {}
        failures: dict[Config, Measurement] = {}
        for c in dict.fromkeys([*available, default]):
            m = backend.measure(family.name, w, c)
            if m.ok and m.median_ms is not None and m.median_ms > 0:
                times[c] = float(m.median_ms)
            else:
                failures[c] = m
        if times:
            refs.append(WorkloadReference(w, times, failures, default, frozenset(available)))
        if progress is not None:
            progress(i + 1, len(workloads))
    return refs


@dataclass
class Catalogue:
    """The agent's action set for one kernel: action i means configs[i]."""

    kernel: str
    configs: list[Config]
    near: float = 0.02
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.configs)

    def index(self, config: Config) -> int:
        return self.configs.index(config)

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "near": self.near, "configs": [dict(c) for c in self.configs], "meta": self.meta}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Catalogue:
        return cls(data["kernel"], [Config(c) for c in data["configs"]], data.get("near", 0.02), data.get("meta", {}))

    def save(self, path: Any) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: Any) -> Catalogue:
        with open(path) as f:
            return cls.from_dict(json.load(f))


# Action-space cap. 64 since the decode grid gained batches 3-48: its greedy cover then wanted 54 entries (48 cut it:
# held-out mixtral 0.969 -> 0.975 with the cap lifted, docs/agent.md); MoE (31-39) and prefill (13-14) stay below 48.
MAX_CATALOGUE = 64


class NoMeasurementsError(ValueError):
    """The data holds no ok time for any workload of the kernel (e.g. a model without that family's rows): nothing
    to build a catalogue from or to score. A ValueError, so callers that report bad input keep doing so."""


def build_catalogue(
    kernel: str, refs: Sequence[WorkloadReference], near: float = 0.02, max_size: int = MAX_CATALOGUE, depth: int = 1
) -> Catalogue:
    """Greedy cover: start from the default configs, then repeatedly add the candidate config (within `near` of the
    best on some training workload) that most raises the summed log of each workload's best reachable ratio, until
    every workload has a config within `near` of its oracle or `max_size` entries are chosen.

    depth > 1 then adds each training workload's `depth` fastest configs (most often top-`depth` first, up to
    `max_size`): a spare near-best choice wherever the winner is not measured (the recorded grid measures a
    different config sample on neighbouring workloads, so a held-out workload may lack its neighbours' winner)."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    if not refs:
        raise NoMeasurementsError(f"no {kernel} workload has an ok measurement: cannot build a catalogue (check the "
                                  "backend)")
    if not 0 <= near < 1:
        raise ValueError(f"near must be in [0, 1), got {near}")
    chosen: list[Config] = list(dict.fromkeys(r.default for r in refs))
    candidates: list[Config] = []
    for r in refs:
        for c, t in r.times.items():
            if r.best_time / t >= 1 - near:
                candidates.append(c)
    candidates = [c for c in dict.fromkeys(candidates) if c not in chosen]
    floor = 1e-3
    cover = [max([r.ratio(c) or floor for c in chosen] + [floor]) for r in refs]
    while candidates and len(chosen) < max_size and min(cover) < 1 - near:
        best_gain, best_c = 0.0, None
        for c in candidates:
            gain = 0.0
            for i, r in enumerate(refs):
                rc = r.ratio(c)
                if rc is not None and rc > cover[i]:
                    gain += math.log(rc / cover[i])
            if gain > best_gain + 1e-12:
                best_gain, best_c = gain, c
        if best_c is None:
            break
        chosen.append(best_c)
        candidates.remove(best_c)
        cover = [max(cover[i], r.ratio(best_c) or floor) for i, r in enumerate(refs)]
    if depth > 1:
        tops: dict[Config, int] = {}
        for r in refs:
            for c in sorted(r.times, key=r.times.__getitem__)[:depth]:
                tops[c] = tops.get(c, 0) + 1
        for c in sorted(tops, key=lambda c: -tops[c]):  # stable: ties keep first-seen order
            if len(chosen) >= max_size:
                break
            if c not in chosen:
                chosen.append(c)
        cover = [max([r.ratio(c) or floor for c in chosen] + [floor]) for r in refs]
    meta = {
        "depth": depth,
        "train_workloads": len(refs),
        "covered_geomean": geomean(cover),
        "covered_min": min(cover),
        "num_defaults": len(dict.fromkeys(r.default for r in refs)),
    }
    return Catalogue(kernel, chosen, near, meta)


def geomean(values: Sequence[float]) -> float:
    if not values:
        return float("nan")
    if min(values) <= 0:
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def best_static_config(refs: Sequence[WorkloadReference]) -> Config:
    """The one config with the best geomean ratio across these (training) workloads, failures falling back to the
    default as in `WorkloadReference.ratio_with_fallback`."""
    if not refs:
        raise ValueError("best_static_config needs at least one workload reference")
    candidates = list(dict.fromkeys(c for r in refs for c in r.times))
    return max(candidates, key=lambda c: geomean([r.ratio_with_fallback(c)[0] for r in refs]))


def primary_value(workload: Any) -> float:
    """The workload's value on its primary axis, its first feature (MoE tokens, decode batch, prefill total tokens; log2
    units), rounded so that equal shapes compare equal."""
    return round(next(iter(workload.features().values())), 9)


def split_workloads(
    workloads: Sequence[Any], holdout: float = 0.25, seed: int = 0, keep: Iterable[str] = ()
) -> tuple[list[Any], list[Any]]:
    """Deterministic train / held-out split that makes held-out workloads interpolations between training ones.

    Whole values of the primary axis (the first feature: tokens, batch, total tokens) are held out, so no held-out
    workload shares its batch size with a training workload: never the smallest or the largest value, never two
    neighbouring values (each held-out value has training values on both sides), never a value with a `keep`
    workload (anchors, e.g. the exhaustively measured eval grid). Candidate values are tried in a seeded order until
    the held-out share reaches `holdout`. With fewer than 3 distinct values, single workloads are held out instead
    (seeded shuffle, the extremes kept)."""
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    ws = sorted(workloads, key=lambda w: w.key())
    if holdout == 0 or len(ws) < 3:
        return list(ws), []
    first = primary_value
    values = sorted({first(w) for w in ws})
    target = max(1, round(holdout * len(ws)))
    if len(values) < 3:
        ends = {min(ws, key=first).key(), max(ws, key=first).key()}
        pool = [w for w in ws if w.key() not in ends]
        random.Random(seed).shuffle(pool)
        out_keys = {w.key() for w in pool[: min(len(pool), target)]}
    else:
        keep = set(keep)
        anchored = {first(w) for w in ws if w.key() in keep}
        count = {v: sum(first(w) == v for w in ws) for v in values}
        order = [i for i in range(1, len(values) - 1) if values[i] not in anchored]
        random.Random(seed).shuffle(order)
        taken: set[int] = set()
        held = 0
        for i in order:
            if held >= target:
                break
            if i - 1 in taken or i + 1 in taken:
                continue
            taken.add(i)
            held += count[values[i]]
        out_values = {values[i] for i in taken}
        out_keys = {w.key() for w in ws if first(w) in out_values}
    return [w for w in ws if w.key() not in out_keys], [w for w in ws if w.key() in out_keys]


def split_references(
    refs: Sequence[WorkloadReference], holdout: float = 0.25, seed: int = 0, keep: Iterable[str] = ()
) -> tuple[list[WorkloadReference], list[WorkloadReference]]:
    """split_workloads over measured workloads only (a workload without data can neither train nor be scored, and
    must not count as the largest value that keeps the split an interpolation)."""
    by_key = {r.key: r for r in refs}
    train, out = split_workloads([r.workload for r in refs], holdout, seed, keep)
    return [by_key[w.key()] for w in train], [by_key[w.key()] for w in out]


@dataclass
class Evaluation:
    """Held-out quality: geomean of oracle_time / chosen_time for the policy, the default config and the best static
    config; per-workload rows for plots and JSON."""

    geomean_policy: float
    geomean_default: float
    geomean_static: float
    num_workloads: int
    policy_failures: int
    static_config: str
    rows: list[dict[str, Any]]

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        return {
            f"{prefix}geomean_policy": self.geomean_policy,
            f"{prefix}geomean_default": self.geomean_default,
            f"{prefix}geomean_static": self.geomean_static,
            f"{prefix}policy_failures": float(self.policy_failures),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "geomean_policy": self.geomean_policy,
            "geomean_default": self.geomean_default,
            "geomean_static": self.geomean_static,
            "num_workloads": self.num_workloads,
            "policy_failures": self.policy_failures,
            "static_config": self.static_config,
            "rows": self.rows,
        }


def evaluate_choices(
    refs: Sequence[WorkloadReference], choose: Callable[[WorkloadReference], Config], static: Config
) -> Evaluation:
    """Score a chooser (workload reference -> config, made without measuring) on these workloads."""
    rows, pol, dfl, sta, failures = [], [], [], [], 0
    for r in refs:
        c = choose(r)
        rp, failed = r.ratio_with_fallback(c)
        rd, _ = r.ratio_with_fallback(r.default)
        rs, _ = r.ratio_with_fallback(static)
        failures += failed
        pol.append(rp)
        dfl.append(rd)
        sta.append(rs)
        rows.append(
            {
                "workload": r.key,
                "chosen": str(c),
                "ratio_policy": rp,
                "policy_failed": failed,
                "ratio_default": rd,
                "ratio_static": rs,
                "oracle_config": str(r.best_config),
                "oracle_ms": r.best_time,
            }
        )
    return Evaluation(geomean(pol), geomean(dfl), geomean(sta), len(refs), failures, str(static), rows)
