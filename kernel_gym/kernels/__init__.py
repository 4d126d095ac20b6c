"""Triton kernel families. Each module exposes `FAMILY` (see space.KernelFamily); `get_family(name)` imports lazily
so that importing kernel_gym never imports triton. Which families exist, and where, is their profiles'
(kernels/profiles.py): FAMILY_MODULES and FAMILY_NAMES follow the registered profiles."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence

from kernel_gym.kernels import profiles as _profiles
from kernel_gym.kernels.space import Config, KernelFamily, Knob, KnobSpace


# Same methods as dispatch/observation.py's live Mappings (duplicate scan): that file is bundled without kernel_gym
# beside a logged model, so it cannot import this one; the methods are the ones Mapping asks for.
class _FamilyModules(Mapping[str, str]):
    """kernel -> import path of its module, read live from the registered profiles."""

    def __getitem__(self, name: str) -> str:
        p = _profiles.get(name)
        if p is None:
            raise KeyError(name)
        return p.module

    def __iter__(self) -> Iterator[str]:
        return iter(list(_profiles.PROFILES))

    def __len__(self) -> int:
        return len(_profiles.PROFILES)


class _FamilyNames(Sequence[str]):
    """The registered kernels' names, in registration order (live, like FAMILY_MODULES)."""

    def __getitem__(self, i):  # type: ignore[override]
        return tuple(_profiles.PROFILES)[i]

    def __len__(self) -> int:
        return len(_profiles.PROFILES)

    def __contains__(self, name: object) -> bool:
        return name in _profiles.PROFILES

    def __repr__(self) -> str:
        return repr(tuple(_profiles.PROFILES))


FAMILY_MODULES: Mapping[str, str] = _FamilyModules()
FAMILY_NAMES: Sequence[str] = _FamilyNames()


def get_family(name: str) -> KernelFamily:
    if name not in FAMILY_MODULES:
        raise ValueError(f"unknown kernel {name!r}: choose one of {list(FAMILY_NAMES)}")
    return importlib.import_module(FAMILY_MODULES[name]).FAMILY


__all__ = ["Config", "KernelFamily", "Knob", "KnobSpace", "FAMILY_NAMES", "get_family"]
