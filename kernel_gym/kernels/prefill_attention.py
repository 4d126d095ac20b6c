"""Prefill attention: causal grouped-query FlashAttention forward over variable-length sequences packed with cu_seqlens.

Layout follows flash-attn's varlen API: q [total_tokens, num_heads, D], k and v [total_tokens, num_kv_heads, D],
cu_seqlens [num_seqs + 1] int32 prefix sums of the sequence lengths. Output o has q's shape and dtype.

Kernel design (Triton tutorial 06 on a ragged batch, with Hopper loads and an L2-aware program order):
- One program per (q tile, q head). prepare() builds a work table of (sequence, q block, q head) items. The (sequence,
  kv head) pairs are cut into L2 sections of L2_SECTION pairs; within a section tiles run heaviest first (causal work
  grows with the block index), so a ragged batch launches no empty programs, the long tail starts early, and the
  programs in flight share the K/V of a few heads in L2 instead of each streaming a different head from DRAM.
  Measured on the H200 (benchmarks/h200_run3/exp_prefill.json): sections of 8 pairs made B=4 N=2048 9% and B=1
  N=8192 4% faster than one global heaviest-first order at the same tile config.
- On sm_90+ (and under the interpreter) q, K and V are loaded through host-side TMA tensor descriptors on the 2-D views
  [T, heads * D]; elsewhere through pointers. A tile that reaches past its sequence's end reads the next sequence's
  rows (or zeros past T): the diagonal loop's causal mask removes those keys for every query row that is stored, and
  the output store stays a masked pointer store.
- q is loaded once; softmax runs in base 2 with sm_scale * log2(e) folded into one multiply; fp32 accumulation.
- The causal loop is split: key blocks entirely below the tile's first query row run without any mask (and without
  bounds checks: they are inside the sequence by construction); only the blocks that cross the diagonal apply the
  causal mask (and, on the pointer path, the sequence-end mask).

The IMPL knob (added after the Triton kernel's rows were stored; its legacy value "triton" is left out of configs)
selects the Gluon kernel of kernels/prefill_gluon.py instead: the same inputs and work table with FlashAttention-3's
Hopper schedules, sm_90 only. On the H200 it reaches 0.91-1.03 of torch SDPA where this kernel stays at 0.86-0.87
(docs/benchmarks.md).

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
from kernel_gym.kernels.attention import load_rows, online_softmax, tile_rows
from kernel_gym.kernels.space import Config, Knob, KnobSpace
from kernel_gym.kernels.workloads import PrefillWorkload

HEAD_DIMS = (64, 128)  # head dims the kernel is built and tested for (also any power of two >= 16 up to 256)
L2_SECTION = 8  # (sequence, kv head) pairs whose tiles run together (see the module docstring)
_DTYPE_BYTES = attention.DTYPE_BYTES
_LOG2E = attention.LOG2E


# ---- kernels ----------------------------------------------------------------------------------------------------


@triton.jit
def _load_kv(X, row, col, cols, stride_t, offs_d, seq_len, MASKED: tl.constexpr, USE_TMA: tl.constexpr):
    """One K or V block: a TMA descriptor block at [row, col], or pointer rows `cols` (masked past seq_len)."""
    if USE_TMA:
        x = X.load([row, col])
    else:
        x = load_rows(X + cols[:, None] * stride_t + offs_d[None, :], cols < seq_len, MASKED)
    return x


@triton.jit
def _attn_inner(
    acc, l_i, m_i, q, K, V, kv_row0, kv_col, stride_kt, stride_vt,
    offs_m, offs_d, lo, hi, seq_len, qk_scale,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, USE_TMA: tl.constexpr,
):
    """Online softmax over key blocks [lo, hi). K/V: TMA descriptors (block row kv_row0 + start_n, column kv_col) or
    base pointers of this (sequence, kv head). MASKED=False: no causal or bounds mask (caller guarantees it)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_kv(K, kv_row0 + start_n, kv_col, cols, stride_kt, offs_d, seq_len, MASKED, USE_TMA)
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            keep = offs_m[:, None] >= cols[None, :]
            qk = qk * qk_scale + tl.where(keep, 0.0, -1.0e6)
        p, m_ij, l_i, acc = online_softmax(qk, m_i, l_i, acc, qk_scale, MASKED)
        v = _load_kv(V, kv_row0 + start_n, kv_col, cols, stride_vt, offs_d, seq_len, MASKED, USE_TMA)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _prefill_fwd(
    Q, K, V, O, W_START, W_LEN, W_BLOCK, W_HEAD,
    qk_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr, PACK_GQA: tl.constexpr,
):
    """One program = work item program_id: one BLOCK_M tile of queries of one sequence, for one q head; with
    PACK_GQA, BLOCK_M // GROUP tokens of one sequence for every q head of one kv head (row r: token r // GROUP, q head
    kv_head * GROUP + r % GROUP), so each K/V block feeds GROUP heads and the causal diagonal is GROUP times finer."""
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs BLOCK_M >= 16")
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs BLOCK_N >= 16")
    tl.static_assert(HEAD_DIM >= 16, "tl.dot needs HEAD_DIM >= 16")
    w = tl.program_id(0)
    # the item carries its sequence's start and length: one memory round trip before the q and K loads, not two
    # (a table load, then cu_seqlens at the loaded index), which short sequences' short programs feel
    seq_start = tl.load(W_START + w)
    seq_len = tl.load(W_LEN + w)
    head = tl.load(W_HEAD + w)  # PACK_GQA: the kv head
    s64 = seq_start.to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    start_m, kv_head, offs_m, q_heads = tile_rows(tl.load(W_BLOCK + w), head, GROUP, BLOCK_M, PACK_GQA)
    tile_m: tl.constexpr = BLOCK_M // GROUP if PACK_GQA else BLOCK_M  # tokens per tile
    row_in_seq = offs_m < seq_len
    if USE_TMA:
        k_src, v_src, kv_row0, kv_col = K, V, seq_start, kv_head * HEAD_DIM
    else:
        k_src = K + s64 * stride_kt + kv_head * stride_kh
        v_src = V + s64 * stride_vt + kv_head * stride_vh
        kv_row0, kv_col = 0, 0
    if USE_TMA and not PACK_GQA:
        q = Q.load([seq_start + start_m, head * HEAD_DIM])
    else:  # PACK_GQA: rows of GROUP heads per token, gathered by pointers (Q is the tensor)
        q_ptrs = Q + s64 * stride_qt + offs_m[:, None] * stride_qt + q_heads[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=row_in_seq[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # Key blocks that end at or before the tile's first query row: fully visible and inside the sequence.
    full_hi = (start_m // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attn_inner(
        acc, l_i, m_i, q, k_src, v_src, kv_row0, kv_col, stride_kt, stride_vt,
        offs_m, offs_d, 0, full_hi, seq_len, qk_scale, BLOCK_N, False, USE_TMA,
    )
    # Key blocks crossing the diagonal (or the sequence end): causal (and bounds) masks.
    diag_hi = tl.minimum(start_m + tile_m, seq_len)
    acc, l_i, m_i = _attn_inner(
        acc, l_i, m_i, q, k_src, v_src, kv_row0, kv_col, stride_kt, stride_vt,
        offs_m, offs_d, full_hi, diag_hi, seq_len, qk_scale, BLOCK_N, True, USE_TMA,
    )

    acc = acc / l_i[:, None]
    o_ptrs = O + s64 * stride_ot + offs_m[:, None] * stride_ot + q_heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_in_seq[:, None])


# ---- knob space -------------------------------------------------------------------------------------------------


def _shared_memory_bytes(config: Config, workload: PrefillWorkload) -> int:
    """Per-block shared memory: the q tile plus num_stages buffers of the K and V tiles (P stays in registers as the
    wgmma A operand), plus 1 KiB of TMA barriers. Matches what Triton's sm_90 compiler allocates for the TMA path
    (multi-stage configs; checked by tests/kernels/test_prefill_attention.py via compile_sm90)."""
    b = _DTYPE_BYTES[workload.dtype]
    bm, bn, d, stages = int(config["BLOCK_M"]), int(config["BLOCK_N"]), workload.head_dim, int(config["num_stages"])
    return b * (bm * d + stages * 2 * bn * d) + 1024


def _rule_shared_memory(config: Config, workload: PrefillWorkload) -> str | None:
    need = _shared_memory_bytes(config, workload)
    return attention.shared_memory_reason(need, config, workload, ("BLOCK_M", "BLOCK_N", "num_stages"))


SPACE = KnobSpace(
    knobs=[
        Knob("BLOCK_M", (16, 32, 64, 128), "query rows per program"),
        Knob("BLOCK_N", (16, 32, 64, 128), "keys per inner-loop step"),
        Knob("num_warps", (4, 8), "warps per program"),
        Knob("num_stages", (1, 2, 3, 4), "software-pipelining depth of the K/V loads"),
    ],
    rules=[attention.rule_head_dim, _rule_shared_memory, attention.rule_tile_registers],
)

# The IMPL knob came after the Triton kernel's rows were stored: "triton" (its legacy value, left out of configs, so
# every stored config string and the Triton path's source hash stay as they were) or one of the Gluon schedules of
# kernels/prefill_gluon.py (sm_90 only); "_persistent" runs that schedule in resident programs looping over the work
# items (for short sequences). The family's space is SPACE plus IMPL and PACK_GQA (attention.PACK_GQA, Triton only).
IMPLS = ("triton", "gluon_overlap", "gluon_ws", "gluon_pingpong", "gluon_ws_persistent", "gluon_pingpong_persistent")


def _rule_gluon(config: Config, workload: PrefillWorkload) -> str | None:
    impl = GLUON_SPACE.value(config, "IMPL")
    if impl == "triton":
        return None
    bm, bn, warps, stages = (int(config[k]) for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))
    if workload.dtype not in ("bfloat16", "float16"):
        return f"IMPL={impl} multiplies 16-bit inputs on wgmma; {workload.dtype} runs on the Triton kernel (no IMPL)"
    if workload.head_dim not in HEAD_DIMS:
        return f"IMPL={impl} is built for head_dim in {HEAD_DIMS}, not {workload.head_dim}; use the Triton kernel"
    if bm not in (64, 128) or bn not in (64, 128):
        return f"IMPL={impl} needs BLOCK_M and BLOCK_N in (64, 128) (one 64-row wgmma tile per warpgroup)"
    if warps != 4 * bm // 64:
        return f"IMPL={impl} runs one warpgroup per 64 query rows: num_warps must be {4 * bm // 64} for BLOCK_M={bm}"
    if stages < 2:
        return f"IMPL={impl} needs num_stages >= 2 (the K/V ring must hold the block in use and the next one)"
    if impl.startswith("gluon_pingpong") and bm != 128:
        return f"IMPL={impl} splits a 128-row tile between two warpgroups: BLOCK_M must be 128"
    return None


def _rule_pack_gqa(config: Config, workload: PrefillWorkload) -> str | None:
    pack = int(GLUON_SPACE.value(config, "PACK_GQA"))
    impl = GLUON_SPACE.value(config, "IMPL")
    if pack and impl != "triton":
        return f"PACK_GQA=1 is a mode of the Triton kernel; IMPL={impl} runs one q head per program: use PACK_GQA=0"
    return attention.pack_gqa_reason(pack, int(config["BLOCK_M"]), workload)


GLUON_SPACE = KnobSpace(
    knobs=[*SPACE.knobs, Knob("IMPL", IMPLS, "kernel: Triton, or a Gluon schedule for sm_90", legacy="triton"),
           attention.PACK_GQA],
    rules=[*SPACE.rules, _rule_gluon, _rule_pack_gqa],
)


# ---- inputs, launch, reference ----------------------------------------------------------------------------------


@dataclass
class PrefillInputs:
    """Packed varlen inputs: q [T, H, D], k/v [T, Hkv, D], cu_seqlens [S+1] int32 on the same device."""

    workload: PrefillWorkload
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens: torch.Tensor
    sm_scale: float


def _check_workload(workload: object) -> PrefillWorkload:
    return attention.check_workload(workload, PrefillWorkload, "prefill_attention")


def work_table(seq_lens: tuple[int, ...], num_heads: int, num_kv_heads: int, block_m: int,
               section: int = L2_SECTION, pack_gqa: bool = False) -> list[tuple[int, int, int]]:
    """(sequence, q block, q head) of every program; with pack_gqa (sequence, block of block_m // group tokens, kv
    head). The (sequence, kv head) pairs are cut into sections of `section` pairs that run one after another; within
    a section tiles run heaviest first (most keys to visit), then by sequence, kv head, q block and q head, so the q
    heads of one GQA group run side by side."""
    if section < 1:
        raise ValueError(f"section must be >= 1 (sequence, kv head) pair, got {section}")
    group = num_heads // num_kv_heads
    tile = block_m // group if pack_gqa else block_m
    heads = range(num_kv_heads) if pack_gqa else range(num_heads)
    keyed = []
    for s, n in enumerate(seq_lens):
        for b in range(triton.cdiv(n, tile)):
            weight = min((b + 1) * tile, n)
            for h in heads:
                kv_head = h if pack_gqa else h // group
                pair = s * num_kv_heads + kv_head
                keyed.append(((pair // section, -weight, s, kv_head, b, h), (s, b, h)))
    keyed.sort()
    return [item for _, item in keyed]


def item_table(seq_lens: tuple[int, ...], items: list[tuple[int, int, int]], device: torch.device) -> torch.Tensor:
    """The Triton kernel's work items as int32 rows (sequence start, sequence length, block, head), one column per
    program: the start and length are looked up here, on the host, not by each program."""
    starts = [0, *itertools.accumulate(seq_lens)]
    rows = [(starts[s], seq_lens[s], b, h) for s, b, h in items]
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, 4).t().contiguous().to(device)


use_tma = attention.has_tma  # TMA descriptors on sm_90+ and under the interpreter; pointers elsewhere


# Same shape as PrefixPrefillFamily (duplicate scan): the KernelFamily protocol's attributes and methods; what the two
# share is in attention.py (TiledAttentionFamily, checks, randn, shrink_until_valid), the rest is each family's own.
class PrefillAttentionFamily(attention.TiledAttentionFamily):
    """KernelFamily for causal GQA varlen prefill attention (see the module docstring)."""

    name = "prefill_attention"
    space = SPACE
    workload_type = PrefillWorkload
    # fp32 allows for TF32 dots on the GPU; fp16/bf16 for P rounded to the input type before the PV dot
    tolerances = {"float32": (5e-3, 5e-3), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)}

    def default_config(self, workload: PrefillWorkload) -> Config:
        """Tutorial-06 heuristic: 128x64 tiles, 4 warps for D <= 64 else 8, 3 stages; halved until the rules pass."""
        workload = _check_workload(workload)
        config = Config(BLOCK_M=128, BLOCK_N=64, num_warps=4 if workload.head_dim <= 64 else 8, num_stages=3)
        steps = (("num_stages", 2, attention.one_less), ("BLOCK_N", 16, attention.half),
                 ("BLOCK_M", 16, attention.half))
        return attention.shrink_until_valid(self.space, config, workload, steps)

    def make_inputs(self, workload: PrefillWorkload, device: str, seed: int = 0) -> PrefillInputs:
        workload = _check_workload(workload)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        t, d = workload.total_tokens, workload.head_dim

        def randn(heads: int) -> torch.Tensor:
            return attention.randn(gen, (t, heads, d), device, workload.dtype)

        q, k, v = randn(workload.num_heads), randn(workload.num_kv_heads), randn(workload.num_kv_heads)
        cu = torch.tensor([0, *itertools.accumulate(workload.seq_lens)], dtype=torch.int32, device=device)
        return PrefillInputs(workload, q, k, v, cu, 1.0 / math.sqrt(d))

    def prepare(self, inputs: PrefillInputs, config: Config) -> Callable[[], torch.Tensor]:
        w = _check_workload(inputs.workload)
        self.space.check(config, w)
        q, k, v = inputs.q, inputs.k, inputs.v
        attention.check_shapes((name, x, (w.total_tokens, heads, w.head_dim))
                               for name, x, heads in (("q", q, w.num_heads), ("k", k, w.num_kv_heads),
                                                      ("v", v, w.num_kv_heads)))
        bm, bn = int(config["BLOCK_M"]), int(config["BLOCK_N"])
        pack = bool(int(self.space.value(config, "PACK_GQA"))) if "PACK_GQA" in self.space.names else False
        table = item_table(w.seq_lens, work_table(w.seq_lens, w.num_heads, w.num_kv_heads, bm, pack_gqa=pack),
                           q.device)
        o = torch.empty_like(q)
        tma = use_tma(q.device) and all(x.is_contiguous() for x in (q, k, v))  # descriptors view [T, heads * D]
        if tma:
            from triton.tools.tensor_descriptor import TensorDescriptor

            t, d = w.total_tokens, w.head_dim
            # PACK_GQA gathers q's rows (GROUP heads per token) by pointers
            qx = q if pack else TensorDescriptor.from_tensor(q.reshape(t, w.num_heads * d), [bm, d])
            kx = TensorDescriptor.from_tensor(k.reshape(t, w.num_kv_heads * d), [bn, d])
            vx = TensorDescriptor.from_tensor(v.reshape(t, w.num_kv_heads * d), [bn, d])
        else:
            qx, kx, vx = q, k, v
        grid = (table.shape[1],)
        qk_scale = inputs.sm_scale * _LOG2E
        args = (
            qx, kx, vx, o, table[0], table[1], table[2], table[3], qk_scale,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        )
        meta = dict(
            GROUP=w.num_heads // w.num_kv_heads, HEAD_DIM=w.head_dim, BLOCK_M=bm, BLOCK_N=bn, USE_TMA=tma,
            PACK_GQA=pack, num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]),
        )

        def launch() -> torch.Tensor:
            _prefill_fwd[grid](*args, **meta)
            return o

        return launch

    def reference(self, inputs: PrefillInputs) -> torch.Tensor:
        """fp32 causal attention per sequence, kv heads repeated for GQA; returned in fp32 [T, H, D]."""
        w = inputs.workload
        group = w.num_heads // w.num_kv_heads
        out = torch.empty(inputs.q.shape, dtype=torch.float32, device=inputs.q.device)
        cu = inputs.cu_seqlens.tolist()
        for s in range(len(w.seq_lens)):
            a, b = cu[s], cu[s + 1]
            q = inputs.q[a:b].float().transpose(0, 1)  # [H, n, D]
            k = inputs.k[a:b].float().repeat_interleave(group, dim=1).transpose(0, 1)
            v = inputs.v[a:b].float().repeat_interleave(group, dim=1).transpose(0, 1)
            causal = torch.ones(b - a, b - a, dtype=torch.bool, device=out.device).tril()
            out[a:b] = attention.reference_attend(q, k, v, inputs.sm_scale, causal).transpose(0, 1)
        return out

    def bytes_moved(self, workload: PrefillWorkload) -> float:
        """Bytes of q, k, v read and o written once."""
        heads = 2 * workload.num_heads + 2 * workload.num_kv_heads
        return float(workload.total_tokens * heads * workload.head_dim * _DTYPE_BYTES[workload.dtype])


class PrefillFamily(PrefillAttentionFamily):
    """The family with the IMPL knob: IMPL=gluon_* configs launch the Gluon kernel (kernels/prefill_gluon.py), the
    rest the Triton kernel, unchanged (PrefillAttentionFamily, whose source the stored rows' hash covers)."""

    space = GLUON_SPACE

    def prepare(self, inputs: PrefillInputs, config: Config) -> Callable[[], torch.Tensor]:
        impl = GLUON_SPACE.value(config, "IMPL")
        if impl == "triton":
            return super().prepare(inputs, config)
        from kernel_gym.kernels import prefill_gluon

        w = _check_workload(inputs.workload)
        GLUON_SPACE.check(config, w)
        bm, bn, stages = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["num_stages"])
        items = work_table(w.seq_lens, w.num_heads, w.num_kv_heads, bm)
        table = torch.tensor(items, dtype=torch.int32).t().contiguous().to(inputs.q.device)
        return prefill_gluon.prepare_gluon(inputs, prefill_gluon.variant_for(impl, bm, bn, stages), table, len(items))


FAMILY = PrefillFamily()

def compile_sm90(config: Config, workload: PrefillWorkload) -> dict[str, int]:
    """Compile the kernel for sm_90 without a GPU (not under TRITON_INTERPRET) and return its metadata
    {"shared": bytes, "num_warps": n}: checks the shared-memory rule against the real compiler on a CPU machine."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _check_workload(workload)
    bm, bn, d = int(config["BLOCK_M"]), int(config["BLOCK_N"]), workload.head_dim
    ty = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[workload.dtype]
    pack = bool(int(GLUON_SPACE.value(config, "PACK_GQA")))
    signature = {"Q": f"*{ty}" if pack else f"tensordesc<{ty}[{bm}, {d}]>", "K": f"tensordesc<{ty}[{bn}, {d}]>",
                 "V": f"tensordesc<{ty}[{bn}, {d}]>", "O": f"*{ty}"}
    signature |= {n: "*i32" for n in ("W_START", "W_LEN", "W_BLOCK", "W_HEAD")}
    signature["qk_scale"] = "fp32"
    for n in ("q", "k", "v", "o"):
        signature |= {f"stride_{n}t": "i32", f"stride_{n}h": "i32"}
    constexprs = dict(GROUP=workload.num_heads // workload.num_kv_heads, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn,
                      USE_TMA=True, PACK_GQA=pack)
    signature |= {n: "constexpr" for n in constexprs}
    names = _prefill_fwd.arg_names
    # what the launcher's specialisation gives real launches: 16-byte aligned pointers, strides divisible by 16
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items()
             if t.startswith("*") or (n.startswith("stride") and n.endswith("t"))}
    kernel = triton.compile(
        ASTSource(_prefill_fwd, signature, constexprs, attrs),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"])),
    )
    return {"shared": int(kernel.metadata.shared), "num_warps": int(kernel.metadata.num_warps)}


def bench_cases() -> list[tuple[str, PrefillWorkload]]:
    """Benchmark shapes (compare against torch SDPA on [B, H, N, D], causal); the last four are many short sequences
    (issue 29), where one sequence gives few query tiles per head."""
    return [
        ("prefill_b4_h32_n2048_d128", PrefillWorkload(32, 32, 128, (2048,) * 4)),
        ("prefill_b1_h32_n8192_d128", PrefillWorkload(32, 32, 128, (8192,))),
        ("prefill_b4_h32kv8_n2048_d128", PrefillWorkload(32, 8, 128, (2048,) * 4)),
        ("prefill_b16_h32kv8_n512_d128", PrefillWorkload(32, 8, 128, (512,) * 16)),
        ("prefill_b64_h32kv8_n128_d128", PrefillWorkload(32, 8, 128, (128,) * 64)),
        ("prefill_b16_h32kv4_n512_d128", PrefillWorkload(32, 4, 128, (512,) * 16)),
        ("prefill_b64_h32kv4_n128_d128", PrefillWorkload(32, 4, 128, (128,) * 64)),
    ]
