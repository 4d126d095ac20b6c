"""benchmarks/live_e2e/decode_graph_table.py (the live policies' decode configs timed as the stack's CUDA graphs
replay them) and run.py --predict --decode-graph, which fits the decode wave model on those times."""

import json

import numpy as np
import pytest

from benchmarks.live_e2e import decode_graph_table as dgt
from benchmarks.live_e2e import run as le
from kernel_gym.kernels.decode_attention import program_rounds
from kernel_gym.kernels.workloads import DecodeWorkload
from kernel_gym.measure.roofline import RooflineTimer
from kernel_gym.traffic import decode_waves as dw


def test_smoke_times_every_planned_point_checked_and_the_table_reads_back(tmp_path):
    """CPU dry run under the interpreter: the tiny model's plan, every point timed (wall clock) after its layer-0
    check, the table written and read back as {config: {(batch, context): seconds}}."""
    assert dgt.main(["--smoke", "--out", str(tmp_path)]) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    doc = json.loads((tmp_path / dgt.OUT_NAME).read_text())
    points = plan["models"]["tiny-moe"]["points"]
    timed = doc["models"]["tiny-moe"]["ms"]
    assert set(timed) == set(points) and points
    for cfg, pts in points.items():
        assert {f"{b},{c}" for b, c in pts} == set(timed[cfg])
        assert all("ms" in r and "error" not in r for r in timed[cfg].values())
    back = dgt.graph_times(tmp_path / dgt.OUT_NAME, "tiny-moe")
    cfg = next(iter(points))
    b, c = points[cfg][0]
    assert back[cfg][(b, c)] == pytest.approx(timed[cfg][f"{b},{c}"]["ms"] * 1e-3)
    assert dgt.graph_times(tmp_path / dgt.OUT_NAME, "other") is None


def test_committed_plan_holds_the_live_policies_configs_within_the_kv_cap():
    plan = json.loads(dgt.PLAN_PATH.read_text())
    assert set(plan["models"]) == set(dgt.MODEL_POLICIES)
    for entry in plan["models"].values():
        assert entry["points"]
        for pts in entry["points"].values():
            assert all(b * c <= plan["max_kv_tokens"] for b, c in pts)
    # the learned table's split-KV config the profiled steps over-priced is planned
    assert any('"NUM_SPLITS":16' in cfg for cfg in plan["models"]["mixtral-8x7b"]["points"])


def test_predict_fits_the_wave_model_on_the_graph_table_where_it_times_the_config():
    trace = le.window_trace("bundled", 0.0, 30.0, 1.0, 60, 3).head(le.SMOKE_REQUESTS)
    sim = le.PredictSimulator(le.TINY, trace, RooflineTimer(0.5), le.DefaultChooser(), None, kv_layout=le.PAGE,
                              dtype="float32", gpu_memory_bytes=le.pool_memory(le.TINY, 0.002),
                              max_num_batched_tokens=48, max_num_seqs=256, decode_waves=True)
    m = le.TINY
    contexts = np.array([900, 100, 100, 100])
    sim._decode_s(4, float(contexts.mean()), 900.0, [], contexts)  # the config the chooser serves, on the roofline
    cfg = sim._last_cfg["decode_attention"]
    slots, launch, token = 64, 3e-6, 2e-8  # a graph table that follows the model with these

    def rounds(b, c, cfg=cfg):
        return program_rounds(DecodeWorkload(m.num_heads, m.num_kv_heads, m.head_dim, b, c, "float32").context_lens(),
                              cfg, m.num_heads, m.num_kv_heads)

    table = {str(cfg): {(b, c): launch + token * dw.makespan(rounds(b, c), slots)
                        for b in dw.FIT_BATCHES for c in dw.FIT_CONTEXTS}}
    graphed = le.PredictSimulator(le.TINY, trace, RooflineTimer(0.5), le.DefaultChooser(), None, kv_layout=le.PAGE,
                                  dtype="float32", gpu_memory_bytes=le.pool_memory(le.TINY, 0.002),
                                  max_num_batched_tokens=48, max_num_seqs=256, decode_waves=True)
    graphed.decode_graph = table
    t = graphed._decode_s(4, float(contexts.mean()), 900.0, [], contexts)
    assert graphed.decode_graph_fits == 1
    ctx = [int(-(-c // 16) * 16) for c in contexts]
    want = launch + token * dw.makespan(program_rounds(ctx, cfg, m.num_heads, m.num_kv_heads), slots)
    assert t == pytest.approx(want, rel=0.1)
    assert sim.decode_graph_fits == 0  # without the table: the timer's times (here the roofline)


def test_a_plan_timed_in_two_parts_skips_what_the_first_timed_and_predict_reads_both(tmp_path):
    """--done TABLE drops the points an earlier table timed (not its errors), and --decode-graph A,B merges the two
    tables' points per config."""
    cfg = '{"BLOCK_N":16}'
    plan = {"models": {"m": {"points": {cfg: [[1, 128], [4, 128], [16, 128]]}}}}

    def table(path, points):
        path.write_text(json.dumps({"meta": {}, "models": {"m": {"ms": {cfg: points}, "skipped_points": 1}}}))
        return path

    first = table(tmp_path / "a.json", {"1,128": {"ms": 0.01}, "4,128": {"error": "RuntimeError: x"}})
    rest, dropped = dgt.drop_done(plan, [first])
    assert dropped == 1 and rest["models"]["m"]["points"][cfg] == [[4, 128], [16, 128]]
    assert plan["models"]["m"]["points"][cfg] == [[1, 128], [4, 128], [16, 128]]  # the plan itself is left as it was
    second = table(tmp_path / "b.json", {"4,128": {"ms": 0.02}, "16,128": {"ms": 0.03}})
    args = le.build_parser().parse_args(["--out", str(tmp_path), "--predict", "--decode-graph", f"{first},{second}"])
    shown = le.decode_graph_setup(args, le.TINY.__class__(**{**le.TINY.__dict__, "name": "m"}))
    assert args.decode_graph_s == {cfg: {(1, 128): 1e-5, (4, 128): 2e-5, (16, 128): 3e-5}}
    assert shown["configs"] == 1 and "a.json" in shown["table"] and "b.json" in shown["table"]
    with pytest.raises(SystemExit, match="no such file"):
        dgt.main(["--out", str(tmp_path / "o"), "--done", str(tmp_path / "missing.json")])


def test_the_rest_of_a_plan_times_the_most_served_configs_first():
    plan = {"models": {"m": {"points": {"A": [[1, 128]], "B": [[1, 128], [4, 128]], "C": [[1, 128]]}}}}
    rest = dgt.rest_plan(plan, [], {("m", "A"): 5, ("m", "B"): 500, ("m", "C"): 50}, min_steps=10)
    assert list(rest["models"]["m"]["points"]) == ["B", "C"]  # most served first, A (5 steps) left out
    assert rest["models"]["m"]["served_steps"] == {"B": 500, "C": 50}


def test_served_steps_counts_each_configs_decode_steps_in_the_live_runs(tmp_path, monkeypatch):
    """served_steps reads each check row's step records (under live_e2e/, not predicted/) and counts the decode steps
    per (model, config); steps with no decode rows or no config are not counted."""
    steps = [{"decode_batch": 4, "configs": {"decode_attention": "A"}},
             {"decode_batch": 0, "configs": {"decode_attention": "A"}},  # a prefill-only step
             {"decode_batch": 2, "configs": {"decode_attention": "B"}},
             {"decode_batch": 2, "configs": {}}]
    seen = []
    monkeypatch.setattr(le, "read_steps", lambda run, spec: seen.append((run, spec)) or steps)
    rows = [{"run": "benchmarks/live_e2e/predicted/w/r", "model": "m", "policy": "vllm-table"}]
    assert dgt.served_steps(rows) == {("m", "A"): 1, ("m", "B"): 1}
    assert seen[0][0].as_posix().endswith("benchmarks/live_e2e/w/r") and seen[0][1] == "vllm-table"
    with pytest.raises(SystemExit):
        dgt.main(["--plan", str(dgt.PLAN_PATH), "--done", str(dgt.PLAN_PATH)])  # would overwrite the plan itself


def test_predict_refuses_a_table_timed_on_another_gpu(tmp_path):
    """A decode_graph.json (or any --predict table) whose meta.device differs from the live run's is refused by name;
    the committed tables all match the committed runs' H200."""
    table = tmp_path / "decode_graph.json"
    table.write_text(json.dumps({"meta": {"device": "NVIDIA H100 80GB HBM3"}, "models": {}}))
    args = le.build_parser().parse_args(["--out", str(tmp_path), "--predict", "--decode-graph", str(table)])
    with pytest.raises(SystemExit, match=r"--decode-graph .*timed on NVIDIA H100 80GB HBM3, but the live run ran on "
                                         r"NVIDIA H200"):
        le.check_table_devices(args, "NVIDIA H200")
    le.check_table_devices(args, None)  # a run that names no device: nothing to compare
    defaults = le.build_parser().parse_args(["--out", str(tmp_path), "--predict"])
    le.check_table_devices(defaults, "NVIDIA H200")


def test_the_served_plan_holds_the_configs_the_chooser_serves_at_recorded_steps_that_no_table_times(tmp_path):
    """--served-by: the configs today's chooser serves at a run's recorded decode steps (the committed held-out
    window's learned table among its policies: moved onto 16-token pages per shape), less those a --done table times,
    each at the points its rules accept; a folder without measured.json is refused by name."""
    from kernel_gym.kernels.decode_attention import SPACE
    from kernel_gym.kernels.space import Config

    run = dgt.HERE / "heldout_bffac01" / "code540_mixtral"
    m = le.load_model("mixtral-8x7b")
    spec = "table:benchmarks/live_e2e/tables/mixtral_seed0/dispatch_table.json"
    step = next(r for r in le.read_steps(run, spec) if r["decode_batch"])
    first = le.step_decode_config(le.make_chooser(spec, m), m, step)
    done = tmp_path / "decode_graph.json"
    done.write_text(json.dumps({"models": {"mixtral-8x7b": {"ms": {first: {"4,1024": {"ms": 0.01}}}}}}))
    plan = dgt.served_plan([run], [done], (4, 8, 16, 32, 64), (1024, 4096), min_steps=2)["models"]["mixtral-8x7b"]
    assert first not in plan["served_steps"] and plan["served_steps"]
    assert all(n >= 2 for n in plan["served_steps"].values())
    assert set(plan["points"]) <= set(plan["served_steps"])
    for cfg, pts in plan["points"].items():
        assert pts and all(SPACE.is_valid(Config.parse(cfg), DecodeWorkload(m.num_heads, m.num_kv_heads, m.head_dim,
                                                                            b, c, "bfloat16")) for b, c in pts)
    with pytest.raises(SystemExit, match="measured.json"):
        dgt.served_plan([tmp_path], [], (4,), (1024,))


def test_graph_times_reads_the_flushed_times_only_where_a_point_has_them(tmp_path):
    """--also-flushed adds flushed_ms beside ms; graph_times(key="flushed_ms") reads those, and only those."""
    from benchmarks.live_e2e.decode_graph_table import graph_times

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"meta": {}, "models": {"m": {"ms": {"cfg": {
        "1,256": {"ms": 0.010, "flushed_ms": 0.013}, "2,256": {"ms": 0.011}, "4,256": {"error": "x"}}}}}}))
    assert graph_times(path, "m") == {"cfg": {(1, 256): pytest.approx(1.0e-5), (2, 256): pytest.approx(1.1e-5)}}
    assert graph_times(path, "m", key="flushed_ms") == {"cfg": {(1, 256): pytest.approx(1.3e-5)}}


def test_predict_fits_on_the_flushed_times_when_asked_and_says_so(tmp_path):
    import argparse

    from kernel_gym.models import load_model

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"meta": {}, "models": {"mixtral-8x7b": {"ms": {"cfg": {
        "1,256": {"ms": 0.010, "flushed_ms": 0.013}}}}}}))
    m = load_model("mixtral-8x7b")
    args = argparse.Namespace(decode_graph=str(path), decode_graph_times="flushed")
    note = le.decode_graph_setup(args, m)
    assert args.decode_graph_s == {"cfg": {(1, 256): pytest.approx(1.3e-5)}} and note["times"] == "flushed"
    args = argparse.Namespace(decode_graph=str(path))
    assert le.decode_graph_setup(args, m)["times"] == "unflushed" and args.decode_graph_s["cfg"][(1, 256)] == 1e-5
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"meta": {}, "models": {"mixtral-8x7b": {"ms": {"cfg": {"1,256": {"ms": 0.010}}}}}}))
    with pytest.raises(SystemExit, match="no flushed times"):
        le.decode_graph_setup(argparse.Namespace(decode_graph=str(plain), decode_graph_times="flushed"), m)


def test_repeats_build_fresh_caches_and_keep_the_median_of_their_graphs(tmp_path, monkeypatch):
    """--repeats N: each repeat builds the layers' caches from new seeds and times its own graph; the point's ms is
    the median over the repeats (each kept), so one allocation sitting on a slow speed does not set the table."""
    seeds, times = [], iter([1.0, 1.3, 0.9])

    class Family:
        def make_inputs(self, wl, device, seed):
            seeds.append(seed)
            return seed

        def prepare(self, x, cfg):
            return x

        def reference(self, x):
            return x

    def fake_replayed(meas, calls, ref0, dtype, family, also_flushed):
        t = next(times)
        return {"ms": t, "flushed_ms": 2 * t, "spread": 0.01}

    monkeypatch.setattr(dgt, "replayed_layers", fake_replayed)
    wl = type("WL", (), {"dtype": "float32"})()
    res = dgt.time_point(None, Family(), wl, None, layers=2, device="cpu", also_flushed=True, repeats=3)
    assert seeds == [0, 1, 2, 3, 4, 5]  # every repeat's layers get caches of their own
    assert res["ms"] == 1.0 and res["repeat_ms"] == [1.0, 1.3, 0.9]
    assert res["flushed_ms"] == 2.0 and res["repeat_flushed_ms"] == [2.0, 2.6, 1.8]
    assert res["repeat_ratio"] == pytest.approx(1.3 / 0.9)

    monkeypatch.setattr(dgt, "replayed_layers", lambda *a: {"error": "layer 0: wrong"} if seeds[-1] > 2 else
                        {"ms": 1.0})
    seeds.clear()
    assert dgt.time_point(None, Family(), wl, None, 2, "cpu", repeats=3) == {"error": "repeat 1: layer 0: wrong"}


def test_smoke_with_repeats_writes_each_repeat_and_refuses_zero(tmp_path, monkeypatch):
    # one (batch, context) point per config: what --repeats adds is per point, and the smoke above times every
    # point of the full smoke plan already (each point is a few seconds under the interpreter, twice here)
    monkeypatch.setattr(dgt, "SMOKE_BATCHES", dgt.SMOKE_BATCHES[:1])
    monkeypatch.setattr(dgt, "SMOKE_CONTEXTS", dgt.SMOKE_CONTEXTS[:1])
    assert dgt.main(["--smoke", "--out", str(tmp_path), "--repeats", "2"]) == 0
    doc = json.loads((tmp_path / dgt.OUT_NAME).read_text())
    assert doc["meta"]["repeats"] == 2
    rows = [r for per in doc["models"]["tiny-moe"]["ms"].values() for r in per.values()]
    assert rows and all(len(r["repeat_ms"]) == 2 and r["ms"] == min(r["repeat_ms"]) for r in rows)  # a graph's own
    with pytest.raises(SystemExit):
        dgt.main(["--smoke", "--out", str(tmp_path), "--repeats", "0"])
