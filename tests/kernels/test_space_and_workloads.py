import pytest

from kernel_gym.kernels.space import Config, InvalidConfig, Knob, KnobSpace
from kernel_gym.kernels.workloads import (
    DecodeWorkload,
    MoEWorkload,
    PrefillWorkload,
    model_workloads,
    prefill_seq_lens,
    workload_from_key,
)
from kernel_gym.models import BUILTIN_MODELS


def _space():
    return KnobSpace(
        [Knob("BLOCK", (16, 32, 64)), Knob("num_warps", (4, 8))],
        [lambda c, w: "BLOCK larger than n" if c["BLOCK"] > w else None],
    )


def test_config_is_canonical_and_hashable():
    a, b = Config(BLOCK=32, num_warps=4), Config({"num_warps": 4, "BLOCK": 32})
    assert a == b and hash(a) == hash(b) and str(a) == '{"BLOCK":32,"num_warps":4}'
    assert Config.parse(str(a)) == a
    assert a.replace(BLOCK=64)["BLOCK"] == 64 and a["BLOCK"] == 32


def test_space_rules_mask_invalid_configs():
    space = _space()
    assert len(space) == 6
    assert [c["BLOCK"] for c in space.valid_configs(32)] == [16, 16, 32, 32]
    assert space.why_invalid(Config(BLOCK=64, num_warps=4), 32) == "BLOCK larger than n"
    assert "not one of" in space.why_invalid(Config(BLOCK=48, num_warps=4), 64)
    assert "differ" in space.why_invalid(Config(BLOCK=16), 64)
    with pytest.raises(InvalidConfig, match="BLOCK larger than n"):
        space.check(Config(BLOCK=64, num_warps=8), 32)
    s1, s2 = space.sample(64, 3, seed=1), space.sample(64, 3, seed=1)
    assert s1 == s2 and len(set(s1)) == 3 and all(space.is_valid(c, 64) for c in s1)


@pytest.mark.parametrize("kernel", ["prefill_attention", "decode_attention", "fused_moe"])
@pytest.mark.parametrize("model", sorted(BUILTIN_MODELS))
def test_workload_keys_round_trip(kernel, model):
    grid = model_workloads(kernel, BUILTIN_MODELS[model])
    assert len(grid) == len({w.key() for w in grid}) > 10
    for w in grid[:5]:
        assert workload_from_key(kernel, w.key()) == w
        assert all(isinstance(v, float) for v in w.features().values())


def test_workload_semantics():
    d = DecodeWorkload(32, 8, 128, 5, 100)
    lens = d.context_lens()
    assert lens[0] == 50 and lens[-1] == 150 and sum(lens) == 500
    assert d.kv_bytes() == 2 * 500 * 8 * 128 * 2
    for mix in ("single", "equal4", "ragged"):
        assert sum(prefill_seq_lens(1000, mix)) == 1000
    assert PrefillWorkload(4, 2, 64, (3, 4)).causal_pairs() == 6 + 10
    pop = MoEWorkload(8, 8, 2, 64, 64, skew=1.2).expert_popularity()
    assert abs(sum(pop) - 1) < 1e-9 and pop[0] > pop[-1]
    assert MoEWorkload(8, 8, 2, 64, 64).expert_popularity() == [1 / 8] * 8
    with pytest.raises(ValueError, match="top_k"):
        MoEWorkload(8, 4, 5, 64, 64)
    with pytest.raises(ValueError, match="dtype"):
        DecodeWorkload(4, 2, 64, 1, 1, dtype="int8")


def test_valid_configs_are_remembered_per_workload_and_stay_right():
    """The cached answer is the enumeration's, per workload; a caller changing its list changes nothing stored; an
    unhashable workload is enumerated each time."""
    calls = []

    def small_m(config, workload):
        calls.append(workload)
        return None if config["BLOCK_M"] <= workload else "too big"

    space = KnobSpace([Knob("BLOCK_M", (16, 32, 64)), Knob("num_warps", (4, 8))], rules=[small_m])
    first = space.valid_configs(32)
    assert [c["BLOCK_M"] for c in first] == [16, 16, 32, 32] and len(calls) == 6
    first.clear()
    assert space.valid_configs(32) == [c for c in space.all_configs() if c["BLOCK_M"] <= 32]
    assert len(calls) == 6, "the second call for the same workload must not run the rules again"
    assert [c["BLOCK_M"] for c in space.valid_configs(64)] == [16, 16, 32, 32, 64, 64]

    class Unhashable(int):
        __hash__ = None

    assert len(space.valid_configs(Unhashable(16))) == 2


def test_valid_configs_are_exactly_the_configs_why_invalid_accepts() -> None:
    """valid_configs skips the shape checks for all_configs' own configs (they are in the space's knobs by
    construction) and asks only the rules: the result must be what the full check gives, for every family."""
    from kernel_gym.kernels import FAMILY_MODULES, get_family
    from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload, PrefillWorkload, PrefixPrefillWorkload

    samples = {"fused_moe": MoEWorkload(64, 8, 2, 4096, 14336), "vllm_fused_moe": MoEWorkload(64, 8, 2, 4096, 14336),
               "decode_attention": DecodeWorkload(32, 8, 128, 4, 1000),
               "prefill_attention": PrefillWorkload(32, 8, 128, (300, 77)),
               "prefix_prefill": PrefixPrefillWorkload(32, 8, 128, (64, 17), (100, 0))}
    for name in FAMILY_MODULES:
        if name not in samples:
            continue
        space = get_family(name).space
        full = [c for c in space.all_configs() if space.why_invalid(c, samples[name]) is None]
        assert space.valid_configs(samples[name]) == full, name
        assert full, name
