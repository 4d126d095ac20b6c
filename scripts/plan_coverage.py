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
every new value (bench.with_new_knobs, what `kernel-gym bench` times too).
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
    p.add_argument("--configs-per-shape", type=int, default=48, help="--new-shapes: collect's seeded sample size")
    p.add_argument("--neighbour-top", type=int, default=16, help="--new-shapes: fastest configs of each neighbour")
    args = p.parse_args(argv)
    if args.depth < 1 or args.top < 0 or args.neighbour_top < 0 or args.configs_per_shape < 0:
        p.error("--depth must be >= 1; --top, --neighbour-top and --configs-per-shape >= 0")

    from kernel_gym.dispatch.catalogue import MAX_CATALOGUE, build_catalogue
    from kernel_gym.kernels import get_family
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.train.train import prepare_data

    backend = RecordedBackend(args.data or None)
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.new_shapes or args.new_knobs:
        if args.new_shapes and args.new_knobs:
            p.error("--new-shapes and --new-knobs make separate plans: give one")
        if args.new_shapes:
            plan, summary = plan_new_shapes(backend, kernels, models, args.configs_per_shape, args.neighbour_top)
        else:
            plan, summary = plan_new_knobs(backend, kernels, models, args.top)
        write_plan(plan, args.out)
        print(json.dumps({"out": str(args.out), "entries": len(plan), **summary}))
        return 0
    plan, summary = [], {}
    for kernel in kernels:
        space = get_family(kernel).space
        candidates: dict = {}
        shapes: dict = {}
        for model in models:
            data = prepare_data(kernel, backend, model)
            for depth in range(1, args.depth + 1):  # as training builds it (near 0, MAX_CATALOGUE) at each depth
                candidates.update(dict.fromkeys(build_catalogue(kernel, data.train, 0.0, MAX_CATALOGUE, depth).configs))
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
    write_plan(plan, args.out)
    print(json.dumps({"out": str(args.out), "entries": len(plan), **summary}))
    return 0


def plan_new_shapes(backend, kernels: list[str], models: list[str], per_shape: int, neighbour_top: int):
    """Per grid shape without stored rows: collect's seeded sample, the default, the training catalogue, and the
    fastest stored configs of its nearest measured neighbours below and above along the first feature axis."""
    from kernel_gym.dispatch.catalogue import primary_value
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import workload_from_key
    from kernel_gym.measure.collect import CollectOptions, build_plan
    from kernel_gym.train.train import prepare_data

    plan, summary = [], {}
    for kernel in kernels:
        fam = get_family(kernel)
        stored_shapes = {w for w, _ in backend.stored_keys(kernel)}
        sampled: dict[str, list[str]] = {}
        opts = CollectOptions(models=models, kernels=[kernel], grids=["default"], configs_per_shape=per_shape)
        for chunks in build_plan(opts):
            for item in chunks:
                if item.workload_key not in stored_shapes:
                    sampled.setdefault(item.workload_key, []).extend(item.configs)
        catalogue, refs = {}, []
        for model in models:
            data = prepare_data(kernel, backend, model)
            catalogue.update(dict.fromkeys(str(c) for c in data.catalogue.configs))
            refs += data.train + data.heldout
        # Only shapes at first-axis values that no stored shape has: the values the grid gained. Grid shapes left
        # unmeasured at old values (sampled out, or cut by a collection's budget) stay as they were.
        old_values = {primary_value(workload_from_key(kernel, w)) for w in stored_shapes}
        new = {w: workload_from_key(kernel, w) for w in sampled}
        new = {w: wl for w, wl in new.items() if primary_value(wl) not in old_values}
        n = 0
        # Smallest values first (a collection cut by its budget keeps those: where decode's winners change fastest).
        for wkey, workload in sorted(new.items(), key=lambda kv: (primary_value(kv[1]), kv[0])):
            wanted = dict.fromkeys([*sampled[wkey], *catalogue])
            for ref in neighbours(workload, refs):
                fastest = sorted(ref.times, key=ref.times.__getitem__)[:neighbour_top]
                wanted.update(dict.fromkeys(str(c) for c in fastest))
            valid = [c for c in wanted if fam.space.is_valid(Config.parse(c), workload)]
            plan.append({"kernel": kernel, "workload": wkey, "configs": valid})
            n += len(valid)
        summary[kernel] = {"new_shapes": len(new), "to_measure": n}
        print(f"{kernel}: {len(new)} grid shapes without rows: {n} configs planned", file=sys.stderr)
    return plan, summary


def plan_new_knobs(backend, kernels: list[str], models: list[str], top: int):
    """Per measured shape, the configs that set a knob added after its rows were stored (see the module docstring)."""
    from kernel_gym.bench import EXHAUSTIVE, with_new_knobs
    from kernel_gym.kernels import get_family
    from kernel_gym.train.train import prepare_data

    plan, summary = [], {}
    for kernel in kernels:
        space = get_family(kernel).space
        added = [k.name for k in space.knobs if k.legacy is not None]
        stored = backend.stored_keys(kernel)
        n = 0
        refs = {}
        for model in models:
            data = prepare_data(kernel, backend, model)
            refs.update({r.key: r for r in data.train + data.heldout})
        for wkey, ref in sorted(refs.items()):
            if kernel in EXHAUSTIVE:
                configs = [c for c in space.valid_configs(ref.workload) if any(k in c for k in added)]
            else:
                fastest = sorted(ref.times, key=ref.times.__getitem__)[:top]
                configs = with_new_knobs(space, fastest, ref.workload)
            missing = list(dict.fromkeys(str(c) for c in configs if (wkey, str(c)) not in stored))
            if missing:
                plan.append({"kernel": kernel, "workload": wkey, "configs": missing})
                n += len(missing)
        summary[kernel] = {"knobs": added, "shapes": len(refs), "to_measure": n}
        print(f"{kernel}: new knobs {added} at {len(refs)} measured shapes: {n} configs planned", file=sys.stderr)
    return plan, summary


def neighbours(workload, refs) -> list:
    """The measured references nearest below and above `workload` along its primary axis, all else equal (the
    workload keys differ in one field)."""
    from kernel_gym.dispatch.catalogue import primary_value

    x = primary_value(workload)
    fields = json.loads(workload.key())
    same = [r for r in refs if sum(v != fields.get(k) for k, v in json.loads(r.workload.key()).items()) == 1]
    below = [r for r in same if primary_value(r.workload) < x]
    above = [r for r in same if primary_value(r.workload) > x]
    return ([max(below, key=lambda r: primary_value(r.workload))] if below else []) + (
        [min(above, key=lambda r: primary_value(r.workload))] if above else [])


def write_plan(plan: list, out: Path) -> None:
    if out.suffix == ".gz":
        import gzip

        with gzip.open(out, "wt") as f:
            json.dump(plan, f)
    else:
        out.write_text(json.dumps(plan))


if __name__ == "__main__":
    raise SystemExit(main())
