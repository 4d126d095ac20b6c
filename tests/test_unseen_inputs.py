"""The CPU commands on inputs the project never shipped: model specs outside the zoo (a TP that does not split the
heads, fp8 / fp32 experts), traces of other shapes (gzip-compressed, a single request, all at one instant, one-token
outputs, prompts beyond the engine's context limit). Each test failed before its fix."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from pathlib import Path

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


# ---- plan: the engine's context limit ----------------------------------------------------------------------------

def test_launch_commands_pass_the_context_limit_the_plan_assumed():
    from kernel_gym.parallel.deploy import MAX_MODEL_LEN, Deployment, launch_commands

    (v,) = launch_commands(Deployment("vllm", 1, 8, 1, 16, 8192, 256, 512), "m")
    assert f"--max-model-len {MAX_MODEL_LEN}" in v  # the engine otherwise takes the model's own (up to 256k)
    (s,) = launch_commands(Deployment("sglang", 1, 8, 1, 16, 8192, 256, 512), "m", max_model_len=131072)
    assert "--context-length 131072" in s


def test_plan_says_how_to_serve_prompts_beyond_the_context_limit(tmp_path, capsys):
    from kernel_gym.cli.plan import main

    rows = "".join(f"2024-05-01 12:00:{i:02d}.0000000,{40000 + i},3\n" for i in range(30))
    path = tmp_path / "long.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    assert main(["--model", "qwen3-30b-a3b", "--gpus", "1", "--trace", str(path), "--no-mlflow"]) == 2
    err = capsys.readouterr().err  # was: "no request of the window fits max_model_len 32768", no fix
    assert "longer than max_model_len 32768" in err and "--max-model-len 40032" in err  # within its 40,960
    assert main(["--model", "mixtral-8x7b", "--gpus", "1", "--trace", str(path), "--no-mlflow"]) == 2
    assert "mixtral-8x7b serves at most 32768 tokens" in capsys.readouterr().err  # no limit it could pass


def test_pricer_error_names_the_limit_to_raise(monkeypatch):
    import kernel_gym.parallel.deploy as deploy

    pricer = deploy.DeploymentPricer.__new__(deploy.DeploymentPricer)  # no backend: it refuses before pricing
    pricer.spec, pricer.max_model_len = QWEN3_CODER, 1000
    monkeypatch.setattr(deploy, "why_invalid_deployment", lambda *a, **k: "")
    trace = Trace("t", np.array([0.0, 1.0]), np.array([4000, 5000]), np.array([8, 8]))
    with pytest.raises(ValueError, match="none of the window's 2 requests fits.*--max-model-len 4008"):
        pricer.serve(trace, deploy.Deployment("vllm", 1, 8, 1, 16, 8192, 256, 512), 2.0, 0.1)


def _azure(path, times, prompt=300, output=20):
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2024-05-01 12:{int(t) // 60:02d}:{t % 60:09.6f}0,{prompt},{output}\n" for t in times))
    return path


def test_plan_names_the_window_that_fits_a_short_trace(tmp_path, capsys):
    from kernel_gym.cli.plan import main
    from kernel_gym.deploy.plan import largest_window

    assert largest_window(600.0, 1.0, 60.0) == 60.0 and largest_window(0.0, 1.0, 60.0) == 0.0
    w = largest_window(100.0, 1.0, 60.0)
    assert 10 < w < 60 and largest_window(100.0, 1.0, w) == w and largest_window(100.0, 1.0, w + 0.2) < w + 0.2
    path = _azure(tmp_path / "short.csv", [i * 2.0 for i in range(50)])  # 98 s
    assert main(["--model", "mixtral-8x7b", "--gpus", "1", "--trace", str(path), "--no-mlflow"]) == 2
    err = capsys.readouterr().err  # was: "... shorter than context + warm-up + window; use shorter windows"
    assert "spans 98 s" in err and f"pass --window-s {largest_window(98.0, 1.0, 60.0):g}" in err
    one = _azure(tmp_path / "one.csv", [0.0])
    assert main(["--model", "mixtral-8x7b", "--gpus", "1", "--trace", str(one), "--no-mlflow"]) == 2
    assert "has no time span" in capsys.readouterr().err


def test_plan_window_start_in_a_bursty_trace_takes_in_a_burst():
    from types import SimpleNamespace

    from kernel_gym.deploy.plan import window_starts

    # bursts every 20 s; the held-out part's start range [83.975, 84.1] lies in a gap, its window (with 3.975 s of
    # warm-up) reaches back to the burst at 80 s only from the range's first start (was: the middle one, no arrivals)
    arr = np.repeat(np.arange(0.0, 101.0, 20.0), 5)
    env = SimpleNamespace(_range=(83.975, 84.1), trace=Trace("b", arr, np.ones(30, int), np.ones(30, int)),
                          warmup_s=3.975, window_s=15.9, rate_scale=1.0, split="heldout")
    (s,) = window_starts(env, 1)
    assert s == pytest.approx(83.975)
    env.trace = Trace("gap", np.array([0.0, 200.0]), np.ones(2, int), np.ones(2, int))
    env._range = (100.0, 110.0)
    with pytest.raises(ValueError, match="no request in any window of its heldout part"):
        window_starts(env, 1)


# ---- cycle: a request log of a tensor-parallel deployment ---------------------------------------------------------

def test_cycle_replays_a_request_log_on_one_gpu_of_the_tp_deployment(tmp_path):
    from kernel_gym.deploy import cycle
    from kernel_gym.deploy import engine_export as ee

    spec = tmp_path / "qwen3-coder.json"
    spec.write_text(json.dumps(dataclasses.asdict(QWEN3_CODER)))
    ee.export(QWEN3_CODER, "vllm", tmp_path / "cur", "NVIDIA H200", tp=8, force=True, rows=[])
    log = _azure(tmp_path / "log.csv", [i * 0.5 for i in range(40)])
    # 957 GB of weights: the request log was replayed on one GPU holding the whole model, refused as "weights exceed
    # 0.9 x 151 GB ... use a larger GPU"; at TP 8 it is read, and the cycle stops only at the unmeasured shape
    with pytest.raises(ValueError, match="no recorded vllm_fused_moe times for E=160, N=320"):
        cycle.run_cycle(current=tmp_path / "cur", model=str(spec), engine="vllm", traffic=[log], tp=8,
                        no_mlflow=True, report_dir=tmp_path, rows=[])


def test_a_spec_file_names_its_tp_shard_as_a_zoo_name_does(tmp_path):
    from kernel_gym.models import load_model

    path = tmp_path / "coder.json"
    path.write_text(json.dumps(dataclasses.asdict(QWEN3_CODER)))
    shard = load_model(f"{path}@tp8")  # was "unknown model": `tune` (no --tp) could not tune a user's spec at TP 8
    assert (shard.name, shard.intermediate, shard.num_heads, shard.num_kv_heads) == \
        ("qwen3-coder-480b-a35b@tp8", 320, 12, 1)
    with pytest.raises(ValueError, match="PATH.json@tpN with N an integer"):
        load_model(f"{path}@tpx")
    bad = tmp_path / "h20.json"
    bad.write_text(json.dumps(dataclasses.asdict(HEADS20)))
    with pytest.raises(ValueError, match="does not split tp=8 ways"):
        load_model(f"{bad}@tp8")


def test_export_says_what_the_spec_states_that_the_tables_do_not_model(tmp_path, capsys):
    from kernel_gym.deploy.export import export_files
    from kernel_gym.models import spec_caveats

    mla = dataclasses.replace(QWEN3_CODER, name="mla-model", attention="mla", kv_lora_rank=512, rope_head_dim=64,
                              num_shared_experts=1, dtype_bytes=1)
    notes = spec_caveats(mla)
    assert len(notes) == 3 and "latent attention (MLA)" in notes[0] and "fp8" in notes[1] and "shared" in notes[2]
    assert spec_caveats(QWEN3_CODER) == []
    path = tmp_path / "mla.json"
    path.write_text(json.dumps(dataclasses.asdict(mla)))
    try:  # the note comes first, whatever the policies' answer (no MLflow policy here): was silent
        export_files(out=tmp_path / "o", fmt="dispatch", model=str(path), tp=8, policy_dir=tmp_path / "none")
    except (ValueError, FileNotFoundError, OSError):
        pass
    assert "note: mla-model@tp8 uses latent attention (MLA)" in capsys.readouterr().err


def test_dispatcher_hot_path_on_a_table_without_a_kernel_says_what_to_run():
    from kernel_gym.dispatch.dispatcher import Dispatcher, DispatchTable

    disp = Dispatcher(DispatchTable(kernels={}, meta={"rests_on": {"prefill_attention": {
        "basis": "absent", "why": "no prefill_attention policy was exported"}}}))
    # export says the deployment runs the family's default there; prefill_config raised a bare KeyError
    with pytest.raises(KeyError, match="no prefill_attention policy was exported.*family's default config"):
        disp.prefill_config([100])
    with pytest.raises(ValueError, match="non-empty"):
        disp.prefill_config([])


def test_plan_names_the_config_file_the_engine_reads_for_the_specs_dtype():
    from kernel_gym.parallel.deploy import Deployment, moe_config_files

    dep = Deployment("vllm", 1, 8, 1, 16, 8192, 256, 512)
    (f,) = moe_config_files(dataclasses.replace(QWEN3_CODER, dtype_bytes=1), dep)
    assert f["file"] == "E=160,N=320,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"  # was the bf16 file's name
    (f,) = moe_config_files(QWEN3_CODER, dep, device="NVIDIA H200 NVL")
    assert f["file"] == "E=160,N=320,device_name=NVIDIA_H200.json"  # vLLM's name for the NVL part, as export's
    from kernel_gym.deploy.plan import kernel_configs

    # how to write it: export for bf16 (a spec file by its path), vLLM's own tuner for fp8, which export refuses
    (f,) = kernel_configs(dataclasses.replace(QWEN3_CODER, dtype_bytes=1), dep, {})
    assert "benchmark_moe.py" in f["write_with"] and "--dtype fp8_w8a8" in f["write_with"]
    (f,) = kernel_configs(QWEN3_CODER, dep, {})
    assert f["write_with"].startswith("kernel-gym export --format vllm --engine-version 0.34.0 --model SPEC.json "
                                      "--tp 8")


def test_replay_errors_say_where_the_data_or_the_trace_ends():
    from kernel_gym.evaluate.replay import untimeable
    from kernel_gym.kernels.workloads import DecodeWorkload

    t = Trace("t", np.array([0.0, 55.3]), np.array([10, 10]), np.array([5, 5]))
    with pytest.raises(ValueError, match=r"arrive in \[0, 55.3\] s; choose a window"):  # was: no span, no fix
        t.window(1000, 2000)
    # a measured model at a decode shape the data does not bracket was told to "collect measurements for this model
    # first", as if it had none
    why = untimeable("decode_attention", DecodeWorkload(16, 16, 128, 54, 19484, "bfloat16"), None)
    assert "batch / context length beyond the measured ones" in why and "--rate-scale" in why


def test_cycle_reads_gzip_scrapes_and_names_a_folder_of_request_logs(tmp_path):
    import os

    from kernel_gym.models import load_model
    from kernel_gym.traffic import metrics
    from tests.traffic.test_metrics import ZERO14, vllm_scrape

    mixtral = load_model("mixtral-8x7b")
    d = tmp_path / "scrapes"
    d.mkdir()
    steps = [5, 0, 0, 40, 0, 0, 0, 0, 30, 0, 0, 0, 0, 0]
    for name, text, t in (("t0.prom.gz", vllm_scrape([5, 0, 0, 10] + [0] * 10, ZERO14, ZERO14), 1000.0),
                          ("t1.prom.gz", vllm_scrape(steps, ZERO14, ZERO14), 1600.0)):
        (d / name).write_bytes(gzip.compress(text.replace("\n", "\r\n").encode()))
        os.utime(d / name, (t, t))
    prof = metrics.read_traffic([d], mixtral, "vllm")  # was "folder mixes ['trace']"
    assert prof.steps == pytest.approx(60.0) and prof.span_s == pytest.approx(600.0)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.csv").write_text(AZURE)
    with pytest.raises(metrics.MetricsError, match="not Prometheus scrapes.*pass one request log file"):
        metrics.read_traffic([logs], mixtral, "vllm")


def test_engine_file_degree_below_one_is_named_as_such():
    from kernel_gym.deploy import engine_export as ee

    for kw, flag in (({"tp": 0}, "--tp 0"), ({"ep": 0}, "--ep 0"), ({"ep": -2}, "--ep -2")):
        with pytest.raises(ValueError, match=f"{flag}: a parallel degree is an integer >= 1"):
            ee.shard_shape(QWEN3_CODER, **kw)  # was "must split evenly over 0 GPUs"


def test_plan_sums_up_overloaded_replays_in_its_own_flags(tmp_path, capsys):
    from kernel_gym.cli.plan import main

    path = _azure(tmp_path / "heavy.csv", [i * 0.25 for i in range(480)], prompt=3000, output=400)  # 4 req/s
    rc = main(["--model", "mixtral-8x7b", "--gpus", "1", "--trace", str(path), "--window-s", "15", "--train-steps",
               "0", "--refine-rounds", "0", "--next", "0", "--no-mlflow"])
    err = capsys.readouterr().err
    assert rc == 0, err
    # was one Python warning per replay (file:line, source line), advising replay's --window, which plan lacks
    assert "OverloadWarning" not in err and "of the replays were overloaded" in err and "--rate-scale" in err


def test_a_nan_lookup_is_refused_not_answered_from_the_last_bucket():
    """Dispatcher.moe_config(m, nan) used to return the largest bucket's config (bisect puts NaN past every edge);
    a lookup now names the axis."""
    from kernel_gym.dispatch.dispatcher import Dispatcher

    d = Dispatcher.load(Path(__file__).resolve().parents[1] / "benchmarks" / "live_replay" / "inputs"
                        / "dispatch_table.json")
    with pytest.raises(ValueError, match="skew=nan is not a number"):
        d.moe_config(64, float("nan"))
    with pytest.raises(ValueError, match="is not a number"):
        d.decode_config(float("nan"), 1024)


# ---- a new user's path: a model the data never measured, their own trace and config.json (session 61) ----------

def test_replay_and_demo_stop_at_once_for_an_unmeasured_model_and_name_commands_that_work(tmp_path):
    """A model outside the data was told to run `tune`, which cannot measure prefill, and only after the baselines
    (or mid-replay, as a LookupError suggesting a lighter load)."""
    from kernel_gym.demo import run_demo
    from kernel_gym.evaluate.replay import run_replay

    spec = tmp_path / "coder.json"
    spec.write_text(json.dumps(dataclasses.asdict(QWEN3_CODER)))
    for policies in ("default,oracle", "default,static,vllm-table,oracle"):
        with pytest.raises(ValueError, match="no measurement of prefill_attention, decode_attention, fused_moe") as e:
            run_replay(json_path=tmp_path / "r.json", model=f"{spec}@tp8", policies=policies, no_mlflow=True)
        msg = str(e.value)
        assert "kernel-gym tune --model SPEC --kernels decode_attention,fused_moe" in msg
        assert "kernel-gym collect --model SPEC --kernels prefill_attention" in msg and "--backend STORE" in msg
        assert "kernel-gym plan" in msg
    with pytest.raises(ValueError, match="the demo reads the packaged data only"):
        run_demo(out=tmp_path / "demo", model=f"{spec}@tp8", timesteps=512)
    assert not (tmp_path / "demo").exists()  # refused before anything was written


def test_engine_file_of_a_shard_spec_refuses_a_second_tp():
    """`export --format vllm --model X@tp8 --tp 2` wrote N = intermediate / 16: right for neither degree."""
    from kernel_gym.deploy.engine_export import shard_shape
    from kernel_gym.zoo import shard

    with pytest.raises(ValueError, match="already names a shard and --tp 2 another"):
        shard_shape(shard(QWEN3_CODER, 8), tp=2)
    assert shard_shape(shard(QWEN3_CODER, 8)).n == 320 == shard_shape(QWEN3_CODER, tp=8).n


def test_a_request_csv_of_ones_own_loads_and_a_missing_column_is_named(tmp_path):
    from kernel_gym.traffic.traces import detect_format

    log = tmp_path / "requests.csv"
    log.write_text("arrival_s,prompt_tokens,output_tokens,user\n0.5,100,20,a\n1.25,300,40,b\n")
    t = load_trace(log)
    assert detect_format(log) == "plain" and list(t.prompt_tokens) == [100, 300] and t.duration_s == 0.75
    bad = tmp_path / "burst.csv"
    bad.write_text("Timestamp,Request tokens\n0.5,100\n")  # was: "matches no known trace format"
    with pytest.raises(TraceError, match=r"looks like a BurstGPT CSV but lacks \['Response tokens'\]"):
        load_trace(bad)


def test_a_mooncake_trace_with_seconds_for_milliseconds_is_warned_about(tmp_path):
    """Seconds in Mooncake's millisecond field replayed 1,000 times too fast with only an overload warning."""
    from kernel_gym.traffic.traces import TraceWarning

    secs, ms = tmp_path / "secs.jsonl", tmp_path / "ms.jsonl"
    secs.write_text("".join(json.dumps({"timestamp": i * 0.5, "input_length": 100, "output_length": 10}) + "\n"
                            for i in range(40)))
    ms.write_text("".join(json.dumps({"timestamp": i * 500, "input_length": 100, "output_length": 10}) + "\n"
                          for i in range(40)))
    with pytest.warns(TraceWarning, match="Mooncake timestamps are milliseconds; if yours are seconds"):
        load_trace(secs)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        assert load_trace(ms).duration_s == pytest.approx(19.5)  # 2 requests/s: no warning


def test_a_hugging_face_config_json_is_read_as_a_spec(tmp_path):
    """A config.json was refused with two lists of field names."""
    from kernel_gym.models import load_model

    qwen3 = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
             "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
             "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "intermediate_size": 6144,
             "torch_dtype": "bfloat16", "vocab_size": 151936}
    folder = tmp_path / "Qwen3-30B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(qwen3))
    spec = load_model(str(folder / "config.json"))
    assert (spec.name, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.num_experts, spec.top_k,
            spec.intermediate, spec.num_shared_experts) == ("Qwen3-30B-A3B", 48, 32, 4, 128, 8, 768, 0)
    assert load_model(f"{folder / 'config.json'}@tp8").intermediate == 96
    deepseek = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
                "num_key_value_heads": 128, "n_routed_experts": 256, "num_experts_per_tok": 8,
                "moe_intermediate_size": 2048, "intermediate_size": 18432, "n_shared_experts": 1, "kv_lora_rank": 512,
                "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "torch_dtype": "bfloat16"}
    (tmp_path / "ds.json").write_text(json.dumps(deepseek))
    ds = load_model(str(tmp_path / "ds.json"))
    assert (ds.name, ds.attention, ds.kv_lora_rank, ds.rope_head_dim, ds.head_dim, ds.num_experts,
            ds.num_shared_experts, ds.shared_intermediate) == ("ds", "mla", 512, 64, 128, 256, 1, 2048)
    ling = {**qwen3, "num_shared_experts": 2}  # Bailing-style key (session 62)
    (tmp_path / "ling.json").write_text(json.dumps(ling))
    assert load_model(str(tmp_path / "ling.json")).num_shared_experts == 2
    dense = {k: v for k, v in qwen3.items() if k not in ("num_experts", "num_experts_per_tok")}
    (tmp_path / "dense.json").write_text(json.dumps(dense))
    with pytest.raises(ValueError, match="not a mixture-of-experts model"):
        load_model(str(tmp_path / "dense.json"))


def test_a_file_tracking_store_is_refused_before_the_work_when_mlflow_refuses_it(monkeypatch):
    """file:PATH was refused as an unknown scheme while the message listed "file"; file:///PATH passed the check and
    MLflow 3.17 refused it after the whole command had run."""
    from kernel_gym.train import tracking

    monkeypatch.setattr(tracking, "file_store_refused", lambda: "maintenance mode")
    for uri in ("file:/tmp/mlruns", "file:///tmp/mlruns", "/tmp/mlruns"):
        with pytest.raises(ValueError, match="a file store, which MLflow .* refuses .*sqlite:///PATH/mlflow.db"):
            tracking.check_tracking_uri(uri)
    monkeypatch.setattr(tracking, "file_store_refused", lambda: "")
    tracking.check_tracking_uri("file:/tmp/mlruns")  # an MLflow that keeps the file store
    with pytest.raises(ValueError, match="use sqlite:///PATH/mlflow.db, http"):
        tracking.check_tracking_uri("ftp://host/x")


def test_replay_without_a_policy_names_replays_own_flags(tmp_path, monkeypatch):
    """Replay suggested `--policy-dir`, an export flag replay refuses."""
    from kernel_gym.deploy import export
    from kernel_gym.evaluate.replay import learned_policy
    from kernel_gym.models import load_model

    monkeypatch.setattr(export, "latest_model_uris", lambda name: {})
    monkeypatch.setattr(export, "registered_policy_names", lambda: [])
    with pytest.raises(export.NoPolicyError) as e:
        learned_policy(load_model("mixtral-8x7b"))
    assert "--policy-dir benchmarks/generalisation/policies --out DIR`) and pass --table DIR/dispatch_table.json" \
        in str(e.value)
    assert "or pass `--policy-dir" in export.no_policy_message("m")  # export's own wording is kept


def test_demo_checks_its_replay_inputs_before_training(tmp_path):
    """A wrong --trace failed after training had registered new policy versions and overwritten the exports."""
    from kernel_gym.demo import run_demo

    with pytest.raises(FileNotFoundError, match="neither a known name"):
        run_demo(out=tmp_path / "demo", trace=str(tmp_path / "nosuch.csv"), timesteps=512)
    with pytest.raises(ValueError, match="--routing 'zipfx'"):
        run_demo(out=tmp_path / "demo", routing="zipfx", timesteps=512)
    assert not (tmp_path / "demo").exists()


def test_train_refuses_to_overwrite_another_runs_checkpoint(tmp_path, capsys):
    from kernel_gym.cli import main

    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    (ckpt / "latest.zip").write_bytes(b"another run")
    assert main(["train", "--checkpoint-dir", str(ckpt), "--total-timesteps", "512"]) != 0
    assert "holds another run's checkpoint" in capsys.readouterr().err
    assert (ckpt / "latest.zip").read_bytes() == b"another run"


def test_plan_refuses_a_json_directory_before_the_work(tmp_path, capsys):
    from kernel_gym.cli.plan import main

    assert main(["--model", "mixtral-8x7b", "--gpus", "8", "--trace", "bundled", "--json", str(tmp_path),
                 "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert "a directory; pass a file name" in err and "[plan] mixtral" not in err  # nothing ran


def test_small_flags_say_what_they_mean(tmp_path, monkeypatch):
    """A bare --routing zipf meant exponent 1.0 where the default is 1.2; ui had no --tracking-uri its errors named;
    the shipped policies' path was relative to the repository, wrong from any other folder."""
    from kernel_gym.cli.ui import build_parser
    from kernel_gym.deploy.export import shipped_policy_dir
    from kernel_gym.evaluate.replay import routing_profile
    from kernel_gym.models import load_model

    assert routing_profile("zipf", load_model("mixtral-8x7b")).exponent == 1.2
    assert build_parser().parse_args(["--tracking-uri", "sqlite:///x.db"]).tracking_uri == "sqlite:///x.db"
    monkeypatch.chdir(tmp_path)
    path = Path(shipped_policy_dir())
    assert path.is_absolute() and (path / "fused_moe.json").exists()


def test_export_says_when_it_replaces_another_models_table(tmp_path, capsys):
    from kernel_gym.deploy.export import TABLE_FILE, replaced_model_note

    (tmp_path / TABLE_FILE).write_text(json.dumps({"model": {"name": "mixtral-8x7b"}}))
    replaced_model_note(tmp_path / TABLE_FILE, "mixtral-8x7b")
    assert capsys.readouterr().err == ""  # the same model's table again: nothing to say
    replaced_model_note(tmp_path / TABLE_FILE, "olmoe-1b-7b")
    assert "the table of another model (mixtral-8x7b)" in capsys.readouterr().err


# ---- session 62: an audit of plan / export / cycle with models the project does not ship --------------------------

def test_a_config_json_with_a_string_where_a_number_goes_names_the_field(tmp_path):
    """'"hidden_size": "4096"' failed with "TypeError: unsupported operand type(s) for //", naming neither file nor
    field."""
    from kernel_gym.models import load_model

    cfg = {"model_type": "mixtral", "hidden_size": "4096", "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 14336}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config.json: hidden_size must be an integer, got '4096'"):
        load_model(str(tmp_path / "config.json"))
    cfg.update(hidden_size=4096, num_experts_per_tok=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="num_experts_per_tok must be an integer"):
        load_model(str(tmp_path / "config.json"))


def test_a_config_jsons_quantization_is_read_or_said_to_be_ignored(tmp_path):
    """quantization_config was ignored: a block-fp8 checkpoint (DeepSeek-V3, Kimi-K2) was sized as bf16, and an
    mxfp4 one (gpt-oss) too, without a word."""
    import warnings

    from kernel_gym.deploy.engine_export import shard_shape
    from kernel_gym.models import load_model
    from kernel_gym.modelspec import SpecWarning

    base = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
            "moe_intermediate_size": 768, "torch_dtype": "bfloat16"}
    fp8 = {**base, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (tmp_path / "fp8.json").write_text(json.dumps(fp8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecWarning)
        spec = load_model(str(tmp_path / "fp8.json"))
    assert spec.dtype_bytes == 1
    bf16 = load_model(str(tmp_path / "fp8.json")).__class__(**{**dataclasses.asdict(spec), "dtype_bytes": 2,
                                                                "fp8_block_n": 0, "fp8_block_k": 0})
    assert spec.kv_bytes_per_token == bf16.kv_bytes_per_token  # KV and activations stay bf16 (review, session 62)
    assert 2 * spec.weight_bytes == bf16.weight_bytes
    with pytest.raises(ValueError, match="dtype=fp8_w8a8"):  # the engine file it would need is not bf16's
        shard_shape(spec, 8)
    (tmp_path / "mxfp4.json").write_text(json.dumps({**base, "quantization_config": {"quant_method": "mxfp4"}}))
    with pytest.warns(SpecWarning, match="'mxfp4' is not modelled"):
        assert load_model(str(tmp_path / "mxfp4.json")).dtype_bytes == 2
    (tmp_path / "plain.json").write_text(json.dumps(base))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecWarning)
        assert load_model(str(tmp_path / "plain.json")).dtype_bytes == 2


def test_an_engine_export_keeps_a_file_it_did_not_write_and_refuses_vllm_tp_with_ep(tmp_path, capsys):
    """A hand-tuned E=..,N=.. file in --out was replaced without a word; --tp 2 --ep 4 wrote E=2,N=7168 for vLLM,
    which slices experts over TP or places them whole over EP, never both."""
    from kernel_gym.deploy.engine_export import SIDECAR, export_and_print

    mine = tmp_path / "E=8,N=7168,device_name=NVIDIA_H200.json"
    mine.write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16}}))
    assert export_and_print(model="mixtral-8x7b", fmt="vllm", out=tmp_path, tp=2, force=True) == 0
    assert "kept as E=8,N=7168,device_name=NVIDIA_H200.json.bak" in capsys.readouterr().err
    assert json.loads((tmp_path / (mine.name + ".bak")).read_text()) == {"1": {"BLOCK_SIZE_M": 16}}
    assert mine.name in json.loads((tmp_path / SIDECAR).read_text())["files"]
    export_and_print(model="mixtral-8x7b", fmt="vllm", out=tmp_path, tp=2, force=True)  # its own file: no backup
    assert not (tmp_path / (mine.name + ".bak.1")).exists()
    with pytest.raises(ValueError, match="never both; pass one of --tp and --ep"):
        export_and_print(model="mixtral-8x7b", fmt="vllm", out=tmp_path / "mixed", tp=2, ep=4, force=True)


def test_train_reads_ones_own_store_and_an_unmeasured_model_names_the_commands(tmp_path):
    """`train --backend STORE` was refused ("unknown backend"), so the measure-then-train fix export and replay name
    could not be completed; a model without rows failed with "cannot build a catalogue (check the backend)"; and
    --no-register-model failed at the end, tagging MLflow 3's unregistered models:/m-<id> as a registered version."""
    from kernel_gym.cli.train import build_parser, train_args
    from kernel_gym.kernels.workloads import model_workloads
    from kernel_gym.measure import resolve_backend
    from kernel_gym.measure.store import PACKAGED_SNAPSHOT, MeasurementStore, iter_snapshot
    from kernel_gym.models import load_model
    from kernel_gym.train.train import prepare_data, train
    from tests.fakes.mlflow_store import fresh_store

    keys = {w.key() for w in model_workloads("decode_attention", load_model("olmoe-1b-7b"))}
    store = tmp_path / "mine.sqlite"
    with MeasurementStore(store) as db:
        for ctx, rows in iter_snapshot(PACKAGED_SNAPSHOT):
            db.put_many(ctx, [m for m in rows if m.kernel == "decode_attention" and m.workload in keys])
    args = train_args(build_parser().parse_args([
        "--env-id", "KernelGym/DecodeAttention-v0", "--model", "olmoe-1b-7b", "--backend", str(store),
        "--total-timesteps", "128", "--n-envs", "2", "--eval-freq", "0", "--checkpoint-freq", "0",
        "--checkpoint-dir", str(tmp_path / "ck"), "--tracking-uri", fresh_store(tmp_path), "--no-register-model",
        "--no-progress-bar"]))
    res = train(args)
    assert res.num_timesteps >= 128 and res.evaluation is not None
    with pytest.raises(ValueError, match=r"no fused_moe measurement of any of olmoe-1b-7b's .* --backend STORE"):
        prepare_data("fused_moe", resolve_backend(str(store)), "olmoe-1b-7b")
    with pytest.raises(ValueError, match="neither a backend .* nor an existing store file"):
        train(dataclasses.replace(args, backend=str(tmp_path / "missing.sqlite")))


def test_small_refusals_from_the_docs_audit(tmp_path, monkeypatch):
    """export --min-gain -1 was accepted (and hid a candidate); bench without a GPU left an empty benchmarks/ folder;
    Dispatcher.precompile("cuda") without CUDA raised torch's bare AssertionError."""
    import torch

    from kernel_gym.bench import bench_and_write
    from kernel_gym.deploy.engine_export import export_and_print
    from kernel_gym.dispatch.dispatcher import Dispatcher, DispatchTable

    with pytest.raises(ValueError, match="--min-gain -1: give the share"):
        export_and_print(model="mixtral-8x7b", fmt="vllm", out=tmp_path / "v", tp=2, min_gain=-1)
    assert not (tmp_path / "v").exists()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "b" / "h200_kernels.json"
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        bench_and_write(out=out, md=None, kernels=["fused_moe"], configs=1, recorded=0, budget_s=1)
    assert not out.parent.exists()
    monkeypatch.setattr(Dispatcher, "precompiled", property(lambda self: {("fused_moe", None)}))
    with pytest.raises(RuntimeError, match="no CUDA device here"):
        Dispatcher(DispatchTable(kernels={}, meta={})).precompile("cuda")


def test_a_skew_beyond_the_measured_ones_is_said_and_nan_refused(tmp_path, capsys):
    """zipf:2, 3, 5 and 100 replayed exactly like zipf:1.2 without a word, and zipf:nan like uniform; DeepSeek-V3's
    attention was tuned as GQA without a caveat (audit 3, session 62)."""
    from kernel_gym.evaluate.replay import routing_profile, run_replay
    from kernel_gym.models import load_model, spec_caveats

    mixtral = load_model("mixtral-8x7b")
    for bad in ("zipf:nan", "drift:inf", "zipf:NaN"):
        with pytest.raises(ValueError, match="give finite numbers"):
            routing_profile(bad, mixtral)
    with pytest.raises(ValueError, match="a dwell of at least the 10 s transition"):
        routing_profile("drift:1.2:0.001", mixtral)
    run_replay(trace="bundled", model="mixtral-8x7b", policies="default", window="0:5", routing="zipf:3",
               no_mlflow=True, json_path=tmp_path / "r.json")
    assert "routing skew 3 is beyond the largest measured (1.2)" in capsys.readouterr().err
    assert any("zoo.NO_DECODE" in line for line in spec_caveats(load_model("deepseek-v3@tp8")))
    assert not any("NO_DECODE" in line for line in spec_caveats(mixtral))


def test_the_clis_own_warnings_print_as_one_line(monkeypatch):
    """OverloadWarning printed Python's file path and a `return self.result()` source line."""
    import warnings

    from kernel_gym.cli import quiet_known_warnings
    from kernel_gym.traffic.traces import TraceWarning

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    quiet_known_warnings()
    assert warnings.formatwarning("too fast", TraceWarning, "/x/traces.py", 3, "src") == \
        "warning (TraceWarning): too fast\n"
    assert "/x/y.py:3" in warnings.formatwarning("other", UserWarning, "/x/y.py", 3, "src")
    installed = warnings.formatwarning
    quiet_known_warnings()
    assert warnings.formatwarning is installed  # not wrapped again on every command


def test_mlflows_type_hint_warning_is_not_printed_under_its_own_once_filter(monkeypatch):
    """MLflow warns (in colour) that the policy model's predict has no type hints, under a simplefilter("once") it
    puts in front of every filter: the CLI's ignore filter never applied, and demo / train printed it each time a
    policy was logged."""
    import warnings

    from kernel_gym.cli import quiet_known_warnings

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    quiet_known_warnings()
    hint = "\x1b[33mAdd type hints to the `predict` method to enable data validation\x1b[0m"
    assert warnings.formatwarning(hint, UserWarning, "/m/data_validation.py", 187, "color_warning(") == ""
    assert "something else" in warnings.formatwarning("something else", UserWarning, "/x/y.py", 3, "src")


def test_replay_and_plan_price_from_stored_rows_only(tmp_path):
    """plan (store_backend), replay (its own make_backend call) and train (resolve_backend) answered --backend three
    ways: replay --backend live built a recorded backend over a file named "live". Both now go through
    measure.recorded_backend, which refuses the live and interpreter backends and a missing store by name."""
    from kernel_gym.deploy.plan import plan_deployment
    from kernel_gym.evaluate.replay import run_replay
    from kernel_gym.measure import recorded_backend
    from kernel_gym.measure.recorded import RecordedBackend

    for name in ("live", "interpreter"):
        with pytest.raises(ValueError, match=f"--backend {name}: replay and plan price from measured rows"):
            recorded_backend(name)
    with pytest.raises(ValueError, match="no such store file"):
        recorded_backend(tmp_path / "missing.sqlite")
    assert isinstance(recorded_backend("recorded"), RecordedBackend)
    with pytest.raises(ValueError, match="--backend live: replay and plan"):
        plan_deployment(model="olmoe-1b-7b", gpus=1, trace="bundled", backend="live", no_mlflow=True)
    with pytest.raises(ValueError, match="no such store file"):
        run_replay(json_path=tmp_path / "r.json", model="olmoe-1b-7b", policies="default", no_mlflow=True,
                   backend=str(tmp_path / "missing.sqlite"))
    assert not (tmp_path / "r.json").exists()


def test_replay_names_the_trace_origin_and_requests_over_the_context_limit(tmp_path, capsys):
    """Audit 3: a negative --window start was taken silently (every trace is re-based to start at 0), and requests
    longer than the engine's context limit replayed without a word."""
    from kernel_gym.evaluate.replay import run_replay

    trace = tmp_path / "mine.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n1000.0,40000,10\n1000.5,500,20\n1001.0,600,30\n")
    with pytest.raises(ValueError, match=r"seconds from the trace's first request .* span 0 to 1 s"):
        run_replay(json_path=tmp_path / "r.json", trace=str(trace), model="olmoe-1b-7b", policies="default",
                   window="-100:5", no_mlflow=True)
    with pytest.raises(ValueError, match="0 <= START < END"):
        run_replay(json_path=tmp_path / "r.json", trace=str(trace), model="olmoe-1b-7b", policies="default",
                   window="5:2", no_mlflow=True)
    run_replay(json_path=tmp_path / "r.json", trace=str(trace), model="olmoe-1b-7b", policies="default",
               no_mlflow=True)
    assert "1 of the 3 requests are longer than 32,768 tokens" in capsys.readouterr().err


def test_tune_names_every_missing_policy_before_its_plan(tmp_path, monkeypatch, capsys):
    """The README's path trains the MoE policy only; tune then printed coverage and ranked round 1 for 24 s before
    refusing for want of a decode policy. Every missing policy is now named first, with the shipped ones."""
    from kernel_gym.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    rc = main(["tune", "--model", "mixtral-8x7b", "--kernels", "fused_moe,decode_attention", "--dry-run"])
    captured = capsys.readouterr()
    assert rc == 2 and "no fused_moe, decode_attention policy in the MLflow store" in captured.err
    assert "benchmarks/generalisation/policies" in captured.err and "[tune]" not in captured.out


def test_collect_refusals_read_as_every_other_commands(capsys, monkeypatch):
    """collect exited 1 with a bare 'collect: ...' where every other command says 'kernel-gym CMD: error: ...' and
    exits 2."""
    import torch

    from kernel_gym.cli import main

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # no GPU visible, on a GPU machine too
    rc = main(["collect", "--model", "mixtral-8x7b", "--budget-s", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("kernel-gym collect: error: no CUDA GPU visible")


def test_tune_refuses_a_model_uri_without_its_kernel_instead_of_ignoring_it(tmp_path, monkeypatch, capsys):
    """A bare --model-uri was filed under no kernel and tune took the latest registered policy in its place."""
    from kernel_gym.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    rc = main(["tune", "--model", "mixtral-8x7b", "--kernels", "fused_moe", "--dry-run", "--model-uri",
               "models:/my-policy/1"])
    assert rc == 2 and "as KERNEL=URI (e.g. fused_moe=models:/my-policy/1)" in capsys.readouterr().err
