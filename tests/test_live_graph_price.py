"""benchmarks/live_e2e/run.py --predict's prices for graphed steps (session 42): the MoE layer from the table of the
live call timed as its graphs run it (--moe-graph, moe_graph_table.py), the step overhead from the live runs' own
records (--step-host: seconds minus the GPU span), and no compile stalls (the live run compiles untimed)."""

import json

import pytest

from benchmarks.live_e2e import run as le
from kernel_gym.measure.roofline import RooflineTimer
from kernel_gym.traffic.simulator import capture_size


def graph_table(model: str, points: dict[str, dict[int, float]]) -> dict:
    """A moe_graph_table.py table: {models: {MODEL: {ms: {CONFIG: {T: {"ms": ...}}}}}}."""
    return {"meta": {}, "models": {model: {"ms": {cfg: {str(t): {"ms": s * 1e3} for t, s in per.items()}
                                                 for cfg, per in points.items()}}}}


def test_graph_table_interpolates_a_config_between_its_timed_rows_and_answers_none_elsewhere(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(graph_table("m", {"A": {8: 1e-4, 32: 3e-4}, "B": {16: 5e-4}})))
    g = le.MoEGraphTable.from_table(path, "m")
    assert g("A", 8) == pytest.approx(1e-4) and g("A", 32) == pytest.approx(3e-4)
    assert g("A", 16) == pytest.approx(2e-4)  # halfway in log2 rows between 8 and 32
    assert g("A", 4) is None and g("A", 64) is None  # outside the rows the config was timed at: not clamped
    assert g("B", 16) == pytest.approx(5e-4) and g("B", 24) is None
    assert g("C", 16) is None  # a config never timed
    assert le.MoEGraphTable.from_table(path, "other") is None


def _sim(graphs=True):
    trace = le.window_trace("bundled", 0.0, 30.0, 1.0, 60, 3).head(le.SMOKE_REQUESTS)
    return le.PredictSimulator(le.TINY, trace, RooflineTimer(0.5), le.DefaultChooser(), None, kv_layout=le.PAGE,
                               dtype="float32", gpu_memory_bytes=le.pool_memory(le.TINY, 0.002),
                               max_num_batched_tokens=48, max_num_seqs=256,
                               **le.graph_kwargs({"cuda_graphs": graphs}))


def test_graphed_steps_moe_comes_from_the_graph_table_with_the_routing_inside():
    """Where the table times the chosen config at the step's capture size, the step's MoE costs the table's time x
    layers and no routing charge (the table's call routes inside); the dataset's time is kept beside it. A step the
    table cannot answer (a config it never timed) keeps the dataset's row plus the routing charge."""
    probe = _sim()
    probe.price_step([], 3, 200.0, 3, [])
    cfg = str(probe._last_cfg["fused_moe"])  # the default chooser's MoE config for the tiny model
    rows = capture_size(3)
    routing = le.TokenTable({1: 1e-5, 64: 2e-5})
    plain, graphed = _sim(), _sim()
    for s in (plain, graphed):
        s.moe_routing_s = routing
    graphed.moe_graph = le.MoEGraphTable({cfg: {rows: 7e-4}})
    a = plain.price_step([], 3, 200.0, 3, [])
    b = graphed.price_step([], 3, 200.0, 3, [])
    dataset_moe = graphed.moe_graph_replaced_s / le.TINY.num_layers
    assert graphed.moe_graph_steps == 1 and graphed.moe_graph_charged_s == pytest.approx(7e-4 * le.TINY.num_layers)
    assert b[0] - a[0] == pytest.approx((7e-4 - dataset_moe) * le.TINY.num_layers - routing(rows) * le.TINY.num_layers)
    assert graphed.moe_routing_charged_s == 0.0 and plain.moe_routing_charged_s > 0
    missed = _sim()
    missed.moe_routing_s = routing
    missed.moe_graph = le.MoEGraphTable({"another config": {rows: 7e-4}})
    assert missed.price_step([], 3, 200.0, 3, []) == pytest.approx(a)
    assert missed.moe_graph_missed == 1 and missed.moe_graph_steps == 0
    eager = _sim(graphs=False)  # an eager step is not a graph replay: the dataset prices it
    eager.moe_graph = le.MoEGraphTable({cfg: {3: 7e-4}})
    eager.price_step([], 3, 200.0, 3, [])
    assert eager.moe_graph_steps == 0


def _records(path, steps: list[dict]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "measured.json").write_text(json.dumps({"measured": {"default": {}}}))
    (path / "default_steps.json").write_text(json.dumps(steps))


def test_step_host_is_the_median_of_seconds_minus_gpu_span_per_kind_of_step(tmp_path):
    run = tmp_path / "run"
    step = {"chunks": [], "ran_untimed_first": False}
    _records(run, [{**step, "graph_rows": 8, "seconds": 0.010, "gpu_s": 0.0099},
                   {**step, "graph_rows": 8, "seconds": 0.010, "gpu_s": 0.0098},
                   {**step, "graph_rows": 8, "seconds": 0.010, "gpu_s": 0.0097},
                   {**step, "graph_rows": 8, "seconds": 1.0, "gpu_s": 0.5, "ran_untimed_first": True},  # compiled
                   {**step, "piecewise_rows": 16, "seconds": 0.02, "gpu_s": 0.0195},
                   {**step, "seconds": 0.1, "gpu_s": 0.099}])
    host = le.measured_step_host([run])
    assert host["graph"] == {"overhead_s": pytest.approx(2e-4), "steps": 3}
    assert host["piecewise"]["overhead_s"] == pytest.approx(5e-4) and host["eager"]["overhead_s"] == pytest.approx(1e-3)
    old = tmp_path / "old"  # records from before the GPU span was kept: refused with the way out
    _records(old, [{**step, "graph_rows": 8, "seconds": 0.01}])
    with pytest.raises(SystemExit, match="gpu_s.*assumed"):
        le.measured_step_host([old])


def test_committed_step_host_runs_measure_a_graph_replay_far_below_the_assumed_2_ms():
    host = le.measured_step_host(le.STEP_HOST_RUNS)
    assert set(host) == set(le.STEP_KINDS) and all(v["steps"] > 50 for v in host.values())
    assert all(0 < v["overhead_s"] < 2e-4 for v in host.values())


def test_prediction_charges_no_compile_stall(tmp_path):
    """The live run compiles each config and captures each graph untimed: its prediction must not charge them."""
    import argparse

    args = argparse.Namespace(kv_gb=0.002, max_batched_tokens=48, max_seqs=256)
    trace = le.window_trace("bundled", 0.0, 30.0, 1.0, 60, 3).head(le.SMOKE_REQUESTS)
    summary, sim, _ = le._predict_one("default", le.TINY, trace, RooflineTimer(0.5), None, args,
                                      {"cuda_graphs": True, "dtype": "float32"})
    assert sim.stalls and all(s == 0.0 for _, s, _ in sim.stalls)  # first uses still noted, at no cost
    assert summary["stall_s"] == 0.0


def test_eager_issue_is_measured_on_host_bound_eager_steps_and_floors_an_eager_steps_price(tmp_path):
    """--eager-issue: the host's issue seconds per layer, the median over eager steps the GPU waited on (issue_s at
    least 0.95 of the step; GPU-bound steps, whose issue time holds the launch queue's back-pressure, and graphed
    steps left out); an eager step then costs no less than that x layers, the wait kept apart (host_bound_s)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "measured.json").write_text(json.dumps({"meta": {"smoke": True}, "measured": {"default": {}}}))
    layers = le.TINY.num_layers
    eager = {"chunks": [[0, 600, 0]], "ran_untimed_first": False}
    steps = [{**eager, "seconds": 0.010, "issue_s": 0.0099},  # host-bound: 4.95 ms per layer
             {**eager, "seconds": 0.012, "issue_s": 0.0118},  # host-bound: 5.9 ms per layer
             {**eager, "seconds": 0.050, "issue_s": 0.020},  # GPU-bound: left out
             {**eager, "piecewise_rows": 512, "seconds": 0.01, "issue_s": 0.01},  # piecewise: left out
             {"chunks": [], "graph_rows": 8, "ran_untimed_first": False, "seconds": 0.01, "issue_s": 0.01}]
    (run / "default_steps.json").write_text(json.dumps(steps))
    issue = le.measured_eager_issue([run])
    assert issue["steps"] == 2 and issue["of_eager_steps"] == 3
    assert issue["per_layer_s"] == pytest.approx((0.0099 + 0.0118) / 2 / layers)
    (run / "default_steps.json").write_text(json.dumps(steps[2:]))
    with pytest.raises(SystemExit, match="no host-bound eager steps.*none"):
        le.measured_eager_issue([run])

    plain, floored = _sim(graphs=False), _sim(graphs=False)
    floored.eager_issue_per_layer_s = 1.0  # far above any tiny step's kernels: every eager step is host-bound
    a = plain.price_step([(0, 20, 0)], 3, 200.0, 3, [])
    b = floored.price_step([(0, 20, 0)], 3, 200.0, 3, [])
    assert b[0] == a[0] and sum(b) == pytest.approx(1.0 * layers)
    assert floored.host_bound_s == pytest.approx(1.0 * layers - sum(a))
    graphed = _sim(graphs=True)  # a graphed step is replayed, not issued launch by launch: no floor
    graphed.eager_issue_per_layer_s = 1.0
    graphed.price_step([(0, 20, 0)], 3, 200.0, 3, [])
    assert graphed.host_bound_s == 0.0


def test_committed_eager_issue_run_gives_about_a_millisecond_per_layer():
    issue = le.measured_eager_issue(le.EAGER_ISSUE_RUNS)
    assert 0.9e-3 < issue["per_layer_s"] < 1.3e-3 and issue["steps"] > 50


def test_live_check_plot_draws_every_run_against_its_target(tmp_path):
    check = {"models": ["m"], "rows": [
        {"model": "m", "policy": "default", "tokens_per_s": 0.01, "ttft_p50_s": -0.2, "tpot_p50_s": 0.03},
        {"model": "m", "policy": "table:x.json", "tokens_per_s": -0.02, "ttft_p50_s": 0.05, "tpot_p50_s": 0.2}]}
    path = le.plot_live_check(check, tmp_path / "sub" / "check.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert set(le.TARGETS) == set(le.METRICS)  # a panel per metric the check holds


def test_moe_graph_tables_union_first_wins_and_a_model_missing_from_one_is_skipped(tmp_path):
    """--moe-graph A,B: the union of the tables for the model; where both time a config at the same rows the first's
    time holds, and a table without the model adds nothing (the others still answer)."""
    import argparse

    model = le.load_model("mixtral-8x7b")
    a, b, c = (tmp_path / f"{n}.json" for n in "abc")
    a.write_text(json.dumps({"models": {model.name: {"ms": {"cfg1": {"8": {"ms": 1.0}, "16": {"ms": 2.0}}}}}}))
    b.write_text(json.dumps({"models": {model.name: {"ms": {"cfg1": {"16": {"ms": 9.0}, "32": {"ms": 4.0}},
                                                            "cfg2": {"8": {"ms": 5.0}, "64": {"ms": 5.0}}}}}}))
    c.write_text(json.dumps({"models": {"olmoe-1b-7b": {"ms": {"cfg3": {"8": {"ms": 1.0}}}}}}))
    args = argparse.Namespace(moe_graph=f"{a},{c}, {b}")
    note = le.moe_graph_setup(args, model)
    table = args.moe_graph_s
    assert note["configs"] == 2 and len(note["table"].split(",")) == 2  # c holds no Mixtral entry
    assert table("cfg1", 16) == pytest.approx(2e-3)  # a's time, not b's 9 ms
    assert table("cfg1", 32) == pytest.approx(4e-3) and table("cfg2", 32) == pytest.approx(5e-3)
    assert table("cfg1", 64) is None and table("cfg3", 8) is None
    none = argparse.Namespace(moe_graph="none")
    assert le.moe_graph_setup(none, model).startswith("none") and none.moe_graph_s is None


def test_host_issue_reports_each_policys_host_bound_eager_steps(tmp_path):
    """benchmarks/live_e2e/host_issue.py: per policy, the timed eager steps with chunks, the host-bound ones (the rule
    --eager-issue uses) and their median issue time per layer; a policy with no issue times is left out."""
    from benchmarks.live_e2e import host_issue

    run = tmp_path / "run"
    run.mkdir()
    gpu = {"sm_mhz": 1980.0, "throttle": 0}
    host = {"cpu": "some cpu", "cores": 16, "python": "3.12"}
    (run / "measured.json").write_text(json.dumps({"meta": {"smoke": True, "host": host},
                                                   "measured": {"default": {"gpu_before": gpu,
                                                                            "host_issue_calibration": {
                                                                                "per_layer_s": 4e-3}},
                                                                "old": {}}}))
    layers = le.TINY.num_layers
    eager = {"chunks": [[0, 600, 0]], "ran_untimed_first": False}
    (run / "default_steps.json").write_text(json.dumps([
        {**eager, "seconds": 0.010, "issue_s": 0.0099}, {**eager, "seconds": 0.012, "issue_s": 0.0118},
        {**eager, "seconds": 0.050, "issue_s": 0.020}, {**eager, "ran_untimed_first": True, "seconds": 1.0,
                                                         "issue_s": 1.0}]))
    (run / "old_steps.json").write_text(json.dumps([{**eager, "seconds": 0.010}]))  # before issue_s was recorded
    got = host_issue.issue_times(run)
    assert list(got) == ["default"]
    assert got["default"]["eager_chunk_steps"] == 3 and got["default"]["host_bound"] == 2
    assert got["default"]["issue_ms_per_layer_median"] == pytest.approx((9.9 + 11.8) / 2 / layers)
    assert got["default"]["host"] == host and got["default"]["gpu_before"] == gpu  # the machine beside its time
    assert got["default"]["gpu_after"] is None
    assert got["default"]["calibration_before_replay"] == {"per_layer_s": 4e-3}  # run.py's calibrate_issue


def test_compare_checks_counts_by_model_and_policy_and_refuses_checks_of_other_runs(tmp_path):
    from benchmarks.live_e2e import compare_checks as cc

    def row(run, policy, ttft):
        return {"run": run, "model": "m", "policy": policy, "tokens_per_s": 0.01, "ttft_p50_s": ttft,
                "tpot_p50_s": 0.2}
    before = {"rows": [row("a", "vllm-table", -0.2), row("a", "table:x.json", 0.05)]}
    after = {"rows": [row("a", "vllm-table", -0.05), row("a", "table:x.json", 0.05)]}
    got = cc.counts(after)
    assert set(got) == {"m vllm-table", "m learned table"}
    assert got["m vllm-table"]["ttft_p50_s"]["within"] == 1 and got["m vllm-table"]["tpot_p50_s"]["within"] == 0
    paths = []
    other = {"rows": [row("other", "vllm-table", 0.0)] + after["rows"][1:]}
    for name, check in (("b", before), ("a", after), ("o", other)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(check))
    assert cc.main([str(paths[0]), str(paths[1]), "--json", str(tmp_path / "c.json")]) == 0
    by = json.loads((tmp_path / "c.json").read_text())["by_group"]["m vllm-table"]
    assert (by["before"]["ttft_p50_s"]["within"], by["after"]["ttft_p50_s"]["within"]) == (0, 1)
    with pytest.raises(SystemExit, match="different policy runs"):
        cc.main([str(paths[0]), str(paths[2])])
    # --common: a later check that added runs is compared on the runs both cover
    grown = {"rows": after["rows"] + [row("new", "vllm-table", 0.5)]}
    paths.append(tmp_path / "g.json")
    paths[-1].write_text(json.dumps(grown))
    assert cc.main([str(paths[0]), str(paths[3]), "--common", "--json", str(tmp_path / "d.json")]) == 0
    by = json.loads((tmp_path / "d.json").read_text())["by_group"]["m vllm-table"]
    assert (by["before"]["runs"], by["after"]["runs"], by["after"]["ttft_p50_s"]["within"]) == (1, 1, 1)
