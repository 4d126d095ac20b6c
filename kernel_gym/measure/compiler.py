"""A pool of CPU processes that compile configs ahead of the GPU worker, so the GPU never waits on Triton.

Each pool process patches `JITFunction.run` to Triton's warmup mode (compile, write the cubin to the shared
TRITON_CACHE_DIR, never launch) and then runs the family's own prepare + launch closure on the workload's real inputs:
the specialisation (constexprs, integer divisibility by 16, pointer alignment) is exactly the one the GPU worker will
ask for, which then only loads the cubin from the cache. Triton caches per specialisation, so one compile serves every
later workload that shares it (a cache hit costs milliseconds). Nothing is launched, so the timed GPU stays quiet apart
from the pool's input allocation. Genuine compile errors are returned and stored without touching the timing worker;
anything else (the closure did something that needs real results) is left for the GPU worker to find.

Imports only torch, triton, numpy and the standard library (in the pool processes).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from kernel_gym.measure.types import COMPILE_ERROR

_state: dict[str, Any] = {}


def _init(env: dict[str, str]) -> None:
    from kernel_gym.measure.worker import die_with_parent

    die_with_parent()
    os.environ.update(env)
    os.environ.pop("TRITON_INTERPRET", None)
    from triton.runtime.jit import JITFunction

    original = JITFunction.run

    def compile_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        return original(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = compile_only


def _compile_job(ref: str, workload_key: str, configs: list[str],
                 device: str) -> list[tuple[str, str | None, str, float]]:
    """(config, COMPILE_ERROR or None, reason, seconds) per config; None means compiled or left to the GPU worker."""
    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.worker import COMPILE_EXCEPTIONS, REASON_CHARS, resolve_family, workload_from_key

    fam = resolve_family(ref)
    if _state.get("key") != (ref, workload_key):
        _state.clear()
        _release(device)  # the previous workload's inputs: 14 pool processes each caching a large MoE layer's
        wl = workload_from_key(fam, workload_key)  # blocks ran the timing process out of memory (H200, run 7)
        try:
            _state.update(key=(ref, workload_key), workload=wl, inputs=fam.make_inputs(wl, device, 0))
        except Exception as exc:  # noqa: BLE001 - the GPU worker will meet and record the same failure
            return [(c, None, f"pool could not build inputs: {type(exc).__name__}", 0.0) for c in configs]
    out = []
    for cfg in configs:
        config = Config.parse(cfg)
        if fam.space.why_invalid(config, _state["workload"]):
            out.append((cfg, None, "", 0.0))
            continue
        t0 = time.perf_counter()
        try:
            fam.prepare(_state["inputs"], config)()
        except Exception as exc:  # noqa: BLE001
            name = type(exc).__name__
            if name in COMPILE_EXCEPTIONS:
                text = str(exc).strip().splitlines()
                out.append((cfg, COMPILE_ERROR, f"{name}: {text[0] if text else ''}"[:REASON_CHARS],
                            time.perf_counter() - t0))
                continue
            out.append((cfg, None, "", time.perf_counter() - t0))
            continue
        out.append((cfg, None, "", time.perf_counter() - t0))
    _release(device)  # the closures' workspaces: only the workload's inputs stay allocated between jobs
    return out


def _release(device: str) -> None:
    """Hand the caching allocator's free blocks back to the GPU (the timing process shares it)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


class CompilePool:
    """Submit (family, workload, configs) compile jobs; results come back as futures."""

    def __init__(self, workers: int, env: dict[str, str], device: str = "cuda") -> None:
        if workers < 1:
            raise ValueError(f"compile pool needs >= 1 worker, got {workers}")
        self.workers, self.env, self.device = workers, dict(env), device
        self.pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"), initializer=_init,
                                   initargs=(self.env,))

    def submit(self, ref: str, workload_key: str, configs: list[str], chunk: int = 8) -> list[Future]:
        """Split the configs into chunks so the pool's processes compile different configs at once."""
        futures = []
        for i in range(0, len(configs), chunk):
            try:
                futures.append(self.pool.submit(_compile_job, ref, workload_key, configs[i:i + chunk], self.device))
            except BrokenProcessPool:
                self.pool = self._new_pool()
                futures.append(self.pool.submit(_compile_job, ref, workload_key, configs[i:i + chunk], self.device))
        return futures

    @staticmethod
    def collect(futures: list[Future], timeout_s: float = 600.0) -> dict[str, tuple[str | None, str, float]]:
        """Wait for the jobs; {config: (status, reason, seconds)}. A broken job returns nothing (GPU worker decides)."""
        out: dict[str, tuple[str | None, str, float]] = {}
        for f in futures:
            try:
                for cfg, status, reason, secs in f.result(timeout=timeout_s):
                    out[cfg] = (status, reason, secs)
            except Exception:  # noqa: BLE001,S112 - a dead compile process only loses the head start
                continue
        return out

    def close(self) -> None:
        """Cancel queued jobs and terminate the processes at once: results still being compiled are not needed any
        more, and a process that finishes a long compile (or tears down a CUDA context holding a model's expert
        weights) would otherwise hold up the interpreter's exit, which joins every pool process."""
        procs = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5)
        for proc in procs:  # a process that ignored SIGTERM (or was slow to act on it on a loaded machine)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
