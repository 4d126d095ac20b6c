"""Routing profiles and effective_skew: the Zipf exponent that sorted loads correspond to."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.traffic.routing import (
    DriftingHotRouting,
    UniformRouting,
    ZipfRouting,
    effective_skew,
    entropy_norm,
    max_share,
    topk_load_shares,
    zipf_popularity,
)


def test_zipf_popularity_matches_moe_workload():
    w = MoEWorkload(16, 8, 2, 64, 64, skew=1.2)
    assert np.allclose(zipf_popularity(8, 1.2), w.expert_popularity())


def test_top2_shares_match_gumbel_top_k_sampling():
    p = zipf_popularity(8, 1.2)
    g = np.random.default_rng(0).gumbel(size=(100000, 8)) + np.log(p)
    top = np.argpartition(-g, 1, axis=1)[:, :2]
    mc = np.bincount(top.ravel(), minlength=8) / top.size
    assert np.allclose(topk_load_shares(p, 2), mc, atol=3e-3)


@pytest.mark.parametrize("experts,top_k,skew", [(8, 2, 0.0), (8, 2, 0.6), (8, 2, 1.2), (8, 1, 2.0), (64, 8, 0.8)])
def test_effective_skew_recovers_the_exponent_whatever_expert_is_hot(experts, top_k, skew):
    shares = topk_load_shares(zipf_popularity(experts, skew), top_k)
    perm = np.random.default_rng(1).permutation(experts)
    loads = np.round(shares[perm] * 1e6)
    assert effective_skew(loads, top_k) == pytest.approx(skew, abs=0.03)


def test_effective_skew_orders_and_bad_input():
    even = effective_skew(np.full(8, 10.0), 2)
    some = effective_skew(np.array([30, 20, 10, 10, 10, 10, 5, 5.0]), 2)
    hot = effective_skew(np.array([45, 30, 10, 5, 4, 3, 2, 1.0]), 2)
    assert even == 0.0 and 0 < some < hot
    with pytest.raises(ValueError, match="non-negative"):
        effective_skew(np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="top_k"):
        effective_skew(np.ones(4), top_k=5)


def test_profiles_reproducible_and_summarised():
    z = ZipfRouting(8, 2, seed=7, exponent=1.2)
    a, b = z.loads(3.0, 500), ZipfRouting(8, 2, seed=7, exponent=1.2).loads(3.0, 500)
    c = ZipfRouting(8, 2, seed=8, exponent=1.2).loads(3.0, 500)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.sum() == 1000 and a.shape == (8,)
    assert z.effective_skew(0.0) == pytest.approx(1.2, abs=0.01)
    u = UniformRouting(8, 2)
    assert u.effective_skew(5.0) == 0.0 and u.summary(0)["entropy"] == pytest.approx(1.0)
    assert z.summary(0)["max_share"] == pytest.approx(max_share(z.load_shares(0)))
    assert entropy_norm(z.load_shares(0)) < 0.95


def test_drifting_hot_expert_moves_but_sorted_load_stays():
    d = DriftingHotRouting(8, 2, seed=0, exponent=1.0, dwell_s=30.0, transition_s=6.0)
    hots = {d.hot_expert(t) for t in np.arange(0, 600, 30.0)}
    assert len(hots) >= 4
    steady = [d.effective_skew(t) for t in (1.0, 31.0, 95.0, 200.0)]
    assert np.allclose(steady, 1.0, atol=0.02)
    mid_fade = d.effective_skew(27.0)  # half-way through the cross-fade: two experts share the heat
    if d.hot_expert(0) != d.hot_expert(31):
        assert mid_fade < 0.95
