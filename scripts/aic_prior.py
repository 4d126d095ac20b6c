"""Convert NVIDIA aiconfigurator's packaged H200 collective tables into kernel_gym's collectives table, as a LABELLED
PRIOR (kernel_gym/data/collectives/h200_aic_prior.json), until benchmarks/multigpu/run_collectives.py measures our own.

Why a prior: no multi-GPU machine has been lent to this project, so without it every multi-GPU step time refuses.
aiconfigurator (Apache-2.0) ships NCCL all-reduce / all-gather / all-to-all / reduce-scatter latencies on 2, 4 and 8
H200 SXM GPUs for 2^8 .. 2^28 fp16 elements, and vLLM's custom all-reduce (CUDA-graph and eager) over the same range.
What is not known about those rows is written into the table (`prior.unknown`): whether NVLink SHARP (NVLS) was on,
the spread over repeats (one latency per size, duplicates only), the timing method, the all-to-all size convention.

Run it in a venv that has aiconfigurator (it pins numpy 2.4 / pandas 3, so keep it apart from the project's venv):

    python3 -m venv /tmp/aic && /tmp/aic/bin/pip install "kernel_gym[aic]"   # or aiconfigurator==0.12.0
    /tmp/aic/bin/python scripts/aic_prior.py --out kernel_gym/data/collectives/h200_aic_prior.json

Rows written (per-rank buffer bytes = elements x 2, seconds = aiconfigurator's milliseconds / 1e3, median over
duplicate rows):
- `all_reduce`: what vLLM and SGLang run inside CUDA graphs: the custom all-reduce (graph) for messages up to
  `CUSTOM_AR_MAX_BYTES` (the engines' custom all-reduce limit), NCCL above it.
- `all_reduce_eager`: the same outside CUDA graphs (custom all-reduce, eager mode), NCCL above the limit.
- `all_reduce_nccl`, `all_to_all` (NCCL alltoall), `all_gather`, `reduce_scatter`: NCCL as measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import sys
from pathlib import Path

NCCL_VERSION = "2.26.2"  # the version aiconfigurator's h200_sxm system file prices with (misc.nccl_version)
VLLM_TABLE_VERSION = "0.24.0"  # the newest vLLM custom all-reduce table aiconfigurator ships for h200_sxm
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024  # vLLM's custom all-reduce max_size (8 MiB); larger messages go to NCCL
ELEMENT_BYTES = 2  # fp16 / bf16 rows
NCCL_OPS = {"all_reduce": "all_reduce_nccl", "alltoall": "all_to_all", "all_gather": "all_gather",
            "reduce_scatter": "reduce_scatter"}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def convert(data_root: Path, aic_version: str) -> dict:
    import pandas as pd

    nccl_file = data_root / "comm" / "nccl" / NCCL_VERSION / "nccl_perf.parquet"
    car_file = data_root / "comm" / "vllm" / VLLM_TABLE_VERSION / "custom_allreduce_perf.parquet"
    for f in (nccl_file, car_file):
        if not f.is_file():
            raise SystemExit(f"aic_prior: {f} is missing; install aiconfigurator-core=={aic_version} (pip install "
                             "'kernel_gym[aic]') or pass --data-root")
    nccl = pd.read_parquet(nccl_file)
    nccl = nccl[nccl.nccl_dtype == "half"]
    car = pd.read_parquet(car_file)
    car = car[car.allreduce_dtype == "bfloat16"]
    curves: dict[tuple[str, int], dict[int, float]] = {}
    for (op, gpus, size), g in nccl.groupby(["op_name", "num_gpus", "message_size"]):
        curves.setdefault((NCCL_OPS[op], int(gpus)), {})[int(size) * ELEMENT_BYTES] = float(g.latency.median()) / 1e3
    custom: dict[tuple[str, int], dict[int, float]] = {}
    for (backend, gpus, size), g in car.groupby(["backend", "num_gpus", "message_size"]):
        mode = {"vllm_graph": "graph", "vllm_eager": "eager"}[backend]
        custom.setdefault((mode, int(gpus)), {})[int(size) * ELEMENT_BYTES] = float(g.latency.median()) / 1e3
    for mode, op in (("graph", "all_reduce"), ("eager", "all_reduce_eager")):
        for gpus in sorted({g for _, g in custom}):
            nc = curves[("all_reduce_nccl", gpus)]
            cu = custom[(mode, gpus)]
            pts = {b: t for b, t in cu.items() if b <= CUSTOM_AR_MAX_BYTES}
            pts.update({b: t for b, t in nc.items() if b > CUSTOM_AR_MAX_BYTES})
            curves[(op, gpus)] = pts
    results = []
    for (op, gpus), pts in sorted(curves.items()):
        src = "nccl" if op not in ("all_reduce", "all_reduce_eager") else "vllm custom all-reduce <= 8 MiB, nccl above"
        for b, t in sorted(pts.items()):
            results.append({"op": op, "gpus": gpus, "bytes": b, "median_s": t, "p10_s": None, "p90_s": None,
                            "repeats": None, "correct": None, "source": src})
    return {
        "format": "kernel_gym-collectives", "version": 1,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": "NVIDIA H200", "gpu_counts": sorted({g for _, g in curves}), "torch": None, "nccl": NCCL_VERSION,
        "backend": "nccl", "complete": True,
        "prior": {
            "source": "NVIDIA aiconfigurator (Apache-2.0), packaged H200 SXM collective tables",
            "package": "aiconfigurator-core", "package_version": aic_version,
            "files": {
                "nccl": {"path": f"aiconfigurator_core/systems/data/h200_sxm/comm/nccl/{NCCL_VERSION}/"
                                 "nccl_perf.parquet", "sha256": _sha256(nccl_file), "nccl": NCCL_VERSION},
                "custom_all_reduce": {"path": "aiconfigurator_core/systems/data/h200_sxm/comm/vllm/"
                                              f"{VLLM_TABLE_VERSION}/custom_allreduce_perf.parquet",
                                      "sha256": _sha256(car_file), "vllm": VLLM_TABLE_VERSION},
            },
            "conversion": "bytes = message_size (elements) x 2 (fp16 / bf16 rows); seconds = latency (ms) / 1e3; "
                          "median over duplicate rows; all_reduce = custom all-reduce (CUDA graph) up to 8 MiB, "
                          "NCCL above; all_reduce_eager = custom all-reduce (eager) up to 8 MiB, NCCL above",
            "unknown": [
                "whether NVLink SHARP (NVLS multicast) was enabled when the NCCL rows were collected "
                "(kernel_gym's deployments and its own measurement run with NCCL_NVLS_ENABLE=0)",
                "the spread over repeats: one latency per size (p10/p90 not published), so no error bar",
                "the timing method (CUDA graph or back-to-back launches, warm-up, which rank's time)",
                "whether alltoall's message_size is the per-rank send buffer (read so, as nccl-tests reports it)",
                "the NVSwitch / driver / clock state of the machine that collected them (not this project's H200)",
                "whether SGLang's custom all-reduce matches vLLM's (the vLLM table prices both engines)",
            ],
            "replaced_by": "python3 benchmarks/multigpu/run_collectives.py --gpus 8 --out benchmarks/multigpu (our own "
                           "NCCL measurement; read first whenever present)",
        },
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="kernel_gym/data/collectives/h200_aic_prior.json")
    p.add_argument("--data-root", default="", help="aiconfigurator_core/systems/data/h200_sxm (default: installed)")
    args = p.parse_args(argv)
    try:
        from importlib.metadata import version

        import aiconfigurator_core
    except ImportError:
        print("aic_prior: aiconfigurator is not installed; pip install 'kernel_gym[aic]' in a separate venv",
              file=sys.stderr)
        return 2
    root = Path(args.data_root) if args.data_root else \
        Path(aiconfigurator_core.__file__).parent / "systems" / "data" / "h200_sxm"
    table = convert(root, version("aiconfigurator-core"))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(table, indent=1) + "\n")
    print(f"aic_prior: {len(table['results'])} rows, ops {sorted({r['op'] for r in table['results']})}, GPUs "
          f"{table['gpu_counts']} -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
