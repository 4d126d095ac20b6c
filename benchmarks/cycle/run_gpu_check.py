"""GPU: `kernel-gym cycle --gpu` end to end on a routing shift, then an independent paired re-check of every change it
confirmed (the issue's "never a confirmed change that is slower").

Per model (default OLMoE, Mixtral-8x7B and Qwen2-57B-A14B at TP 1): the current folder holds a vLLM file tuned at
uniform routing (vLLM's shipped H200 table where one exists, else the recorded rows' best at each M key) with the
profile of a uniform period stored beside it; the period to cycle on is the bundled Azure conversation excerpt
(first 10 minutes, packaged with kernel_gym) under Zipf-1.2 routing, recorded as vLLM would (two Prometheus scrapes
and an EPLB-style per-expert count file). The cycle runs with --gpu (deploy/cycle_gpu.py: per moved key the current
entry and the top --top-k recorded candidates are checked against the fp32 reference, captured in CUDA graphs,
swept, and the sweep's winner must lead the current entry again in a paired interleaved round). Afterwards each
confirmed key is re-timed against the current entry in a fresh paired round (60 interleaved samples each, new
inputs seed): `recheck_gain` < 1 would be a confirmed change that is slower.

    python3 benchmarks/cycle/run_gpu_check.py --out $OUT/cycle_gpu --budget-s 360

Writes $OUT/cycle_gpu/cycle_gpu.json (per model: decision, exit code, per-key sweep / paired / re-check times, GPU-s)
and the cycle's own report and new folder per model. `--dry-run` runs everything but the GPU timing on the CPU (a
fake confirmer that confirms nothing): the plumbing check. Imports torch, triton, numpy and the standard library.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.cycle import run as bc  # noqa: E402
from kernel_gym.deploy import cycle  # noqa: E402
from kernel_gym.deploy import engine_export as ee  # noqa: E402
from kernel_gym.kernels.space import Config  # noqa: E402
from kernel_gym.kernels.vllm_moe import to_entry  # noqa: E402
from kernel_gym.measure.store import PACKAGED_SNAPSHOT  # noqa: E402
from kernel_gym.models import load_model  # noqa: E402
from kernel_gym.traffic import metrics  # noqa: E402
from kernel_gym.traffic.routing import UniformRouting, ZipfRouting  # noqa: E402
from kernel_gym.traffic.traces import load_trace  # noqa: E402

MODELS = ("olmoe-1b-7b", "mixtral-8x7b", "qwen2-57b-a14b")
DEV = "NVIDIA H200"
RECHECK_REPS = 60


def log(msg: str) -> None:
    print(f"[cycle_gpu {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class DryConfirmer:
    """CPU plumbing check: times nothing, confirms nothing."""

    gpu_s = 0.0

    def tune_key(self, m, skew, current, candidates, min_gain):
        return {"M": m, "skew": skew, "timed": {}, "dropped": {}, "confirmed": False, "dry_run": True,
                "candidates": [str(c) for c in candidates]}


def recheck(confirmer, m: int, skew: float, current: Config, new: Config) -> dict:
    """A fresh paired round (new inputs seed) of a confirmed change against the current entry."""
    from kernel_gym.kernels import vllm_moe as vm
    from kernel_gym.measure.timing import time_interleaved

    confirmer.seed += 1000
    confirmer._weights = None
    inputs = confirmer._inputs(m, skew)
    ref = vm.FAMILY.reference(inputs)
    fa, why_a = confirmer.ready(inputs, ref, current)
    fb, why_b = confirmer.ready(inputs, ref, new)
    if fa is None or fb is None:
        return {"error": why_a or why_b}
    ta, tb = time_interleaved([fa, fb], RECHECK_REPS)
    cur, nw = statistics.median(ta), statistics.median(tb)
    return {"current_ms": cur, "new_ms": nw, "recheck_gain": cur / nw}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=360.0)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--dry-run", action="store_true", help="CPU: everything but the GPU timing")
    args = p.parse_args(argv)
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():  # before the output folder and the rows: nothing left behind
            p.error("no CUDA device here: this check times configs on the GPU; --dry-run runs everything else on the "
                    "CPU")
    t_start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = ee.measured_rows([PACKAGED_SNAPSHOT])
    trace = load_trace("bundled")
    models = [m for m in args.models.split(",") if m]
    results = {"meta": {"command": "python3 benchmarks/cycle/run_gpu_check.py " + " ".join(argv or sys.argv[1:]),
                        "dry_run": args.dry_run, "dataset_sha256_16": bc.sha16(PACKAGED_SNAPSHOT)}, "models": {}}
    if not args.dry_run:
        import torch

        results["meta"].update(device=torch.cuda.get_device_name(0), torch=torch.__version__,
                               triton=__import__("triton").__version__)
    for i, name in enumerate(models):
        left = args.budget_s - (time.time() - t_start)
        if left < 30:
            log(f"budget reached before {name}")
            break
        model = load_model(name)
        shape = ee.shard_shape(model, 1)
        pricer = cycle.Pricer(shape, DEV, rows)
        work = args.out / name
        if work.exists():
            shutil.rmtree(work)
        cur = work / "moe"
        table0, origin = bc.initial_table(shape, pricer)
        ee.write_engine_file(cur, "vllm", shape, DEV, {str(k): to_entry(c) for k, c in sorted(table0.items())},
                             "3.6.0", {"skew": 0.0, "origin": origin})
        before = trace.window(0, 300)
        metrics.profile_from_trace(before, model, "vllm", UniformRouting(model.num_experts, model.top_k),
                                   source="bundled[0:300] uniform").save(cur / metrics.PROFILE_FILE)
        # the stored profile's routing: uniform
        prof = metrics.load_profile(cur / metrics.PROFILE_FILE)
        prof.routing = {"skew": 0.0}
        prof.save(cur / metrics.PROFILE_FILE)
        win = trace.window(300, 600)
        routing = ZipfRouting(model.num_experts, model.top_k, 1, exponent=1.2)
        st = metrics.simulate_steps(model, win, routing)
        bc.vllm_scrapes(work / "scrapes", st["num_tokens"], win.prompt_tokens, win.output_tokens,
                        float(np.mean(st["running"])), win.duration_s)
        bc.expert_counts(work / "experts.json", routing, int(st["num_tokens"].sum()), 4, seed=7)
        if args.dry_run:
            confirmer = DryConfirmer()
        else:
            from kernel_gym.deploy.cycle_gpu import GpuConfirmer

            confirmer = GpuConfirmer(shape, budget_s=left / (len(models) - i), engine="vllm", rows=rows)
        log(f"{name}: cycling on bundled[300:600] under zipf 1.2 ({len(win)} requests), {origin}")
        code, rep = cycle.run_cycle(
            model=name, engine="vllm", current=cur, no_mlflow=True, gpu=True, top_k=args.top_k,
            gpu_budget_s=left / (len(models) - i), traffic=[work / "scrapes", work / "experts.json"],
            report_dir=work / "report", out=work / "moe.next", rows=rows, confirmer=confirmer)
        keys = []
        for k in rep["keys"]:
            if not k["moved"]:
                continue
            entry = {"M": k["key"], "share": k["share"], "zero_shot": k["confirm"].get("candidates"),
                     "current": k["current"], "proposed": k["proposed"], "confirmed": k["confirmed"],
                     "sweep_ms": k["confirm"].get("timed"), "dropped": k["confirm"].get("dropped"),
                     "paired": k["confirm"].get("paired"), "skipped": k["confirm"].get("skipped")}
            if k["confirmed"] and not args.dry_run:
                entry["recheck"] = recheck(confirmer, k["key"], rep["skew"], Config.parse(k["current"]),
                                           Config.parse(k["proposed"]))
            keys.append(entry)
            log(f"  M {k['key']}: confirmed={k['confirmed']} paired={entry['paired']} "
                f"recheck={entry.get('recheck')}")
        results["models"][name] = {"decision": rep["decision"], "exit_code": code, "gpu_s": rep["gpu_s"],
                                   "moved_keys": rep["moved_keys"], "changed_keys": rep["changed_keys"],
                                   "expected_gain_recorded": rep["expected_gain"], "skew": rep["skew"],
                                   "initial_files": origin, "keys": keys}
        (args.out / "cycle_gpu.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    results["meta"]["elapsed_s"] = round(time.time() - t_start, 1)
    (args.out / "cycle_gpu.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print("\n| model | decision | moved | confirmed | GPU-s | paired gains | re-check gains (min) |")
    print("|---|---|---:|---:|---:|---|---|")
    for name, r in results["models"].items():
        pg = [round(k["paired"]["gain"], 3) for k in r["keys"] if k.get("paired")]
        rg = [k["recheck"]["recheck_gain"] for k in r["keys"] if k.get("recheck", {}).get("recheck_gain")]
        print(f"| {name} | exit {r['exit_code']} | {r['moved_keys']} | {sum(bool(k['confirmed']) for k in r['keys'])}"
              f" | {r['gpu_s']:.0f} | {pg} | {min(rg) if rg else '-'} |")
    log(f"wrote {args.out / 'cycle_gpu.json'} in {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
