"""Online adaptation: watch the traffic, and when it drifts beyond what the dispatch table covers, re-plan and swap.

The table's buckets cover a range per axis (e.g. MoE routing skew 0..1.6, decode context 32..65536). `OnlineTuner`
reads the serving engine's recent steps (here: the simulator's step log over a trailing window), and when a
percentile of an axis falls outside the covered range it adds grid points at the observed values, asks the policy for
those buckets again (`predict`, e.g. the pyfunc policy), optionally measures the few most promising configs per new
bucket on a backend (GPU, within `measure_budget` per bucket; the time is charged as a stall), pre-compiles the new
configs, and swaps the whole table into the Dispatcher at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from kernel_gym.dispatch.dispatcher import AXES, Dispatcher, DispatchTable, KernelTable
from kernel_gym.kernels import profiles
from kernel_gym.kernels.space import Config
from kernel_gym.traffic.simulator import _C, COMPILE_S_DEFAULT

Predictor = Callable[[list[Any]], list[Config]]



def observed() -> dict[str, tuple[str | None, str | None]]:
    """kernel -> per dispatch axis, the step-log column that measures it (each profile's step_log_columns; None: not
    observable from the step log), for the kernels with at least one."""
    return {k: p.step_log_columns for k, p in profiles.PROFILES.items() if p.step_log_columns != (None, None)}


@dataclass
class Drift:
    """One axis observed outside the table: kernel, axis index, observed values, covered range."""

    kernel: str
    axis: int
    values: list[float]
    covered: tuple[float, float]


@dataclass
class OnlineTuner:
    """Re-plans the Dispatcher's table when traffic leaves its coverage (see the module docstring).

    predictors: kernel -> policy predictor. backend: optional, to measure up to `measure_budget` configs per new
    bucket. percentiles: the low/high percentiles of each axis that must stay inside the covered range."""

    dispatcher: Dispatcher
    model: Any
    predictors: dict[str, Predictor]
    window_s: float = 30.0
    backend: Any = None
    measure_budget: int = 0
    percentiles: tuple[float, float] = (5.0, 95.0)
    replans: list[dict[str, Any]] = field(default_factory=list)
    tuning_gpu_s: float = 0.0

    def drift(self, sim: Any) -> list[Drift]:
        """Axes whose recent percentiles fall outside the table's covered range."""
        log = sim.step_log
        t0 = sim.clock - self.window_s
        w = log[np.searchsorted(log[:, _C["t_start"]], t0):]
        out = []
        for kernel, cols in observed().items():
            t = self.dispatcher.table.kernels.get(kernel)
            if t is None or len(w) == 0:
                continue
            for axis, col in enumerate(cols):
                if col is None:
                    continue
                x = w[:, _C[col]]
                x = x[x > 0] if AXES[kernel][1][axis] else x
                if not len(x):
                    continue
                lo, hi = (float(np.percentile(x, p)) for p in self.percentiles)
                c = t.centers[axis]
                if lo < c[0] * (0.5 if AXES[kernel][1][axis] else 1.0) - 1e-9 or hi > c[-1] * (
                        2.0 if AXES[kernel][1][axis] else 1.0) + 1e-9:
                    out.append(Drift(kernel, axis, [lo, hi], (c[0], c[-1])))
        return out

    def replan(self, drifts: list[Drift], sim: Any = None) -> DispatchTable:
        """A new table with grid points added at the drifted values; new buckets asked of the policy (and measured)."""
        old = self.dispatcher.table
        kernels = dict(old.kernels)
        for d in drifts:
            t = kernels[d.kernel]
            centers = [list(t.centers[0]), list(t.centers[1])]
            log = AXES[d.kernel][1][d.axis]
            for v in d.values:
                if not centers[d.axis][0] <= v <= centers[d.axis][-1]:
                    # on the 2^(k/4) grid (log axes) or to 0.01 (skew), so repeated re-plans reuse grid points
                    v = float(round(2 ** (round(4 * math.log2(max(v, 1.0))) / 4))) if log else round(v, 2)
                    centers[d.axis].append(v)
            centers = [sorted(set(c)) for c in centers]
            kernels[d.kernel] = self._rebuild(t, centers, sim)
            self.replans.append({"t_s": getattr(sim, "clock", 0.0), "kernel": d.kernel, "axis": d.axis,
                                 "observed": d.values, "covered": list(d.covered)})
        return DispatchTable(kernels, old.device, old.model, old.versions, {**old.meta, "replans": len(self.replans)})

    def _rebuild(self, t: KernelTable, centers: list[list[float]], sim: Any) -> KernelTable:
        from kernel_gym.dispatch.dispatcher import cell_workload

        old = {(a, b): t.configs[t.cells[i * len(t.centers[1]) + j]]
               for i, a in enumerate(t.centers[0]) for j, b in enumerate(t.centers[1])}
        new_cells = [(a, b) for a in centers[0] for b in centers[1] if (a, b) not in old]
        wls = [cell_workload(t.kernel, t.fixed, a, b) for a, b in new_cells]
        chosen = list(self.predictors[t.kernel](wls)) if t.kernel in self.predictors else []
        if len(chosen) != len(wls):
            from kernel_gym.dispatch.rules import default_for

            chosen = [default_for(t.kernel, w, None) for w in wls]
        if profiles.follows_kv(t.kernel) and t.kv_layout:
            from kernel_gym.dispatch.rules import on_layout

            ps, lay = t.kv_layout["page_size"], t.kv_layout["layout"]
            chosen = [on_layout(c, w, ps, lay) for c, w in zip(chosen, wls)]
        if self.backend is not None and self.measure_budget > 0:
            chosen = [self._measure(t, w, c, sim) for w, c in zip(wls, chosen)]
        table = dict(old)
        table.update(zip(new_cells, chosen))
        cfgs = [table[(a, b)] for a in centers[0] for b in centers[1]]
        unique = list(dict.fromkeys(cfgs))
        index = {c: i for i, c in enumerate(unique)}
        return KernelTable(t.kernel, (centers[0], centers[1]), unique, [index[c] for c in cfgs], t.fixed,
                           {**t.policy, "adapted": True}, t.kv_layout)

    def _measure(self, t: KernelTable, workload: Any, proposed: Config, sim: Any) -> Config:
        """Measure the policy's choice and the table's nearby choices (at most measure_budget); keep the fastest."""
        from kernel_gym.kernels import get_family

        space = get_family(t.kernel).space
        cands = [proposed, *t.configs]
        cands = [c for c in dict.fromkeys(cands) if space.is_valid(c, workload)][: self.measure_budget]
        best, best_t, cost = proposed, math.inf, 0.0
        for c in cands:
            m = self.backend.measure(t.kernel, workload, c)
            cost += (m.compile_s or COMPILE_S_DEFAULT) + (m.median_ms or 0.0) * 1e-3 * max(m.repeats, 1)
            if m.ok and m.median_ms is not None and m.median_ms < best_t:
                best, best_t = c, m.median_ms
        self.tuning_gpu_s += cost
        if sim is not None:
            sim.add_stall(cost, f"online tuner measured {len(cands)} {t.kernel} configs")
        return best

    def update(self, sim: Any) -> bool:
        """Check for drift; re-plan, pre-compile and swap if needed. True when the table was swapped."""
        drifts = self.drift(sim)
        if not drifts:
            return False
        table = self.replan(drifts, sim)
        new = {(k, c) for k, t in table.kernels.items() for c in t.configs}
        if sim is not None:
            sim.compiled.update(new)  # compiled in the background before the swap: no request waits for it
        self.dispatcher.swap(table)
        return True


def run_adaptive(sim: Any, tuner: OnlineTuner, interval_s: float = 10.0) -> Any:
    """Drive the simulator to completion, letting the tuner check for drift every `interval_s` simulated seconds."""
    if interval_s <= 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s}")
    t = sim.clock
    while not sim.done:
        t += interval_s
        sim.run_until(t)
        tuner.update(sim)
    return sim.result()
