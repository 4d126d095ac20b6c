"""The fourth audit of inputs the project never shipped, as a new user meets them: request logs written the way real
logs are (epoch milliseconds in a seconds column, ISO datetimes, a BOM, a JSON array, other field names, tabs, a blank
first line), engine releases written the way release notes write them (`--engine-version vllm-0.33.0`), and the
config.json of MoE families whose keys differ (ERNIE-4.5's moe_num_experts / moe_k, Hunyuan's per-layer lists).
Each test failed before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_gym.traffic.traces import TraceError, load_trace

ROWS = [(i * 0.5, 100 + i, 20 + i) for i in range(30)]


def _csv(path: Path, header: str, rows=ROWS, sep: str = ",") -> Path:
    path.write_text(header + "\n" + "".join(sep.join(str(x) for x in r) + "\n" for r in rows))
    return path


# ---- traces ------------------------------------------------------------------------------------------------------

def test_epoch_milliseconds_in_a_seconds_column_are_refused_naming_the_unit(tmp_path):
    # was read as seconds: 30 requests over 14,500 s (0.002 req/s), replayed without a word
    rows = [(1714564800000 + int(t * 1000), p, o) for t, p, o in ROWS]
    path = _csv(tmp_path / "log.csv", "arrival_s,prompt_tokens,output_tokens", rows)
    with pytest.raises(TraceError, match=r"log.csv:2: .*finer unit than seconds.*fix: convert the time column"):
        load_trace(path)
    # epoch seconds are fine (any origin)
    rows = [(1714564800 + t, p, o) for t, p, o in ROWS]
    assert load_trace(_csv(tmp_path / "ok.csv", "arrival_s,prompt_tokens,output_tokens", rows)).duration_s == 14.5


def test_epoch_microseconds_in_a_mooncake_trace_are_refused_naming_milliseconds(tmp_path):
    path = tmp_path / "us.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 1714564800000000 + int(t * 1e6), "input_length": p,
                                        "output_length": o}) + "\n" for t, p, o in ROWS))
    with pytest.raises(TraceError, match="finer unit than milliseconds"):
        load_trace(path)


def test_iso_datetimes_in_arrival_s_name_the_format_that_reads_datetimes(tmp_path):
    rows = [(f"2024-05-01T12:00:{int(t):02d}Z", p, o) for t, p, o in ROWS]
    path = _csv(tmp_path / "iso.csv", "arrival_s,prompt_tokens,output_tokens", rows)
    with pytest.raises(TraceError, match=r"not a number of seconds; fix: write arrival_s as seconds.*TIMESTAMP"):
        load_trace(path)  # was "fix: correct or delete that row", for a file whose every row is that way


def test_a_jsonl_with_a_bom_loads(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_text("\ufeff" + "".join(json.dumps({"timestamp": int(t * 1000), "input_length": p,
                                                   "output_length": o}) + "\r\n" for t, p, o in ROWS))
    trace = load_trace(path)  # was "not a JSON object (Unexpected UTF-8 BOM ...); fix: correct or delete that line"
    assert len(trace) == 30 and trace.duration_s == 14.5


def test_a_json_array_is_named_as_such(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([{"timestamp": 0, "input_length": 10, "output_length": 5}]))
    with pytest.raises(TraceError, match=r"a JSON array, not JSON Lines.*jq -c"):
        load_trace(path)  # was "not a JSON object; fix: one object per line"


def test_a_request_log_with_other_field_names_names_its_fields_and_the_csv(tmp_path):
    path = tmp_path / "openai.jsonl"
    path.write_text("".join(json.dumps({"created": 1714564800 + int(t), "usage": {"prompt_tokens": p,
                                                                                   "completion_tokens": o}}) + "\n"
                            for t, p, o in ROWS))
    with pytest.raises(TraceError, match=r"Mooncake JSONL format \(its fields: \['created', 'usage'\]\).*arrival_s"):
        load_trace(path)


@pytest.mark.parametrize("sep, name", [("\t", "tabs"), (";", "semicolons")])
def test_other_separators_are_named(tmp_path, sep, name):
    path = _csv(tmp_path / "t.csv", sep.join(["arrival_s", "prompt_tokens", "output_tokens"]), sep=sep)
    with pytest.raises(TraceError, match=f"separated by {name}, not commas; fix: save it as a comma-separated CSV"):
        load_trace(path)


def test_column_names_in_another_case_are_named(tmp_path):
    path = _csv(tmp_path / "t.csv", "Arrival_S,Prompt_Tokens,Output_Tokens")
    with pytest.raises(TraceError, match=r"case-sensitive; fix: name the columns exactly \['arrival_s'"):
        load_trace(path)


def test_a_blank_first_line_is_not_called_an_empty_file(tmp_path):
    path = _csv(tmp_path / "t.csv", "\narrival_s,prompt_tokens,output_tokens")
    with pytest.raises(TraceError, match="first line is blank; the header row must come first"):
        load_trace(path)  # was "the file is empty"


# ---- engine releases -----------------------------------------------------------------------------------------------

def test_engine_version_may_repeat_the_engine_name():
    from kernel_gym.kernels.vllm_tables import engine_with_version, parse_engine

    assert engine_with_version("vllm", "vllm-0.33.0") == "vllm-0.33.0"  # was 'vllm-vllm-0.33.0', refused
    assert engine_with_version("vllm", "vllm==0.33.0") == "vllm-0.33.0"
    assert engine_with_version("vllm", "v0.33.0") == "vllm-0.33.0"
    assert engine_with_version("sglang", "") == "sglang"
    with pytest.raises(ValueError, match=r"names sglang, but the engine is vllm: pass --engine sglang"):
        engine_with_version("vllm", "sglang-0.5.23")
    assert parse_engine("vLLM v0.33.0").id == parse_engine("vllm 0.33.0").id == "vllm-0.33.0"
    with pytest.raises(ValueError, match=r"no tables of vllm-0.40.*known: .*vllm-0.34.0.*nearest yours"):
        parse_engine("vllm-0.40")


def test_export_takes_the_engine_version_as_tune_writes_it(tmp_path):
    from kernel_gym.deploy import engine_export as ee
    from kernel_gym.models import load_model

    # min_gain 2 is refused right after the engine is read: reaching it shows the engine was accepted
    with pytest.raises(ValueError, match="--min-gain 2"):
        ee.export(load_model("olmoe-1b-7b"), "vllm", tmp_path, "NVIDIA H200", engine_version="vllm-0.33.0",
                  min_gain=2.0)
    with pytest.raises(ValueError, match="names sglang, but the engine is vllm"):
        ee.export(load_model("olmoe-1b-7b"), "vllm", tmp_path, "NVIDIA H200", engine_version="sglang-0.5.23")


def test_plan_takes_the_engine_version_as_tune_writes_it(monkeypatch, capsys):
    from kernel_gym.cli import plan as plan_cli
    from kernel_gym.deploy import plan

    seen = {}
    monkeypatch.setattr(plan, "plan_deployment", lambda **kw: seen.update(kw) or 0)
    assert plan_cli.main(["--model", "olmoe-1b-7b", "--gpus", "1", "--trace", "bundled",
                          "--engine-version", "vllm-0.33.0"]) == 0
    assert seen["engine"] == "vllm-0.33.0"  # was 'vllm-vllm-0.33.0': "kernel_gym models ... 0.33.0, 0.34.0"
    assert plan_cli.main(["--model", "olmoe-1b-7b", "--gpus", "1", "--trace", "bundled",
                          "--engine-version", "sglang-0.5.23"]) == 2
    assert "names sglang, but the engine is vllm" in capsys.readouterr().err


# ---- config.json of other MoE families -----------------------------------------------------------------------------

def _load(tmp_path: Path, name: str, cfg: dict):
    from kernel_gym.models import load_model

    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    return load_model(str(tmp_path / name / "config.json"))


def _shape(spec):
    return (spec.num_layers, spec.hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.num_experts,
            spec.top_k, spec.intermediate)


def test_ernie_config_is_read_as_the_zoo_has_it(tmp_path):
    from kernel_gym.zoo import ZOO

    # ERNIE-4.5-21B-A3B's config.json keys (was "not a mixture-of-experts model")
    cfg = {"architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "hidden_size": 2560,
           "num_attention_heads": 20, "num_key_value_heads": 4, "num_hidden_layers": 28, "moe_num_experts": 64,
           "moe_k": 6, "moe_intermediate_size": 1536, "moe_num_shared_experts": 2, "intermediate_size": 12288,
           "torch_dtype": "bfloat16"}
    spec = _load(tmp_path, "ernie", cfg)
    assert _shape(spec) == _shape(ZOO["ernie-4.5-21b-a3b"])
    assert (spec.num_shared_experts, spec.shared_intermediate) == (2, 1536)


def test_hunyuan_per_layer_lists_are_read_when_equal(tmp_path):
    from kernel_gym.zoo import ZOO

    cfg = {"architectures": ["HunYuanMoEV1ForCausalLM"], "model_type": "hunyuan_v1_moe", "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 32,
           "num_experts": 64, "moe_topk": [8] * 32, "moe_intermediate_size": [3072] * 32,
           "num_shared_expert": [1] * 32, "intermediate_size": 3072, "torch_dtype": "bfloat16"}
    spec = _load(tmp_path, "hunyuan", cfg)  # was "moe_intermediate_size must be an integer, got [3072, ...]"
    assert _shape(spec) == _shape(ZOO["hunyuan-a13b"]) and spec.num_shared_experts == 1
    with pytest.raises(ValueError, match=r"moe_intermediate_size holds several values.*one MoE shape per model"):
        _load(tmp_path, "mixed", dict(cfg, moe_intermediate_size=[1536, 512]))


def test_gpt_oss_top_k_under_its_own_key(tmp_path):
    cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 24,
           "num_local_experts": 32, "experts_per_token": 4, "intermediate_size": 2880, "sliding_window": 128}
    assert _load(tmp_path, "gptoss", cfg).top_k == 4


def test_unread_expert_fields_are_named_not_called_dense(tmp_path):
    cfg = {"model_type": "dbrx_like", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 8,
           "moe_num_routed": 16, "expert_top_k": 4, "intermediate_size": 8192}
    with pytest.raises(ValueError, match=r"its MoE fields \['expert_top_k', 'moe_num_routed'\] are not ones "
                                         "kernel_gym reads; write the model as a ModelSpec JSON"):
        _load(tmp_path, "odd", cfg)  # was "not a mixture-of-experts model"


@pytest.mark.parametrize("suffix, compress, kind", [
    (".csv.bz2", "bz2", "bzip2"), (".csv.xz", "lzma", "xz"), (".zip", "zip", "zip")])
def test_archives_other_than_gzip_are_named(tmp_path, suffix, compress, kind):
    import bz2
    import lzma
    import zipfile

    data = _csv(tmp_path / "t.csv", "arrival_s,prompt_tokens,output_tokens").read_bytes()
    path = tmp_path / f"trace{suffix}"
    if compress == "zip":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("t.csv", data)
    else:
        path.write_bytes((bz2 if compress == "bz2" else lzma).compress(data))
    with pytest.raises(TraceError, match=f"compressed with {kind}; .*fix: unpack it"):
        load_trace(path)  # was "not UTF-8 text (offset 13); fix: save the trace as UTF-8"


def test_no_head_dim_and_heads_that_do_not_divide_hidden_is_refused(tmp_path):
    # hidden 3000 over 64 heads: without head_dim the spec took 3000 // 64 = 46, a head size of no model
    cfg = {"model_type": "odd", "hidden_size": 3000, "num_attention_heads": 64, "num_key_value_heads": 8,
           "num_hidden_layers": 24, "num_local_experts": 32, "num_experts_per_tok": 4, "intermediate_size": 2880}
    with pytest.raises(ValueError, match="no head_dim, and hidden_size 3000 is not a multiple of num_attention_heads"):
        _load(tmp_path, "nohead", cfg)
    assert _load(tmp_path, "withhead", dict(cfg, head_dim=64)).head_dim == 64


def test_plan_that_fits_nothing_names_the_fix():
    """'fits no deployment ... do not hold one 2500000-token request' named no fix (audit 4)."""
    from kernel_gym.deploy.plan import plan_deployment

    with pytest.raises(ValueError, match=r"-token request; pass a smaller --max-model-len .* or more --gpus"):
        plan_deployment(model="qwen2-57b-a14b", gpus=1, trace="bundled", max_model_len=2_500_000, no_mlflow=True)
    with pytest.raises(ValueError, match=r"leave no KV cache .*; give more --gpus"):
        plan_deployment(model="deepseek-v3", gpus=1, trace="bundled", no_mlflow=True)


def test_hunyuan_large_head_size_shared_width_and_dense_configs(tmp_path):
    """Review of audit 4: Hunyuan-Large writes its head size as attention_head_dim (hidden 6400 / 80 heads would give
    80, not 128), its shared MLP is moe_intermediate_size x num_shared_expert wide, and a dense config (one expert)
    read as a one-expert MoE."""
    cfg = {"architectures": ["HunYuanForCausalLM"], "hidden_size": 6400, "num_attention_heads": 80,
           "num_key_value_heads": 8, "attention_head_dim": 128, "num_hidden_layers": 64, "num_experts": 16,
           "moe_topk": 1, "moe_intermediate_size": 18304, "num_shared_expert": 1, "intermediate_size": 1,
           "torch_dtype": "bfloat16"}
    spec = _load(tmp_path, "hunyuan_large", cfg)
    assert spec.head_dim == 128 and (spec.num_shared_experts, spec.shared_intermediate) == (1, 18304)
    with pytest.raises(ValueError, match=r"1 expert\(s\): not a mixture-of-experts model"):
        _load(tmp_path, "dense", dict(cfg, num_experts=1))
