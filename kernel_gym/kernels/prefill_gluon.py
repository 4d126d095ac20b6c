"""Gluon flash-attention forward for Hopper: the prefill family's IMPL=gluon_* configs.

Same semantics and inputs as kernel_gym.kernels.prefill_attention (causal GQA over varlen sequences packed with
cu_seqlens, bf16/fp16, D 64 or 128, the same L2-aware work table). Why a second kernel: Triton 3.6 cannot express the
Hopper scheduling that attention at SDPA's speed needs; Gluon (triton.experimental.gluon) can. The Triton kernel stays
at 0.86-0.87 of torch SDPA on the H200 (docs/benchmarks.md); this one adds:

- TMA: host-side descriptors on the 2-D views [T, H * D] and [T, Hkv * D]; K/V blocks land in a STAGES-deep shared
  memory ring guarded by mbarriers (k_ready / v_ready per slot: expect-tx + TMA arrival; kv_empty per slot: consumer
  release). A q tile that reaches past its sequence's end reads the next sequence's rows (zeros past T): the causal
  mask removes those keys for every stored row, and the output store is a row-masked pointer store.
- wgmma: S = Q K^T with Q and K^T (a permuted view of the K slot) from shared memory, O += P V with P in registers;
  accumulators in registers (NVMMA v3 layout); exp2 softmax with sm_scale * log2(e) folded into one multiply; key
  blocks ending before the tile's first row run unmasked, the blocks crossing the diagonal masked.
- OVERLAP=1 (FlashAttention-3's intra-warpgroup overlap): iteration j issues QK^T of block j and PV of block j-1 as
  two async wgmma groups and runs block j's softmax while PV(j-1) is on the tensor cores.
- WS=1: gl.warp_specialize with a 1-warp load partition (24 registers) and the consumer warpgroup(s). SPLIT=1: two
  consumer warpgroups as separate partitions, each owning 64 rows of a 128-row tile; PINGPONG=1 adds FA3's ping-pong:
  a pair of "turn" mbarriers makes them take turns issuing wgmmas, so one's softmax runs under the other's GEMMs.
- Persistent (_attn_persistent, IMPL=gluon_*_persistent): the WS schedules in as many programs as the SMs hold,
  each looping over work items; the load partition keeps one K/V ring across tiles and loads the next tile's q once
  the consumers release the current one, so short sequences (tiles of 1-4 key blocks, where a one-tile program
  waits on its first loads and stores its output with the tensor cores idle) overlap those phases across tiles.

Runs only on sm_90 GPUs (Gluon has no interpreter); `compile_sm90` builds it for sm_90 on a CPU machine (the tests
check its shared memory against the knob space's estimate that way).
Imports only torch, triton and the standard library: this module runs on the GPU machine.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.language.nvidia.hopper import tma as _tma


def _tma_compat() -> Any:
    """The kernel is written against triton 3.6 (the GPU machine's), whose TMA load is async_copy_global_to_shared;
    triton 3.9 renamed it async_load (same arguments) and made the old name raise. Newer versions get a copy of the
    tma module with the old name pointing at the new builtin, so the same kernel source compiles on both."""
    if not hasattr(_tma, "async_load"):
        return _tma
    shim = types.ModuleType(f"{_tma.__name__}_compat")
    shim.__dict__.update({k: getattr(_tma, k) for k in dir(_tma) if not k.startswith("__")})
    shim.async_copy_global_to_shared = _tma.async_load
    return shim


tma = _tma_compat()

_LOG2E = 1.4426950408889634
SM_SHARED_BYTES = 233472  # shared memory per SM on sm_90 (228 KiB)
SM_REGISTERS = 65536  # 32-bit registers per SM
_GL_DTYPES = {"bfloat16": gl.bfloat16, "float16": gl.float16}
_SIG_DTYPES = {"bfloat16": "bf16", "float16": "fp16"}


# ---- device code ------------------------------------------------------------------------------------------------


@gluon.jit
def _softmax(s, m_i, l_i, rows, cols, qk_scale, MASKED: gl.constexpr):
    """Online-softmax step on raw scores s [ROWS, BLOCK_N] (fp32, wgmma layout): returns p = exp2(s*scale - m_new),
    alpha = exp2(m_old - m_new), m_new, l_new. MASKED applies the causal mask (key col > query row -> -inf); every
    row sees key 0 in block 0, so m stays finite and the masked entries give p = 0."""
    if MASKED:
        keep = gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)
        s = gl.where(keep, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        s = s - gl.expand_dims(m_new, 1)
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        s = s * qk_scale - gl.expand_dims(m_new, 1)
    p = gl.exp2(s)
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _issue_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, kv_row0, kv_col, j, n_blocks,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """TMA loads of key block j (if j < n_blocks) into ring slot j % STAGES; each lands on its own ready barrier."""
    slot = j % STAGES
    pred = j < n_blocks
    kb = k_ready.index(slot)
    vb = v_ready.index(slot)
    mbarrier.expect(kb, k_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [kv_row0 + j * BLOCK_N, kv_col], kb, k_bufs.index(slot), pred=pred)
    mbarrier.expect(vb, v_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(v_desc, [kv_row0 + j * BLOCK_N, kv_col], vb, v_bufs.index(slot), pred=pred)


@gluon.jit
def _release(j, k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, kv_empty, kv_row0, kv_col, n_blocks,
             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr):
    """Block j's K and V have been read by completed wgmmas: hand the slot back (WS: arrive on kv_empty for the load
    partition; no WS: refill it with block j + STAGES right here)."""
    if WS:
        mbarrier.arrive(kv_empty.index(j % STAGES), count=1)
    else:
        _issue_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, kv_row0, kv_col, j + STAGES, n_blocks,
                  BLOCK_N, STAGES)


@gluon.jit
def _turn_wait(turn_bars, t, PART: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: warpgroup PART waits for its t-th turn to issue wgmmas (turns alternate 0, 1, 0, 1, ...). A fresh
    mbarrier counts its 'previous' phase (parity 1) as complete, so warpgroup 0's first wait passes at once."""
    if PINGPONG:
        mbarrier.wait(turn_bars.index(PART), (t & 1) ^ (1 - PART))


@gluon.jit
def _turn_pass(turn_bars, PART: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn_bars.index(1 - PART), count=1)


@gluon.jit
def _consumer(q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, turn_bars,
              k_desc, v_desc, O, out_row0, out_col, stride_ot, kv_row0, kv_col,
              row0, seq_len, n_full, n_blocks, qk_scale, it0, q_phase, t, q_empty,
              PART: gl.constexpr, NW: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
              HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr, PINGPONG: gl.constexpr,
              OVERLAP: gl.constexpr, RELEASE_Q: gl.constexpr):
    """Attention of ROWS query rows (sequence rows row0 .. row0 + ROWS - 1) over key blocks [0, n_blocks), run by NW
    warps (NW // 4 warpgroups, ROWS // (NW // 4) rows each). Blocks [0, n_full) are unmasked, the rest masked.

    A persistent program's tiles share one K/V ring, so a tile's block j sits at ring position it0 + j (its slot and
    mbarrier phase); the q tile is on its q_phase-th fill and, with RELEASE_Q, handed back through q_empty once the
    tile's last wgmma is done (the load partition then fetches the next tile's q under this tile's epilogue). The
    step helpers index by ring position: the block indices they see are shifted by it0, and the query rows and the
    K/V origin by it0 * BLOCK_N with them, so their causal masks and addresses stay those of the tile. t counts the
    ping-pong turns taken so far and is returned. it0 = 0, q_phase = 0, t = 0: one tile per program."""
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_l: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_l: gl.constexpr = gl.SliceLayout(0, s_layout)
    orow_l: gl.constexpr = gl.SliceLayout(1, o_layout)

    shift = it0 * BLOCK_N
    rows = row0 + shift + gl.arange(0, ROWS, layout=row_l)  # shifted with the block indices (see above)
    offs_n = gl.arange(0, BLOCK_N, layout=col_l)
    kv_row_s = kv_row0 - shift
    full_s = it0 + n_full
    end_s = it0 + n_blocks
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=row_l)
    l_i = gl.zeros([ROWS], gl.float32, layout=row_l)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)

    mbarrier.wait(q_bar, q_phase)

    # Block 0 (peeled: nothing to overlap with yet).
    first = it0 % STAGES
    first_phase = (it0 // STAGES) & 1
    mbarrier.wait(k_ready.index(first), first_phase)
    _turn_wait(turn_bars, t, PART, PINGPONG)
    s = warpgroup_mma(q_smem, k_bufs.index(first).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    _turn_pass(turn_bars, PART, PINGPONG)
    t += 1
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    if n_full > 0:
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, rows, shift + offs_n, qk_scale, False)
    else:
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, rows, shift + offs_n, qk_scale, True)

    if OVERLAP:
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(it0 + 1, full_s):
            p_op, acc, m_i, l_i, t = _overlap_step(
                j, p_op, acc, m_i, l_i, t, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn_bars,
                k_desc, v_desc, kv_row_s, kv_col, end_s, rows, offs_n, s_zero, qk_scale,
                False, PART, BLOCK_N, STAGES, WS, PINGPONG, p_layout, orow_l)
        for j in range(gl.maximum(full_s, it0 + 1), end_s):
            p_op, acc, m_i, l_i, t = _overlap_step(
                j, p_op, acc, m_i, l_i, t, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn_bars,
                k_desc, v_desc, kv_row_s, kv_col, end_s, rows, offs_n, s_zero, qk_scale,
                True, PART, BLOCK_N, STAGES, WS, PINGPONG, p_layout, orow_l)
        # PV of the last block.
        last = end_s - 1
        mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
        _turn_wait(turn_bars, t, PART, PINGPONG)
        acc = warpgroup_mma(p_op, v_bufs.index(last % STAGES), acc, is_async=True)
        _turn_pass(turn_bars, PART, PINGPONG)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        if WS:
            mbarrier.arrive(kv_empty.index(last % STAGES), count=1)
    else:
        # Block 0's PV, then plain blocks.
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(v_ready.index(first), first_phase)
        acc = warpgroup_mma(p_op, v_bufs.index(first), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        _release(it0, k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, kv_empty, kv_row_s, kv_col, end_s,
                 BLOCK_N, STAGES, WS)
        for j in range(it0 + 1, full_s):
            acc, m_i, l_i, t = _plain_step(
                j, acc, m_i, l_i, t, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn_bars,
                k_desc, v_desc, kv_row_s, kv_col, end_s, rows, offs_n, s_zero, qk_scale,
                False, PART, BLOCK_N, STAGES, WS, PINGPONG, p_layout, orow_l)
        for j in range(gl.maximum(full_s, it0 + 1), end_s):
            acc, m_i, l_i, t = _plain_step(
                j, acc, m_i, l_i, t, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn_bars,
                k_desc, v_desc, kv_row_s, kv_col, end_s, rows, offs_n, s_zero, qk_scale,
                True, PART, BLOCK_N, STAGES, WS, PINGPONG, p_layout, orow_l)
    if RELEASE_Q:
        mbarrier.arrive(q_empty, count=1)

    # Epilogue: normalise and store the rows inside the sequence.
    l_o = gl.convert_layout(l_i, orow_l)
    out = (acc / gl.expand_dims(l_o, 1)).to(dtype)
    orows = row0 + gl.arange(0, ROWS, layout=orow_l)
    ocols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    offs = (gl.expand_dims((out_row0 + orows).to(gl.int64) * stride_ot, 1)
            + gl.expand_dims(out_col + ocols, 0))
    mask = gl.expand_dims(orows < seq_len, 1) & gl.expand_dims(ocols < HEAD_DIM, 0)
    gl.store(O + offs, out, mask=mask)
    return t


@gluon.jit
def _overlap_step(j, p_op, acc, m_i, l_i, t, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn_bars,
                  k_desc, v_desc, kv_row0, kv_col, n_blocks, rows, offs_n, s_zero, qk_scale,
                  MASKED: gl.constexpr, PART: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  WS: gl.constexpr, PINGPONG: gl.constexpr, p_layout: gl.constexpr, orow_l: gl.constexpr):
    """FA3 intra-warpgroup overlap: issue S_j = Q K_j^T and O += P_{j-1} V_{j-1}; softmax of S_j runs while PV is
    in flight; then wait for PV, release block j-1's slot and rescale O by block j's alpha."""
    slot = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
    mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
    _turn_wait(turn_bars, t, PART, PINGPONG)
    s = warpgroup_mma(q_smem, k_bufs.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    acc = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
    _turn_pass(turn_bars, PART, PINGPONG)
    t += 1
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    cols = j * BLOCK_N + offs_n
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, rows, cols, qk_scale, MASKED)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
    _release(j - 1, k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, kv_empty, kv_row0, kv_col, n_blocks,
             BLOCK_N, STAGES, WS)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, orow_l), 1)
    p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    return p_op, acc, m_i, l_i, t


@gluon.jit
def _plain_step(j, acc, m_i, l_i, t, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turn_bars,
                k_desc, v_desc, kv_row0, kv_col, n_blocks, rows, offs_n, s_zero, qk_scale,
                MASKED: gl.constexpr, PART: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                WS: gl.constexpr, PINGPONG: gl.constexpr, p_layout: gl.constexpr, orow_l: gl.constexpr):
    """One key block without intra-warpgroup overlap: S = QK^T, softmax, rescale, O += PV."""
    slot = j % STAGES
    phase = (j // STAGES) & 1
    mbarrier.wait(k_ready.index(slot), phase)
    _turn_wait(turn_bars, t, PART, PINGPONG)
    s = warpgroup_mma(q_smem, k_bufs.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    _turn_pass(turn_bars, PART, PINGPONG)
    t += 1
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    cols = j * BLOCK_N + offs_n
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, rows, cols, qk_scale, MASKED)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, orow_l), 1)
    p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    mbarrier.wait(v_ready.index(slot), phase)
    acc = warpgroup_mma(p_op, v_bufs.index(slot), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
    _release(j, k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, kv_empty, kv_row0, kv_col, n_blocks,
             BLOCK_N, STAGES, WS)
    return acc, m_i, l_i, t


@gluon.jit
def _work_item(W_SEQ, W_BLOCK, W_HEAD, CU_SEQLENS, w, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Work item w of the table: (first row of its sequence, sequence length, the tile's first query row, q and kv
    column of its heads in the 2-D views, unmasked key blocks, key blocks)."""
    seq = gl.load(W_SEQ + w)
    start_m = gl.load(W_BLOCK + w) * BLOCK_M
    head = gl.load(W_HEAD + w)
    seq_start = gl.load(CU_SEQLENS + seq)
    seq_len = gl.load(CU_SEQLENS + seq + 1) - seq_start
    n_full = start_m // BLOCK_N  # key blocks ending at or before the tile's first query row: no mask
    n_blocks = gl.cdiv(gl.minimum(start_m + BLOCK_M, seq_len), BLOCK_N)
    return seq_start, seq_len, start_m, head * HEAD_DIM, (head // GROUP) * HEAD_DIM, n_full, n_blocks


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
                    q_row, q_col, kv_row0, kv_col, n_blocks,
                    NUM_Q: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """1-warp producer: the q tile(s), then K/V blocks into the ring, each slot once the consumers released it."""
    mbarrier.expect(q_bar, NUM_Q * q_desc.block_type.nbytes)
    for g in gl.static_range(NUM_Q):
        tma.async_copy_global_to_shared(q_desc, [q_row + g * ROWS, q_col], q_bar, q_bufs.index(g))
    for j in range(n_blocks):
        slot = j % STAGES
        mbarrier.wait(kv_empty.index(slot), ((j // STAGES) & 1) ^ 1)
        _issue_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, kv_row0, kv_col, j, n_blocks, BLOCK_N, STAGES)


@gluon.jit
def _load_persistent(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, kv_empty,
                     CU_SEQLENS, W_SEQ, W_BLOCK, W_HEAD, num_items,
                     GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, NUM_Q: gl.constexpr,
                     ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Persistent producer: the program's work items pid, pid + programs, ...; per tile its q once the consumers
    handed the previous one back, then its K/V blocks into the shared ring (ring position it0 + j, see _consumer),
    so the next tile's loads run under this tile's last blocks and epilogue."""
    it0 = 0
    tile = 0
    for w in range(gl.program_id(0), num_items, gl.num_programs(0)):
        seq_start, seq_len, start_m, q_col, kv_col, n_full, n_blocks = _work_item(
            W_SEQ, W_BLOCK, W_HEAD, CU_SEQLENS, w, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N)
        mbarrier.wait(q_empty, (tile & 1) ^ 1)
        mbarrier.expect(q_bar, NUM_Q * q_desc.block_type.nbytes)
        for g in gl.static_range(NUM_Q):
            tma.async_copy_global_to_shared(q_desc, [seq_start + start_m + g * ROWS, q_col], q_bar, q_bufs.index(g))
        kv_row_s = seq_start - it0 * BLOCK_N
        for j in range(it0, it0 + n_blocks):
            slot = j % STAGES
            mbarrier.wait(kv_empty.index(slot), ((j // STAGES) & 1) ^ 1)
            _issue_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, kv_row_s, kv_col, j, it0 + n_blocks,
                      BLOCK_N, STAGES)
        it0 += n_blocks
        tile += 1


@gluon.jit
def _consumer_persistent(q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, kv_empty, turn_bars,
                         k_desc, v_desc, O, stride_ot, CU_SEQLENS, W_SEQ, W_BLOCK, W_HEAD, num_items, qk_scale,
                         ROW_OFF: gl.constexpr, GROUP: gl.constexpr, BLOCK_M: gl.constexpr,
                         PART: gl.constexpr, NW: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                         HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                         OVERLAP: gl.constexpr):
    """Persistent consumer: the same work items as _load_persistent, each tile's ROWS rows from ROW_OFF on (the
    ping-pong warpgroups own one half each), ring positions and ping-pong turns carried from tile to tile."""
    it0 = 0
    tile = 0
    t = 0
    for w in range(gl.program_id(0), num_items, gl.num_programs(0)):
        seq_start, seq_len, start_m, q_col, kv_col, n_full, n_blocks = _work_item(
            W_SEQ, W_BLOCK, W_HEAD, CU_SEQLENS, w, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N)
        t = _consumer(q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, turn_bars,
                      k_desc, v_desc, O, seq_start, q_col, stride_ot, seq_start, kv_col,
                      start_m + ROW_OFF, seq_len, n_full, n_blocks, qk_scale, it0, tile & 1, t, q_empty,
                      PART, NW, ROWS, BLOCK_N, HEAD_DIM, STAGES, True, PINGPONG, OVERLAP, True)
        it0 += n_blocks
        tile += 1


@gluon.jit
def _consumer_partition(q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, turn_bars,
                        k_desc, v_desc, O, out_row0, out_col, stride_ot, kv_row0, kv_col,
                        row0, seq_len, n_full, n_blocks, qk_scale, it0, q_phase, t, q_empty,
                        PART: gl.constexpr, NW: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                        HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr, PINGPONG: gl.constexpr,
                        OVERLAP: gl.constexpr, RELEASE_Q: gl.constexpr):
    """_consumer as a warp_specialize partition of the one-tile kernel: triton 3.6 rejects a partition that returns
    a value (its turn count), so this one drops it."""
    _consumer(q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, turn_bars,
              k_desc, v_desc, O, out_row0, out_col, stride_ot, kv_row0, kv_col,
              row0, seq_len, n_full, n_blocks, qk_scale, it0, q_phase, t, q_empty,
              PART, NW, ROWS, BLOCK_N, HEAD_DIM, STAGES, WS, PINGPONG, OVERLAP, RELEASE_Q)


@gluon.jit
def _attn_fwd(
    q_desc, k_desc, v_desc, O, CU_SEQLENS, W_SEQ, W_BLOCK, W_HEAD, qk_scale, stride_ot,
    GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    NUM_WG: gl.constexpr, ROWS_PER_WG: gl.constexpr, WS: gl.constexpr, SPLIT: gl.constexpr,
    PINGPONG: gl.constexpr, OVERLAP: gl.constexpr,
):
    """One program = one work item: a BLOCK_M = NUM_WG * ROWS_PER_WG tile of queries of one sequence, one q head.
    q_desc's block is [ROWS_PER_WG, D] when SPLIT (one q buffer per consumer partition) else [BLOCK_M, D]."""
    BLOCK_M: gl.constexpr = NUM_WG * ROWS_PER_WG
    NUM_Q: gl.constexpr = 2 if SPLIT else 1
    Q_ROWS: gl.constexpr = q_desc.block_type.shape[0]
    gl.static_assert(Q_ROWS * NUM_Q == BLOCK_M, "q descriptor block rows must be BLOCK_M / (SPLIT ? 2 : 1)")
    dtype: gl.constexpr = q_desc.dtype

    w = gl.program_id(0)
    seq = gl.load(W_SEQ + w)
    start_m = gl.load(W_BLOCK + w) * BLOCK_M
    head = gl.load(W_HEAD + w)
    kv_head = head // GROUP
    seq_start = gl.load(CU_SEQLENS + seq)
    seq_len = gl.load(CU_SEQLENS + seq + 1) - seq_start
    n_full = start_m // BLOCK_N  # key blocks ending at or before the tile's first query row: no mask
    n_blocks = gl.cdiv(gl.minimum(start_m + BLOCK_M, seq_len), BLOCK_N)
    q_col = head * HEAD_DIM
    kv_col = kv_head * HEAD_DIM

    q_bufs = gl.allocate_shared_memory(dtype, [NUM_Q, Q_ROWS, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    mbarrier.init(q_bar.index(0), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=NUM_Q)
    for i in gl.static_range(2):
        mbarrier.init(turn_bars.index(i), count=1)
    fence_async_shared()

    if WS:
        if SPLIT:
            gl.warp_specialize([
                (_consumer_partition, (q_bufs.index(0), k_bufs, v_bufs, q_bar.index(0), k_ready, v_ready,
                             kv_empty, turn_bars, k_desc, v_desc, O, seq_start, q_col, stride_ot, seq_start, kv_col,
                             start_m, seq_len, n_full, n_blocks, qk_scale, 0, 0, 0, q_bar.index(0),
                             0, 4, ROWS_PER_WG, BLOCK_N, HEAD_DIM, STAGES, WS, PINGPONG, OVERLAP, False)),
                (_consumer_partition, (q_bufs.index(1), k_bufs, v_bufs, q_bar.index(0), k_ready, v_ready,
                             kv_empty, turn_bars, k_desc, v_desc, O, seq_start, q_col, stride_ot, seq_start, kv_col,
                             start_m + ROWS_PER_WG, seq_len, n_full, n_blocks, qk_scale, 0, 0, 0, q_bar.index(0),
                             1, 4, ROWS_PER_WG, BLOCK_N, HEAD_DIM, STAGES, WS, PINGPONG, OVERLAP, False)),
                (_load_partition, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bar.index(0), k_ready, v_ready,
                                   kv_empty, seq_start + start_m, q_col, seq_start, kv_col, n_blocks,
                                   NUM_Q, Q_ROWS, BLOCK_N, STAGES)),
            ], [4, 1], [240, 24])
        else:
            gl.warp_specialize([
                (_consumer_partition, (q_bufs.index(0), k_bufs, v_bufs, q_bar.index(0), k_ready, v_ready,
                             kv_empty, turn_bars, k_desc, v_desc, O, seq_start, q_col, stride_ot, seq_start, kv_col,
                             start_m, seq_len, n_full, n_blocks, qk_scale, 0, 0, 0, q_bar.index(0),
                             0, 4 * NUM_WG, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, WS, False, OVERLAP, False)),
                (_load_partition, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bar.index(0), k_ready, v_ready,
                                   kv_empty, seq_start + start_m, q_col, seq_start, kv_col, n_blocks,
                                   NUM_Q, Q_ROWS, BLOCK_N, STAGES)),
            ], [1], [24])
    else:
        # The consumer warps are their own producer: q and the first STAGES key blocks now, the rest on release.
        mbarrier.expect(q_bar.index(0), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [seq_start + start_m, q_col], q_bar.index(0), q_bufs.index(0))
        for i in gl.static_range(STAGES):
            _issue_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, seq_start, kv_col, i, n_blocks,
                      BLOCK_N, STAGES)
        _consumer(q_bufs.index(0), k_bufs, v_bufs, q_bar.index(0), k_ready, v_ready, kv_empty, turn_bars,
                  k_desc, v_desc, O, seq_start, q_col, stride_ot, seq_start, kv_col,
                  start_m, seq_len, n_full, n_blocks, qk_scale, 0, 0, 0, q_bar.index(0),
                  0, 4 * NUM_WG, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, WS, False, OVERLAP, False)


@gluon.jit
def _attn_persistent(
    q_desc, k_desc, v_desc, O, CU_SEQLENS, W_SEQ, W_BLOCK, W_HEAD, qk_scale, stride_ot, num_items,
    GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    NUM_WG: gl.constexpr, ROWS_PER_WG: gl.constexpr, SPLIT: gl.constexpr, PINGPONG: gl.constexpr,
    OVERLAP: gl.constexpr,
):
    """The warp-specialized schedules in resident programs: program pid runs work items pid, pid + programs, ...
    (num_items of them); its load partition fetches a tile's q once the consumers hand the previous one back
    (q_empty) and streams every tile's K/V through one ring, so a tile's first loads run under the previous tile's
    last blocks and epilogue. Buffers as _attn_fwd's, plus q_empty."""
    BLOCK_M: gl.constexpr = NUM_WG * ROWS_PER_WG
    NUM_Q: gl.constexpr = 2 if SPLIT else 1
    Q_ROWS: gl.constexpr = q_desc.block_type.shape[0]
    gl.static_assert(Q_ROWS * NUM_Q == BLOCK_M, "q descriptor block rows must be BLOCK_M / (SPLIT ? 2 : 1)")
    dtype: gl.constexpr = q_desc.dtype

    # Duplicate scan: the same buffers and barriers as _attn_fwd's; they stay spelled out in both kernels so that the
    # one-tile kernel compiles to the code its stored rows measured (a shared allocation helper reorders it).
    q_bufs = gl.allocate_shared_memory(dtype, [NUM_Q, Q_ROWS, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], bar_layout)
    q_empty = gl.allocate_shared_memory(gl.int64, [1, 1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    mbarrier.init(q_bar.index(0), count=1)
    mbarrier.init(q_empty.index(0), count=NUM_Q)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=NUM_Q)
    for i in gl.static_range(2):
        mbarrier.init(turn_bars.index(i), count=1)
    fence_async_shared()

    # (Gluon's frontend has no *args: every partition's arguments are spelled out)
    if SPLIT:
        gl.warp_specialize([
            (_consumer_persistent, (q_bufs.index(0), k_bufs, v_bufs, q_bar.index(0), q_empty.index(0), k_ready,
                                    v_ready, kv_empty, turn_bars, k_desc, v_desc, O, stride_ot, CU_SEQLENS,
                                    W_SEQ, W_BLOCK, W_HEAD, num_items, qk_scale, 0, GROUP, BLOCK_M,
                                    0, 4, ROWS_PER_WG, BLOCK_N, HEAD_DIM, STAGES, PINGPONG, OVERLAP)),
            (_consumer_persistent, (q_bufs.index(1), k_bufs, v_bufs, q_bar.index(0), q_empty.index(0), k_ready,
                                    v_ready, kv_empty, turn_bars, k_desc, v_desc, O, stride_ot, CU_SEQLENS,
                                    W_SEQ, W_BLOCK, W_HEAD, num_items, qk_scale, ROWS_PER_WG, GROUP, BLOCK_M,
                                    1, 4, ROWS_PER_WG, BLOCK_N, HEAD_DIM, STAGES, PINGPONG, OVERLAP)),
            (_load_persistent, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bar.index(0), q_empty.index(0),
                                k_ready, v_ready, kv_empty, CU_SEQLENS, W_SEQ, W_BLOCK, W_HEAD, num_items,
                                GROUP, HEAD_DIM, BLOCK_M, NUM_Q, Q_ROWS, BLOCK_N, STAGES)),
        ], [4, 1], [240, 24])
    else:
        gl.warp_specialize([
            (_consumer_persistent, (q_bufs.index(0), k_bufs, v_bufs, q_bar.index(0), q_empty.index(0), k_ready,
                                    v_ready, kv_empty, turn_bars, k_desc, v_desc, O, stride_ot, CU_SEQLENS,
                                    W_SEQ, W_BLOCK, W_HEAD, num_items, qk_scale, 0, GROUP, BLOCK_M,
                                    0, 4 * NUM_WG, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, False, OVERLAP)),
            (_load_persistent, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bar.index(0), q_empty.index(0),
                                k_ready, v_ready, kv_empty, CU_SEQLENS, W_SEQ, W_BLOCK, W_HEAD, num_items,
                                GROUP, HEAD_DIM, BLOCK_M, NUM_Q, Q_ROWS, BLOCK_N, STAGES)),
        ], [1], [24])


# ---- variants ---------------------------------------------------------------------------------------------------


# A frozen record of int fields that checks itself in __post_init__, as modelspec.ModelSpec and parallel.Layout are
# (duplicate scan: the same shape); unrelated records, nothing to share.
@dataclass(frozen=True)
class GluonVariant:
    """One compile-time configuration of _attn_fwd (the IMPL knob picks one per config)."""

    ws: int
    num_wg: int
    block_n: int
    stages: int
    overlap: int
    split: int = 0
    pingpong: int = 0
    rows_per_wg: int = 64
    maxnreg: int = 0  # 0: compiler default
    persistent: int = 0  # one program per resident slot looping over the work items (needs ws)

    def __post_init__(self) -> None:
        if self.split and not (self.ws and self.num_wg == 2):
            raise ValueError(f"split needs ws=1 and num_wg=2: {self}")
        if self.pingpong and not self.split:
            raise ValueError(f"pingpong needs split=1: {self}")
        if self.persistent and not self.ws:
            raise ValueError(f"persistent needs ws=1 (its load partition runs ahead across tiles): {self}")

    @property
    def block_m(self) -> int:
        return self.num_wg * self.rows_per_wg

    @property
    def num_warps(self) -> int:
        """Warps of the default partition (the kernel's num_warps)."""
        return 4 if self.split else 4 * self.num_wg

    @property
    def q_rows(self) -> int:
        return self.rows_per_wg if self.split else self.block_m

    def family(self) -> str:
        if not self.ws:
            return "pipe" if self.overlap else "plain"
        if self.split:
            return "ws_pingpong" if self.pingpong else "ws_split"
        return "ws"

    def label(self) -> str:
        s = (f"{self.family()} wg{self.num_wg} {self.block_m}x{self.block_n} s{self.stages} "
             f"ov{self.overlap}")
        return s + (f" r{self.maxnreg}" if self.maxnreg else "") + (" persistent" if self.persistent else "")

    @property
    def kernel(self) -> Any:
        """The @gluon.jit kernel this variant launches."""
        return _attn_persistent if self.persistent else _attn_fwd

    def constexprs(self, group: int, head_dim: int) -> dict[str, Any]:
        c = dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_N=self.block_n, STAGES=self.stages, NUM_WG=self.num_wg,
                 ROWS_PER_WG=self.rows_per_wg, WS=self.ws, SPLIT=self.split, PINGPONG=self.pingpong,
                 OVERLAP=self.overlap)
        if self.persistent:
            del c["WS"]  # always warp-specialized
        return c

    def shared_bytes(self, head_dim: int, dtype_bytes: int = 2) -> int:
        """The q tile and the K/V ring, plus 1 KiB for barriers (the prefill family's estimate)."""
        return dtype_bytes * (self.block_m * head_dim + self.stages * 2 * self.block_n * head_dim) + 1024

    def resident_programs(self, sm_count: int, head_dim: int) -> int:
        """How many programs the GPU holds at once (a persistent launch's grid): per SM as many as its shared
        memory and registers fit (255 registers a thread where maxnreg leaves the compiler free)."""
        threads = 32 * (self.num_warps + (4 if self.split else 0) + (1 if self.ws else 0))
        by_regs = SM_REGISTERS // (threads * (self.maxnreg or 255))
        by_smem = SM_SHARED_BYTES // (self.shared_bytes(head_dim) + 1024)  # + the 1 KiB each block reserves
        return sm_count * max(1, min(by_regs, by_smem))

    def options(self) -> dict[str, Any]:
        opts: dict[str, Any] = dict(num_warps=self.num_warps, num_stages=1)
        if self.maxnreg:
            opts["maxnreg"] = self.maxnreg
        return opts


# ---- launch -----------------------------------------------------------------------------------------------------


def _nvmma_layout(block: list[int], dtype: str) -> Any:
    return gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[dtype])


def require_hopper(device: torch.device) -> None:
    """Gluon's wgmma / TMA code runs on sm_90 only; say what to do instead everywhere else."""
    cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if cap != (9, 0):
        where = f"sm_{cap[0]}{cap[1]}" if cap else f"{device.type} (Gluon has no interpreter)"
        raise ValueError(
            f"the Gluon prefill kernel (IMPL=gluon_*) runs only on Hopper (sm_90) GPUs, not on {where}: use a config "
            "without IMPL (the Triton kernel) there"
        )


def prepare_gluon(inputs: Any, variant: GluonVariant, table: torch.Tensor, num_items: int) -> Callable[[], Any]:
    """Launch closure on the family's inputs (q [T, H, D], k/v [T, Hkv, D] contiguous, cu_seqlens) and its work
    table [3, num_items] (sequence, q block, q head) built for variant.block_m."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    w = inputs.workload
    require_hopper(inputs.q.device)
    t, h, hkv, d = w.total_tokens, w.num_heads, w.num_kv_heads, w.head_dim
    for name, x in (("q", inputs.q), ("k", inputs.k), ("v", inputs.v)):
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous [T, heads, D] for the Gluon kernel's TMA descriptors")
    o = torch.empty_like(inputs.q)

    def desc(x: torch.Tensor, heads: int, rows: int) -> Any:
        x2 = x.reshape(t, heads * d)
        return TensorDescriptor(x2, list(x2.shape), list(x2.stride()), [rows, d], _nvmma_layout([rows, d], w.dtype))

    qx, kx, vx = desc(inputs.q, h, variant.q_rows), desc(inputs.k, hkv, variant.block_n), desc(inputs.v, hkv,
                                                                                            variant.block_n)
    programs = num_items
    if variant.persistent:
        sms = torch.cuda.get_device_properties(inputs.q.device).multi_processor_count
        programs = min(num_items, variant.resident_programs(sms, d))
    grid = (programs,)
    meta = variant.constexprs(h // hkv, d) | variant.options()
    args = (qx, kx, vx, o, inputs.cu_seqlens, table[0], table[1], table[2], inputs.sm_scale * _LOG2E, o.stride(0))
    if variant.persistent:
        args += (num_items,)
    kernel = variant.kernel

    def launch() -> torch.Tensor:
        kernel[grid](*args, **meta)
        return o

    return launch


def compile_sm90(variant: GluonVariant, head_dim: int = 128, dtype: str = "bfloat16", group: int = 1) -> Any:
    """triton.compile the variant for sm_90 without a GPU; returns the CompiledKernel (metadata.shared, asm)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ty = _SIG_DTYPES[dtype]

    def desc(rows: int) -> str:
        return f"tensordesc<{ty}[{rows}, {head_dim}],{_nvmma_layout([rows, head_dim], dtype)!r}>"

    signature = {"q_desc": desc(variant.q_rows), "k_desc": desc(variant.block_n), "v_desc": desc(variant.block_n),
                 "O": f"*{ty}", "CU_SEQLENS": "*i32", "W_SEQ": "*i32", "W_BLOCK": "*i32", "W_HEAD": "*i32",
                 "qk_scale": "fp32", "stride_ot": "i32"}
    if variant.persistent:
        signature["num_items"] = "i32"
    constexprs = variant.constexprs(group, head_dim)
    signature |= {n: "constexpr" for n in constexprs}
    names = variant.kernel.arg_names
    attrs = {(names.index(n),): [["tt.divisibility", 16]]
             for n in ("O", "CU_SEQLENS", "W_SEQ", "W_BLOCK", "W_HEAD", "stride_ot")}
    src = GluonASTSource(variant.kernel, signature, {(names.index(k),): v for k, v in constexprs.items()}, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=variant.options())


# The prefill family's IMPL knob values and the variant each one launches (the fastest of the sweep's schedules on
# the H200; the maxnreg caps are the sweep's: 128 lets two 1-warpgroup programs share an SM, 168 fits ping-pong).
# "_persistent": the same schedule in resident programs that loop over the work items, for short sequences whose
# tiles visit few key blocks (a tile's q load and first K/V blocks then run under the previous tile's epilogue).
IMPLS = ("gluon_overlap", "gluon_ws", "gluon_pingpong", "gluon_ws_persistent", "gluon_pingpong_persistent")
PERSISTENT_SUFFIX = "_persistent"


def variant_for(impl: str, block_m: int, block_n: int, stages: int) -> GluonVariant:
    """The GluonVariant of a prefill config (IMPL, BLOCK_M, BLOCK_N, num_stages); the knob space's rules have already
    checked the combination."""
    wg = block_m // 64
    base = impl.removesuffix(PERSISTENT_SUFFIX)
    persistent = int(impl != base)
    if impl == "gluon_overlap":
        return GluonVariant(ws=0, num_wg=wg, block_n=block_n, stages=stages, overlap=1)
    if impl in IMPLS and base == "gluon_ws":
        return GluonVariant(ws=1, num_wg=wg, block_n=block_n, stages=stages, overlap=1, maxnreg=128 if wg == 1 else 0,
                            persistent=persistent)
    if impl in IMPLS and base == "gluon_pingpong":
        return GluonVariant(ws=1, num_wg=2, block_n=block_n, stages=stages, overlap=1, split=1, pingpong=1,
                            maxnreg=168, persistent=persistent)
    raise ValueError(f"unknown Gluon IMPL {impl!r}; use one of {IMPLS}")
