"""KernelGym/PrefixPrefill-v0 (issue 29): registered beside the other kernel envs, the Gymnasium contract on the
packaged H200 prefix_prefill rows, and an observation that carries the prefix axis."""

from __future__ import annotations

import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import kernel_gym  # noqa: F401  (registers the ids)
from kernel_gym.dispatch.observation import feature_names, observe
from kernel_gym.envs import ENV_IDS, ENV_KERNELS
from kernel_gym.kernels.workloads import PrefixPrefillWorkload
from tests.fakes.analytic_backend import AnalyticBackend

ENV_ID = "KernelGym/PrefixPrefill-v0"


@pytest.fixture(scope="module")
def env():
    return gymnasium.make(ENV_ID).unwrapped  # the recorded backend: the packaged H200 rows


def test_registered_with_its_kernel_and_live_twin():
    assert ENV_KERNELS[ENV_ID] == ENV_KERNELS["KernelGym/PrefixPrefill-live-v0"] == "prefix_prefill"
    assert ENV_IDS[ENV_ID][1] == {"backend": "recorded"} and not gymnasium.spec(ENV_ID).nondeterministic
    assert gymnasium.spec("KernelGym/PrefixPrefill-live-v0").nondeterministic


def test_check_env_passes_on_the_recorded_data(env):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=False)
    assert env.kernel == "prefix_prefill" and env.observation_space.shape == (len(feature_names("prefix_prefill")),)
    held = gymnasium.make(ENV_ID, split="heldout").unwrapped
    keys = {r.key for r in env.references}
    assert len(env.references) + len(held.references) == 44 and not keys & {r.key for r in held.references}


def test_observation_tells_prefix_lengths_apart():
    names = feature_names("prefix_prefill")
    a, b = (observe(PrefixPrefillWorkload(32, 8, 128, (512,), (p,))) for p in (0, 8192))
    moved = {names[i] for i in np.flatnonzero(a != b)}
    assert {"log2_mean_prefix", "log2_max_prefix", "log2_causal_pairs"} <= moved
    assert "log2_total_tokens" not in moved


def test_rewards_are_oracle_ratios_and_the_best_config_earns_one(env):
    for i, ref in enumerate(env.references):
        env.reset(options={"workload_index": i})
        mask = env.action_masks()
        assert mask.any()
        rewards = {}
        for a in np.flatnonzero(mask):
            _, r, term, trunc, info = env.step(int(a))
            assert term and not trunc and 0 < r <= 1.0 + 1e-12, info
            rewards[int(a)] = r
            env.reset(options={"workload_index": i})
        fastest = min(ref.times, key=ref.times.get)
        if fastest in env.catalogue.configs and mask[env.catalogue.configs.index(fastest)]:
            assert rewards[env.catalogue.configs.index(fastest)] == pytest.approx(1.0)
        for a in np.flatnonzero(~mask):  # masked actions end with the failure penalty
            _, r, _, _, info = env.step(int(a))
            assert r == -1.0 and info["error_type"] in ("invalid", "unavailable")
            env.reset(options={"workload_index": i})
            break


def test_analytic_backend_env_masks_follow_the_knob_rules():
    env = gymnasium.make(ENV_ID, backend=AnalyticBackend()).unwrapped
    space = env.family.space
    for ref, mask in zip(env.references, env.masks):
        for cfg, ok in zip(env.catalogue.configs, mask):
            if ok:
                assert space.is_valid(cfg, ref.workload)
