"""Experiment: would TMA loads close the fused MoE layer's gap to the torch loop at large M (docs/benchmarks.md)?

Run 5 timed these variants as kernels of this script; they now ship as the fused MoE family's TMA_LOADS knob
(kernel_gym.kernels.fused_moe.prepare_tma), which this script calls. The pointer-load path loads expert weights and
gathered activation rows through pointers. The variants keep its routing, alignment, SiLU-and-mul and top-k sum
kernels and change the two grouped GEMMs:
- tma_w: the expert weights (w1 as [E * 2I, H], w2 as [E * H, I]) load through host-side TMA tensor descriptors;
  activations as before.
- tma_w_sorted: also the gate/up output is written in the aligned (sorted, padded) slot order instead of slot order,
  so each row block of the down GEMM reads one contiguous [BLOCK_M, I] slab of it through a descriptor too.
Both variants scale by the routing weight in the down GEMM epilogue and sum the top-k slots in a separate kernel (the
configuration the pointer path's best large-M configs use). The pointer path is timed alongside at the dataset's 4
fastest configs for each workload.

GPU:  python3 experiments/exp_moe_tma.py --out $OUT/exp_moe_tma.json --budget-s 300 [--model olmoe] [--tokens 64 1024]
CPU:  python3 experiments/exp_moe_tma.py --tiny     (interpreter correctness, fp32 and fp16)
Imports only torch and the standard library besides kernel_gym's kernel modules.
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

from kernel_gym.kernels import fused_moe as fm  # noqa: E402
from kernel_gym.kernels.space import Config  # noqa: E402
from kernel_gym.kernels.workloads import MoEWorkload  # noqa: E402


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

    def config(self) -> Config:
        """This variant as a config of the fused MoE family (TMA_LOADS 1 or 2, weight fused, sum separate)."""
        return fm.LAYER_SPACE.config(dict(
            BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_K=self.block_k, GROUP_M=self.group_m,
            num_warps=self.num_warps, num_stages=self.num_stages, SPLIT_K=1, FUSE_SILU=self.fuse_silu,
            FUSE_WEIGHT=1, FUSE_SUM=0, TMA_LOADS=2 if self.sorted_act else 1,
        ))


def prepare_variant(inputs: fm.MoEInputs, v: Variant) -> Callable[[], torch.Tensor]:
    """Launch closure of one variant: the family's TMA_LOADS path (fused_moe.prepare_tma)."""
    return fm.prepare_tma(inputs, v.config())


def _err(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> str | None:
    """None when out matches the reference within the family's tolerance (the check every measurement uses)."""
    from kernel_gym.measure.worker import compare

    return compare(fm.FAMILY, out, ref, dtype)


def tiny_variants() -> list[Variant]:
    return [Variant(s, 16, 32, 32, 4, 3, fuse_silu=f, group_m=g) for s in (False, True) for f, g in ((0, 8), (1, 1))]


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


SHIPPED_BEST = [  # the pointer path's fastest configs at M=1024 and 4096 (benchmarks/h200_run5/bench)
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
    """Per case: the torch loop, the pointer path's best configs (kind "shipped") and every variant, each checked
    first, timed with the benchmark's timer (L2 flushed, GPU spun before every sample) in one process."""
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
            except Exception as exc:  # noqa: BLE001 - a config that fails is recorded, the sweep goes on
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
