"""`kernel-gym plan`: the recommended deployment of a MoE model on N H200s for the user's traffic: replicas x TP / EP
layout and the engine knobs, as the engine's launch commands, with the fused-MoE config files for that layout, the
predicted goodput at the SLO (with the share of the step time resting on estimates and on the collectives prior),
and the next-best deployments.

    kernel-gym plan --model mixtral-8x7b --gpus 8 --engine vllm --trace azure-conv --slo ttft=2,tpot=0.1

How it decides (the agent): MaskablePPO trains on KernelGym/ServingPlan-v0 over windows of the first part of the
trace (`--train-steps` one-step episodes; the layout x knob action with memory masks), then its proposals (the
greedy action and `--samples` draws from the policy, plus the engine's defaults and the hand-picked layouts as a
floor) are each replayed on the training windows; the best mean goodput wins. The prediction is a replay of a
held-out window (the trace's last part) under the winner. Every figure is a simulator replay (docs/parallelism.md):
kernel times from the packaged H200 measurements (scaled estimates where a shard was not measured), collectives
from the measured table or, without one, aiconfigurator's labelled prior.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

SLO_HELP = "ttft=SECONDS,tpot=SECONDS, e.g. ttft=2,tpot=0.1"
HF_IDS = {"mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x22b": "mistralai/Mixtral-8x22B-v0.1",
          "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B", "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
          "gpt-oss-20b": "openai/gpt-oss-20b", "gpt-oss-120b": "openai/gpt-oss-120b",
          "olmoe-1b-7b": "allenai/OLMoE-1B-7B-0924", "deepseek-v3": "deepseek-ai/DeepSeek-V3",
          "phi-3.5-moe": "microsoft/Phi-3.5-MoE-instruct", "dbrx": "databricks/dbrx-instruct"}


FEW_REQUESTS = 20  # a held-out window with fewer is said to be too thin to rank deployments by (BurstGPT's 400 rows)


def parse_slo(text: str) -> tuple[float, float]:
    """'ttft=2,tpot=0.1' -> (2.0, 0.1); a one-line error naming the fix otherwise."""
    out: dict[str, float] = {}
    for part in [p for p in text.split(",") if p.strip()]:
        key, sep, val = part.partition("=")
        try:
            if not sep or key.strip() not in ("ttft", "tpot") or not 0 < float(val) < math.inf:  # NaN fails too
                raise ValueError
            out[key.strip()] = float(val)
        except ValueError:
            raise ValueError(f"--slo {text!r}: write {SLO_HELP} (finite seconds > 0)") from None
    if set(out) != {"ttft", "tpot"}:
        raise ValueError(f"--slo {text!r} needs both ttft and tpot: {SLO_HELP}")
    return out["ttft"], out["tpot"]


def make_env(spec: Any, gpus: int, engine: str, trace: Any, slo: tuple[float, float], rate_scale: float,
             window_s: float, split: str = "train", routing: Any = None, table: Any = None,
             backend: Any = None, pricer: Any = None, max_model_len: int = 0) -> Any:
    """A ServingPlan-v0 env; `backend` / `pricer` (a DeploymentPricer of the model) are shared when given, so that
    the dataset loads once and the layouts' prices are memoised across envs."""
    from kernel_gym.envs.parallel_serving import ServingPlanEnv
    from kernel_gym.parallel.deploy import MAX_MODEL_LEN

    if pricer is not None:
        backend, table = pricer.backend, pricer._table_arg if pricer._table is None else pricer._table
        max_model_len = pricer.max_model_len
    ctx, warmup = window_parts(window_s)
    return ServingPlanEnv(backend=backend or "recorded", model=spec, trace=trace, gpus=gpus, engine=engine,
                          table=table, routing=routing, split=split, window_s=window_s,
                          warmup_s=warmup, context_s=ctx, rate_scale=rate_scale, ttft_slo_s=slo[0],
                          tpot_slo_s=slo[1], pricer=pricer, max_model_len=max_model_len or MAX_MODEL_LEN)


def window_parts(window_s: float) -> tuple[float, float]:
    """(context_s, warmup_s) of a plan window of `window_s` simulated seconds."""
    return min(60.0, window_s), min(10.0, window_s / 4)


def largest_window(duration_s: float, rate_scale: float, window_s: float) -> float:
    """The largest window (<= window_s, 0.1 s steps; 0 when none) whose context, warm-up and window fit both the train
    and the held-out part of a trace spanning `duration_s` (make_env's envs)."""
    from kernel_gym.envs.parallel_serving import window_start_range

    def fits(w: float) -> bool:
        ctx, warm = window_parts(w)
        return all(a <= b for a, b in (window_start_range(duration_s, HOLDOUT, split, w, warm, ctx, rate_scale)
                                       for split in ("train", "heldout")))

    return largest_fitting(fits, window_s)


def largest_fitting(fits: Any, window_s: float) -> float:
    """The largest window <= `window_s` for which `fits(w)` holds (fitting is monotone in the window): `window_s`
    itself, else found by bisection and rounded down to 0.1 s; 0.0 when none."""
    if fits(window_s):
        return window_s
    lo, hi = 0.0, window_s
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    w = math.floor(lo * 10) / 10
    return w if w > 0 and fits(w) else 0.0


def window_starts(env: Any, n: int) -> list[float]:
    """n evenly spaced window starts inside the env's split, each moved to the next arrival (bursty traces have
    idle gaps longer than a window); where that window (with its warm-up) would still hold no request, to the start
    in the split whose window takes in the nearest earlier arrival. A split no window of which holds a request is
    refused, naming the fix."""
    lo, hi = env._range
    even = [lo + (hi - lo) * (i + 0.5) / n for i in range(n)] if hi > lo else [lo]
    arr = env.trace.arrival_s
    back, ahead = env.warmup_s * env.rate_scale, env.window_s * env.rate_scale  # trace s before / after a start

    def holds(s: float) -> bool:
        i, j = np.searchsorted(arr, [s - back, s + ahead], side="left")
        return bool(j > i)

    out = []
    for s in even:
        i = int(np.searchsorted(arr, s))
        s = float(min(arr[i], hi)) if i < len(arr) else s
        if not holds(s) and i > 0:
            s = float(min(max(arr[i - 1], lo), hi))  # the earlier arrival at the window's start, or in its warm-up
        if not holds(s):
            raise ValueError(f"trace {env.trace.name!r} has no request in any window of its {env.split} part "
                             f"([{lo - back:g}, {hi + ahead:g}) s of trace): an idle gap longer than that part; pass "
                             "a larger --window-s, or a trace (or --rate-scale) with arrivals throughout")
        out.append(s)
    return out


class Score(NamedTuple):
    """A deployment's standing on the training windows, compared goodput first, then headroom. Goodput is capped by
    the offered rate, so at a load every candidate serves within the SLO they all tie; the one with the most room
    below the SLO then ranks first (1 - the worse of TTFT p99 / its SLO and TPOT p99 / its SLO, mean over windows),
    as it is the one a heavier window is least likely to push over."""

    goodput: float
    headroom: float


INVALID = Score(-np.inf, -np.inf)


def score(env: Any, dep: Any, starts: list[float]) -> Score:
    """Mean goodput (requests / s meeting the SLO) of `dep` over the windows starting at `starts`, and its headroom
    (Score)."""
    if env._why(env.model, dep, env.pricer.max_model_len):
        return INVALID
    good, room = [], []
    for s in starts:
        env.reset(options={"start_s": s})
        r = env.serve_deployment(dep)
        good.append(r["goodput_req_per_s"])
        ratios = [r["ttft_p99_s"] / env.slo[0], r["tpot_p99_s"] / env.slo[1]]  # TPOT is NaN for 1-token outputs
        worst = max((x for x in ratios if not math.isnan(x)), default=math.inf)
        room.append(1.0 - worst)
    return Score(float(np.mean(good)), float(np.mean(room)))


def train_agent(env: Any, steps: int, seed: int = 0) -> Any:
    """MaskablePPO on the env (one-step episodes), `steps` environment steps; None when steps == 0."""
    if steps <= 0:
        return None
    from sb3_contrib import MaskablePPO

    n = max(8, min(32, steps))
    model = MaskablePPO("MlpPolicy", env, n_steps=n, batch_size=n, n_epochs=4, learning_rate=3e-3, gamma=0.0,
                        ent_coef=0.01, seed=seed, verbose=0, policy_kwargs={"net_arch": [32, 32]}, device="cpu")
    model.learn(total_timesteps=steps)
    return model


def proposals(env: Any, agent: Any, starts: list[float], samples: int, seed: int = 0) -> list[Any]:
    """The agent's deployments: greedy and sampled actions at the training windows' observations (deduplicated)."""
    out: list[Any] = []
    if agent is None:
        return out
    rng_seed = seed
    for s in starts:
        obs, _ = env.reset(options={"start_s": s})
        mask = env.action_masks()
        a, _ = agent.predict(obs, action_masks=mask, deterministic=True)
        out.append(env.deployment_of(a))
        for _ in range(samples):
            agent.set_random_seed(rng_seed)
            rng_seed += 1
            a, _ = agent.predict(obs, action_masks=mask, deterministic=False)
            out.append(env.deployment_of(a))
    return list(dict.fromkeys(out))


def tpe_search(env: Any, starts: list[float], trials: int, seed: int = 0) -> tuple[Any, float, int]:
    """Optuna TPE over the same action space as the agent (replicas x layout and the four knob grids), `trials`
    replays scored by mean training goodput; masked and memory-refused deployments score 0. Returns (best, score,
    trials run)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    valid = [i for i, ok in enumerate(env._choice_mask) if ok]
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    seen: dict[Any, float] = {}

    def objective(trial: Any) -> float:
        a = [trial.suggest_categorical("layout", valid)] + [trial.suggest_int(k, 0, len(g) - 1) for k, g in
                                                            zip(("block", "tokens", "seqs", "graph"), env.grids)]
        d = env.deployment_of(a)
        if d not in seen:
            s = score(env, d, starts).goodput
            seen[d] = s if np.isfinite(s) else 0.0
        return seen[d]

    study.optimize(objective, n_trials=trials)
    best = max(seen, key=seen.__getitem__)
    return best, seen[best], len(study.trials)


def baselines(spec: Any, engine: str, gpus: int, max_model_len: int = 0) -> dict[str, Any]:
    """The floor every plan is compared with: the engine's default and the hand-picked layouts that launch and hold
    a `max_model_len` request (0: the default context limit)."""
    from kernel_gym.parallel.deploy import MAX_MODEL_LEN, engine_default, hand_picked

    limit = max_model_len or MAX_MODEL_LEN
    default = engine_default(spec, engine, gpus, limit)
    out = {"engine_default": default} if default is not None else {}
    out.update({f"hand_{k}": v for k, v in hand_picked(spec, engine, gpus, limit).items()})
    return out


def recommend(spec: Any, gpus: int, engine: str, trace: Any, slo: tuple[float, float], rate_scale: float = 1.0,
              window_s: float = 60.0, train_steps: int = 64, samples: int = 2, train_windows: int = 2,
              seed: int = 0, routing: Any = None, table: Any = None, env: Any = None,
              refine_rounds: int = 1, pricer: Any = None, max_model_len: int = 0,
              backend: Any = None) -> dict[str, Any]:
    """The agent's choice on the training windows (module docstring): the ranked candidates with their mean
    training goodput, the winner first. refine_rounds > 0: a coordinate search over the knobs starting at the best
    candidate refines it (the agent proposes, the simulator replays decide)."""
    t0 = time.time()
    env = env or make_env(spec, gpus, engine, trace, slo, rate_scale, window_s, "train", routing, table,
                          backend=backend, pricer=pricer, max_model_len=max_model_len)
    starts = window_starts(env, train_windows)
    agent = train_agent(env, train_steps, seed)
    agent_deps = proposals(env, agent, starts, samples, seed)
    used = env.used_gpus  # gpus, or fewer where no deployment of all of them fits (ServingPlan-v0)
    floor = baselines(spec, engine, used, env.pricer.max_model_len)
    cands = list(dict.fromkeys([*agent_deps, *floor.values()]))
    print(f"[plan] agent trained ({time.time() - t0:.0f} s); replaying {len(cands)} candidate deployments on "
          f"{len(starts)} training windows", file=sys.stderr, flush=True)
    scores = {d: score(env, d, starts) for d in cands}
    agent_best = max(agent_deps, key=scores.__getitem__) if agent_deps else None
    refined: list = []
    if refine_rounds > 0:
        from kernel_gym.parallel.deploy import coordinate_search

        # two starts: the agent's best proposal and the best of the floor (coordinate ascent stops at local optima)
        floor_best = max(floor.values(), key=scores.__getitem__) if floor else None
        print(f"[plan] refining the best ({refine_rounds} coordinate-search round{'s' if refine_rounds != 1 else ''}, "
              f"{time.time() - t0:.0f} s so far)", file=sys.stderr, flush=True)
        for start in dict.fromkeys(d for d in (agent_best, floor_best) if d is not None):
            _, _, hist = coordinate_search(lambda d: score(env, d, starts), spec, engine, used, start,
                                           refine_rounds, env.pricer.max_model_len)
            refined += [d for d, v in hist if v is not None and d not in scores and d not in refined]
        for d in refined:
            scores[d] = score(env, d, starts)
    scored = sorted(scores.items(), key=lambda kv: kv[1], reverse=True)
    ranked = [{"deployment": d, "train_goodput_req_per_s": s.goodput, "train_headroom": s.headroom,
               "from_agent": d in agent_deps, "from_refinement": d in refined,
               "baseline": next((k for k, v in floor.items() if v == d), None)}
              for d, s in scored if np.isfinite(s.goodput)]
    if not ranked:
        raise ValueError(f"{spec.name}: no candidate deployment fits {gpus} GPUs with {engine}")
    return {"ranked": ranked, "train_windows": starts, "train_steps": train_steps,
            "evaluations": env.pricer.evaluations, "wall_s": time.time() - t0, "env": env,
            "agent_proposals": [d.name for d in agent_deps], "agent_best": agent_best}


def heldout_replay(spec: Any, gpus: int, engine: str, trace: Any, slo: tuple[float, float], rate_scale: float,
                   window_s: float, deps: list[Any], routing: Any = None, table: Any = None,
                   env: Any = None, pricer: Any = None) -> tuple[list[dict[str, Any]], Any]:
    """Each deployment replayed on the held-out window in the middle of the trace's last part."""
    env = env or make_env(spec, gpus, engine, trace, slo, rate_scale, window_s, "heldout", routing, table,
                          pricer=pricer)
    start = window_starts(env, 1)[0]
    env.reset(options={"start_s": start})
    out = []
    for d in deps:
        r = env.serve_deployment(d)
        r["start_s"] = start
        out.append(r)
    return out, env


def kernel_configs(spec: Any, dep: Any, replay: dict[str, Any], model: str = "") -> list[dict[str, Any]]:
    """The fused-MoE config files for the layout, with the configs the replay used most (kernel_gym's knobs), and the
    command that writes each: its arguments give the file's local experts E / ep and N = intermediate / tp; `model`:
    the --model the user gave (a spec or config.json path), else the spec's name (export.model_arg)."""
    from kernel_gym.deploy.export import model_arg
    from kernel_gym.parallel.deploy import moe_config_files

    files = moe_config_files(spec, dep)
    ep = f" --ep {dep.ep}" if dep.ep > 1 else ""
    model = model or model_arg(spec)
    measured = engine_shape_measured(spec, dep)
    for f in files:
        # what the replay priced: kernel_gym's own fused-MoE kernel and knobs, not entries of the engine's file
        f["kernel_gym_configs_priced"] = replay.get("moe_configs", {})
        if spec.expert_quant:
            from kernel_gym.deploy.engine_export import quantized_moe_kernel

            f["write_with"] = (f"none from kernel_gym: {quantized_moe_kernel(spec.expert_quant)}; kernel_gym measures "
                               "bf16 kernels only")
        elif spec.dtype_bytes == 1 and dep.engine == "vllm":  # kernel_gym measures bf16 kernels; export refuses fp8
            # vLLM's tuner: --enable-expert-parallel gives E / tp-size whole experts, else N / tp-size (never both)
            par = (f"--tp-size {dep.tp * dep.ep} --enable-expert-parallel" if dep.ep > 1 else f"--tp-size {dep.tp}")
            f["write_with"] = (f"vLLM's own tuner: benchmarks/kernels/benchmark_moe.py --model CHECKPOINT {par} "
                               "--dtype fp8_w8a8 --tune (kernel_gym measures bf16 kernels only)")
        elif spec.dtype_bytes == 1:  # SGLang's tuner: --tp-size is all the server's GPUs, E / ep, N / (tp-size / ep)
            f["write_with"] = ("SGLang's own tuner: benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton.py "
                               f"--model CHECKPOINT --tp-size {dep.tp * dep.ep} --ep-size {dep.ep} --dtype fp8_w8a8 "
                               "--tune (kernel_gym measures bf16 kernels only)")
        else:
            cmd = (f"kernel-gym export --format {dep.engine} --engine-version {dep.version} --model "
                   f"{model} --tp {dep.tp}{ep} --out DIR")
            f["write_with"] = (f"{cmd} (the engine's own kernel design)" if measured else
                               f"{cmd} --force (no measurement of this shape in vLLM's kernel design: the engine's "
                               f"own entries, as an estimate; to measure it: kernel-gym tune --engine {dep.engine} "
                               f"--model {model} --tp {dep.tp}{ep} on an H200)")
    return files


@functools.lru_cache(maxsize=1)
def _packaged_engine_rows() -> tuple:
    from kernel_gym.deploy import engine_export as ee
    from kernel_gym.measure.store import PACKAGED_SNAPSHOT

    return tuple(ee.measured_rows([PACKAGED_SNAPSHOT]))


def engine_shape_measured(spec: Any, dep: Any, device: str = "NVIDIA H200") -> bool:
    """Whether the packaged data times this layout's engine-file shape in vLLM's kernel design at uniform routing:
    what `kernel-gym export` (no --routing) needs to write a measured file rather than refuse without --force."""
    from kernel_gym.deploy import engine_export as ee

    if spec.dtype_bytes == 1 or spec.expert_quant:  # kernel_gym measures bf16 kernels only
        return False
    samples, _ = ee.samples_by_workload(_packaged_engine_rows(), ee.shard_shape(spec, dep.tp, ep=dep.ep), device,
                                        f"{dep.engine}-{dep.version}")
    return any(skew == 0 for _, skew in samples)


CURVE_FACTORS = (0.5, 1, 2, 4)  # the goodput-vs-load curve's loads, x the trace's rate (x --rate-scale)
CURVE_MIN_WINDOW_S = 5.0  # a load point whose window would be shorter (or --window-s when shorter) is skipped
HOLDOUT = 0.2  # ServingPlan-v0's held-out share of the trace (its last part)


def fit_window(make: Any, window_s: float, min_window_s: float) -> tuple[Any, float]:
    """(env, window): `make(w)` builds the env of a `w`-second window, or raises ValueError when the split cannot hold
    its context + warm-up + window. The largest window <= `window_s` that fits (bisection, rounded down to 0.1 s);
    (None, that window) when it is below `min_window_s`."""
    try:
        return make(window_s), window_s
    except ValueError as exc:
        if "shorter than" not in str(exc):
            raise

    def fits(w: float) -> bool:
        try:
            make(w)
            return True
        except ValueError:
            return False

    w = largest_fitting(fits, window_s)
    if w <= 0 or w < min_window_s:
        return None, w
    return make(w), w


def load_curve(spec: Any, gpus: int, engine: str, trace: Any, slo: tuple[float, float], deps: list[Any],
               factors: list[float], window_s: float, routing: Any = None, table: Any = None,
               pricer: Any = None) -> tuple[dict[str, list], list[dict[str, Any]]]:
    """Goodput vs load (rate factor) per deployment on the held-out window: the data of the MLflow plot, and the
    notes on its load points. A higher load compresses the trace's time (`rate_scale`): W simulated seconds replay
    W x load seconds of the trace, so the held-out part (the last 20%: 120 s of the bundled 10-minute trace) holds
    shorter windows as the load grows. A point whose `window_s` (+ warm-up) does not fit is replayed on the longest
    window that does (its `window_s` says which), and skipped when that is below CURVE_MIN_WINDOW_S (or `window_s`)
    or the replay fails; each such point gets a note {"load", "window_s", "skipped", "note"}."""
    curve: dict[str, list] = {d.layout_name + " " + d.name.split(":", 2)[2]: [] for d in deps}
    notes: list[dict[str, Any]] = []
    floor = min(window_s, CURVE_MIN_WINDOW_S)
    held_s = trace.duration_s * HOLDOUT
    for f in factors:
        def make(w: float, f: float = f) -> Any:
            return make_env(spec, gpus, engine, trace, slo, f, w, "heldout", routing, table, pricer=pricer)

        where = (f"the held-out part of trace {trace.name!r} ({held_s:.0f} s of trace) holds at most"
                 f" {held_s / f:.0f} simulated s of warm-up + window at {f:g}x the trace's rate")
        try:
            env, w = fit_window(make, window_s, floor)
            if env is None:
                notes.append({"load": f, "window_s": w, "skipped": True,
                              "note": f"load {f:g}x skipped: {where}, room for a {w:g} s window with its warm-up, "
                                      f"under the {floor:g} s minimum"})
                continue
            start = window_starts(env, 1)[0]
            env.reset(options={"start_s": start})
            replays = [env.serve_deployment(d) for d in deps]
        except ValueError as exc:
            notes.append({"load": f, "window_s": None, "skipped": True, "note": f"load {f:g}x skipped: {exc}"})
            continue
        for key, r in zip(curve, replays):
            curve[key].append({"load": f, "offered_req_per_s": r["offered_req_per_s"],
                               "goodput_req_per_s": r["goodput_req_per_s"], "window_s": w})
        if w < window_s:
            notes.append({"load": f, "window_s": w, "skipped": False,
                          "note": f"load {f:g}x replayed on a {w:g} s window instead of {window_s:g} s: {where}"})
    return curve, notes


def log_mlflow(params: dict[str, Any], report: dict[str, Any], curve: dict[str, list], tracking_uri: str = "",
               notes: list[dict[str, Any]] | None = None) -> str:
    """One MLflow run: parameters (model, gpus, engine, trace, slo, rate_scale, train_steps), predicted goodput and
    shares, the report JSON and the goodput-vs-load plot; `notes` (load_curve's: shortened and skipped load points)
    as the tag `goodput_vs_load_notes`, the metrics `goodput_vs_load_points` / `goodput_vs_load_skipped` and a
    footnote of the plot."""
    try:
        import mlflow
    except ImportError as exc:
        raise RuntimeError("mlflow is not installed: pip install 'kernel_gym' (it depends on mlflow) or pass "
                           "--no-mlflow") from exc
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kernel_gym.train.tracking import get_or_create_experiment, setup_tracking

    uri = setup_tracking(tracking_uri or None)
    exp = get_or_create_experiment("kernel-gym-plan", uri)
    name = f"plan-{params['model']}-g{params['gpus']}-{params['engine']}"
    with mlflow.start_run(experiment_id=exp, run_name=name) as run:
        mlflow.log_params(params)
        from kernel_gym.train.tracking import git_commit

        mlflow.set_tag("git_commit", git_commit())
        best = report["recommended"]
        mlflow.log_metrics({"goodput_req_per_s": best["predicted"]["goodput_req_per_s"],
                            "estimated_share": best["predicted"]["estimated_share"],
                            "prior_share": best["predicted"]["prior_share"]})
        notes = notes or []
        mlflow.log_metrics({"goodput_vs_load_points": len(next(iter(curve.values()), [])),
                            "goodput_vs_load_skipped": sum(n["skipped"] for n in notes)})
        if notes:
            mlflow.set_tag("goodput_vs_load_notes", "; ".join(n["note"] for n in notes)[:5000])
        mlflow.log_dict(report, "plan.json")
        fig, ax = plt.subplots(figsize=(7, 4.6 if notes else 4))
        for name, pts in curve.items():
            ax.plot([p["offered_req_per_s"] for p in pts], [p["goodput_req_per_s"] for p in pts], marker="o",
                    label=name)
        ax.set_xlabel("offered load (requests / s)")
        ax.set_ylabel("goodput at the SLO (requests / s)")
        ax.set_title(f"{params['model']} on {params['gpus']} H200, {params['engine']}, {params['trace']}")
        if any(curve.values()):
            ax.legend(fontsize=7)
        if notes:
            short = ", ".join(f"{n['load']:g}x: {n['window_s']:g} s" for n in notes if not n["skipped"])
            skipped = ", ".join(f"{n['load']:g}x" for n in notes if n["skipped"])
            text = "; ".join(t for t in (short and f"shorter windows (the held-out part is too short) at {short}",
                                         skipped and f"skipped (see the run's goodput_vs_load_notes): {skipped}")
                             if t)
            fig.text(0.01, 0.01, text, fontsize=6, wrap=True)
            fig.tight_layout(rect=(0, 0.06, 1, 1))
        else:
            fig.tight_layout()
        mlflow.log_figure(fig, "goodput_vs_load.png")
        plt.close(fig)
        return run.info.run_id


def plan_deployment(*, model: str, gpus: int, trace: str, engine: str = "vllm", slo: str = "ttft=2,tpot=0.1",
                    rate_scale: float = 1.0, window_s: float = 60.0, routing: str = "zipf:1.2", train_steps: int = 64,
                    samples: int = 2, refine_rounds: int = 1, next_best: int = 3, model_id: str = "",
                    json_path: str = "", no_mlflow: bool = False, tracking_uri: str = "", seed: int = 0,
                    max_model_len: int = 0, backend: str = "recorded") -> int:
    """`kernel-gym plan` (module docstring): the recommended deployment and the `next_best` others printed, the plan
    written to `json_path` (when given) and logged to MLflow (unless `no_mlflow`). max_model_len: the engine's
    context limit (prompt + output tokens; default MAX_MODEL_LEN), in the launch commands; every deployment's KV
    cache must hold one request of it, and the trace's longer requests are refused (they miss the SLO). `backend`:
    "recorded" (the packaged H200 data) or a measurement store's path (the rows `tune` / `collect` wrote there)."""
    from kernel_gym.dispatch.baselines import measure_commands
    from kernel_gym.evaluate.replay import routing_profile
    from kernel_gym.evaluate.replay_report import json_safe, live_check_line
    from kernel_gym.models import kernel_spec, load_model, spec_caveats
    from kernel_gym.modelspec import MIXERS
    from kernel_gym.parallel.deploy import (
        MAX_MODEL_LEN,
        SGLANG_MAMBA_FULL_MEMORY_RATIO,
        SGLANG_SWA_FULL_TOKENS_RATIO,
        launch_commands,
        split_engine,
        state_slots_per_request,
    )
    from kernel_gym.parallel.layout import MAX_GPUS
    from kernel_gym.traffic.windows import resolve_trace

    limits = parse_slo(slo)
    from kernel_gym.measure import recorded_backend

    store = recorded_backend(backend)
    if json_path and (Path(json_path).is_dir() or str(json_path).endswith(("/", "\\"))):  # before the work, not after
        raise ValueError(f"--json {json_path}: a directory; pass a file name, e.g. --json "
                         f"{Path(json_path) / 'plan.json'}")
    if json_path:
        blocked = next((p for p in Path(json_path).parents if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            raise ValueError(f"--json {json_path}: {blocked} is a file, not a folder; pass a path in a folder")
    engine_name, engine_version = split_engine(engine)
    engine = f"{engine_name}-{engine_version}"  # every deployment below carries the release whose defaults it prices
    if not 1 <= gpus <= MAX_GPUS:
        raise ValueError(f"--gpus {gpus}: one H200 host has 1 to {MAX_GPUS} GPUs")
    if max_model_len < 0:
        raise ValueError(f"--max-model-len {max_model_len}: give the engine's context limit in tokens (> 0; 0 or "
                         f"left out: {MAX_MODEL_LEN})")
    for flag, value, low in (("--train-steps", train_steps, 0), ("--refine-rounds", refine_rounds, 0),
                             ("--next", next_best, 0), ("--samples", samples, 0)):
        if value < low:
            raise ValueError(f"{flag} {value}: give an integer >= {low}")
    for flag, value in (("--window-s", window_s), ("--rate-scale", rate_scale)):
        if not value > 0 or not math.isfinite(value):
            raise ValueError(f"{flag} {value:g}: give a positive number" + (" (1: the trace's own arrival rate)"
                                                                           if flag == "--rate-scale" else ""))
    if "@tp" in model:  # a shard planned as a whole model: its launch commands and predictions would be 1/N's
        raise ValueError(f"--model {model} names one GPU's tensor-parallel shard: plan chooses the parallelism itself; "
                         f"pass the whole model (--model {model.partition('@tp')[0]})")
    spec = load_model(model)
    if "@tp" in spec.name:
        raise ValueError(f"--model {model}: the spec {spec.name!r} is one GPU's tensor-parallel shard: plan chooses "
                         "the parallelism itself; pass the whole model's spec")
    for line in spec_caveats(spec):
        print(f"[plan] note: {line}", file=sys.stderr)
    ctx = spec.max_context  # the engines refuse a limit past the model's own (0: not known)
    if ctx and max_model_len > ctx:
        raise ValueError(f"--max-model-len {max_model_len}: {spec.name} serves at most {ctx} tokens (its config's "
                         f"max_position_embeddings), and the engine refuses a longer limit; pass at most {ctx}")
    max_model_len = max_model_len or min(MAX_MODEL_LEN, ctx or MAX_MODEL_LEN)
    spec = kernel_spec(spec)
    replayed = resolve_trace(trace)
    total = replayed.prompt_tokens + replayed.output_tokens
    too_long = int((total > max_model_len).sum())
    longest = int(total.max())
    serve_them = (f"pass --max-model-len {longest} to serve them" if not ctx or longest <= ctx else
                  f"{spec.name} serves at most {ctx} tokens (its config's max_position_embeddings)"
                  + (f": pass --max-model-len {ctx} to serve those within it" if max_model_len < ctx else ""))
    if too_long == len(replayed):
        raise ValueError(f"every request of trace {replayed.name!r} is longer than max_model_len {max_model_len} "
                         f"(prompt + output tokens; the shortest has {int(total.min())}): {serve_them}")
    if too_long:
        print(f"[plan] {too_long} of {len(replayed)} requests of trace {replayed.name!r} are longer than "
              f"max_model_len {max_model_len} (prompt + output tokens; the longest has {longest}): the engine refuses "
              f"them and they count as missing the SLO; {serve_them}", file=sys.stderr)
    fit = largest_window(replayed.duration_s, rate_scale, window_s)
    if fit < window_s:
        span = (f"spans {replayed.duration_s:g} s" if replayed.duration_s > 0 else
                "has no time span (one request, or all at one instant)")
        raise ValueError(f"trace {replayed.name!r} {span} at rate scale {rate_scale:g}: too short for {window_s:g}-s "
                         f"windows (the plan trains on windows of its first {1 - HOLDOUT:.0%} and predicts on one of "
                         f"its last {HOLDOUT:.0%}, each after a context and a warm-up); "
                         + (f"pass --window-s {fit:g} (or less)" if fit >= 1 else
                            "give a trace spanning a few minutes")
                         + (", or a lower --rate-scale" if rate_scale > 1 and fit < 1 else ""))
    profile = routing_profile(routing, spec, seed)
    print(f"[plan] {spec.name} on {gpus} H200, {engine}, trace {replayed.name} x{rate_scale:g}, SLO "
          f"TTFT <= {limits[0]} s TPOT <= {limits[1]} s; training the agent ({train_steps} steps)", file=sys.stderr)
    from kernel_gym.traffic.simulator import OverloadWarning

    with warnings.catch_warnings(record=True) as overloaded:  # one line for them all, in plan's own flags
        warnings.simplefilter("always", OverloadWarning)
        rec = recommend(spec, gpus, engine, replayed, limits, rate_scale, window_s, train_steps,
                        samples, seed=seed, routing=profile, refine_rounds=refine_rounds, max_model_len=max_model_len,
                        backend=store)
        used = rec["env"].used_gpus
        if used < gpus:
            print(f"[plan] no deployment of {spec.name} on all {gpus} GPUs fits ({rec['env'].unfit_reasons}); "
                  f"the plan uses {used} of them", file=sys.stderr)
        ranked, seen = [], set()
        for r in rec["ranked"]:  # the winner, then the best deployment of each other layout
            if r["deployment"].layout_name not in seen and len(ranked) <= next_best:
                ranked.append(r)
                seen.add(r["deployment"].layout_name)
        deps = [r["deployment"] for r in ranked]
        print(f"[plan] {len(rec['ranked'])} deployments scored ({rec['wall_s']:.0f} s); replaying the {len(deps)} best "
              "on the held-out window", file=sys.stderr, flush=True)
        held, _ = heldout_replay(spec, gpus, engine, replayed, limits, rate_scale, window_s, deps, profile,
                                 pricer=rec["env"].pricer)
    for w in overloaded:
        if not issubclass(w.category, OverloadWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    n_over = sum(issubclass(w.category, OverloadWarning) for w in overloaded)
    if n_over:
        print(f"[plan] {n_over} of the replays were overloaded (the offered load exceeds what that deployment "
              "sustains, so its queue and TTFT grow with the window): their goodput is what they serve within the "
              f"SLO at this load; plan for a lighter one with --rate-scale below {rate_scale:g}", file=sys.stderr)
    if not model_id and spec.name not in HF_IDS:  # a user's spec: its name is no checkpoint the engine can load
        print(f"[plan] the launch commands name the model {spec.name!r} (the spec's name): pass --model-id with "
              "the checkpoint the engine loads (a Hugging Face repo id or a local path)", file=sys.stderr)
    model_id = model_id or HF_IDS.get(spec.name, spec.name)
    table = rec["env"].table
    entries = []
    for r, h in zip(ranked, held):
        d = r["deployment"]
        entries.append({"deployment": d.to_dict(), "launch": launch_commands(d, model_id, max_model_len, spec),
                        "train_goodput_req_per_s": r["train_goodput_req_per_s"],
                        "train_headroom": r["train_headroom"], "from_agent": r["from_agent"],
                        "baseline": r["baseline"], "predicted": {k: v for k, v in h.items() if k != "deployment"},
                        "kernel_config_files": kernel_configs(spec, d, h, model)})
    report = {"model": spec.name, "gpus": gpus, "used_gpus": used, "engine": engine_name,
              "engine_version": engine_version, "trace": replayed.name, "rate_scale": rate_scale,
              "slo": {"ttft_s": limits[0], "tpot_s": limits[1]}, "routing": routing, "max_model_len": max_model_len,
              "collectives": {"source": None if table is None else table.source,
                              "prior": None if table is None else (table.prior or {}).get("source")},
              "recommended": entries[0], "next_best": entries[1:], "agent_proposals": rec["agent_proposals"],
              "evaluations": rec["evaluations"], "wall_s": rec["wall_s"]}
    best = entries[0]
    p = best["predicted"]
    print(f"\nrecommended: {best['deployment']['layout']} ({engine_name} {engine_version})")
    for cmd in best["launch"]:
        print(f"  {cmd}")
    block, knob = p.get("kv_block_tokens"), best["deployment"]["block_size"]
    if block and block != knob:
        print(f"  KV blocks of {block} tokens, not {knob}: vLLM raises the block of a model with a recurrent mixer "
              "state until one layer's block holds one layer's state; the launch passes it and the replay allocates "
              f"it (the attention kernels are priced at {knob}-token pages)")
    if p.get("state_slots"):
        ratio = SGLANG_MAMBA_FULL_MEMORY_RATIO
        print(f"  mixer state: SGLang's own pool (--mamba-full-memory-ratio {ratio:g}, "
              f"{ratio / (1 + ratio):.0%} of the memory after weights) holds {p['state_slots']} states, "
              f"{state_slots_per_request(spec)} per running request: at most "
              f"{p['state_running_cap']} run at once per replica; the KV cache has the rest of the memory")
    if engine_name == "sglang" and spec.window_tokens:
        ratio = SGLANG_SWA_FULL_TOKENS_RATIO
        print(f"  {MIXERS[spec.mixer]} KV: SGLang's own pool (--swa-full-tokens-ratio {ratio:g}: {ratio:g} of its "
              "tokens per token of the full layers' pool); a request holds "
              + (f"its current chunk there (at most {spec.window_tokens} tokens)" if spec.mixer == "chunked-local"
                 else f"its last {spec.window_tokens} tokens there"))
    print(f"  kernel configs: {', '.join(f['file'] for f in best['kernel_config_files'])}")
    for how in dict.fromkeys(f["write_with"] for f in best["kernel_config_files"] if f.get("write_with")):
        print(f"    write them with: {how}")
    print(f"  predicted goodput {p['goodput_req_per_s']:.2f} req/s ({p['slo_attainment']:.0%} within SLO, "
          f"{p['goodput_tokens_per_s_per_gpu']:.0f} good tokens/s/GPU); estimated share {p['estimated_share']:.0%}, "
          f"prior share {p['prior_share']:.0%} of the step time")
    if p.get("roofline_priced"):
        print(f"  priced from the roofline, no measured rows at this model's shapes: {', '.join(p['roofline_priced'])}"
              f" (in the estimated share); to price them from measurements: "
              f"{measure_commands(p['roofline_priced'])} on a GPU, then plan again with --backend STORE")

    def lat(key: str, scale: float, unit: str) -> str:
        vals = [p.get(f"{key}_p50_s"), p.get(f"{key}_p99_s")]
        ok = all(v is not None and math.isfinite(v) for v in vals)
        return f"{vals[0] * scale:.3g} / {vals[1] * scale:.3g} {unit}" if ok else "n/a (no request defines it)"

    print(f"  held-out latency: TTFT p50 / p99 {lat('ttft', 1, 's')} (SLO {limits[0]:g} s), TPOT p50 / p99 "
          f"{lat('tpot', 1e3, 'ms')} (SLO {limits[1] * 1e3:g} ms)")
    live = live_check_line()
    if live:
        print(f"  read these with {live}")
    if p["goodput_req_per_s"] <= 0:
        print(f"  no request of the held-out window met the SLO (TTFT <= {limits[0]:g} s and TPOT <= {limits[1]:g} s): "
              "compare the latencies above with it; loosen --slo, give more --gpus, or replay a lower load "
              f"(--rate-scale below {rate_scale:g})")
    if p.get("refused_too_long"):
        print(f"  {p['refused_too_long']} of the held-out window's {p['requests']} requests refused: longer than "
              f"max_model_len {max_model_len}")
    if p["requests"] < FEW_REQUESTS:
        print(f"  the held-out window holds only {p['requests']} request(s) in {window_s:g} s: these figures rest on "
              f"too few to rank deployments by; replay more load (--rate-scale above {rate_scale:g}) or longer "
              f"windows (--window-s above {window_s:g})")
    n_train = len(rec["train_windows"])
    print(f"  chosen by its mean goodput on the {n_train} training window{'s' if n_train != 1 else ''}: "
          f"{best['train_goodput_req_per_s']:.2f} req/s (ties by SLO headroom, here {best['train_headroom']:.2f}); "
          "the predicted goodput is one held-out window's")
    # the rows rank by training goodput (as the recommendation); held-out goodput is the prediction, one window
    print(f"{'next best (ranked by training goodput, then headroom)':<58} {'train req/s':>11} {'held-out req/s':>14} "
          f"{'estimated':>9} {'prior':>6}")
    above = False
    for e in entries[1:]:
        q = e["predicted"]
        mark = "*" if q["goodput_req_per_s"] > p["goodput_req_per_s"] else " "
        above |= mark == "*"
        print(f"  {e['deployment']['engine']}-{e['deployment']['version']}:{e['deployment']['layout']} "
              f"bs{e['deployment']['block_size']} "
              f"mbt{e['deployment']['max_batched_tokens']} seqs{e['deployment']['max_seqs']} "
              f"graph{e['deployment']['graph_max']}".ljust(58) +
              f" {e['train_goodput_req_per_s']:>11.2f} {q['goodput_req_per_s']:>13.2f}{mark} "
              f"{q['estimated_share']:>9.0%} {q['prior_share']:>6.0%}")
    if above:
        print("  * a higher held-out goodput than the recommended deployment's on this one window, a lower training "
              "goodput (the ranking)")

    def write_json() -> None:
        if json_path:
            Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            Path(json_path).write_text(json.dumps(json_safe(report), indent=1, default=str, allow_nan=False) + "\n")

    write_json()  # the recommendation first: the optional curve and MLflow run below cannot lose it
    if not no_mlflow:
        curve, notes = load_curve(spec, gpus, engine, replayed, limits, deps[:3],
                                  [rate_scale * f for f in CURVE_FACTORS], window_s, profile,
                                  pricer=rec["env"].pricer)
        for n in notes:
            print(f"[plan] goodput vs load: {n['note']}", file=sys.stderr)
        report["goodput_vs_load"] = curve
        report["goodput_vs_load_notes"] = notes
        write_json()
        data = getattr(rec["env"].backend, "inner", rec["env"].backend)  # the rows the plan was priced from
        params = {"model": model, "gpus": gpus, "engine": engine, "trace": trace, "slo": slo, "rate_scale": rate_scale,
                  "train_steps": train_steps, "window_s": window_s, "routing": routing, "seed": seed,
                  "backend": backend, "max_model_len": max_model_len,
                  "dataset_sha256_16": str(getattr(data, "dataset_hash", "") or "")}
        try:
            report["mlflow_run_id"] = log_mlflow(params, report, curve, tracking_uri, notes)
        except (ValueError, RuntimeError):
            if json_path:
                print(f"[plan] the plan is written to {json_path}; logging it to MLflow failed:", file=sys.stderr)
            raise
        skipped = [f"{n['load']:g}x" for n in notes if n["skipped"]]
        print(f"MLflow run {report['mlflow_run_id']} (experiment kernel-gym-plan): goodput_vs_load.png"
              + (f" (load points skipped: {', '.join(skipped)}; see goodput_vs_load_notes)" if skipped else ""))
        write_json()
    return 0
