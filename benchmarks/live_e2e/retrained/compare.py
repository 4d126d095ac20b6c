"""The retrained tables against the vllm-table, live on the H200: per window, each table's measured tokens/s, TTFT
p50 and TPOT p50 beside the vllm-table's from the same command (so the same GPU session and power state), their
ratios, and the plain simulator's error on each (from each run's summary.json, `run.py --predict`).

    python benchmarks/live_e2e/retrained/compare.py    # writes compare.json and compare.png here, prints a table
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
METRICS = ("tokens_per_s", "ttft_p50_s", "tpot_p50_s")


def rows() -> list[dict]:
    """One row per (run folder, window, retrained table)."""
    out = []
    for summary in sorted(HERE.glob("run*/window*/summary.json")):
        s = json.loads(summary.read_text())
        pol = s["policies"]
        base = pol.get("vllm-table")
        if base is None or "relative_error" not in base:
            print(f"{summary}: no predicted vllm-table run beside the tables: left out", file=sys.stderr)
            continue
        for spec, r in pol.items():
            if not spec.startswith("table:") or "relative_error" not in r:
                continue
            out.append({
                "run": summary.parent.parent.name, "window": summary.parent.name, "table": spec[len("table:"):],
                "requests": s["meta"]["requests"], "commit": s["meta"].get("commit"),
                "vllm_table": {k: base["measured"][k] for k in METRICS},
                "learned": {k: r["measured"][k] for k in METRICS},
                "learned_over_vllm_table": {k: r["measured"][k] / base["measured"][k] for k in METRICS},
                "simulator_error": {"vllm_table": base["relative_error"], "learned": r["relative_error"]},
                "estimated_share": {"vllm_table": base["estimated_share"], "learned": r["estimated_share"]},
                # the GPU's clocks, power and throttle reasons before and after each policy's replay (measured.json)
                "gpu": {"vllm_table": {k: base.get(k) for k in ("gpu_before", "gpu_after")},
                        "learned": {k: r.get(k) for k in ("gpu_before", "gpu_after")}},
            })
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def plot(table: list[dict], path: Path) -> Path:
    """Per window run, the retrained table's TTFT p50 and TPOT p50 over the vllm-table's (below 1: the table wins)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['window']}\n{Path(r['table']).parent.name.replace('mixtral_', '')}" for r in table]
    x = range(len(table))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(table)), 4))
    for offset, (key, name) in zip((-0.2, 0.2), (("ttft_p50_s", "TTFT p50"), ("tpot_p50_s", "TPOT p50"))):
        ax.bar([i + offset for i in x], [r["learned_over_vllm_table"][key] for r in table], width=0.4, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(x), labels, fontsize=8)
    ratios = [r["learned_over_vllm_table"][k] for r in table for k in ("ttft_p50_s", "tpot_p50_s")]
    ax.set_ylim(min(0.7, min(ratios) - 0.05), max(1.1, max(ratios) + 0.05))
    ax.set_ylabel("retrained table / vllm-table")
    ax.set_title("Mixtral-8x7B live on one H200: retrained dispatch tables against the vllm-table (same command)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    table = rows()
    if not table:
        raise SystemExit(f"no predicted runs under {HERE}: run `run.py --out RUN --predict` on each window first")
    ratio = {k: [r["learned_over_vllm_table"][k] for r in table] for k in METRICS}
    result = {"rows": table, "pairs": len(table),
              "geomean_learned_over_vllm_table": {k: geomean(v) for k, v in ratio.items()},
              "range_learned_over_vllm_table": {k: [min(v), max(v)] for k, v in ratio.items()},
              "tpot_better": sum(x < 1.0 for x in ratio["tpot_p50_s"]),
              "ttft_better": sum(x < 1.0 for x in ratio["ttft_p50_s"]),
              "throughput_better": sum(x > 1.0 for x in ratio["tokens_per_s"])}
    (HERE / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(table, HERE / "compare.png")
    print("| window (requests) | table | vllm-table: tok/s / TTFT / TPOT (ms) | retrained: tok/s / TTFT / TPOT (ms) "
          "| TPOT ratio | plain simulator error, vllm-table / retrained: TTFT, TPOT |")
    print("|---|---|---|---|---:|---|")
    for r in table:
        v, t, e = r["vllm_table"], r["learned"], r["simulator_error"]
        seed = Path(r["table"]).parent.name.replace("mixtral_", "")
        print(f"| {r['window']} ({r['requests']}) | {seed} | {v['tokens_per_s']:.1f} / {1e3 * v['ttft_p50_s']:.1f} / "
              f"{1e3 * v['tpot_p50_s']:.2f} | {t['tokens_per_s']:.1f} / {1e3 * t['ttft_p50_s']:.1f} / "
              f"{1e3 * t['tpot_p50_s']:.2f} | {r['learned_over_vllm_table']['tpot_p50_s']:.3f} | "
              f"{100 * e['vllm_table']['ttft_p50_s']:+.1f}%, {100 * e['vllm_table']['tpot_p50_s']:+.1f}% / "
              f"{100 * e['learned']['ttft_p50_s']:+.1f}%, {100 * e['learned']['tpot_p50_s']:+.1f}% |")
    g = result["geomean_learned_over_vllm_table"]
    print(f"\n{len(table)} pairs: retrained / vllm-table geomean tok/s {g['tokens_per_s']:.3f}, TTFT p50 "
          f"{g['ttft_p50_s']:.3f}, TPOT p50 {g['tpot_p50_s']:.3f}; TPOT lower in {result['tpot_better']}, TTFT lower "
          f"in {result['ttft_better']}, throughput higher in {result['throughput_better']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
