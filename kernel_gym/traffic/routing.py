"""Expert routing profiles for MoE layers, and `effective_skew(loads)`.

A profile gives the router's expert popularity p(t) (the distribution each token's top-k picks are drawn from,
without replacement, like `MoEWorkload`'s Gumbel-top-k inputs) and from it the expected load share of each expert
(fraction of the token-slots it receives; at most 1/top_k). `loads(t, num_tokens)` draws token-slot counts from those
shares, reproducibly per (seed, t, num_tokens): a multinomial over num_tokens * top_k slots, which ignores the
per-token "no expert twice" constraint (the expected shares honour it).

Kernel time depends on the sorted load, not on which expert is hot, so every profile is summarised for the kernels by
`effective_skew`: the Zipf exponent s (MoEWorkload.skew, popularity ~ (rank+1)^-s) whose expected sorted load shares
best match the observed max-expert share and normalised entropy.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

SKEW_MAX = 4.0
_SKEW_TABLE_STEP = 0.02
_MC_SAMPLES = 4096


def zipf_popularity(num_experts: int, skew: float) -> np.ndarray:
    """MoEWorkload.expert_popularity as an array: p_e ~ (e + 1) ** -skew."""
    w = np.arange(1, num_experts + 1, dtype=np.float64) ** -float(skew)
    return w / w.sum()


def topk_load_shares(popularity: np.ndarray, top_k: int) -> np.ndarray:
    """Expected fraction of token-slots each expert receives when each token picks top_k distinct experts by
    sequential sampling from `popularity` (Plackett-Luce; what Gumbel-top-k draws). Exact for top_k <= 2; Monte
    Carlo with fixed common noise (4096 draws) above."""
    p = np.asarray(popularity, dtype=np.float64)
    p = p / p.sum()
    e = len(p)
    if top_k >= e:
        return np.full(e, 1.0 / e)
    if top_k == 1:
        return p
    if top_k == 2:
        q = np.minimum(p, 1 - 1e-12)
        # P(e in top 2) = p_e + sum_{j != e} p_j * p_e / (1 - p_j)
        incl = p + p * (np.sum(p / (1 - q)) - p / (1 - q))
        return incl / 2
    g = _gumbel(e)
    logits = np.log(np.maximum(p, 1e-300))[None, :] + g
    top = np.argpartition(-logits, top_k - 1, axis=1)[:, :top_k]
    counts = np.bincount(top.ravel(), minlength=e).astype(np.float64)
    return counts / counts.sum()


@functools.lru_cache(maxsize=8)
def _gumbel(num_experts: int) -> np.ndarray:
    return np.random.default_rng(12345).gumbel(size=(_MC_SAMPLES, num_experts))


def entropy_norm(shares: np.ndarray) -> float:
    """Shannon entropy of the load shares divided by log(num_experts): 1 = perfectly even, 0 = one expert."""
    s = np.asarray(shares, dtype=np.float64)
    tot = s.sum()
    if tot <= 0:
        raise ValueError("loads sum to zero: nothing was routed")
    s = s[s > 0] / tot
    n = len(np.asarray(shares))
    return float(-(s * np.log(s)).sum() / np.log(n)) if n > 1 else 1.0


def max_share(loads: np.ndarray) -> float:
    """Fraction of the token-slots that the busiest expert received."""
    x = np.asarray(loads, dtype=np.float64)
    return float(x.max() / x.sum())


@functools.lru_cache(maxsize=32)
def _skew_table(num_experts: int, top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    step = _SKEW_TABLE_STEP if top_k <= 2 else 2.5 * _SKEW_TABLE_STEP  # Monte Carlo shares cost more: coarser grid
    skews = np.arange(0.0, SKEW_MAX + 1e-9, step)
    mx = np.empty(len(skews))
    en = np.empty(len(skews))
    for i, s in enumerate(skews):
        sh = topk_load_shares(zipf_popularity(num_experts, s), top_k)
        mx[i] = sh.max()
        en[i] = entropy_norm(sh)
    return skews, mx, en


def effective_skew(loads: np.ndarray, top_k: int = 1) -> float:
    """The Zipf exponent (MoEWorkload.skew) whose expected sorted load shares best match the observed max-expert share
    and normalised entropy of `loads` (per-expert token-slot counts or shares). Pass the model's top_k: with top_k > 1
    an expert receives at most 1/top_k of the slots, so the same popularity gives flatter loads. In [0, 4]."""
    x = np.asarray(loads, dtype=np.float64)
    if x.ndim != 1 or len(x) < 2 or np.any(x < 0) or x.sum() <= 0:
        raise ValueError(f"loads must be a 1-D array of >= 2 non-negative counts with a positive sum, got {loads!r}")
    if not 1 <= top_k <= len(x):
        raise ValueError(f"top_k {top_k} must be in [1, num_experts={len(x)}]")
    skews, mx, en = _skew_table(len(x), top_k)
    step = skews[1] - skews[0]
    err = (mx - max_share(x)) ** 2 + (en - entropy_norm(x)) ** 2
    i = int(np.argmin(err))
    # refine between grid neighbours by a parabola through the errors
    if 0 < i < len(skews) - 1:
        a, b, c = err[i - 1], err[i], err[i + 1]
        den = a - 2 * b + c
        if den > 0:
            return float(np.clip(skews[i] + 0.5 * step * (a - c) / den, 0.0, SKEW_MAX))
    return float(skews[i])


class RoutingProfile(Protocol):
    """Maps a time (and token count) to expert loads."""

    num_experts: int
    top_k: int

    def popularity(self, t_s: float) -> np.ndarray: ...

    def load_shares(self, t_s: float) -> np.ndarray: ...

    def loads(self, t_s: float, num_tokens: int) -> np.ndarray: ...

    def effective_skew(self, t_s: float) -> float: ...


@dataclass
class _Base:
    num_experts: int
    top_k: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_experts < 1 or not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"need num_experts >= 1 and 1 <= top_k <= num_experts, got {self.num_experts}, "
                             f"{self.top_k}")
        self._cache: dict[object, tuple[np.ndarray, float]] = {}

    def _bucket(self, t_s: float) -> object:
        return 0

    def popularity(self, t_s: float) -> np.ndarray:
        raise NotImplementedError

    def _stats(self, t_s: float) -> tuple[np.ndarray, float]:
        b = self._bucket(t_s)
        hit = self._cache.get(b)
        if hit is None:
            shares = topk_load_shares(self.popularity(t_s), self.top_k)
            hit = (shares, effective_skew(shares, self.top_k))
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[b] = hit
        return hit

    def load_shares(self, t_s: float) -> np.ndarray:
        """Expected fraction of token-slots per expert at time t (sums to 1)."""
        return self._stats(t_s)[0]

    def effective_skew(self, t_s: float) -> float:
        return self._stats(t_s)[1]

    def loads(self, t_s: float, num_tokens: int) -> np.ndarray:
        """Token-slot counts per expert for num_tokens tokens at time t; the same (seed, t, num_tokens) gives the
        same counts."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        seq = [self.seed, int(round(t_s * 1e6)) & 0xFFFFFFFF, int(num_tokens), zlib.crc32(type(self).__name__.encode())]
        rng = np.random.default_rng(seq)
        return rng.multinomial(num_tokens * self.top_k, self.load_shares(t_s))

    def summary(self, t_s: float) -> dict[str, float]:
        sh = self.load_shares(t_s)
        return {"entropy": entropy_norm(sh), "max_share": float(sh.max()), "effective_skew": self.effective_skew(t_s)}


@dataclass
class UniformRouting(_Base):
    """Every expert equally popular (what per-batch tuning tables assume)."""

    def popularity(self, t_s: float) -> np.ndarray:
        return np.full(self.num_experts, 1.0 / self.num_experts)


@dataclass
class ZipfRouting(_Base):
    """Zipf popularity with a given exponent over a seeded random ranking of the experts (constant in time)."""

    exponent: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.exponent < 0:
            raise ValueError(f"Zipf exponent must be >= 0, got {self.exponent}")
        self._perm = np.random.default_rng(self.seed).permutation(self.num_experts)

    def popularity(self, t_s: float) -> np.ndarray:
        p = np.empty(self.num_experts)
        p[self._perm] = zipf_popularity(self.num_experts, self.exponent)
        return p


@dataclass
class DriftingHotRouting(_Base):
    """One hot expert that moves: Zipf(exponent) over a ranking whose head changes every `dwell_s` seconds to a seeded
    random expert, cross-fading linearly over the last `transition_s` of each dwell (during a fade two experts share
    the heat, so the sorted load flattens briefly). Stats are cached per 1/16 of a transition."""

    exponent: float = 1.2
    dwell_s: float = 60.0
    transition_s: float = 10.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.exponent < 0 or self.dwell_s <= 0 or not 0 <= self.transition_s <= self.dwell_s:
            raise ValueError(f"need exponent >= 0, dwell_s > 0 and 0 <= transition_s <= dwell_s (a dwell of at "
                             f"least the {self.transition_s:g} s transition); got exponent {self.exponent}, dwell_s "
                             f"{self.dwell_s}")
        self._base = zipf_popularity(self.num_experts, self.exponent)
        self._rankings: dict[int, np.ndarray] = {}

    def _ranking(self, period: int) -> np.ndarray:
        r = self._rankings.get(period)
        if r is None:
            r = np.random.default_rng([self.seed, period]).permutation(self.num_experts)
            self._rankings[period] = r
        return r

    def hot_expert(self, t_s: float) -> int:
        return int(self._ranking(int(np.floor(t_s / self.dwell_s)))[0])

    def _bucket(self, t_s: float) -> object:
        res = self.transition_s / 16 if self.transition_s > 0 else self.dwell_s
        return int(np.floor(t_s / res))

    def popularity(self, t_s: float) -> np.ndarray:
        period = int(np.floor(t_s / self.dwell_s))
        p = np.empty(self.num_experts)
        p[self._ranking(period)] = self._base
        into = t_s - period * self.dwell_s
        start_fade = self.dwell_s - self.transition_s
        if self.transition_s > 0 and into > start_fade:
            w = (into - start_fade) / self.transition_s
            q = np.empty(self.num_experts)
            q[self._ranking(period + 1)] = self._base
            p = (1 - w) * p + w * q
        return p


def uniform_for(model: object, seed: int = 0) -> UniformRouting:
    """Uniform routing for a ModelSpec."""
    return UniformRouting(model.num_experts, model.top_k, seed)
