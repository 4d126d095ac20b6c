"""Synthetic traffic: rates, burstiness, ramps, shifts, fitted lengths; reproducible per seed."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_gym.traffic.synthetic import (
    EmpiricalLengths,
    FixedLengths,
    LogNormalLengths,
    Phase,
    arrival_times,
    diurnal,
    gamma,
    poisson,
    traffic_shift,
)
from kernel_gym.traffic.traces import load_trace

L = FixedLengths(100, 10)


def _cv(t: np.ndarray) -> float:
    g = np.diff(t)
    return float(g.std() / g.mean())


def test_poisson_rate_cv_and_seed():
    a = poisson(20.0, 500.0, L, seed=1)
    assert len(a) / 500.0 == pytest.approx(20.0, rel=0.05)
    assert _cv(a.arrival_s) == pytest.approx(1.0, abs=0.05)
    b = poisson(20.0, 500.0, L, seed=1)
    c = poisson(20.0, 500.0, L, seed=2)
    assert np.array_equal(a.arrival_s, b.arrival_s) and not np.array_equal(a.arrival_s[:50], c.arrival_s[:50])


def test_gamma_burstiness():
    t = gamma(20.0, 3.0, 2000.0, L, seed=0)
    assert len(t) / 2000.0 == pytest.approx(20.0, rel=0.1)
    assert _cv(t.arrival_s) == pytest.approx(3.0, rel=0.15)


def test_diurnal_ramp_climbs_from_trough():
    t = diurnal(10.0, 0.8, period_s=1000.0, duration_s=1000.0, lengths=L, seed=0).arrival_s
    trough = np.count_nonzero(t < 100)  # near phase -pi/2: rate ~ 2 req/s
    peak = np.count_nonzero((t >= 450) & (t < 550))  # rate ~ 18 req/s
    assert peak > 4 * trough
    with pytest.raises(ValueError, match="amplitude"):
        diurnal(10.0, 1.5, 100.0, 100.0, L)


def test_traffic_shift_changes_rate_and_mix_at_the_boundary():
    tr = traffic_shift([Phase(300.0, 5.0, FixedLengths(200, 50)), Phase(300.0, 20.0, FixedLengths(2000, 5))], seed=3)
    first = tr.arrival_s < 300
    assert np.count_nonzero(first) / 300 == pytest.approx(5.0, rel=0.15)
    assert np.count_nonzero(~first) / 300 == pytest.approx(20.0, rel=0.1)
    assert set(tr.prompt_tokens[first]) == {200} and set(tr.prompt_tokens[~first]) == {2000}


def test_lognormal_fit_recovers_a_real_trace():
    real = load_trace("bundled")
    fit = LogNormalLengths.fit(real)
    p, o = fit.sample(20000, np.random.default_rng(0))
    # a maximum-likelihood log-normal matches the mean and spread of log lengths (geometric mean, not median)
    assert np.log(p).mean() == pytest.approx(np.log(real.prompt_tokens).mean(), abs=0.05)
    assert np.log(o).mean() == pytest.approx(np.log(real.output_tokens).mean(), abs=0.05)
    assert np.log(o).std() == pytest.approx(np.log(real.output_tokens).std(), rel=0.05)
    assert p.min() >= 1 and p.max() <= real.prompt_tokens.max()


def test_empirical_resampling_keeps_real_pairs():
    real = load_trace("bundled")
    emp = EmpiricalLengths.from_trace(real)
    p, o = emp.sample(500, np.random.default_rng(0))
    pairs = set(zip(real.prompt_tokens.tolist(), real.output_tokens.tolist()))
    assert all((a, b) in pairs for a, b in zip(p.tolist(), o.tolist()))


def test_zero_rate_and_bad_args():
    assert len(arrival_times(lambda t: np.zeros_like(t), 10.0)) == 0
    with pytest.raises(ValueError, match="cv"):
        arrival_times(1.0, 10.0, cv=0)
    with pytest.raises(ValueError, match="no arrivals"):
        poisson(1e-6, 1.0, L)
