"""Plan the measurements that let the recorded data score every choice a policy may make (a `collect --plan` file).

Why: the recorded grid measures a sampled subset of each config space per shape, and the configs that win on the
exhaustively measured evaluation shapes are often outside that sample. A policy that picks such a config on a held-out
shape cannot be scored there, so the evaluation masks it and the policy falls back to a lower-ranked choice: on decode
the policy's first choice was unmeasured on every held-out batch-8 shape (docs/measurement.md). This script lists, for
every measured shape of the given kernels and models, the candidate configs not yet stored there: the union over models
of the action catalogues the agent builds from the training split (kernel_gym.train.train.prepare_data) at every
depth up to one deeper than training uses, and each shape's `--top` fastest stored configs. Measuring them
(`collect --plan FILE`) adds rows only; the oracle stays the best measured config and can only get faster.

    python scripts/plan_coverage.py --kernels decode_attention --out plan_decode.json
    python3 scripts/collect.py --plan plan_decode.json --kernels decode_attention --db h200.sqlite   # on the GPU

`--new-shapes` plans the collection grid's shapes at first-axis values that no stored shape has (after the grid grew,
e.g. the decode batches 3, 6, 12, 24, 48) so that they come out sampled like the shapes measured before them: the
seeded sample the grid collection takes at every shape (collect's own sampler, `--configs-per-shape`), the default
config, the training catalogue, and the `--neighbour-top` fastest stored configs of each shape's measured neighbours
along the first axis (the batch, for decode). At the decode shapes of the original batches (~280 stored configs each)
the neighbours' 16 fastest and 30 sampled configs hold the best to within 0.03% geomean, 1.0% at worst
(tests/policies/test_scripts_plans.py).

`--new-knobs` plans the values of knobs added after the stored rows were measured (knobs with a legacy value: fused
MoE's TMA_LOADS, prefill's IMPL) at every measured shape: for the families the benchmark searches exhaustively
(prefill) every valid config that sets such a knob, for the others each shape's `--top` fastest stored configs at
every new value (with_new_knobs, what `kernel-gym bench` times too).

`--neighbour-winners` plans, at every measured shape, the `--top` fastest stored configs of its neighbours along the
first axis that it has not stored: a held-out shape's winner is then measured on both sides of it (the policies'
held-out scores on Mixtral's decode and prefill are limited by that, benchmarks/policy_quality/neighbours.py).

The plans are made by kernel_gym.train.measurement_plans; this is their command line.
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
    p.add_argument("--new-shapes", action="store_true", help="plan the grid shapes with no stored rows instead")
    p.add_argument("--new-knobs", action="store_true", help="plan the values of knobs added since, at stored shapes")
    p.add_argument("--variants-only", action="store_true",
                   help="--new-knobs: every family, prefill too, gets only the new-knob variants of each shape's "
                        "--top fastest stored configs (prefill otherwise gets every valid config: a plan cut to fit "
                        "a GPU budget)")
    p.add_argument("--neighbour-winners", action="store_true",
                   help="plan each measured shape's neighbours' --top fastest configs that it has not stored")
    p.add_argument("--configs-per-shape", type=int, default=48, help="--new-shapes: collect's seeded sample size")
    p.add_argument("--neighbour-top", type=int, default=16, help="--new-shapes: fastest configs of each neighbour")
    p.add_argument("--fill", action="store_true",
                   help="--new-shapes: every grid shape without rows, also at values other stored shapes have (the "
                        "holes that keep interpolation from bracketing the shapes around them)")
    args = p.parse_args(argv)
    if args.depth < 1 or args.top < 0 or args.neighbour_top < 0 or args.configs_per_shape < 0:
        p.error("--depth must be >= 1; --top, --neighbour-top and --configs-per-shape >= 0")
    if args.fill and not args.new_shapes:
        p.error("--fill goes with --new-shapes")
    if args.variants_only and not args.new_knobs:
        p.error("--variants-only goes with --new-knobs")
    if args.new_shapes + args.new_knobs + args.neighbour_winners > 1:
        p.error("--new-shapes, --new-knobs and --neighbour-winners make separate plans: give one")

    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.train import measurement_plans as plans

    backend = RecordedBackend(args.data or None)
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    if args.new_shapes:
        plan, summary = plans.new_shapes_plan(backend, kernels, models, args.configs_per_shape, args.neighbour_top,
                                              log, fill=args.fill)
    elif args.neighbour_winners:
        plan, summary = plans.neighbour_winners_plan(backend, kernels, models, args.top, log)
    elif args.new_knobs:
        plan, summary = plans.new_knobs_plan(backend, kernels, models, args.top, log,
                                             exhaustive=not args.variants_only)
    else:
        plan, summary = plans.coverage_plan(backend, kernels, models, args.depth, args.top, log)
    plans.write_plan(plan, args.out)
    print(json.dumps({"out": str(args.out), "entries": len(plan), **summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
