"""CPU: how far a dispatch table's choices are from the fastest config the packaged H200 dataset measured, at every
cell of the table whose workload the dataset measured (the cells a policy trained on the model's rows saw).

A table is a snapshot of its policies; the dataset moves (rows re-timed, knobs added, holes filled). The live runs'
learned table (`benchmarks/live_replay/inputs/dispatch_table.json`) was exported on 2026-11-30, before the Mixtral MoE
rows were re-timed and the fills were merged, while the vllm-table baseline is rebuilt from the current dataset every
time it runs. This script puts a number on that:

    python benchmarks/live_e2e/table_gap.py benchmarks/live_replay/inputs/dispatch_table.json \\
        benchmarks/live_e2e/tables/mixtral_seed{0,1,2}/dispatch_table.json --json benchmarks/live_e2e/tables/gap.json

Per table and kernel (fused_moe, decode_attention on the live stack's 16-token NHD pages): the measured cells, the
geomean and worst ratio chosen / fastest (>= 1; 1 = the table holds the fastest measured config), the cells whose
choice the dataset cannot time, and for fused_moe the ratio per token count at uniform routing (skew 0, what the
live stack's random router gives). Dataset: the packaged one (its hash is in the output).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

KERNELS = ("fused_moe", "decode_attention")


def table_gap(path: Path, oracle: Any, kv: Any) -> dict[str, Any]:
    """{kernel: gap summary} for one dispatch table file (module docstring)."""
    from kernel_gym.dispatch.dispatcher import Dispatcher

    dispatcher = Dispatcher.load(path)
    out: dict[str, Any] = {"versions": dispatcher.table.versions}
    for kernel, table in dispatcher._tables.items():
        if kernel not in KERNELS:
            continue
        layout = kv if kernel == "decode_attention" else None
        ratios, untimed, by_tokens = [], 0, {}
        for i, x0 in enumerate(table.centers[0]):
            for j, x1 in enumerate(table.centers[1]):
                w = table.cell_workload(i, j)
                best = oracle.best(kernel, w, layout)
                if best is None:
                    continue  # the dataset did not measure this cell
                chosen = dispatcher.choose(kernel, w, layout)
                t, t_best = oracle.time_ms(kernel, w, chosen), oracle.time_ms(kernel, w, best)
                if t is None:
                    untimed += 1
                    continue
                ratios.append((t / t_best, x0, x1))
                if kernel == "fused_moe" and x1 == 0.0:
                    by_tokens[str(int(x0))] = round(t / t_best, 4)  # str: as the JSON file keys it
        worst = max(ratios, default=None)
        out[kernel] = {
            "measured_cells": len(ratios) + untimed, "untimed_choices": untimed,
            "geomean": (round(math.exp(sum(math.log(r) for r, _, _ in ratios) / len(ratios)), 4) if ratios else None),
            "worst": None if worst is None else {"ratio": round(worst[0], 4), "cell": [worst[1], worst[2]]},
            "within_1pct": sum(r <= 1.01 for r, _, _ in ratios),
            **({"skew0_by_tokens": by_tokens} if by_tokens else {}),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tables", nargs="+", type=Path, help="dispatch table JSON files")
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    args = p.parse_args(argv)
    missing = [str(t) for t in args.tables if not t.exists()]
    if missing:
        raise SystemExit(f"no such table: {', '.join(missing)} (export one with kernel-gym export --format dispatch)")
    from kernel_gym.dispatch.baselines import Oracle
    from kernel_gym.measure import make_backend
    from kernel_gym.traffic.simulator import KVLayout

    backend = make_backend("recorded")
    oracle = Oracle(backend)
    result = {"dataset_sha256_16": backend.dataset_hash, "kv_layout": [16, "NHD"],
              "tables": {str(t): table_gap(t, oracle, KVLayout(16, "NHD")) for t in args.tables}}
    print(f"{'table':60s} {'kernel':17s} {'cells':>5s} {'geomean':>8s} {'worst':>7s} {'<=1%':>5s}")
    for name, kernels in result["tables"].items():
        for kernel in KERNELS:
            g = kernels.get(kernel)
            if g:
                worst = g["worst"]["ratio"] if g["worst"] else float("nan")
                print(f"{name[-60:]:60s} {kernel:17s} {g['measured_cells']:5d} {g['geomean'] or float('nan'):8.3f} "
                      f"{worst:7.3f} {g['within_1pct']:5d}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
