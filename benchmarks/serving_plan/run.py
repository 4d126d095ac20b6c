"""The serving-plan benchmark: goodput at a TTFT/TPOT SLO of the agent's deployment (kernel-gym plan) against the
engine's defaults, the hand-picked layouts, a coordinate search over the same knobs, and aiconfigurator's
recommendation for the same inputs (its stored answers, benchmarks/serving_plan/aic_answers.json), each replayed on a
held-out window of each trace by the same simulator, at the trace's own load and compressed until the engine's
default deployment saturates (SLO attainment below 90%, doubling the rate from 2x).

    KERNEL_GYM_TRACES=DIR python3 benchmarks/serving_plan/run.py --out benchmarks/serving_plan.json --budget-s 2400

Writes benchmarks/serving_plan.json ({"profiles": [...], "meta": {...}}: the schema of issue 26) after every
profile, and the raw per-deployment replays under benchmarks/serving_plan/raw/. A profile the budget did not reach
is absent (meta.skipped lists it). aiconfigurator's own prediction for its recommendation is beside ours
(`aiconfigurator_self`: its requests / s at its chosen concurrency, times its replicas, capped at the offered rate).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROOT = Path(__file__).resolve().parents[2]
AIC_ANSWERS = ROOT / "benchmarks" / "serving_plan" / "aic_answers.json"


def aic_deployment(answer: dict, spec, engine: str, gpus: int):
    """aiconfigurator's top aggregated answer as a Deployment of this project's space, and a note when it had to be
    approximated (attention data-parallel in front of tensor-parallel experts is priced as plain TP)."""
    from kernel_gym.parallel.deploy import Deployment, engine_knobs

    ranked = answer.get("ranked") or []
    if not ranked:
        return None, f"no answer: {answer.get('error')}"
    top = ranked[0]
    tp, dp, etp, ep = (int(top[k]) for k in ("tp", "dp", "moe_tp", "moe_ep"))
    per = int(top["num_total_gpus"])
    note = ""
    if ep > 1 and tp == 1 and dp == ep:
        lay = (1, ep)
    elif ep == 1 and dp == 1:
        lay = (tp, 1)
    else:
        lay = (etp, ep)
        note = f"aiconfigurator's {top['parallel']} (attention tp{tp} dp{dp}) priced as MoE tp{etp} ep{ep}"
    knobs = engine_knobs(engine, lay[0])
    args = " ".join((answer.get("top1_launch") or {}).get("worker_args", []))
    m = re.search(r"--max-num-seqs \"?(\d+)", args)
    if m:
        knobs["max_seqs"] = int(m.group(1))
    m = re.search(r"--max-num-batched-tokens \"?(\d+)", args)
    if m:
        knobs["max_batched_tokens"] = int(m.group(1))
    dep = Deployment(engine, max(1, gpus // per), lay[0], lay[1], **knobs)
    return dep, note


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for pkg in ("numpy", "gymnasium", "stable-baselines3", "sb3-contrib", "torch"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    out["python"] = sys.version.split()[0]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/serving_plan.json")
    p.add_argument("--raw", default="benchmarks/serving_plan/raw")
    p.add_argument("--models", default="mixtral-8x7b,qwen3-30b-a3b,gpt-oss-20b")
    p.add_argument("--gpus", default="8,1,2,4")
    p.add_argument("--traces", default="azure-conv,azure-code,mooncake,burstgpt")
    p.add_argument("--loads", default="saturated,own")
    p.add_argument("--engine", default="vllm", help="vllm, sglang, or a release: vllm-0.33.0 (default vLLM 0.34.0)")
    p.add_argument("--slo", default="ttft=2,tpot=0.1")
    p.add_argument("--window-s", type=float, default=30.0, help="window of the saturation probe (simulated s)")
    p.add_argument("--requests", type=int, default=300, help="requests per replayed window (sets its length)")
    p.add_argument("--train-steps", type=int, default=16)
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--routing", default="zipf:1.2")
    p.add_argument("--budget-s", type=float, default=2400.0)
    p.add_argument("--resume", action="store_true", help="keep the profiles already in --out")
    p.add_argument("--markdown", default="", help="also write the table and target counts here")
    p.add_argument("--tpe-trials", type=int, default=0, help="also an Optuna TPE search with this many replays")
    p.add_argument("--commit", default="", help="the commit the tree is (default: git rev-parse HEAD)")
    p.add_argument("--jobs", type=int, default=1, help="profiles replayed in parallel (forked processes)")
    args = p.parse_args(argv)

    from kernel_gym.deploy.plan import (
        parse_slo,
    )
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.models import load_model
    from kernel_gym.traffic.traces import load_trace

    t_start = time.time()
    slo = parse_slo(args.slo)
    aic = json.loads(AIC_ANSWERS.read_text()) if AIC_ANSWERS.is_file() else {"answers": {}}
    out_path, raw = Path(args.out), Path(args.raw)
    raw.mkdir(parents=True, exist_ok=True)
    try:
        commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                               cwd=ROOT).stdout.strip()
    except OSError:  # no git where it runs (a copied tree): --commit names it
        commit = args.commit
    import sb3_contrib  # noqa: F401

    import kernel_gym.deploy.plan  # noqa: F401  (imported before any fork)
    from kernel_gym.measure.coverage import cover

    backend = RecordedBackend()
    _CTX["backend"] = cover(backend)
    doc = json.loads(out_path.read_text()) if args.resume and out_path.is_file() else {"profiles": []}
    done = {(q["trace"], q["load_kind"], q["model"], q["gpus"], q["engine"]) for q in doc["profiles"]}
    doc["meta"] = {"commit": commit, "dataset_hash": backend.dataset_hash, "versions": versions(),
                   "aiconfigurator": {k: aic.get(k) for k in ("aiconfigurator", "aiconfigurator_core", "source")},
                   "slo": {"ttft_s": slo[0], "tpot_s": slo[1]}, "routing": args.routing,
                   "window_s": args.window_s, "train_steps": args.train_steps, "engine_versions": None,
                   "budget_s": args.budget_s, "skipped": [], "goodput_unit": "requests per second meeting both SLOs "
                   "on the held-out window (simulator replay)"}
    from kernel_gym.parallel.deploy import split_engine

    name, version = split_engine(args.engine)  # the release whose defaults every deployment here is priced with
    doc["meta"]["engine_versions"] = {name: version}
    traces = {t: load_trace(t) for t in args.traces.split(",")}
    engine = f"{name}-{version}"
    models = args.models.split(",")
    gpu_list = [int(g) for g in args.gpus.split(",")]
    loads = args.loads.split(",")
    keys = priority(models, gpu_list, list(traces), loads)
    specs = {m: load_model(m) for m in models}
    todo = [k for k in keys if (*k, engine) not in done]
    ctx = {"args": args, "slo": slo, "traces": traces, "specs": specs, "engine": engine, "raw": raw,
           "t_start": t_start}
    if args.jobs > 1:
        import multiprocessing as mp

        _CTX.update(ctx)
        with mp.get_context("fork").Pool(args.jobs) as pool:
            results = pool.imap_unordered(_run_key, todo)
            for key, prof, skip in results:
                _collect(doc, out_path, key, prof, skip)
    else:
        _CTX.update(ctx)
        for key in todo:
            _collect(doc, out_path, *_run_key(key))
    doc["meta"]["wall_s"] = time.time() - t_start
    doc["meta"]["data_sha256"] = hashlib.sha256(json.dumps(doc["profiles"], default=str).encode()).hexdigest()[:16]
    out_path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(doc))
    summary(doc)
    return 0


_CTX: dict = {}
_PRICERS: dict = {}


def _pricer(spec, routing):
    """One DeploymentPricer per model and process: the dataset loads once, layout prices are memoised."""
    from kernel_gym.parallel.deploy import DeploymentPricer

    p = _PRICERS.get(spec.name)
    if p is None:
        p = _PRICERS[spec.name] = DeploymentPricer(spec, _CTX["backend"], None, routing)
    return p


def _run_key(key: tuple) -> tuple:
    """One profile (in a worker process with --jobs): (key, profile or None, skip reason or None)."""
    from kernel_gym.deploy.plan import baselines, heldout_replay, make_env, recommend, window_starts
    from kernel_gym.evaluate.replay import routing_profile
    from kernel_gym.parallel.deploy import coordinate_search

    c = _CTX
    args, engine = c["args"], c["engine"]
    tname, load_kind, model, gpus = key
    full = (*key, engine)
    if time.time() - c["t_start"] > args.budget_s:
        return full, None, "budget"
    aic = json.loads(AIC_ANSWERS.read_text()) if AIC_ANSWERS.is_file() else {"answers": {}}
    spec = c["specs"][model]
    routing = routing_profile(args.routing, spec, 0)
    t0 = time.time()
    try:
        prof = run_profile(spec, gpus, engine, c["traces"][tname], tname, load_kind, c["slo"], args, routing, aic,
                           make_env, window_starts, baselines, recommend, heldout_replay, coordinate_search,
                           c["raw"])
    except (ValueError, LookupError, RuntimeError) as exc:  # one profile's failure is recorded, not fatal
        return full, None, f"{type(exc).__name__}: {exc}"
    prof["wall_s"] = time.time() - t0
    return full, prof, None


def _collect(doc: dict, out_path: Path, key: tuple, prof: dict | None, skip: str | None) -> None:
    if prof is None:
        print(f"[bench] {key}: skipped ({skip})", file=sys.stderr, flush=True)
        doc["meta"]["skipped"].append("|".join(map(str, key)) + f": {skip}")
        return
    doc["profiles"].append(prof)
    out_path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    g = prof["goodput"]
    print(f"[bench] {key[0]} {key[1]} x{prof['load']:g} {key[2]} g{key[3]}: plan {g['plan']:.2f} "
          f"default {g['engine_default']:.2f} search {g['search']:.2f} aic {g.get('aiconfigurator')} "
          f"req/s ({prof['wall_s']:.0f} s)", file=sys.stderr, flush=True)


def priority(models: list, gpus: list, traces: list, loads: list) -> list:
    """Profiles in the order the budget should reach them: breadth first (every model and GPU count on the first
    trace at the first load), then the other traces at the first load on the largest GPU count, then the rest."""
    out: list = []
    first_t, first_l = traces[0], loads[0]
    out += [(first_t, first_l, m, g) for m in models for g in gpus]
    out += [(t, first_l, m, max(gpus)) for m in models for t in traces[1:]]
    out += [(t, first_l, m, min(gpus)) for m in models for t in traces[1:]]
    out += [(t, ld, m, g) for ld in loads for t in traces for m in models for g in gpus]
    return list(dict.fromkeys(out))


def window_for(trace, tname: str, load: float, requests: int) -> float:
    """About `requests` requests per window (the simulator's cost grows with them), at least 10 simulated seconds,
    at most what fits in the held-out 20% of the trace with its warm-up and context (15% of the trace's span at this
    load); BurstGPT's 400 sparse rows: that largest window."""
    top = 0.15 * trace.duration_s / load
    if "burst" in tname.lower():
        return top
    rate = len(trace.arrival_s) / max(trace.duration_s, 1e-9) * load
    return min(max(10.0, requests / rate), top)


def saturating_factor(spec, gpus, engine, trace, slo, args, routing, baselines, make_env, window_starts) -> float:
    """The rate factor (2, 4, 8, ... 64) at which the engine default's SLO attainment first drops below 0.9."""
    dep = baselines(spec, engine, gpus)["engine_default"]
    f = 2.0
    while f < 64:
        env = make_env(spec, gpus, engine, trace, slo, f, window_for(trace, trace.name, f, args.requests), "heldout",
                       routing, pricer=_pricer(spec, routing))
        env.reset(options={"start_s": window_starts(env, 1)[0]})
        if env.serve_deployment(dep)["slo_attainment"] < 0.9:
            return f
        f *= 2
    return f


def run_profile(spec, gpus, engine, trace, tname, load_kind, slo, args, routing, aic, make_env, window_starts,
                baselines, recommend, heldout_replay, coordinate_search, raw) -> dict:
    load = 1.0 if load_kind == "own" else saturating_factor(spec, gpus, engine, trace, slo, args, routing,
                                                            baselines, make_env, window_starts)
    window = window_for(trace, tname, load, args.requests)
    pricer = _pricer(spec, routing)
    ev0 = pricer.evaluations
    rec = recommend(spec, gpus, engine, trace, slo, load, window, args.train_steps, args.samples, 1, 0, routing,
                    pricer=pricer)
    env = rec["env"]
    starts = rec["train_windows"]
    floor = baselines(spec, engine, gpus)
    from kernel_gym.deploy.plan import score

    d0 = floor["engine_default"]
    best, _, hist = coordinate_search(lambda d: score(env, d, starts), spec, engine, gpus,
                                      d0 if d0.block_size in (16, 32, 64, 128) else None, 1, env.pricer.max_model_len)
    hist = [(d.name, None if v is None else v._asdict()) for d, v in hist]  # plan.Score: goodput, then headroom
    deps = {"plan": rec["ranked"][0]["deployment"], **floor, "search": best}
    tpe_note = ""
    if args.tpe_trials > 0:
        try:
            from kernel_gym.deploy.plan import tpe_search

            deps["search_tpe"], _, _ = tpe_search(env, starts, args.tpe_trials)
        except ImportError as exc:
            tpe_note = f"optuna unavailable: {exc}"
    if rec["agent_best"] is not None:
        deps["agent_only"] = rec["agent_best"]
    answer = aic["answers"].get(f"{spec.name}|{gpus}|{engine.split('-')[0]}|{tname}")  # asked per engine, not release
    aic_note = "no stored aiconfigurator answer for this input"
    if answer:
        a_dep, aic_note = aic_deployment(answer, spec, engine, gpus)
        if a_dep is not None:
            from kernel_gym.parallel.deploy import why_invalid_deployment

            why = why_invalid_deployment(spec, a_dep, env.pricer.max_model_len)
            if why:
                aic_note = f"aiconfigurator's answer {a_dep.name} does not fit this simulator's memory model: {why}"
            else:
                deps["aiconfigurator"] = a_dep
    names = list(deps)
    held, henv = heldout_replay(spec, gpus, engine, trace, slo, load, window, [deps[n] for n in names], routing,
                                pricer=pricer)
    res = dict(zip(names, held))
    offered = held[0]["offered_req_per_s"]
    goodput = {n: res[n]["goodput_req_per_s"] for n in names}
    goodput.setdefault("aiconfigurator", None)
    if answer and answer.get("ranked"):
        top = answer["ranked"][0]
        per = int(top["num_total_gpus"])
        self_pred = float(top["seq/s"]) * max(1, gpus // per)
        goodput["aiconfigurator_self"] = min(self_pred, offered)
        goodput["aiconfigurator_self_capacity"] = self_pred
    plan = res["plan"]
    prof = {"trace": tname, "window": {"start_s": held[0]["start_s"], "window_s": window,
                                       "train_starts_s": starts},
            "load": load, "load_kind": load_kind, "offered_req_per_s": offered, "model": spec.name, "gpus": gpus,
            "engine": engine, "slo": {"ttft_s": slo[0], "tpot_s": slo[1]}, "goodput": goodput,
            "ratios": {"plan_vs_engine_default": _ratio(goodput["plan"], goodput["engine_default"]),
                       "plan_vs_aiconfigurator": _ratio(goodput["plan"], goodput.get("aiconfigurator")),
                       "plan_vs_aiconfigurator_self": _ratio(goodput["plan"], goodput.get("aiconfigurator_self")),
                       "plan_vs_search": _ratio(goodput["plan"], goodput["search"]),
                       "plan_vs_search_tpe": _ratio(goodput["plan"], goodput.get("search_tpe"))},
            "chosen": {n: d.to_dict() for n, d in deps.items()},
            "estimated_share": plan["estimated_share"], "prior_share": plan["prior_share"],
            "shares": {n: {"estimated": res[n]["estimated_share"], "prior": res[n]["prior_share"]} for n in names},
            "slo_attainment": {n: res[n]["slo_attainment"] for n in names},
            "aiconfigurator_note": aic_note, "search_tpe_note": tpe_note, "agent_proposals": rec["agent_proposals"],
            "evaluations": pricer.evaluations - ev0, "search_evaluations": len(hist)}
    rawf = raw / f"{tname}_{load_kind}_{spec.name}_g{gpus}_{engine}.json"
    rawf.write_text(json.dumps({"profile": prof, "heldout": res, "search_history": hist,
                                "agent_ranked": [{"deployment": r["deployment"].to_dict(),
                                                  "train_goodput_req_per_s": r["train_goodput_req_per_s"],
                                                  "from_agent": r["from_agent"]} for r in rec["ranked"]]},
                               indent=1, default=str) + "\n")
    return prof


def _window(env, start):
    env.reset(options={"start_s": start})
    return env.window()


def _ratio(a, b):
    return None if a is None or not b else a / b


def markdown(doc: dict) -> str:
    """The per-profile table and the target counts, for docs and benchmarks/serving_plan.md."""
    import math

    rows = sorted(doc["profiles"], key=lambda q: (q["load_kind"], q["trace"], q["model"], q["gpus"]))
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    out = ["| trace | load | model | GPUs | plan | engine default | aiconfigurator (our sim) | aic (own prediction) | "
           "search | plan chosen | est. share | prior share |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for q in rows:
        g, c = q["goodput"], q["chosen"]["plan"]
        out.append(f"| {q['trace']} | {q['load_kind']} x{q['load']:g} | {q['model']} | {q['gpus']} | {g['plan']:.2f} | "
                   f"{g['engine_default']:.2f} | {f(g.get('aiconfigurator'))} | {f(g.get('aiconfigurator_self'))} | "
                   f"{g['search']:.2f} | {c['layout']} bs{c['block_size']} mbt{c['max_batched_tokens']} "
                   f"seqs{c['max_seqs']} g{c['graph_max']} | {q['estimated_share']:.0%} | {q['prior_share']:.0%} |")
    out.append("")
    for kind in sorted({q["load_kind"] for q in rows}):
        sub = [q for q in rows if q["load_kind"] == kind]
        for key, target in (("plan_vs_engine_default", 1.3), ("plan_vs_aiconfigurator", 1.05),
                            ("plan_vs_aiconfigurator_self", 1.05), ("plan_vs_search", 1.0)):
            vals = [q["ratios"][key] for q in sub if q["ratios"].get(key)]
            met = sum(v >= target for v in vals)
            gm = math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")
            out.append(f"- {kind} load, {key}: geomean {gm:.3f} over {len(vals)} profiles with a nonzero "
                       f"baseline; >= {target} in {met}")
    return "\n".join(out) + "\n"


def summary(doc: dict) -> None:
    import math

    rows = doc["profiles"]
    print(f"\n{len(rows)} profiles; plan / engine default, plan / aiconfigurator (same simulator), plan / search")
    print(f"{'trace':<11} {'load':<9} {'model':<14} {'G':>2} {'plan':>7} {'default':>7} {'aic':>7} {'search':>7} "
          f"{'/def':>5} {'/aic':>5} {'est':>4} {'prior':>5}")
    for q in rows:
        g, r = q["goodput"], q["ratios"]
        f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        print(f"{q['trace']:<11} {q['load_kind'][:4]}x{q['load']:<4g} {q['model']:<14} {q['gpus']:>2} "
              f"{g['plan']:>7.2f} {g['engine_default']:>7.2f} {f(g.get('aiconfigurator')):>7} {g['search']:>7.2f} "
              f"{f(r['plan_vs_engine_default']):>5} {f(r['plan_vs_aiconfigurator']):>5} "
              f"{q['estimated_share']:>4.0%} {q['prior_share']:>5.0%}")
    for k in ("plan_vs_engine_default", "plan_vs_aiconfigurator"):
        vals = [q["ratios"][k] for q in rows if q["ratios"][k]]
        if vals:
            print(f"geomean {k}: {math.exp(sum(math.log(v) for v in vals) / len(vals)):.3f} over {len(vals)}")


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except (ValueError, FileNotFoundError) as exc:  # a trace not downloaded, a bad flag: the message, no traceback
        raise SystemExit(f"serving_plan/run.py: error: {exc}") from None
