"""Shape generality of the three attention families (prefill_attention, prefix_prefill, decode_attention) on model
shapes outside the ones the project was built on: head_dim 64/128/256 and 80/96 (Phi, Falcon), GQA groups 1-8 and 16
(28 q heads over 4 kv heads is a group of 7), ragged batches with one-token sequences and lengths off every block,
prefixes and decode contexts off every page size, contexts of one token, fp32/fp16/bf16.

The contract, per shape: either (a) the family's default config and a few other valid configs of its knob space match
`family.reference` within the family's tolerance (measure.worker.compare), or (b) the shape or config is refused up
front, by the workload check or a validity rule, with a message that names what is unsupported and what to use
instead. Anything else (wrong numbers, a crash inside Triton, a bare assertion) is a bug.

On the CPU the kernels run under Triton's interpreter in fp32 and fp16 (bf16 arithmetic is wrong in the interpreter,
docs/architecture.md: there bf16 is checked up to the launch's host-side plumbing); the gpu-marked tests run the same
matrix in bf16 and fp16 on a GPU, with the Gluon schedules of prefill on sm_90.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest
import torch

from kernel_gym.kernels import decode_attention as da
from kernel_gym.kernels import prefill_attention as pa
from kernel_gym.kernels import prefix_prefill as pp
from kernel_gym.kernels.space import Config, InvalidConfig
from kernel_gym.kernels.workloads import DecodeWorkload, PrefillWorkload, PrefixPrefillWorkload
from kernel_gym.measure.worker import compare, poisoned_empty

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HOPPER = DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)
GROUPS = (1, 2, 3, 4, 5, 6, 7, 8, 16)
HEAD_DIMS = (64, 128, 256)
UNSUPPORTED_HEAD_DIMS = (80, 96)  # not powers of two: refused with how to pad
FAMILIES = ("prefill_attention", "prefix_prefill", "decode_attention")
MODULES = {"prefill_attention": pa, "prefix_prefill": pp, "decode_attention": da}


def kv_heads(group: int) -> int:
    """Two kv heads where the group is small (the kv head's offset into K/V is exercised), one where it is larger (the
    interpreter's time grows with the q heads; test_a_28_over_4_model_shape has 4 kv heads of 7)."""
    return 2 if group <= 2 else 1


def workload(family: str, group: int, head_dim: int, dtype: str) -> Any:
    """The family's ragged shape for a GQA group: a one-token sequence and lengths off every block and page."""
    hkv = kv_heads(group)
    h = group * hkv
    if family == "prefill_attention":
        return PrefillWorkload(h, hkv, head_dim, (1, 21), dtype)
    if family == "prefix_prefill":  # a one-token chunk after a 21-token prefix, and a fresh request
        return PrefixPrefillWorkload(h, hkv, head_dim, (1, 19), (21, 0), dtype)
    return DecodeWorkload(h, hkv, head_dim, 3, 21, dtype)  # contexts 10, 21, 32


def family_of(name: str) -> Any:
    return MODULES[name].FAMILY


def runnable(name: str, w: Any) -> list[Config]:
    """The family's valid configs less those this device cannot run: the Gluon kernel (IMPL) needs sm_90 (Gluon has
    no interpreter), so elsewhere prefill's configs are the Triton kernel's."""
    return [c for c in family_of(name).space.valid_configs(w) if HOPPER or "IMPL" not in c]


def special(name: str) -> Callable[[Config], bool]:
    """The family's paths beyond the default's: packed GQA tiles, KV splits, the grouped decode kernel with its TMA,
    preload and in-kernel combine variants."""
    if name == "prefill_attention":
        return lambda c: "PACK_GQA" in c or "IMPL" in c
    if name == "prefix_prefill":
        return lambda c: "PACK_GQA" in c or int(c["NUM_SPLITS"]) > 1 or int(c["BLOCK_N"]) > int(c["PAGE_SIZE"])
    return lambda c: int(c["GQA_GROUPED"]) == 1 and ("KV_TMA" in c or "PRELOAD_PAGES" in c or "COMBINE" in c)


def configs_for(name: str, w: Any, extra: int, seed: str) -> list[Config]:
    """The default config, one valid config on a path beyond the default's (when the shape has one) and `extra` - 1
    more valid configs, drawn deterministically per shape so that the matrix covers the spaces' knob values."""
    fam = family_of(name)
    valid = runnable(name, w)
    assert valid, f"{name}: no valid config for {w}"
    rng = random.Random(seed)
    picked = [fam.default_config(w)]
    beyond = [c for c in valid if special(name)(c)]
    if beyond:
        picked.append(rng.choice(beyond))
    picked += rng.sample(valid, min(len(valid), max(0, extra - len(picked) + 1)))
    return list(dict.fromkeys(picked))


def check(name: str, w: Any, configs: list[Config], seed: int = 0) -> list[str]:
    """Why each config fails the contract on w (empty when every one matches the reference). Buffers start as NaN
    (poisoned_empty, as the measurement worker checks), so a config that leaves part of its output unwritten fails."""
    fam = family_of(name)
    inputs = fam.make_inputs(w, DEVICE, seed)
    ref = fam.reference(inputs)
    failures = []
    for config in configs:
        assert fam.space.is_valid(config, w), fam.space.why_invalid(config, w)
        try:
            with poisoned_empty():
                out = fam.prepare(inputs, config)()
        except Exception as exc:  # noqa: BLE001 - a valid config must run: the message is the finding
            failures.append(f"{config} on {w}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        if out.dtype != inputs.q.dtype:
            failures.append(f"{config} on {w}: output dtype {out.dtype}, inputs {inputs.q.dtype}")
        elif msg := compare(fam, out, ref, w.dtype):
            failures.append(f"{config} on {w}: {msg}")
    return failures


MATRIX = [
    pytest.param(name, g, d, ("float32", "float16")[(i + j) % 2], id=f"{name}-group{g}-d{d}")
    for name in FAMILIES for i, g in enumerate(GROUPS) for j, d in enumerate(HEAD_DIMS)
]


# ---- (a) supported shapes match the reference (CPU interpreter: fp32 and fp16, alternating over the matrix) -------


@pytest.mark.parametrize(("name", "group", "head_dim", "dtype"), MATRIX)
def test_default_and_sampled_configs_match_reference(name: str, group: int, head_dim: int, dtype: str) -> None:
    w = workload(name, group, head_dim, dtype)
    configs = configs_for(name, w, extra=2, seed=f"{name}-{group}-{head_dim}")
    failures = check(name, w, configs, seed=group)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_bf16_is_in_the_space_and_prepares(name: str, head_dim: int) -> None:
    """bf16 has a default and valid configs at every head_dim and GQA group, and prepare() builds its launch (the
    numbers are checked on the GPU: the interpreter's bf16 arithmetic is wrong)."""
    fam = family_of(name)
    for group in (1, 7, 16):
        w = workload(name, group, head_dim, "bfloat16")
        inputs = fam.make_inputs(w, DEVICE)
        for config in configs_for(name, w, extra=2, seed=f"bf16-{name}-{group}-{head_dim}"):
            assert callable(fam.prepare(inputs, config))


def _pick(valid: list[Config], **want: Any) -> Config | None:
    for c in valid:
        if all(c.get(k, v if v == 0 else None) == v for k, v in want.items()):
            return c
    return None


def test_prefix_prefill_prefixes_off_every_page_size_in_a_mixed_batch() -> None:
    """Prefixes of 37, 0 and 17 tokens (none a multiple of any page size) with chunks of 1, 19 and 5 tokens: one
    config per page size and layout, TMA blocks within a page and pointer blocks across pages, KV splits, packed GQA."""
    w = PrefixPrefillWorkload(8, 2, 64, (1, 19, 5), (37, 0, 17), "float32")
    valid = pp.FAMILY.space.valid_configs(w)
    configs = []
    for i, page in enumerate((16, 32, 64, 128)):
        for layout in ("NHD", "HND"):
            pool = [c for c in valid if c["PAGE_SIZE"] == page and c["LAYOUT"] == layout]
            across = [c for c in pool if int(c["BLOCK_N"]) > page]  # pointers, one page lookup per token
            split = [c for c in pool if int(c["NUM_SPLITS"]) > 1]
            packed = [c for c in pool if "PACK_GQA" in c]
            paths = (across, split, packed, pool) if layout == "NHD" else (split, packed, across, pool)
            configs += [next(x for x in paths if x)[i % len(next(x for x in paths if x))]]
    assert {int(c["BLOCK_N"]) > int(c["PAGE_SIZE"]) for c in configs} == {False, True}
    failures = check("prefix_prefill", w, list(dict.fromkeys(configs)), seed=4)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(("batch", "context"), [(1, 1), (2, 1), (3, 45)], ids=["ctx1", "ctx1-2", "ctx22-45-68"])
def test_decode_contexts_of_one_token_and_off_every_page(batch: int, context: int) -> None:
    """A context of one token (batch 2: contexts 1 and 2) and contexts of 22, 45 and 68 tokens: every page size, both
    paths, and the grouped path's TMA, preload, split and in-kernel combine variants where the shape allows them."""
    w = DecodeWorkload(8, 2, 64, batch, context, "float16")
    valid = da.FAMILY.space.valid_configs(w)
    wants = [dict(PAGE_SIZE=p, GQA_GROUPED=i % 2) for i, p in enumerate((16, 32, 64, 128))]
    wants += [dict(KV_TMA=1, LAYOUT="HND"), dict(PRELOAD_PAGES=1), dict(COMBINE=1), dict(NUM_SPLITS=2, GQA_GROUPED=0)]
    configs = [c for want in wants if (c := _pick(valid, **want)) is not None]
    assert len(configs) >= 5, configs
    failures = check("decode_attention", w, list(dict.fromkeys(configs)), seed=batch)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("seq_lens", [(1,), (1, 16, 1, 33)], ids=["one", "mixed"])
def test_prefill_one_token_sequences_and_packed_groups(seq_lens: tuple[int, ...]) -> None:
    """One-token sequences alone and among others, with and without packed GQA (groups of 2 to 16 packed per tile)."""
    failures = []
    for group, dtype in ((4, "float16"), (16, "float32")):
        w = PrefillWorkload(group * 2 if group < 16 else 16, 2 if group < 16 else 1, 64, seq_lens, dtype)
        valid = runnable("prefill_attention", w)
        configs = [pa.FAMILY.default_config(w)]
        configs += [c for c in (_pick(valid, PACK_GQA=1, BLOCK_M=16), _pick(valid, PACK_GQA=1, BLOCK_M=128),
                                _pick(valid, BLOCK_M=16, BLOCK_N=128)) if c is not None]
        assert any("PACK_GQA" in c for c in configs), f"no packed config for {w}"
        failures += check("prefill_attention", w, configs)
    assert not failures, "\n".join(failures)


def test_a_28_over_4_model_shape() -> None:
    """28 q heads over 4 kv heads (a group of 7, Qwen2-7B-like) at head_dim 128, each family once."""
    shapes = {
        "prefill_attention": PrefillWorkload(28, 4, 128, (1, 23), "float16"),
        "prefix_prefill": PrefixPrefillWorkload(28, 4, 128, (3, 1), (21, 0), "float16"),
        "decode_attention": DecodeWorkload(28, 4, 128, 2, 19, "float32"),
    }
    failures = []
    for name, w in shapes.items():
        failures += check(name, w, configs_for(name, w, extra=1, seed=f"28/4-{name}"))
    assert not failures, "\n".join(failures)


# ---- (b) unsupported shapes and configs are refused up front, saying what to do ----------------------------------


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("head_dim", UNSUPPORTED_HEAD_DIMS)
def test_head_dims_off_the_powers_of_two_are_refused_with_how_to_pad(name: str, head_dim: int) -> None:
    fam = family_of(name)
    w = workload(name, 7, head_dim, "float16")
    words = (rf"head_dim {head_dim} is not supported.*power of two.*zero-pad q, k and v to head_dim 128.*"
             rf"sqrt\({head_dim}\)")
    with pytest.raises(ValueError, match=words):
        fam.default_config(w)
    with pytest.raises(ValueError, match=words):
        fam.make_inputs(w, DEVICE)
    assert fam.space.valid_configs(w) == []
    supported = fam.default_config(workload(name, 7, 128, "float16"))
    assert f"head_dim {head_dim} is not supported" in fam.space.why_invalid(supported, w)
    with pytest.raises(InvalidConfig, match="zero-pad"):
        fam.space.check(supported, w)


@pytest.mark.parametrize("head_dim", [8, 512])
def test_head_dims_outside_16_to_256_are_refused(head_dim: int) -> None:
    for name in FAMILIES:
        with pytest.raises(ValueError, match=rf"head_dim {head_dim} is not supported.*\[16, 256\]"):
            family_of(name).default_config(workload(name, 2, head_dim, "float32"))


@pytest.mark.parametrize("name", ["prefill_attention", "prefix_prefill"])
@pytest.mark.parametrize("group", [3, 5, 6, 7])
def test_pack_gqa_is_refused_for_groups_no_tile_holds_whole(name: str, group: int) -> None:
    """BLOCK_M is a power of two: PACK_GQA cannot pack groups of 3, 5, 6 or 7 q heads, and says to leave it out."""
    fam = family_of(name)
    w = workload(name, group, 64, "float16")
    packed = fam.space.config({**fam.default_config(w), "PACK_GQA": 1})
    reason = fam.space.why_invalid(packed, w)
    assert reason and f"groups of {group}" in reason and "use PACK_GQA=0" in reason, reason
    assert not [c for c in fam.space.valid_configs(w) if "PACK_GQA" in c]


def test_gluon_prefill_refuses_head_dims_and_dtypes_it_is_not_built_for() -> None:
    base = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2, IMPL="gluon_ws")
    config = pa.GLUON_SPACE.config(base)
    assert pa.GLUON_SPACE.is_valid(config, PrefillWorkload(28, 4, 128, (33,), "bfloat16"))
    assert "use the Triton kernel" in pa.GLUON_SPACE.why_invalid(config, PrefillWorkload(28, 4, 256, (33,)))
    assert "runs on the Triton kernel" in pa.GLUON_SPACE.why_invalid(config, PrefillWorkload(28, 4, 128, (33,),
                                                                                           "float32"))


@pytest.mark.parametrize(("heads", "kv", "words"), [
    (4, 0, "must be >= 1"), (0, 1, "must be >= 1"), (-4, 2, "must be >= 1"), (28, 8, "must be a multiple of"),
])
def test_workloads_refuse_head_counts_with_a_message(heads: int, kv: int, words: str) -> None:
    """No ZeroDivisionError for 0 kv heads, no empty q tensor reaching a TMA descriptor for 0 q heads."""
    for make in (lambda: PrefillWorkload(heads, kv, 64, (3,)), lambda: DecodeWorkload(heads, kv, 64, 1, 3),
                 lambda: PrefixPrefillWorkload(heads, kv, 64, (3,), (0,))):
        with pytest.raises(ValueError, match=words):
            make()


# ---- (c) GPU: bf16 and fp16 over the whole matrix, the Gluon schedules on sm_90 ------------------------------------


GPU_MATRIX = [
    pytest.param(name, g, d, dtype, id=f"{name}-group{g}-d{d}-{dtype}")
    for name in FAMILIES for g in GROUPS for d in HEAD_DIMS for dtype in ("bfloat16", "float16")
]


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "group", "head_dim", "dtype"), GPU_MATRIX)
def test_gpu_matrix_matches_reference(name: str, group: int, head_dim: int, dtype: str) -> None:
    w = workload(name, group, head_dim, dtype)
    failures = check(name, w, configs_for(name, w, extra=3, seed=f"gpu-{name}-{group}-{head_dim}-{dtype}"))
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)
