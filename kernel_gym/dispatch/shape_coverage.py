"""How far a MoE shape lies from the shapes a policy was trained on: the coverage measure `export` and `tune` print.

Why: a model-conditioned policy answers any spec, but its answers are only as good as the training shapes around
it (issue: TP-8 shards with many small experts, top-k above 8, fell outside every published model the zoo held and
got 0.6x configs). So every zero-shot answer comes with the distance from its shape to the nearest trained shapes, in
a unit cube over the four numbers that fix a fused-MoE layer's GEMMs:

    log2 experts in [3, 9] (8-512), log2 top-k in [0, log2 10], log2 hidden in [10, 13] (1024-8192),
    log2 per-shard intermediate N in [5, 14] (32-16384)

each mapped to [0, 1] (values beyond the ranges map outside it). The percentile says how unusual that distance is:
the share of points drawn uniformly from the cube (a fixed sample) that lie nearer to a trained shape. A shape whose
percentile exceeds `WARN_PERCENTILE`, or that lies beyond the trained range on an axis, gets a warning: measure it
with `kernel-gym tune`.

Imports only the standard library and kernel_gym's spec floor (zoo): the GPU machine's `tune` calls it too.
"""

from __future__ import annotations

import ast
import json
import math
import random
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

AXES = (("experts", 3.0, 9.0), ("top_k", 0.0, math.log2(10)), ("hidden", 10.0, 13.0), ("intermediate", 5.0, 14.0))
WARN_PERCENTILE = 90.0
RANGE_SLACK = 0.05  # unit-cube distance beyond the trained range on one axis that counts as outside it
_REFERENCE_POINTS = 2048


@dataclass(frozen=True)
class Shape:
    """The four numbers that fix a fused-MoE layer's GEMMs, with the name of the spec (or shard) they come from."""

    name: str
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int

    def point(self) -> tuple[float, ...]:
        raw = (math.log2(self.num_experts), math.log2(self.top_k), math.log2(self.hidden),
               math.log2(self.intermediate))
        return tuple((v - lo) / (hi - lo) for v, (_, lo, hi) in zip(raw, AXES))


@dataclass(frozen=True)
class Coverage:
    """A shape's distance to the trained shapes (unit cube), its nearest ones, the percentile and the axes beyond the
    trained range."""

    shape: Shape
    distance: float
    nearest: tuple[tuple[str, float], ...]
    percentile: float
    outside: tuple[str, ...]
    trained: int

    @property
    def warn(self) -> bool:
        return self.percentile > WARN_PERCENTILE or bool(self.outside)

    def line(self) -> str:
        near = ", ".join(f"{n} ({d:.2f})" for n, d in self.nearest)
        s = self.shape
        text = (f"coverage {s.name} (E={s.num_experts}, top-k={s.top_k}, hidden={s.hidden}, N={s.intermediate}): "
                f"distance {self.distance:.3f} to the nearest of {self.trained} trained shapes, percentile "
                f"{self.percentile:.0f}; nearest {near}")
        if self.warn:
            why = f"beyond the trained range in {', '.join(self.outside)}" if self.outside else "far from them"
            text += (f". WARNING: this shape lies {why}; zero-shot configs may be poor here: measure it with "
                     "`kernel-gym tune`")
        return text

    def as_dict(self) -> dict[str, Any]:
        return {"shape": self.shape.__dict__, "distance": self.distance, "nearest": [list(n) for n in self.nearest],
                "percentile": self.percentile, "outside": list(self.outside), "trained_shapes": self.trained,
                "warning": self.warn}


def shape_of(spec: Any) -> Shape:
    """A Shape from a ModelSpec-like object or a mapping with its fields."""
    get = spec.get if isinstance(spec, dict) else lambda k: getattr(spec, k)
    return Shape(str(get("name")), int(get("num_experts")), int(get("top_k")), int(get("hidden")),
                 int(get("intermediate")))


def trained_shapes(provenance: dict[str, Any] | None = None) -> list[Shape]:
    """The MoE shapes a policy trained on: the specs its provenance lists (`model_specs`, as logged: JSON or a Python
    literal), else the zoo policy's training shards and the design (what `kernel-gym train --model zoo` uses)."""
    specs = (provenance or {}).get("model_specs")
    if isinstance(specs, str):
        try:
            specs = json.loads(specs)
        except ValueError:
            try:
                specs = ast.literal_eval(specs)
            except (ValueError, SyntaxError):
                specs = None
    if isinstance(specs, list) and specs:
        try:
            return _unique(shape_of(s) for s in specs)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass
    from kernel_gym import zoo

    shards = [s for s in zoo.zoo_shards(zoo.training_models("fused_moe")) if s.name not in zoo.TOO_LARGE]
    return _unique(shape_of(s) for s in [*shards, *zoo.DESIGN.values()])


def _unique(shapes: Iterable[Shape]) -> list[Shape]:
    out: dict[tuple, Shape] = {}
    for s in shapes:
        out.setdefault(s.point(), s)
    return list(out.values())


def _nearest(point: Sequence[float], trained: Sequence[Shape]) -> list[tuple[float, str]]:
    return sorted((math.dist(point, t.point()), t.name) for t in trained)


def _reference_distances(trained: Sequence[Shape]) -> list[float]:
    rng = random.Random(0)
    pts = [tuple(rng.random() for _ in AXES) for _ in range(_REFERENCE_POINTS)]
    tp = [t.point() for t in trained]
    return sorted(min(math.dist(p, q) for q in tp) for p in pts)


_REF_CACHE: dict[tuple, list[float]] = {}


def coverage(spec: Any, trained: Sequence[Shape] | None = None, k: int = 3) -> Coverage:
    """The coverage of one spec (ModelSpec, Shape or mapping) against `trained` (default: trained_shapes())."""
    shape = spec if isinstance(spec, Shape) else shape_of(spec)
    trained = list(trained) if trained is not None else trained_shapes()
    if not trained:
        raise ValueError("coverage: no trained shapes to compare with (the policy's provenance lists no model specs)")
    key = tuple(sorted(t.point() for t in trained))
    ref = _REF_CACHE.get(key)
    if ref is None:
        ref = _REF_CACHE[key] = _reference_distances(trained)
    p = shape.point()
    near = _nearest(p, trained)
    dist = near[0][0]
    below = sum(1 for d in ref if d <= dist)
    outside = []
    for i, (axis, _, _) in enumerate(AXES):
        lo, hi = min(t.point()[i] for t in trained), max(t.point()[i] for t in trained)
        if p[i] < lo - RANGE_SLACK or p[i] > hi + RANGE_SLACK:
            outside.append(axis)
    return Coverage(shape, dist, tuple((n, d) for d, n in near[:k]), 100.0 * below / len(ref), tuple(outside),
                    len(trained))
