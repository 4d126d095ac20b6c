"""`kernel-gym demo` end to end with tiny settings (one PPO rollout per kernel, a 30-request excerpt of the bundled
trace): it trains and registers the three policies, exports both formats and replays every policy; and it refuses
bad input before doing any work. About 50 s on one CPU core."""

from __future__ import annotations

import json

import mlflow
import pytest

from kernel_gym import demo
from kernel_gym.cli import demo as demo_cli
from kernel_gym.evaluate.replay import POLICY_NAMES
from kernel_gym.traffic.traces import bundled_trace_path
from tests.fakes.mlflow_store import fresh_store

REQUESTS = 30


def test_parser_defaults_are_the_embedded_main_job() -> None:
    args = demo_cli.build_parser().parse_args([])
    assert (args.trace, args.model, args.timesteps, args.seed) == ("bundled", "mixtral-8x7b", 30_000, 0)
    assert set(demo.KERNEL_ENVS) == {"fused_moe", "decode_attention", "prefill_attention"}


@pytest.mark.parametrize("argv,match", [(["--timesteps", "511"], "--timesteps must be >= 512"),
                                        (["--timesteps", "0"], "one PPO rollout")])
def test_bad_timesteps_are_refused_before_any_work(argv, match, tmp_path) -> None:
    out = tmp_path / "demo"
    with pytest.raises(ValueError, match=match):
        demo_cli.main([*argv, "--out", str(out)])
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_demo_trains_exports_and_replays_every_policy(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # checkpoints and anything else relative stay in tmp_path
    uri = fresh_store(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    lines = bundled_trace_path().read_text().splitlines()
    trace = tmp_path / "tiny.csv"
    trace.write_text("\n".join(lines[: REQUESTS + 1]) + "\n")
    out = tmp_path / "demo"

    assert demo.run_demo(timesteps=512, trace=str(trace), out=out) == 0
    assert "done: results in" in capsys.readouterr().out
    assert (out / "checkpoints").is_dir() and not (tmp_path / "out").exists()  # the run's files under --out only

    # 1. one held-out evaluation and one registered model per kernel family
    training = json.loads((out / "training.json").read_text())
    assert set(training) == set(demo.KERNEL_ENVS)
    for kernel, ev in training.items():
        assert ev["num_workloads"] > 0, kernel
        assert 0.0 < ev["geomean_policy"] <= 1.0 + 1e-9, kernel  # a ratio to the best measured config
        assert ev["geomean_policy"] > ev["geomean_default"], kernel  # even one rollout beats the untuned default
    registered = {m.name for m in mlflow.MlflowClient(tracking_uri=uri).search_registered_models()}
    for env_id in demo.KERNEL_ENVS.values():
        prefix = f"kernel-gym-{env_id.split('/')[-1].lower()}"  # e.g. kernel-gym-moe-v0[-<model>]
        assert any(n == prefix or n.startswith(prefix + "-") for n in registered), (prefix, registered)

    # 2. the exports: a dispatch table for all three kernels, vLLM's fused-MoE file for Mixtral on the H200
    table = json.loads((out / "dispatch" / "dispatch_table.json").read_text())
    assert table["format"] == "kernel-gym-dispatch/1"
    assert set(table["kernels"]) == set(demo.KERNEL_ENVS)
    vllm = json.loads((out / "vllm" / "E=8,N=14336,device_name=NVIDIA_H200.json").read_text())
    assert vllm and all(k.isdigit() and "BLOCK_SIZE_M" in v for k, v in vllm.items())

    # 3. the replay: every policy on the same 30 requests; the oracle's kernels are the fastest on the same traffic
    report = json.loads((out / "replay.json").read_text())
    assert report["requests"] == REQUESTS
    policies = report["policies"]
    assert set(policies) == set(POLICY_NAMES)
    best = policies["oracle"]["tuned_kernel_s_same_traffic"]
    for name, row in policies.items():
        assert row["tokens_per_s"] > 0, name
        assert row["tuned_kernel_s_same_traffic"] >= best * (1 - 1e-9), name
    assert policies["learned"]["tuning_gpu_s"] == 0.0
    assert policies["autotune"]["tuning_gpu_s"] > 0.0
