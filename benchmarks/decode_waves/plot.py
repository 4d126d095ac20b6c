"""Each live policy run's simulator error before the decode wave model (session 49's check) against now, TPOT and
TTFT p50: a point nearer the horizontal zero line than the diagonal moved toward the measurement. CPU, from the two
committed checks.

    python benchmarks/decode_waves/plot.py        # before_after.png beside this file
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BEFORE = HERE / "live_check_before.json"
NOW = ROOT / "kernel_gym" / "data" / "live_check.json"
TARGETS = {"tpot_p50_s": ("TPOT p50", 0.05), "ttft_p50_s": ("TTFT p50", 0.10)}


def group(row: dict) -> str:
    policy = {"default": "default configs", "vllm-table": "vllm-table"}.get(row["policy"], "learned tables")
    return f"{row['model'].split('-')[0]}, {policy}"


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def rows(path: Path) -> dict:
        return {(r["run"].split("predicted/")[-1], r["policy"]): r for r in json.loads(path.read_text())["rows"]}

    before, now = rows(BEFORE), rows(NOW)
    keys = [k for k in now if k in before]
    groups = sorted({group(now[k]) for k in keys})
    colours = dict(zip(groups, ("tab:blue", "tab:cyan", "tab:green", "tab:orange", "tab:red", "tab:purple")))
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    for ax, (metric, (name, target)) in zip(axes, TARGETS.items()):
        x = [100 * before[k][metric] for k in keys]
        y = [100 * now[k][metric] for k in keys]
        lim = max(map(abs, x + y)) * 1.08
        ax.axhspan(-100 * target, 100 * target, color="0.92", zorder=0)
        ax.axvspan(-100 * target, 100 * target, color="0.92", zorder=0)
        ax.plot([-lim, lim], [-lim, lim], color="0.5", lw=0.8)
        for g in groups:
            sel = [i for i, k in enumerate(keys) if group(now[k]) == g]
            ax.scatter([x[i] for i in sel], [y[i] for i in sel], color=colours[g], s=26, label=g)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ins = (sum(abs(v) <= 100 * target for v in x), sum(abs(v) <= 100 * target for v in y))
        ax.set_title(f"{name}: within {100 * target:g}% on {ins[0]} -> {ins[1]} of {len(keys)} runs")
        ax.set_xlabel("simulator error before, % (session 49)")
        ax.set_ylabel("simulator error with the decode wave model, %")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("Live H200 runs: the simulator's error before and after pricing decode from each batch's contexts")
    fig.tight_layout()
    out = HERE / "before_after.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
