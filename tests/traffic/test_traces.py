"""Trace loaders: the real published files (only from the folder in $KERNEL_GYM_TRACES), the bundled excerpt, and bad
input."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kernel_gym.traffic.traces import (
    BUNDLED_DIR,
    TraceError,
    bundled_trace_path,
    detect_format,
    load_azure,
    load_burstgpt,
    load_mooncake,
    load_trace,
)

# The real traces are read only from the folder the user names in KERNEL_GYM_TRACES; nothing is looked up by default.
_ENV = os.environ.get("KERNEL_GYM_TRACES", "")
REAL_TRACES = Path(_ENV) if _ENV else None
needs_real_traces = pytest.mark.skipif(
    REAL_TRACES is None or not (REAL_TRACES / "AzureLLMInferenceTrace_conv.csv").exists(),
    reason="real traces not available: KERNEL_GYM_TRACES is unset" if REAL_TRACES is None else
    f"real traces absent: KERNEL_GYM_TRACES={_ENV} holds no AzureLLMInferenceTrace_conv.csv (README.md: Data and "
    "licences)",
)


@needs_real_traces
@pytest.mark.parametrize(
    "name,count,prompt_mean,output_mean,dropped",
    [
        ("azure-conv", 19366, 1155, 211, 0),
        ("azure-code", 8819, 2048, 27.9, 0),
        ("mooncake", 3993, 15325, 149, 0),
        ("burstgpt", 383, 544, 289, 17),  # 17 zero-token failure rows (SOURCES.md)
    ],
)
def test_real_traces_match_published_stats(name, count, prompt_mean, output_mean, dropped):
    tr = load_trace(name, traces_dir=REAL_TRACES)
    assert len(tr) == count
    assert tr.repairs["zero_token_rows_dropped"] == dropped
    assert tr.prompt_tokens.mean() == pytest.approx(prompt_mean, rel=2e-3)
    assert tr.output_tokens.mean() == pytest.approx(output_mean, rel=3e-3)
    assert tr.arrival_s[0] == 0 and np.all(np.diff(tr.arrival_s) >= 0)


@needs_real_traces
def test_azure_conv_duration_and_rate():
    tr = load_trace("azure-conv", traces_dir=REAL_TRACES)
    assert tr.duration_s == pytest.approx(3501.72, abs=0.01)  # 18:15:46.68 .. 19:14:08.40
    assert tr.mean_rate == pytest.approx(5.530, abs=1e-3)


def test_bundled_trace_is_an_unmodified_prefix_with_attribution():
    tr = load_trace("bundled")
    assert len(tr) == 2867 and tr.duration_s < 600
    assert (BUNDLED_DIR / "LICENSE-AzurePublicDataset-CC-BY-4.0.txt").read_text(encoding="utf-8-sig").startswith(
        "Attribution 4.0 International")
    readme = (BUNDLED_DIR / "README.md").read_text()
    assert "Splitwise" in readme and "CC BY 4.0" in readme
    full = REAL_TRACES / "AzureLLMInferenceTrace_conv.csv" if REAL_TRACES is not None else None
    if full is not None and full.exists():
        data = bundled_trace_path().read_bytes()
        assert full.read_bytes()[: len(data)] == data


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_azure_parses_seven_digit_fractions(tmp_path):
    p = _write(tmp_path, "a.csv", AZ + "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    tr = load_azure(p)
    assert tr.arrival_s[1] == pytest.approx(4.314579, abs=1e-6)
    assert list(tr.prompt_tokens) == [374, 396] and list(tr.output_tokens) == [44, 109]


@pytest.mark.parametrize(
    "text,line,needle",
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,3\n", 1, "GeneratedTokens"),
        (AZ + "2023-11-16 18:15:46.68,3,4\n2023-11-16 18:15:47.00,abc,4\n", 3, "'abc'"),
        (AZ + "2023-11-16 18:15:46.68,3,-4\n", 2, "negative"),
        (AZ + "2023-11-16 18:15:46.68,3,4\n2023-11-16 18:15:45.00,3,4\n", 3, "sort the file"),
        (AZ + "yesterday,3,4\n", 2, "TIMESTAMP"),
        (AZ + "2023-11-16 18:15:46.68,3.5,4\n", 2, "whole token count"),
        ("", 1, "empty"),
        (AZ, 1, "no data rows"),
    ],
)
def test_azure_bad_input_names_file_line_and_fix(tmp_path, text, line, needle):
    p = _write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceError) as exc:
        load_azure(p)
    msg = str(exc.value)
    assert f"{p}:{line}:" in msg and needle in msg and "fix:" in msg


def test_burstgpt_zero_token_rows_are_dropped_and_counted(tmp_path):
    p = _write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
               "5,ChatGPT,472,18,490,Conversation log\n1106,ChatGPT,0,0,0,Conversation log\n"
               "1200,GPT-4,30,0,30,API log\n1300,GPT-4,10,20,30,API log\n")
    tr = load_burstgpt(p)
    assert len(tr) == 2 and tr.repairs["zero_token_rows_dropped"] == 2
    assert list(tr.arrival_s) == [0.0, 1295.0]


def test_mooncake_ms_timestamps_and_errors(tmp_path):
    good = _write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n'
                  '{"timestamp": 1500, "input_length": 20, "output_length": 3, "hash_ids": [0, 1]}\n')
    tr = load_mooncake(good)
    assert list(tr.arrival_s) == [0.0, 1.5]
    bad = _write(tmp_path, "n.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
                 '{"timestamp": 5, "input_length": 10}\n')
    with pytest.raises(TraceError, match=r"n\.jsonl:2: .*output_length"):
        load_mooncake(bad)
    garbled = _write(tmp_path, "g.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 2}\nnot json\n')
    with pytest.raises(TraceError, match=r"g\.jsonl:2: not a JSON object"):
        load_mooncake(garbled)


def test_load_trace_detects_format_from_header_and_extension(tmp_path):
    a = _write(tmp_path, "x.csv", AZ + "2023-11-16 18:15:46.68,3,4\n")
    b = _write(tmp_path, "y.csv", "Timestamp,Model,Request tokens,Response tokens\n1,ChatGPT,3,4\n")
    m = _write(tmp_path, "z.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 2}\n')
    assert (detect_format(a), detect_format(b), detect_format(m)) == ("azure", "burstgpt", "mooncake")
    assert len(load_trace(str(a))) == len(load_trace(b)) == len(load_trace(m)) == 1
    u = _write(tmp_path, "u.csv", "time,in,out\n1,2,3\n")
    with pytest.raises(TraceError, match="matches no known trace format"):
        load_trace(u)
    with pytest.raises(FileNotFoundError, match="neither a known name"):
        load_trace("azure-conversation")
    with pytest.raises(FileNotFoundError, match="absent"):
        load_trace("azure-conv", traces_dir=tmp_path)


def test_named_traces_have_no_default_folder(tmp_path, monkeypatch):
    """Without KERNEL_GYM_TRACES (and no traces_dir) a named trace is refused with the fix; nothing is looked up
    beside the repository. With it, the folder it names is used, read at call time. The bundled trace needs neither."""
    monkeypatch.delenv("KERNEL_GYM_TRACES", raising=False)
    with pytest.raises(FileNotFoundError, match="KERNEL_GYM_TRACES, which is not set"):
        load_trace("azure-conv")
    assert len(load_trace("bundled")) == 2867
    monkeypatch.setenv("KERNEL_GYM_TRACES", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=str(tmp_path.resolve())):
        load_trace("azure-code")
    _write(tmp_path, "AzureLLMInferenceTrace_code.csv", AZ + "2023-11-16 18:15:46.68,3,4\n")
    assert len(load_trace("azure-code")) == 1


def test_window_and_scale_rate():
    tr = load_trace("bundled")
    w = tr.window(60, 120)
    assert w.arrival_s[0] == 0 and w.duration_s < 60 and len(w) > 100
    fast = tr.scale_rate(2.0)
    assert fast.mean_rate == pytest.approx(2 * tr.mean_rate)
