"""benchmarks/live_e2e/heldout_check.py: the held-out runs set beside the prediction committed before them."""

import json

import pytest

from benchmarks.live_e2e import heldout_check as hc


def _write(path, doc):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_heldout_check_sets_the_preregistered_prediction_beside_the_measured_run(tmp_path):
    meta = {"model": "m", "trace": "code.csv", "window": [300.0, 30.0, 1.0]}
    pre, runs = tmp_path / "pre", tmp_path / "runs"
    guess = {"tokens_per_s": 110.0, "ttft_p50_s": 0.2, "tpot_p50_s": 0.05}
    _write(pre / "code_m" / "predicted.json", {"meta": meta, "prediction": {"commit": "abc"},
                                               "policies": {"vllm-table": {"predicted": guess,
                                                                           "estimated_share": 0.4},
                                                            "default": {"predicted": guess}}})
    measured = {"tokens_per_s": 100.0, "ttft_p50_s": 0.25, "tpot_p50_s": 0.05}
    after = {"tokens_per_s": 100.0, "ttft_p50_s": 0.25, "tpot_p50_s": 0.06}
    _write(runs / "code_m" / "summary.json", {"meta": meta, "prediction": {"commit": "def"}, "policies": {
        "vllm-table": {"measured": measured, "predicted": after, "gpu_before": {"sm_mhz": 1980.0}},
        "default": {"measured": measured, "predicted": after, "measured_run_complete": False},
        "table:x": {"measured": measured, "predicted": after}}})
    got = hc.check(runs, pre)["code_m"]
    row = got["policies"]["vllm-table"]
    assert row["error_preregistered"]["tokens_per_s"] == pytest.approx(0.10)
    assert row["error_preregistered"]["ttft_p50_s"] == pytest.approx(-0.2)
    assert row["error_after"]["tpot_p50_s"] == pytest.approx(0.2) and row["estimated_share"] == 0.4
    assert row["gpu_before"] == {"sm_mhz": 1980.0} and row["gpu_after"] is None  # the clocks beside the errors
    assert "did not finish" in got["policies"]["default"]["skipped"]       # cut by its budget: no error
    assert "no preregistered" in got["policies"]["table:x"]["skipped"]     # predicted only after the run
    assert got["preregistered_commit"] == "abc" and got["after_commit"] == "def"
    _write(runs / "code_m" / "summary.json", {"meta": {**meta, "window": [0.0, 30.0, 1.0]}, "prediction": {},
                                              "policies": {}})
    with pytest.raises(SystemExit, match="not the same window"):
        hc.check(runs, pre)


def test_heldout_check_merges_each_sessions_runs(tmp_path):
    """Each session's held-out runs sit in their own predicted/ folder; one call sets them all side by side."""
    meta = {"model": "m", "trace": "code.csv", "window": [300.0, 30.0, 1.0]}
    guess = {"tokens_per_s": 100.0, "ttft_p50_s": 0.2, "tpot_p50_s": 0.05}
    pre = tmp_path / "pre"
    for run, folder in (("code_m", "first"), ("code540_m", "second")):
        window = {**meta, "window": [540.0, 30.0, 1.0]} if run == "code540_m" else meta
        _write(pre / run / "predicted.json", {"meta": window, "prediction": {},
                                              "policies": {"d": {"predicted": guess}}})
        _write(tmp_path / folder / run / "summary.json", {"meta": window, "prediction": {}, "policies": {
            "d": {"measured": guess, "predicted": guess}}})
    out = tmp_path / "check.json"
    assert hc.main([str(tmp_path / "first"), str(tmp_path / "second"), "--json", str(out),
                    "--preregistered", str(pre)]) == 0
    got = json.loads(out.read_text())
    assert sorted(got) == ["code540_m", "code_m"] and got["code540_m"]["window"][0] == 540.0
    assert got["code_m"]["policies"]["d"]["error_preregistered"]["ttft_p50_s"] == 0.0
