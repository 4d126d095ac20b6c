"""benchmarks/live_e2e/run.py --predict's MoE routing charge (--moe-routing): the live fused MoE routes and aligns
inside its launch, which the dataset's rows leave out; the prediction charges it per MoE call x layers from the
measured table (moe_price_check.py's moe_routing.json)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.live_e2e import run as le
from kernel_gym.measure.roofline import RooflineTimer
from kernel_gym.traffic.simulator import _C, capture_size

POINTS = {1: 1e-4, 4: 2e-4, 16: 6e-4}


def table(models: dict[str, dict[int, float]], block_ms: tuple[int, ...] = (16, 64)) -> dict:
    """A routing table as moe_price_check writes it; BLOCK_M 64's times 2% above BLOCK_M 16's (averaged)."""
    return {"meta": {}, "models": {m: {"ms": {str(b): {str(t): {"ms": s * 1e3 * (1.0 + 0.02 * (b == 64))}
                                                      for t, s in pts.items()} for b in block_ms}}
                                   for m, pts in models.items()}}


def test_interpolation_is_linear_in_log2_tokens_and_clamped(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(table({"m": POINTS})))
    r = le.TokenTable.from_routing_table(path, "m")
    avg = 1.01  # the two BLOCK_Ms averaged
    for t, s in POINTS.items():  # at the points
        assert r(t) == pytest.approx(s * avg)
    assert r(2) == pytest.approx(1.5e-4 * avg)  # log2 2 halfway between log2 1 and log2 4
    assert r(8) == pytest.approx((2e-4 + 4e-4 * 0.5) * avg)  # halfway in log2 between 4 and 16, not linear (3.33e-4)
    assert r(0) == r(1) == pytest.approx(1e-4 * avg)  # clamped below
    assert r(10_000) == pytest.approx(6e-4 * avg)  # clamped above
    assert le.TokenTable.from_routing_table(path, "other") is None


def test_committed_table_gives_the_diagnostics_figures():
    r = le.TokenTable.from_routing_table(le.MOE_ROUTING_TABLE, "mixtral-8x7b")
    assert 0.060e-3 < r(32) < 0.068e-3 and 0.085e-3 < r(128) < 0.095e-3 and 0.14e-3 < r(4096) < 0.16e-3
    olmoe = le.TokenTable.from_routing_table(le.MOE_ROUTING_TABLE, "olmoe-1b-7b")
    assert olmoe(1024) == pytest.approx(0.15e-3, rel=0.01)
    assert le.TokenTable.from_routing_table(le.MOE_ROUTING_TABLE, "tiny-moe") is None


def _sim(routing, graphs=True):
    trace = le.window_trace("bundled", 0.0, 30.0, 1.0, 60, 3).head(le.SMOKE_REQUESTS)
    sim = le.PredictSimulator(le.TINY, trace, RooflineTimer(0.5), le.DefaultChooser(), None, kv_layout=le.PAGE,
                              dtype="float32", gpu_memory_bytes=le.pool_memory(le.TINY, 0.002),
                              max_num_batched_tokens=48, max_num_seqs=256,
                              **le.graph_kwargs({"cuda_graphs": graphs}))
    sim.moe_routing_s = routing
    return sim


@pytest.mark.parametrize("graphs", [True, False])
def test_charge_is_per_moe_call_times_layers_at_the_steps_moe_rows(graphs):
    routing = le.TokenTable(POINTS)
    plain, routed = _sim(None, graphs), _sim(routing, graphs)
    for chunks, batch in (([], 3), ([(0, 20, 0)], 5), ([(1, 40, 16)], 0)):
        a = plain.price_step(chunks, batch, 200.0, batch, [])
        b = routed.price_step(chunks, batch, 200.0, batch, [])
        rows = batch + sum(c for _, c, _ in chunks)
        rows = capture_size(rows) if graphs else rows  # a graphed step's MoE runs its padded rows
        assert b[1] == a[1] and b[0] - a[0] == pytest.approx(routing(rows) * le.TINY.num_layers)
    # a whole run: the total charged is the sum over its steps, and every step's kernel time holds its charge
    plain, routed = _sim(None, graphs), _sim(routing, graphs)
    p, r = plain.run(), routed.run()
    steps = r.steps
    rows = [capture_size(int(n)) if graphs and n <= le.PIECEWISE_MAX_TOKENS else int(n)
            for n in steps[:, _C["num_tokens"]]]
    charge = sum(routing(n) for n in rows) * le.TINY.num_layers
    assert routed.moe_routing_charged_s == pytest.approx(charge) and charge > 0
    assert plain.moe_routing_charged_s == 0.0
    assert r.summary["tuned_kernel_s"] > p.summary["tuned_kernel_s"]
    assert r.summary["busy_s"] > p.summary["busy_s"]


# the tests that read the smoke run stay on one xdist worker (scripts/test.sh runs --dist loadgroup), so the module's
# smoke replay (half a minute under the interpreter) runs once, not once per worker
SMOKE_RUN = pytest.mark.xdist_group("live_moe_routing_smoke_run")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    assert le.main(["--out", str(out), "--smoke"]) == 0
    return out


def _predict(out: Path, *flags: str) -> dict:
    assert le.main(["--out", str(out), "--predict", "--smoke", *flags]) == 0
    return json.loads((out / "summary.json").read_text())


@SMOKE_RUN
def test_predict_charges_the_table_and_none_turns_it_off(smoke_run, tmp_path):
    path = tmp_path / "routing.json"
    path.write_text(json.dumps(table({"tiny-moe": POINTS})))
    routed = _predict(smoke_run, "--moe-routing", str(path))
    note = routed["prediction"]["moe_routing"]
    row = routed["policies"]["default"]
    assert note["table"] == str(path) and note["model"] == "tiny-moe"
    assert row["moe_routing_charged_s"] > 0 and note["charged_s"]["default"] == row["moe_routing_charged_s"]
    # the step check's price holds it, as its own share
    off = _predict(smoke_run, "--moe-routing", "none")
    assert off["prediction"]["moe_routing"] == "none: --moe-routing none"
    assert off["policies"]["default"]["moe_routing_charged_s"] == 0.0
    assert row["predicted_busy_s"] > off["policies"]["default"]["predicted_busy_s"]
    assert row["predicted"]["tokens_per_s"] < off["policies"]["default"]["predicted"]["tokens_per_s"]
    # the default table has no tiny-moe entry: no charge, and the summary says so
    default = _predict(smoke_run)
    assert default["prediction"]["moe_routing"].startswith("none: no measured table for tiny-moe")
    assert default["policies"]["default"]["moe_routing_charged_s"] == 0.0
    assert math.isclose(default["policies"]["default"]["predicted_busy_s"],
                        off["policies"]["default"]["predicted_busy_s"])


@SMOKE_RUN
def test_priced_steps_carry_the_routing_as_its_own_part(smoke_run, monkeypatch):
    """step_check's price of each measured step holds the charge, booked as its own part (price_shares)."""
    import kernel_gym.evaluate.replay as replay

    class Guard:  # the parts of GuardedChooser priced_steps reads; the recorded backend has no tiny-model rows
        def __init__(self, policy, backend, layers):
            self.policy, self.layers, self.sim = policy, layers, None
            self.kernel_s: dict[str, float] = {}

        def choose(self, kernel, workload, kv):
            cfg = self.policy.choose(kernel, workload, kv)
            self.kernel_s[kernel] = self.kernel_s.get(kernel, 0.0) + 1e-6 * self.layers
            return cfg

    class Args:
        kv_gb, max_batched_tokens, max_seqs = 0.002, 48, 256

    monkeypatch.setattr(replay, "GuardedChooser", Guard)
    meta = json.loads((smoke_run / "measured.json").read_text())["meta"]
    trace = le.window_trace(meta["trace"], *meta["window"], meta["max_prompt"], meta["max_output"])
    trace = trace.head(le.SMOKE_REQUESTS)
    routing = le.TokenTable(POINTS)
    priced = {}
    for name, r in (("plain", None), ("routed", routing)):
        args = Args()
        args.moe_routing_s = r
        priced[name] = le.priced_steps(smoke_run, "default", le.TINY, trace, RooflineTimer(0.5), None, args, meta)
    assert len(priced["plain"]) == len(priced["routed"]) > 0
    steps = json.loads((smoke_run / "default_steps.json").read_text())
    for a, b, step in zip(priced["plain"], priced["routed"], steps):
        assert "moe_routing" not in a[5]
        rows = capture_size(step["tokens"])  # the smoke's steps are all graphed (full or piecewise)
        assert b[5]["moe_routing"] == pytest.approx(routing(rows) * le.TINY.num_layers)
        assert b[3] - a[3] == pytest.approx(b[5]["moe_routing"])
    check = le.step_check(priced["routed"], dict.fromkeys(le.STEP_KINDS, 0.0))
    assert all(g["price_shares"]["moe_routing"] > 0 for g in check.values())
    assert np.isfinite([b[3] for b in priced["routed"]]).all()


def test_dense_ops_table_prices_each_steps_dense_ops_instead_of_the_roofline(tmp_path):
    """--dense-ops: a step's dense ops cost the table's per-layer time at its rows (its padded rows when graphed) x
    layers plus the sample at its sampling rows; the roofline's price is kept beside it. The committed table gives
    the H200 figures docs/live.md quotes, and a model without an entry is refused (None)."""
    layer, sample = {1: 1e-4, 16: 2e-4}, {1: 5e-5, 4: 8e-5}
    path = tmp_path / "dense.json"
    path.write_text(json.dumps({"models": {"tiny-moe": {
        "layer_ms": {str(t): {"ms": s * 1e3} for t, s in layer.items()},
        "sample_ms": {str(n): {"ms": s * 1e3} for n, s in sample.items()}}}}))
    dense = le.DenseOps.from_table(path, "tiny-moe")
    assert dense(4, 2, 3) == pytest.approx(1.5e-4 * 3 + 6.5e-5) and dense(4, 0, 3) == pytest.approx(4.5e-4)
    assert dense(0, 1, 3) == 0.0 and le.DenseOps.from_table(path, "other") is None
    plain, priced = _sim(None), _sim(None)
    priced.dense_ops = dense
    for chunks, batch, n_logits in (([], 3, 3), ([(0, 20, 0)], 5, 6)):
        a = plain.price_step(chunks, batch, 200.0, n_logits, [])
        b = priced.price_step(chunks, batch, 200.0, n_logits, [])
        rows = capture_size(batch + sum(c for _, c, _ in chunks))
        assert b[0] == a[0] and b[1] == pytest.approx(dense(rows, n_logits, le.TINY.num_layers))
    assert priced.dense_roofline_s == pytest.approx(plain.dense_charged_s) and priced.dense_charged_s > 0
    mixtral = le.DenseOps.from_table(le.DENSE_OPS_TABLE, "mixtral-8x7b")
    assert 77e-6 < mixtral.layer(1) < 78e-6 and 101e-6 < mixtral.layer(32) < 103e-6
    assert le.DenseOps.from_table(le.DENSE_OPS_TABLE, "tiny-moe") is None


@SMOKE_RUN
def test_summary_dir_writes_the_prediction_beside_the_run_and_leaves_the_runs_own(smoke_run, tmp_path):
    own = _predict(smoke_run)
    before = (smoke_run / "summary.json").read_bytes()
    where = tmp_path / "predicted" / "run"
    assert le.main(["--out", str(smoke_run), "--predict", "--smoke", "--moe-routing", "none",
                    "--summary-dir", str(where)]) == 0
    assert (smoke_run / "summary.json").read_bytes() == before  # the committed prediction stays
    beside = json.loads((where / "summary.json").read_text())
    assert beside["prediction"]["moe_routing"] == "none: --moe-routing none"  # this command's flags, not the run's
    assert not (where / "measured.json").exists() and (smoke_run / "measured.json").exists()
    assert beside["policies"].keys() == own["policies"].keys()
