"""KernelGym/Serving-v0 on a fresh machine (issue 25 item 6): its default trace is the bundled excerpt, so
`gym.make` needs no KERNEL_GYM_TRACES and the env passes Gymnasium's check_env."""

from __future__ import annotations

import inspect

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import kernel_gym  # noqa: F401  (registers the ids)
from kernel_gym.envs.serving import ServingEnv
from tests.fakes.analytic_backend import AnalyticBackend


def test_the_default_trace_is_the_bundled_one():
    assert inspect.signature(ServingEnv).parameters["trace"].default == "bundled"


def test_serving_v0_makes_without_a_traces_folder_and_passes_check_env(monkeypatch):
    monkeypatch.delenv("KERNEL_GYM_TRACES", raising=False)
    env = gym.make("KernelGym/Serving-v0", backend=AnalyticBackend(sample=16), num_intervals=2, interval_s=5.0,
                   warmup_s=5.0, profile_s=30.0, profile_windows=1, max_configs=4)
    assert env.unwrapped.trace.name == "bundled-azure-conv-10min"
    check_env(env.unwrapped, skip_render_check=True)


def test_a_named_trace_without_its_folder_still_says_how_to_get_it(monkeypatch):
    monkeypatch.delenv("KERNEL_GYM_TRACES", raising=False)
    with pytest.raises((ValueError, FileNotFoundError), match="KERNEL_GYM_TRACES"):
        ServingEnv(backend=AnalyticBackend(sample=8), trace="azure-conv")
