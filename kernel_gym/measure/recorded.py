"""The recorded backend: answers from stored measurements, interpolating between measured shapes, never inventing.

Exact hits return the stored row (source "recorded"; failures stay failures with their reason). Between measured
workloads of the same kernel and the same fixed dimensions (heads, head_dim, experts, top_k, hidden, intermediate,
dtype), log(time) is interpolated multilinearly over the workload's axes (each profile's `interpolation`,
kernels/profiles.py):

- fused_moe: (log2 num_tokens, skew), bilinear;
- decode_attention: (log2 batch, log2 context_len), bilinear;
- prefill_attention: (log2 causal pairs,), linear (causal pairs is the work; the mix of lengths is not an axis);
- prefix_prefill: (log2 chunk tokens, log2(longest prefix + PREFIX_OFFSET)), bilinear, among workloads of one batch
  shape (number of requests, each chunk's share of the tokens, each prefix's share of the longest; its `shape_key`). A
  workload without any prefix belongs to every prefix pattern of its chunk shape: it is the p = 0 edge of each.

The query must lie inside the measured range on every axis, its bracketing neighbours must be at most MAX_GAP apart,
every corner of the bracketing cell must be a measured workload, and the config must be measured "ok" at every corner.
Otherwise the answer is UNAVAILABLE (masked). If the config failed at every corner with the same status, that status
is returned. Lookups are plain dict and float work with memoised plans (>= 20,000 lookups/s on one core:
benchmarks/recorded_backend/run.py). Imports only numpy and the standard library.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_gym.kernels import profiles
from kernel_gym.kernels.profiles import PREFIX_OFFSET, Interpolation  # noqa: F401 - PREFIX_OFFSET: re-exported
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import parse_key
from kernel_gym.measure.store import PACKAGED_SNAPSHOT, Context, load_rows
from kernel_gym.measure.types import OK, UNAVAILABLE, Measurement


def interpolation(kernel: str) -> Interpolation | None:
    """A kernel's interpolation axes (its profile's), None for exact hits only."""
    p = profiles.get(kernel)
    return None if p is None else p.interpolation


def proxy_axes(kernel: str) -> Interpolation | None:
    """The axes measure/coverage.py proxies a kernel along: its interpolation axes when its profile says it is
    proxied (it has a roofline to scale by). prefix_prefill is interpolated, never proxied: a chunk call outside its
    measured grid stays unanswered, and the simulator charges its stand-in, counted as estimated."""
    p = profiles.get(kernel)
    return p.interpolation if p is not None and p.proxied else None


_EPS = 1e-9
# An ok row whose samples spread more than this ((p90 - p10) / median) is left out: its median can be several times
# the kernel's time (host launch delays reached into the timed interval while the GPU machine's CPUs were contended,
# docs/measurement.md), so it cannot rank configs. Left-out rows count as unmeasured, never as failures.
MAX_SPREAD = 0.5


def current_source_hash(kernel: str) -> str | None:
    """The store key of this checkout's kernel code: its profile's version key (None for a kernel without a
    profile: no preference)."""
    p = profiles.get(kernel)
    return None if p is None else p.store_key


def _fixed_key(workload: Any, varying: tuple[str, ...]) -> str:
    data = json.loads(workload.key())
    for name in varying:
        data.pop(name, None)
    axes = interpolation(data.get("kernel", ""))
    if axes is not None and axes.shape_key is not None:
        data.update(axes.shape_key(workload))
    return json.dumps(data, sort_keys=True)


def _edge_key(fixed: str) -> str | None:
    """The fixed key of the no-prefix edge of a prefix_prefill group with a prefix pattern (None for any other)."""
    data = json.loads(fixed)
    if data.get("prefix_shares") is None:
        return None
    data["prefix_shares"] = None
    return json.dumps(data, sort_keys=True)


@dataclass
class _Group:
    """Measured workloads sharing the fixed dimensions: their axis coordinates, per-axis sorted values."""

    points: dict[tuple[float, ...], str] = field(default_factory=dict)  # rounded coords -> workload key
    values: list[list[float]] = field(default_factory=list)


@dataclass(frozen=True)
class _Plan:
    corners: tuple[tuple[str, float], ...]  # (workload key, weight); one corner of weight 1 = exact hit
    reason: str = ""


class RecordedBackend:
    """Stored measurements (snapshot .jsonl.gz or store .sqlite) for one device and software context."""

    name = "recorded"

    def __init__(self, path: str | Path | None = None, device: str | None = None,
                 groups: list[tuple[Context, list[Measurement]]] | None = None, check_validity: bool = True,
                 max_spread: float | None = None) -> None:
        self.dataset_hash = ""  # sha256 (16 hex) of the file the rows came from: the data a policy was trained on
        if groups is None:
            source = Path(path or PACKAGED_SNAPSHOT)
            groups = load_rows(source)
            if source.is_file():
                self.dataset_hash = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
        if not groups:
            raise ValueError(f"no measurements in {path or PACKAGED_SNAPSHOT}")
        rows_per_device = Counter()
        for ctx, ms in groups:
            rows_per_device[ctx.device] += len(ms)
        where = path or PACKAGED_SNAPSHOT
        if device is None and len(rows_per_device) > 1:  # never price one GPU's policy with another GPU's rows
            mix = ", ".join(f"{d!r}: {n} rows" for d, n in rows_per_device.most_common())
            raise ValueError(f"{where} holds rows of {len(rows_per_device)} devices ({mix}): pass --device NAME to "
                             "choose the one to price with")
        if device is None:
            device = next(iter(rows_per_device))
        elif device not in rows_per_device:
            raise ValueError(f"no measurements for device {device!r}; the data has {sorted(rows_per_device)}")
        self.device = device
        # per kernel, one context (torch, triton, source hash): the current code's source when rows of it exist (the
        # most rows among those), else the context with the most rows; a mix is announced (self.notes), not blended
        by_kernel: dict[str, Counter] = defaultdict(Counter)
        for ctx, ms in groups:
            if ctx.device == device:
                by_kernel[ctx.kernel][ctx] += len(ms)
        self.contexts: dict[str, Context] = {}
        self.notes: list[str] = []
        for k, counts in by_kernel.items():
            current = current_source_hash(k) if len(counts) > 1 else None
            ours = Counter({c: n for c, n in counts.items() if c.source_hash == current})
            chosen = (ours or counts).most_common(1)[0][0]
            self.contexts[k] = chosen
            others = [(c, n) for c, n in counts.items() if c != chosen]
            if others:
                self.notes.append(
                    f"{k}: pricing with source {chosen.source_hash} (triton {chosen.triton_version}, "
                    f"{counts[chosen]} rows"
                    f"{', the current code' if chosen.source_hash == current else ''}); not used: "
                    + ", ".join(f"source {c.source_hash} triton {c.triton_version} ({n} rows"
                                f"{', the current code: newer rows exist' if c.source_hash == current else ''})"
                                for c, n in others))
        for note in self.notes:  # every user of the backend sees a mix, not only replay
            print(f"warning: recorded data {where}: {note}", file=sys.stderr, flush=True)
        self._rows: dict[str, dict[str, dict[str, Measurement]]] = defaultdict(dict)  # kernel -> wkey -> cfg -> m
        self.max_spread = MAX_SPREAD if max_spread is None else max_spread
        self.noisy: Counter = Counter()  # per kernel: ok rows left out as too noisy to rank configs by
        self._stored: dict[str, set[tuple[str, str]]] = defaultdict(set)  # every stored (workload, config)
        for ctx, ms in groups:
            if self.contexts.get(ctx.kernel) == ctx:
                table = self._rows[ctx.kernel]
                self._stored[ctx.kernel].update((m.workload, m.config) for m in ms)
                for m in ms:
                    if m.ok and m.spread is not None and m.spread > self.max_spread:
                        self.noisy[ctx.kernel] += 1
                        continue
                    table.setdefault(m.workload, {})[m.config] = m
        self._workloads: dict[str, dict[str, Any]] = {}
        self._groups: dict[str, dict[str, _Group]] = {}
        for kernel, table in self._rows.items():
            self._index(kernel, table)
        self._plans: dict[tuple[str, str, str], _Plan | None] = {}
        self._answers: dict[tuple[str, str, Config], Measurement] = {}
        self._configs: dict[str, Config] = {}
        self._check_validity = check_validity
        self._spaces: dict[str, Any] = {}
        self._described: dict[str, Any] | None = None

    def describe(self) -> dict[str, Any]:
        """What prices: the device and, per kernel, the source hash, versions, row count and the clocks its rows were
        timed under (power.power_states; printed by replay and the summaries beside their numbers, and written into
        every results file priced from this data, since an absolute time means little without its clocks)."""
        if self._described is None:
            from kernel_gym.measure.power import power_states

            self._described = {
                "device": self.device, "dataset_hash": self.dataset_hash, "notes": list(self.notes),
                "kernels": {k: {"source_hash": c.source_hash, "triton": c.triton_version, "torch": c.torch_version,
                                "rows": sum(len(v) for v in self._rows.get(k, {}).values()),
                                "power": power_states([m.power for v in self._rows.get(k, {}).values()
                                                       for m in v.values() if m.ok])}
                            for k, c in sorted(self.contexts.items())}}
        return copy.deepcopy(self._described)

    def describe_line(self) -> str:
        d = self.describe()
        def clocks(pw: dict[str, Any]) -> str:
            sm = pw["sm_mhz_p10_p50_p90"]
            return (f"; {pw['rows_recorded']} with clocks, SM p50 {sm[1]:.0f} MHz, {pw['share_slowed']:.0%} slowed"
                    if pw["rows_recorded"] and sm and pw["share_slowed"] is not None else "")

        return (f"recorded data: device {d['device']}; " + "; ".join(
            f"{k} source {v['source_hash']} (triton {v['triton']}, {v['rows']} rows{clocks(v['power'])})"
            for k, v in d["kernels"].items()))

    # ---- indexing --------------------------------------------------------------------------------------------

    def _workload(self, kernel: str, wkey: str) -> Any:
        p = profiles.get(kernel)
        return None if p is None else parse_key(p.workload_type(), wkey)

    def _index(self, kernel: str, table: dict[str, dict[str, Measurement]]) -> None:
        self._workloads[kernel] = {w: self._workload(kernel, w) for w in table}
        groups: dict[str, _Group] = {}
        axes = interpolation(kernel)
        if axes is not None:
            varying, coords = axes.varying, axes.coords
            for wkey, wl in self._workloads[kernel].items():
                g = groups.setdefault(_fixed_key(wl, varying), _Group())
                g.points.setdefault(tuple(round(x, 9) for x in coords(wl)), wkey)
            if axes.shape_key is not None:  # the no-prefix workloads join every prefix pattern of their chunk shape
                for fixed, g in groups.items():
                    edge = groups.get(_edge_key(fixed) or "")
                    if edge is not None and edge is not g:
                        for point, wkey in edge.points.items():
                            g.points.setdefault(point, wkey)
            for g in groups.values():
                dims = len(next(iter(g.points)))
                g.values = [sorted({p[d] for p in g.points}) for d in range(dims)]
        self._groups[kernel] = groups

    # ---- planning ----------------------------------------------------------------------------------------------

    def _plan(self, kernel: str, workload: Any, exclude: str = "") -> _Plan | None:
        """Corners and weights answering a workload (None: unknown kernel). `exclude` hides one measured workload
        (held-out error estimation)."""
        wkey = workload.key()
        memo = (kernel, wkey, exclude)
        if memo in self._plans:
            return self._plans[memo]
        plan = self._make_plan(kernel, workload, wkey, exclude)
        self._plans[memo] = plan
        return plan

    def _make_plan(self, kernel: str, workload: Any, wkey: str, exclude: str) -> _Plan | None:
        table = self._rows.get(kernel)
        if table is None:
            return None
        if wkey in table and wkey != exclude:
            return _Plan(((wkey, 1.0),))
        axes = interpolation(kernel)
        if axes is None:
            return _Plan((), f"workload not measured and {kernel} has no interpolation axes")
        varying, coords, max_gap = axes.varying, axes.coords, axes.max_gap
        g = self._groups[kernel].get(_fixed_key(workload, varying))
        if g is None:
            return _Plan((), "no measured workload with these fixed dimensions")
        q = coords(workload)
        if not exclude:
            return self._grid_plan(g, q, max_gap, "", None)
        # held out: interpolate along one axis at a time (the held-out point's coordinate removed from that axis)
        plan = _Plan((), "no axis brackets the held-out workload")
        for d in range(len(q)):
            plan = self._grid_plan(g, q, max_gap, exclude, (d, round(q[d], 9)))
            if plan.corners:
                return plan
        return plan

    @staticmethod
    def _grid_plan(g: _Group, q: tuple[float, ...], max_gap: tuple[float, ...], exclude: str,
                   drop: tuple[int, float] | None) -> _Plan:
        per_axis: list[list[tuple[float, float]]] = []  # per axis: (coordinate, weight)
        for d, x in enumerate(q):
            vals = g.values[d]
            if drop is not None and drop[0] == d:
                vals = [v for v in vals if v != drop[1]]
            if not vals or x < vals[0] - _EPS or x > vals[-1] + _EPS:
                return _Plan((), f"axis {d} value {x:.3f} outside the measured range")
            hit = [v for v in vals if abs(v - x) <= _EPS]
            if hit:
                per_axis.append([(hit[0], 1.0)])
                continue
            hi = next(i for i, v in enumerate(vals) if v > x)
            lo_v, hi_v = vals[hi - 1], vals[hi]
            if hi_v - lo_v > max_gap[d] + _EPS:
                return _Plan((), f"axis {d}: bracketing measurements {lo_v:.3f}..{hi_v:.3f} are too far apart")
            t = (x - lo_v) / (hi_v - lo_v)
            per_axis.append([(lo_v, 1.0 - t), (hi_v, t)])
        corners: list[tuple[str, float]] = []
        for combo in _product(per_axis):
            point = tuple(c for c, _ in combo)
            weight = math.prod(w for _, w in combo)
            key = g.points.get(point)
            if key is None or key == exclude:
                return _Plan((), f"no measured workload at bracketing corner {point}")
            corners.append((key, weight))
        return _Plan(tuple(corners))

    # ---- answering -----------------------------------------------------------------------------------------------

    def _cfg(self, text: str) -> Config:
        c = self._configs.get(text)
        if c is None:
            c = self._configs[text] = Config.parse(text)
        return c

    def _space(self, kernel: str) -> Any:
        if kernel not in self._spaces:
            try:
                from kernel_gym.measure.worker import resolve_family

                self._spaces[kernel] = resolve_family(kernel).space
            except Exception:  # noqa: BLE001 - without the kernel module, answers rest on the data alone
                self._spaces[kernel] = None
        return self._spaces[kernel]

    def _answer(self, kernel: str, workload: Any, wkey: str, cfg: str, plan: _Plan | None) -> Measurement:
        if plan is None:
            return Measurement(kernel, wkey, cfg, UNAVAILABLE, reason=f"no measurements of kernel {kernel!r}",
                               source="recorded")
        if not plan.corners:
            return Measurement(kernel, wkey, cfg, UNAVAILABLE, reason=plan.reason, source="recorded")
        table = self._rows[kernel]
        if len(plan.corners) == 1 and plan.corners[0][0] == wkey:
            m = table[wkey].get(cfg)
            if m is None:
                return Measurement(kernel, wkey, cfg, UNAVAILABLE, source="recorded",
                                   reason="config not measured on this workload")
            why = self._why_invalid(kernel, cfg, workload) if m.status == OK else None
            return m if not why else Measurement(kernel, wkey, cfg, "invalid", reason=why, source="recorded")
        log_t, statuses, spread = 0.0, set(), 0.0
        for ckey, weight in plan.corners:
            m = table[ckey].get(cfg)
            if m is None:
                return Measurement(kernel, wkey, cfg, UNAVAILABLE, source="recorded-interpolated",
                                   reason=f"config not measured at bracketing workload {ckey}")
            if m.status == OK and not m.median_ms:
                return Measurement(kernel, wkey, cfg, UNAVAILABLE, source="recorded-interpolated",
                                   reason="no time stored (interpreter rows) at a bracketing workload")
            statuses.add(m.status)
            if m.status == OK:
                log_t += weight * math.log(m.median_ms)
                spread = max(spread, m.spread or 0.0)
        if statuses == {OK}:
            why = self._why_invalid(kernel, cfg, workload)
            if why:
                return Measurement(kernel, wkey, cfg, "invalid", reason=why, source="recorded-interpolated")
            return Measurement(kernel, wkey, cfg, OK, median_ms=math.exp(log_t), spread=spread, repeats=0,
                               source="recorded-interpolated")
        if len(statuses) == 1:
            (status,) = statuses
            return Measurement(kernel, wkey, cfg, status, source="recorded-interpolated",
                               reason=f"{status} at every bracketing workload")
        return Measurement(kernel, wkey, cfg, UNAVAILABLE, source="recorded-interpolated",
                           reason=f"bracketing workloads disagree ({sorted(statuses)})")

    def answer_workloads(self, kernel: str, workload: Any) -> list[str]:
        """The stored workload keys an answer for `workload` reads: its own when stored, else the bracketing
        workloads interpolation weighs; [] when the data cannot bracket it. A config measured at all of them is
        answered there (what `measurement_plans.untimed_plan` plans)."""
        plan = self._plan(kernel, workload)
        return [key for key, _ in plan.corners] if plan is not None else []

    def stored_keys(self, kernel: str) -> set[tuple[str, str]]:
        """Every (workload key, config) stored for the kernel's context, whatever its status or spread: what a
        collection in the same context (device, torch, triton, kernel source hash) would skip."""
        return set(self._stored.get(kernel, ()))

    def _why_invalid(self, kernel: str, cfg: str, workload: Any) -> str | None:
        """The current knob space's reason to reject a stored ok config (its rules can tighten after a row was
        measured, as FUSE_SUM's token limit did), or None."""
        if not self._check_validity:
            return None
        space = self._space(kernel)
        return space.why_invalid(self._cfg(cfg), workload) if space is not None else None

    def measure(self, kernel: str, workload: Any, config: Config) -> Measurement:
        memo = (kernel, workload.key(), config)
        m = self._answers.get(memo)
        if m is None:
            m = self._answer(kernel, workload, memo[1], str(config), self._plan(kernel, workload))
            self._answers[memo] = m
        return m

    def measure_heldout(self, kernel: str, workload: Any, config: Config) -> Measurement:
        """The answer as if this measured workload had not been measured (for held-out error estimation)."""
        wkey = workload.key()
        return self._answer(kernel, workload, wkey + "#heldout", str(config), self._plan(kernel, workload, wkey))

    def _candidate_configs(self, kernel: str, workload: Any) -> list[str]:
        plan = self._plan(kernel, workload)
        if plan is None or not plan.corners:
            return []
        table = self._rows[kernel]
        sets = [set(table[k]) for k, _ in plan.corners]
        return sorted(set.intersection(*sets))

    def available_configs(self, kernel: str, workload: Any) -> list[Config]:
        """Configs with an "ok" answer for this workload (exact or interpolated); the rest are masked."""
        return [self._cfg(c) for c in self._candidate_configs(kernel, workload)
                if self.measure(kernel, workload, self._cfg(c)).status == OK]

    def best_config(self, kernel: str, workload: Any) -> Config:
        """The oracle: the fastest available config. Raises LookupError when none is available."""
        best = self.best_measurement(kernel, workload)
        return self._cfg(best.config)

    def best_measurement(self, kernel: str, workload: Any) -> Measurement:
        ms = [m for m in (self.measure(kernel, workload, c) for c in self.available_configs(kernel, workload))
              if m.median_ms]
        if not ms:
            raise LookupError(f"no recorded config is available for {kernel} on {workload.key()}: the shape is "
                              "outside the measured grid (see RecordedBackend.workloads)")
        return min(ms, key=lambda m: m.median_ms)

    def workloads(self, kernel: str) -> list[Any]:
        """The measured workloads of a kernel."""
        return [w for w in self._workloads.get(kernel, {}).values() if w is not None]

    def kernels(self) -> list[str]:
        return sorted(self._rows)

    def rows(self, kernel: str) -> dict[str, dict[str, Measurement]]:
        """workload key -> config -> stored Measurement (read-only view)."""
        return self._rows.get(kernel, {})


def _product(per_axis: list[list[tuple[float, float]]]) -> list[list[tuple[float, float]]]:
    out: list[list[tuple[float, float]]] = [[]]
    for options in per_axis:
        out = [prev + [o] for prev in out for o in options]
    return out


def heldout_error(backend: RecordedBackend, kernel: str) -> dict[str, Any]:
    """Leave each measured workload out in turn, interpolate it from its neighbours, compare with the measurement.

    Returns the fraction of (workload, ok config) pairs that interpolation answers, the median and p90 absolute
    relative error of those answers, and the mean regret of the interpolated winner (its measured time over the
    measured best; 1.0 = picks the true winner)."""
    import numpy as np

    errors: list[float] = []
    asked = answered = 0
    regrets: list[float] = []
    for wkey, row in backend.rows(kernel).items():
        wl = backend._workloads[kernel][wkey]
        if wl is None:
            continue
        best_pred: tuple[float, float] | None = None
        true_best = min((m.median_ms for m in row.values() if m.status == OK), default=None)
        for cfg, m in row.items():
            if m.status != OK or not m.median_ms:
                continue
            asked += 1
            p = backend.measure_heldout(kernel, wl, backend._cfg(cfg))
            if p.status == OK:
                answered += 1
                errors.append(abs(p.median_ms / m.median_ms - 1.0))
                if best_pred is None or p.median_ms < best_pred[0]:
                    best_pred = (p.median_ms, m.median_ms)
        if best_pred is not None and true_best:
            regrets.append(best_pred[1] / true_best)
    e = np.asarray(errors)
    return {
        "kernel": kernel,
        "pairs": asked,
        "answered_fraction": answered / asked if asked else 0.0,
        "median_abs_rel_error": float(np.median(e)) if e.size else None,
        "p90_abs_rel_error": float(np.percentile(e, 90)) if e.size else None,
        "winner_time_over_best": float(np.mean(regrets)) if regrets else None,
        "workloads_with_answer": len(regrets),
    }
