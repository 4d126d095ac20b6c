"""KernelGym/Serving-v0 on the analytic test backend (real configs of the real knob spaces, made-up times) and a
synthetic Poisson trace: the Gymnasium contract, masks, switching costs in the reward, seeded reproducibility and
evaluate_serving."""

from __future__ import annotations

import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from kernel_gym.dispatch.serving_rules import DispatchRule, build_serving_catalogue
from kernel_gym.envs.serving import ServingEnv
from kernel_gym.evaluate.serving_eval import evaluate_serving
from kernel_gym.measure.types import OK
from kernel_gym.traffic.simulator import COMPILE_S_DEFAULT, KERNELS
from kernel_gym.traffic.synthetic import LogNormalLengths, poisson
from tests.fakes.analytic_backend import AnalyticBackend

ENV_ID = "KernelGym/Serving-v0"


@pytest.fixture(scope="module")
def backend():
    return AnalyticBackend(sample=96)


@pytest.fixture(scope="module")
def trace():
    lengths = LogNormalLengths(np.log(600), 0.9, np.log(120), 0.8, max_prompt=4000, max_output=600)
    return poisson(6.0, 400.0, lengths, seed=1)


@pytest.fixture(scope="module")
def kwargs(backend, trace):
    catalogue = build_serving_catalogue(backend, "mixtral-8x7b", trace, holdout=0.25, profile_s=60.0,
                                        profile_windows=2)
    return dict(backend=backend, trace=trace, holdout=0.25, interval_s=5.0, num_intervals=4, warmup_s=5.0,
                catalogue=catalogue)


def make(kwargs, **extra) -> ServingEnv:
    return ServingEnv(**dict(kwargs, **extra))


def test_catalogue_rules_are_measured_and_decode_rules_carry_their_layout(kwargs, backend):
    cat = kwargs["catalogue"]
    assert all(n >= 2 for n in cat.sizes())
    for kernel in KERNELS:
        rules = cat.rules[kernel]
        assert rules[0].is_default and rules[0].name == "default"
        assert any(r.name.startswith("oracle_table") for r in rules)
        for r in rules:
            for c in r.configs():
                if kernel == "decode_attention":
                    assert (c["PAGE_SIZE"], c["LAYOUT"]) == (r.kv.page_size, r.kv.layout)
                assert (kernel, c) in cat.compile_s or COMPILE_S_DEFAULT > 0
        one = [r for r in rules if r.name.startswith("table1")]
        assert all(len(r.configs()) == 1 for r in one)
    # the oracle's decode layout has a rule
    assert any(r.kv == cat.oracle_kv for r in cat.rules["decode_attention"])
    assert cat.nominal_tokens_per_s > 0


def test_check_env_and_registration(kwargs):
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(ENV_ID, entry_point="kernel_gym.envs.serving:ServingEnv", nondeterministic=True)
    env = gymnasium.make(ENV_ID, **kwargs).unwrapped
    assert isinstance(env, ServingEnv)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=True)
    assert isinstance(env.action_space, gymnasium.spaces.MultiDiscrete)
    assert list(env.action_space.nvec) == kwargs["catalogue"].sizes()


def test_masks_observation_and_episode_length(kwargs):
    env = make(kwargs)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    mask = env.action_masks()
    assert mask.dtype == bool and mask.shape == (int(env.action_space.nvec.sum()),) and mask.all()
    assert np.array_equal(info["action_mask"], mask)
    steps, done = 0, False
    while not done:
        obs, reward, done, truncated, info = env.step(env.action_space.sample())
        steps += 1
        assert env.observation_space.contains(obs) and not truncated
        assert 0 <= reward < 4 and info["tokens"] >= 0
        assert obs[-1] == pytest.approx(steps / env.num_intervals)
    assert steps == env.num_intervals
    with pytest.raises(ValueError, match="MultiDiscrete"):
        env.step([99, 0, 0])


def _non_default_rule(env: ServingEnv, kernel: str) -> int:
    for i, r in enumerate(env.catalogue.rules[kernel]):
        if not r.is_default and any((kernel, c) not in env.catalogue.precompiled for c in r.configs()):
            return i
    pytest.skip(f"every {kernel} rule uses only precompiled configs")


def test_compile_stall_costs_tokens(kwargs):
    """The same rule, once with its configs compiled beforehand and once not: the uncompiled run stalls for the
    compile times of the configs it uses and serves fewer tokens."""
    env = make(kwargs)
    i = _non_default_rule(env, "fused_moe")
    action = [0, 0, i]
    for c in env.catalogue.rules["fused_moe"][i].configs():
        env.compile_table[("fused_moe", c)] = 1.5  # a slow compile makes the cost plain
    env.reset(options={"start_s": 150.0})
    _, r_cold, _, _, cold = env.step(action)
    env.reset(options={"start_s": 150.0})
    env.sim.compiled |= {("fused_moe", c) for c in env.catalogue.rules["fused_moe"][i].configs()}
    _, r_warm, _, _, warm = env.step(action)
    assert warm["compile_stall_s"] == 0
    assert cold["compile_stall_s"] >= 1.5
    assert cold["tokens"] < warm["tokens"] and r_cold < r_warm
    # the next interval with the same rule compiles nothing new for the configs already used
    _, _, _, _, again = env.step(action)
    assert again["compile_stall_s"] <= cold["compile_stall_s"]


def test_kv_relayout_stall_costs_tokens(kwargs, monkeypatch):
    env = make(kwargs)
    rules = env.catalogue.rules["decode_attention"]
    i = next((j for j, r in enumerate(rules) if r.is_default and r.kv != rules[0].kv), None)
    if i is None:
        pytest.skip("the catalogue has one decode layout")
    action = [0, i, 0]
    # a slow copy engine makes the re-layout last seconds instead of milliseconds (the formula is unchanged)
    monkeypatch.setattr("kernel_gym.traffic.simulator.COPY_BW", 1e9)
    monkeypatch.setattr("kernel_gym.envs.serving.COPY_BW", 1e9)
    obs, _ = env.reset(options={"start_s": 150.0})
    expected = float(obs[11]) * env.interval_s
    _, r_paid, _, _, paid = env.step(action)
    assert paid["relayout_stall_s"] > 0.5 and paid["relayout_stall_s"] == pytest.approx(expected, rel=1e-5)
    assert paid["stall_s"] >= paid["relayout_stall_s"]
    assert env.sim.kv_layout == rules[i].kv
    # the same switch with the re-layout charged nothing serves more tokens
    env.reset(options={"start_s": 150.0})
    real = env.sim.add_stall
    monkeypatch.setattr(env.sim, "add_stall", lambda s, why: real(0.0 if why.startswith("kv re-layout") else s, why))
    _, r_free, _, _, free = env.step(action)
    assert free["tokens"] > paid["tokens"] and r_free > r_paid
    # staying on the layout costs nothing more
    _, _, _, _, stay = env.step(action)
    assert stay["relayout_stall_s"] == 0


def test_seeded_episode_is_reproducible(kwargs):
    a, b = make(kwargs), make(kwargs)
    oa, _ = a.reset(seed=7)
    ob, _ = b.reset(seed=7)
    assert a.start_s == b.start_s and np.array_equal(oa, ob)
    rng = np.random.default_rng(0)
    for _ in range(a.num_intervals):
        act = [int(rng.integers(n)) for n in a.action_space.nvec]
        ra, rb = a.step(act), b.step(act)
        assert np.array_equal(ra[0], rb[0]) and ra[1] == rb[1] and ra[4]["tokens"] == rb[4]["tokens"]
    assert make(kwargs).reset(seed=8)[1]["start_s"] != a.start_s


def test_heldout_windows_lie_after_the_training_part(kwargs):
    train, held = make(kwargs), make(kwargs, split="heldout")
    cut = kwargs["trace"].duration_s * (1 - kwargs["holdout"])
    for seed in range(5):
        assert held.reset(seed=seed)[1]["start_s"] >= cut
        assert train.reset(seed=seed)[1]["start_s"] + 4 * 5.0 <= cut + 1e-6
    with pytest.raises(ValueError, match="split"):
        make(kwargs, split="test")


def test_evaluate_serving_reports_agent_default_and_oracle(kwargs):
    res = evaluate_serving(kwargs, "default")
    for who in ("agent", "default", "oracle"):
        v = res[f"{who}_tokens_per_s"]
        assert np.isfinite(v) and v > 0
    assert res["agent_tokens_per_s"] == pytest.approx(res["default_tokens_per_s"])
    assert res["agent_over_oracle"] == pytest.approx(res["agent_tokens_per_s"] / res["oracle_tokens_per_s"])
    assert res["windows"][0]["oracle_compiles"] > 0  # the oracle pays for compiling its per-workload picks
    # a callable policy: oracle-like tables everywhere
    env = make(kwargs)
    table = [next(i for i, r in enumerate(env.catalogue.rules[k]) if r.name.startswith("oracle_table"))
             for k in KERNELS]
    res2 = evaluate_serving(kwargs, lambda obs, env: np.array(table))
    assert res2["default_tokens_per_s"] == pytest.approx(res["default_tokens_per_s"])
    assert res2["agent_rules"][0] == [env.catalogue.rules[k][i].name for k, i in zip(KERNELS, table)]
    assert res2["agent_tokens_per_s"] != res["agent_tokens_per_s"]


def test_rule_falls_back_to_nearest_bucket_and_default(backend):
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.workloads import MoEWorkload

    fam = get_family("fused_moe")
    w_small = MoEWorkload(4, 8, 2, 4096, 14336, 0.0)
    w_big = MoEWorkload(4096, 8, 2, 4096, 14336, 0.0)
    small_cfg, big_cfg = fam.default_config(w_small), fam.default_config(w_big)
    assert small_cfg != big_cfg
    rule = DispatchRule("fused_moe", "t", {(2.0, 0.0): small_cfg, (12.0, 0.0): big_cfg})
    assert rule.choose(MoEWorkload(8, 8, 2, 4096, 14336, 0.0)) == small_cfg
    assert rule.choose(MoEWorkload(2048, 8, 2, 4096, 14336, 0.25)) == big_cfg
    assert DispatchRule("fused_moe", "default", {}).choose(w_big) == big_cfg
    assert backend.measure("fused_moe", w_big, big_cfg).status == OK


@pytest.fixture(scope="module")
def recorded():
    from kernel_gym.measure import make_backend

    return make_backend("recorded")


def test_covered_backend_answers_outside_the_grid_honestly_and_counts_it(recorded):
    """The H200 data stops at 2112 causal pairs (prefill) and 6144 tokens (MoE): a proxy answers beyond, never
    faster than the nearest measured shape when smaller, scaled by the roofline ratio when bigger; in-grid answers
    are the recorded ones; choosers count the calls that rest on proxies."""
    from kernel_gym.dispatch.serving_rules import OracleChooser, _Answers
    from kernel_gym.kernels.workloads import MoEWorkload, PrefillWorkload
    from kernel_gym.measure.coverage import CoveredBackend, cover
    from kernel_gym.traffic.simulator import KVLayout

    cov = cover(recorded)
    assert isinstance(cov, CoveredBackend) and cover(cov) is cov
    tiny = PrefillWorkload(32, 8, 128, (32,))
    assert recorded.available_configs("prefill_attention", tiny) == []
    cfgs = cov.available_configs("prefill_attention", tiny)
    assert cfgs and cov.is_proxied("prefill_attention", tiny)
    proxy, scale = cov.proxied[("prefill_attention", tiny.key())]
    assert scale == 1.0 and proxy.causal_pairs() > tiny.causal_pairs()  # a measured, larger shape: never faster
    assert proxy.num_heads == tiny.num_heads and recorded.available_configs("prefill_attention", proxy)
    m = cov.measure("prefill_attention", tiny, cfgs[0])
    assert m.source == "recorded-proxy"
    assert m.median_ms == recorded.measure("prefill_attention", proxy, cfgs[0]).median_ms
    big = MoEWorkload(8192, 8, 2, 4096, 14336, 0.0)
    c = cov.available_configs("fused_moe", big)[0]
    near, s = cov.proxied[("fused_moe", big.key())]
    assert near.num_tokens == 6144 and s > 1.2
    expected = recorded.measure("fused_moe", near, c).median_ms * s
    assert cov.measure("fused_moe", big, c).median_ms == pytest.approx(expected)
    inside = MoEWorkload(64, 8, 2, 4096, 14336, 0.6)
    assert not cov.is_proxied("fused_moe", inside)
    assert cov.measure("fused_moe", inside, c) == recorded.measure("fused_moe", inside, c)
    oracle = OracleChooser(_Answers(cov, {}))
    for w in (tiny, tiny, PrefillWorkload(32, 8, 128, (2048,))):
        oracle.choose("prefill_attention", w, KVLayout(16, "NHD"))
    assert oracle.coverage.calls["prefill_attention"] == 3 and oracle.coverage.proxied["prefill_attention"] == 2


class _TaggedBackend:
    """The analytic backend with measured sources ("recorded") except for the workloads `estimated(kernel, workload)`
    picks, which answer as "recorded-interpolated" (same times)."""

    def __init__(self, inner, estimated):
        self.inner, self.estimated = inner, estimated
        self.name = "recorded"

    def measure(self, kernel, workload, config):
        from dataclasses import replace

        m = self.inner.measure(kernel, workload, config)
        return replace(m, source="recorded-interpolated" if self.estimated(kernel, workload) else "recorded")

    def available_configs(self, kernel, workload):
        return self.inner.available_configs(kernel, workload)


def test_estimated_share_of_tuned_kernel_time_per_policy_and_family(kwargs, backend):
    """Serving-v0 reports, per policy and family, the share of tuned-kernel seconds on estimated times: the seconds it
    charges add up to the simulator's tuned-kernel time, a family answered only by estimates is at 1.0, one answered
    only by measurements at 0.0, and a split inside a family lands strictly between."""
    big_moe = lambda k, w: k == "fused_moe" and w.num_tokens >= 64  # noqa: E731
    tagged = _TaggedBackend(backend, lambda k, w: k == "prefill_attention" or big_moe(k, w))
    kw = dict(kwargs, backend=tagged)
    env = make(kw, split="heldout")
    env.reset(options={"start_s": env._range[0]})
    _, _, _, _, info = env.step(env.default_action())
    assert sum(info["kernel_s"].values()) == pytest.approx(info["tuned_kernel_s"], rel=1e-9)
    assert info["estimated_kernel_s"]["prefill_attention"] == pytest.approx(info["kernel_s"]["prefill_attention"])
    assert info["estimated_kernel_s"]["decode_attention"] == 0.0
    res = evaluate_serving(kw, "default")
    for who in ("agent", "default", "oracle"):
        assert res[f"{who}_estimated_share.prefill_attention"] == pytest.approx(1.0)
        assert res[f"{who}_estimated_share.decode_attention"] == 0.0
        assert 0.0 < res[f"{who}_estimated_share.fused_moe"] < 1.0
        assert 0.0 < res[f"{who}_estimated_share"] < 1.0
        assert res[f"{who}_tuned_kernel_s"] > 0
    # the analytic backend's own answers are not measurements: everything is estimated
    plain = evaluate_serving(kwargs, "default")
    assert plain["oracle_estimated_share"] == pytest.approx(1.0)
    assert plain["agent_estimated_share"] == pytest.approx(1.0)
