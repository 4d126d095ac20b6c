"""Ask NVIDIA aiconfigurator for its recommended aggregated deployment of each (model, GPU count, engine, traffic
profile) the serving-plan benchmark uses, and store its answers as JSON (benchmarks/serving_plan/aic_answers.json),
so that tests and benchmarks/serving_plan/run.py never need aiconfigurator installed.

Run in a venv with aiconfigurator (kernel_gym[aic]; it pins numpy 2.4 / pandas 3, so keep it apart):

    /tmp/aic/bin/python benchmarks/serving_plan/run_aic_answers.py --out benchmarks/serving_plan/aic_answers.json

aiconfigurator takes one input and one output length per query: each trace profile passes its mean prompt and
output tokens (the traces' SOURCES statistics, PROFILES below). Model configs are aiconfigurator's own packaged
Hugging Face config.json files (it cannot download here). Each query takes about 40 s on a 2-core CPU; answers
already in --out are kept (the script resumes).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# kernel_gym zoo name -> aiconfigurator's packaged config (model_configs/<name>_config.json)
MODELS = {"mixtral-8x7b": "mistralai--Mixtral-8x7B-v0.1", "qwen3-30b-a3b": "Qwen--Qwen3-30B-A3B",
          "gpt-oss-20b": "openai--gpt-oss-20b", "mixtral-8x22b": "mistralai--Mixtral-8x22B-v0.1"}
# trace -> (mean prompt tokens, mean output tokens) over the whole trace file
PROFILES = {"azure-conv": (1155, 211), "azure-code": (2048, 28), "mooncake": (15325, 149), "burstgpt": (520, 277)}
KEEP = ("tokens/s/gpu", "tokens/s", "seq/s", "seq/s/gpu", "ttft", "tpot", "concurrency", "bs", "global_bs",
        "num_total_gpus", "tp", "pp", "dp", "moe_tp", "moe_ep", "parallel", "backend", "version", "memory")


def ask(model_dir: Path, gpus: int, engine: str, isl: int, osl: int, ttft_ms: float, tpot_ms: float,
        exe: str) -> dict:
    """One `aiconfigurator cli default` query in aggregated mode; its ranked answers and its launch arguments."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [exe, "cli", "default", "--model-path", str(model_dir), "--total-gpus", str(gpus), "--system",
               "h200_sxm", "--backend", engine, "--serving-mode", "agg", "--isl", str(isl), "--osl", str(osl),
               "--ttft", str(ttft_ms), "--tpot", str(tpot_ms), "--save-dir", tmp, "--top-n", "5", "--no-color"]
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        out: dict = {"command": " ".join(cmd[1:]).replace(str(model_dir), model_dir.name), "wall_s": time.time() - t0,
                     "returncode": proc.returncode}
        found = list(Path(tmp).glob("*/agg/best_config_topn.csv"))
        if proc.returncode != 0 or not found:
            out["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no answer"]
            return out
        with open(found[0]) as f:
            rows = list(csv.DictReader(f))
        out["ranked"] = [{k: r.get(k) for k in KEEP} for r in rows]
        run = found[0].parent / "top1" / "run_0.sh"
        if run.is_file():
            args = [ln.strip() for ln in run.read_text().splitlines() if "--tensor-parallel-size" in ln or
                    "--tp-size" in ln or "--max-num-seqs" in ln or "--max-running-requests" in ln]
            workers = [ln.split("=", 1)[1] for ln in run.read_text().splitlines() if ln.startswith("AGG_WORKERS=")]
            out["top1_launch"] = {"worker_args": args, "workers": workers[0] if workers else None}
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/serving_plan/aic_answers.json")
    p.add_argument("--models", default="mixtral-8x7b,qwen3-30b-a3b,gpt-oss-20b")
    p.add_argument("--gpus", default="1,2,4,8")
    p.add_argument("--engines", default="vllm")
    p.add_argument("--traces", default=",".join(PROFILES))
    p.add_argument("--ttft-ms", type=float, default=2000.0)
    p.add_argument("--tpot-ms", type=float, default=100.0)
    args = p.parse_args(argv)
    exe = shutil.which("aiconfigurator") or str(Path(sys.executable).parent / "aiconfigurator")
    try:
        from importlib.metadata import version

        import aiconfigurator_core
    except ImportError:
        print("aic_answers: aiconfigurator is not installed; pip install 'kernel_gym[aic]' in a separate venv",
              file=sys.stderr)
        return 2
    configs = Path(aiconfigurator_core.__file__).parent / "model_configs"
    out_path = Path(args.out)
    data = json.loads(out_path.read_text()) if out_path.is_file() else {
        "source": "aiconfigurator cli default --serving-mode agg --system h200_sxm",
        "aiconfigurator": version("aiconfigurator"), "aiconfigurator_core": version("aiconfigurator-core"),
        "ttft_ms": args.ttft_ms, "tpot_ms": args.tpot_ms, "profiles": PROFILES, "answers": {}}
    work = Path(tempfile.mkdtemp(prefix="aic_models_"))
    for model in args.models.split(","):
        d = work / MODELS[model]
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(configs / f"{MODELS[model]}_config.json", d / "config.json")
        for engine in args.engines.split(","):
            for gpus in [int(g) for g in args.gpus.split(",")]:
                for trace in args.traces.split(","):
                    key = f"{model}|{gpus}|{engine}|{trace}"
                    if key in data["answers"]:
                        continue
                    isl, osl = PROFILES[trace]
                    ans = ask(d, gpus, engine, isl, osl, args.ttft_ms, args.tpot_ms, exe)
                    data["answers"][key] = ans
                    top = (ans.get("ranked") or [{}])[0]
                    print(f"[aic] {key}: {top.get('parallel')} {top.get('tokens/s/gpu')} tok/s/gpu "
                          f"({ans['wall_s']:.0f} s){' ERROR ' + str(ans.get('error')) if 'error' in ans else ''}",
                          file=sys.stderr, flush=True)
                    out_path.parent.mkdir(parents=True, exist_ok=True)
                    out_path.write_text(json.dumps(data, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    os.sync()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
