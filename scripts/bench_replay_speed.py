"""Replay speed benchmark: the full one-hour Azure conversation trace (19,366 requests) through the serving simulator
for mixtral-8x7b on one CPU core. Target: under 60 s of wall time with a memoised timer.

The timer here is kernel_gym's config-blind roofline timer (analytic, memoised). To time with the recorded backend,
replace RooflineTimer(...) by kernel_gym.traffic.BackendTimer(<recorded backend>) and the StaticChooser configs by
configs the store holds. Prints wall time, steps/s, requests.

    python scripts/bench_replay_speed.py [--trace azure-conv] [--model mixtral-8x7b] [--efficiency 0.6]
"""

from __future__ import annotations

import argparse
import time

from kernel_gym.kernels.space import Config
from kernel_gym.models import load_model
from kernel_gym.traffic import KVLayout, RooflineTimer, Simulator, StaticChooser, load_trace
from kernel_gym.traffic.routing import ZipfRouting


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure-conv", help="trace name or path (load_trace)")
    ap.add_argument("--model", default="mixtral-8x7b")
    ap.add_argument("--efficiency", type=float, default=0.6, help="fraction of roofline the kernels reach")
    ap.add_argument("--skew", type=float, default=0.6, help="Zipf exponent of expert routing")
    args = ap.parse_args()

    t0 = time.perf_counter()
    trace = load_trace(args.trace)
    model = load_model(args.model)
    t_load = time.perf_counter() - t0
    kv = KVLayout(16, "NHD")
    chooser = StaticChooser({
        "prefill_attention": Config(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
        "decode_attention": Config(PAGE_SIZE=kv.page_size, LAYOUT=kv.layout, SPLIT_KV=4, num_warps=4),
        "fused_moe": Config(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3),
    })
    sim = Simulator(model, trace, RooflineTimer(args.efficiency), chooser,
                    ZipfRouting(model.num_experts, model.top_k, seed=0, exponent=args.skew), kv_layout=kv)
    t1 = time.perf_counter()
    res = sim.run()
    wall = time.perf_counter() - t1
    s = res.summary
    print(f"trace {trace.name}: {len(trace)} requests over {trace.duration_s:.0f} s (loaded in {t_load:.2f} s)")
    print(f"replay wall time {wall:.2f} s, {s['steps']:.0f} steps, {s['steps'] / wall:.0f} steps/s, "
          f"{len(trace) / wall:.0f} requests/s of wall time")
    print(f"simulated {s['sim_time_s']:.0f} s: {s['tokens_per_s']:.0f} output tokens/s, "
          f"TTFT p50 {s['ttft_p50_s']:.3f} s, "
          f"TPOT p50 {s['tpot_p50_s'] * 1e3:.1f} ms, preemptions {s['preemptions']:.0f}, "
          f"KV occupancy mean {s['kv_occupancy_mean']:.2f}")
    print("PASS" if wall < 60 else "SLOW", "(target: under 60 s)")


if __name__ == "__main__":
    main()
