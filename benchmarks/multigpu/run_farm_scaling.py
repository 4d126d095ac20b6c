"""Farm scaling: the same fused-MoE plan collected on 1, 2, 4, ... N GPUs of one host; wall time, measurements per
second, GPU idle share, efficiency, and whether every GPU picks the same winners -> scaling.json.

    python3 benchmarks/multigpu/run_farm_scaling.py --gpus 8 --out benchmarks/multigpu          # GPU host
    python3 benchmarks/multigpu/run_farm_scaling.py --gpus 8 --out benchmarks/multigpu --ray    # with Ray installed

Per GPU count n: a fresh store, the same plan (written once to OUT/plan.json: `collect`'s own plan for --model,
kernel fused_moe, grid --grid, --configs-per-shape configs), collected with `scripts/collect.py --plan ... --gpus n`
(the plain multi-GPU path: one shard process per GPU, CUDA_VISIBLE_DEVICES) or, with --ray, `collect --ray --gpus n`
(kernel_gym/measure/farm.py, one actor per GPU). The GPU machines this project is lent have torch, triton and numpy
only, and no Ray (its wheel is not carried there, docs/measurement.md): the plain path is the default, and --ray needs
`pip install ray` on that host first.

Figures, all from the stores' own rows (neither path records per-worker busy time):
- measurements_per_s = rows stored / wall time of the collect command; efficiency = rate_n / (n x rate_1).
  steady_measurements_per_s: rows committed after the first commit / (last - first commit), start-up left out.
- gpu_idle_share = 1 - sum over GPUs of (last commit - start) / (n x wall): the tail a GPU spends with nothing left
  and start-up (idle inside a chunk, e.g. waiting on compiles, is not visible in the rows).
- winner agreement: the plan's workloads re-measured on every GPU (each GPU alone, its K fastest configs from the
  1-GPU run); a workload agrees when every GPU's winner is the same config, or, after the disagreeing configs are
  re-measured once more on every GPU, every GPU's time for the common winner (the config fastest in the sum over GPUs)
  is within --tie of its own best. Target >= 95% of workloads.

Fair and bounded: every timed run starts with an empty Triton cache of its own (a cache the 1-GPU run filled would
spare the later runs their compiles and inflate their rates); --budget-s (default 400) is split over the timed runs
(75%: 30 s of start-up each, the rest in proportion to 1 / GPUs) and the agreement study (25%); each collect stops
cleanly at its share (`stopped_by_budget` in scaling.json; the rate stays rows / wall) and is killed 120 s after it;
the agreement's per-GPU collect processes, all running at once, share the host's cores for their compile pools.
--out gets plan.json, scaling.json and the 1-GPU run's rows (scaling_1gpu.jsonl.gz); the SQLite stores go to --work
(a temp folder).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
GRACE_S = 120.0  # past a collect run's --budget-s before it is killed (start-up, the store's export)
STARTUP_S = 30.0  # a collect run's start-up (imports, shard processes, compile pool), given to every run's budget


def write_plan(args: argparse.Namespace, path: Path) -> int:
    from kernel_gym.measure.collect import CollectOptions, build_plan

    opts = CollectOptions(models=[args.model], kernels=["fused_moe"], grids=[args.grid],
                          configs_per_shape=args.configs_per_shape, seed=0)
    entries = [{"kernel": i.kernel, "workload": i.workload_key, "configs": list(i.configs)}
               for chunks in build_plan(opts) for i in chunks]
    path.write_text(json.dumps(entries) + "\n")
    return sum(len(e["configs"]) for e in entries)


def _run(cmd: list[str], env: dict, budget_s: float, what: str) -> float:
    """Run a collect command; its wall time. It gets --budget-s (collect stops cleanly between chunks) and is killed
    `GRACE_S` later (start-up, export) if it still runs; a failure ends farm_scaling with one line."""
    if budget_s > 0:
        cmd = [*cmd, "--budget-s", f"{budget_s:.0f}"]
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env)
    try:
        rc = proc.wait(timeout=budget_s + GRACE_S if budget_s > 0 else None)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise SystemExit(f"farm_scaling: {what} still ran {GRACE_S:.0f} s past its {budget_s:.0f} s budget: "
                         "killed") from None
    if rc:
        raise SystemExit(f"farm_scaling: {what} exited {rc} (its output is above)")
    return time.time() - t0


def _env(visible: str, fresh_cache: bool, work: Path, tag: str) -> dict:
    """The child's environment: CUDA_VISIBLE_DEVICES, and for a timed run an empty Triton cache of its own, so every
    GPU count pays the same compiles (a cache filled by the previous count would inflate the later counts' rates)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible)
    if fresh_cache:
        cache = work / "triton_cache" / tag
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        env["TRITON_CACHE_DIR"] = str(cache)
    return env


def collect(plan: Path, db: Path, gpus: int, visible: str, ray: bool, extra: list[str], budget_s: float = 0.0,
            export: Path | None = None) -> float:
    """Run one timed collection (fresh Triton cache beside `db`); returns its wall time. visible: CUDA_VISIBLE_DEVICES
    for it; export: also write the store's rows there (.jsonl.gz)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "collect.py"), "--plan", str(plan), "--kernels", "fused_moe",
           "--db", str(db), "--gpus", str(gpus), *extra] + (["--ray"] if ray else []) + \
        (["--out", str(export)] if export else [])
    env = _env(visible, True, db.parent, f"scaling_{gpus}gpu")
    return _run(cmd, env, budget_s, f"collect on {gpus} GPU(s)")


def split_budget(budget_s: float, counts: list[int], scaling_share: float = 0.75,
                 overhead_s: float = STARTUP_S) -> tuple[dict[int, float], float]:
    """Seconds for each GPU count's timed run (`overhead_s` of start-up each, the rest in proportion to 1 / n, the
    time a run should take) and for the winner-agreement study (the rest); 0 = no budget."""
    if budget_s <= 0:
        return dict.fromkeys(counts, 0.0), 0.0
    share = scaling_share if max(counts) >= 2 else 1.0
    runs_s = budget_s * share
    fixed = overhead_s if runs_s > 2 * overhead_s * len(counts) else 0.0
    weights = {n: 1.0 / n for n in counts}
    total = sum(weights.values())
    return ({n: fixed + (runs_s - fixed * len(counts)) * w / total for n, w in weights.items()},
            budget_s * (1 - share))


def compile_workers(n_processes: int, cpus: int | None = None) -> int:
    """Compile processes for each of `n_processes` collect processes running at once (collect's default, every core
    but one, in each of 8 processes would start ~8 x 127 compile processes and exhaust the host's memory)."""
    return max(1, (cpus or os.cpu_count() or 2) // n_processes - 1)


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


def steady_rate(rs: list[dict]) -> float | None:
    """Rows committed after the first commit per second until the last one: the rate without the run's start-up
    (None with fewer than two commits)."""
    times = sorted({r["created"] for r in rs})
    if len(times) < 2:
        return None
    after = sum(1 for r in rs if r["created"] > times[0])
    return after / (times[-1] - times[0])


def best_by_workload(rs: list[dict]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r in rs:
        if r["status"] == "ok" and r["median_ms"]:
            out.setdefault(r["workload"], {})[r["config"]] = r["median_ms"]
    return out


def per_gpu(plan_entries: list[dict], tag: str, work: Path, n: int, extra: list[str],
            budget_s: float = 0.0) -> list[dict[str, dict]]:
    """The entries measured on each GPU alone, all GPUs at once (one process per GPU); times per GPU."""
    plan = work / f"{tag}_plan.json"
    plan.write_text(json.dumps(plan_entries) + "\n")
    procs, dbs = [], []
    workers = [] if "--compile-workers" in extra else ["--compile-workers", str(compile_workers(n))]
    budget = ["--budget-s", f"{budget_s:.0f}"] if budget_s > 0 else []
    for g in range(n):
        db = work / f"{tag}_gpu{g}.sqlite"
        db.unlink(missing_ok=True)
        dbs.append(db)
        cmd = [sys.executable, str(ROOT / "scripts" / "collect.py"), "--plan", str(plan), "--kernels", "fused_moe",
               "--db", str(db), "--gpus", "1", *workers, *budget, *extra]
        procs.append(subprocess.Popen(cmd, env=_env(str(g), False, work, tag)))
    deadline = time.time() + budget_s + GRACE_S if budget_s > 0 else None
    try:
        for p in procs:
            left = None if deadline is None else max(1.0, deadline - time.time())
            if p.wait(timeout=left):
                raise SystemExit(f"farm_scaling: a per-GPU collection ({tag}) exited {p.returncode}")
    except subprocess.TimeoutExpired:
        raise SystemExit(f"farm_scaling: the per-GPU collections ({tag}) ran {GRACE_S:.0f} s past their "
                         f"{budget_s:.0f} s budget: killed") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
    return [best_by_workload(rows(db)) for db in dbs]


def agreement(one_gpu: dict[str, dict[str, float]], n: int, work: Path, top: int, tie: float,
              extra: list[str], budget_s: float = 0.0) -> dict:
    entries = [{"kernel": "fused_moe", "workload": w, "configs": [c for c, _ in sorted(t.items(),
                                                                                      key=lambda x: x[1])[:top]]}
               for w, t in one_gpu.items()]
    first = per_gpu(entries, "agree", work, n, extra, budget_s * 2 / 3)
    disagree = {}
    for e in entries:
        w = e["workload"]
        winners = {min(g[w], key=g[w].get) for g in first if g.get(w)}
        if len(winners) > 1:
            disagree[w] = sorted(winners)
    second = per_gpu([{"kernel": "fused_moe", "workload": w, "configs": cs} for w, cs in disagree.items()],
                     "tie", work, n, extra, budget_s / 3) if disagree else []
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
    ap.add_argument("--out", required=True, help="plan.json, scaling.json and the 1-GPU run's rows (.jsonl.gz)")
    ap.add_argument("--work", default="", help="stores, per-GPU plans and Triton caches (default: a temp folder)")
    ap.add_argument("--model", default="mixtral-8x7b")
    ap.add_argument("--grid", default="default", help="collect's shape grid for the plan")
    ap.add_argument("--configs-per-shape", type=int, default=48)
    ap.add_argument("--plan", default="", help="use this plan file instead of writing one")
    ap.add_argument("--ray", action="store_true", help="collect --ray (needs Ray on this host)")
    ap.add_argument("--agree-top", type=int, default=8, help="fastest configs per workload in the agreement study")
    ap.add_argument("--tie", type=float, default=0.02, help="within this fraction of a GPU's best = a near tie")
    ap.add_argument("--budget-s", type=float, default=400.0,
                    help="seconds for all the collections (75%% the timed runs, 30 s each plus the rest in proportion "
                         "to 1 / GPUs; 25%% the agreement study); each collect stops cleanly at its share; 0 = none")
    ap.add_argument("--collect-args", default="", help="extra collect.py arguments, space separated")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="farm_scaling_"))
    work.mkdir(parents=True, exist_ok=True)
    extra = args.collect_args.split()
    plan = Path(args.plan) if args.plan else out / "plan.json"
    if not args.plan:
        write_plan(args, plan)
    planned = sum(len(e["configs"]) for e in json.loads(plan.read_text()))
    counts = [c for c in (1, 2, 4, 8, 16) if c <= args.gpus]
    budgets, agree_budget = split_budget(args.budget_s, counts)
    print(f"[scaling] {planned} configs per run on {counts} GPUs; budget {args.budget_s:.0f} s "
          f"(runs {', '.join(f'{n}: {b:.0f} s' for n, b in budgets.items())}; agreement {agree_budget:.0f} s); "
          f"stores in {work}", file=sys.stderr, flush=True)
    runs = []
    for n in counts:
        db = work / f"scaling_{n}gpu.sqlite"
        db.unlink(missing_ok=True)
        t0 = time.time()
        wall = collect(plan, db, n, ",".join(map(str, range(n))), args.ray, extra, budgets[n],
                       out / "scaling_1gpu.jsonl.gz" if n == 1 else None)
        rs = rows(db)
        runs.append({"gpus": n, "wall_s": wall, "rows": len(rs), "ok_rows": sum(r["status"] == "ok" for r in rs),
                     "steady_measurements_per_s": steady_rate(rs),
                     "planned_configs": planned, "stopped_by_budget": len(rs) < planned, "budget_s": budgets[n],
                     "measurements_per_s": len(rs) / wall, "gpu_idle_share": idle_share(rs, t0, wall, n)})
        print(f"[scaling] {n} GPU(s): {len(rs)} of {planned} rows in {wall:.0f} s"
              + (" (stopped by its budget)" if len(rs) < planned else ""), file=sys.stderr, flush=True)
    rate1 = runs[0]["measurements_per_s"]
    result = {"gpus": counts, "measurements_per_s": [r["measurements_per_s"] for r in runs],
              "efficiency": [r["measurements_per_s"] / (r["gpus"] * rate1) if rate1 else None for r in runs],
              "steady_measurements_per_s": [r["steady_measurements_per_s"] for r in runs],
              "wall_s": [r["wall_s"] for r in runs], "gpu_idle_share": [r["gpu_idle_share"] for r in runs],
              "runs": runs, "plan": str(plan), "planned_configs": planned, "path": "ray" if args.ray else "plain",
              "triton_cache": "empty at the start of every timed run", "target": {"efficiency": 0.9,
                                                                                  "winner_agreement": 0.95}}
    if args.gpus >= 2:
        result["winner_agreement"] = agreement(best_by_workload(rows(work / "scaling_1gpu.sqlite")), args.gpus, work,
                                               args.agree_top, args.tie, extra, agree_budget)
    (out / "scaling.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("gpus", "measurements_per_s", "efficiency", "gpu_idle_share")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
