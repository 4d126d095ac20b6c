"""The live backend: compile, check against the torch reference and time on a CUDA GPU, in a supervised worker process.

`measure_many` is the efficient path (one workload's inputs and reference serve every config); `prefetch` hands the
next workloads' configs to the compile pool so Triton compiles on CPU cores while the GPU times; `pick_winner`
re-measures near-ties with more samples before declaring a winner.
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from kernel_gym.kernels.space import Config, KernelFamily
from kernel_gym.measure.compiler import CompilePool
from kernel_gym.measure.timing import DEFAULT_TIMING, TimingOptions
from kernel_gym.measure.types import COMPILE_ERROR, OK, Measurement
from kernel_gym.measure.worker import IsolatedRunner, family_ref, resolve_family

CONFIRM_TIMING = TimingOptions(min_reps=9, max_reps=15, target_spread=0.02, max_time_s=1.0)  # near-tie re-measure
DEFAULT_CACHE_DIR = os.path.join(tempfile.gettempdir(), "kernel_gym_triton_cache")


class LiveBackend:
    """Measures on one GPU (CUDA_VISIBLE_DEVICES=gpu in the worker) or, with device="cpu", checks under the interpreter
    (correctness only: the same supervision, used by CPU tests)."""

    name = "live"

    def __init__(self, gpu: int | None = None, timing: TimingOptions = DEFAULT_TIMING, timeout_s: float = 60.0,
                 first_timeout_s: float = 300.0, compile_workers: int = 0, device: str = "cuda",
                 cache_dir: str | None = None, extra_env: dict[str, str] | None = None) -> None:
        if device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu' (interpreter), got {device!r}")
        if timing.flush_mode != "write":  # a row does not record its flush: every stored row has the write flush
            raise ValueError(f"flush_mode={timing.flush_mode!r}: stored rows are all timed after the write flush, and "
                             "a row does not say which flush it had; time clean-flush studies with timing.time_launch "
                             "or time_interleaved (benchmarks/flush_mode/run.py), not through the store")
        env = {"TRITON_CACHE_DIR": cache_dir or os.environ.get("TRITON_CACHE_DIR", DEFAULT_CACHE_DIR)}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        env.update(extra_env or {})
        self.env, self.device = env, device
        self.timing: TimingOptions | None = timing if device == "cuda" else None
        self.runner = IsolatedRunner(env, timeout_s, first_timeout_s)
        pool_env = {k: v for k, v in env.items() if k != "TRITON_INTERPRET"}
        self.pool = CompilePool(compile_workers, pool_env) if compile_workers and device == "cuda" else None
        self._prefetched: dict[tuple[str, str, tuple[str, ...]], list[Future]] = {}

    @staticmethod
    def _family(kernel: str | KernelFamily) -> tuple[KernelFamily, str]:
        if isinstance(kernel, str):
            fam = resolve_family(kernel)
            return fam, kernel
        return kernel, family_ref(kernel)

    def prefetch(self, kernel: str | KernelFamily, workload: Any, configs: list[Config]) -> None:
        """Start compiling these configs in the pool (no-op without a pool)."""
        if self.pool is None:
            return
        _, ref = self._family(kernel)
        cfgs = tuple(str(c) for c in configs)
        key = (ref, workload.key(), cfgs)
        if key not in self._prefetched:
            self._prefetched[key] = self.pool.submit(ref, key[1], list(cfgs))

    def precompile(self, kernel: str | KernelFamily, workload: Any, configs: list[Config],
                   timeout_s: float = 300.0) -> dict[str, tuple[str | None, str, float]]:
        """Compile these configs on the pool and wait: {config: (compile status or None, reason, seconds)}; empty
        without a pool. For callers that will measure the configs in an unknown order (the live envs)."""
        if self.pool is None:
            return {}
        _, ref = self._family(kernel)
        return CompilePool.collect(self.pool.submit(ref, workload.key(), [str(c) for c in configs]), timeout_s)

    def measure(self, kernel: str | KernelFamily, workload: Any, config: Config) -> Measurement:
        return self.measure_many(kernel, workload, [config])[0]

    def measure_many(self, kernel: str | KernelFamily, workload: Any, configs: list[Config],
                     timing: TimingOptions | None = None) -> list[Measurement]:
        """One Measurement per config, in order. Compile errors found by the pool are returned without GPU work."""
        fam, ref = self._family(kernel)
        wkey = workload.key()
        compiled: dict[str, tuple[str | None, str, float]] = {}
        futures = self._prefetched.pop((ref, wkey, tuple(str(c) for c in configs)), None)
        if futures:
            compiled = CompilePool.collect(futures, timeout_s=120.0)
        answers: dict[str, Measurement] = {}
        to_run = []
        for c in configs:
            cfg = str(c)
            status, reason, secs = compiled.get(cfg, (None, "", 0.0))
            if status == COMPILE_ERROR:
                answers[cfg] = Measurement(kernel=fam.name, workload=wkey, config=cfg, status=status, reason=reason,
                                           compile_s=secs, source="live" if self.device == "cuda" else "interpreter")
            else:
                to_run.append(cfg)
        if to_run:
            timing_opts = (timing or self.timing) if self.device == "cuda" else None
            for m in self.runner.run(ref, fam.name, wkey, to_run, timing_opts, self.device):
                secs = compiled.get(m.config, (None, "", 0.0))[2]
                answers[m.config] = replace(m, compile_s=secs) if secs > 0.05 else m  # a pool compile, not a cache load
        return [answers[str(c)] for c in configs]

    def available_configs(self, kernel: str | KernelFamily, workload: Any) -> list[Config]:
        fam, _ = self._family(kernel)
        return fam.space.valid_configs(workload)

    def pick_winner(self, kernel: str | KernelFamily, workload: Any, configs: list[Config], tie_tol: float = 0.03,
                    confirm: TimingOptions = CONFIRM_TIMING) -> tuple[Config, list[Measurement]]:
        """The fastest config. Configs within tie_tol of the best are re-measured with more samples, and the winner is
        the fastest of the re-measurement, so a lucky sample does not decide it."""
        ms = self.measure_many(kernel, workload, configs)
        ok = [(m.median_ms, c) for m, c in zip(ms, configs) if m.status == OK and m.median_ms]
        if not ok:
            raise RuntimeError(f"no config of {len(configs)} measured successfully on {workload}: "
                               f"{sorted({m.status for m in ms})}")
        best = min(t for t, _ in ok)
        ties = [c for t, c in ok if t <= best * (1 + tie_tol)]
        if len(ties) == 1 or self.device != "cuda":
            return min(ok, key=lambda x: x[0])[1], ms
        again = self.measure_many(kernel, workload, ties, timing=confirm)
        ok2 = [(m.median_ms, c) for m, c in zip(again, ties) if m.status == OK and m.median_ms]
        if not ok2:
            return min(ok, key=lambda x: x[0])[1], ms
        return min(ok2, key=lambda x: x[0])[1], ms + again

    # close, __enter__ and __exit__ have the shape of storetools._Source's (duplicate scan): the context-manager idiom,
    # each closing its own resources; a shared mixin would save two one-line methods and hide the idiom.
    def close(self) -> None:
        self.runner.close()
        if self.pool is not None:
            self.pool.close()

    def __enter__(self) -> LiveBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
