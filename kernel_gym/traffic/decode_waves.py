"""Decode attention's time for the batch a step really holds: its programs filling the GPU in launch order.

Why: a decode kernel launches one program per (sequence, head, split), and the GPU starts them in launch order as
earlier ones finish. A live batch is ragged (its longest sequence is often 2-6x the mean) while the dataset's rows
spread contexts over only 0.5-1.5x their mean (DecodeWorkload.context_lens), so a row's time at the batch's mean
context misprices it: the default config (one program per sequence and q head, no split) took 1.3-1.75x that on
live steps, and split configs less than the bound for the longest sequence alone (docs/live.md).

The model: with `slots` programs in flight, each program busy for its tokens plus PROGRAM_TOKENS (its fixed work),
the launch lasts the makespan of that list schedule (in token units), and its seconds are launch_s + token_s x
makespan. Nothing is fitted to live runs: per config, fit() takes the config's own times at a grid of batches and
contexts (whatever the simulator's timer answers there, usually the dataset's rows and their interpolation), tries
each slot count and keeps the one whose least-squares line fits best. A config whose times the line does not fit
(median error over MAX_FIT_ERROR, or too few points) gets None, and the simulator prices it as before.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PROGRAM_TOKENS = 16  # a program's fixed work (setup, the output store) in tokens of KV: one 16-token page
MAX_JOBS = 4096  # larger launches are simulated on every g-th round with about slots / g (bounded cost), rescaled
FIT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FIT_CONTEXTS = (256, 1024, 4096, 16384)
SLOT_CANDIDATES = tuple(round(32 * 2 ** (k / 4)) for k in range(33))  # 32 .. 8192 programs in flight
MIN_FIT_POINTS, MIN_FIT_BATCHES, MAX_FIT_ERROR = 8, 3, 0.10


def makespan(rounds: Sequence[Sequence[int]], slots: int) -> float:
    """Token units until the last program ends when programs (rounds in order, each round's in order) start on the
    first of `slots` free slots, each busy for its tokens plus PROGRAM_TOKENS."""
    jobs = sum(len(r) for r in rounds)
    if jobs == 0:
        return 0.0
    if jobs <= slots:
        return float(max(max(r) for r in rounds if r) + PROGRAM_TOKENS)
    g = max(1, math.ceil(jobs / MAX_JOBS))
    scale = 1.0
    if g > 1:  # every g-th round on about slots / g: the same schedule's shape at a bounded cost, rescaled by how far
        # the kept rounds and the whole slots stray from the exact 1 / g (else the price would jump as g changes)
        kept, whole = rounds[::g], max(1, round(slots / g))
        scale = (len(rounds) / len(kept)) * (whole / slots)
        rounds, slots = kept, whole
    free = [0.0] * slots
    end = 0.0
    for r in rounds:
        for tokens in r:
            t = heapq.heappop(free) + tokens + PROGRAM_TOKENS
            if t > end:
                end = t
            heapq.heappush(free, t)
    return end * scale


@dataclass(frozen=True)
class WaveFit:
    """One config's fit: seconds = launch_s + token_s x makespan(rounds, slots); median_error over `points` times."""

    slots: int
    launch_s: float
    token_s: float
    median_error: float
    points: int

    def seconds(self, rounds: Sequence[Sequence[int]]) -> float:
        return self.launch_s + self.token_s * makespan(rounds, self.slots)


def fit(time_at: Callable[[int, int], float | None],
        rounds_at: Callable[[int, int], Sequence[Sequence[int]]]) -> WaveFit | None:
    """The slot count and line that best fit a config's times: `time_at(batch, context)` its seconds at a grid
    point (None where it has none), `rounds_at(batch, context)` the programs that point launches. None where the
    times are too few or the line fits them worse than MAX_FIT_ERROR (median relative error)."""
    points = []
    for b in FIT_BATCHES:
        for c in FIT_CONTEXTS:
            t = time_at(b, c)
            if t is not None and t > 0 and math.isfinite(t):
                points.append((b, rounds_at(b, c), t))
    if len(points) < MIN_FIT_POINTS or len({b for b, _, _ in points}) < MIN_FIT_BATCHES:
        return None
    best: WaveFit | None = None
    for slots in SLOT_CANDIDATES:
        xs = [makespan(r, slots) for _, r, _ in points]
        ys = [t for _, _, t in points]
        # relative least squares of t = a + k x: minimise sum((a + k x) / t - 1)^2
        s11 = sum(1 / t ** 2 for t in ys)
        s12 = sum(x / t ** 2 for x, t in zip(xs, ys))
        s22 = sum(x * x / t ** 2 for x, t in zip(xs, ys))
        r1, r2 = sum(1 / t for t in ys), sum(x / t for x, t in zip(xs, ys))
        det = s11 * s22 - s12 * s12
        if det <= 0:
            continue
        a, k = (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det
        if k <= 0:
            continue
        a = max(a, 0.0)
        errs = sorted(abs((a + k * x) / t - 1) for x, t in zip(xs, ys))
        med = errs[len(errs) // 2]
        if best is None or med < best.median_error:
            best = WaveFit(slots, a, k, med, len(points))
    if best is None or best.median_error > MAX_FIT_ERROR:
        return None
    return best
