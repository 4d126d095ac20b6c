"""The shape zoo: published shapes, tensor-parallel shards, and a test split that no training row can reach."""

import pytest

from kernel_gym import zoo
from kernel_gym.models import load_model


def test_shards_split_experts_and_heads_as_vllm_does():
    mixtral = zoo.ZOO["mixtral-8x7b"]
    tp2 = zoo.shard(mixtral, 2)
    assert (tp2.intermediate, tp2.num_heads, tp2.num_kv_heads, tp2.hidden) == (7168, 16, 4, 4096)
    tp4 = zoo.shard(zoo.ZOO["qwen2-57b-a14b"], 4)
    assert tp4.num_kv_heads == 1  # 4 KV heads over 4 GPUs; below one they are replicated
    assert load_model("mixtral-8x7b@tp2") == tp2
    with pytest.raises(ValueError, match="NAME@tpN"):
        load_model("mixtral-8x7b@tpx")
    with pytest.raises(ValueError, match="does not split tp=3 ways"):
        zoo.shard(zoo.ZOO["phi-3.5-moe"], 3)


def test_zoo_has_a_dozen_architectures_and_both_grids():
    assert len(zoo.ZOO) >= 12
    for kernel in ("fused_moe", "decode_attention"):
        spec = zoo.shard(zoo.ZOO[zoo.TEST_MODELS[kernel][0]], 2)
        assert zoo.shard_workloads(kernel, spec, "zoo") and zoo.shard_workloads(kernel, spec, "eval")
    assert zoo.shard_workloads("decode_attention", zoo.ZOO["deepseek-v3"]) == []  # MLA: not this decode kernel


@pytest.mark.parametrize("kernel", ["fused_moe", "decode_attention"])
def test_test_models_are_disjoint_from_training(kernel):
    test_keys = zoo.test_workload_keys(kernel)
    assert len(zoo.TEST_MODELS[kernel]) >= 3
    assert not set(zoo.TEST_MODELS[kernel]) & set(zoo.training_models(kernel))
    train_keys = {w.key() for s in zoo.zoo_shards(zoo.training_models(kernel)) for w in zoo.shard_workloads(kernel, s)}
    # Training models never produce a test workload here (distinct shapes), and the profile drops any that would.
    assert not train_keys & test_keys
    from kernel_gym.train.zoo_policy import zoo_profile

    profile = zoo_profile(kernel)
    assert not {w.key() for w in profile.workloads} & test_keys
    assert set(profile.anchors) <= {w.key() for w in profile.workloads}


def test_design_fills_the_shape_space_and_stays_apart_from_tests():
    """The design reaches below the zoo (N < 128, top-k > 8, E > 256), is deterministic, fits one GPU process per
    layer, and never produces a test model's workload."""
    from kernel_gym import zoo

    shapes = zoo.design_shapes()
    assert [s.name for s in shapes] == list(zoo.DESIGN) and len(shapes) == zoo.DESIGN_POINTS
    assert min(s.intermediate for s in shapes) < 128 and max(s.top_k for s in shapes) > 8
    assert max(s.num_experts for s in shapes) > 256 and min(s.num_experts for s in shapes) <= 16
    assert all(s.top_k <= s.num_experts for s in shapes)
    assert all(s.num_experts * 3 * s.hidden * s.intermediate * 2 <= zoo.DESIGN_MAX_WEIGHT_BYTES for s in shapes)
    test_keys = zoo.test_workload_keys("fused_moe")
    assert not any(w.key() in test_keys for s in shapes for w in zoo.shard_workloads("fused_moe", s, "zoo"))
