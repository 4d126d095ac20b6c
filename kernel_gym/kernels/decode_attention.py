"""Paged decode attention: one query token per sequence against a paged KV cache (vLLM-style block table).

Inputs (config-independent, from make_inputs): q [B, H, D]; k and v [sum(context_lens), Hkv, D], the sequences'
keys and values concatenated; cu_context [B + 1] prefix sums. prepare(inputs, config) pages them for the config:
- the cache holds `num_pages` pages (the sequences' pages plus spare ones, in a seeded random order, so the block table
  is shuffled and non-contiguous); NHD = [pages, PAGE_SIZE, Hkv, D], HND = [pages, Hkv, PAGE_SIZE, D] (one page of
  one kv head contiguous); slots past a sequence's end are NaN, so a wrong mask shows up as NaN, never as luck;
- block_table [B, max_pages] int32 maps a sequence's logical page to its physical page.

Kernel design (flash-decoding on a paged cache):
- GQA_GROUPED=0: one program per (sequence, q head, split); scores and P@V as broadcast-multiply-reduce (no tl.dot),
  so K/V of a kv head is read once per q head (the repeats mostly hit L2).
- GQA_GROUPED=1: one program per (sequence, kv head, split) holds all q heads of the group as a [GROUP_PAD, D] tile
  (padded to 16 rows for tl.dot), so K/V is read from memory once per kv head.
- NUM_SPLITS > 1 splits each context into NUM_SPLITS BLOCK_N-aligned slices (flash-decoding): each program writes a
  normalised partial output and its base-2 log-sum-exp; a second kernel combines the splits (COMBINE=0), or
  (COMBINE=1, grouped path) the program that finishes last for its (sequence, kv head) combines them, found by an
  atomic counter: one launch instead of two, which at batch 1-4 is a third of the whole time (an empty launch is
  ~2.8 us on the H200, the KV read 4-15 us). Splits that fall past a short sequence's end write lse = -inf and weigh
  nothing.
- Inner loop: full blocks run without masks; only the block containing the sequence end is masked. A block within one
  page (BLOCK_N <= PAGE_SIZE) looks up its page once; a block spanning pages looks up one page per token.
  PRELOAD_PAGES=1 (grouped path, one page per block) reads the page ids of up to PRELOAD_BLOCKS blocks before their
  loop: no K/V address then waits on a load of the loop, and the loads pipeline num_stages - 1 blocks deep (with the
  table read in the loop, Triton's sm_90 code waits on each copy as soon as it is issued). On the H200 it is the best
  config at 12 of 15 small-to-mid-batch workloads, by 0-5% (docs/benchmarks.md, "Decode at batch 1-4").
- KV_TMA=1 (grouped path, one page per block; Hopper and newer, pointers elsewhere) loads each K/V block with one TMA
  copy at its page's row of the cache's 2-D view (PagedKV.view_2d, as prefix_prefill reads the cache), instead of
  per-thread pointer loads; the masked tail zeroes V past the sequence's end (a masked p of 0 times a stale NaN or
  inf there would still be NaN). On the H200 a KV_TMA config is the fastest at all 12 batch 1-16 workloads of
  benchmarks/decode_floor/run5_tma, by 0.6-8%; over the dataset's 365 pairs its row takes 0.997x its pointer twin's
  time (median; p10 0.94, p90 1.06): a small gain where the fastest configs run, no general one.
- Softmax in base 2 with sm_scale * log2(e) applied to the fp32 scores; fp32 accumulation.

Imports only torch, triton and the standard library: this module runs on the GPU machine.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from kernel_gym.kernels import attention
from kernel_gym.kernels.attention import LAYOUTS, PagedKV, block_row, load_rows
from kernel_gym.kernels.space import Config, Knob, KnobSpace
from kernel_gym.kernels.workloads import DecodeWorkload

NUM_SMS = 132  # H200 streaming multiprocessors
MAX_WAVES = 8  # a split count whose grid exceeds this many waves of programs only adds partials to combine
SPLIT_COUNTS = (1, 2, 4, 8, 16, 32, 64)
# The "double" pruning rule (_rule_splits) was measured for counts up to 16 (docs/agent.md). 32 and 64, added for
# batch 1-4 at long contexts (docs/benchmarks.md, "Decode at batch 1-4"), do not prune smaller counts: stored rows of
# 16 splits at batch 1 stay valid, and the grids of 32 and 64 splits are more than one wave there anyway.
DOUBLE_RULE_MAX = 16
PRELOAD_BLOCKS = tl.constexpr(32)  # PRELOAD_PAGES=1: page ids read per group of blocks, before that group's loop
MAX_TILE_PER_THREAD = 64  # elements of one loaded K/V tile per thread above which the per-head path spills
MIN_TILE_PER_THREAD = 32  # with 8 warps, fewer tile elements per thread than this leave lanes idle
MAX_STATE_PER_THREAD = 128  # fp32 accumulator + score elements per thread for the grouped (tl.dot) path
MAX_PAGES_PER_BLOCK = 2  # BLOCK_N may span at most this many pages (one block-table gather per token)
MIN_BLOCK_FRACTION = 2  # BLOCK_N must cover at least PAGE_SIZE / this (smaller blocks only add loop iterations)
_DTYPE_BYTES = attention.DTYPE_BYTES
_LOG2E = attention.LOG2E


# ---- kernels ----------------------------------------------------------------------------------------------------


# Same shape as prefix_prefill's _kv_rows (duplicate scan): both look pages up once per block or per token, but this
# one returns element offsets of one kv head (page and slot strides), that one rows of the cache's 2-D TMA view.
@triton.jit
def _kv_offsets(bt_row, tok0, offs_n, seq_len, stride_page, stride_slot, PAGE_SIZE: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """Element offsets (int64) of tokens tok0 + offs_n of one kv head: physical page * page stride + slot.
    Block-table reads past the sequence's end are masked (page 0), so prefetching one block ahead is always safe."""
    tok = tok0 + offs_n
    if BLOCK_N <= PAGE_SIZE:
        # Blocks are BLOCK_N-aligned and BLOCK_N divides PAGE_SIZE: the whole block lies in one page.
        page = tl.load(bt_row + tok0 // PAGE_SIZE, mask=tok0 < seq_len, other=0).to(tl.int64)
    else:
        page = tl.load(bt_row + tok // PAGE_SIZE, mask=tok < seq_len, other=0).to(tl.int64)
    return page * stride_page + (tok % PAGE_SIZE) * stride_slot


@triton.jit
def _block_offsets(bt_row, tok0, offs_n, seq_len, stride_page, stride_slot, rows_per_page, head_row,
                   PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, KV_TMA: tl.constexpr):
    """Where the grouped path's block at tok0 lies: each token's element offset (_kv_offsets), or with KV_TMA the
    block's first row in the cache's 2-D view (the block lies in one page)."""
    if KV_TMA:
        offs = block_row(bt_row, tok0, seq_len, rows_per_page, PAGE_SIZE) + head_row
    else:
        offs = _kv_offsets(bt_row, tok0, offs_n, seq_len, stride_page, stride_slot, PAGE_SIZE, BLOCK_N)
    return offs


@triton.jit
def _grouped_step(acc, l_i, m_i, q, k_head, v_head, offs, tok0, seq_len, qk_scale, kv_col,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr,
                  KV_TMA: tl.constexpr = 0):
    """One BLOCK_N step of online softmax for all q heads of a group: [GROUP_PAD, D] x [D, BLOCK_N] tl.dot. K/V:
    pointers (k_head, v_head: the kv head's base; offs: each token's element offset), or with KV_TMA descriptors over
    the cache's 2-D view (offs: the block's first row, scalar; kv_col: the kv head's column)."""
    offs_n = tl.arange(0, BLOCK_N)
    in_seq = (tok0 + offs_n) < seq_len  # read only when MASKED
    if KV_TMA:
        k = k_head.load([offs.to(tl.int32), kv_col])
    else:
        kv_offs = offs[:, None] + tl.arange(0, HEAD_DIM)[None, :]
        k = load_rows(k_head + kv_offs, in_seq, MASKED)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        s = tl.where(in_seq[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if KV_TMA:
        v = v_head.load([offs.to(tl.int32), kv_col])
        if MASKED:
            v = tl.where(in_seq[:, None], v, 0.0)  # slots past the end may hold NaN or inf: 0 * NaN is NaN
    else:
        v = load_rows(v_head + kv_offs, in_seq, MASKED)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _per_head_step(acc, l_i, m_i, q, k_head, v_head, offs, tok0, seq_len, qk_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """One BLOCK_N step of online softmax for one q head: broadcast-multiply-reduce, no tl.dot."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_offs = offs[:, None] + offs_d[None, :]
    in_seq = (tok0 + offs_n) < seq_len  # read only when MASKED
    k = load_rows(k_head + kv_offs, in_seq, MASKED)
    s = tl.sum(k.to(tl.float32) * q[None, :], 1) * qk_scale
    if MASKED:
        s = tl.where(in_seq, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new)
    l_i = l_i * alpha + tl.sum(p, 0)
    v = load_rows(v_head + kv_offs, in_seq, MASKED)
    acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
    return acc, l_i, m_new


@triton.jit
def _split_range(ContextLens, pid_b, pid_s, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """[start, end) of this split's tokens: BLOCK_N-aligned slices of ceil(len / NUM_SPLITS); may be empty."""
    seq_len = tl.load(ContextLens + pid_b)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = pid_s * chunk
    end = tl.minimum(start + chunk, seq_len)
    n_full = tl.maximum(end - start, 0) // BLOCK_N
    return seq_len, start, end, n_full


# Opens as _decode_per_head_kernel does (duplicate scan: the same asserts, program ids and split range): two
# kernels, not one with a constexpr path, so each compiles and is named on its own; the bodies differ from there.
@triton.jit
def _decode_grouped_kernel(
    Q, K, V, BlockTable, ContextLens, Out, PartOut, PartLse, Arrived,
    qk_scale,
    stride_qb, stride_qh, stride_page, stride_slot, stride_head, stride_bt,
    stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ab,
    rows_per_page, head_rows, head_cols,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, NUM_STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr,
    COMBINE: tl.constexpr = 0, PRELOAD_PAGES: tl.constexpr = 0, KV_TMA: tl.constexpr = 0,
):
    """One program = all GROUP q heads sharing one kv head, for one sequence and one split. KV_TMA: K and V are TMA
    descriptors over the cache's 2-D view (PagedKV.view_2d; rows_per_page, head_rows, head_cols its geometry)."""
    tl.static_assert(GROUP_PAD >= 16, "tl.dot needs >= 16 rows: pad the group")
    tl.static_assert(GROUP_PAD >= GROUP, "GROUP_PAD must hold the whole group")
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs BLOCK_N >= 16")
    tl.static_assert(HEAD_DIM >= 16, "tl.dot needs HEAD_DIM >= 16")
    tl.static_assert(PAGE_SIZE % BLOCK_N == 0 or BLOCK_N % PAGE_SIZE == 0, "BLOCK_N and PAGE_SIZE must nest")
    pid_b = tl.program_id(0)
    pid_kv = tl.program_id(1)
    pid_s = tl.program_id(2)
    seq_len, start, end, n_full = _split_range(ContextLens, pid_b, pid_s, NUM_SPLITS, BLOCK_N)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = pid_kv * GROUP + offs_g
    row_ok = offs_g < GROUP
    q = tl.load(Q + pid_b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    bt_row = BlockTable + pid_b * stride_bt
    if KV_TMA:  # descriptors; a block's rows start at page * rows_per_page + head_row + slot, column kv_col
        k_head, v_head = K, V
        head_row = pid_kv * head_rows
        kv_col = pid_kv * head_cols
    else:
        k_head = K + pid_kv * stride_head
        v_head = V + pid_kv * stride_head
        head_row = 0
        kv_col = 0

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    if PRELOAD_PAGES:
        # The page ids of PRELOAD_BLOCKS blocks are read before their loop, so no K/V address depends on a load
        # inside it and the pipeliner keeps num_stages - 1 blocks of K/V in flight. With the block-table read in
        # the loop (below), the sm_90 code waits for every copy right after issuing it (async_wait 0): one block at
        # a time, three memory latencies each (table, K, V); seen in the sm_90 code triton 3.9 compiles on the CPU
        # (compile_sm90).
        # Needs BLOCK_N <= PAGE_SIZE: one page per block.
        offs_b = tl.arange(0, PRELOAD_BLOCKS)
        for g in range(0, n_full, PRELOAD_BLOCKS):
            blk = g + offs_b
            pages = tl.load(bt_row + (start + blk * BLOCK_N) // PAGE_SIZE, mask=blk < n_full, other=0).to(tl.int64)
            for j in tl.range(0, tl.minimum(PRELOAD_BLOCKS, n_full - g), num_stages=NUM_STAGES):
                tok0 = start + (g + j) * BLOCK_N
                page = tl.sum(tl.where(offs_b == j, pages, 0))
                if KV_TMA:
                    offs = page * rows_per_page + head_row + tok0 % PAGE_SIZE
                else:
                    offs = page * stride_page + (tok0 % PAGE_SIZE + offs_n).to(tl.int64) * stride_slot
                acc, l_i, m_i = _grouped_step(acc, l_i, m_i, q, k_head, v_head, offs, tok0, seq_len, qk_scale,
                                              kv_col, HEAD_DIM, BLOCK_N, DOT_PRECISION, False, KV_TMA)
        offs = _block_offsets(bt_row, start + n_full * BLOCK_N, offs_n, seq_len, stride_page, stride_slot,
                              rows_per_page, head_row, PAGE_SIZE, BLOCK_N, KV_TMA)
    else:
        # Page offsets are computed one block ahead and carried: the K/V loads then depend on no load of their own
        # iteration (PRELOAD_PAGES=0, the code the stored rows timed).
        offs = _block_offsets(bt_row, start, offs_n, seq_len, stride_page, stride_slot, rows_per_page, head_row,
                              PAGE_SIZE, BLOCK_N, KV_TMA)
        for i in tl.range(0, n_full, num_stages=NUM_STAGES):
            tok0 = start + i * BLOCK_N
            offs_next = _block_offsets(bt_row, tok0 + BLOCK_N, offs_n, seq_len, stride_page, stride_slot,
                                       rows_per_page, head_row, PAGE_SIZE, BLOCK_N, KV_TMA)
            acc, l_i, m_i = _grouped_step(acc, l_i, m_i, q, k_head, v_head, offs, tok0, seq_len, qk_scale,
                                          kv_col, HEAD_DIM, BLOCK_N, DOT_PRECISION, False, KV_TMA)
            offs = offs_next
    tail = start + n_full * BLOCK_N
    if tail < end:
        acc, l_i, m_i = _grouped_step(acc, l_i, m_i, q, k_head, v_head, offs, tail, seq_len, qk_scale,
                                      kv_col, HEAD_DIM, BLOCK_N, DOT_PRECISION, True, KV_TMA)

    if NUM_SPLITS == 1:
        o_ptrs = Out + pid_b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        lse = tl.where(l_i > 0, m_i + tl.math.log2(l_safe), float("-inf"))
        p_ptrs = PartOut + pid_b * stride_pb + heads[:, None] * stride_ph + pid_s * stride_ps + offs_d[None, :]
        tl.store(p_ptrs, acc / l_safe[:, None], mask=row_ok[:, None])
        tl.store(PartLse + pid_b * stride_lb + heads * stride_lh + pid_s, lse, mask=row_ok)
        if COMBINE:
            _combine_in_place(PartOut, PartLse, Out, Arrived + pid_b * stride_ab + pid_kv, pid_b, heads, row_ok,
                              offs_d, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                              GROUP_PAD, HEAD_DIM, NUM_SPLITS)


@triton.jit
def _combine_in_place(PartOut, PartLse, Out, arrived, pid_b, heads, row_ok, offs_d,
                      stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                      GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """The last split program of a (sequence, kv head) to arrive combines the group's partials and resets the
    counter for the next launch. The counter's acq_rel atomic orders this program's partial stores before its
    arrival and the last one's loads after every arrival; the loads bypass L1 (.cg) so they read what other SMs
    wrote."""
    done = tl.atomic_add(arrived, 1, sem="acq_rel")
    if done == NUM_SPLITS - 1:
        m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        for s in tl.static_range(NUM_SPLITS):
            lse_s = tl.load(PartLse + pid_b * stride_lb + heads * stride_lh + s, mask=row_ok, other=float("-inf"),
                            cache_modifier=".cg")
            m = tl.maximum(m, lse_s)
        m = tl.where(m > float("-inf"), m, 0.0)  # padded rows: every lse is -inf
        total = tl.zeros([GROUP_PAD], dtype=tl.float32)
        out = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
        for s in tl.static_range(NUM_SPLITS):
            lse_s = tl.load(PartLse + pid_b * stride_lb + heads * stride_lh + s, mask=row_ok, other=float("-inf"),
                            cache_modifier=".cg")
            part = tl.load(PartOut + pid_b * stride_pb + heads[:, None] * stride_ph + s * stride_ps + offs_d[None, :],
                           mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
            w = tl.math.exp2(lse_s - m)
            total += w
            out += w[:, None] * part
        total = tl.where(total > 0, total, 1.0)
        o_ptrs = Out + pid_b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, (out / total[:, None]).to(Out.dtype.element_ty), mask=row_ok[:, None])
        tl.atomic_xchg(arrived, 0)


@triton.jit
def _decode_per_head_kernel(
    Q, K, V, BlockTable, ContextLens, Out, PartOut, PartLse,
    qk_scale,
    stride_qb, stride_qh, stride_page, stride_slot, stride_head, stride_bt,
    stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """One program = one q head of one sequence, for one split."""
    tl.static_assert(PAGE_SIZE % BLOCK_N == 0 or BLOCK_N % PAGE_SIZE == 0, "BLOCK_N and PAGE_SIZE must nest")
    pid_b = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_s = tl.program_id(2)
    seq_len, start, end, n_full = _split_range(ContextLens, pid_b, pid_s, NUM_SPLITS, BLOCK_N)

    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + pid_b * stride_qb + pid_h * stride_qh + offs_d).to(tl.float32)
    bt_row = BlockTable + pid_b * stride_bt
    kv_head = pid_h // GROUP
    k_head = K + kv_head * stride_head
    v_head = V + kv_head * stride_head

    m_i = tl.full([], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    # tl.range(num_stages=) makes the pipeliner stage these loads although no tl.dot consumes them.
    offs = _kv_offsets(bt_row, start, offs_n, seq_len, stride_page, stride_slot, PAGE_SIZE, BLOCK_N)
    for i in tl.range(0, n_full, num_stages=NUM_STAGES):
        tok0 = start + i * BLOCK_N
        offs_next = _kv_offsets(bt_row, tok0 + BLOCK_N, offs_n, seq_len, stride_page, stride_slot, PAGE_SIZE, BLOCK_N)
        acc, l_i, m_i = _per_head_step(acc, l_i, m_i, q, k_head, v_head, offs, tok0, seq_len, qk_scale,
                                       HEAD_DIM, BLOCK_N, False)
        offs = offs_next
    tail = start + n_full * BLOCK_N
    if tail < end:
        acc, l_i, m_i = _per_head_step(acc, l_i, m_i, q, k_head, v_head, offs, tail, seq_len, qk_scale,
                                       HEAD_DIM, BLOCK_N, True)

    if NUM_SPLITS == 1:
        tl.store(Out + pid_b * stride_ob + pid_h * stride_oh + offs_d, (acc / l_i).to(Out.dtype.element_ty))
    else:
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        lse = tl.where(l_i > 0, m_i + tl.math.log2(l_safe), float("-inf"))
        tl.store(PartOut + pid_b * stride_pb + pid_h * stride_ph + pid_s * stride_ps + offs_d, acc / l_safe)
        tl.store(PartLse + pid_b * stride_lb + pid_h * stride_lh + pid_s, lse)


@triton.jit
def _combine_splits_kernel(
    PartOut, PartLse, Out,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    """One program = one (sequence, q head): out = sum_s 2^(lse_s - max) * out_s / sum_s 2^(lse_s - max)."""
    pid_b = tl.program_id(0)
    pid_h = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM)
    lse = tl.load(PartLse + pid_b * stride_lb + pid_h * stride_lh + offs_s)
    m = tl.max(lse, 0)  # split 0 is never empty (context_len >= 1), so m is finite
    w = tl.math.exp2(lse - m)
    parts = tl.load(PartOut + pid_b * stride_pb + pid_h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :])
    out = tl.sum(w[:, None] * parts, 0) / tl.sum(w, 0)
    tl.store(Out + pid_b * stride_ob + pid_h * stride_oh + offs_d, out.to(Out.dtype.element_ty))


# ---- knob space -------------------------------------------------------------------------------------------------


def group_pad(group: int) -> int:
    """Rows of the grouped q tile: the GQA group rounded up to a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(group))


def _shared_memory_bytes(config: Config, workload: DecodeWorkload) -> int:
    """Conservative per-block shared memory: num_stages buffers of the K and V tiles (Triton may pipeline any loop
    load through shared memory), plus for the grouped path the q tile and the P tile staged for the second dot."""
    b = _DTYPE_BYTES[workload.dtype]
    bn, d, stages = int(config["BLOCK_N"]), workload.head_dim, int(config["num_stages"])
    need = max(stages, 1) * 2 * bn * d * b
    if int(config["GQA_GROUPED"]):
        g = group_pad(workload.num_heads // workload.num_kv_heads)
        need += g * d * b + g * bn * b
    if int(config.get("KV_TMA", 0)):
        need += 1024  # the TMA copies' barriers (the prefill families' allowance)
    return need


def _rule_block_vs_page(config: Config, workload: DecodeWorkload) -> str | None:
    bn, page = int(config["BLOCK_N"]), int(config["PAGE_SIZE"])
    if bn > MAX_PAGES_PER_BLOCK * page:
        return (
            f"BLOCK_N={bn} spans {bn // page} pages of PAGE_SIZE={page}; at most {MAX_PAGES_PER_BLOCK} pages per block "
            f"(a block-table gather per token): use BLOCK_N <= {MAX_PAGES_PER_BLOCK * page}"
        )
    if bn * MIN_BLOCK_FRACTION < page:
        return (
            f"BLOCK_N={bn} is below PAGE_SIZE/{MIN_BLOCK_FRACTION} (PAGE_SIZE={page}): smaller blocks only add "
            f"loop iterations; use BLOCK_N >= {page // MIN_BLOCK_FRACTION}"
        )
    return None


def program_rounds(context_lens: list[int], config: Config, num_heads: int, num_kv_heads: int) -> list[list[int]]:
    """The tokens each program of one launch reads, in the order the GPU starts them: the grid is (sequence, head,
    split) with the sequence fastest, so a round is one (split, head) pair over the batch, and the rounds go head by
    head within a split (_split_range's BLOCK_N-aligned slices, rounded up to whole blocks). A decode step's time is
    how these programs fill the GPU (kernel_gym.traffic.decode_waves)."""
    splits, bn = int(config["NUM_SPLITS"]), int(config["BLOCK_N"])
    heads = num_kv_heads if int(config["GQA_GROUPED"]) else num_heads
    rounds = []
    for z in range(splits):
        row = []
        for n in context_lens:
            per_split = -(-n // splits)
            chunk = -(-per_split // bn) * bn
            part = max(0, min(chunk, n - z * chunk))
            row.append(-(-part // bn) * bn)
        rounds += [row] * heads
    return rounds


def _rule_splits(config: Config, workload: DecodeWorkload) -> str | None:
    """Split counts that cannot pay off are pruned (keeps the space measurable): slices under one block, grids past
    MAX_WAVES waves, and counts whose grid is under one wave while their double is valid. On the H200 data the
    double was as fast or faster at every such shape (docs/agent.md: pruning them lost nothing against the oracle of
    any measured decode workload), and a policy that met the smaller count only where it is valid learned to prefer
    it at shapes where it is 0.76 of the best."""
    splits, bn = int(config["NUM_SPLITS"]), int(config["BLOCK_N"])
    if splits == 1:
        return None
    if splits * bn > workload.context_len:
        return (
            f"NUM_SPLITS={splits} x BLOCK_N={bn} exceeds the mean context {workload.context_len}: most splits would "
            f"get less than one block; use fewer splits or a smaller BLOCK_N"
        )
    heads = workload.num_kv_heads if int(config["GQA_GROUPED"]) else workload.num_heads
    programs = workload.batch * heads * splits
    if programs > MAX_WAVES * NUM_SMS:
        return (
            f"NUM_SPLITS={splits} launches {programs} programs (> {MAX_WAVES} waves of {NUM_SMS} SMs): the grid is "
            f"already full with fewer splits; use fewer splits"
        )
    double = 2 * splits
    if double <= DOUBLE_RULE_MAX and double * bn <= workload.context_len and programs < NUM_SMS:
        return (
            f"NUM_SPLITS={splits} launches {programs} programs, less than one wave of {NUM_SMS} SMs; {double} splits "
            f"read the same bytes with more programs in flight: use NUM_SPLITS={double}"
        )
    return None


def _rule_combine(config: Config, workload: DecodeWorkload) -> str | None:
    """The in-kernel combine exists on the grouped path only, and only splits have something to combine."""
    if int(config.get("COMBINE", 0)) and (int(config["NUM_SPLITS"]) == 1 or not int(config["GQA_GROUPED"])):
        return "COMBINE=1 needs NUM_SPLITS > 1 and GQA_GROUPED=1 (the grouped kernel combines its own splits)"
    return None


def _one_page_grouped_reason(knob: str, why: str, config: Config) -> str | None:
    """Why a knob of the grouped path that needs each block in one page cannot be 1 here (None when it can)."""
    if int(config.get(knob, 0)) and (not int(config["GQA_GROUPED"])
                                     or int(config["BLOCK_N"]) > int(config["PAGE_SIZE"])):
        return f"{knob}=1 needs GQA_GROUPED=1 and BLOCK_N <= PAGE_SIZE ({why})"
    return None


def _rule_preload(config: Config, workload: DecodeWorkload) -> str | None:
    """Page ids are read ahead on the grouped path only, one per block: the block must lie in one page."""
    return _one_page_grouped_reason("PRELOAD_PAGES", "one page id per block, read ahead by the grouped kernel", config)


def _rule_kv_tma(config: Config, workload: DecodeWorkload) -> str | None:
    """A TMA load is one box of consecutive rows of the cache's 2-D view: one page per block, grouped path."""
    return _one_page_grouped_reason("KV_TMA", "a TMA box is one block of consecutive rows within a page", config)


def _rule_shared_memory(config: Config, workload: DecodeWorkload) -> str | None:
    need = _shared_memory_bytes(config, workload)
    return attention.shared_memory_reason(need, config, workload, ("BLOCK_N", "num_stages"))


def _rule_registers(config: Config, workload: DecodeWorkload) -> str | None:
    """Registers per thread (upper bounds) and, for 8 warps, enough of each K/V tile per thread to keep them busy."""
    bn, warps, d = int(config["BLOCK_N"]), int(config["num_warps"]), workload.head_dim
    threads = 32 * warps
    if warps > 4 and bn * d < MIN_TILE_PER_THREAD * threads:
        return (
            f"num_warps={warps} spreads a BLOCK_N*head_dim={bn * d} tile to {bn * d // threads} elements per thread "
            f"(< {MIN_TILE_PER_THREAD}): idle lanes; use 4 warps or BLOCK_N >= {MIN_TILE_PER_THREAD * threads // d}"
        )
    if int(config["GQA_GROUPED"]):
        g = group_pad(workload.num_heads // workload.num_kv_heads)
        per_thread = g * (d + bn) // threads
        if per_thread > MAX_STATE_PER_THREAD:
            return (
                f"register pressure: {per_thread} fp32 accumulator+score elements per thread "
                f"(GROUP_PAD*(head_dim+BLOCK_N)/(32*num_warps)) exceeds {MAX_STATE_PER_THREAD}; use more warps, a "
                f"smaller BLOCK_N or GQA_GROUPED=0"
            )
        return None
    per_thread = bn * d // threads
    if per_thread > MAX_TILE_PER_THREAD:
        return (
            f"register pressure: a K/V tile of BLOCK_N*head_dim={bn * d} elements gives {per_thread} per thread "
            f"(> {MAX_TILE_PER_THREAD}) on the per-head path; use more warps or a smaller BLOCK_N"
        )
    return None


SPACE = KnobSpace(
    knobs=[
        Knob("PAGE_SIZE", (16, 32, 64, 128), "tokens per KV-cache page (a deployment choice: re-layout to change)"),
        Knob("LAYOUT", LAYOUTS, "NHD = [pages, page, kv_heads, D]; HND = [pages, kv_heads, page, D]"),
        Knob("NUM_SPLITS", SPLIT_COUNTS, "flash-decoding KV splits per sequence (1 = single pass)"),
        Knob("BLOCK_N", (16, 32, 64, 128), "tokens per inner-loop step"),
        Knob("num_warps", (4, 8), "warps per program"),
        Knob("num_stages", (2, 4), "software-pipelining depth of the K/V loads"),
        Knob("GQA_GROUPED", (0, 1), "1 = one program per kv head holds all its q heads (K/V read once)"),
        Knob("COMBINE", (0, 1), "1 = the last split program combines the splits (one launch, not two)", legacy=0),
        Knob("PRELOAD_PAGES", (0, 1), "1 = page ids read before the loop, so K/V loads pipeline num_stages deep",
             legacy=0),
        Knob("KV_TMA", (0, 1), "1 = each K/V block is one TMA copy (Hopper+; pointers on GPUs without TMA)", legacy=0),
    ],
    rules=[attention.rule_head_dim, _rule_block_vs_page, _rule_splits, _rule_combine, _rule_preload, _rule_kv_tma,
           _rule_shared_memory, _rule_registers],
)


# ---- inputs, launch, reference ----------------------------------------------------------------------------------


@dataclass(eq=False)
class DecodeInputs:
    """Config-independent decode inputs: q [B, H, D]; k, v [sum(context_lens), Hkv, D] (sequences concatenated);
    cu_context [B + 1] int64 prefix sums and context_lens [B] int32, on the same device; seed for the page shuffle."""

    workload: DecodeWorkload
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_context: torch.Tensor
    context_lens: torch.Tensor
    sm_scale: float
    seed: int


PagedCache = PagedKV  # a paged copy of the KV of DecodeInputs (page_kv_cache), the class prefix_prefill reads too


def _check_workload(workload: object) -> DecodeWorkload:
    return attention.check_workload(workload, DecodeWorkload, "decode_attention")


def page_kv_cache(inputs: DecodeInputs, page_size: int, layout: str) -> PagedCache:
    """Scatter the contiguous K/V into shuffled physical pages (plus ~1/8 spare pages that no sequence uses; slots
    past a sequence's end NaN): attention.page_kv, as the prefix_prefill family pages its contexts."""
    return attention.page_kv(inputs.k, inputs.v, inputs.workload.context_lens(), page_size, layout, inputs.seed)


_last_paged: list = []  # [(inputs, page_size, layout, PagedCache)]: one entry, so memory stays bounded


def _paged_cache_memo(inputs: DecodeInputs, page_size: int, layout: str) -> PagedCache:
    """page_kv_cache, reusing the last result when consecutive configs share inputs, page size and layout (collection
    orders each workload's configs by page size and layout, so paging is done once per layout, not once per config)."""
    return attention.reuse_last(_last_paged, inputs, page_size, layout,
                                lambda: page_kv_cache(inputs, page_size, layout))


def paged_launch(q: torch.Tensor, cache: PagedCache, context_lens: torch.Tensor, config: Config, sm_scale: float,
                 num_kv_heads: int, out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
    """The config's kernels over a paged cache: q [B, H, D] (last dim contiguous), cache pages of config's PAGE_SIZE
    and LAYOUT with its block table, context_lens [B] int32 on the device. Workspaces are allocated here, and the
    closure reads the block table and lengths where they lie at each call, so a serving stack keeps its own cache
    and may rewrite both in place between calls (a CUDA graph replays it). `prepare` times exactly this closure."""
    if (int(config["PAGE_SIZE"]), str(config["LAYOUT"])) != (cache.page_size, cache.layout):
        raise ValueError(f"config pages {config['PAGE_SIZE']} {config['LAYOUT']} but the cache has "
                         f"{cache.page_size} {cache.layout}: choose the config for the cache's layout")
    batch, num_heads, head_dim = q.shape
    splits, bn = int(config["NUM_SPLITS"]), int(config["BLOCK_N"])
    grouped = bool(int(config["GQA_GROUPED"]))
    combine = bool(int(config.get("COMBINE", 0)))
    stride_page, stride_slot, stride_head = cache.strides()
    out = torch.empty_like(q) if out is None else out
    if splits > 1:
        part_out = torch.empty(batch, num_heads, splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(batch, num_heads, splits, dtype=torch.float32, device=q.device)
    else:  # never touched: NUM_SPLITS == 1 writes the output directly
        part_out = torch.empty(1, 1, 1, 1, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(1, 1, 1, dtype=torch.float32, device=q.device)
    group = num_heads // num_kv_heads
    # TMA where the config asks for it and it can run: one page per block, a contiguous cache (its 2-D view)
    tma = (grouped and bool(int(config.get("KV_TMA", 0))) and bn <= cache.page_size
           and cache.k_cache.is_contiguous() and cache.v_cache.is_contiguous() and attention.has_tma(q.device))
    k_src, v_src = cache.k_cache, cache.v_cache
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        k_src = TensorDescriptor.from_tensor(cache.view_2d(cache.k_cache), [bn, head_dim])
        v_src = TensorDescriptor.from_tensor(cache.view_2d(cache.v_cache), [bn, head_dim])
    rows_per_page, head_rows, head_cols = cache.geometry(num_kv_heads, head_dim)
    # COMBINE: split programs arrived per (sequence, kv head); the combining program resets it to 0
    arrived = torch.zeros(batch if combine else 1, num_kv_heads if combine else 1, dtype=torch.int32,
                          device=q.device)
    args = (
        q, k_src, v_src, cache.block_table, context_lens, out, part_out, part_lse,
        sm_scale * _LOG2E,
        q.stride(0), q.stride(1), stride_page, stride_slot, stride_head, cache.block_table.stride(0),
        out.stride(0), out.stride(1), part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
    )
    launch_opts = dict(num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))
    common = dict(HEAD_DIM=head_dim, PAGE_SIZE=cache.page_size, BLOCK_N=bn, NUM_SPLITS=splits,
                  NUM_STAGES=int(config["num_stages"]))
    if grouped:
        kernel = _decode_grouped_kernel
        grid = (batch, num_kv_heads, splits)
        precision = "ieee" if q.dtype == torch.float32 else "tf32"  # tf32 is ignored for 16-bit inputs
        meta = dict(GROUP=group, GROUP_PAD=group_pad(group), DOT_PRECISION=precision, COMBINE=int(combine),
                    PRELOAD_PAGES=int(config.get("PRELOAD_PAGES", 0)), KV_TMA=int(tma), **common)
        args = (*args[:8], arrived, *args[8:], arrived.stride(0), rows_per_page, head_rows, head_cols)
    else:
        kernel = _decode_per_head_kernel
        grid = (batch, num_heads, splits)
        meta = dict(GROUP=group, **common)
    combine_args = (
        part_out, part_lse, out, part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
    )

    def launch() -> torch.Tensor:
        kernel[grid](*args, **meta, **launch_opts)
        if splits > 1 and not combine:
            _combine_splits_kernel[(batch, num_heads)](*combine_args, HEAD_DIM=head_dim, NUM_SPLITS=splits,
                                                       num_warps=4)
        return out

    return launch


class DecodeAttentionFamily:
    """KernelFamily for paged GQA decode attention with optional split-KV (see the module docstring)."""

    name = "decode_attention"
    space = SPACE
    workload_type = DecodeWorkload

    def default_config(self, workload: DecodeWorkload) -> Config:
        """vLLM-like default: 16-token NHD pages, one page per loop step, one program per q head, no split,
        4 warps, 2 stages. Valid for every workload with a supported head_dim."""
        _check_workload(workload)
        config = Config(PAGE_SIZE=16, LAYOUT="NHD", NUM_SPLITS=1, BLOCK_N=16, num_warps=4, num_stages=2,
                        GQA_GROUPED=0)
        self.space.check(config, workload)
        return config

    def make_inputs(self, workload: DecodeWorkload, device: str, seed: int = 0) -> DecodeInputs:
        """q scaled by 2 so softmax is peaked (outputs of order 0.1-1, not ~1/sqrt(context)): errors stay visible."""
        workload = _check_workload(workload)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        lens = workload.context_lens()
        total, d = sum(lens), workload.head_dim

        def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return attention.randn(gen, shape, device, workload.dtype, scale)

        q = randn(workload.batch, workload.num_heads, d, scale=2.0)
        k = randn(total, workload.num_kv_heads, d)
        v = randn(total, workload.num_kv_heads, d)
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int64, device=device)
        context_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        return DecodeInputs(workload, q, k, v, cu, context_lens, 1.0 / math.sqrt(d), seed)

    def prepare(self, inputs: DecodeInputs, config: Config) -> Callable[[], torch.Tensor]:
        w = _check_workload(inputs.workload)
        self.space.check(config, w)
        total = sum(w.context_lens())
        attention.check_shapes((
            ("q", inputs.q, (w.batch, w.num_heads, w.head_dim)),
            ("k", inputs.k, (total, w.num_kv_heads, w.head_dim)),
            ("v", inputs.v, (total, w.num_kv_heads, w.head_dim)),
        ))
        cache = _paged_cache_memo(inputs, int(config["PAGE_SIZE"]), str(config["LAYOUT"]))
        return paged_launch(inputs.q, cache, inputs.context_lens, config, inputs.sm_scale, w.num_kv_heads)

    def reference(self, inputs: DecodeInputs) -> torch.Tensor:
        """fp32 attention of each sequence's query over its whole context, kv heads repeated for GQA: [B, H, D]."""
        w = inputs.workload
        group = w.num_heads // w.num_kv_heads
        out = torch.empty(inputs.q.shape, dtype=torch.float32, device=inputs.q.device)
        cu = inputs.cu_context.tolist()
        for b in range(w.batch):
            k = inputs.k[cu[b]: cu[b + 1]].float().repeat_interleave(group, dim=1)  # [L, H, D]
            v = inputs.v[cu[b]: cu[b + 1]].float().repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,lhd->hl", inputs.q[b].float(), k) * inputs.sm_scale
            out[b] = torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1), v)
        return out

    def tolerance(self, dtype: str) -> tuple[float, float]:
        """fp32: IEEE dots, only summation order differs; fp16/bf16: P rounded to the input type before P@V and the
        output rounded once."""
        table = {"float32": (1e-4, 1e-4), "float16": (4e-3, 4e-3), "bfloat16": (2e-2, 2e-2)}
        return attention.tolerance(table, dtype)

    def flops(self, workload: DecodeWorkload) -> float:
        """4 * sum(context_lens) * D * H: QK^T and PV, 2 flops per multiply-add."""
        return 4.0 * sum(workload.context_lens()) * workload.head_dim * workload.num_heads

    def bytes_moved(self, workload: DecodeWorkload) -> float:
        """The KV read once per kv head plus q read and o written."""
        b = _DTYPE_BYTES[workload.dtype]
        return float(workload.kv_bytes(b) + 2 * workload.batch * workload.num_heads * workload.head_dim * b)


FAMILY = DecodeAttentionFamily()


def compile_sm90(config: Config, workload: DecodeWorkload) -> dict[str, int | list[int]]:
    """Compile the grouped kernel for sm_90 without a GPU (not under TRITON_INTERPRET) and return {"shared": bytes,
    "async_waits": the depth of each async_wait in the TTGIR}: a wait of depth n leaves n copy groups in flight, so
    this shows on a CPU machine whether the pointer loads pipeline (PRELOAD_PAGES=1) or wait as soon as issued.
    KV_TMA=1 copies wait on barriers instead, so its async_waits say nothing about its pipelining."""
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _check_workload(workload)
    if not int(config["GQA_GROUPED"]):
        raise ValueError(f"{config}: compile_sm90 builds the grouped kernel; use GQA_GROUPED=1")
    ty = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[workload.dtype]
    names = _decode_grouped_kernel.arg_names
    tma = int(config.get("KV_TMA", 0))
    signature = {n: f"*{ty}" for n in ("Q", "K", "V", "Out")}
    if tma:
        signature |= {n: f"tensordesc<{ty}[{int(config['BLOCK_N'])}, {workload.head_dim}]>" for n in ("K", "V")}
    signature |= {"PartOut": "*fp32", "PartLse": "*fp32", "BlockTable": "*i32", "ContextLens": "*i32",
                  "Arrived": "*i32", "qk_scale": "fp32"}
    signature |= {n: "i32" for n in names if n.startswith("stride")}
    signature |= {n: "i32" for n in ("rows_per_page", "head_rows", "head_cols")}
    group = workload.num_heads // workload.num_kv_heads
    constexprs = dict(GROUP=group, GROUP_PAD=group_pad(group), HEAD_DIM=workload.head_dim,
                      PAGE_SIZE=int(config["PAGE_SIZE"]), BLOCK_N=int(config["BLOCK_N"]),
                      NUM_SPLITS=int(config["NUM_SPLITS"]), NUM_STAGES=int(config["num_stages"]),
                      DOT_PRECISION="ieee" if workload.dtype == "float32" else "tf32",
                      COMBINE=int(config.get("COMBINE", 0)), PRELOAD_PAGES=int(config.get("PRELOAD_PAGES", 0)),
                      KV_TMA=tma)
    signature |= {n: "constexpr" for n in constexprs}
    # what the launcher's specialisation gives real launches: 16-byte aligned pointers, cache strides divisible by 16
    aligned = ("stride_page", "stride_slot", "stride_head", "stride_qb", "stride_qh", "rows_per_page", "head_rows",
               "head_cols")
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items()
             if t.startswith("*") or n in aligned}
    kernel = triton.compile(
        ASTSource(_decode_grouped_kernel, signature, constexprs, attrs),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"])),
    )
    waits = [int(n) for n in re.findall(r"async_wait[^{\n]*\{num = ([0-9]+)", kernel.asm["ttgir"])]
    return {"shared": int(kernel.metadata.shared), "async_waits": waits}


def bench_cases() -> list[tuple[str, DecodeWorkload]]:
    """Benchmark shapes (Mixtral attention: 32 q heads, 8 kv heads, D=128, bf16); anchor = device copy bandwidth."""
    return [
        ("decode_b64_ctx8192_gqa4_d128", DecodeWorkload(32, 8, 128, 64, 8192)),
        ("decode_b8_ctx32768_gqa4_d128", DecodeWorkload(32, 8, 128, 8, 32768)),
        ("decode_b256_ctx1024_gqa4_d128", DecodeWorkload(32, 8, 128, 256, 1024)),
    ]
