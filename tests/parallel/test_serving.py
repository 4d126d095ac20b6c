"""The layout-aware simulator, the pricer's bookkeeping, goodput, and KernelGym/ServingTPEP-v0, on the recorded H200
data with a FIXTURE collectives table (synthetic times, tests/parallel/fixture_table.py)."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_gym.measure.coverage import cover
from kernel_gym.measure.recorded import RecordedBackend
from kernel_gym.models import load_model
from kernel_gym.parallel.collectives import CollectivesMissing, CollectiveTable
from kernel_gym.parallel.layout import Layout, moe_shard
from kernel_gym.parallel.step_time import ParallelSimulator, StepPricer, goodput, serve
from kernel_gym.traffic.routing import ZipfRouting
from kernel_gym.traffic.traces import Trace
from tests.parallel.fixture_table import fixture_table

MIXTRAL = load_model("mixtral-8x7b")


@pytest.fixture(scope="module")
def backend():
    return cover(RecordedBackend())


@pytest.fixture(scope="module")
def table():
    return CollectiveTable(fixture_table())


def small_trace(n: int = 24) -> Trace:
    rng = np.random.default_rng(0)
    return Trace("small", np.sort(rng.uniform(0, 4, n)), rng.integers(50, 900, n), rng.integers(2, 40, n))


def test_without_a_measured_table_the_labelled_prior_prices(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_GYM_COLLECTIVES", str(tmp_path / "absent.json"))
    p = StepPricer(MIXTRAL, Layout(2, 1), backend)
    assert p.table.is_prior and "aiconfigurator" in p.table.prior["source"]
    _, total = p.moe_s(64, 0.0, None)
    rep = p.report()
    assert rep["prior_share"] == pytest.approx(rep["all_reduce_s"] / rep["step_parts_s"]) and rep["prior_share"] > 0
    monkeypatch.setattr("kernel_gym.parallel.collectives.PRIOR_TABLE", tmp_path / "no_prior.json")
    with pytest.raises(CollectivesMissing, match="benchmarks/multigpu/run_collectives.py"):
        StepPricer(MIXTRAL, Layout(2, 1), backend)
    StepPricer(MIXTRAL, Layout(1, 1), backend)  # one GPU needs no collectives
    with pytest.raises(Exception, match="no all_to_all on 8 GPUs"):
        StepPricer(MIXTRAL, Layout(1, 8), backend, CollectiveTable(fixture_table(gpu_counts=(2, 4))))


def test_moe_step_is_kernel_plus_collectives(backend, table):
    counts = np.array([40, 30, 20, 10, 10, 10, 5, 3])
    for layout in (Layout(4, 1), Layout(1, 4), Layout(2, 2)):
        p = StepPricer(MIXTRAL, layout, backend, table)
        _, total = p.moe_s(64, 0.0, counts)
        sh = moe_shard(MIXTRAL, layout, 64, 0.0, counts)
        want = p.price("fused_moe", sh.workload)[1]
        if layout.tp > 1:
            want += 2 * table.time_s("all_reduce", layout.tp, sh.all_reduce_bytes)
        if layout.ep > 1:
            want += 2 * table.time_s("all_to_all", layout.ep, sh.all_to_all_bytes)
        assert total == pytest.approx(want)
        rep = p.report()
        assert rep["step_parts_s"] == pytest.approx(total)
        assert 0.0 <= rep["estimated_share"] <= 1.0
    assert p.report()["ep_imbalance_mean"] == pytest.approx(100 / 64)  # TP2xEP2: ranks hold 100 and 28 slots


def test_replay_serves_every_request_and_books_every_second(backend, table):
    routing = ZipfRouting(8, 2, 0, exponent=1.2)
    for layout in (Layout(2, 1), Layout(1, 2)):
        r = serve(MIXTRAL, small_trace(), layout, backend=backend, table=table, routing=routing)
        assert r["finished"] == r["requests"] == 24
        assert 0 < r["estimated_share"] <= 1 and 0 < r["collective_share"] < 1
        parts = sum(r[f"{p}_s"] for p in ("prefill_attention", "decode_attention", "fused_moe", "all_reduce",
                                          "all_to_all"))
        assert parts == pytest.approx(r["step_parts_s"]) and parts < r["busy_s"]
    assert r["ep_imbalance_mean"] > 1.0  # EP2 under Zipf routing


def test_goodput_is_per_second_of_arrivals_not_of_the_drain():
    """Two deployments that serve every request within the SLO have the offered rate as goodput, however long the
    window's longest request takes to finish after the last arrival."""
    from types import SimpleNamespace

    arrivals = np.arange(100) * 0.1  # 10 req/s over 10 s
    def result(drain_s):
        finish = arrivals + 1.0
        finish[50] = 10.0 + drain_s  # one long request still decoding after the window
        return SimpleNamespace(arrival_s=arrivals, finish_s=finish, ttft_s=np.full(100, 0.1),
                               tpot_s=np.full(100, 0.02), generated_tokens=np.full(100, 50))
    fast, slow = goodput(result(1.0), 2.0, 0.1), goodput(result(30.0), 2.0, 0.1)
    assert fast["goodput_req_per_s"] == slow["goodput_req_per_s"] == pytest.approx(10.0)
    assert goodput(result(30.0), 2.0, 0.1, span_s=20.0)["goodput_req_per_s"] == pytest.approx(5.0)  # a known window
    assert goodput(result(30.0), 2.0, 0.01)["goodput_req_per_s"] == 0.0  # TPOT over the SLO: none good


def test_arrival_span_of_one_request_or_one_instant_runs_to_the_last_finish():
    from kernel_gym.parallel.step_time import arrival_span_s

    assert arrival_span_s([0.0, 1.0, 2.0, 3.0], [9.0] * 4) == pytest.approx(4.0)  # 4 requests at 1/s: 4 s
    assert arrival_span_s([5.0], [7.5]) == pytest.approx(2.5)
    assert arrival_span_s([5.0, 5.0], [6.0, 8.0]) == pytest.approx(3.0)
    assert arrival_span_s([5.0], [float("nan")]) == float("inf")  # nothing finished: no rate at all


def test_goodput_counts_requests_within_both_slos(backend, table):
    sim = ParallelSimulator(MIXTRAL, small_trace(), Layout(2, 1), StepPricer(MIXTRAL, Layout(2, 1), backend, table))
    res = sim.run()
    assert goodput(res, 1e9, 1e9)["slo_attainment"] == 1.0
    assert goodput(res, 0.0, 1e9)["goodput_req_per_s"] == 0.0
    g = goodput(res, float(np.median(res.ttft_s)), 1e9)
    assert 0.3 < g["slo_attainment"] < 0.7


def test_env_masks_steps_and_refusal(backend, tmp_path, monkeypatch):
    import gymnasium

    import kernel_gym  # noqa: F401  (registers the ids)
    from kernel_gym.envs.parallel_serving import ParallelServingEnv

    kw = dict(backend=backend, trace="bundled", window_s=5.0, warmup_s=2.0, context_s=10.0,
              routing=ZipfRouting(8, 2, 0, exponent=1.2))
    env = gymnasium.make("KernelGym/ServingTPEP-v0", gpus=2, table=fixture_table(), **kw).unwrapped
    assert [lay.name for lay in env.layouts] == ["TP2", "EP2"] and env.action_masks().all()
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    rewards = []
    for a in range(2):
        env.reset(options={"start_s": info["start_s"]})
        obs, reward, terminated, truncated, step_info = env.step(a)
        assert terminated and not truncated and np.isfinite(reward) and reward > 0
        assert step_info["layout"] == env.layouts[a].name and 0 <= step_info["estimated_share"] <= 1
        rewards.append(reward)
    with pytest.raises(ValueError, match="fits no layout"):
        ParallelServingEnv(model="deepseek-v3", gpus=2, table=fixture_table(), **kw)
    monkeypatch.setenv("KERNEL_GYM_COLLECTIVES", str(tmp_path / "absent.json"))
    monkeypatch.setattr("kernel_gym.parallel.collectives.PRIOR_TABLE", tmp_path / "no_prior.json")
    with pytest.raises(CollectivesMissing):
        ParallelServingEnv(gpus=2, **kw)
