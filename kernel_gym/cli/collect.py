"""`kernel-gym collect`: measure/collect.py's options, with --ray handed to the farm (measure/farm.py). The farm
builds on collect.py, so the command layer joins the two instead of collect importing the farm back."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from kernel_gym.measure.collect import CollectOptions


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    from kernel_gym.measure import collect

    d = collect.CollectOptions()
    p = argparse.ArgumentParser(prog="kernel-gym collect", description=collect.__doc__.split("\n\n")[0])
    p.add_argument("--model", default=",".join(d.models), help="built-in model names or spec JSON paths, comma list")
    p.add_argument("--kernels", default=",".join(d.kernels), help="kernel names (or module:ATTR families), comma list")
    p.add_argument("--grid", default=",".join(d.grids), help="shape grids: eval (exhaustive), default (sampled), small")
    p.add_argument("--configs-per-shape", type=int, default=d.configs_per_shape,
                   help="sampled valid configs per non-eval shape (the default config is always added)")
    p.add_argument("--budget-s", type=float, default=0.0, help="stop cleanly after this many seconds (0 = none)")
    p.add_argument("--db", default=d.db, help="SQLite measurement store (created; resumed when it exists)")
    p.add_argument("--out", default="", help="export a compressed snapshot (.jsonl.gz) here at the end")
    p.add_argument("--gpus", type=int, default=0, help="GPUs to use (0 = every visible one; one shard each)")
    p.add_argument("--compile-workers", type=int, default=-1, help="CPU compile processes (-1 = cores - GPUs)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu = interpreter, no timings")
    p.add_argument("--seed", type=int, default=0, help="config sampling seed")
    p.add_argument("--min-reps", type=int, default=d.timing.min_reps, help="timing samples before the spread test")
    p.add_argument("--max-reps", type=int, default=d.timing.max_reps, help="timing samples cap")
    p.add_argument("--dry-run", action="store_true", help="print the plan size and projection, measure nothing")
    p.add_argument("--remeasure-noisy", action="store_true",
                   help="instead of the plan: measure again the stored ok rows whose samples spread > 0.5, in place")
    p.add_argument("--plan", default="", metavar="FILE",
                   help="measure the (kernel, workload, configs) entries of this JSON file instead of the grids "
                        "(scripts/plan_coverage.py writes one); stored rows are skipped as usual")
    p.add_argument("--noise", type=int, default=0, metavar="REPEATS",
                   help="noise study instead of a collection: re-measure a subset of --db in REPEATS processes")
    p.add_argument("--noise-out", default="", help="write the noise study's JSON here")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="measure on a Ray cluster, one actor per GPU (kernel_gym.measure.farm; needs "
                        "pip install 'kernel_gym[ray]'): no ADDRESS starts a local cluster, 'auto' or HOST:PORT joins "
                        "one started with `ray start --head`; with --noise, the study runs on every GPU")
    p.add_argument("--allow-open-cluster", action="store_true",
                   help="--ray without ADDRESS on a Ray older than 2.52: start the local cluster (127.0.0.1) without "
                        "token authentication")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kernel_gym.measure import collect
    from kernel_gym.measure.timing import TimingOptions

    if args.configs_per_shape < 1:
        raise SystemExit(f"--configs-per-shape must be >= 1, got {args.configs_per_shape}")
    grids = _csv(args.grid)
    bad = [g for g in grids if g not in ("eval", "default", "small")]
    if bad:
        raise SystemExit(f"--grid: unknown grid(s) {bad}; use eval, default, small")
    timing = TimingOptions(min_reps=args.min_reps, max_reps=max(args.min_reps, args.max_reps))
    opts = collect.CollectOptions(models=_csv(args.model), kernels=_csv(args.kernels), grids=grids,
                                  configs_per_shape=args.configs_per_shape, budget_s=args.budget_s, db=args.db,
                                  out=args.out, gpus=args.gpus, compile_workers=args.compile_workers,
                                  device=args.device, seed=args.seed, timing=timing,
                                  remeasure_noisy=args.remeasure_noisy, plan_file=args.plan)
    if args.ray is not None and not args.dry_run:
        return _on_farm(opts, args.ray or None, args.allow_open_cluster, args.noise, args.noise_out)
    if args.noise:
        _print_noise(collect.noise_study(args.db, args.noise, device=args.device, seed=args.seed, timing=timing),
                     args.noise_out)
        return 0
    if args.dry_run:
        print(json.dumps(collect.dry_run(opts), indent=2))
        return 0
    res = collect.collect(opts)
    print(json.dumps(res))
    return 0 if not any(res["shard_exit_codes"]) else 1


def _on_farm(opts: CollectOptions, address: str | None, allow_open_cluster: bool, noise: int, noise_out: str) -> int:
    """collect --ray: the collection (or the noise study) on a Ray cluster (exit 2 with the install line without
    Ray)."""
    from kernel_gym.measure import farm

    try:
        farm.require_ray()
    except farm.RayMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    cluster = farm.FarmOptions(address=address, allow_open_cluster=allow_open_cluster)
    if noise:
        _print_noise(farm.farm_noise_study(opts, noise, cluster), noise_out)
        return 0
    res = farm.collect_farm(opts, cluster)
    print(json.dumps(res))
    return 0 if not any(res["shard_exit_codes"]) else 1


def _print_noise(res: dict, noise_out: str) -> None:
    text = json.dumps(res, indent=2)
    print(text)
    if noise_out:
        Path(noise_out).write_text(text + "\n")
