"""Traffic features over a trailing window, as a fixed-order vector for environment observations.

Values are raw (req/s, tokens, sequences, fractions); an environment scales them as it sees fit. Quantiles over an
empty window are 0 (no arrivals, no decode steps), and routing stats fall back to the profile at the window's end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernel_gym.traffic.routing import entropy_norm
from kernel_gym.traffic.simulator import _C, Simulator

FEATURE_NAMES = (
    "arrival_rate",  # requests arriving per second in the window
    "prompt_len_p50",  # prompt tokens of the requests arriving in the window
    "prompt_len_p90",
    "context_len_p50",  # mean decode context per step (tokens), over the window's steps
    "context_len_p90",
    "decode_batch_p50",  # decode batch size per step
    "decode_batch_p90",
    "routing_entropy",  # normalised entropy of the expected expert load (1 = even)
    "routing_max_share",  # fraction of token-slots to the busiest expert
    "kv_occupancy",  # time-weighted fraction of KV pages in use
    "queue_len",  # time-weighted number of requests waiting
)


def _q(x: np.ndarray, p: float) -> float:
    return float(np.percentile(x, p)) if len(x) else 0.0


def traffic_features(sim: Simulator, window_s: float, t_end: float | None = None) -> np.ndarray:
    """FEATURE_NAMES-ordered float32 vector over (t_end - window_s, t_end] (t_end defaults to the simulator's clock)."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    t1 = sim.clock if t_end is None else float(t_end)
    t0 = t1 - window_s
    lo, hi = np.searchsorted(sim.arrival, [t0, t1], side="right")
    prompts = sim.prompt[lo:hi]
    log = sim.step_log
    starts = log[:, _C["t_start"]]
    a, b = np.searchsorted(starts, [t0, t1], side="left")
    w = log[a:b]
    dec = w[w[:, _C["decode_batch"]] > 0]
    dur = w[:, _C["duration_s"]]
    busy = float(dur.sum())
    if len(w):
        ent = float(w[:, _C["routing_entropy"]].mean())
        mx = float(w[:, _C["max_share"]].mean())
        occ = float((w[:, _C["kv_occupancy"]] * dur).sum() / busy) if busy > 0 else 0.0
        queue = float((w[:, _C["waiting"]] * dur).sum() / busy) if busy > 0 else 0.0
    else:
        shares = sim.routing.load_shares(t1)
        ent, mx = entropy_norm(shares), float(np.max(shares))
        occ = 1.0 - sim.free_pages / sim.num_pages
        queue = float(len(sim.waiting))
    return np.array([
        (hi - lo) / window_s,
        _q(prompts, 50), _q(prompts, 90),
        _q(dec[:, _C["mean_context"]], 50), _q(dec[:, _C["mean_context"]], 90),
        _q(dec[:, _C["decode_batch"]], 50), _q(dec[:, _C["decode_batch"]], 90),
        ent, mx, occ, queue,
    ], dtype=np.float32)


def feature_dict(sim: Any, window_s: float, t_end: float | None = None) -> dict[str, float]:
    """The same features keyed by name (logging, plots)."""
    return dict(zip(FEATURE_NAMES, (float(v) for v in traffic_features(sim, window_s, t_end))))
