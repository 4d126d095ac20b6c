"""benchmarks/live_e2e/band_check.py: the decode-only price errors by decode batch band, gathered over runs."""

import json

import pytest

from benchmarks.live_e2e import band_check as bc


def _summary(path, model, bands_by_spec):
    path.mkdir(parents=True, exist_ok=True)
    path.joinpath("summary.json").write_text(json.dumps({"meta": {"model": model}, "step_check": {
        spec: {"decode_only": {"by_decode_batch": bands}, "with_prefill": {"by_decode_batch": {"0": {
            "steps": 9, "sum_error": 0.5}}}} for spec, bands in bands_by_spec.items()}}))


def test_bands_are_gathered_per_model_and_policy_group_with_the_median_and_range_over_runs(tmp_path):
    """Two runs: the learned tables of either seed form one group, each band's median and range are over the runs
    that have steps there, bands come in batch order, and steps with prefill chunks are left out."""
    _summary(tmp_path / "a" / "w1", "mix", {"default": {"9-16": {"steps": 10, "sum_error": -0.10},
                                                        "1": {"steps": 4, "sum_error": 0.01}},
                                            "table:s0.json": {"9-16": {"steps": 3, "sum_error": 0.20}}})
    _summary(tmp_path / "b" / "w1", "mix", {"default": {"9-16": {"steps": 6, "sum_error": -0.06}},
                                            "table:s1.json": {"9-16": {"steps": 5, "sum_error": 0.10}}})
    _summary(tmp_path / "c", "olmoe", {"vllm-table": {}})  # no decode-only bands: no group
    got = bc.gather(tmp_path)
    assert list(got) == ["mix default", "mix learned table"]
    assert list(got["mix default"]) == ["1", "9-16"]
    band = got["mix default"]["9-16"]
    assert band["runs"] == 2 and band["steps"] == 16
    assert band["median"] == pytest.approx(-0.08) and (band["min"], band["max"]) == (-0.10, -0.06)
    assert band["by_run"] == {"a/w1 default": -0.10, "b/w1 default": -0.06}
    assert got["mix learned table"]["9-16"]["median"] == pytest.approx(0.15)
    assert "0" not in got["mix default"]
    out = tmp_path / "band_check.json"
    assert bc.main(["--predicted", str(tmp_path), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["groups"] == got and out.with_suffix(".png").exists()
    with pytest.raises(SystemExit, match="run predict_all.sh first"):
        bc.main(["--predicted", str(tmp_path / "c"), "--out", str(out)])
