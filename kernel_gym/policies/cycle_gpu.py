"""`kernel-gym cycle --gpu`: re-tune one moved key of an engine's fused-MoE file on this GPU and confirm it paired.

Per key (M tokens, the planned routing skew): the current entry and the cycle's top candidates (recorded ranking)
are each checked against the fp32 reference (outputs NaN-filled first, `vllm_moe.prepare`), captured in a CUDA graph
(as the engines replay decode batches) and swept (`time_launch`); the sweep's fastest, if it leads the current entry
by `min_gain`, is then timed against the current entry in a paired round (samples interleaved one by one,
`time_interleaved`, so a clock drift falls on both) and kept only if it still leads by `min_gain` there. So a
confirmed change is never slower than the engine's own entry within that round's noise. A config that fails the
check or to compile is dropped with its reason. `gpu_s` sums the wall time spent. The GPU side imports only torch,
triton, numpy and the standard library.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from kernel_gym.kernels.space import Config

PAIR_REPS = 40  # interleaved samples per config in the confirmation round


class GpuConfirmer:
    """tune_key(M, skew, current, candidates, min_gain) -> what was timed and whether a change is confirmed."""

    def __init__(self, shape: Any, budget_s: float = 300.0, device: str = "cuda", seed: int = 0) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("--gpu: no CUDA device here; run the cycle on the GPU machine, or without --gpu for "
                               "the zero-shot (unconfirmed) change")
        self.shape, self.budget_s, self.device, self.seed = shape, budget_s, device, seed
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

    def _ready(self, inputs: Any, ref: Any, config: Config) -> tuple[Any, str]:
        import torch

        from kernel_gym.kernels import vllm_moe as vm
        from kernel_gym.measure.timing import capture_graph
        from kernel_gym.measure.worker import classify, compare

        try:
            fn = vm.prepare(inputs, config)
            out = fn()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - dropped with its reason
            return None, classify(exc)[1]
        wrong = compare(vm.FAMILY, out, ref, inputs.workload.dtype)
        if wrong:
            return None, f"wrong result: {wrong[:200]}"
        try:
            return capture_graph(fn), ""
        except Exception:  # noqa: BLE001 - timed eagerly
            torch.cuda.synchronize()
            return fn, ""

    def tune_key(self, m: int, skew: float, current: Config, candidates: list[Config], min_gain: float) -> dict:
        from kernel_gym.kernels import vllm_moe as vm
        from kernel_gym.measure.timing import TimingOptions, time_interleaved, time_launch

        t0 = time.perf_counter()
        res: dict[str, Any] = {"M": m, "skew": skew, "timed": {}, "dropped": {}, "confirmed": False}
        if self.gpu_s >= self.budget_s:
            res["skipped"] = "GPU budget reached"
            return res
        inputs = self._inputs(m, skew)
        ref = vm.FAMILY.reference(inputs)
        opts = TimingOptions(min_reps=5, max_reps=15, round_reps=5, target_spread=0.03, max_time_s=0.3)
        fns = {}
        for c in [current, *[c for c in candidates if c != current]]:
            fn, why = self._ready(inputs, ref, c)
            if fn is None:
                res["dropped"][str(c)] = why
                continue
            fns[c] = fn
            res["timed"][str(c)] = time_launch(fn, opts).median_ms
        if current not in fns:
            res["skipped"] = "the current entry failed its check: keep it and investigate (nothing confirmed)"
        else:
            best = min(fns, key=lambda c: res["timed"][str(c)])
            if best != current and res["timed"][str(current)] / res["timed"][str(best)] >= 1 + min_gain:
                ta, tb = time_interleaved([fns[current], fns[best]], PAIR_REPS)
                cur_ms, new_ms = statistics.median(ta), statistics.median(tb)
                res["paired"] = {"current_ms": cur_ms, "new_ms": new_ms, "gain": cur_ms / new_ms}
                if cur_ms / new_ms >= 1 + min_gain:
                    res["confirmed"], res["config"] = True, str(best)
        self.gpu_s += time.perf_counter() - t0
        res["gpu_s"] = time.perf_counter() - t0
        return res
