"""Is the learned policy's held-out shortfall real? Time its choices against the recorded oracle's, paired, on the GPU.

The held-out score (`benchmarks/policy_quality/run.py`) divides the recorded oracle time by the chosen config's recorded
time. The oracle is the minimum over hundreds of single measurements taken in different processes, so it is biased
low by their noise (the winner's curse), and the two times come from different runs. This check removes both: on
the GPU, for every held-out workload, the policy's choice, the recorded oracle config and the recorded runner-ups are
timed in the same process, in rounds with a shuffled order, and the ratio is taken within each round.

    python benchmarks/heldout_live/run.py plan --out benchmarks/heldout_live/plan.json            # CPU: train, choose
    python3 benchmarks/heldout_live/run.py time --plan benchmarks/heldout_live/plan.json --out $OUT/heldout_live.json
    python benchmarks/heldout_live/run.py report --result benchmarks/heldout_live/heldout_live.json   # table

`plan` trains each env's policy exactly as benchmarks/policy_quality/run.py does (same seed and split); `time`
imports only torch, triton, numpy and the standard library (the GPU machine has nothing else).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

ENVS = ("KernelGym/DecodeAttention-v0", "KernelGym/MoE-v0")
MODELS = ("mixtral-8x7b", "olmoe-1b-7b")


def make_plan(args: argparse.Namespace) -> int:
    from kernel_gym.kernels import get_family
    from kernel_gym.measure import make_backend
    from kernel_gym.measure.worker import workload_from_key
    from kernel_gym.train.train import TrainArgs, train

    backend = make_backend("recorded")
    entries = []
    for env_id in args.envs:
        for model in args.models:
            short = env_id.split("/")[-1].lower()
            res = train(TrainArgs(env_id=env_id, model=model, total_timesteps=args.timesteps, seed=args.seed,
                                  eval_freq=0, checkpoint_freq=0, experiment="kernel-gym-heldout-live",
                                  run_name=f"heldout-live-{short}-{model}", tracking_uri=args.tracking_uri,
                                  checkpoint_dir=str(args.checkpoints / f"heldout-live-{short}-{model}"),
                                  progress_bar=False, log_model=False, register_model=False), backend=backend)
            e = res.evaluation
            print(f"{env_id} {model}: recorded held-out geomean {e.geomean_policy:.3f}", flush=True)
            kernel = res.catalogue.kernel
            for row in e.rows:
                workload = workload_from_key(get_family(kernel), row["workload"])
                times = {}
                for c in backend.available_configs(kernel, workload):
                    m = backend.measure(kernel, workload, c)
                    if m.ok and m.median_ms:
                        times[str(c)] = m.median_ms
                ranked = sorted(times, key=times.__getitem__)
                configs = list(dict.fromkeys([row["chosen"], row["oracle_config"], *ranked[:args.runner_ups]]))
                entries.append({"env_id": env_id, "model": model, "kernel": kernel,
                                "workload": json.loads(row["workload"]),
                                "chosen": row["chosen"], "oracle": row["oracle_config"],
                                "recorded_ratio": row["ratio_policy"], "configs": configs,
                                "recorded_ms": {c: times.get(c) for c in configs}})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "python benchmarks/heldout_live/run.py " + " ".join(sys.argv[1:]),
                                    "entries": entries}, indent=1))
    print(f"wrote {len(entries)} held-out workloads to {args.out}")
    return 0


def time_plan(args: argparse.Namespace) -> int:
    import torch

    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.timing import TimingOptions, time_launch
    from kernel_gym.measure.worker import compare, workload_from_key

    if not torch.cuda.is_available():
        raise SystemExit("`time` runs the kernels on a CUDA GPU; on the CPU only `plan` and `report` work")
    plan = json.loads(args.plan.read_text())
    timing = TimingOptions(min_reps=args.reps, max_reps=args.reps, round_reps=args.reps, max_time_s=10.0)
    rng = random.Random(0)
    start, results = time.time(), []
    for n, entry in enumerate(plan["entries"]):
        if time.time() - start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: {len(plan['entries']) - n} workloads left", flush=True)
            break
        family = get_family(entry["kernel"])
        workload = workload_from_key(family, json.dumps(entry["workload"]))
        inputs = family.make_inputs(workload, "cuda", seed=0)
        ref = family.reference(inputs)
        fns, status = {}, {}
        for c in entry["configs"]:
            try:
                fn = family.prepare(inputs, Config.parse(c))
                wrong = compare(family, fn(), ref, workload.dtype)
                torch.cuda.synchronize()
                status[c] = "ok" if wrong is None else f"wrong_result: {wrong}"
            except Exception as exc:  # noqa: BLE001 - a failing config is reported, not fatal
                status[c] = f"{type(exc).__name__}: {exc}"[:200]
            if status[c] == "ok":
                fns[c] = fn
        rounds = {c: [] for c in fns}
        for _ in range(args.rounds):
            order = list(fns)
            rng.shuffle(order)
            for c in order:
                rounds[c].append(time_launch(fns[c], timing).median_ms)
        results.append({**{k: entry[k] for k in ("env_id", "model", "workload", "chosen", "oracle",
                                                 "recorded_ratio")},
                        "status": status, "round_ms": rounds, "live_ratio": _paired(rounds, entry["chosen"]),
                        "oracle_live_ratio": _paired(rounds, entry["oracle"])})
        print(f"[{time.time() - start:.0f}s] {n + 1}/{len(plan['entries'])} {entry['env_id'].split('/')[-1]} "
              f"{entry['model']} recorded {entry['recorded_ratio']:.3f} live {results[-1]['live_ratio']} "
              f"(recorded oracle: {results[-1]['oracle_live_ratio']})", flush=True)
        fns.clear()
        del inputs
        torch.cuda.empty_cache()
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rounds": args.rounds,
                                        "reps": args.reps, "results": results}, indent=1))
    report_table(json.loads(args.out.read_text()))
    return 0


def _paired(rounds: dict[str, list[float]], config: str) -> float | None:
    """Median over rounds of (the round's fastest config time) / (this config's time in the same round)."""
    if config not in rounds:
        return None
    n = len(rounds[config])
    ratios = sorted(min(times[r] for times in rounds.values()) / rounds[config][r] for r in range(n))
    return float(ratios[n // 2])


def _geomean(rows: list[dict], key: str) -> float:
    return math.exp(sum(math.log(r[key]) for r in rows) / len(rows))


def report_table(result: dict) -> str:
    """Per env and model: recorded held-out geomean beside the paired live one (and the recorded oracle's own)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in result["results"]:
        if r["live_ratio"] is not None and r["oracle_live_ratio"] is not None:
            groups.setdefault((r["env_id"], r["model"]), []).append(r)
    lines = ["| env | model | held-out workloads | recorded geomean | paired live geomean | recorded oracle, live |",
             "|---|---|---:|---:|---:|---:|"]
    for (env_id, model), rows in groups.items():
        lines.append(f"| {env_id} | {model} | {len(rows)} | {_geomean(rows, 'recorded_ratio'):.3f} | "
                     f"{_geomean(rows, 'live_ratio'):.3f} | {_geomean(rows, 'oracle_live_ratio'):.3f} |")
    text = "\n".join(lines)
    print(text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("plan", help="CPU: train the policies, write each held-out workload's configs to time")
    a.add_argument("--out", type=Path, default=Path("benchmarks/heldout_live/plan.json"))
    a.add_argument("--envs", nargs="+", default=list(ENVS))
    a.add_argument("--models", nargs="+", default=list(MODELS))
    a.add_argument("--timesteps", type=int, default=30_000)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--runner-ups", type=int, default=3, help="also time this many of the recorded fastest configs")
    a.add_argument("--tracking-uri", default="", help="MLflow store of the training runs (default: mlruns/)")
    a.add_argument("--checkpoints", type=Path, default=Path("out/checkpoints"), help="where training checkpoints go")
    b = sub.add_parser("time", help="GPU: time each workload's configs in shuffled rounds")
    b.add_argument("--plan", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--rounds", type=int, default=5)
    b.add_argument("--reps", type=int, default=10, help="timed samples per config per round")
    b.add_argument("--budget-s", type=float, default=400.0)
    c = sub.add_parser("report", help="print the table of a result file")
    c.add_argument("--result", type=Path, required=True)
    args = p.parse_args(argv)
    if args.cmd == "plan":
        return make_plan(args)
    if args.cmd == "time":
        return time_plan(args)
    report_table(json.loads(args.result.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
