"""The re-optimisation cycle on recorded traffic that shifts (CPU, recorded H200 times): benchmarks/cycle.json.

Scenarios are consecutive windows of the real traces (Azure code / conversation, Mooncake), chosen so that the
traffic shifts between them: code then conversation, short then long contexts (conversation then Mooncake), uniform
then skewed routing (Zipf 1.2 from the second window on: no public trace records per-expert loads, so the routing is
a synthetic profile and the expert counts the cycle reads are drawn from it). For each model and scenario the
deployment starts from the engine's own file (vLLM's shipped H200 table; where vLLM ships none, a table tuned at
uniform routing at its M keys from the recorded rows, since vLLM's default rule is not among the measured configs)
without a stored profile. Per window:

1. the window is replayed through the serving simulator (config-blind roofline kernel times, as the cycle's own
   profile simulation) under its routing; what vLLM would have recorded is written: two Prometheus scrapes (start,
   end) of `vllm:iteration_tokens_total` (vLLM's buckets), the prompt / generation histograms and the gauges, and a
   per-expert count file (EPLB-style JSON) from the routing profile's loads;
2. `kernel-gym cycle --install --no-mlflow` runs on those files (no GPU: the zero-shot re-plan, exit 11 when it
   proposes a change, 0 when nothing moved or nothing beats the current entries);
3. scores on the window's exact per-step M and the routing profile's true skew, all priced with the same recorded
   times (cycle.Pricer): `kept` = the first window's files (after its cycle), `cycled` = the files after this
   window's cycle, `lagged` = the files before it (what served the window when the cycle runs at its end), `oracle` =
   the per-M best recorded config (an upper bound no file with fixed keys can beat). Ratios are oracle time / time.
   Goodput: tokens/s of the window replayed with each file's MoE times (other kernels at roofline).

`gpu_s` is 0 (no GPU here); `gpu_s_estimate` is what `--gpu` would spend on the moved keys (top-k + 1 configs each:
0.27 s compile + 15 swept samples, plus 2 x 40 paired samples for a candidate), an estimate, not a measurement.

    KERNEL_GYM_TRACES=/path/to/traces python benchmarks/cycle/run.py --out benchmarks/cycle.json --raw benchmarks/cycle
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from kernel_gym.deploy import cycle
from kernel_gym.deploy import engine_export as ee
from kernel_gym.deploy.export import versions
from kernel_gym.evaluate.replay import routing_profile
from kernel_gym.kernels import vllm_tables
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.vllm_moe import to_config, to_entry
from kernel_gym.measure.roofline import RooflineTimer
from kernel_gym.measure.store import PACKAGED_SNAPSHOT
from kernel_gym.models import load_model
from kernel_gym.traffic import metrics
from kernel_gym.traffic.simulator import Simulator
from kernel_gym.traffic.traces import NAMED_TRACES, load_trace

SCENARIOS = {
    "code-then-conversation": [("azure-code", 0, 600, "uniform"), ("azure-conv", 0, 600, "uniform"),
                               ("azure-conv", 600, 1200, "uniform")],
    "short-then-long-contexts": [("azure-conv", 0, 600, "uniform"), ("mooncake", 0, 500, "uniform"),
                                 ("mooncake", 500, 1000, "uniform")],
    "uniform-then-skewed-routing": [("azure-conv", 0, 600, "uniform"), ("azure-conv", 600, 1200, "zipf:1.2"),
                                    ("azure-conv", 1200, 1800, "zipf:1.2")],
}
MODELS = ("mixtral-8x7b", "olmoe-1b-7b", "qwen2-57b-a14b")
DEV = "NVIDIA H200"
LEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000)
TOP_K, COMPILE_S, SWEEP_REPS, PAIR_REPS = 4, 0.27, 15, 40


def log(msg: str) -> None:
    print(f"[bench_cycle {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def hist_text(name: str, bounds: tuple, values: np.ndarray) -> str:
    """A histogram of `values` in vLLM's exposition (prometheus_client text, labels model_name and engine)."""
    lab = 'engine="0",model_name="kernel-gym-bench"'
    lines = [f"# HELP {name} Histogram.", f"# TYPE {name} histogram"]
    v = np.asarray(values, dtype=np.float64)
    for b in bounds:
        n = float(np.sum(v <= b))
        lines.append(f'{name}_bucket{{engine="0",le="{float(b)}",model_name="kernel-gym-bench"}} {n}')
    lines.append(f'{name}_bucket{{engine="0",le="+Inf",model_name="kernel-gym-bench"}} {float(len(v))}')
    lines.append(f"{name}_count{{{lab}}} {float(len(v))}")
    lines.append(f"{name}_sum{{{lab}}} {float(v.sum())}")
    return "\n".join(lines)


def vllm_scrapes(folder: Path, steps: np.ndarray, prompts: np.ndarray, outputs: np.ndarray, running: float,
                 span_s: float) -> None:
    """Two scrapes of the window: an empty one at its start (a fresh server) and the cumulative one at its end."""
    folder.mkdir(parents=True, exist_ok=True)
    empty = np.zeros(0)
    for name, (st, pr, out, run), t in (("t0.prom", (empty, empty, empty, 0.0), 0.0),
                                        ("t1.prom", (steps, prompts, outputs, running), span_s)):
        text = "\n".join([
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{engine="0",model_name="kernel-gym-bench"}} {run}',
            hist_text("vllm:iteration_tokens_total", metrics.VLLM_STEP_BUCKETS, st),
            hist_text("vllm:request_prompt_tokens", LEN_BUCKETS, pr),
            hist_text("vllm:request_generation_tokens", LEN_BUCKETS, out)]) + "\n"
        (folder / name).write_text(text)
        os.utime(folder / name, (1.7e9 + t, 1.7e9 + t))


def expert_counts(path: Path, routing, tokens: int, layers: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    shares = routing.load_shares(0.0)
    counts = [rng.multinomial(tokens * routing.top_k, shares).tolist() for _ in range(layers)]
    path.write_text(json.dumps({"expert_load_window": [counts]}))


def initial_table(shape, pricer: cycle.Pricer) -> tuple[dict[int, Config], str]:
    shipped = vllm_tables.shipped_table(shape.num_experts, shape.n, DEV, shape.dtype)
    if shipped:
        table = {int(k): to_config(v) for k, v in shipped.items()}
        return table, "vLLM's shipped H200 table"
    table = {}
    for k in vllm_tables.VLLM_M_KEYS:
        near = min(pricer.ms[0.0], key=lambda m: (abs(math.log(m) - math.log(k)), m))
        cell = pricer.times[(near, 0.0)]
        table[k] = min(cell, key=lambda c: (cell[c], str(c)))
    return table, "tuned at uniform routing at vLLM's M keys (recorded rows; vLLM ships no table for this shape)"


class MoETimer:
    """Simulator kernel times: fused MoE from a file (nearest key) or the per-M best, priced on recorded times at the
    window's skew; attention at roofline (the same for every file)."""

    def __init__(self, pricer: cycle.Pricer, table: dict[int, Config] | None, skew: float,
                 others: list[dict[int, Config]] = ()) -> None:
        self.pricer, self.table, self.skew, self.others = pricer, table, skew, list(others)
        self.keys = sorted(table) if table else []
        self.roof = RooflineTimer(metrics.ROOFLINE_EFFICIENCY)

    def time_s(self, kernel, workload, config):
        if kernel != "fused_moe":
            return self.roof.time_s(kernel, workload, config)
        m = workload.num_tokens
        best, _ = self.pricer.oracle(m, self.skew)
        entries = [self.pricer.time(tab[cycle.nearest_key(sorted(tab), m)], m, self.skew)[0] for tab in self.others]
        if self.table is None:  # the per-M best, never slower than a compared file's own entry
            t = min([best, *[e for e in entries if e is not None]])
        else:
            t, _ = self.pricer.time(self.table[cycle.nearest_key(self.keys, m)], m, self.skew)
        if t is None or not math.isfinite(t):  # an entry with no recorded time: the same stand-in for every file
            t = best if math.isfinite(best) else self.roof.time_s(kernel, workload, config) * 1e3
        return t * 1e-3


def goodput(model, trace, routing, pricer, table, skew, others=()) -> float:
    sim = Simulator(model, trace, MoETimer(pricer, table, skew, others), metrics._BlindChooser(), routing,
                    compile_s=lambda k, c: 0.0)
    return float(sim.run().summary["tokens_per_s"])


def gpu_estimate(rep: dict, pricer: cycle.Pricer, skew: float) -> float:
    s = 0.0
    for k in rep["keys"]:
        if not k["moved"]:
            continue
        t = (pricer.time(Config.parse(k["current"]), k["key"], skew)[0] or 1.0) * 1e-3
        s += (TOP_K + 1) * (COMPILE_S + SWEEP_REPS * t) + 2 * PAIR_REPS * t
    return s


def sha16(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/cycle.json"))
    p.add_argument("--raw", type=Path, default=Path("benchmarks/cycle"), help="per-cycle reports and profiles")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--noise-margin", type=float, default=cycle.NOISE_MARGIN, help="passed to the cycle")
    args = p.parse_args(argv)
    traces_dir = os.environ.get("KERNEL_GYM_TRACES")
    if not traces_dir:
        raise SystemExit("set KERNEL_GYM_TRACES to the folder with the published trace files (README: Data and "
                         "licences)")
    import tempfile

    work = args.work or Path(tempfile.mkdtemp(prefix="kg-cycle-"))
    t_start = time.time()
    rows = ee.measured_rows([PACKAGED_SNAPSHOT])
    log(f"{len(rows)} recorded vllm_fused_moe rows")
    traces = {}
    out_windows = []
    for model_name in args.models.split(","):
        model = load_model(model_name)
        shape = ee.shard_shape(model, 1)
        pricer = cycle.Pricer(shape, DEV, rows)
        for scen in args.scenarios.split(","):
            base = work / model_name / scen
            if base.exists():
                shutil.rmtree(base)
            cur = base / "moe"
            table0, origin = initial_table(shape, pricer)
            ee.write_engine_file(cur, "vllm", shape, DEV, {str(k): to_entry(c) for k, c in sorted(table0.items())},
                                 "3.6.0", {"skew": 0.0, "origin": origin})
            kept_table = None
            for i, (tname, t0, t1, rspec) in enumerate(SCENARIOS[scen]):
                if tname not in traces:
                    traces[tname] = load_trace(tname, traces_dir)
                win = traces[tname].window(t0, t1)
                routing = routing_profile(rspec, model, seed=i)
                true_skew = float(routing.effective_skew(0.0))
                st = metrics.simulate_steps(model, win, routing)
                wdir = base / f"w{i}"
                vllm_scrapes(wdir / "scrapes", st["num_tokens"], win.prompt_tokens, win.output_tokens,
                             float(np.mean(st["running"])), win.duration_s)
                expert_counts(wdir / "experts.json", routing, int(st["num_tokens"].sum()), 4, seed=100 + i)
                before = cycle.read_table(cycle.engine_file(cur, "vllm", shape, DEV)[0])
                code, rep = cycle.run_cycle(
                    model=model_name, engine="vllm", current=cur, install=True, no_mlflow=True,
                    traffic=[wdir / "scrapes", wdir / "experts.json"], report_dir=wdir / "report",
                    noise_margin=args.noise_margin, rows=rows)
                after = cycle.read_table(cycle.engine_file(cur, "vllm", shape, DEV)[0])
                if kept_table is None:
                    kept_table = after
                exact, unpriced = cycle.priced_weights([kept_table, after, before],
                                                       metrics.m_weights_from_steps(st["num_tokens"]), true_skew,
                                                       pricer)
                orc = cycle.price_oracle(exact, true_skew, pricer, [kept_table, after, before])["ms"]
                pk = cycle.price(kept_table, exact, true_skew, pricer)
                pc = cycle.price(after, exact, true_skew, pricer)
                pl = cycle.price(before, exact, true_skew, pricer)
                gp = {name: goodput(model, win, routing, pricer, tab, true_skew, [kept_table, after])
                      for name, tab in (("kept", kept_table), ("cycled", after), ("oracle", None))}
                entry = {
                    "model": model_name, "scenario": scen, "index": i, "trace": tname, "window": f"{t0}:{t1}",
                    "routing": rspec, "true_skew": round(true_skew, 3), "observed_skew": round(rep["skew"], 3),
                    "kept": round(orc / pk["ms"], 4), "cycled": round(orc / pc["ms"], 4),
                    "lagged": round(orc / pl["ms"], 4), "oracle": 1.0,
                    "decision": rep["decision"], "exit_code": code, "moved_keys": rep["moved_keys"],
                    "changed_keys": rep["changed_keys"], "expected_gain": round(rep["expected_gain"], 4),
                    "estimated_share": round(pc["estimated_share"], 4),
                    "gpu_s": 0.0, "gpu_s_estimate": round(gpu_estimate(rep, pricer, rep["skew"]), 1),
                    "tokens_per_s": {k: round(v, 2) for k, v in gp.items()},
                    "requests": len(win), "steps": int(len(st["num_tokens"])), "initial_files": origin,
                    "unpriced_step_share": round(unpriced, 4)}
                out_windows.append(entry)
                raw = args.raw / model_name / scen / f"w{i}"
                raw.mkdir(parents=True, exist_ok=True)
                for f in (cycle.REPORT_MD, cycle.REPORT_JSON):
                    shutil.copy(wdir / "report" / f, raw / f)
                log(f"{model_name} {scen} w{i} {tname}[{t0}:{t1}] {rspec}: exit {code}, {rep['changed_keys']} "
                    f"changed; kept {entry['kept']:.3f} cycled {entry['cycled']:.3f} lagged {entry['lagged']:.3f} "
                    f"(of the per-M best); est. share {entry['estimated_share']:.2f}")

    def geo(xs):
        return float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")

    after_shift = [w for w in out_windows if w["index"] > 0]
    summary = {
        "windows": len(out_windows),
        "cycled_geomean": geo([w["cycled"] for w in out_windows]),
        "kept_geomean": geo([w["kept"] for w in out_windows]),
        "lagged_geomean": geo([w["lagged"] for w in out_windows]),
        "after_shift": {"windows": len(after_shift), "cycled_geomean": geo([w["cycled"] for w in after_shift]),
                        "kept_geomean": geo([w["kept"] for w in after_shift]),
                        "cycled_min": min((w["cycled"] for w in after_shift), default=None),
                        "kept_min": min((w["kept"] for w in after_shift), default=None)},
        "cycled_at_least_0.97": sum(w["cycled"] >= 0.97 for w in out_windows),
        "cycled_below_0.97": [f"{w['model']} {w['scenario']} {w['trace']}[{w['window']}]: {w['cycled']}"
                              for w in out_windows if w["cycled"] < 0.97],
        "cycled_slower_than_kept": [f"{w['model']} {w['scenario']} {w['trace']}[{w['window']}]"
                                    for w in out_windows if w["cycled"] < w["kept"] - 1e-4],
        "confirmed_changes": sum(w["exit_code"] == cycle.CONFIRMED for w in out_windows),
        "decisions": {d: sum(w["decision"] == d for w in out_windows) for d in cycle.DECISIONS.values()},
    }
    result = {
        "meta": {"command": "KERNEL_GYM_TRACES=... python benchmarks/cycle/run.py " + " ".join(argv or sys.argv[1:]),
                 "versions": versions(), "dataset": str(PACKAGED_SNAPSHOT.name),
                 "dataset_sha256_16": sha16(PACKAGED_SNAPSHOT),
                 "traces_sha256_16": {n: sha16(Path(traces_dir) / NAMED_TRACES[n]) for n in traces},
                 "device": DEV, "engine": "vllm", "tp": 1, "pricing": "cycle.Pricer on the recorded vllm_fused_moe "
                 "rows (H200); ratios = per-M best recorded config time / time of the file's entry (nearest key)",
                 "gpu": "none: every cycle is the zero-shot re-plan (exit 11 = proposed, unconfirmed)",
                 "noise_margin": args.noise_margin,
                 "elapsed_s": round(time.time() - t_start, 1)},
        "summary": summary, "windows": out_windows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("\n| model | scenario | window | routing | decision | kept | cycled | lagged | est. share |")
    print("|---|---|---|---|---|---:|---:|---:|---:|")
    for w in out_windows:
        print(f"| {w['model']} | {w['scenario']} | {w['trace']}[{w['window']}] | {w['routing']} | exit "
              f"{w['exit_code']} | {w['kept']:.3f} | {w['cycled']:.3f} | {w['lagged']:.3f} | "
              f"{w['estimated_share']:.2f} |")
    print(json.dumps(summary, indent=1))
    log(f"wrote {args.out} in {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
