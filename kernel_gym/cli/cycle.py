"""`kernel-gym cycle`: the options of kernel_gym.deploy.cycle.run_cycle, --rollback, and the exit code for CI."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    from kernel_gym.deploy import cycle
    from kernel_gym.deploy.cycle import DEFAULT_DEVICE, NOISE_MARGIN, SHARE_MOVE, SKEW_MOVE

    p = argparse.ArgumentParser(prog="kernel-gym cycle", description=cycle.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="exit codes: 0 no change needed, 10 change proposed and confirmed, 11 proposed "
                                       "but unconfirmed, 2 error")
    p.add_argument("--model", help="model spec: a built-in or zoo name, NAME@tpN, or a JSON file")
    p.add_argument("--engine", choices=("vllm", "sglang"), help="whose fused-MoE config files --current holds")
    p.add_argument("--engine-version", default="", help="the engine release serving --current now, e.g. 0.34.0 "
                   "(default: the one its kernel_gym_export.json was exported for): it decides the launch path "
                   "priced at each M")
    p.add_argument("--current", type=Path, required=True, help="the folder the engine reads its configs from")
    p.add_argument("--traffic", action="append", default=[], metavar="SOURCE",
                   help="repeatable: a Prometheus scrape or folder of scrapes, a request log (Azure / Mooncake / "
                        "BurstGPT), per-expert counts (SGLang recorder dump, vLLM EPLB state, JSON)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (the engine file's N = intermediate/tp)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree, as kernel-gym export --ep (the engine "
                   "file's E = the local expert count, experts/ep)")
    p.add_argument("--device", default=DEFAULT_DEVICE, help="GPU name as torch.cuda.get_device_name() says")
    p.add_argument("--gpu", action="store_true", help="time the changed keys on this machine's GPU and keep only the "
                   "ones a paired round confirms")
    p.add_argument("--gpu-budget-s", type=float, default=300.0, help="GPU time budget of --gpu")
    p.add_argument("--top-k", type=int, default=4, help="--gpu: candidates timed per moved key besides the current")
    p.add_argument("--out", type=Path, default=None, help="the new folder (default <current>.next)")
    p.add_argument("--install", action="store_true", help="move the new folder into --current's place (the old one "
                   "becomes <current>.prev)")
    p.add_argument("--rollback", action="store_true", help="put <current>.prev back and exit")
    p.add_argument("--report-dir", type=Path, default=Path("."),
                   help="where cycle_report.md/.json and the traffic profile the next cycle compares with go "
                   "(default: the working directory)")
    p.add_argument("--store", action="append", default=[], metavar="PATH",
                   help="measurement stores with vllm_fused_moe rows (default: the packaged H200 dataset)")
    p.add_argument("--min-gain", type=float, default=0.01, help="a key changes only if faster by this much")
    p.add_argument("--noise-margin", type=float, default=NOISE_MARGIN,
                   help="zero-shot: the lead must also exceed this x the two recorded rows' spreads (0: min-gain only)")
    p.add_argument("--share-move", type=float, default=SHARE_MOVE, help="share of steps a key must gain or lose")
    p.add_argument("--skew-move", type=float, default=SKEW_MOVE, help="skew change that moves every key")
    p.add_argument("--no-mlflow", action="store_true", help="skip the MLflow run")
    p.add_argument("--tracking-uri", default="", help="MLflow store (default mlruns/ or MLFLOW_TRACKING_URI)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kernel_gym.deploy import cycle

    if args.rollback:
        undone = cycle.rollback(args.current)
        print(f"[cycle] restored {args.current} from {cycle.prev_of(args.current)}; the replaced folder is {undone}")
        return 0
    code, rep = cycle.run_cycle(
        current=args.current, model=args.model, engine=args.engine, traffic=args.traffic, tp=args.tp, ep=args.ep,
        device=args.device, gpu=args.gpu, gpu_budget_s=args.gpu_budget_s, top_k=args.top_k, out=args.out,
        install=args.install, report_dir=args.report_dir, stores=args.store, min_gain=args.min_gain,
        noise_margin=args.noise_margin, share_move=args.share_move, skew_move=args.skew_move,
        no_mlflow=args.no_mlflow, tracking_uri=args.tracking_uri, engine_version=args.engine_version)
    print("\n".join(cycle.summary_lines(code, rep, args.report_dir)))
    return code
