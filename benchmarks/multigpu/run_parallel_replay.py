"""Replay traces through the multi-GPU simulator under every TP / EP layout on G GPUs: goodput at a TTFT/TPOT SLO,
with the share of each result resting on estimated times beside it.

    python3 benchmarks/multigpu/run_parallel_replay.py run --model mixtral-8x7b --gpus 8 --traces azure-conv,mooncake \\
        --duration-s 600 --json benchmarks/multigpu/replay_g8.json          # CPU
    python3 benchmarks/multigpu/run_parallel_replay.py plan --model mixtral-8x7b --gpus 8 --out plan.json
    python3 scripts/collect.py --plan plan.json --kernels fused_moe --db shards.sqlite --out shards.jsonl.gz  # 1 GPU

`run` reads the measured collectives table, else aiconfigurator's labelled prior (kernel_gym/data/collectives/; each
row then reports prior_step_share, the part of its step time priced from it). The baselines are the fixed layouts
users pick by hand: TP = G, EP = G and the mixed tp x ep = G the model allows (kernel_gym.parallel.layout). `plan`
writes the fused-MoE shards of every layout (TP: intermediate / tp; EP: E / ep experts, one expert per received row)
as a `collect --plan` file, with the fastest configs measured at the model's unsharded shapes as candidates, so one
GPU can measure what the layouts run.
Traces by name need KERNEL_GYM_TRACES (README: Data and licences); "bundled" works anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernel_gym.parallel.collectives import CollectivesError, CollectivesMissing  # noqa: E402


def plan(args: argparse.Namespace) -> int:
    from kernel_gym.kernels import get_family
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.models import load_model
    from kernel_gym.parallel.layout import ep_plan_workloads, valid_layouts

    spec = load_model(args.model)
    backend = RecordedBackend()
    fam = get_family("fused_moe")
    rows = backend.rows("fused_moe")
    # candidates: the fastest configs at each measured unsharded shape of this model
    cand: list[str] = []
    for wkey, by_cfg in rows.items():
        w = json.loads(wkey)
        if (w["num_experts"], w["hidden"], w["intermediate"], w["top_k"]) != (spec.num_experts, spec.hidden,
                                                                               spec.intermediate, spec.top_k):
            continue
        ok = sorted((m.median_ms, c) for c, m in by_cfg.items() if m.ok and m.median_ms)
        cand += [c for _, c in ok[:args.configs]]
    cand = list(dict.fromkeys(cand))
    entries = []
    from kernel_gym.traffic.simulator import GPU_MEMORY_UTILIZATION, H200_MEMORY_BYTES

    for layout in valid_layouts(spec, args.gpus, gpu_memory_bytes=H200_MEMORY_BYTES,  # the pool `run` replays with
                                gpu_memory_utilization=GPU_MEMORY_UTILIZATION):
        for wl in ep_plan_workloads(spec, layout, args.max_tokens):
            from kernel_gym.kernels.space import Config

            configs = [c for c in cand if fam.space.is_valid(Config.parse(c), wl)]
            configs.append(str(fam.default_config(wl)))
            entries.append({"kernel": "fused_moe", "workload": wl.key(), "configs": list(dict.fromkeys(configs)),
                            "layout": layout.name})
    Path(args.out).write_text(json.dumps(entries, indent=1) + "\n")
    n = sum(len(e["configs"]) for e in entries)
    print(f"[plan] {len(entries)} shard workloads, {n} configs ({len(cand)} candidates from {spec.name}'s measured "
          f"shapes) -> {args.out}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    from kernel_gym.evaluate.replay import routing_profile
    from kernel_gym.models import load_model
    from kernel_gym.parallel.collectives import default_table, load_table
    from kernel_gym.parallel.layout import layouts_for, why_invalid
    from kernel_gym.parallel.step_time import serve
    from kernel_gym.traffic.simulator import GPU_MEMORY_UTILIZATION, H200_MEMORY_BYTES
    from kernel_gym.traffic.traces import load_trace
    from kernel_gym.traffic.windows import slice_window

    table = load_table(args.table) if args.table else default_table()
    if table.is_prior:
        print(f"parallel_replay: note: no measured collectives table; pricing collectives from the labelled prior "
              f"{table.source} ({table.prior.get('source')}); prior_share says how much of each step rests on it",
              file=sys.stderr)
    if table.meta.get("complete") is False:
        print(f"parallel_replay: note: {table.source} is incomplete ({table.meta.get('stopped')}); sizes and GPU "
              "counts it lacks are refused", file=sys.stderr)
    spec = load_model(args.model)
    routing = routing_profile(args.routing, spec, args.seed)
    report = {"model": spec.name, "gpus": args.gpus, "table": table.source, "table_meta": {
        k: table.meta.get(k) for k in ("device", "created", "nccl", "torch", "gpu_counts", "complete", "stopped")},
        "routing": args.routing, "ttft_slo_s": args.ttft_slo_s, "tpot_slo_s": args.tpot_slo_s, "traces": {}}
    for name in [t for t in args.traces.split(",") if t]:
        trace = load_trace(name)
        end = min(trace.duration_s, args.start_s + args.duration_s) if args.duration_s else trace.duration_s
        reqs = slice_window(trace, args.start_s, end, args.rate_scale)
        results, skipped = [], {}
        for layout in layouts_for(args.gpus):
            why = why_invalid(spec, layout, args.gpus, H200_MEMORY_BYTES, GPU_MEMORY_UTILIZATION)  # serve()'s pool
            if why:
                skipped[layout.name] = why
                continue
            t0 = time.time()
            r = serve(spec, reqs, layout, table=table, routing=routing, ttft_slo_s=args.ttft_slo_s,
                      tpot_slo_s=args.tpot_slo_s, max_num_batched_tokens=args.max_num_batched_tokens)
            r["wall_s"] = time.time() - t0
            results.append(r)
        report["traces"][name] = {"requests": len(reqs.arrival_s), "span_s": float(end - args.start_s),
                                  "layouts": results, "invalid": skipped}
        print(f"\n{name}: {len(reqs.arrival_s)} requests, {spec.name} on {args.gpus} GPUs, routing {args.routing}, "
              f"SLO TTFT <= {args.ttft_slo_s} s, TPOT <= {args.tpot_slo_s} s")
        print(f"{'layout':<10} {'goodput req/s':>14} {'SLO met':>8} {'tokens/s':>9} {'TTFT p99':>9} "
              f"{'TPOT p50':>9} {'coll. share':>11} {'EP imb.':>8} {'estimated':>9}")
        for r in results:
            print(f"{r['layout']:<10} {r['goodput_req_per_s']:>14.3f} {r['slo_attainment']:>8.1%} "
                  f"{r['tokens_per_s']:>9.1f} {r['ttft_p99_s']:>9.3f} {r['tpot_p50_s']:>9.4f} "
                  f"{r['collective_share']:>11.1%} {r['ep_imbalance_mean']:>8.2f} {r['estimated_share']:>9.1%} "
                  f"{r['prior_step_share']:>6.1%}")
        for lay, why in skipped.items():
            print(f"{lay:<10} invalid: {why}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="replay traces under every layout on --gpus GPUs")
    r.add_argument("--model", default="mixtral-8x7b")
    r.add_argument("--gpus", type=int, default=8)
    r.add_argument("--traces", default="azure-conv,mooncake", help="comma list of load_trace names or paths")
    r.add_argument("--table", default="", help="collectives.json (default: $KERNEL_GYM_COLLECTIVES, else "
                                               "benchmarks/multigpu/collectives.json)")
    r.add_argument("--start-s", type=float, default=0.0, help="replay from this trace second")
    r.add_argument("--duration-s", type=float, default=600.0, help="trace seconds to replay (0: all)")
    r.add_argument("--rate-scale", type=float, default=1.0, help="compress the trace's time by this factor")
    r.add_argument("--routing", default="zipf:1.2", help="uniform, zipf:EXPONENT or drift:EXPONENT[:DWELL_S]")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--ttft-slo-s", type=float, default=2.0)
    r.add_argument("--tpot-slo-s", type=float, default=0.1)
    r.add_argument("--max-num-batched-tokens", type=int, default=8192)
    r.add_argument("--json", default="", help="write the report here")
    q = sub.add_parser("plan", help="the layouts' fused-MoE shards as a collect --plan file (measured on 1 GPU)")
    q.add_argument("--model", default="mixtral-8x7b")
    q.add_argument("--gpus", type=int, default=8)
    q.add_argument("--configs", type=int, default=8, help="fastest configs per measured unsharded shape")
    q.add_argument("--max-tokens", type=int, default=8192, help="largest step (max_num_batched_tokens)")
    q.add_argument("--out", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return plan(args) if args.cmd == "plan" else run(args)
    except (CollectivesMissing, CollectivesError, FileNotFoundError, ValueError) as exc:
        print(f"parallel_replay: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
