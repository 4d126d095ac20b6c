"""Policy quality benchmark: train each kernel env per built-in model on the recorded H200 data with fixed seeds, and
score the learned policy on held-out workloads against the oracle, the default config and the best static config.

    python benchmarks/policy_quality/run.py                       # all envs x both models, 30k steps each
    python benchmarks/policy_quality/run.py --seeds 0 1 2         # the same with three seeds (one row each)
    python benchmarks/policy_quality/run.py --timesteps 12000 --envs KernelGym/MoE-v0 --models olmoe-1b-7b

A model whose data holds no rows of an env's kernel family (OLMoE has no prefix_prefill rows) is skipped with a note
in the output (`skipped`), not scored.

Writes benchmarks/policy_quality.json, benchmarks/policy_quality.md and benchmarks/policy_curves/<env>-<model>.png;
every run is an MLflow run (experiment kernel-gym-bench) like `kernel-gym train`. Held-out workloads are whole
primary-axis values (token counts, batch sizes, prompt totals) never seen in training; the policy decides from the
workload features alone (zero measurements), the recorded measurements only score the decision.

Each result also says how much of its score rests on estimated times (interpolated between measured shapes rather
than measured at that workload and config; measure.types.is_estimated), computed from the sources of the times that
score it: `estimated_workload_share` (held-out workloads whose oracle or policy time is estimated),
`estimated_oracle_time_share` and `estimated_policy_time_share` (share of the summed oracle / policy milliseconds).

    python benchmarks/policy_quality/run.py --annotate benchmarks/policy_quality.json   # add them to an existing result
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ENVS = ("KernelGym/MoE-v0", "KernelGym/DecodeAttention-v0", "KernelGym/PrefillAttention-v0",
        "KernelGym/PrefixPrefill-v0")
MODELS = ("mixtral-8x7b", "olmoe-1b-7b")
TARGET = 0.97


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", nargs="+", default=list(ENVS))
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--timesteps", type=int, default=30_000, help="training steps per (env, model)")
    p.add_argument("--eval-freq", type=int, default=2_000, help="held-out evaluation every this many steps (curve)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds, one result row each")
    p.add_argument("--out", type=Path, default=Path("benchmarks"))
    p.add_argument("--tracking-uri", default="", help="MLflow URI (default: MLFLOW_TRACKING_URI or mlruns/mlflow.db)")
    p.add_argument("--log-model", action=argparse.BooleanOptionalAction, default=False,
                   help="also log and register each policy (off: the benchmark measures quality, not export)")
    p.add_argument("--annotate", type=Path, default=None, metavar="JSON",
                   help="train nothing: add the estimated shares to an existing policy_quality.json (its held-out "
                        "rows rescored for sources only) and rewrite it and its .md beside it")
    p.add_argument("--data", default="", help="measurement store (.jsonl.gz or .sqlite); default: the packaged "
                   "H200 dataset. --annotate refuses data whose hash differs from the one the JSON records")
    return p


class _SourceRecorder:
    """A backend wrapper that remembers the source of every answer: (kernel, workload key, config) -> source."""

    def __init__(self, backend):
        self.backend = backend
        self.name = getattr(backend, "name", "recorded")
        self.sources: dict = {}

    def measure(self, kernel, workload, config):
        m = self.backend.measure(kernel, workload, config)
        self.sources[(kernel, workload.key(), config)] = m.source
        return m

    def available_configs(self, kernel, workload):
        return self.backend.available_configs(kernel, workload)


def estimated_shares(backend, kernel: str, rows: list[dict]) -> dict:
    """How much of a result's score rests on estimated times. For each scored held-out row ({"workload": key,
    "chosen": config, ...}) the workload's references are measured again (lookups), and the sources of the two times
    that score it are read: the oracle's (fastest ok config) and the policy's (the chosen config, else the default,
    else the slowest ok config: catalogue.WorkloadReference.ratio_with_fallback)."""
    from kernel_gym.dispatch.catalogue import measure_reference
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import workload_from_key
    from kernel_gym.measure.types import is_estimated

    family = get_family(kernel)
    rec = _SourceRecorder(backend)
    n_est = 0
    oracle_ms = oracle_est = policy_ms = policy_est = 0.0
    for row in rows:
        w = workload_from_key(kernel, row["workload"])
        refs = measure_reference(rec, family, [w])
        if not refs:
            raise ValueError(f"{kernel} {row['workload']}: the data holds no ok time for this scored workload; "
                             "score and annotate with the same data")
        ref = refs[0]
        oracle = ref.best_config
        chosen = Config.parse(row["chosen"])
        served = chosen if chosen in ref.times else ref.default if ref.default in ref.times else \
            max(ref.times, key=ref.times.__getitem__)
        est_o = is_estimated(rec.sources[(kernel, ref.key, oracle)])
        est_p = is_estimated(rec.sources[(kernel, ref.key, served)])
        n_est += est_o or est_p
        oracle_ms += ref.times[oracle]
        oracle_est += ref.times[oracle] if est_o else 0.0
        policy_ms += ref.times[served]
        policy_est += ref.times[served] if est_p else 0.0
    n = len(rows)
    return {"estimated_workloads": n_est, "estimated_workload_share": n_est / n if n else 0.0,
            "estimated_oracle_time_share": oracle_est / oracle_ms if oracle_ms > 0 else 0.0,
            "estimated_policy_time_share": policy_est / policy_ms if policy_ms > 0 else 0.0,
            "estimated_share_basis": "computed: sources of the scoring times (measure.types.is_estimated)"}


def write_markdown(doc: dict, out: Path) -> str:
    cpus = doc.get("machine", {}).get("cpus", "?")
    lines = [
        "# Policy quality on held-out workloads (recorded H200 data)", "",
        f"`{doc['command'].strip()}` on {cpus} CPU cores. Geomean over held-out workloads of "
        "oracle time / chosen time (1.0 = the best measured config everywhere); held-out workloads are whole "
        "token-count / batch / prompt-total values never seen in training.", "",
        "| env | model | seed | policy | default | best static | held-out | steps | train s | meets 0.97 | "
        "estimated: workloads / oracle time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        est = (f"{r['estimated_workloads']} of {r['heldout_workloads']} / {r['estimated_oracle_time_share']:.1%}"
               if "estimated_workload_share" in r else "not computed")
        lines.append(f"| {r['env_id']} | {r['model']} | {r.get('seed', 0)} | {r['geomean_policy']:.3f} | "
                     f"{r['geomean_default']:.3f} | "
                     f"{r['geomean_static']:.3f} | {r['heldout_workloads']} | {r['timesteps']} | "
                     f"{r['train_seconds']:.0f} | {'yes' if r['meets_target'] else 'no'} | {est} |")
    lines += [f"\nSkipped (no rows of the family for the model): {k['env_id']} {k['model']}."
              for k in doc.get("skipped", [])]
    lines += ["", "Estimated: held-out workloads whose oracle or policy time is an estimate (interpolated between "
              "measured shapes) rather than a measurement of that workload and config, and the share of the summed "
              "oracle time resting on estimates; computed from the sources of the scoring times (0 = every score "
              "rests on measured rows, checked, not assumed)"
              + (f"; {doc['estimated_shares_note']}" if doc.get("estimated_shares_note") else "") + ".", "",
              "Learning curves: `policy_curves/<env>-<model>.png`; per-workload choices in policy_quality.json.", ""]
    text = "\n".join(lines)
    out.write_text(text)
    return text


def annotate(path: Path, data: str = "") -> int:
    """Add the estimated shares to an existing result file (no training) and rewrite its markdown."""
    from kernel_gym.envs import ENV_KERNELS
    from kernel_gym.measure import make_backend

    doc = json.loads(path.read_text())
    backend = make_backend("recorded", path=data or None)
    want, have = doc.get("dataset_hash", "n/a"), str(getattr(backend, "dataset_hash", "") or "n/a")
    if want not in ("n/a", "") and want != have:
        raise SystemExit(f"{path} was scored on data {want}, this data is {have}: pass --data with that snapshot")
    for r in doc["results"]:
        r.update(estimated_shares(backend, ENV_KERNELS[r["env_id"]], r["heldout"]))
        print(f"{r['env_id']} {r['model']}: {r['estimated_workloads']} of {len(r['heldout'])} held-out workloads "
              f"on estimated times, {r['estimated_oracle_time_share']:.1%} of oracle time", flush=True)
    doc["estimated_shares_data"] = have
    path.write_text(json.dumps(doc, indent=1))
    print(write_markdown(doc, path.with_suffix(".md")))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.annotate is not None:
        return annotate(args.annotate, args.data)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow
    import torch

    from kernel_gym.dispatch.catalogue import NoMeasurementsError
    from kernel_gym.envs import ENV_KERNELS
    from kernel_gym.measure import make_backend
    from kernel_gym.train.train import TrainArgs, train

    backend = make_backend("recorded", path=args.data or None)
    curves_dir = args.out / "policy_curves"
    curves_dir.mkdir(parents=True, exist_ok=True)
    results, skipped = [], []
    for env_id, model, seed in ((e, m, sd) for e in args.envs for m in args.models for sd in args.seeds):
        if (env_id, model) in {(k["env_id"], k["model"]) for k in skipped}:
            continue
        short = env_id.split("/")[-1].lower()
        targs = TrainArgs(env_id=env_id, model=model, total_timesteps=args.timesteps, seed=seed,
                          eval_freq=args.eval_freq, checkpoint_freq=0, experiment="kernel-gym-bench",
                          run_name=f"bench-{short}-{model}-seed{seed}", tracking_uri=args.tracking_uri,
                          checkpoint_dir=f"out/checkpoints/bench-{short}-{model}-seed{seed}", progress_bar=False,
                          log_model=args.log_model, register_model=args.log_model)
        t0 = time.perf_counter()
        try:
            res = train(targs, backend=backend)
        except NoMeasurementsError as exc:  # the data holds no rows of this family for this model: nothing to score
            skipped.append({"env_id": env_id, "model": model, "why": str(exc)})
            print(f"{env_id} {model}: skipped, {exc}", flush=True)
            continue
        seconds = time.perf_counter() - t0
        client = mlflow.tracking.MlflowClient()
        curve = [{"step": m.step, "geomean_policy": m.value}
                 for m in client.get_metric_history(res.run_id, "eval/geomean_policy")]
        e = res.evaluation
        row = {
            "env_id": env_id, "model": model, "seed": seed, "timesteps": res.num_timesteps,
            "train_seconds": round(seconds, 1), "heldout_workloads": e.num_workloads,
            "geomean_policy": e.geomean_policy, "geomean_default": e.geomean_default,
            "geomean_static": e.geomean_static, "policy_failures": e.policy_failures,
            "train_geomean_policy": res.metrics.get("final/train_geomean_policy"),
            "random_policy_geomean": res.metrics.get("final/random_policy_geomean"),
            "catalogue_size": len(res.catalogue), "static_config": e.static_config,
            "meets_target": e.geomean_policy >= TARGET, "run_id": res.run_id, "curve": curve,
            "heldout": [{k: r[k] for k in ("workload", "chosen", "ratio_policy", "ratio_default", "ratio_static",
                                           "oracle_config", "oracle_ms") if k in r}
                        for r in e.rows],
        }
        row.update(estimated_shares(backend, ENV_KERNELS[env_id], row["heldout"]))
        results.append(row)
        print(f"{env_id} {model}: policy {e.geomean_policy:.3f} default {e.geomean_default:.3f} static "
              f"{e.geomean_static:.3f} ({e.num_workloads} held-out, {seconds:.0f} s)", flush=True)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([c["step"] for c in curve], [c["geomean_policy"] for c in curve], "o-", label="learned policy")
        ax.axhline(e.geomean_static, ls="--", color="C1", label="best static config")
        ax.axhline(e.geomean_default, ls=":", color="C2", label="default config")
        ax.axhline(TARGET, color="grey", lw=0.8, label=f"target {TARGET}")
        ax.set_xlabel("environment steps")
        ax.set_ylabel("held-out geomean vs oracle")
        ax.set_title(f"{short} / {model} ({seconds:.0f} s on {os.cpu_count()} cores)", fontsize=9)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(curves_dir / f"{short}-{model}{'' if seed == args.seeds[0] else f'-seed{seed}'}.png", dpi=80)
        plt.close(fig)
    doc = {
        "command": "python benchmarks/policy_quality/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "backend": "recorded", "dataset_hash": str(getattr(backend, "dataset_hash", "") or "n/a"),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "python": platform.python_version()},
        "target": TARGET, "results": results, "skipped": skipped,
    }
    (args.out / "policy_quality.json").write_text(json.dumps(doc, indent=1))
    print(write_markdown(doc, args.out / "policy_quality.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
