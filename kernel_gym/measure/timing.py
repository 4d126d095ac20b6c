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
of several closures in turn, one by one, for paired ratios that a drift of the clocks cannot bias.

Clock state (docs/measurement.md, "Clocks and power"): recorded times stand for a hot GPU, as a serving GPU runs.
`keep_hot` is the rule that makes them so, and `time_launch` and `time_interleaved` apply it before they time: when the
GPU is cooler than HOT_MARGIN_C below the plateau this process last reached (or has not been heated yet), it runs a
sustained bf16 matmul load until the temperature stops rising (`heat_to_steady`, at most TimingOptions.heat_max_s);
otherwise it costs one temperature reading, at most once a second. `measure/power.py` samples the state each row was
timed under. Imports torch,
numpy and the standard library only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FLUSH_BYTES = 256 * 1024 * 1024
# How the L2 is emptied before a sample. "write" (what every stored row was timed with): the buffer is zeroed, so the
# L2 starts full of dirty lines, and a launch evicts them as it reads, paying their write-back (0.6-9.7 us of decode
# at batch 1-16 on the H200, the more the more it reads: benchmarks/flush_mode/run1_cf0ac05). "clean": the buffer is
# read, so the L2 starts cold and clean, the state a bytes / bandwidth floor assumes (and Nsight Compute's cache
# control gives). LiveBackend, which stores rows, refuses "clean": a row does not record its flush.
FLUSH_MODES = ("write", "clean")
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
    flush_mode: str = "write"  # FLUSH_MODES
    heat_max_s: float = 30.0  # keep_hot before each batch: at most this long (0: time the GPU in whatever state)

    def __post_init__(self) -> None:
        if not 1 <= self.min_reps <= self.max_reps:
            raise ValueError(f"need 1 <= min_reps ({self.min_reps}) <= max_reps ({self.max_reps})")
        if self.target_spread <= 0:
            raise ValueError(f"target_spread must be > 0, got {self.target_spread}")
        if self.flush_mode not in FLUSH_MODES:
            raise ValueError(f"flush_mode {self.flush_mode!r} is not one of {FLUSH_MODES}")
        if self.heat_max_s < 0:
            raise ValueError(f"heat_max_s must be >= 0 (0: no warm-up), got {self.heat_max_s}")


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


def flush_l2(buf: Any, mode: str) -> None:
    """Enqueue the L2 flush of one sample (FLUSH_MODES): zero the buffer, or read it (a reduction to one value)."""
    if mode == "write":
        buf.zero_()
    elif mode == "clean":
        buf.max()
    else:
        raise ValueError(f"flush mode {mode!r} is not one of {FLUSH_MODES}")


def time_launch(fn: Callable[[], Any], options: TimingOptions | None = None, device: str = "cuda") -> Timing:
    """Time `fn` (a prepared launch closure, already run once: compiled and warm) with CUDA events."""
    import torch

    options = options or DEFAULT_TIMING
    keep_hot(options, device)
    buf = _flush_buffer(device) if options.flush else None
    samples: list[float] = []
    spent_s = 0.0
    n = options.min_reps
    while True:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            if buf is not None:
                flush_l2(buf, options.flush_mode)
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
    likely cause; the replay closure did not then keep `fn`, and with it the launch's own tensors, alive, which can
    also make a replay read freed memory): use it for launches known to replay, such as vllm_fused_moe's."""
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
    # The graph replays raw addresses: the tensors `fn` holds (inputs, routing ids, workspaces made by prepare outside
    # the graph's pool) must outlive it. Without this reference, `fn = capture_graph(fn)` freed them, the allocator
    # handed their memory to later tensors, and replays read garbage (an out-of-bounds scatter in the alignment's
    # expert ids on the H200, clock_study run 1).
    replay.launch = fn  # type: ignore[attr-defined]
    return replay


def time_interleaved(fns: list[Callable[[], Any]], reps: int, device: str = "cuda",
                     heat: bool = True, flush_mode: str = "write") -> list[list[float]]:
    """Per closure, `reps` samples (ms) taken in turn: a b c, then c b a, ... each after an L2 flush and a spin. A
    slow drift of the GPU's clocks (power or temperature: a minute of large-M MoE on the H200 moved one config's time
    by 25% between two rounds) then falls on every closure alike, so their ratio holds where separate rounds do not.
    heat=False skips the warm-up rule (keep_hot), for studies that set the GPU's state themselves; flush_mode is
    TimingOptions.flush_mode's."""
    import torch

    if heat:
        keep_hot(DEFAULT_TIMING, device)
    buf = _flush_buffer(device)
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
              for _ in fns]
    for r in range(reps):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            flush_l2(buf, flush_mode)
            torch.cuda._sleep(SPIN_CYCLES)
            start, end = events[i][r]
            start.record()
            fns[i]()
            end.record()
    torch.cuda.synchronize()
    return [[s.elapsed_time(e) for s, e in per_fn] for per_fn in events]


# ---- clock state: the warm-up-to-steady-state rule ----------------------------------------------------------------

HEATER_N = 8192  # bf16 matmul size of the heater: ~1.4 ms a launch on the H200, at the power cap when run back to back
HOT_MARGIN_C = 5.0  # keep_hot re-heats when the GPU is this much cooler than the plateau it last reached
SETTLE_C = 1.0  # heat_to_steady stops when the temperature rose by at most this over SETTLE_WINDOW_S
SETTLE_WINDOW_S = 4.0
NO_READER_HEAT_S = 10.0  # without NVML / nvidia-smi: heat this long, once per process
CHECK_EVERY_S = 1.0  # keep_hot reads the temperature at most this often (time_launch calls it for every config)
HEAT_SHARE = 0.25  # re-heats stop once they took this share of the time since the first heat (low-power workloads
# cool the GPU between timings; heating after every few of them would multiply a collection's time)


@dataclass
class HeatRecord:
    """What one heat_to_steady call did; `plateau` False means it stopped at its time cap (or had no thermometer)."""

    heated_s: float = 0.0
    temp_start_c: float | None = None
    temp_end_c: float | None = None
    sm_end_mhz: float | None = None
    plateau: bool = False
    trace: list[tuple[float, float | None, float | None]] = field(default_factory=list)  # (s, temp C, SM MHz)

    def to_dict(self) -> dict[str, Any]:
        return {"heated_s": round(self.heated_s, 2), "temp_start_c": self.temp_start_c, "temp_end_c": self.temp_end_c,
                "sm_end_mhz": self.sm_end_mhz, "plateau": self.plateau,
                "trace": [(round(t, 2), c, m) for t, c, m in self.trace]}


def heat_to_steady(max_s: float, device: str = "cuda", reader: Any = None, min_s: float = 2.0,
                   settle_c: float = SETTLE_C, window_s: float = SETTLE_WINDOW_S) -> HeatRecord:
    """Run back-to-back bf16 matmuls on random data (power depends on the data: zeros draw less) until the GPU
    temperature rose by at most `settle_c` over the last `window_s` seconds (after at least `min_s`), or `max_s`.
    Why: the H200 here is power-capped; its SM clock under load falls as the chip heats (1,980 to about 1,500 MHz
    within seconds of large-M MoE), so a time taken cool is not the time a serving GPU gives. `reader`: a
    measure.power reader (None: heat for max_s)."""
    import torch

    rec = HeatRecord()
    if max_s <= 0:
        return rec
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(HEATER_N, HEATER_N, generator=gen, device=device, dtype=torch.bfloat16)
    b = torch.randn(HEATER_N, HEATER_N, generator=gen, device=device, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    t0 = time.monotonic()

    def read() -> tuple[float | None, float | None]:
        if reader is None:
            return None, None
        try:
            s = reader.read()
        except Exception:  # noqa: BLE001 - a failed reading only ends the plateau test
            return None, None
        return s.temp_c, s.sm_mhz

    temp, sm = read()
    rec.temp_start_c = temp
    rec.trace.append((0.0, temp, sm))
    while True:
        for _ in range(40):  # ~60 ms of work between readings
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        now = time.monotonic() - t0
        if now - rec.trace[-1][0] >= 0.5:
            temp, sm = read()
            rec.trace.append((now, temp, sm))
            past = [tc for t, tc, _ in rec.trace if t <= now - window_s and tc is not None]
            if now >= min_s and temp is not None and past and temp - past[-1] <= settle_c:
                rec.plateau = True
                break
        if now >= max_s:
            break
    rec.heated_s = time.monotonic() - t0
    rec.temp_end_c, rec.sm_end_mhz = rec.trace[-1][1], rec.trace[-1][2]
    del a, b, c
    return rec


_hot: dict[str, Any] = {}


def keep_hot(options: TimingOptions | None = None, device: str = "cuda") -> HeatRecord | None:
    """The warm-up rule applied before every batch of timings (worker.WorkloadRunner, the benchmarks): heat to the
    steady state unless the GPU is still within HOT_MARGIN_C of the plateau this process last reached, and re-heat
    only while re-heating has taken at most HEAT_SHARE of the time since the first heat; without a thermometer heat
    NO_READER_HEAT_S once per process. Returns the heat record, or None when nothing was needed.
    KERNEL_GYM_HEAT=0 or options.heat_max_s == 0 switch it off (times then stand for whatever state the GPU is in;
    the power record says which)."""
    options = options or DEFAULT_TIMING
    if options.heat_max_s <= 0 or os.environ.get("KERNEL_GYM_HEAT", "1") == "0":
        return None
    now = time.monotonic()
    if now - _hot.get("checked", -1e9) < CHECK_EVERY_S:
        return None
    _hot["checked"] = now
    import torch

    from kernel_gym.measure import power

    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if "reader" not in _hot:
        try:
            _hot["reader"] = power.open_reader(index)
        except power.PowerUnavailable:
            _hot["reader"] = None
    reader = _hot["reader"]
    if reader is None:
        if _hot.get("heated"):
            return None
        rec = heat_to_steady(min(NO_READER_HEAT_S, options.heat_max_s), device)
        _hot["heated"] = True
        return rec
    try:
        temp = reader.read().temp_c
    except power.PowerUnavailable:
        temp = None
    plateau = _hot.get("plateau_c")
    if _hot.get("heated"):
        if temp is None or plateau is None or temp >= plateau - HOT_MARGIN_C:
            return None  # still hot (or no way to tell: the first heat stands)
        if _hot["heat_s"] > HEAT_SHARE * (now - _hot["first"]):
            return None  # re-heating already took its share of this process's time: the power record tells
    rec = heat_to_steady(options.heat_max_s, device, reader)
    if rec.temp_end_c is not None:
        _hot["plateau_c"] = rec.temp_end_c
    _hot.setdefault("first", now)
    _hot["heated"] = True
    _hot["heat_s"] = _hot.get("heat_s", 0.0) + rec.heated_s
    _hot["checked"] = time.monotonic()
    return rec
