"""The deployment side of a learned policy: a dispatch table (plain JSON) and the `Dispatcher` serving code calls.

A dispatch table holds, per kernel family, a grid of workload buckets (two axes per kernel, bucket edges between
the grid points) and the config chosen for each bucket. Serving code calls `Dispatcher.choose(...)` (or the
per-kernel helpers) once per batch: two `bisect` calls and a list index, no model inference, no pickle. The table can be
swapped atomically while serving (`swap`), and `precompile(device)` compiles every config the table may choose at
start-up so no request pays a compile stall. The Dispatcher is also a `traffic.ConfigChooser`, so the serving
simulator replays "learned" through exactly this code.

Imports only the standard library at module level (the GPU machine runs it).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from kernel_gym.dispatch.rules import default_for, on_layout
from kernel_gym.kernels import profiles
from kernel_gym.kernels.profiles import EXPORT_SKEWS, prefill_lens  # noqa: F401 - re-exported (export, tests)
from kernel_gym.kernels.space import Config

DISPATCH_FORMAT = "kernel-gym-dispatch/1"
FIT_MEMO = 65536  # (config, shape) validity answers a Dispatcher remembers (then it starts over)


class _Axes(Mapping):
    """kernel -> (axis names, whether each axis is log-scaled): the profiles' `dispatch_axes`, read live. Bucket
    edges sit between grid points: geometric means on log axes, arithmetic means otherwise, so a lookup is a bisect
    on raw values (no log in the hot path)."""

    def __getitem__(self, kernel: str) -> tuple[tuple[str, str], tuple[bool, bool]]:
        p = profiles.get(kernel)
        if p is None or p.dispatch_axes is None:
            raise KeyError(kernel)
        return p.dispatch_axes

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, p in profiles.PROFILES.items() if p.dispatch_axes is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)


AXES: Mapping[str, tuple[tuple[str, str], tuple[bool, bool]]] = _Axes()


def _table_profile(kernel: str) -> profiles.KernelProfile:
    p = profiles.get(kernel)
    if p is None or p.dispatch_axes is None:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {sorted(AXES)}")
    return p


def axis_values(kernel: str, workload: Any) -> tuple[float, float]:
    """The two bucket coordinates of a workload (raw units)."""
    return _table_profile(kernel).axis_values(workload)


def grid_centers(kernel: str) -> tuple[list[float], list[float]]:
    """The bucket grid per axis (the profile's export_grid): the model's collection grid, plus skews for MoE and
    wider ranges for attention."""
    p = profiles.get(kernel)
    if p is None or p.export_grid is None:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {sorted(AXES)}")
    return p.export_grid()


def fixed_dims(kernel: str, model: Any, dtype: str = "bfloat16") -> dict[str, Any]:
    """The workload dimensions a model spec fixes for a kernel (its profile's fixed_fields)."""
    return {**{f: getattr(model, f) for f in profiles.profile(kernel).fixed_fields}, "dtype": dtype}


def cell_workload(kernel: str, fixed: dict[str, Any], x0: float, x1: float) -> Any:
    """The representative workload of the bucket centred at (x0, x1)."""
    return _table_profile(kernel).cell_workload(fixed, x0, x1)


def bucket_grid(kernel: str, model: Any, dtype: str = "bfloat16") -> tuple[list[float], list[float], list[Any]]:
    """(axis-0 centers, axis-1 centers, one representative workload per cell in row-major order)."""
    f = fixed_dims(kernel, model, dtype)
    c0, c1 = grid_centers(kernel)
    return c0, c1, [cell_workload(kernel, f, a, b) for a in c0 for b in c1]


def bucket_edges(centers: Sequence[float], log: bool) -> list[float]:
    """Boundaries between consecutive grid points (len(centers) - 1 of them)."""
    c = [float(x) for x in centers]
    if sorted(set(c)) != c:
        raise ValueError(f"bucket centers must be strictly increasing, got {c}")
    if log and c and c[0] <= 0:
        raise ValueError(f"log-scaled bucket centers must be > 0, got {c}")
    return [math.sqrt(a * b) if log else (a + b) / 2 for a, b in zip(c, c[1:])]


@dataclass
class KernelTable:
    """One kernel's buckets: `cells[i * len(centers[1]) + j]` indexes `configs` for the bucket (i, j).

    fixed: the workload dimensions the table was built for (heads, experts, hidden, ... from the model spec).
    policy: where the choices came from (model URI, run id, or "default"). kv_layout: decode only, the KV page size and
    layout the deployment should run with (every decode config in the table carries it)."""

    kernel: str
    centers: tuple[list[float], list[float]]
    configs: list[Config]
    cells: list[int]
    fixed: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    kv_layout: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.kernel not in AXES:
            raise ValueError(f"unknown kernel {self.kernel!r} in dispatch table: choose one of {sorted(AXES)}")
        self._profile = profiles.profile(self.kernel)
        _, logs = AXES[self.kernel]
        self.centers = ([float(x) for x in self.centers[0]], [float(x) for x in self.centers[1]])
        self.edges = (bucket_edges(self.centers[0], logs[0]), bucket_edges(self.centers[1], logs[1]))
        n = len(self.centers[0]) * len(self.centers[1])
        if len(self.cells) != n:
            raise ValueError(f"{self.kernel}: {len(self.cells)} cells for a {len(self.centers[0])} x "
                             f"{len(self.centers[1])} grid (need {n}); the table file is damaged: export it again")
        bad = [i for i in self.cells if not 0 <= i < len(self.configs)]
        if bad:
            raise ValueError(f"{self.kernel}: cell entries {bad[:5]} index past the {len(self.configs)} configs; "
                             "export the table again")
        for i, c in enumerate(self.configs):  # a table hands out only configs of the kernel's knob space
            problem = knob_problem(self.kernel, c)
            if problem:
                raise ValueError(f"{self.kernel}: configs[{i}] {dict(c)}: {problem}; the table is damaged or not "
                                 "for this kernel_gym: export it again")
        self._n1 = len(self.centers[1])

    def cell_workload(self, i: int, j: int) -> Any:
        """The representative workload of bucket (i, j) with the table's fixed dimensions (as export builds it)."""
        return self._profile.cell_workload(self.fixed, self.centers[0][i], self.centers[1][j])

    def invalid_cells(self) -> list[tuple[int, int, str]]:
        """(i, j, reason) of every bucket whose config the knob-space rules reject at the bucket's workload."""
        from kernel_gym.kernels import get_family

        space = get_family(self.kernel).space
        out = []
        for i in range(len(self.centers[0])):
            for j in range(self._n1):
                reason = space.why_invalid(self.configs[self.cells[i * self._n1 + j]], self.cell_workload(i, j))
                if reason:
                    out.append((i, j, reason))
        return out

    def lookup(self, x0: float, x1: float) -> Config:
        """The config of the bucket holding (x0, x1) (values outside the grid use the nearest edge bucket)."""
        i, j = self.bucket(x0, x1)
        return self.configs[self.cells[i * self._n1 + j]]

    def bucket(self, x0: float, x1: float) -> tuple[int, int]:
        if x0 != x0 or x1 != x1:  # NaN: bisect puts it past every edge, the largest bucket's config, silently
            (name0, name1), _ = AXES[self.kernel]
            raise ValueError(f"{self.kernel}: {name0}={x0}, {name1}={x1} is not a number; a config is looked up for "
                             "measured quantities (check how the caller computes them, e.g. a routing skew of an empty "
                             "batch)")
        return bisect_right(self.edges[0], x0), bisect_right(self.edges[1], x1)

    def adjacent(self, x0: float, x1: float) -> list[int]:
        """Indices into `configs` of the buckets one grid step from the bucket holding (x0, x1)."""
        i0, j0 = self.bucket(x0, x1)
        return [self.cells[i * self._n1 + j] for i, j in ((i0 - 1, j0), (i0 + 1, j0), (i0, j0 - 1), (i0, j0 + 1))
                if 0 <= i < len(self.centers[0]) and 0 <= j < self._n1]

    def to_dict(self) -> dict[str, Any]:
        names, logs = AXES[self.kernel]
        return {
            "axes": [{"name": n, "log": lg, "centers": c, "edges": e}
                     for n, lg, c, e in zip(names, logs, self.centers, self.edges)],
            "configs": [dict(c) for c in self.configs],
            "cells": list(self.cells),
            "fixed": self.fixed,
            "policy": self.policy,
            "kv_layout": self.kv_layout,
        }

    @classmethod
    def from_dict(cls, kernel: str, data: dict[str, Any]) -> KernelTable:
        try:
            axes = data["axes"]
            names = tuple(a["name"] for a in axes)
            if names != AXES.get(kernel, ((), ()))[0]:
                raise ValueError(f"{kernel}: axes {names} differ from {AXES.get(kernel, ((),))[0]}; the table was "
                                 "written by an incompatible version: export it again")
            return cls(kernel, (axes[0]["centers"], axes[1]["centers"]), [Config(c) for c in data["configs"]],
                       [int(i) for i in data["cells"]], dict(data.get("fixed") or {}), dict(data.get("policy") or {}),
                       data.get("kv_layout"))
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"{kernel}: malformed dispatch table entry ({exc!r}); export the table again") from exc


@dataclass
class DispatchTable:
    """Every kernel's buckets plus provenance: device, model spec, software versions, creation time."""

    kernels: dict[str, KernelTable]
    device: str = "NVIDIA H200"
    model: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": DISPATCH_FORMAT, "device": self.device, "model": self.model, "versions": self.versions,
                "meta": self.meta, "kernels": {k: t.to_dict() for k, t in self.kernels.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DispatchTable:
        if not isinstance(data, dict) or data.get("format") != DISPATCH_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a kernel_gym dispatch table (format {got!r}, expected {DISPATCH_FORMAT!r}); "
                             "write one with `kernel-gym export --format dispatch`")
        kernels = {k: KernelTable.from_dict(k, v) for k, v in (data.get("kernels") or {}).items()}
        if not kernels:
            raise ValueError("dispatch table has no kernels; export it again from a trained policy")
        return cls(kernels, str(data.get("device", "")), dict(data.get("model") or {}),
                   dict(data.get("versions") or {}), dict(data.get("meta") or {}))

    def save(self, path: str | Path) -> Path:
        """Write atomically (temp file + rename): a reader never sees half a table."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(self.to_dict(), indent=1))
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a crash never leaves an empty table in place
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> DispatchTable:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"dispatch table {path} does not exist; write it with `kernel-gym export`")
        if path.stat().st_size > 256 << 20:
            raise ValueError(f"{path}: {path.stat().st_size} bytes is not a dispatch table; export it again")
        try:
            data = json.loads(path.read_text(), object_pairs_hook=_no_duplicate_keys)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not valid JSON ({exc}); export the table again") from exc
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}; export the table again") from exc
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object hook: a key given twice (which the last one silently wins in json.loads) is refused."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


class Dispatcher:
    """Per-batch config lookup for serving code, and a `ConfigChooser` for the serving simulator.

    `choose(kernel, workload, kv)` returns the table's config for the workload's bucket; a decode config follows the
    KV layout in force (PAGE_SIZE and LAYOUT replaced if they differ, the default config if that is invalid). Kernels
    missing from the table get their family's default config. `swap(table)` replaces the table in one reference
    assignment (atomic for concurrent readers); `precompiled` is the set of (kernel, config) pairs the table may choose.
    """

    def __init__(self, table: DispatchTable) -> None:
        self._lock = threading.Lock()  # serialises writers (swap); readers never take it
        self._tables: dict[str, KernelTable] = dict(table.kernels)
        self.table = table
        self._follow: dict[tuple[Config, Any, Any], Config] = {}  # (config, KV layout, workload) -> moved config
        self._snap: dict[tuple[str, Config, tuple[Config, ...]], Config] = {}
        self._fits: dict[tuple[Any, ...], Config] = {}
        self._safe: dict[tuple[str, int, int], bool] = {}  # interior buckets whose config is valid at all corners
        self.swaps = 0

    @classmethod
    def load(cls, path: str | Path) -> Dispatcher:
        return cls(DispatchTable.load(path))

    # ---- the hot path ----

    def lookup(self, kernel: str, x0: float, x1: float) -> Config:
        """The config for bucket coordinates (see AXES) of one kernel."""
        t = self._tables.get(kernel)
        if t is None:
            why = self.table.meta.get("rests_on", {}).get(kernel, {}).get("why", "")
            raise KeyError(f"the dispatch table has no {kernel!r}; it holds {sorted(self._tables)}"
                           + (f" (export left it out: {why})" if why else "") + ": run the family's default config "
                           f"there, as choose({kernel!r}, workload, kv) answers for a kernel the table lacks")
        return t.lookup(x0, x1)

    def moe_config(self, num_tokens: int, skew: float = 0.0) -> Config:
        return self._lookup_fit("fused_moe", num_tokens, skew)

    def decode_config(self, batch: int, context_len: int) -> Config:
        return self._lookup_fit("decode_attention", batch, context_len)

    def prefill_config(self, seq_lens: Sequence[int]) -> Config:
        if not seq_lens:
            raise ValueError("prefill_config needs the step's prefill chunk lengths (a non-empty list)")
        return self._lookup_fit("prefill_attention", sum(seq_lens), max(seq_lens))

    def _lookup_fit(self, kernel: str, x0: float, x1: float) -> Config:
        """lookup(), made valid at the shape (x0, x1) with the table's fixed dimensions (`_fit`). A bucket whose
        config the rules accept at its four corners answers at once (the rules that move inside a bucket are
        thresholds on the axes, so a config valid at the corners is valid between them); the others, and the edge
        buckets (unbounded), check the shape itself."""
        t = self._tables.get(kernel)
        if t is None:
            return self.lookup(kernel, x0, x1)  # raises, naming why the table lacks it
        i, j = t.bucket(x0, x1)  # one bisect per axis: the bucket gives the config and the corner answer
        cfg = t.configs[t.cells[i * t._n1 + j]]
        cell = (kernel, i, j)
        safe = self._safe.get(cell)
        if safe is None:
            safe = self._safe[cell] = self._valid_at_corners(kernel, t, cfg, *cell[1:])
        if safe:
            return cfg
        key = (kernel, cfg, x0, x1)
        out = self._fits.get(key)
        if out is None:
            try:
                workload = t._profile.cell_workload(t.fixed, x0, x1)
            except (KeyError, TypeError, ValueError):  # no shape to check (a table without fixed dims, x0 < 1)
                return cfg
            out = self._remember(key, self._fit(kernel, t, cfg, workload))
        return out

    def choose(self, kernel: str, workload: Any, kv: Any = None) -> Config:
        """ConfigChooser: the config for this step's call of `kernel`."""
        t = self._tables.get(kernel)
        if t is None:
            return self._default(kernel, workload, kv)
        cfg = t.lookup(*t._profile.axis_values(workload))
        if t._profile.follows_kv and kv is not None and (cfg["PAGE_SIZE"] != kv.page_size
                                                          or cfg["LAYOUT"] != kv.layout):
            cfg = self._follow_kv(cfg, workload, kv)
        key = (kernel, cfg, workload)
        out = self._fits.get(key)
        return out if out is not None else self._remember(key, self._fit(kernel, t, cfg, workload))

    def choose_within(self, kernel: str, workload: Any, kv: Any, available: Sequence[Config]) -> Config:
        """choose(), kept inside `available`: the configs the deployment has data for at this shape (a mask of
        data availability and validity, as in training). The table's config if listed, else, of the policy's own
        choices in the adjacent buckets that are listed, the one nearest the table's config in knob space, else the
        listed config nearest it. Uses no timing: the learned path stays zero-measurement. The search stops at the
        adjacent buckets: searching the whole grid (as before) could answer a batch-1 long-context decode with a
        large-batch bucket's unsplit config, 2.5-4x slower there (the replay on dataset a827d5fc, where the new decode
        knobs were measured at few shapes: 0.848 of the oracle's kernel time on Azure code, OLMoE)."""
        cfg = self.choose(kernel, workload, kv)
        t = self._tables.get(kernel)
        if not available or cfg in available or t is None:
            return cfg
        x0, x1 = axis_values(kernel, workload)
        key = (kernel, cfg, t.bucket(x0, x1), tuple(available))
        out = self._snap.get(key)
        if out is None:
            ok = set(available)
            if t._profile.follows_kv and kv is not None:
                held = [(i, self._follow_kv(c, workload, kv)) for i, c in enumerate(t.configs)]
                ok_idx = {i for i, c in held if c in ok}
                moved = dict(held)
            else:
                ok_idx = {i for i, c in enumerate(t.configs) if c in ok}
                moved = dict(enumerate(t.configs))
            near = [moved[i] for i in dict.fromkeys(t.adjacent(x0, x1)) if i in ok_idx]
            out = nearest_config(cfg, near) if near else nearest_config(cfg, available, set(t.configs))
            self._snap[key] = out
        return out

    # ---- the rest ----

    def _fit(self, kernel: str, t: KernelTable, cfg: Config, workload: Any) -> Config:
        """cfg where the family's rules accept it at `workload`, else the nearest config they accept there (decode: on
        cfg's KV layout). A bucket's config is chosen at the bucket's centre, and some rules move inside a bucket
        (fused_moe's FUSE_SUM above 96 tokens, measured wrong on the H200; decode's split counts by batch and
        context, which its prepare() refuses), so a shape between two centres could get a config the kernel
        refuses or computes wrong there. A config the rules reject at its own bucket's centre is left as the table
        has it (export never writes one; check_table_for refuses such a table)."""
        from kernel_gym.kernels import get_family

        space = get_family(kernel).space
        if space.is_valid(cfg, workload):
            return cfg
        try:
            if not space.is_valid(cfg, t.cell_workload(*t.bucket(*t._profile.axis_values(workload)))):
                return cfg
        except (KeyError, TypeError, ValueError):  # a table without fixed dims: no centre to compare with
            pass
        kv = t._profile.follows_kv
        same_kv = (lambda c: c["PAGE_SIZE"] == cfg["PAGE_SIZE"] and c["LAYOUT"] == cfg["LAYOUT"]) if kv else None
        # the table's own configs first: a few dozen checks (microseconds each) and no compile a deployment did not
        # precompile; the whole space only when none of them fits
        own = [c for c in t.configs if (not kv or same_kv(c)) and space.is_valid(c, workload)]
        if own:
            return nearest_config(cfg, own, t.configs)
        if kv:  # on cfg's KV layout: the cache's pages are what they are (on_layout raises where none fits)
            return on_layout(cfg, workload, int(cfg["PAGE_SIZE"]), str(cfg["LAYOUT"]), kernel)
        valid = space.valid_configs(workload)
        return nearest_config(cfg, valid, t.configs) if valid else default_for(kernel, workload, None)

    @staticmethod
    def _valid_at_corners(kernel: str, t: KernelTable, cfg: Config, i: int, j: int) -> bool:
        """Whether the rules accept `cfg` at the four corners of the interior bucket (i, j); False for an edge
        bucket or a table without fixed dimensions (no corners to check)."""
        from kernel_gym.kernels import get_family

        e0, e1 = t.edges
        if not (0 < i < len(e0) and 0 < j < len(e1)):
            return False
        space = get_family(kernel).space
        try:
            return all(space.is_valid(cfg, t._profile.cell_workload(t.fixed, a, b))
                       for a in (e0[i - 1], e0[i]) for b in (e1[j - 1], e1[j]))
        except (KeyError, TypeError, ValueError):
            return False

    def _remember(self, key: tuple[Any, ...], cfg: Config) -> Config:
        if len(self._fits) >= FIT_MEMO:
            self._fits.clear()
        self._fits[key] = cfg
        return cfg

    def _follow_kv(self, cfg: Config, workload: Any, kv: Any) -> Config:
        """cfg moved onto the KV layout in force. Remembered per workload: where cfg's knobs are invalid on that
        layout, the nearest valid config depends on the batch and context (decode's split counts), so a memo keyed
        without them answered every later shape with the first shape's move (a served config that depended on the
        order of earlier calls)."""
        key = (cfg, kv, workload)
        out = self._follow.get(key)
        if out is None:
            if len(self._follow) >= FIT_MEMO:
                self._follow.clear()
            out = self._follow[key] = on_layout(cfg, workload, kv.page_size, kv.layout)
        return out

    def _default(self, kernel: str, workload: Any, kv: Any) -> Config:
        return default_for(kernel, workload, kv)

    @property
    def kv_layout(self) -> Any:
        """The KV layout the table was built for (a traffic.KVLayout), or None without a decode table."""
        t = next((t for t in self._tables.values() if t._profile.follows_kv and t.kv_layout), None)
        if t is None:
            return None
        from kernel_gym.traffic.simulator import KVLayout

        return KVLayout(int(t.kv_layout["page_size"]), str(t.kv_layout["layout"]))

    @property
    def precompiled(self) -> set[tuple[str, Config]]:
        """Every (kernel, config) the table may choose: the simulator charges no compile stall for these."""
        return {(k, c) for k, t in self._tables.items() for c in {t.configs[i] for i in t.cells}}

    def swap(self, table: DispatchTable) -> DispatchTable:
        """Replace the whole table at once (readers see the old or the new one, never a mix); returns the old one."""
        new = dict(table.kernels)
        with self._lock:
            old = self.table
            self._tables = new  # one reference assignment: atomic under the GIL
            self.table = table
            self._fits, self._safe = {}, {}  # the old table's answers made valid at a shape are not the new one's
            self.swaps += 1
        return old

    def precompile(self, device: str = "cpu", kernels: Iterable[str] | None = None) -> set[tuple[str, Config]]:
        """Compile every config the table may choose. device="cpu": nothing runs, returns the set (the simulator's
        `precompiled`); "cuda": prepares and launches each config once on small inputs of the table's shapes."""
        chosen = {(k, c) for k, c in self.precompiled if kernels is None or k in set(kernels)}
        if device == "cpu":
            return chosen
        if not device.startswith("cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        import torch

        from kernel_gym.kernels import get_family

        if not torch.cuda.is_available():  # at start-up, before any config: not torch's assertion on the first launch
            raise RuntimeError(f"precompile({device!r}): no CUDA device here (torch {torch.__version__}, "
                               f"{'a CPU build' if torch.version.cuda is None else 'CUDA ' + torch.version.cuda}); "
                               "run it on the serving GPU, or precompile('cpu') for the list only")
        for kernel, cfg in sorted(chosen, key=lambda kc: (kc[0], str(kc[1]))):
            family = get_family(kernel)
            wl = small_workload(kernel, self._tables[kernel].fixed)
            if not family.space.is_valid(cfg, wl):
                continue  # a config valid only for larger shapes compiles on first use at those shapes
            family.prepare(family.make_inputs(wl, device), cfg)()
        torch.cuda.synchronize()
        return chosen


def knob_problem(kernel: str, config: Config) -> str | None:
    """Why a config's knobs are not the kernel's (unknown or missing knobs, values outside a knob's list), else None."""
    from kernel_gym.kernels import get_family

    space = get_family(kernel).space
    optional = {k.name for k in space.knobs if k.legacy is not None}
    if not set(space.names) - optional <= set(config) <= set(space.names):
        return f"knobs {sorted(config)} differ from {kernel}'s {sorted(space.names)}"
    for knob in space.knobs:
        if knob.name in config and (isinstance(config[knob.name], bool) or config[knob.name] not in knob.values):
            return f"{knob.name}={config[knob.name]!r} is not one of {list(knob.values)}"
    return None


def check_table_for(table: DispatchTable, model: Any, where: str = "dispatch table") -> None:
    """Refuse (one line) a table made for another model or shape, or holding configs the knob-space rules reject at
    its own buckets: the table's model and every kernel's fixed dimensions must equal the spec's, and each bucket's
    config must be valid at the bucket's workload (a table of unusable choices cannot be scored as if it were one)."""
    name = getattr(model, "name", None)
    if table.model.get("name") != name:
        raise ValueError(f"{where} was exported for model {table.model.get('name')}, not {name}: pass --model with "
                         f"that model (its name, or the spec file it came from) or export a table for {name}")
    from kernel_gym.kernels.workloads import padded_head_dim

    for field_name, value in table.model.items():
        ours = getattr(model, field_name, value)
        if field_name == "head_dim" and (padded_head_dim(ours) or ours) == (padded_head_dim(value) or value):
            continue  # the spec as the kernels run it (models.kernel_spec: 96 zero-padded to 128)
        if field_name != "name" and hasattr(model, field_name) and ours != value:
            raise ValueError(f"{where}: its model {name} has {field_name}={value!r}, the spec "
                             f"{getattr(model, field_name)!r}: the table was made for another shape; export it "
                             "again for this spec")
    for kernel, t in table.kernels.items():
        for f in t._profile.fixed_fields:
            if f in t.fixed and hasattr(model, f) and t.fixed[f] != getattr(model, f):
                raise ValueError(f"{where}: {kernel} buckets are for {f}={t.fixed[f]}, the model {name} has "
                                 f"{getattr(model, f)}: the table was made for another shape; export it again")
            if f not in t.fixed:
                raise ValueError(f"{where}: {kernel} has no fixed {f}: export the table again")
        bad = t.invalid_cells()
        if bad:
            i, j, reason = bad[0]
            raise ValueError(f"{where}: {len(bad)} of {len(t.cells)} {kernel} buckets hold configs the knob-space "
                             f"rules reject there (first: bucket {t.centers[0][i]:g}, {t.centers[1][j]:g}: {reason});"
                             " export the table again")


def knob_distance(a: Config, b: Config) -> tuple[int, float]:
    """(knobs that differ, summed |log2| gap of the numeric ones): tile 64 is nearer 128 than 16."""
    diff, gap = 0, 0.0
    for k, v in a.items():
        w = b.get(k)
        if w == v:
            continue
        diff += 1
        if isinstance(v, (int, float)) and isinstance(w, (int, float)) and not isinstance(v, bool):
            gap += abs(math.log2(float(v) + 1.0) - math.log2(float(w) + 1.0))
        else:
            gap += 1.0
    return diff, gap


def nearest_config(cfg: Config, candidates: Sequence[Config], preferred: Iterable[Config] = ()) -> Config:
    """The candidate nearest `cfg` by knob_distance; ties: a `preferred` one, then the candidates' order."""
    if not candidates:
        raise ValueError(f"no candidate config to map {dict(cfg)} onto; pass the configs available for the workload")
    preferred = set(preferred)
    return min(enumerate(candidates), key=lambda ic: (*knob_distance(cfg, ic[1]), ic[1] not in preferred, ic[0]))[1]


def small_workload(kernel: str, fixed: dict[str, Any]) -> Any:
    """A small workload with the table's fixed dimensions (pre-compilation inputs)."""
    return _table_profile(kernel).small_workload(dict(fixed))


# ---- the deployment's KV layout for a decode table ------------------------------------------------------------------

LAYOUT_COVERAGE = 0.8  # a layout is a candidate if its moved choices have data on this share of the best coverage


def layout_scores(configs: Sequence[Config], wls: Sequence[Any], scorer: Any,
                  kernel: str = "decode_attention") -> dict[tuple[int, str], tuple[float, int]]:
    """Per KV layout (page size, layout): the policy's choices moved onto it (on_layout), scored on the measured data
    as (geomean over cells of best time / moved choice's time, cells with data). Cells where the moved config has no
    answer are skipped, so layouts are compared by quality and by how much of the grid the data covers."""
    from kernel_gym.kernels import get_family

    space = get_family(kernel).space
    pages = next(k.values for k in space.knobs if k.name == "PAGE_SIZE")
    layouts = next(k.values for k in space.knobs if k.name == "LAYOUT")
    out = {}
    best_ms: dict[int, float] = {}  # per cell, computed once for all layouts
    for ps in pages:
        for lay in layouts:
            logs = []
            for i, (c, w) in enumerate(zip(configs, wls)):
                try:
                    moved = on_layout(c, w, int(ps), str(lay))
                except ValueError:
                    continue
                t = scorer.measure(kernel, w, moved)
                if not (t.ok and t.median_ms):
                    continue  # outside the measured grid, or this config unmeasured around it
                if i not in best_ms:
                    best_ms[i] = scorer.best_measurement(kernel, w).median_ms
                logs.append(math.log(min(1.0, best_ms[i] / t.median_ms)))
            out[(int(ps), str(lay))] = (math.exp(sum(logs) / len(logs)) if logs else 0.0, len(logs))
    return out


def pick_layout(scores: dict[tuple[int, str], tuple[float, int]]) -> tuple[int, str] | None:
    """The best-scoring layout among those whose data covers at least LAYOUT_COVERAGE of the best-covered one's cells
    (a layout measured on a few easy cells must not win on them); None without data."""
    most = max((n for _, n in scores.values()), default=0)
    if most == 0:
        return None
    fair = {k: q for k, (q, n) in scores.items() if n >= LAYOUT_COVERAGE * most}
    return max(fair, key=fair.__getitem__)


def put_on_layout(kernel: str, configs: Sequence[Config], wls: Sequence[Any], kv_layout: tuple[int, str] | None,
                  scorer: Any = None) -> tuple[list[Config], dict[str, Any] | None]:
    """A table's configs on one KV layout, since a deployment runs one layout at a time (kernels whose profile
    follows_kv; others are returned as they are, with no layout): the one given; else, with measured data (`scorer`:
    the recorded backend), the layout on which the policy's moved choices measure best (layout_scores /
    pick_layout); else the layout the policy picks most often. Returns (configs, the table's kv_layout entry)."""
    if not profiles.profile(kernel).follows_kv:
        return list(configs), None
    chosen_by, scores = "given", {}
    if kv_layout is None and scorer is not None:
        print(f"export: scoring the decode choices on each KV layout in the measured data ({len(wls)} cells; "
              "~30 s on 2 cores)", file=sys.stderr, flush=True)
        scores = layout_scores(configs, wls, scorer, kernel)
        kv_layout, chosen_by = pick_layout(scores), "measured quality of the moved choices"
    if kv_layout is None:
        kv_layout = Counter((int(c["PAGE_SIZE"]), str(c["LAYOUT"])) for c in configs).most_common(1)[0][0]
        chosen_by = "the policy's most frequent layout"
    ps, lay = int(kv_layout[0]), str(kv_layout[1])
    moved = [on_layout(c, w, ps, lay) for c, w in zip(configs, wls)]
    return moved, {"page_size": ps, "layout": lay, "chosen_by": chosen_by,
                   "scores": {f"{p}:{l}": {"geomean": round(q, 4), "cells": n} for (p, l), (q, n) in scores.items()}}
