"""One process per GPU for the multi-GPU harnesses (benchmarks/multigpu/run_collectives.py and run_live_parallel.py):
start the ranks, end the whole job when one rank fails or the budget is spent, and time a closure that holds
collectives the same way on every rank.

- `run_ranks`: torch.multiprocessing with a deadline. A rank that raises ends every rank (its traceback is in the
  RankFailure); ranks still running `grace_s` after the deadline (a hang in a collective, a stuck NCCL init) are
  terminated. Never an endless wait.
- `init_rank`: NVLink multicast asserted off, the rank's own GPU selected before the process group exists
  (`device_id`, so NCCL binds each rank to its GPU), a collective timeout so that NCCL's watchdog ends a rank whose
  peers are gone.
- `agree_to_stop`: the ranks stop together (a rank that alone decided to stop would leave the others waiting in the
  next collective).
- `time_closure`: CUDA events around `inner` back-to-back calls after a GPU spin that covers the host's enqueueing
  (as kernel_gym.measure.timing does for one GPU), so that neither Python launch overhead nor the ranks' skew in
  leaving the barrier enters a small collective's time; `inner` and the spin are agreed by all ranks (every rank
  must issue the same collectives); per repeat the slowest rank counts.

Imports only the standard library at module level and torch inside the functions (the GPU machines have torch, triton
and numpy only).
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
import time
from typing import Any, Callable

from kernel_gym.parallel.collectives import NO_MULTICAST_ENV

CYCLES_PER_S = 1.98e9  # H200 boost clock: torch.cuda._sleep counts SM cycles (a lower clock only spins longer)
SPIN_MIN_CYCLES = 400_000  # ~0.2 ms
SPIN_MAX_CYCLES = 200_000_000  # ~0.1 s
SPIN_SAFETY = 3.0  # spin this many times the host's enqueue time of one sample


class RankFailure(RuntimeError):
    """A rank raised, died, or outlived the deadline; every rank has been ended."""


def require_no_multicast() -> None:
    """Raise unless NVLink multicast is off in this process's environment (NCCL, torch symmetric memory, NVSHMEM)."""
    bad = {k: os.environ.get(k) for k, v in NO_MULTICAST_ENV.items() if os.environ.get(k) != v}
    if bad:
        raise RuntimeError(f"NVLink multicast must stay off: {bad} should be {NO_MULTICAST_ENV} (set them before "
                           "torch, NCCL or any child starts)")


def run_ranks(fn: Callable[..., None], nprocs: int, args: tuple, deadline: float, grace_s: float = 60.0,
              poll_s: float = 1.0) -> None:
    """fn(rank, *args) in `nprocs` spawned processes. Returns when all exit cleanly; raises RankFailure (every rank
    ended) when one raises or dies, or when any still runs `grace_s` after `deadline` (time.time())."""
    import torch.multiprocessing as mp

    require_no_multicast()  # the children inherit this environment
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    try:
        while not ctx.join(timeout=poll_s, grace_period=10.0):
            if time.time() > deadline + grace_s:
                raise RankFailure(f"{nprocs} ranks still running {grace_s:.0f} s after the budget ran out (a hang "
                                  "in a collective or in NCCL init?): terminated")
    except mp.ProcessRaisedException as exc:
        last = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        raise RankFailure(f"rank {exc.error_index} of {nprocs} raised {last[-1] if last else '?'}; every rank was "
                          f"ended\n{exc}") from None
    except mp.ProcessExitedException as exc:
        raise RankFailure(f"rank {exc.error_index} of {nprocs} died (exit code {exc.exit_code}, signal "
                          f"{exc.signal_name}); every rank was ended") from None
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        for p in ctx.processes:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)


def init_rank(rank: int, world: int, init_method: str, backend: str, timeout_s: float) -> Any:
    """The process group of this rank; returns its device (cuda:rank for NCCL, cpu for gloo)."""
    import torch
    import torch.distributed as dist

    require_no_multicast()
    kw: dict[str, Any] = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)  # before anything allocates: else every rank's context lands on GPU 0
        device = torch.device("cuda", rank)
        kw["device_id"] = device
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return device


def agree_to_stop(device: Any, deadline: float) -> bool:
    """True on every rank when any rank is past `deadline` (one MAX all-reduce)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if time.time() > deadline else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _quantile(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(round(p * (len(sorted_values) - 1))))]


def time_closure(fn: Callable[[], Any], device: Any, repeats: int, warmup: int, inner: int | None = None,
                 target_sample_s: float = 1e-3, max_inner: int = 64) -> dict[str, Any]:
    """Seconds per call of `fn` (which may issue collectives; every rank calls this with the same arguments).

    After `warmup` calls, one calibration sample fixes `inner` (back-to-back calls per sample, so a sample lasts about
    `target_sample_s`; given: used as is) and the GPU spin, both agreed across ranks (MAX). Each of `repeats` samples:
    barrier, synchronise, spin the GPU (so the host's enqueueing of the calls hides behind it), start event, `inner`
    calls, end event; per-call time = interval / inner; per sample the slowest rank's time (a collective ends when its
    last rank does). `host_bound_samples`: samples where some rank's host took longer to enqueue the calls than its
    GPU spin lasted (the GPU may have waited for Python: that time is in the sample). CPU (gloo): wall clock."""
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    sleep = getattr(torch.cuda, "_sleep", None) if cuda else None

    def sample(calls: int, spin_cycles: int) -> tuple[float, float, bool]:
        """(seconds per call, host enqueue seconds, host bound) on this rank."""
        dist.barrier()
        if not cuda:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            dt = time.perf_counter() - t0
            return dt / calls, dt, False
        torch.cuda.synchronize()
        e0, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        if sleep is not None:
            sleep(spin_cycles)
        start.record()
        h0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host = time.perf_counter() - h0
        end.record()
        end.synchronize()
        spin_s = e0.elapsed_time(start) * 1e-3
        return start.elapsed_time(end) * 1e-3 / calls, host, host > spin_s

    def agree(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    per_call, host, _ = sample(1, SPIN_MIN_CYCLES)
    per_call, host_per_call = agree([per_call, host])
    if inner is None:
        inner = max(1, min(max_inner, math.ceil(target_sample_s / max(per_call, 1e-9))))
    spin = int(min(SPIN_MAX_CYCLES, max(SPIN_MIN_CYCLES, SPIN_SAFETY * host_per_call * inner * CYCLES_PER_S)))
    times, bound = [], []
    for _ in range(repeats):
        t, _, hb = sample(inner, spin)
        times.append(t)
        bound.append(1.0 if hb else 0.0)
    slowest = agree(times + bound)
    ts = sorted(slowest[:repeats])
    return {"median_s": statistics.median(ts), "p10_s": _quantile(ts, 0.1), "p90_s": _quantile(ts, 0.9),
            "repeats": repeats, "inner": inner, "spin_cycles": spin if sleep is not None else 0,
            "host_bound_samples": int(sum(slowest[repeats:])),
            "method": "cuda events, GPU spin, back-to-back calls" if cuda else "perf_counter"}
