"""Serving-v0's rules exported as a dispatch table: the Dispatcher loads it and answers with the rule's configs
(exactly for MoE and decode, at the cells' representative batches for prefill), and a serving run goes through it."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_gym.deploy.export import prefill_lens
from kernel_gym.deploy.serving_export import (
    export_serving_agent,
    most_used_rules,
    rule_grid,
    rules_of_action,
    serving_dispatch_table,
)
from kernel_gym.dispatch.dispatcher import Dispatcher, DispatchTable
from kernel_gym.dispatch.serving_rules import DispatchRule, build_serving_catalogue
from kernel_gym.evaluate.replay import GuardedChooser
from kernel_gym.kernels import get_family
from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload, PrefillWorkload
from kernel_gym.models import load_model
from kernel_gym.traffic.simulator import KERNELS, KVLayout
from kernel_gym.traffic.synthetic import LogNormalLengths, poisson
from kernel_gym.traffic.windows import window_simulator
from tests.fakes.analytic_backend import AnalyticBackend

MODEL = load_model("mixtral-8x7b")
SKEWS = [round(0.05 * i, 3) for i in range(41)]  # the simulator's skew grid (traffic.simulator.SKEW_GRID), 0..2
SIZES = sorted({int(round(1.3 ** i)) for i in range(36)})  # 1 .. ~10k, uneven steps


def moe(n: int, skew: float = 0.0) -> MoEWorkload:
    return MoEWorkload(n, MODEL.num_experts, MODEL.top_k, MODEL.hidden, MODEL.intermediate, skew)


def decode(batch: int, ctx: int) -> DecodeWorkload:
    return DecodeWorkload(MODEL.num_heads, MODEL.num_kv_heads, MODEL.head_dim, batch, ctx)


def test_constructed_rules_dispatch_exactly_through_a_loaded_table(tmp_path):
    fam = get_family("fused_moe")
    small, big = fam.default_config(moe(4)), fam.default_config(moe(4096))
    mid = small.replace(num_stages=4 if small["num_stages"] != 4 else 3)  # a third config of the knob space
    moe_rule = DispatchRule("fused_moe", "table3", {(2.0, 0.0): small, (12.0, 0.0): big, (6.0, 1.0): mid})
    dec = get_family("decode_attention").default_config(decode(8, 1024))
    kv = KVLayout(32, "HND")
    d1, d2 = dec.replace(PAGE_SIZE=32, LAYOUT="HND"), dec.replace(PAGE_SIZE=32, LAYOUT="HND", NUM_SPLITS=4)
    dec_rule = DispatchRule("decode_attention", "table2@32HND", {(3.0, 8.0): d1, (0.0, 13.0): d2}, kv)
    pre_rule = DispatchRule("prefill_attention", "default", {})
    table = serving_dispatch_table({"fused_moe": moe_rule, "decode_attention": dec_rule,
                                    "prefill_attention": pre_rule}, "mixtral-8x7b")
    assert set(table.kernels) == {"fused_moe", "decode_attention"}  # a default prefill rule is left to the default
    assert table.meta["left_out"].keys() == {"prefill_attention"}
    disp = Dispatcher.load(table.save(tmp_path / "serving_table.json"))
    assert disp.kv_layout == kv
    for n in SIZES:
        for s in SKEWS:
            assert disp.choose("fused_moe", moe(n, s), disp.kv_layout) == moe_rule.choose(moe(n, s)), (n, s)
        for ctx in SIZES:
            assert disp.choose("decode_attention", decode(n, ctx), kv) == dec_rule.choose(decode(n, ctx)), (n, ctx)
    pw = PrefillWorkload(MODEL.num_heads, MODEL.num_kv_heads, MODEL.head_dim, (700, 300))
    assert disp.choose("prefill_attention", pw, kv) == get_family("prefill_attention").default_config(pw)
    with pytest.raises(ValueError, match="nothing to export"):
        serving_dispatch_table({"fused_moe": DispatchRule("fused_moe", "default", {})}, MODEL)


@pytest.fixture(scope="module")
def setting():
    backend = AnalyticBackend(sample=96)
    lengths = LogNormalLengths(np.log(600), 0.9, np.log(120), 0.8, max_prompt=4000, max_output=600)
    trace = poisson(6.0, 400.0, lengths, seed=1)
    catalogue = build_serving_catalogue(backend, "mixtral-8x7b", trace, holdout=0.25, profile_s=60.0,
                                        profile_windows=2)
    kw = dict(backend=backend, trace=trace, holdout=0.25, interval_s=5.0, num_intervals=4, warmup_s=5.0,
              catalogue=catalogue)
    return backend, trace, catalogue, kw


def test_an_agents_most_used_rules_export_and_serve_a_replayed_window(setting, tmp_path):
    backend, trace, catalogue, kw = setting
    oracle_tables = [next(i for i, r in enumerate(catalogue.rules[k]) if r.name.startswith("oracle_table"))
                     for k in KERNELS]
    # an "agent" that keeps the oracle-like tables except every third interval, where it goes back to the defaults
    calls = {"n": 0}

    def agent(obs, env):
        calls["n"] += 1
        return np.array([0, 0, 0] if calls["n"] % 3 == 0 else oracle_tables)

    table, res = export_serving_agent(kw, agent, num_windows=2)
    chosen = rules_of_action(catalogue, oracle_tables)
    assert most_used_rules(catalogue, res["agent_rules"]) == chosen
    assert table.meta["rules"] == {k: r.name for k, r in chosen.items()}
    assert set(table.kernels) == set(KERNELS)
    disp = Dispatcher(DispatchTable.load(table.save(tmp_path / "t.json")))
    kv = chosen["decode_attention"].kv
    assert disp.kv_layout == kv
    # prefill: exact at every cell's representative batch
    c0, c1 = rule_grid("prefill_attention")
    for total in c0[8:30]:
        for mx in c1[8:30]:
            w = PrefillWorkload(MODEL.num_heads, MODEL.num_kv_heads, MODEL.head_dim,
                                prefill_lens(round(total), round(mx)))
            assert disp.choose("prefill_attention", w, kv) == chosen["prefill_attention"].choose(w)

    # a held-out window served through the Dispatcher as replay serves "learned" (GuardedChooser: a config the
    # backend cannot time falls back): the Dispatcher gives every MoE and decode call the rule's config
    guard = GuardedChooser(disp, backend, MODEL.num_layers)
    seen: list[tuple[str, object]] = []

    class Recorder:
        def choose(self, kernel, workload, kv_in_force):
            seen.append((kernel, workload))
            return guard.choose(kernel, workload, kv_in_force)

    cut = trace.duration_s * 0.75
    sim = window_simulator(MODEL, trace, backend, Recorder(), cut + 20.0, 5.0, 20.0, 1.0,
                           precompiled=disp.precompiled, sim_kwargs={"kv_layout": kv})
    st = sim.run_until(sim.clock + 20.0)
    assert st.output_tokens > 0
    kernels_seen = {k for k, _ in seen}
    assert {"fused_moe", "decode_attention"} <= kernels_seen
    for kernel, w in seen:
        if kernel in ("fused_moe", "decode_attention"):  # prefill and prefix_prefill chunks: no rule table
            assert disp.choose(kernel, w, kv) == chosen[kernel].choose(w), (kernel, w)
