"""GPU: the PACK_GQA knob (prefill and prefix prefill) against the same kernels without it and against the SDPA
anchors, all in one run (issue 29, points 1 and 2).

PACK_GQA=1 runs every q head of one kv head in one program: a tile's BLOCK_M rows are BLOCK_M / group tokens x the
group's heads (kernels/attention.py), so each K/V block is read once per group and the causal diagonal is cut group
times finer, what many short sequences lack. Per benchmark case with GQA (the prefill family's five, the prefix
family's eight), it times the same tile grid with PACK_GQA 0 and 1, plus (prefill) every valid Gluon config and
(prefix) the config of the case's committed record and its PACK_GQA variant, through `kernel-gym bench`'s own
machinery (kernel_gym.bench.run_bench: each config checked against the fp32 reference before it is timed, L2
flushed, median of 10-40 samples, near ties re-timed; the anchor measured in the same run).

    python3 benchmarks/short_prefill/pack_gqa.py --out $OUT/pack_gqa                 # GPU, ~5 min
    python3 benchmarks/short_prefill/pack_gqa.py --out benchmarks/short_prefill/run3_pack \\
        --merge-into benchmarks/h200_kernels.json                                      # CPU, after the GPU run

Writes per family <family>.json (bench records), <family>_details.json (every config tried) and <family>.md; prints
a table last: per case the best without PACK_GQA, the best with it, the anchor and both ratios. Imports only torch,
triton, the standard library and kernel_gym.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FAMILIES = ("prefill_attention", "prefix_prefill")
RECORDS = Path(__file__).resolve().parents[1] / "h200_kernels.json"  # the committed records (their configs)


def log(msg: str) -> None:
    print(f"[pack_gqa {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _tiles() -> list[dict]:
    """The tile grid both families share: 64-row tiles on 4 warps and 128-row tiles on 8 (one 64-row wgmma per
    warpgroup), 32-row tiles for packed GQA groups, BLOCK_N 32-128, 1-3 stages."""
    out = []
    for (bm, warps), bn, stages in itertools.product(((32, 4), (64, 4), (128, 8)), (32, 64, 128), (1, 2, 3)):
        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages))
    return out


def candidates(family, workload) -> list:
    """The configs one case times (kernel_gym.bench.run_bench's `candidates`)."""
    space = family.space
    group = workload.num_heads // workload.num_kv_heads
    picks = []
    if family.name == "prefill_attention":
        picks += [c for c in space.valid_configs(workload) if space.value(c, "IMPL") != "triton"]
        grid = _tiles()
    else:
        grid = [dict(t, PAGE_SIZE=page, LAYOUT="NHD", NUM_SPLITS=1) for t in _tiles() for page in (16, 64)
                if t["BLOCK_N"] <= 64 and t["num_stages"] >= 2]
        recorded = [r["config"] for r in json.loads(RECORDS.read_text()) if r["kernel"] == family.name
                    and r["workload"] == json.loads(workload.key())] if RECORDS.exists() else []
        grid += [{k: v for k, v in c.items() if k != "PACK_GQA"} for c in recorded]
    for base in grid:
        for pack in ((0, 1) if group > 1 else (0,)):
            config = space.config({**base, "PACK_GQA": pack})
            if space.is_valid(config, workload):
                picks.append(config)
    return list(dict.fromkeys(picks))


def gqa_cases(family_name: str) -> list[str]:
    import importlib

    from kernel_gym.kernels import FAMILY_MODULES

    cases = importlib.import_module(FAMILY_MODULES[family_name]).bench_cases()
    return [c for c, w in cases if w.num_heads > w.num_kv_heads]


def run(out: Path, budget_s: float, compile_workers: int) -> list[dict]:
    from kernel_gym import bench

    bench.BENCH_COMPILE_WORKERS = compile_workers  # attention inputs are small: more compile processes fit
    start, rows = time.time(), []
    for family_name in FAMILIES:
        path = out / f"{family_name}.json"
        partial = lambda records, p=path: p.write_text(json.dumps(records, indent=1))  # noqa: E731
        left = budget_s - (time.time() - start)
        result = bench.run_bench([family_name], 0, left, log=log, on_case=partial, cases=gqa_cases(family_name),
                                 candidates=candidates)
        path.write_text(json.dumps(result["records"], indent=1))
        (out / f"{family_name}_details.json").write_text(
            json.dumps({"env": result["env"], "details": result["details"]}, indent=1))
        (out / f"{family_name}.md").write_text(bench.to_markdown(result))
        rows += compare(result)
    return rows


def compare(result: dict) -> list[dict]:
    """Per case: the fastest correct config without and with PACK_GQA, the anchor's time and both ratios."""
    rows = []
    for case, d in result["details"].items():
        if "tried" not in d:
            rows.append({"case": case, "error": d.get("error", "no configs timed")})
            continue
        anchor = d.get("sdpa") or d.get("sdpa_prefix") or {}
        row = {"case": case, "anchor_ms": anchor.get("ms"), "anchor_variant": anchor.get("variant")}
        for pack in (0, 1):
            ok = [m for m in d["tried"] if m["status"] == "ok" and m["median_ms"]
                  and int(json.loads(m["config"]).get("PACK_GQA", 0)) == pack]
            best = min(ok, key=lambda m: m["median_ms"], default=None)
            row[f"pack{pack}_ms"] = best["median_ms"] if best else None
            row[f"pack{pack}_config"] = best["config"] if best else None
            row[f"pack{pack}_ratio"] = (anchor["ms"] / best["median_ms"]) if best and anchor.get("ms") else None
            row[f"pack{pack}_power"] = best.get("power") if best else None  # the GPU's state while it was timed
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'case':<30} {'anchor ms':>9} {'no-pack ms':>10} {'ratio':>6} {'pack ms':>9} {'ratio':>6}  pack config"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:<30} {r['error'][:80]}")
            continue
        f = lambda x, n=4: "-" if x is None else f"{x:.{n}f}"  # noqa: E731
        lines.append(f"{r['case']:<30} {f(r['anchor_ms']):>9} {f(r['pack0_ms']):>10} {f(r['pack0_ratio'], 3):>6} "
                     f"{f(r['pack1_ms']):>9} {f(r['pack1_ratio'], 3):>6}  {r['pack1_config']}")
    return "\n".join(lines)


def merge_records(folder: Path, target: Path) -> int:
    """Put the run's records into `target` (benchmarks/h200_kernels.json), replacing the records of the same (kernel,
    case, anchor) and tagging each with the run's folder and commit.txt; every other record stays."""
    commit = folder / "commit.txt"
    tag = folder.name + (f"@{commit.read_text().split()[1]}" if commit.exists() else "")
    new = []
    for family_name in FAMILIES:
        path = folder / f"{family_name}.json"
        if not path.exists():
            raise SystemExit(f"{path} is absent: run this script on the GPU with --out {folder} first")
        new += [{**r, "run": tag} for r in json.loads(path.read_text())]
    if not new:
        raise SystemExit(f"{folder} holds no records (a failed or empty run): nothing merged")
    keys = {(r["kernel"], r["case"], r["anchor"]) for r in new}
    old = json.loads(target.read_text()) if target.exists() else []
    target.write_text(json.dumps([r for r in old if (r["kernel"], r["case"], r["anchor"]) not in keys] + new,
                                 indent=1))
    return len(new)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the results (created)")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting new cases after this many seconds")
    p.add_argument("--compile-workers", type=int, default=12, help="compile processes ahead of the timing")
    p.add_argument("--merge-into", type=Path, default=None, metavar="JSON",
                   help="CPU, after a GPU run: put --out's records into this records file")
    args = p.parse_args(argv)
    if args.merge_into is not None:
        n = merge_records(args.out, args.merge_into)
        log(f"{args.merge_into}: {n} records from {args.out}")
        return 0
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("pack_gqa.py times kernels on a CUDA GPU; run it on the GPU machine")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = run(args.out, args.budget_s, args.compile_workers)
    (args.out / "compare.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
