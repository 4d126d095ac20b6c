"""Zero-shot quality on models never trained on, timed live: the model-conditioned policy's choices beside a wide sweep.

What a user gets for a model the project never measured is the policy's choice under the knob-space rules alone
(`kernel_gym.train.zoo_policy.choose`, the pyfunc model's "rules" mask). This script measures exactly that:

    python benchmarks/generalisation/run.py plan --out benchmarks/generalisation/plan.json  # CPU: train 3 seeds, choose
    python3 benchmarks/generalisation/run.py time --plan benchmarks/generalisation/plan.json --out $OUT/live.json  # GPU
    python benchmarks/generalisation/run.py report --result benchmarks/generalisation/live.json  # generalisation.json

`plan` trains one model-conditioned policy per kernel and seed on the zoo's training models (never a row of a test
model's workloads; kernel_gym.zoo.TEST_MODELS), then for each evaluation workload of the test models writes: each
seed's zero-shot choice, each seed's 8 most preferred valid configs (what `kernel-gym tune` would measure), and a sweep
of at least 256 configs sampled uniformly from the valid space plus every catalogue entry and the default.

`time` (GPU; imports only torch, triton, numpy and the standard library) compiles every config in a CPU pool, then per
workload, in one process: checks each config against the torch reference (outputs NaN-poisoned first, then a second
launch over a NaN-filled output) and times it (the sweep); then times the seeds' choices, the tune picks and the
sweep's three fastest paired, their samples interleaved one by one. `report` scores ratio = best_ms / chosen_ms from
the paired rounds (best = the fastest of that paired set, which holds the sweep's best) and the tune and sweep curves
from the sweep.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import sys
import time
from pathlib import Path

KERNEL_ENVS = {"fused_moe": "KernelGym/MoE-v0", "decode_attention": "KernelGym/DecodeAttention-v0"}
TUNE_K = 8
# Evaluation workloads timed live (the GPU budget of one session allows ~20 wide sweeps): for each test model, shards
# and sizes spread so that every TP degree, small and large M (batch), and skewed routing appear.
MOE_EVAL = {  # model -> [(tp, tokens, skew)]
    "phi-3.5-moe": [(1, 1, 0.0), (2, 256, 1.2), (4, 4096, 0.0), (1, 1024, 0.0)],
    "qwen1.5-moe-a2.7b": [(1, 16, 0.0), (2, 1024, 0.0), (4, 64, 1.2), (1, 256, 0.0)],
    "gpt-oss-20b": [(1, 64, 0.0), (2, 4096, 0.0), (4, 256, 1.2), (2, 16, 0.0)],
    # kernel_gym.zoo.FRESH_MODELS, added after run 3
    "ernie-4.5-21b-a3b": [(1, 16, 0.0), (2, 4096, 0.0), (4, 256, 1.2), (1, 1024, 0.0)],
    "hunyuan-a13b": [(1, 64, 1.2), (4, 4096, 0.0), (2, 256, 0.0), (1, 1, 0.0)],
    "glm-4.5-air": [(2, 64, 0.0), (1, 4096, 0.0), (4, 1024, 0.0), (2, 256, 1.2)],
}
DECODE_EVAL = {  # model -> [(tp, batch, context)]
    "qwen2-57b-a14b": [(1, 1, 4096), (2, 64, 2048), (4, 256, 4096)],
    "llama-4-scout": [(1, 8, 16384), (4, 128, 1024), (2, 32, 4096)],
    "granite-3.0-3b-a800m": [(1, 32, 4096), (2, 256, 4096), (4, 1, 4096)],
    # fresh (kernel_gym.zoo.FRESH_MODELS), added after run 3
    "ernie-4.5-21b-a3b": [(1, 1, 4096), (2, 64, 2048), (4, 128, 1024)],
    "glm-4.5-air": [(1, 32, 4096), (2, 8, 16384), (4, 256, 4096)],
}


# The far test split (kernel_gym.zoo.FAR_TEST_MODELS): the shards people serve (TP 4 and 8), M from 1 to 4096 and
# skewed routing, fixed before any of their shapes was timed.
MOE_FAR = {
    "llama-4-maverick": [(8, 1, 0.0), (8, 1024, 0.0), (4, 256, 1.2), (4, 4096, 0.0)],
    "snowflake-arctic": [(8, 4096, 0.0), (8, 64, 1.2), (4, 16, 0.0), (4, 1024, 0.0)],
    "qwen3-next-80b-a3b": [(8, 256, 0.0), (8, 4096, 0.0), (4, 1, 0.0), (4, 64, 1.2)],
    "jamba-1.5-large": [(8, 64, 0.0), (8, 4096, 0.0), (8, 256, 1.2), (8, 1024, 0.0)],
}
# The second far split (kernel_gym.zoo.FAR2_TEST_MODELS), fixed before any of its shapes was timed; the product's
# zero-shot answer here is the cost model's re-ranking (`export --policy-dir` with the shipped fused_moe.cost.npz).
MOE_FAR2 = {
    "minimax-text-01": [(8, 1, 0.0), (8, 1024, 0.0), (4, 256, 1.2), (4, 4096, 0.0)],
    "ernie-4.5-300b-a47b": [(8, 64, 1.2), (8, 4096, 0.0), (4, 16, 0.0), (4, 1024, 0.0)],
    "skywork-moe": [(4, 1, 0.0), (4, 64, 0.0), (4, 256, 1.2), (4, 4096, 0.0)],
    "granite-3.0-1b-a400m": [(1, 256, 0.0), (1, 4096, 0.0), (2, 16, 0.0), (2, 64, 1.2)],
}
FAR_SPLITS = {"far": MOE_FAR, "far2": MOE_FAR2}
ROBUST_TOP_K = 4  # kernel-gym tune's default: the policy's top 4 + nearest shapes' winners + engine entry + local


# Leave-one-model-out, timed live: a training model's shapes, scored with a policy trained without any of its rows
# (`plan --leave-out MODEL ...`). Three shards each: small M sharded, large M, skewed (MoE); three batch x context
# points (decode).
LOMO_MOE = [(2, 64, 0.0), (1, 4096, 0.0), (4, 256, 1.2)]
LOMO_DECODE = [(1, 1, 4096), (2, 64, 2048), (4, 256, 4096)]


def _workload(kernel: str, model: str, point: tuple) -> tuple[str, object]:
    from kernel_gym import zoo
    from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload

    spec = zoo.shard(zoo.ZOO[model], point[0])
    if kernel == "fused_moe":
        return spec.name, MoEWorkload(point[1], spec.num_experts, spec.top_k, spec.hidden, spec.intermediate, point[2])
    return spec.name, DecodeWorkload(spec.num_heads, spec.num_kv_heads, spec.head_dim, point[1], point[2])


def eval_workloads(kernel: str, models: dict[str, list] | None = None) -> list[tuple[str, object]]:
    """(shard name, workload) pairs of the test models (or of `models`: name -> points), interleaved over models so a
    budget cut keeps every model."""
    per_model = [[_workload(kernel, model, p) for p in points] for model, points in
                 (models or (MOE_EVAL if kernel == "fused_moe" else DECODE_EVAL)).items()]
    return [r for i in range(max(map(len, per_model))) for rows in per_model if i < len(rows) for r in [rows[i]]]


def make_plan(args: argparse.Namespace) -> int:
    from sb3_contrib import MaskablePPO

    from kernel_gym import zoo
    from kernel_gym.kernels import get_family
    from kernel_gym.measure import make_backend
    from kernel_gym.train import zoo_policy
    from kernel_gym.train.train import TrainArgs, train

    backend = make_backend("recorded")
    entries, trained = [], []
    nearest = None
    for kernel in args.kernels:
        space, family = get_family(kernel).space, get_family(kernel)
        if args.split in FAR_SPLITS:
            if kernel != "fused_moe":
                continue
            groups = [((), args.split, eval_workloads(kernel, FAR_SPLITS[args.split]))]
        elif args.leave_out:  # one group per left-out training model: its policies never saw any of its rows
            allowed = zoo.training_models(kernel)
            unknown = [m for m in args.leave_out if m not in zoo.ZOO]
            if unknown:
                raise SystemExit(f"--leave-out: unknown zoo model(s) {unknown}; the zoo has {sorted(zoo.ZOO)}")
            points = LOMO_MOE if kernel == "fused_moe" else LOMO_DECODE
            groups = [((m,), "lomo", eval_workloads(kernel, {m: points})) for m in args.leave_out if m in allowed]
        else:
            groups = [((), "test", eval_workloads(kernel))]
        for exclude, split, workloads in groups:
            tag = f"zoo-{kernel}" + "".join(f"-without-{m}" for m in exclude)
            policies = []
            for seed in args.seeds:
                ckpt = args.checkpoints / f"{tag}-seed{seed}"
                register = seed == args.seeds[0] and not exclude
                res = train(TrainArgs(env_id=KERNEL_ENVS[kernel], model=zoo_policy.ZOO_MODEL, holdout=0.1, seed=seed,
                                      exclude_models=",".join(exclude), total_timesteps=args.timesteps, eval_freq=0,
                                      checkpoint_freq=0, checkpoint_dir=str(ckpt), experiment="kernel-gym-zoo",
                                      run_name=f"{tag}-seed{seed}", tracking_uri=args.tracking_uri,
                                      progress_bar=False, log_model=register, register_model=register),
                            backend=backend)
                model = MaskablePPO.load(ckpt / "latest.zip", device="cpu")
                policies.append((seed, model, res.catalogue))
                trained.append({"kernel": kernel, "seed": seed, "excluded": list(exclude), "run_id": res.run_id,
                                "model_uri": res.model_uri, "catalogue": len(res.catalogue),
                                "train_workloads": res.catalogue.meta.get("train_workloads"),
                                "recorded_heldout_geomean": res.evaluation.geomean_policy})
                print(f"{tag} seed {seed}: trained ({len(res.catalogue)} actions)", flush=True)
            held_out = zoo_policy.excluded_keys(kernel, exclude) if exclude else zoo.test_workload_keys(kernel)
            # The product's zero-shot re-ranking (tune.zero_shot_ranker): one cost model per seed, fitted on the
            # packaged dataset without any test model's rows (cost_model.fit_packaged), so only held-out splits
            # (never a leave-one-model-out one, whose model the packaged rows hold) get it.
            costs = {}
            if kernel == "fused_moe" and args.rerank and not exclude:
                from kernel_gym.dispatch import cost_model as cm

                costs = {seed: cm.fit_packaged(backend, cm.FitOptions(seed=seed)) for seed, _, _ in policies}
                print(f"cost models fitted (seeds {sorted(costs)})", flush=True)
            for shard, w in workloads:
                assert w.key() in held_out, f"{w.key()} is not held out of training"
                choices, tune, policy_choices = {}, {}, {}
                if costs:
                    from kernel_gym.deploy import tune as tune_mod

                    nearest = nearest or tune_mod.NearestWinners(backend)
                for seed, model, cat in policies:
                    ranked = zoo_policy.ranked(model, cat, w)
                    policy_choices[seed] = str(ranked[0] if ranked else family.default_config(w))
                    if costs:
                        ranked = zoo_policy.ranked(model, cat, w, costs[seed], nearest)
                    choices[seed] = str(ranked[0] if ranked else family.default_config(w))
                    tune[seed] = [str(c) for c in ranked[:TUNE_K]]
                sweep = [str(c) for c in space.sample(w, args.sweep, seed=args.sweep_seed)]
                catalogue = [str(c) for _, _, cat in policies for c in cat.configs if space.is_valid(c, w)]
                extra_fields: dict = {}
                if kernel == "fused_moe":  # kernel-gym tune's search: round 1 here, its local round timed live
                    from kernel_gym.deploy import tune as tune_mod
                    from kernel_gym.dispatch.shape_coverage import Shape, coverage
                    from kernel_gym.kernels import vllm_moe
                    from kernel_gym.kernels.space import Config

                    nearest = nearest or tune_mod.NearestWinners(backend)
                    robust = {seed: [str(c) for c in tune_mod.first_round(
                        w, functools.partial(zoo_policy.ranked, model, cat, cost=costs.get(seed), nearest=nearest),
                        ROBUST_TOP_K, nearest)] for seed, model, cat in policies}
                    local = {str(c) for r1 in robust.values() for c1 in r1 for c in tune_mod.local_steps(
                        Config.parse(c1), w, space)}
                    engine = tune_mod.engine_candidate(w)

                    extra_fields = {"robust": robust, "extra": sorted(local),
                                    **({"policy_choices": policy_choices, "rerank": "tune.zero_shot_ranker with "
                                        "cost_model.fit_packaged(seed)"} if costs else {}),
                                    "engine_entry": str(engine) if engine is not None else None,
                                    "anchor": str(vllm_moe.FAMILY.engine_config(w)),
                                    "coverage": coverage(Shape(shard, w.num_experts, w.top_k, w.hidden,
                                                               w.intermediate)).as_dict()}
                configs = list(dict.fromkeys([*choices.values(), *policy_choices.values(),
                                              *(c for t in tune.values() for c in t),
                                              *(c for r in extra_fields.get("robust", {}).values() for c in r),
                                              str(family.default_config(w)), *catalogue, *sweep]))
                entries.append({"kernel": kernel, "model": zoo.base_model(shard), "shard": shard, "split": split,
                                "workload": w.key(), "choices": choices, "tune": tune,
                                "default": str(family.default_config(w)), "sweep": sweep, "configs": configs,
                                **extra_fields})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "python benchmarks/generalisation/run.py " + " ".join(sys.argv[1:]),
                                    "seeds": args.seeds, "timesteps": args.timesteps, "sweep": args.sweep,
                                    "trained": trained, "entries": entries}, indent=1))
    print(f"wrote {len(entries)} workloads, {sum(len(e['configs']) for e in entries)} configs to {args.out}")
    return 0


def _check_and_time(fam, inputs, ref, wl, c: str, keep: set, compiled: dict, state: dict) -> None:
    """Check one config against the torch reference (outputs NaN-poisoned first, then a second launch over a
    NaN-filled output) and time it; its launch closure is kept when `c` is in `keep` (the paired rounds need it)."""
    import torch

    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.timing import TimingOptions, time_launch
    from kernel_gym.measure.worker import compare, poison_outputs, poisoned_empty

    c0 = time.time()
    fn = out = None
    try:
        with poisoned_empty():
            fn = fam.prepare(inputs, Config.parse(c))
            out = fn()
        torch.cuda.synchronize()
        wrong = compare(fam, out, ref, wl.dtype)
        if wrong is None:
            poison_outputs(out)
            wrong = compare(fam, fn(), ref, wl.dtype)
        if wrong is None:
            state["sweep_ms"][c] = time_launch(fn, TimingOptions()).median_ms
            if c in keep:
                state["fns"][c] = fn
            state["status"][c] = "ok"
        else:
            state["status"][c] = f"wrong_result: {wrong}"[:200]
    except Exception as exc:  # noqa: BLE001 - a failing config is recorded, never timed
        state["status"][c] = f"{type(exc).__name__}: {exc}"[:200]
        torch.cuda.synchronize()
    state["seconds"][c] = time.time() - c0 + compiled.get(c, (None, "", 0.0))[2]


def time_plan(args: argparse.Namespace) -> int:
    import torch

    from kernel_gym.deploy import tune as tune_mod
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.compiler import CompilePool
    from kernel_gym.measure.timing import time_interleaved
    from kernel_gym.measure.worker import compare, poison_outputs, workload_from_key

    if not torch.cuda.is_available():
        raise SystemExit("`time` runs the kernels on a CUDA GPU; on the CPU only `plan` and `report` work")
    plan = json.loads(_read_text(args.plan))
    entries = plan["entries"]
    os.environ.setdefault("TRITON_CACHE_DIR", "/tmp/kernel_gym_triton_cache")
    pool = CompilePool(args.compile_workers, {"TRITON_CACHE_DIR": os.environ["TRITON_CACHE_DIR"]})
    t0 = time.time()
    futures = [pool.submit(e["kernel"], e["workload"], e["configs"] + e.get("extra", [])) for e in entries]
    results = []
    for n, (entry, fut) in enumerate(zip(entries, futures)):
        if time.time() - t0 > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: {len(entries) - n} workloads left", flush=True)
            break
        compiled = CompilePool.collect(fut, timeout_s=300)
        fam = get_family(entry["kernel"])
        wl = workload_from_key(fam, entry["workload"])
        inputs = fam.make_inputs(wl, "cuda", seed=0)
        ref = fam.reference(inputs)
        sweep_ms, status, seconds, fns = {}, {}, {}, {}
        # Only the configs the paired rounds may need keep their launch closure (each holds its own buffers; keeping
        # all ~270 ran a 16k-context decode workload out of memory); the sweep's fastest are prepared again after.
        keep = {*entry["choices"].values(), *entry.get("policy_choices", {}).values(),
                *(c for t in entry["tune"].values() for c in t), entry["default"]}
        w0 = time.time()
        state = {"sweep_ms": sweep_ms, "status": status, "seconds": seconds, "fns": fns}
        for c in entry["configs"]:
            _check_and_time(fam, inputs, ref, wl, c, keep, compiled, state)
        sweep_s = time.time() - w0
        # kernel-gym tune's search, as the command runs it: round 1 (timed in the sweep), then the one-knob steps
        # around round 1's fastest (compiled with the plan as "extra", timed here), the fastest of both kept.
        robust_picks, local_timed = {}, {}
        for s_, round1 in entry.get("robust", {}).items():
            timed = [c for c in round1 if c in sweep_ms]
            if not timed:
                robust_picks[s_] = None
                continue
            best1 = min(timed, key=sweep_ms.__getitem__)
            steps = [str(c) for c in tune_mod.local_steps(Config.parse(best1), wl, fam.space, tune_mod.LOCAL_STEPS,
                                                          exclude={Config.parse(c) for c in round1})]
            for c in steps:
                if c not in status:
                    _check_and_time(fam, inputs, ref, wl, c, set(), compiled, state)
            local_timed[s_] = steps
            robust_picks[s_] = min((c for c in [*round1, *steps] if c in sweep_ms), key=sweep_ms.__getitem__)
        # The engine's own kernel (vLLM's fused-MoE design with vLLM's config for this M) on the same inputs and
        # routing, checked against the same reference, in the paired rounds as "vllm:<config>".
        anchor_key, anchor_status = None, None
        if entry.get("anchor"):
            from kernel_gym.kernels import vllm_moe as vm

            try:
                a_fn = vm.prepare_kernels_only(inputs, Config.parse(entry["anchor"]))
                a_out = a_fn()
                torch.cuda.synchronize()
                wrong = compare(vm.FAMILY, a_out, ref, wl.dtype)
                if wrong is None:
                    poison_outputs(a_out)
                    wrong = compare(vm.FAMILY, a_fn(), ref, wl.dtype)
                if wrong is None:
                    anchor_key = "vllm:" + entry["anchor"]
                    fns[anchor_key] = a_fn
                    anchor_status = "ok"
                else:
                    anchor_status = f"wrong_result: {wrong}"[:200]
            except Exception as exc:  # noqa: BLE001 - recorded, the workload is scored without the anchor
                anchor_status = f"{type(exc).__name__}: {exc}"[:200]
                torch.cuda.synchronize()
            a_out = None
        top = sorted(sweep_ms, key=sweep_ms.__getitem__)[:3]
        for c in top:  # checked in the sweep; prepared again for the paired rounds (a compile-cache hit)
            if c not in fns:
                fns[c] = fam.prepare(inputs, Config.parse(c))
        tune_picks = {s: min((c for c in t if c in sweep_ms), key=sweep_ms.__getitem__, default=None)
                      for s, t in entry["tune"].items()}
        for c in [*robust_picks.values(), entry.get("engine_entry")]:
            if c is not None and c in sweep_ms and c not in fns:
                fns[c] = fam.prepare(inputs, Config.parse(c))
        paired_set = [c for c in dict.fromkeys([*entry["choices"].values(), *entry.get("policy_choices", {}).values(),
                                                *tune_picks.values(), *top,
                                                entry["default"], *(c for c in robust_picks.values() if c),
                                                *([entry["engine_entry"]] if entry.get("engine_entry") else []),
                                                *([anchor_key] if anchor_key else [])]) if c in fns]
        # Samples interleaved one by one (a b c ..., then ... c b a): a drift of the clocks over the workload's
        # rounds (power, temperature: large-M MoE) falls on every config alike; a round = `reps` samples' median.
        samples = time_interleaved([fns[c] for c in paired_set], args.rounds * args.reps)
        rounds = {c: [_median(xs[i:i + args.reps]) for i in range(0, len(xs), args.reps)]
                  for c, xs in zip(paired_set, samples)}
        results.append({**{k: entry[k] for k in ("kernel", "model", "shard", "workload", "choices", "tune",
                                                 "default")}, "split": entry.get("split", "test"),
                        **({"policy_choices": entry["policy_choices"]} if "policy_choices" in entry else {}),
                        "tune_picks": tune_picks, "robust_picks": robust_picks, "local_timed": local_timed,
                        "anchor": anchor_key, "anchor_status": anchor_status,
                        "engine_entry": entry.get("engine_entry"), "coverage": entry.get("coverage"),
                        "sweep_ms": sweep_ms, "status": status, "seconds": seconds,
                        "sweep_s": sweep_s, "configs_swept": len(sweep_ms), "configs_attempted": len(entry["configs"]),
                        "round_ms": rounds})
        ok = sum(s == "ok" for s in status.values())
        chosen = entry["choices"][next(iter(entry["choices"]))]
        ratio = min(min(v) for v in rounds.values()) / min(rounds[chosen]) if chosen in rounds else None
        print(f"[{time.time() - t0:.0f}s] {n + 1}/{len(entries)} {entry['kernel']} {entry['shard']}: {ok}/"
              f"{len(status)} ok in {sweep_s:.0f} s; seed-0 choice at {ratio}", flush=True)
        fns.clear()
        del inputs, ref
        torch.cuda.empty_cache()
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "triton": __import__("triton").__version__, "rounds": args.rounds,
                                        "reps": args.reps, "results": results}, indent=1))
    pool.close()
    return 0


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _p5(xs: list[float]) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(0.05 * len(s)) - 1)] if s else float("nan")


def paired_ms(r: dict, config: str | None) -> float | None:
    """Median over the paired rounds of a config's time."""
    times = r["round_ms"].get(config) if config else None
    return _median(times) if times else None


def _group(rows: list[dict], key: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for x in rows:
        out.setdefault(x[key], []).append(x["ratio"])
    return out


def _subset(rows: list[dict], models: tuple[str, ...]) -> dict | None:
    """Scores over the rows of these models only (None when none of them was timed)."""
    ratios = [x["ratio"] for x in rows if x["model"] in models]
    return {"models": list(models), "geomean": _geomean(ratios), "p5": _p5(ratios), "min": min(ratios),
            "rows": len(ratios)} if ratios else None


def score(results: list[dict]) -> dict:
    """Rows and curves of one kernel's timed workloads: ratio = best / chosen from the paired samples (a choice that
    failed its check is charged the default config, the Dispatcher's fallback); tune picks; the policy-ranked and
    random-order curves from the sweep."""
    rows, tuned, default_rows, incomplete, robust, vs_engine, argmax = [], [], [], [], [], [], []
    curve_policy: dict[int, list[float]] = {}
    curve_random: dict[int, list[float]] = {}
    seconds_per_config = []
    for r in results:
        if len(r["sweep_ms"]) < 0.5 * len(r["status"]):  # most of the sweep failed (e.g. out of memory): its best is
            incomplete.append({"shard": r["shard"], "workload": r["workload"],  # no oracle; reported, not scored
                               "configs_swept": len(r["sweep_ms"]), "configs_attempted": len(r["status"])})
            continue
        best = min(paired_ms(r, c) for c in r["round_ms"] if not c.startswith("vllm:"))  # kernel_gym's kernel only
        for seed, c in r["choices"].items():
            ms = paired_ms(r, c)
            if ms is None:  # the choice failed its check: the Dispatcher's fallback is the default config
                ms = paired_ms(r, r["default"])
            swept = len(r["sweep_ms"])  # configs that passed the check and were timed (not attempts)
            rows.append({"model": r["model"], "shard": r["shard"], "workload": r["workload"], "seed": int(seed),
                         "chosen": c, "chosen_ms": ms, "best_ms": best, "ratio": best / ms,
                         "configs_swept": swept, "configs_attempted": len(r["status"])})
        for seed, c in (r.get("policy_choices") or {}).items():  # --rerank plans: the policy's own argmax beside
            ms = paired_ms(r, c) or paired_ms(r, r["default"])
            argmax.append({"shard": r["shard"], "workload": r["workload"], "seed": int(seed), "chosen": c,
                           "ratio": best / ms})
        for seed, c in r["tune_picks"].items():
            ms = paired_ms(r, c)
            if ms is not None:
                tuned.append({"shard": r["shard"], "seed": int(seed), "ratio": best / ms})
        d = paired_ms(r, r["default"])
        if d is not None:
            default_rows.append(best / d)
        for seed, c in (r.get("robust_picks") or {}).items():
            ms = paired_ms(r, c)
            if ms is None and c is None:  # nothing of round 1 passed its check: the default config is served
                ms = paired_ms(r, r["default"])
            if ms is not None:
                robust.append({"shard": r["shard"], "workload": r["workload"], "seed": int(seed), "chosen": c,
                               "ratio": best / ms})
        a = paired_ms(r, r.get("anchor"))
        if a is not None:
            row = {"shard": r["shard"], "workload": r["workload"], "anchor": r["anchor"], "anchor_ms": a,
                   "best_ms": best, "best_over_anchor": a / best, "zero_shot_over_anchor": {}, "tuned_over_anchor": {}}
            for seed, c in r["choices"].items():
                ms = paired_ms(r, c) or paired_ms(r, r["default"])
                if ms:
                    row["zero_shot_over_anchor"][seed] = a / ms
            for seed, c in (r.get("robust_picks") or {}).items():
                ms = paired_ms(r, c)
                if ms:
                    row["tuned_over_anchor"][seed] = a / ms
            e = paired_ms(r, r.get("engine_entry"))
            row["engine_entry_in_kernel_gym_over_anchor"] = a / e if e else None
            vs_engine.append(row)
        sweep_best = min(r["sweep_ms"].values())
        n_sweep = len(r["sweep_ms"])
        seconds_per_config.append(sum(r["seconds"].values()) / max(1, len(r["seconds"])))
        for ranked in r["tune"].values():  # policy-ranked top-k, scored on the sweep's times
            for k in (1, 2, 4, 8):
                got = [r["sweep_ms"][c] for c in ranked[:k] if c in r["sweep_ms"]]
                if got:
                    curve_policy.setdefault(k, []).append(sweep_best / min(got))
        sweep_cfgs = sorted(r["sweep_ms"])
        rng = random.Random(0)
        for k in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            vals = []
            for _ in range(50):
                pick = rng.sample(sweep_cfgs, min(k, n_sweep))
                vals.append(sweep_best / min(r["sweep_ms"][c] for c in pick))
            curve_random.setdefault(k, []).append(_geomean(vals))
    ratios = [x["ratio"] for x in rows]
    summary = {"test_models": sorted({x["model"] for x in rows}), "geomean": _geomean(ratios), "p5": _p5(ratios),
               "min": min(ratios), "workloads": len({(x["shard"], x["workload"]) for x in rows}),
               "seeds": sorted({x["seed"] for x in rows}), "default_geomean": _geomean(default_rows),
               "estimated_share": 0.0, "incomplete_sweeps_left_out": incomplete,
               "per_model": {m: {"geomean": _geomean(v), "p5": _p5(v), "min": min(v)}
                             for m, v in sorted(_group(rows, "model").items())}}
    tr = [x["ratio"] for x in tuned]
    spc = sum(seconds_per_config) / len(seconds_per_config)
    rr = [x["ratio"] for x in robust]
    engine_summary = None
    if vs_engine:
        z = [v for x in vs_engine for v in x["zero_shot_over_anchor"].values()]
        t = [v for x in vs_engine for v in x["tuned_over_anchor"].values()]
        engine_summary = {"note": "anchor_ms / kernel_gym ms (paired, same inputs and routing): > 1 is faster than "
                                  "the engine's own kernel with the engine's own config",
                          "best_geomean": _geomean([x["best_over_anchor"] for x in vs_engine]),
                          "zero_shot_geomean": _geomean(z), "zero_shot_min": min(z) if z else None,
                          "tuned_geomean": _geomean(t), "tuned_min": min(t) if t else None,
                          "workloads": len(vs_engine), "rows": vs_engine}
    if argmax:
        am = [x["ratio"] for x in argmax]
        summary["zero_shot_is"] = "the cost model's re-ranking (tune.zero_shot_ranker): `export --policy-dir`'s answer"
        summary["policy_argmax"] = {"geomean": _geomean(am), "p5": _p5(am), "min": min(am), "rows": argmax}
    return {"summary": summary, "rows": rows,
            "robust_tune": {"method": f"kernel-gym tune: the policy's top {ROBUST_TOP_K}, the 3 nearest measured "
                                      "shapes' winners, the engine's own entry, then one-knob steps around round 1's "
                                      "fastest", "geomean": _geomean(rr), "p5": _p5(rr),
                            "min": min(rr) if rr else None, "rows": robust} if robust else None,
            "vs_engine": engine_summary,
            "tuned": {"configs_per_shape": TUNE_K, "geomean": _geomean(tr), "p5": _p5(tr),
                      "min": min(tr) if tr else None, "rows": tuned},
            "curves": {"gpu_seconds_per_config": spc,
                       "policy_ranked": {k: _geomean(v) for k, v in sorted(curve_policy.items())},
                       "random_order": {k: _geomean(v) for k, v in sorted(curve_random.items())},
                       "note": "quality = sweep best / best of the first k configs (sweep times); GPU-seconds = k x "
                               "gpu_seconds_per_config (compile + check + time). Random order over the >= "
                               "256-config sweep is exhaustive search cut at k; k = all is the full grid a "
                               "benchmark_moe-style tuner runs."}}


def _read_text(path: Path) -> str:
    """A `time` result or a plan as committed: plain JSON, or gzipped (.gz) where the raw file is megabytes."""
    import gzip

    return gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()


def report(args: argparse.Namespace) -> int:
    """generalisation.json from `time` results. Several runs may be given (--result / --plan / --commit /
    --dataset-hash in the same order): for each kernel and split (test models; leave-one-model-out) the last run that
    timed it counts, and its entry records that run's provenance. Test-split workloads give "zero_shot", "tuned" and
    "curves"; leave-one-model-out ones give "leave_one_model_out_live"."""
    n = len(args.result)
    for name in ("plan", "commit", "dataset_hash"):
        if len(getattr(args, name)) not in (0, n):
            raise SystemExit(f"--{name.replace('_', '-')}: give one per --result ({n}), in the same order")
    for path in [*args.result, *args.plan]:
        if not path.exists():
            raise SystemExit(f"{path}: no such file (--result / --plan)")
    runs = []
    for i, path in enumerate(args.result):
        plan_path = args.plan[i] if args.plan else None
        runs.append({"live": json.loads(_read_text(path)), "result": str(path),
                     "plan": json.loads(_read_text(plan_path)) if plan_path else {},
                     "plan_path": str(plan_path) if plan_path else None,
                     "commit": args.commit[i] if args.commit else "",
                     "dataset_sha256": args.dataset_hash[i] if args.dataset_hash else ""})
    by_key = {(r["kernel"], r.get("split", "test")): run for run in runs for r in run["live"]["results"]}
    out: dict = {"zero_shot": {"kernel": {}}, "tuned": {}, "curves": {}, "leave_one_model_out_live": {}, "meta": {
        "command": "python benchmarks/generalisation/run.py " + " ".join(sys.argv[1:]),
        "ratio": "best_ms / chosen_ms: medians over paired samples; best = fastest of (seed choices, tune picks, the "
                 "sweep's 3 fastest, default) in those samples",
        "runs": {f"{kernel}/{split}": {
            "result": run["result"], "plan": run["plan_path"], "commit": run["commit"],
            "dataset_sha256": run["dataset_sha256"], "device": run["live"].get("device"),
            "torch": run["live"].get("torch"), "triton": run["live"].get("triton"),
            "rounds": run["live"].get("rounds"), "reps": run["live"].get("reps"), "seeds": run["plan"].get("seeds"),
            "timesteps": run["plan"].get("timesteps"),
            "trained": [t for t in run["plan"].get("trained", []) if t.get("kernel") == kernel]}
            for (kernel, split), run in by_key.items()}}}
    from kernel_gym import zoo

    for (kernel, split), run in by_key.items():
        sc = score([r for r in run["live"]["results"] if r["kernel"] == kernel and r.get("split", "test") == split])
        if split in FAR_SPLITS:
            entry_name = "far_test" if split == "far" else f"{split}_test"
            out.setdefault(entry_name, {})[kernel] = {**sc["summary"], "tuned_top8": sc["tuned"],
                                                      "tuned": sc["robust_tune"], "vs_engine": sc["vs_engine"],
                                                      "coverage": {r["shard"]: r.get("coverage") for r in
                                                                   run["live"]["results"] if r.get("coverage")},
                                                      "rows": sc["rows"]}
            continue
        if split == "lomo":
            left_out = sc["summary"].pop("test_models")
            out["leave_one_model_out_live"][kernel] = {**sc["summary"], "models_left_out": left_out,
                                                       "tuned": sc["tuned"], "rows": sc["rows"]}
            continue
        fresh = tuple(m for m in zoo.FRESH_MODELS if m in zoo.TEST_MODELS[kernel])
        out["zero_shot"]["kernel"][kernel] = {**sc["summary"], "fresh_models": _subset(sc["rows"], fresh),
                                              "rows": sc["rows"]}
        out["tuned"][kernel] = sc["tuned"]
        out["curves"][kernel] = sc["curves"]
    for path in args.engine_tune:  # `kernel-gym tune --engine` runs: engine_gpu_run.json, or one run's engine_tune.json
        data = json.loads(path.read_text())
        if "keys" in data:
            gains = [k.get("paired_gain", 1.0) for k in data["keys"].values()]
            m = data["meta"]
            out.setdefault("engine_tune", {})[str(path)] = {f"tune_{m['model']}": {
                "keys_tuned": m["keys_tuned"], "keys": len(data["keys"]), "summary": data["summary"],
                "geomean_paired_gain": _geomean(gains), "min_paired_gain": min(gains, default=float("nan")),
                "gpu_timing_s": m["gpu_timing_s"], "seconds": m["seconds"], "budget_s": m["budget_s"],
                "engine": m["engine"], "command": f"kernel-gym tune --engine {m['engine']} "
                                                  f"--model {m['model']} --budget-s {m['budget_s']:g} --out OUT"}}
            continue
        out.setdefault("engine_tune", {})[str(path)] = {
            part: {**(r.get("result") or {}), "command": " ".join(map(str, r.get("cmd", [])))}
            for part, r in data.get("parts", {}).items() if part.startswith("tune_")}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    if out["curves"]:
        plot_curves(out["curves"], args.out.with_name(args.out.stem + "_curve.png"))
    for split, kernel, z in [(s_, k, z) for s_ in FAR_SPLITS for k, z in out.get(
            "far_test" if s_ == "far" else f"{s_}_test", {}).items()]:
        t, e = z["tuned"] or {}, z["vs_engine"] or {}
        nan = float("nan")
        print(f"{kernel}, {split} test: zero-shot geomean {z['geomean']:.3f} p5 {z['p5']:.3f} min {z['min']:.3f} over "
              f"{z['workloads']} workloads x {len(z['seeds'])} seeds; tune geomean {t.get('geomean', nan):.3f} "
              f"p5 {t.get('p5', nan):.3f}; vs the engine's kernel: best {e.get('best_geomean', nan):.3f}, "
              f"zero-shot {e.get('zero_shot_geomean', nan):.3f}, tune {e.get('tuned_geomean', nan):.3f}")
    for kernel, z in out["leave_one_model_out_live"].items():
        print(f"{kernel}, leave-one-model-out: geomean {z['geomean']:.3f} p5 {z['p5']:.3f} min {z['min']:.3f} over "
              f"{z['workloads']} workloads of {len(z['models_left_out'])} models x {len(z['seeds'])} seeds")
    for kernel, z in out["zero_shot"]["kernel"].items():
        t = out["tuned"][kernel]
        print(f"{kernel}: zero-shot geomean {z['geomean']:.3f} p5 {z['p5']:.3f} min {z['min']:.3f} over "
              f"{z['workloads']} workloads x {len(z['seeds'])} seeds (default {z['default_geomean']:.3f}); "
              f"tuned (top-{TUNE_K}) geomean {t['geomean']:.3f} p5 {t['p5']:.3f}")
        for m, v in z["per_model"].items():
            print(f"    {m:22s} geomean {v['geomean']:.3f} p5 {v['p5']:.3f} min {v['min']:.3f}"
                  f"{'   (fresh)' if m in zoo.FRESH_MODELS else ''}")
    return 0


def plot_curves(curves: dict, path: Path) -> None:
    """Quality (sweep best / best found) against GPU-seconds per shape: the policy's ranking vs random search."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6), squeeze=False)
    for ax, (kernel, c) in zip(axes[0], curves.items()):
        spc = c["gpu_seconds_per_config"]
        for key, label, style in (("policy_ranked", "policy's top-k (tune)", "o-"),
                                  ("random_order", "random valid configs (search)", "s--")):
            ks = sorted(int(k) for k in c[key])
            ax.plot([k * spc for k in ks], [c[key][str(k)] if str(k) in c[key] else c[key][k] for k in ks], style,
                    label=label)
        ax.axhline(0.99, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel("GPU-seconds per shape")
        ax.set_ylabel("quality (sweep best / best found)")
        ax.set_title(f"{kernel}, models never trained on")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("plan", help="CPU: train the zoo policies (3 seeds), write each test workload's configs")
    a.add_argument("--out", type=Path, default=Path("benchmarks/generalisation/plan.json"))
    a.add_argument("--kernels", nargs="+", default=list(KERNEL_ENVS), choices=list(KERNEL_ENVS))
    a.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    a.add_argument("--timesteps", type=int, default=30_000)
    a.add_argument("--sweep", type=int, default=256, help="valid configs sampled uniformly per workload")
    a.add_argument("--sweep-seed", type=int, default=0)
    a.add_argument("--leave-out", nargs="*", default=[], metavar="MODEL",
                   help="leave-one-model-out instead of the test split: per zoo training model, policies trained "
                        "without its rows, choosing at three of its shards")
    a.add_argument("--split", choices=("test", *FAR_SPLITS), default="test",
                   help="far / far2: a far test split (kernel_gym.zoo.FAR_TEST_MODELS / FAR2_TEST_MODELS, MoE) "
                        "instead of the test models")
    a.add_argument("--rerank", action="store_true",
                   help="MoE choices and tune's round 1 as the product makes them with the cost model "
                        "(tune.zero_shot_ranker; one cost model per seed); the policy's own argmax is kept beside "
                        "them as policy_choices")
    a.add_argument("--tracking-uri", default="", help="MLflow store of the training runs (default: mlruns/)")
    a.add_argument("--checkpoints", type=Path, default=Path("out/checkpoints"), help="where the policies are saved")
    b = sub.add_parser("time", help="GPU: sweep and paired timing per workload")
    b.add_argument("--plan", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--rounds", type=int, default=5)
    b.add_argument("--reps", type=int, default=10, help="timed samples per config per paired round")
    b.add_argument("--budget-s", type=float, default=420.0, help="start no new workload after this many seconds")
    b.add_argument("--compile-workers", type=int, default=14)
    c = sub.add_parser("report", help="CPU: benchmarks/generalisation.json from a `time` result")
    c.add_argument("--result", type=Path, nargs="+", required=True,
                   help="`time` results; for each kernel the last one that timed it counts")
    c.add_argument("--plan", type=Path, nargs="*", default=[], help="the plan of each result, same order")
    c.add_argument("--out", type=Path, default=Path("benchmarks/generalisation.json"))
    c.add_argument("--commit", nargs="*", default=[], help="the commit each GPU run used, same order")
    c.add_argument("--engine-tune", type=Path, nargs="*", default=[],
                   help="engine_gpu_run.json files (their `tune --engine` parts) or engine_tune.json files of single "
                        "`tune --engine` runs: the engine_tune entry")
    c.add_argument("--dataset-hash", nargs="*", default=[],
                   help="sha256 of the dataset each run's policies trained on, same order")
    args = p.parse_args(argv)
    if args.cmd == "plan":
        return make_plan(args)
    if args.cmd == "time":
        return time_plan(args)
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
