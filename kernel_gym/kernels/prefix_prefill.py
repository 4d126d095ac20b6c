"""Paged-prefix chunked prefill: each request's chunk of new queries attends causally within the chunk and fully to
the request's earlier tokens, all read from the paged KV cache (the chunked-prefill and prefix-cache attention of
serving engines; vLLM's unified Triton attention is the design studied).

Inputs (config-independent, from make_inputs): q [T, H, D], the chunks' queries packed with cu_q [S + 1]; k and v
[sum(prefix + chunk), Hkv, D], each request's whole context (its prefix, then its chunk: serving engines write the
chunk's K/V into the cache before attention) concatenated. prepare(inputs, config) pages them for the config, with the
decode family's page size and layouts: NHD = [pages, PAGE_SIZE, Hkv, D], HND = [pages, Hkv, PAGE_SIZE, D], pages in a
seeded shuffled order (a non-contiguous block table [S, max_pages] int32), slots past a context's end NaN (so a
missing mask shows as NaN, never as luck).

Kernel design (one program per (q tile of a chunk, q head, KV split), from a work table):
- Query row r of a chunk sits at absolute position prefix + r and sees keys [0, prefix + r]. The tile's key range is
  [0, min(prefix + start_m + BLOCK_M, context)); key blocks that end at or before the tile's first row's position run
  without masks (no causal mask, no bounds check: inside the context by construction), the rest with both.
- K/V come through the block table. When a key block lies within one page (BLOCK_N <= PAGE_SIZE), the page is looked
  up once per block and, on sm_90+ and under the interpreter, the block is loaded with a TMA tensor descriptor over
  the cache's 2-D view (rows page * rows-per-page + head offset + slot); q too. Otherwise (BLOCK_N > PAGE_SIZE:
  several pages per block) pointers with one page lookup per token. Page offsets are computed one block ahead so the
  K/V loads do not wait on a block-table load of their own iteration.
- NUM_SPLITS > 1 cuts a tile's key range into BLOCK_N-aligned slices (flash-decoding over the prefix): a chunk of few
  tiles over a long prefix then fills the GPU. Each split writes its normalised partial output and base-2
  log-sum-exp; a second kernel combines them.
- Masked scores are replaced (tl.where), never added to, so NaN slots and rows with no visible key in a block stay
  finite; V is zeroed past the context's end. Softmax in base 2 with sm_scale * log2(e) folded into one multiply, fp32
  accumulation. Tiles run heaviest first within L2 sections of (request, kv head) pairs (as the prefill family).

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
from kernel_gym.kernels.attention import LAYOUTS, PagedKV, block_row, load_rows, online_softmax, tile_rows
from kernel_gym.kernels.space import Config, Knob, KnobSpace
from kernel_gym.kernels.workloads import PrefixPrefillWorkload

NUM_SMS = 132  # H200 streaming multiprocessors
SPLIT_COUNTS = (1, 2, 4, 8)
SPLIT_MIN_KEYS = 2  # each split must cover at least this many BLOCK_N blocks of the longest context
L2_SECTION = 8  # (request, kv head) pairs whose tiles run together
_DTYPE_BYTES = attention.DTYPE_BYTES
_LOG2E = attention.LOG2E
_MASKED = tl.constexpr(-1.0e30)  # a masked pair's score: finite, so a row with no visible key in a block stays finite


# ---- kernels ----------------------------------------------------------------------------------------------------


@triton.jit
def _kv_rows(bt_row, tok0, offs_n, kv_len, rows_per_page, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row of each token tok0 + offs_n in the cache's [rows, ...] view: physical page * rows_per_page + slot (int64).
    Block-table reads past the context's end are masked (page 0), so computing one block ahead is always safe."""
    tok = tok0 + offs_n
    if BLOCK_N <= PAGE_SIZE:
        page = tl.load(bt_row + tok0 // PAGE_SIZE, mask=tok0 < kv_len, other=0).to(tl.int64)
    else:
        page = tl.load(bt_row + tok // PAGE_SIZE, mask=tok < kv_len, other=0).to(tl.int64)
    return page * rows_per_page + tok % PAGE_SIZE


@triton.jit
def _attend(acc, l_i, m_i, q, K, V, bt_row, kv_col, head_row, rows_per_page, stride_row,
            q_pos, kv_len, lo, hi, qk_scale,
            HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
            USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax over key blocks [lo, hi). K/V: TMA descriptors over [rows, cols] (block at row, column kv_col) or
    base pointers with row stride stride_row (the kv head's offset already added). MASKED: causal + context masks."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if USE_TMA:  # the block lies in one page: one row, its rows are consecutive
        rows = block_row(bt_row, lo, kv_len, rows_per_page, PAGE_SIZE)
    else:
        rows = _kv_rows(bt_row, lo, offs_n, kv_len, rows_per_page, PAGE_SIZE, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        if USE_TMA:
            rows_next = block_row(bt_row, start_n + BLOCK_N, kv_len, rows_per_page, PAGE_SIZE)
        else:
            rows_next = _kv_rows(bt_row, start_n + BLOCK_N, offs_n, kv_len, rows_per_page, PAGE_SIZE, BLOCK_N)
        cols = start_n + offs_n
        in_ctx = cols < kv_len
        if USE_TMA:
            row0 = rows.to(tl.int32) + head_row
            k = K.load([row0, kv_col])
        else:
            kv_ptrs = rows[:, None] * stride_row + offs_d[None, :]
            k = load_rows(K + kv_ptrs, in_ctx, MASKED)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if MASKED:
            keep = (cols[None, :] <= q_pos[:, None]) & in_ctx[None, :]
            qk = tl.where(keep, qk * qk_scale, _MASKED)
        p, m_ij, l_i, acc = online_softmax(qk, m_i, l_i, acc, qk_scale, MASKED)
        if USE_TMA:
            v = V.load([row0, kv_col])
            if MASKED:
                v = tl.where(in_ctx[:, None], v, 0.0)  # NaN slots past the context's end
        else:
            v = load_rows(V + kv_ptrs, in_ctx, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_ij
        rows = rows_next
    return acc, l_i, m_i


@triton.jit
def _prefix_fwd(
    Q, K, V, O, PartO, PartLse, BlockTable, W_SEQ, W_QSTART, W_QLEN, W_PREFIX, W_BLOCK, W_HEAD, W_SPLIT,
    qk_scale, rows_per_page, head_rows, head_cols,
    stride_qt, stride_qh, stride_row, stride_bt, stride_ot, stride_oh, stride_ps, stride_pt, stride_ph,
    stride_ls, stride_lt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, USE_TMA: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PACK_GQA: tl.constexpr,
):
    """One program = work item program_id: one BLOCK_M tile of one request's chunk, one q head, one KV split; with
    PACK_GQA, BLOCK_M // GROUP tokens for every q head of one kv head (row r: token r // GROUP, q head
    kv_head * GROUP + r % GROUP)."""
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs BLOCK_M >= 16")
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs BLOCK_N >= 16")
    tl.static_assert(HEAD_DIM >= 16, "tl.dot needs HEAD_DIM >= 16")
    tl.static_assert(PAGE_SIZE % BLOCK_N == 0 or BLOCK_N % PAGE_SIZE == 0, "BLOCK_N and PAGE_SIZE must nest")
    w = tl.program_id(0)
    seq = tl.load(W_SEQ + w)
    head = tl.load(W_HEAD + w)  # PACK_GQA: the kv head
    split = tl.load(W_SPLIT + w)
    # the item carries its request's chunk start, chunk length and prefix: one memory round trip before the q and
    # K loads, not two (a table load, then cu_q and the prefix at the loaded index)
    q_start = tl.load(W_QSTART + w)
    q_len = tl.load(W_QLEN + w)
    prefix = tl.load(W_PREFIX + w)
    kv_len = prefix + q_len
    q64 = q_start.to(tl.int64)

    start_m, kv_head, offs_m, q_heads = tile_rows(tl.load(W_BLOCK + w), head, GROUP, BLOCK_M, PACK_GQA)
    tile_m: tl.constexpr = BLOCK_M // GROUP if PACK_GQA else BLOCK_M  # tokens per tile
    offs_d = tl.arange(0, HEAD_DIM)
    row_in_chunk = offs_m < q_len
    q_pos = prefix + offs_m  # absolute position of each query row: it sees keys [0, q_pos]
    if USE_TMA and not PACK_GQA:
        q = Q.load([q_start + start_m, head * HEAD_DIM])
    else:  # PACK_GQA: rows of GROUP heads per token, gathered by pointers (Q is the tensor)
        q_ptrs = Q + q64 * stride_qt + offs_m[:, None] * stride_qt + q_heads[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=row_in_chunk[:, None], other=0.0)
    if USE_TMA:
        k_src, v_src = K, V
        kv_col = kv_head * head_cols
        head_row = kv_head * head_rows
    else:
        k_src = K + kv_head * head_rows * stride_row + kv_head * head_cols
        v_src = V + kv_head * head_rows * stride_row + kv_head * head_cols
        kv_col = 0
        head_row = 0
    bt_row = BlockTable + seq * stride_bt

    # this tile's keys: [0, hi); this split's slice [lo, hi_s); keys below full_hi are visible to every row
    hi = tl.minimum(prefix + start_m + tile_m, kv_len)
    full_hi = ((prefix + start_m + 1) // BLOCK_N) * BLOCK_N
    if NUM_SPLITS == 1:
        lo = 0
        hi_s = hi
    else:
        span = tl.cdiv(tl.cdiv(hi, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = split * span
        hi_s = tl.minimum(lo + span, hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i = _attend(
        acc, l_i, m_i, q, k_src, v_src, bt_row, kv_col, head_row, rows_per_page, stride_row,
        q_pos, kv_len, lo, tl.minimum(hi_s, full_hi), qk_scale,
        HEAD_DIM, PAGE_SIZE, BLOCK_N, False, USE_TMA, DOT_PRECISION,
    )
    acc, l_i, m_i = _attend(
        acc, l_i, m_i, q, k_src, v_src, bt_row, kv_col, head_row, rows_per_page, stride_row,
        q_pos, kv_len, tl.maximum(lo, full_hi), hi_s, qk_scale,
        HEAD_DIM, PAGE_SIZE, BLOCK_N, True, USE_TMA, DOT_PRECISION,
    )

    if NUM_SPLITS == 1:
        o_ptrs = O + q64 * stride_ot + q_heads[:, None] * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :]
        tl.store(o_ptrs, (acc / l_i[:, None]).to(O.dtype.element_ty), mask=row_in_chunk[:, None])
    else:
        # an empty split (past a short tile's keys) has l = 0: it writes zeros and lse = -inf, weighing nothing
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        lse = tl.where(l_i > 0, m_i + tl.math.log2(l_safe), float("-inf"))
        tok = q64 + offs_m
        p_ptrs = PartO + split * stride_ps + tok[:, None] * stride_pt + q_heads[:, None] * stride_ph + offs_d[None, :]
        tl.store(p_ptrs, acc / l_safe[:, None], mask=row_in_chunk[:, None])
        tl.store(PartLse + split * stride_ls + tok * stride_lt + q_heads, lse, mask=row_in_chunk)


@triton.jit
def _combine_splits(PartO, PartLse, O, T, stride_ps, stride_pt, stride_ph, stride_ls, stride_lt, stride_ot, stride_oh,
                    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_T: tl.constexpr):
    """One program = BLOCK_T tokens of one q head: o = sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s - max). Split 0
    always holds key 0, which every query sees, so the max is finite."""
    pid_t = tl.program_id(0)
    head = tl.program_id(1)
    tok = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = tok < T
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_T], float("-inf"), dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        m = tl.maximum(m, tl.load(PartLse + s * stride_ls + tok * stride_lt + head, mask=ok, other=0.0))
    num = tl.zeros([BLOCK_T, HEAD_DIM], dtype=tl.float32)
    den = tl.zeros([BLOCK_T], dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        wgt = tl.math.exp2(tl.load(PartLse + s * stride_ls + tok * stride_lt + head, mask=ok, other=0.0) - m)
        part = tl.load(PartO + s * stride_ps + tok[:, None] * stride_pt + head * stride_ph + offs_d[None, :],
                       mask=ok[:, None], other=0.0)
        num += wgt[:, None] * part
        den += wgt
    out = num / tl.where(ok, den, 1.0)[:, None]
    tl.store(O + tok[:, None] * stride_ot + head * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=ok[:, None])


# ---- knob space -------------------------------------------------------------------------------------------------


def _tiles(workload: PrefixPrefillWorkload, block_m: int) -> int:
    """Query tiles of the call, over all chunks (one program per tile per q head per split)."""
    return sum(triton.cdiv(c, block_m) for c in workload.chunk_lens)


def _programs(config: Config, workload: PrefixPrefillWorkload) -> int:
    """Programs of one split: tiles x q heads, or with PACK_GQA tiles of BLOCK_M / group tokens x kv heads."""
    bm = int(config["BLOCK_M"])
    if int(SPACE.value(config, "PACK_GQA")):
        return _tiles(workload, bm * workload.num_kv_heads // workload.num_heads) * workload.num_kv_heads
    return _tiles(workload, bm) * workload.num_heads


def _shared_memory_bytes(config: Config, workload: PrefixPrefillWorkload) -> int:
    """The q tile plus num_stages buffers of the K and V tiles, plus 1 KiB of barriers and 128 B of scratch (the
    prefill family's model; the sm_90 compiler took 24 B above 1 KiB for split configs: checked by
    tests/kernels/test_prefix_prefill.py)."""
    b = _DTYPE_BYTES[workload.dtype]
    bm, bn, d, stages = int(config["BLOCK_M"]), int(config["BLOCK_N"]), workload.head_dim, int(config["num_stages"])
    return b * (bm * d + stages * 2 * bn * d) + 1024 + 128


def _rule_block_vs_page(config: Config, workload: PrefixPrefillWorkload) -> str | None:
    bn, page = int(config["BLOCK_N"]), int(config["PAGE_SIZE"])
    if bn > 4 * page:
        return (f"BLOCK_N={bn} spans {bn // page} pages of {page} tokens (one block-table lookup per token, no TMA); "
                f"use BLOCK_N <= {4 * page}")
    return None


def _rule_splits(config: Config, workload: PrefixPrefillWorkload) -> str | None:
    splits, bn = int(config["NUM_SPLITS"]), int(config["BLOCK_N"])
    if splits == 1:
        return None
    programs = _programs(config, workload)
    if programs >= 2 * NUM_SMS:
        return (f"NUM_SPLITS={splits}: {programs} tiles x heads already fill two waves of {NUM_SMS} SMs; splitting "
                "the keys only adds partial outputs to combine: use NUM_SPLITS=1")
    longest = max(workload.context_lens())
    if longest < splits * SPLIT_MIN_KEYS * bn:
        return (f"NUM_SPLITS={splits} cuts the longest context ({longest} tokens) into slices of fewer than "
                f"{SPLIT_MIN_KEYS} blocks of BLOCK_N={bn}; use fewer splits")
    return None


def _rule_shared_memory(config: Config, workload: PrefixPrefillWorkload) -> str | None:
    need = _shared_memory_bytes(config, workload)
    return attention.shared_memory_reason(need, config, workload, ("BLOCK_M", "BLOCK_N", "num_stages"))


def _rule_pack_gqa(config: Config, workload: PrefixPrefillWorkload) -> str | None:
    return attention.pack_gqa_reason(SPACE.value(config, "PACK_GQA"), int(config["BLOCK_M"]), workload)


SPACE = KnobSpace(
    knobs=[
        Knob("PAGE_SIZE", (16, 32, 64, 128), "tokens per KV-cache page (a deployment choice: re-layout to change)"),
        Knob("LAYOUT", LAYOUTS, "NHD = [pages, page, kv_heads, D]; HND = [pages, kv_heads, page, D]"),
        Knob("BLOCK_M", (16, 32, 64, 128), "query rows per program"),
        Knob("BLOCK_N", (16, 32, 64, 128), "keys per inner-loop step"),
        Knob("num_warps", (4, 8), "warps per program"),
        Knob("num_stages", (1, 2, 3, 4), "software-pipelining depth of the K/V loads"),
        Knob("NUM_SPLITS", SPLIT_COUNTS, "slices of each tile's keys run by separate programs (1 = single pass)"),
        attention.PACK_GQA,
    ],
    rules=[attention.rule_head_dim, _rule_block_vs_page, _rule_pack_gqa, _rule_splits, _rule_shared_memory,
           attention.rule_tile_registers],
)


# ---- inputs, paging, launch, reference ----------------------------------------------------------------------------


@dataclass(eq=False)
class PrefixInputs:
    """Config-independent inputs: q [T, H, D] (cu_q [S + 1] int32); k, v [sum(context), Hkv, D] (cu_ctx [S + 1]
    int64), each request's prefix then chunk; prefix_lens [S] int32; seed for the page shuffle."""

    workload: PrefixPrefillWorkload
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_ctx: torch.Tensor
    prefix_lens: torch.Tensor
    sm_scale: float
    seed: int


def page_context(k: torch.Tensor, v: torch.Tensor, context_lens: tuple[int, ...], page_size: int, layout: str,
                 seed: int = 0) -> PagedKV:
    """Scatter contiguous per-request K/V ([sum(context_lens), Hkv, D]) into shuffled physical pages (plus ~1/8 spare
    pages no request uses); slots past a context's end are NaN (attention.page_kv, as the decode family pages)."""
    return attention.page_kv(k, v, context_lens, page_size, layout, seed)


_last_paged: list = []  # [(inputs, page_size, layout, PagedKV)]: one entry, so memory stays bounded


def _paged_memo(inputs: PrefixInputs, page_size: int, layout: str) -> PagedKV:
    """page_context, reused while consecutive configs share inputs, page size and layout (collection orders a
    workload's configs by PAGE_SIZE and LAYOUT)."""
    return attention.reuse_last(_last_paged, inputs, page_size, layout, lambda: page_context(
        inputs.k, inputs.v, inputs.workload.context_lens(), page_size, layout, inputs.seed))


def _check_workload(workload: object) -> PrefixPrefillWorkload:
    return attention.check_workload(workload, PrefixPrefillWorkload, "prefix_prefill")


def work_table(workload: PrefixPrefillWorkload, block_m: int, splits: int,
               section: int = L2_SECTION, pack_gqa: bool = False) -> list[tuple[int, int, int, int]]:
    """(request, q block, q head, split) of every program; with pack_gqa (request, block of block_m // group tokens,
    kv head, split). (request, kv head) pairs are cut into sections of `section` pairs run one after another; within
    a section the tiles with most keys to visit run first, the q heads of one GQA group side by side."""
    if section < 1:
        raise ValueError(f"section must be >= 1 (request, kv head) pair, got {section}")
    w = workload
    group = w.num_heads // w.num_kv_heads
    tile = block_m // group if pack_gqa else block_m
    heads = range(w.num_kv_heads) if pack_gqa else range(w.num_heads)
    keyed = []
    for s, (c, p) in enumerate(zip(w.chunk_lens, w.prefix_lens)):
        for b in range(triton.cdiv(c, tile)):
            weight = min(p + (b + 1) * tile, p + c)
            for h in heads:
                kv_head = h if pack_gqa else h // group
                pair = s * w.num_kv_heads + kv_head
                for sp in range(splits):
                    keyed.append(((pair // section, -weight, s, kv_head, b, h, sp), (s, b, h, sp)))
    keyed.sort()
    return [item for _, item in keyed]


ITEM_FIELDS = ("W_SEQ", "W_QSTART", "W_QLEN", "W_PREFIX", "W_BLOCK", "W_HEAD", "W_SPLIT")  # the kernel's item rows


def item_table(workload: PrefixPrefillWorkload, items: list[tuple[int, int, int, int]],
               device: torch.device) -> torch.Tensor:
    """The work items as int32 rows (ITEM_FIELDS: request, its chunk's first row, chunk length, prefix length, q
    block, head, split), one column per program: the chunk's start, length and prefix are looked up here, on the
    host, not by each program."""
    starts = [0, *itertools.accumulate(workload.chunk_lens)]
    rows = [(s, starts[s], workload.chunk_lens[s], workload.prefix_lens[s], b, h, sp) for s, b, h, sp in items]
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, len(ITEM_FIELDS)).t().contiguous().to(device)


def use_tma(device: torch.device, block_n: int, page_size: int) -> bool:
    """TMA loads when a key block lies in one page, on Hopper and newer GPUs and under the interpreter."""
    return block_n <= page_size and attention.has_tma(device)


class PrefixPrefillFamily(attention.TiledAttentionFamily):
    """KernelFamily for chunked prefill over a paged KV prefix (see the module docstring)."""

    name = "prefix_prefill"
    space = SPACE
    workload_type = PrefixPrefillWorkload
    # fp32: IEEE dots; fp16/bf16: P rounded to the input type before the PV dot, the output rounded once
    tolerances = {"float32": (2e-4, 2e-4), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)}

    def default_config(self, workload: PrefixPrefillWorkload) -> Config:
        """vLLM-like: 16-token NHD pages, 64 query rows and 32-key tiles (two pages, as vLLM's prefill tile), 4 warps,
        3 stages, one pass; shrunk until the rules pass."""
        workload = _check_workload(workload)
        config = Config(PAGE_SIZE=16, LAYOUT="NHD", BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3, NUM_SPLITS=1)
        steps = (("num_stages", 1, attention.one_less), ("BLOCK_M", 16, attention.half))
        return attention.shrink_until_valid(self.space, config, workload, steps)

    def make_inputs(self, workload: PrefixPrefillWorkload, device: str, seed: int = 0) -> PrefixInputs:
        workload = _check_workload(workload)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        d, ctx = workload.head_dim, sum(workload.context_lens())

        def randn(n: int, heads: int) -> torch.Tensor:
            return attention.randn(gen, (n, heads, d), device, workload.dtype)

        q = randn(workload.total_tokens, workload.num_heads)
        k, v = randn(ctx, workload.num_kv_heads), randn(ctx, workload.num_kv_heads)
        cu_q = torch.tensor([0, *itertools.accumulate(workload.chunk_lens)], dtype=torch.int32, device=device)
        cu_ctx = torch.tensor([0, *itertools.accumulate(workload.context_lens())], dtype=torch.int64, device=device)
        prefix = torch.tensor(workload.prefix_lens, dtype=torch.int32, device=device)
        return PrefixInputs(workload, q, k, v, cu_q, cu_ctx, prefix, 1.0 / math.sqrt(d), seed)

    def prepare(self, inputs: PrefixInputs, config: Config) -> Callable[[], torch.Tensor]:
        w = _check_workload(inputs.workload)
        self.space.check(config, w)
        ctx = sum(w.context_lens())
        attention.check_shapes((("q", inputs.q, (w.total_tokens, w.num_heads, w.head_dim)),
                                ("k", inputs.k, (ctx, w.num_kv_heads, w.head_dim)),
                                ("v", inputs.v, (ctx, w.num_kv_heads, w.head_dim))))
        paged = _paged_memo(inputs, int(config["PAGE_SIZE"]), str(config["LAYOUT"]))
        return self.prepare_paged(inputs.q, paged, w, config, inputs.sm_scale)

    def prepare_paged(self, q: torch.Tensor, paged: PagedKV, w: PrefixPrefillWorkload, config: Config,
                      sm_scale: float, out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
        """The launch over an existing paged cache (what a serving loop calls: its cache, block table and chunks;
        `out`, [T, H, D] like q, where it keeps its attention output)."""
        bm, bn, splits = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["NUM_SPLITS"])
        page_size = int(config["PAGE_SIZE"])
        if paged.page_size != page_size or paged.layout != config["LAYOUT"]:
            raise ValueError(f"the cache has PAGE_SIZE={paged.page_size} LAYOUT={paged.layout}, the config "
                             f"{config}; page the cache for the config")
        pack = bool(int(self.space.value(config, "PACK_GQA")))
        table = item_table(w, work_table(w, bm, splits, pack_gqa=pack), q.device)
        o = torch.empty_like(q) if out is None else out
        t, h, d, hkv = w.total_tokens, w.num_heads, w.head_dim, w.num_kv_heads
        if splits > 1:
            part_o = torch.empty(splits, t, h, d, dtype=torch.float32, device=q.device)
            part_lse = torch.empty(splits, t, h, dtype=torch.float32, device=q.device)
        else:  # never touched: one pass writes the output directly
            part_o = torch.empty(1, 1, 1, 1, dtype=torch.float32, device=q.device)
            part_lse = torch.empty(1, 1, 1, dtype=torch.float32, device=q.device)
        rows_per_page, head_rows, head_cols = paged.geometry(hkv, d)
        k2, v2 = paged.view_2d(paged.k_cache), paged.view_2d(paged.v_cache)
        tma = use_tma(q.device, bn, page_size) and q.is_contiguous()
        if tma:
            from triton.tools.tensor_descriptor import TensorDescriptor

            # PACK_GQA gathers q's rows (GROUP heads per token) by pointers
            qx = q if pack else TensorDescriptor.from_tensor(q.reshape(t, h * d), [bm, d])
            kx = TensorDescriptor.from_tensor(k2, [bn, d])
            vx = TensorDescriptor.from_tensor(v2, [bn, d])
        else:
            qx, kx, vx = q, k2, v2
        precision = "ieee" if w.dtype == "float32" else "tf32"  # tf32 is ignored for 16-bit inputs
        args = (
            qx, kx, vx, o, part_o, part_lse, paged.block_table, *table, sm_scale * _LOG2E,
            rows_per_page, head_rows, head_cols,
            q.stride(0), q.stride(1), k2.stride(0), paged.block_table.stride(0), o.stride(0), o.stride(1),
            part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
        )
        meta = dict(GROUP=h // hkv, HEAD_DIM=d, PAGE_SIZE=page_size, BLOCK_M=bm, BLOCK_N=bn, NUM_SPLITS=splits,
                    USE_TMA=tma, DOT_PRECISION=precision, PACK_GQA=pack, num_warps=int(config["num_warps"]),
                    num_stages=int(config["num_stages"]))
        grid = (table.shape[1],)
        block_t = 16
        combine_grid = (triton.cdiv(t, block_t), h)
        combine_args = (part_o, part_lse, o, t, part_o.stride(0), part_o.stride(1), part_o.stride(2),
                        part_lse.stride(0), part_lse.stride(1), o.stride(0), o.stride(1))

        def launch() -> torch.Tensor:
            _prefix_fwd[grid](*args, **meta)
            if splits > 1:
                _combine_splits[combine_grid](*combine_args, HEAD_DIM=d, NUM_SPLITS=splits, BLOCK_T=block_t,
                                              num_warps=4)
            return o

        return launch

    def reference(self, inputs: PrefixInputs) -> torch.Tensor:
        """fp32 attention per request: chunk row i sees context keys [0, prefix + i]; kv heads repeated for GQA; in
        head groups of 8 to bound the score tensor's memory. Returned in fp32 [T, H, D]."""
        w = inputs.workload
        group = w.num_heads // w.num_kv_heads
        out = torch.empty(inputs.q.shape, dtype=torch.float32, device=inputs.q.device)
        cu_q, cu_ctx = inputs.cu_q.tolist(), inputs.cu_ctx.tolist()
        for s, p in enumerate(w.prefix_lens):
            a, b = cu_q[s], cu_q[s + 1]
            ka, kb = cu_ctx[s], cu_ctx[s + 1]
            n, m = b - a, kb - ka
            visible = torch.arange(m, device=out.device)[None, :] <= p + torch.arange(n, device=out.device)[:, None]
            for h0 in range(0, w.num_heads, 8):
                h1 = min(h0 + 8, w.num_heads)
                q = inputs.q[a:b, h0:h1].float().transpose(0, 1)  # [h, n, D]
                kv_heads = torch.arange(h0, h1, device=out.device) // group
                k = inputs.k[ka:kb].float()[:, kv_heads].transpose(0, 1)  # [h, m, D]
                v = inputs.v[ka:kb].float()[:, kv_heads].transpose(0, 1)
                out[a:b, h0:h1] = attention.reference_attend(q, k, v, inputs.sm_scale, visible).transpose(0, 1)
        return out

    def bytes_moved(self, workload: PrefixPrefillWorkload) -> float:
        """q read and o written once, every context's K and V read once per kv head."""
        b = _DTYPE_BYTES[workload.dtype]
        d = workload.head_dim
        qo = 2 * workload.total_tokens * workload.num_heads * d
        kv = 2 * sum(workload.context_lens()) * workload.num_kv_heads * d
        return float((qo + kv) * b)


FAMILY = PrefixPrefillFamily()


def bench_cases() -> list[tuple[str, PrefixPrefillWorkload]]:
    """Benchmark shapes: GQA 32/8, D=128, bf16 (Mixtral's attention); chunks of 512-2048 tokens after prefixes of
    0-32k, single requests and 4 equal ones (the sdpa_prefix anchor needs equal shapes), and one mixed batch."""
    def one(c: int, p: int, b: int = 1) -> PrefixPrefillWorkload:
        return PrefixPrefillWorkload(32, 8, 128, (c,) * b, (p,) * b)

    return [  # ordered so that a short budget still covers long and short prefixes and chunks
        ("prefix_c512_p32768", one(512, 32768)),
        ("prefix_c2048_p8192", one(2048, 8192)),
        ("prefix_c512_p0_b4", one(512, 0, 4)),
        ("prefix_c2048_p32768", one(2048, 32768)),
        ("prefix_c1024_p4096", one(1024, 4096)),
        ("prefix_c2048_p0", one(2048, 0)),
        ("prefix_c512_p2048_b4", one(512, 2048, 4)),
        ("prefix_mixed4_c2048_p8192", PrefixPrefillWorkload(32, 8, 128, (512,) * 4, (8192, 4096, 2048, 0))),
    ]


def compile_sm90(config: Config, workload: PrefixPrefillWorkload) -> dict[str, int]:
    """Compile the kernel for sm_90 without a GPU (not under TRITON_INTERPRET) and return its metadata
    {"shared": bytes, "num_warps": n, "tma": 0/1}: checks that every path builds for the H200 and the shared-memory
    rule against the real compiler on a CPU machine."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _check_workload(workload)
    bm, bn, d = int(config["BLOCK_M"]), int(config["BLOCK_N"]), workload.head_dim
    tma = int(config["BLOCK_N"]) <= int(config["PAGE_SIZE"])
    pack = bool(int(SPACE.value(config, "PACK_GQA")))
    ty = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[workload.dtype]
    if tma:
        signature = {"Q": f"*{ty}" if pack else f"tensordesc<{ty}[{bm}, {d}]>", "K": f"tensordesc<{ty}[{bn}, {d}]>",
                     "V": f"tensordesc<{ty}[{bn}, {d}]>"}
    else:
        signature = {"Q": f"*{ty}", "K": f"*{ty}", "V": f"*{ty}"}
    signature |= {"O": f"*{ty}", "PartO": "*fp32", "PartLse": "*fp32"}
    signature |= {n: "*i32" for n in ("BlockTable", *ITEM_FIELDS)}
    signature |= {"qk_scale": "fp32", "rows_per_page": "i32", "head_rows": "i32", "head_cols": "i32"}
    for n in ("stride_qt", "stride_qh", "stride_row", "stride_bt", "stride_ot", "stride_oh", "stride_ps", "stride_pt",
              "stride_ph", "stride_ls", "stride_lt"):
        signature[n] = "i32"
    constexprs = dict(GROUP=workload.num_heads // workload.num_kv_heads, HEAD_DIM=d,
                      PAGE_SIZE=int(config["PAGE_SIZE"]), BLOCK_M=bm, BLOCK_N=bn,
                      NUM_SPLITS=int(config["NUM_SPLITS"]), USE_TMA=tma,
                      DOT_PRECISION="ieee" if workload.dtype == "float32" else "tf32", PACK_GQA=pack)
    signature |= {n: "constexpr" for n in constexprs}
    names = _prefix_fwd.arg_names
    # what the launcher's specialisation gives real launches: 16-byte aligned pointers, integers divisible by 16
    aligned = ("rows_per_page", "head_rows", "head_cols")
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items()
             if t.startswith("*") or n in aligned or (n.startswith("stride") and n != "stride_bt")}
    kernel = triton.compile(
        ASTSource(_prefix_fwd, signature, constexprs, attrs),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"])),
    )
    return {"shared": int(kernel.metadata.shared), "num_warps": int(kernel.metadata.num_warps), "tma": int(tma)}
