"""benchmarks/live_e2e/ragged_decode.py (decode attention on ragged batches, launched as the live graphs launch
them) and run.py --predict --decode-ragged, which prices a graphed decode-only step no lower than its longest
sequence alone x the ragged launch's measured factor."""

import json

import numpy as np
import pytest

from benchmarks.live_e2e import ragged_decode as rd
from benchmarks.live_e2e import run as le
from kernel_gym.kernels.decode_attention import program_rounds
from kernel_gym.kernels.workloads import DecodeWorkload
from kernel_gym.measure.roofline import RooflineTimer
from kernel_gym.traffic import decode_waves as dw


def test_cases_pad_to_the_capture_size_with_one_token_rows_and_duplicates_are_timed_once():
    assert rd.case_lens("padded", 9, 4096, 1024) == (4096,) + (1024,) * 8 + (1,) * 7
    assert rd.case_lens("alone", 5, 4096, 1024) == (4096, 1, 1, 1, 1, 1, 1, 1)
    assert rd.case_lens("long_last", 3, 4096, 1024) == (1024, 1024, 4096)
    with pytest.raises(ValueError, match="one of uniform"):
        rd.case_lens("sideways", 4, 4096, 1024)
    points = rd.plan_points((8, 9), 4096, 1024)
    assert points[0] == (1, "uniform", (4096,))  # batch 1 always, the reference of every ratio
    cases_at = {b: [c for bb, c, _ in points if bb == b] for b in (8, 9)}
    # at 8 (a capture size) `padded` is `long_first`: left out
    assert cases_at[8] == ["uniform", "long_first", "long_last", "alone"]
    assert cases_at[9] == list(rd.CASES)
    assert len({lens for _, _, lens in points}) == len(points)


def test_smoke_times_every_case_checked(tmp_path):
    """CPU dry run under the interpreter: the tiny model's cases for both configs, each checked against the fp32
    reference before its (wall-clock) time, written and tabled."""
    assert rd.main(["--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / rd.OUT_NAME).read_text())
    assert set(doc["configs"]) == set(rd.CONFIGS["olmoe-1b-7b"])
    for rows in doc["configs"].values():
        assert [r["case"] for r in rows if r["batch"] == 3] == list(rd.CASES)
        assert all("ms" in r and "error" not in r for r in rows)
    assert "b= 3: uniform" in rd.table(doc)


def _doc(model="m"):
    one = 0.4
    rows = [{"batch": 1, "case": "uniform", "contexts": [4096], "ms": one},
            {"batch": 6, "case": "padded", "contexts": [4096] + [1024] * 5 + [1, 1], "ms": 1.2 * one},
            {"batch": 8, "case": "long_first", "contexts": [4096] + [1024] * 7, "ms": 1.0 * one},
            {"batch": 8, "case": "uniform", "contexts": [4096] * 8, "ms": 3.0 * one},  # not a ragged launch
            {"batch": 9, "case": "padded", "contexts": [4096] + [1024] * 8 + [1] * 7, "ms": 1.3 * one},
            {"batch": 12, "case": "padded", "contexts": [4096] + [1024] * 11 + [1] * 4, "ms": 1.5 * one},
            {"batch": 12, "case": "alone", "contexts": [4096] + [1] * 15, "ms": 1.0 * one},  # not a live launch
            {"batch": 14, "case": "padded", "contexts": [4096] + [1024] * 13 + [1] * 2, "error": "x"}]
    return {"meta": {"model": model}, "configs": {"CFG": rows}}


def test_factors_come_from_the_launches_a_live_graph_runs_per_capture_size(tmp_path):
    path = tmp_path / "ragged_decode.json"
    path.write_text(json.dumps(_doc()))
    factors = rd.ragged_factors(path, "m")["CFG"]
    assert set(factors) == {8, 16}  # uniform, alone and failed points left out
    assert factors[8] == pytest.approx(np.median([1.2, 1.0]))
    assert factors[16] == pytest.approx(np.median([1.3, 1.5]))
    assert rd.ragged_factors(path, "other") is None
    assert rd.factor_at(factors, 16) == factors[16]
    assert rd.factor_at(factors, 12) == pytest.approx((factors[8] + factors[16]) / 2)
    assert rd.factor_at(factors, 4) is None and rd.factor_at(factors, 24) is None  # outside: no correction


def _sim():
    """A prediction whose decode config's wave model is fitted on a graph table that follows the model exactly."""
    trace = le.window_trace("bundled", 0.0, 30.0, 1.0, 60, 3).head(le.SMOKE_REQUESTS)
    sim = le.PredictSimulator(le.TINY, trace, RooflineTimer(0.5), le.DefaultChooser(), None, kv_layout=le.PAGE,
                              dtype="float32", gpu_memory_bytes=le.pool_memory(le.TINY, 0.002),
                              max_num_batched_tokens=48, max_num_seqs=256, decode_waves=True)
    m = le.TINY
    cfg = le.DefaultChooser().choose("decode_attention", DecodeWorkload(m.num_heads, m.num_kv_heads, m.head_dim, 9,
                                                                        400, "float32"), le.PAGE)

    def rounds(b, c):
        return program_rounds(DecodeWorkload(m.num_heads, m.num_kv_heads, m.head_dim, b, c, "float32").context_lens(),
                              cfg, m.num_heads, m.num_kv_heads)

    sim.decode_graph = {str(cfg): {(b, c): 3e-6 + 2e-8 * dw.makespan(rounds(b, c), 64)
                                   for b in dw.FIT_BATCHES for c in dw.FIT_CONTEXTS}}
    return sim


def test_a_graphed_ragged_decode_step_costs_at_least_the_long_sequence_alone_times_the_factor():
    contexts = [2048, 128, 128, 128, 128, 128, 128, 128, 128]  # 9 rows: the capture size 16
    plain = _sim()
    plain._graph_rows = 16
    waves = plain._decode_s(9, float(np.mean(contexts)), 2048.0, [], contexts)
    cfg = str(plain._last_cfg["decode_attention"])
    alone = plain._waves_s(plain._last_cfg["decode_attention"], [2048])
    assert plain.decode_graph_fits == 1 and alone is not None and 0 < alone <= waves

    sim = _sim()
    sim.decode_ragged = {cfg: {8: 1.0, 16: 3.0 * waves / alone}}
    sim._graph_rows = 16
    t = sim._decode_s(9, float(np.mean(contexts)), 2048.0, [], contexts)
    assert t == pytest.approx(3.0 * waves)
    assert sim.decode_ragged_steps == 1
    assert sim.decode_ragged_s == pytest.approx(2.0 * waves * le.TINY.num_layers)

    # not on a step with prefill chunks (its attention launches eagerly, unpadded), nor where the factor is lower
    # than the wave model's price, nor at a capture size outside the measured ones
    for has_chunks, factors in ((True, {16: 3.0 * waves / alone}), (False, {16: 0.5}), (False, {24: 9.0})):
        other = _sim()
        other.decode_ragged = {cfg: {8: 1.0, **factors}} if 24 not in factors else {cfg: factors}
        other._graph_rows, other._has_chunks = 16, has_chunks
        assert other._decode_s(9, float(np.mean(contexts)), 2048.0, [], contexts) == pytest.approx(waves)
        assert other.decode_ragged_steps == 0


def test_predict_reads_the_table_and_refuses_one_from_another_gpu(tmp_path):
    path = tmp_path / "ragged_decode.json"
    doc = _doc(model=le.TINY.name)
    doc["meta"]["device"] = "NVIDIA H100 80GB HBM3"
    path.write_text(json.dumps(doc))
    args = le.build_parser().parse_args(["--out", str(tmp_path), "--predict", "--decode-ragged", str(path)])
    shown = le.decode_ragged_setup(args, le.TINY)
    assert set(args.decode_ragged_s["CFG"]) == {8, 16} and shown["factors"]["CFG"]["16"] > 1
    with pytest.raises(SystemExit, match="--decode-ragged .*timed on NVIDIA H100 80GB HBM3"):
        le.check_table_devices(args, "NVIDIA H200")
    none = le.build_parser().parse_args(["--out", str(tmp_path), "--predict"])
    assert "wave model alone" in le.decode_ragged_setup(none, le.TINY) and none.decode_ragged_s is None


def test_predict_picks_the_table_for_the_run_model_among_several(tmp_path):
    other, mine = tmp_path / "other.json", tmp_path / "mine.json"
    other.write_text(json.dumps(_doc(model="mixtral-8x7b")))
    mine.write_text(json.dumps(_doc(model=le.TINY.name)))
    args = le.build_parser().parse_args(["--out", str(tmp_path), "--predict", "--decode-ragged", f"{other},{mine}"])
    shown = le.decode_ragged_setup(args, le.TINY)
    assert shown["table"].endswith("mine.json") and set(args.decode_ragged_s["CFG"]) == {8, 16}
    only_other = le.build_parser().parse_args(["--out", str(tmp_path), "--predict", "--decode-ragged", str(other)])
    assert "no measured table for" in le.decode_ragged_setup(only_other, le.TINY)
    assert only_other.decode_ragged_s is None
    both_other = le.build_parser().parse_args(["--out", str(tmp_path), "--predict", "--decode-ragged",
                                               f"{other},{other}"])
    assert f"{other}, {other}" in le.decode_ragged_setup(both_other, le.TINY)


def test_any_zoo_model_with_its_configs_and_clear_errors_otherwise(capsys):
    with pytest.raises(SystemExit):
        rd.main(["--out", "/tmp/x", "--model", "no-such-model"])
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rd.main(["--out", "/tmp/x", "--model", "qwen2-57b-a14b"])
    assert "pass the decode configs to time with --configs" in capsys.readouterr().err
