"""Plan the measurements that let the recorded data score every choice a policy may make (a `collect --plan` file).

Why: the recorded grid measures a sampled subset of each config space per shape, and the configs that win on the
exhaustively measured evaluation shapes are often outside that sample. A policy that picks such a config on a held-out
shape cannot be scored there, so the evaluation masks it and the policy falls back to a lower-ranked choice: on decode
the policy's first choice was unmeasured on every held-out batch-8 shape (docs/measurement.md). This script lists, for
every measured shape of the given kernels and models, the candidate configs not yet stored there: the union over models
of the action catalogues the agent builds from the training split (kernel_gym.policies.train.prepare_data) at every
depth up to one deeper than training uses, and each shape's `--top` fastest stored configs. Measuring them
(`collect --plan FILE`) adds rows only; the oracle stays the best measured config and can only get faster.

    python scripts/plan_coverage.py --kernels decode_attention --out plan_decode.json
    python3 scripts/collect.py --plan plan_decode.json --kernels decode_attention --db h200.sqlite   # on the GPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", default="decode_attention", help="comma list of kernel names")
    p.add_argument("--models", default="mixtral-8x7b,olmoe-1b-7b", help="comma list of built-in model names")
    p.add_argument("--data", default="", help="snapshot or store (default: the packaged H200 snapshot)")
    p.add_argument("--depth", type=int, default=3, help="catalogue depths 1..this (training uses 2)")
    p.add_argument("--top", type=int, default=3, help="also each shape's this many fastest stored configs")
    p.add_argument("--out", type=Path, required=True, help="plan JSON (.json or .json.gz) for `collect --plan`")
    args = p.parse_args(argv)
    if args.depth < 1 or args.top < 0:
        p.error(f"--depth must be >= 1 and --top >= 0, got {args.depth} and {args.top}")

    from kernel_gym.kernels import get_family
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.policies.catalogue import build_catalogue
    from kernel_gym.policies.train import prepare_data

    backend = RecordedBackend(args.data or None)
    plan, summary = [], {}
    for kernel in [k.strip() for k in args.kernels.split(",") if k.strip()]:
        space = get_family(kernel).space
        candidates: dict = {}
        shapes: dict = {}
        for model in [m.strip() for m in args.models.split(",") if m.strip()]:
            data = prepare_data(kernel, backend, model)
            for depth in range(1, args.depth + 1):  # as training builds it (near 0, 48 entries) at each depth
                candidates.update(dict.fromkeys(build_catalogue(kernel, data.train, 0.0, 48, depth).configs))
            for ref in data.train + data.heldout:
                shapes[ref.key] = ref.workload
                candidates.update(dict.fromkeys(sorted(ref.times, key=ref.times.__getitem__)[:args.top]))
        stored = backend.stored_keys(kernel)
        n = 0
        for wkey, workload in sorted(shapes.items()):
            missing = [str(c) for c in candidates if (wkey, str(c)) not in stored and space.is_valid(c, workload)]
            if missing:
                plan.append({"kernel": kernel, "workload": wkey, "configs": missing})
                n += len(missing)
        summary[kernel] = {"candidates": len(candidates), "shapes": len(shapes), "to_measure": n}
        print(f"{kernel}: {len(candidates)} candidate configs x {len(shapes)} measured shapes: {n} not stored",
              file=sys.stderr)
    if args.out.suffix == ".gz":
        import gzip

        with gzip.open(args.out, "wt") as f:
            json.dump(plan, f)
    else:
        args.out.write_text(json.dumps(plan))
    print(json.dumps({"out": str(args.out), "entries": len(plan), **summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
