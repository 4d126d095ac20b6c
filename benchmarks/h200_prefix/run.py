"""The paged-prefix prefill kernel on the H200 in one command (issue 29): bf16 correctness, the benchmark against the
sdpa_prefix anchor, and dataset rows over the prefill grid's new prefix-length axis.

Steps, each within its share of --budget-s:
  1. bench (--bench-share of it, default 55%): `kernel-gym bench --kernels prefix_prefill` logic
     (kernel_gym.bench.run_bench): per case the default config and a seeded sample of --configs valid configs,
     each checked against the fp32 torch reference on NaN-filled outputs (launched twice) before it is timed (L2
     flushed, median of 10-40 samples, spread kept), near ties re-timed; the best against the sdpa_prefix anchor
     measured in the same run (torch SDPA over a contiguous prefix + chunk, bottom-right causal mask, the fastest
     correct backend variant; every variant's time is kept). Writes $OUT/h200_prefix.json (records: kernel, case,
     config, ms, value, anchor "sdpa_prefix", anchor_value, ratio_to_anchor, default_ms),
     $OUT/h200_prefix_details.json (every config tried with median and spread, the anchor variants) and
     $OUT/h200_prefix.md.
  2. collect (the rest): measurements of prefix_prefill on Mixtral's default grid (chunks 128-4096 x prefixes
     0-32k x {one request, a mixed batch of four}; --per-shape sampled configs plus the default per shape) into
     $OUT/prefix_prefill.sqlite (kernel_gym.measure.store format) and a snapshot $OUT/prefix_prefill.jsonl.gz that
     `kernel-gym data --merge` adds to the dataset.
Prints progress, then a table of the bench records.

    python3 benchmarks/h200_prefix/run.py --out $OUT/prefix --budget-s 330          # GPU
    python3 benchmarks/h200_prefix/run.py --out /tmp/pp_smoke --smoke                 # CPU: interpreter, tiny
    python3 benchmarks/h200_prefix/run.py --out benchmarks/h200_prefix --merge-into benchmarks/h200_kernels.json

Imports only torch, triton, numpy, the standard library and kernel_gym.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def log(msg: str) -> None:
    print(f"[prefix_study {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_bench_step(out: Path, configs: int, budget_s: float, seed: int) -> list[dict]:
    from kernel_gym import bench

    path = out / "h200_prefix.json"
    partial = lambda records: path.write_text(json.dumps(records, indent=1))  # noqa: E731
    result = bench.run_bench(["prefix_prefill"], configs, budget_s, seed=seed, log=log, on_case=partial,
                             n_recorded=0)
    path.write_text(json.dumps(result["records"], indent=1))
    (out / "h200_prefix_details.json").write_text(json.dumps({"env": result["env"], "details": result["details"]},
                                                             indent=1))
    (out / "h200_prefix.md").write_text(bench.to_markdown(result))
    return result["records"]


def run_collect_step(out: Path, per_shape: int, budget_s: float, device: str, grid: str) -> dict:
    from kernel_gym.measure.collect import CollectOptions, collect

    opts = CollectOptions(models=["mixtral-8x7b"], kernels=["prefix_prefill"], grids=[grid],
                          configs_per_shape=per_shape, budget_s=budget_s, db=str(out / "prefix_prefill.sqlite"),
                          out=str(out / "prefix_prefill.jsonl.gz"), device=device)
    return collect(opts)


def merge_records(source: Path, target: Path) -> int:
    """Replace target's prefix_prefill records by source's, tagged with the run's folder (and commit.txt); the other
    kernels' records stay as they are."""
    if not source.exists():
        raise SystemExit(f"{source} is absent: run the GPU study with --out {source.parent} first")
    new = [r for r in json.loads(source.read_text()) if r.get("kernel") == "prefix_prefill"]
    commit = source.parent / "commit.txt"  # the tree the GPU ran, when the run's folder records it
    tag = source.parent.name + (f"@{commit.read_text().strip()}" if commit.exists() else "")
    new = [{**r, "run": r.get("run", tag)} for r in new]
    if not new:
        raise SystemExit(f"{source} holds no prefix_prefill records (a failed or empty run): nothing merged")
    old = json.loads(target.read_text()) if target.exists() else []
    target.write_text(json.dumps([r for r in old if r.get("kernel") != "prefix_prefill"] + new, indent=1))
    return len(new)


def table(records: list[dict]) -> str:
    lines = [f"{'case':<28} {'best ms':>9} {'TF/s':>7} {'sdpa ms':>9} {'ratio':>6} {'default ms':>10}  config"]
    for r in records:
        anchor_ms = r["ms"] * r["ratio_to_anchor"]
        default = f"{r['default_ms']:.4f}" if r["default_ms"] else "failed"
        lines.append(f"{r['case']:<28} {r['ms']:>9.4f} {r['value']:>7.1f} {anchor_ms:>9.4f} "
                     f"{r['ratio_to_anchor']:>6.3f} {default:>10}  {json.dumps(r['config'], sort_keys=True)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the results (created)")
    p.add_argument("--budget-s", type=float, default=330.0, help="seconds for both steps together")
    p.add_argument("--configs", type=int, default=24, help="sampled configs per bench case (plus the default)")
    p.add_argument("--per-shape", type=int, default=6, help="sampled configs per dataset shape (plus the default)")
    p.add_argument("--bench-share", type=float, default=0.55, help="share of --budget-s for the bench step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="CPU: the collect step on the interpreter's small grid")
    p.add_argument("--merge-into", type=Path, default=None, metavar="JSON",
                   help="CPU, after a GPU run: put --out's h200_prefix.json records into this records file (e.g. "
                        "benchmarks/h200_kernels.json), replacing its prefix_prefill records")
    args = p.parse_args(argv)
    if args.merge_into is not None:
        n = merge_records(args.out / "h200_prefix.json", args.merge_into)
        log(f"{args.merge_into}: {n} prefix_prefill records from {args.out / 'h200_prefix.json'}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        summary = run_collect_step(args.out, 1, args.budget_s, "cpu", "small")
        log(f"smoke collect: {summary} (the grid is bf16, which the interpreter computes wrongly: wrong_result rows "
            "are expected here; the point is the path)")
        (args.out / "summary.json").write_text(json.dumps({"collect": summary}, indent=1))
        return 0 if summary["written"] > 0 else 1
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("prefix_prefill_study needs a CUDA GPU (or --smoke on the CPU)")
    if not 0 < args.bench_share <= 1:
        raise SystemExit(f"--bench-share {args.bench_share}: give a fraction in (0, 1]")
    records = run_bench_step(args.out, args.configs, args.bench_share * args.budget_s, args.seed)
    log(f"bench: {len(records)} records in {time.time() - t0:.0f} s")
    left = args.budget_s - (time.time() - t0)
    summary: dict = {"bench_records": len(records), "bench_s": time.time() - t0}
    if left > 20:
        summary["collect"] = run_collect_step(args.out, args.per_shape, left - 10, "cuda", "default")
        log(f"collect: {summary['collect']}")
    else:
        log(f"no time left for collect ({left:.0f} s)")
    summary["seconds"] = time.time() - t0
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
