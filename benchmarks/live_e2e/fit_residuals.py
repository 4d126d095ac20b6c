"""How far the decode wave model's line lies from the graph table's own times at the points it is fitted on.

Per config of the committed decode graph tables (run.DECODE_GRAPH_TABLES, or --tables), decode_waves.fit on the
table's points as run.py --predict fits it, then the line's price / the table's time - 1 at each point, one row per
batch, one column per context (docs/live.md, session 61: the points at small batches and contexts lie below the line).
CPU only, a few seconds. `--flush-ratios TABLE` prints instead, per config and point of a table timed with
decode_graph_table.py --also-flushed, its time after an L2 flush over its time without (the points below the line are
the ones whose layers' KV stays in L2 between the table's replays). `--repeats TABLE` prints, for a table timed with
decode_graph_table.py --repeats N, each point's slowest / fastest repeat, and each --tables table's time over its median
(which of a bistable point's two speeds an earlier table timed once held).

    python benchmarks/live_e2e/fit_residuals.py --model mixtral-8x7b
    python benchmarks/live_e2e/fit_residuals.py --flush-ratios \
        benchmarks/live_e2e/l2_check_h100_b57c3d4/l2_check/decode_graph.json
    python benchmarks/live_e2e/fit_residuals.py --model olmoe-1b-7b \
        --repeats benchmarks/live_e2e/repeats_h100_51b9504/decode_graph/decode_graph.json \
        --tables benchmarks/live_e2e/flushed_h100_b765fd9/decode_graph/decode_graph.json,\
benchmarks/live_e2e/same_gpu_h100_8868229/decode_graph/decode_graph.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from benchmarks.live_e2e.decode_graph_table import graph_times  # noqa: E402
from benchmarks.live_e2e.run import DECODE_GRAPH_TABLES  # noqa: E402


def residuals(model_name: str, tables: list[Path]) -> dict[str, dict]:
    """{config: {"slots", "median_error", "by_point": {(batch, context): line / table - 1}}} (None: no fit)."""
    from kernel_gym.kernels.decode_attention import program_rounds
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import DecodeWorkload
    from kernel_gym.models import load_model
    from kernel_gym.traffic import decode_waves

    m = load_model(model_name)
    times: dict[str, dict[tuple[int, int], float]] = {}
    for t in tables:
        for cfg, points in (graph_times(t, model_name) or {}).items():
            times.setdefault(cfg, {}).update(points)
    out: dict[str, dict] = {}
    for key, points in sorted(times.items()):
        cfg = Config(json.loads(key))

        def rounds(b: int, c: int, cfg: Config = cfg) -> list[list[int]]:
            wl = DecodeWorkload(m.num_heads, m.num_kv_heads, m.head_dim, b, c)
            return program_rounds(wl.context_lens(), cfg, m.num_heads, m.num_kv_heads)

        fit = decode_waves.fit(lambda b, c, pts=points: pts.get((b, c)), rounds)
        out[key] = None if fit is None else {
            "slots": fit.slots, "median_error": fit.median_error,
            "by_point": {p: fit.seconds(rounds(*p)) / t - 1 for p, t in sorted(points.items())}}
    return out


def flush_ratios(table: Path, model_name: str) -> dict[str, dict[tuple[int, int], float]]:
    """{config: {(batch, context): flushed time / unflushed time}} over the points that have both."""
    plain, flushed = graph_times(table, model_name) or {}, graph_times(table, model_name, key="flushed_ms") or {}
    return {cfg: {p: flushed[cfg][p] / t for p, t in sorted(pts.items()) if p in flushed.get(cfg, {})}
            for cfg, pts in plain.items() if cfg in flushed}


def repeat_spreads(table: Path, model_name: str) -> dict[str, dict[tuple[int, int], float]]:
    """{config: {(batch, context): slowest / fastest repeat}} of a table timed with --repeats N (N > 1)."""
    doc = json.loads(Path(table).read_text())
    out: dict[str, dict[tuple[int, int], float]] = {}
    for cfg, per in doc.get("models", {}).get(model_name, {}).get("ms", {}).items():
        for point, res in per.items():
            if "repeat_ratio" in res:
                b, c = (int(x) for x in point.split(","))
                out.setdefault(cfg, {})[(b, c)] = res["repeat_ratio"]
    return out


def _print_grid(by_point: dict[tuple[int, int], float], fmt: str) -> None:
    contexts = sorted({c for _, c in by_point})
    print("   batch / context " + " ".join(f"{c:>7d}" for c in contexts))
    for b in sorted({b for b, _ in by_point}):
        print(f"   batch {b:4d}:       " + " ".join(format(by_point[(b, c)], fmt) if (b, c) in by_point else "      -"
                                                for c in contexts))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mixtral-8x7b")
    p.add_argument("--tables", default=",".join(str(t) for t in DECODE_GRAPH_TABLES),
                   help="decode_graph_table.py tables, comma-separated (default: the committed ones)")
    p.add_argument("--flush-ratios", type=Path, default=None, metavar="TABLE.json",
                   help="print a --also-flushed table's flushed / unflushed times instead")
    p.add_argument("--repeats", type=Path, default=None, metavar="TABLE.json",
                   help="print a --repeats table's slowest / fastest repeat per point, and each --tables table's time "
                        "over its median")
    args = p.parse_args(argv)
    if args.repeats is not None:
        median = graph_times(args.repeats, args.model) or {}
        for cfg, by_point in repeat_spreads(args.repeats, args.model).items():
            print(f"{cfg}\n   slowest / fastest of the repeats (fresh allocations):")
            _print_grid(by_point, "7.3f")
            for t in [Path(t) for t in args.tables.split(",") if t]:
                other = (graph_times(t, args.model) or {}).get(cfg, {})
                ratio = {pt: other[pt] / v for pt, v in median.get(cfg, {}).items() if pt in other}
                if ratio:
                    print(f"   {t}: its time / the repeats' median:")
                    _print_grid(ratio, "7.3f")
        return 0
    if args.flush_ratios is not None:
        for cfg, by_point in flush_ratios(args.flush_ratios, args.model).items():
            print(f"{cfg}\n   time after an L2 flush / time without:")
            _print_grid(by_point, "7.3f")
        return 0
    res = residuals(args.model, [Path(t) for t in args.tables.split(",")])
    for key, r in res.items():
        print(key)
        if r is None:
            print("   no fit (too few points, or the line misses them by more than decode_waves.MAX_FIT_ERROR)")
            continue
        contexts = sorted({c for _, c in r["by_point"]})
        print(f"   slots {r['slots']}, median error {r['median_error']:.3f}; line / table - 1 by batch, contexts "
              + " ".join(str(c) for c in contexts))
        for b in sorted({b for b, _ in r["by_point"]}):
            print(f"   batch {b:4d}: " + " ".join(f"{r['by_point'][(b, c)]:+.3f}" if (b, c) in r["by_point"]
                                                 else "     -" for c in contexts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
