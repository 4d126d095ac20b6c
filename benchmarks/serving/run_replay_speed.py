"""Replay speed benchmark: the full one-hour Azure conversation trace (19,366 requests) through the serving simulator
for mixtral-8x7b on one CPU core. Target: under 60 s of wall time.

Backends: "recorded" (default; the packaged H200 measurements through BackendTimer, shapes outside the measured grid
answered by measure.coverage.CoveredBackend and counted) or "roofline" (config-blind analytic timer).
Choosers (recorded): "default" (each family's default heuristic) and "oracle" (fastest recorded config per workload;
its decode KV layout is the one in force, 16/NHD). Writes a JSON record with --out.

    python benchmarks/serving/run_replay_speed.py [--backend recorded] [--chooser default oracle] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from kernel_gym.kernels.space import Config
from kernel_gym.measure.roofline import RooflineTimer
from kernel_gym.models import load_model
from kernel_gym.traffic import Simulator, StaticChooser, load_trace
from kernel_gym.traffic.routing import ZipfRouting
from kernel_gym.traffic.simulator import DEFAULT_KV


def _replay(args: argparse.Namespace, chooser_name: str, trace, model) -> dict:
    t0 = time.perf_counter()
    if args.backend == "roofline":
        kv = DEFAULT_KV
        chooser = StaticChooser({
            "prefill_attention": Config(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
            "decode_attention": Config(PAGE_SIZE=kv.page_size, LAYOUT=kv.layout, SPLIT_KV=4, num_warps=4),
            "fused_moe": Config(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3),
        })
        sim = Simulator(model, trace, RooflineTimer(args.efficiency), chooser,
                        ZipfRouting(model.num_experts, model.top_k, seed=0, exponent=args.skew), kv_layout=kv)
        coverage = None
    else:
        from kernel_gym.dispatch.serving_rules import KERNELS, DispatchRule, OracleChooser, _Answers, _RuleChooser
        from kernel_gym.kernels import get_family
        from kernel_gym.measure import make_backend
        from kernel_gym.measure.coverage import cover
        from kernel_gym.traffic import BackendTimer

        for k in KERNELS:  # import the kernel modules (torch, triton) before the clock starts
            get_family(k)
        backend = cover(make_backend("recorded"))
        answers = _Answers(backend, {})
        if chooser_name == "oracle":
            chooser = OracleChooser(answers)
        else:
            chooser = _RuleChooser(answers, {k: DispatchRule(k, "default", {}) for k in KERNELS})
        sim = Simulator(model, trace, BackendTimer(backend), chooser, None)
        coverage = chooser.coverage
    setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    res = sim.run()
    wall = time.perf_counter() - t1
    s = res.summary
    row = {"backend": args.backend, "chooser": chooser_name if args.backend == "recorded" else "static",
           "setup_s": setup, "replay_wall_s": wall, "pass": wall < 60, "steps": s["steps"],
           "steps_per_s": s["steps"] / wall, "requests": len(trace), "sim_time_s": s["sim_time_s"],
           "tokens_per_s": s["tokens_per_s"], "ttft_p50_s": s["ttft_p50_s"], "tpot_p50_s": s["tpot_p50_s"],
           "preemptions": s["preemptions"], "kv_occupancy_mean": s["kv_occupancy_mean"],
           "compile_stall_s": s["stall_s"]}
    if coverage is not None:
        row["kernel_calls"] = dict(coverage.calls)
        row["proxied_calls"] = dict(coverage.proxied)
        row["proxied_share"] = coverage.snapshot()[1] / max(coverage.snapshot()[0], 1)
        row["fallbacks"] = getattr(chooser, "fallbacks", 0)
    print(f"{row['backend']}/{row['chooser']}: replay wall {wall:.1f} s (setup {setup:.1f} s), {s['steps']:.0f} steps "
          f"({row['steps_per_s']:.0f}/s); simulated {s['sim_time_s']:.0f} s, {s['tokens_per_s']:.0f} output tok/s, "
          f"TTFT p50 {s['ttft_p50_s']:.3f} s, TPOT p50 {s['tpot_p50_s'] * 1e3:.1f} ms, preemptions "
          f"{s['preemptions']:.0f}" + (f", proxied calls {row['proxied_share']:.1%}" if coverage else "")
          + (" PASS" if wall < 60 else " SLOW") + " (target: replay under 60 s)")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure-conv", help="trace name or path (load_trace)")
    ap.add_argument("--model", default="mixtral-8x7b")
    ap.add_argument("--backend", choices=("recorded", "roofline"), default="recorded")
    ap.add_argument("--chooser", nargs="+", choices=("default", "oracle"), default=["default", "oracle"])
    ap.add_argument("--efficiency", type=float, default=0.6, help="roofline: fraction of roofline the kernels reach")
    ap.add_argument("--skew", type=float, default=0.6, help="roofline: Zipf exponent of expert routing")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    trace = load_trace(args.trace)
    model = load_model(args.model)
    print(f"trace {trace.name}: {len(trace)} requests over {trace.duration_s:.0f} s (loaded in "
          f"{time.perf_counter() - t0:.2f} s)")
    rows = [_replay(args, c, trace, model) for c in (args.chooser if args.backend == "recorded" else ["static"])]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        rec = {"trace": trace.name, "model": model.name, "cpu_affinity": len(os.sched_getaffinity(0)), "runs": rows}
        Path(args.out).write_text(json.dumps(rec, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
