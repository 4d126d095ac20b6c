"""What the attention families (decode_attention, prefill_attention, prefix_prefill) share: dtype tables, the rules
and input checks they apply alike, the paged KV cache's page shuffle, and the masked K/V row load of their kernels.

One copy so the three cannot drift apart: a rule's message, the page order of a seed or a masked load changed here
changes all three families at once (their golden outputs and the sm_90 code of their kernels stay as they were when
this module was split out of them).

Imports only torch, triton and the standard library: this module runs on the GPU machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
import triton
import triton.language as tl

from kernel_gym.kernels.space import SHARED_MEMORY_LIMIT, Config, Knob, KnobSpace
from kernel_gym.kernels.workloads import MAX_HEAD_DIM, MIN_HEAD_DIM, padded_head_dim

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
LOG2E = 1.4426950408889634  # softmax runs in base 2: sm_scale * LOG2E folds the change of base into one multiply
LAYOUTS = ("NHD", "HND")  # paged KV cache: NHD = [pages, page, kv_heads, D]; HND = [pages, kv_heads, page, D]
MAX_STATE_PER_THREAD = 160  # fp32 acc + score elements per thread; above it ptxas (sm_90) spills >100 B per thread


# ---- kernels ----------------------------------------------------------------------------------------------------


@triton.jit
def load_rows(ptrs, in_range, MASKED: tl.constexpr):
    """A K/V tile through pointers. MASKED: rows outside in_range read as 0 (past a sequence's or context's end);
    otherwise the caller guarantees every row is inside and the load has no mask."""
    if MASKED:
        rows = tl.load(ptrs, mask=in_range[:, None], other=0.0)
    else:
        rows = tl.load(ptrs)
    return rows


@triton.jit
def online_softmax(qk, m_i, l_i, acc, qk_scale, SCALED: tl.constexpr):
    """One key block of base-2 online softmax over a [rows, keys] block: qk is the raw QK^T block, or (SCALED) one
    already scaled by qk_scale and masked. Returns p (unnormalised), the new row max, l_i and acc rescaled to it."""
    if SCALED:
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_ij[:, None]
    else:
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_ij[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_ij)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return p, m_ij, l_i, acc


@triton.jit
def block_row(bt_row, tok0, kv_len, rows_per_page, PAGE_SIZE: tl.constexpr):
    """Row of token tok0 in a paged cache's 2-D view (PagedKV.view_2d) when its key block lies in one page: physical
    page * rows_per_page + slot (scalar, int64). A block-table read past the context's end is masked (page 0), so
    looking one block ahead is always safe. The row a TMA load of the block starts at (prefix prefill, decode)."""
    page = tl.load(bt_row + tok0 // PAGE_SIZE, mask=tok0 < kv_len, other=0).to(tl.int64)
    return page * rows_per_page + tok0 % PAGE_SIZE


# ---- rules and checks -------------------------------------------------------------------------------------------


def rule_head_dim(config: Config, workload: Any) -> str | None:
    """head_dim must be a power of two in [16, 256]. 80 and 96 (Phi, Falcon, ...) are refused, not rounded up inside
    the kernels: their bodies index the head with tl.arange(0, HEAD_DIM) and tile it whole through TMA boxes and
    tl.dot, so a padded head needs padded tensors. The message says how to pad."""
    d = workload.head_dim
    padded = padded_head_dim(d)
    if padded == d:
        return None
    if padded is None:
        return (f"head_dim {d} is not supported: it must be a power of two in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}] "
                "(tl.arange and tl.dot tile shapes; a larger head's tiles outgrow shared memory and registers); "
                "these kernels cannot run it: use another attention implementation (torch SDPA) for this model")
    return (f"head_dim {d} is not supported: it must be a power of two in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}] "
            f"(tl.arange and tl.dot tile shapes); zero-pad q, k and v to head_dim {padded}, keep "
            f"sm_scale = 1/sqrt({d}) and drop the padded output columns (or tune on the head_dim {padded} workload)")


def shared_memory_reason(need: int, config: Config, workload: Any, shown: Sequence[str]) -> str | None:
    """Why an estimate of `need` bytes per block is refused (None when it fits), naming the `shown` knobs."""
    if need > SHARED_MEMORY_LIMIT:
        knobs = ", ".join(f"{k}={config[k]}" for k in shown)
        return (
            f"shared memory estimate {need} B exceeds the H200's {SHARED_MEMORY_LIMIT} B per block "
            f"({knobs}, head_dim={workload.head_dim}, {workload.dtype}); lower num_stages or BLOCK_N"
        )
    return None


def rule_tile_registers(config: Config, workload: Any) -> str | None:
    """A BLOCK_M x BLOCK_N tile's fp32 accumulator and scores per thread (prefill and prefix prefill)."""
    bm, bn, warps = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["num_warps"])
    per_thread = bm * (workload.head_dim + bn) // (32 * warps)
    if per_thread > MAX_STATE_PER_THREAD:
        return (
            f"register pressure: {per_thread} fp32 accumulator+score elements per thread "
            f"(BLOCK_M*(head_dim+BLOCK_N)/(32*num_warps)) exceeds {MAX_STATE_PER_THREAD}; "
            "use more warps or smaller blocks"
        )
    return None


# Prefill and prefix prefill: PACK_GQA=1 runs the q heads that share a kv head in one program, a tile's BLOCK_M rows
# being BLOCK_M / group tokens x the group's heads. Each K/V block then feeds the whole group (read once, not group
# times) and the causal diagonal is cut group times finer, which is what short sequences lack (flash-attention 3's
# PackGQA). A knob added after rows were stored: 0, the kernel before it, is its legacy value.
PACK_GQA = Knob("PACK_GQA", (0, 1), "1: one program per kv head, its q heads packed into the tile's rows", legacy=0)


@triton.jit
def tile_rows(block, head, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, PACK_GQA: tl.constexpr):
    """A prefill work item's query rows: (first token, kv head, each row's token, each row's q head). `block` is the
    item's query block, `head` its q head, or with PACK_GQA its kv head, whose GROUP q heads share the tile (row r:
    token r // GROUP, q head kv_head * GROUP + r % GROUP; BLOCK_M // GROUP tokens a tile)."""
    if PACK_GQA:
        start_m = block * (BLOCK_M // GROUP)
        kv_head = head
        rows = tl.arange(0, BLOCK_M)
        offs_m = start_m + rows // GROUP
        q_heads = head * GROUP + rows % GROUP
    else:
        start_m = block * BLOCK_M
        kv_head = head // GROUP
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_heads = tl.zeros([BLOCK_M], dtype=tl.int32) + head
    return start_m, kv_head, offs_m, q_heads


def pack_gqa_reason(pack: int, block_m: int, workload: Any) -> str | None:
    """Why PACK_GQA=pack cannot run BLOCK_M=block_m on this workload (None when it can)."""
    if not int(pack):
        return None
    group = workload.num_heads // workload.num_kv_heads
    if group == 1:
        return ("PACK_GQA=1 packs the q heads that share a kv head into one tile; this workload has one q head per kv "
                "head: use PACK_GQA=0 (leave it out)")
    if group & (group - 1):  # BLOCK_M is a power of two: no tile holds whole groups of 3, 5, 6, 7, ...
        return (f"PACK_GQA=1 gives each token {group} rows (its GQA group's q heads) and BLOCK_M is a power of two, "
                f"so no tile holds whole groups of {group}: use PACK_GQA=0 (leave it out) for this GQA group")
    if block_m % group:
        return (f"PACK_GQA=1 gives each token {group} rows (its GQA group's q heads): BLOCK_M={block_m} must be a "
                f"multiple of {group}")
    return None


def check_workload(workload: object, workload_type: type, family: str) -> Any:
    """The workload, if it is the family's type with a head_dim its kernels are built for; raises otherwise."""
    if not isinstance(workload, workload_type):
        raise TypeError(f"{family} needs a {workload_type.__name__}, got {type(workload).__name__}: {workload!r}")
    reason = rule_head_dim(Config(), workload)
    if reason:
        raise ValueError(reason)
    return workload


def check_shapes(tensors: Iterable[tuple[str, torch.Tensor, tuple[int, ...]]]) -> None:
    """Each (name, tensor, shape) must have that shape and a contiguous last dim, as make_inputs builds them."""
    for name, x, shape in tensors:
        if tuple(x.shape) != shape or x.stride(-1) != 1:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)} strides {x.stride()}; expected {shape} with a contiguous "
                "last dim (use make_inputs)"
            )


def reference_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float,
                     visible: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T * sm_scale, keys not visible left out) v per head, in q's dtype: q [h, n, D], k and v
    [h, m, D], visible [n, m] bool (the references' core)."""
    scores = (q @ k.transpose(1, 2)) * sm_scale
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def tolerance(table: dict[str, tuple[float, float]], dtype: str) -> tuple[float, float]:
    """The family's (atol, rtol) of a dtype, from its table."""
    if dtype not in table:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(table)}")
    return table[dtype]


def has_tma(device: torch.device) -> bool:
    """TMA descriptors on Hopper and newer GPUs and under the interpreter (which emulates them); pointers elsewhere."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 9
    return True


def shrink_until_valid(space: KnobSpace, config: Config, workload: Any,
                       steps: Sequence[tuple[str, int, Callable[[int], int]]]) -> Config:
    """A default config made valid: while the space refuses it, the first knob of `steps` (knob, floor, step) still
    above its floor takes one step down; raises with the space's reason when no knob can."""
    while not space.is_valid(config, workload):
        for knob, floor, step in steps:
            if int(config[knob]) > floor:
                config = config.replace(**{knob: step(int(config[knob]))})
                break
        else:
            space.check(config, workload)  # raises with the reason
    return config


def one_less(n: int) -> int:
    return n - 1


def half(n: int) -> int:
    return n // 2


class TiledAttentionFamily:
    """The KernelFamily methods prefill and prefix prefill share; a subclass sets `tolerances`, its (atol, rtol) per
    dtype."""

    tolerances: dict[str, tuple[float, float]] = {}

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return tolerance(self.tolerances, dtype)

    def flops(self, workload: Any) -> float:
        """4 * attended (query, key) pairs * D * H: QK^T and PV, 2 flops per multiply-add, visible pairs only (as
        FlashAttention counts causal attention)."""
        return 4.0 * workload.causal_pairs() * workload.head_dim * workload.num_heads


# ---- inputs and the paged cache ---------------------------------------------------------------------------------


def randn(gen: torch.Generator, shape: tuple[int, ...], device: str, dtype: str, scale: float = 1.0) -> torch.Tensor:
    """Normal values (times scale) drawn in fp32 on the CPU generator, so the same on every device, then cast."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32)
    if scale != 1.0:
        x = x * scale
    return x.to(device=device, dtype=TORCH_DTYPES[dtype])


@dataclass(eq=False)
class PagedKV:
    """K/V in physical pages of one PAGE_SIZE and LAYOUT with their block table: what decode attention and prefix
    prefill read (decode_attention.PagedCache is this class; a serving stack's cache serves both)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor  # [S, max_pages] int32; entries past a context's last page are 0 and never read
    page_size: int
    layout: str

    def strides(self) -> tuple[int, int, int]:
        """(page, slot, kv head) element strides of the cache; the head-dim stride is 1 (decode's pointers)."""
        c = self.k_cache
        if self.layout == "NHD":
            return c.stride(0), c.stride(1), c.stride(2)
        return c.stride(0), c.stride(2), c.stride(1)

    def view_2d(self, x: torch.Tensor) -> torch.Tensor:
        """The [rows, cols] view prefix prefill indexes: NHD [pages * page, Hkv * D]; HND [pages * Hkv * page, D]."""
        if self.layout == "NHD":
            return x.view(x.shape[0] * x.shape[1], x.shape[2] * x.shape[3])
        return x.view(x.shape[0] * x.shape[1] * x.shape[2], x.shape[3])

    def geometry(self, num_kv_heads: int, head_dim: int) -> tuple[int, int, int]:
        """(rows per page, rows per kv head within a page, columns per kv head) of view_2d."""
        if self.layout == "NHD":
            return self.page_size, 0, head_dim
        return num_kv_heads * self.page_size, self.page_size, 0


def page_kv(k: torch.Tensor, v: torch.Tensor, context_lens: Sequence[int], page_size: int, layout: str,
            seed: int) -> PagedKV:
    """Scatter contiguous per-sequence K/V ([sum(context_lens), Hkv, D]) into shuffled physical pages (plus ~1/8 spare
    pages no sequence uses, in a seeded order, so the block table is non-contiguous); slots past a context's end are
    NaN, so a missing mask shows as NaN, never as luck."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not supported; use one of {LAYOUTS}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    device = k.device
    n_seq = len(context_lens)
    pages_per_seq = [max(1, triton.cdiv(n, page_size)) for n in context_lens]
    used = sum(pages_per_seq)
    num_pages = used + max(1, used // 8)
    gen = torch.Generator(device="cpu").manual_seed(seed * 1009 + page_size)
    physical = torch.randperm(num_pages, generator=gen)[:used].to(torch.int32)
    block_table = torch.zeros(n_seq, max(pages_per_seq), dtype=torch.int32)
    for s, chunk in enumerate(torch.split(physical, pages_per_seq)):
        block_table[s, : len(chunk)] = chunk
    block_table = block_table.to(device)
    lens_t = torch.tensor(list(context_lens), dtype=torch.int64, device=device)
    starts = torch.cumsum(lens_t, 0) - lens_t
    seq_of_token = torch.repeat_interleave(torch.arange(n_seq, device=device), lens_t)
    pos = torch.arange(int(lens_t.sum()), device=device) - starts[seq_of_token]
    page = block_table[seq_of_token, pos // page_size].long()
    slot = pos % page_size
    hkv, d = k.shape[1], k.shape[2]

    def paged(x: torch.Tensor) -> torch.Tensor:
        cache = torch.full((num_pages, page_size, hkv, d), float("nan"), dtype=x.dtype, device=device)
        cache[page, slot] = x
        return cache if layout == "NHD" else cache.permute(0, 2, 1, 3).contiguous()

    return PagedKV(paged(k), paged(v), block_table, page_size, layout)


def reuse_last(memo: list, inputs: object, page_size: int, layout: str, build: Callable[[], Any]) -> Any:
    """build(), reused while consecutive calls share inputs, page size and layout (collection orders a workload's
    configs by PAGE_SIZE and LAYOUT, so paging runs once per layout, not once per config). `memo` holds one entry
    [(inputs, page_size, layout, value)], so memory stays bounded."""
    if memo and memo[0][0] is inputs and memo[0][1:3] == (page_size, layout):
        return memo[0][3]
    memo.clear()
    value = build()
    memo.append((inputs, page_size, layout, value))
    return value
