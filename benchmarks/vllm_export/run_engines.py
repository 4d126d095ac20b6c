"""One GPU command for the engine claims (issues 23/24): re-measure "never slower than what the engine runs without
the file" against vLLM 0.33.0's own entries (its new default rule and small-batch path) and SGLang 0.5.23's, then
`kernel-gym tune --engine` on two shapes, within one --budget-s.

Parts (each a subprocess, so one failing part cannot take the others with it; budgets are shares of --budget-s):
1. benchmarks/vllm_export/run.py --engine vllm-0.33.0 on OLMoE (no shipped table: 0.33's default rule; M = 1, 2 on the
   small-batch path) and Mixtral-8x7B TP1 (shipped table; M = 1 on the small-batch path), both routings, 18 keys;
2. benchmarks/vllm_export/run.py --engine sglang-0.5.23 on OLMoE (SGLang's default rule = the pre-0.33 vLLM rule of
   run 6);
3. tune --engine vllm on Qwen1.5-MoE-A2.7B (E=60, top_k=4, N=1408: no table in either engine) and on Mixtral-8x7B
   TP2 (vLLM's shipped table), uniform routing.
Each part writes under --out/<part>/ (bench_vllm_export.json / engine_tune.json, the SQLite rows, the engine files,
the log); --out/engine_gpu_run.json sums them up. nvidia-smi's clock/power/temperature/throttle state is recorded
around every cell by the parts.

    python3 benchmarks/vllm_export/run_engines.py --out $OUT/engine_run1 --budget-s 190  # GPU, about 240 s in all
    python3 benchmarks/vllm_export/run_engines.py --out /tmp/x --budget-s 60 --dry-run     # CPU: the commands only

Imports only the standard library (the parts import torch, triton, numpy and kernel_gym).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARES = {"bench_vllm033": 0.42, "bench_sglang0523": 0.18, "tune_qwen15": 0.20, "tune_mixtral_tp2": 0.20}


def parts(out: Path, budget: float) -> list[tuple[str, list[str]]]:
    py = sys.executable
    b = {k: max(20, int(budget * v)) for k, v in SHARES.items()}
    bench = [py, str(ROOT / "benchmarks" / "vllm_export" / "run.py"), "--per-m", "24", "--pool", "24"]
    tune = [py, "-m", "kernel_gym.cli", "tune", "--engine", "vllm-0.33.0"]
    return [
        ("bench_vllm033", [*bench, "--engine", "vllm-0.33.0", "--models", "olmoe-1b-7b-tp1,mixtral-8x7b-tp1",
                           "--budget-s", str(b["bench_vllm033"]), "--out", str(out / "bench_vllm033")]),
        ("bench_sglang0523", [*bench, "--engine", "sglang-0.5.23", "--models", "olmoe-1b-7b-tp1",
                              "--budget-s", str(b["bench_sglang0523"]), "--out", str(out / "bench_sglang0523")]),
        ("tune_qwen15", [*tune, "--model", "qwen1.5-moe-a2.7b", "--budget-s", str(b["tune_qwen15"]),
                         "--out", str(out / "tune_qwen15")]),
        ("tune_mixtral_tp2", [*tune, "--model", "mixtral-8x7b", "--tp", "2", "--budget-s", str(b["tune_mixtral_tp2"]),
                              "--out", str(out / "tune_mixtral_tp2")]),
    ]


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summarise(name: str, folder: Path) -> dict:
    """The part's headline numbers from its own JSON (nothing invented: missing files give an error entry)."""
    if name.startswith("bench"):
        f = folder / "bench_vllm_export.json"
        if not f.exists():
            return {"error": "no bench_vllm_export.json (see its log)"}
        d = json.loads(f.read_text())
        return {m: {"geomean_uniform": r["geomean_uniform"], "geomean_skew": r["geomean_skew"], "min": r["min"],
                    "rows": len(r["rows"]), "engine": d.get("meta", {}).get("engine")}
                for m, r in d.get("models", {}).items()}
    f = folder / "engine_tune.json"
    if not f.exists():
        return {"error": "no engine_tune.json (see its log)"}
    d = json.loads(f.read_text())
    gains = [k.get("paired_gain", 1.0) for k in d["keys"].values()]
    return {"keys_tuned": d["meta"]["keys_tuned"], "summary": d["summary"], "geomean_paired_gain": _geo(gains),
            "min_paired_gain": min(gains, default=float("nan")), "gpu_timing_s": d["meta"]["gpu_timing_s"],
            "seconds": d["meta"]["seconds"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=190.0, help="the parts' budgets (startup adds ~40 s)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    plan = parts(args.out, args.budget_s)
    if args.dry_run:
        for name, cmd in plan:
            print(f"{name}: {' '.join(cmd)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    result: dict = {"budget_s": args.budget_s, "parts": {}}
    for name, cmd in plan:
        (args.out / name).mkdir(parents=True, exist_ok=True)
        left = args.budget_s + 60 - (time.time() - start)
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.time()
        with open(args.out / name / "run.log", "w") as logf:
            try:
                rc = subprocess.run(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT,
                                    timeout=max(30, left)).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        tail = (args.out / name / "run.log").read_text().splitlines()[-6:]
        print("\n".join("    " + t for t in tail), flush=True)
        result["parts"][name] = {"rc": rc, "seconds": round(time.time() - t0, 1), "cmd": cmd[1:],
                                 "result": summarise(name, args.out / name)}
        (args.out / "engine_gpu_run.json").write_text(json.dumps(result, indent=1))
    result["seconds"] = round(time.time() - start, 1)
    (args.out / "engine_gpu_run.json").write_text(json.dumps(result, indent=1))
    print("\npart               rc  seconds  result")
    for name, r in result["parts"].items():
        print(f"{name:18s}{r['rc']:>3d}{r['seconds']:>9.0f}  {json.dumps(r['result'])[:160]}")
    print(f"wrote {args.out / 'engine_gpu_run.json'} in {result['seconds']:.0f} s")
    return 0 if all(r["rc"] == 0 for r in result["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
