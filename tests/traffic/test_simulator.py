"""Serving simulator: conservation across preemption, Little's law, monotonicity, stalls, layouts, the interfaces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload, PrefillWorkload
from kernel_gym.measure.roofline import COPY_BW, dense_step_s
from kernel_gym.measure.types import OK, UNAVAILABLE, Measurement
from kernel_gym.models import BUILTIN_MODELS, ModelSpec
from kernel_gym.traffic.routing import UniformRouting, ZipfRouting
from kernel_gym.traffic.simulator import (
    COMPILE_S_DEFAULT,
    BackendTimer,
    KVLayout,
    Simulator,
    StaticChooser,
    capture_size,
    chunk_equivalent_len,
    round_count,
    round_log4,
)
from kernel_gym.traffic.synthetic import LogNormalLengths, poisson
from kernel_gym.traffic.traces import Trace

TINY = ModelSpec("tiny", num_layers=2, hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, num_experts=4, top_k=2,
                 intermediate=512)
KV = KVLayout(16, "NHD")


class AnalyticTimer:
    """Kernel time = fixed launch cost + work / rate; `scale` makes every kernel slower; a config knob SLOW adds."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.calls = 0

    def time_s(self, kernel, workload, config) -> float:
        self.calls += 1
        slow = 1.0 + 0.5 * int(config.get("SLOW", 0))
        if isinstance(workload, PrefillWorkload):
            work = workload.causal_pairs() * 1e-9
        elif isinstance(workload, DecodeWorkload):
            work = workload.batch * workload.context_len * 2e-9
        else:
            assert isinstance(workload, MoEWorkload)
            work = workload.num_tokens * 1e-7 * (1 + workload.skew)
        return self.scale * slow * (20e-6 + work)


def chooser(page_size: int = 16, layout: str = "NHD", **extra) -> StaticChooser:
    return StaticChooser({
        "prefill_attention": Config(BLOCK_M=64, **extra),
        "decode_attention": Config(PAGE_SIZE=page_size, LAYOUT=layout, **extra),
        "fused_moe": Config(BLOCK_M=32, **extra),
    })


def mem_for_tokens(model: ModelSpec, tokens: int) -> float:
    """GPU memory (at utilisation 0.9) that leaves a KV pool of `tokens` tokens."""
    return (model.weight_bytes + tokens * model.kv_bytes_per_token + 1) / 0.9


def sim(trace, timer=None, ch=None, routing=None, **kw) -> Simulator:
    kw.setdefault("gpu_memory_bytes", mem_for_tokens(TINY, 1 << 20))
    return Simulator(TINY, trace, timer or AnalyticTimer(), ch or chooser(), routing or UniformRouting(4, 2), **kw)


def small_trace(n=200, rate=50.0, seed=0):
    lengths = LogNormalLengths(np.log(300), 0.8, np.log(40), 0.8, max_prompt=2000, max_output=200)
    return poisson(rate, n / rate, lengths, seed=seed)


def test_conservation_across_preemption():
    tr = small_trace(300, rate=200.0)
    s = sim(tr, gpu_memory_bytes=mem_for_tokens(TINY, 4000), max_num_batched_tokens=512)
    res = s.run()
    assert res.summary["preemptions"] > 0, "the pool was meant to be small enough to force preemption"
    assert np.array_equal(res.generated_tokens, tr.output_tokens)  # every token produced, none twice
    assert s.output_tokens_total == tr.output_tokens.sum()
    assert np.all(res.first_token_s > res.arrival_s) and np.all(res.finish_s >= res.first_token_s)
    assert s.free_pages == s.num_pages  # every page returned


def _resume_extra(res, s) -> int:
    """Tokens prefilled beyond the prompts and the recomputed KV: on resume a request also prefills the generated
    token whose KV was not yet written (one per preemption of a request that had emitted a token)."""
    return int(res.summary["prefill_tokens"] - res.prompt_tokens.sum() - res.summary["recomputed_tokens"])


def test_prefill_tokens_only_exceed_prompts_by_recompute():
    tr = small_trace(300, rate=200.0)
    s = sim(tr, gpu_memory_bytes=mem_for_tokens(TINY, 4000), max_num_batched_tokens=512)
    res = s.run()
    extra = _resume_extra(res, s)
    assert 0 <= extra <= res.preemptions.sum()
    no_pre = sim(tr).run()
    assert no_pre.summary["preemptions"] == 0 and no_pre.summary["prefill_tokens"] == tr.prompt_tokens.sum()


def test_littles_law():
    tr = small_trace(800, rate=40.0, seed=4)
    res = sim(tr).run()
    lam = len(tr) / res.summary["sim_time_s"]
    assert res.summary["in_system_mean"] == pytest.approx(lam * res.summary["e2e_mean_s"], rel=0.02)


def test_slower_kernels_never_raise_throughput():
    tr = small_trace(300, rate=100.0, seed=2)
    prev = math.inf
    for scale in (1.0, 2.0, 4.0):
        s = sim(tr, AnalyticTimer(scale)).run().summary
        assert s["tokens_per_s"] <= prev + 1e-9
        prev = s["tokens_per_s"]
    fast = sim(tr, AnalyticTimer(1.0)).run().summary
    slow = sim(tr, AnalyticTimer(4.0)).run().summary
    assert slow["tuned_kernel_s"] > fast["tuned_kernel_s"] and slow["e2e_p50_s"] >= fast["e2e_p50_s"]


def test_single_request_timeline_and_chunked_prefill():
    tr = Trace("one", np.array([0.0]), np.array([1000]), np.array([5]))
    timer = AnalyticTimer()
    s = sim(tr, timer, max_num_batched_tokens=256, step_overhead_s=1e-3)
    res = s.run()
    prefill_steps = res.step_column("prefill_tokens")
    assert list(prefill_steps[prefill_steps > 0]) == [256, 256, 256, 232]
    assert len(res.steps) == 4 + 4  # 4 prefill chunks, then 4 decode steps for tokens 2..5
    # TTFT = compile stalls (3 kernels, first use) + the four prefill steps
    first4 = res.step_column("duration_s")[:4].sum()
    assert res.ttft_s[0] == pytest.approx(first4)
    assert res.summary["stall_s"] == pytest.approx(3 * COMPILE_S_DEFAULT)
    assert res.tpot_s[0] == pytest.approx(res.step_column("duration_s")[4:].mean())
    assert res.e2e_s[0] == pytest.approx(res.step_column("duration_s").sum())


def test_each_kind_of_step_pays_its_own_overhead():
    """With CUDA graphs, decode-only steps within the graph size pay the "graph" overhead, steps with chunks there
    "piecewise", larger steps "eager"; a kind left out pays step_overhead_s; an unknown kind is refused."""
    from kernel_gym.traffic.simulator import STEP_KINDS

    tr = Trace("one", np.array([0.0]), np.array([600]), np.array([3]))
    timer = AnalyticTimer()
    pre = {(k, c) for k, c in chooser().configs.items()}
    base = sim(tr, timer, chooser(), step_overhead_s=0.0, precompiled=pre, cuda_graph_max_tokens=512,
               max_num_batched_tokens=512).run()
    costs = {"graph": 0.01, "piecewise": 0.1, "eager": 1.0}
    got = sim(tr, timer, chooser(), step_overhead_s=0.0, precompiled=pre, cuda_graph_max_tokens=512,
              max_num_batched_tokens=512, step_overheads=costs).run()
    extra = got.step_column("duration_s") - base.step_column("duration_s")
    prefill = got.step_column("prefill_tokens")  # chunks of 512 then 88 tokens, then 2 decode-only steps
    assert list(prefill) == [512, 88, 0, 0]
    assert extra == pytest.approx([0.1, 0.1, 0.01, 0.01])
    eager = sim(tr, timer, chooser(), step_overhead_s=0.5, precompiled=pre, max_num_batched_tokens=512,
                step_overheads={"graph": 0.01}).run()  # no graphs: every step eager, at step_overhead_s
    plain = sim(tr, timer, chooser(), step_overhead_s=0.0, precompiled=pre, max_num_batched_tokens=512).run()
    assert eager.step_column("duration_s") - plain.step_column("duration_s") == pytest.approx([0.5] * 4)
    assert set(STEP_KINDS) == set(costs)
    with pytest.raises(ValueError, match="unknown step kinds"):
        sim(tr, timer, step_overheads={"warm": 0.1})


def test_step_time_is_kernels_times_layers_plus_dense_plus_overhead():
    tr = Trace("one", np.array([0.0]), np.array([100]), np.array([2]))
    timer = AnalyticTimer()
    ch = chooser()
    pre = {(k, c) for k, c in ch.configs.items()} | {("decode_attention", ch.choose("decode_attention", None, KV))}
    s = sim(tr, timer, ch, step_overhead_s=0.004, precompiled=pre)
    res = s.run()
    d0 = res.step_column("duration_s")[0]
    pw = PrefillWorkload(4, 2, 64, (112,))  # 100 rounded up to a multiple of 16
    mw = MoEWorkload(100 if 100 <= 16 else round_count(100), 4, 2, 256, 512, 0.0)
    expect = 2 * (timer.time_s("p", pw, Config()) + timer.time_s("m", mw, Config())) \
        + dense_step_s(TINY, 100, 1) + 0.004
    assert d0 == pytest.approx(expect) and res.summary["stall_s"] == 0


def test_graphed_steps_are_charged_at_their_capture_size():
    """cuda_graph_max_tokens: a step of up to that many tokens runs at its capture size (1, 2, 4, then multiples of
    8), so the MoE layer and the dense ops are charged for the padded rows; larger steps and the default stay exact."""
    assert [capture_size(n) for n in (1, 2, 3, 5, 8, 9, 250)] == [1, 2, 4, 8, 8, 16, 256]
    tr = Trace("three", np.array([0.0, 0.0, 0.0]), np.array([16, 16, 16]), np.array([3, 3, 3]))

    class Recording(AnalyticTimer):
        def __init__(self):
            super().__init__()
            self.moe_tokens = []

        def time_s(self, kernel, workload, config):
            if isinstance(workload, MoEWorkload):
                self.moe_tokens.append(workload.num_tokens)
            return super().time_s(kernel, workload, config)

    graphed, eager = Recording(), Recording()
    sim(tr, graphed, cuda_graph_max_tokens=512).run()
    sim(tr, eager).run()
    assert 3 in eager.moe_tokens and 3 not in graphed.moe_tokens and 4 in graphed.moe_tokens  # 3 decodes
    assert sorted(set(graphed.moe_tokens) - {4}) == sorted(set(eager.moe_tokens) - {3})  # 48 prompt tokens: a size
    big = Trace("big", np.array([0.0]), np.array([1000]), np.array([2]))
    capped = Recording()
    sim(big, capped, cuda_graph_max_tokens=512).run()
    assert round_count(1000) in capped.moe_tokens  # above the cap: the step's own tokens


def test_decode_config_must_match_kv_layout():
    tr = small_trace(20)
    bad = StaticChooser({"prefill_attention": Config(A=1), "decode_attention": Config(PAGE_SIZE=32, LAYOUT="NHD"),
                         "fused_moe": Config(A=1)}, follow_kv=False)
    with pytest.raises(ValueError, match="does not match the KV layout in force"):
        sim(tr, ch=bad).run()


def test_compile_stalls_first_use_only_and_precompiled():
    tr = small_trace(100)
    res = sim(tr, compile_s=lambda k, c: 0.5).run()
    assert res.summary["stall_s"] == pytest.approx(3 * 0.5)
    assert sum(1 for _, _, why in res.stalls if why.startswith("compile")) == 3
    ch = chooser()
    ch.precompiled = {(k, c) for k, c in ch.configs.items()} | {
        ("decode_attention", ch.choose("decode_attention", None, KV))}
    assert sim(tr, ch=ch).run().summary["stall_s"] == 0


def test_kv_relayout_charges_copy_of_live_bytes_and_repages():
    tr = small_trace(200, rate=100.0)
    s = sim(tr)
    s.run_until(0.5)
    live = float(s.kv[s._running()].sum()) * TINY.kv_bytes_per_token
    assert live > 0
    pages_before = s.num_pages
    stall = s.set_kv_layout(64, "HND")
    assert stall == pytest.approx(2 * live / COPY_BW)
    assert s.num_pages == pages_before // 4 or abs(s.num_pages - pages_before / 4) <= 1
    stats = s.run_until(1.0)
    assert any("re-layout" in why for _, _, why in stats.stalls)
    res = s.run()
    assert any('"PAGE_SIZE":64' in c for c in res.configs_used["decode_attention"])
    assert np.array_equal(res.generated_tokens, tr.output_tokens)


def test_add_stall_and_run_until_intervals_add_up():
    tr = small_trace(200, rate=100.0)
    whole = sim(tr).run()
    s = sim(tr)
    total_tokens, t = 0, 0.0
    while not s.done:
        t += 0.25
        st = s.run_until(t)
        assert s.clock >= t or s.done
        total_tokens += st.output_tokens
    assert total_tokens == tr.output_tokens.sum()
    assert np.allclose(s.result().finish_s, whole.finish_s)  # stepping in intervals changes nothing
    s2 = sim(tr)
    s2.run_until(0.3)
    s2.add_stall(2.0, "autotune")
    t0 = s2.clock
    st = s2.run_until(t0 + 0.01)
    assert st.steps == 1 and st.stall_s >= 2.0 and st.t_end >= t0 + 2.0
    assert st.stalls[0][1:] == (2.0, "autotune")  # charged to the next step, with its reason
    assert s2.run().summary["e2e_p50_s"] > whole.summary["e2e_p50_s"]


def test_switch_log_and_config_counts():
    class ByBatch(StaticChooser):
        def choose(self, kernel, workload, kv):
            cfg = super().choose(kernel, workload, kv)
            if kernel == "fused_moe" and workload.num_tokens > 64:
                return cfg.replace(SLOW=1)
            return cfg

    tr = small_trace(300, rate=100.0)
    res = sim(tr, ch=ByBatch(chooser().configs)).run()
    moe = res.configs_used["fused_moe"]
    assert len(moe) == 2 and sum(moe.values()) == len(res.steps)
    switches = [s for s in res.switch_log if s[1] == "fused_moe"]
    assert len(switches) >= 1 and all(old != new for _, _, old, new in switches)


def test_skewed_routing_reaches_the_moe_workload():
    seen = []

    class Spy(AnalyticTimer):
        def time_s(self, kernel, workload, config):
            if kernel == "fused_moe":
                seen.append(workload.skew)
            return super().time_s(kernel, workload, config)

    sim(small_trace(50), Spy(), routing=ZipfRouting(4, 2, seed=0, exponent=1.2)).run()
    assert seen and all(abs(s - 1.2) < 0.051 for s in seen)


def test_backend_timer_memoises_and_names_unavailable_configs():
    class Fake:
        name = "fake"

        def __init__(self):
            self.calls = 0

        def measure(self, kernel, workload, config):
            self.calls += 1
            if config.get("BAD"):
                return Measurement(kernel, workload.key(), str(config), UNAVAILABLE, reason="nothing near")
            return Measurement(kernel, workload.key(), str(config), OK, median_ms=0.5)

    fake = Fake()
    bt = BackendTimer(fake)
    wl = DecodeWorkload(4, 2, 64, 8, 512)
    assert bt.time_s("decode_attention", wl, Config(X=1)) == pytest.approx(5e-4)
    bt.time_s("decode_attention", DecodeWorkload(4, 2, 64, 8, 512), Config(X=1))
    assert fake.calls == 1
    with pytest.raises(RuntimeError, match=r"decode_attention.*\"BAD\":1.*unavailable config"):
        bt.time_s("decode_attention", wl, Config(BAD=1))


def test_rounding_grid():
    assert [round_count(n) for n in (1, 7, 16)] == [1, 7, 16]
    assert round_count(100) in (91, 108) and round_log4(2048) == 2048
    assert chunk_equivalent_len(100, 0) == 112
    n = chunk_equivalent_len(256, 1024)  # as many causal pairs as the chunk after 1024 cached tokens
    assert n * (n + 1) / 2 >= 256 * 1024 + 256 * 257 / 2 and n % 16 == 0


def test_pool_sizing_and_too_long_requests():
    m = BUILTIN_MODELS["mixtral-8x7b"]
    tr = Trace("t", np.array([0.0]), np.array([100]), np.array([10]))
    s = Simulator(m, tr, AnalyticTimer(), chooser(), UniformRouting(8, 2))
    assert s.num_pages == int((143771 * 2**20 * 0.9 - m.weight_bytes) // (16 * m.kv_bytes_per_token))
    huge = Trace("t", np.array([0.0]), np.array([s.num_pages * 16]), np.array([10]))
    with pytest.raises(ValueError, match="request 0 needs"):
        Simulator(m, huge, AnalyticTimer(), chooser(), UniformRouting(8, 2))
    with pytest.raises(ValueError, match="routing profile has 4 experts"):
        Simulator(m, tr, AnalyticTimer(), chooser(), UniformRouting(4, 2))


def test_idle_gaps_jump_time():
    tr = Trace("gap", np.array([0.0, 100.0]), np.array([50, 50]), np.array([3, 3]))
    res = sim(tr).run()
    assert res.first_token_s[1] > 100.0 and res.e2e_s[1] < 1.0
    assert len(res.steps) == 6


def test_a_ragged_decode_batch_costs_no_less_than_its_longest_sequence_alone():
    """Decode is priced at the batch's mean context, but no less than the same config's time for the longest sequence
    alone (batch 1 at max_ctx): a ragged batch waits for its longest sequence. Within the rows' own spread (max up to
    1.5x the mean) and without a max the mean stands; so does a config a guarding chooser served as a fallback."""
    tr = Trace("one", np.array([0.0]), np.array([16]), np.array([3]))
    timer = AnalyticTimer()
    s = sim(tr, timer)

    def dec(mean, mx):
        return s._decode_s(4, mean, mx, [])

    at_mean = dec(200.0, None)
    cfg = s._last_cfg["decode_attention"]
    alone = timer.time_s("decode_attention", s._workload(("decode_attention", 1, round_log4(1000.0))), cfg)
    assert alone > at_mean  # the analytic timer: 1 x 1000 tokens read alone takes longer than 4 x 200 together
    assert dec(200.0, 250.0) == at_mean and s.decode_longest_s == 0.0  # within the rows' spread
    assert dec(200.0, 1000.0) == pytest.approx(alone)
    assert s.decode_longest_s == pytest.approx((alone - at_mean) * TINY.num_layers)
    kernel_s, _ = s.price_step([], 4, 200.0, 4, [], 1000.0)  # price_step passes the longest context on
    assert kernel_s > s.price_step([], 4, 200.0, 4, [])[0]

    class Guarded:  # a chooser that reports its last decode choice as a fallback (replay's GuardedChooser)
        last_fallback = {"decode_attention": True}

        def choose(self, kernel, workload, kv):
            return chooser().choose(kernel, workload, kv)

    g = sim(tr, AnalyticTimer(), ch=Guarded())
    assert g._decode_s(4, 200.0, 1000.0, []) == pytest.approx(at_mean) and g.decode_longest_s == 0.0
