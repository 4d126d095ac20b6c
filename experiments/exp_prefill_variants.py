"""Experiment: Hopper-aimed variants of the varlen causal GQA prefill attention kernel, timed against the current kernel
and torch SDPA in one process.

Same inputs and semantics as kernel_gym.kernels.prefill_attention (packed q [T, H, D], k/v [T, Hkv, D], cu_seqlens,
causal, GQA). One Triton kernel with compile-time switches covers the variants:
- ptr_l2: the current kernel's pointer loads, but programs ordered in L2 sections: the (sequence, kv head) pairs are cut
  into sections of SECTION pairs and each section's tiles run heaviest-first before the next section starts. With the
  global heaviest-first order, the ~132 programs in flight all belong to different heads (4x2048: one q block of all
  128 (seq, head) pairs), so every K/V tile is read from DRAM once per q tile: ~1.1 GB at 4x2048, as much time as the
  whole kernel at SDPA speed. A section keeps its heads' K/V (1-4 MB each) in the 50 MB L2. SECTION=0: no sections.
- tma: K/V/Q loaded through host-side tensor descriptors (TMA) on 2-D views [T, H*D] / [T, Hkv*D]. Rows past a
  sequence's end read the next sequence (finite values; zeros past T): the diagonal loop's causal mask removes those
  keys for every stored query row, and the output store stays a masked pointer store.
- tma_dev: device-side descriptors (tl.make_tensor_descriptor) bounded to each sequence, so TMA zero-fills past its end
  and the descriptor store clips the last tile (flash-attn-3 style varlen). Needs triton.set_allocator.
- persist: tma with a persistent grid (programs_per_sm x #SMs programs walk the work table round-robin).
- ws: tma / persist with tl.range(..., warp_specialize=True) (may be unsupported by triton 3.6 on sm_90: recorded).
- lazy (session 4): tma with lazy rescaling in the unmasked loop (FlashAttention-4: the running max, and with it the
  accumulator's rescale, changes only when a row's max grows by more than 8 in log2 units).
- pipe (session 4): tma with the next block's QK^T issued before this block's softmax (FlashAttention-3's
  intra-warpgroup overlap, written at the source level).

GPU:  python3 experiments/exp_prefill_variants.py --out $OUT/exp_prefill.json --budget-s 180
CPU:  TRITON_INTERPRET=1 python3 experiments/exp_prefill_variants.py --tiny   (correctness only, fp32 and fp16)
Imports only torch, triton, numpy (via triton's interpreter) and the standard library besides the baseline module.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

if "--tiny" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede any @triton.jit definition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernel_gym.kernels import prefill_attention as pa  # noqa: E402
from kernel_gym.kernels.space import Config  # noqa: E402
from kernel_gym.kernels.workloads import PrefillWorkload  # noqa: E402

_LOG2E = 1.4426950408889634
MODE_PTR, MODE_TMA_HOST, MODE_TMA_DEV = 0, 1, 2

# ---- kernel -----------------------------------------------------------------------------------------------------


@triton.jit
def _inner(
    acc, l_i, m_i, q, Kx, Vx, kv_row0, k_col, v_col, stride_kt, stride_vt,
    offs_m, offs_d, lo, hi, seq_len, qk_scale,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, MODE: tl.constexpr, WS: tl.constexpr, LAZY: tl.constexpr,
):
    """Online softmax over key blocks [lo, hi). MODE 0: Kx/Vx are base pointers of this (sequence, kv head);
    MODE 1/2: tensor descriptors, block row kv_row0 + start_n, column k_col / v_col. MASKED applies the causal mask,
    which also removes every key past the sequence end for the query rows that are stored. LAZY (unmasked only):
    keep the running max, and skip rescaling the accumulator, until some row's max grows by more than 8 (log2 units:
    p stays <= 256, exact in fp32 and bf16 range), as FlashAttention-4 does."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        cols = start_n + offs_n
        if MODE == 0:
            k_ptrs = Kx + cols[:, None] * stride_kt + offs_d[None, :]
            if MASKED:
                k = tl.load(k_ptrs, mask=(cols < seq_len)[:, None], other=0.0)
            else:
                k = tl.load(k_ptrs)
        else:
            k = Kx.load([kv_row0 + start_n, k_col])
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            keep = offs_m[:, None] >= cols[None, :]
            qk = qk * qk_scale + tl.where(keep, 0.0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        elif LAZY:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            if tl.max(m_new - m_i, 0) > 8.0:
                alpha = tl.math.exp2(m_i - m_new)
                acc = acc * alpha[:, None]
                l_i = l_i * alpha
                m_i = m_new
            m_ij = m_i
            qk = qk * qk_scale - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        if LAZY and not MASKED:
            l_i = l_i + tl.sum(p, 1)
        else:
            alpha = tl.math.exp2(m_i - m_ij)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
        if MODE == 0:
            v_ptrs = Vx + cols[:, None] * stride_vt + offs_d[None, :]
            if MASKED:
                v = tl.load(v_ptrs, mask=(cols < seq_len)[:, None], other=0.0)
            else:
                v = tl.load(v_ptrs)
        else:
            v = Vx.load([kv_row0 + start_n, v_col])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _inner_pipe(acc, l_i, m_i, q, Kx, Vx, kv_row0, k_col, v_col, lo, hi, qk_scale, BLOCK_N: tl.constexpr):
    """Unmasked key blocks [lo, hi) through descriptors, software-pipelined at the source level: the next block's
    QK^T is issued before this block's softmax, so the tensor cores can run it while the softmax runs
    (FlashAttention-3's intra-warpgroup overlap)."""
    if hi > lo:
        k = Kx.load([kv_row0 + lo, k_col])
        qk = tl.dot(q, tl.trans(k))
        for start_n in range(lo, hi - BLOCK_N, BLOCK_N):
            k = Kx.load([kv_row0 + start_n + BLOCK_N, k_col])
            qk_next = tl.dot(q, tl.trans(k))
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = Vx.load([kv_row0 + start_n, v_col])
            acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_ij
            qk = qk_next
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = Vx.load([kv_row0 + hi - BLOCK_N, v_col])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _tile(
    Qx, Kx, Vx, O, CU_SEQLENS, seq, blk, head, qk_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, WS: tl.constexpr,
    LAZY: tl.constexpr, PIPE: tl.constexpr,
):
    """One BLOCK_M tile of queries of sequence `seq`, q head `head`."""
    kv_head = head // (NUM_HEADS // NUM_KV_HEADS)
    start_m = blk * BLOCK_M
    seq_start = tl.load(CU_SEQLENS + seq)
    seq_len = tl.load(CU_SEQLENS + seq + 1) - seq_start
    s64 = seq_start.to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_in_seq = offs_m < seq_len
    if MODE == 0:
        q_ptrs = Qx + s64 * stride_qt + head * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :]
        q = tl.load(q_ptrs, mask=row_in_seq[:, None], other=0.0)
        k_src = Kx + s64 * stride_kt + kv_head * stride_kh
        v_src = Vx + s64 * stride_vt + kv_head * stride_vh
        kv_row0 = 0
        k_col = 0
        v_col = 0
    elif MODE == 1:
        q = Qx.load([seq_start + start_m, head * HEAD_DIM])
        k_src = Kx
        v_src = Vx
        kv_row0 = seq_start
        k_col = kv_head * HEAD_DIM
        v_col = kv_head * HEAD_DIM
    else:
        q_desc = tl.make_tensor_descriptor(
            Qx + s64 * stride_qt, shape=[seq_len, NUM_HEADS * HEAD_DIM], strides=[stride_qt, 1],
            block_shape=[BLOCK_M, HEAD_DIM],
        )
        k_src = tl.make_tensor_descriptor(
            Kx + s64 * stride_kt, shape=[seq_len, NUM_KV_HEADS * HEAD_DIM], strides=[stride_kt, 1],
            block_shape=[BLOCK_N, HEAD_DIM],
        )
        v_src = tl.make_tensor_descriptor(
            Vx + s64 * stride_vt, shape=[seq_len, NUM_KV_HEADS * HEAD_DIM], strides=[stride_vt, 1],
            block_shape=[BLOCK_N, HEAD_DIM],
        )
        q = q_desc.load([start_m, head * HEAD_DIM])
        kv_row0 = 0
        k_col = kv_head * HEAD_DIM
        v_col = kv_head * HEAD_DIM

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    full_hi = (start_m // BLOCK_N) * BLOCK_N  # key blocks ending at or before the first query row: no mask
    if PIPE:
        acc, l_i, m_i = _inner_pipe(acc, l_i, m_i, q, k_src, v_src, kv_row0, k_col, v_col, 0, full_hi, qk_scale,
                                    BLOCK_N)
    else:
        acc, l_i, m_i = _inner(
            acc, l_i, m_i, q, k_src, v_src, kv_row0, k_col, v_col, stride_kt, stride_vt,
            offs_m, offs_d, 0, full_hi, seq_len, qk_scale, BLOCK_N, False, MODE, WS, LAZY,
        )
    diag_hi = tl.minimum(start_m + BLOCK_M, seq_len)
    acc, l_i, m_i = _inner(
        acc, l_i, m_i, q, k_src, v_src, kv_row0, k_col, v_col, stride_kt, stride_vt,
        offs_m, offs_d, full_hi, diag_hi, seq_len, qk_scale, BLOCK_N, True, MODE, False, False,
    )
    acc = acc / l_i[:, None]
    if MODE == 2:
        o_desc = tl.make_tensor_descriptor(
            O + s64 * stride_ot, shape=[seq_len, NUM_HEADS * HEAD_DIM], strides=[stride_ot, 1],
            block_shape=[BLOCK_M, HEAD_DIM],
        )
        o_desc.store([start_m, head * HEAD_DIM], acc.to(O.dtype.element_ty))  # TMA store clips rows >= seq_len
    else:
        o_ptrs = O + s64 * stride_ot + head * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :]
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_in_seq[:, None])


@triton.jit
def _fwd(
    Qx, Kx, Vx, O, CU_SEQLENS, W_SEQ, W_BLK, W_HEAD, n_work, qk_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, PERSISTENT: tl.constexpr, WS: tl.constexpr,
    LAZY: tl.constexpr, PIPE: tl.constexpr,
):
    """Program p runs work item p (or, persistent, items p, p + P, ...) of the (seq, q block, head) work table."""
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs BLOCK_M >= 16")
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs BLOCK_N >= 16")
    if PERSISTENT:
        for w in tl.range(tl.program_id(0), n_work, tl.num_programs(0), warp_specialize=WS):
            _tile(
                Qx, Kx, Vx, O, CU_SEQLENS, tl.load(W_SEQ + w), tl.load(W_BLK + w), tl.load(W_HEAD + w), qk_scale,
                stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_M, BLOCK_N, MODE, False, LAZY, PIPE,
            )
    else:
        w = tl.program_id(0)
        _tile(
            Qx, Kx, Vx, O, CU_SEQLENS, tl.load(W_SEQ + w), tl.load(W_BLK + w), tl.load(W_HEAD + w), qk_scale,
            stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
            NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_M, BLOCK_N, MODE, WS, LAZY, PIPE,
        )


# ---- host side --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VariantConfig:
    """One launch configuration of one variant."""

    mode: int
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    section: int = 0  # (seq, kv head) pairs per L2 section; 0 = one section (the current kernel's order)
    persistent: bool = False
    programs_per_sm: int = 1
    ws: bool = False
    trick: str = ""  # "lazy": lazy rescaling; "pipe": next QK^T issued before the softmax (descriptor modes only)

    def label(self) -> str:
        s = f"m{self.mode} {self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages} sec{self.section}"
        if self.persistent:
            s += f" persist{self.programs_per_sm}"
        return s + (" ws" if self.ws else "") + (f" {self.trick}" if self.trick else "")


def work_table(seq_lens: tuple[int, ...], num_heads: int, num_kv_heads: int, block_m: int,
               section: int) -> list[tuple[int, int, int]]:
    """The family's work table (kernel_gym.kernels.prefill_attention.work_table); section=0 = one section for the
    whole batch (heaviest first globally, the order before L2 sections)."""
    if section < 0:
        raise ValueError(f"section must be >= 0 (0 = no sections), got {section}")
    return pa.work_table(seq_lens, num_heads, num_kv_heads, block_m, section or len(seq_lens) * num_kv_heads)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 5  # interpreter: a few programs, each walking several work items


_ALLOCATOR_SET = False


def _ensure_allocator(device: torch.device) -> None:
    """Device-side tensor descriptors need global scratch memory from a Triton allocator."""
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
        _ALLOCATOR_SET = True


def prepare_variant(inputs: pa.PrefillInputs, cfg: VariantConfig) -> Callable[[], torch.Tensor]:
    """Launch closure for one variant config (raises on unsupported inputs, like the family's prepare)."""
    w = inputs.workload
    q, k, v = inputs.q, inputs.k, inputs.v
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous [T, heads, D] (got strides {x.stride()}); use make_inputs")
    t, h, hkv, d = w.total_tokens, w.num_heads, w.num_kv_heads, w.head_dim
    table = work_table(w.seq_lens, h, hkv, cfg.block_m, cfg.section)
    cols = torch.tensor(table, dtype=torch.int32).t().contiguous().to(q.device)
    w_seq, w_blk, w_head = cols[0], cols[1], cols[2]
    n_work = len(table)
    o = torch.empty_like(q)
    if cfg.mode == MODE_PTR:
        qx, kx, vx = q, k, v
    elif cfg.mode == MODE_TMA_HOST:
        from triton.tools.tensor_descriptor import TensorDescriptor

        qx = TensorDescriptor.from_tensor(q.view(t, h * d), [cfg.block_m, d])
        kx = TensorDescriptor.from_tensor(k.view(t, hkv * d), [cfg.block_n, d])
        vx = TensorDescriptor.from_tensor(v.view(t, hkv * d), [cfg.block_n, d])
    elif cfg.mode == MODE_TMA_DEV:
        _ensure_allocator(q.device)
        qx, kx, vx = q, k, v
    else:
        raise ValueError(f"mode {cfg.mode} unknown; use 0 (pointers), 1 (host TMA) or 2 (device TMA)")
    if cfg.trick not in ("", "lazy", "pipe"):
        raise ValueError(f"trick {cfg.trick!r} unknown; use '', 'lazy' or 'pipe'")
    if cfg.trick == "pipe" and cfg.mode == MODE_PTR:
        raise ValueError("trick 'pipe' loads through tensor descriptors; use mode 1 or 2")
    grid = (min(n_work, cfg.programs_per_sm * _num_sms(q.device)),) if cfg.persistent else (n_work,)
    args = (
        qx, kx, vx, o, inputs.cu_seqlens, w_seq, w_blk, w_head, n_work, inputs.sm_scale * _LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
    )
    meta = dict(
        NUM_HEADS=h, NUM_KV_HEADS=hkv, HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, MODE=cfg.mode,
        PERSISTENT=cfg.persistent, WS=cfg.ws, LAZY=cfg.trick == "lazy", PIPE=cfg.trick == "pipe",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )

    def launch() -> torch.Tensor:
        _fwd[grid](*args, **meta)
        return o

    return launch


def _cfgs(mode: int, shapes: list[tuple[int, int, int, int]], sections: list[int], **kw: Any) -> list[VariantConfig]:
    return [VariantConfig(mode, bm, bn, wp, st, section=sec, **kw) for sec in sections for bm, bn, wp, st in shapes]


def gpu_variants() -> dict[str, list[VariantConfig]]:
    """Per-variant sweeps (<= 24 each), the most promising first (the budget guard cuts from the end)."""
    a_best, b_best = (128, 32, 4, 3), (128, 64, 8, 3)  # the current kernel's best configs on the two cases
    tma_shapes = [b_best, (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3), a_best, (128, 64, 8, 2),
                  (128, 64, 4, 2), (64, 64, 4, 3)]
    return {
        "lazy": _cfgs(MODE_TMA_HOST, tma_shapes[:6], [8], trick="lazy"),
        "pipe": _cfgs(MODE_TMA_HOST, tma_shapes[:6], [8], trick="pipe"),
        "tma": _cfgs(MODE_TMA_HOST, tma_shapes, [8, 0, 4]),
        "ptr_l2": _cfgs(MODE_PTR, [a_best, b_best, (128, 128, 8, 2)], [0, 2, 4, 8, 16]),
        "ws": _cfgs(MODE_TMA_HOST, [b_best, (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3)], [8, 0], ws=True)
        + _cfgs(MODE_TMA_HOST, [b_best, (128, 128, 8, 2)], [8], persistent=True, ws=True),
        "persist": _cfgs(MODE_TMA_HOST, [b_best, (128, 128, 8, 2), (128, 64, 4, 3), a_best], [8, 0], persistent=True)
        + _cfgs(MODE_TMA_HOST, [a_best, (64, 64, 4, 3)], [8, 0], persistent=True, programs_per_sm=2),
        "tma_dev": _cfgs(MODE_TMA_DEV, [b_best, (128, 128, 8, 2), (128, 64, 4, 3), a_best], [8, 0]),
    }


def tiny_variants() -> dict[str, list[VariantConfig]]:
    """Interpreter configs: BLOCK_N < BLOCK_M (several diagonal steps) and BLOCK_N > BLOCK_M; sections split heads."""
    return {
        "lazy": [VariantConfig(MODE_TMA_HOST, 32, 16, 4, 2, section=2, trick="lazy"),
                 VariantConfig(MODE_TMA_HOST, 16, 32, 4, 2, trick="lazy")],
        "pipe": [VariantConfig(MODE_TMA_HOST, 32, 16, 4, 2, section=2, trick="pipe"),
                 VariantConfig(MODE_TMA_HOST, 16, 16, 4, 2, trick="pipe")],
        "tma": [VariantConfig(MODE_TMA_HOST, 32, 16, 4, 2, section=2), VariantConfig(MODE_TMA_HOST, 16, 32, 4, 2)],
        "ptr_l2": [VariantConfig(MODE_PTR, 32, 16, 4, 2, section=1), VariantConfig(MODE_PTR, 16, 32, 4, 2)],
        "persist": [VariantConfig(MODE_TMA_HOST, 32, 16, 4, 2, section=2, persistent=True),
                    VariantConfig(MODE_TMA_HOST, 16, 32, 4, 2, persistent=True, programs_per_sm=2)],
        "tma_dev": [VariantConfig(MODE_TMA_DEV, 32, 16, 4, 2, section=3), VariantConfig(MODE_TMA_DEV, 16, 32, 4, 2)],
        "ws": [VariantConfig(MODE_TMA_HOST, 32, 16, 4, 2, ws=True),
               VariantConfig(MODE_TMA_HOST, 16, 32, 4, 2, persistent=True, ws=True)],
    }


@dataclass
class Record:
    variant: str
    case: str
    config: dict
    status: str  # ok | wrong | error | out_of_resources | unsupported | skipped_budget | skipped
    ms: float | None = None
    tflops: float | None = None
    ratio_to_sdpa: float | None = None
    max_err: float | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict)


def _classify(exc: BaseException, cfg: VariantConfig | None) -> tuple[str, str]:
    name = type(exc).__name__
    msg = f"{name}: {str(exc).strip()[:400]}"
    if "OutOfResources" in name or "out of resource" in str(exc).lower():
        return "out_of_resources", msg
    if cfg is not None and cfg.ws:
        return "unsupported", "warp_specialize: " + msg
    return "error", msg


def _max_err_ok(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> tuple[bool, float, int]:
    err = (out.float() - ref.float()).abs()
    bad = err > atol + rtol * ref.float().abs()
    return not bool(bad.any()), float(err.max()), int(bad.sum())


# ---- tiny CPU check ---------------------------------------------------------------------------------------------


def tiny_check(variants: list[str] | None = None, dtypes: tuple[str, ...] = ("float32", "float16")) -> list[Record]:
    """Correctness of every variant on a ragged GQA batch (lengths 37 and 100: the short sequence's last tile reads
    into the next sequence through host TMA, the long one's past T). Works under TRITON_INTERPRET=1."""
    device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    if device == "cuda":
        dtypes = tuple(d for d in dtypes if d != "float32") or ("float16",)  # fp32 dots are TF32 on the GPU
    table = tiny_variants()
    records = []
    for dtype in dtypes:
        wl = PrefillWorkload(4, 2, 64, (37, 100), dtype)
        inputs = pa.FAMILY.make_inputs(wl, device, seed=1)
        ref = pa.FAMILY.reference(inputs)
        atol, rtol = pa.FAMILY.tolerance(dtype)
        for name, cfgs in table.items():
            if variants and name not in variants:
                continue
            for cfg in cfgs:
                rec = Record(name, f"tiny_{dtype}", asdict(cfg), "ok")
                try:
                    out = prepare_variant(inputs, cfg)()
                    ok, rec.max_err, n_bad = _max_err_ok(out, ref, atol, rtol)
                    if not ok:
                        rec.status, rec.reason = "wrong", f"{n_bad} elements off, max abs error {rec.max_err:.3g}"
                except Exception as exc:  # noqa: BLE001 - recorded per config, never fatal
                    rec.status, rec.reason = _classify(exc, cfg)
                records.append(rec)
    return records


# ---- GPU sweep --------------------------------------------------------------------------------------------------


def gpu_cases() -> list[tuple[str, PrefillWorkload]]:
    return [
        ("b4_h32_n2048_d128", PrefillWorkload(32, 32, 128, (2048,) * 4)),
        ("b1_h32_n8192_d128", PrefillWorkload(32, 32, 128, (8192,))),
    ]


BASELINE_BEST = {  # the current kernel's best configs (docs/benchmarks.md)
    "b4_h32_n2048_d128": Config(BLOCK_M=128, BLOCK_N=32, num_stages=3, num_warps=4),
    "b1_h32_n8192_d128": Config(BLOCK_M=128, BLOCK_N=64, num_stages=3, num_warps=8),
}


def gpu_sweep(
    out_path: Path | None, budget_s: float, rep_ms: int, only: list[str] | None, *, device: str = "cuda",
    case_list: list[tuple[str, PrefillWorkload]] | None = None, variants: dict[str, list[VariantConfig]] | None = None,
    bench_fn: Callable[[Callable[[], Any]], float] | None = None,
) -> list[Record]:
    """Time SDPA, the current kernel's best configs and every variant config (each checked first) on the cases.
    device/case_list/variants/bench_fn exist for a CPU dry run of this flow; the GPU run uses the defaults."""
    import torch.nn.functional as F

    t0 = time.monotonic()
    cases = []
    for case, wl in case_list or gpu_cases():
        inputs = pa.FAMILY.make_inputs(wl, device, seed=0)
        b, n, h, d = len(wl.seq_lens), wl.seq_lens[0], wl.num_heads, wl.head_dim
        q4, k4, v4 = (x.view(b, n, x.shape[1], d).transpose(1, 2).contiguous() for x in (inputs.q, inputs.k, inputs.v))
        ref = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True).transpose(1, 2).reshape(b * n, h, d)
        cases.append((case, wl, inputs, (q4, k4, v4), ref.contiguous()))
    atol = rtol = 2e-2  # bf16 kernel vs bf16 SDPA: P rounded to bf16 before the PV dot in both
    records: list[Record] = []

    def bench(fn: Callable[[], Any]) -> float:
        if bench_fn is not None:
            return bench_fn(fn)
        return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))

    sdpa_tf: dict[str, float] = {}
    for case, wl, _inputs, (q4, k4, v4), _ref in cases:
        ms = bench(lambda q4=q4, k4=k4, v4=v4: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True))
        tf = pa.FAMILY.flops(wl) / (ms * 1e-3) / 1e12
        sdpa_tf[case] = tf
        records.append(Record("sdpa", case, {}, "ok", ms, tf, 1.0))
        print(f"[{time.monotonic() - t0:6.1f}s] sdpa {case}: {ms:.4f} ms {tf:.1f} TF", flush=True)

    def finish(rec: Record, wl: PrefillWorkload, ms: float) -> None:
        rec.ms = ms
        rec.tflops = pa.FAMILY.flops(wl) / (ms * 1e-3) / 1e12
        rec.ratio_to_sdpa = rec.tflops / sdpa_tf[rec.case]

    for case, wl, inputs, _sdpa_in, ref in cases:
        for cname, config in BASELINE_BEST.items():
            rec = Record("baseline", case, dict(config.items()) | {"tuned_for": cname}, "ok")
            try:
                fn = pa.FAMILY.prepare(inputs, config)
                ok, rec.max_err, n_bad = _max_err_ok(fn(), ref, atol, rtol)
                if ok:
                    finish(rec, wl, bench(fn))
                else:
                    rec.status, rec.reason = "wrong", f"{n_bad} elements off, max abs error {rec.max_err:.3g}"
            except Exception as exc:  # noqa: BLE001
                rec.status, rec.reason = _classify(exc, None)
            records.append(rec)
            print(f"[{time.monotonic() - t0:6.1f}s] baseline {case} {dict(config.items())}: {rec.status} "
                  f"{rec.ratio_to_sdpa or 0:.3f}", flush=True)

    for name, cfgs in (variants or gpu_variants()).items():
        if only and name not in only:
            continue
        leading_failures = 0  # configs failing from the start; after 2 the variant's remaining configs are skipped
        first_error = ""
        for cfg in cfgs:
            mine = []
            for case, wl, inputs, _sdpa_in, ref in cases:
                rec = Record(name, case, asdict(cfg), "ok")
                if time.monotonic() - t0 > budget_s:
                    rec.status, rec.reason = "skipped_budget", f"budget of {budget_s:.0f} s spent"
                elif leading_failures >= 2:
                    rec.status, rec.reason = "skipped", f"the variant's first configs failed: {first_error}"
                else:
                    try:
                        fn = prepare_variant(inputs, cfg)
                        ok, rec.max_err, n_bad = _max_err_ok(fn(), ref, atol, rtol)
                        if ok:
                            finish(rec, wl, bench(fn))
                        else:
                            rec.status, rec.reason = "wrong", f"{n_bad} elements off, max abs error {rec.max_err:.3g}"
                    except Exception as exc:  # noqa: BLE001
                        rec.status, rec.reason = _classify(exc, cfg)
                        if os.environ.get("EXP_TRACEBACK"):
                            traceback.print_exc()
                mine.append(rec)
                print(f"[{time.monotonic() - t0:6.1f}s] {name} {case} {cfg.label()}: {rec.status} "
                      f"{'' if rec.ms is None else f'{rec.ms:.4f} ms {rec.tflops:.1f} TF {rec.ratio_to_sdpa:.3f}'}"
                      f"{' ' + rec.reason[:160] if rec.reason else ''}", flush=True)
            records.extend(mine)
            statuses = {r.status for r in mine}
            if leading_failures >= 0 and statuses & {"error", "unsupported", "wrong"} and "ok" not in statuses:
                leading_failures += 1
                first_error = first_error or next(r.reason for r in mine if r.reason)[:200]
            elif "ok" in statuses:
                leading_failures = -1  # a config worked: keep going whatever follows
        if out_path:
            _write(out_path, records, budget_s, t0)
    return records


def _write(path: Path, records: list[Record], budget_s: float, t0: float) -> None:
    meta = dict(
        torch=torch.__version__, triton=triton.__version__, budget_s=budget_s, elapsed_s=time.monotonic() - t0,
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "records": [asdict(r) for r in records]}, indent=1))


def summary(records: list[Record]) -> str:
    """Best timed config per (variant, case), plus counts of each status."""
    lines = [f"{'variant':10} {'case':20} {'ms':>8} {'TF':>7} {'ratio':>6}  best config / statuses"]
    keys = sorted({(r.variant, r.case) for r in records}, key=lambda k: (k[1], k[0]))
    for variant, case in keys:
        rs = [r for r in records if r.variant == variant and r.case == case]
        timed = [r for r in rs if r.ms is not None]
        counts = {}
        for r in rs:
            counts[r.status] = counts.get(r.status, 0) + 1
        if timed:
            best = min(timed, key=lambda r: r.ms)
            cfg = VariantConfig(**best.config).label() if "mode" in best.config else str(best.config)
            lines.append(f"{variant:10} {case:20} {best.ms:8.4f} {best.tflops:7.1f} {best.ratio_to_sdpa or 0:6.3f}  "
                         f"{cfg} {counts}")
        else:
            lines.append(f"{variant:10} {case:20} {'-':>8} {'-':>7} {'-':>6}  {counts}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="JSON file for all records")
    ap.add_argument("--budget-s", type=float, default=180.0, help="skip remaining configs after this many seconds")
    ap.add_argument("--rep-ms", type=int, default=100, help="do_bench rep (ms) per timing")
    ap.add_argument("--variants", help="comma-separated subset of: " + ",".join(gpu_variants()))
    ap.add_argument("--tiny", action="store_true", help="CPU/interpreter correctness check only (no timing)")
    args = ap.parse_args(argv)
    only = [v.strip() for v in args.variants.split(",")] if args.variants else None
    if only:
        unknown = sorted(set(only) - set(gpu_variants()))
        if unknown:
            ap.error(f"unknown variants {unknown}; choose from {sorted(gpu_variants())}")
    if args.rep_ms < 100 and not args.tiny:
        ap.error(f"--rep-ms {args.rep_ms} is below 100 ms; use >= 100 for stable medians")
    if args.tiny:
        t0 = time.monotonic()
        records = tiny_check(only)
        for r in records:
            print(f"{r.variant:8} {r.case:14} {VariantConfig(**r.config).label():40} {r.status:12} "
                  f"err={r.max_err if r.max_err is None else f'{r.max_err:.2e}'} {r.reason[:200]}")
        if args.out:
            _write(args.out, records, 0.0, t0)
        bad = [r for r in records if r.status not in ("ok", "unsupported")]
        print(f"tiny check: {len(records) - len(bad)}/{len(records)} ok or unsupported, {time.monotonic() - t0:.1f} s")
        return 1 if bad else 0
    if not torch.cuda.is_available():
        ap.error("the timing sweep needs a CUDA GPU; on CPU run with --tiny")
    records = gpu_sweep(args.out, args.budget_s, args.rep_ms, only)
    if args.out:
        print(f"wrote {args.out}")
    print(summary(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
