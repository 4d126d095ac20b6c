"""`kernel-gym demo`: the options of kernel_gym.demo.run_demo."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    from kernel_gym import demo

    p = argparse.ArgumentParser(prog="kernel-gym demo", description=demo.__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("out/demo"), help="where the exported files and replay go")
    p.add_argument("--model", default="mixtral-8x7b", help="model spec: mixtral-8x7b, olmoe-1b-7b or a JSON file")
    p.add_argument("--timesteps", type=int, default=30_000, help="training steps per kernel family")
    p.add_argument("--trace", default="bundled", help="trace to replay (bundled: 10 min of Azure conversation)")
    p.add_argument("--routing", default="zipf:1.2", help="expert routing during replay (uniform, zipf:EXP, drift:EXP)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kernel_gym.demo import run_demo

    return run_demo(out=args.out, model=args.model, timesteps=args.timesteps, trace=args.trace, routing=args.routing,
                    seed=args.seed)
