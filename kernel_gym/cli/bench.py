"""`kernel-gym bench`: the options of kernel_gym.bench (GPU only)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernel-gym bench")
    p.add_argument("--out", type=Path, default=Path("benchmarks/h200_kernels.json"), help="JSON results file")
    p.add_argument("--md", type=Path, default=None,
                   help="readable markdown summary (default: beside --out; docs/benchmarks.md keeps its analysis)")
    p.add_argument("--kernels", default="prefill_attention,decode_attention,fused_moe", help="comma-separated families")
    p.add_argument("--configs", type=int, default=120, help="configs timed per case (sampled from the valid space)")
    p.add_argument("--recorded", type=int, default=12,
                   help="also time the packaged dataset's N fastest configs for each case's workload (0: none)")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting new cases after this many seconds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kernel_gym import bench

    return bench.bench_and_write(out=args.out, md=args.md, kernels=[k for k in args.kernels.split(",") if k],
                                 configs=args.configs, recorded=args.recorded, budget_s=args.budget_s)
