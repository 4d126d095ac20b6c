"""Where a policy's decode price is off, by decode batch: each predicted live run's decode-only steps, their summed
price over their summed measured seconds by band of decode batch (run.py's step_check `by_decode_batch`; the bands
are the stack's CUDA graph capture sizes), gathered per model and kind of policy over every predicted run.

A TPOT error is the end of a chain: the steps' prices, then the scheduling that turns them into per-request times. A
price that is right on average can still be off at one capture size, which the summed decode-only error hides and
the TPOT p50 does not (a request's tokens come mostly from the busier steps). One band off in every run of a policy
names the part to re-time; a band off in a few runs names those runs. CPU only, from the committed summaries.

`--profiled RUN` (a run with `--profile-every` steps) also prices that run's profiled decode-only steps again
(run.priced_steps) and sets, per band, each part's price beside its profiled kernel time (the profile of the same
step's graph replay where the run has it: each part's kernels with the gaps before them; else of its eager launch:
the kernels' durations, gaps left out) and the step's measured seconds beside its busy kernel time. `--profiles RUN`
sets a run's two profiles of each step, eager and graph replay, side by side (no prices: any GPU's run answers it).
`--tables DIR` prices the profiled steps from the tables one machine timed beside its run (same_gpu_session.sh), so
a part's price and its kernels come from the same GPU: a check of the tables' method, whichever GPU ran it.

    python benchmarks/live_e2e/band_check.py    # band_check.json and band_check.png beside this file; a table last
    python benchmarks/live_e2e/band_check.py --profiled benchmarks/live_e2e/graph_5ebaec4/window1_spans  # ~1 minute
    python benchmarks/live_e2e/band_check.py --profiles RUN --out FILE   # a run's eager and graph profiles side by side
    python benchmarks/live_e2e/band_check.py --profiled RUN --tables DIR --out FILE  # priced from DIR's tables
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from benchmarks.live_e2e.run import BATCH_BANDS, band_name  # noqa: E402

PREDICTED = HERE / "predicted"


def policy_group(spec: str) -> str:
    """default / vllm-table / learned table (every `table:` policy, whichever seed or retraining)."""
    return "learned table" if spec.startswith("table:") else spec


def gather(predicted: Path = PREDICTED) -> dict:
    """{"<model> <policy group>": {band: {runs, steps, median, min, max, by_run: {run policy: sum_error}}}} over the
    decode-only steps of every summary under `predicted` that has a step check."""
    groups: dict[str, dict[str, dict]] = {}
    for path in sorted(predicted.rglob("summary.json")):
        summary = json.loads(path.read_text())
        run = path.parent.relative_to(predicted).as_posix()
        for spec, check in (summary.get("step_check") or {}).items():
            bands = (check.get("decode_only") or {}).get("by_decode_batch")
            if not bands:
                continue
            group = groups.setdefault(f"{summary['meta']['model']} {policy_group(spec)}", {})
            for band, v in bands.items():
                cell = group.setdefault(band, {"steps": 0, "by_run": {}})
                cell["steps"] += v["steps"]
                cell["by_run"][f"{run} {spec}"] = v["sum_error"]
    order = [band_name(lo, hi) for lo, hi in BATCH_BANDS]
    out: dict[str, dict[str, dict]] = {}
    for name, group in sorted(groups.items()):
        out[name] = {}
        for band in sorted(group, key=order.index):
            errors = np.array(list(group[band]["by_run"].values()))
            out[name][band] = {"runs": len(errors), "steps": group[band]["steps"], "median": float(np.median(errors)),
                               "min": float(errors.min()), "max": float(errors.max()), "by_run": group[band]["by_run"]}
    return out


def table_args(tables: Path | None, ragged: Path | None = None, flushed: bool = False) -> list[str]:
    """run.py --predict's options that price a graphed decode step's three parts from one machine's tables
    (same_gpu_session.sh's layout: dense_ops.json, moe_graph/moe_graph.json, decode_graph/decode_graph.json);
    [] for the committed H200 tables (run.py's defaults). `ragged`: a ragged_decode.py table (--decode-ragged)."""
    extra = (["--decode-ragged", str(ragged)] if ragged is not None else []) \
        + (["--decode-graph-times", "flushed"] if flushed else [])
    if tables is None:
        return extra
    paths = {"--dense-ops": tables / "dense_ops.json", "--moe-graph": tables / "moe_graph" / "moe_graph.json",
             "--decode-graph": tables / "decode_graph" / "decode_graph.json"}
    missing = [str(v) for v in paths.values() if not v.exists()]
    if missing:
        raise SystemExit(f"--tables {tables}: no {', '.join(missing)} (same_gpu_session.sh writes all three)")
    # the tables of steps with prefill chunks and of eager steps are the H200's: off (decode-only steps never read them)
    off = ["--moe-eager", "none", "--moe-chunk", "none", "--dense-eager", "none"]
    return [x for k, v in paths.items() for x in (k, str(v))] + off + extra


def profiled_parts(run: Path, tables: Path | None = None, ragged: Path | None = None, flushed: bool = False) -> dict:
    """{policy: {band: {steps, graph_profiled, measured_step_ms, busy_ms, parts: {part: {priced_ms, measured_ms}},
    dense_and_moe}}} per step (means) over the profiled decode-only steps of `run`, priced as `run.py --predict` prices
    them, measured from the profile of each step's graph replay where it has one (`graph_profiled` steps: each part's
    kernels with the gaps before them, run.part_spans_us), else of its eager launch (`run.py --profile-every`: the
    kernels' durations). The MoE's price holds its routing (the graph table times the launch with the routing inside),
    so fused_moe's measured time here is the MoE kernels' plus the routing's; `dense_and_moe` sums the two parts (a
    profile by kernel name alone counts the MoE call's elementwise kernels as dense: then only the sum compares like
    with like; profiles from session 57 on also place them by position, run.call_parts, which this prefers). `tables`,
    `ragged`: price from that machine's tables (table_args), not the H200's."""
    from benchmarks.live_e2e import run as le

    args = le.build_parser().parse_args(["--out", str(run), "--predict", *table_args(tables, ragged, flushed)])
    data, meta, model, trace, backend, timer, _ = le.predict_setup(args)
    out: dict[str, dict] = {}
    for spec, measured in data["measured"].items():
        priced = le.priced_steps(run, spec, model, trace, timer, backend, args, meta,
                                 issue_s=le.policy_issue_s(args, measured)[0])
        # a step's graph replay profiled (runs after tree 380bf90) is what the graph ran; else its eager launch
        records = le.read_steps(run, spec) or []
        rows = [(*r[:6], *((rec["kernels_graph"], True) if "by_part_us" in (rec.get("kernels_graph") or {})
                           else (r[6], False))) for r, rec in zip(priced, records)]
        rows = [r for r in rows if not r[1] and r[6] and "by_part_us" in r[6]]
        for lo, hi in BATCH_BANDS:
            band = [r for r in rows if lo <= r[4] <= hi]
            if not band:
                continue
            parts: dict[str, dict[str, float]] = {}
            for r in band:
                # a graph replay's parts with the gaps before their kernels (run.part_spans_us), as the graph-timed
                # tables price them; an eager launch's durations alone (its gaps are the host's)
                # parts by each kernel's place in the step (run.call_parts: the MoE call's own elementwise kernels with
                # the MoE) where the profile has them (runs from session 57 on), else by kernel name
                prof = r[6]
                graphed = r[7] and "by_part_span_us" in prof
                kernels = dict((prof.get("by_call_span_us") or prof["by_part_span_us"]) if graphed
                               else (prof.get("by_call_us") or prof["by_part_us"]))
                kernels["fused_moe"] = kernels.get("fused_moe", 0.0) + kernels.pop("moe_routing", 0.0)
                for part in sorted(set(kernels) | set(r[5])):
                    cell = parts.setdefault(part, {"priced_ms": 0.0, "measured_ms": 0.0})
                    cell["priced_ms"] += 1e3 * r[5].get(part, 0.0) / len(band)
                    cell["measured_ms"] += 1e-3 * kernels.get(part, 0.0) / len(band)
            # the MoE call's own torch kernels (its routing's elementwise, index, fill and copy ops on the GPU) carry
            # no routing word in their names: a profile by name alone (runs before session 57) counts them as dense
            # ops, so the two parts' split is off by them; their sum is not
            both = {k: sum(parts.get(p, {}).get(k, 0.0) for p in ("dense", "fused_moe"))
                    for k in ("priced_ms", "measured_ms")}
            out.setdefault(spec, {})[band_name(lo, hi)] = {
                "steps": len(band), "graph_profiled": sum(r[7] for r in band),
                "measured_step_ms": 1e3 * float(np.mean([r[2] for r in band])),
                "busy_ms": 1e-3 * float(np.mean([r[6]["busy_us"] for r in band])), "parts": parts,
                "dense_and_moe": both}
    return out


def profile_pairs(run: Path) -> dict:
    """{policy: {band: {steps, measured_step_ms, eager_busy_ms, graph_busy_ms, graph_wall_ms, parts: {part:
    {eager_ms, graph_ms, graph_span_ms}}}}} (means per step) over the decode-only steps of `run` profiled both ways
    (`kernels` and `kernels_graph`): whether a graph replay runs each part's kernels as long as the eager launch does,
    and how much of the replay's wall time lies between them. No prices: any GPU's run answers it."""
    from benchmarks.live_e2e import run as le

    measured = json.loads((run / "measured.json").read_text())["measured"]
    out: dict[str, dict] = {}
    for spec in measured:
        steps = [r for r in le.read_steps(run, spec) or [] if not r["chunks"]
                 and "by_part_us" in (r.get("kernels") or {}) and "by_part_span_us" in (r.get("kernels_graph") or {})]
        for lo, hi in BATCH_BANDS:
            band = [r for r in steps if lo <= r["decode_batch"] <= hi]
            if not band:
                continue
            parts: dict[str, dict[str, float]] = {}
            for r in band:
                eager, graph = r["kernels"]["by_part_us"], r["kernels_graph"]
                for part in sorted(set(eager) | set(graph["by_part_us"])):
                    cell = parts.setdefault(part, {"eager_ms": 0.0, "graph_ms": 0.0, "graph_span_ms": 0.0})
                    cell["eager_ms"] += 1e-3 * eager.get(part, 0.0) / len(band)
                    cell["graph_ms"] += 1e-3 * graph["by_part_us"].get(part, 0.0) / len(band)
                    cell["graph_span_ms"] += 1e-3 * graph["by_part_span_us"].get(part, 0.0) / len(band)
            out.setdefault(spec, {})[band_name(lo, hi)] = {
                "steps": len(band), "measured_step_ms": 1e3 * float(np.mean([r["seconds"] for r in band])),
                "eager_busy_ms": 1e-3 * float(np.mean([r["kernels"]["busy_us"] for r in band])),
                "graph_busy_ms": 1e-3 * float(np.mean([r["kernels_graph"]["busy_us"] for r in band])),
                "graph_wall_ms": 1e-3 * float(np.mean([sum(r["kernels_graph"]["by_part_span_us"].values())
                                                       for r in band])), "parts": parts}
    return out


def run_clocks(run: Path) -> dict:
    """The run's GPU and each policy's clock and power state before and after it (measured.json), to keep beside
    figures drawn from its profiles: an absolute kernel time means little without them."""
    data = json.loads((run / "measured.json").read_text())
    return {"device": data["meta"].get("device"),
            "policies": {spec: {k: m.get(k) for k in ("gpu_before", "gpu_after")}
                         for spec, m in data["measured"].items()}}


def plot(groups: dict, path: Path) -> Path:
    """One panel per model: per policy group, the median decode-only error by band with the runs' range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({g.split(" ")[0] for g in groups})
    order = [band_name(lo, hi) for lo, hi in BATCH_BANDS if lo > 0]  # decode-only steps have a decode batch
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = {g: v for g, v in groups.items() if g.startswith(model + " ")}
        for k, (name, bands) in enumerate(sorted(mine.items())):
            xs = [order.index(b) + 0.12 * (k - (len(mine) - 1) / 2) for b in bands]
            med = [100 * v["median"] for v in bands.values()]
            lo = [100 * (v["median"] - v["min"]) for v in bands.values()]
            hi = [100 * (v["max"] - v["median"]) for v in bands.values()]
            ax.errorbar(xs, med, yerr=[lo, hi], fmt="o-", capsize=3, lw=1, ms=4, label=name[len(model) + 1:])
        ax.axhspan(-5, 5, color="0.9", zorder=0)
        ax.axhline(0.0, color="0.5", lw=0.8)
        ax.set_xticks(range(len(order)), order, fontsize=8)
        ax.set_xlabel("decode batch (graph capture sizes)")
        ax.set_ylabel("decode-only steps: price / measured - 1, %")
        ax.set_title(f"{model}: median over runs, bars the runs' range", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _name(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(HERE.parents[1]) if path.is_relative_to(HERE.parents[1]) else path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--predicted", type=Path, default=PREDICTED, help="the predicted summaries (predict_all.sh's)")
    p.add_argument("--out", type=Path, default=HERE / "band_check.json")
    p.add_argument("--profiled", type=Path, metavar="RUN",
                   help="also each part's price beside its profiled kernel time by band on this run's profiled steps")
    p.add_argument("--tables", type=Path, metavar="DIR",
                   help="with --profiled: price from the tables one machine timed beside its run (same_gpu_session.sh "
                        "folder), not the committed H200 tables")
    p.add_argument("--ragged", type=Path, metavar="TABLE.json",
                   help="with --profiled: also run.py --decode-ragged TABLE.json (a ragged_decode.py table)")
    p.add_argument("--flushed", action="store_true",
                   help="with --profiled: fit the decode wave model on the tables' times after an L2 flush (run.py "
                        "--decode-graph-times flushed; tables timed with decode_graph_table.py --also-flushed)")
    p.add_argument("--profiles", type=Path, metavar="RUN",
                   help="only set the eager and the graph replay profiles of RUN's steps side by side, by band "
                        "(written to --out; no prices)")
    args = p.parse_args(argv)
    if (args.tables or args.ragged or args.flushed) and not args.profiled:
        p.error("--tables, --ragged and --flushed price a profiled run: give --profiled RUN with them")
    if args.profiles:
        pairs = profile_pairs(args.profiles)
        if not pairs:
            raise SystemExit(f"{args.profiles}: no decode-only step profiled both ways (run.py --profile-every N on a "
                             "tree from 380bf90 on, with CUDA graphs)")
        args.out.write_text(json.dumps({"what": profile_pairs.__doc__.splitlines()[0], "run": _name(args.profiles),
                                        "clocks": run_clocks(args.profiles), "policies": pairs}, indent=1) + "\n")
        for spec, bands in pairs.items():
            for b, c in bands.items():
                print(f"{spec[:24]:24s} {b:6s} {c['steps']:3d} steps: step {c['measured_step_ms']:.2f} ms, replay wall "
                      f"{c['graph_wall_ms']:.2f}, busy graph {c['graph_busy_ms']:.2f} / eager {c['eager_busy_ms']:.2f}:"
                      " "
                      "graph / eager ms "
                      + " ".join(f"{part} {v['graph_ms'] / v['eager_ms']:.2f}" for part, v in sorted(c["parts"].items())
                                 if v["eager_ms"] > 0))
        return 0
    groups = gather(args.predicted)
    if not groups:
        raise SystemExit(f"no step check with decode bands under {args.predicted}: run predict_all.sh first")
    doc = {"what": __doc__.splitlines()[0], "source": _name(args.predicted),
           "clocks": "each run's and policy's gpu_before / gpu_after: its summary.json under the source",
           "groups": groups}
    if args.profiled:
        doc["profiled"] = {"run": _name(args.profiled), "clocks": run_clocks(args.profiled),
                           "tables": _name(args.tables) if args.tables else "the committed H200 tables",
                           "decode_ragged": _name(args.ragged) if args.ragged else None,
                           "decode_graph_times": "flushed" if args.flushed else "unflushed",
                           "policies": profiled_parts(args.profiled, args.tables, args.ragged, args.flushed)}
        for spec, bands in doc["profiled"]["policies"].items():
            print(f"profiled {spec[:40]}: " + "; ".join(
                f"{b} " + " ".join(f"{part} {v['priced_ms'] / v['measured_ms']:.2f}" for part, v in sorted(
                    {**cell["parts"], "dense+moe": cell["dense_and_moe"]}.items()) if v["measured_ms"] > 0)
                for b, cell in bands.items()))
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    png = plot(groups, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {png}")
    for name, bands in groups.items():
        print(f"{name}: " + ", ".join(f"{b} {100 * v['median']:+.1f}% ({v['runs']})" for b, v in bands.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
