"""Paged decode attention: correctness against the torch reference (CPU interpreter: fp32/fp16; GPU: bf16, many
configs), paging that is really exercised, and the knob space's rules."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch

from kernel_gym.kernels import decode_attention as da
from kernel_gym.kernels import get_family
from kernel_gym.kernels.space import SHARED_MEMORY_LIMIT, Config, InvalidConfig
from kernel_gym.kernels.workloads import DecodeWorkload, model_workloads
from kernel_gym.models import BUILTIN_MODELS

FAMILY = da.FAMILY
SPACE = da.SPACE
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CPU_DTYPES = ("float32", "float16")  # bf16 arithmetic is wrong in the interpreter (docs/architecture.md)
# A ragged workload: contexts 150, 300, 450; no page size divides 150 or 450.
RAGGED = (4, 2, 64, 3, 300)


def _interp_cost(workload: DecodeWorkload, config: Config) -> int:
    """Programs x loop steps: what the interpreter's run time grows with."""
    splits, bn = int(config["NUM_SPLITS"]), int(config["BLOCK_N"])
    heads = workload.num_kv_heads if int(config["GQA_GROUPED"]) else workload.num_heads
    steps = -(-max(workload.context_lens()) // (splits * bn)) + 1
    return workload.batch * heads * splits * steps


def _cheap_valid(workload: DecodeWorkload, budget: int) -> list[Config]:
    return [c for c in SPACE.valid_configs(workload) if _interp_cost(workload, c) <= budget]


def _check(workload: DecodeWorkload, config: Config, inputs=None, reference=None) -> None:
    inputs = inputs if inputs is not None else FAMILY.make_inputs(workload, DEVICE, seed=0)
    reference = reference if reference is not None else FAMILY.reference(inputs)
    out = FAMILY.prepare(inputs, config)()
    assert out.shape == (workload.batch, workload.num_heads, workload.head_dim)
    assert out.dtype == inputs.q.dtype
    atol, rtol = FAMILY.tolerance(workload.dtype)
    err = (out.float() - reference).abs().max().item()
    assert torch.isfinite(out.float()).all(), f"{config} on {workload}: non-finite output"
    assert torch.allclose(out.float(), reference, atol=atol, rtol=rtol), f"{config} on {workload}: max err {err:.3g}"


# ---- (a) correctness under the interpreter (CPU) or on the GPU in fp32/fp16 ----------------------------------------


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_sampled_valid_configs_match_reference_on_small_grid(dtype):
    for i, workload in enumerate(model_workloads("decode_attention", None, grid="small", dtype=dtype)):
        inputs = FAMILY.make_inputs(workload, DEVICE, seed=i)
        reference = FAMILY.reference(inputs)
        configs = _cheap_valid(workload, budget=160)
        assert len(configs) >= 3, f"too few cheap valid configs on {workload}"
        for config in random.Random(f"{dtype}-{i}").sample(configs, 2):
            _check(workload, config, inputs, reference)


def test_every_layout_split_count_page_size_and_path():
    """Each (NUM_SPLITS, LAYOUT) pair once, alternating fp32/fp16 and cycling page sizes and GQA_GROUPED; contexts
    end mid-page and short sequences leave later splits empty."""
    cases = {}
    for dtype in CPU_DTYPES:
        workload = DecodeWorkload(*RAGGED, dtype=dtype)
        inputs = FAMILY.make_inputs(workload, DEVICE, seed=3)
        cases[dtype] = (workload, inputs, FAMILY.reference(inputs), _cheap_valid(workload, budget=320))
    rng = random.Random(7)
    seen_pages, seen_grouped = set(), set()
    # counts whose 16-token slices fit the ragged context (32 and 64: test_split_counts_beyond_16_...)
    counts = [s for s in da.SPLIT_COUNTS if s * 16 <= RAGGED[4]]
    assert counts == [1, 2, 4, 8, 16]
    for i, (splits, layout) in enumerate((s, lay) for s in counts for lay in da.LAYOUTS):
        workload, inputs, reference, valid = cases[CPU_DTYPES[(i + i // 2) % 2]]
        pool = [c for c in valid if c["NUM_SPLITS"] == splits and c["LAYOUT"] == layout]
        assert pool, f"no cheap valid NUM_SPLITS={splits} LAYOUT={layout} config on {workload}"
        preferred = [c for c in pool if c["PAGE_SIZE"] == (16, 32, 64, 128)[i % 4] and c["GQA_GROUPED"] == i % 2]
        config = rng.choice(preferred or pool)
        seen_pages.add(config["PAGE_SIZE"])
        seen_grouped.add(config["GQA_GROUPED"])
        _check(workload, config, inputs, reference)
    assert seen_pages == {16, 32, 64, 128} and seen_grouped == {0, 1}


@pytest.mark.parametrize("splits", [32, 64])
def test_split_counts_beyond_16_on_both_paths_and_both_combines(splits):
    """32 and 64 splits (batch 1-4 at long contexts): a ragged batch whose shorter sequence leaves the last splits
    empty, the per-head path, the two-launch combine and the one-launch combine all match the reference."""
    workload = DecodeWorkload(4, 2, 32, 2, 1100, dtype="float32")
    inputs = FAMILY.make_inputs(workload, DEVICE, seed=11)
    reference = FAMILY.reference(inputs)
    for grouped, combine, layout in ((1, 0, "HND"), (1, 1, "NHD"), (0, 0, "HND")):
        config = SPACE.config(dict(PAGE_SIZE=16, LAYOUT=layout, NUM_SPLITS=splits, BLOCK_N=16, num_warps=4,
                                   num_stages=2, GQA_GROUPED=grouped, COMBINE=combine))
        assert SPACE.is_valid(config, workload), SPACE.why_invalid(config, workload)
        _check(workload, config, inputs, reference)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_preloaded_page_ids_match_the_reference_across_preload_groups(dtype):
    """PRELOAD_PAGES=1: page ids read PRELOAD_BLOCKS blocks at a time before their loop. A context of 2,300 tokens in
    16-token blocks spans five such groups (the last one partial) plus a masked tail; with and without splits and
    with the one-launch combine; the result equals the PRELOAD_PAGES=0 kernel's up to summation order (none)."""
    workload = DecodeWorkload(4, 1, 32, 2, 2300, dtype=dtype)
    inputs = FAMILY.make_inputs(workload, DEVICE, seed=13)
    reference = FAMILY.reference(inputs)
    assert workload.context_len // 16 > 4 * da.PRELOAD_BLOCKS
    for splits, combine, layout, page in ((1, 0, "HND", 16), (16, 1, "NHD", 32), (64, 0, "HND", 16)):
        base = SPACE.config(dict(PAGE_SIZE=page, LAYOUT=layout, NUM_SPLITS=splits, BLOCK_N=16, num_warps=4,
                                 num_stages=4, GQA_GROUPED=1, COMBINE=combine))
        preload = base.replace(PRELOAD_PAGES=1)
        assert SPACE.is_valid(preload, workload), SPACE.why_invalid(preload, workload)
        _check(workload, preload, inputs, reference)
        same = torch.equal(FAMILY.prepare(inputs, preload)(), FAMILY.prepare(inputs, base)())
        assert same, f"{preload}: not bit-identical to the in-loop table read"


def test_preload_pages_needs_the_grouped_path_and_one_page_per_block():
    workload = DecodeWorkload(32, 8, 128, 1, 4096)
    ok = dict(PAGE_SIZE=64, LAYOUT="HND", NUM_SPLITS=16, BLOCK_N=64, num_warps=4, num_stages=4, GQA_GROUPED=1,
              PRELOAD_PAGES=1)
    assert SPACE.is_valid(SPACE.config(ok), workload)
    for bad in (dict(GQA_GROUPED=0), dict(BLOCK_N=128)):
        why = SPACE.why_invalid(SPACE.config({**ok, **bad}), workload) or ""
        assert "PRELOAD_PAGES=1 needs" in why, (bad, why)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_tma_blocks_match_the_reference_and_the_pointer_loads(dtype):
    """KV_TMA=1: each K/V block one TMA copy at its page's row of the cache's 2-D view (both layouts, with and
    without read-ahead page ids, splits and the one-launch combine, a ragged batch whose masked tails end mid-page
    beside NaN slots); the result equals the pointer path's up to summation order (none)."""
    workload = DecodeWorkload(8, 2, 32, 3, 700, dtype=dtype)
    inputs = FAMILY.make_inputs(workload, DEVICE, seed=17)
    reference = FAMILY.reference(inputs)
    assert len(set(workload.context_lens())) > 1 and any(n % 16 for n in workload.context_lens())
    for splits, combine, preload, layout, page, bn in ((1, 0, 0, "NHD", 16, 16), (16, 1, 1, "HND", 32, 16),
                                                       (16, 0, 1, "NHD", 32, 32), (16, 1, 0, "HND", 64, 32)):
        base = SPACE.config(dict(PAGE_SIZE=page, LAYOUT=layout, NUM_SPLITS=splits, BLOCK_N=bn, num_warps=4,
                                 num_stages=2, GQA_GROUPED=1, COMBINE=combine, PRELOAD_PAGES=preload))
        tma = base.replace(KV_TMA=1)
        assert SPACE.is_valid(tma, workload), SPACE.why_invalid(tma, workload)
        _check(workload, tma, inputs, reference)
        same = torch.equal(FAMILY.prepare(inputs, tma)(), FAMILY.prepare(inputs, base)())
        assert same, f"{tma}: not bit-identical to the pointer loads"


def test_kv_tma_needs_the_grouped_path_and_one_page_per_block():
    workload = DecodeWorkload(32, 8, 128, 1, 4096)
    ok = dict(PAGE_SIZE=64, LAYOUT="NHD", NUM_SPLITS=16, BLOCK_N=64, num_warps=4, num_stages=4, GQA_GROUPED=1,
              KV_TMA=1)
    assert SPACE.is_valid(SPACE.config(ok), workload)
    for bad in (dict(GQA_GROUPED=0), dict(BLOCK_N=128)):
        why = SPACE.why_invalid(SPACE.config({**ok, **bad}), workload) or ""
        assert "KV_TMA=1 needs" in why, (bad, why)


_SM90 = """
import json, sys
from kernel_gym.kernels import decode_attention as da
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import DecodeWorkload
w = DecodeWorkload(32, 8, 128, 1, 4096)
print(json.dumps([da.compile_sm90(Config.parse(c), w) for c in json.loads(sys.argv[1])]))
"""


@pytest.mark.slow
def test_preloaded_page_ids_let_the_sm90_loads_pipeline_within_the_estimate():
    """Compiled for sm_90 (no GPU, outside the interpreter): with PRELOAD_PAGES=1 and 4 stages the TTGIR keeps copies
    in flight (an async_wait deeper than 0), and every variant, KV_TMA's too, builds within the shared-memory estimate.
    This is the compiler fact docs/benchmarks.md states for the knob (the in-loop table read's waits are all 0 on
    triton 3.9)."""
    w = DecodeWorkload(32, 8, 128, 1, 4096)
    base = SPACE.config(dict(PAGE_SIZE=64, LAYOUT="HND", NUM_SPLITS=16, BLOCK_N=64, num_warps=4, num_stages=4,
                             GQA_GROUPED=1))
    picks = [base, base.replace(PRELOAD_PAGES=1), base.replace(KV_TMA=1, PRELOAD_PAGES=1)]
    assert all(SPACE.is_valid(c, w) for c in picks)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _SM90, json.dumps([str(c) for c in picks])], capture_output=True,
                          text=True, env=env, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    old, preload, tma = json.loads(done.stdout.strip().splitlines()[-1])
    assert max(preload["async_waits"]) > 0, preload
    for config, meta in zip(picks, (old, preload, tma), strict=True):  # KV_TMA=1 builds for sm_90 too
        assert meta["shared"] <= da._shared_memory_bytes(config, w) <= SHARED_MEMORY_LIMIT, (config, meta)


def test_splits_beyond_16_leave_the_double_rule_as_it_was():
    """16 splits at batch 1 (128 programs, under one wave) stay valid beside 32: the stored rows of the counts up to
    16 keep their validity; 8 is still pruned in favour of 16 there."""
    workload = DecodeWorkload(32, 8, 128, 1, 4096)
    base = dict(PAGE_SIZE=64, LAYOUT="HND", BLOCK_N=64, num_warps=4, num_stages=2, GQA_GROUPED=1)
    assert SPACE.is_valid(SPACE.config({**base, "NUM_SPLITS": 16}), workload)
    assert SPACE.is_valid(SPACE.config({**base, "NUM_SPLITS": 32}), workload)
    assert "use NUM_SPLITS=16" in (SPACE.why_invalid(SPACE.config({**base, "NUM_SPLITS": 8}), workload) or "")
    # 64 splits x 8 kv heads x batch 4 is 2,048 programs: past MAX_WAVES waves
    assert "waves" in (SPACE.why_invalid(SPACE.config({**base, "NUM_SPLITS": 64}),
                                         DecodeWorkload(32, 8, 128, 4, 16384)) or "")


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_in_kernel_combine_matches_the_two_launch_combine_and_resets_its_counter(dtype):
    """COMBINE=1: the last split program of each (sequence, kv head) combines; ragged contexts leave later splits
    empty, and a second launch of the same closure (the counter reset to 0 by the combiner) is right again."""
    workload = DecodeWorkload(*RAGGED, dtype=dtype)
    inputs = FAMILY.make_inputs(workload, DEVICE, seed=3)
    reference = FAMILY.reference(inputs)
    for layout, page in (("HND", 16), ("NHD", 32)):  # the split count the rules allow here: 16
        base = SPACE.config(dict(PAGE_SIZE=page, LAYOUT=layout, NUM_SPLITS=16, BLOCK_N=16, num_warps=4,
                                 num_stages=2, GQA_GROUPED=1))
        fused = base.replace(COMBINE=1)
        assert SPACE.is_valid(base, workload) and SPACE.is_valid(fused, workload)
        fn = FAMILY.prepare(inputs, fused)
        first, second = fn().float().clone(), fn().float()
        two_launch = FAMILY.prepare(inputs, base)().float()
        atol, rtol = FAMILY.tolerance(dtype)
        for out in (first, second):
            assert torch.isfinite(out).all() and torch.allclose(out, reference, atol=atol, rtol=rtol)
            assert torch.allclose(out, two_launch, atol=1e-6, rtol=1e-6)
    # only the grouped path with splits has something to combine
    for bad in (dict(NUM_SPLITS=1), dict(GQA_GROUPED=0)):
        c = SPACE.config({**dict(PAGE_SIZE=16, LAYOUT="HND", NUM_SPLITS=16, BLOCK_N=16, num_warps=4, num_stages=2,
                                 GQA_GROUPED=1, COMBINE=1), **bad})
        assert "COMBINE=1 needs" in (SPACE.why_invalid(c, workload) or "")


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("shape", [(4, 2, 64, 1, 1), (4, 2, 64, 3, 1), (4, 4, 32, 1, 77), (8, 1, 64, 2, 45)])
def test_edge_shapes(dtype, shape):
    """One-token contexts (alone and in a batch: lens 1, 1, 2), batch 1, D=32, MHA (group 1) and group 8."""
    workload = DecodeWorkload(*shape, dtype=dtype)
    inputs = FAMILY.make_inputs(workload, DEVICE, seed=5)
    reference = FAMILY.reference(inputs)
    valid = SPACE.valid_configs(workload)
    picks = random.Random(str(shape) + dtype).sample(valid, 2) + [FAMILY.default_config(workload)]
    for grouped in (0, 1):  # both paths on every shape
        picks.append(next(c for c in valid if c["GQA_GROUPED"] == grouped and c["PAGE_SIZE"] == 128))
    for config in picks:
        _check(workload, config, inputs, reference)


def test_block_spanning_pages_and_block_inside_page():
    """BLOCK_N = 2 x PAGE_SIZE (per-token page gather) and BLOCK_N = PAGE_SIZE / 2 (one lookup per block)."""
    workload = DecodeWorkload(*RAGGED, dtype="float32")
    inputs = FAMILY.make_inputs(workload, DEVICE, seed=11)
    reference = FAMILY.reference(inputs)
    base = Config(PAGE_SIZE=16, LAYOUT="HND", NUM_SPLITS=1, BLOCK_N=32, num_warps=4, num_stages=2, GQA_GROUPED=1)
    for config in (base, base.replace(PAGE_SIZE=64, LAYOUT="NHD", NUM_SPLITS=8, GQA_GROUPED=0)):
        SPACE.check(config, workload)
        _check(workload, config, inputs, reference)


# ---- paging ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", da.LAYOUTS)
def test_paged_cache_is_shuffled_complete_and_nan_padded(layout):
    workload = DecodeWorkload(4, 2, 32, 5, 90, dtype="float32")
    inputs = FAMILY.make_inputs(workload, "cpu", seed=1)
    page = 16
    cache = da.page_kv_cache(inputs, page, layout)
    lens = workload.context_lens()
    pages = [-(-n // page) for n in lens]
    used = torch.cat([cache.block_table[b, :p] for b, p in enumerate(pages)])
    assert len(set(used.tolist())) == len(used), "physical pages must be distinct"
    assert cache.k_cache.shape[0] > len(used), "there must be spare pages"
    assert not bool((used[1:] > used[:-1]).all()), "block table must not be sorted (shuffled pages)"
    nhd_k = cache.k_cache if layout == "NHD" else cache.k_cache.permute(0, 2, 1, 3)
    nhd_v = cache.v_cache if layout == "NHD" else cache.v_cache.permute(0, 2, 1, 3)
    cu = inputs.cu_context.tolist()
    for b, n in enumerate(lens):
        toks = torch.arange(n)
        phys = cache.block_table[b, toks // page].long()
        assert torch.equal(nhd_k[phys, toks % page], inputs.k[cu[b]: cu[b + 1]])
        assert torch.equal(nhd_v[phys, toks % page], inputs.v[cu[b]: cu[b + 1]])
        if n % page:  # slots past the end of the last page are NaN
            assert torch.isnan(nhd_k[phys[-1], n % page:]).all()
    assert torch.isnan(nhd_k).sum() == nhd_k.numel() - inputs.k.numel()
    d, hkv = workload.head_dim, workload.num_kv_heads
    expected = (page * hkv * d, hkv * d, d) if layout == "NHD" else (page * hkv * d, d, page * d)
    assert cache.strides() == expected


@pytest.mark.parametrize("grouped", [0, 1])
def test_reading_past_a_context_end_shows_up_as_nan(grouped):
    """The masks are what keeps NaN out: claim one more token than was written and that sequence's output is NaN."""
    workload = DecodeWorkload(4, 2, 64, 3, 100, dtype="float32")  # contexts 50, 100, 150
    inputs = FAMILY.make_inputs(workload, DEVICE, seed=2)
    config = Config(PAGE_SIZE=32, LAYOUT="NHD", NUM_SPLITS=1, BLOCK_N=32, num_warps=4, num_stages=2,
                    GQA_GROUPED=grouped)
    launch = FAMILY.prepare(inputs, config)
    assert torch.isfinite(launch()).all()
    inputs.context_lens[0] += 1  # 51 tokens claimed, slot 51 % 32 of page 1 was never written
    out = launch()
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1:]).all()


# ---- (b) knob space ------------------------------------------------------------------------------------------------


def _cfg(**kw) -> Config:
    base = dict(PAGE_SIZE=64, LAYOUT="HND", NUM_SPLITS=1, BLOCK_N=64, num_warps=4, num_stages=2, GQA_GROUPED=1)
    return Config(base, **kw)


MIXTRAL_B64 = DecodeWorkload(32, 8, 128, 64, 8192)


@pytest.mark.parametrize(
    "config, workload, words",
    [
        (_cfg(BLOCK_N=128, num_stages=4), DecodeWorkload(32, 8, 128, 64, 8192, dtype="float32"), "shared memory"),
        (_cfg(BLOCK_N=128, num_stages=4), MIXTRAL_B64, "shared memory"),
        (_cfg(PAGE_SIZE=16, BLOCK_N=64), MIXTRAL_B64, "spans"),
        (_cfg(PAGE_SIZE=128, BLOCK_N=32), MIXTRAL_B64, "below PAGE_SIZE"),
        (_cfg(BLOCK_N=128, GQA_GROUPED=0), MIXTRAL_B64, "register pressure"),
        (_cfg(PAGE_SIZE=32, BLOCK_N=32, num_warps=8), MIXTRAL_B64, "idle lanes"),
        (_cfg(NUM_SPLITS=4), MIXTRAL_B64, "waves"),
        (_cfg(NUM_SPLITS=4), DecodeWorkload(32, 8, 128, 1, 128), "exceeds the mean context"),
        (_cfg(NUM_SPLITS=4), DecodeWorkload(32, 8, 128, 1, 8192), "use NUM_SPLITS=8"),
        (_cfg(), DecodeWorkload(32, 8, 96, 4, 512), "power of two"),
        (_cfg(LAYOUT="NDH"), MIXTRAL_B64, "LAYOUT"),
    ],
)
def test_rules_reject_with_reason(config, workload, words):
    reason = SPACE.why_invalid(config, workload)
    assert reason is not None and words in reason, reason
    with pytest.raises(InvalidConfig, match="invalid"):
        SPACE.check(config, workload)


def test_shared_memory_estimate_is_conservative_and_within_limit_for_valid_configs():
    for workload in (MIXTRAL_B64, DecodeWorkload(16, 16, 128, 2, 4096, dtype="float32")):
        for config in SPACE.valid_configs(workload):
            assert da._shared_memory_bytes(config, workload) <= SHARED_MEMORY_LIMIT
            # at least num_stages buffers of the K and V tiles
            tile = int(config["BLOCK_N"]) * workload.head_dim * da._DTYPE_BYTES[workload.dtype]
            assert da._shared_memory_bytes(config, workload) >= int(config["num_stages"]) * 2 * tile


def test_default_config_valid_and_space_size_bounded_on_every_default_workload():
    for model in BUILTIN_MODELS.values():
        for dtype in ("bfloat16", "float32"):
            for workload in model_workloads("decode_attention", model, grid="default", dtype=dtype):
                default = FAMILY.default_config(workload)
                assert SPACE.is_valid(default, workload), SPACE.why_invalid(default, workload)
                n = len(SPACE.valid_configs(workload))
                # COMBINE=1 twins of the grouped split configs, 32 and 64 splits, and the PRELOAD_PAGES=1 and
                # KV_TMA=1 twins of the grouped one-page-per-block configs: up to 1,312 (500 before them)
                assert 50 <= n <= 1350, f"{n} valid configs on {workload}"


def test_default_is_vllm_like():
    default = FAMILY.default_config(MIXTRAL_B64)
    assert default == Config(PAGE_SIZE=16, LAYOUT="NHD", NUM_SPLITS=1, BLOCK_N=16, num_warps=4, num_stages=2,
                             GQA_GROUPED=0)


def test_fast_hopper_configs_are_in_the_space():
    """What the H200 target needs: GQA grouping, HND pages, 64-128 token blocks, 2-4 stages; splits at small batch."""
    for page, bn, stages in ((64, 64, 2), (64, 64, 4), (128, 128, 2), (64, 128, 2), (128, 64, 4)):
        config = _cfg(PAGE_SIZE=page, BLOCK_N=bn, num_stages=stages)
        assert SPACE.is_valid(config, MIXTRAL_B64), SPACE.why_invalid(config, MIXTRAL_B64)
    assert SPACE.is_valid(_cfg(NUM_SPLITS=2, BLOCK_N=128), MIXTRAL_B64)  # evens out contexts of 0.5x..1.5x
    b8 = DecodeWorkload(32, 8, 128, 8, 32768)
    for splits in (4, 8, 16):
        assert SPACE.is_valid(_cfg(NUM_SPLITS=splits), b8), SPACE.why_invalid(_cfg(NUM_SPLITS=splits), b8)
    # 2 splits: 8 x 8 x 2 = 128 programs, under one wave of 132 SMs, while 4 splits are valid
    assert "less than one wave" in SPACE.why_invalid(_cfg(NUM_SPLITS=2), b8)
    b1 = DecodeWorkload(32, 8, 128, 1, 32768)
    assert SPACE.is_valid(_cfg(NUM_SPLITS=16, BLOCK_N=128), b1)


def test_every_knob_value_is_used_by_some_valid_config():
    workloads = [w for m in BUILTIN_MODELS.values() for w in model_workloads("decode_attention", m, "default")]
    used = {name: set() for name in SPACE.names}
    for workload in workloads[::7]:
        for config in SPACE.valid_configs(workload):
            for name in SPACE.names:
                used[name].add(SPACE.value(config, name))  # legacy knobs: left out at 0
    for knob in SPACE.knobs:
        assert used[knob.name] == set(knob.values), knob.name


def test_family_interface_and_counts():
    assert get_family("decode_attention") is FAMILY
    assert FAMILY.workload_type is DecodeWorkload and FAMILY.name == "decode_attention"
    w = DecodeWorkload(32, 8, 128, 2, 100)  # contexts 50 and 150
    assert FAMILY.flops(w) == 4 * 200 * 128 * 32
    assert FAMILY.bytes_moved(w) == 2 * 200 * 8 * 128 * 2 + 2 * 2 * 32 * 128 * 2
    assert FAMILY.bytes_moved(DecodeWorkload(32, 8, 128, 2, 100, dtype="float32")) == 2 * FAMILY.bytes_moved(w)
    assert [name for name, _ in da.bench_cases()][0] == "decode_b64_ctx8192_gqa4_d128"
    assert da.bench_cases()[0][1] == MIXTRAL_B64
    with pytest.raises(ValueError, match="bfloat17"):
        FAMILY.tolerance("bfloat17")


def test_inputs_are_random_nonzero_and_config_independent():
    w = DecodeWorkload(4, 2, 64, 3, 100, dtype="float16")
    a, b = FAMILY.make_inputs(w, "cpu", seed=0), FAMILY.make_inputs(w, "cpu", seed=0)
    assert torch.equal(a.q, b.q) and torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    assert a.q.dtype == torch.float16 and a.k.shape == (300, 2, 64) and a.q.shape == (3, 4, 64)
    assert (a.k != 0).float().mean() > 0.99 and a.k.float().std() > 0.5
    assert a.context_lens.tolist() == w.context_lens() == [50, 100, 150]
    c = FAMILY.make_inputs(w, "cpu", seed=1)
    assert not torch.equal(a.k, c.k)
    ref = FAMILY.reference(a)
    assert ref.dtype == torch.float32 and ref.abs().mean() > 0.05  # peaked softmax: outputs are not ~0


def test_bad_inputs_are_rejected_with_clear_errors():
    w = DecodeWorkload(4, 2, 64, 2, 40, dtype="float32")
    inputs = FAMILY.make_inputs(w, "cpu")
    with pytest.raises(InvalidConfig, match="spans"):
        FAMILY.prepare(inputs, _cfg(PAGE_SIZE=16, BLOCK_N=64))
    inputs.q = inputs.q[:, :2]
    with pytest.raises(ValueError, match="q has shape"):
        FAMILY.prepare(inputs, FAMILY.default_config(w))
    with pytest.raises(ValueError, match="power of two"):
        FAMILY.make_inputs(DecodeWorkload(4, 2, 48, 1, 10), "cpu")
    with pytest.raises(TypeError, match="DecodeWorkload"):
        FAMILY.default_config("decode")
    with pytest.raises(ValueError, match="layout"):
        da.page_kv_cache(FAMILY.make_inputs(w, "cpu"), 16, "HDN")


# ---- (c) GPU: bf16, many configs on realistic shapes -----------------------------------------------------------------


def _failures(workload: DecodeWorkload, configs: list[Config]) -> list[str]:
    inputs = FAMILY.make_inputs(workload, "cuda", seed=0)
    reference = FAMILY.reference(inputs)
    atol, rtol = FAMILY.tolerance(workload.dtype)
    bad = []
    for config in configs:
        try:
            out = FAMILY.prepare(inputs, config)()
            torch.cuda.synchronize()
            err = (out.float() - reference).abs().max().item()
            if not torch.allclose(out.float(), reference, atol=atol, rtol=rtol):
                bad.append(f"{config}: max err {err:.3g}")
        except Exception as exc:  # noqa: BLE001 - every failure is reported with its reason
            bad.append(f"{config}: {type(exc).__name__}: {str(exc)[:300]}")
    return bad


@pytest.mark.gpu
def test_gpu_all_valid_configs_mixtral_bf16():
    workload = DecodeWorkload(32, 8, 128, 5, 1000)  # contexts 500 .. 1500
    configs = SPACE.valid_configs(workload)
    bad = _failures(workload, configs)
    assert not bad, f"{len(bad)}/{len(configs)} configs failed:\n" + "\n".join(bad[:30])


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(32, 8, 128, 1, 8192), (32, 8, 128, 64, 2048), (16, 16, 128, 4, 4096)])
def test_gpu_sampled_configs_bf16(shape):
    workload = DecodeWorkload(*shape)
    configs = SPACE.sample(workload, 80, seed=1) + [FAMILY.default_config(workload)]
    bad = _failures(workload, configs)
    assert not bad, f"{len(bad)}/{len(configs)} configs failed on {workload}:\n" + "\n".join(bad[:30])


@pytest.mark.gpu
def test_gpu_bench_case_bandwidth():
    """Best of a few Hopper-style configs on the target case: report KV bandwidth; fail below half the copy speed."""
    import triton

    name, workload = da.bench_cases()[0]
    inputs = FAMILY.make_inputs(workload, "cuda", seed=0)
    reference = FAMILY.reference(inputs)
    best = None
    for page, bn, stages, warps in ((64, 64, 2, 4), (64, 64, 4, 4), (128, 128, 2, 4), (64, 128, 2, 8)):
        config = _cfg(PAGE_SIZE=page, BLOCK_N=bn, num_stages=stages, num_warps=warps)
        launch = FAMILY.prepare(inputs, config)
        out = launch()
        assert torch.allclose(out.float(), reference, atol=2e-2, rtol=2e-2), config
        ms = triton.testing.do_bench(launch)
        tbps = FAMILY.bytes_moved(workload) / (ms * 1e-3) / 1e12
        print(f"{name} {config}: {ms:.3f} ms, {tbps:.2f} TB/s")
        best = max(best or 0.0, tbps)
    assert best >= 0.5 * 4.27, f"best {best:.2f} TB/s is below half of the 4.27 TB/s copy bandwidth"
