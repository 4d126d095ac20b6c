"""CUDA timing of one launch closure: L2 flushed before every sample, CUDA events, adaptive repeats.

Method (as triton.testing.do_bench, made adaptive and cheaper): each sample enqueues a write of a 256 MB buffer (more
than 4x the H200's 60 MB L2, so every sample starts from a cold cache, as a layer does in a real forward pass where the
other layers evicted its weights), then a start event, the launch, an end event. Samples are enqueued in rounds with one
synchronisation per round; rounds continue until (p90 - p10) / median <= target_spread or a cap on samples or on
time is reached. After the flush the GPU also spins for SPIN_CYCLES (torch.cuda._sleep) before the start event, so it
stays busy while Python enqueues the launch and host launch overhead does not enter the event interval even on a
contended CPU: the flush alone (~60 us) did not cover it for small kernels while 30 compile processes shared the
cores, and their samples spread by 50% or more (benchmarks/h200_run3, docs/measurement.md).

Two helpers for comparisons: `time_launch(capture_graph(fn))` times replays of a CUDA graph (the launch's GPU time
with no host launch cost, as engines run decode batches), and `time_interleaved` takes the samples
of several closures in turn, one by one, for paired ratios that a drift of the clocks cannot bias. Imports torch, numpy
and the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

FLUSH_BYTES = 256 * 1024 * 1024
SPIN_CYCLES = 400_000  # GPU busy-wait before each start event: ~0.2 ms at the H200's 1.98 GHz boost clock
_flush_buffers: dict[int, Any] = {}


@dataclass(frozen=True)
class TimingOptions:
    """How hard to try. Defaults favour throughput: 3 samples, more only when they disagree."""

    min_reps: int = 3
    max_reps: int = 9
    round_reps: int = 3  # samples added per round after the first
    target_spread: float = 0.04  # stop once (p90 - p10) / median is this small
    max_time_s: float = 0.4  # stop adding rounds once the samples so far took this long
    flush: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_reps <= self.max_reps:
            raise ValueError(f"need 1 <= min_reps ({self.min_reps}) <= max_reps ({self.max_reps})")
        if self.target_spread <= 0:
            raise ValueError(f"target_spread must be > 0, got {self.target_spread}")


DEFAULT_TIMING = TimingOptions()


@dataclass(frozen=True)
class Timing:
    """Summary of the samples in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int

    @property
    def spread(self) -> float:
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else float("inf")


def summarize(samples_ms: list[float] | np.ndarray) -> Timing:
    """Median, p10, p90 of the samples (numpy's linear percentile)."""
    a = np.asarray(samples_ms, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no samples to summarise")
    p10, med, p90 = np.percentile(a, [10, 50, 90])
    return Timing(float(med), float(p10), float(p90), int(a.size))


def _flush_buffer(device: Any) -> Any:
    import torch

    index = torch.device(device).index or 0
    if index not in _flush_buffers:
        _flush_buffers[index] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    return _flush_buffers[index]


def time_launch(fn: Callable[[], Any], options: TimingOptions | None = None, device: str = "cuda") -> Timing:
    """Time `fn` (a prepared launch closure, already run once: compiled and warm) with CUDA events."""
    import torch

    options = options or DEFAULT_TIMING
    buf = _flush_buffer(device) if options.flush else None
    samples: list[float] = []
    spent_s = 0.0
    n = options.min_reps
    while True:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            if buf is not None:
                buf.zero_()
            torch.cuda._sleep(SPIN_CYCLES)
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        round_ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        samples.extend(round_ms)
        spent_s += sum(round_ms) / 1e3 + n * (0.0002 + (0.0001 if buf is not None else 0.0))
        t = summarize(samples)
        if t.spread <= options.target_spread or len(samples) >= options.max_reps or spent_s >= options.max_time_s:
            return t
        n = min(options.round_reps, options.max_reps - len(samples))


def capture_graph(fn: Callable[[], Any]) -> Callable[[], Any]:
    """A replay closure of `fn` captured in a CUDA graph (warmed on a side stream first, as PyTorch requires); the
    closure keeps the graph, and with it the graph's memory pool, alive.

    Why: the GPU time of the launch's kernels with no host launch overhead at all, as an engine that captures its
    decode batches in graphs runs them (vLLM and SGLang do, up to a few hundred tokens); host-heavy launch code (torch
    ops around the kernels) otherwise makes small-M samples depend on the CPU, not on the config. The launch must not
    synchronise with the host. Replaying kernel_gym's own fused_moe hit an illegal address on the H200
    (benchmarks/vllm_export/run5; its TMA configs allocate descriptors through Triton's allocator at launch, the
    likely cause): use it for launches known to replay, such as vllm_fused_moe's."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()

    def replay() -> None:
        graph.replay()

    replay.graph = graph  # type: ignore[attr-defined]
    return replay


def time_interleaved(fns: list[Callable[[], Any]], reps: int, device: str = "cuda") -> list[list[float]]:
    """Per closure, `reps` samples (ms) taken in turn: a b c, then c b a, ... each after an L2 flush and a spin. A
    slow drift of the GPU's clocks (power or temperature: a minute of large-M MoE on the H200 moved one config's time
    by 25% between two rounds) then falls on every closure alike, so their ratio holds where separate rounds do not."""
    import torch

    buf = _flush_buffer(device)
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
              for _ in fns]
    for r in range(reps):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            buf.zero_()
            torch.cuda._sleep(SPIN_CYCLES)
            start, end = events[i][r]
            start.record()
            fns[i]()
            end.record()
    torch.cuda.synchronize()
    return [[s.elapsed_time(e) for s, e in per_fn] for per_fn in events]
