"""Running the serving simulator over windows of a trace: the glue Serving-v0, its rule catalogue and its evaluation
share (kernel_gym/envs/serving.py, dispatch/serving_rules.py, evaluate/serving_eval.py).

- `resolve_trace` / `resolve_model`: a trace or model spec given by name, or as the object itself.
- `slice_window`: the requests arriving in [t0, t1) of a trace, shifted to time 0 and compressed by rate_scale.
- `window_simulator`: a Simulator over [start - warm-up, start + span) of a trace, advanced through the warm-up.
- `run_windows`: evenly spaced windows of the start of a trace, each replayed with a fresh chooser.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from kernel_gym.traffic.simulator import BackendTimer, ConfigChooser, Simulator
from kernel_gym.traffic.traces import Trace, load_trace


def resolve_trace(trace: Any) -> Trace:
    if isinstance(trace, Trace):
        return trace
    if isinstance(trace, str):
        return load_trace(trace)
    raise TypeError(f"trace {trace!r} is neither a trace name/path nor a kernel_gym.traffic.Trace")


def resolve_model(model: Any) -> Any:
    if isinstance(model, str):
        from kernel_gym.models import load_model

        return load_model(model)
    return model


def slice_window(trace: Trace, t0: float, t1: float, rate_scale: float) -> Trace:
    """Requests arriving in [t0, t1) of the trace, with t0 at time 0 and time compressed by rate_scale."""
    lo, hi = np.searchsorted(trace.arrival_s, [t0, t1], side="left")
    if hi <= lo:
        raise ValueError(f"trace {trace.name!r} has no arrivals in [{t0:g}, {t1:g}) s; choose another window")
    return Trace(f"{trace.name}[{t0:g}:{t1:g}s]", (trace.arrival_s[lo:hi] - t0) / rate_scale,
                 trace.prompt_tokens[lo:hi], trace.output_tokens[lo:hi], trace.source)


def window_simulator(model: Any, trace: Trace, backend: Any, chooser: ConfigChooser, start_s: float, warmup_s: float,
                     span_s: float, rate_scale: float, routing: Any = None,
                     compile_s: Callable[[str, Any], float] | None = None,
                     precompiled: Iterable[tuple[str, Any]] = (),
                     sim_kwargs: dict[str, Any] | None = None) -> Simulator:
    """A simulator over [start_s - warmup_s x rate_scale, start_s + span_s x rate_scale) of the trace (trace seconds;
    warmup_s and span_s are simulated seconds), served by `chooser` with kernel times from `backend`, advanced through
    the warm-up."""
    t0 = start_s - warmup_s * rate_scale
    t1 = start_s + span_s * rate_scale
    sim = Simulator(model, slice_window(trace, t0, t1, rate_scale), BackendTimer(backend), chooser, routing,
                    compile_s=compile_s, precompiled=precompiled, **(sim_kwargs or {}))
    if warmup_s > 0:
        sim.run_until(warmup_s)
    return sim


def run_windows(model: Any, trace: Trace, backend: Any, make_chooser: Callable[[], ConfigChooser],
                    end_s: float, windows: int, window_s: float, rate_scale: float, routing: Any = None,
                    sim_kwargs: dict[str, Any] | None = None) -> None:
    """Replay `windows` windows of `window_s` simulated seconds, starting evenly over [0, end_s) of the trace (trace
    seconds), each with a fresh chooser from `make_chooser` (which records what it is asked)."""
    for i in range(windows):
        t0 = i * end_s / windows
        sim = Simulator(model, slice_window(trace, t0, t0 + window_s * rate_scale, rate_scale), BackendTimer(backend),
                        make_chooser(), routing, **(sim_kwargs or {}))
        sim.run_until(window_s)
