"""tune's search: the four candidate sources, the local round, and that the engine's own entry bounds the pick."""

from kernel_gym.deploy import tune
from kernel_gym.kernels import get_family
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.models import load_model

FAM = get_family("fused_moe")
NARROW = MoEWorkload(4096, 512, 10, 2048, 64, 0.0)  # a TP-8 shard of a 512-expert model: N = 64


_BASE = Config(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=3, SPLIT_K=1, FUSE_SILU=0,
               FUSE_WEIGHT=1, FUSE_SUM=0)
_WIDE = [_BASE.replace(BLOCK_M=bm, BLOCK_N=bn, num_warps=8) for bn in (256, 128, 64) for bm in (128, 64, 16)]


def wide_ranker(workload):
    """A wrong policy: prefers the widest tiles the rules allow."""
    return [c for c in _WIDE if FAM.space.is_valid(c, workload)]


def test_first_round_holds_policy_nearest_and_engine():
    near = Config(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3, SPLIT_K=1, FUSE_SILU=1,
                  FUSE_WEIGHT=1, FUSE_SUM=0)
    cands = tune.first_round(NARROW, wide_ranker, 2, nearest=lambda w: [near])
    engine = tune.engine_candidate(NARROW)
    assert engine is not None and FAM.space.is_valid(engine, NARROW)
    assert cands[:2] == wide_ranker(NARROW)[:2] and near in cands and engine in cands
    assert all(FAM.space.is_valid(c, NARROW) for c in cands)
    assert all(c["BLOCK_N"] <= 128 for c in cands)  # the tile-fits rule: nothing wider than 2N unfused


def test_local_round_steps_one_knob_around_the_best_and_pick_is_never_slower_than_engine():
    model = load_model("olmoe-1b-7b")
    plan = tune.tune_plan("fused_moe", model, wide_ranker, 2)
    assert plan and all(len(e["configs"]) >= 2 for e in plan)
    cell = plan[0]
    engine = str(tune.engine_candidate(__import__("kernel_gym.measure.worker", fromlist=["x"]).workload_from_key(
        FAM, cell["workload"])))
    assert engine in cell["configs"]
    times = {(cell["workload"], c): 2.0 for c in cell["configs"]}
    times[(cell["workload"], engine)] = 1.0  # the engine's entry is the fastest measured
    local = tune.local_plan("fused_moe", [cell], times, limit=3)
    assert len(local) == 1 and 1 <= len(local[0]["configs"]) <= 3
    best = Config.parse(engine)
    for c in map(Config.parse, local[0]["configs"]):
        assert sum(FAM.space.value(c, k.name) != FAM.space.value(best, k.name) for k in FAM.space.knobs) == 1
        assert str(c) not in cell["configs"]
    merged = tune.merge_plans([cell], local)
    assert merged[0]["configs"][:len(cell["configs"])] == cell["configs"]
    predict = tune.tuned_predictor(merged, times, lambda ws: [None for _ in ws])
    w = __import__("kernel_gym.measure.worker", fromlist=["x"]).workload_from_key(FAM, cell["workload"])
    assert predict([w]) == [best]
    kept = tune.engine_kept(merged, times)
    assert kept == {"measured": 1, "kept": 1, "geomean_gain": 1.0}
    times[(cell["workload"], local[0]["configs"][0])] = 0.5
    assert tune.engine_kept(tune.merge_plans([cell], local), times)["geomean_gain"] == 2.0


def test_tune_engine_is_the_engine_file_search(capsys, tmp_path):
    """`kernel-gym tune --engine vllm` runs the engine-design search (engine_tune), not the dispatch-table one."""
    from kernel_gym.cli import main

    rc = main(["tune", "--engine", "vllm", "--model", "olmoe-1b-7b", "--dry-run", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "engine entry" in out and "nothing measured (--dry-run)" in out


def test_engine_entry_with_a_tile_fused_moe_lacks_is_snapped_not_dropped():
    """vLLM's tables use BLOCK_SIZE_M 32 and 256, which fused_moe has not: the candidate takes the nearest BLOCK_M the
    rules allow (so the never-slower bound covers every cell), and keeps vLLM's other knobs."""
    from kernel_gym.kernels import vllm_moe

    arctic = load_model("snowflake-arctic@tp8")
    snapped = 0
    for m in (1, 16, 64, 256, 1024, 4096):
        w = MoEWorkload(m, arctic.num_experts, arctic.top_k, arctic.hidden, arctic.intermediate, 0.0)
        entry = vllm_moe.FAMILY.engine_config(w)
        cand = tune.engine_candidate(w)
        assert cand is not None and FAM.space.is_valid(cand, w)
        assert (cand["BLOCK_N"], cand["BLOCK_K"], cand["num_warps"]) == (
            entry["BLOCK_SIZE_N"], entry["BLOCK_SIZE_K"], entry["num_warps"])
        if int(entry["BLOCK_SIZE_M"]) not in (16, 64, 128):
            snapped += 1
            assert cand["BLOCK_M"] in ((16, 64) if entry["BLOCK_SIZE_M"] == 32 else (128,))
    assert snapped  # Arctic's shard has such entries in vLLM 0.33's default rule or table
    assert tune._snapped_block_m(32, MoEWorkload(1, 128, 2, 7168, 608, 0.0))[0] == 16  # sparse: less padding
    assert tune._snapped_block_m(32, MoEWorkload(4096, 8, 2, 4096, 1792, 0.0))[0] == 64
    assert tune._snapped_block_m(256, MoEWorkload(4096, 8, 2, 4096, 1792, 0.0))[0] == 128


def test_tune_round_one_takes_the_shipped_cost_models_top_k(capsys, tmp_path, monkeypatch):
    """With a policy folder that ships fused_moe.cost.npz, round 1's top-k is the cost model's ranking of the whole
    valid space (what `export --policy-dir` answers), not the policy's catalogue order."""
    import json

    import numpy as np

    from kernel_gym.cli import main
    from kernel_gym.dispatch.observation import feature_names
    from kernel_gym.train import bundle

    names = feature_names("fused_moe")
    meta = {"kernel": "fused_moe", "configs": [dict(c) for c in _WIDE], "activation": "tanh"}
    params = {"W_out": np.zeros((len(_WIDE), len(names)), np.float32), "b_out": np.zeros(len(_WIDE), np.float32)}
    bundle.save_bundle(tmp_path, "fused_moe", meta, params, {"model_uri": "models:/x/1"})
    model = load_model("olmoe-1b-7b")

    class Cheapest:
        """A cost model that prefers the narrowest tile with the fewest warps (none of the policy's catalogue)."""

        meta = {"dataset_sha256": ""}

        def rank(self, workload, configs):
            return sorted(configs, key=lambda c: (c["BLOCK_N"], c["BLOCK_M"], c["num_warps"]))

    monkeypatch.setattr(bundle, "load_cost_model", lambda folder, kernel: Cheapest())
    plans = {}
    real_plan = tune.tune_plan
    monkeypatch.setattr(tune, "tune_plan", lambda *a, **k: plans.setdefault("p", real_plan(*a, **k)))
    rc = main(["tune", "--model", model.name, "--kernels", "fused_moe", "--policy-dir", str(tmp_path), "--dry-run",
               "--no-nearest"])
    out = capsys.readouterr().out
    assert rc == 0 and "cost model's top 4" in out
    assert "round 1 projected at about" in out and "against --budget-s 120: it" in out  # audit 3: no projection
    rc = main(["tune", "--model", model.name, "--kernels", "fused_moe", "--policy-dir", str(tmp_path), "--dry-run",
               "--no-nearest", "--budget-s", "0.001"])
    assert rc == 0 and "is more than the budget" in capsys.readouterr().out
    first = [Config(json.loads(c)) for c in plans["p"][0]["configs"]]
    assert first[0]["BLOCK_N"] == 32 and first[0] not in _WIDE  # outside the catalogue: the whole space was ranked
