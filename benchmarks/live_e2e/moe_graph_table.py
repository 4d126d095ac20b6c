"""The live stack's MoE layer as its CUDA graphs run it: a table `run.py --predict --moe-graph` prices graphed steps by.

The packaged dataset times each fused-MoE row as collection does: an eager launch after an L2 flush, routing and
alignment prepared outside the timed closure. A graphed step runs it otherwise: routing and alignment inside the
launch (`fused_moe.prepare_layer(..., route_in_launch=True)`), the layers' calls back to back with no launch gaps and
no flush. `moe_price_check.py` measured both ways at 8-128 tokens (its C: 0.93-1.15x the dataset path, with the
routing inside), so a price built from the dataset's row plus a separately timed routing is off by up to 15% per
call, one way at small token counts and the other at larger ones. This script times C over the graphs' whole range:

- the plan (CPU, `--plan FILE`): per model, the MoE config each live policy runs at every decode-graph capture size
  up to 512 rows (run.py's `LiveSimulator._moe_config`, the config the prediction charges there too), and the grid
  points GRID that bracket each capture size, so the prediction can interpolate a config between two points where
  that config was timed;
- the timings (GPU, `--out DIR`): per model, `--layers` layers with distinct expert weights and routings, their live
  calls captured in one graph and replayed without the L2 flush (DEFAULT_TIMING's repeats), each config first
  checked against the fp32 reference on layer 0 (before and after the capture), per layer the total divided by the
  layers. One JSON file, moe_graph.json; a short table last.

`--eager` does the same for the steps over 512 tokens, which run eagerly (the table `run.py --predict --moe-eager`
reads): steps with prefill chunks are under-priced by 8-12% at every size while their profiled fused MoE priced at
0.92-1.00 of its kernels, and neither the dataset's row (flushed, routing outside, synthetic routing) nor the
routing table (the routing and alignment timed eagerly on their own) times what an eager step runs. The plan: the
config each live policy runs at every token count of an eager step (run.py's `_moe_config(t, t)`) at the grid points
EAGER_GRID that bracket it; the timings: `--layers` layers with distinct weights and the live router's logits (`h @
wr`, as the stack routes), each layer's closure prepared and launched in turn as run.py's eager forward does
(`prepare_layer(..., route_in_launch=True)()`: routing inside, bounded grids), no graph, no flush, per layer the
total / layers; each config checked against the fp32 reference on layer 0 first. One JSON file, moe_eager.json.

    python3 benchmarks/live_e2e/moe_graph_table.py --plan benchmarks/live_e2e/moe_graph_plan.json    # CPU
    python3 benchmarks/live_e2e/moe_graph_table.py --out $OUT/moe_graph                        # GPU (32 s on the H200)
    TRITON_INTERPRET=1 python3 benchmarks/live_e2e/moe_graph_table.py --smoke --out /tmp/mgt          # CPU dry run
    python3 benchmarks/live_e2e/moe_graph_table.py --eager --plan benchmarks/live_e2e/moe_eager_plan.json   # CPU
    python3 benchmarks/live_e2e/moe_graph_table.py --eager --out $OUT/moe_eager                          # GPU
    TRITON_INTERPRET=1 python3 benchmarks/live_e2e/moe_graph_table.py --eager --smoke --out /tmp/met     # CPU dry run

The GPU mode imports only torch, triton, numpy, the standard library and kernel_gym.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.live_e2e.moe_price_check import (  # noqa: E402
    PLAN_OR_OUT,
    TABLE_POLICY,
    Measurer,
    _checked,
    _gpu_state,
    graph_layers,
    live_config,
    real_router_logits,
    smoke_measure,
    write_doc,
)
from benchmarks.live_e2e.run import EAGER_GRID  # noqa: E402

HERE = Path(__file__).resolve().parent
PLAN_PATH = HERE / "moe_graph_plan.json"
OUT_NAME = "moe_graph.json"
GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # capture sizes timed; the rest interpolate
MODEL_POLICIES = {"mixtral-8x7b": ("default", "vllm-table", TABLE_POLICY), "olmoe-1b-7b": ("default", "vllm-table")}
SMOKE_GRID = (4, 8)
EAGER_PLAN_PATH = HERE / "moe_eager_plan.json"
EAGER_OUT_NAME = "moe_eager.json"
# the live policies' MoE configs at eager sizes: the graph plan's, and the retrained tables run live (session 48)
RETRAINED = tuple(f"table:benchmarks/live_e2e/tables/mixtral_seed{s}/dispatch_table.json" for s in (0, 1, 2))
EAGER_MODEL_POLICIES = {"mixtral-8x7b": (*MODEL_POLICIES["mixtral-8x7b"], *RETRAINED),
                        "olmoe-1b-7b": MODEL_POLICIES["olmoe-1b-7b"]}
SMOKE_EAGER_GRID = (8, 16)
CHUNK_GRID = GRID[GRID.index(16):]  # steps with prefill chunks: a chunk and the decode rows beside it, 16 rows up


def log(msg: str) -> None:
    print(f"[moe_graph_table {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def bracket(t: int, grid: tuple[int, ...]) -> tuple[int, int]:
    """The grid points at or below and at or above t (the same point when t is on the grid)."""
    if not grid[0] <= t <= grid[-1]:
        raise ValueError(f"{t} rows is outside the grid {grid[0]}..{grid[-1]}")
    return max(g for g in grid if g <= t), min(g for g in grid if g >= t)


def build_plan(model_policies: dict[str, tuple[str, ...]], grid: tuple[int, ...] = GRID, smoke: bool = False,
               eager: bool = False, chunk: bool = False) -> dict:
    """Per model: the (T, config) points to time: for every capture size up to the grid's last point (eager: every
    token count over the grid's first point, as eager steps run unpadded) and every policy, the config the live run
    executes there at its two bracketing grid points (configs the family's rules refuse at a grid point are left out
    there: the prediction falls back where it cannot interpolate)."""
    from benchmarks.live_e2e import run as le
    from benchmarks.live_e2e.moe_price_check import _live_simulator
    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import MoEWorkload
    from kernel_gym.models import load_model
    from kernel_gym.traffic.simulator import capture_size

    dtype = "float32" if smoke else "bfloat16"
    if eager:
        caps = list(range(grid[0] + 1, grid[-1] + 1))
    else:
        caps = sorted({capture_size(n) for n in range(grid[0], grid[-1] + 1)})
    plan: dict[str, Any] = {"mode": "eager" if eager else "graph", "routing": "chunk" if chunk else "even",
                            "grid": list(grid), "dtype": dtype, "models": {}}
    for name, policies in model_policies.items():
        model = le.TINY if smoke else load_model(name)
        points: dict[int, set[str]] = {}
        for spec in policies:
            sim = _live_simulator(model, spec, dtype)
            for cs in caps:
                cfg = live_config(sim, cs, cs)
                for g in set(bracket(cs, grid)):
                    wl = MoEWorkload(g, model.num_experts, model.top_k, model.hidden, model.intermediate, 0.0, dtype)
                    if fm.FAMILY.space.is_valid(Config.parse(cfg), wl):
                        points.setdefault(g, set()).add(cfg)
        from dataclasses import asdict

        plan["models"][model.name] = {"model_spec": asdict(model), "policies": list(policies),
                                      "points": {str(g): sorted(points[g]) for g in sorted(points)}}
        log(f"{model.name}: {sum(len(v) for v in points.values())} points, "
            f"{len(set().union(*points.values()))} configs")
    return plan


def eager_layers(meas: Measurer, inputs: list, ref0: Any, cfg: Any, dtype: str) -> dict:
    """The layers' live calls as an eager step runs them (run.py's _layer_pieces outside a graph: each layer's
    `prepare_layer(..., route_in_launch=True)` built and launched in turn inside the step), timed without the L2
    flush; layer 0 checked against the reference first (twice, as collection checks a row). ms per layer (the
    median / layers), with the whole call's timing; or {"error": why}."""
    from kernel_gym.kernels import fused_moe as fm

    _, wrong = _checked(lambda: fm.prepare_layer(inputs[0], cfg, route_in_launch=True)(), ref0, dtype)
    if wrong:
        return {"error": f"layer 0: {wrong}"}

    def step() -> None:
        for li in inputs:
            fm.prepare_layer(li, cfg, route_in_launch=True)()

    step()  # every layer compiled and warm before the timing
    whole = meas.time(step, flush=False)
    return {**whole, "ms": whole["ms"] / len(inputs), "layers": len(inputs), "total_ms": whole["ms"]}


def chunk_inputs(spec: dict, wl: Any, weights: list, gen: Any, device: str, torch_dtype: Any) -> list:
    """The MoE inputs of every layer of the live stack (run.py's Stack and step: random embedded tokens; per layer
    RMSNorm, QKV, causal attention with GQA, the output projection added to the residual, RMSNorm, the router, the MoE
    added to the residual) for one fresh sequence of wl.num_tokens tokens, the MoE weights cycled from `weights`.
    A chunk's tokens attend to the same earlier tokens, so their hidden states grow alike layer by layer and the
    router sends them to a few experts (more row blocks per expert than an even routing); a decode batch's rows,
    from different sequences, stay independent."""
    import torch

    from kernel_gym.kernels import fused_moe as fm

    t, hidden = wl.num_tokens, spec["hidden"]
    nh, nkv, d = spec["num_heads"], spec["num_kv_heads"], spec["head_dim"]
    q_dim, kv_dim = nh * d, nkv * d

    def rnd(*shape: int, scale: float) -> Any:
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale).to(torch_dtype)

    def rmsnorm(x: Any) -> Any:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    x = rnd(t, hidden, scale=1.0)
    inputs = []
    for i in range(spec["num_layers"]):
        wqkv, wo = rnd(hidden, q_dim + 2 * kv_dim, scale=hidden ** -0.5), rnd(q_dim, hidden, scale=q_dim ** -0.5)
        wr = rnd(hidden, spec["num_experts"], scale=hidden ** -0.5)
        qkv = rmsnorm(x) @ wqkv
        q = qkv[:, :q_dim].view(t, nh, d).transpose(0, 1)
        kv = [qkv[:, q_dim + j * kv_dim:q_dim + (j + 1) * kv_dim].view(t, nkv, d).transpose(0, 1)
              .repeat_interleave(nh // nkv, 0) for j in (0, 1)]
        attn = torch.nn.functional.scaled_dot_product_attention(q, *kv, is_causal=True, scale=d ** -0.5)
        x = x + attn.transpose(0, 1).reshape(t, q_dim) @ wo
        h = rmsnorm(x).contiguous()
        w1, w2 = weights[i % len(weights)]
        layer = fm.MoEInputs(wl, h, (h @ wr).float(), w1, w2)
        inputs.append(layer)
        x = x + fm.FAMILY.reference(layer).to(torch_dtype)
    return inputs


def routing_balance(inputs: list) -> list[float]:
    """Per layer, the busiest expert's share of the routed slots over an even share (1.0: even)."""
    import torch

    from kernel_gym.kernels import fused_moe as fm

    out = []
    for layer in inputs:
        wl = layer.workload
        ids = fm.route(layer.router_logits, wl.top_k)[1]
        counts = torch.bincount(ids.flatten().long(), minlength=wl.num_experts)
        out.append(float(counts.max()) * wl.num_experts / (wl.num_tokens * wl.top_k))
    return out


def measure_model(meas: Measurer, spec: dict, points: dict[str, list[str]], dtype: str, device: str, layers: int,
                  deadline: float, eager: bool = False, chunk: bool = False) -> tuple[dict, list[int], dict]:
    """{config: {T: timing per layer}} for one model (errors in place of a timing), the T left by the deadline, and
    (chunk) per T each layer's routing balance. eager: the live router's logits on random rows and eager_layers;
    else synthetic routings and graph_layers; chunk: every layer of one sequence's chunk as the live stack routes it
    (chunk_inputs), timed either way."""
    import torch

    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import MoEWorkload

    e, k, hidden, inter = spec["num_experts"], spec["top_k"], spec["hidden"], spec["intermediate"]
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    gen = torch.Generator(device=device).manual_seed(1234)
    weights = [(torch.randn(e, 2 * inter, hidden, generator=gen, device=device, dtype=torch_dtype)
                .mul_(hidden ** -0.5),
                torch.randn(e, hidden, inter, generator=gen, device=device, dtype=torch_dtype).mul_(inter ** -0.5))
               for _ in range(layers)]
    table: dict[str, dict[str, Any]] = {}
    skipped: list[int] = []
    balance: dict[str, list[float]] = {}
    for t_s in sorted(points, key=int):
        t = int(t_s)
        if time.monotonic() > deadline:
            skipped.append(t)
            continue
        wl = MoEWorkload(t, e, k, hidden, inter, 0.0, dtype)
        if chunk:  # every layer's inputs as the live stack routes one sequence's chunk
            inputs = chunk_inputs(spec, wl, weights, gen, device, torch_dtype)
            balance.setdefault(t_s, [round(b, 3) for b in routing_balance(inputs)])
        else:
            x = torch.randn(t, hidden, generator=gen, device=device, dtype=torch_dtype)
            inputs = [fm.MoEInputs(wl, x, (real_router_logits(x, e, seed=1 + i) if eager
                                           else fm.router_logits(wl, seed=1 + i).to(device)), w1, w2)
                      for i, (w1, w2) in enumerate(weights)]
        ref0 = fm.FAMILY.reference(inputs[0])
        timed = eager_layers if eager else graph_layers
        for cfg_s in points[t_s]:
            c0 = time.monotonic()
            try:
                res = timed(meas, inputs, ref0, Config.parse(cfg_s), dtype)
            except Exception as exc:  # noqa: BLE001 - a failing config is reported, the others still run
                res = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
            res["seconds"] = round(time.monotonic() - c0, 2)
            table.setdefault(cfg_s, {})[t_s] = res
            log(f"T={t} {cfg_s}: " + (res["error"] if "error" in res else f"{res['ms']:.4f} ms per layer")
                + f" ({res['seconds']} s)")
        if meas.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return table, skipped, balance


def out_name(eager: bool, chunk: bool) -> str:
    return ("moe_chunk_" if chunk else "moe_") + ("eager.json" if eager else "graph.json")


def plan_path(eager: bool, chunk: bool) -> Path:
    return HERE / (out_name(eager, chunk).replace(".json", "_plan.json"))


def run_measure(plan: dict, out_dir: Path, layers: int, budget_s: float, smoke: bool = False) -> dict:
    import torch

    cuda = torch.cuda.is_available() and not smoke and os.environ.get("TRITON_INTERPRET") != "1"
    if not cuda and not smoke:
        raise SystemExit("no CUDA device (or TRITON_INTERPRET=1): the timings need the GPU; --smoke is the CPU dry run")
    device, dtype = ("cuda", plan["dtype"]) if cuda else ("cpu", "float32")
    eager, chunk = plan.get("mode") == "eager", plan.get("routing") == "chunk"
    meas = Measurer(cuda)
    start = time.monotonic()
    what = ("fused_moe.prepare_layer(route_in_launch=True) built and launched per layer for `layers` layers with "
            "distinct weights and the live router's logits, eagerly (no graph), no L2 flush; ms per layer (the "
            "median / layers)" if eager else
            "fused_moe.prepare_layer(route_in_launch=True) for `layers` layers with distinct weights in one CUDA "
            "graph, no L2 flush; ms per layer (the graph's median / layers)")
    if chunk:
        what += ("; every layer (num_layers of them, the weights cycled from `layers` sets) with the inputs of one "
                 "sequence's chunk as the live stack routes it (chunk_inputs), not a synthetic routing")
    doc: dict[str, Any] = {"meta": {
        "what": what, "mode": "eager" if eager else "graph", "routing": "chunk" if chunk else "even",
        "layers": layers, "grid": plan["grid"], "dtype": dtype, "budget_s": budget_s,
        "device": torch.cuda.get_device_name() if cuda else "cpu-interpreter", "torch": torch.__version__,
        "triton": __import__("triton").__version__, "commit": os.environ.get("KERNEL_GYM_COMMIT"),
        "gpu_before": _gpu_state(cuda)}, "models": {}}
    share = budget_s / max(1, len(plan["models"]))
    for i, (name, entry) in enumerate(plan["models"].items()):
        deadline = start + share * (i + 1)
        table, skipped, balance = measure_model(meas, entry["model_spec"], entry["points"], dtype, device, layers,
                                                deadline, eager, chunk)
        doc["models"][name] = {"policies": entry["policies"], "ms": table, "skipped_T": skipped,
                               **({"routing_balance": balance} if chunk else {})}
        log(f"{name} done ({time.monotonic() - start:.0f} s so far; skipped T {skipped})")
    out_path = write_doc(doc, out_dir / out_name(eager, chunk), start, cuda)
    log(f"wrote {out_path} ({doc['meta']['wall_s']} s)")
    print_table(doc)
    return doc


def print_table(doc: dict) -> None:
    """Per model and T: how many configs were timed, and their per-layer ms range."""
    for name, entry in doc["models"].items():
        by_t: dict[int, list[float]] = {}
        errors = 0
        for per_t in entry["ms"].values():
            for t, res in per_t.items():
                if "ms" in res:
                    by_t.setdefault(int(t), []).append(res["ms"])
                else:
                    errors += 1
        print(f"{name}: {sum(len(v) for v in by_t.values())} timed, {errors} failed, skipped T {entry['skipped_T']}")
        for t in sorted(by_t):
            print(f"  T={t:>4}: {len(by_t[t])} configs, {min(by_t[t]):.4f}-{max(by_t[t]):.4f} ms per layer")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plan", type=Path, default=None,
                   help="without --out: write the plan here (CPU); with --out: the plan to read (default: the "
                        "committed benchmarks/live_e2e/moe_graph_plan.json, with --eager moe_eager_plan.json)")
    p.add_argument("--out", type=Path, default=None,
                   help="GPU: time the plan, write DIR/moe_graph.json (--eager: DIR/moe_eager.json)")
    p.add_argument("--eager", action="store_true",
                   help="eager steps' sizes (run.EAGER_GRID) and the call as an eager step runs it (no graph)")
    p.add_argument("--chunk", action="store_true",
                   help="the steps with prefill chunks: every layer's inputs as the live stack routes one "
                        "sequence's chunk (chunk_inputs), every live policy's configs; DIR/moe_chunk_graph.json "
                        "(--eager: moe_chunk_eager.json), the tables run.py --moe-chunk reads")
    p.add_argument("--layers", type=int, default=4, help="layers with distinct weights captured back to back")
    p.add_argument("--budget-s", type=float, default=300.0, help="GPU: start no new T after this many seconds "
                   "(shared evenly by the plan's models)")
    p.add_argument("--policies", default="", metavar="MODEL=SPEC,SPEC",
                   help="with --plan (CPU): plan these policies of one model instead of every live policy (e.g. "
                        "mixtral-8x7b=table:benchmarks/live_e2e/tables/mixtral_seed0/dispatch_table.json)")
    p.add_argument("--smoke", action="store_true",
                   help="CPU dry run under TRITON_INTERPRET=1: the tiny model's plan (T=4, 8), wall clocks")
    args = p.parse_args(argv)
    if args.smoke:
        return smoke_measure(p, args, lambda: build_plan({"tiny-moe": ("default", TABLE_POLICY)},
                                                         SMOKE_EAGER_GRID if args.eager else SMOKE_GRID, smoke=True,
                                                         eager=args.eager, chunk=args.chunk), run_measure)
    if args.out is None:
        if args.plan is None:
            p.error(PLAN_OR_OUT)
        chosen = EAGER_MODEL_POLICIES if args.eager or args.chunk else MODEL_POLICIES
        if args.policies:
            model, _, specs = args.policies.partition("=")
            if not specs:
                p.error(f"--policies {args.policies!r}: write MODEL=SPEC[,SPEC] (e.g. mixtral-8x7b=vllm-table)")
            chosen = {model: tuple(specs.split(","))}
        grid = EAGER_GRID if args.eager else CHUNK_GRID if args.chunk else GRID
        plan = build_plan(chosen, grid, eager=args.eager, chunk=args.chunk)
        args.plan.write_text(json.dumps(plan, indent=1) + "\n")
        log(f"wrote {args.plan}")
        return 0
    path = args.plan or plan_path(args.eager, args.chunk)
    if not path.exists():
        raise SystemExit(f"{path}: no plan; write one on the CPU first (--plan {path})")
    plan = json.loads(path.read_text())
    if (plan.get("mode") == "eager") != args.eager:
        raise SystemExit(f"{path} is a {plan.get('mode', 'graph')} plan: pass --eager with an eager plan only")
    if (plan.get("routing") == "chunk") != args.chunk:
        raise SystemExit(f"{path} is a {plan.get('routing', 'even')}-routing plan: pass --chunk with a chunk plan only")
    run_measure(plan, args.out, args.layers, args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
