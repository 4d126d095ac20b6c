"""The fused MoE layer in vLLM's published design, with exactly vLLM's tunables: the kernel vLLM's config files tune.

kernel_gym's own `fused_moe` family has knobs vLLM lacks (split-K, epilogue fusions, TMA loads), so its block sizes
are tuned for another kernel and cannot be exported to vLLM as they are (issue 15: such an export ran at 0.935x of
vLLM's shipped H200 table inside vLLM). This family is the kernel those files configure, so configs measured here
are what an exported vLLM / SGLang table should contain.

Modelled release: vLLM 0.33.0 on Hopper with bf16 experts (its unquantised MoE tries this Triton kernel first,
`fused_moe/oracle/unquantized.py`; SPLIT_K is forced to 1, SWAP_AB is fp8-only, the tensor-descriptor path is
Blackwell/XPU-only, so none of them is a knob here). SGLang 0.5.23 runs the same kernel design with the alignment
always on. Which entry each engine version runs is in kernel_gym/kernels/vllm_tables.py.

Design (vLLM's fused_moe, re-implemented; vllm/model_executor/layers/fused_moe/fused_moe.py and
moe_align_block_size):
1. alignment: the M * top_k (token, expert) slots are sorted by expert and each expert's segment is padded to a
   multiple of BLOCK_SIZE_M; outputs sorted_token_ids (slot ids, padding = M * top_k), expert_ids (one per row block)
   and num_tokens_post_padded (a 1-element device tensor). Sizes are the static upper bound
   min(M*top_k + E*(BLOCK_SIZE_M - 1), M*top_k*BLOCK_SIZE_M), so nothing waits on the host; row blocks past
   num_tokens_post_padded exit at once. vLLM runs a CUDA op here; this is torch ops, timed as part of the call as
   vLLM's is;
2. one Triton grouped GEMM over the sorted slots with GROUP_SIZE_M program swizzle, used twice:
   x @ w13[e].T -> [M*top_k, 2N] (gate then up), and act @ w2[e].T -> [M*top_k, H] with MUL_ROUTED_WEIGHT;
3. silu(gate) * up between them (one elementwise Triton kernel, as vLLM's silu_and_mul);
4. the top-k sum over each token's slots (torch.sum, as vLLM's moe_sum).
Small batches (vLLM 0.33, `_prepare_expert_assignment`): when M * top_k * 4 <= E and there is no expert map, vLLM
skips step 1 and runs one (token, expert) slot per row block (`prepare_small_batch`; `prepare_engine` picks the path
the engine runs). `prepare` itself stays the aligned path at every M: rows timed on the small-batch path carry their own
store key, `small_batch_store_key()`.
Routing (softmax + top-k) runs before the timed closure, as in `fused_moe` (vLLM's topk is a separate op too).

M is a runtime argument of every kernel (EM and num_valid_tokens are not specialised), so one compile per config and
shape serves every batch size.

Knobs: BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages with the values of vLLM's tuner,
plus BLOCK_SIZE_K 32 and GROUP_SIZE_M 8 (the values of older vLLM's and SGLang's default config). Rules: shared memory
(num_stages - 1 K steps of A and B tiles in flight vs SHARED_MEMORY_LIMIT) and registers (fp32 accumulators per
thread). Every entry of vLLM 0.33's and SGLang 0.5.23's shipped H200 tables is valid (tests/kernels/test_vllm_moe.py).

Imports only torch, triton and the standard library: this module runs on the GPU machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from kernel_gym.kernels import fused_moe as _fm
from kernel_gym.kernels import profiles as _profiles
from kernel_gym.kernels import vllm_tables
from kernel_gym.kernels.space import SHARED_MEMORY_LIMIT, Config, Knob, KnobSpace
from kernel_gym.kernels.workloads import MoEWorkload

MAX_ACC_PER_THREAD = 128  # as fused_moe: more fp32 accumulators per thread spill
SILU_BLOCK = 1024
DEFAULT_DEVICE = "NVIDIA H200"


# ---- Triton kernels ------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["EM", "num_valid_tokens"])
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_padded_ptr,
    N, K, EM, num_valid_tokens,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    TOP_K: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
):
    """C[slot] = A[slot // TOP_K] @ B[expert of the slot's row block].T (times the slot's routing weight).

    A: [rows, K]; B: [E, N, K]; C: [num_valid_tokens, N]. Row block pid_m covers sorted positions
    [pid_m * BLOCK_SIZE_M, +BLOCK_SIZE_M); blocks at or past num_tokens_post_padded do nothing."""
    pid_m, pid_n = _fm._tile_ids(tl.program_id(0), tl.cdiv(EM, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N), GROUP_SIZE_M)
    if pid_m * BLOCK_SIZE_M >= tl.load(num_post_padded_ptr):
        return
    tokens = tl.load(sorted_ids_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M))
    token_mask = tokens < num_valid_tokens
    a_rows = tl.where(token_mask, tokens // TOP_K, 0).to(tl.int64)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    _gemm_block(a_ptr, b_ptr, c_ptr, topk_weights_ptr, tokens, token_mask, a_rows, expert, pid_n, N, K,
                stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
                MUL_ROUTED_WEIGHT, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)


@triton.jit
def _gemm_block(a_ptr, b_ptr, c_ptr, topk_weights_ptr, tokens, token_mask, a_rows, expert, pid_n, N, K,
                stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
                MUL_ROUTED_WEIGHT: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                BLOCK_SIZE_K: tl.constexpr):
    """What both row-block assignments run once a block's slots (`tokens`, masked past the valid ones), A rows and
    expert are known: C[tokens, pid_n's columns] = A[a_rows] @ B[expert].T (times the routing weight)."""
    offs_bn = ((pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    if MUL_ROUTED_WEIGHT:
        w = tl.load(topk_weights_ptr + tokens, mask=token_mask, other=0.0)
        acc = acc * w[:, None]
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_rows = tl.where(token_mask, tokens, 0).to(tl.int64)
    c_ptrs = c_ptr + c_rows[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=token_mask[:, None] & (offs_cn[None, :] < N))


@triton.jit(do_not_specialize=["numel"])
def _silu_and_mul_kernel(h_ptr, act_ptr, numel, INTER, BLOCK: tl.constexpr):
    """act[s, i] = silu(h[s, i]) * h[s, INTER + i] over the flattened contiguous act (fp32 math)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    h_offs = offs + (offs // INTER) * INTER
    g = tl.load(h_ptr + h_offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + h_offs + INTER, mask=mask, other=0.0).to(tl.float32)
    tl.store(act_ptr + offs, (g / (1.0 + tl.exp(-g)) * u).to(act_ptr.dtype.element_ty), mask=mask)


# ---- alignment (moe_align_block_size) --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlignedSlots:
    sorted_token_ids: torch.Tensor  # int32 [max_padded]: slot ids sorted by expert, padding = num slots
    expert_ids: torch.Tensor  # int32 [cdiv(max_padded, block_m)]: expert of each row block (past the end: clamped)
    num_tokens_post_padded: torch.Tensor  # int32 [1] on the device


def max_padded_slots(num_slots: int, num_experts: int, block_m: int) -> int:
    """Static size of sorted_token_ids: every expert's segment padded, but never more than one block per slot."""
    return min(num_slots + num_experts * (block_m - 1), num_slots * block_m)


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedSlots:
    """Sort the slots by expert and pad each expert's segment to a multiple of block_m, with device-side ops only
    (no host synchronisation: the sizes are static upper bounds)."""
    flat = topk_ids.flatten().to(torch.int64)
    n = flat.numel()
    dev = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    seg_end = torch.cumsum(padded, 0)
    seg_start = seg_end - padded
    order = torch.argsort(flat, stable=True)
    experts_sorted = flat[order]
    rank = torch.arange(n, device=dev) - (torch.cumsum(counts, 0) - counts)[experts_sorted]
    max_padded = max_padded_slots(n, num_experts, block_m)
    sorted_ids = torch.full((max_padded,), n, dtype=torch.int32, device=dev)
    sorted_ids[seg_start[experts_sorted] + rank] = order.to(torch.int32)
    blocks = torch.arange(triton.cdiv(max_padded, block_m), device=dev)
    expert_ids = torch.searchsorted(seg_end // block_m, blocks, right=True).clamp_(max=num_experts - 1)
    return AlignedSlots(sorted_ids, expert_ids.to(torch.int32), seg_end[-1:].to(torch.int32))


# ---- knob space ----------------------------------------------------------------------------------------------------

KNOBS = (
    Knob("BLOCK_SIZE_M", (16, 32, 64, 128, 256), "sorted slots per tile; each expert's segment is padded to it"),
    Knob("BLOCK_SIZE_N", (32, 64, 128, 256), "output columns per tile"),
    Knob("BLOCK_SIZE_K", (32, 64, 128, 256), "reduction step (32: vLLM's default config only)"),
    Knob("GROUP_SIZE_M", (1, 8, 16, 32, 64), "row blocks that sweep the N tiles together (8: vLLM's default only)"),
    Knob("num_warps", (4, 8), "warps per program"),
    Knob("num_stages", (2, 3, 4, 5), "software pipeline depth"),
)


def _dtype_bytes(workload: MoEWorkload) -> int:
    return 4 if workload.dtype == "float32" else 2


def smem_bytes(config: Config, workload: MoEWorkload) -> int:
    """num_stages x one K step's A tile (BLOCK_SIZE_M x BLOCK_SIZE_K) and B tile (BLOCK_SIZE_K x BLOCK_SIZE_N)."""
    bk = int(config["BLOCK_SIZE_K"])
    per_stage = (int(config["BLOCK_SIZE_M"]) * bk + bk * int(config["BLOCK_SIZE_N"])) * _dtype_bytes(workload)
    return int(config["num_stages"]) * per_stage


def _rule_registers(config: Config, workload: MoEWorkload) -> str | None:
    per_thread = int(config["BLOCK_SIZE_M"]) * int(config["BLOCK_SIZE_N"]) // (32 * int(config["num_warps"]))
    if per_thread > MAX_ACC_PER_THREAD:
        return f"{per_thread} fp32 accumulators per thread exceed {MAX_ACC_PER_THREAD} (more warps or smaller tiles)"
    return None


def _rule_smem_in_flight(config: Config, workload: MoEWorkload) -> str | None:
    """Shared memory of the K steps Triton's pipeliner keeps in flight: num_stages - 1 of them from 4 stages on,
    all of them below. Both ends are measured on the H200: the full num_stages estimate, smem_bytes, rejects an entry
    vLLM 0.33 ships and runs (E=16, N=2048, M=128, 16/256/128 with 4 stages: 3 steps fit), and 256/64/128 with 3
    stages needs all 3 (245,760 B, refused by the compiler). A config this admits and the compiler refuses is
    recorded as a compile failure, never timed."""
    stages = int(config["num_stages"])
    steps = stages - 1 if stages >= 4 else stages
    need = smem_bytes(config, workload) // stages * steps
    if need > SHARED_MEMORY_LIMIT:
        return (f"shared memory estimate {need} B for {steps} K steps in flight exceeds "
                f"{SHARED_MEMORY_LIMIT} B per block (fewer stages or tiles)")
    return None


# The space's rules: the in-flight shared-memory rule (every stored row was measured with a config the full
# num_stages estimate admits, which the in-flight rule admits too) and the register rule.
SPACE = KnobSpace(KNOBS, rules=(_rule_smem_in_flight, _rule_registers))


def to_config(entry: dict[str, int]) -> Config:
    """A vLLM config-file entry (extra keys such as SPLIT_K are ignored by vLLM's Triton path) as a Config."""
    return Config({k: int(entry[k]) for k in vllm_tables.CONFIG_KEYS})


def to_entry(config: Config) -> dict[str, int]:
    """A Config as a vLLM / SGLang config-file entry, in the files' key order."""
    return {k: int(config[k]) for k in vllm_tables.CONFIG_KEYS}


def vllm_engine_config(num_experts: int, n: int, m: int, dtype: str = "bfloat16",
                       device_name: str = DEFAULT_DEVICE, engine: str = vllm_tables.DEFAULT_ENGINE) -> Config:
    """The config the engine (default vllm_tables.DEFAULT_ENGINE) runs for M tokens on this shape and device without a
    user folder: its shipped table's nearest M entry, else its default rule (kernel_gym.kernels.vllm_tables)."""
    return to_config(vllm_tables.engine_entry(num_experts, n, m, dtype, device_name, engine)[0])


def default_config(workload: MoEWorkload, device_name: str = DEFAULT_DEVICE,
                   engine: str = vllm_tables.DEFAULT_ENGINE) -> Config:
    """What a user of the engine release (default vllm_tables.DEFAULT_ENGINE) gets on the H200 (kernel_gym's target
    device): the shipped table, else the default rule."""
    wl = _check_workload(workload)
    return vllm_engine_config(wl.num_experts, wl.intermediate, wl.num_tokens, wl.dtype, device_name, engine)


def neighbours(config: Config, workload: MoEWorkload) -> list[Config]:
    """The valid configs one step away in one knob (the knobs' value order)."""
    out = []
    for knob in SPACE.knobs:
        i = knob.values.index(config[knob.name])
        for j in (i - 1, i + 1):
            if 0 <= j < len(knob.values):
                c = config.replace(**{knob.name: knob.values[j]})
                if SPACE.is_valid(c, workload):
                    out.append(c)
    return out


# ---- family ----------------------------------------------------------------------------------------------------------


def _check_workload(workload: object) -> MoEWorkload:
    if not isinstance(workload, MoEWorkload):
        raise TypeError(f"vllm_fused_moe needs a MoEWorkload, got {type(workload).__name__}; pass MoEWorkload(...)")
    return workload


def _routed(inputs: _fm.MoEInputs, config: Config) -> tuple[MoEWorkload, torch.Tensor, torch.Tensor]:
    """Checks and routing, before either path's closure: (workload, flat routing weights, top-k expert ids)."""
    wl = _check_workload(inputs.workload)
    SPACE.check(config, wl)
    weights, ids = _fm.route(inputs.router_logits.to(inputs.x.device), wl.top_k)
    return wl, weights.flatten().contiguous(), ids


def _layer(inputs: _fm.MoEInputs, config: Config, gemm: Any, em: int, flat_weights: torch.Tensor,
           row_blocks: Callable[[], tuple]) -> Callable[[], torch.Tensor]:
    """The closure both paths time, around their GEMM kernel `gemm`: w13 GEMM, silu-and-mul, w2 GEMM, top-k sum, on
    workspaces that start NaN-filled (a kernel that skips an element cannot pass the reference check). em: padded
    slots the grids cover; row_blocks(), called first in the closure: the kernel's row-block arguments."""
    wl = inputs.workload
    bm, bn, bk = int(config["BLOCK_SIZE_M"]), int(config["BLOCK_SIZE_N"]), int(config["BLOCK_SIZE_K"])
    meta = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=int(config["GROUP_SIZE_M"]),
                num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))
    x, w1, w2 = inputs.x, inputs.w1, inputs.w2
    m, hidden, inter, top_k = wl.num_tokens, wl.hidden, wl.intermediate, wl.top_k
    dev, n_slots = x.device, m * top_k
    nan = float("nan")
    cache1 = torch.full((n_slots, 2 * inter), nan, dtype=x.dtype, device=dev)
    cache2 = torch.full((n_slots, inter), nan, dtype=x.dtype, device=dev)
    cache3 = torch.full((n_slots, hidden), nan, dtype=x.dtype, device=dev)
    out = torch.full((m, hidden), nan, dtype=x.dtype, device=dev)
    grid1 = (triton.cdiv(em, bm) * triton.cdiv(2 * inter, bn),)
    grid2 = (triton.cdiv(em, bm) * triton.cdiv(hidden, bn),)
    grid_act = (triton.cdiv(n_slots * inter, SILU_BLOCK),)

    def launch() -> torch.Tensor:
        blocks = row_blocks()
        gemm[grid1](
            x, w1, cache1, flat_weights, *blocks, 2 * inter, hidden, em, n_slots,
            x.stride(0), x.stride(1), w1.stride(0), w1.stride(1), w1.stride(2), cache1.stride(0), cache1.stride(1),
            TOP_K=top_k, MUL_ROUTED_WEIGHT=False, **meta,
        )
        _silu_and_mul_kernel[grid_act](cache1, cache2, n_slots * inter, inter, BLOCK=SILU_BLOCK)
        gemm[grid2](
            cache2, w2, cache3, flat_weights, *blocks, hidden, inter, em, n_slots,
            cache2.stride(0), cache2.stride(1), w2.stride(0), w2.stride(1), w2.stride(2), cache3.stride(0),
            cache3.stride(1),
            TOP_K=1, MUL_ROUTED_WEIGHT=True, **meta,
        )
        torch.sum(cache3.view(m, top_k, hidden), dim=1, out=out)
        return out

    return launch


def prepare(inputs: _fm.MoEInputs, config: Config, align_in_closure: bool = True) -> Callable[[], torch.Tensor]:
    """Routing and workspaces (not timed); returns the closure: alignment, w13 GEMM, silu-and-mul, w2 GEMM, top-k sum
    (`_layer`). align_in_closure=False aligns once here instead (prepare_kernels_only)."""
    wl, flat_weights, ids = _routed(inputs, config)
    e, bm = wl.num_experts, int(config["BLOCK_SIZE_M"])
    aligned = None if align_in_closure else moe_align_block_size(ids, e, bm)

    def row_blocks() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        al = moe_align_block_size(ids, e, bm) if aligned is None else aligned
        return al.sorted_token_ids, al.expert_ids, al.num_tokens_post_padded

    em = max_padded_slots(wl.num_tokens * wl.top_k, e, bm)
    return _layer(inputs, config, _moe_gemm_kernel, em, flat_weights, row_blocks)


def prepare_kernels_only(inputs: _fm.MoEInputs, config: Config) -> Callable[[], torch.Tensor]:
    """prepare() with the alignment done once before the closure: the timing scope of kernel_gym's own fused_moe
    (whose alignment runs in its prepare), so that the two kernels are compared on the same work. Used only for that
    comparison (benchmarks/vllm_export/run.py); configs are still measured and exported with prepare()."""
    return prepare(inputs, config, align_in_closure=False)


# ---- vLLM 0.33's small-batch path (no alignment) ---------------------------------------------------------------------
# Rows timed on this path are stored under small_batch_store_key(), never under store_key(): the two paths time
# different launches (tests/kernels/test_vllm_moe.py pins both keys).
SMALL_BATCH_KEY = "small-batch-v1"


@triton.jit(do_not_specialize=["EM", "num_valid_tokens"])
def _moe_gemm_slot_kernel(
    a_ptr, b_ptr, c_ptr, topk_weights_ptr, expert_ids_ptr, num_post_padded_ptr,
    N, K, EM, num_valid_tokens,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    TOP_K: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
):
    """vLLM 0.33's `naive_block_assignment` path: row block pid_m is slot pid_m alone (row 0 of the tile; the other
    BLOCK_SIZE_M - 1 rows are masked but still go through the dot, as in vLLM), expert = topk_ids.flatten()[pid_m].
    EM = num_valid_tokens * BLOCK_SIZE_M, so there is one row block per slot."""
    pid_m, pid_n = _fm._tile_ids(tl.program_id(0), tl.cdiv(EM, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N), GROUP_SIZE_M)
    if pid_m * BLOCK_SIZE_M >= tl.load(num_post_padded_ptr):
        return
    offs = tl.arange(0, BLOCK_SIZE_M)
    tokens = tl.where(offs == 0, pid_m, num_valid_tokens).to(tl.int64)
    token_mask = tokens < num_valid_tokens
    a_rows = tl.where(token_mask, tokens // TOP_K, 0)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    _gemm_block(a_ptr, b_ptr, c_ptr, topk_weights_ptr, tokens, token_mask, a_rows, expert, pid_n, N, K,
                stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
                MUL_ROUTED_WEIGHT, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)


def prepare_small_batch(inputs: _fm.MoEInputs, config: Config) -> Callable[[], torch.Tensor]:
    """vLLM 0.33's launch when M * top_k * 4 <= E (`_prepare_expert_assignment`): no moe_align_block_size; the
    expert ids are topk_ids.flatten() and num_tokens_post_padded = M * top_k * BLOCK_SIZE_M (a device constant).
    Everything else as prepare() (`_layer`): NaN-filled workspaces, w13 GEMM, silu-and-mul, w2 GEMM, top-k sum."""
    wl, flat_weights, ids = _routed(inputs, config)
    em = wl.num_tokens * wl.top_k * int(config["BLOCK_SIZE_M"])  # one row block per slot
    expert_ids = ids.flatten().to(torch.int32).contiguous()
    post_padded = torch.full((1,), em, dtype=torch.int32, device=inputs.x.device)
    return _layer(inputs, config, _moe_gemm_slot_kernel, em, flat_weights, lambda: (expert_ids, post_padded))


def uses_small_batch_path(workload: MoEWorkload, engine: str = vllm_tables.DEFAULT_ENGINE, ep: int = 1) -> bool:
    """Does the engine run this workload on its small-batch path (vLLM 0.33: M * top_k * 4 <= E, no EP)?"""
    wl = _check_workload(workload)
    return vllm_tables.naive_block_assignment(wl.num_tokens, wl.top_k, wl.num_experts, engine, ep)


def prepare_engine(inputs: _fm.MoEInputs, config: Config,
                   engine: str = vllm_tables.DEFAULT_ENGINE) -> Callable[[], torch.Tensor]:
    """The launch the engine itself runs for this workload: the small-batch path where it applies, else prepare()."""
    if uses_small_batch_path(inputs.workload, engine):
        return prepare_small_batch(inputs, config)
    return prepare(inputs, config)


def path_store_key(workload: MoEWorkload, engine: str = vllm_tables.DEFAULT_ENGINE) -> str:
    """The store key of a row timed with prepare_engine: store_key() or small_batch_store_key()."""
    return small_batch_store_key() if uses_small_batch_path(workload, engine) else store_key()


def small_batch_store_key() -> str:
    """The small-batch path's rows' store key (kernels/profiles.py path_keys; separate from store_key())."""
    return SMALL_BATCH_KEY


def store_key() -> str:
    """The aligned path's rows' store key: the family's version (kernels/profiles.py)."""
    return _profiles.profile("vllm_fused_moe").store_key


@dataclass(frozen=True)
class VllmFusedMoEFamily:
    """vLLM's fused MoE kernel design (module docstring); workloads, inputs and reference as `fused_moe`."""

    name: str = "vllm_fused_moe"
    space: KnobSpace = SPACE
    workload_type: type = MoEWorkload

    def default_config(self, workload: MoEWorkload, engine: str = vllm_tables.DEFAULT_ENGINE) -> Config:
        return default_config(workload, engine=engine)

    def make_inputs(self, workload: MoEWorkload, device: str, seed: int = 0) -> _fm.MoEInputs:
        return _fm.make_inputs(_check_workload(workload), device, seed)

    def prepare(self, inputs: _fm.MoEInputs, config: Config) -> Callable[[], torch.Tensor]:
        return prepare(inputs, config)

    def reference(self, inputs: _fm.MoEInputs) -> torch.Tensor:
        return _fm.reference_moe(inputs)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return _fm.tolerance(dtype)

    def flops(self, workload: MoEWorkload) -> float:
        return _fm.flops(workload)

    def bytes_moved(self, workload: MoEWorkload) -> float:
        return _fm.bytes_moved(workload)

    # extras: the engine's own choice and the export entry format
    def engine_config(self, workload: MoEWorkload, device_name: str = DEFAULT_DEVICE) -> Config:
        return default_config(workload, device_name)

    def engine_prepare(self, inputs: _fm.MoEInputs, config: Config,
                       engine: str = vllm_tables.DEFAULT_ENGINE) -> Callable[[], torch.Tensor]:
        return prepare_engine(inputs, config, engine)

    def vllm_config_entry(self, config: Config) -> dict[str, Any]:
        return to_entry(config)

    def bench_cases(self) -> list[tuple[str, MoEWorkload]]:
        return _fm.bench_cases()


def bench_cases() -> list[tuple[str, MoEWorkload]]:
    return _fm.bench_cases()


FAMILY = VllmFusedMoEFamily()
