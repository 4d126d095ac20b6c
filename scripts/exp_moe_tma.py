"""Experiment: would TMA loads close the fused MoE layer's gap to the torch loop at large M (docs/benchmarks.md)?

The shipped kernel (kernel_gym.kernels.fused_moe) loads expert weights and gathered activation rows through pointers.
These variants keep its routing, alignment, SiLU-and-mul and top-k sum kernels and change the two grouped GEMMs:
- tma_w: the expert weights (w1 as [E * 2I, H], w2 as [E * H, I]) load through host-side TMA tensor descriptors;
  activations as before.
- tma_w_sorted: also the gate/up output is written in the aligned (sorted, padded) slot order instead of slot order,
  so each row block of the down GEMM reads one contiguous [BLOCK_M, I] slab of it through a descriptor too.
Both variants scale by the routing weight in the down GEMM epilogue and sum the top-k slots in a separate kernel (the
configuration the shipped kernel's best large-M configs use). The shipped kernel is timed alongside at the dataset's 4
fastest configs for each workload. Its source is not touched: changing it changes its source hash and invalidates the
86,446 stored MoE rows, so a variant that wins is a reason to change it.

GPU:  python3 scripts/exp_moe_tma.py --out $OUT/exp_moe_tma.json --budget-s 300 [--model olmoe] [--tokens 64 1024]
CPU:  python3 scripts/exp_moe_tma.py --tiny     (interpreter correctness, fp32 and fp16)
Imports only torch, triton and the standard library besides kernel_gym's kernel modules.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

if "--tiny" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede any @triton.jit definition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from kernel_gym.kernels import fused_moe as fm  # noqa: E402
from kernel_gym.kernels.fused_moe import _tile_ids  # noqa: E402
from kernel_gym.kernels.space import Config  # noqa: E402
from kernel_gym.kernels.workloads import MoEWorkload  # noqa: E402

_LOG2E = 1.4426950408889634


@triton.jit
def _gate_up_tma(
    x_ptr, w_desc, out_ptr, sorted_ids_ptr, expert_ids_ptr, num_valid_slots, num_m_blocks, K, INTER,
    stride_xm, stride_om,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, FUSE_SILU: tl.constexpr, SORTED_OUT: tl.constexpr,
):
    """x[token] @ w1[expert].T per row block of aligned slots; w1 tiles [BLOCK_N, BLOCK_K] through a descriptor.
    SORTED_OUT: output row = aligned position (padding rows included), else the slot id (padding rows dropped)."""
    pid = tl.program_id(0)
    n_out = INTER if FUSE_SILU else 2 * INTER
    pid_m, pid_n = _tile_ids(pid, num_m_blocks, tl.cdiv(n_out, BLOCK_N), GROUP_M)
    pos = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ids_ptr + pos)
    slot_mask = slots < num_valid_slots
    rows = tl.where(slot_mask, slots // TOP_K, 0).to(tl.int64)
    w_row = tl.load(expert_ids_ptr + pid_m) * (2 * INTER) + pid_n * BLOCK_N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :]
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
    if SORTED_OUT:
        out_ptrs = out_ptr + pos.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty))
    else:
        out_ptrs = out_ptr + slots.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=slot_mask[:, None])


@triton.jit
def _down_tma(
    act, w_desc, y_ptr, weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_valid_slots, num_m_blocks, N, K,
    stride_am, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SORTED_IN: tl.constexpr,
):
    """act[row] @ w2[expert].T, scaled by the routing weight, stored per slot. SORTED_IN: act is in aligned order and
    a descriptor (one [BLOCK_M, BLOCK_K] slab per step), else a pointer in slot order (gathered rows)."""
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, num_m_blocks, tl.cdiv(N, BLOCK_N), GROUP_M)
    pos = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ids_ptr + pos)
    slot_mask = slots < num_valid_slots
    a_rows = tl.where(slot_mask, slots, 0).to(tl.int64)
    w_row = tl.load(expert_ids_ptr + pid_m) * N + pid_n * BLOCK_N
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SORTED_IN:
        for k in range(0, K, BLOCK_K):
            acc = tl.dot(act.load([pid_m * BLOCK_M, k]), tl.trans(w_desc.load([w_row, k])), acc)
    else:
        a_ptrs = act + a_rows[:, None] * stride_am + offs_k[None, :]
        for k in range(0, K, BLOCK_K):
            acc = tl.dot(tl.load(a_ptrs), tl.trans(w_desc.load([w_row, k])), acc)
            a_ptrs += BLOCK_K
    w = tl.load(weights_ptr + a_rows, mask=slot_mask, other=0.0)
    acc = acc * w[:, None]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    y_ptrs = y_ptr + a_rows[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=slot_mask[:, None])


@dataclass(frozen=True)
class Variant:
    sorted_act: bool  # tma_w_sorted
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    fuse_silu: int = 0
    group_m: int = 8

    @property
    def name(self) -> str:
        return "tma_w_sorted" if self.sorted_act else "tma_w"

    def label(self) -> str:
        return (f"{self.name} {self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages} "
                f"silu{self.fuse_silu} g{self.group_m}")


def prepare_variant(inputs: fm.MoEInputs, v: Variant) -> Callable[[], torch.Tensor]:
    """Launch closure of one variant (routing and alignment up front, as in fused_moe.prepare)."""
    wl = inputs.workload
    m, e, h, inter, k = wl.num_tokens, wl.num_experts, wl.hidden, wl.intermediate, wl.top_k
    for name, dim, block in (("hidden", h, v.block_k), ("intermediate", inter, v.block_k),
                             ("intermediate", inter, v.block_n), ("hidden", h, v.block_n)):
        if dim % block:
            raise ValueError(f"{name} {dim} is not a multiple of {block}: this experiment has no ragged tiles")
    weights, ids = fm.route(inputs.router_logits.to(inputs.x.device), k)
    al = fm.align_block_size(ids, e, v.block_m)
    x = inputs.x
    w1_desc = TensorDescriptor.from_tensor(inputs.w1.view(e * 2 * inter, h), [v.block_n, v.block_k])
    w2_desc = TensorDescriptor.from_tensor(inputs.w2.view(e * h, inter), [v.block_n, v.block_k])
    n_slots = m * k
    rows = al.num_tokens_post_padded if v.sorted_act else n_slots
    n_out = inter if v.fuse_silu else 2 * inter
    gate_up = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    act = gate_up if v.fuse_silu else torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    a_in = TensorDescriptor.from_tensor(act, [v.block_m, v.block_k]) if v.sorted_act else act
    y = torch.empty(n_slots, h, dtype=x.dtype, device=x.device)
    out = torch.empty(m, h, dtype=x.dtype, device=x.device)
    flat_w = weights.flatten().contiguous()
    nb = al.num_blocks
    meta = dict(num_warps=v.num_warps, num_stages=v.num_stages)
    eb = fm.ELEMWISE_BLOCK

    def launch() -> torch.Tensor:
        _gate_up_tma[(nb * triton.cdiv(n_out, v.block_n),)](
            x, w1_desc, gate_up, al.sorted_token_ids, al.expert_ids, n_slots, nb, h, inter, x.stride(0),
            gate_up.stride(0), TOP_K=k, BLOCK_M=v.block_m, BLOCK_N=v.block_n, BLOCK_K=v.block_k,
            GROUP_M=v.group_m, FUSE_SILU=v.fuse_silu, SORTED_OUT=v.sorted_act, **meta,
        )
        if not v.fuse_silu:
            fm._silu_mul_kernel[(triton.cdiv(act.numel(), eb),)](gate_up, act, act.numel(), inter, BLOCK=eb)
        _down_tma[(nb * triton.cdiv(h, v.block_n),)](
            a_in, w2_desc, y, flat_w, al.sorted_token_ids, al.expert_ids, n_slots, nb, h, inter,
            act.stride(0), y.stride(0), BLOCK_M=v.block_m, BLOCK_N=v.block_n, BLOCK_K=v.block_k,
            GROUP_M=v.group_m, SORTED_IN=v.sorted_act, **meta,
        )
        fm._topk_sum_kernel[(triton.cdiv(out.numel(), eb),)](y, out, out.numel(), h, TOP_K=k, BLOCK=eb)
        return out

    return launch


def _err(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> str | None:
    atol, rtol = fm.tolerance(dtype)
    bad = (out.float() - ref.float()).abs() > atol + rtol * ref.float().abs()
    return None if not bad.any() else f"{int(bad.sum())}/{bad.numel()} elements off"


def tiny_variants() -> list[Variant]:
    return [Variant(s, 16, 32, 32, 4, 2, fuse_silu=f, group_m=g) for s in (False, True) for f, g in ((0, 8), (1, 1))]


def tiny_check(dtypes: tuple[str, ...] = ("float32", "float16")) -> list[dict]:
    """Every variant against the fp32 reference on a ragged routing (37 tokens, 4 experts, top-2, one expert empty
    under the Zipf skew is likely; padding rows in every group). Runs under TRITON_INTERPRET=1."""
    device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    out = []
    for dtype in dtypes:
        wl = MoEWorkload(37, 4, 2, 64, 128, 1.5, dtype)
        inputs = fm.make_inputs(wl, device, seed=1)
        ref = fm.reference_moe(inputs)
        for v in tiny_variants():
            try:
                err = _err(prepare_variant(inputs, v)(), ref, dtype)
                out.append({"variant": v.label(), "dtype": dtype, "status": "ok" if err is None else "wrong",
                            "reason": err or ""})
            except Exception as exc:  # noqa: BLE001 - reported per variant
                out.append({"variant": v.label(), "dtype": dtype, "status": "error",
                            "reason": f"{type(exc).__name__}: {exc}"[:300]})
    return out


SHIPPED_BEST = [  # the shipped kernel's fastest configs at M=1024 and 4096 (benchmarks/h200_run5/bench)
    Config(BLOCK_K=64, BLOCK_M=128, BLOCK_N=256, FUSE_SILU=0, FUSE_SUM=0, FUSE_WEIGHT=1, GROUP_M=8, SPLIT_K=1,
           num_stages=3, num_warps=8),
    Config(BLOCK_K=64, BLOCK_M=128, BLOCK_N=256, FUSE_SILU=0, FUSE_SUM=0, FUSE_WEIGHT=1, GROUP_M=8, SPLIT_K=1,
           num_stages=4, num_warps=8),
    Config(BLOCK_K=64, BLOCK_M=64, BLOCK_N=256, FUSE_SILU=1, FUSE_SUM=0, FUSE_WEIGHT=0, GROUP_M=8, SPLIT_K=1,
           num_stages=3, num_warps=8),
    Config(BLOCK_K=64, BLOCK_M=128, BLOCK_N=128, FUSE_SILU=1, FUSE_SUM=0, FUSE_WEIGHT=1, GROUP_M=8, SPLIT_K=1,
           num_stages=4, num_warps=8),
]


def gpu_variants() -> list[Variant]:
    shapes = [(128, 256, 64, 8, 3, 0), (128, 256, 64, 8, 4, 0), (128, 128, 64, 8, 4, 0), (128, 128, 64, 8, 3, 1),
              (128, 128, 64, 8, 4, 1), (64, 256, 64, 8, 3, 0), (128, 256, 64, 8, 3, 1), (128, 128, 128, 8, 3, 0),
              (64, 128, 64, 4, 4, 0), (16, 128, 128, 4, 3, 0), (16, 64, 128, 4, 4, 1)]
    return [Variant(s, bm, bn, bk, w, st, fuse_silu=f) for s in (False, True) for bm, bn, bk, w, st, f in shapes]


MODEL_SHAPES = {"mixtral": (8, 2, 4096, 14336), "olmoe": (64, 8, 2048, 1024)}  # experts, top-k, hidden, intermediate


def gpu_sweep(out_path: Path, budget_s: float, tokens: list[int], model: str = "mixtral",
              skew: float = 0.0) -> list[dict]:
    """Per case: the torch loop, the shipped kernel's best configs and every variant, each checked first, timed
    with the benchmark's timer (L2 flushed, GPU spun before every sample) in one process."""
    from kernel_gym.bench import BENCH_TIMING_KW, recorded_best
    from kernel_gym.measure.timing import TimingOptions, time_launch

    timing = TimingOptions(**BENCH_TIMING_KW)
    t0 = time.monotonic()
    records: list[dict] = []

    def timed(kind: str, case: str, label: str, fn: Callable[[], torch.Tensor], ref: torch.Tensor, wl) -> None:
        rec: dict[str, Any] = {"kind": kind, "case": case, "config": label}
        if time.monotonic() - t0 > budget_s:
            rec["status"] = "skipped_budget"
        else:
            try:
                err = _err(fn(), ref, wl.dtype)
                if err:
                    rec.update(status="wrong", reason=err)
                else:
                    t = time_launch(fn, timing)
                    rec.update(status="ok", ms=t.median_ms, spread=t.spread,
                               tflops=fm.flops(wl) / (t.median_ms * 1e-3) / 1e12)
            except Exception as exc:  # noqa: BLE001
                rec.update(status="error", reason=f"{type(exc).__name__}: {exc}"[:300])
        records.append(rec)
        print(f"[{time.monotonic() - t0:6.1f}s] {case} {kind} {label}: {rec['status']} "
              f"{rec.get('ms', '')} {rec.get('reason', '')[:120]}", flush=True)
        out_path.write_text(json.dumps({"device": torch.cuda.get_device_name(), "records": records}, indent=1))

    for m in tokens:
        wl = MoEWorkload(m, *MODEL_SHAPES[model], skew)
        case = f"moe_{model}_m{m}" + (f"_skew{skew:g}" if skew else "")
        inputs = fm.make_inputs(wl, "cuda", seed=0)
        ref = fm.reference_moe(inputs)
        timed("torch_loop", case, "loop over experts", fm.make_torch_loop(inputs), ref, wl)
        shipped = recorded_best(fm.FAMILY, wl, 4) + (SHIPPED_BEST if model == "mixtral" else [])
        for c in dict.fromkeys(shipped):  # the dataset's fastest for this workload (+ run 5's large-M winners)
            timed("shipped", case, str(c), fm.prepare(inputs, c), ref, wl)
        for v in gpu_variants():
            timed(v.name, case, json.dumps(asdict(v)), prepare_variant(inputs, v), ref, wl)
        del inputs
        torch.cuda.empty_cache()
    return records


def summary(records: list[dict]) -> str:
    lines = []
    for case in dict.fromkeys(r["case"] for r in records):
        loop = next((r["ms"] for r in records if r["case"] == case and r["kind"] == "torch_loop" and "ms" in r), None)
        for kind in dict.fromkeys(r["kind"] for r in records if r["case"] == case):
            ok = [r for r in records if r["case"] == case and r["kind"] == kind and "ms" in r]
            if ok:
                best = min(ok, key=lambda r: r["ms"])
                vs = f"{loop / best['ms']:.3f}x the loop's speed" if loop else ""
                lines.append(f"{case:18} {kind:13} {best['ms']:8.4f} ms {best['tflops']:6.1f} TF  {vs}  "
                             f"{best['config']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="JSON file for all records")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 1024])
    ap.add_argument("--model", choices=sorted(MODEL_SHAPES), default="mixtral", help="expert shapes")
    ap.add_argument("--skew", type=float, default=0.0, help="Zipf exponent of expert popularity (0: uniform)")
    ap.add_argument("--tiny", action="store_true", help="CPU/interpreter correctness check only")
    args = ap.parse_args(argv)
    if args.tiny:
        rows = tiny_check()
        for r in rows:
            print(f"{r['variant']:50} {r['dtype']:8} {r['status']} {r['reason']}")
        return 0 if all(r["status"] == "ok" for r in rows) else 1
    if not torch.cuda.is_available():
        ap.error("the sweep needs a CUDA GPU; on CPU run with --tiny")
    if not args.out:
        ap.error("--out is required for the GPU sweep")
    records = gpu_sweep(args.out, args.budget_s, args.tokens, args.model, args.skew)
    print(summary(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
