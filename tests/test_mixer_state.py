"""Mixer state (ModelSpec.mixer_state_bytes): the fixed-size state a running request holds in the layers without full
attention (Mamba, Gated DeltaNet, lightning attention, a sliding window). Before, hybrid models' KV pools were sized
as if those layers held nothing per request, and their steps never read it: a 4k-token Qwen3-Next request holds
about as much mixer state as KV cache. Config values are the published models' config.json."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from kernel_gym.measure.roofline import COPY_BW
from kernel_gym.modelspec import ModelSpec, SpecWarning, spec_from_hf_config
from kernel_gym.parallel.layout import Layout, attention_spec
from kernel_gym.traffic.simulator import STEP_COLUMNS
from kernel_gym.zoo import ZOO, shard
from tests.traffic.test_simulator import AnalyticTimer, chooser, mem_for_tokens, small_trace

QWEN3_NEXT = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
              "intermediate_size": 5120, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
              "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
              "num_experts": 512, "num_experts_per_tok": 10, "full_attention_interval": 4, "linear_num_key_heads": 16,
              "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "linear_conv_kernel_dim": 4, "decoder_sparse_step": 1, "torch_dtype": "bfloat16"}
JAMBA_15_LARGE = {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 8192,
                  "intermediate_size": 24576, "num_hidden_layers": 72, "num_attention_heads": 64,
                  "num_key_value_heads": 8, "num_experts": 16, "num_experts_per_tok": 2, "attn_layer_period": 8,
                  "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1, "mamba_d_state": 16,
                  "mamba_expand": 2, "mamba_d_conv": 4, "torch_dtype": "bfloat16"}
MINIMAX_01 = {"architectures": ["MiniMaxText01ForCausalLM"], "model_type": "minimax_text_01", "hidden_size": 6144,
              "intermediate_size": 9216, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
              "head_dim": 128, "num_local_experts": 32, "num_experts_per_tok": 2,
              "attn_type_list": [0, 0, 0, 0, 0, 0, 0, 1] * 10, "torch_dtype": "bfloat16"}
NEMOTRON_H = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 2688,
              "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
              "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
              "hybrid_override_pattern": "MEM*EMEM", "mamba_num_heads": 64, "mamba_head_dim": 64,
              "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "torch_dtype": "bfloat16"}
GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
           "intermediate_size": 2880, "num_hidden_layers": 4, "num_attention_heads": 64, "num_key_value_heads": 8,
           "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 2, "torch_dtype": "bfloat16"}


def _read(cfg: dict, name: str = "m") -> tuple[ModelSpec, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SpecWarning)
        spec = spec_from_hf_config(cfg, "config.json", name)
    return spec, [str(w.message) for w in caught]


@pytest.mark.parametrize("cfg,name", [(QWEN3_NEXT, "qwen3-next-80b-a3b"), (JAMBA_15_LARGE, "jamba-1.5-large"),
                                      (MINIMAX_01, "minimax-text-01")])
def test_the_config_json_and_the_zoo_agree_on_the_mixer_state(cfg, name):
    spec, said = _read(cfg, name)
    assert spec.mixer_state_bytes == ZOO[name].mixer_state_bytes > 0
    assert (spec.mixer, spec.mixer_layers) == (ZOO[name].mixer, ZOO[name].mixer_layers)
    assert spec.weight_bytes == ZOO[name].weight_bytes
    assert any("MiB per request, is counted" in s for s in said), said


def test_each_mixer_family_is_sized_as_the_engines_size_its_state():
    qwen, _ = _read(QWEN3_NEXT)  # Gated DeltaNet: conv over q, k (16 x 128 each) and v (32 x 128), 32 heads of 128^2
    assert qwen.mixer_state_bytes == 36 * ((2 * 16 * 128 + 32 * 128) * 3 + 32 * 128 * 128) * 2
    nemo, _ = _read(NEMOTRON_H)  # Mamba-2 in the 4 'M' layers: conv over x, B, C; 64 heads x 64 x 128 SSM state,
    inner = 64 * 64  # the SSM state in float32 (vLLM's default for Nemotron-H), the conv state in bf16
    assert nemo.mixer_state_bytes == 4 * ((inner + 2 * 8 * 128) * 3 * 2 + inner * 128 * 4)
    bf16, _ = _read({**NEMOTRON_H, "mamba_ssm_cache_dtype": "bfloat16"})  # the config's own cache dtype wins
    assert bf16.mixer_state_bytes == 4 * ((inner + 2 * 8 * 128) * 3 + inner * 128) * 2
    oss, said = _read(GPT_OSS)  # sliding window: 128 tokens of K and V in the 2 sliding layers
    assert oss.mixer_state_bytes == 2 * 2 * 8 * 64 * 128 * 2 and oss.window_tokens == 128
    assert not said  # a window's attention is priced and its KV held: nothing to caveat
    assert [(m.mixer, m.mixer_layers) for m in (qwen, nemo, oss)] == [("gated-deltanet", 0), ("mamba2", 4),
                                                                      ("sliding-window", 0)]
    assert nemo.mixer_page_bytes == nemo.mixer_state_bytes // 4  # its 'E' and '*' layers hold none
    unknown, said = _read({**NEMOTRON_H, "mamba_num_heads": None, "ssm_state_size": None})
    assert unknown.mixer_state_bytes == 0 and "kernels and state are not priced" in said[0]


def test_a_shard_holds_its_slice_of_the_state():
    spec = ZOO["qwen3-next-80b-a3b"]
    assert shard(spec, 4).mixer_state_bytes == spec.mixer_state_bytes // 4
    assert attention_spec(spec, Layout(4, 2)).mixer_state_bytes == spec.mixer_state_bytes // 4
    oss, _ = _read(GPT_OSS)  # a sliding window's KV splits as the KV heads do: 8 heads, one per GPU at TP 8 and 16
    assert shard(oss, 8).mixer_state_bytes == shard(oss, 16).mixer_state_bytes == oss.mixer_state_bytes // 8


HYBRID = ModelSpec("hybrid", num_layers=4, hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, num_experts=4,
                   top_k=2, intermediate=512, attention_layers=2)


def _run(state_tokens: int, pool_tokens: int, **kw):
    """A simulator of HYBRID whose mixer state is as large as `state_tokens` tokens of its KV cache."""
    from kernel_gym.traffic.routing import UniformRouting
    from kernel_gym.traffic.simulator import Simulator

    model = dataclasses.replace(HYBRID, mixer_state_bytes=state_tokens * HYBRID.kv_bytes_per_token)
    s = Simulator(model, small_trace(300, rate=200.0), AnalyticTimer(), chooser(), UniformRouting(4, 2),
                  gpu_memory_bytes=mem_for_tokens(model, pool_tokens), **kw)
    return s, s.run()


def test_running_requests_hold_their_state_in_the_pool_and_return_every_page():
    base_s, base = _run(0, 6000, max_num_batched_tokens=512)
    s, res = _run(512, 6000, max_num_batched_tokens=512)
    assert s.state_pages == 512 // 16 and base_s.state_pages == 0
    running = STEP_COLUMNS.index("running")
    assert res.steps[:, running].max() < base.steps[:, running].max()  # fewer requests fit beside their state
    assert res.summary["preemptions"] > 0  # the pool was meant to be tight enough to preempt
    assert np.array_equal(res.generated_tokens, base.generated_tokens)
    assert s.free_pages == s.num_pages and not s.state_held.any()  # every page returned, the state's too


def test_a_step_reads_and_writes_each_sequences_state():
    s, _ = _run(64, 1 << 20)
    plain, _ = _run(0, 1 << 20)
    for sim in (s, plain):
        sim._dense_memo.clear()
    _, with_state = s.price_step([], 8, 100.0, 8, [])
    _, without = plain.price_step([], 8, 100.0, 8, [])
    assert with_state - without == pytest.approx(2.0 * 8 * s.model.mixer_state_bytes / COPY_BW)
    _, with_state = s.price_step([(0, 16, 0)], 8, 100.0, 8, [])  # a prefill chunk's sequence reads its state too
    _, without = plain.price_step([(0, 16, 0)], 8, 100.0, 8, [])
    assert with_state - without == pytest.approx(2.0 * 9 * s.model.mixer_state_bytes / COPY_BW)


def test_a_request_longer_than_the_pool_beside_its_state_is_refused():
    with pytest.raises(ValueError, match="beside its mixer state"):
        _run(4000, 4100)


def test_a_layout_switch_mid_run_re_pages_the_state_and_loses_no_page():
    from kernel_gym.traffic.routing import UniformRouting
    from kernel_gym.traffic.simulator import Simulator

    model = dataclasses.replace(HYBRID, mixer_state_bytes=100 * HYBRID.kv_bytes_per_token)
    s = Simulator(model, small_trace(300, rate=200.0), AnalyticTimer(), chooser(), UniformRouting(4, 2),
                  gpu_memory_bytes=mem_for_tokens(model, 8000), max_num_batched_tokens=512)
    s.run_until(0.5)
    holding = int(np.count_nonzero(s.state_held))
    assert holding > 0 and s.state_pages == 7 and set(s.state_held[s.state_held > 0]) == {7}  # 100 tokens, 16 a page
    s.set_kv_layout(64, "NHD")
    assert s.state_pages == 2 and np.count_nonzero(s.state_held) <= holding
    running = s._running()
    assert set(s.state_held[running]) == {2}
    assert s.free_pages == s.num_pages - int(s.pages[running].sum()) - int(s.state_held[running].sum())
    s.run()
    assert s.free_pages == s.num_pages and not s.state_held.any()


def test_a_policy_stored_before_the_state_was_read_still_matches_its_model():
    from dataclasses import asdict

    from kernel_gym.deploy.export import check_policy_model

    model = ZOO["qwen3-next-80b-a3b"]
    old = {k: v for k, v in asdict(model).items() if k != "mixer_state_bytes"}  # logged before the field existed
    line = check_policy_model("fused_moe", {"model_uri": "models:/p/1", "model_specs": [old]}, model)
    assert "qwen3-next-80b-a3b" in line
    with pytest.raises(ValueError, match="other hidden"):
        check_policy_model("fused_moe", {"model_uri": "models:/p/1", "model_specs": [old]},
                           dataclasses.replace(model, hidden=4096))


def test_a_layout_switch_that_leaves_a_request_no_room_beside_its_state_is_refused():
    """A 1000-token pool holds 62 pages of 16 (a 17-token state takes 2: 960 tokens left for the request) but 15 of
    64 (the state takes 1: 896 left), so a 950-token request that fits at 16 cannot at 64; before, the switch went
    through and that request preempted itself forever."""
    from kernel_gym.traffic.routing import UniformRouting
    from kernel_gym.traffic.simulator import Simulator
    from kernel_gym.traffic.traces import Trace

    model = dataclasses.replace(HYBRID, mixer_state_bytes=17 * HYBRID.kv_bytes_per_token)
    trace = Trace("t", np.array([0.0, 0.1]), np.array([900, 100]), np.array([50, 5]))
    s = Simulator(model, trace, AnalyticTimer(), chooser(), UniformRouting(4, 2),
                  gpu_memory_bytes=mem_for_tokens(model, 1000))
    with pytest.raises(ValueError, match="page_size=64: request 0 needs 950 tokens .* beside its mixer state.*keep "
                                         "page_size=16"):
        s.set_kv_layout(64, "NHD")
    assert s.page_size == 16 and s.state_pages == 2  # nothing changed
    s.run()
    assert s.free_pages == s.num_pages


def test_the_parallel_simulator_spreads_the_state_reads_over_its_ep_ranks():
    from kernel_gym.measure.coverage import cover
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.parallel import deploy
    from kernel_gym.parallel.collectives import CollectiveTable
    from kernel_gym.parallel.step_time import ParallelSimulator, StepPricer
    from tests.parallel.fixture_table import fixture_table

    backend, table = cover(RecordedBackend()), CollectiveTable(fixture_table())
    mixtral = ZOO["mixtral-8x7b"]
    stateful = dataclasses.replace(mixtral, mixer_state_bytes=64 << 20)
    trace = small_trace(20, rate=20.0)
    extra = {}
    for lay in (Layout(1, 1), Layout(1, 2), Layout(2, 1)):
        dense = []
        for spec in (stateful, mixtral):
            sim = ParallelSimulator(spec, trace, lay, StepPricer(spec, lay, backend, table))
            dense.append(sim.price_step([], 9, 100.0, 9, [])[1])
        extra[lay] = dense[0] - dense[1]
        per_gpu = attention_spec(stateful, lay).mixer_state_bytes
        assert extra[lay] == pytest.approx(2.0 * per_gpu * -(-9 // lay.ep) / COPY_BW)
    assert extra[Layout(1, 2)] < extra[Layout(1, 1)]  # 5 sequences on the busiest EP rank, not 9
    # a rank's KV room for one request is what is left beside that request's state
    dep = deploy.Deployment(replicas=1, tp=2, ep=1, engine="vllm", version="0.34.0", block_size=16,
                            max_batched_tokens=8192, max_seqs=256, graph_max=512)
    room = deploy.kv_tokens_per_rank(mixtral, dep) - deploy.kv_tokens_per_rank(stateful, dep)
    assert room == pytest.approx((32 << 20) / attention_spec(mixtral, Layout(2, 1)).kv_bytes_per_token, abs=1)


# ---- vLLM's KV block for hybrid models ---------------------------------------------------------------------------

def _dep(tp: int = 1, block: int = 64, engine: str = "vllm"):
    from kernel_gym.parallel.deploy import Deployment

    return Deployment(engine, 1, tp, 1, block, 8192, 256, 512)


def test_vllm_raises_the_block_of_a_model_with_a_recurrent_state_as_it_logs():
    """vLLM's _align_hybrid_block_size: one layer's block of KV holds one layer's state, in multiples of
    max(16, --block-size) and, for Gated DeltaNet under prefix caching (the default), of its 64-token prefill
    checkpoints (releases before that "align" mode logged 272 tokens for Qwen3-Next on four GPUs; it is 320 now)."""
    from kernel_gym.parallel.deploy import engine_block_tokens, launch_commands

    qwen = ZOO["qwen3-next-80b-a3b"]
    per_token = 2 * 2 * 256 * 2  # one attention layer's K and V of one token: 2 KV heads x 256 x bf16
    assert qwen.mixer_page_bytes == 1097728
    assert engine_block_tokens(qwen, _dep(1, 64)) == 64 * -(-1097728 // (64 * per_token)) == 576
    assert engine_block_tokens(qwen, _dep(4, 16)) == 64 * -(-1097728 // 4 // (64 * per_token // 2)) == 320
    assert engine_block_tokens(qwen, _dep(1, 16)) == engine_block_tokens(qwen, _dep(1, 32)) == 576  # not 544
    assert engine_block_tokens(qwen, _dep(1, 128)) == 640
    jamba = ZOO["jamba-1.5-large"]  # Mamba: no checkpoint alignment, 16-token multiples at the 16-token block
    assert engine_block_tokens(jamba, _dep(1, 16)) == 16 * -(-jamba.mixer_page_bytes // (16 * 2 * 8 * 128 * 2)) == 160
    assert engine_block_tokens(qwen, _dep(1, 576)) == 576  # passing the raised block keeps it
    (cmd,) = launch_commands(_dep(1, 64), "Qwen/Qwen3-Next-80B-A3B-Instruct", spec=qwen)
    assert "--block-size 576 " in cmd
    assert "--block-size 64 " in launch_commands(_dep(1, 64), "m")[0]  # without the spec: the knob as given
    oss, _ = _read(GPT_OSS)
    for spec, dep in ((qwen, _dep(1, 64, "sglang")), (ZOO["mixtral-8x7b"], _dep(1, 64)), (oss, _dep(1, 64)),
                      (dataclasses.replace(ZOO["mixtral-8x7b"], mixer_state_bytes=1 << 20), _dep(1, 64))):
        assert engine_block_tokens(spec, dep) == 64  # SGLang, no state, a sliding window, no layer holding it


def test_the_replay_allocates_the_engines_blocks_and_prices_the_kernels_page():
    from kernel_gym.parallel.deploy import kv_tokens_per_rank

    s, res = _run(100, 20000, kv_block_tokens=80)
    plain, _ = _run(100, 20000)
    assert (s.page_size, s.kv_layout.page_size, res.summary["page_size"]) == (80, 16, 80.0)
    assert s.state_pages == 2 and plain.state_pages == 7  # 100 tokens' worth of state: 2 blocks of 80, 7 pages of 16
    assert s.num_pages == plain.num_pages * 16 // 80
    assert s.free_pages == s.num_pages and all(c["PAGE_SIZE"] == 16 for c in s.configs_used["decode_attention"])
    qwen = ZOO["qwen3-next-80b-a3b"]
    assert kv_tokens_per_rank(qwen, _dep(2, 64)) % 576 == 0  # whole blocks, beside the state's whole blocks
    with pytest.raises(ValueError, match="kv_block_tokens must be an integer >= 0"):
        _run(100, 20000, kv_block_tokens=-1)


def test_prefix_hits_on_blocks_the_traces_blocks_do_not_tile_are_a_lower_bound():
    """Mooncake's 512-token hash blocks on a hybrid model's 576-token blocks: a block is a hit where the trace's block
    that ends at or past its end is, which holds only where the prompts agree over the whole block."""
    from kernel_gym.traffic.routing import UniformRouting
    from kernel_gym.traffic.simulator import KVLayout, Simulator
    from kernel_gym.traffic.traces import Trace

    ids = ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 9))  # the third shares 1,536 tokens: two whole 576-token blocks
    tr = Trace("moon", [0.0, 5.0, 10.0], [2048] * 3, [2] * 3, hash_ids=ids, hash_block_tokens=512)
    model = HYBRID
    s = Simulator(model, tr, AnalyticTimer(), chooser(), UniformRouting(4, 2), kv_block_tokens=576,
                  gpu_memory_bytes=mem_for_tokens(model, 1 << 16))
    res = s.run()
    assert s.hashes[0] == ((1, 1), (2, 2), (3, 3))  # pages 1-3 end at 576, 1,152 and 1,728: blocks 2-4 stand for them
    assert res.summary["prefix_hit_tokens"] == 3 * 576 + 2 * 576
    # Jamba's 160-token vLLM blocks: three pages end inside the trace's first block, each its own page
    small = Simulator(model, tr, AnalyticTimer(), chooser(), UniformRouting(4, 2), kv_block_tokens=160,
                      gpu_memory_bytes=mem_for_tokens(model, 1 << 16))
    res = small.run()
    assert small.hashes[0][:4] == ((0, 1), (0, 2), (0, 3), (1, 4)) and len(small.hashes[0]) == 12
    assert res.summary["prefix_hit_tokens"] == 12 * 160 + 9 * 160  # the third shares 1,536 tokens: 9 whole pages
    assert small.free_pages == small.num_pages - small.cache_pages
    with pytest.raises(ValueError, match="do not fill pages of 576"):  # a page the user chose must tile
        Simulator(model, tr, AnalyticTimer(), chooser(page_size=576), UniformRouting(4, 2),
                  kv_layout=KVLayout(576, "NHD"), gpu_memory_bytes=mem_for_tokens(model, 1 << 16))


def test_sglang_holds_the_state_in_a_pool_of_its_own_whose_slots_cap_the_running_requests(monkeypatch):
    """SGLang 0.5.23 gives a hybrid model's state ratio / (1 + ratio) of the memory left after weights
    (--mamba-full-memory-ratio 0.9): the KV pool gets the rest, and each running request takes one state slot."""
    from kernel_gym.parallel.deploy import SGLANG_MAMBA_FULL_MEMORY_RATIO, kv_tokens_per_rank, state_pool_share

    qwen, oss = ZOO["qwen3-next-80b-a3b"], _read(GPT_OSS)[0]
    share = SGLANG_MAMBA_FULL_MEMORY_RATIO / (1 + SGLANG_MAMBA_FULL_MEMORY_RATIO)
    assert state_pool_share(qwen, _dep(2, 16, "sglang")) == pytest.approx(share)
    assert state_pool_share(qwen, _dep(2, 16)) == state_pool_share(oss, _dep(2, 16, "sglang")) == 0.0
    apart = kv_tokens_per_rank(qwen, _dep(2, 16, "sglang"))
    monkeypatch.setattr("kernel_gym.parallel.deploy.window_pool_ratio", lambda spec, dep: 0.0)  # one pool for all
    together = kv_tokens_per_rank(dataclasses.replace(qwen, mixer="sliding-window"), _dep(2, 16, "sglang"))
    assert apart / together == pytest.approx(1 / 1.9, rel=0.01)  # the KV pool's share of what one pool would hold
    s, res = _run(512, 6000, max_num_batched_tokens=512, state_pool_share=0.5)
    shared, _ = _run(512, 6000, max_num_batched_tokens=512)
    assert s.state_slots == int(shared.pool_bytes * 0.5 // s.model.mixer_state_bytes) == 5 and s.state_pages == 0
    assert s.num_pages == shared.num_pages // 2
    running = STEP_COLUMNS.index("running")
    assert res.steps[:, running].max() == 5 and s.free_pages == s.num_pages  # the slots cap it; every page returned
    two, res = _run(512, 6000, max_num_batched_tokens=512, state_pool_share=0.5, state_slots_per_request=2)
    assert res.steps[:, running].max() == 2  # SGLang's radix cache keeps 3-5 slots per running request
    with pytest.raises(ValueError, match="fewer than one running request takes"):
        _run(512, 6000, state_pool_share=0.05)
    with pytest.raises(ValueError, match=r"state_pool_share must be in \[0, 1\)"):
        _run(512, 6000, state_pool_share=1.0)


def test_a_deployment_replay_reports_the_engines_block_and_state_pool():
    """DeploymentPricer.serve (what `plan` prints from): vLLM's raised block and SGLang's state slots."""
    from kernel_gym.measure.coverage import cover
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.parallel.deploy import DeploymentPricer
    from tests.parallel.fixture_table import fixture_table

    qwen = ZOO["qwen3-next-80b-a3b"]
    p = DeploymentPricer(qwen, cover(RecordedBackend()), fixture_table())
    trace = small_trace(12, rate=4.0)
    vllm, sglang = (p.serve(trace, _dep(2, 64, engine), 2.0, 0.1) for engine in ("vllm", "sglang"))
    assert (vllm["kv_block_tokens"], vllm["state_slots"]) == (576, 0)
    assert sglang["kv_block_tokens"] == 64 and sglang["state_slots"] > 100
    assert sglang["state_running_cap"] == sglang["state_slots"] // 5  # Gated DeltaNet: 3 + 2 extra-buffer slots
    assert vllm["slo_attainment"] > 0 and sglang["slo_attainment"] > 0


def test_a_spec_naming_an_unknown_mixer_or_too_many_mixer_layers_is_refused_with_the_choices():
    from kernel_gym.models import spec_from_dict

    good = dataclasses.asdict(ZOO["qwen3-next-80b-a3b"])
    assert spec_from_dict(good) == ZOO["qwen3-next-80b-a3b"]
    with pytest.raises(ValueError, match=r"mixer must be one of .*'gated-deltanet'.*got 'gdn'"):
        spec_from_dict({**good, "mixer": "gdn"})
    with pytest.raises(ValueError, match=r"mixer_layers \(49\) exceeds num_layers \(48\)"):
        spec_from_dict({**good, "mixer_layers": 49})
