"""Prefill attention: correctness against the fp32 torch reference (CPU interpreter and GPU), knob-space rules,
tile scheduling, and the FLOP/byte model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from kernel_gym.kernels import get_family
from kernel_gym.kernels import prefill_attention as pa
from kernel_gym.kernels.space import SHARED_MEMORY_LIMIT, Config, InvalidConfig
from kernel_gym.kernels.workloads import PrefillWorkload, model_workloads, prefill_seq_lens
from kernel_gym.models import BUILTIN_MODELS

FAMILY = pa.FAMILY
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HOPPER = DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)
# The Gluon kernel (IMPL=gluon_*) runs on sm_90 only (Gluon has no interpreter): elsewhere the samples come from the
# Triton kernel's knobs.
RUNNABLE_SPACE = FAMILY.space if HOPPER else pa.SPACE


def _check(workload: PrefillWorkload, config: Config, seed: int = 0) -> str | None:
    """None when the kernel matches the reference for this config, else a message naming config and error."""
    inputs = FAMILY.make_inputs(workload, DEVICE, seed)
    try:
        out = FAMILY.prepare(inputs, config)()
    except Exception as exc:  # noqa: BLE001 - the message is the point of the GPU sweep
        return f"{config} on {workload}: {type(exc).__name__}: {str(exc)[:300]}"
    ref = FAMILY.reference(inputs)
    atol, rtol = FAMILY.tolerance(workload.dtype)
    if out.shape != ref.shape or out.dtype != inputs.q.dtype:
        expected = f"{tuple(ref.shape)} {inputs.q.dtype}"
        return f"{config} on {workload}: output {tuple(out.shape)} {out.dtype}, expected {expected}"
    err = (out.float() - ref).abs()
    bad = err > atol + rtol * ref.abs()
    if bad.any():
        return f"{config} on {workload}: {int(bad.sum())} elements off, max abs error {err.max().item():.3g}"
    return None


# ---- (a) correctness under the interpreter (fp32, fp16) ---------------------------------------------------------

EXTRA_RAGGED = [
    PrefillWorkload(8, 2, 128, (129, 1, 16), "float32"),  # D=128, GQA group 4, one-token sequence, block-edge lengths
    PrefillWorkload(2, 2, 64, (17, 64, 3), "float16"),  # MHA, lengths around the block sizes
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_sampled_configs_match_reference_on_small_grid(dtype: str) -> None:
    failures = []
    for i, workload in enumerate(model_workloads("prefill_attention", None, grid="small", dtype=dtype)):
        configs = RUNNABLE_SPACE.sample(workload, 3, seed=100 + i) + [FAMILY.default_config(workload)]
        failures += [msg for c in configs if (msg := _check(workload, c, seed=i))]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("workload", EXTRA_RAGGED, ids=lambda w: f"{w.dtype}-d{w.head_dim}-{w.seq_lens}")
def test_ragged_extra_cases_match_reference(workload: PrefillWorkload) -> None:
    configs = [
        Config(BLOCK_M=16, BLOCK_N=128, num_warps=4, num_stages=2),  # BLOCK_N > BLOCK_M: one diagonal block
        Config(BLOCK_M=128, BLOCK_N=16, num_warps=8, num_stages=2),  # many masked diagonal steps
        Config(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1),  # full blocks plus diagonal
    ]
    failures = [msg for c in configs if FAMILY.space.is_valid(c, workload) and (msg := _check(workload, c))]
    assert not failures, "\n".join(failures)


def test_pointer_path_for_strided_inputs_matches_reference() -> None:
    """Inputs that are views into a wider buffer (q of a fused qkv projection) cannot use TMA descriptors over
    [T, heads * D]: the kernel takes the pointer path, with its own sequence-end masks, and stays correct."""
    w = PrefillWorkload(4, 2, 64, (37, 100), "float32")
    inputs = FAMILY.make_inputs(w, DEVICE, seed=5)
    wide = torch.zeros(w.total_tokens, 4, 128, dtype=inputs.q.dtype, device=inputs.q.device)
    wide[..., :64] = inputs.q
    inputs.q = wide[..., :64]
    assert not inputs.q.is_contiguous() and pa.use_tma(inputs.q.device)
    for config in (Config(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=2), FAMILY.default_config(w)):
        torch.testing.assert_close(FAMILY.prepare(inputs, config)(), FAMILY.reference(inputs), atol=1e-4, rtol=1e-4)


def test_gqa_uses_the_right_kv_head() -> None:
    """Zeroing one kv head's V must zero exactly its group's q heads in the output."""
    w = PrefillWorkload(4, 2, 64, (40,), "float32")
    inputs = FAMILY.make_inputs(w, DEVICE, seed=3)
    inputs.v[:, 1] = 0
    out = FAMILY.prepare(inputs, Config(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=1))()
    assert out[:, 2:].abs().max().item() == 0.0
    assert out[:, :2].abs().min(dim=-1).values.max().item() > 0.0
    torch.testing.assert_close(out, FAMILY.reference(inputs), atol=1e-4, rtol=1e-4)


def test_first_token_attends_only_to_itself() -> None:
    w = PrefillWorkload(2, 1, 64, (5, 9), "float32")
    inputs = FAMILY.make_inputs(w, DEVICE, seed=4)
    out = FAMILY.prepare(inputs, FAMILY.default_config(w))()
    for start in (0, 5):  # the first token of each sequence: softmax over one key is 1, so o = v
        torch.testing.assert_close(out[start], inputs.v[start].expand(2, -1), atol=1e-5, rtol=1e-5)


def test_prepare_rejects_invalid_config_and_bad_inputs() -> None:
    w = PrefillWorkload(4, 2, 64, (33,), "float32")
    inputs = FAMILY.make_inputs(w, DEVICE)
    with pytest.raises(InvalidConfig, match="BLOCK_M=24"):
        FAMILY.prepare(inputs, Config(BLOCK_M=24, BLOCK_N=64, num_warps=4, num_stages=1))
    inputs.q = inputs.q[:-1]
    with pytest.raises(ValueError, match=r"q has shape \(32, 4, 64\)"):
        FAMILY.prepare(inputs, FAMILY.default_config(w))
    with pytest.raises(ValueError, match="head_dim 80"):
        FAMILY.make_inputs(PrefillWorkload(4, 2, 80, (8,), "float32"), DEVICE)


def test_make_inputs_are_seeded_nonzero_and_packed() -> None:
    w = PrefillWorkload(4, 2, 64, (3, 7), "float16")
    a, b = FAMILY.make_inputs(w, DEVICE, seed=1), FAMILY.make_inputs(w, DEVICE, seed=1)
    assert torch.equal(a.q, b.q) and not torch.equal(a.q, FAMILY.make_inputs(w, DEVICE, seed=2).q)
    assert a.q.shape == (10, 4, 64) and a.k.shape == (10, 2, 64) and a.q.dtype == torch.float16
    assert a.cu_seqlens.tolist() == [0, 3, 10] and a.cu_seqlens.dtype == torch.int32
    assert (a.q != 0).float().mean() > 0.99


def test_work_table_covers_every_tile_once_heaviest_first_per_section() -> None:
    lens, heads, kv_heads = (33, 100, 5), 4, 2  # GQA group 2: pairs (seq, kv head) = 6
    items = pa.work_table(lens, heads, kv_heads, 32, section=2)
    expected = [(s, b, h) for s, n in enumerate(lens) for b in range(-(-n // 32)) for h in range(heads)]
    assert sorted(items) == sorted(expected)
    pair = [(s * kv_heads + h // 2) // 2 for s, _, h in items]
    assert pair == sorted(pair)  # sections run one after another
    for sec in set(pair):
        work = [min((b + 1) * 32, lens[s]) for (s, b, _), p in zip(items, pair) if p == sec]
        assert work == sorted(work, reverse=True)  # heaviest first inside a section
    first = [h for s, b, h in items if (s, b) == (0, 1)]
    assert first[:2] == [0, 1]  # the q heads of one GQA group side by side
    with pytest.raises(ValueError, match="section must be >= 1"):
        pa.work_table(lens, heads, kv_heads, 32, section=0)


@pytest.mark.parametrize("workload", [
    PrefillWorkload(8, 2, 128, (129, 1, 16), "float32"),  # GQA 4: 16-token tiles at BLOCK_M=64
    PrefillWorkload(8, 1, 64, (33, 7), "float16"),  # GQA 8, a sequence shorter than a tile
    PrefillWorkload(4, 2, 64, (37, 100), "float32"),  # GQA 2
], ids=lambda w: f"{w.dtype}-g{w.num_heads // w.num_kv_heads}-{w.seq_lens}")
def test_pack_gqa_matches_reference_and_the_unpacked_kernel(workload: PrefillWorkload) -> None:
    """PACK_GQA=1: one program per (token tile, kv head), rows = tokens x the group's q heads."""
    failures = []
    inputs = FAMILY.make_inputs(workload, DEVICE, seed=7)
    # the two kernels sum in different tile orders: equal to float32's noise, or one float16 ulp (2^-10 relative)
    tol = 1e-5 if workload.dtype == "float32" else 1e-3
    for bm, bn in ((16, 16), (64, 32), (32, 64)):
        config = Config(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=2)
        packed = Config({**config, "PACK_GQA": 1})
        if not FAMILY.space.is_valid(packed, workload):
            continue
        failures += [msg for msg in [_check(workload, packed, seed=7)] if msg]
        torch.testing.assert_close(FAMILY.prepare(inputs, packed)(), FAMILY.prepare(inputs, config)(),
                                   atol=tol, rtol=tol)
    assert not failures, "\n".join(failures)


def test_pack_gqa_rules_and_work_table() -> None:
    packed = Config(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, PACK_GQA=1)
    assert "one q head per kv head" in FAMILY.space.why_invalid(packed, PrefillWorkload(8, 8, 64, (10,)))
    gluon = Config({**packed, "IMPL": "gluon_ws"})
    assert "mode of the Triton kernel" in FAMILY.space.why_invalid(gluon, PrefillWorkload(32, 8, 128, (10,)))
    mqa = PrefillWorkload(32, 1, 128, (10,))
    assert "must be a multiple of 32" in FAMILY.space.why_invalid(Config({**packed, "BLOCK_M": 16}), mqa)
    assert FAMILY.space.is_valid(packed, PrefillWorkload(32, 8, 128, (10,)))
    lens = (33, 100, 5)
    items = pa.work_table(lens, 8, 2, 32, section=2, pack_gqa=True)  # group 4: 8 tokens per tile
    expected = [(s, b, h) for s, n in enumerate(lens) for b in range(-(-n // 8)) for h in range(2)]
    assert sorted(items) == sorted(expected)
    pair = [(s * 2 + h) // 2 for s, _, h in items]
    assert pair == sorted(pair)  # sections run one after another
    for sec in set(pair):
        work = [min((b + 1) * 8, lens[s]) for (s, b, _), p in zip(items, pair) if p == sec]
        assert work == sorted(work, reverse=True)


# ---- (b) knob space ---------------------------------------------------------------------------------------------


def test_family_is_registered() -> None:
    assert get_family("prefill_attention") is FAMILY
    assert FAMILY.workload_type is PrefillWorkload and FAMILY.name == "prefill_attention"


def test_gluon_impl_rules() -> None:
    w = PrefillWorkload(32, 8, 128, (2048,))
    gluon = [c for c in FAMILY.space.valid_configs(w) if "IMPL" in c]
    impls = {c["IMPL"] for c in gluon}
    assert impls == {"gluon_overlap", "gluon_ws", "gluon_pingpong", "gluon_ws_persistent", "gluon_pingpong_persistent"}
    assert all(int(c["num_warps"]) == 4 * int(c["BLOCK_M"]) // 64 for c in gluon)
    assert all(int(c["BLOCK_M"]) == 128 for c in gluon if c["IMPL"].startswith("gluon_pingpong"))
    # each persistent schedule is valid exactly where its one-tile schedule is
    for impl in ("gluon_ws", "gluon_pingpong"):
        one_tile = {str(c.replace(IMPL=impl + "_persistent")) for c in gluon if c["IMPL"] == impl}
        assert one_tile == {str(c) for c in gluon if c["IMPL"] == impl + "_persistent"}
    ws = Config(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, IMPL="gluon_ws")
    assert FAMILY.space.is_valid(ws, w)
    assert "num_warps must be 4" in FAMILY.space.why_invalid(ws.replace(num_warps=8), w)
    assert "BLOCK_M must be 128" in FAMILY.space.why_invalid(ws.replace(IMPL="gluon_pingpong"), w)
    assert "num_stages >= 2" in FAMILY.space.why_invalid(ws.replace(num_stages=1), w)
    assert "Triton kernel" in FAMILY.space.why_invalid(ws, PrefillWorkload(32, 8, 128, (2048,), "float32"))
    assert "shared memory" in FAMILY.space.why_invalid(
        Config(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=4, IMPL="gluon_ws"), w)
    # the Triton kernel's configs are written without the knob, as they were stored
    assert "leaving the knob out" in FAMILY.space.why_invalid(ws.replace(IMPL="triton", num_warps=8), w)
    assert all(pa.SPACE.is_valid(c, w) for c in FAMILY.space.valid_configs(w)
               if "IMPL" not in c and "PACK_GQA" not in c)


def test_persistent_variants_fill_the_gpu_once() -> None:
    """A persistent launch runs as many programs as the SMs hold at once: two 64-row programs per SM where their
    shared memory and registers fit, one ping-pong program (9 warps at 168 registers) per SM; unknown IMPLs say
    which exist."""
    from kernel_gym.kernels import prefill_gluon as pg

    small = pg.variant_for("gluon_ws_persistent", 64, 64, 2)
    assert small.persistent and small.ws and small.kernel is pg._attn_persistent
    assert small.resident_programs(132, 128) == 2 * 132
    assert pg.variant_for("gluon_ws_persistent", 64, 128, 2).resident_programs(132, 128) == 132  # 145 KiB each
    pingpong = pg.variant_for("gluon_pingpong_persistent", 128, 128, 2)
    assert pingpong.pingpong and pingpong.resident_programs(132, 128) == 132
    one_tile = pg.variant_for("gluon_pingpong", 128, 128, 2)
    assert not one_tile.persistent and one_tile.kernel is pg._attn_fwd
    assert "WS" in one_tile.constexprs(4, 128) and "WS" not in pingpong.constexprs(4, 128)
    with pytest.raises(ValueError, match="persistent needs ws=1"):
        pg.GluonVariant(ws=0, num_wg=1, block_n=64, stages=2, overlap=1, persistent=1)
    with pytest.raises(ValueError, match="use one of"):
        pg.variant_for("gluon_overlap_persistent", 64, 64, 2)


@pytest.mark.skipif(HOPPER, reason="checks the message given where the Gluon kernel cannot run")
def test_gluon_config_off_hopper_says_to_use_the_triton_kernel() -> None:
    w = PrefillWorkload(4, 2, 64, (70,), "float16")
    inputs = FAMILY.make_inputs(w, DEVICE)
    with pytest.raises(ValueError, match="only on Hopper.*without IMPL"):
        FAMILY.prepare(inputs, Config(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, IMPL="gluon_ws"))


def test_shared_memory_rule_rejects_with_reason() -> None:
    w = PrefillWorkload(32, 8, 128, (2048,), "float32")
    reason = FAMILY.space.why_invalid(Config(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=4), w)
    assert reason and "shared memory" in reason and "232448" in reason


def test_register_rule_rejects_with_reason() -> None:
    w = PrefillWorkload(32, 8, 128, (2048,))
    reason = FAMILY.space.why_invalid(Config(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2), w)
    assert reason and "register" in reason


def test_unknown_knob_value_rejected() -> None:
    w = PrefillWorkload(32, 8, 128, (2048,))
    reason = FAMILY.space.why_invalid(Config(BLOCK_M=256, BLOCK_N=64, num_warps=8, num_stages=3), w)
    assert reason and "BLOCK_M=256" in reason


@pytest.mark.parametrize("model", sorted(BUILTIN_MODELS))
def test_default_config_valid_on_default_grid(model: str) -> None:
    for workload in model_workloads("prefill_attention", BUILTIN_MODELS[model], grid="default"):
        config = FAMILY.default_config(workload)
        assert FAMILY.space.is_valid(config, workload), FAMILY.space.why_invalid(config, workload)


def test_default_config_is_tutorial_choice() -> None:
    d128 = FAMILY.default_config(PrefillWorkload(32, 8, 128, (1024,)))
    d64 = FAMILY.default_config(PrefillWorkload(32, 8, 64, (1024,)))
    assert d128 == Config(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    assert d64 == Config(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_valid_space_size_is_measurable(head_dim: int, dtype: str) -> None:
    valid = FAMILY.space.valid_configs(PrefillWorkload(32, 8, head_dim, (2048,), dtype))
    assert 40 <= len(valid) <= 400, len(valid)


def test_hopper_fast_configs_are_valid() -> None:
    """Tutorial-06 Hopper configs (128-row tiles, 8 warps, 3-4 stages) must be in the space for bf16 D=128."""
    w = PrefillWorkload(32, 8, 128, (2048,) * 4)
    for bn, stages in ((64, 3), (64, 4), (128, 2), (128, 3)):
        config = Config(BLOCK_M=128, BLOCK_N=bn, num_warps=8, num_stages=stages)
        assert FAMILY.space.is_valid(config, w), FAMILY.space.why_invalid(config, w)


def test_flops_and_bytes() -> None:
    w = PrefillWorkload(32, 8, 128, (3, 4))
    pairs = 3 * 4 // 2 + 4 * 5 // 2
    assert FAMILY.flops(w) == 4 * pairs * 128 * 32
    assert FAMILY.bytes_moved(w) == 7 * (32 + 8 + 8 + 32) * 128 * 2
    assert FAMILY.tolerance("bfloat16") > FAMILY.tolerance("float16")
    with pytest.raises(ValueError, match="int8"):
        FAMILY.tolerance("int8")


def test_bench_cases() -> None:
    cases = dict(pa.bench_cases())
    assert cases["prefill_b4_h32_n2048_d128"] == PrefillWorkload(32, 32, 128, (2048,) * 4)
    assert cases["prefill_b1_h32_n8192_d128"] == PrefillWorkload(32, 32, 128, (8192,))
    assert cases["prefill_b4_h32kv8_n2048_d128"].num_kv_heads == 8
    # issue 29's short prefills: many short sequences, GQA 32/8 and 32/4
    for kv in (8, 4):
        assert cases[f"prefill_b16_h32kv{kv}_n512_d128"] == PrefillWorkload(32, kv, 128, (512,) * 16)
        assert cases[f"prefill_b64_h32kv{kv}_n128_d128"] == PrefillWorkload(32, kv, 128, (128,) * 64)
    assert len(cases) == 7
    for w in cases.values():
        assert FAMILY.space.is_valid(FAMILY.default_config(w), w)


_SM90_SHARED = """
import json, sys
from kernel_gym.kernels import prefill_attention as pa, prefill_gluon as pg
from kernel_gym.kernels.space import Config
w = pa.PrefillWorkload(32, 8, 128, (2048,))
out = []
for c in map(Config.parse, json.loads(sys.argv[1])):
    if "IMPL" in c:
        v = pg.variant_for(c["IMPL"], int(c["BLOCK_M"]), int(c["BLOCK_N"]), int(c["num_stages"]))
        out.append(pg.compile_sm90(v, w.head_dim, w.dtype, w.num_heads // w.num_kv_heads).metadata.shared)
    else:
        out.append(pa.compile_sm90(c, w)["shared"])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_shared_memory_estimate_bounds_the_sm90_compiler() -> None:
    """The valid configs with the largest estimate (the Triton kernel's, and each Gluon schedule's) and the default
    compile for sm_90 (no GPU needed, outside the interpreter) within the estimate and the H200's limit."""
    w = PrefillWorkload(32, 8, 128, (2048,))
    valid = sorted(FAMILY.space.valid_configs(w), key=lambda c: pa._shared_memory_bytes(c, w))
    picks = [str([c for c in valid if pa.GLUON_SPACE.value(c, "IMPL") == impl][-1]) for impl in pa.IMPLS]
    picks.append(str(FAMILY.default_config(w)))
    picks.append(str([c for c in valid if "PACK_GQA" in c][-1]))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", _SM90_SHARED, json.dumps(picks)],
        capture_output=True, text=True, env=env, timeout=600, cwd=root,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    shared = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(shared) == len(picks) == len(pa.IMPLS) + 2
    for config, used in zip(picks, shared):
        estimate = pa._shared_memory_bytes(Config.parse(config), w)
        assert used <= estimate <= SHARED_MEMORY_LIMIT, (config, used, estimate)


# ---- (c) GPU: bf16, every valid config on Mixtral shapes ---------------------------------------------------------

MIXTRAL = BUILTIN_MODELS["mixtral-8x7b"]
GPU_WORKLOADS = [
    PrefillWorkload(MIXTRAL.num_heads, MIXTRAL.num_kv_heads, MIXTRAL.head_dim, prefill_seq_lens(2048, "ragged")),
    PrefillWorkload(MIXTRAL.num_heads, MIXTRAL.num_kv_heads, MIXTRAL.head_dim, (1, 1000, 300)),
    PrefillWorkload(MIXTRAL.num_heads, MIXTRAL.num_kv_heads, 64, prefill_seq_lens(1024, "equal4")),
    PrefillWorkload(MIXTRAL.num_heads, MIXTRAL.num_kv_heads, MIXTRAL.head_dim, (5, 40)),  # fewer tokens than a tile
]


@pytest.mark.gpu
@pytest.mark.parametrize("workload", GPU_WORKLOADS, ids=lambda w: f"d{w.head_dim}-{len(w.seq_lens)}seqs")
def test_gpu_all_valid_configs_match_reference_bf16(workload: PrefillWorkload) -> None:
    """Every valid config, the Gluon kernel's included on the H200."""
    configs = RUNNABLE_SPACE.valid_configs(workload)
    failures = [msg for c in configs if (msg := _check(workload, c))]
    assert not failures, f"{len(failures)}/{len(configs)} configs failed:\n" + "\n".join(failures)


@pytest.mark.gpu
def test_gpu_fp16_and_fp32_sample() -> None:
    failures = []
    for dtype in ("float16", "float32"):
        w = PrefillWorkload(32, 8, 128, prefill_seq_lens(1024, "ragged"), dtype)
        failures += [msg for c in RUNNABLE_SPACE.sample(w, 16, seed=7) if (msg := _check(w, c))]
    assert not failures, "\n".join(failures)
