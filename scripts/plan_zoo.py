"""Plan the shape-zoo collection: the same candidate configs at every training shape of every zoo model (a
`collect --plan` file).

Why the same configs everywhere: a deployment masks a policy's choices with the knob-space rules alone, so the policy
must be trained where every catalogue entry that the rules allow has a measured time; otherwise training masks out
what deployment will pick. The candidate set is the union of the action catalogues learned from the stored data
(both built-in models, depths 1-2: the configs that win somewhere), each workload's default config, and the first
`--sample` configs of the collection's seeded order of the whole space (what `collect` samples at every shape), so
the oracle of a zoo shape is the best of several dozen configs that cover the space. Test models' shapes are left out
(kernel_gym.zoo.TEST_MODELS): they are swept widely and timed live by benchmarks/generalisation/run.py instead.

    python scripts/plan_zoo.py --kernels fused_moe,decode_attention --out zoo_plan.json.gz
    python3 -m kernel_gym.cli collect --plan zoo_plan.json.gz --kernels fused_moe,decode_attention --db zoo.sqlite
    python scripts/plan_zoo.py --remaining-of zoo_plan.json.gz --out rest.json.gz   # what the packaged data lacks

`--remaining-of` keeps the entries of an earlier plan that the packaged dataset does not hold yet (and that the
current rules still allow), largest-M MoE cells first, then the other uniform cells, then skewed ones: a budget cut
then leaves the cells that the zero-shot policy misses most (large M at TP 2-4) measured.

The plans are made by kernel_gym.train.measurement_plans; this is their command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", default="fused_moe,decode_attention", help="comma list: fused_moe, decode_attention")
    p.add_argument("--sample", default="fused_moe=6,decode_attention=4",
                   help="seeded-order configs per shape, per kernel (kernel=N comma list)")
    p.add_argument("--max-candidates", default="fused_moe=24,decode_attention=20",
                   help="cap on the learned catalogue configs, per kernel (kernel=N comma list)")
    p.add_argument("--out", type=Path, required=True, help="plan file (.json or .json.gz) for `collect --plan`")
    p.add_argument("--design", action="store_true",
                   help="plan the space-filling design (kernel_gym.zoo.DESIGN, fused_moe) instead of the zoo shards")
    p.add_argument("--remaining-of", type=Path, default=None, metavar="PLAN",
                   help="instead of planning anew: the part of this earlier plan the packaged dataset lacks")
    args = p.parse_args(argv)
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.train import measurement_plans as plans

    if args.remaining_of is not None:
        try:
            earlier = plans.read_plan(args.remaining_of)
        except (OSError, ValueError) as e:
            p.error(f"--remaining-of {args.remaining_of}: cannot read a JSON plan ({e})")
        rest = plans.remaining(earlier, RecordedBackend())
        plans.write_plan(rest, args.out)
        print(json.dumps({"out": str(args.out), "entries": len(rest),
                          "configs": sum(len(e["configs"]) for e in rest)}))
        return 0

    def per_kernel(text: str) -> dict[str, int]:
        try:
            return {k.strip(): int(v) for k, v in (x.split("=") for x in text.split(",") if x.strip())}
        except ValueError:
            p.error(f"expected kernel=N pairs, got {text!r}")
            raise

    sample, cap = per_kernel(args.sample), per_kernel(args.max_candidates)
    backend = RecordedBackend()
    plan, summaries = [], []
    for kernel in [k.strip() for k in args.kernels.split(",") if k.strip()]:
        if kernel not in ("fused_moe", "decode_attention"):
            p.error(f"the zoo covers fused_moe and decode_attention, not {kernel!r}")
        if args.design and kernel != "fused_moe":
            p.error("--design covers fused_moe only (pass --kernels fused_moe)")
        part, summary = plans.zoo_plan(kernel, backend, sample.get(kernel, 6), cap.get(kernel, 24), args.design)
        plan += part
        summaries.append(summary)
    # Interleave kernels too, so a budget cut leaves both covered.
    plan = plans.round_robin([[e for e in plan if e["kernel"] == k] for k in dict.fromkeys(e["kernel"] for e in plan)])
    plans.write_plan(plan, args.out)
    print(json.dumps({"out": str(args.out), "entries": len(plan), "per_kernel": summaries}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
