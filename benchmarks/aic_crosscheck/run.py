"""Cross-check `vllm_fused_moe` against an outside silicon table: NVIDIA aiconfigurator 0.12's H200 MoE data for
vLLM 0.24's unquantised Triton MoE (bf16), and find what makes the two differ (issue 24 item 5).

Two steps:
1. CPU (`--extract`): read aiconfigurator-core's `systems/data/h200_sxm/moe/vllm/0.24.0/moe_perf.parquet` (needs
   pandas: `pip install aiconfigurator==0.12.0 aiconfigurator-core==0.12.0` into a venv under /tmp; it pins
   numpy 2.4 / pandas 3) and write the rows of the shapes kernel_gym models (E=8: Mixtral-8x7B and 8x22B, their TP
   shards, EP 1; every M and routing distribution) with what the collector did, to a small committed JSON:
       /tmp/aicvenv/bin/python benchmarks/aic_crosscheck/run.py --extract PARQUET \\
           --out benchmarks/aic_crosscheck/aic_rows.json
2. GPU: time vllm_fused_moe at those points with the config vLLM runs (its shipped H200 table's nearest-M entry,
   `vllm_moe.default_config`), one factor at a time from kernel_gym's own way of timing (random weights, the
   dataset's Gumbel-uniform routing, alignment inside the timed closure, CUDA-graph replay, L2 flushed before every
   sample, median), and aiconfigurator's way as its collector does it (collector/vllm/collect_moe.py and
   collector/helper.py's benchmark_with_power at ai-dynamo/aiconfigurator 095f58a): expert weights all 0.01,
   "balanced" or "power_law_1.01" routing, the whole FusedMoE (routing included) captured in a CUDA graph, 3 warm-up
   replays then 6 back to back with no flush between them, mean; power law: 5 routings in one iteration, 1 + 1 runs,
   divided by 5. Every point is timed cool (after idle) and hot (after the warm-up rule, timing.heat_to_steady).
       python3 benchmarks/aic_crosscheck/run.py --rows benchmarks/aic_crosscheck/aic_rows.json --out $OUT/aic \\
           --budget-s 90
       TRITON_INTERPRET=1 python3 benchmarks/aic_crosscheck/run.py --rows ... --out /tmp/aic --smoke   # CPU: logic only
Writes $OUT/aic_crosscheck.json and prints a table last.

Step 2 imports only torch, triton, numpy, the standard library and kernel_gym.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

AIC_VERSION = "0.12.0"
AIC_TABLE = "aiconfigurator_core/systems/data/h200_sxm/moe/vllm/0.24.0/moe_perf.parquet"
AIC_SOURCE = "vllm_unquantizedfusedmoe_triton_tritonexperts"
# (name, hidden, full intermediate, E, top_k) of the models kernel_gym tunes that the table has (EP 1, its TP sizes)
MODELS = (("mixtral-8x7b", 4096, 14336, 8, 2), ("mixtral-8x22b", 6144, 16384, 8, 2))
TP_SIZES = (1, 2, 4, 8)
AIC_METHOD = {
    "source": "ai-dynamo/aiconfigurator 095f58a, collector/vllm/collect_moe.py (run_moe_torch) and collector/helper.py "
              "(benchmark_with_power, balanced_logits, power_law_logits_v3)",
    "runtime": "stock vLLM 0.24.0, FusedMoE module (routing, TP sharding and backend selection by vLLM), bf16, "
               "unquantised: TritonExperts (vLLM's fused_moe Triton kernel with the config vLLM looks up: its "
               "shipped E=8,N=<shard>,device_name=NVIDIA_H200.json, nearest M entry; the config is not recorded)",
    "weights": "every floating expert parameter filled with 0.01 (constant data); hidden states torch.randn bf16",
    "routing": "balanced: token t takes experts (t + k * ceil(E / top_k)) % E, k < top_k (for M < ceil(E / top_k): "
               "t * stride / M + k * stride); power_law_a: per-expert counts drawn from a power law (alpha a, "
               "x in [1, 0.8 M] when M * top_k > E), rounded to M * top_k slots, at most M per expert, assigned "
               "column-major; router logits = softmax(one-hot sum) so vLLM's top-k picks exactly those experts",
    "timing": "the whole forward (router top-k + experts) captured in one CUDA graph; balanced: 3 warm-up replays, "
              "then 6 replays back to back between two CUDA events, mean; power law: 5 routings per iteration, "
              "1 warm-up and 1 timed replay, divided by 5; no L2 flush; COLLECTOR_MEASURE_POWER off by default "
              "(no power or clock state recorded in the table)",
    "clocks": "not recorded; the collector only warns when the SM clock fell by >10% during a run with power "
              "measurement on",
}
# GPU points: (model, tp, M values), in priority order (the budget may end the list early)
POINTS = (("mixtral-8x7b", 1, (1, 8, 64, 256, 1024, 4096)), ("mixtral-8x7b", 2, (64, 1024, 4096)),
          ("mixtral-8x22b", 4, (64, 1024, 4096)))
SMOKE_SHAPE = ("smoke", 64, 96, 8, 2)  # M = 1 takes the small-batch path (1 * 2 * 4 <= 8)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- step 1: extraction (CPU, pandas) ------------------------------------------------------------------------------


def vllm_tables_of(wheel: Path, shapes: list[dict]) -> dict[str, Any]:
    """Which config file vLLM (this wheel) reads for each shape, its sha256, and whether kernel_gym's vLLM 0.33.0 data
    holds the same file (then the aiconfigurator rows ran exactly the configs `vllm_moe.default_config` gives)."""
    import zipfile

    ours = json.loads((Path(__file__).resolve().parents[2] / "kernel_gym/data/engine_tables/vllm-0.33.0.json")
                      .read_text())
    sha33 = {t["file"]: t["sha256"] for t in ours["tables"] if not t.get("down")}
    out = {"wheel": wheel.name, "files": {}}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        src = z.read("vllm/model_executor/layers/fused_moe/fused_moe.py").decode()
        out["small_batch_rule"] = ("num_tokens * top_k_num * 4 <= global_num_experts" in src)
        for s in shapes:
            name = f"E={s['num_experts']},N={s['n_shard']},device_name=NVIDIA_H200.json"
            path = f"vllm/model_executor/layers/fused_moe/configs/{name}"
            if path not in names:
                out["files"][name] = {"in_wheel": False, "same_as_vllm_0_33": name not in sha33,
                                      "note": "no shipped table: vLLM's default rule"}
                continue
            sha = hashlib.sha256(z.read(path)).hexdigest()
            same = bool(sha33.get(name)) and sha.startswith(sha33[name])  # kernel_gym keeps 16 hex digits
            out["files"][name] = {"in_wheel": True, "sha256": sha, "same_as_vllm_0_33": same}
    return out


def extract(parquet: Path, out: Path, wheel: Path | None = None) -> dict[str, Any]:
    """The table's bf16 Triton rows of MODELS at TP_SIZES, EP 1, grouped per (model, tp): {M: {distribution: ms}};
    with the vLLM wheel the rows came from, the config files that vLLM read for them (vllm_tables_of)."""
    import pandas as pd

    if not parquet.is_file():
        raise SystemExit(f"no parquet at {parquet}: pip install aiconfigurator-core=={AIC_VERSION} into a venv and "
                         f"pass its site-packages/{AIC_TABLE}")
    df = pd.read_parquet(parquet)
    need = {"kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
            "moe_tp_size", "moe_ep_size", "distribution", "latency", "version", "device"}
    missing = need - set(df.columns)
    if missing:
        raise SystemExit(f"{parquet} lacks columns {sorted(missing)}: not aiconfigurator's moe_perf table")
    df = df[(df.kernel_source == AIC_SOURCE) & (df.moe_dtype == "bfloat16") & (df.moe_ep_size == 1)]
    shapes = []
    for name, hidden, inter, e, k in MODELS:
        for tp in TP_SIZES:
            sub = df[(df.hidden_size == hidden) & (df.inter_size == inter) & (df.num_experts == e) & (df.topk == k)
                     & (df.moe_tp_size == tp)]
            if sub.empty:
                continue
            rows: dict[str, dict[str, float]] = {}
            for r in sub.itertuples():
                rows.setdefault(str(int(r.num_tokens)), {})[str(r.distribution)] = round(float(r.latency), 6)
            shapes.append({"model": name, "hidden": hidden, "intermediate_full": inter, "n_shard": inter // tp,
                           "num_experts": e, "top_k": k, "tp": tp, "ep": 1,
                           "latency_ms": dict(sorted(rows.items(), key=lambda kv: int(kv[0])))})
    if not shapes:
        raise SystemExit(f"{parquet}: no {AIC_SOURCE} bf16 rows for {[m[0] for m in MODELS]}")
    meta_yaml = parquet.with_name("collection_meta.yaml")
    result = {
        "aiconfigurator": AIC_VERSION, "table": AIC_TABLE, "kernel_source": AIC_SOURCE,
        "table_sha256": hashlib.sha256(parquet.read_bytes()).hexdigest(),
        "framework_version": sorted(set(df.version.astype(str))), "device": sorted(set(df.device.astype(str))),
        "collection_meta": meta_yaml.read_text() if meta_yaml.is_file() else None,
        "method": AIC_METHOD, "units": "latency_ms per MoE layer forward", "shapes": shapes,
    }
    if wheel is not None:
        result["vllm_configs"] = vllm_tables_of(wheel, shapes)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


# ---- routings (torch) ------------------------------------------------------------------------------------------


def balanced_ids(m: int, e: int, k: int) -> list[list[int]]:
    """aiconfigurator's "balanced" expert choice per token (helper.balanced_logits), as integer lists."""
    stride = math.ceil(e / k)
    if m >= stride:
        return [[(t + j * stride) % e for j in range(k)] for t in range(m)]
    return [[int((t * stride / m + j * stride) % e) for j in range(k)] for t in range(m)]


def power_law_ids(m: int, e: int, k: int, alpha: float, seed: int) -> list[list[int]]:
    """aiconfigurator's power-law expert choice at EP 1 (helper._generate_power_law_distribution), seeded: counts
    from a power law, rounded to m * k slots, at most m per expert, then assigned column-major (no token gets an
    expert twice)."""
    import random

    rng = random.Random(seed)
    lo, hi = (1.0, m * 0.8) if m * k > e else (0.01, 2.0)
    a1 = 1 - alpha
    draw = [((hi ** a1 - lo ** a1) * rng.random() + lo ** a1) ** (1 / a1) for _ in range(e)]
    total = m * k
    counts = [min(m, round(x / sum(draw) * total)) for x in draw]
    while sum(counts) < total:  # fill the least loaded expert with room (overflow and rounding), as the collector
        i = min((c, i) for i, c in enumerate(counts) if c < m)[1]
        counts[i] += 1
    while sum(counts) > total:
        i = max((c, -i) for i, c in enumerate(counts) if c > 0)[1] * -1
        counts[i] -= 1
    order = sorted(range(e), key=lambda i: -counts[i])
    flat = [i for i in order for _ in range(counts[i])]
    return [[flat[j * m + t] for j in range(k)] for t in range(m)]


def logits_for(ids: list[list[int]], e: int, device: str) -> Any:
    """Router logits whose top-k are exactly these experts (one-hot sum, as the collector's softmax(one-hot))."""
    import torch

    out = torch.zeros(len(ids), e, dtype=torch.float32)
    for t, row in enumerate(ids):
        out[t, row] = 1.0
    return out.to(device)


# ---- step 2: timing (GPU, or wall clock under the CPU smoke) -------------------------------------------------------


def b2b_ms(fns: list[Callable[[], Any]], warmups: int, runs: int, cuda: bool) -> float:
    """aiconfigurator's timing: warm-up replays, then `runs` iterations of every closure back to back between two
    events (no flush), divided by runs * len(fns)."""
    import torch

    for _ in range(warmups):
        for f in fns:
            f()
    if not cuda:
        t0 = time.perf_counter()
        for _ in range(runs):
            for f in fns:
                f()
        return (time.perf_counter() - t0) * 1e3 / (runs * len(fns))
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        for f in fns:
            f()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (runs * len(fns))


def flushed_medians(fns: list[Callable[[], Any]], reps: int, cuda: bool) -> list[float]:
    if cuda:
        from kernel_gym.measure.timing import time_interleaved

        return [statistics.median(s) for s in time_interleaved(fns, reps, heat=False)]
    out = []
    for f in fns:
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            ts.append((time.perf_counter() - t0) * 1e3)
        out.append(statistics.median(ts))
    return out


class Point:
    """The closures of one (shape, M): every variant, checked against the fp32 reference once."""

    def __init__(self, shape: dict, m: int, weights: dict, cuda: bool, seed: int) -> None:
        import torch

        from kernel_gym.kernels import fused_moe as fm
        from kernel_gym.kernels import vllm_moe as vm
        from kernel_gym.kernels.workloads import MoEWorkload
        from kernel_gym.measure.worker import compare

        self.shape, self.m = shape, m
        e, k = shape["num_experts"], shape["top_k"]
        dtype = "float32" if not cuda else "bfloat16"
        wl = MoEWorkload(m, e, k, shape["hidden"], shape["n_shard"], dtype=dtype)
        self.config = vm.default_config(MoEWorkload(m, e, k, shape["hidden"], shape["n_shard"]))
        dev = weights["random"][0].device
        gen = torch.Generator(device=dev).manual_seed(seed + m)
        x = torch.randn(m, shape["hidden"], generator=gen, device=dev, dtype=weights["random"][0].dtype)
        routings = {"gumbel": fm.router_logits(wl, seed + m).to(dev),
                    "balanced": logits_for(balanced_ids(m, e, k), e, dev)}
        for d in range(5):
            routings[f"power_law_1.01#{d}"] = logits_for(power_law_ids(m, e, k, 1.01, seed * 10 + d), e, dev)
        self.failed: dict[str, str] = {}
        self.cuda = cuda
        refs: dict[tuple[str, str], Any] = {}

        def closure(routing: str, w: str, scope: str, graph: bool) -> Callable[[], Any] | None:
            name = f"{routing}/{w}/{scope}/{'graph' if graph else 'eager'}"
            inputs = fm.MoEInputs(wl, x, routings[routing], *weights[w])
            try:
                full = getattr(vm, "prepare_engine", vm.prepare)  # the small-batch path where vLLM takes it
                fn = (full if scope == "full" else vm.prepare_kernels_only)(inputs, self.config)
                out = fn()
                if (routing, w) not in refs:
                    refs[(routing, w)] = fm.reference_moe(inputs)
                wrong = compare(vm.FAMILY, out, refs[(routing, w)], wl.dtype)
                if wrong:
                    self.failed[name] = f"wrong result: {wrong}"
                    return None
                if graph and cuda:
                    from kernel_gym.measure.timing import capture_graph

                    fn = capture_graph(fn)
                fn()
                return fn
            except Exception as exc:  # noqa: BLE001 - recorded, the variant is left out
                self.failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                return None

        def route_closure(routing: str) -> Callable[[], Any]:
            logits = routings[routing]

            def fn() -> Any:
                return fm.route(logits, k)

            if cuda:
                from kernel_gym.measure.timing import capture_graph

                return capture_graph(fn)
            return fn

        pl = [f"power_law_1.01#{d}" for d in range(5)]
        # flushed, interleaved medians: kernel_gym's way and one factor changed at a time
        self.flushed = {
            "base": closure("gumbel", "random", "full", True),
            "kernels_only": closure("gumbel", "random", "kernels", True),
            "eager": closure("gumbel", "random", "full", False),
            "balanced": closure("balanced", "random", "full", True),
            "const_weights": closure("gumbel", "const", "full", True),
            **{f"power_law#{d}": closure(r, "random", "full", True) for d, r in enumerate(pl)},
        }
        # aiconfigurator's way (back to back, mean), and it with one factor of kernel_gym's put back
        self.b2b = {
            "aic_balanced": [closure("balanced", "const", "full", True)],
            "aic_power_law": [closure(r, "const", "full", True) for r in pl],
            "aic_balanced_random_weights": [self.flushed["balanced"]],
            "b2b_base": [self.flushed["base"]],
        }
        self.route = {"balanced": route_closure("balanced"), "power_law": [route_closure(r) for r in pl]}
        refs.clear()

    def time(self, reps: int) -> dict[str, Any]:
        names = [n for n, f in self.flushed.items() if f is not None]
        med = dict(zip(names, flushed_medians([self.flushed[n] for n in names], reps, self.cuda)))
        out: dict[str, Any] = {k: v for k, v in med.items() if not k.startswith("power_law#")}
        pls = [v for k, v in med.items() if k.startswith("power_law#")]
        if pls:
            out["power_law"] = statistics.mean(pls)
        for name, fns in self.b2b.items():
            if any(f is None for f in fns):
                continue
            warm, runs = (1, 1) if len(fns) > 1 or not self.cuda else (3, 6)
            trials = [b2b_ms(fns, warm, runs, self.cuda) for _ in range(5 if self.cuda else 1)]
            out[name] = statistics.median(trials)
            out[name + "_first"] = trials[0]  # what one collector run gives
        out["route_balanced"] = b2b_ms([self.route["balanced"]], 3, 6, self.cuda)
        out["route_power_law"] = b2b_ms(self.route["power_law"], 1, 1, self.cuda)
        # aiconfigurator's scope includes vLLM's router top-k (one fused op); ours runs before the closure: added
        # back here (torch softmax + top-k + renormalise: a few small kernels, an upper bound of vLLM's one)
        for way, route in (("aic_balanced", "route_balanced"), ("aic_power_law", "route_power_law")):
            if way in out:
                out[way + "_with_route"] = out[way] + out[route]
        return out


def factors(t: dict[str, float]) -> dict[str, float]:
    """Each factor's effect as a time ratio (variant / kernel_gym's base), and aic's way over kernel_gym's way."""
    base = t.get("base")
    out = {}
    if base:
        for k in ("kernels_only", "eager", "balanced", "power_law", "const_weights", "b2b_base", "aic_balanced",
                  "aic_power_law", "aic_balanced_random_weights"):
            if t.get(k):
                out[k] = t[k] / base
    if t.get("aic_balanced") and t.get("aic_balanced_random_weights"):
        out["aic_weights_effect"] = t["aic_balanced"] / t["aic_balanced_random_weights"]
    return out


def run_gpu(args: argparse.Namespace, result: dict[str, Any] | None = None,
            save: Callable[[], None] | None = None) -> dict[str, Any]:
    """Fills `result` as it goes (main writes it even when a step fails; `save` after every point timed)."""
    import torch

    from kernel_gym.measure import power
    from kernel_gym.measure.timing import heat_to_steady

    start = time.monotonic()
    deadline = start + args.budget_s
    cuda = torch.cuda.is_available() and not args.smoke
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = json.loads(Path(args.rows).read_text())
    by_key = {(s["model"], s["tp"]): s for s in rows["shapes"]}
    if args.smoke:
        name, h, n, e, k = SMOKE_SHAPE
        smoke = {"model": name, "hidden": h, "n_shard": n, "num_experts": e, "top_k": k, "tp": 1, "latency_ms": {}}
        plan = [(smoke, (1, 16))]
    else:
        plan = []
        for model, tp, ms in POINTS:
            if (model, tp) not in by_key:
                raise SystemExit(f"{args.rows} has no rows for {model} TP{tp}: run --extract again")
            plan.append((by_key[(model, tp)], ms))
    mon = power.PowerMonitor(0, interval_s=0.1)
    mon.__enter__()
    try:
        reader = power.open_reader(0)
    except power.PowerUnavailable:
        reader = None
    result = {} if result is None else result
    result.update({"meta": {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
        "triton": __import__("triton").__version__, "smoke": args.smoke, "args": vars(args),
        "aic": {k: rows.get(k) for k in ("aiconfigurator", "table", "table_sha256", "kernel_source")},
        "aic_method": rows.get("method"),
    }, "points": []})
    log(f"device {result['meta']['device']}; {mon.summary().line()}")

    pool = None
    if cuda and args.compile_workers > 0:  # compile every point's config into Triton's cache on CPU cores at once
        import os

        from kernel_gym.kernels import vllm_moe as vm
        from kernel_gym.kernels.workloads import MoEWorkload
        from kernel_gym.measure.compiler import CompilePool

        try:
            pool = CompilePool(args.compile_workers,
                               {k: os.environ[k] for k in ("TRITON_CACHE_DIR",) if k in os.environ})
            futures = []
            for shape, ms in plan:
                for m in ms:
                    wl = MoEWorkload(m, shape["num_experts"], shape["top_k"], shape["hidden"], shape["n_shard"])
                    futures += pool.submit(vm.FAMILY.name, wl.key(), [str(vm.default_config(wl))], chunk=1)
            CompilePool.collect(futures, timeout_s=max(10.0, args.budget_s * 0.3))
            log(f"compiled in the pool ({time.monotonic() - start:.1f} s since the start)")
        except Exception as exc:  # noqa: BLE001 - the pool only saves time
            log(f"compile pool failed ({type(exc).__name__}: {exc}); compiling in this process")
            if pool is not None:
                pool.close()
            pool = None
    points: list[tuple[dict, Point]] = []
    for shape, ms in plan:
        if time.monotonic() > start + args.budget_s * 0.45:
            log(f"budget: {shape['model']} TP{shape.get('tp')} skipped")
            break
        e, h, n = shape["num_experts"], shape["hidden"], shape["n_shard"]
        dtype = torch.float32 if not cuda else torch.bfloat16
        gen = torch.Generator(device=dev).manual_seed(args.seed)
        rand = (torch.randn(e, 2 * n, h, generator=gen, device=dev, dtype=dtype).mul_(1 / math.sqrt(h)),
                torch.randn(e, h, n, generator=gen, device=dev, dtype=dtype).mul_(1 / math.sqrt(n)))
        const = (torch.full_like(rand[0], 0.01), torch.full_like(rand[1], 0.01))
        weights = {"random": rand, "const": const}
        for m in ms:
            t0 = time.monotonic()
            p = Point(shape, m, weights, cuda, args.seed)
            points.append((shape, p))
            log(f"{shape['model']} TP{shape.get('tp')} M={m}: config {p.config}; {len(p.failed)} variants failed "
                f"({time.monotonic() - t0:.1f} s)")
            for v, why in p.failed.items():
                log(f"  failed {v}: {why}")
    if pool is not None:
        pool.close()
    result["meta"]["setup_s"] = round(time.monotonic() - start, 1)

    def window(t0: float, t1: float) -> dict:
        inside = [s for s in list(mon.samples) if t0 <= s.t <= t1]
        if not inside:
            return power.PowerSummary.unavailable(mon.summary().reason or "no samples in the window").to_dict()
        return power.PowerSummary.of(inside, mon.source).to_dict()

    states: dict[str, list[dict]] = {}
    result["raw_by_state"] = states  # per state, per point in order: written even if a later step fails
    idle = 0.0 if args.smoke else args.idle_s
    time.sleep(idle)
    for state in ("cool", "hot"):
        if state == "hot":
            t0 = time.monotonic()
            rec = heat_to_steady(args.heat_s, reader=reader).to_dict() if cuda else {"heated_s": 0}
            result["meta"]["heat"] = {**rec, "power": window(t0, time.monotonic())}
            log(f"heat: {power.monitor_summary_line(result['meta']['heat']['power'])}")
        states[state] = []
        for shape, p in points:
            if state == "hot" and cuda and args.reheat_s > 0:
                heat_to_steady(args.reheat_s, reader=reader, min_s=args.reheat_s)
            if time.monotonic() > deadline:
                log(f"budget: {state} {shape['model']} M={p.m} not timed")
                states[state].append({})
                continue
            t0 = time.monotonic()
            times = p.time(1 if args.smoke else args.reps)
            times["power"] = window(t0, time.monotonic())
            states[state].append(times)
            if save is not None:
                save()
            log(f"{state} {shape['model']} TP{shape.get('tp')} M={p.m}: base {times.get('base', float('nan')):.4f} ms, "
                f"aic way {times.get('aic_balanced', float('nan')):.4f} ms; "
                f"{power.monitor_summary_line(times['power'])}")
    mon.__exit__(None, None, None)

    for i, (shape, p) in enumerate(points):
        aic = shape["latency_ms"].get(str(p.m), {})
        entry = {"model": shape["model"], "tp": shape.get("tp"), "n_shard": shape["n_shard"], "M": p.m,
                 "config": str(p.config), "aic_ms": aic, "failed": p.failed}
        for state in ("cool", "hot"):
            t = states.get(state, [{}] * len(points))[i]
            entry[state] = t
            entry[f"{state}_factors"] = factors(t)
            if aic.get("balanced") and t.get("base"):
                entry[f"{state}_base_over_aic_balanced"] = t["base"] / aic["balanced"]
            if aic.get("balanced") and t.get("aic_balanced_with_route"):
                entry[f"{state}_aic_way_over_aic_balanced"] = t["aic_balanced_with_route"] / aic["balanced"]
            if aic.get("power_law_1.01") and t.get("aic_power_law_with_route"):
                entry[f"{state}_aic_way_over_aic_power_law"] = t["aic_power_law_with_route"] / aic["power_law_1.01"]
        result["points"].append(entry)
    result["power_run"] = mon.summary().to_dict()
    result["meta"]["wall_s"] = round(time.monotonic() - start, 1)
    return result


def table(result: dict[str, Any]) -> str:
    rows = ["| shape | M | aic bal ms | kg base ms cool / hot | base/aic | aic way + route / aic (bal, pl) | "
            "kernels only | "
            "eager | balanced | power law | const W | back to back | SM MHz cool / hot |",
            "|---|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]

    def f(x: Any, fmt: str = "{:.3f}") -> str:
        return "-" if x is None else fmt.format(x)

    for p in result["points"]:
        hot, cool, fx = p.get("hot", {}), p.get("cool", {}), p.get("hot_factors", {})
        sm = [(s.get("power") or {}).get("sm_mhz") for s in (cool, hot)]
        sm_s = " / ".join(f"{v[1]:.0f}" if v else "-" for v in sm)
        rows.append(
            f"| {p['model']} TP{p['tp']} | {p['M']} | {f(p['aic_ms'].get('balanced'))} | "
            f"{f(cool.get('base'))} / {f(hot.get('base'))} | {f(p.get('hot_base_over_aic_balanced'))} | "
            f"{f(p.get('hot_aic_way_over_aic_balanced'))}, {f(p.get('hot_aic_way_over_aic_power_law'))} | "
            + " | ".join(f(fx.get(k)) for k in ("kernels_only", "eager", "balanced", "power_law", "const_weights",
                                                 "b2b_base"))
            + f" | {sm_s} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--extract", metavar="PARQUET", help="step 1: aiconfigurator's moe_perf.parquet -> --out JSON")
    p.add_argument("--vllm-wheel", help="step 1: vLLM 0.24.0's wheel (pip download vllm==0.24.0 --no-deps): record "
                   "which config files the rows ran and whether they equal kernel_gym's vLLM 0.33.0 data")
    p.add_argument("--rows", help="step 2: the JSON step 1 wrote (benchmarks/aic_crosscheck/aic_rows.json)")
    p.add_argument("--out", required=True, help="step 1: the JSON to write; step 2: a folder")
    p.add_argument("--budget-s", type=float, default=90.0)
    p.add_argument("--idle-s", type=float, default=8.0, help="idle before the cool pass")
    p.add_argument("--heat-s", type=float, default=20.0, help="cap of the warm-up before the hot pass")
    p.add_argument("--reheat-s", type=float, default=1.0, help="heat before every hot point")
    p.add_argument("--reps", type=int, default=10, help="interleaved flushed samples per variant")
    p.add_argument("--compile-workers", type=int, default=8, help="CPU processes compiling ahead (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="CPU: tiny shape under TRITON_INTERPRET=1, logic only")
    args = p.parse_args(argv)
    if bool(args.extract) == bool(args.rows):
        p.error("give exactly one of --extract PARQUET (step 1, CPU) and --rows JSON (step 2, GPU)")
    if args.extract:
        res = extract(Path(args.extract), Path(args.out), Path(args.vllm_wheel) if args.vllm_wheel else None)
        n = sum(len(s["latency_ms"]) for s in res["shapes"])
        print(f"wrote {args.out}: {len(res['shapes'])} shapes, {n} token counts")
        return 0
    if not Path(args.rows).is_file():
        p.error(f"--rows {args.rows}: no such file (run step 1, --extract, first)")
    import torch

    if not args.smoke and not torch.cuda.is_available():
        p.error("no CUDA device: run on the GPU machine, or pass --smoke (with TRITON_INTERPRET=1) for the logic")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    path = out / "aic_crosscheck.json"

    def save() -> None:
        path.write_text(json.dumps(result, indent=1, default=str))

    try:
        run_gpu(args, result, save)
    finally:  # a failing step still leaves what was measured
        save()
    print(table(result))
    print(f"wrote {path} ({result['meta']['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
