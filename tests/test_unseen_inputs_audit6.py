"""Findings of a CLI sweep over 160 commands (session 67): inputs that passed unchecked, errors without their fix, and
a multi-replica plan whose token figures moved with the number of replicas."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_gym.deploy.plan import parse_slo, plan_deployment


@pytest.mark.parametrize("bad", ["ttft=nan,tpot=0.1", "ttft=2,tpot=inf", "ttft=NaN,tpot=nan"])
def test_an_slo_of_nan_or_inf_is_refused(bad):
    """`--slo ttft=nan,tpot=inf` planned every deployment at 0 req/s and wrote null SLOs, exit 0."""
    with pytest.raises(ValueError, match="finite seconds > 0"):
        parse_slo(bad)


def test_a_json_path_under_a_file_is_refused_before_the_work(tmp_path):
    """The folder check passed a path under a file, and the plan failed after its work with FileExistsError."""
    (tmp_path / "rows.csv").write_text("x\n")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        plan_deployment(model="mixtral-8x7b", gpus=1, trace="bundled", json_path=str(tmp_path / "rows.csv" / "p.json"),
                        train_steps=0, no_mlflow=True)


def test_routing_and_rate_errors_name_the_flag_and_the_fix(tmp_path):
    from kernel_gym.evaluate.replay import routing_profile, run_replay
    from kernel_gym.models import load_model

    with pytest.raises(ValueError, match=r"--routing 'zipf:abc': give numbers, e\.g\. zipf:1\.2"):
        routing_profile("zipf:abc", load_model("mixtral-8x7b"))
    with pytest.raises(ValueError, match="--rate-scale 0: give a positive number"):
        run_replay(trace="bundled", model="mixtral-8x7b", policies="default", window="0:5", rate_scale=0.0,
                   no_mlflow=True, json_path=tmp_path / "r.json")


def test_a_model_too_big_for_one_host_is_told_to_use_a_lighter_checkpoint():
    """deepseek-v3 (bf16, 1,373 GB) on 8 GPUs was told to "give more --gpus", which --gpus refuses above 8."""
    with pytest.raises(ValueError, match="a lighter checkpoint") as err:
        plan_deployment(model="deepseek-v3", gpus=8, trace="bundled", train_steps=0, no_mlflow=True)
    assert "give more --gpus" not in str(err.value)


def test_replicas_scale_a_windows_tokens_by_its_tokens_not_its_requests():
    """Scaling one replica's good tokens by the request ratio read 54.4, 65.6 and 72.9 good tokens/s at 1, 2 and 4
    replicas where every request of the window was served: a replica's share of heavy-tailed outputs is not 1 / R of
    the tokens. Served within the SLO, every replica count must read the window's own token rate."""
    from kernel_gym.parallel.deploy import Deployment, DeploymentPricer
    from kernel_gym.traffic.traces import Trace

    rng = np.random.default_rng(0)
    n = 48
    out = np.where(rng.random(n) < 0.1, 400, 10)  # heavy-tailed: a few long answers carry most tokens
    arrival = np.sort(rng.uniform(0, 60, n))
    trace = Trace("t", arrival, np.full(n, 64), out)
    from kernel_gym.models import load_model

    pricer = DeploymentPricer(load_model("olmoe-1b-7b"))
    want = float(out.sum()) / 60.0
    for replicas in (1, 2, 4):
        dep = Deployment("vllm", replicas, 1, 1, 16, 8192, 256, 512)
        got = pricer.serve(trace, dep, ttft_slo_s=60.0, tpot_slo_s=1.0, span_s=60.0)
        assert got["slo_attainment"] == 1.0
        assert got["goodput_tokens_per_s"] == pytest.approx(want, rel=1e-9), replicas


def test_the_context_limit_stays_within_the_models_own():
    """`--max-model-len 200000` for Qwen3-30B-A3B (max_position_embeddings 40960) gave launch commands vLLM refuses,
    and Mooncake plans told Mixtral (32,768) to pass --max-model-len 191386."""
    from kernel_gym.modelspec import spec_from_hf_config
    from kernel_gym.zoo import ZOO

    assert ZOO["qwen3-30b-a3b"].max_context == 40960 and ZOO["mixtral-8x7b"].max_context == 32768
    cfg = {"model_type": "mixtral", "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 2,
           "num_attention_heads": 8, "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
           "max_position_embeddings": 16384}
    assert spec_from_hf_config(cfg, "config.json", "m").max_context == 16384
    with pytest.raises(ValueError, match="serves at most 40960 tokens"):
        plan_deployment(model="qwen3-30b-a3b", gpus=1, trace="bundled", max_model_len=200000, train_steps=0,
                        no_mlflow=True)


def test_the_context_limit_follows_vllms_rope_scaling_rule():
    """vLLM 0.34 multiplies the length by a linear or dynamic RoPE factor, not by YaRN's (already counted)."""
    from kernel_gym.modelspec import hf_max_context

    assert hf_max_context({"max_position_embeddings": 32768}) == 32768
    assert hf_max_context({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}) == 16384
    assert hf_max_context({"max_position_embeddings": 40960,
                           "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}) == 40960
    assert hf_max_context({"max_position_embeddings": 8192, "max_seq_len": 4096}) == 4096  # the least of the keys
    assert hf_max_context({"hidden_size": 8}) == 0


def test_a_block_fp8_checkpoints_engine_file_carries_its_block_shape(tmp_path):
    """An fp8 checkpoint with weight blocks (DeepSeek-V3's [128, 128]) was told the per-tensor file name: vLLM and
    SGLang look for E=..,N=..,device_name=..,dtype=fp8_w8a8,block_shape=[128,128].json and never read it."""
    import json

    from kernel_gym.models import load_model
    from kernel_gym.parallel.deploy import Deployment, moe_config_files

    base = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
            "moe_intermediate_size": 768, "torch_dtype": "bfloat16"}
    quant = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "block.json").write_text(json.dumps({**base, "quantization_config": quant}))
    spec = load_model(str(tmp_path / "block.json"))
    assert (spec.dtype_bytes, spec.fp8_block_n, spec.fp8_block_k) == (1, 128, 128)
    vllm, sglang = (Deployment(e, 1, 8, 1, 16, 8192, 256, 512) for e in ("vllm", "sglang"))
    assert moe_config_files(spec, vllm)[0]["file"] == \
        "E=128,N=96,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert moe_config_files(spec, sglang)[0]["file"] == \
        "E=128,N=96,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"  # SGLang prints the list
    # per-tensor scales: no block part, as before
    (tmp_path / "tensor.json").write_text(json.dumps({**base, "quantization_config": {"quant_method": "fp8"}}))
    per_tensor = load_model(str(tmp_path / "tensor.json"))
    assert moe_config_files(per_tensor, vllm)[0]["file"] == "E=128,N=96,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    (tmp_path / "bad.json").write_text(json.dumps({**base, "quantization_config": {**quant,
                                                                                     "weight_block_size": [128]}}))
    with pytest.raises(ValueError, match="weight_block_size must be two positive integers"):
        load_model(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="set both with dtype_bytes 1"):
        type(spec)(**{**__import__("dataclasses").asdict(spec), "dtype_bytes": 2})
