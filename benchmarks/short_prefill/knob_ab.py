"""GPU: an attention knob turned on against the same kernels with it off and against the SDPA anchors, all in one run
(issue 29, points 1 and 2): PACK_GQA, MAXNREG, or any knob of the prefill or prefix-prefill space with two values, 0
(off) and one other (the sessions' experiments ran their knobs through it: benchmarks/short_prefill/README.md).

PACK_GQA=1 runs every q head of one kv head in one program: a tile's BLOCK_M rows are BLOCK_M / group tokens x the
group's heads (kernels/attention.py), so each K/V block is read once per group and the causal diagonal is cut group
times finer, what many short sequences lack. Per benchmark case of the families that have the knob (for PACK_GQA the
GQA cases), it times the same tile grid at each of the knob's values, PACK_GQA 0 and 1 included wherever the case
has GQA, plus (prefill) every valid Gluon config and (prefix) the config of the case's committed record and its
variants, through `kernel-gym bench`'s own machinery (kernel_gym.bench.run_bench: each config checked against the
fp32 reference before it is timed, L2 flushed, median of 10-40 samples, near ties timed again; the anchor measured
in the same run).

    python3 benchmarks/short_prefill/knob_ab.py --knob PACK_GQA --out $OUT/ab             # GPU, ~5 min
    python3 benchmarks/short_prefill/knob_ab.py --out benchmarks/short_prefill/<the run's folder> \\
        --merge-into benchmarks/h200_kernels.json                   # CPU, after the GPU run: its records replace these

Writes per family <family>.json (bench records), <family>_details.json (every config tried) and <family>.md, and
compare.json after each family; prints a table last: per case the best config at each of the knob's values, the anchor
and both ratios, and the twins' speedup (knob 0's best / knob 1's best over the configs timed at both values). Imports
only torch, triton, the standard library and kernel_gym.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ATTENTION = ("prefill_attention", "prefix_prefill")
RECORDS = Path(__file__).resolve().parents[1] / "h200_kernels.json"  # the committed records (their configs)


def log(msg: str) -> None:
    print(f"[knob_ab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _tiles() -> list[dict]:
    """The tile grid both families share: 64-row tiles on 4 warps and 128-row tiles on 8 (one 64-row wgmma per
    warpgroup), 32-row tiles for packed GQA groups, BLOCK_N 32-128, 1-3 stages."""
    out = []
    for (bm, warps), bn, stages in itertools.product(((32, 4), (64, 4), (128, 8)), (32, 64, 128), (1, 2, 3)):
        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages))
    return out


def families(knob: str) -> tuple[str, ...]:
    """The attention families whose space has the knob."""
    from kernel_gym.kernels import get_family

    return tuple(f for f in ATTENTION if knob in get_family(f).space.names)


def check_knob(knob: str) -> None:
    """Raises SystemExit unless some attention family has the knob with two values, 0 (off) and one other."""
    from kernel_gym.kernels import get_family

    binary = [f for f in families(knob) if len(vals := get_family(f).space.knob(knob).values) == 2 and vals[0] == 0]
    if not binary:
        raise SystemExit(f"--knob {knob}: no attention family ({', '.join(ATTENTION)}) has a knob {knob} with values "
                         "0 and one other; use PACK_GQA or add the knob to a family's space first")


def candidates(family, workload, knob: str = "PACK_GQA") -> list:
    """The configs one case times (kernel_gym.bench.run_bench's `candidates`): the tile grid at each of the knob's
    values and PACK_GQA 0 and 1 (where the case has GQA), plus the family's extra picks."""
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
        grid += [{k: v for k, v in c.items() if k not in ("PACK_GQA", knob)} for c in recorded]
    values = space.knob(knob).values
    for base in grid:
        for pack, value in itertools.product((0, 1) if group > 1 else (0,), values):
            config = space.config({**base, "PACK_GQA": pack, knob: value})
            if space.is_valid(config, workload):
                picks.append(config)
    return list(dict.fromkeys(picks))


def knob_cases(family_name: str, knob: str) -> list[str]:
    """The family's bench cases the knob can change: for PACK_GQA those with GQA, otherwise all."""
    import importlib

    from kernel_gym.kernels import FAMILY_MODULES

    cases = importlib.import_module(FAMILY_MODULES[family_name]).bench_cases()
    return [c for c, w in cases if knob != "PACK_GQA" or w.num_heads > w.num_kv_heads]


def run(out: Path, knob: str, budget_s: float, compile_workers: int, only: tuple[str, ...] = ()) -> list[dict]:
    """Time the knob's cases family by family (only those in `only`, when given), writing each family's files and
    compare.json after each family (so a family that fails keeps the ones before it)."""
    from kernel_gym import bench

    bench.BENCH_COMPILE_WORKERS = compile_workers  # attention inputs are small: more compile processes fit
    start, rows = time.time(), []
    for family_name in (f for f in families(knob) if not only or f in only):
        path = out / f"{family_name}.json"
        partial = lambda records, p=path: p.write_text(json.dumps(records, indent=1))  # noqa: E731
        left = budget_s - (time.time() - start)
        result = bench.run_bench([family_name], 0, left, log=log, on_case=partial,
                                 cases=knob_cases(family_name, knob),
                                 candidates=lambda fam, w: candidates(fam, w, knob))
        path.write_text(json.dumps(result["records"], indent=1))
        (out / f"{family_name}_details.json").write_text(
            json.dumps({"env": result["env"], "details": result["details"]}, indent=1))
        (out / f"{family_name}.md").write_text(bench.to_markdown(result))
        rows += compare(result, knob)
        (out / "compare.json").write_text(json.dumps(rows, indent=1))
    return rows


def compare(result: dict, knob: str = "PACK_GQA") -> list[dict]:
    """Per case: the fastest correct config with the knob off (0) and on (its other value; any kernel: the Gluon
    configs count as off), the anchor's time and both ratios (keys value0_*, value1_*); and twin_speedup, the fastest
    time off / the fastest on over the configs timed both ways (the same tiles with and without the knob)."""
    from kernel_gym.kernels.space import Config

    rows = []
    for case, d in result["details"].items():
        if "tried" not in d:
            rows.append({"case": case, "error": d.get("error", "no configs timed")})
            continue
        anchor = d.get("sdpa") or d.get("sdpa_prefix") or {}
        row = {"case": case, "knob": knob, "anchor_ms": anchor.get("ms"), "anchor_variant": anchor.get("variant")}
        timed = {m["config"]: m for m in d["tried"] if m["status"] == "ok" and m["median_ms"]}
        for value in (0, 1):
            ok = [m for m in timed.values() if bool(int(json.loads(m["config"]).get(knob, 0))) == bool(value)]
            best = min(ok, key=lambda m: m["median_ms"], default=None)
            row[f"value{value}_ms"] = best["median_ms"] if best else None
            row[f"value{value}_config"] = best["config"] if best else None
            row[f"value{value}_ratio"] = (anchor["ms"] / best["median_ms"]) if best and anchor.get("ms") else None
            row[f"value{value}_power"] = best.get("power") if best else None  # the GPU's state while it was timed
        on = {json.loads(c)[knob] for c in timed if json.loads(c).get(knob, 0)}  # the knob's value other than 0
        twins = [(m["median_ms"], timed[t]["median_ms"]) for c, m in timed.items() for v in on
                 if not json.loads(c).get(knob, 0) and (t := str(Config({**json.loads(c), knob: v}))) in timed]
        row["twin_speedup"] = (min(a for a, _ in twins) / min(b for _, b in twins)) if twins else None
        rows.append(row)
    return rows


def table(rows: list[dict], knob: str = "PACK_GQA") -> str:
    lines = [f"{'case':<30} {'anchor ms':>9} {knob + '=0 ms':>13} {'ratio':>6} {knob + '=1 ms':>13} {'ratio':>6} "
             f"{'twins':>6}  {knob}=1 config"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:<30} {r['error'][:80]}")
            continue
        f = lambda x, n=4: "-" if x is None else f"{x:.{n}f}"  # noqa: E731
        lines.append(f"{r['case']:<30} {f(r['anchor_ms']):>9} {f(r['value0_ms']):>13} {f(r['value0_ratio'], 3):>6} "
                     f"{f(r['value1_ms']):>13} {f(r['value1_ratio'], 3):>6} {f(r.get('twin_speedup'), 3):>6}  "
                     f"{r['value1_config']}")
    return "\n".join(lines)


def merge_records(folder: Path, target: Path) -> int:
    """Put the run's records into `target` (benchmarks/h200_kernels.json), replacing the records of the same (kernel,
    case, anchor) and tagging each with the run's folder and commit.txt; every other record stays."""
    commit = folder / "commit.txt"
    tag = folder.name + (f"@{commit.read_text().split()[1]}" if commit.exists() else "")
    new = []
    paths = [folder / f"{family_name}.json" for family_name in ATTENTION]
    if not any(p.exists() for p in paths):
        raise SystemExit(f"{folder} has none of {[p.name for p in paths]}: run this script on the GPU with --out "
                         f"{folder} first")
    for path in paths:
        if path.exists():
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
    p.add_argument("--knob", default="PACK_GQA", help="the knob whose two values (0 and one other) are compared")
    p.add_argument("--families", default="", help="comma-separated families to run (default: every one with the knob)")
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

    check_knob(args.knob)
    only = tuple(f for f in args.families.split(",") if f)
    unknown = [f for f in only if f not in families(args.knob)]
    if unknown:
        raise SystemExit(f"--families {','.join(unknown)}: not an attention family with {args.knob}; use some of "
                         f"{', '.join(families(args.knob))}")
    if not torch.cuda.is_available():
        raise SystemExit("knob_ab.py times kernels on a CUDA GPU; run it on the GPU machine")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = run(args.out, args.knob, args.budget_s, args.compile_workers, only)
    print(table(rows, args.knob))
    return 0


if __name__ == "__main__":
    sys.exit(main())
