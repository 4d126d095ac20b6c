"""The model-conditioned policy's catalogue and zero-shot choice, and `kernel-gym tune`'s plan and refit."""

import json

import numpy as np
import pytest

from kernel_gym.deploy import tune
from kernel_gym.dispatch.catalogue import WorkloadReference
from kernel_gym.kernels import get_family
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.train import zoo_policy

FAM = get_family("fused_moe")
W1 = MoEWorkload(16, 8, 2, 4096, 14336)
W2 = MoEWorkload(64, 8, 2, 4096, 14336)


def ref(w, times):
    return WorkloadReference(w, {Config.parse(c): t for c, t in times.items()}, {}, FAM.default_config(w),
                             frozenset(Config.parse(c) for c in times))


def test_common_configs_need_a_measurement_at_most_zoo_shapes():
    a, b = str(FAM.default_config(W1)), str(FAM.default_config(W1).replace(num_warps=8))
    refs = [ref(W1, {a: 1.0, b: 0.9}), ref(W2, {a: 2.0})]
    common = zoo_policy.common_configs(refs, {W1.key(), W2.key()}, FAM.space)
    assert Config.parse(a) in common and Config.parse(b) not in common  # b is valid at W2 but unmeasured there
    restricted = zoo_policy.restrict(refs, common)
    assert set(restricted[0].times) == {Config.parse(a)}


def test_ranker_masks_with_the_rules_only(tmp_path):
    configs = [FAM.default_config(W1), FAM.default_config(W1).replace(TMA_LOADS=2)]
    meta = {"kernel": "fused_moe", "configs": [dict(c) for c in configs], "activation": "tanh"}
    obs_dim = 8
    params = {"W0": np.zeros((4, obs_dim), np.float32), "b0": np.zeros(4, np.float32),
              "W_out": np.zeros((2, 4), np.float32), "b_out": np.array([0.0, 1.0], np.float32)}
    tune.save_bundle(tmp_path, "fused_moe", meta, params, {"model_uri": "models:/x/1"})
    meta2, params2, prov = tune.load_bundle(tmp_path, "fused_moe")
    assert prov["model_uri"] == "models:/x/1" and np.array_equal(params2["b_out"], params["b_out"])
    rank = tune.ranker("fused_moe", meta2, params2)
    tiny = MoEWorkload(16, 8, 2, 96, 96)  # TMA needs whole 128-row tiles: the second entry is invalid here
    assert rank(W1)[0] == configs[1]  # preferred and valid
    assert configs[1] not in rank(tiny) and rank(tiny)[0] == configs[0]
    plan = tune.tune_plan("fused_moe", __import__("kernel_gym.models", fromlist=["x"]).load_model("mixtral-8x7b"),
                          rank, top_k=1)
    assert plan and all(1 <= len(e["configs"]) <= 2 for e in plan)  # the policy's first, and the engine's entry
    assert len({e["workload"] for e in plan}) == len(plan)


def test_tuned_predictor_takes_the_fastest_measured_else_zero_shot():
    a, b = FAM.default_config(W1), FAM.default_config(W1).replace(num_warps=8)
    plan = [{"kernel": "fused_moe", "workload": W1.key(), "configs": [str(a), str(b)]},
            {"kernel": "fused_moe", "workload": W2.key(), "configs": [str(a)]}]
    times = {(W1.key(), str(a)): 2.0, (W1.key(), str(b)): 1.0}
    predict = tune.tuned_predictor(plan, times, lambda ws: [a for _ in ws])
    assert predict([W1, W2]) == [b, a]  # W2 has no measurement: the zero-shot choice stays
    assert predict.measured_cells == 1


def test_zero_shot_report_scores_paired_rounds(tmp_path):
    """benchmarks/generalisation/run.py report: ratio = best / chosen over paired rounds; a failed choice falls back."""

    from benchmarks.generalisation import run as zsl
    a, b, d = "A", "B", "D"
    result = {"results": [{"kernel": "fused_moe", "model": "m", "shard": "m", "workload": "w1",
                           "choices": {"0": a, "1": "X"}, "tune": {"0": [a, b], "1": [b]}, "default": d,
                           "tune_picks": {"0": b, "1": b}, "sweep_ms": {a: 2.0, b: 1.0, d: 4.0},
                           "seconds": {a: 0.1, b: 0.1, d: 0.1}, "configs_swept": 3,
                           "status": {a: "ok", b: "ok", d: "ok", "X": "wrong_result: non-finite"},
                           "round_ms": {a: [2.0, 2.0, 2.2], b: [1.0, 1.1, 1.0], d: [4.0, 4.0, 4.0]}}]}
    (tmp_path / "live.json").write_text(json.dumps(result))
    out = tmp_path / "g.json"
    with pytest.raises(SystemExit, match="none.json"):  # a plan that is not there is named, not skipped
        zsl.main(["report", "--result", str(tmp_path / "live.json"), "--plan", str(tmp_path / "none.json"),
                  "--out", str(out)])
    with pytest.raises(SystemExit, match="one per --result"):
        zsl.main(["report", "--result", str(tmp_path / "live.json"), "--commit", "a", "b", "--out", str(out)])
    zsl.main(["report", "--result", str(tmp_path / "live.json"), "--out", str(out)])
    g = json.loads(out.read_text())
    rows = {r["seed"]: r for r in g["zero_shot"]["kernel"]["fused_moe"]["rows"]}
    assert rows[0]["ratio"] == 0.5 and rows[1]["ratio"] == 0.25  # seed 1's choice failed: the default config
    assert g["tuned"]["fused_moe"]["geomean"] == 1.0
    assert g["curves"]["fused_moe"]["policy_ranked"]["1"] == pytest.approx(0.5 ** 0.5)  # seeds: a (0.5), b (1)


def test_zero_shot_report_takes_each_kernel_from_the_last_run_that_timed_it(tmp_path):

    from benchmarks.generalisation import run as zsl

    def run(kernel, ms_a, split="test"):
        return {"results": [{"kernel": kernel, "model": "m", "shard": "m", "workload": "w", "choices": {"0": "A"},
                             "split": split,
                             "tune": {"0": ["A"]}, "default": "D", "tune_picks": {"0": "A"},
                             "sweep_ms": {"A": ms_a, "D": 1.0}, "seconds": {"A": 0.1, "D": 0.1},
                             "status": {"A": "ok", "D": "ok"}, "round_ms": {"A": [ms_a], "D": [1.0]}}]}

    paths = []
    for i, (kernel, ms, split) in enumerate([("fused_moe", 4.0, "test"), ("decode_attention", 2.0, "test"),
                                             ("fused_moe", 1.0, "test"), ("fused_moe", 2.0, "lomo")]):
        paths.append(tmp_path / f"live{i}.json")
        paths[-1].write_text(json.dumps(run(kernel, ms, split)))
    out = tmp_path / "g.json"
    zsl.main(["report", "--result", *map(str, paths[:3]), "--commit", "c0", "c1", "c2", "--out", str(out)])
    g = json.loads(out.read_text())
    assert g["zero_shot"]["kernel"]["fused_moe"]["geomean"] == 1.0  # run 2 (A at 1.0 ms), not run 0 (0.25)
    assert g["zero_shot"]["kernel"]["decode_attention"]["geomean"] == 0.5
    runs = g["meta"]["runs"]
    assert runs["fused_moe/test"]["commit"] == "c2" and runs["decode_attention/test"]["commit"] == "c1"
    assert g["leave_one_model_out_live"] == {}
    zsl.main(["report", "--result", *map(str, paths), "--out", str(out)])  # a leave-one-model-out run joins
    g = json.loads(out.read_text())
    assert g["zero_shot"]["kernel"]["fused_moe"]["geomean"] == 1.0  # its rows do not mix with the test split's
    assert g["leave_one_model_out_live"]["fused_moe"]["geomean"] == 0.5
    assert g["leave_one_model_out_live"]["fused_moe"]["models_left_out"] == ["m"]


def test_zero_shot_report_leaves_a_failed_sweep_out_of_the_score(tmp_path):
    """A workload whose sweep mostly failed (out of memory) has no oracle: it is listed, not scored."""

    from benchmarks.generalisation import run as zsl
    good = {"kernel": "fused_moe", "model": "m", "shard": "m", "workload": "w1", "choices": {"0": "A"},
            "tune": {"0": ["A"]}, "default": "D", "tune_picks": {"0": "A"}, "sweep_ms": {"A": 2.0, "D": 1.0},
            "seconds": {"A": 0.1, "D": 0.1}, "status": {"A": "ok", "D": "ok"}, "round_ms": {"A": [2.0], "D": [1.0]}}
    broken = {**good, "workload": "w2", "sweep_ms": {"A": 1.0}, "round_ms": {"A": [1.0]},
              "status": {"A": "ok", **{f"C{i}": "oom: CUDA out of memory" for i in range(5)}}}
    (tmp_path / "live.json").write_text(json.dumps({"results": [good, broken]}))
    out = tmp_path / "g.json"
    zsl.main(["report", "--result", str(tmp_path / "live.json"), "--out", str(out)])
    z = json.loads(out.read_text())["zero_shot"]["kernel"]["fused_moe"]
    assert z["workloads"] == 1 and z["geomean"] == 0.5
    assert [x["workload"] for x in z["incomplete_sweeps_left_out"]] == ["w2"]
