"""Timing the engine's own kernel design (vllm_fused_moe) the way engine-file choices are confirmed: checked against the
fp32 reference first, CUDA-graph replays (the engines capture decode batches in graphs), and paired, interleaved
samples for every keep-or-drop decision. Shared by benchmarks/vllm_export/run.py and `kernel-gym tune --engine`
(kernel_gym/deploy/engine_tune.py), so both decide with the same rule.

On the CPU (smoke runs under TRITON_INTERPRET=1) the same calls use wall clocks: logic only, never a figure.

Imports only torch, triton, the standard library and kernel_gym's kernels / measure modules: runs on the GPU machine.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from kernel_gym.kernels import vllm_moe as vm
from kernel_gym.kernels import vllm_tables
from kernel_gym.kernels.space import Config
from kernel_gym.measure.types import OK, WRONG_RESULT, Measurement


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Timer:
    """CUDA: kernel_gym's flushed event timing of CUDA-graph replays. CPU smoke: wall clock (logic only)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.capture_failures = 0
        self.gpu_s = 0.0  # seconds spent timing (sweep and paired samples), printed as GPU-seconds
        if cuda:
            from kernel_gym.measure.timing import TimingOptions

            self.sweep_opts = TimingOptions(min_reps=5, max_reps=15, round_reps=5, target_spread=0.03, max_time_s=0.3)
            self.pair_opts = TimingOptions(min_reps=10, max_reps=10, round_reps=10, target_spread=1.0,
                                           max_time_s=5.0)

    def ready(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """The closure to time: on the GPU a CUDA-graph replay, captured once per config after its check; a launch
        that cannot be captured is timed eagerly, logged and counted (capture_failures)."""
        if not self.cuda:
            return fn
        import torch

        from kernel_gym.measure.timing import capture_graph

        try:
            return capture_graph(fn)
        except Exception as exc:  # noqa: BLE001 - timed eagerly instead, and counted
            log(f"  CUDA graph capture failed ({type(exc).__name__}: {str(exc)[:120]}); timing eagerly")
            self.capture_failures += 1
            torch.cuda.synchronize()
            return fn

    def sweep(self, fn: Callable[[], Any]) -> tuple[float, float, int]:
        t0 = time.perf_counter()
        try:
            if not self.cuda:
                return self._wall(fn, 2)
            from kernel_gym.measure.timing import time_launch

            t = time_launch(fn, self.sweep_opts)
            return t.median_ms, t.spread, t.repeats
        finally:
            self.gpu_s += time.perf_counter() - t0

    def pair_sample(self, fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        try:
            if not self.cuda:
                return self._wall(fn, 1)[0]
            from kernel_gym.measure.timing import time_launch

            return time_launch(fn, self.pair_opts).median_ms
        finally:
            self.gpu_s += time.perf_counter() - t0

    @staticmethod
    def _wall(fn: Callable[[], Any], n: int) -> tuple[float, float, int]:
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts), 0.0, n


def paired(timer: Timer, a: Callable[[], Any], b: Callable[[], Any], rounds: int) -> tuple[float, float]:
    """Medians of a's and b's samples taken in turn in the same process, warm: on the GPU 5 x `rounds` samples each,
    interleaved one by one (kernel_gym.measure.timing.time_interleaved); on the CPU smoke, alternating wall clocks."""
    if timer.cuda:
        from kernel_gym.measure.timing import time_interleaved

        t0 = time.perf_counter()
        ta, tb = time_interleaved([a, b], 5 * rounds)
        timer.gpu_s += time.perf_counter() - t0
        return statistics.median(ta), statistics.median(tb)
    ta, tb = [], []
    for i in range(rounds):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        x, y = timer.pair_sample(first), timer.pair_sample(second)
        (ta, tb)[i % 2].append(x)
        (tb, ta)[i % 2].append(y)
    return statistics.median(ta), statistics.median(tb)


def confirm(timer: Timer, base_fn: Callable[[], Any], pick_fn: Callable[[], Any], rounds: int,
            min_gain: float) -> tuple[bool, float, float]:
    """(keep the pick?, engine entry's paired median, pick's): the pick must keep a lead of min_gain paired, not
    just be faster (a sweep sample taken while the clocks ramp can flatter a pick by 30% at M <= 2)."""
    t_base, t_pick = paired(timer, base_fn, pick_fn, rounds)
    return t_base / t_pick >= 1 + min_gain, t_base, t_pick


def measure_config(inputs: Any, ref: Any, config: Config, timer: Timer, sync: Callable[[], None],
                   engine: str = vllm_tables.DEFAULT_ENGINE) -> tuple[Measurement, Callable[[], Any] | None]:
    """Check against the reference (workspaces NaN-filled by the launch's prepare), then time the launch the engine
    runs for this workload (vm.prepare_engine: vLLM 0.33's small-batch path where it applies): (store row, closure if
    ok). The row's store key is vm.path_store_key(workload, engine)."""
    from kernel_gym.measure.worker import classify, compare

    wl = inputs.workload
    base = dict(kernel=vm.FAMILY.name, workload=wl.key(), config=str(config), source="live")
    t0 = time.perf_counter()
    try:
        fn = vm.prepare_engine(inputs, config, engine)
        out = fn()
        sync()
    except Exception as exc:  # noqa: BLE001 - recorded with its reason, never timed
        status, reason, _ = classify(exc)
        return Measurement(status=status, reason=reason, compile_s=time.perf_counter() - t0, **base), None
    compile_s = time.perf_counter() - t0
    wrong = compare(vm.FAMILY, out, ref, wl.dtype)
    if wrong:
        return Measurement(status=WRONG_RESULT, reason=wrong[:300], compile_s=compile_s, **base), None
    fn = timer.ready(fn)
    ms, spread, reps = timer.sweep(fn)
    return Measurement(status=OK, median_ms=ms, spread=spread, repeats=reps, compile_s=compile_s, **base), fn


def gpu_state() -> dict[str, Any]:
    """The GPU's SM clock, power, temperature and throttle reasons now (kernel_gym.measure.power: NVML, else
    nvidia-smi), or {} where there is none: the H200 here is power-capped, so a time means little without the state
    it was taken in."""
    from dataclasses import asdict

    from kernel_gym.measure import power

    try:
        sample = power.read_once()
    except Exception:  # noqa: BLE001 - the state is extra information, never a reason to stop
        return {}
    if sample is None:
        return {}
    out = asdict(sample)
    if sample.throttle is not None:
        out["throttle_reasons"] = power.throttle_names(sample.throttle)
    return out
