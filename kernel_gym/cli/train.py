"""`kernel-gym train`: one --flag per TrainArgs field (kernel_gym.train.train), its docstring as the help."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from kernel_gym.train.train import TrainArgs


def field_help() -> dict[str, str]:
    """Each TrainArgs field's docstring (cleanrl style), for argparse help."""
    from kernel_gym.train.train import TrainArgs

    tree = ast.parse(inspect.getsource(TrainArgs))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            out[a.target.id] = str(b.value.value)  # type: ignore[union-attr]
    return out


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add one --flag per TrainArgs field (--no-flag for booleans); `train_args(ns)` reads them back."""
    from kernel_gym.train.train import TrainArgs

    helps = field_help()
    for f in dataclasses.fields(TrainArgs):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if f.name == "resume":  # --resume [DIR]: DIR is the checkpoint directory of the run to continue
            parser.add_argument(flag, dest=f.name, nargs="?", const=True, default=False, metavar="DIR",
                                help=helps.get(f.name, "") + " --resume DIR sets --checkpoint-dir DIR.")
        elif isinstance(default, bool):
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                                help=helps.get(f.name, ""))
        elif isinstance(default, tuple):
            parser.add_argument(flag, dest=f.name, type=int, nargs="+", default=default, help=helps.get(f.name, ""))
        else:
            parser.add_argument(flag, dest=f.name, type=type(default), default=default,
                                help=f"{helps.get(f.name, '')} (default: {default!r})")
    return parser


def build_parser() -> argparse.ArgumentParser:
    from kernel_gym.train import train as job

    return add_arguments(argparse.ArgumentParser(prog="kernel-gym train", allow_abbrev=False,
                                                 description=job.__doc__.splitlines()[0]))


def train_args(ns: argparse.Namespace) -> TrainArgs:
    """The parsed flags as TrainArgs; `--resume DIR` is `--resume --checkpoint-dir DIR`."""
    from kernel_gym.train.train import TrainArgs

    values = vars(ns)
    if isinstance(ns.resume, str):
        if ns.checkpoint_dir and ns.checkpoint_dir != ns.resume:
            raise ValueError(f"--resume {ns.resume} and --checkpoint-dir {ns.checkpoint_dir} disagree: "
                             "pass one of them")
        values = {**values, "checkpoint_dir": ns.resume, "resume": True}
    return TrainArgs(**values)


def main(argv: Sequence[str] | None = None) -> int:
    from pathlib import Path

    from kernel_gym.train.train import train

    args = train_args(build_parser().parse_args(argv))
    ckpt = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    if ckpt is not None and not args.resume and ((ckpt / "state.json").exists() or (ckpt / "latest.zip").exists()):
        raise ValueError(f"--checkpoint-dir {ckpt} holds another run's checkpoint (state.json, latest.zip) that a new "
                         "run would overwrite: pass --resume to continue it, or another --checkpoint-dir")
    result = train(args)
    e = result.evaluation
    print(json.dumps({"run_id": result.run_id, "model_uri": result.model_uri, "geomean_policy": e.geomean_policy,
                      "geomean_static": e.geomean_static, "geomean_default": e.geomean_default}, indent=1))
    return 0
