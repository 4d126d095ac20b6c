"""What every kernel family shares: configs, knob spaces with validity rules, workloads, and the family interface.

A kernel family (prefill attention, decode attention, fused MoE) is one module in this package that exposes a
`FAMILY` object implementing `KernelFamily`. Everything downstream (measurement, environments, export) talks to
families through this interface and reads what else it needs about a kernel from its profile (kernels/profiles.py),
so adding a kernel takes its module, its profile and its env line (docs/architecture.md).

Imports only the standard library: this module runs on the GPU machine too.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

KnobValue = int | str

# Shared memory one block may use on the H200 (sm_90: the OutOfResources limit Triton reports; docs/architecture.md).
# Every family's shared-memory rule checks its estimate against this one number.
SHARED_MEMORY_LIMIT = 232448


class Config(Mapping[str, KnobValue]):
    """An immutable, hashable assignment of knob values (like triton.Config, but only the knobs).

    `str(config)` is canonical (sorted keys, compact JSON) and is what the measurement store keys on.
    """

    __slots__ = ("_items", "_dict", "_hash")

    def __init__(self, values: Mapping[str, KnobValue] | None = None, **kwargs: KnobValue) -> None:
        merged = dict(values or {}, **kwargs)
        self._items = tuple(sorted(merged.items()))
        self._dict = dict(self._items)
        self._hash = hash(self._items)

    def __getitem__(self, key: str) -> KnobValue:
        return self._dict[key]

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self._items == other._items

    def __repr__(self) -> str:
        return f"Config({', '.join(f'{k}={v!r}' for k, v in self._items)})"

    def __str__(self) -> str:
        return json.dumps(dict(self._items), separators=(",", ":"), sort_keys=True)

    def replace(self, **changes: KnobValue) -> Config:
        return Config(dict(self._items), **changes)

    @classmethod
    def parse(cls, text: str) -> Config:
        return cls(json.loads(text))


@dataclass(frozen=True)
class Knob:
    """One tunable parameter and the values it may take, in a meaningful order (small to large).

    `legacy`: for a knob added after measurements were stored, the value that reproduces the code from before it.
    Configs at that value leave the knob out, so every stored config string, exported table and logged catalogue
    keeps meaning what it meant (the store keys on `str(config)`)."""

    name: str
    values: tuple[KnobValue, ...]
    doc: str = ""
    legacy: KnobValue | None = None


class InvalidConfig(ValueError):
    """A config that the knob space's rules reject for a workload (named rule, never compiled)."""


VALID_CACHE_WORKLOADS = 4096  # workloads whose valid configs a space remembers (then it starts over)


class KnobSpace:
    """The product of a family's knobs, restricted by validity rules.

    `rules` are functions (config, workload) -> None or a string naming the violated rule
    (shared memory, registers, divisibility). A config is valid for a workload when no rule objects.
    """

    def __init__(self, knobs: Sequence[Knob], rules: Sequence[Callable[[Config, Any], str | None]] = ()) -> None:
        self.knobs = tuple(knobs)
        self.rules = tuple(rules)
        self.names = tuple(k.name for k in self.knobs)
        self._by_name = {k.name: k for k in self.knobs}
        self._optional = frozenset(k.name for k in self.knobs if k.legacy is not None)
        self._valid: dict[Any, tuple[Config, ...]] = {}  # valid_configs per workload
        self._all: tuple[Config, ...] | None = None  # all_configs, built once

    def __len__(self) -> int:
        n = 1
        for knob in self.knobs:
            n *= len(knob.values)
        return n

    def knob(self, name: str) -> Knob:
        knob = self._by_name.get(name)
        if knob is None:
            raise KeyError(f"no knob {name!r}; knobs are {list(self.names)}")
        return knob

    def config(self, values: Mapping[str, KnobValue]) -> Config:
        """The canonical Config of these knob values: knobs at their legacy value are left out."""
        legacy = {k.name: k.legacy for k in self.knobs if k.legacy is not None}
        return Config({n: v for n, v in values.items() if n not in legacy or v != legacy[n]})

    def value(self, config: Mapping[str, KnobValue], name: str) -> KnobValue:
        """A knob's value in a config, its legacy value where the config leaves it out."""
        knob = self.knob(name)
        return config[name] if name in config or knob.legacy is None else knob.legacy

    def all_configs(self) -> Iterator[Config]:
        """Every combination of knob values, valid or not, in a fixed order (canonical: see `config`)."""
        if self._all is None:  # built once: valid_configs walks it for every workload
            self._all = tuple(self.config(dict(zip(self.names, values)))
                              for values in itertools.product(*(k.values for k in self.knobs)))
        return iter(self._all)

    def later_knob_siblings(self, config: Config) -> list[Config]:
        """The configs that differ from `config` only in knobs added later (those with a legacy value), fewest
        changed first, then in the space's order (fixed, so a replay's prices never depend on the order of calls).
        Such knobs change how a program works (how it loads, how it combines), not the tiles or the grid, so a
        sibling's times are the nearest measured stand-in for a config nothing timed (Simulator._sibling_fit)."""
        later = [k for k in self.knobs if k.legacy is not None]
        values = {k.name: self.value(config, k.name) for k in self.knobs}
        out = []
        for combo in itertools.product(*(k.values for k in later)):
            changed = sum(v != values[k.name] for k, v in zip(later, combo))
            if changed:
                out.append((changed, self.config(values | {k.name: v for k, v in zip(later, combo)})))
        return [c for _, c in sorted(out, key=lambda x: x[0])]  # stable: the space's order within a distance

    def why_invalid(self, config: Config, workload: Any) -> str | None:
        """None when valid; otherwise the first violated rule's explanation."""
        return self._shape_reason(config) or self._rule_reason(config, workload)

    def _shape_reason(self, config: Config) -> str | None:
        """Whether the config is written in this space's knobs and values (what all_configs' configs are)."""
        names, known = set(config), set(self.names)
        if not known - self._optional <= names <= known:
            return f"config knobs {sorted(config)} differ from the space's knobs {sorted(self.names)}"
        for knob in self.knobs:
            if knob.name in config and config[knob.name] == knob.legacy:
                return (f"{knob.name}={knob.legacy!r} is written by leaving the knob out (its value before it "
                        f"existed): use KnobSpace.config")
            if self.value(config, knob.name) not in knob.values:
                return f"{knob.name}={config[knob.name]!r} is not one of {list(knob.values)}"
        return None

    def _rule_reason(self, config: Config, workload: Any) -> str | None:
        for rule in self.rules:
            reason = rule(config, workload)
            if reason:
                return reason
        return None

    def is_valid(self, config: Config, workload: Any) -> bool:
        return self.why_invalid(config, workload) is None

    def check(self, config: Config, workload: Any) -> None:
        reason = self.why_invalid(config, workload)
        if reason:
            raise InvalidConfig(f"{config} is invalid for {workload}: {reason}")

    def valid_configs(self, workload: Any) -> list[Config]:
        """Every valid config, in all_configs' order. Remembered per workload (workloads are frozen and hashable;
        knobs, rules and Configs are immutable): a space of ~10^4 combinations takes a fraction of a second through
        its rules, and export, tune, the envs and the planners ask for the same workloads many times."""
        try:
            cached = self._valid.get(workload)
        except TypeError:  # an unhashable workload: enumerated each time
            return [c for c in self.all_configs() if self._rule_reason(c, workload) is None]
        if cached is None:  # all_configs' configs are in the space's knobs by construction: only the rules decide
            cached = tuple(c for c in self.all_configs() if self._rule_reason(c, workload) is None)
            if len(self._valid) >= VALID_CACHE_WORKLOADS:
                self._valid.clear()
            self._valid[workload] = cached
        return list(cached)

    def sample(self, workload: Any, n: int, seed: int = 0) -> list[Config]:
        """Up to n distinct valid configs, drawn uniformly without replacement (deterministic per seed)."""
        valid = self.valid_configs(workload)
        rng = random.Random(seed)
        return valid if n >= len(valid) else rng.sample(valid, n)


class KernelFamily(Protocol):
    """The interface every kernel module exposes as `FAMILY`.

    name: the kernel's name (its profile's, kernels/profiles.py).
    space: the KnobSpace. workload_type: the Workload dataclass from kernel_gym.kernels.workloads.
    """

    name: str
    space: KnobSpace
    workload_type: type

    def default_config(self, workload: Any) -> Config:
        """What a user gets without tuning (Triton tutorial / vLLM-style heuristic)."""
        ...

    def make_inputs(self, workload: Any, device: str, seed: int = 0) -> Any:
        """Random inputs for the workload in workload.dtype (never zeros), in a config-independent layout.
        Config-dependent layout (KV page size and layout) is applied in prepare()."""
        ...

    def prepare(self, inputs: Any, config: Config) -> Callable[[], Any]:
        """Everything that is not the kernel (layout changes such as paging the KV cache for this config's page size,
        workspace allocation, grid computation), done once; returns a closure that launches the Triton kernel(s) with
        this explicit config and returns the output tensor. Timing measures only the closure."""
        ...

    def reference(self, inputs: Any) -> Any:
        """The torch reference output for the same inputs."""
        ...

    def tolerance(self, dtype: str) -> tuple[float, float]:
        """(atol, rtol) for comparing the kernel's output with reference() in this dtype name."""
        ...

    def flops(self, workload: Any) -> float:
        """Useful floating-point operations of one call (causal pairs only for attention)."""
        ...

    def bytes_moved(self, workload: Any) -> float:
        """Minimum bytes one call must move (attention: Q, K, V, O; decode: KV read; MoE: expert weights touched)."""
        ...


def run(family: KernelFamily, inputs: Any, config: Config) -> Any:
    """Prepare and launch once (tests, correctness checks)."""
    return family.prepare(inputs, config)()


def source_hash(*objects: Any) -> str:
    """Short hash of the given objects' source: the store key of a family without a profile (a test's or a fault
    injection's; registered families key on their profile's version)."""
    h = hashlib.sha256()
    for obj in objects:
        h.update(inspect.getsource(obj).encode())
    return h.hexdigest()[:16]
