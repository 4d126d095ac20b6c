"""Replay evaluation: a trace through the serving simulator with each policy a user could run, side by side.

`kernel-gym replay --trace azure-conv --model mixtral-8x7b --policies default,static,vllm-table,autotune,random,tpe,
learned,oracle --json out/replay.json` replays the trace once per policy (kernel times from the backend: the recorded
H200 store by default) and writes {"trace", "model", "policies": {NAME: {tokens_per_s, tuned_kernel_s, tuning_gpu_s,
ttft_p50_s, ttft_p99_s, tpot_p50_s, tpot_p99_s, ...}}}, a markdown table (.md) and plots (.png: tokens/s over time,
config switches) beside the JSON, and logs all of it to MLflow. The baselines are defined in baselines.py; "learned"
is the exported policy served through the Dispatcher (no measurement at serving time).

A config the backend cannot answer for a workload (not measured there) falls back to the family's default config, as
a dispatcher would, and is counted in `fallbacks`.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from kernel_gym.kernels.space import Config
from kernel_gym.policies.baselines import BASELINE_NAMES, SEARCH_BUDGET, CoveredBackend, Policy, make_baselines
from kernel_gym.traffic.simulator import _C, KERNELS, BackendTimer, KVLayout, SimResult, Simulator

POLICY_NAMES = ("default", "static", "vllm-table", "autotune", "random", "tpe", "learned", "oracle")
METRICS = ("tokens_per_s", "tuned_kernel_s", "tuning_gpu_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")


class GuardedChooser:
    """Wraps a policy: answers only with configs the backend can time (else the default, else the slowest available
    one), accumulates tuned-kernel seconds per kernel, and optionally records per-step workloads for the live check."""

    def __init__(self, policy: Any, backend: Any, num_layers: int, record_steps: int = 0) -> None:
        from kernel_gym.policies.baselines import Oracle

        self.policy = policy
        self.backend = backend
        self.layers = num_layers
        self.kv_layout = getattr(policy, "kv_layout", None)
        self.precompiled = set(getattr(policy, "precompiled", ()) or ())
        self._oracle = Oracle(backend)
        self._ok: dict[tuple, tuple[Config, float]] = {}
        self.fallbacks = 0
        self.kernel_s = dict.fromkeys(KERNELS, 0.0)
        self.record_steps = record_steps
        self.steps: list[dict[str, Any]] = []
        self.sim: Any = None

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        cfg = self.policy.choose(kernel, workload, kv)
        key = (kernel, workload, cfg)
        hit = self._ok.get(key)
        if hit is None:
            t = self._oracle.time_ms(kernel, workload, cfg)
            out = cfg
            if t is None:
                self.fallbacks += 1
                from kernel_gym.policies.baselines import default_for

                out = default_for(kernel, workload, kv)
                t = self._oracle.time_ms(kernel, workload, out)
                if t is None:
                    cands = self._oracle.candidates(kernel, workload, kv)
                    if not cands:
                        raise LookupError(f"the backend can time no config of {kernel} on {workload.key()} with KV "
                                          f"layout {kv}; collect measurements for this model first")
                    out = max(cands, key=lambda c: self._oracle.time_ms(kernel, workload, c))
                    t = self._oracle.time_ms(kernel, workload, out)
            hit = self._ok[key] = (out, t * 1e-3)
        self.kernel_s[kernel] += hit[1] * self.layers
        if self.record_steps and len(self.steps) < self.record_steps * len(KERNELS):
            self.steps.append({"t_s": self.sim.clock if self.sim is not None else 0.0, "kernel": kernel,
                               "workload": workload.key(), "config": dict(hit[0]), "predicted_s": hit[1]})
        return hit[0]


@dataclass
class PolicyRun:
    name: str
    result: SimResult
    metrics: dict[str, float]
    steps: list[dict[str, Any]] = field(default_factory=list)


def routing_profile(spec: str, model: Any, seed: int = 0) -> Any:
    """"uniform", "zipf:EXPONENT" or "drift:EXPONENT[:DWELL_S]" for the model's experts."""
    from kernel_gym.traffic.routing import DriftingHotRouting, UniformRouting, ZipfRouting

    kind, _, rest = spec.partition(":")
    try:
        if kind == "uniform":
            return UniformRouting(model.num_experts, model.top_k, seed)
        if kind == "zipf":
            return ZipfRouting(model.num_experts, model.top_k, seed, exponent=float(rest or 1.0))
        if kind == "drift":
            exp, _, dwell = rest.partition(":")
            return DriftingHotRouting(model.num_experts, model.top_k, seed, exponent=float(exp or 1.2),
                                      dwell_s=float(dwell or 60.0))
    except ValueError as exc:
        raise ValueError(f"--routing {spec!r}: {exc}") from exc
    raise ValueError(f"--routing {spec!r}: use uniform, zipf:EXPONENT or drift:EXPONENT[:DWELL_S]")


def run_policy(name: str, policy: Policy | Any, model: Any, trace: Any, routing: Any, backend: Any,
               record_steps: int = 0, **sim_kw: Any) -> PolicyRun:
    """Replay the trace under one policy; metrics include the issue's set plus stalls, fallbacks and switches."""
    guard = GuardedChooser(policy, backend, model.num_layers, record_steps)
    kv = getattr(policy, "kv_layout", None) or KVLayout(16, "NHD")
    sim = Simulator(model, trace, BackendTimer(backend), guard, routing, kv_layout=kv, **sim_kw)
    guard.sim = sim
    if hasattr(policy, "attach"):
        policy.attach(sim)
    res = sim.run()
    s = res.summary
    metrics = {k: float(s[k]) for k in ("tokens_per_s", "tuned_kernel_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                                         "tpot_p99_s", "stall_s", "config_switches", "configs_used", "preemptions",
                                         "sim_time_s", "steps")}
    metrics["tuning_gpu_s"] = float(getattr(policy, "tuning_gpu_s", 0.0))
    metrics["measurements"] = float(getattr(policy, "measurements", 0))
    metrics["fallbacks"] = float(guard.fallbacks)
    for k, v in guard.kernel_s.items():
        metrics[f"tuned_kernel_s.{k}"] = v
    metrics["kv_page_size"] = float(kv.page_size)
    return PolicyRun(name, res, metrics, guard.steps)


def learned_policy(model: Any, model_uris: Sequence[str] = (), table_path: str | None = None) -> Any:
    """The Dispatcher over a dispatch table: from a file, or exported now from the given (or latest) policies."""
    from kernel_gym.policies.dispatcher import Dispatcher, DispatchTable
    from kernel_gym.policies.export import build_table, load_policies

    table = DispatchTable.load(table_path) if table_path else build_table(model, load_policies(model_uris))
    return Dispatcher(table)


def replay(trace: Any, model: Any, factories: dict[str, Callable[[], Any]], backend: Any, routing: Any,
           record_steps: dict[str, int] | None = None, progress: bool = True, **sim_kw: Any) -> dict[str, PolicyRun]:
    """Run each policy (a fresh one from its factory) over the trace; returns name -> PolicyRun."""
    runs = {}
    for i, (name, factory) in enumerate(factories.items()):
        t0 = time.perf_counter()
        runs[name] = run_policy(name, factory(), model, trace, routing, backend,
                                (record_steps or {}).get(name, 0), **sim_kw)
        if progress:
            m = runs[name].metrics
            print(f"[{i + 1}/{len(factories)}] {name}: {m['tokens_per_s']:.1f} tok/s, tuned kernels "
                  f"{m['tuned_kernel_s']:.1f} s, tuning {m['tuning_gpu_s']:.1f} GPU-s "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return runs


def report(trace_name: str, model_name: str, runs: dict[str, PolicyRun], extra: dict[str, Any] | None = None) -> dict:
    return {"trace": trace_name, "model": model_name, **(extra or {}),
            "policies": {n: {**{k: r.metrics[k] for k in METRICS}, **{k: v for k, v in r.metrics.items()
                                                                        if k not in METRICS}}
                         for n, r in runs.items()}}


def markdown(rep: dict[str, Any]) -> str:
    pols = rep["policies"]
    ref = pols.get("oracle", {}).get("tokens_per_s")
    lines = [f"# Replay: {rep['trace']} on {rep['model']}", "",
             "| policy | tokens/s | vs oracle | tuned kernels (s) | tuning (GPU-s) | TTFT p50 (s) | TTFT p99 (s) | "
             "TPOT p50 (ms) | TPOT p99 (ms) | switches | fallbacks |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, m in pols.items():
        rel = f"{m['tokens_per_s'] / ref:.3f}" if ref else "-"
        lines.append(f"| {n} | {m['tokens_per_s']:.1f} | {rel} | {m['tuned_kernel_s']:.2f} | {m['tuning_gpu_s']:.1f} | "
                     f"{m['ttft_p50_s']:.3f} | {m['ttft_p99_s']:.3f} | {m['tpot_p50_s'] * 1e3:.2f} | "
                     f"{m['tpot_p99_s'] * 1e3:.2f} | {m.get('config_switches', 0):.0f} | {m.get('fallbacks', 0):.0f} |")
    return "\n".join(lines) + "\n"


def tokens_over_time(res: SimResult, bins: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """(bin centres, output tokens/s per bin): decode tokens at each step's end plus first tokens."""
    steps = res.steps
    t_end = steps[:, _C["t_start"]] + steps[:, _C["duration_s"]]
    first = res.first_token_s[~np.isnan(res.first_token_s)]
    hi = float(max(t_end.max() if len(t_end) else 1.0, first.max() if len(first) else 1.0))
    edges = np.linspace(0.0, hi, bins + 1)
    h, _ = np.histogram(t_end, edges, weights=steps[:, _C["decode_batch"]])
    f, _ = np.histogram(first, edges)
    return (edges[:-1] + edges[1:]) / 2, (h + f) / np.diff(edges)


def plot(runs: dict[str, PolicyRun], path_tokens: Path, path_switches: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for n, r in runs.items():
        x, y = tokens_over_time(r.result)
        ax.plot(x, y, label=n, lw=1.2)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path_tokens, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    for n, r in runs.items():
        times = sorted(t for t, *_ in r.result.switch_log)
        ax.step([0.0, *times], np.arange(len(times) + 1), where="post", label=f"{n} ({len(times)})")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("config switches (cumulative)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path_switches, dpi=110)
    plt.close(fig)


def write_outputs(rep: dict[str, Any], runs: dict[str, PolicyRun], json_path: Path) -> list[Path]:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(rep, indent=1))
    md = json_path.with_suffix(".md")
    md.write_text(markdown(rep))
    p1 = json_path.with_name(json_path.stem + "_tokens.png")
    p2 = json_path.with_name(json_path.stem + "_switches.png")
    plot(runs, p1, p2)
    return [json_path, md, p1, p2]


def log_mlflow(rep: dict[str, Any], paths: list[Path], params: dict[str, Any], tracking_uri: str | None) -> str:
    import mlflow

    from kernel_gym.policies import tracking

    uri = tracking.setup_tracking(tracking_uri)
    exp = tracking.get_or_create_experiment("kernel-gym-replay", uri)
    with mlflow.start_run(experiment_id=exp, run_name=f"replay-{rep['trace']}-{rep['model']}") as run:
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        mlflow.set_tag("git_commit", tracking.git_commit())
        metrics = {f"{n}/{k}": float(v) for n, m in rep["policies"].items() for k, v in m.items()
                   if isinstance(v, (int, float)) and np.isfinite(v)}
        mlflow.log_metrics(metrics)
        for p in paths:
            mlflow.log_artifact(str(p), artifact_path="plots" if p.suffix == ".png" else None)
        return run.info.run_id


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernel-gym replay", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="bundled", help="trace name (azure-conv, azure-code, bundled, ...) or path")
    p.add_argument("--model", default="mixtral-8x7b", help="model spec: built-in name or ModelSpec JSON file")
    p.add_argument("--policies", default=",".join(POLICY_NAMES),
                   help=f"comma-separated, from {','.join(POLICY_NAMES)}")
    p.add_argument("--json", type=Path, required=True, help="results JSON; .md and .png files are written beside it")
    p.add_argument("--routing", default="zipf:0.6", help="expert routing: uniform, zipf:EXP, drift:EXP[:DWELL_S]")
    p.add_argument("--model-uri", action="append", default=[], metavar="[KERNEL=]URI",
                   help="learned policy per kernel (repeatable); default: latest registered kernel-gym-* models")
    p.add_argument("--table", default="", help="learned: a dispatch_table.json instead of MLflow models")
    p.add_argument("--budget", type=int, default=SEARCH_BUDGET, help="random/tpe: measurements per new shape")
    p.add_argument("--seed", type=int, default=0, help="seed of routing and search baselines")
    p.add_argument("--window", default="", metavar="START:END", help="replay only arrivals in [START, END) seconds")
    p.add_argument("--backend", default="recorded", help="recorded (H200 store) or a store path")
    p.add_argument("--steps-json", type=Path, default=None,
                   help="also write per-step workloads, configs and predicted kernel times of default, learned and "
                        "oracle (input of scripts/live_replay_check.py)")
    p.add_argument("--steps", type=int, default=2000, help="--steps-json: steps recorded per policy")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("--tracking-uri", default="", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or mlruns/)")
    return p


def parse_policies(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad or not names:
        raise ValueError(f"--policies {text!r}: unknown {bad}; choose from {','.join(POLICY_NAMES)}")
    return list(dict.fromkeys(names))


def main(argv: Sequence[str] | None = None, backend: Any = None) -> int:
    """CLI entry (`kernel-gym replay`); tests pass a Backend object as `backend`."""
    args = build_parser().parse_args(argv)
    from kernel_gym.models import load_model
    from kernel_gym.traffic.traces import load_trace

    names = parse_policies(args.policies)
    if args.budget < 1:
        raise ValueError(f"--budget must be >= 1, got {args.budget}")
    model = load_model(args.model)
    trace = load_trace(args.trace)
    if args.window:
        try:
            start, end = (float(x) for x in args.window.split(":"))
        except ValueError as exc:
            raise ValueError(f"--window {args.window!r}: use START:END in seconds, e.g. 0:300") from exc
        trace = trace.window(start, end)
    if backend is None:
        from kernel_gym.measure import make_backend

        backend = make_backend("recorded", **({} if args.backend == "recorded" else {"path": args.backend}))
    covered = CoveredBackend(backend)
    factories: dict[str, Callable[[], Any]] = {}
    base = make_baselines([n for n in names if n in BASELINE_NAMES], covered, model, args.budget, args.seed)
    for n in names:
        if n == "learned":
            if not args.table:
                from kernel_gym.policies.tracking import setup_tracking

                setup_tracking(args.tracking_uri or None)
            disp = learned_policy(model, args.model_uri, args.table or None)
            factories[n] = lambda disp=disp: _fresh(disp)
        else:
            factories[n] = base[n]
    routing = routing_profile(args.routing, model, args.seed)
    record = {n: args.steps for n in ("default", "learned", "oracle")} if args.steps_json else {}
    runs = replay(trace, model, factories, covered, routing, record)
    rep = report(trace.name, model.name, runs, {"routing": args.routing, "backend": getattr(backend, "name", ""),
                                                "clamped_workloads": covered.clamped_workloads})
    paths = write_outputs(rep, runs, args.json)
    if args.steps_json:
        args.steps_json.parent.mkdir(parents=True, exist_ok=True)
        args.steps_json.write_text(json.dumps({
            "trace": trace.name, "model": model.name, "num_layers": model.num_layers,
            "policies": {n: runs[n].steps for n in record if n in runs}}))
        paths.append(args.steps_json)
    if not args.no_mlflow:
        params = {k: v for k, v in vars(args).items() if k not in ("no_mlflow",)}
        run_id = log_mlflow(rep, paths, params, args.tracking_uri or None)
        print(f"logged to MLflow run {run_id}")
    print(markdown(rep))
    return 0


def _fresh(disp: Any) -> Any:
    """A Dispatcher over the same table with fresh memo state for each replay."""
    from kernel_gym.policies.dispatcher import Dispatcher

    return Dispatcher(disp.table)


__all__ = ["POLICY_NAMES", "GuardedChooser", "PolicyRun", "learned_policy", "main", "markdown", "replay",
           "report", "routing_profile", "run_policy"]
