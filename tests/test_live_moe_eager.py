"""The eager steps' prices (session 48): the live MoE call timed as an eager step of benchmarks/live_e2e/run.py runs
it (moe_graph_table.py --eager, its committed plan moe_eager_plan.json) and the dense ops timed eagerly
(dense_price_check.py --eager), read by run.py --predict through --moe-eager and --dense-eager; without them every
price stays as it was."""

import argparse
import gzip
import json
import shutil
from pathlib import Path

import pytest

from benchmarks.live_e2e import dense_price_check as dpc
from benchmarks.live_e2e import moe_graph_table as mgt
from benchmarks.live_e2e import run as le
from benchmarks.live_e2e.moe_price_check import _live_simulator, live_config
from kernel_gym.kernels import fused_moe as fm
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.measure.roofline import RooflineTimer
from kernel_gym.models import load_model

HERE = Path(le.__file__).resolve().parent
RETRAINED = HERE / "retrained"
RUN = RETRAINED / "run1_seed0_53398a4" / "window5"  # predicted at be62885 as committed, no eager table


def _plan() -> dict:
    return json.loads(mgt.EAGER_PLAN_PATH.read_text())


def test_eager_plan_spans_the_eager_steps_sizes_for_every_live_policy():
    plan = _plan()
    assert plan["mode"] == "eager" and plan["dtype"] == "bfloat16"
    assert plan["grid"] == list(le.EAGER_GRID)
    assert plan["grid"][0] == le.PIECEWISE_MAX_TOKENS  # eager steps are the ones above the piecewise graphs
    assert plan["grid"][-1] >= 4096  # the chunk budget every live run used (decodes included)
    assert {m: tuple(e["policies"]) for m, e in plan["models"].items()} == mgt.EAGER_MODEL_POLICIES
    assert len(mgt.EAGER_MODEL_POLICIES["mixtral-8x7b"]) == 6  # default, vllm-table, the learned and 3 retrained
    for entry in plan["models"].values():
        assert set(entry["points"]) == {str(g) for g in plan["grid"]}


@pytest.mark.parametrize("spec", [p for p in mgt.EAGER_MODEL_POLICIES["mixtral-8x7b"] if p != "vllm-table"])
def test_eager_plan_holds_run_pys_own_choice_at_both_grid_points_around_each_size(spec):
    """run.py's chooser path (LiveSimulator._moe_config at the step's unpadded token count) for sizes across the
    eager range: the config is planned at both grid points that bracket the size."""
    plan = _plan()["models"]["mixtral-8x7b"]["points"]
    sim = _live_simulator(load_model("mixtral-8x7b"), spec, "bfloat16")
    for t in (513, 600, 777, 1000, 1234, 1357, 1800, 2500, 3333, 4000, 4096):
        cfg = live_config(sim, t, t)
        for g in set(mgt.bracket(t, le.EAGER_GRID)):
            assert cfg in plan[str(g)], (spec, t, g)


def _steps(run: Path, spec: str) -> list[dict]:
    return json.loads(gzip.decompress(le.steps_path(run, spec).with_suffix(".json.gz").read_bytes()))


def test_eager_plan_holds_every_config_the_retrained_runs_eager_steps_ran():
    """Every step over 512 tokens in the session-48 runs (vllm-table and the retrained tables, on today's data): the
    MoE config it recorded is planned at both grid points around its token count."""
    plan = _plan()["models"]["mixtral-8x7b"]["points"]
    checked = 0
    for measured in sorted(RETRAINED.glob("run*/window*/measured.json")):
        for spec in json.loads(measured.read_text())["measured"]:
            for r in _steps(measured.parent, spec):
                if r["chunks"] and r["tokens"] > le.PIECEWISE_MAX_TOKENS:
                    for g in set(mgt.bracket(r["tokens"], le.EAGER_GRID)):
                        assert r["configs"]["fused_moe"] in plan[str(g)], (measured, spec, r["tokens"], g)
                    checked += 1
    assert checked > 1000


def test_eager_smoke_times_every_planned_point_under_the_interpreter(tmp_path):
    assert mgt.main(["--eager", "--smoke", "--out", str(tmp_path)]) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    doc = json.loads((tmp_path / mgt.EAGER_OUT_NAME).read_text())
    assert plan["mode"] == doc["meta"]["mode"] == "eager" and plan["grid"] == list(mgt.SMOKE_EAGER_GRID)
    assert not (tmp_path / mgt.OUT_NAME).exists()
    points = plan["models"]["tiny-moe"]["points"]
    timed = doc["models"]["tiny-moe"]["ms"]
    assert points and all("ms" in timed[cfg][t] and timed[cfg][t]["layers"] == 2
                          for t, cfgs in points.items() for cfg in cfgs)
    sim = _live_simulator(le.TINY, "default", "float32")
    m = le.TINY
    for t in range(mgt.SMOKE_EAGER_GRID[0] + 1, mgt.SMOKE_EAGER_GRID[-1] + 1):  # unpadded sizes, not capture sizes
        cfg = live_config(sim, t, t)
        for g in set(mgt.bracket(t, mgt.SMOKE_EAGER_GRID)):  # planned where the family's rules take it at g
            wl = MoEWorkload(g, m.num_experts, m.top_k, m.hidden, m.intermediate, 0.0, "float32")
            assert (cfg in points[str(g)]) == fm.FAMILY.space.is_valid(Config.parse(cfg), wl)
    table = le.MoEEagerTable.from_table(tmp_path / mgt.EAGER_OUT_NAME, "tiny-moe")
    assert table is not None and set(table.points) == {c for cfgs in points.values() for c in cfgs}


def test_a_graph_plan_is_not_timed_as_eager(tmp_path):
    with pytest.raises(SystemExit, match="graph plan"):
        mgt.main(["--eager", "--plan", str(mgt.PLAN_PATH), "--out", str(tmp_path)])


def test_dense_eager_smoke_writes_a_table_the_prediction_reads(tmp_path):
    out = tmp_path / "dense_eager.json"
    assert dpc.main(["--smoke", "--eager", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["mode"] == "eager" and set(table["models"]["tiny-moe"]["layer_ms"]) == {"8", "16"}
    ops = le.DenseOps.from_table(out, "tiny-moe")
    assert ops.covers(8) and ops.covers(12) and not ops.covers(4) and not ops.covers(17)


def test_eager_table_is_linear_in_tokens_between_its_points_and_not_clamped():
    t = le.MoEEagerTable({"A": {512: 1e-3, 1024: 3e-3}})
    assert t("A", 768) == pytest.approx(2e-3)  # halfway in tokens (log2 would give 2e-3 at 724)
    assert t("A", 511) is None and t("A", 1025) is None and t("B", 768) is None


def _sim(graphs: bool = True) -> le.PredictSimulator:
    trace = le.window_trace("bundled", 0.0, 30.0, 1.0, 60, 3).head(le.SMOKE_REQUESTS)
    return le.PredictSimulator(le.TINY, trace, RooflineTimer(0.5), le.DefaultChooser(), None, kv_layout=le.PAGE,
                               dtype="float32", gpu_memory_bytes=le.pool_memory(le.TINY, 0.002),
                               max_num_batched_tokens=4096, max_num_seqs=256,
                               **le.graph_kwargs({"cuda_graphs": graphs}))


CHUNKS = [(0, 600, 0)]  # with 3 decodes: a 603-token step, over the piecewise graphs: eager


def test_an_eager_steps_moe_comes_from_the_eager_table_with_the_routing_inside_and_misses_are_counted():
    layers = le.TINY.num_layers
    probe = _sim()
    probe.price_step(CHUNKS, 3, 200.0, 3, [])
    cfg = str(probe._last_cfg["fused_moe"])
    routing = le.TokenTable({1: 1e-5, 4096: 2e-5})
    plain, eager = _sim(), _sim()
    for s in (plain, eager):
        s.moe_routing_s = routing
    eager.moe_eager = le.MoEEagerTable({cfg: {512: 1e-3, 768: 2e-3}})
    a = plain.price_step(CHUNKS, 3, 200.0, 3, [])
    b = eager.price_step(CHUNKS, 3, 200.0, 3, [])
    g = 1e-3 + (603 - 512) / 256 * 1e-3
    dataset_moe = eager.moe_eager_replaced_s / layers
    assert eager.moe_eager_steps == 1 and eager.moe_eager_charged_s == pytest.approx(g * layers)
    assert b[0] - a[0] == pytest.approx((g - dataset_moe) * layers - routing(603) * layers)
    assert b[1] == a[1]  # the dense ops are not the MoE table's
    assert eager.moe_routing_charged_s == 0.0 and plain.moe_routing_charged_s > 0
    assert plain.moe_eager_steps == plain.moe_eager_missed == 0  # no table: nothing counted, the price as before
    for table in ({"another config": {512: 1e-3, 768: 2e-3}}, {cfg: {768: 1e-3, 1024: 2e-3}}):  # no config; no bracket
        missed = _sim()
        missed.moe_routing_s = routing
        missed.moe_eager = le.MoEEagerTable(table)
        assert missed.price_step(CHUNKS, 3, 200.0, 3, []) == pytest.approx(a)
        assert missed.moe_eager_missed == 1 and missed.moe_eager_steps == 0 and missed.moe_eager_charged_s == 0
    graphed = _sim()  # a decode-only step of 3 replays a graph: the eager table is not asked
    graphed.moe_eager = le.MoEEagerTable({cfg: {1: 1e-3, 4096: 2e-3}})
    assert graphed.price_step([], 3, 200.0, 3, []) == pytest.approx(_sim().price_step([], 3, 200.0, 3, []))
    assert graphed.moe_eager_steps == graphed.moe_eager_missed == 0


def test_an_eager_steps_dense_ops_come_from_the_eager_dense_table_within_its_tokens():
    layer = le.TokenTable({256: 1e-4, 4096: 1e-3})
    sample = le.TokenTable({1: 1e-5, 256: 2e-5})
    graph_ops = le.DenseOps(layer, sample)
    eager_ops = le.DenseOps(le.TokenTable({512: 5e-4, 1024: 7e-4}), sample)
    plain, eager = _sim(), _sim()
    for s in (plain, eager):
        s.dense_ops = graph_ops
    eager.dense_eager = eager_ops
    assert eager.price_step(CHUNKS, 3, 200.0, 3, [])[1] == pytest.approx(eager_ops(603, 3, le.TINY.num_layers))
    assert plain.price_step(CHUNKS, 3, 200.0, 3, [])[1] == pytest.approx(graph_ops(603, 3, le.TINY.num_layers))
    assert eager.dense_eager_steps == 1
    big = [(0, 2000, 0)]  # outside the eager dense table: the graph table's price, counted
    assert eager.price_step(big, 3, 200.0, 3, [])[1] == pytest.approx(graph_ops(2003, 3, le.TINY.num_layers))
    assert eager.dense_eager_missed == 1 and eager.dense_eager_steps == 1


def _args(out: Path, moe_eager: str = "none") -> argparse.Namespace:
    """--predict's defaults (run.main) with this eager table; decode priced as the committed summaries were (before
    --decode-waves)."""
    return argparse.Namespace(
        out=out, moe_routing=str(le.MOE_ROUTING_TABLE), dense_ops=str(le.DENSE_OPS_TABLE),
        moe_graph=",".join(str(t) for t in le.MOE_GRAPH_TABLES), moe_eager=moe_eager, dense_eager="none",
        decode_waves="off",
        step_host=",".join(str(r) for r in le.STEP_HOST_RUNS),
        eager_issue=",".join(str(r) for r in le.EAGER_ISSUE_RUNS))


def test_without_an_eager_table_a_committed_run_prices_its_steps_as_committed_and_with_one_only_eager_moe_moves(
        tmp_path):
    spec = "vllm-table"
    data = json.loads((RUN / "measured.json").read_text())
    data["measured"] = {spec: data["measured"][spec]}
    (tmp_path / "measured.json").write_text(json.dumps(data))
    shutil.copy(le.steps_path(RUN, spec).with_suffix(".json.gz"), tmp_path)
    args = _args(tmp_path)
    _, meta, model, trace, backend, timer, prediction = le.predict_setup(args)
    assert prediction["moe_eager"].startswith("none")
    plain = le.priced_steps(tmp_path, spec, model, trace, timer, backend, args, meta)
    want = json.loads((RUN / "summary.json").read_text())["step_check"][spec]
    overheads = args.step_host_s
    got = le.step_check(plain, overheads)
    for group in ("decode_only", "with_prefill"):
        assert got[group]["predicted_s"] == pytest.approx(want[group]["predicted_s"], rel=1e-12)
        assert got[group]["price_shares"] == pytest.approx(want[group]["price_shares"], rel=1e-9)

    # a hand-written eager table: every planned config at every grid point, 1 ms per layer per 1024 tokens
    points = _plan()["models"][model.name]["points"]
    table = {"models": {model.name: {"ms": {}}}}
    for g, cfgs in points.items():
        for cfg in cfgs:
            table["models"][model.name]["ms"].setdefault(cfg, {})[g] = {"ms": int(g) / 1024}
    path = tmp_path / "moe_eager.json"
    path.write_text(json.dumps(table))
    eager_args = argparse.Namespace(**{**vars(args), "moe_eager": str(path)})  # the other tables as loaded
    note = le.moe_eager_setup(eager_args, model)
    assert note["configs"] == len(table["models"][model.name]["ms"])
    eager = le.priced_steps(tmp_path, spec, model, trace, timer, backend, eager_args, meta)
    moved = 0
    for r, p, e in zip(_steps(RUN, spec), plain, eager, strict=True):
        assert sum(e[5].values()) == pytest.approx(e[3], rel=1e-9)  # the parts add up to the price
        if e[0] != "eager":
            assert e[3] == pytest.approx(p[3], rel=1e-12) and e[5] == pytest.approx(p[5], rel=1e-9)
            continue
        assert "moe_routing" not in e[5] and "moe_routing" in p[5]  # the timed call routes inside
        assert e[5]["fused_moe"] == pytest.approx(r["tokens"] / 1024 * 1e-3 * model.num_layers)
        assert e[3] - p[3] == pytest.approx(e[5]["fused_moe"] - p[5]["fused_moe"] - p[5]["moe_routing"])
        moved += 1
    assert moved > 100
    checked = le.step_check(eager, overheads)
    assert checked["decode_only"]["predicted_s"] == pytest.approx(got["decode_only"]["predicted_s"], rel=1e-12)
    assert checked["with_prefill"]["predicted_s"] != pytest.approx(got["with_prefill"]["predicted_s"])
    assert sum(checked["with_prefill"]["price_shares"].values()) == pytest.approx(1.0)
