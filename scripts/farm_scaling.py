"""Farm scaling: the same fused-MoE plan collected on 1, 2, 4, ... N GPUs of one host; wall time, measurements per
second, GPU idle share, efficiency, and whether every GPU picks the same winners -> scaling.json.

    python3 scripts/farm_scaling.py --gpus 8 --out benchmarks/multigpu                  # GPU host
    python3 scripts/farm_scaling.py --gpus 8 --out benchmarks/multigpu --ray            # with Ray installed

Per GPU count n: a fresh store, the same plan (written once to OUT/plan.json: `collect`'s own plan for --model,
kernel fused_moe, grid --grid, --configs-per-shape configs), collected with `scripts/collect.py --plan ... --gpus n`
(the plain multi-GPU path: one shard process per GPU, CUDA_VISIBLE_DEVICES) or, with --ray, `collect --ray --gpus n`
(kernel_gym/measure/farm.py, one actor per GPU). The GPU machines this project is lent have torch, triton and numpy
only, and no Ray (its wheel is not carried there, docs/measurement.md): the plain path is the default, and --ray needs
`pip install ray` on that host first.

Figures, all from the stores' own rows (neither path records per-worker busy time):
- measurements_per_s = rows stored / wall time of the collect command; efficiency = rate_n / (n x rate_1).
- gpu_idle_share = 1 - sum over GPUs of (last commit - start) / (n x wall): the tail a GPU spends with nothing left
  and start-up (idle inside a chunk, e.g. waiting on compiles, is not visible in the rows).
- winner agreement: the plan's workloads re-measured on every GPU (each GPU alone, its K fastest configs from the
  1-GPU run); a workload agrees when every GPU's winner is the same config, or, after the disagreeing configs are
  re-measured once more on every GPU, every GPU's time for the common winner (the config fastest in the sum over GPUs)
  is within --tie of its own best. Target >= 95% of workloads.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def write_plan(args: argparse.Namespace, path: Path) -> int:
    from kernel_gym.measure.collect import CollectOptions, build_plan

    opts = CollectOptions(models=[args.model], kernels=["fused_moe"], grids=[args.grid],
                          configs_per_shape=args.configs_per_shape, seed=0)
    entries = [{"kernel": i.kernel, "workload": i.workload_key, "configs": list(i.configs)}
               for chunks in build_plan(opts) for i in chunks]
    path.write_text(json.dumps(entries) + "\n")
    return sum(len(e["configs"]) for e in entries)


def collect(plan: Path, db: Path, gpus: int, visible: str, ray: bool, extra: list[str]) -> float:
    """Run one collection; returns its wall time. visible: CUDA_VISIBLE_DEVICES for it."""
    cmd = [sys.executable, str(ROOT / "scripts" / "collect.py"), "--plan", str(plan), "--kernels", "fused_moe",
           "--db", str(db), "--gpus", str(gpus), *extra] + (["--ray"] if ray else [])
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible)
    t0 = time.time()
    subprocess.run(cmd, env=env, check=True)
    return time.time() - t0


def rows(db: Path) -> list[dict]:
    con = sqlite3.connect(str(db))
    con.row_factory = sqlite3.Row
    out = [dict(r) for r in con.execute("SELECT workload, config, status, median_ms, created, gpu FROM measurements")]
    con.close()
    return out


def idle_share(rs: list[dict], t0: float, wall: float, gpus: int) -> float:
    last: dict[str, float] = {}
    for r in rs:
        last[r["gpu"]] = max(last.get(r["gpu"], t0), r["created"])
    busy = sum(min(v, t0 + wall) - t0 for v in last.values())
    return max(0.0, 1.0 - busy / (gpus * wall))


def best_by_workload(rs: list[dict]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r in rs:
        if r["status"] == "ok" and r["median_ms"]:
            out.setdefault(r["workload"], {})[r["config"]] = r["median_ms"]
    return out


def per_gpu(plan_entries: list[dict], tag: str, out: Path, n: int, extra: list[str]) -> list[dict[str, dict]]:
    """The entries measured on each GPU alone, all GPUs at once (one process per GPU); times per GPU."""
    plan = out / f"{tag}_plan.json"
    plan.write_text(json.dumps(plan_entries) + "\n")
    procs, dbs = [], []
    for g in range(n):
        db = out / f"{tag}_gpu{g}.sqlite"
        db.unlink(missing_ok=True)
        dbs.append(db)
        cmd = [sys.executable, str(ROOT / "scripts" / "collect.py"), "--plan", str(plan), "--kernels", "fused_moe",
               "--db", str(db), "--gpus", "1", *extra]
        procs.append(subprocess.Popen(cmd, env=dict(os.environ, CUDA_VISIBLE_DEVICES=str(g))))
    for p in procs:
        if p.wait():
            raise SystemExit(f"farm_scaling: a per-GPU collection exited {p.returncode}")
    return [best_by_workload(rows(db)) for db in dbs]


def agreement(one_gpu: dict[str, dict[str, float]], n: int, out: Path, top: int, tie: float,
              extra: list[str]) -> dict:
    entries = [{"kernel": "fused_moe", "workload": w, "configs": [c for c, _ in sorted(t.items(),
                                                                                      key=lambda x: x[1])[:top]]}
               for w, t in one_gpu.items()]
    first = per_gpu(entries, "agree", out, n, extra)
    disagree = {}
    for e in entries:
        w = e["workload"]
        winners = {min(g[w], key=g[w].get) for g in first if g.get(w)}
        if len(winners) > 1:
            disagree[w] = sorted(winners)
    second = per_gpu([{"kernel": "fused_moe", "workload": w, "configs": cs} for w, cs in disagree.items()],
                     "tie", out, n, extra) if disagree else []
    agreed_after = 0
    for w, cs in disagree.items():
        times = [g.get(w, {}) for g in second]
        if not all(all(c in t for c in cs) for t in times):
            continue
        common = min(cs, key=lambda c: sum(t[c] for t in times))
        agreed_after += all(t[common] <= (1 + tie) * min(t.values()) for t in times)
    total = len(entries)
    same = total - len(disagree)
    return {"workloads": total, "same_winner_first_pass": same, "near_ties_remeasured": len(disagree),
            "agree_after_remeasure": agreed_after, "share": (same + agreed_after) / total if total else None,
            "tie": tie, "configs_per_workload": top}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, required=True, help="GPUs on this host; runs 1, 2, 4, ... up to it")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="mixtral-8x7b")
    ap.add_argument("--grid", default="default", help="collect's shape grid for the plan")
    ap.add_argument("--configs-per-shape", type=int, default=48)
    ap.add_argument("--plan", default="", help="use this plan file instead of writing one")
    ap.add_argument("--ray", action="store_true", help="collect --ray (needs Ray on this host)")
    ap.add_argument("--agree-top", type=int, default=8, help="fastest configs per workload in the agreement study")
    ap.add_argument("--tie", type=float, default=0.02, help="within this fraction of a GPU's best = a near tie")
    ap.add_argument("--collect-args", default="", help="extra collect.py arguments, space separated")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = args.collect_args.split()
    plan = Path(args.plan) if args.plan else out / "plan.json"
    planned = write_plan(args, plan) if not args.plan else None
    counts = [c for c in (1, 2, 4, 8, 16) if c <= args.gpus]
    runs = []
    for n in counts:
        db = out / f"scaling_{n}gpu.sqlite"
        db.unlink(missing_ok=True)
        t0 = time.time()
        wall = collect(plan, db, n, ",".join(map(str, range(n))), args.ray, extra)
        rs = rows(db)
        runs.append({"gpus": n, "wall_s": wall, "rows": len(rs), "ok_rows": sum(r["status"] == "ok" for r in rs),
                     "measurements_per_s": len(rs) / wall, "gpu_idle_share": idle_share(rs, t0, wall, n)})
        print(f"[scaling] {n} GPU(s): {len(rs)} rows in {wall:.0f} s", file=sys.stderr)
    rate1 = runs[0]["measurements_per_s"]
    result = {"gpus": counts, "measurements_per_s": [r["measurements_per_s"] for r in runs],
              "efficiency": [r["measurements_per_s"] / (r["gpus"] * rate1) for r in runs],
              "wall_s": [r["wall_s"] for r in runs], "gpu_idle_share": [r["gpu_idle_share"] for r in runs],
              "runs": runs, "plan": str(plan), "planned_configs": planned, "path": "ray" if args.ray else "plain",
              "target": {"efficiency": 0.9, "winner_agreement": 0.95}}
    if args.gpus >= 2:
        result["winner_agreement"] = agreement(best_by_workload(rows(out / "scaling_1gpu.sqlite")), args.gpus, out,
                                               args.agree_top, args.tie, extra)
    (out / "scaling.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("gpus", "measurements_per_s", "efficiency", "gpu_idle_share")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
