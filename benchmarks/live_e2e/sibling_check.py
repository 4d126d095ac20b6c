"""How close the price of an untimed decode config comes when its nearest timed sibling stands in, on the H200's
own times.

A dispatch table can serve a decode config that neither the dataset nor the decode graph table times (a learned
table's config moved onto the serving KV layout keeps knobs such as KV_TMA or COMBINE that nothing timed on those
pages). The simulator prices such a choice with the wave model fitted on its nearest timed sibling: the same config
with some later-added knobs set otherwise (KnobSpace.later_knob_siblings), which leaves the grid of programs as it
is (Simulator._sibling_fit). Before, it charged the family default's time. This check leaves each config the decode
graph tables time out in turn, prices its measured points from its nearest sibling's fit, and sets that price
beside the config's own measured time, and beside the default config's time at the same point in the same tables
(what the fallback charged, though the simulator took it from the dataset's row at the batch's mean context). Only
siblings these tables time are tried; the simulator also fits a sibling on the dataset's rows. CPU only, from the
committed tables.

    python benchmarks/live_e2e/sibling_check.py            # sibling_check.json beside this file; a table last
    python benchmarks/live_e2e/sibling_check.py --tables A.json,B.json --out FILE
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from benchmarks.live_e2e.decode_graph_table import graph_times  # noqa: E402
from benchmarks.live_e2e.run import DECODE_GRAPH_TABLES  # noqa: E402


def merged_times(tables: list[Path], model: str) -> dict[str, dict[tuple[int, int], float]]:
    """{config: {(batch, context): seconds}} over the tables that time `model` (later tables add points)."""
    out: dict[str, dict[tuple[int, int], float]] = {}
    for t in tables:
        for cfg, points in (graph_times(t, model) or {}).items():
            out.setdefault(cfg, {}).update(points)
    return out


def check_model(times: dict[str, dict[tuple[int, int], float]], model_name: str) -> list[dict]:
    """Per timed config with a timed sibling: its points priced from the nearest sibling's wave fit, over its own
    measured seconds, and the default config's measured seconds at the same points over its own."""
    from kernel_gym.kernels.decode_attention import FAMILY, SPACE, program_rounds
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import DecodeWorkload
    from kernel_gym.models import load_model
    from kernel_gym.traffic import decode_waves

    m = load_model(model_name)

    def workload(b: int, c: int) -> DecodeWorkload:
        return DecodeWorkload(m.num_heads, m.num_kv_heads, m.head_dim, b, c)

    def rounds(cfg: Config, b: int, c: int) -> list[list[int]]:
        return program_rounds(workload(b, c).context_lens(), cfg, m.num_heads, m.num_kv_heads)

    fits: dict[str, object] = {}

    def fit_of(key: str):
        if key not in fits:
            pts, cfg = times[key], Config(json.loads(key))
            fits[key] = decode_waves.fit(lambda b, c: pts.get((b, c)), lambda b, c: rounds(cfg, b, c))
        return fits[key]

    rows = []
    for key, points in sorted(times.items()):
        cfg = Config(json.loads(key))
        sibling = next((str(s) for s in SPACE.later_knob_siblings(cfg) if str(s) in times and fit_of(str(s))), None)
        if sibling is None:
            continue
        fit = fit_of(sibling)
        ratios, before = [], []
        for (b, c), s in sorted(points.items()):
            ratios.append(fit.seconds(rounds(cfg, b, c)) / s)
            default = times.get(str(FAMILY.default_config(workload(b, c))), {}).get((b, c))
            if default is not None:
                before.append(default / s)
        rows.append({"config": key, "sibling": sibling, "points": len(ratios),
                     "sibling_price_over_measured": _spread(ratios),
                     "default_time_over_measured": _spread(before) if before else None})
    return rows


def _spread(xs: list[float]) -> dict:
    a = np.asarray(xs)
    return {"median": float(np.median(a)), "p10": float(np.percentile(a, 10)), "p90": float(np.percentile(a, 90)),
            "min": float(a.min()), "max": float(a.max())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", default=",".join(str(t) for t in DECODE_GRAPH_TABLES), metavar="TABLE.json[,...]",
                   help="decode_graph_table.py tables (default: the ones run.py --predict reads)")
    p.add_argument("--out", type=Path, default=HERE / "sibling_check.json")
    args = p.parse_args(argv)
    from kernel_gym.train.tracking import git_commit

    tables = [Path(t) for t in args.tables.split(",") if t]
    missing = [str(t) for t in tables if not t.exists()]
    if missing:
        raise SystemExit(f"--tables: no such file {', '.join(missing)} (decode_graph_table.py's decode_graph.json)")
    models = sorted({m for t in tables for m in json.loads(t.read_text()).get("models", {})})
    root = HERE.parents[1]
    shown = [t.resolve().relative_to(root).as_posix() if t.resolve().is_relative_to(root) else str(t) for t in tables]
    doc = {"what": "each decode config the tables time, priced from its nearest timed sibling's wave fit (as the "
                   "simulator prices a choice nothing times) over its own measured seconds; and the default config's "
                   "measured seconds over it (the charge before)",
           "commit": git_commit(), "tables": shown,
           # a CPU check of GPU times: each table's GPU and clock state when it was timed, as its meta recorded them
           "timed_on": {name: {k: json.loads(t.read_text())["meta"].get(k)
                               for k in ("device", "gpu_before", "gpu_after")} for name, t in zip(shown, tables)},
           "models": {m: check_model(merged_times(tables, m), m) for m in models}}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    print("| model | config (its later knobs) | sibling's | points | sibling price / measured, median (p10-p90) | "
          "default's time / measured, median |")
    print("|---|---|---|---:|---|---|")
    from kernel_gym.kernels.decode_attention import SPACE

    later = [k.name for k in SPACE.knobs if k.legacy is not None]
    for m, rows in doc["models"].items():
        for r in rows:
            own, sib = json.loads(r["config"]), json.loads(r["sibling"])
            tag = (f"S{own['NUM_SPLITS']} BN{own['BLOCK_N']} G{own['GQA_GROUPED']} "
                   + (" ".join(k for k in later if own.get(k)) or "-"))
            q, d = r["sibling_price_over_measured"], r["default_time_over_measured"]
            print(f"| {m} | {tag} | {' '.join(k for k in later if sib.get(k)) or '-'} | {r['points']} | "
                  f"{q['median']:.3f} ({q['p10']:.3f}-{q['p90']:.3f}) | "
                  f"{'-' if d is None else format(d['median'], '.2f')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
