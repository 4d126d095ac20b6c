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
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


def candidate_configs(kernel: str, backend, sample: int, seed: int = 0) -> tuple[list, list]:
    """(catalogue configs learned from the stored data, the seeded order of the whole space) for one kernel."""
    from kernel_gym.dispatch.catalogue import MAX_CATALOGUE, build_catalogue
    from kernel_gym.kernels import get_family
    from kernel_gym.measure.collect import _stable_seed
    from kernel_gym.train.train import prepare_data

    learned: dict = {}
    for model in ("mixtral-8x7b", "olmoe-1b-7b"):
        data = prepare_data(kernel, backend, model, holdout=0.0)
        for depth in (1, 2):
            learned.update(dict.fromkeys(build_catalogue(kernel, data.train, 0.0, MAX_CATALOGUE, depth).configs))
    order = list(get_family(kernel).space.all_configs())
    random.Random(_stable_seed(seed, kernel)).shuffle(order)  # collect's own order: the same sample as the grid
    return list(learned), order


# The design's M order: a budget cut keeps every shape's most informative cells (the two ends of M, then the middle).
DESIGN_M_ORDER = ((4096, 0.0), (1, 0.0), (256, 0.0), (64, 1.2), (1024, 0.0), (16, 0.0), (64, 0.0), (256, 1.2))


def plan_kernel(kernel: str, backend, sample: int, max_candidates: int, design: bool = False) -> tuple:
    from kernel_gym import zoo
    from kernel_gym.kernels import get_family

    fam = get_family(kernel)
    learned, order = candidate_configs(kernel, backend, sample)
    learned = learned[:max_candidates]
    stored = backend.stored_keys(kernel) if kernel in backend.kernels() else set()
    per_shard: list[list[dict]] = []
    seen: set[str] = set()
    test_keys = zoo.test_workload_keys(kernel)
    shards = list(zoo.DESIGN.values()) if design else zoo.zoo_shards(zoo.training_models(kernel))
    for spec in shards:
        if spec.name in zoo.TOO_LARGE:
            continue
        entries = []
        workloads = zoo.shard_workloads(kernel, spec, "zoo")
        if design:  # a learned config the shape's rules reject is replaced by one more sampled config
            rank = {mk: i for i, mk in enumerate(DESIGN_M_ORDER)}
            workloads = sorted(workloads, key=lambda w: rank.get((w.num_tokens, w.skew), len(rank)))
            valid_learned = sum(fam.space.is_valid(c, workloads[0]) for c in learned) if workloads else 0
            sample_here = sample + max(0, len(learned) - valid_learned)
        else:
            sample_here = sample
        for wl in workloads:
            key = wl.key()
            if key in seen or key in test_keys:
                continue
            seen.add(key)
            sampled = []
            for c in order:
                if len(sampled) >= sample_here:
                    break
                if fam.space.is_valid(c, wl):
                    sampled.append(c)
            configs = [c for c in dict.fromkeys([fam.default_config(wl), *learned, *sampled])
                       if fam.space.is_valid(c, wl) and (key, str(c)) not in stored]
            if configs:
                entries.append({"kernel": kernel, "workload": key, "configs": [str(c) for c in configs],
                                "model": spec.name})
        per_shard.append(entries)
    # Round-robin over shards (first every shard's first workload, then the second, ...): a budget cut still leaves
    # every model covered.
    plan = [e for i in range(max(map(len, per_shard), default=0)) for s in per_shard if i < len(s) for e in [s[i]]]
    summary = {"kernel": kernel, "candidates_learned": len(learned), "sample": sample, "workloads": len(plan),
               "configs": sum(len(e["configs"]) for e in plan), "shards": len(per_shard)}
    return plan, summary


def remaining(plan: list[dict], backend) -> list[dict]:
    """The entries of `plan` not yet in the packaged dataset and still valid, in priority order (module docstring)."""
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.worker import workload_from_key

    stored = {k: backend.stored_keys(k) for k in {e["kernel"] for e in plan} if k in backend.kernels()}
    rest = []
    for e in plan:
        fam = get_family(e["kernel"])
        wl = workload_from_key(fam, e["workload"])
        configs = [c for c in e["configs"] if (e["workload"], c) not in stored.get(e["kernel"], set())
                   and fam.space.is_valid(Config.parse(c), wl)]
        if configs:
            rest.append({**e, "configs": configs})

    def priority(e: dict) -> int:
        w = json.loads(e["workload"])
        if e["kernel"] != "fused_moe":
            return 3
        return 0 if w["num_tokens"] >= 4096 else 2 if w.get("skew", 0.0) > 0 else 1

    return sorted(rest, key=priority)  # stable: plan order within a priority


def write_plan(plan: list[dict], out: Path) -> None:
    if out.suffix == ".gz":
        import gzip

        with gzip.open(out, "wt") as f:
            json.dump(plan, f)
    else:
        out.write_text(json.dumps(plan))


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

    if args.remaining_of is not None:
        import gzip

        opener = gzip.open if args.remaining_of.suffix == ".gz" else open
        try:
            with opener(args.remaining_of, "rt") as f:
                earlier = json.load(f)
        except (OSError, ValueError) as e:
            p.error(f"--remaining-of {args.remaining_of}: cannot read a JSON plan ({e})")
        rest = remaining(earlier, RecordedBackend())
        write_plan(rest, args.out)
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
        part, summary = plan_kernel(kernel, backend, sample.get(kernel, 6), cap.get(kernel, 24), args.design)
        plan += part
        summaries.append(summary)
    # Interleave kernels too, so a budget cut leaves both covered.
    by_kernel = [[e for e in plan if e["kernel"] == k] for k in dict.fromkeys(e["kernel"] for e in plan)]
    plan = [e for i in range(max(map(len, by_kernel), default=0)) for s in by_kernel if i < len(s) for e in [s[i]]]
    write_plan(plan, args.out)
    print(json.dumps({"out": str(args.out), "entries": len(plan), "per_kernel": summaries}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
