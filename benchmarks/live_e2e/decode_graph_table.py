"""The live policies' decode attention as the stack's CUDA graphs run it: the times `run.py --predict --decode-graph`
fits the decode wave model on.

The wave model (kernel_gym/traffic/decode_waves.py) is fitted per config on the dataset's rows, which time one launch
at a time after an L2 flush, with its launch latency. A graphed step replays the layers' launches back to back with
no flush. On the profiled live steps the learned table's 16-split config was priced at 66.7 us per layer where its
kernels took 25.2 us (benchmarks/decode_waves/profile_check.json), so its rows, not the model, set that error. This
script times what the graphs run, at the wave model's fit grid (decode_waves.FIT_BATCHES x FIT_CONTEXTS):

- the plan (CPU, `--plan FILE`): per model, every decode config a live policy chooses at the fit grid's points (the
  chooser run.py's live stack asks), and the points where the family's rules accept it (and its KV fits the cap);
- the timings (GPU, `--out DIR`): per point, `--layers` layers with their own paged caches (the family's inputs, one
  seed a layer), each config checked against the fp32 reference on layer 0 (eagerly and through the replay), the
  layers' launches captured in one graph and replayed without the flush; ms per layer (the median / layers). One JSON
  file, decode_graph.json; a short table last.

    python3 benchmarks/live_e2e/decode_graph_table.py --plan benchmarks/live_e2e/decode_graph_plan.json  # CPU
    python3 benchmarks/live_e2e/decode_graph_table.py --out $OUT/decode_graph                               # GPU
    python3 benchmarks/live_e2e/decode_graph_table.py --plan REST.json --done FIRST/decode_graph.json  # CPU: the rest
    python3 benchmarks/live_e2e/decode_graph_table.py --plan REST.json --out $OUT/rest                 # GPU: time it
    TRITON_INTERPRET=1 python3 benchmarks/live_e2e/decode_graph_table.py --smoke --out /tmp/dgt   # CPU dry run

The GPU mode imports only torch, triton, numpy, the standard library and kernel_gym.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.live_e2e.moe_price_check import (  # noqa: E402
    PLAN_OR_OUT,
    Measurer,
    _gpu_state,
    replayed_layers,
    smoke_measure,
    write_doc,
)
from kernel_gym.traffic.decode_waves import FIT_BATCHES, FIT_CONTEXTS  # noqa: E402

HERE = Path(__file__).resolve().parent
PLAN_PATH = HERE / "decode_graph_plan.json"
OUT_NAME = "decode_graph.json"
RETRAINED = tuple(f"table:benchmarks/live_e2e/tables/mixtral_seed{s}/dispatch_table.json" for s in (0, 1, 2))
MODEL_POLICIES = {"mixtral-8x7b": ("default", "vllm-table", "table:benchmarks/live_replay/inputs/dispatch_table.json",
                                   *RETRAINED),
                  "olmoe-1b-7b": ("default", "vllm-table")}
MAX_KV_TOKENS = 1 << 19  # batch x context per point: a layer's K and V of Mixtral then take 4 GB, x --layers
SMOKE_BATCHES, SMOKE_CONTEXTS = (1, 2, 4), (32, 64)


def log(msg: str) -> None:
    print(f"[decode_graph_table {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def build_plan(model_policies: dict[str, tuple[str, ...]], smoke: bool = False) -> dict:
    """Per model: {config: [[batch, context], ...]}, the fit grid's points where a live policy chooses the config and
    the family's rules accept it there."""
    from dataclasses import asdict

    from benchmarks.live_e2e import run as le
    from kernel_gym.kernels.decode_attention import SPACE
    from kernel_gym.kernels.workloads import DecodeWorkload
    from kernel_gym.models import load_model
    from kernel_gym.traffic import decode_waves as dw

    dtype = "float32" if smoke else "bfloat16"
    batches, contexts = (SMOKE_BATCHES, SMOKE_CONTEXTS) if smoke else (dw.FIT_BATCHES, dw.FIT_CONTEXTS)
    plan: dict[str, Any] = {"batches": list(batches), "contexts": list(contexts), "dtype": dtype,
                            "max_kv_tokens": MAX_KV_TOKENS, "models": {}}
    for name, policies in model_policies.items():
        model = le.TINY if smoke else load_model(name)
        configs: set[str] = set()
        for spec in policies:
            chooser = le.make_chooser(spec, model)
            for b in batches:
                for c in contexts:
                    wl = DecodeWorkload(model.num_heads, model.num_kv_heads, model.head_dim, b, c, dtype)
                    configs.add(str(chooser.choose("decode_attention", wl, le.PAGE)))
        points = {}
        for cfg in sorted(configs):
            from kernel_gym.kernels.space import Config

            parsed = Config.parse(cfg)
            ok = [[b, c] for b in batches for c in contexts if b * c <= MAX_KV_TOKENS
                  and SPACE.is_valid(parsed, DecodeWorkload(model.num_heads, model.num_kv_heads, model.head_dim, b,
                                                            c, dtype))]
            if ok:
                points[cfg] = ok
        plan["models"][model.name] = {"model_spec": asdict(model), "policies": list(policies), "points": points}
        log(f"{model.name}: {len(points)} configs, {sum(len(v) for v in points.values())} points")
    return plan


def time_point(meas: Measurer, family: Any, wl: Any, cfg: Any, layers: int, device: str,
               also_flushed: bool = False, repeats: int = 1) -> dict:
    """One config at one workload: `layers` layers with their own caches, layer 0 checked against the reference
    (eagerly, then through the graph's replay), the launches replayed in one graph without the flush (and, with
    `also_flushed`, after an L2 flush before each replay: replayed_layers).

    `repeats` > 1 builds the layers' caches afresh (new seeds, new allocations) and captures and times a new graph
    each time: two H100 tables of the same plan disagreed by 1.20-1.34x at 4 of 42 points (docs/live.md, session 61),
    more than one timing's spread, so one allocation's graph can sit on either of two speeds. The point's ms (and
    flushed_ms) is then the median over the repeats (the lower middle one for an even count), each repeat's in
    repeat_ms (repeat_flushed_ms), and repeat_ratio says how far apart they fell (slowest / fastest)."""
    runs = []
    for r in range(repeats):
        inputs = [family.make_inputs(wl, device, seed=r * layers + i) for i in range(layers)]
        res = replayed_layers(meas, [family.prepare(x, cfg) for x in inputs], family.reference(inputs[0]), wl.dtype,
                              family, also_flushed)
        if "error" in res:
            return res if r == 0 else {**res, "error": f"repeat {r}: {res['error']}"}
        runs.append(res)
        del inputs
    if repeats == 1:
        return runs[0]
    # the median graph (for an even count the lower middle one: a time one graph ran at, never a mean of two
    # speeds), with its own spread and percentiles
    out = dict(sorted(runs, key=lambda run: run["ms"])[(len(runs) - 1) // 2])
    for key in ("ms", "flushed_ms"):
        if key in runs[0]:
            vals = [run[key] for run in runs]
            out[key] = statistics.median_low(vals)
            out[f"repeat_{key}"] = vals
    out.update(total_ms=out["ms"] * layers, repeats_built=repeats,
               repeat_ratio=max(out["repeat_ms"]) / min(out["repeat_ms"]))
    return out


def drop_done(plan: dict, done: list[Path]) -> tuple[dict, int]:
    """The plan less the points these earlier decode_graph.json tables timed (an error there is timed again), so a
    second GPU command times the rest; run.py --decode-graph reads the tables together. (the plan, points dropped)"""
    timed: set[tuple[str, str, tuple[int, int]]] = set()
    for path in done:
        for name in plan["models"]:
            for cfg, points in (graph_times(path, name) or {}).items():
                timed.update((name, cfg, bc) for bc in points)
    out = json.loads(json.dumps(plan))
    dropped = 0
    for name, entry in out["models"].items():
        for cfg, points in entry["points"].items():
            keep = [p for p in points if (name, cfg, (p[0], p[1])) not in timed]
            dropped += len(points) - len(keep)
            entry["points"][cfg] = keep
    return out, dropped


def served_steps(rows: list[dict]) -> dict[tuple[str, str], int]:
    """Decode steps each (model, config) served in the live runs (live_check.json's rows: run, model, policy), from
    their step records: what a plan cut short should time first."""
    from benchmarks.live_e2e import run as le

    root = Path(__file__).resolve().parents[2]
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        run = root / row["run"].replace("live_e2e/predicted/", "live_e2e/")
        for step in le.read_steps(run, row["policy"]) or []:
            cfg = (step.get("configs") or {}).get("decode_attention")
            if cfg and step.get("decode_batch"):
                counts[(row["model"], cfg)] = counts.get((row["model"], cfg), 0) + 1
    return counts


def rest_plan(plan: dict, done: list[Path], served: dict[tuple[str, str], int], min_steps: int) -> dict:
    """The points `done` has not timed, each model's configs ordered by the live decode steps they served, those
    that served fewer than min_steps left out (so a budget spends itself where the live check prices most)."""
    out, _ = drop_done(plan, done)
    for name, entry in out["models"].items():
        ranked = sorted(((served.get((name, cfg), 0), cfg) for cfg, pts in entry["points"].items() if pts),
                        key=lambda x: -x[0])
        entry["points"] = {cfg: entry["points"][cfg] for n, cfg in ranked if n >= min_steps}
        entry["served_steps"] = {cfg: n for n, cfg in ranked if n >= min_steps}
    out["rest_of"] = {"done": [str(t) for t in done], "min_steps": min_steps}
    return out


def served_plan(runs: list[Path], done: list[Path], batches: tuple[int, ...], contexts: tuple[int, ...],
                min_steps: int = 1) -> dict:
    """Per model: the decode configs today's chooser serves at the recorded decode steps of these live runs (every
    policy, asked as --predict's simulator asks: the batch and the mean context on the memo grid), less those the
    `done` tables time, each at the points of batches x contexts where the family's rules accept it, ordered by the
    steps they serve. A table cell's config moved onto the serving KV layout depends on the step's shape, so configs
    served between the fit grid's points are ones build_plan (the grid's own choices) never meets."""
    from dataclasses import asdict

    from benchmarks.live_e2e import run as le
    from kernel_gym.kernels.decode_attention import SPACE
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import DecodeWorkload
    from kernel_gym.models import load_model

    plan: dict[str, Any] = {"batches": list(batches), "contexts": list(contexts), "dtype": "bfloat16",
                            "max_kv_tokens": MAX_KV_TOKENS, "models": {}, "served_by": [str(r) for r in runs],
                            "rest_of": {"done": [str(t) for t in done]}}
    timed_by_model: dict[str, set[str]] = {}  # the configs the done tables time, read once per model
    for run in runs:
        path = run / "measured.json"
        if not path.exists():
            raise SystemExit(f"--served-by {run}: no measured.json there (a live run's folder)")
        data = json.loads(path.read_text())
        model = load_model(data["meta"]["model"])
        entry = plan["models"].setdefault(model.name, {"model_spec": asdict(model), "policies": [], "points": {},
                                                       "served_steps": {}})
        if model.name not in timed_by_model:
            timed_by_model[model.name] = set().union(*[set(graph_times(t, model.name) or {}) for t in done])
        timed = timed_by_model[model.name]
        for spec in data["measured"]:
            chooser = le.make_chooser(spec, model)
            if spec not in entry["policies"]:
                entry["policies"].append(spec)
            for step in le.read_steps(run, spec) or []:
                if not step.get("decode_batch"):
                    continue
                cfg = le.step_decode_config(chooser, model, step)
                if cfg not in timed:
                    entry["served_steps"][cfg] = entry["served_steps"].get(cfg, 0) + 1
    for name, entry in plan["models"].items():
        m = entry["model_spec"]
        ranked = sorted(((c, n) for c, n in entry["served_steps"].items() if n >= min_steps), key=lambda x: -x[1])
        entry["served_steps"] = dict(ranked)
        for cfg, _ in ranked:
            ok = [[b, c] for b in batches for c in contexts if b * c <= MAX_KV_TOKENS and SPACE.is_valid(
                Config.parse(cfg), DecodeWorkload(m["num_heads"], m["num_kv_heads"], m["head_dim"], b, c, "bfloat16"))]
            if ok:
                entry["points"][cfg] = ok
        log(f"{name}: {len(entry['points'])} configs untimed, {sum(map(len, entry['points'].values()))} points")
    return plan


def run_measure(plan: dict, out_dir: Path, layers: int, budget_s: float, smoke: bool = False,
                also_flushed: bool = False, repeats: int = 1) -> dict:
    import torch

    from kernel_gym.kernels.decode_attention import FAMILY
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import DecodeWorkload

    cuda = torch.cuda.is_available() and not smoke and os.environ.get("TRITON_INTERPRET") != "1"
    if not cuda and not smoke:
        raise SystemExit("no CUDA device (or TRITON_INTERPRET=1): the timings need the GPU; --smoke is the CPU dry run")
    device, dtype = ("cuda", plan["dtype"]) if cuda else ("cpu", "float32")
    meas = Measurer(cuda)
    start = time.monotonic()
    doc: dict[str, Any] = {"meta": {
        "what": "decode_attention (the family's paged launch) for `layers` layers with their own caches in one CUDA "
                "graph, no L2 flush; ms per layer (the graph's median / layers); layer 0 checked against the fp32 "
                "reference first" + ("; flushed_ms: the same graph with the L2 flushed before each replay"
                                     if also_flushed else "")
                + (f"; the median of {repeats} graphs, each over caches built afresh (repeat_ms)" if repeats > 1
                   else ""), "layers": layers, "repeats": repeats, "dtype": dtype, "budget_s": budget_s,
        "device": torch.cuda.get_device_name() if cuda else "cpu-interpreter", "torch": torch.__version__,
        "triton": __import__("triton").__version__, "commit": os.environ.get("KERNEL_GYM_COMMIT"),
        "gpu_before": _gpu_state(cuda)}, "models": {}}
    counts = {name: sum(len(v) for v in entry["points"].values()) for name, entry in plan["models"].items()}
    done_share = 0.0
    for name, entry in plan["models"].items():
        done_share += counts[name] / max(1, sum(counts.values()))  # the budget shared by the models' points
        deadline = start + budget_s * done_share
        spec = entry["model_spec"]
        table: dict[str, dict[str, dict]] = {}
        skipped = 0
        for cfg_text, points in entry["points"].items():
            cfg = Config.parse(cfg_text)
            for b, c in points:
                if time.monotonic() > deadline:
                    skipped += 1
                    continue
                wl = DecodeWorkload(spec["num_heads"], spec["num_kv_heads"], spec["head_dim"], b, c, dtype)
                try:
                    res = time_point(meas, FAMILY, wl, cfg, layers, device, also_flushed, repeats)
                except Exception as exc:  # noqa: BLE001 - one failed point must not lose the others
                    res = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                table.setdefault(cfg_text, {})[f"{b},{c}"] = res
                if cuda:
                    torch.cuda.empty_cache()
        doc["models"][name] = {"policies": entry["policies"], "ms": table, "skipped_points": skipped}
        log(f"{name} done ({time.monotonic() - start:.0f} s so far; {skipped} points skipped by the budget)")
    out_path = write_doc(doc, out_dir / OUT_NAME, start, cuda)
    log(f"wrote {out_path} ({doc['meta']['wall_s']} s)")
    for name, entry in doc["models"].items():
        timed = [r["ms"] for per in entry["ms"].values() for r in per.values() if "ms" in r]
        failed = sum(1 for per in entry["ms"].values() for r in per.values() if "error" in r)
        print(f"{name}: {len(timed)} points timed over {len(entry['ms'])} configs, {failed} failed, "
              f"{entry['skipped_points']} skipped")
        apart = sorted(((r["repeat_ratio"], cfg, pt) for cfg, per in entry["ms"].items() for pt, r in per.items()
                        if "repeat_ratio" in r), reverse=True)
        if apart:
            print(f"  repeats (graphs over fresh caches) slowest / fastest: median "
                  f"{statistics.median(a for a, _, _ in apart):.3f}, max {apart[0][0]:.3f} at {apart[0][2]}; "
                  f"{sum(a > 1.1 for a, _, _ in apart)} of {len(apart)} points beyond 1.10")
    return doc


def graph_times(path: Path | str, model: str, key: str = "ms") -> dict[str, dict[tuple[int, int], float]] | None:
    """A decode_graph.json's timed points of one model: {config: {(batch, context): seconds}}, or None. `key`:
    "flushed_ms" for the times after an L2 flush (--also-flushed), where the table has them."""
    doc = json.loads(Path(path).read_text())
    entry = doc.get("models", {}).get(model)
    if entry is None:
        return None
    out: dict[str, dict[tuple[int, int], float]] = {}
    for cfg, per in entry["ms"].items():
        for point, res in per.items():
            if key in res:
                b, c = (int(x) for x in point.split(","))
                out.setdefault(cfg, {})[(b, c)] = res[key] * 1e-3
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plan", type=Path, default=None,
                   help="without --out: write the plan here (CPU); with --out: the plan to read (default: the "
                        "committed benchmarks/live_e2e/decode_graph_plan.json)")
    p.add_argument("--out", type=Path, default=None, help="GPU: time the plan, write DIR/decode_graph.json")
    p.add_argument("--layers", type=int, default=4, help="layers with their own caches captured back to back")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="GPU: start no new point after this many seconds (shared by the models' point counts)")
    p.add_argument("--done", default="", metavar="TABLE.json[,...]",
                   help="skip the points these earlier decode_graph.json tables timed (the rest of a plan a budget "
                        "cut short). GPU: time the rest; CPU (--plan OUT without --out): write the rest of the "
                        "committed plan, configs ordered by the live decode steps they served (--min-steps)")
    p.add_argument("--min-steps", type=int, default=100,
                   help="--done or --served-by on the CPU: leave out configs that served fewer live decode steps than "
                        "this")
    p.add_argument("--served-by", default="", metavar="RUN[,RUN]",
                   help="CPU, with --plan OUT: plan the configs today's chooser serves at these live runs' decode "
                        "steps that the --done tables do not time (served_plan)")
    p.add_argument("--batches", default=",".join(map(str, FIT_BATCHES)), help="--served-by: the batches to time")
    p.add_argument("--contexts", default=",".join(map(str, FIT_CONTEXTS)), help="--served-by: the contexts to time")
    p.add_argument("--also-flushed", action="store_true",
                   help="GPU: time each point's graph again with the L2 flushed before each replay (flushed_ms): "
                        "a live step reads each layer's KV once, after the MoE streamed its weights through L2")
    p.add_argument("--repeats", type=int, default=1,
                   help="GPU: build each point's caches and graph this many times (fresh allocations) and keep the "
                        "median; repeat_ms keeps each, to tell a bistable point from a noisy one")
    p.add_argument("--smoke", action="store_true",
                   help="CPU dry run under TRITON_INTERPRET=1: the tiny model's plan, wall clocks")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: give 1 or more (graphs per point)")
    if args.smoke:
        return smoke_measure(p, args, lambda: build_plan({"tiny-moe": ("default", MODEL_POLICIES["mixtral-8x7b"][2])},
                                                         smoke=True),
                             lambda *a, **k: run_measure(*a, **k, repeats=args.repeats))
    done = [Path(t) for t in args.done.split(",") if t]
    missing = [str(t) for t in done if not t.exists()]
    if missing:
        raise SystemExit(f"--done {','.join(missing)}: no such file (earlier decode_graph.json tables)")
    if args.out is None:
        if args.plan is None:
            p.error(PLAN_OR_OUT)
        if args.served_by:
            plan = served_plan([Path(r) for r in args.served_by.split(",")], done,
                               tuple(int(x) for x in args.batches.split(",")),
                               tuple(int(x) for x in args.contexts.split(",")), args.min_steps)
            args.plan.write_text(json.dumps(plan, indent=1) + "\n")
            log(f"wrote {args.plan}")
            return 0
        if done:
            if args.plan.resolve() == PLAN_PATH.resolve():
                p.error(f"--done writes the rest of {PLAN_PATH.name} to --plan: give another path, not the plan itself")
            check = json.loads((Path(__file__).resolve().parents[2] / "kernel_gym" / "data" / "live_check.json")
                               .read_text())
            plan = rest_plan(json.loads(PLAN_PATH.read_text()), done, served_steps(check["rows"]), args.min_steps)
            args.plan.write_text(json.dumps(plan, indent=1) + "\n")
            log(f"wrote {args.plan}: " + ", ".join(f"{m} {sum(map(len, e['points'].values()))} points"
                                                  for m, e in plan["models"].items()))
            return 0
        args.plan.write_text(json.dumps(build_plan(MODEL_POLICIES), indent=1) + "\n")
        log(f"wrote {args.plan}")
        return 0
    path = args.plan or PLAN_PATH
    if not path.exists():
        raise SystemExit(f"{path}: no plan; write one on the CPU first (--plan {path})")
    plan = json.loads(path.read_text())
    if done:
        plan, dropped = drop_done(plan, done)
        left = sum(len(v) for e in plan["models"].values() for v in e["points"].values())
        log(f"--done: {dropped} points already timed, {left} left")
    run_measure(plan, args.out, args.layers, args.budget_s, also_flushed=args.also_flushed,
                repeats=args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
