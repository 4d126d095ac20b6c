"""Kernel envs: registration, the Gymnasium contract (check_env), rewards, masks and failures, on the analytic test
backend (real configs of the real knob spaces, made-up times)."""

from __future__ import annotations

import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import kernel_gym  # noqa: F401  (registers the ids)
from kernel_gym.dispatch.catalogue import split_workloads
from kernel_gym.envs import ENV_IDS, ENV_KERNELS
from kernel_gym.measure.types import COMPILE_ERROR, INVALID, UNAVAILABLE
from tests.fakes.analytic_backend import AnalyticBackend

KERNEL_IDS = ["KernelGym/MoE-v0", "KernelGym/DecodeAttention-v0", "KernelGym/PrefillAttention-v0"]


@pytest.fixture(scope="module")
def backend():
    return AnalyticBackend()


@pytest.fixture(scope="module")
def envs(backend):
    return {env_id: gymnasium.make(env_id, backend=backend).unwrapped for env_id in KERNEL_IDS}


def test_every_id_is_registered_with_the_right_determinism():
    for env_id, (_, kwargs, nondeterministic) in ENV_IDS.items():
        spec = gymnasium.spec(env_id)
        assert spec.nondeterministic is nondeterministic
        assert (kwargs["backend"] == "live") is nondeterministic
        assert env_id in ENV_KERNELS or env_id.startswith("KernelGym/Serving")
    assert set(KERNEL_IDS) <= set(ENV_IDS)


@pytest.mark.parametrize("env_id", KERNEL_IDS)
def test_check_env_passes(env_id, envs):
    env = envs[env_id]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning is a failure
        check_env(env, skip_render_check=False)
    assert env.observation_space.shape == (len(env.observation_space.low),)
    assert env.kernel == ENV_KERNELS[env_id]


@pytest.mark.parametrize("env_id", KERNEL_IDS)
def test_reward_is_oracle_ratio_and_masks_are_valid(env_id, envs):
    env = envs[env_id]
    space = env.family.space
    seen_one = False
    for i, ref in enumerate(env.references):
        obs, info = env.reset(options={"workload_index": i})
        assert env.observation_space.contains(obs)
        mask = env.action_masks()
        assert mask.any() and np.array_equal(mask, info["action_mask"])
        for a in np.flatnonzero(mask):
            c = env.catalogue.configs[a]
            assert space.is_valid(c, ref.workload)
        ok = [a for a in np.flatnonzero(mask) if env.catalogue.configs[a] in ref.times]
        best = max(ok, key=lambda a: ref.best_time / ref.times[env.catalogue.configs[a]])
        _, reward, terminated, truncated, info = env.step(best)
        assert terminated and not truncated
        assert reward == pytest.approx(ref.best_time / ref.times[env.catalogue.configs[best]])
        assert 0 < reward <= 1 and info["ratio"] == reward
        if ref.best_config in env.catalogue.configs:
            env.reset(options={"workload_index": i})
            assert env.step(env.catalogue.index(ref.best_config))[1] == pytest.approx(1.0)
            seen_one = True
    assert seen_one  # the catalogue holds the oracle config of some training workload


def test_masked_and_failing_actions_end_with_penalty_and_reason(backend):
    env = gymnasium.make("KernelGym/PrefillAttention-v0", backend=AnalyticBackend(fail_every=3)).unwrapped
    masked = failed = 0
    for i, ref in enumerate(env.references):
        for a, c in enumerate(env.catalogue.configs):
            env.reset(options={"workload_index": i})
            _, reward, terminated, _, info = env.step(a)
            assert terminated
            if not env.masks[i][a]:
                assert reward == -1.0 and info["error_type"] in (INVALID, UNAVAILABLE) and info["reason"]
                masked += 1
            elif c in ref.failures:
                assert reward == -1.0 and info["error_type"] == COMPILE_ERROR
                assert info["reason"] == "injected test failure"
                failed += 1
            else:
                assert 0 < reward <= 1
    assert failed > 0


def test_seeded_resets_repeat_and_cover_the_profile(envs):
    env = envs["KernelGym/MoE-v0"]
    first = [env.reset(seed=7)[1]["workload"]] + [env.reset()[1]["workload"] for _ in range(200)]
    again = [env.reset(seed=7)[1]["workload"]] + [env.reset()[1]["workload"] for _ in range(200)]
    assert first == again
    assert len(set(first)) > len(env.references) // 2


def test_live_backend_is_measured_every_step_and_best_improves(backend):
    class Live(AnalyticBackend):
        name = "live"

    live = Live()
    env = gymnasium.make("KernelGym/PrefillAttention-live-v0", backend=live).unwrapped
    assert env.live
    env.reset(seed=0)
    a = int(np.flatnonzero(env.action_masks())[0])
    before = live.calls
    env.step(a)
    env.reset(options={"workload_index": env._index})
    env.step(a)
    assert live.calls == before + 2


def test_heldout_split_is_disjoint_from_training(backend):
    train = gymnasium.make("KernelGym/DecodeAttention-v0", backend=backend).unwrapped
    held = gymnasium.make("KernelGym/DecodeAttention-v0", backend=backend, split="heldout").unwrapped
    assert {r.key for r in train.references}.isdisjoint({r.key for r in held.references})
    assert held.catalogue.configs == train.catalogue.configs  # built from the training workloads only


def test_split_holds_out_whole_interleaved_token_counts_and_keeps_anchors():
    from kernel_gym.kernels.workloads import model_workloads
    from kernel_gym.models import BUILTIN_MODELS

    ws = model_workloads("fused_moe", BUILTIN_MODELS["mixtral-8x7b"])
    anchors = [w.key() for w in model_workloads("fused_moe", BUILTIN_MODELS["mixtral-8x7b"], "eval")]
    a_train, a_out = split_workloads(ws, 0.25, 0, anchors)
    b_train, b_out = split_workloads(list(reversed(ws)), 0.25, 0, anchors)
    assert [w.key() for w in a_out] == [w.key() for w in b_out]
    assert len(a_train) + len(a_out) == len(ws) and 0.2 * len(ws) <= len(a_out) <= 0.35 * len(ws)
    values = sorted({w.num_tokens for w in ws})
    held = {w.num_tokens for w in a_out}
    assert held.isdisjoint({w.num_tokens for w in a_train})  # no held-out token count is seen in training
    assert values[0] not in held and values[-1] not in held
    assert not any(values[i] in held and values[i + 1] in held for i in range(len(values) - 1))  # interleaved
    assert not held & {w.num_tokens for w in ws if w.key() in set(anchors)}
    assert split_workloads(ws, 0.25, 1, anchors)[1] != a_out
    with pytest.raises(ValueError, match="holdout must be in"):
        split_workloads(ws, 1.0)


def test_catalogue_depth_adds_each_training_workloads_runner_up(backend):
    from kernel_gym.dispatch.catalogue import build_catalogue

    env = gymnasium.make("KernelGym/MoE-v0", backend=backend, catalogue_depth=1).unwrapped
    refs = env.references
    shallow = build_catalogue("fused_moe", refs, 0.0, 200, depth=1)
    deep = build_catalogue("fused_moe", refs, 0.0, 200, depth=2)
    assert shallow.configs == deep.configs[: len(shallow)]
    for r in refs:
        assert set(sorted(r.times, key=r.times.__getitem__)[:2]) <= set(deep.configs)
    assert len(build_catalogue("fused_moe", refs, 0.0, len(shallow) + 1, depth=2)) == len(shallow) + 1
    with pytest.raises(ValueError, match="depth must be >= 1"):
        build_catalogue("fused_moe", refs, depth=0)


def test_bad_arguments_name_the_value(backend):
    with pytest.raises(ValueError, match="traffic profile 'bursty'"):
        gymnasium.make("KernelGym/MoE-v0", backend=backend, profile="bursty")
    with pytest.raises(ValueError, match="split 'test'"):
        gymnasium.make("KernelGym/MoE-v0", backend=backend, split="test")
    with pytest.raises(TypeError, match="neither a backend name"):
        gymnasium.make("KernelGym/MoE-v0", backend=42)
    env = gymnasium.make("KernelGym/PrefillAttention-v0", backend=backend).unwrapped
    env.reset(seed=0)
    with pytest.raises(ValueError, match="outside Discrete"):
        env.step(len(env.catalogue))


def test_render_ansi_describes_the_last_step(backend):
    env = gymnasium.make("KernelGym/PrefillAttention-v0", backend=backend, render_mode="ansi").unwrapped
    env.reset(seed=0)
    env.step(int(np.flatnonzero(env.action_masks())[0]))
    assert "workload=" in env.render() and "config=" in env.render()


def test_obs_jitter_moves_only_the_workload_axes_of_training_observations(backend):
    """obs_jitter (training only) shifts the decode batch and context features by Gaussian noise per reset and
    leaves the model's constant features alone; the default (0) returns the exact observation every time."""
    from kernel_gym.dispatch.observation import feature_names

    names = feature_names("decode_attention")
    exact = gymnasium.make("KernelGym/DecodeAttention-v0", backend=backend).unwrapped
    jittered = gymnasium.make("KernelGym/DecodeAttention-v0", backend=backend, obs_jitter=0.5).unwrapped
    obs = []
    for seed in range(8):
        o, _ = jittered.reset(seed=seed, options={"workload_index": 0})
        e, _ = exact.reset(seed=seed, options={"workload_index": 0})
        assert np.array_equal(e, exact._obs[0])
        obs.append(o)
    obs = np.array(obs)
    moved = {n for i, n in enumerate(names) if np.ptp(obs[:, i]) > 0}
    assert moved == {"log2_batch", "log2_context"}
    again, _ = jittered.reset(seed=3, options={"workload_index": 0})
    assert np.array_equal(again, obs[3])  # seeded: the same seed gives the same jittered observation
    assert jittered.observation_space.contains(obs[0].astype(np.float32))
    with pytest.raises(ValueError, match="obs_jitter"):
        gymnasium.make("KernelGym/DecodeAttention-v0", backend=backend, obs_jitter=-1.0)


def test_prefill_jitter_scales_every_length_together(backend):
    """Prefill's jitter axis is the sequence lengths, all scaled by one factor 2^d: total tokens and the longest
    length move by d, the causal pairs by 2d (log2 units), the number of sequences not at all."""
    from kernel_gym.dispatch.observation import FEATURES, feature_names

    names = feature_names("prefill_attention")
    exact = gymnasium.make("KernelGym/PrefillAttention-v0", backend=backend).unwrapped
    jittered = gymnasium.make("KernelGym/PrefillAttention-v0", backend=backend, obs_jitter=1.0).unwrapped
    e, _ = exact.reset(seed=0, options={"workload_index": 0})
    span = {name: (hi - lo) / 2.0 for name, lo, hi in FEATURES["prefill_attention"]}  # obs units per log2 unit
    moved = 0
    for seed in range(6):
        o, _ = jittered.reset(seed=seed, options={"workload_index": 0})
        d = {n: (float(o[i]) - float(e[i])) * span[n] for i, n in enumerate(names)}
        assert d["log2_num_seqs"] == 0 and d["log2_num_heads"] == 0
        assert d["log2_max_len"] == pytest.approx(d["log2_total_tokens"], abs=1e-4)
        assert d["log2_causal_pairs"] == pytest.approx(2 * d["log2_total_tokens"], abs=1e-4)
        moved += abs(d["log2_total_tokens"]) > 1e-3
    assert moved >= 5


def test_obs_jitter_masks_what_the_knob_space_rejects_at_the_moved_workload(backend):
    """With obs_jitter the mask follows the observation: a MoE workload at <= 96 tokens whose observation was moved
    above 96 tokens gets the fused top-k sum (FUSE_SUM=1, invalid above 96 tokens) masked, the mask is never wider
    than the exact workload's, and stepping an entry masked only by the jitter ends the episode as invalid."""
    from kernel_gym.dispatch.catalogue import Catalogue
    from kernel_gym.kernels.fused_moe import FUSE_SUM_MAX_TOKENS

    plain = gymnasium.make("KernelGym/MoE-v0", backend=backend).unwrapped
    ref = next(r for r in plain.references if r.workload.num_tokens == FUSE_SUM_MAX_TOKENS)
    measured = sorted(ref.times, key=str)
    configs = [c for c in measured if c["FUSE_SUM"]][:4] + [c for c in measured if not c["FUSE_SUM"]][:4]
    assert any(c["FUSE_SUM"] for c in configs), "the test needs a measured FUSE_SUM=1 config at the limit"
    env = gymnasium.make("KernelGym/MoE-v0", backend=backend, obs_jitter=1.0,
                         catalogue=Catalogue("fused_moe", configs)).unwrapped
    i = next(j for j, r in enumerate(env.references) if r.key == ref.key)
    fused = np.array([bool(c["FUSE_SUM"]) for c in env.catalogue.configs])
    assert (env.masks[i] & fused).any()
    hidden = 0
    for seed in range(40):
        _, info = env.reset(seed=seed, options={"workload_index": i})
        mask = env.action_masks()
        assert np.array_equal(mask, info["action_mask"]) and not (mask & ~env.masks[i]).any()
        only_jitter = env.masks[i] & ~mask
        if only_jitter.any():
            hidden += 1
            assert not (only_jitter & ~fused).any()  # only the fused top-k sum depends on the token count here
            _, reward, terminated, _, info = env.step(int(np.flatnonzero(only_jitter)[0]))
            assert terminated and reward < 0 and info["error_type"] == INVALID and "obs_jitter" in info["reason"]
    assert 5 < hidden < 35  # about half of the draws move 96 tokens above the limit
