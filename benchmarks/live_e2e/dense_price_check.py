"""What the live stack's dense ops cost, timed on the GPU: the table `run.py --predict --dense-ops` prices them from.

The simulator prices a step's untuned ops (norms, the QKV, output and router projections, the KV-cache writes, the
residual adds, the LM head) by a roofline (`measure/roofline.dense_step_s`). Kernel profiles of live steps
(`run.py --profile-every`, benchmarks/live_e2e/profile_b563b8d/) found those ops taking 4-9x that price: at decode
sizes each is a small kernel, well below the roofline, and a layer runs about a dozen of them. This script times them
as the live stack runs them, per zoo model and token count:

- `layer_ms[T]`: one layer's dense pieces over T rows (run.py's attn_in and attn_out, plus the residual add the MoE
  output takes), `--layers` layers with distinct weights back to back in one CUDA graph, not flushed (as the stack
  runs them: each layer's weights evict the last's), the replay's median divided by the layers;
- `sample_ms[N]`: the final norm, LM head and greedy pick over N rows (run.py's sample), in a graph.

Medians of kernel_gym's event timing (time_launch) with spreads; the GPU's clocks and power state before and after.

`--eager`: the same ops launched as an eager step launches them (no graph; time_launch's spin before each sample
gives the host a head start, as a step's earlier work does) at the eager steps' token counts (run.EAGER_GRID): the
table `run.py --predict --dense-eager` prices eager steps' dense ops from. On the profiled steps with prefill chunks
of benchmarks/live_e2e/graph_5ebaec4/window1_spans the graph table priced the dense ops at 0.82-0.86 of their
kernels' time; the eager table tells whether running them outside a graph is the difference.

    python3 benchmarks/live_e2e/dense_price_check.py --out $OUT/dense_ops.json                 # GPU (~1 min)
    python3 benchmarks/live_e2e/dense_price_check.py --eager --out $OUT/dense_eager.json       # GPU
    python3 benchmarks/live_e2e/dense_price_check.py --smoke --out /tmp/dense_ops.json         # CPU dry run (tiny)

Imports only torch, numpy, the standard library and kernel_gym (with run.py's stack).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096)
LOGITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MODELS = ("mixtral-8x7b", "olmoe-1b-7b")
VOCAB = {"mixtral-8x7b": 32000, "olmoe-1b-7b": 50304}  # run.py --vocab for each model's live runs


def log(msg: str) -> None:
    print(f"[dense_price_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _timer(device: str, eager: bool = False) -> Any:
    """(fn -> (median ms, spread)): graph replays (eager: fn launched as it is, run once first to compile) under
    kernel_gym's event timing, unflushed; wall clock on the CPU."""
    if device == "cuda":
        from kernel_gym.measure.timing import TimingOptions, capture_graph, time_launch

        opts = TimingOptions(min_reps=5, max_reps=15, target_spread=0.03, flush=False, heat_max_s=10.0)

        def timed(fn: Any) -> tuple[float, float]:
            if eager:
                fn()
            t = time_launch(fn if eager else capture_graph(fn), opts)
            return t.median_ms, t.spread
        return timed

    def wall(fn: Any) -> tuple[float, float]:
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3, 0.0
    return wall


def time_model(model: Any, vocab: int, layers: int, tokens: list[int], logits: list[int], device: str,
               dtype: Any, eager: bool = False) -> dict:
    """One model's layer_ms and sample_ms tables (module docstring)."""
    import torch

    from benchmarks.live_e2e import run as le
    from kernel_gym.kernels.workloads import MoEWorkload

    spec = dataclasses.replace(model, num_layers=layers)
    max_t = max(tokens)
    num_pages = -(-max_t // le.PAGE.page_size) + 1
    st = le.Stack(spec, num_pages, max_t, device, dtype, vocab, max_seqs=max(logits), max_context=le.PAGE.page_size)
    timed = _timer(device, eager)
    layer_ms, sample_ms = {}, {}
    for t in tokens:
        slot_t = torch.arange(t, device=device, dtype=torch.int64)
        wl = MoEWorkload(t, model.num_experts, model.top_k, model.hidden, model.intermediate, 0.0,
                         "bfloat16" if device == "cuda" else "float32")

        def dense(t: int = t, slot_t: Any = slot_t, wl: MoEWorkload = wl) -> None:
            for layer in st.layers:
                le.attn_in(st, layer, t, slot_t)
                moe_in = le.attn_out(st, layer, t, wl)
                st.x_res[:t].add_(moe_in.x)  # the add the MoE layer's output takes
        st.x_res.copy_(st.x0)
        ms, spread = timed(dense)
        layer_ms[t] = {"ms": ms / layers, "spread": spread}
    for n in logits:
        ms, spread = timed(lambda n=n: le.sample(st, n, n))
        sample_ms[n] = {"ms": ms, "spread": spread}
    return {"layers_timed": layers, "vocab": vocab, "mode": "eager" if eager else "graph", "layer_ms": layer_ms,
            "sample_ms": sample_ms}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the table's JSON path")
    p.add_argument("--models", default=",".join(MODELS), help="zoo models, comma-separated")
    p.add_argument("--layers", type=int, default=4, help="layers with distinct weights in one graph")
    p.add_argument("--eager", action="store_true",
                   help="launch the ops eagerly (no graph) at the eager steps' token counts (run.EAGER_GRID)")
    p.add_argument("--smoke", action="store_true", help="CPU dry run: the tiny model, fp32, wall clocks")
    args = p.parse_args(argv)
    import torch

    from benchmarks.live_e2e import run as le
    from kernel_gym.models import load_model

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if device == "cpu" and not args.smoke:
        raise SystemExit("no GPU here: dense_price_check times the stack's ops on CUDA (or pass --smoke for a dry run)")
    table: dict[str, Any] = {"what": __doc__.split("\n\n")[0], "torch": torch.__version__,
                             "commit": os.environ.get("KERNEL_GYM_COMMIT"), "models": {}}
    table["mode"] = "eager" if args.eager else "graph"
    tokens = list(le.EAGER_GRID if args.eager else TOKENS)
    if args.smoke:
        table["models"][le.TINY.name] = time_model(le.TINY, 64, 2, [8, 16] if args.eager else [1, 8, 16], [1, 4],
                                                   device, torch.float32, args.eager)
    else:
        table["gpu_before"] = le.gpu_state(device)
        for name in args.models.split(","):
            t0 = time.time()
            model = load_model(name)
            table["models"][name] = time_model(model, VOCAB.get(name, 32000), args.layers, tokens, list(LOGITS),
                                               device, torch.bfloat16, args.eager)
            torch.cuda.empty_cache()  # the model's stack is gone: its memory back before the next one
            log(f"{name}: {time.time() - t0:.0f} s")
        table["gpu_after"] = le.gpu_state(device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    for name, entry in table["models"].items():
        print(f"{name}: per layer " + ", ".join(f"T={t} {v['ms'] * 1e3:.0f} us" for t, v in entry["layer_ms"].items())
              + "; sample " + ", ".join(f"N={n} {v['ms'] * 1e3:.0f} us" for n, v in entry["sample_ms"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
