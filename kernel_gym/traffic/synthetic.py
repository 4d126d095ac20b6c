"""Seeded synthetic traffic: Poisson and gamma (bursty) arrivals, diurnal ramps, step changes of rate and length mix,
and length distributions fitted to a real trace.

Arrivals for any rate curve rate(t) and burstiness come from one construction (time rescaling): a renewal process of
unit rate with gamma inter-arrival gaps (shape 1/cv^2, so cv = 1 is Poisson and cv > 1 is burstier) is mapped through
the inverse of the cumulative rate Lambda(t) = integral of rate. Same seed, same trace. Times count from the profile's
start (0), not from the first arrival, so phase boundaries stay where they were asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kernel_gym.traffic.traces import Trace


class LengthDist(Protocol):
    """Draws (prompt_tokens, output_tokens) pairs."""

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class LogNormalLengths:
    """Independent log-normal prompt and output lengths (log-space mean and std), clipped to [1, max]."""

    prompt_mu: float
    prompt_sigma: float
    output_mu: float
    output_sigma: float
    max_prompt: int = 32768
    max_output: int = 4096

    @classmethod
    def fit(cls, trace: Trace, max_prompt: int | None = None, max_output: int | None = None) -> LogNormalLengths:
        """Maximum-likelihood log-normal fit to a trace's lengths; clips at the trace's maxima unless given."""
        lp, lo = np.log(trace.prompt_tokens), np.log(trace.output_tokens)
        return cls(float(lp.mean()), float(lp.std()), float(lo.mean()), float(lo.std()),
                   int(max_prompt or trace.prompt_tokens.max()), int(max_output or trace.output_tokens.max()))

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        p = np.exp(rng.normal(self.prompt_mu, self.prompt_sigma, n))
        o = np.exp(rng.normal(self.output_mu, self.output_sigma, n))
        return (np.clip(np.rint(p), 1, self.max_prompt).astype(np.int64),
                np.clip(np.rint(o), 1, self.max_output).astype(np.int64))


@dataclass(frozen=True)
class EmpiricalLengths:
    """Resamples (prompt, output) pairs of a real trace with replacement (keeps their correlation)."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    @classmethod
    def from_trace(cls, trace: Trace) -> EmpiricalLengths:
        return cls(trace.prompt_tokens.copy(), trace.output_tokens.copy())

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, len(self.prompt_tokens), n)
        return self.prompt_tokens[idx], self.output_tokens[idx]


@dataclass(frozen=True)
class FixedLengths:
    """Every request has the same lengths (tests, microbenchmarks)."""

    prompt: int
    output: int

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return np.full(n, self.prompt, dtype=np.int64), np.full(n, self.output, dtype=np.int64)


def arrival_times(rate: float | Callable[[np.ndarray], np.ndarray], duration_s: float, cv: float = 1.0,
                  seed: int = 0, grid_s: float = 0.1) -> np.ndarray:
    """Arrival times in [0, duration_s) for a constant or time-varying rate (req/s) and inter-arrival coefficient of
    variation `cv` (1 = Poisson). rate(t) is evaluated on a `grid_s` grid (vectorised: takes and returns arrays)."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    if cv <= 0:
        raise ValueError(f"cv (burstiness) must be > 0 (1 = Poisson), got {cv}")
    grid = np.arange(0.0, duration_s + grid_s, grid_s)
    r = np.full_like(grid, float(rate)) if not callable(rate) else np.asarray(rate(grid), dtype=np.float64)
    if r.shape != grid.shape or np.any(r < 0) or not np.all(np.isfinite(r)):
        raise ValueError("rate must be a non-negative number or a function giving one finite rate >= 0 per time")
    cum = np.concatenate([[0.0], np.cumsum(0.5 * (r[1:] + r[:-1]) * np.diff(grid))])  # Lambda on the grid
    total = cum[-1]
    if total <= 0:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    shape = 1.0 / cv**2
    n_guess = int(total + 10 * np.sqrt(total) * max(cv, 1.0) + 20)
    gaps = rng.gamma(shape, 1.0 / shape, n_guess)
    u = np.cumsum(gaps)
    while u[-1] < total:
        more = np.cumsum(rng.gamma(shape, 1.0 / shape, n_guess)) + u[-1]
        u = np.concatenate([u, more])
    u = u[u < total]
    t = np.interp(u, cum, grid)  # inverse of Lambda (monotone; flat parts where rate = 0 are skipped)
    return t[t < duration_s]


def _trace(name: str, t: np.ndarray, lengths: LengthDist, rng: np.random.Generator) -> Trace:
    if len(t) == 0:
        raise ValueError(f"synthetic profile {name!r} produced no arrivals; raise the rate or the duration")
    p, o = lengths.sample(len(t), rng)
    return Trace(name, t, p, o, source="synthetic")


def poisson(rate: float, duration_s: float, lengths: LengthDist, seed: int = 0) -> Trace:
    """Poisson arrivals at a constant rate (req/s)."""
    t = arrival_times(rate, duration_s, 1.0, seed)
    return _trace(f"poisson(rate={rate:g},seed={seed})", t, lengths, np.random.default_rng([seed, 1]))


def gamma(rate: float, cv: float, duration_s: float, lengths: LengthDist, seed: int = 0) -> Trace:
    """Gamma renewal arrivals: mean rate `rate`, inter-arrival coefficient of variation `cv` (> 1 = bursty)."""
    t = arrival_times(rate, duration_s, cv, seed)
    return _trace(f"gamma(rate={rate:g},cv={cv:g},seed={seed})", t, lengths, np.random.default_rng([seed, 1]))


def diurnal(mean_rate: float, amplitude: float, period_s: float, duration_s: float, lengths: LengthDist,
            seed: int = 0, cv: float = 1.0, phase: float = -np.pi / 2) -> Trace:
    """A daily-style ramp: rate(t) = mean_rate * (1 + amplitude * sin(2 pi t / period_s + phase)); the default phase
    starts at the trough and climbs. amplitude in [0, 1]."""
    if not 0 <= amplitude <= 1:
        raise ValueError(f"amplitude must be in [0, 1] (rate never negative), got {amplitude}")
    fn = lambda t: mean_rate * (1 + amplitude * np.sin(2 * np.pi * t / period_s + phase))
    t = arrival_times(fn, duration_s, cv, seed)
    return _trace(f"diurnal(rate={mean_rate:g},amp={amplitude:g},seed={seed})", t, lengths,
                  np.random.default_rng([seed, 1]))


@dataclass(frozen=True)
class Phase:
    """One segment of a traffic shift: its duration, rate, burstiness and length mix."""

    duration_s: float
    rate: float
    lengths: LengthDist
    cv: float = 1.0


def traffic_shift(phases: Sequence[Phase], seed: int = 0) -> Trace:
    """Step changes of rate and length mix: the phases follow one another; arrivals of each phase draw that phase's
    lengths."""
    if not phases:
        raise ValueError("traffic_shift needs at least one Phase")
    ts, ps, os_ = [], [], []
    start = 0.0
    for i, ph in enumerate(phases):
        t = arrival_times(ph.rate, ph.duration_s, ph.cv, seed=seed * 1000 + i) + start
        p, o = ph.lengths.sample(len(t), np.random.default_rng([seed, i, 1]))
        ts.append(t)
        ps.append(p)
        os_.append(o)
        start += ph.duration_s
    t = np.concatenate(ts)
    if len(t) == 0:
        raise ValueError("traffic_shift produced no arrivals; raise a phase's rate or duration")
    return Trace(f"shift({len(phases)} phases,seed={seed})", t, np.concatenate(ps), np.concatenate(os_),
                 source="synthetic")
