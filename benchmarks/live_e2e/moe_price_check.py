"""Why does the simulator under-price the live stack's MoE? A one-command GPU diagnostic of the fused MoE's price
(docs/live.md, `residual_fit`: decode-only steps at batch 35-65 under-priced by 14-16%, the residual per sequence
depending on the policy's MoE config; the MoE is 0.80-0.90 of every step's price).

For each token count T (a decode graph's capture size) and each live policy's MoE config at T, it times on the GPU:

- A, the dataset's path: exactly as collection times a row (measure.worker.WorkloadRunner: the family's make_inputs
  with seed 0, synthetic skew-0 routing, prepare with routing and alignment on the host outside the timed closure,
  time_launch with DEFAULT_TIMING and the L2 flush; checked against the torch reference, twice, first);
- B, the live call on the same inputs: `prepare_layer(inputs, cfg, route_in_launch=True)` (routing and alignment on
  the GPU inside the launch, grids at the bounded size) captured in a CUDA graph, timed by time_launch with the same
  flush; also without the flush (B_noflush) and paired with A by time_interleaved (B_over_A_paired: a clock drift
  between the two cannot bias that ratio);
- C, back to back as the live stack runs it: L layers with distinct expert weights (and routings), their live calls
  captured in one graph, timed without the L2 flush, per layer (the total divided by L);
- D, the routing and alignment alone (`fused_moe._route_and_align(..., bounded=True)`, what B adds inside its
  launch), in a graph, flushed;
- E, A and B again with router logits from a real router's shape (the live stack's `h @ layer["wr"]`: random hidden
  rows times a random [hidden, experts] router weight, bf16, then softmax/top-k): a real router's uneven expert counts
  instead of the synthetic balanced routing (E_A, E_B; the expert counts of both routings are written per T).

Beside each, the plan's answer of the packaged H200 dataset (RecordedBackend, as `run.py --predict` reads it): the
config's time at T itself (`recorded`) and what the prediction charges for a graphed step of T rows (`priced`: the
workload at the simulator's rounded count round_count(T), through GuardedChooser as --predict does: interpolated
between stored counts where it is not one of them). So: B/A is the in-launch routing and bounded grid (i), C/A the
isolation and the flush (ii), A/recorded re-timing now against then (iii), E_A/A the routing's evenness (iv),
recorded/priced the interpolation to the rounded count (v).

    python3 benchmarks/live_e2e/moe_price_check.py --plan benchmarks/live_e2e/moe_price_plan.json   # CPU: the plan
    python3 benchmarks/live_e2e/moe_price_check.py --out $OUT/moe_price_check                       # GPU (~3 min)
    TRITON_INTERPRET=1 python3 benchmarks/live_e2e/moe_price_check.py --smoke --out /tmp/mpc          # CPU dry run

The plan mode reuses run.py's policy code (make_chooser, LiveSimulator._moe_config: the config the live run picks for
a decode batch of T on the simulator's rounded count, checked with the family's rules). The GPU mode reads the plan
(`--plan`, default the committed moe_price_plan.json), writes one JSON file, moe_price_check.json, under --out and
prints a table of ratios last; it imports only torch, triton, numpy, the standard library and kernel_gym.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HERE = Path(__file__).resolve().parent
PLAN_PATH = HERE / "moe_price_plan.json"
TABLE_POLICY = "table:benchmarks/live_replay/inputs/dispatch_table.json"
POLICIES = ("default", "vllm-table", TABLE_POLICY)
TOKENS = (8, 16, 32, 40, 48, 56, 64, 128)
SMOKE_TOKENS = (4, 8)
SMOKE_POLICIES = ("default", TABLE_POLICY)  # the vllm-table is built from the dataset's rows: none for the tiny model
OUT_NAME = "moe_price_check.json"
FOCUS_T = 48  # the GPU run goes through T nearest this first (the residual is at decode batches 35-65)


def log(msg: str) -> None:
    print(f"[moe_price_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the plan (CPU) ----------------------------------------------------------------------------------------------


def _live_simulator(model: Any, spec: str, dtype: str) -> Any:
    """run.py's LiveSimulator with the policy's chooser (no stack: only its MoE choice is asked)."""
    from benchmarks.live_e2e import run as le
    from kernel_gym.traffic.traces import Trace

    kw = dict(gpu_memory_bytes=le.pool_memory(model, 20.0), max_num_batched_tokens=4096, max_num_seqs=256)
    return le.LiveSimulator(model, Trace("moe_price_check", [0.0], [16], [2], "moe_price_check"),
                            le.make_chooser(spec, model), None, dtype, **kw)


def live_config(sim: Any, rows: int, batch: int) -> str:
    """The MoE config the live run executes for a decode-only step of `batch` sequences in a graph of `rows` rows
    (LiveSimulator._moe_config: the policy's pick at round_count(batch), refused ones replaced as the run does)."""
    return str(sim._moe_config(rows, batch)[0])


def _answer(m: Any) -> dict:
    from kernel_gym.measure.types import is_estimated

    ms = m.median_ms if m.ok and m.median_ms else None
    return {"ms": ms, "status": m.status, "source": m.source, "estimated": is_estimated(m.source) if ms else None,
            "spread": m.spread, "power": m.power or None}


def build_plan(model_name: str, tokens: list[int], policies: list[str], smoke: bool = False) -> dict:
    """Per (T, policy): the config the live run picks for a full decode graph of T rows, the configs it picks for
    the other batches that share that graph (`bucket_configs`), the dataset's time for it at T (skew 0), and what
    --predict charges for that step's MoE (`priced`)."""
    from dataclasses import asdict

    from benchmarks.live_e2e import run as le
    from kernel_gym.evaluate.replay import GuardedChooser
    from kernel_gym.kernels.workloads import MoEWorkload
    from kernel_gym.measure import make_backend
    from kernel_gym.models import load_model
    from kernel_gym.traffic.simulator import capture_size, round_count

    model = le.TINY if smoke else load_model(model_name)
    dtype = "float32" if smoke else "bfloat16"
    backend = make_backend("recorded", max_spread=math.inf)  # as --predict reads the dataset
    rows = []
    for spec in policies:
        t0 = time.time()
        sim = _live_simulator(model, spec, dtype)
        guard = GuardedChooser(sim.chooser, backend, model.num_layers)  # as --predict wraps the policy
        for t in tokens:
            if capture_size(t) != t:
                raise SystemExit(f"T={t} is not a capture size (1, 2, 4, then multiples of 8): the live run never "
                                 "runs a decode graph of that many rows")
            cfg = live_config(sim, t, t)
            bucket: dict[str, list[int]] = {}
            for n in range(1, t + 1):
                if capture_size(n) == t:
                    c = live_config(sim, t, n)
                    bucket.setdefault(c, [n, n])[1] = n
            wl = MoEWorkload(t, model.num_experts, model.top_k, model.hidden, model.intermediate, 0.0, dtype)
            priced_wl = sim._workload(("fused_moe", round_count(t), 0.0))
            try:
                p_cfg, p_s, p_est = guard.resolve("fused_moe", priced_wl, le.PAGE)
                priced = {"tokens": round_count(t), "config": str(p_cfg), "same_config": str(p_cfg) == cfg,
                          "ms": p_s * 1e3, "estimated": p_est,
                          "source": backend.measure("fused_moe", priced_wl, p_cfg).source}
            except LookupError as exc:  # the dataset times no config there (the tiny model of --smoke)
                priced = {"tokens": round_count(t), "config": None, "ms": None, "error": str(exc)[:200]}
            rows.append({"T": t, "policy": spec, "config": cfg, "bucket_configs": bucket,
                         "recorded": _answer(backend.measure("fused_moe", wl, sim._moe_config(t, t)[0])),
                         "priced": priced})
        log(f"{spec}: {len(tokens)} token counts in {time.time() - t0:.1f} s ({sim.config_fallbacks} refused "
            "configs replaced)")
    return {"model": model.name, "model_spec": asdict(model), "dtype": dtype, "tokens": list(tokens),
            "policies": list(policies), "dataset_sha256_16": getattr(backend, "dataset_hash", None),
            "rows": rows}


# ---- the measurements (GPU; the CPU smoke runs the same path under the interpreter) -------------------------------


def _checked(fn: Any, ref: Any, dtype: str, out: Any = None, family: Any = None) -> tuple[Any, str | None]:
    """Run fn under poisoned_empty (unwritten floating buffers are NaN), check its output (what it returns, or the
    buffer `out` a graph replay writes) against the reference, fill the output with NaN, run again and check again
    (as WorkloadRunner checks a row before timing it): (the output, None) or (None, why it is wrong). `family`: whose
    tolerance (default fused_moe's)."""
    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.measure.worker import compare, poison_outputs, poisoned_empty

    family = family or fm.FAMILY

    with poisoned_empty():
        got = fn()
    _sync()
    got = got if out is None else out
    wrong = compare(family, got, ref, dtype)
    if wrong:
        return None, wrong
    poison_outputs(got)
    again = fn()
    _sync()
    got = again if out is None else out
    wrong = compare(family, got, ref, dtype)
    return (None, f"second run over a NaN-filled output: {wrong}") if wrong else (got, None)


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        torch.cuda.synchronize()


class Measurer:
    """The timings of one run: CUDA events (kernel_gym.measure.timing, DEFAULT_TIMING as collection) on the GPU, one
    wall-clock run on the CPU (the smoke: logic only, never a figure)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def time(self, fn: Any, flush: bool = True) -> dict:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return {"ms": (time.perf_counter() - t0) * 1e3, "spread": None, "repeats": 1, "wall_clock": True}
        from dataclasses import replace

        from kernel_gym.measure.timing import DEFAULT_TIMING, time_launch

        t = time_launch(fn, replace(DEFAULT_TIMING, flush=flush))
        return {"ms": t.median_ms, "spread": t.spread, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms, "repeats": t.repeats}

    def graph(self, fn: Any) -> Any:
        """fn captured in a CUDA graph (its replay), or fn itself on the CPU."""
        if not self.cuda:
            return fn
        from kernel_gym.measure.timing import capture_graph

        return capture_graph(fn)

    def paired_ratio(self, a: Any, b: Any, reps: int = 12) -> float | None:
        """median(b) / median(a) over samples taken in turn (timing.time_interleaved, flushed); None on the CPU."""
        if not self.cuda:
            return None
        import numpy as np

        from kernel_gym.measure.timing import time_interleaved

        sa, sb = time_interleaved([a, b], reps)
        return float(np.median(sb) / np.median(sa))


def real_router_logits(x: Any, num_experts: int, seed: int = 1) -> Any:
    """The live stack's router on these rows: rmsnorm(x) @ wr in the activations' dtype, wr ~ N(0, 1/hidden) (run.py's
    Stack), as float32 logits."""
    import torch

    g = torch.Generator(device=x.device).manual_seed(seed)
    wr = (torch.randn(x.shape[1], num_experts, generator=g, device=x.device, dtype=torch.float32)
          * x.shape[1] ** -0.5).to(x.dtype)
    xf = x.float()
    h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
    return (h @ wr).float()


def _expert_counts(logits: Any, top_k: int, num_experts: int) -> list[int]:
    import torch

    from kernel_gym.kernels import fused_moe as fm

    ids = fm.route(logits, top_k)[1]
    return [int(c) for c in torch.bincount(ids.flatten().long(), minlength=num_experts).cpu()]


def _blocks(logits: Any, top_k: int, num_experts: int, block_m: int) -> dict:
    """Row blocks the measured path's grid covers (the routed ones) and the live path's bounded grid."""
    from kernel_gym.kernels import fused_moe as fm

    ids = fm.route(logits, top_k)[1]
    return {"routed": fm.align_block_size(ids, num_experts, block_m).num_blocks,
            "bounded": fm.max_aligned_blocks(ids.numel(), num_experts, block_m)}


def measure_config(meas: Measurer, runner: Any, real: Any, real_ref: Any, layers: list, layer0_ref: Any,
                   cfg: Any, dtype: str) -> dict:
    """A, B (+ no flush, + paired with A), C, E_A, E_B for one config at one T (module docstring). A config whose
    output is wrong anywhere is reported with the reason and the timings after that left out."""
    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.measure.types import OK

    res: dict[str, Any] = {}
    m = runner.measure(cfg)  # A: collection's own path (checked twice, then time_launch with DEFAULT_TIMING)
    if m.status != OK:
        return {"error": f"A: {m.status}: {m.reason}"}
    if meas.cuda:
        res["A"] = {"ms": m.median_ms, "spread": m.spread, "repeats": m.repeats}
    else:  # the interpreter times nothing: one wall-clock run of the same closure
        res["A"] = meas.time(fm.FAMILY.prepare(runner.inputs, cfg))

    live = fm.prepare_layer(runner.inputs, cfg, route_in_launch=True)
    out, wrong = _checked(live, runner.ref, dtype)
    if wrong:
        return {**res, "error": f"B (route in launch): {wrong}"}
    graph_b = meas.graph(live)
    _, wrong = _checked(graph_b, runner.ref, dtype, out)  # the replay writes the closure's output buffer
    if wrong:
        return {**res, "error": f"B (graph replay): {wrong}"}
    res["B"] = meas.time(graph_b)
    res["B_noflush"] = meas.time(graph_b, flush=False)
    if meas.cuda:
        plain_a = fm.FAMILY.prepare(runner.inputs, cfg)
        plain_a()
        res["B_over_A_paired"] = meas.paired_ratio(plain_a, graph_b)

    c = graph_layers(meas, layers, layer0_ref, cfg, dtype)
    if "error" in c:
        return {**res, "error": f"C ({c['error']})"}
    res["C"] = c

    plain = fm.FAMILY.prepare(real, cfg)
    _, wrong = _checked(plain, real_ref, dtype)
    if wrong:
        return {**res, "error": f"E_A (real router): {wrong}"}
    res["E_A"] = meas.time(plain)
    live_real = fm.prepare_layer(real, cfg, route_in_launch=True)
    out_real, wrong = _checked(live_real, real_ref, dtype)
    if wrong:
        return {**res, "error": f"E_B (real router): {wrong}"}
    live_real = meas.graph(live_real)
    _, wrong = _checked(live_real, real_ref, dtype, out_real)
    if wrong:
        return {**res, "error": f"E_B (real router, graph): {wrong}"}
    res["E_B"] = meas.time(live_real)
    return res


def graph_layers(meas: Measurer, inputs: list, ref0: Any, cfg: Any, dtype: str) -> dict:
    """C: the layers' live calls (routing and alignment inside each launch) captured back to back in one graph and
    replayed without the L2 flush; layer 0 checked against the reference eagerly and through the replay. ms per layer
    (the graph's median / layers), with the whole graph's timing; or {"error": why}."""
    from kernel_gym.kernels import fused_moe as fm

    return replayed_layers(meas, [fm.prepare_layer(li, cfg, route_in_launch=True) for li in inputs], ref0, dtype)


def replayed_layers(meas: Measurer, calls: list, ref0: Any, dtype: str, family: Any = None,
                    also_flushed: bool = False) -> dict:
    """The layers' calls captured back to back in one graph and replayed without the L2 flush; layer 0 checked
    against the reference (with `family`'s tolerance, default fused_moe's) eagerly and through the replay. ms per
    layer (the graph's median / layers), with the whole graph's timing; or {"error": why}. `also_flushed`: the same
    graph timed again with the L2 flushed before each replay (`flushed_ms` per layer), so that every layer reads its
    inputs from memory once, as in a live step where the other layers' work has streamed through L2 in between."""
    out0, wrong = _checked(calls[0], ref0, dtype, family=family)
    if wrong:
        return {"error": f"layer 0: {wrong}"}
    for call in calls[1:]:
        call()  # compiled and warm before the capture

    def stack() -> Any:
        return [call() for call in calls][0]

    graph = meas.graph(stack)
    _, wrong = _checked(graph, ref0, dtype, out0, family)
    if wrong:
        return {"error": f"graph replay, layer 0: {wrong}"}
    whole = meas.time(graph, flush=False)
    out = {**whole, "ms": whole["ms"] / len(calls), "layers": len(calls), "total_ms": whole["ms"]}
    if also_flushed:
        cold = meas.time(graph, flush=True)
        out.update(flushed_ms=cold["ms"] / len(calls), flushed_spread=cold.get("spread"))
    return out


def _gpu_state(cuda: bool) -> dict | None:
    if not cuda:
        return None
    from kernel_gym.measure.engine_timing import gpu_state

    return gpu_state()


def write_doc(doc: dict, path: Path, start: float, cuda: bool) -> Path:
    """A GPU table's results file closed and written: the GPU's state after, the wall seconds since `start`
    (time.monotonic), the JSON at `path` (its folder made)."""
    doc["meta"]["gpu_after"] = _gpu_state(cuda)
    doc["meta"]["wall_s"] = round(time.monotonic() - start, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return path


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if a is not None and b else None


def measure_tokens(meas: Measurer, wl: Any, device: str, configs: list[str], layer_w: list, routing: dict,
                   monitor: Any) -> list[tuple[str, dict]]:
    """Every config of one token count: the inputs, routings and references built once (collection's
    WorkloadRunner for the synthetic routing, the live router's logits on the same rows, C's layers with their own
    weights and routings), then measure_config and D per config; the routing's expert counts and row blocks into
    `routing`."""
    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.timing import DEFAULT_TIMING
    from kernel_gym.measure.worker import WorkloadRunner

    t, e, k = wl.num_tokens, wl.num_experts, wl.top_k
    runner = WorkloadRunner(fm.FAMILY, wl, device, DEFAULT_TIMING if meas.cuda else None, seed=0)
    inputs = runner.inputs
    real = fm.MoEInputs(wl, inputs.x, real_router_logits(inputs.x, e), inputs.w1, inputs.w2)
    real_ref = fm.FAMILY.reference(real)
    layers = [fm.MoEInputs(wl, inputs.x, fm.router_logits(wl, seed=1 + i).to(device), w1, w2)
              for i, (w1, w2) in enumerate(layer_w)]
    layer0_ref = fm.FAMILY.reference(layers[0])
    routing[t] = {"synthetic_counts": _expert_counts(inputs.router_logits, k, e),
                  "real_router_counts": _expert_counts(real.router_logits, k, e), "blocks": {}}
    d_memo: dict[int, dict] = {}
    out = []
    for cfg_s in configs:
        cfg = Config.parse(cfg_s)
        bm = int(cfg["BLOCK_M"])
        c0 = time.monotonic()
        try:
            res = measure_config(meas, runner, real, real_ref, layers, layer0_ref, cfg, wl.dtype)
        except Exception as exc:  # noqa: BLE001 - a failing config is reported, the others still run
            res = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
        if bm not in d_memo:  # D: routing + alignment alone, per BLOCK_M
            routing[t]["blocks"][bm] = {"synthetic": _blocks(inputs.router_logits, k, e, bm),
                                        "real_router": _blocks(real.router_logits, k, e, bm)}
            try:
                d_memo[bm] = meas.time(meas.graph(lambda bm=bm: fm._route_and_align(inputs, bm, bounded=True)))
            except Exception as exc:  # noqa: BLE001
                d_memo[bm] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        res["D"] = d_memo[bm]
        if monitor is not None:
            monitor.sample_now()
            res["power"] = monitor.window(c0, time.monotonic()).compact()
        res["seconds"] = round(time.monotonic() - c0, 2)
        out.append((cfg_s, res))
        log(f"T={t} {cfg_s}: " + (res["error"] if "error" in res else
            " ".join(f"{name}={res[name]['ms']:.4f}" for name in ("A", "B", "C", "D", "E_A", "E_B")
                     if isinstance(res.get(name), dict) and "ms" in res[name])) + f" ({res['seconds']} s)")
    return out


def run_measure(plan: dict, out_dir: Path, num_layers: int, budget_s: float, smoke: bool = False) -> dict:
    import torch

    from kernel_gym.kernels.workloads import MoEWorkload
    from kernel_gym.measure.power import PowerMonitor

    cuda = torch.cuda.is_available() and not smoke and os.environ.get("TRITON_INTERPRET") != "1"
    if not cuda and not smoke:
        raise SystemExit("no CUDA device (or TRITON_INTERPRET=1): the timings need the GPU; --smoke is the CPU dry run")
    device = "cuda" if cuda else "cpu"
    dtype = plan["dtype"] if cuda else "float32"
    spec = plan["model_spec"]
    e, k, hidden, inter = spec["num_experts"], spec["top_k"], spec["hidden"], spec["intermediate"]
    meas = Measurer(cuda)
    start = time.monotonic()
    meta: dict[str, Any] = {
        "model": plan["model"], "dtype": dtype, "layers_C": num_layers, "budget_s": budget_s,
        "device": torch.cuda.get_device_name() if cuda else "cpu-interpreter", "torch": torch.__version__,
        "triton": __import__("triton").__version__, "commit": os.environ.get("KERNEL_GYM_COMMIT"),
        "timing": "A: measure.worker.WorkloadRunner (collection's path); B-E: timing.time_launch, DEFAULT_TIMING"
                  if cuda else "CPU interpreter: one wall-clock run each, logic only",
        "plan_dataset_sha256_16": plan.get("dataset_sha256_16"), "gpu_start": _gpu_state(cuda)}
    monitor = PowerMonitor(torch.cuda.current_device()).__enter__() if cuda else None
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    gen = torch.Generator(device=device).manual_seed(1234)
    # C's layers: distinct expert weights (as make_inputs draws them), built once for every T
    layer_w = [(torch.randn(e, 2 * inter, hidden, generator=gen, device=device, dtype=torch_dtype)
                .mul_(hidden ** -0.5),
                torch.randn(e, hidden, inter, generator=gen, device=device, dtype=torch_dtype).mul_(inter ** -0.5))
               for _ in range(num_layers)]
    by_t: dict[int, list[dict]] = {}
    for row in plan["rows"]:
        by_t.setdefault(row["T"], []).append(row)
    order = sorted(by_t, key=lambda t: (abs(math.log(t / FOCUS_T)), t))
    results: dict[tuple[int, str], dict] = {}
    routing: dict[int, dict] = {}
    skipped = []
    for t in order:
        if time.monotonic() - start > budget_s:
            skipped.append(t)
            log(f"budget of {budget_s:.0f} s spent: T={t} skipped")
            continue
        t0 = time.monotonic()
        for cfg_s, res in measure_tokens(meas, MoEWorkload(t, e, k, hidden, inter, 0.0, dtype), device,
                                         list(dict.fromkeys(r["config"] for r in by_t[t])), layer_w, routing,
                                         monitor):
            for r in by_t[t]:
                if r["config"] == cfg_s:
                    results[(t, r["policy"])] = res
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        log(f"T={t} done in {time.monotonic() - t0:.1f} s ({time.monotonic() - start:.0f} s so far)")
    meta["gpu_end"] = _gpu_state(cuda)
    if monitor is not None:
        monitor.__exit__(None, None, None)
        meta["power_whole_run"] = monitor.summary().to_dict()
    meta["wall_s"] = round(time.monotonic() - start, 1)
    rows = []
    for r in plan["rows"]:
        res = results.get((r["T"], r["policy"]))
        row = {"T": r["T"], "policy": r["policy"], "config": r["config"],
               "recorded_ms": r["recorded"]["ms"], "recorded_source": r["recorded"]["source"],
               "recorded_estimated": r["recorded"]["estimated"], "recorded_power": r["recorded"].get("power"),
               "priced_tokens": r["priced"]["tokens"], "priced_ms": r["priced"]["ms"],
               "priced_config": r["priced"]["config"], "priced_estimated": r["priced"].get("estimated"),
               "measured": res if res is not None else {"error": "not run (budget)"}}
        ms = {k: v["ms"] for k, v in (res or {}).items() if isinstance(v, dict) and v.get("ms") is not None}
        a = ms.get("A")
        row["ratios"] = {"B/A": _ratio(ms.get("B"), a), "B/A_paired": (res or {}).get("B_over_A_paired"),
                         "B_noflush/B": _ratio(ms.get("B_noflush"), ms.get("B")), "C/A": _ratio(ms.get("C"), a),
                         "E_A/A": _ratio(ms.get("E_A"), a), "E_B/B": _ratio(ms.get("E_B"), ms.get("B")),
                         "D/A": _ratio(ms.get("D"), a), "A/recorded": _ratio(a, r["recorded"]["ms"]),
                         "recorded/priced": _ratio(r["recorded"]["ms"], r["priced"]["ms"]),
                         "C/priced": _ratio(ms.get("C"), r["priced"]["ms"]),
                         "E_B/priced": _ratio(ms.get("E_B"), r["priced"]["ms"])}
        rows.append(row)
    doc = {"meta": meta, "skipped_T": skipped, "routing": {str(t): v for t, v in routing.items()}, "rows": rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / OUT_NAME).write_text(json.dumps(doc, indent=1, default=str))
    log(f"wrote {out_dir / OUT_NAME} ({meta['wall_s']} s)")
    print_table(doc)
    return doc


def print_table(doc: dict) -> None:
    """Per (T, policy): the ms of A (dataset path), C (live-like, per layer), the recorded and priced ms, and the
    ratios that separate the five suspects."""
    cols = ("B/A", "B/A_paired", "C/A", "E_A/A", "E_B/B", "D/A", "A/recorded", "recorded/priced", "C/priced")

    def f(v: Any, w: int = 7, p: int = 3) -> str:
        return f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"

    print(f"{'T':>4} {'policy':<10} {'A_ms':>7} {'C_ms':>7} {'rec_ms':>7} {'prc_ms':>7} "
          + " ".join(f"{c:>{max(7, len(c))}}" for c in cols))
    order = {p: i for i, p in enumerate(dict.fromkeys(r["policy"] for r in doc["rows"]))}
    for r in sorted(doc["rows"], key=lambda r: (r["T"], order[r["policy"]])):
        m = r["measured"]
        a = m.get("A", {}).get("ms") if isinstance(m.get("A"), dict) else None
        c = m.get("C", {}).get("ms") if isinstance(m.get("C"), dict) else None
        pol = r["policy"].replace(TABLE_POLICY, "learned")[:10]
        line = (f"{r['T']:>4} {pol:<10} {f(a)} {f(c)} {f(r['recorded_ms'])} {f(r['priced_ms'])} "
                + " ".join(f(r["ratios"][k], max(7, len(k))) for k in cols))
        print(line + (f"  ERROR {m['error'][:80]}" if "error" in m else ""))


# ---- entry ---------------------------------------------------------------------------------------------------------


ROUTING_TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192)
ROUTING_BLOCK_M = (16, 32, 64, 128)


def routing_table(models: list[str], out_path: Path, tokens: tuple[int, ...] = ROUTING_TOKENS,
                  block_ms: tuple[int, ...] = ROUTING_BLOCK_M) -> dict:
    """GPU: D alone over a grid, the table `run.py --predict` charges per MoE call (`moe_routing_ms`): the live
    stack's routing and bounded alignment (`fused_moe._route_and_align(..., bounded=True)`) captured in a CUDA graph,
    as its decode graphs and piecewise graphs replay it, timed without the L2 flush (the inputs are the router's
    logits, a few KB, which the step has just written), per model (its experts and top-k), BLOCK_M and token count."""
    import torch

    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.kernels.workloads import MoEWorkload
    from kernel_gym.models import load_model

    meas = Measurer(torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1")
    device = "cuda" if meas.cuda else "cpu"
    doc = {"meta": {"what": "fused_moe._route_and_align(bounded=True) in a CUDA graph, no L2 flush, ms per call",
                    "gpu_before": _gpu_state(meas.cuda), "torch": torch.__version__}, "models": {}}
    for name in models:
        m = load_model(name)
        table: dict[str, dict[str, dict]] = {}
        for bm in block_ms:
            for t in tokens:
                wl = MoEWorkload(t, m.num_experts, m.top_k, m.hidden, m.intermediate, 0.0, "bfloat16")
                logits = fm.router_logits(wl, seed=0).to(device)
                inputs = fm.MoEInputs(wl, torch.empty(t, 1, device=device), logits, None, None)
                fn = meas.graph(lambda inputs=inputs, bm=bm: fm._route_and_align(inputs, bm, bounded=True))
                table.setdefault(str(bm), {})[str(t)] = meas.time(fn, flush=False)
            log(f"routing {name} BLOCK_M={bm}: " + " ".join(f"{t}:{table[str(bm)][str(t)]['ms']:.4f}" for t in tokens))
        doc["models"][name] = {"num_experts": m.num_experts, "top_k": m.top_k, "ms": table}
    doc["meta"]["gpu_after"] = _gpu_state(meas.cuda)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1))
    return doc


PLAN_OR_OUT = "give --plan PLAN.json (CPU: write the plan) or --out DIR (GPU: time the plan)"


def smoke_measure(p: argparse.ArgumentParser, args: argparse.Namespace, build: Any, measure: Any) -> int:
    """--smoke of the table scripts (this one, moe_graph_table.py, decode_graph_table.py): the tiny model's plan from
    `build()` written to --out/plan.json and timed there by `measure` under Triton's interpreter (wall clocks), so
    the GPU path is exercised on the CPU before a GPU minute is spent on it."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.out is None:
        p.error("--smoke needs --out")
    plan = build()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan.json").write_text(json.dumps(plan, indent=1))
    measure(plan, args.out, min(args.layers, 2), args.budget_s, smoke=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plan", type=Path, default=None,
                   help="without --out: write the plan here (CPU); with --out: the plan to read (default: the "
                        "committed benchmarks/live_e2e/moe_price_plan.json)")
    p.add_argument("--out", type=Path, default=None, help="GPU: time the plan, write DIR/moe_price_check.json")
    p.add_argument("--model", default="mixtral-8x7b", help="plan mode: a zoo model (mixtral-8x7b, olmoe-1b-7b)")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="plan mode: token counts T (capture sizes)")
    p.add_argument("--policies", default=",".join(POLICIES), help="plan mode: the live policies (run.py's specs)")
    p.add_argument("--layers", type=int, default=4, help="C: layers with distinct weights captured back to back")
    p.add_argument("--budget-s", type=float, default=200.0, help="GPU: start no new T after this many seconds")
    p.add_argument("--smoke", action="store_true",
                   help="CPU dry run under TRITON_INTERPRET=1: the tiny model's plan (T=4, 8; default and learned "
                        "table) written to --out and measured there (no graphs, wall clocks)")
    p.add_argument("--routing-table", type=Path, default=None, metavar="JSON",
                   help="GPU: time only the routing and alignment over token counts and BLOCK_M for --models, "
                        "into this file (what run.py --predict --moe-routing charges per MoE call)")
    p.add_argument("--models", default="mixtral-8x7b,olmoe-1b-7b", help="--routing-table: zoo models")
    args = p.parse_args(argv)
    if args.routing_table is not None:
        routing_table([m for m in args.models.split(",") if m], args.routing_table)
        return 0
    if args.smoke:
        return smoke_measure(p, args, lambda: build_plan("tiny-moe", list(SMOKE_TOKENS), list(SMOKE_POLICIES),
                                                         smoke=True), run_measure)
    if args.out is None:
        if args.plan is None:
            p.error(PLAN_OR_OUT)
        plan = build_plan(args.model, [int(t) for t in args.tokens.split(",")], args.policies.split(","))
        args.plan.write_text(json.dumps(plan, indent=1) + "\n")
        log(f"wrote {args.plan}: {len(plan['rows'])} rows, "
            f"{len({r['config'] for r in plan['rows']})} distinct configs")
        return 0
    plan_path = args.plan or PLAN_PATH
    run_measure(json.loads(plan_path.read_text()), args.out, args.layers, args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
