"""Fused MoE layer (Mixtral-style SwiGLU experts) as Triton grouped GEMMs, with its knob space and torch references.

The layer: router logits -> softmax -> top-k -> renormalised weights; per token slot (token, expert) the expert MLP
act = silu(x @ w1_gate.T) * (x @ w1_up.T), y = act @ w2.T; out[token] = sum over its top-k slots of weight * y.

Pattern (after vLLM's fused_moe): the M * top_k token slots are sorted by expert and each expert's group is padded
to a multiple of BLOCK_M (`align_block_size`, like vLLM's moe_align_block_size), so every BLOCK_M row block of the
grouped GEMM belongs to one expert and reads that expert's weights only.

Timing scope: routing and alignment depend on BLOCK_M and run in `prepare()`, NOT in the timed closure. The closure
times the gate/up grouped GEMM, SiLU-and-mul, the down grouped GEMM, routing-weight scaling and the top-k sum,
in as many kernels as the fusion knobs ask for. Benchmarks therefore time the layer with routing excluded
(`make_torch_loop` gives the torch anchor with the same scope). A serving step routes inside the closure instead
(`prepare(..., route_in_launch=True)`): `align_block_size_bounded` sizes the alignment from the shapes alone and never
syncs with the host, so a CUDA graph can capture the layer; the kernels skip the row blocks past the routed ones.

Knobs: BLOCK_M/N/K, GROUP_M (program order: GROUP_M row blocks share each weight tile while it is in L2), num_warps,
num_stages (both GEMMs), SPLIT_K (down GEMM only: the intermediate dimension is split over SPLIT_K programs that
atomically add fp32 partial sums; this needs the FUSE_SUM=1 fp32 accumulator, so SPLIT_K > 1 requires FUSE_SUM=1),
FUSE_SILU (1: each gate/up program computes matching gate and up tiles and stores silu(g) * u; 0: store the
[slots, 2 * intermediate] GEMM output, then a separate SiLU-and-mul kernel), FUSE_WEIGHT (1: scale by the routing
weight in the down GEMM epilogue; 0: a separate kernel scales the per-slot down output rows), FUSE_SUM (1: the down
GEMM atomically adds its weighted rows into an fp32 [M, hidden] accumulator and a finalize kernel casts it to the
output and re-zeroes it for the next call; 0: store per-slot [M * top_k, hidden] and a separate top-k reduction
kernel sums each token's slots). Validity beyond shared memory / registers / tl.dot sizes: FUSE_SUM=1 requires
FUSE_WEIGHT=1 (the sum happens inside the GEMM, so the weight must be applied there first) and SPLIT_K > 1 requires
FUSE_SUM=1.

TMA_LOADS (added after the H200 dataset was measured; 0, the pointer path, is left out of configs so stored config
strings keep their meaning): 1 loads the expert weights through TMA tensor descriptors, 2 also writes the gate/up
output in the aligned slot order so the down GEMM reads its activations through a descriptor; both need FUSE_SUM=0,
FUSE_WEIGHT=1 and tiles that divide hidden and intermediate (`prepare_tma`). It wins at large M (docs/benchmarks.md).

Space size: the value lists are chosen so the pointer path's valid space stays under ~2000 configs per workload (1832
for bf16; TMA_LOADS adds up to 916 more): BLOCK_M 16/64/128 (vLLM's default sizes plus the big-M tile), num_stages 3/4
(with BLOCK_K 128, 3-4 stages already keep >= 100 KB of weights in flight) and SPLIT_K 1/4.

Imports only torch, triton and the standard library: this module runs on the GPU machine.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from kernel_gym.kernels.space import SHARED_MEMORY_LIMIT, Config, Knob, KnobSpace
from kernel_gym.kernels.workloads import MoEWorkload

MAX_ACC_PER_THREAD = 128  # fp32 accumulators per thread; more leaves too few of the 255 registers (spills)
ELEMWISE_BLOCK = 1024  # elements per program of the flat elementwise kernels (not a knob: they are bandwidth-trivial)
# How the FUSE_SUM=1 down GEMM adds into the fp32 accumulator: "relaxed" atomics on the 2-D tile, "acq_rel" atomics,
# or "flat" (relaxed atomics on the tile flattened to 1-D, a different lowering). An H200 run found wrong results with
# one of them; experiments/diag_moe_atomics.py compares them on the GPU. The env var exists only for that comparison.
ATOMIC_MODE = os.environ.get("KERNEL_GYM_MOE_ATOMIC", "relaxed")
if ATOMIC_MODE not in ("relaxed", "acq_rel", "flat"):
    raise ValueError(f"KERNEL_GYM_MOE_ATOMIC={ATOMIC_MODE!r}: use relaxed, acq_rel or flat")
_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


# ---- Triton kernels ------------------------------------------------------------------------------------------------


@triton.jit
def _tile_ids(pid, num_m_blocks, num_n_blocks, GROUP_M: tl.constexpr):
    """Grouped program order: GROUP_M consecutive row blocks sweep the N tiles together (weight tile reuse in L2)."""
    in_group = GROUP_M * num_n_blocks
    group = pid // in_group
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    return pid_m, pid_n


@triton.jit(do_not_specialize=["num_valid_slots", "num_m_blocks"])
def _gate_up_kernel(
    x_ptr, w1_ptr, out_ptr, sorted_ids_ptr, expert_ids_ptr,
    num_valid_slots, num_m_blocks, K, INTER,
    stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, FUSE_SILU: tl.constexpr, EVEN_K: tl.constexpr,
):
    """Grouped GEMM x[token] @ w1[expert].T per row block of sorted slots.

    FUSE_SILU: output columns are [0, INTER): gate rows n and up rows INTER + n of w1, stored as silu(g) * u.
    Otherwise output columns are [0, 2 * INTER) (the plain GEMM). Padding slots load row 0 and are never stored.
    """
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and BLOCK_K >= 16, "tl.dot needs every dimension >= 16")
    pid = tl.program_id(0)
    n_out = INTER if FUSE_SILU else 2 * INTER
    num_n_blocks = tl.cdiv(n_out, BLOCK_N)
    pid_m, pid_n = _tile_ids(pid, num_m_blocks, num_n_blocks, GROUP_M)

    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert < 0:  # a row block past the routed ones (align_block_size_bounded): nothing to compute
        return
    slots = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    slot_mask = slots < num_valid_slots
    rows = tl.where(slot_mask, slots // TOP_K, 0).to(tl.int64)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_wn = (offs_n % n_out).to(tl.int64)  # wrap instead of masking the weight loads; stores are masked
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk
    b_ptrs = w1_ptr + expert * stride_we + offs_wn[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FUSE_SILU:
        u_ptrs = b_ptrs + INTER * stride_wn
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        if FUSE_SILU:
            if EVEN_K:
                u = tl.load(u_ptrs)
            else:
                u = tl.load(u_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
            acc_u = tl.dot(a, u, acc_u)
            u_ptrs += BLOCK_K * stride_wk
        a_ptrs += BLOCK_K * stride_xk
        b_ptrs += BLOCK_K * stride_wk

    if FUSE_SILU:
        # silu(g) = g * sigmoid(g), sigmoid via exp2 with log2(e) scaling
        acc = acc / (1.0 + tl.exp2(-acc * 1.4426950408889634)) * acc_u
    out_ptrs = out_ptr + slots.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=slot_mask[:, None] & (offs_n[None, :] < n_out))


# Its K loop and weight epilogue have the shape of vllm_moe._gemm_block's (duplicate scan): that is vLLM's kernel as
# published (no EVEN_K, no split-K, no fused sum), this kernel_gym's own; each family's rows time its own kernel.
@triton.jit(do_not_specialize=["num_valid_slots", "num_m_blocks"])
def _down_kernel(
    act_ptr, w2_ptr, out_ptr, weights_ptr, sorted_ids_ptr, expert_ids_ptr,
    num_valid_slots, num_m_blocks, N, K, K_PER_SPLIT,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_om, stride_on,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, FUSE_WEIGHT: tl.constexpr, FUSE_SUM: tl.constexpr,
    EVEN_K: tl.constexpr, ATOMIC: tl.constexpr,
):
    """Grouped GEMM act[slot] @ w2[expert].T over the K range of split program_id(1).

    FUSE_SUM: atomically add (weighted) fp32 rows into out[token] (an fp32 accumulator); else store out[slot].
    """
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and BLOCK_K >= 16, "tl.dot needs every dimension >= 16")
    tl.static_assert(SPLIT_K == 1 or FUSE_SUM, "SPLIT_K > 1 accumulates with fp32 atomics: needs FUSE_SUM")
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_n_blocks = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_ids(pid, num_m_blocks, num_n_blocks, GROUP_M)

    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert < 0:  # a row block past the routed ones (align_block_size_bounded)
        return
    slots = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    slot_mask = slots < num_valid_slots
    a_rows = tl.where(slot_mask, slots, 0).to(tl.int64)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_wn = (offs_n % N).to(tl.int64)
    k_start = pid_k * K_PER_SPLIT
    offs_k = k_start + tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = w2_ptr + expert * stride_we + offs_wn[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K_PER_SPLIT // BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k_start - k * BLOCK_K
            a = tl.load(a_ptrs, mask=tl.arange(0, BLOCK_K)[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_wk

    if FUSE_WEIGHT:
        w = tl.load(weights_ptr + a_rows, mask=slot_mask, other=0.0)
        acc = acc * w[:, None]
    mask = slot_mask[:, None] & (offs_n[None, :] < N)
    if FUSE_SUM:
        tokens = (a_rows // TOP_K)
        out_ptrs = out_ptr + tokens[:, None] * stride_om + offs_n[None, :] * stride_on
        if ATOMIC == "flat":
            tl.atomic_add(tl.reshape(out_ptrs, (BLOCK_M * BLOCK_N,)), tl.reshape(acc, (BLOCK_M * BLOCK_N,)),
                          mask=tl.reshape(mask, (BLOCK_M * BLOCK_N,)), sem="relaxed")
        elif ATOMIC == "acq_rel":
            tl.atomic_add(out_ptrs, acc, mask=mask, sem="acq_rel")
        else:
            tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")
    else:
        out_ptrs = out_ptr + a_rows[:, None] * stride_om + offs_n[None, :] * stride_on
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["numel"])
def _silu_mul_kernel(h_ptr, act_ptr, numel, INTER, BLOCK: tl.constexpr):
    """act[s, i] = silu(h[s, i]) * h[s, INTER + i] over the flattened contiguous act (the unfused SiLU-and-mul)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    row = offs // INTER
    h_offs = offs + row * INTER  # row * 2 * INTER + col
    g = tl.load(h_ptr + h_offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + h_offs + INTER, mask=mask, other=0.0).to(tl.float32)
    act = g / (1.0 + tl.exp2(-g * 1.4426950408889634)) * u
    tl.store(act_ptr + offs, act.to(act_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["numel"])
def _scale_rows_kernel(y_ptr, weights_ptr, numel, N, BLOCK: tl.constexpr):
    """y[slot, :] *= routing weight of slot over the flattened contiguous [slots, N] down output (unfused weighting)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    w = tl.load(weights_ptr + offs // N, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (y * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["numel"])
def _topk_sum_kernel(y_ptr, out_ptr, numel, N, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """out[t, n] = sum over j < TOP_K of y[t * TOP_K + j, n], in fp32 (the unfused top-k reduction; contiguous)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    y_offs = offs + (offs // N) * (TOP_K - 1) * N  # token * TOP_K * N + col
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + y_offs + j * N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["numel"])
def _finalize_kernel(acc_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    """out = fp32 accumulator cast to the output dtype; re-zero the accumulator so the next call can add into it."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.load(acc_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(acc_ptr + offs, tl.zeros((BLOCK,), dtype=tl.float32), mask=mask)


@triton.jit
def _gate_up_tma_kernel(
    x_ptr, w_desc, out_ptr, sorted_ids_ptr, expert_ids_ptr, num_valid_slots, num_m_blocks, K, INTER,
    stride_xm, stride_om,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, FUSE_SILU: tl.constexpr, ALIGNED_OUT: tl.constexpr,
):
    """TMA_LOADS path of the gate/up GEMM: w1 tiles [BLOCK_N, BLOCK_K] through a descriptor over w1 viewed as
    [E * 2 * INTER, K]; activation rows gathered through pointers. ALIGNED_OUT: output row = aligned position (padding
    rows included, so the down GEMM can read whole row blocks through a descriptor), else the slot id."""
    pid = tl.program_id(0)
    n_out = INTER if FUSE_SILU else 2 * INTER
    pid_m, pid_n = _tile_ids(pid, num_m_blocks, tl.cdiv(n_out, BLOCK_N), GROUP_M)
    expert = tl.load(expert_ids_ptr + pid_m)
    if expert < 0:  # a row block past the routed ones (align_block_size_bounded)
        return
    pos = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ids_ptr + pos)
    slot_mask = slots < num_valid_slots
    rows = tl.where(slot_mask, slots // TOP_K, 0).to(tl.int64)
    w_row = expert * (2 * INTER) + pid_n * BLOCK_N
    a_ptrs = x_ptr + rows[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FUSE_SILU:
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs)
        acc = tl.dot(a, tl.trans(w_desc.load([w_row, k])), acc)
        if FUSE_SILU:
            acc_u = tl.dot(a, tl.trans(w_desc.load([w_row + INTER, k])), acc_u)
        a_ptrs += BLOCK_K
    if FUSE_SILU:
        acc = acc / (1.0 + tl.exp2(-acc * 1.4426950408889634)) * acc_u
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if ALIGNED_OUT:
        tl.store(out_ptr + pos.to(tl.int64)[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty))
    else:
        out_ptrs = out_ptr + slots.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=slot_mask[:, None])


# Opens as _gate_up_tma_kernel does (duplicate scan: tile ids, expert, early exit, slots): the exit must stay in
# each kernel body (a row block past the routed ones returns before its slots are loaded), so they stay inline.
@triton.jit
def _down_tma_kernel(
    act, w_desc, y_ptr, weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_valid_slots, num_m_blocks, N, K,
    stride_am, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ALIGNED_IN: tl.constexpr,
):
    """TMA_LOADS path of the down GEMM: w2 tiles through a descriptor over w2 viewed as [E * N, K], the routing
    weight applied in the epilogue, rows stored per slot. ALIGNED_IN: `act` is a descriptor over the aligned-order
    activations (one [BLOCK_M, BLOCK_K] slab per step), else a pointer to slot-order rows (gathered)."""
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, num_m_blocks, tl.cdiv(N, BLOCK_N), GROUP_M)
    expert = tl.load(expert_ids_ptr + pid_m)
    if expert < 0:  # a row block past the routed ones (align_block_size_bounded)
        return
    pos = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ids_ptr + pos)
    slot_mask = slots < num_valid_slots
    a_rows = tl.where(slot_mask, slots, 0).to(tl.int64)
    w_row = expert * N + pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if ALIGNED_IN:
        for k in range(0, K, BLOCK_K):
            acc = tl.dot(act.load([pid_m * BLOCK_M, k]), tl.trans(w_desc.load([w_row, k])), acc)
    else:
        a_ptrs = act + a_rows[:, None] * stride_am + tl.arange(0, BLOCK_K)[None, :]
        for k in range(0, K, BLOCK_K):
            acc = tl.dot(tl.load(a_ptrs), tl.trans(w_desc.load([w_row, k])), acc)
            a_ptrs += BLOCK_K
    w = tl.load(weights_ptr + a_rows, mask=slot_mask, other=0.0)
    acc = acc * w[:, None]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(y_ptr + a_rows[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=slot_mask[:, None])


# ---- inputs, routing, alignment ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MoEInputs:
    """One MoE layer call: activations, router logits (fp32, so routing is identical on every device), weights."""

    workload: MoEWorkload
    x: torch.Tensor  # [M, hidden], workload dtype
    router_logits: torch.Tensor  # [M, E], float32
    w1: torch.Tensor  # [E, 2 * intermediate, hidden]: gate rows then up rows
    w2: torch.Tensor  # [E, hidden, intermediate]


@dataclass(frozen=True)
class Alignment:
    """Slots sorted by expert, each expert's group padded to BLOCK_M (padding = num_slots, a sentinel)."""

    sorted_token_ids: torch.Tensor  # int32 [num_blocks * BLOCK_M]: slot ids (token * top_k + j) or the sentinel
    expert_ids: torch.Tensor  # int32 [num_blocks]: the expert of each row block
    num_tokens_post_padded: int  # num_blocks * BLOCK_M
    block_m: int

    @property
    def num_blocks(self) -> int:
        return self.num_tokens_post_padded // self.block_m


def router_logits(workload: MoEWorkload, seed: int = 0) -> torch.Tensor:
    """log(expert popularity) + Gumbel noise (CPU generator, fp32): top-k of these follows the workload's Zipf skew."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    u = torch.rand(workload.num_tokens, workload.num_experts, generator=gen, dtype=torch.float64)
    gumbel = -torch.log(-torch.log(u.clamp(1e-12, 1.0 - 1e-12)))
    log_pop = torch.tensor(workload.expert_popularity(), dtype=torch.float64).log()
    return (log_pop[None, :] + gumbel).to(torch.float32)


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts, top-k, renormalise: (weights fp32 [M, k], expert ids int32 [M, k])."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.contiguous(), ids.to(torch.int32).contiguous()


def align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """Sort the M * top_k slots by expert and pad each non-empty expert group to a multiple of block_m."""
    flat = topk_ids.flatten().to(torch.int64)
    num_slots = flat.numel()
    device = flat.device
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    padded_start = torch.cumsum(padded, 0) - padded
    count_start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    experts_sorted = flat[order]
    rank = torch.arange(num_slots, device=device) - count_start[experts_sorted]
    total = int(padded.sum().item())
    sorted_ids = torch.full((total,), num_slots, dtype=torch.int32, device=device)
    sorted_ids[padded_start[experts_sorted] + rank] = order.to(torch.int32)
    expert_ids = torch.repeat_interleave(torch.arange(num_experts, device=device), padded // block_m)
    return Alignment(sorted_ids, expert_ids.to(torch.int32), total, block_m)


def max_aligned_blocks(num_slots: int, num_experts: int, block_m: int) -> int:
    """The most row blocks any routing of num_slots slots can need: each non-empty expert pads fewer than block_m
    slots, and at most min(num_experts, num_slots) experts are non-empty (vLLM's moe_align_block_size sizes its
    buffers by the same kind of bound)."""
    return (num_slots + min(num_experts, num_slots) * (block_m - 1)) // block_m


def align_block_size_bounded(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """align_block_size at a size fixed by the shapes alone (max_aligned_blocks), with no host sync, so a CUDA
    graph can capture it: the routed blocks come first, in the same order; the blocks after them hold only the
    sentinel slot and expert id -1, which the GEMM kernels skip."""
    flat = topk_ids.flatten().to(torch.int64)
    num_slots, device = flat.numel(), flat.device
    num_blocks = max_aligned_blocks(num_slots, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    blocks = (counts + block_m - 1) // block_m
    block_end = torch.cumsum(blocks, 0)
    padded_start = (block_end - blocks) * block_m
    count_start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    experts_sorted = flat[order]
    rank = torch.arange(num_slots, device=device) - count_start[experts_sorted]
    sorted_ids = torch.full((num_blocks * block_m,), num_slots, dtype=torch.int32, device=device)
    sorted_ids[padded_start[experts_sorted] + rank] = order.to(torch.int32)
    block = torch.arange(num_blocks, device=device)
    expert_ids = torch.where(block < block_end[-1], torch.searchsorted(block_end, block, right=True), -1)
    return Alignment(sorted_ids, expert_ids.to(torch.int32), num_blocks * block_m, block_m)


def _routing_for(inputs: MoEInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return route(inputs.router_logits, inputs.workload.top_k)


# ---- references ----------------------------------------------------------------------------------------------------


def reference_moe(inputs: MoEInputs) -> torch.Tensor:
    """fp32 torch reference: routing, per-expert matmuls, silu(gate) * up, weight, top-k sum -> fp32 [M, hidden]."""
    wl = inputs.workload
    weights, ids = _routing_for(inputs)
    x = inputs.x.float()
    out = torch.zeros(wl.num_tokens, wl.hidden, dtype=torch.float32, device=x.device)
    inter = wl.intermediate
    for e in range(wl.num_experts):
        tok, j = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        h = x[tok] @ inputs.w1[e].float().T
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = act @ inputs.w2[e].float().T
        out.index_add_(0, tok, y * weights[tok, j][:, None])
    return out


def make_torch_loop(inputs: MoEInputs) -> Callable[[], torch.Tensor]:
    """The "torch_loop" benchmark anchor with the same timing scope as prepare(): routing and the per-expert token
    lists are computed here, the closure loops over active experts with matmuls in the input dtype."""
    wl = inputs.workload
    weights, ids = _routing_for(inputs)
    inter = wl.intermediate
    groups = []
    for e in range(wl.num_experts):
        tok, j = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel():
            groups.append((e, tok, weights[tok, j][:, None].to(inputs.x.dtype)))
    x, w1, w2 = inputs.x, inputs.w1, inputs.w2

    def loop() -> torch.Tensor:
        out = torch.zeros_like(x)
        for e, tok, w in groups:
            h = x[tok] @ w1[e].T
            act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
            out.index_add_(0, tok, (act @ w2[e].T) * w)
        return out

    return loop


def torch_loop_moe(inputs: MoEInputs) -> torch.Tensor:
    """Plain torch MoE layer in the input dtype, looping over experts (see make_torch_loop for the timed form)."""
    return make_torch_loop(inputs)()


# ---- knob space ----------------------------------------------------------------------------------------------------

KNOBS = (
    Knob("BLOCK_M", (16, 64, 128), "rows (token slots) per tile; each expert group is padded to it"),
    Knob("BLOCK_N", (32, 64, 128, 256), "output columns per tile"),
    Knob("BLOCK_K", (32, 64, 128), "reduction step"),
    Knob("GROUP_M", (1, 8), "row blocks that sweep the N tiles together (L2 reuse of weight tiles)"),
    Knob("num_warps", (4, 8), "warps per program"),
    Knob("num_stages", (3, 4), "software pipeline depth of the GEMM loads"),
    Knob("SPLIT_K", (1, 4), "programs splitting the down GEMM's reduction (fp32 atomics; needs FUSE_SUM=1)"),
    Knob("FUSE_SILU", (0, 1), "1: SiLU-and-mul in the gate/up GEMM epilogue; 0: separate kernel"),
    Knob("FUSE_WEIGHT", (0, 1), "1: routing weight in the down GEMM epilogue; 0: separate kernel (needs FUSE_SUM=0)"),
    Knob("FUSE_SUM", (0, 1), "1: atomic top-k sum into an fp32 accumulator in the down GEMM; 0: separate reduction"),
)


def _dtype_bytes(workload: MoEWorkload) -> int:
    return 4 if workload.dtype == "float32" else 2


def smem_bytes(config: Config, workload: MoEWorkload) -> int:
    """Conservative shared memory estimate: num_stages x the A and B tiles one K step loads (the larger GEMM)."""
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    b_tiles = 2 if config["FUSE_SILU"] else 1
    per_stage = max(bm * bk + b_tiles * bn * bk, bm * bk + bn * bk) * _dtype_bytes(workload)
    return int(config["num_stages"]) * per_stage


def _rule_split_k(config: Config, workload: MoEWorkload) -> str | None:
    if config["SPLIT_K"] > 1 and not config["FUSE_SUM"]:
        return f"SPLIT_K={config['SPLIT_K']} needs FUSE_SUM=1 (split partial sums are added with fp32 atomics)"
    return None


# Measured, not derived: on the H200 (triton 3.6) FUSE_SUM=1 gave wrong results (a few to thousands of elements off by
# O(1), varying run to run) more often the more tokens: 152 of 5,496 checked configs at 256 tokens, 1 of 780 at 128
# (benchmarks/h200_run3), 0 of 780 at 96 and 0 of about 5,500 at 64 or fewer, in every atomic lowering tried
# (benchmarks/h200_run2/diag_moe_atomics.json, docs/benchmarks.md). Under the interpreter it is exact. Until the cause
# is found, batches above 96 tokens sum separately.
FUSE_SUM_MAX_TOKENS = 96


def _rule_fusion(config: Config, workload: MoEWorkload) -> str | None:
    if config["FUSE_SUM"] and not config["FUSE_WEIGHT"]:
        return "FUSE_SUM=1 needs FUSE_WEIGHT=1 (the top-k sum happens in the down GEMM, so must the weighting)"
    if config["FUSE_SUM"] and workload.num_tokens > FUSE_SUM_MAX_TOKENS:
        return (f"FUSE_SUM=1 is limited to <= {FUSE_SUM_MAX_TOKENS} tokens: its atomic top-k sum was measured wrong "
                "on the H200 above that (docs/benchmarks.md); use FUSE_SUM=0")
    return None


def _rule_smem(config: Config, workload: MoEWorkload) -> str | None:
    need = smem_bytes(config, workload)
    if need > SHARED_MEMORY_LIMIT:
        return f"shared memory estimate {need} B exceeds {SHARED_MEMORY_LIMIT} B per block (lower num_stages or tiles)"
    return None


def _rule_registers(config: Config, workload: MoEWorkload) -> str | None:
    acc = config["BLOCK_M"] * config["BLOCK_N"] * (2 if config["FUSE_SILU"] else 1)
    per_thread = acc // (32 * config["num_warps"])
    if per_thread > MAX_ACC_PER_THREAD:
        return (
            f"{per_thread} fp32 accumulator elements per thread exceed {MAX_ACC_PER_THREAD} "
            "(registers: use more warps or smaller BLOCK_M x BLOCK_N)"
        )
    return None


def _rule_dot(config: Config, workload: MoEWorkload) -> str | None:
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        v = config[name]
        if v < 16 or v & (v - 1):
            return f"{name}={v} must be a power of two >= 16 (tl.dot)"
    return None


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _rule_tile_fits(config: Config, workload: MoEWorkload) -> str | None:
    """Tiles relative to the shape: a tile that is wider than the whole dimension it tiles (rounded up to a power of
    two) only computes padding, so such configs are never worth measuring or choosing. This is what keeps a policy from
    proposing a 256-wide BLOCK_N for a TP-8 shard whose intermediate size is 64. The floors (16 rows, 32 columns,
    32 reduction) keep every shape with at least one valid tile."""
    n_gate_up = workload.intermediate * (1 if config["FUSE_SILU"] else 2)
    if config["BLOCK_N"] > max(32, _pow2_at_least(n_gate_up)):
        return (f"BLOCK_N={config['BLOCK_N']} is wider than the gate/up output ({n_gate_up} columns): "
                "choose BLOCK_N <= the next power of two of it")
    # BLOCK_K steps both reductions (hidden in gate/up, intermediate in down): a step of more than twice the down
    # GEMM's whole reduction is mostly padding there, whatever it gains in gate/up.
    if config["BLOCK_K"] > max(32, 2 * _pow2_at_least(workload.intermediate)):
        return (f"BLOCK_K={config['BLOCK_K']} is over twice the down GEMM's reduction ({workload.intermediate}): "
                "choose a smaller BLOCK_K")
    slots = workload.num_tokens * workload.top_k
    if config["BLOCK_M"] > 2 * max(16, _pow2_at_least(slots)):
        return (f"BLOCK_M={config['BLOCK_M']} is over twice the batch's token slots ({slots}), so every row block is "
                "mostly padding: choose a smaller BLOCK_M")
    return None


SPACE = KnobSpace(KNOBS, rules=(_rule_dot, _rule_fusion, _rule_split_k, _rule_smem, _rule_registers))

TMA_LOADS = Knob(
    "TMA_LOADS", (0, 1, 2),
    "0: pointer loads; 1: expert weights through TMA descriptors; 2: also the down GEMM's activations (the gate/up "
    "output written in aligned order)", legacy=0,
)


def _rule_tma(config: Config, workload: MoEWorkload) -> str | None:
    if not config.get("TMA_LOADS", 0):
        return None
    if config["FUSE_SUM"] or not config["FUSE_WEIGHT"]:
        return "TMA_LOADS needs FUSE_SUM=0 and FUSE_WEIGHT=1 (its down GEMM weights rows and stores them per slot)"
    for name, dim in (("hidden", workload.hidden), ("intermediate", workload.intermediate)):
        for knob in ("BLOCK_N", "BLOCK_K"):
            if dim % config[knob]:
                return f"TMA_LOADS: {name} {dim} must be a multiple of {knob}={config[knob]} (whole descriptor tiles)"
    return None


# What the kernels can run: SPACE plus TMA_LOADS. SPACE alone is what `prepare` (the pointer-load path) accepts, so a
# TMA_LOADS config can never run there by mistake.
LAUNCH_SPACE = KnobSpace((*KNOBS, TMA_LOADS), rules=(*SPACE.rules, _rule_tma))
# The family's space, what is worth choosing and measuring: LAUNCH_SPACE minus the tiles that do not fit the shape
# (`_rule_tile_fits`). The pointer-load wrapper (`prepare`) accepts those tiles (the kernels mask the padding; the
# interpreter tests use them to reach ragged and wrapped tiles at tiny sizes), but no policy, sweep or tune candidate
# may pick them.
LAYER_SPACE = KnobSpace((*KNOBS, TMA_LOADS), rules=(*LAUNCH_SPACE.rules, _rule_tile_fits))


def vllm_config_entry(config: Config) -> dict[str, int]:
    """A config as one entry of vLLM's fused-MoE config JSON (the fusion, split and TMA_LOADS knobs have no vLLM
    equivalent: vLLM keeps its own)."""
    return {
        "BLOCK_SIZE_M": int(config["BLOCK_M"]),
        "BLOCK_SIZE_N": int(config["BLOCK_N"]),
        "BLOCK_SIZE_K": int(config["BLOCK_K"]),
        "GROUP_SIZE_M": int(config["GROUP_M"]),
        "num_warps": int(config["num_warps"]),
        "num_stages": int(config["num_stages"]),
    }


def default_config(workload: MoEWorkload) -> Config:
    """vLLM's get_default_config for unquantised experts (M <= E: 16/32/64, GROUP 1; else 64/64/32, GROUP 8;
    4 warps, 3 stages) with vLLM's fusions: separate SiLU-and-mul, weight in the down epilogue, separate sum, no
    split-K. Clamped to validity by lowering num_stages, then BLOCK_M, then BLOCK_N and BLOCK_K to 32 (a TP shard's
    intermediate of 16 or less, e.g. 128 over 8 GPUs, has no room for the 64-wide tiles), if a rule objects."""
    small = workload.num_tokens <= workload.num_experts
    config = Config(
        BLOCK_M=16 if small else 64, BLOCK_N=32 if small else 64, BLOCK_K=64 if small else 32,
        GROUP_M=1 if small else 8, num_warps=4, num_stages=3, SPLIT_K=1,
        FUSE_SILU=0, FUSE_WEIGHT=1, FUSE_SUM=0,
    )
    for block_n, block_k in ((config["BLOCK_N"], config["BLOCK_K"]), (32, 32)):
        for block_m in (config["BLOCK_M"], 32, 16):
            for stages in (3, 2):
                candidate = config.replace(num_stages=stages, BLOCK_M=min(block_m, config["BLOCK_M"]),
                                           BLOCK_N=block_n, BLOCK_K=block_k)
                if LAYER_SPACE.is_valid(candidate, workload):
                    return candidate
    LAYER_SPACE.check(config, workload)  # raises with the reason
    return config


# ---- family ------------------------------------------------------------------------------------------------------


def _check_workload(workload: object) -> MoEWorkload:
    if not isinstance(workload, MoEWorkload):
        raise TypeError(f"fused_moe needs a MoEWorkload, got {type(workload).__name__}; pass MoEWorkload(...)")
    return workload


def make_inputs(workload: MoEWorkload, device: str, seed: int = 0) -> MoEInputs:
    """x ~ N(0, 1); w1, w2 ~ N(0, 1/fan_in) so activations stay O(1); router logits from `router_logits`."""
    wl = _check_workload(workload)
    dtype = _TORCH_DTYPES[wl.dtype]
    gen = torch.Generator(device=device).manual_seed(seed)
    e, h, i = wl.num_experts, wl.hidden, wl.intermediate
    x = torch.randn(wl.num_tokens, h, generator=gen, device=device, dtype=dtype)
    w1 = torch.randn(e, 2 * i, h, generator=gen, device=device, dtype=dtype).mul_(1.0 / math.sqrt(h))
    w2 = torch.randn(e, h, i, generator=gen, device=device, dtype=dtype).mul_(1.0 / math.sqrt(i))
    logits = router_logits(wl, seed).to(device)
    return MoEInputs(wl, x, logits, w1, w2)


def _route_and_align(inputs: MoEInputs, block_m: int, bounded: bool = False) -> tuple[torch.Tensor, Alignment]:
    """Routing (top-k of the router logits, on the inputs' device) and alignment to BLOCK_M, shared by every launch
    path: (the flat routing weights, the alignment)."""
    wl = inputs.workload
    weights, ids = route(inputs.router_logits.to(inputs.x.device), wl.top_k)
    align = align_block_size_bounded if bounded else align_block_size
    return weights.flatten().contiguous(), align(ids, wl.num_experts, block_m)


def _routing(inputs: MoEInputs, block_m: int, in_launch: bool) -> tuple[int, Callable[[], tuple]]:
    """(the row blocks the grids cover, a call giving (flat routing weights, alignment)): routed once here (the
    measured scope), or, in_launch, routed at every call from the current logits at the bounded size."""
    if in_launch:
        wl = inputs.workload
        num_blocks = max_aligned_blocks(wl.num_tokens * wl.top_k, wl.num_experts, block_m)
        return num_blocks, lambda: _route_and_align(inputs, block_m, bounded=True)
    routed = _route_and_align(inputs, block_m)
    return routed[1].num_blocks, lambda: routed


def prepare(inputs: MoEInputs, config: Config, route_in_launch: bool = False) -> Callable[[], torch.Tensor]:
    """Routing, alignment to BLOCK_M, workspaces and grids (not timed); returns the closure of the layer's kernels.

    route_in_launch: the closure routes and aligns itself, from whatever inputs.router_logits holds at the call, at
    the bounded size and without a host sync: a serving step's layer, which a CUDA graph can capture."""
    wl = inputs.workload
    SPACE.check(config, wl)
    bm, bn, bk = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["BLOCK_K"])
    group_m, split_k = int(config["GROUP_M"]), int(config["SPLIT_K"])
    fuse_silu, fuse_weight, fuse_sum = bool(config["FUSE_SILU"]), bool(config["FUSE_WEIGHT"]), bool(config["FUSE_SUM"])
    launch_opts = {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}

    x, w1, w2 = inputs.x, inputs.w1, inputs.w2
    m, hidden, inter, top_k = wl.num_tokens, wl.hidden, wl.intermediate, wl.top_k
    expected = {"x": (m, hidden), "w1": (wl.num_experts, 2 * inter, hidden), "w2": (wl.num_experts, hidden, inter)}
    for name, shape in expected.items():
        t = getattr(inputs, name)
        if tuple(t.shape) != shape or t.dtype != _TORCH_DTYPES[wl.dtype]:
            raise ValueError(f"inputs.{name} is {tuple(t.shape)} {t.dtype}; expected {shape} {wl.dtype} (make_inputs)")
    dev = x.device
    num_slots = m * top_k

    num_m_blocks, routed = _routing(inputs, bm, route_in_launch)

    act = torch.empty(num_slots, inter, dtype=x.dtype, device=dev)
    h = act if fuse_silu else torch.empty(num_slots, 2 * inter, dtype=x.dtype, device=dev)
    out = torch.empty(m, hidden, dtype=x.dtype, device=dev)
    # FUSE_SUM: fp32 accumulator, zeroed here and re-zeroed by the finalize kernel after every call
    down_out = torch.zeros(m, hidden, dtype=torch.float32, device=dev) if fuse_sum else torch.empty(
        num_slots, hidden, dtype=x.dtype, device=dev
    )

    n_gate_up = inter if fuse_silu else 2 * inter
    grid_gate_up = (num_m_blocks * triton.cdiv(n_gate_up, bn),)
    even_k_gate_up = hidden % bk == 0
    k_per_split = triton.cdiv(triton.cdiv(inter, split_k), bk) * bk
    even_k_down = inter % (bk * split_k) == 0
    grid_down = (num_m_blocks * triton.cdiv(hidden, bn), split_k)
    grid_act = (triton.cdiv(num_slots * inter, ELEMWISE_BLOCK),)
    grid_slots_out = (triton.cdiv(num_slots * hidden, ELEMWISE_BLOCK),)
    grid_out = (triton.cdiv(m * hidden, ELEMWISE_BLOCK),)

    def launch() -> torch.Tensor:
        flat_weights, align = routed()
        sorted_ids, expert_ids = align.sorted_token_ids, align.expert_ids
        _gate_up_kernel[grid_gate_up](
            x, w1, h, sorted_ids, expert_ids, num_slots, num_m_blocks, hidden, inter,
            x.stride(0), x.stride(1), w1.stride(0), w1.stride(1), w1.stride(2), h.stride(0), h.stride(1),
            TOP_K=top_k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, FUSE_SILU=fuse_silu,
            EVEN_K=even_k_gate_up, **launch_opts,
        )
        if not fuse_silu:
            _silu_mul_kernel[grid_act](h, act, num_slots * inter, inter, BLOCK=ELEMWISE_BLOCK)
        _down_kernel[grid_down](
            act, w2, down_out, flat_weights, sorted_ids, expert_ids, num_slots, num_m_blocks, hidden, inter,
            k_per_split, act.stride(0), act.stride(1), w2.stride(0), w2.stride(1), w2.stride(2),
            down_out.stride(0), down_out.stride(1),
            TOP_K=top_k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, SPLIT_K=split_k,
            FUSE_WEIGHT=fuse_weight, FUSE_SUM=fuse_sum, EVEN_K=even_k_down, ATOMIC=ATOMIC_MODE, **launch_opts,
        )
        if not fuse_weight:
            _scale_rows_kernel[grid_slots_out](down_out, flat_weights, num_slots * hidden, hidden, BLOCK=ELEMWISE_BLOCK)
        if fuse_sum:
            _finalize_kernel[grid_out](down_out, out, m * hidden, BLOCK=ELEMWISE_BLOCK)
        else:
            _topk_sum_kernel[grid_out](down_out, out, m * hidden, hidden, TOP_K=top_k, BLOCK=ELEMWISE_BLOCK)
        return out

    return launch


def prepare_tma(inputs: MoEInputs, config: Config, route_in_launch: bool = False) -> Callable[[], torch.Tensor]:
    """The TMA_LOADS path (1: weights through descriptors; 2: also the down GEMM's activations): routing and
    alignment as in `prepare`; the closure runs gate/up, SiLU-and-mul unless fused, down with the routing weight, and
    the top-k sum. Measured on the H200 (docs/benchmarks.md): faster than pointer loads and the torch loop at large M,
    a little slower at M <= 64."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    wl = inputs.workload
    LAYER_SPACE.check(config, wl)
    mode = int(LAYER_SPACE.value(config, "TMA_LOADS"))
    if mode == 0:
        raise ValueError(f"{config} has no TMA_LOADS: use prepare (or FAMILY.prepare for any config)")
    bm, bn, bk = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["BLOCK_K"])
    group_m, fuse_silu = int(config["GROUP_M"]), bool(config["FUSE_SILU"])
    launch_opts = {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}
    x = inputs.x
    m, e, hidden, inter, top_k = wl.num_tokens, wl.num_experts, wl.hidden, wl.intermediate, wl.top_k
    nb, routed = _routing(inputs, bm, route_in_launch)
    num_slots, aligned = m * top_k, mode == 2
    w1_desc = TensorDescriptor.from_tensor(inputs.w1.view(e * 2 * inter, hidden), [bn, bk])
    w2_desc = TensorDescriptor.from_tensor(inputs.w2.view(e * hidden, inter), [bn, bk])
    rows = nb * bm if aligned else num_slots
    n_out = inter if fuse_silu else 2 * inter
    h = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    act = h if fuse_silu else torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    act_in = TensorDescriptor.from_tensor(act, [bm, bk]) if aligned else act
    y = torch.empty(num_slots, hidden, dtype=x.dtype, device=x.device)
    out = torch.empty(m, hidden, dtype=x.dtype, device=x.device)

    def launch() -> torch.Tensor:
        flat_weights, align = routed()
        sorted_ids, expert_ids = align.sorted_token_ids, align.expert_ids
        _gate_up_tma_kernel[(nb * triton.cdiv(n_out, bn),)](
            x, w1_desc, h, sorted_ids, expert_ids, num_slots, nb, hidden, inter, x.stride(0), h.stride(0),
            TOP_K=top_k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, FUSE_SILU=fuse_silu,
            ALIGNED_OUT=aligned, **launch_opts,
        )
        if not fuse_silu:
            _silu_mul_kernel[(triton.cdiv(act.numel(), ELEMWISE_BLOCK),)](h, act, act.numel(), inter,
                                                                          BLOCK=ELEMWISE_BLOCK)
        _down_tma_kernel[(nb * triton.cdiv(hidden, bn),)](
            act_in, w2_desc, y, flat_weights, sorted_ids, expert_ids, num_slots, nb, hidden, inter, act.stride(0),
            y.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, ALIGNED_IN=aligned, **launch_opts,
        )
        _topk_sum_kernel[(triton.cdiv(m * hidden, ELEMWISE_BLOCK),)](y, out, m * hidden, hidden, TOP_K=top_k,
                                                                     BLOCK=ELEMWISE_BLOCK)
        return out

    return launch


def prepare_layer(inputs: MoEInputs, config: Config, route_in_launch: bool = False) -> Callable[[], torch.Tensor]:
    """The launch closure of any config of the family's space: `prepare_tma` for TMA_LOADS, else `prepare`."""
    prep = prepare_tma if config.get("TMA_LOADS", 0) else prepare
    return prep(inputs, config, route_in_launch)


def reference(inputs: MoEInputs) -> torch.Tensor:
    return reference_moe(inputs)


def tolerance(dtype: str) -> tuple[float, float]:
    """(atol, rtol) on O(1) outputs: bf16/fp16 round the [slots, intermediate] activation; fp32 allows TF32 dots."""
    table = {"bfloat16": (3e-2, 3e-2), "float16": (1e-2, 1e-2), "float32": (5e-3, 5e-3)}
    if dtype not in table:
        raise ValueError(f"no tolerance for dtype {dtype!r}; use one of {sorted(table)}")
    return table[dtype]


def flops(workload: MoEWorkload) -> float:
    """2 * slots * hidden * 2 * inter (gate/up) + 2 * slots * inter * hidden (down)."""
    wl = _check_workload(workload)
    slots = wl.num_tokens * wl.top_k
    return float(2 * slots * wl.hidden * 2 * wl.intermediate + 2 * slots * wl.intermediate * wl.hidden)


def active_experts(workload: MoEWorkload, seed: int = 0) -> int:
    """Experts that receive at least one token under the seed's routing (make_inputs draws the same logits)."""
    _, ids = route(router_logits(workload, seed), workload.top_k)
    return int(torch.unique(ids).numel())


def bytes_moved(workload: MoEWorkload) -> float:
    """Minimum bytes: w1 + w2 of every expert with >= 1 token (seed-0 routing, as benchmarks use) + x read + out
    written. Intermediates are not counted (a fully fused kernel could keep them on chip)."""
    wl = _check_workload(workload)
    elt = _dtype_bytes(wl)
    expert_bytes = 3 * wl.hidden * wl.intermediate * elt
    return float(active_experts(wl, 0) * expert_bytes + 2 * wl.num_tokens * wl.hidden * elt)


def bench_cases() -> list[tuple[str, MoEWorkload]]:
    """Benchmark cases: Mixtral 8x7B layer (uniform routing) and OLMoE (uniform and Zipf-skewed routing)."""
    cases = [(f"moe_mixtral_m{m}", MoEWorkload(m, 8, 2, 4096, 14336, 0.0)) for m in (1, 16, 64, 256, 1024, 4096)]
    cases += [(f"moe_olmoe_m{m}", MoEWorkload(m, 64, 8, 2048, 1024, 0.0)) for m in (1, 64, 1024)]
    cases += [("moe_olmoe_m64_skew1.2", MoEWorkload(64, 64, 8, 2048, 1024, 1.2))]
    return cases


_JIT_FUNCTIONS = (
    _tile_ids, _gate_up_kernel, _down_kernel, _silu_mul_kernel, _scale_rows_kernel, _topk_sum_kernel, _finalize_kernel
)


@dataclass(frozen=True)
class FusedMoEFamily:
    """The fused MoE kernel family (see the module docstring)."""

    name: str = "fused_moe"
    space: KnobSpace = LAYER_SPACE
    workload_type: type = MoEWorkload

    def default_config(self, workload: MoEWorkload) -> Config:
        return default_config(_check_workload(workload))

    def make_inputs(self, workload: MoEWorkload, device: str, seed: int = 0) -> MoEInputs:
        return make_inputs(workload, device, seed)

    def prepare(self, inputs: MoEInputs, config: Config) -> Callable[[], torch.Tensor]:
        return prepare_layer(inputs, config)

    def reference(self, inputs: MoEInputs) -> torch.Tensor:
        return reference_moe(inputs)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return tolerance(dtype)

    def flops(self, workload: MoEWorkload) -> float:
        return flops(workload)

    def bytes_moved(self, workload: MoEWorkload) -> float:
        return bytes_moved(workload)

    # MoE-only extras (the benchmark and the vLLM export reach them through FAMILY)
    def torch_loop_moe(self, inputs: MoEInputs) -> torch.Tensor:
        return torch_loop_moe(inputs)

    def make_torch_loop(self, inputs: MoEInputs) -> Callable[[], torch.Tensor]:
        return make_torch_loop(inputs)

    def vllm_config_entry(self, config: Config) -> dict[str, int]:
        return vllm_config_entry(config)

    def bench_cases(self) -> list[tuple[str, MoEWorkload]]:
        return bench_cases()


FAMILY = FusedMoEFamily()
