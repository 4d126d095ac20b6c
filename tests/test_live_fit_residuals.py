"""benchmarks/live_e2e/fit_residuals.py: the wave model's line against a decode graph table's own points."""

from __future__ import annotations

import json

import pytest

from benchmarks.live_e2e.fit_residuals import residuals
from kernel_gym.kernels.decode_attention import program_rounds
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import DecodeWorkload
from kernel_gym.models import load_model
from kernel_gym.traffic import decode_waves

CFG = {"BLOCK_N": 16, "GQA_GROUPED": 1, "LAYOUT": "NHD", "NUM_SPLITS": 1, "PAGE_SIZE": 16, "num_stages": 2,
       "num_warps": 4}


def _table(path, seconds):
    """A decode_graph.json holding one config of Mixtral at the fit grid, its times from `seconds(batch, context)`."""
    ms = {f"{b},{c}": {"ms": 1e3 * seconds(b, c)} for b in (1, 2, 4, 8, 16) for c in decode_waves.FIT_CONTEXTS}
    key = json.dumps(CFG, sort_keys=True, separators=(",", ":"))
    path.write_text(json.dumps({"meta": {}, "models": {"mixtral-8x7b": {"ms": {key: ms}}}}))
    return path, key


def _rounds(b, c):
    m = load_model("mixtral-8x7b")
    wl = DecodeWorkload(m.num_heads, m.num_kv_heads, m.head_dim, b, c)
    return program_rounds(wl.context_lens(), Config(CFG), m.num_heads, m.num_kv_heads)


def test_a_table_on_the_line_has_no_residual_and_a_slow_point_shows_below_it(tmp_path):
    line = decode_waves.WaveFit(slots=512, launch_s=4e-6, token_s=2e-9, median_error=0.0, points=0)
    path, key = _table(tmp_path / "on.json", lambda b, c: line.seconds(_rounds(b, c)))
    r = residuals("mixtral-8x7b", [path])[key]
    assert max(abs(v) for v in r["by_point"].values()) < 0.02
    # one point twice as slow as the line: the refit line lies about 50% below the table there
    slow = tmp_path / "slow.json"
    _, key = _table(slow, lambda b, c: line.seconds(_rounds(b, c)) * (2.0 if (b, c) == (1, 256) else 1.0))
    r = residuals("mixtral-8x7b", [slow])[key]
    assert r["by_point"][(1, 256)] == pytest.approx(-0.5, abs=0.05)


def test_flush_ratios_pair_each_point_with_its_flushed_time(tmp_path):
    from benchmarks.live_e2e.fit_residuals import flush_ratios

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"meta": {}, "models": {"m": {"ms": {"cfg": {
        "1,256": {"ms": 0.020, "flushed_ms": 0.029}, "1,4096": {"ms": 0.40, "flushed_ms": 0.40},
        "2,256": {"ms": 0.021}}}}}}))
    assert flush_ratios(path, "m") == {"cfg": {(1, 256): pytest.approx(1.45), (1, 4096): pytest.approx(1.0)}}


def test_repeat_spreads_reads_each_points_slowest_over_fastest_repeat(tmp_path, capsys):
    from benchmarks.live_e2e import fit_residuals as fr

    cfg = '{"NUM_SPLITS":1}'
    table = {"meta": {"repeats": 3}, "models": {"olmoe-1b-7b": {"ms": {cfg: {
        "24,4096": {"ms": 0.5, "repeat_ms": [0.5, 0.62, 0.5], "repeat_ratio": 1.24},
        "1,256": {"ms": 0.015, "repeat_ms": [0.015, 0.015, 0.015], "repeat_ratio": 1.0},
        "2,256": {"ms": 0.02}}}}}}
    once = {"models": {"olmoe-1b-7b": {"ms": {cfg: {"24,4096": {"ms": 0.62}}}}}}
    (tmp_path / "r.json").write_text(json.dumps(table))
    (tmp_path / "once.json").write_text(json.dumps(once))
    assert fr.repeat_spreads(tmp_path / "r.json", "olmoe-1b-7b") == {cfg: {(24, 4096): 1.24, (1, 256): 1.0}}
    assert fr.main(["--model", "olmoe-1b-7b", "--repeats", str(tmp_path / "r.json"), "--tables",
                    str(tmp_path / "once.json")]) == 0
    out = capsys.readouterr().out
    assert "1.240" in out and "its time / the repeats' median" in out and "1.240" in out.split("median:")[1]
