"""The MoE of steps with prefill chunks (session 49): the live stack routes a chunk's tokens to few experts (they attend
to the same earlier tokens), so moe_graph_table.py --chunk times the live call with every layer's inputs from a
model-shaped forward of one chunk, and run.py --predict --moe-chunk prices those steps' MoE from it; decode-only steps
and `--moe-chunk none` are priced as before. The tables timed in session 52 are the default."""

import json
from pathlib import Path

import pytest
import torch

from benchmarks.live_e2e import moe_graph_table as mgt
from benchmarks.live_e2e import run as le
from benchmarks.live_e2e.moe_price_check import real_router_logits
from kernel_gym.kernels import fused_moe as fm
from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.measure.roofline import RooflineTimer
from kernel_gym.models import load_model

SPEC = dict(hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, num_layers=8, num_experts=8, top_k=2,
            intermediate=512)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_chunks_tokens_go_to_few_experts_in_the_deeper_layers_and_independent_rows_do_not(seed):
    gen = torch.Generator().manual_seed(seed)
    e, h, inter = SPEC["num_experts"], SPEC["hidden"], SPEC["intermediate"]
    weights = [(torch.randn(e, 2 * inter, h, generator=gen) * h ** -0.5,
                torch.randn(e, h, inter, generator=gen) * inter ** -0.5) for _ in range(2)]
    wl = MoEWorkload(256, e, SPEC["top_k"], h, inter, 0.0, "float32")
    inputs = mgt.chunk_inputs(SPEC, wl, weights, gen, "cpu", torch.float32)
    assert len(inputs) == SPEC["num_layers"] and inputs[0].w1 is weights[0][0] and inputs[1].w1 is weights[1][0]
    chunk = mgt.routing_balance(inputs)
    x = torch.randn(256, h, generator=gen)
    rows = mgt.routing_balance([fm.MoEInputs(wl, x, real_router_logits(x, e, seed=i), *weights[0]) for i in range(8)])
    assert all(b >= 1.0 for b in chunk + rows)
    assert sum(chunk[4:]) / 4 > 1.45 > max(rows)  # even routing of 512 slots on 8 experts: ~1.2 at most


def test_the_committed_chunk_plans_hold_every_live_policy_at_the_chunk_steps_sizes():
    for eager, grid in ((False, mgt.CHUNK_GRID), (True, le.EAGER_GRID)):
        plan = json.loads(mgt.plan_path(eager, chunk=True).read_text())
        assert plan["routing"] == "chunk" and plan["mode"] == ("eager" if eager else "graph")
        assert plan["grid"] == list(grid)
        assert {m: tuple(v["policies"]) for m, v in plan["models"].items()} == mgt.EAGER_MODEL_POLICIES
    assert mgt.CHUNK_GRID[-1] == le.PIECEWISE_MAX_TOKENS == le.EAGER_GRID[0]


def test_chunk_smoke_times_every_layer_with_the_chunks_routing_and_refuses_an_even_plan(tmp_path):
    assert mgt.main(["--chunk", "--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "moe_chunk_graph.json").read_text())
    assert doc["meta"]["routing"] == "chunk" and doc["meta"]["mode"] == "graph"
    entry = doc["models"]["tiny-moe"]
    timed = [r for per in entry["ms"].values() for r in per.values()]
    assert timed and all(r["layers"] == le.TINY.num_layers for r in timed)  # every layer, not the weight sets
    assert set(entry["routing_balance"]) == {str(t) for t in mgt.SMOKE_GRID}
    assert all(len(b) == le.TINY.num_layers for b in entry["routing_balance"].values())
    with pytest.raises(SystemExit, match="even-routing plan"):
        mgt.main(["--chunk", "--plan", str(mgt.PLAN_PATH), "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="chunk-routed table"):
        le.moe_chunk_setup(type("A", (), {"moe_chunk": str(le.MOE_GRAPH_TABLES[0])})(), le.TINY)
    with pytest.raises(SystemExit, match="no such file"):
        le.moe_chunk_setup(type("A", (), {"moe_chunk": str(tmp_path / "absent.json")})(), le.TINY)
    args = type("A", (), {"moe_chunk": str(tmp_path / "moe_chunk_graph.json")})()
    note = le.moe_chunk_setup(args, le.TINY)
    assert note["graph"].endswith("moe_chunk_graph.json") and args.moe_chunk_s[1] is None
    assert isinstance(args.moe_chunk_s[0], le.MoEGraphTable)


def _sim() -> le.PredictSimulator:
    trace = le.window_trace("bundled", 0.0, 30.0, 1.0, 60, 3).head(le.SMOKE_REQUESTS)
    return le.PredictSimulator(le.TINY, trace, RooflineTimer(0.5), le.DefaultChooser(), None, kv_layout=le.PAGE,
                               dtype="float32", gpu_memory_bytes=le.pool_memory(le.TINY, 0.002),
                               max_num_batched_tokens=4096, max_num_seqs=256, **le.graph_kwargs({"cuda_graphs": True}))


def test_only_steps_with_chunks_read_the_chunk_tables_and_a_miss_falls_to_the_graph_table():
    layers = le.TINY.num_layers
    probe = _sim()
    probe.price_step([(0, 100, 0)], 3, 200.0, 3, [])  # 103 rows: a piecewise step of 104
    cfg = str(probe._last_cfg["fused_moe"])
    graph = le.MoEGraphTable({cfg: {96: 1e-3, 128: 1e-3}})
    chunked = _sim()
    chunked.moe_graph, chunked.moe_chunk_graph = graph, le.MoEGraphTable({cfg: {96: 3e-3, 128: 3e-3}})
    plain = _sim()
    plain.moe_graph = graph
    a = plain.price_step([(0, 100, 0)], 3, 200.0, 3, [])
    b = chunked.price_step([(0, 100, 0)], 3, 200.0, 3, [])
    assert b[0] - a[0] == pytest.approx(2e-3 * layers) and b[1] == a[1]
    assert chunked.moe_chunk_steps == 1 and chunked.moe_graph_steps == 0
    assert chunked.moe_chunk_charged_s == pytest.approx(3e-3 * layers)
    # a decode-only step replays its decode graph: the chunk table is not asked
    assert chunked.price_step([], 3, 200.0, 3, []) == pytest.approx(plain.price_step([], 3, 200.0, 3, []))
    assert chunked.moe_chunk_steps == 1 and chunked.moe_chunk_missed == 0
    missed = _sim()  # the chunk table does not time this config: counted, and the graph table prices it
    missed.moe_graph, missed.moe_chunk_graph = graph, le.MoEGraphTable({"another": {96: 3e-3, 128: 3e-3}})
    assert missed.price_step([(0, 100, 0)], 3, 200.0, 3, []) == pytest.approx(a)
    assert missed.moe_chunk_missed == 1 and missed.moe_graph_steps == 1
    eager = _sim()  # an eager step with chunks reads the eager chunk table, not the graphed one
    eager.price_step([(0, 600, 0)], 3, 200.0, 3, [])
    big = str(eager._last_cfg["fused_moe"])
    eager = _sim()
    eager.moe_chunk_graph = le.MoEGraphTable({big: {1: 9.0, 4096: 9.0}})
    eager.moe_chunk_eager = le.MoEEagerTable({big: {512: 1e-3, 1024: 1e-3}})
    eager.price_step([(0, 600, 0)], 3, 200.0, 3, [])
    assert eager.moe_chunk_charged_s == pytest.approx(1e-3 * layers)


def test_run_py_defaults_to_the_committed_chunk_tables_and_none_turns_them_off():
    args = le.build_parser().parse_args(["--out", "x", "--predict"])
    assert args.moe_chunk.split(",") == [str(t) for t in le.MOE_CHUNK_TABLES] and all(
        t.exists() for t in le.MOE_CHUNK_TABLES)
    shown = le.moe_chunk_setup(args, load_model("mixtral-8x7b"))
    assert shown["graph"] and shown["eager"] and all(t is not None for t in args.moe_chunk_s)
    off = le.build_parser().parse_args(["--out", "x", "--predict", "--moe-chunk", "none"])
    assert le.moe_chunk_setup(off, le.TINY).startswith("none") and off.moe_chunk_s == (None, None)
    assert Path(le.__file__).with_name("chunk_session.sh").exists()


class SkewTimer(RooflineTimer):
    """The roofline, with the MoE's seconds growing with the routing's skew (1 + skew); LookupError above `limit`."""

    def __init__(self, limit: float = 9.0) -> None:
        super().__init__(0.5)
        self.limit = limit

    def time_s(self, kernel, workload, config):
        t = super().time_s(kernel, workload, config)
        if kernel != "fused_moe":
            return t
        if workload.skew > self.limit:
            raise LookupError("no row at that skew")
        return 1e-4 * (1.0 + workload.skew)


def _skew_sim(routing, limit: float = 9.0) -> le.PredictSimulator:
    trace = le.window_trace("bundled", 0.0, 30.0, 1.0, 60, 3).head(le.SMOKE_REQUESTS)
    sim = le.PredictSimulator(le.TINY, trace, SkewTimer(limit), le.DefaultChooser(), None, kv_layout=le.PAGE,
                              dtype="float32", gpu_memory_bytes=le.pool_memory(le.TINY, 0.002),
                              max_num_batched_tokens=4096, max_num_seqs=256, **le.graph_kwargs({"cuda_graphs": True}))
    sim.chunk_routing = routing
    return sim


def test_a_chunk_step_is_priced_at_each_layers_chunk_skew_and_decode_steps_at_their_own():
    layers = le.TINY.num_layers
    even, skewed = _skew_sim(None), _skew_sim({16: [0.0, 0.0], 128: [0.6, 1.2]})
    a = even.price_step([(0, 100, 0)], 3, 200.0, 3, [])
    b = skewed.price_step([(0, 100, 0)], 3, 200.0, 3, [])  # 100 chunk tokens: nearest in log2 is 128
    moe = 1e-4 * layers
    assert b[0] - a[0] == pytest.approx(moe * ((1.6 + 2.2) / 2 - 1.0))
    assert skewed.chunk_skew_steps == 1 and skewed.chunk_skew_s == pytest.approx(moe * 0.9)
    assert b[1] == a[1]
    assert skewed.price_step([], 3, 200.0, 3, []) == pytest.approx(even.price_step([], 3, 200.0, 3, []))
    assert skewed.chunk_skew_steps == 1
    short = _skew_sim({16: [0.0, 0.0], 128: [0.6, 1.2]})  # a 20-token chunk: the 16-token skews, even here
    assert short.price_step([(0, 20, 0)], 3, 200.0, 3, []) == pytest.approx(even.price_step([(0, 20, 0)], 3, 200.0,
                                                                                              3, []))
    missed = _skew_sim({128: [0.6, 1.2]}, limit=1.0)  # no row at skew 1.2: the even price, counted
    assert missed.price_step([(0, 100, 0)], 3, 200.0, 3, []) == pytest.approx(a)
    assert missed.chunk_skew_missed == 1 and missed.chunk_skew_steps == 0


def test_chunk_routing_setup_reads_a_table_and_refuses_anything_else(tmp_path):
    from benchmarks.live_e2e import chunk_routing as cr

    assert cr.main(["--smoke", "--out", str(tmp_path / "cr.json")]) == 0
    doc = json.loads((tmp_path / "cr.json").read_text())
    for per in doc["models"]["tiny-moe"].values():
        assert len(per["skew"]) == len(per["balance"]) == le.TINY.num_layers
        assert all(0.0 <= s <= cr.MAX_SKEW for s in per["skew"])
    args = type("A", (), {"chunk_routing": str(tmp_path / "cr.json")})()
    assert le.chunk_routing_setup(args, le.TINY)["model"] == "tiny-moe" and set(args.chunk_routing_s) == {8, 16}
    with pytest.raises(SystemExit, match="not a chunk_routing.py table"):
        le.chunk_routing_setup(type("A", (), {"chunk_routing": str(le.MOE_GRAPH_TABLES[0])})(), le.TINY)
    with pytest.raises(SystemExit, match="no such file"):
        le.chunk_routing_setup(type("A", (), {"chunk_routing": str(tmp_path / "absent.json")})(), le.TINY)


def test_matching_skew_inverts_the_even_routings_balance_curve():
    from benchmarks.live_e2e import chunk_routing as cr

    curve = [1.0 + s for s in cr.SKEWS]
    assert cr.matching_skew(0.5, curve) == 0.0 and cr.matching_skew(9.0, curve) == cr.MAX_SKEW
    assert cr.matching_skew(1.625, curve) == pytest.approx(0.625)
    real = [cr.even_balance(256, 8, 2, s, seeds=4) for s in (0.0, 0.6, 1.2)]
    assert real[0] < real[1] < real[2]  # the dataset's skews route less and less evenly


def test_step_check_splits_each_group_by_kind_of_step():
    priced = [("piecewise", True, 0.011, 0.010, 1, {"dense": 0.010}, None),
              ("eager", True, 0.030, 0.020, 1, {"dense": 0.020}, None),
              ("eager", True, 0.030, 0.020, 2, {"dense": 0.020}, None),
              ("graph", False, 0.010, 0.010, 4, {"dense": 0.010}, None)]
    check = le.step_check(priced, {"graph": 0.0, "piecewise": 0.0, "eager": 0.0})
    by = check["with_prefill"]["by_step_kind"]
    assert by["piecewise"] == {"steps": 1, "sum_error": pytest.approx(0.010 / 0.011 - 1)}
    assert by["eager"] == {"steps": 2, "sum_error": pytest.approx(0.040 / 0.060 - 1)}
    assert check["decode_only"]["by_step_kind"] == {"graph": {"steps": 1, "sum_error": pytest.approx(0.0)}}


def test_a_chunk_table_is_not_skewed_again_and_the_other_flags_refuse_it(tmp_path):
    layers = le.TINY.num_layers
    probe = _skew_sim(None)
    probe.price_step([(0, 100, 0)], 3, 200.0, 3, [])
    cfg = str(probe._last_cfg["fused_moe"])
    both = _skew_sim({128: [1.2, 1.2]})
    both.moe_chunk_graph = le.MoEGraphTable({cfg: {96: 3e-3, 128: 3e-3}})
    both.price_step([(0, 100, 0)], 3, 200.0, 3, [])
    assert both.moe_chunk_steps == 1 and both.chunk_skew_steps == 0  # the table holds the chunk's routing already
    assert both.moe_chunk_charged_s == pytest.approx(3e-3 * layers)
    chunk = tmp_path / "moe_chunk_graph.json"
    chunk.write_text(json.dumps({"meta": {"routing": "chunk", "mode": "graph"},
                                 "models": {"tiny-moe": {"ms": {cfg: {"96": {"ms": 1.0}}}}}}))
    with pytest.raises(SystemExit, match="timed with chunk routing"):
        le.moe_graph_setup(type("A", (), {"moe_graph": str(chunk)})(), le.TINY)
    with pytest.raises(SystemExit, match="graph plan"):
        mgt.main(["--chunk", "--eager", "--plan", str(mgt.plan_path(False, True)), "--out", str(tmp_path)])
