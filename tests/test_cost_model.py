"""The fused-MoE cost model: shape-relative features, a deterministic fit, valid re-ranked choices, a lossless save/load
and a learnable preference learned (kernel_gym/dispatch/cost_model.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernel_gym.dispatch import cost_model as cm
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import MoEWorkload

BASE = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=3, SPLIT_K=1, FUSE_SILU=0,
            FUSE_WEIGHT=1, FUSE_SUM=0)


def _cfg(**kw) -> Config:
    return Config({**BASE, **kw})


def _f(w, c) -> dict[str, float]:
    return dict(zip(cm.FEATURES, cm.features(w, c)))


def test_features_are_shape_relative():
    # the tile-unit features depend on dimension / tile only: hidden 2048 with BLOCK_K 64 == hidden 4096 with 128
    a = _f(MoEWorkload(64, 8, 2, 2048, 1024), _cfg(BLOCK_K=64))
    b = _f(MoEWorkload(64, 8, 2, 4096, 1024), _cfg(BLOCK_K=128))
    for name in ("log2_k_gate_up_steps", "k_gate_up_fill"):
        assert a[name] == b[name]
    # tokens per expert (and its share of a row block) keep when tokens and experts scale together
    a = _f(MoEWorkload(64, 8, 2, 2048, 1024), _cfg())
    b = _f(MoEWorkload(256, 32, 2, 2048, 1024), _cfg())
    for name in ("log2_tokens_per_expert", "log2_tokens_per_expert_per_block_m"):
        assert a[name] == pytest.approx(b[name])
    # ... and the padding share follows the tile against the shape: a 64-wide tile on 2 x 48 columns wastes a third
    f = _f(MoEWorkload(16, 8, 2, 2048, 48), _cfg(BLOCK_N=64))
    assert f["n_gate_up_fill"] == pytest.approx(96 / 128)
    assert len(cm.features(MoEWorkload(1, 8, 2, 2048, 1024), _cfg())) == len(cm.FEATURES)


def test_expected_row_blocks_count_padding():
    w = MoEWorkload(num_tokens=1024, num_experts=8, top_k=2, hidden=1024, intermediate=1024)
    # 2048 slots over 8 uniform experts: 256 each, 16 blocks of 16 per expert
    assert cm.expected_row_blocks(w, 16) == pytest.approx(128, rel=1e-6)
    # one token, top-2 of 64: at most 2 non-empty experts, one block each
    assert cm.expected_row_blocks(MoEWorkload(1, 64, 2, 1024, 1024), 64) <= 2.0


def _synthetic_groups(rng: np.random.Generator, n: int = 40) -> list[cm.Group]:
    """Workloads where the faster of two configs is learnable from the features: BLOCK_N 32 wins when the gate/up
    output is narrow (intermediate <= 128), BLOCK_N 128 when it is wide."""
    groups = []
    configs = [_cfg(BLOCK_N=32), _cfg(BLOCK_N=128), _cfg(BLOCK_N=64, num_warps=8)]
    for _ in range(n):
        inter = int(rng.choice([32, 64, 128, 1024, 2048, 4096]))
        w = MoEWorkload(num_tokens=int(rng.choice([1, 16, 256])), num_experts=8, top_k=2, hidden=2048,
                        intermediate=inter)
        narrow = inter <= 128
        t = np.array([1.0 if narrow else 2.0, 2.0 if narrow else 1.0, 1.5]) * math.exp(rng.normal(0, 3))
        groups.append(cm.Group(w, configs, cm.feature_matrix(w, configs), np.log(t)))
    return groups


FAST = cm.FitOptions(hidden=16, epochs=40, batch_workloads=8)


def test_fit_is_deterministic_and_learns_the_faster_config():
    groups = _synthetic_groups(np.random.default_rng(0))
    a, b = cm.fit(groups, FAST), cm.fit(groups, FAST)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    narrow, wide = MoEWorkload(64, 16, 2, 4096, 64), MoEWorkload(64, 16, 2, 4096, 2048)  # shapes never fitted on
    two = [_cfg(BLOCK_N=128), _cfg(BLOCK_N=32)]
    assert a.rank(narrow, two)[0] == _cfg(BLOCK_N=32)
    assert a.rank(wide, list(reversed(two)))[0] == _cfg(BLOCK_N=128)
    c = cm.fit(groups, cm.FitOptions(**{**FAST.__dict__, "seed": 1}))
    assert any(not np.array_equal(a.params[k], c.params[k]) for k in ("W0", "W1"))  # the seed is used


def test_save_load_round_trip_keeps_the_ranking(tmp_path):
    model = cm.fit(_synthetic_groups(np.random.default_rng(1)), FAST, {"dataset_sha256": "test"})
    model.save(tmp_path)
    back = cm.load(tmp_path)
    w = MoEWorkload(256, 16, 2, 2048, 512)
    configs = [_cfg(BLOCK_N=n, BLOCK_M=m) for n in (32, 64, 128) for m in (16, 64)]
    assert back.rank(w, configs) == model.rank(w, configs)
    np.testing.assert_allclose(back.predict(w, configs), model.predict(w, configs))
    assert back.meta["dataset_sha256"] == "test"


def test_load_rejects_a_foreign_feature_list(tmp_path):
    model = cm.fit(_synthetic_groups(np.random.default_rng(2)), FAST)
    model.save(tmp_path)
    meta = tmp_path / f"{cm.FILE_STEM}.json"
    meta.write_text(meta.read_text().replace('"log2_tokens"', '"log2_something_else"'))
    with pytest.raises(ValueError, match="another feature list"):
        cm.load(tmp_path)
    with pytest.raises(ValueError, match="no cost model"):
        cm.load(tmp_path / "missing")


def test_zero_shot_ranker_returns_only_valid_configs_and_keeps_the_policy_without_a_cost_model(tmp_path):
    from kernel_gym.deploy import tune
    from kernel_gym.dispatch.observation import feature_names
    from kernel_gym.kernels import get_family
    from kernel_gym.train import bundle

    space = get_family("fused_moe").space
    wide, narrow = _cfg(BLOCK_N=256, BLOCK_K=128, num_warps=8), _cfg(BLOCK_N=32)
    names = feature_names("fused_moe")
    w_out = np.zeros((2, len(names)), np.float32)
    w_out[0, names.index("log2_hidden")] = 1.0  # the policy prefers the wide tile everywhere
    meta = {"kernel": "fused_moe", "configs": [dict(wide), dict(narrow)], "activation": "tanh"}
    params = {"W_out": w_out, "b_out": np.zeros(2, np.float32)}
    invalid_near = _cfg(BLOCK_M=128, BLOCK_N=256, num_warps=4)  # too many accumulators per thread: never returned

    def nearest(w):
        return [invalid_near, _cfg(BLOCK_N=64)]

    cost = cm.fit(_synthetic_groups(np.random.default_rng(3)), FAST)
    rank = tune.zero_shot_ranker("fused_moe", meta, params, cost, nearest)
    for w in (MoEWorkload(1, 64, 8, 4096, 64), MoEWorkload(4096, 8, 2, 4096, 14336)):
        got = rank(w)
        assert got and all(space.is_valid(c, w) for c in got) and invalid_near not in got
        assert set(got) >= {c for c in (wide, narrow, _cfg(BLOCK_N=64)) if space.is_valid(c, w)}
        # every valid config is a candidate, not only the catalogue: the candidate set no longer caps the choice
        assert set(got) == set(space.valid_configs(w))
    far = MoEWorkload(16, 64, 8, 4096, 4096)
    assert tune.zero_shot_ranker("fused_moe", meta, params)(far) == tune.ranker("fused_moe", meta, params)(far)
    # the cost model travels beside the bundle and loads back to the same ranking
    bundle.save_bundle(tmp_path, "fused_moe", meta, params, {"model_uri": "models:/x/1"}, cost_model=cost)
    back = bundle.load_cost_model(tmp_path, "fused_moe")
    assert tune.zero_shot_ranker("fused_moe", meta, params, back, nearest)(far) == rank(far)
    assert bundle.load_cost_model(tmp_path, "decode_attention") is None


def test_mlflow_export_of_a_model_conditioned_moe_policy_is_re_ranked_like_policy_dir(monkeypatch):
    """`export` from the MLflow store answers as `export --policy-dir` does: the cost model's first choice at an
    unseen workload, the policy's own (measured-mask) choice at a workload it was trained on."""
    from kernel_gym.deploy import export
    from kernel_gym.dispatch.observation import feature_names
    from kernel_gym.kernels import get_family
    from kernel_gym.train.safe_policy import SafePolicy

    space = get_family("fused_moe").space
    wide, narrow = _cfg(BLOCK_N=256, BLOCK_K=128, num_warps=8), _cfg(BLOCK_N=32)
    names = feature_names("fused_moe")
    w_out = np.zeros((2, len(names)), np.float32)
    w_out[0, names.index("log2_hidden")] = 1.0  # the policy prefers the wide tile
    seen, unseen = MoEWorkload(4096, 8, 2, 4096, 14336), MoEWorkload(16, 64, 8, 4096, 4096)
    meta = {"kernel": "fused_moe", "configs": [dict(wide), dict(narrow)], "activation": "tanh",
            "known_masks": {seen.key(): [True, False]}}
    policy = SafePolicy(meta, {"W_out": w_out, "b_out": np.zeros(2, np.float32)}, {"model_conditioned": True})

    class Fewest:
        meta = {"dataset_sha256": "x"}

        def rank(self, workload, configs):  # the smallest tile with the fewest warps first
            return sorted(configs, key=lambda c: (c["BLOCK_N"] * c["BLOCK_M"] * c["BLOCK_K"], c["num_warps"]))

    monkeypatch.setattr(cm, "packaged", lambda backend=None: Fewest())
    predict, provenance = export.reranked_zero_shot(policy)
    got_seen, got_unseen = predict([seen, unseen])
    assert got_seen == policy.choose(seen) == wide
    best = Fewest().rank(unseen, space.valid_configs(unseen))[0]
    assert got_unseen == best and got_unseen not in (wide, narrow) and provenance["cost_model"]["dataset_sha256"]
