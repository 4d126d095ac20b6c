"""The decision rules the choosers share, one named function per rule (dispatch/__init__.py lists which chooser uses
which, and the rules that differ on purpose).

- fastest: the oracle: the config with the lowest time (ties: the first in the given order).
- slowest / fallback_config: what an evaluation charges when a choice has no time: the default config, else the
  slowest timed candidate (the conservative bound).
- on_layout / follow_kv / default_for: a decode config moved onto the KV layout in force (the same knobs if valid
  there, else the nearest valid config on that layout), and the family default on that layout.

Imports only the standard library, kernels.space and kernels.profiles at module level (the Dispatcher uses it on
the GPU machine).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from kernel_gym.kernels.profiles import follows_kv
from kernel_gym.kernels.space import Config


def fastest(configs: Iterable[Config], time_of: Callable[[Config], float]) -> Config:
    """The oracle's pick: the config of lowest `time_of` (ties: the first in `configs`' order)."""
    return min(configs, key=time_of)


def slowest(configs: Iterable[Config], time_of: Callable[[Config], float]) -> Config:
    """The config of highest `time_of` (ties: the first in `configs`' order)."""
    return max(configs, key=time_of)


def fallback_config(
    default: Config, time_of: Callable[[Config], float | None], candidates: Callable[[], Iterable[Config]]
) -> Config | None:
    """Evaluation's fallback for a choice without a time: `default` when it has a time, else the slowest candidate
    with a time (the conservative bound), None when no candidate has one. `candidates` is called only when the
    default has no time (listing them may cost measurements)."""
    if time_of(default) is not None:
        return default
    timed = [c for c in candidates() if time_of(c) is not None]
    return slowest(timed, time_of) if timed else None  # type: ignore[arg-type]


def on_layout(cfg: Config, workload: Any, page_size: int, layout: str, kernel: str = "decode_attention") -> Config:
    """A config of a kernel whose profile follows_kv (decode) moved to a KV layout: the same knobs if valid there,
    else the valid config on that layout that differs from it in the fewest knobs (ties: the space's order)."""
    from kernel_gym.kernels import get_family

    space = get_family(kernel).space
    moved = cfg.replace(PAGE_SIZE=page_size, LAYOUT=layout)
    if space.is_valid(moved, workload):
        return moved
    valid = [c for c in space.valid_configs(workload) if c["PAGE_SIZE"] == page_size and c["LAYOUT"] == layout]
    if not valid:
        raise ValueError(f"no decode config is valid for {workload} with PAGE_SIZE={page_size} LAYOUT={layout}")
    # knobs at their legacy value are left out of a config (KnobSpace.config): compare values, not keys
    return min(valid, key=lambda c: sum(space.value(c, k.name) != space.value(moved, k.name) for k in space.knobs))


def follow_kv(kernel: str, cfg: Config, workload: Any, kv: Any) -> Config:
    """A decode config on the KV layout in force (`kv`: a traffic.KVLayout or None; nearest valid config there)."""
    if follows_kv(kernel) and kv is not None and (cfg["PAGE_SIZE"], cfg["LAYOUT"]) != (kv.page_size, kv.layout):
        return on_layout(cfg, workload, kv.page_size, kv.layout, kernel)
    return cfg


def default_for(kernel: str, workload: Any, kv: Any) -> Config:
    """The family's default config, on the KV layout in force for decode (`kv`: a traffic.KVLayout or None)."""
    from kernel_gym.kernels import get_family

    cfg = get_family(kernel).default_config(workload)
    if follows_kv(kernel) and kv is not None:
        cfg = on_layout(cfg, workload, kv.page_size, kv.layout, kernel)
    return cfg


def kv_key(kernel: str, kv: Any) -> Any:
    """The KV layout as part of a chooser's memo key: the layout for kernels that follow it, else None."""
    return kv if follows_kv(kernel) else None
