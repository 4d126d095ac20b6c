"""The `kernel-gym` command: one subcommand per stage of the data flow (DESIGN.md).

Each subcommand imports its stage lazily, so `kernel-gym --help` is instant and GPU-only commands never import
gymnasium or mlflow. Bad input exits with code 2 and a message that names the problem and the fix.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


class UsageError(Exception):
    """Bad input from the user: printed without a traceback, exit code 2."""


def _cmd_bench(args: argparse.Namespace) -> int:
    from kernel_gym import bench

    return bench.main(args)


def _cmd_collect(args: argparse.Namespace) -> int:
    from kernel_gym.measure import collect

    return collect.main(args.rest)


def _cmd_data(args: argparse.Namespace) -> int:
    from kernel_gym.measure import summary

    info = summary.dataset_summary(args.db)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(summary.format_summary(info))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from kernel_gym.policies import train

    return train.main(args.rest)


def _cmd_replay(args: argparse.Namespace) -> int:
    from kernel_gym.policies import replay

    return replay.main(args.rest)


def _cmd_export(args: argparse.Namespace) -> int:
    from kernel_gym.policies import export

    return export.main(args.rest)


def _cmd_ui(args: argparse.Namespace) -> int:
    from kernel_gym.policies import tracking

    return tracking.serve_ui(port=args.port, open_browser=False)


def _cmd_demo(args: argparse.Namespace) -> int:
    from kernel_gym import demo

    return demo.main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernel-gym",
        description="Learn Triton kernel configs for MoE LLM serving from real compile-and-measure data.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("bench", help="GPU: time each kernel's configs against anchors (SDPA, copy, matmul, torch loop)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/h200_kernels.json"), help="JSON results file")
    p.add_argument("--md", type=Path, default=Path("docs/benchmarks.md"), help="readable markdown summary")
    p.add_argument("--kernels", default="prefill_attention,decode_attention,fused_moe", help="comma-separated families")
    p.add_argument("--configs", type=int, default=120, help="configs timed per case (sampled from the valid space)")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting new cases after this many seconds")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("collect", help="GPU: fill the measurement store (see `kernel-gym collect -- --help`)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for scripts/collect.py")
    p.set_defaults(func=_cmd_collect)

    p = sub.add_parser("data", help="summarise the embedded H200 dataset (or --db PATH)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--db", default=None, help="a measurement store (sqlite) instead of the packaged dataset")
    p.set_defaults(func=_cmd_data)

    for name, func, text in (
        ("train", _cmd_train, "train a MaskablePPO policy on an environment; logs to MLflow (`train -- --help`)"),
        ("replay", _cmd_replay, "replay a trace through the serving simulator with each policy (`replay -- --help`)"),
        ("export", _cmd_export, "export a registered policy as a dispatch table or vLLM config files"),
        ("demo", _cmd_demo, "the main job on embedded defaults, CPU only: train, export, replay, compare"),
    ):
        p = sub.add_parser(name, help=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=func)

    p = sub.add_parser("ui", help="start the MLflow UI on 127.0.0.1 for the kernel_gym store (mlruns/)")
    p.add_argument("--port", type=int, default=5000)
    p.set_defaults(func=_cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "rest") and args.rest and args.rest[0] == "--":
        args.rest = args.rest[1:]
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError, FileNotFoundError) as exc:
        print(f"kernel-gym {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        if missing.startswith("kernel_gym") or "from 'kernel_gym" in str(exc):
            print(f"kernel-gym {args.command}: not available in this version ({exc})", file=sys.stderr)
            return 3
        raise
    except KeyboardInterrupt:
        print(f"kernel-gym {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
