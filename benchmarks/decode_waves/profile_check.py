"""Decode attention's price beside its measured kernel time on the profiled steps of live H200 runs, with the wave
model and without it (benchmarks/live_e2e/run.py --predict --decode-waves on / off).

The profiled runs (`run.py --profile-every N`) ran every N-th step once more under torch's profiler: its decode
kernels' summed durations are the measurement here, set beside the price --predict gives the same step (its decode
batch's contexts recovered from the run's schedule, run.step_contexts). Kernel durations leave out launch gaps, which
a CUDA graph's replay mostly hides, so a price a little above 1.0x is expected. Each run's `clocks` are the GPU's
clock and power state before and after it (its measured.json); the dataset's are in `dataset`. CPU only, from committed
runs.

    python benchmarks/decode_waves/profile_check.py          # profile_check.json beside this file (~2 minutes)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.live_e2e import run as le  # noqa: E402

HERE = Path(__file__).resolve().parent
RUNS = {  # profiled runs: their policies
    "benchmarks/live_e2e/graph_5ebaec4/window1_spans": ("default", "vllm-table",
                                                        "table:benchmarks/live_replay/inputs/dispatch_table.json"),
    "benchmarks/live_e2e/eager_ab2db7d/window1_prof5": ("vllm-table",),
}
BATCHES = ((1, 4), (5, 16), (17, 64), (65, 256))  # decode batch ranges the table breaks the ratio into


def main() -> int:
    from kernel_gym.train.tracking import git_commit

    t0 = time.time()
    out: dict = {"what": "decode attention: price / profiled kernel time, decode-only steps", "commit": git_commit(),
                 "dataset": None, "runs": {}}
    for run, policies in RUNS.items():
        for spec in policies:
            row: dict = {}
            for waves in ("off", "on"):
                args = le.build_parser().parse_args(["--out", str(ROOT / run), "--predict", "--decode-waves", waves])
                _, meta, model, trace, backend, timer, _ = le.predict_setup(args)
                out["dataset"] = out["dataset"] or getattr(backend, "describe", lambda: None)()
                priced = le.priced_steps(args.out, spec, model, trace, timer, backend, args, meta)
                steps = le.read_steps(args.out, spec)
                profiled = [(s, p) for s, p in zip(steps, priced)
                            if "kernels" in s and not s["chunks"] and s["decode_batch"]]
                a = np.array([(s["decode_batch"], s["kernels"]["by_part_us"].get("decode_attention", 0.0) * 1e-6,
                               p[5].get("decode_attention", 0.0)) for s, p in profiled])
                by_config: dict = {}
                for s, p in profiled:  # per decode config: mean measured and priced microseconds per layer
                    c = by_config.setdefault(s["configs"]["decode_attention"], [0, 0.0, 0.0])
                    c[0] += 1
                    c[1] += s["kernels"]["by_part_us"].get("decode_attention", 0.0) / model.num_layers
                    c[2] += p[5].get("decode_attention", 0.0) * 1e6 / model.num_layers
                parts = {}  # every priced part over its profiled time (the other parts do not move with the model)
                for part in ("fused_moe", "decode_attention", "dense"):
                    measured = sum(s["kernels"]["by_part_us"].get(part, 0.0) * 1e-6 for s, _ in profiled)
                    if measured > 0:
                        parts[part] = sum(p[5].get(part, 0.0) for _, p in profiled) / measured
                row[waves] = {"steps": len(a), "price_over_measured": float(a[:, 2].sum() / a[:, 1].sum()),
                              "by_batch": {f"{lo}-{hi}": float(a[m, 2].sum() / a[m, 1].sum())
                                           for lo, hi in BATCHES
                                           if (m := (a[:, 0] >= lo) & (a[:, 0] <= hi)).sum() >= 3},
                              "parts_price_over_measured": parts,
                              "by_config_us_per_layer": {k: {"steps": n, "measured": m / n, "price": pr / n}
                                                         for k, (n, m, pr) in by_config.items()}}
            measured = json.loads((ROOT / run / "measured.json").read_text())["measured"][spec]
            row["clocks"] = {k: measured.get(k) for k in ("gpu_before", "gpu_after")}  # the GPU's state around the run
            out["runs"][f"{run.split('live_e2e/')[-1]} {spec}"] = row
            print(f"{run.split('live_e2e/')[-1]:32s} {spec[:24]:24s} {row['off']['steps']:4d} steps: price / "
                  f"measured {row['off']['price_over_measured']:.3f} -> {row['on']['price_over_measured']:.3f} "
                  "with the wave model", file=sys.stderr, flush=True)
    out["seconds"] = round(time.time() - t0, 1)
    (HERE / "profile_check.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
