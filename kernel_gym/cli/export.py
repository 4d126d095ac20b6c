"""`kernel-gym export`: the options of kernel_gym.deploy.export.export_files (the engine formats: engine_export)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    from kernel_gym.deploy import export
    from kernel_gym.deploy.export import DEFAULT_DEVICE

    p = argparse.ArgumentParser(prog="kernel-gym export", description=export.__doc__.splitlines()[0])
    p.add_argument("--model-uri", action="append", default=[], metavar="[KERNEL=]URI",
                   help="a policy, e.g. models:/kernel-gym-moe-v0-mixtral-8x7b/1 (repeat per kernel); default: the "
                        "latest "
                        "registered kernel-gym-<env>-<model> (for --model), else kernel-gym-<env>, in the MLflow store")
    p.add_argument("--format", choices=("dispatch", "vllm", "sglang"), default="dispatch",
                   help="dispatch: dispatch_table.json for the Dispatcher; vllm / sglang: the engine's fused-MoE "
                        "config file from vllm_fused_moe measurements (deploy/engine_export.py; no policy needed)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--model", default="mixtral-8x7b", help="model spec (built-in name or JSON file) of the deployment")
    p.add_argument("--device", default=DEFAULT_DEVICE, help="GPU name as torch reports it (vLLM file name)")
    p.add_argument("--skew", type=float, default=0.0,
                   help="vllm: the routing skew (Zipf exponent) the deployment sees; vLLM keys on M only")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel degree: vllm/sglang N = intermediate // tp; dispatch: the table is for one "
                        "GPU's shard, the same as --model NAME@tpN")
    p.add_argument("--ep", type=int, default=1,
                   help="vllm/sglang: expert-parallel degree; the file is named by the local expert count E // ep")
    p.add_argument("--engine-version", default="",
                   help="vllm/sglang: the engine release the files target (default vLLM 0.34.0, SGLang 0.5.23)")
    p.add_argument("--confirmations", action="append", default=[], metavar="JSON",
                   help="vllm/sglang: paired confirmations (bench_vllm_export.json, engine_tune.json) that let a "
                        "measured lead change a key")
    p.add_argument("--policy-dir", type=Path, default=None, metavar="DIR",
                   help="dispatch: read the policies from bundles KERNEL.json/.npz in DIR instead of MLflow, e.g. "
                        "benchmarks/generalisation/policies (the model-conditioned zoo policies the repository ships)")
    p.add_argument("--routing", default="", help="vllm/sglang: uniform or zipf:S (default: from --skew)")
    p.add_argument("--store", action="append", default=[], metavar="PATH",
                   help="vllm/sglang: measurement store / snapshot with vllm_fused_moe rows (repeatable; default: "
                        "the packaged dataset)")
    p.add_argument("--force", action="store_true",
                   help="vllm/sglang: write an estimate where --device has no measurements (sidecar says so)")
    p.add_argument("--min-gain", type=float, default=0.01,
                   help="vllm/sglang: replace the engine's own entry only if measured this much faster")
    p.add_argument("--triton-version", default="",
                   help="sglang: the Triton version the server runs (its configs/triton_X_Y_Z/ folder)")
    p.add_argument("--kv-layout", default="", metavar="PAGE_SIZE:LAYOUT",
                   help="decode: KV layout to run with, e.g. 16:NHD (default: the one on which the policy's choices "
                        "measure best in the recorded data for --device, else the one it picks most often)")
    p.add_argument("--tracking-uri", default="", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or mlruns/)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kernel_gym.deploy.export import export_files

    return export_files(out=args.out, fmt=args.format, model=args.model, model_uris=args.model_uri,
                        device=args.device, skew=args.skew, tp=args.tp, ep=args.ep,
                        engine_version=args.engine_version, confirmations=args.confirmations,
                        policy_dir=args.policy_dir, routing=args.routing, stores=args.store, force=args.force,
                        min_gain=args.min_gain, triton_version=args.triton_version, kv_layout=args.kv_layout,
                        tracking_uri=args.tracking_uri)
