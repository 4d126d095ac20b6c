"""Replay with chunked prefill over a prefix (issue 29): GuardedChooser charges the recorded prefix_prefill time
where the packaged H200 data has it (exact or interpolated, the latter counted as estimated), the stand-in prefill
time otherwise (counted as estimated too), never charges the simulator's probe, and serves the prefix kernel on the
KV layout in force, the default for a policy that has no choice for it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from kernel_gym.dispatch.baselines import DefaultPolicy, Policy
from kernel_gym.dispatch.rules import default_for
from kernel_gym.evaluate import replay
from kernel_gym.measure import make_backend
from kernel_gym.measure.coverage import CoveredBackend
from kernel_gym.measure.types import is_estimated
from kernel_gym.models import BUILTIN_MODELS
from kernel_gym.traffic.routing import UniformRouting
from kernel_gym.traffic.simulator import KVLayout, OverloadWarning
from kernel_gym.traffic.traces import Trace

MODEL = BUILTIN_MODELS["mixtral-8x7b"]  # the prefix rows are at its attention shape (32 heads, 8 KV heads, D 128)
KV = KVLayout(16, "NHD")


@pytest.fixture(scope="module")
def backend():
    return CoveredBackend(make_backend("recorded"))


def long_prompts(n: int = 8) -> Trace:
    """Prompts of 3000 tokens a little apart: with 1024 tokens a step, each is prefilled in chunks after a prefix
    of its own earlier chunks, and a finishing chunk shares its step with the next prompt's first."""
    return Trace("long", np.arange(n) * 0.05, np.full(n, 3000), np.full(n, 4))


def run(policy, backend, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OverloadWarning)
        return replay.run_policy("p", policy, MODEL, long_prompts(), UniformRouting(MODEL.num_experts, MODEL.top_k),
                                 backend, max_num_batched_tokens=1024, prefix_caching=False, **kw)


class NoPrefixPolicy(DefaultPolicy):
    """A policy built before the prefix kernel: it has no choice for it."""

    name = "no-prefix"

    def choose(self, kernel, workload, kv):
        if kernel == "prefix_prefill":
            raise KeyError(kernel)
        return super().choose(kernel, workload, kv)


@pytest.fixture(scope="module")
def default_run(backend):
    return run(DefaultPolicy(MODEL, KV), backend)


def test_prefix_chunks_are_charged_with_recorded_prefix_prefill_times(default_run, backend):
    g, s = default_run.guard, default_run.result.summary
    prefix_calls = {w: n for (k, w, _), n in g.calls.items() if k == "prefix_prefill"}
    assert prefix_calls and any(max(w.prefix_lens) > 0 for w in prefix_calls)
    charged = estimated = 0.0
    for w, n in prefix_calls.items():
        cfg, seconds, est = g.resolve("prefix_prefill", w, KV)
        m = backend.measure("prefix_prefill", w, cfg)
        assert m.ok and seconds == pytest.approx(m.median_ms * 1e-3)  # the recorded (or interpolated) time
        assert (cfg["PAGE_SIZE"], cfg["LAYOUT"]) == (KV.page_size, KV.layout)
        assert est == is_estimated(m.source)
        charged += n * seconds * MODEL.num_layers
        estimated += n * seconds * MODEL.num_layers * est
    # every call charged once: the simulator's probe (peek) before choosing the prefix kernel is not a call
    assert g.kernel_s["prefix_prefill"] == pytest.approx(charged)
    assert g.estimated_s["prefix_prefill"] == pytest.approx(estimated)
    assert s["chunk_attention_measured_s"] == pytest.approx(charged)
    assert default_run.metrics["tuned_kernel_s.prefix_prefill"] == pytest.approx(charged)


def test_chunks_the_data_cannot_time_are_charged_with_the_stand_in_as_estimated(default_run):
    g, s = default_run.guard, default_run.result.summary
    assert s["chunk_attention_estimated_s"] > 0  # steps mixing a finishing chunk and a fresh prompt: no such rows
    assert g.standin_s == pytest.approx(s["chunk_attention_estimated_s"])
    assert g.estimated_s["prefill_attention"] >= g.standin_s - 1e-12
    assert default_run.metrics["estimated_share.prefill_attention"] > 0


def test_a_policy_without_a_prefix_choice_is_served_the_default_on_the_layout(backend, default_run):
    r = run(NoPrefixPolicy(MODEL, KV), backend)
    g = r.guard
    assert g.prefix_untuned > 0 and g.kernel_s["prefix_prefill"] > 0
    for (k, w, _), _ in g.calls.items():
        if k == "prefix_prefill":
            cfg = g.resolve(k, w, KV)[0]
            want = default_for(k, w, KV).replace(PAGE_SIZE=KV.page_size, LAYOUT=KV.layout)
            assert cfg == want or g.fallbacks  # the default on the layout, unless the data lacks it there
    # the same choices as the default policy (whose prefix default is moved onto the layout alike)
    assert g.kernel_s["prefix_prefill"] == pytest.approx(default_run.guard.kernel_s["prefix_prefill"])


def test_off_layout_choices_are_moved_onto_the_layout(backend):
    class OtherLayout(Policy):
        name = "other-layout"

        def __init__(self):
            super().__init__(KV)
            self.inner = DefaultPolicy(MODEL, KV)

        def choose(self, kernel, workload, kv):
            cfg = self.inner.choose(kernel, workload, kv)
            return cfg.replace(PAGE_SIZE=128, LAYOUT="HND") if kernel == "prefix_prefill" else cfg

    r = run(OtherLayout(), backend)
    g = r.guard
    assert g.layout_fallbacks > 0
    used = r.result.configs_used.get("prefix_prefill", {})
    assert used and all(('"PAGE_SIZE":16' in c and '"LAYOUT":"NHD"' in c) for c in map(str, used))


def test_equivalent_mode_never_asks_for_prefix_prefill(backend):
    r = run(DefaultPolicy(MODEL, KV), backend, chunk_attention="equivalent")
    assert r.guard.kernel_s["prefix_prefill"] == 0.0 and not r.result.configs_used.get("prefix_prefill")


def test_a_trace_with_hash_ids_reports_its_prefix_cache_in_the_replay(backend):
    """A trace whose prompts share a prefix (hash_ids, as Mooncake and Bailian traces carry) puts the prefix cache's
    hit rate, block size and evictions in each policy's metrics and a line under the replay table; a trace without
    them adds neither."""
    from kernel_gym.evaluate import replay_report

    n, shared = 8, (11, 12, 13)  # three 16-token blocks every prompt starts with, then its own
    ids = tuple(shared + tuple(100 * (i + 1) + j for j in range(10)) for i in range(n))
    trace = Trace("shared", np.arange(n) * 0.5, np.full(n, 13 * 16), np.full(n, 4), hash_ids=ids,
                  hash_block_tokens=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OverloadWarning)
        got = replay.run_policy("p", DefaultPolicy(MODEL, KV), MODEL, trace,
                                UniformRouting(MODEL.num_experts, MODEL.top_k), backend).metrics
    assert got["prefix_block_tokens"] == 16 and got["prefix_hit_tokens"] == 3 * 16 * (n - 1)
    assert got["prefix_hit_rate"] == pytest.approx(3 * 16 * (n - 1) / (n * 13 * 16))
    rep = {"trace": "shared", "model": MODEL.name, "routing": "uniform", "policies": {"p": {
        **got, "tuned_kernel_s_same_traffic": got["tuned_kernel_s"]}}}
    assert "Prefix cache (the trace's hash_ids" in replay_report.markdown(rep) and "p 20.2% (16-token blocks" in \
        replay_report.markdown(rep)
    plain = run(DefaultPolicy(MODEL, KV), backend).metrics
    assert "prefix_hit_rate" not in plain
