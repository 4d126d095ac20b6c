"""The collectives prior (aiconfigurator's tables, labelled), deployments (masks, launch commands, config names), their
pricing (prior share, CUDA-graph knob, replicas) and KernelGym/ServingPlan-v0, on the recorded H200 data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kernel_gym.measure.coverage import cover
from kernel_gym.measure.recorded import RecordedBackend
from kernel_gym.models import load_model
from kernel_gym.parallel import collectives as coll
from kernel_gym.parallel.deploy import (
    Deployment,
    DeploymentPricer,
    engine_default,
    hand_picked,
    kv_tokens_per_rank,
    launch_commands,
    layout_choices,
    moe_config_files,
    why_invalid_deployment,
)
from kernel_gym.parallel.layout import Layout
from kernel_gym.parallel.step_time import ParallelSimulator, StepPricer
from kernel_gym.traffic.traces import Trace
from tests.parallel.fixture_table import fixture_table

MIXTRAL = load_model("mixtral-8x7b")


@pytest.fixture(scope="module")
def backend():
    return cover(RecordedBackend())


def small_trace(n: int = 30, rate: float = 6.0) -> Trace:
    rng = np.random.default_rng(1)
    return Trace("small", np.sort(rng.uniform(0, n / rate, n)), rng.integers(100, 1500, n), rng.integers(2, 60, n))


def test_prior_is_labelled_and_covers_the_engines_collectives():
    t = coll.load_prior()
    assert t.is_prior and t.prior["package"] == "aiconfigurator-core" and t.prior["package_version"] == "0.12.0"
    assert any("NVLink SHARP" in u for u in t.prior["unknown"]) and t.prior["files"]["nccl"]["sha256"]
    for op in ("all_reduce", "all_reduce_eager", "all_reduce_nccl", "all_to_all", "all_gather", "reduce_scatter"):
        for g in (2, 4, 8):
            assert t.has(op, g)
            small, large = t.time_s(op, g, 4096), t.time_s(op, g, 2 ** 27)
            assert 1e-6 < small < large < 0.1
    # the engines' custom all-reduce inside a CUDA graph beats NCCL on small messages and is slower eager
    assert t.time_s("all_reduce", 8, 65536) < t.time_s("all_reduce_nccl", 8, 65536) < \
        t.time_s("all_reduce_eager", 8, 65536)
    assert t.time_s("all_reduce", 8, 2 ** 26) == pytest.approx(t.time_s("all_reduce_nccl", 8, 2 ** 26))


def test_measured_table_replaces_the_prior(tmp_path, monkeypatch):
    data = fixture_table()
    data["backend"] = "nccl"  # as benchmarks/multigpu/run_collectives.py writes it on GPUs
    path = tmp_path / "collectives.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv(coll.TABLE_ENV, str(path))
    t = coll.resolve_table(None)
    assert not t.is_prior and t.source == str(path)
    monkeypatch.setenv(coll.TABLE_ENV, str(tmp_path / "absent.json"))
    assert coll.resolve_table(None).is_prior and coll.resolve_table("prior").is_prior
    unlabelled = dict(data, backend="nccl")
    (tmp_path / "p.json").write_text(json.dumps(unlabelled))
    with pytest.raises(coll.CollectivesError, match="no 'prior' label"):
        coll.load_prior(tmp_path / "p.json")
    extra = dict(data, results=data["results"] + [dict(data["results"][0], op="all_gather")])
    with pytest.raises(coll.CollectivesError, match="unknown op"):
        coll.CollectiveTable(extra)  # only a labelled prior may carry the extra ops


def test_masks_name_what_does_not_fit():
    mixed = Deployment("vllm", 1, 2, 4, 16, 8192, 256, 512)
    assert "SGLang" in why_invalid_deployment(MIXTRAL, mixed)
    assert why_invalid_deployment(MIXTRAL, Deployment("sglang", 1, 2, 4, 16, 8192, 256, 512)) == ""
    ds = load_model("deepseek-v3")
    assert "leave no KV cache" in why_invalid_deployment(ds, Deployment("vllm", 8, 1, 1, 16, 8192, 256, 512))
    # Mixtral on one GPU holds weights, but not a 1M-token request
    one = Deployment("vllm", 1, 1, 1, 16, 8192, 256, 512)
    assert why_invalid_deployment(MIXTRAL, one) == ""
    assert "KV tokens per rank" in why_invalid_deployment(MIXTRAL, one, max_model_len=1_000_000)
    assert len(layout_choices(8)) == 10 and all(r * lay.gpus == 8 for r, lay in layout_choices(8))


def test_defaults_and_launch_commands():
    d = engine_default(MIXTRAL, "vllm", 8)  # the default release, vLLM 0.34: 64-token blocks
    assert (d.replicas, d.tp, d.ep, d.block_size, d.max_batched_tokens, d.max_seqs, d.graph_max, d.version) == \
        (1, 8, 1, 64, 8192, 1024, 512, "0.34.0")
    assert engine_default(MIXTRAL, "vllm-0.33.0", 8).block_size == 16
    hp = hand_picked(MIXTRAL, "vllm==0.33.0", 8)
    assert hp["replicas"].replicas == 8 and hp["ep_all"].ep == 8
    (cmd,) = launch_commands(hp["ep_all"], "m")
    assert "--data-parallel-size 8 --enable-expert-parallel" in cmd and "--block-size 16" in cmd
    cmds = launch_commands(hp["replicas"], "m")
    assert len(cmds) == 8 and cmds[3].startswith("CUDA_VISIBLE_DEVICES=3 ") and "--port 8003" in cmds[3]
    (sg,) = launch_commands(Deployment("sglang", 1, 2, 4, 64, 4096, 128, 0), "m")
    assert "--tp 8 --ep 4 --dp 4 --enable-dp-attention" in sg and "--page-size 64" in sg
    assert "--chunked-prefill-size 4096" in sg and "--max-running-requests 128" in sg and "--disable-cuda-graph" in sg
    (f,) = moe_config_files(MIXTRAL, Deployment("sglang", 1, 2, 4, 16, 8192, 256, 512))
    assert f["file"] == "E=2,N=7168,device_name=NVIDIA_H200.json" and f["local_experts"] == 2


def test_each_release_sizes_its_kv_cache_by_its_own_rule():
    """vLLM 0.33 gives KV 0.92 of the GPU less weights and activations; 0.34 sizes it from the memory free after
    warm-up, less the activation peak and a margin of max(1 GiB, 0.75 x the peak): more KV for the same launch."""
    from kernel_gym.parallel.deploy import memory_utilization, reserve_bytes

    old, new = (Deployment("vllm", 1, 2, 1, 16, 8192, 256, 512, v) for v in ("0.33.0", "0.34.0"))
    assert (memory_utilization(old), memory_utilization(new)) == (0.92, 1.0)
    assert reserve_bytes(MIXTRAL, new) - reserve_bytes(MIXTRAL, old) >= 2 ** 30  # the margin
    assert kv_tokens_per_rank(MIXTRAL, new) > kv_tokens_per_rank(MIXTRAL, old)
    assert Deployment("vllm-0.33.0", 1, 2, 1, 16, 8192, 256, 512) == old  # a release string is split
    assert old.name.startswith("vllm-0.33.0:") and new.name.startswith("vllm-0.34.0:")  # names tell releases apart
    with pytest.raises(ValueError, match="--engine-version"):
        Deployment("vllm-0.20.0", 1, 2, 1, 16, 8192, 256, 512)


def test_coordinate_search_breaks_goodput_ties_by_headroom():
    """Goodput ties at the offered rate wherever every request meets the SLO; the plan's Score then prefers the
    deployment with the most room below the SLO, and an equal score never moves the search."""
    from kernel_gym.deploy.plan import Score
    from kernel_gym.parallel.deploy import coordinate_search

    start = engine_default(MIXTRAL, "vllm", 2)
    best, s, _ = coordinate_search(lambda d: Score(1.0, 0.5 if d.block_size == 128 else 0.1), MIXTRAL, "vllm", 2,
                                   start)
    assert best.block_size == 128 and s == Score(1.0, 0.5)
    assert coordinate_search(lambda d: Score(1.0, 0.1), MIXTRAL, "vllm", 2, start)[0] == start
    assert coordinate_search(lambda d: 1.0, MIXTRAL, "vllm", 2, start)[0] == start  # plain floats still work


def test_replicas_that_do_not_divide_the_requests_serve_no_more_than_offered(backend):
    """Replica 0 replays ceil(N / R) of N requests; scaling its goodput by R gave 4 x TP2 12 of 9 requests (goodput
    1.33x the offered rate, a ServingPlan-v0 reward above 1)."""
    trace = Trace("nine", np.arange(9.0), np.full(9, 200), np.full(9, 20))
    p = DeploymentPricer(MIXTRAL, backend, fixture_table())
    for dep in (Deployment("vllm", 4, 2, 1, 64, 8192, 256, 512), Deployment("vllm", 2, 4, 1, 64, 8192, 256, 512),
                Deployment("vllm", 1, 8, 1, 64, 8192, 256, 512)):
        r = p.serve(trace, dep, 1e9, 1e9, span_s=9.0)  # every request within these SLOs
        assert r["slo_attainment"] == 1.0 and r["goodput_req_per_s"] == pytest.approx(1.0), dep.name


def test_plan_score_headroom_reads_the_worse_of_ttft_and_tpot_and_skips_a_missing_tpot():
    from types import SimpleNamespace

    from kernel_gym.deploy.plan import INVALID, Score, score

    def env_with(ttft, tpot, why=""):
        out = {"goodput_req_per_s": 3.0, "ttft_p99_s": ttft, "tpot_p99_s": tpot}
        return SimpleNamespace(_why=lambda m, d, n: why, model=None, pricer=SimpleNamespace(max_model_len=1),
                               reset=lambda options: None, serve_deployment=lambda d: out, slo=(2.0, 0.1))

    assert score(env_with(1.0, 0.02), None, [0.0]) == Score(3.0, pytest.approx(0.5))  # TTFT at half its SLO
    assert score(env_with(0.2, 0.09), None, [0.0]).headroom == pytest.approx(0.1)  # TPOT is the worse
    assert score(env_with(1.0, float("nan")), None, [0.0]).headroom == pytest.approx(0.5)  # one-token outputs
    assert score(env_with(float("nan"), float("nan")), None, [0.0]).headroom == float("-inf")
    assert score(env_with(1.0, 0.02, why="too big"), None, [0.0]) == INVALID


def test_prior_share_and_the_cuda_graph_knob(backend, tmp_path, monkeypatch):
    monkeypatch.setenv(coll.TABLE_ENV, str(tmp_path / "absent.json"))
    trace = small_trace(16)
    busy = {}
    for mode_max in (512, 0):
        pricer = StepPricer(MIXTRAL, Layout(2, 1), backend)
        sim = ParallelSimulator(MIXTRAL, trace, Layout(2, 1), pricer, graph=("tokens", mode_max))
        busy[mode_max] = sim.run().summary["busy_s"]
        rep = pricer.report()
        assert 0 < rep["prior_share"] <= rep["collective_share"] + 1e-12
    assert busy[0] > busy[512]  # eager steps pay launches and the slower eager all-reduce
    with pytest.raises(ValueError, match="graph must be"):
        ParallelSimulator(MIXTRAL, trace, Layout(2, 1), StepPricer(MIXTRAL, Layout(2, 1), backend), graph=("x", 1))


def test_deployment_pricer_replicas_and_shares(backend):
    p = DeploymentPricer(MIXTRAL, backend, fixture_table())
    trace = small_trace(20)
    one = p.serve(trace, Deployment("vllm", 1, 2, 1, 16, 8192, 256, 512), 2.0, 0.1)
    two = p.serve(trace, Deployment("vllm", 2, 1, 1, 16, 8192, 256, 512), 2.0, 0.1)
    for r in (one, two):
        assert r["goodput_req_per_s"] > 0 and 0 <= r["slo_attainment"] <= 1
        assert 0 <= r["estimated_share"] <= 1 and r["prior_share"] == 0.0  # a fixture table is no prior
    assert one["collective_share"] > 0 and two["collective_share"] == 0
    long = Trace("long", np.array([0.0, 1.0]), np.array([40000, 100]), np.array([10, 10]))
    r = p.serve(long, Deployment("vllm", 1, 1, 1, 16, 8192, 256, 512), 2.0, 0.1)
    assert r["refused_too_long"] == 1 and r["slo_attainment"] <= 0.5


def test_serving_plan_env(backend):
    from kernel_gym.envs.parallel_serving import ServingPlanEnv

    env = ServingPlanEnv(backend=backend, model=MIXTRAL, trace="bundled", gpus=2, table=fixture_table(),
                         window_s=8.0, warmup_s=2.0, context_s=20.0, engine="vllm")
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs) and obs.shape == (8,)
    mask = env.action_masks()
    assert mask.shape == (int(sum(env.action_space.nvec)),) and mask[: len(env.choices)].all()
    dep = Deployment("vllm", 1, 2, 1, 32, 4096, 128, 256)
    a = env.action_of_deployment(dep)
    assert env.deployment_of(a) == dep
    _, reward, terminated, _, step = env.step(a)
    assert terminated and 0 < reward <= 1.0 + 1e-9 and step["deployment"]["tp"] == 2
    with pytest.raises(ValueError, match="outside MultiDiscrete"):
        env.step([99, 0, 0, 0, 0])
