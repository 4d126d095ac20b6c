"""Paged-prefix chunked prefill: correctness against the fp32 torch reference (CPU interpreter in fp32/fp16, GPU in
bf16), every load path (TMA NHD/HND, pointers across pages, KV splits), knob-space rules, the workload and the work
table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from kernel_gym.kernels import get_family
from kernel_gym.kernels import prefill_attention as pa
from kernel_gym.kernels import prefix_prefill as pp
from kernel_gym.kernels.space import SHARED_MEMORY_LIMIT, Config, InvalidConfig
from kernel_gym.kernels.workloads import (
    PrefillWorkload,
    PrefixPrefillWorkload,
    model_workloads,
    prefix_batch,
    workload_from_key,
)
from kernel_gym.models import BUILTIN_MODELS

FAMILY = pp.FAMILY
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def cfg(ps=32, layout="NHD", bm=32, bn=32, warps=4, stages=2, splits=1) -> Config:
    return Config(PAGE_SIZE=ps, LAYOUT=layout, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages,
                  NUM_SPLITS=splits)


def _check(workload: PrefixPrefillWorkload, config: Config, seed: int = 0) -> str | None:
    """None when the kernel matches the reference for this config (output NaN-filled first), else why not."""
    inputs = FAMILY.make_inputs(workload, DEVICE, seed)
    try:
        fn = FAMILY.prepare(inputs, config)
        out = fn()
        out.fill_(float("nan"))  # the second launch must write every element
        out = fn()
    except Exception as exc:  # noqa: BLE001 - the message is the point of the GPU sweep
        return f"{config} on {workload}: {type(exc).__name__}: {str(exc)[:300]}"
    ref = FAMILY.reference(inputs)
    atol, rtol = FAMILY.tolerance(workload.dtype)
    if out.shape != ref.shape or out.dtype != inputs.q.dtype:
        return f"{config} on {workload}: output {tuple(out.shape)} {out.dtype}, expected {tuple(ref.shape)}"
    err = (out.float() - ref).abs()
    bad = ~(err <= atol + rtol * ref.abs())  # NaN counts as bad
    if bad.any():
        return f"{config} on {workload}: {int(bad.sum())} elements off, max abs error {err.max().item():.3g}"
    return None


# ---- (a) correctness under the interpreter ----------------------------------------------------------------------

MIXED = PrefixPrefillWorkload(4, 2, 64, (20, 5, 33), (170, 0, 17), "float32")  # with and without a prefix, GQA 2

PATHS = [
    pytest.param(cfg(ps=32, layout="NHD", bm=32, bn=32), id="tma-nhd"),
    pytest.param(cfg(ps=64, layout="HND", bm=64, bn=32), id="tma-hnd-two-blocks-per-page"),
    pytest.param(cfg(ps=16, layout="NHD", bm=64, bn=64), id="pointers-nhd-4-pages-per-block"),
    pytest.param(cfg(ps=16, layout="HND", bm=32, bn=32), id="pointers-hnd"),
    pytest.param(cfg(ps=32, layout="NHD", bm=64, bn=16, splits=4), id="splits-4"),
    pytest.param(cfg(ps=16, layout="HND", bm=64, bn=32, splits=2), id="pointers-splits-2"),
]


@pytest.mark.parametrize("config", PATHS)
def test_load_paths_match_reference_fp32(config: Config) -> None:
    assert FAMILY.space.is_valid(config, MIXED), FAMILY.space.why_invalid(config, MIXED)
    assert (msg := _check(MIXED, config, seed=3)) is None, msg


@pytest.mark.parametrize("i", range(3))
def test_small_grid_fp16_default_and_a_sample(i: int) -> None:
    w = model_workloads("prefix_prefill", None, grid="small", dtype="float16")[i]
    big = [c for c in FAMILY.space.valid_configs(w) if int(c["BLOCK_M"]) >= 64 and int(c["BLOCK_N"]) >= 32]
    configs = [FAMILY.default_config(w), big[(37 * i) % len(big)]]  # big tiles: few interpreted programs
    failures = [msg for c in configs if (msg := _check(w, c, seed=i))]
    assert not failures, "\n".join(failures)


def test_gqa_group_four_d128_with_chunk_of_one_token() -> None:
    """A one-token chunk (a decode step through this kernel) and a long-prefix request, D=128, 4 q heads per kv head."""
    w = PrefixPrefillWorkload(8, 2, 128, (1, 40), (70, 3), "float32")
    assert (msg := _check(w, cfg(ps=16, bm=64, bn=16, splits=2), seed=1)) is None, msg


def test_reference_without_prefix_is_the_prefill_reference() -> None:
    """prefix 0 is plain causal prefill: the two families' references agree on the same tensors."""
    w = PrefixPrefillWorkload(4, 2, 64, (9, 30), (0, 0), "float32")
    inputs = FAMILY.make_inputs(w, DEVICE, seed=2)
    pw = PrefillWorkload(4, 2, 64, (9, 30), "float32")
    p_inputs = pa.PrefillInputs(pw, inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.sm_scale)
    torch.testing.assert_close(FAMILY.reference(inputs), pa.FAMILY.reference(p_inputs))


def test_last_chunk_row_sees_the_whole_context_and_first_row_not_the_rest() -> None:
    """Changing the chunk's last key moves only the last query row; changing a prefix key moves every row."""
    w = PrefixPrefillWorkload(2, 1, 64, (6,), (10,), "float32")
    inputs = FAMILY.make_inputs(w, DEVICE, seed=4)
    config = cfg(ps=16, bm=16, bn=16)
    base = FAMILY.prepare(inputs, config)().clone()
    inputs.v[15] += 5.0  # the chunk's last token (position 15)
    pp._last_paged.clear()
    moved = (FAMILY.prepare(inputs, config)() - base).abs().amax(dim=(1, 2))
    assert moved[:5].max().item() == 0.0 and moved[5].item() > 0.1
    inputs.v[0] += 5.0  # a prefix token
    pp._last_paged.clear()
    moved = (FAMILY.prepare(inputs, config)() - base).abs().amax(dim=(1, 2))
    assert moved.min().item() > 0.01


def test_paged_cache_is_shuffled_and_nan_past_the_context() -> None:
    w = PrefixPrefillWorkload(2, 2, 16, (3, 4), (30, 0), "float32")
    inputs = FAMILY.make_inputs(w, DEVICE, seed=0)
    paged = pp.page_context(inputs.k, inputs.v, w.context_lens(), 16, "HND", seed=0)
    bt = paged.block_table.tolist()
    assert bt[0][:3] != [0, 1, 2] and len(set(bt[0][:3])) == 3
    page, slot = bt[1][0], 3  # request 1 has 4 tokens: slot 3 holds its last, slot 4 is past its end
    torch.testing.assert_close(paged.k_cache[page, :, slot], inputs.k[33 + 3])
    assert torch.isnan(paged.k_cache[page, :, 4]).all()


def test_prepare_rejects_invalid_config_bad_inputs_and_a_mismatched_cache() -> None:
    w = PrefixPrefillWorkload(4, 2, 64, (33,), (8,), "float32")
    inputs = FAMILY.make_inputs(w, DEVICE)
    with pytest.raises(InvalidConfig, match="BLOCK_M=24"):
        FAMILY.prepare(inputs, cfg(bm=24))
    paged = pp.page_context(inputs.k, inputs.v, w.context_lens(), 16, "NHD")
    with pytest.raises(ValueError, match="page the cache for the config"):
        FAMILY.prepare_paged(inputs.q, paged, w, cfg(ps=32), inputs.sm_scale)
    inputs.k = inputs.k[:-1]
    with pytest.raises(ValueError, match=r"k has shape \(40, 2, 64\)"):
        FAMILY.prepare(inputs, cfg())
    with pytest.raises(ValueError, match="head_dim 80"):
        FAMILY.make_inputs(PrefixPrefillWorkload(4, 2, 80, (8,), (0,), "float32"), DEVICE)
    with pytest.raises(TypeError, match="needs a PrefixPrefillWorkload"):
        FAMILY.default_config(PrefillWorkload(4, 2, 64, (8,)))


# ---- (b) workload, rules, work table ----------------------------------------------------------------------------


def test_workload_validates_and_round_trips() -> None:
    w = PrefixPrefillWorkload(32, 8, 128, (512, 3), (100, 0))
    assert w.causal_pairs() == 512 * 100 + 512 * 513 // 2 + 6 and w.context_lens() == (612, 3)
    assert workload_from_key("prefix_prefill", w.key()) == w
    assert all(isinstance(v, float) for v in w.features().values())
    with pytest.raises(ValueError, match="one length >= 0 per chunk"):
        PrefixPrefillWorkload(4, 2, 64, (8, 8), (0,))
    with pytest.raises(ValueError, match="non-empty positive"):
        PrefixPrefillWorkload(4, 2, 64, (0,), (0,))
    assert prefix_batch(2048, 8192, "mixed4") == ((512,) * 4, (8192, 4096, 2048, 0))
    with pytest.raises(ValueError, match="unknown prefix mix"):
        prefix_batch(8, 8, "zigzag")


@pytest.mark.parametrize("model", sorted(BUILTIN_MODELS))
def test_default_config_valid_on_default_grid(model: str) -> None:
    grid = model_workloads("prefix_prefill", BUILTIN_MODELS[model])
    assert len(grid) == len({w.key() for w in grid}) >= 40
    for w in grid:
        assert FAMILY.space.is_valid(FAMILY.default_config(w), w)


@pytest.mark.parametrize("config", [
    pytest.param(cfg(ps=32, layout="NHD", bm=32, bn=32), id="tma-nhd"),
    pytest.param(cfg(ps=16, layout="HND", bm=16, bn=64), id="pointers-hnd"),
    pytest.param(cfg(ps=32, layout="HND", bm=32, bn=16, splits=2), id="splits-2"),
])
def test_pack_gqa_matches_reference_and_the_unpacked_kernel(config: Config) -> None:
    """PACK_GQA=1 (a tile's rows = BLOCK_M / group tokens x the group's q heads) on requests with and without a
    prefix, GQA 2 and 4, against the reference and against the same config unpacked."""
    packed = Config({**config, "PACK_GQA": 1})
    for w in (MIXED, PrefixPrefillWorkload(8, 2, 64, (1, 40, 9), (70, 3, 0), "float32")):
        assert FAMILY.space.is_valid(packed, w), FAMILY.space.why_invalid(packed, w)
        assert (msg := _check(w, packed, seed=2)) is None, msg
        inputs = FAMILY.make_inputs(w, DEVICE, seed=2)
        torch.testing.assert_close(FAMILY.prepare(inputs, packed)(), FAMILY.prepare(inputs, config)(),
                                   atol=1e-5, rtol=1e-5)


def test_pack_gqa_rules_and_work_table() -> None:
    mha = PrefixPrefillWorkload(4, 4, 64, (20,), (0,))
    assert "one q head per kv head" in FAMILY.space.why_invalid(Config({**cfg(), "PACK_GQA": 1}), mha)
    group8 = PrefixPrefillWorkload(16, 2, 64, (20,), (0,))
    assert "must be a multiple of 8" not in (FAMILY.space.why_invalid(Config({**cfg(bm=32), "PACK_GQA": 1}),
                                                                      group8) or "")
    w = PrefixPrefillWorkload(8, 2, 64, (70, 5), (0, 300))
    items = pp.work_table(w, 32, 2, section=100, pack_gqa=True)  # 8 tokens per tile, one program per kv head
    expected = {(s, b, h, sp) for s, n in enumerate(w.chunk_lens) for b in range(-(-n // 8))
                for h in range(2) for sp in range(2)}
    assert len(items) == len(expected) and set(items) == expected
    assert items[0][0] == 1  # the heaviest tile first: request 1's (305 keys)


def test_rules_name_the_problem() -> None:
    big = PrefixPrefillWorkload(32, 8, 128, (4096,), (0,))
    assert "fill two waves" in FAMILY.space.why_invalid(cfg(ps=64, bm=64, bn=64, splits=2), big)
    short = PrefixPrefillWorkload(32, 8, 128, (64,), (0,))
    assert "fewer than 2 blocks" in FAMILY.space.why_invalid(cfg(bn=32, splits=2), short)
    assert "spans 8 pages" in FAMILY.space.why_invalid(cfg(ps=16, bn=128), short)
    assert "shared memory" in FAMILY.space.why_invalid(cfg(ps=128, bm=128, bn=128, warps=8, stages=4), short)
    assert "register pressure" in FAMILY.space.why_invalid(cfg(ps=128, bm=128, bn=128, warps=4), short)
    long = PrefixPrefillWorkload(32, 8, 128, (512,), (32768,))
    assert FAMILY.space.is_valid(cfg(ps=64, bm=128, bn=64, warps=8, stages=3, splits=4), long)


def test_work_table_covers_every_program_once_heaviest_first() -> None:
    w = PrefixPrefillWorkload(4, 2, 64, (70, 5), (0, 300))
    items = pp.work_table(w, 32, 2, section=100)
    expected = {(s, b, h, sp) for s, n in enumerate(w.chunk_lens) for b in range(-(-n // 32))
                for h in range(4) for sp in range(2)}
    assert len(items) == len(expected) and set(items) == expected
    assert items[0][0] == 1  # request 1's one tile sees 305 keys, more than request 0's heaviest (70)


def test_family_is_registered() -> None:
    assert get_family("prefix_prefill") is FAMILY


def test_flops_and_bytes() -> None:
    w = PrefixPrefillWorkload(32, 8, 128, (2048,), (8192,))
    assert FAMILY.flops(w) == 4.0 * (2048 * 8192 + 2048 * 2049 // 2) * 128 * 32
    assert FAMILY.bytes_moved(w) == (2 * 2048 * 32 * 128 + 2 * 10240 * 8 * 128) * 2


def test_bench_cases_are_valid_and_anchorable() -> None:
    cases = dict(pp.bench_cases())
    assert {max(w.chunk_lens) * len(w.chunk_lens) for w in cases.values()} >= {512, 2048}
    assert max(max(w.prefix_lens) for w in cases.values()) == 32768
    for w in cases.values():
        assert FAMILY.space.is_valid(FAMILY.default_config(w), w)


def test_sdpa_prefix_anchor_masks_compute_the_reference() -> None:
    """The anchor's two mask forms (bench.bottom_right_mask and torch's causal_lower_right) give the family's
    reference on its own inputs, laid out as SDPA's [B, H, N, D] (kv heads repeated)."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    from kernel_gym import bench

    w = PrefixPrefillWorkload(4, 2, 16, (5, 5), (7, 7), "float32")
    inputs = FAMILY.make_inputs(w, "cpu", seed=6)
    q = inputs.q.view(2, 5, 4, 16).transpose(1, 2)
    k = inputs.k.view(2, 12, 2, 16).transpose(1, 2).repeat_interleave(2, dim=1)
    v = inputs.v.view(2, 12, 2, 16).transpose(1, 2).repeat_interleave(2, dim=1)
    ref = FAMILY.reference(inputs)
    for mask in (bench.bottom_right_mask(5, 7, "cpu"), causal_lower_right(5, 12)):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(ref.shape)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


_SM90 = """
import json, sys
from kernel_gym.kernels import prefix_prefill as pp
from kernel_gym.kernels.space import Config
w = pp.PrefixPrefillWorkload(32, 8, 128, (512,), (2048,))
print(json.dumps([pp.compile_sm90(Config.parse(c), w) for c in json.loads(sys.argv[1])]))
"""


@pytest.mark.slow
def test_tma_and_pointer_paths_compile_for_sm90_within_the_estimate() -> None:
    """The largest valid TMA config, the default (pointers) and the largest PACK_GQA config compile for sm_90 (no
    GPU needed, outside the interpreter), within the shared-memory estimate and the H200's limit."""
    w = PrefixPrefillWorkload(32, 8, 128, (512,), (2048,))
    valid = sorted(FAMILY.space.valid_configs(w), key=lambda c: pp._shared_memory_bytes(c, w))
    tma = [c for c in valid if int(c["BLOCK_N"]) <= int(c["PAGE_SIZE"])]
    packed = [c for c in tma if "PACK_GQA" in c]  # q gathered by pointers, K/V through TMA
    picks = [str(tma[-1]), str(FAMILY.default_config(w)), str(packed[-1])]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _SM90, json.dumps(picks)], capture_output=True, text=True, env=env,
                          timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    meta = json.loads(done.stdout.strip().splitlines()[-1])
    assert [m["tma"] for m in meta] == [1, 0, 1]
    for config, m in zip(picks, meta):
        assert m["shared"] <= pp._shared_memory_bytes(Config.parse(config), w) <= SHARED_MEMORY_LIMIT, (config, m)


# ---- (c) GPU: bf16 --------------------------------------------------------------------------------------------

MIXTRAL = BUILTIN_MODELS["mixtral-8x7b"]
GPU_WORKLOADS = [
    PrefixPrefillWorkload(32, 8, 128, (512, 100, 1, 300), (4096, 0, 777, 33)),
    PrefixPrefillWorkload(32, 8, 128, (2048,), (8192,)),
    PrefixPrefillWorkload(32, 4, 64, (37, 512), (1000, 16)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("workload", GPU_WORKLOADS, ids=lambda w: f"d{w.head_dim}-{len(w.chunk_lens)}reqs")
def test_gpu_sampled_configs_match_reference_bf16(workload: PrefixPrefillWorkload) -> None:
    configs = [FAMILY.default_config(workload), *FAMILY.space.sample(workload, 16, seed=5)]
    failures = [msg for c in dict.fromkeys(configs) if (msg := _check(workload, c))]
    assert not failures, f"{len(failures)}/{len(configs)} configs failed:\n" + "\n".join(failures)
