"""CPU: how many decode steps of each committed live run were served a config other than the one today's chooser
answers for the same step (the batch and the mean context on the memo grid, as the live stack asks).

Until session 55 the Dispatcher remembered a table config moved onto the serving KV layout per (config, layout,
head_dim). Where the config's knobs are invalid on that layout the nearest valid one depends on the batch and context
(decode's split counts), so the first shape's move answered every later shape: the served config depended on the
order of earlier calls. The live runs' learned tables hold configs on 128-token HND pages and were served on 16-token
NHD pages. This counts, per run and policy, the decode steps whose recorded config differs from the fixed chooser's.

    python benchmarks/live_e2e/dispatch_order.py   # dispatch_order.json beside this file (about 2 minutes)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from benchmarks.live_e2e import run as le  # noqa: E402


def served_other(folder: Path) -> dict:
    """Per table policy of one live run: its decode steps and those whose recorded config today's chooser would not
    serve there."""
    data = json.loads((folder / "measured.json").read_text())
    if data["meta"].get("smoke"):
        return {}
    model = le.load_model(data["meta"]["model"])
    out = {}
    for spec in data["measured"]:
        if not spec.startswith("table:"):  # the default and vllm-table choosers move nothing between layouts
            continue
        chooser = le.make_chooser(spec, model)
        steps = [r for r in le.read_steps(folder, spec) or []
                 if r["decode_batch"] and (r.get("configs") or {}).get("decode_attention")]
        other = sum(1 for r in steps if le.step_decode_config(chooser, model, r) != r["configs"]["decode_attention"])
        if steps:
            out[spec] = {"decode_steps": len(steps), "served_another_config": other,
                         "share": round(other / len(steps), 4)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE / "dispatch_order.json")
    args = p.parse_args(argv)
    from kernel_gym.train.tracking import git_commit

    runs = {}
    for measured in sorted(HERE.glob("**/measured.json")):
        if "predicted" in measured.parts:
            continue
        got = served_other(measured.parent)
        if got:
            runs[str(measured.parent.relative_to(HERE))] = got
            for spec, r in got.items():
                print(f"{str(measured.parent.relative_to(HERE)):45s} {Path(spec).parent.name:14s} "
                      f"{r['served_another_config']:4d} of {r['decode_steps']:5d} decode steps", file=sys.stderr)
    args.out.write_text(json.dumps({"what": "decode steps of each live run served a config other than today's chooser "
                                            "answers for the same step", "commit": git_commit(), "runs": runs},
                                   indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
