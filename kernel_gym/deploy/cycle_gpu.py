"""`kernel-gym cycle --gpu`: re-tune one moved key of an engine's fused-MoE file on this GPU and confirm it paired.

Per moved key (M tokens, the planned routing skew) this is the engine tune path (deploy/engine_tune.py, `tune
--engine`) with the *current file's* entry as the reference instead of the engine's own: the current entry is
measured first (checked against the fp32 reference with NaN-filled outputs, CUDA-graph replays of the launch the
engine runs at that M, swept: kernel_gym.measure.engine_timing), then the cycle's recorded candidates for the key,
the nearest measured shapes' winners and one local-search round of one-knob neighbours, within the key's share of
the budget; the fastest is kept only if it still leads the current entry by `min_gain` in a paired round (samples
interleaved one by one, so a clock drift falls on both). So a confirmed change is never slower than the current entry
within that round's noise. `gpu_s` sums the seconds spent. GPU-side imports: torch, triton, numpy, the standard
library and kernel_gym (no MLflow).
"""

from __future__ import annotations

import time
from typing import Any

from kernel_gym.kernels.space import Config

PAIR_ROUNDS = 8  # engine_timing.confirm: 5 x rounds interleaved samples per config


class GpuConfirmer:
    """tune_key(M, skew, current, candidates, min_gain) -> what was timed and whether a change is confirmed."""

    def __init__(self, shape: Any, budget_s: float = 300.0, engine: str = "vllm", rows: Any = None,
                 device: str = "cuda", seed: int = 0, keys: int = 1, smoke: bool = False) -> None:
        """smoke: the CPU interpreter with wall clocks (TRITON_INTERPRET=1, a tiny fp32 shape): the logic, never a
        figure."""
        import torch

        if not smoke and not torch.cuda.is_available():
            raise RuntimeError("--gpu: no CUDA device here; run the cycle on the GPU machine, or without --gpu for "
                               "the zero-shot (unconfirmed) change")
        from kernel_gym.deploy import engine_export as ee
        from kernel_gym.kernels import vllm_tables
        from kernel_gym.measure.engine_timing import Timer

        if rows is None:
            from kernel_gym.measure.store import PACKAGED_SNAPSHOT

            rows = ee.measured_rows([PACKAGED_SNAPSHOT])
        self.shape, self.budget_s, self.seed = shape, budget_s, seed
        self.device = "cpu" if smoke else device
        self.engine = vllm_tables.parse_engine(engine).id
        self.device_name = "cpu-interpreter" if smoke else torch.cuda.get_device_name(0)
        self.sync = (lambda: None) if smoke else torch.cuda.synchronize
        self.rows = rows
        self.timer = Timer(cuda=not smoke)
        self.keys_left = max(keys, 1)
        self.pair_rounds = PAIR_ROUNDS
        self.start = time.perf_counter()
        self.gpu_s = 0.0
        self._weights: tuple | None = None

    def _inputs(self, m: int, skew: float) -> Any:
        import torch

        from kernel_gym.kernels import fused_moe as fm

        wl = self.shape.workload(m, round(skew, 3))
        if self._weights is None:
            full = fm.make_inputs(wl, self.device, self.seed)
            self._weights = (full.w1, full.w2)
            return full
        gen = torch.Generator(device=self.device).manual_seed(self.seed + m)
        x = torch.randn(m, self.shape.hidden, generator=gen, device=self.device, dtype=self._weights[0].dtype)
        return fm.MoEInputs(wl, x, fm.router_logits(wl, self.seed + m).to(self.device), *self._weights)

    def ready(self, inputs: Any, ref: Any, config: Config) -> tuple[Any, str]:
        """(timed closure or None, why not): the engine_timing check and graph capture of one config."""
        from kernel_gym.measure.engine_timing import measure_config

        meas, fn = measure_config(inputs, ref, config, self.timer, self.sync, self.engine)
        return fn, ("" if fn is not None else f"{meas.status}: {meas.reason}")

    def tune_key(self, m: int, skew: float, current: Config, candidates: list[Config], min_gain: float) -> dict:
        from kernel_gym.deploy import engine_tune as et
        from kernel_gym.kernels import vllm_moe as vm
        from kernel_gym.measure.engine_timing import confirm, measure_config

        t0 = time.perf_counter()
        res: dict[str, Any] = {"M": m, "skew": skew, "timed": {}, "dropped": {}, "confirmed": False}
        left = self.budget_s - (t0 - self.start)
        if left <= 1.0:
            res["skipped"] = "GPU budget reached"
            self.keys_left = max(self.keys_left - 1, 1)
            return res
        deadline = time.time() + left / self.keys_left
        self.keys_left = max(self.keys_left - 1, 1)
        inputs = self._inputs(m, skew)
        ref = vm.FAMILY.reference(inputs)
        wl = inputs.workload
        times: dict[Config, float] = {}
        fns: dict[Config, Any] = {}

        def run(c: Config) -> None:
            if c in times or str(c) in res["dropped"]:
                return
            meas, fn = measure_config(inputs, ref, c, self.timer, self.sync, self.engine)
            if fn is None:
                res["dropped"][str(c)] = f"{meas.status}: {meas.reason}"[:200]
            else:
                times[c], fns[c] = meas.median_ms, fn
                res["timed"][str(c)] = meas.median_ms

        run(current)
        if current not in fns:
            res["skipped"] = "the current entry failed its check: nothing confirmed (keep it and investigate)"
        else:
            near = et.nearest_shapes(self.rows, self.shape, self.device_name)
            seeds = list(dict.fromkeys([*candidates, *et.nearest_winners(self.rows, self.shape, m, skew,
                                                                          self.device_name, near)]))
            for c in seeds:
                if time.time() > deadline:
                    break
                run(c)
            best = min(times, key=lambda c: (times[c], str(c)))
            for c in vm.neighbours(best, wl):  # one local-search round around the best so far
                if time.time() > deadline:
                    break
                run(c)
            best = min(times, key=lambda c: (times[c], str(c)))
            if best != current:
                kept, t_cur, t_new = confirm(self.timer, fns[current], fns[best], self.pair_rounds, min_gain)
                res["paired"] = {"current_ms": t_cur, "new_ms": t_new, "gain": t_cur / t_new, "pick": str(best)}
                if kept:
                    res["confirmed"], res["config"] = True, str(best)
        fns.clear()
        res["gpu_s"] = time.perf_counter() - t0
        self.gpu_s += res["gpu_s"]
        return res
