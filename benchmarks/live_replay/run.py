"""GPU: execute a replay's per-step kernels with their chosen configs and compare measured with predicted times.

Input: the per-step export of a CPU-side replay (`kernel-gym replay ... --steps-json steps.json`: for default,
learned and oracle, each step's kernel, workload key, config and predicted seconds per layer call) and the dispatch
table the learned policy came from (`kernel-gym export --format dispatch`). For every distinct (workload, config) the
real Triton kernel is timed (do_bench median, L2 flushed); the output JSON holds measured vs predicted per step and
totals per policy and kernel. Imports only torch, triton, numpy, the standard library and kernel_gym's kernels.

    python benchmarks/live_replay/run.py --steps steps.json --table deploy/dispatch_table.json --out live_check.json
    python benchmarks/live_replay/run.py --summarize live_check.json    # (no GPU) the prediction-error table
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import numpy as np
import torch
import triton

from kernel_gym.kernels import get_family
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import workload_from_key


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=Path, help="per-step JSON (or .json.gz) of `kernel-gym replay --steps-json`")
    ap.add_argument("--table", type=Path, help="dispatch_table.json the learned policy used")
    ap.add_argument("--out", type=Path, help="output JSON: measured vs predicted per step")
    ap.add_argument("--summarize", type=Path,
                    help="print the prediction-error table of an output JSON (.gz ok); needs no GPU")
    ap.add_argument("--max-steps", type=int, default=300, help="steps per policy to execute")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop timing new pairs after this many seconds")
    args = ap.parse_args()
    if args.summarize:
        raw = args.summarize.read_bytes()
        print(summary_markdown(json.loads(gzip.decompress(raw) if args.summarize.suffix == ".gz" else raw)))
        return 0
    if not (args.steps and args.table and args.out):
        ap.error("--steps, --table and --out are needed to run the check (or --summarize OUTPUT to read one)")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/live_replay/run.py needs a CUDA GPU")
    raw = args.steps.read_bytes()
    data = json.loads(gzip.decompress(raw) if args.steps.suffix == ".gz" else raw)
    table = json.loads(args.table.read_text())
    table_cfgs = {k: {json.dumps(c, sort_keys=True) for c in t["configs"]} for k, t in table["kernels"].items()}
    inputs: dict[tuple[str, str], object] = {}
    timed: dict[tuple[str, str, str], float | None] = {}
    t_start = time.time()

    def measure(kernel: str, wkey: str, cfg: dict) -> float | None:
        key = (kernel, wkey, json.dumps(cfg, sort_keys=True))
        if key in timed:
            return timed[key]
        if time.time() - t_start > args.budget_s:
            return None
        fam = get_family(kernel)
        wl = workload_from_key(kernel, wkey)
        if (kernel, wkey) not in inputs:
            if len(inputs) > 64:
                inputs.clear()
                torch.cuda.empty_cache()
            inputs[(kernel, wkey)] = fam.make_inputs(wl, "cuda")
        try:
            fn = fam.prepare(inputs[(kernel, wkey)], Config(cfg))
            fn()
            torch.cuda.synchronize()
            timed[key] = float(triton.testing.do_bench(fn, warmup=5, rep=20)) * 1e-3
        except Exception as exc:  # noqa: BLE001 - a failing config is reported, not fatal
            print(f"{kernel} {wkey} {cfg}: {type(exc).__name__}: {exc}")
            timed[key] = None
        return timed[key]

    out: dict[str, object] = {"trace": data["trace"], "model": data["model"], "device": torch.cuda.get_device_name(),
                              "torch": torch.__version__, "triton": triton.__version__, "policies": {}}
    for name, steps in data["policies"].items():
        rows, not_in_table = [], 0
        for s in steps[: args.max_steps * 3]:
            if name == "learned" and json.dumps(s["config"], sort_keys=True) not in table_cfgs.get(s["kernel"], set()):
                not_in_table += 1
            m = measure(s["kernel"], s["workload"], s["config"])
            rows.append({**s, "measured_s": m})
        per_kernel = {}
        for k in sorted({r["kernel"] for r in rows}):
            pairs = [(r["predicted_s"], r["measured_s"]) for r in rows if r["kernel"] == k and r["measured_s"]]
            if pairs:
                p, mm = np.array(pairs).T
                per_kernel[k] = {"predicted_s": float(p.sum()), "measured_s": float(mm.sum()),
                                 "median_ratio": float(np.median(mm / p)), "n": len(pairs)}
        out["policies"][name] = {"per_kernel": per_kernel, "steps": rows, "not_in_table": not_in_table}
        print(name, json.dumps(per_kernel))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


def summary_markdown(out: dict) -> str:
    """Per policy and kernel: the simulator's predicted kernel seconds vs the live-measured seconds over the same steps
    (steps the time budget left unmeasured are excluded from both), and the relative error."""
    lines = [f"Live check: {out['trace']} on {out['model']}, {out['device']} (torch {out['torch']}, triton "
             f"{out['triton']})", "",
             "| policy | kernel | steps | predicted s | measured s | error | median step ratio |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, pol in out["policies"].items():
        tot_p = tot_m = 0.0
        for kernel, k in pol["per_kernel"].items():
            tot_p, tot_m = tot_p + k["predicted_s"], tot_m + k["measured_s"]
            lines.append(f"| {name} | {kernel} | {k['n']} | {k['predicted_s']:.4f} | {k['measured_s']:.4f} | "
                         f"{k['measured_s'] / k['predicted_s'] - 1:+.1%} | {k['median_ratio']:.3f} |")
        lines.append(f"| {name} | all | | {tot_p:.4f} | {tot_m:.4f} | {tot_m / tot_p - 1:+.1%} | |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
