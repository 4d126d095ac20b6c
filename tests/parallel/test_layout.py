"""Layouts: validity, the shapes each GPU runs, EP imbalance from a hand-built routing."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_gym.models import load_model
from kernel_gym.parallel.layout import (
    Layout,
    attention_spec,
    decode_shard,
    ep_imbalance,
    gpu_weight_bytes,
    layouts_for,
    moe_shard,
    pool_memory_bytes,
    split_prefill,
    why_invalid,
)
from kernel_gym.zoo import ZOO

MIXTRAL = load_model("mixtral-8x7b")


def test_layouts_and_validity():
    assert [lay.name for lay in layouts_for(8)] == ["TP8", "TP4xEP2", "TP2xEP4", "EP8"]
    assert all(not why_invalid(MIXTRAL, lay, 8) for lay in layouts_for(8))
    assert "experts" in why_invalid(MIXTRAL, Layout(1, 16), 16)  # 8 experts over 16 GPUs
    assert "tp x ep" in why_invalid(MIXTRAL, Layout(2, 2), 8)
    assert "no KV cache" in why_invalid(ZOO["deepseek-v3"], Layout(1, 1), 1)  # 671B on one H200
    assert "heads" in why_invalid(ZOO["qwen2-57b-a14b"], Layout(8, 1), 8)  # 28 heads
    assert gpu_weight_bytes(MIXTRAL, Layout(8, 1)) == pytest.approx(gpu_weight_bytes(MIXTRAL, Layout(1, 1)) / 8,
                                                                    rel=0.01)


def test_ep_imbalance_from_a_hand_built_routing():
    counts = np.array([10, 0, 0, 0, 1, 1, 1, 1])  # hot expert 0 on rank 0 of 2
    assert ep_imbalance(counts, 2) == pytest.approx(10 / 7)
    assert ep_imbalance(counts, 1) == 1.0
    assert ep_imbalance(np.full(8, 3), 4) == 1.0
    assert ep_imbalance(np.array([5, 0, 0, 0]), 4) == 4.0


def test_moe_shard_runs_the_busiest_gpu():
    counts = np.array([30, 2, 0, 0, 1, 1, 1, 1])  # 36 slots of 18 tokens (top-2)
    sh = moe_shard(MIXTRAL, Layout(1, 4), 18, 0.0, counts)
    assert sh.busiest_slots == 32 and sh.imbalance == pytest.approx(32 / 9)
    wl = sh.workload
    assert (wl.num_experts, wl.top_k, wl.intermediate) == (2, 1, MIXTRAL.intermediate)
    assert wl.num_tokens == 32 and wl.skew > 1.0  # rounded count (16 < 32 -> the 2^(k/4) grid keeps 32)
    assert sh.all_to_all_bytes == 32 * MIXTRAL.hidden * 2 and sh.all_reduce_bytes == 0  # the busiest receives most
    tp = moe_shard(MIXTRAL, Layout(4, 1), 18, 0.5, None)
    assert (tp.workload.num_experts, tp.workload.top_k, tp.workload.intermediate) == (8, 2, MIXTRAL.intermediate // 4)
    assert tp.all_reduce_bytes == 18 * MIXTRAL.hidden * 2 and tp.all_to_all_bytes == 0
    with pytest.raises(ValueError, match="slot counts"):
        moe_shard(MIXTRAL, Layout(1, 4), 18, 0.0, None)


def test_attention_shards_and_kv_pool():
    assert split_prefill((100, 90, 20, 10), 2) == (100,)  # the rest balance on the other rank
    assert split_prefill((50, 50, 10, 10), 2) == (50, 10)
    assert split_prefill((64,), 1) == (64,)
    d = decode_shard(MIXTRAL, Layout(2, 4), 40, 2048)
    assert (d.num_heads, d.batch) == (MIXTRAL.num_heads // 2, 10)  # ceil(40 / 4) on the busiest rank
    for lay in layouts_for(8):
        a = attention_spec(MIXTRAL, lay)
        mem = pool_memory_bytes(MIXTRAL, lay)
        pool = mem * 0.9 - a.weight_bytes
        per_gpu = 143771 * 2**20 * 0.9 - gpu_weight_bytes(MIXTRAL, lay)
        assert pool == pytest.approx(lay.ep * per_gpu)
