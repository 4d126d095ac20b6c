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


def test_profiled_parts_prefer_a_steps_graph_replay_profile_and_add_the_routing_to_the_moe(monkeypatch, tmp_path):
    """Two profiled decode-only steps in band 9-16, one with its graph replay profiled too: that step's parts come
    from the replay's profile with the gaps before their kernels, the other's from its eager launch's durations; the
    routing's kernels count with the MoE's (its price holds them); a step with prefill chunks or without a profile is
    left out."""
    from benchmarks.live_e2e import run as le

    eager = {"busy_us": 9000.0, "by_part_us": {"fused_moe": 6000.0, "moe_routing": 1000.0, "dense": 2000.0}}
    graph = {"busy_us": 7000.0, "by_part_us": {"fused_moe": 4500.0, "moe_routing": 500.0, "dense": 2000.0},
             "by_part_span_us": {"fused_moe": 5000.0, "moe_routing": 600.0, "dense": 2400.0}}
    parts = {"fused_moe": 0.006, "dense": 0.0015}
    priced = [("graph", False, 0.010, 0.0075, 12, parts, eager), ("graph", False, 0.008, 0.0075, 10, parts, eager),
              ("piecewise", True, 0.05, 0.04, 12, parts, eager), ("graph", False, 0.01, 0.0075, 12, parts, None)]
    records = [{"kernels": eager, "kernels_graph": graph}, {"kernels": eager}, {}, {"kernels_graph": {"error": "x"}}]
    monkeypatch.setattr(le, "predict_setup", lambda args: ({"measured": {"p": {}}}, {}, None, None, None, None, {}))
    monkeypatch.setattr(le, "priced_steps", lambda *a, **k: priced)
    monkeypatch.setattr(le, "read_steps", lambda out, spec: records)
    monkeypatch.setattr(le, "policy_issue_s", lambda args, measured: (None, ""))
    band = bc.profiled_parts(tmp_path)["p"]["9-16"]
    assert band["steps"] == 2 and band["graph_profiled"] == 1
    assert band["busy_ms"] == pytest.approx(8.0) and band["measured_step_ms"] == pytest.approx(9.0)
    assert band["parts"]["fused_moe"]["measured_ms"] == pytest.approx((5.6 + 7.0) / 2)
    assert band["parts"]["fused_moe"]["priced_ms"] == pytest.approx(6.0)
    assert band["parts"]["dense"]["measured_ms"] == pytest.approx(2.2) and "moe_routing" not in band["parts"]
    assert band["dense_and_moe"] == pytest.approx({"priced_ms": 7.5, "measured_ms": (5.6 + 7.0) / 2 + 2.2})


def test_table_args_price_from_one_machines_tables_and_say_what_is_missing(tmp_path):
    assert bc.table_args(None) == []
    assert bc.table_args(None, tmp_path / "r.json") == ["--decode-ragged", str(tmp_path / "r.json")]
    with pytest.raises(SystemExit, match="dense_ops.json.*same_gpu_session.sh"):
        bc.table_args(tmp_path)
    for rel in ("dense_ops.json", "moe_graph/moe_graph.json", "decode_graph/decode_graph.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    got = bc.table_args(tmp_path)
    assert got[got.index("--dense-ops") + 1] == str(tmp_path / "dense_ops.json")
    assert got[got.index("--moe-eager") + 1] == "none"  # the H200's chunk and eager tables off
    with pytest.raises(SystemExit):
        bc.main(["--tables", str(tmp_path)])  # without --profiled


def test_profile_pairs_set_a_steps_eager_and_graph_profiles_side_by_side(tmp_path):
    """Only decode-only steps profiled both ways count; per band the means per step of each part's eager and graph
    durations and graph span, and the replay's wall time (its spans summed); a run with none says what to run."""
    import gzip

    from benchmarks.live_e2e import run as le

    run = tmp_path / "run"
    run.mkdir()
    (run / "measured.json").write_text(json.dumps({"meta": {"device": "GPU"}, "measured": {"vllm-table": {
        "gpu_before": {"sm_mhz": 1980.0}}}}))
    both = {"kernels": {"busy_us": 900.0, "by_part_us": {"fused_moe": 600.0, "dense": 300.0}},
            "kernels_graph": {"busy_us": 800.0, "by_part_us": {"fused_moe": 500.0, "dense": 300.0},
                              "by_part_span_us": {"fused_moe": 700.0, "dense": 400.0}}}
    steps = [{"chunks": [], "decode_batch": 3, "seconds": 0.0012, **both},
             {"chunks": [], "decode_batch": 4, "seconds": 0.0014, **both},
             {"chunks": [], "decode_batch": 4, "seconds": 0.001, "kernels": both["kernels"]},
             {"chunks": [[1, 64, 0]], "decode_batch": 4, "seconds": 0.01, **both}]
    with gzip.open(le.steps_path(run, "vllm-table").with_suffix(".json.gz"), "wt") as f:
        json.dump(steps, f)
    band = bc.profile_pairs(run)["vllm-table"]["3-4"]
    assert band["steps"] == 2 and band["measured_step_ms"] == pytest.approx(1.3)
    assert band["graph_wall_ms"] == pytest.approx(1.1) and band["eager_busy_ms"] == pytest.approx(0.9)
    assert band["parts"]["fused_moe"] == pytest.approx({"eager_ms": 0.6, "graph_ms": 0.5, "graph_span_ms": 0.7})
    out = tmp_path / "pairs.json"
    assert bc.main(["--profiles", str(run), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["policies"]["vllm-table"]["3-4"] == band
    assert written["clocks"] == {"device": "GPU", "policies": {"vllm-table": {"gpu_before": {"sm_mhz": 1980.0},
                                                                              "gpu_after": None}}}
    (run / "vllm-table_steps.json.gz").unlink()
    with pytest.raises(SystemExit, match="profile-every"):
        bc.main(["--profiles", str(run), "--out", str(out)])


def test_profiled_parts_prefer_the_parts_placed_by_position(monkeypatch, tmp_path):
    """A profile that also holds the parts by each kernel's place in the step (run.call_parts, from session 57) is
    read by those: the MoE call's elementwise kernels count with the MoE, not with the dense ops."""
    from benchmarks.live_e2e import run as le

    graph = {"busy_us": 7000.0, "by_part_us": {"fused_moe": 4500.0, "dense": 2500.0},
             "by_part_span_us": {"fused_moe": 5000.0, "dense": 3000.0},
             "by_call_span_us": {"fused_moe": 5000.0, "moe_routing": 800.0, "dense": 2200.0}}
    priced = [("graph", False, 0.010, 0.0075, 12, {"fused_moe": 0.006, "dense": 0.002}, graph)]
    monkeypatch.setattr(le, "predict_setup", lambda args: ({"measured": {"p": {}}}, {}, None, None, None, None, {}))
    monkeypatch.setattr(le, "priced_steps", lambda *a, **k: priced)
    monkeypatch.setattr(le, "read_steps", lambda out, spec: [{"kernels": graph, "kernels_graph": graph}])
    monkeypatch.setattr(le, "policy_issue_s", lambda args, measured: (None, ""))
    band = bc.profiled_parts(tmp_path)["p"]["9-16"]
    assert band["parts"]["fused_moe"]["measured_ms"] == pytest.approx(5.8)
    assert band["parts"]["dense"]["measured_ms"] == pytest.approx(2.2)
    assert band["dense_and_moe"]["measured_ms"] == pytest.approx(8.0)
