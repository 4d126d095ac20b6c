"""`kernel-gym tune`: the options of kernel_gym.deploy.tune.tune_model, or with --engine those of
kernel_gym.deploy.engine_tune (the engine's own config file instead of a dispatch table)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    from kernel_gym.deploy import tune
    from kernel_gym.deploy.tune import KERNELS, LOCAL_STEPS

    p = argparse.ArgumentParser(prog="kernel-gym tune", description=tune.__doc__.split("\n\n")[0],
                                epilog="With --engine vllm|sglang: the engine's own fused-MoE config file instead, "
                                       "each key confirmed against the engine's entry (kernel-gym tune --engine "
                                       "vllm --help)")
    p.add_argument("--model", required=True,
                   help="model spec: a built-in or zoo name, or a JSON file; NAME@tpN / FILE.json@tpN: its TP shard")
    p.add_argument("--kernels", default=",".join(KERNELS), help="comma list of kernels to tune")
    p.add_argument("--top-k", type=int, default=4, help="the policy's most preferred configs measured per grid cell")
    p.add_argument("--budget-s", type=float, default=120.0, help="GPU time budget; a rerun resumes where it stopped")
    p.add_argument("--db", default="tune.sqlite", help="measurement store (created; resumed when it exists)")
    p.add_argument("--model-uri", action="append", default=[], metavar="KERNEL=URI",
                   help="policy per kernel (default: the latest registered policy for the model, else the "
                        "model-conditioned one)")
    p.add_argument("--policy-dir", type=Path, default=None,
                   help="read the policies from KERNEL.json/.npz here (no MLflow needed: a GPU machine)")
    p.add_argument("--save-policies", type=Path, default=None,
                   help="write the MLflow policies to this folder for --policy-dir, print the plan, and exit")
    p.add_argument("--out", type=Path, default=Path("deploy/tuned_table.json"), help="dispatch table JSON")
    p.add_argument("--tracking-uri", default="", help="MLflow store holding the policies (default: mlruns/)")
    p.add_argument("--local", type=int, default=LOCAL_STEPS,
                   help="one-knob steps measured around each cell's best in round 2 (0: no local search)")
    p.add_argument("--no-nearest", action="store_true",
                   help="leave out the nearest measured shapes' winners (only the policy and the engine's entry)")
    p.add_argument("--dry-run", action="store_true", help="print the plan size and exit (no GPU needed)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the interpreter (tests only)")
    return p


def build_engine_parser() -> argparse.ArgumentParser:
    from kernel_gym.deploy import engine_export as ee
    from kernel_gym.deploy import engine_tune

    p = argparse.ArgumentParser(prog="kernel-gym tune --engine", description=engine_tune.__doc__.splitlines()[0])
    p.add_argument("--engine", required=True, help="vllm or sglang, optionally with a version: vllm-0.33.0")
    p.add_argument("--model", required=True, help="model spec: built-in / zoo name or a JSON file")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--routing", default="uniform", help="uniform or zipf:S (the engines key on M only)")
    p.add_argument("--device", default="", help="the GPU's name as torch reports it (default: this GPU's)")
    p.add_argument("--triton-version", default="", help="sglang: the Triton its server runs (default: pinned)")
    p.add_argument("--budget-s", type=float, default=60.0, help="seconds for the whole run (compiles included)")
    p.add_argument("--min-gain", type=float, default=ee.DEFAULT_MIN_GAIN)
    p.add_argument("--pair-rounds", type=int, default=6)
    p.add_argument("--m-keys", default="", help="comma-separated subset of vLLM's M keys (default: all 18)")
    p.add_argument("--store", action="append", default=[], help="more vllm_fused_moe rows (besides the packaged)")
    p.add_argument("--no-packaged", action="store_true", help="use only --store rows, not the packaged dataset's")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--resume", action="store_true", help="continue the run in --out (keys already done stay)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (CPU), measure nothing")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, a tiny shape: checks the logic")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--engine" or a.startswith("--engine=") for a in argv):  # the engine's own file: engine_tune.py
        from kernel_gym.deploy.engine_tune import EngineTuneOptions, tune_engine

        e = build_engine_parser().parse_args(argv)
        return tune_engine(EngineTuneOptions(
            engine=e.engine, model=e.model, out=e.out, tp=e.tp, ep=e.ep, routing=e.routing, device=e.device,
            triton_version=e.triton_version, budget_s=e.budget_s, min_gain=e.min_gain, pair_rounds=e.pair_rounds,
            m_keys=e.m_keys, stores=tuple(e.store), no_packaged=e.no_packaged, resume=e.resume, dry_run=e.dry_run,
            smoke=e.smoke, seed=e.seed))
    args = build_parser().parse_args(argv)
    from kernel_gym.deploy.tune import tune_model

    return tune_model(model=args.model, kernels=[k.strip() for k in args.kernels.split(",") if k.strip()],
                      top_k=args.top_k, budget_s=args.budget_s, db=args.db, model_uris=args.model_uri,
                      policy_dir=args.policy_dir, save_policies=args.save_policies, out=args.out,
                      tracking_uri=args.tracking_uri, local=args.local, no_nearest=args.no_nearest,
                      dry_run=args.dry_run, device=args.device)
