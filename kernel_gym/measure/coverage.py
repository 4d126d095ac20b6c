"""A backend wrapper that answers every workload a replay produces, from the nearest measured one, and says so.

The recorded H200 data covers a grid (prefill from 2112 causal pairs up, decode up to batch 256, MoE up to 6144
tokens); the store interpolates inside it and never extrapolates. An engine replay produces shapes beyond it (a
32-token prefill chunk, an 8192-token MoE step) and policies pick configs that were measured only at other shapes.
`CoveredBackend` answers both from measured neighbours, scaled by one roofline rule, and records every such answer so
that reports can show how much of a result rests on them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kernel_gym.kernels.space import Config
from kernel_gym.measure.recorded import RecordedBackend, _fixed_key, proxy_axes
from kernel_gym.measure.roofline import kernel_roofline, op_s
from kernel_gym.measure.types import UNAVAILABLE, Measurement


@dataclass(frozen=True)
class _Points:
    """Measured workloads sharing a query's fixed dimensions: axis coordinates, the workloads, stored row counts."""

    coords: np.ndarray  # (n, dims)
    workloads: list[Any]
    rows: np.ndarray  # (n,) stored rows per workload (tie-break: the better-measured neighbour)


def roofline_scale(kernel: str, query: Any, source: Any) -> float:
    """The one scaling rule: max(1, roofline(query) / roofline(source)), roofline = measure.roofline.op_s of
    kernel_roofline (flops at 792 TFLOP/s vs bytes at 4.27 TB/s). More work scales a time up; a smaller shape is
    never priced faster than the measurement it comes from (small calls are launch-bound)."""
    q, s = op_s(*kernel_roofline(kernel, query)), op_s(*kernel_roofline(kernel, source))
    return max(1.0, q / s) if s > 0 else 1.0


class CoveredBackend:
    """Wraps a backend so that every workload the simulator produces gets an answer, honestly and visibly.

    - proxy: a workload the data cannot answer (no config "ok" there) is answered at a proxy: its axis coordinates
      (recorded.proxy_axes: the profiles' interpolation axes of proxied kernels) clamped into the measured range
      when the store answers that point (MoE, decode: often by interpolation), else the measured workload of the
      same fixed dimensions nearest the clamped point (ties: the one with more stored rows). Answers carry source
      "recorded-proxy" (the inner backend's name + "-proxy");
      `proxied[(kernel, wkey)]` = (proxy workload, scale). `available_configs` lists the proxy's.
    - borrow: a config the data does not answer at a workload (not measured around it) gets its time at the nearest
      measured workload of the same fixed dimensions where it is "ok" (source "recorded-borrowed");
      `borrowed[(kernel, wkey, config)]` = that workload's key. Lets a policy serve a config measured only at other
      shapes (another KV layout's grid, a static config). Configs the family's rules reject are not borrowed.
    Scaling (both): times x `roofline_scale`, i.e. max(1, roofline ratio): never scaled down. Other fields (spread,
    repeats, compile_s) are the source measurement's. Backends without `workloads()` pass through unchanged.
    Workload keys and answers are memoised on the workload objects (workload.key() dominated replay time).
    """

    def __init__(self, inner: Any) -> None:
        if isinstance(inner, CoveredBackend):
            raise TypeError("CoveredBackend(inner): inner is already covered; use cover(backend) to wrap at most once")
        self.inner = inner
        self.name = getattr(inner, "name", "backend")
        self.deterministic = getattr(inner, "deterministic", True)
        self.proxied: dict[tuple[str, str], tuple[Any, float]] = {}
        self.borrowed: dict[tuple[str, str, Config], str] = {}
        self._rec = inner if isinstance(inner, RecordedBackend) else None
        self._covers = hasattr(inner, "workloads")
        self._keys: dict[Any, str] = {}
        self._cstr: dict[Config, str] = {}
        self._anchor: dict[tuple[str, Any], tuple[Any, float] | None] = {}
        self._points: dict[tuple[str, str], _Points | None] = {}
        self._measured: dict[tuple[str, Any, Config], Measurement] = {}
        self._avail: dict[tuple[str, Any], list[Config]] = {}

    # ---- memoised access to the inner backend ----------------------------------------------------------------------

    def _key(self, workload: Any) -> str:
        k = self._keys.get(workload)
        if k is None:
            k = self._keys[workload] = workload.key()
        return k

    def _raw(self, kernel: str, workload: Any, config: Config) -> Measurement:
        """The inner backend's answer; for a RecordedBackend through its memo without recomputing workload.key()."""
        b = self._rec
        if b is None:
            return self.inner.measure(kernel, workload, config)
        wkey = self._key(workload)
        memo = (kernel, wkey, config)
        m = b._answers.get(memo)
        if m is None:
            cs = self._cstr.get(config)
            if cs is None:
                cs = self._cstr[config] = str(config)
            pk = (kernel, wkey, "")
            plan = b._plans[pk] if pk in b._plans else b._plan(kernel, workload)
            m = b._answers[memo] = b._answer(kernel, workload, wkey, cs, plan)
        return m

    def _inner_available(self, kernel: str, workload: Any) -> list[Config]:
        b = self._rec
        if b is None:
            return list(self.inner.available_configs(kernel, workload))
        return [b._cfg(c) for c in b._candidate_configs(kernel, workload)
                if self._raw(kernel, workload, b._cfg(c)).ok]

    def _answerable(self, kernel: str, workload: Any) -> bool:
        """Whether the data answers some config "ok" here (recorded: stops at the first instead of timing all)."""
        b = self._rec
        if b is None:
            return bool(self.inner.available_configs(kernel, workload))
        return any(self._raw(kernel, workload, b._cfg(c)).ok for c in b._candidate_configs(kernel, workload))

    def _group(self, kernel: str, workload: Any) -> _Points | None:
        """The measured workloads sharing this workload's fixed dimensions (None: none, or an unknown kernel)."""
        axes = proxy_axes(kernel)
        if axes is None:
            return None
        varying, coords = axes.varying, axes.coords
        fixed = _fixed_key(workload, varying)
        key = (kernel, fixed)
        if key not in self._points:
            b = self._rec
            if b is not None:
                g = b._groups.get(kernel, {}).get(fixed)
                items = [] if g is None else [(p, b._workloads[kernel][k], len(b.rows(kernel).get(k, {})))
                                              for p, k in g.points.items()]
            else:
                items = [(coords(w), w, 0) for w in self.inner.workloads(kernel) if _fixed_key(w, varying) == fixed]
            self._points[key] = _Points(np.array([p for p, _, _ in items], dtype=np.float64),
                                        [w for _, w, _ in items], np.array([n for _, _, n in items])) if items else None
        return self._points[key]

    # ---- proxies -------------------------------------------------------------------------------------------------

    def _proxy(self, kernel: str, workload: Any) -> tuple[Any, float] | None:
        """(proxy workload, time scale), or None where the data answers the workload (or no proxy exists)."""
        key = (kernel, workload)
        if key in self._anchor:
            return self._anchor[key]
        hit = None
        if self._covers and not self._answerable(kernel, workload):
            proxy = self._find_proxy(kernel, workload)
            if proxy is not None:
                hit = self.proxied[(kernel, self._key(workload))] = (proxy, roofline_scale(kernel, workload, proxy))
        self._anchor[key] = hit
        return hit

    def anchor(self, kernel: str, workload: Any) -> tuple[Any, float]:
        """(workload to ask instead, time scale): (workload, 1.0) where the data answers it or no proxy exists."""
        return self._proxy(kernel, workload) or (workload, 1.0)

    def is_proxied(self, kernel: str, workload: Any) -> bool:
        return self._proxy(kernel, workload) is not None

    def _find_proxy(self, kernel: str, workload: Any) -> Any:
        pts = self._group(kernel, workload)
        if pts is None:
            return None
        q = np.asarray(proxy_axes(kernel).coords(workload), dtype=np.float64)
        clamped = np.clip(q, pts.coords.min(axis=0), pts.coords.max(axis=0))
        if not np.array_equal(clamped, q):
            cand = _from_coords(kernel, workload, clamped)
            if cand is not None and cand != workload and self._answerable(kernel, cand):
                return cand
        d = ((pts.coords - clamped) ** 2).sum(axis=1)
        best = min(range(len(d)), key=lambda i: (round(float(d[i]), 12), -int(pts.rows[i])))
        return pts.workloads[best]

    # ---- borrowed answers ----------------------------------------------------------------------------------------

    def _borrow(self, kernel: str, workload: Any, config: Config, m: Measurement) -> Measurement:
        pts = self._group(kernel, workload)
        if pts is None:
            return m
        space = self._rec._space(kernel) if self._rec is not None else None
        if space is not None and space.why_invalid(config, workload):
            return m
        q = np.asarray(proxy_axes(kernel).coords(workload), dtype=np.float64)
        d = ((pts.coords - q) ** 2).sum(axis=1)
        for i in np.lexsort((-pts.rows, d)):
            src = pts.workloads[int(i)]
            if src == workload:
                continue
            a = self._raw(kernel, src, config)
            if a.ok and a.median_ms:
                self.borrowed[(kernel, self._key(workload), config)] = self._key(src)
                scale = roofline_scale(kernel, workload, src)
                return replace(a, workload=self._key(workload), median_ms=a.median_ms * scale,
                               source=f"{self.name}-borrowed", reason=f"borrowed from {self._key(src)} x {scale:.3g}")
        return m

    # ---- the Backend protocol --------------------------------------------------------------------------------------

    def measure(self, kernel: str, workload: Any, config: Config) -> Measurement:
        memo = (kernel, workload, config)
        m = self._measured.get(memo)
        if m is None:
            p = self._proxy(kernel, workload)
            if p is None:
                m = self._raw(kernel, workload, config)
                if m.status == UNAVAILABLE and self._covers:
                    m = self._borrow(kernel, workload, config, m)
                    if m.status == UNAVAILABLE and self._group(kernel, workload) is None:
                        m = replace(m, reason=f"{m.reason}; the backend has no {kernel} measurement with the fixed "
                                    f"dimensions of {self._key(workload)} (another model or dtype?): collect that "
                                    "model's grid first")
            else:
                proxy, scale = p
                pm = self._raw(kernel, proxy, config)
                if pm.status == UNAVAILABLE:
                    m = self._borrow(kernel, workload, config, pm)
                else:
                    ms = pm.median_ms * scale if pm.median_ms else pm.median_ms
                    m = replace(pm, workload=self._key(workload), median_ms=ms, source=f"{self.name}-proxy",
                                reason=f"proxy {self._key(proxy)} x {scale:.3g}" + (f"; {pm.reason}" if pm.reason
                                                                                      else ""))
            self._measured[memo] = m
        return m

    def available_configs(self, kernel: str, workload: Any) -> list[Config]:
        """The configs answered "ok" at the workload, or at its proxy (borrowable configs are not listed)."""
        key = (kernel, workload)
        out = self._avail.get(key)
        if out is None:
            out = self._avail[key] = self._inner_available(kernel, self.anchor(kernel, workload)[0])
        return out


def _from_coords(kernel: str, workload: Any, c: np.ndarray) -> Any:
    """The workload at axis coordinates c (its profile's at_coords; None for prefill: one causal-pairs axis has no
    unique workload)."""
    at = proxy_axes(kernel).at_coords
    return None if at is None else at(workload, c)


def cover(backend: Any) -> Any:
    """Wrap a backend with a measured grid (`workloads()`) in CoveredBackend once; others answer every shape
    themselves and are returned as they are."""
    if isinstance(backend, CoveredBackend) or not hasattr(backend, "workloads"):
        return backend
    return CoveredBackend(backend)
