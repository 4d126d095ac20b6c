"""Windowed attention layers (ModelSpec.mixer "sliding-window" / "chunked-local", window_tokens): softmax attention over
a window or within chunks, as gpt-oss's sliding layers and Llama-4's RoPE layers run it. Before, the simulator counted
Llama-4's 36 chunked layers as full attention (KV over the whole context: over-counted past 8,192 tokens, 2.3x at 32k)
and a sliding window's KV as a fixed state a request held from its first token; now a request holds the window's
blocks as vLLM's hybrid allocator does (get_num_skipped_tokens) and the windowed layers' attention is priced over the
keys each query sees."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kernel_gym.modelspec import ModelSpec
from kernel_gym.parallel.deploy import Deployment, engine_block_tokens, state_pool_share
from kernel_gym.traffic.routing import UniformRouting
from kernel_gym.traffic.simulator import STEP_COLUMNS, Simulator
from kernel_gym.zoo import ZOO, shard
from tests.traffic.test_simulator import AnalyticTimer, chooser, mem_for_tokens, small_trace

FULL = ModelSpec("full", num_layers=4, hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, num_experts=4, top_k=2,
                 intermediate=512)
LAYER_KV = FULL.kv_bytes_per_token // 4  # one token in one layer


def windowed(kind: str, window: int) -> ModelSpec:
    """FULL with its first three layers windowed (3 x the full layer's bytes per token when the window is full)."""
    return dataclasses.replace(FULL, attention_layers=1, mixer=kind, mixer_state_bytes=3 * window * LAYER_KV)


def _sim(model: ModelSpec, pool_tokens: int = 1 << 20, **kw) -> Simulator:
    return Simulator(model, small_trace(300, rate=200.0), AnalyticTimer(), chooser(), UniformRouting(4, 2),
                     gpu_memory_bytes=mem_for_tokens(model, pool_tokens), **kw)


def test_the_window_is_read_off_the_state_and_a_bad_state_is_refused():
    assert windowed("chunked-local", 64).window_tokens == 64 and windowed("sliding-window", 128).window_tokens == 128
    assert ZOO["llama-4-scout"].window_tokens == ZOO["llama-4-maverick"].window_tokens == 8192
    assert shard(ZOO["llama-4-scout"], 8).window_tokens == 8192  # KV heads split 8 ways, the window stays
    with pytest.raises(ValueError, match="window's K and V"):
        dataclasses.replace(FULL, attention_layers=1, mixer="chunked-local", mixer_state_bytes=3 * LAYER_KV + 1)
    with pytest.raises(ValueError, match="needs attention_layers"):
        dataclasses.replace(FULL, mixer="sliding-window", mixer_state_bytes=4 * LAYER_KV)


def test_a_request_holds_the_blocks_of_its_window_as_vllm_frees_them():
    chunked, sliding = _sim(windowed("chunked-local", 64)), _sim(windowed("sliding-window", 64))
    # 16-token blocks; each windowed block is 3 pages' worth (three layers against the one full layer)
    assert int(chunked._state_need(0, 16)) == 3
    assert int(chunked._state_need(63, 64)) == 12  # the whole first chunk
    assert int(chunked._state_need(64, 65)) == 3  # the next chunk starts: the first one's blocks are freed
    assert int(chunked._state_need(70, 200)) == 3 * (13 - 4)  # a prefill chunk keeps its chunk's start onwards
    assert int(sliding._state_need(64, 65)) == 3 * 5  # keys 1..64: blocks 0..4
    assert int(sliding._state_need(100, 101)) == 3 * 5  # keys 37..100: blocks 2..6
    assert list(sliding._state_need(np.array([10, 1000]), np.array([11, 1001]))) == [3, 15]


@pytest.mark.parametrize("kind", ["chunked-local", "sliding-window"])
def test_long_requests_fit_more_at_once_and_every_page_comes_back(kind):
    full = _sim(dataclasses.replace(FULL, name="all-full"), pool_tokens=6000, max_num_batched_tokens=512)
    full_res = full.run()
    # the same pool in bytes: FULL's 6,000 tokens over four layers are 24,000 tokens of the one full layer
    s = _sim(windowed(kind, 64), pool_tokens=24000, max_num_batched_tokens=512)
    res = s.run()
    running = STEP_COLUMNS.index("running")
    assert res.steps[:, running].max() > full_res.steps[:, running].max()
    assert res.summary["preemptions"] <= full_res.summary["preemptions"]
    assert np.array_equal(res.generated_tokens, full_res.generated_tokens)
    assert s.free_pages == s.num_pages and not s.state_held.any()


def test_a_layout_switch_re_pages_each_window():
    s = _sim(windowed("chunked-local", 64), pool_tokens=24000, max_num_batched_tokens=512)
    s.run_until(0.5)
    s.set_kv_layout(32, "NHD")
    running = s._running()
    assert list(s.state_held[running]) == list(s._state_need(s.kv[running], s.kv[running]))
    assert s.free_pages == s.num_pages - int(s.pages[running].sum()) - int(s.state_held[running].sum())
    s.run()
    assert s.free_pages == s.num_pages and not s.state_held.any()


def test_windowed_layers_are_priced_as_attention_over_the_keys_they_see():
    wide = _sim(windowed("chunked-local", 1 << 16))  # a window past every context: all four layers full attention
    full = _sim(FULL)
    narrow = _sim(windowed("chunked-local", 64))
    ctx = np.full(8, 1000)
    for s in (wide, full, narrow):
        s._dense_memo.clear()
    k_wide, _ = wide.price_step([], 8, 1000.0, 8, [], 1000.0, ctx)
    k_full, _ = full.price_step([], 8, 1000.0, 8, [], 1000.0, ctx)
    k_narrow, _ = narrow.price_step([], 8, 1000.0, 8, [], 1000.0, ctx)
    assert k_wide == pytest.approx(k_full)
    assert k_narrow < k_full
    # the three windowed layers see 1000 - 960 = 40 keys: priced at the decode time over 40 (AnalyticTimer is linear)
    per_key = 8 * 2e-9
    assert k_full - k_narrow == pytest.approx(3 * per_key * (1000 - 40), rel=0.05)
    # a chunk's pairs: 32 queries from 64 in a 64-token chunked window see only their own chunk (a fresh causal 32)
    assert narrow._window_chunk(32, 64) == (32, 0)
    assert narrow._window_chunk(32, 96) == (32, 32)
    # a chunk longer than a sliding window: the fresh sequence with as many pairs (64*65/2 + 192*64 = 14,368)
    assert _sim(windowed("sliding-window", 64))._window_chunk(256, 0) == (176, 0)


def test_the_engines_keep_their_kv_block_and_pool_for_a_window():
    dep = Deployment("vllm", replicas=1, tp=8, ep=1, block_size=16, max_batched_tokens=8192, max_seqs=256,
                     graph_max=512)
    assert engine_block_tokens(ZOO["llama-4-scout"], dep) == 16  # no recurrent state to align the block to
    assert state_pool_share(ZOO["llama-4-scout"], dataclasses.replace(dep, engine="sglang", version="")) == 0.0


def test_sglangs_window_pool_holds_the_windows_apart_and_both_pools_bind():
    model = windowed("chunked-local", 64)
    s = _sim(model, pool_tokens=24000, max_num_batched_tokens=512, window_pool_ratio=0.8)
    # the memory splits so that the window's pool holds 0.8 of the full pool's tokens
    assert s.window_blocks == pytest.approx(0.8 * s.num_pages, abs=2)
    assert int(s._state_need(63, 64)) == 4  # blocks of its own pool, not pages of the full one
    low = 0
    while s.step():
        low = min(low, s.free_window, s.free_pages)
    assert low >= 0  # neither pool was ever overdrawn
    assert s.free_pages == s.num_pages and s.free_window == s.window_blocks and not s.state_held.any()
    shared = _sim(model, pool_tokens=24000, max_num_batched_tokens=512)
    assert shared.run().summary["preemptions"] <= s.result().summary["preemptions"]
    with pytest.raises(ValueError, match="window_pool_ratio must be in"):
        _sim(model, window_pool_ratio=1.5)


def test_sglang_splits_the_kv_memory_for_a_window_and_vllm_shares_it():
    from kernel_gym.parallel.deploy import kv_tokens_per_rank, window_pool_ratio

    vllm = Deployment("vllm", replicas=1, tp=8, ep=1, block_size=16, max_batched_tokens=8192, max_seqs=256,
                      graph_max=512)
    sglang = dataclasses.replace(vllm, engine="sglang", version="")
    scout = ZOO["llama-4-scout"]
    assert (window_pool_ratio(scout, vllm), window_pool_ratio(scout, sglang)) == (0.0, 0.8)
    assert window_pool_ratio(ZOO["mixtral-8x7b"], sglang) == 0.0
    # SGLang's full pool shares the memory with 0.8 tokens of the 36 windowed layers per token: fewer full tokens
    assert 0 < kv_tokens_per_rank(scout, sglang) < kv_tokens_per_rank(scout, vllm)


@pytest.mark.parametrize("kind", ["chunked-local", "sliding-window"])
def test_a_request_near_the_pools_size_gets_a_shorter_chunk_not_a_hang(kind):
    """_fit_chunk took the window's blocks for the whole 2,048-token chunk before sizing it: a 2,010-token request on a
    2,500-token pool got no chunk, and with nothing running the replay looped at clock 0 (review, session 67)."""
    from kernel_gym.traffic.traces import Trace

    model = windowed(kind, 64)
    s = Simulator(model, Trace("one", np.array([0.0]), np.array([2000]), np.array([10])), AnalyticTimer(), chooser(),
                  UniformRouting(4, 2), gpu_memory_bytes=mem_for_tokens(model, 2500), max_num_batched_tokens=2048)
    steps = 0
    while s.step():
        steps += 1
        assert steps < 200, "the replay does not end"
    assert not np.isnan(s.result().finish_s).any()


def test_a_step_priced_without_its_contexts_still_prices_the_windowed_layers():
    narrow, full = _sim(windowed("chunked-local", 64)), _sim(FULL)
    with_ctx, _ = narrow.price_step([], 8, 1000.0, 8, [], 1000.0, np.full(8, 1000))
    without, _ = narrow.price_step([], 8, 1000.0, 8, [], 1000.0)
    assert without == pytest.approx(with_ctx)
    assert without > full.price_step([], 8, 1000.0, 8, [], 1000.0)[0] / 4  # more than the one full layer's share


def test_replays_per_kernel_seconds_count_the_windowed_layers():
    """The replay's guard counted a windowed layer's calls in the full layers (x12 for Llama-4, not x36)."""
    from kernel_gym.evaluate.replay import CHOSEN_KERNELS, GuardedChooser
    from kernel_gym.kernels import profiles

    class EveryCallOneMs(GuardedChooser):
        def resolve(self, kernel, workload, kv):
            return chooser().choose(kernel, workload, kv), 1e-3, False

    model = windowed("chunked-local", 64)
    guard = EveryCallOneMs(chooser(), None, model.num_layers, 0,
                           {k: profiles.layers_of(k, model) for k in CHOSEN_KERNELS})
    s = Simulator(model, small_trace(40, rate=20.0), AnalyticTimer(), guard, UniformRouting(4, 2),
                  gpu_memory_bytes=mem_for_tokens(model, 1 << 20))
    guard.sim = s
    s.run()
    calls = sum(n * (layers or profiles.layers_of(k, model)) for (k, _, layers), n in guard.calls.items())
    assert sum(guard.kernel_s.values()) == pytest.approx(calls * 1e-3)
    assert any(layers == 3 for _, _, layers in guard.calls)  # the windowed calls, in their 3 layers
