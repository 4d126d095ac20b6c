"""The CPU commands on inputs the project never shipped: model specs outside the zoo (a TP that does not split the
heads, fp8 / fp32 experts), traces of other shapes (gzip-compressed, a single request, all at one instant, one-token
outputs, prompts beyond the engine's context limit). Each test failed before its fix."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math

import numpy as np
import pytest

from kernel_gym.models import ModelSpec
from kernel_gym.traffic.traces import Trace, TraceError, load_trace

# shapes of published or plausible MoE models that are not in the zoo
HEADS20 = ModelSpec(name="heads20", num_layers=4, hidden=2560, num_heads=20, num_kv_heads=4, head_dim=128,
                    num_experts=32, top_k=4, intermediate=1536)
KV12 = ModelSpec(name="kv12", num_layers=4, hidden=3072, num_heads=24, num_kv_heads=12, head_dim=128,
                 num_experts=16, top_k=2, intermediate=4096)
QWEN3_CODER = ModelSpec(name="qwen3-coder-480b-a35b", num_layers=62, hidden=6144, num_heads=96, num_kv_heads=8,
                        head_dim=128, num_experts=160, top_k=8, intermediate=2560)


# ---- tensor parallelism the engines refuse ----------------------------------------------------------------------

def test_shard_refuses_heads_that_do_not_split_and_names_the_degrees_that_work():
    from kernel_gym.zoo import shard, tp_problem

    with pytest.raises(ValueError, match=r"num_heads 20 is not a multiple of 8.*use tp in \[1, 2, 4\]"):
        shard(HEADS20, 8)
    # 12 KV heads over 8 GPUs: neither split nor replicated evenly (vLLM's QKVParallelLinear refuses it); was
    # accepted as one KV head per GPU
    with pytest.raises(ValueError, match="num_kv_heads 12 is neither a multiple nor a divisor of 8"):
        shard(KV12, 8)
    assert shard(KV12, 4).num_kv_heads == 3 and not tp_problem(QWEN3_CODER, 8)
    assert shard(QWEN3_CODER, 8).num_kv_heads == 1  # 8 KV heads over 8 GPUs


def test_layout_mask_gives_the_same_reason():
    from kernel_gym.parallel.layout import Layout, why_invalid

    why = why_invalid(KV12, Layout(8, 1), 8)
    assert "num_kv_heads 12" in why and "use tp in" in why


def test_engine_file_refused_for_a_tp_the_engine_cannot_launch():
    from kernel_gym.deploy import engine_export as ee

    with pytest.raises(ValueError, match="--tp 8: heads20 does not split tp=8 ways"):
        ee.shard_shape(HEADS20, tp=8)  # intermediate 1536 splits; the heads do not (the file was written before)
    assert ee.shard_shape(HEADS20, tp=4).n == 384


# ---- the expert dtype keys the engine file -----------------------------------------------------------------------

def test_engine_file_is_keyed_on_the_specs_dtype(tmp_path):
    from kernel_gym.deploy import engine_export as ee

    fp8 = dataclasses.replace(QWEN3_CODER, name="fp8-model", dtype_bytes=1)
    with pytest.raises(ValueError, match="dtype=fp8_w8a8"):  # was written as the bf16 file vLLM never reads for fp8
        ee.export(fp8, "vllm", tmp_path / "a", "NVIDIA H200", tp=8, force=True, rows=[])
    fp32 = dataclasses.replace(QWEN3_CODER, name="fp32-model", dtype_bytes=4)
    assert ee.shard_shape(fp32, 8).dtype == "float32"
    path, note = ee.export(fp32, "vllm", tmp_path / "b", "NVIDIA H200", tp=8, force=True, rows=[])
    assert path.name == "E=160,N=320,device_name=NVIDIA_H200,dtype=float32.json" and note["estimate"]
    path, _ = ee.export(QWEN3_CODER, "vllm", tmp_path / "c", "NVIDIA H200", tp=8, force=True, rows=[])
    assert path.name == "E=160,N=320,device_name=NVIDIA_H200.json"


# ---- traces ------------------------------------------------------------------------------------------------------

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2024-05-01 12:00:{i:02d}.0000000,{100 + i},{10 + i}\n" for i in range(20))


def test_gzip_traces_are_read(tmp_path):
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(AZURE.encode()))
    t = load_trace(tmp_path / "a.csv.gz")
    assert len(t) == 20 and t.name == "a" and t.prompt_tokens[3] == 103
    lines = "".join(json.dumps({"timestamp": 500 * i, "input_length": 600, "output_length": 5, "hash_ids": [1, i]})
                    + "\n" for i in range(4))
    (tmp_path / "m.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    m = load_trace(tmp_path / "m.jsonl.gz")
    assert len(m) == 4 and m.hash_ids[2] == (1, 2) and m.arrival_s[-1] == 1.5
    (tmp_path / "cut.csv.gz").write_bytes(gzip.compress(AZURE.encode())[:60])
    with pytest.raises(TraceError, match="damaged gzip file.*gzip -d"):
        load_trace(tmp_path / "cut.csv.gz")


def test_replay_load_line_for_a_trace_without_a_span():
    from kernel_gym.evaluate.replay import load_info

    one = Trace("one", np.zeros(1), np.array([500]), np.array([100]))
    info = load_info(one)
    assert info["offered_req_per_s"] is None and "1 request (the trace spans 0 s: no arrival rate" in info["load"]
    burst = Trace("burst", np.zeros(30), np.full(30, 200), np.full(30, 10))
    assert "30 requests, all at one instant" in load_info(burst)["load"]  # was "0.00 req/s, 0 output tok/s"
    assert load_info(Trace("t", np.array([0.0, 2.0]), np.array([1, 1]), np.array([4, 4])))["offered_req_per_s"] == 1


def test_replay_report_of_one_token_outputs_is_valid_json_with_na(tmp_path):
    from kernel_gym.evaluate import replay_report

    nan = float("nan")
    pol = {"tokens_per_s": 2.0, "tuned_kernel_s": 1.0, "tuning_gpu_s": 0.0, "ttft_p50_s": 0.1, "ttft_p99_s": 0.2,
           "tpot_p50_s": nan, "tpot_p99_s": nan}
    rep = {"trace": "t", "model": "m", "policies": {"default": dict(pol), "oracle": dict(pol)}}
    md = replay_report.markdown(rep)
    assert "nan" not in md and "n/a / n/a" in md and "TPOT needs a finished request with at least 2" in md
    safe = replay_report.json_safe(rep)
    text = json.dumps(safe, allow_nan=False)  # NaN is not JSON: strict parsers (jq, JSON.parse) rejected the file
    assert json.loads(text)["policies"]["default"]["tpot_p50_s"] is None
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in safe["policies"]["oracle"].values())
