"""A live end-to-end replay on one GPU: a model-shaped MoE stack serves a trace window in real time, beside the
serving simulator's prediction for the same trace, model, configs, page size and chunk budget (issue 29).

The server: every layer of a zoo model at its real shapes with random bf16 weights (RMSNorm, fused QKV projection,
the K/V written into a paged cache of 16-token NHD pages, attention, output projection, RMSNorm, router, the fused
MoE layer; final norm and LM head on the rows that sample a token). Attention runs kernel_gym's kernels on the
cache: prefill chunks through prefix_prefill (causal within the chunk, full to the request's earlier tokens, read
through the block table), decodes through decode_attention; the MoE through fused_moe; configs from the policy
(each family's default config, or a dispatch table), chosen on the simulator's rounded workloads. Scheduling is the
simulator's own (continuous batching, chunked prefill under --max-batched-tokens, pages, preemption): a subclass
executes each step on the GPU and advances the clock by the measured seconds (Simulator._step_seconds), so arrivals,
queueing and batching happen against real time. Kernel metadata (work tables, block tables, descriptors) is built
before each step's timer starts; the MoE routing and alignment run inside it, on the GPU with no host sync
(fused_moe's route_in_launch). Decode-only steps replay a CUDA graph captured per capture size (vLLM's: 1, 2, 4,
then multiples of 8; the padded rows read and write a scratch page) and config pair, with the block table, context
lengths and slots in static buffers; steps with prefill chunks of up to 512 tokens run piecewise graphs (each
layer's work before and after attention replayed, the attention launched eagerly between), larger ones eagerly
(`--graphs off`: every step eager).

Per policy: measured tokens/s, TTFT p50, TPOT p50 (and p99s) over the window, the per-step record (step kind,
tokens, decode batch, measured seconds) in $OUT/<policy>_steps.json. `--predict` (CPU, afterwards) runs the plain
simulator on the same window with the packaged H200 dataset (BackendTimer(recorded)) and writes summary.json: per
policy measured and predicted tokens/s, TTFT p50 and TPOT p50 and their relative errors (with --calibrate, also a
prediction with step overheads fitted on one policy's step records); and untimed_plan.json, the policies' choices
the dataset could not time, for `kernel-gym collect --plan` on the GPU. The prediction charges the live fused MoE's
in-launch routing and alignment per MoE call x layers from a measured table (`--moe-routing`, default
moe_price_check_run1/moe_routing.json; `none`: off), which the dataset's rows exclude, and the dense ops (norms,
projections, KV writes, adds, LM head) from the stack's own timed table (`--dense-ops`, default
dense_217cbde/dense_ops.json from dense_price_check.py; `none`: the simulator's roofline, which kernel profiles of
live steps found 4-9x too low). A graphed step's MoE is priced from the live call timed as its graphs run it
(`--moe-graph`, moe_graph_table.py; routing inside), each step's host overhead from the host's part measured in live
runs' records (`--step-host`: seconds minus the GPU span), an eager step no lower than the host's issue time
(measured on the serving host before each policy's replay, calibrate_issue; for runs without it, a committed run's:
`--eager-issue`), and no compile stalls: the live run compiles and captures untimed. An eager step's MoE is priced
from the live call timed as eager steps run it (`--moe-eager`, moe_graph_table.py --eager; routing inside) and its
dense ops from the ops timed eagerly (`--dense-eager`, dense_price_check.py --eager). Steps with prefill chunks can
be priced from MoE tables timed with the live stack's routing of a chunk (`--moe-chunk`, moe_graph_table.py --chunk:
a chunk's tokens go to few experts) or, on the CPU, at the dataset's matching skew (`--chunk-routing`); both off.
A decode batch is priced from its own contexts by the wave model, fitted per config on that config's launches timed
as the stack's CUDA graphs replay them where the decode graph table times it (`--decode-graph`), else on the
dataset's rows.
`--summary-dir DIR` writes the prediction there instead of beside the run (predict_all.sh: every graphed run).

    python3 benchmarks/live_e2e/run.py --out $OUT/live_e2e --policies default,table:TABLE.json --budget-s 420   # GPU
    python3 benchmarks/live_e2e/run.py --out benchmarks/live_e2e --predict                           # CPU, afterwards
    python3 benchmarks/live_e2e/run.py --live-check RUN [RUN ...]     # CPU: the error ranges replay prints
    TRITON_INTERPRET=1 python3 benchmarks/live_e2e/run.py --out /tmp/e2e --smoke                     # CPU dry run, tiny

Imports only torch, triton, numpy, the standard library and kernel_gym.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from kernel_gym.kernels.space import Config  # noqa: E402
from kernel_gym.kernels.workloads import MoEWorkload, PrefixPrefillWorkload  # noqa: E402
from kernel_gym.models import ModelSpec, load_model  # noqa: E402
from kernel_gym.traffic.simulator import (  # noqa: E402
    SKEW_GRID,
    STEP_KINDS,
    STEP_OVERHEAD_S,
    KVLayout,
    Simulator,
    capture_size,
    round_count,
    round_log4,
    round_up16,
)
from kernel_gym.traffic.traces import Trace, load_trace  # noqa: E402

PAGE = KVLayout(16, "NHD")
TINY = ModelSpec("tiny-moe", num_layers=2, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16, num_experts=4,
                 top_k=2, intermediate=32)
METRICS = ("tokens_per_s", "ttft_p50_s", "tpot_p50_s")
SMOKE_REQUESTS = 6


def log(msg: str) -> None:
    print(f"[live_e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- policies --------------------------------------------------------------------------------------------------


class DefaultChooser:
    """Each family's default config (decode and prefix_prefill on the KV layout in force)."""

    name = "default"

    def __init__(self) -> None:
        self._memo: dict[tuple, Config] = {}

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        key = (kernel, workload.key(), kv)
        cfg = self._memo.get(key)
        if cfg is None:
            from kernel_gym.kernels import get_family

            cfg = get_family(kernel).default_config(workload)
            if kernel in ("decode_attention", "prefix_prefill"):
                cfg = cfg.replace(PAGE_SIZE=kv.page_size, LAYOUT=kv.layout)
            self._memo[key] = cfg
        return cfg


class TableChooser(DefaultChooser):
    """A dispatch table (`kernel-gym export --format dispatch`) for the kernels it holds, defaults for the rest."""

    def __init__(self, path: str) -> None:
        super().__init__()
        from kernel_gym.dispatch.dispatcher import Dispatcher

        self.name = f"table:{Path(path).name}"
        self.dispatcher = Dispatcher.load(path)
        self.kernels = set(getattr(self.dispatcher, "_tables", {}) or {})
        from kernel_gym.deploy.export import stale_dataset, stale_line

        for k, t in self.dispatcher.table.kernels.items():  # a table is a snapshot: its policies may predate the rows
            stale = stale_dataset(k, str(t.policy.get("dataset_sha256_16") or ""), self.dispatcher.table.model.get(
                "name", "?")).get("stale")
            if stale:
                log(f"{path}: {stale_line(k, stale)}")

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        if kernel in self.kernels:
            return self.dispatcher.choose(kernel, workload, kv)
        return super().choose(kernel, workload, kv)


class VllmTableChooser(DefaultChooser):
    """`kernel-gym replay`'s vllm-table baseline (dispatch.baselines: a per-M fused-MoE table tuned offline on uniform
    routing, as vLLM's benchmark_moe.py writes it, and one static config per attention kernel), built from the
    packaged H200 dataset; kernels it has no entry for (prefix_prefill) keep their defaults."""

    name = "vllm-table"

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        from kernel_gym.dispatch.baselines import make_baselines
        from kernel_gym.measure import make_backend

        self.table = make_baselines(["vllm-table"], make_backend("recorded"), model)["vllm-table"]()

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        if kernel == "fused_moe" or kernel in self.table.static:
            return self.table.choose(kernel, workload, kv)
        return super().choose(kernel, workload, kv)


def make_chooser(spec: str, model: ModelSpec | None = None) -> Any:
    if spec == "default":
        return DefaultChooser()
    if spec == "vllm-table" and model is not None:
        return VllmTableChooser(model)
    if spec.startswith("table:"):
        return TableChooser(spec[len("table:"):])
    raise SystemExit(f"policy {spec!r}: use 'default', 'vllm-table' or 'table:PATH' (a dispatch table JSON)")


# ---- the model-shaped stack ------------------------------------------------------------------------------------


PIECEWISE_MAX_TOKENS = 512  # steps with prefill chunks up to this many tokens run piecewise graphs (vLLM's default)
# The token counts the eager tables time (moe_graph_table.py --eager, dense_price_check.py --eager): the steps over
# PIECEWISE_MAX_TOKENS, which run eagerly, up to the chunk budget (--max-batched-tokens 4096 holds a mixed step's
# decodes too: no live step record has more than 4096 tokens).
EAGER_GRID = (512, 768, 1024, 1536, 2048, 3072, 4096)


class Stack:
    """Random weights at the model's shapes, the paged KV cache (plus one scratch page that padded graph rows read
    and write), the static buffers a captured decode step reads, and the launches of one layer's attention."""

    def __init__(self, model: ModelSpec, num_pages: int, max_tokens: int, device: str, dtype: Any,
                 vocab: int, max_seqs: int = 256, max_context: int = 4352, seed: int = 0) -> None:
        import torch

        self.torch, self.m, self.device, self.dtype = torch, model, device, dtype
        m = model
        g = torch.Generator(device=device).manual_seed(seed)
        h, q, kv, d = m.hidden, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.head_dim

        def rnd(*shape: int, scale: float) -> Any:
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * scale).to(dtype)

        self.scratch_page = num_pages  # never handed out: padded decode rows of a graph use it
        self.layers = []
        for _ in range(m.num_layers):
            self.layers.append(dict(
                norm1=torch.ones(h, device=device, dtype=dtype), norm2=torch.ones(h, device=device, dtype=dtype),
                wqkv=rnd(h, q + 2 * kv, scale=h ** -0.5), wo=rnd(q, h, scale=q ** -0.5),
                wr=rnd(h, m.num_experts, scale=h ** -0.5),
                w1=rnd(m.num_experts, 2 * m.intermediate, h, scale=h ** -0.5),
                w2=rnd(m.num_experts, h, m.intermediate, scale=m.intermediate ** -0.5),
                k_cache=torch.zeros(num_pages + 1, PAGE.page_size, m.num_kv_heads, d, device=device, dtype=dtype),
                v_cache=torch.zeros(num_pages + 1, PAGE.page_size, m.num_kv_heads, d, device=device, dtype=dtype),
            ))
        self.final_norm = torch.ones(h, device=device, dtype=dtype)
        self.lm_head = rnd(h, vocab, scale=h ** -0.5)
        rows = max(max_tokens, capture_size(max_seqs), PIECEWISE_MAX_TOKENS)
        self.x0 = rnd(rows, h, scale=1.0)  # the step's embedded tokens (random: the values do not matter)
        self.x_res = torch.empty_like(self.x0)  # the residual stream, in place (graphs read and write it there)
        self.q_buf = torch.empty(self.x0.shape[0], m.num_heads, d, device=device, dtype=dtype)
        self.attn = torch.zeros(self.x0.shape[0], m.num_heads, d, device=device, dtype=dtype)  # padded rows stay finite
        rows = max(capture_size(max_seqs), PIECEWISE_MAX_TOKENS)
        width = -(-max_context // PAGE.page_size)
        self.g_slots = torch.full((rows,), self.scratch_page * PAGE.page_size, dtype=torch.int64, device=device)
        self.g_block_table = torch.full((rows, width), self.scratch_page, dtype=torch.int32, device=device)
        self.g_context = torch.ones(rows, dtype=torch.int32, device=device)
        self.free = list(range(num_pages - 1, -1, -1))
        self.pages: dict[int, list[int]] = {}
        # (rows, decode config, MoE config) -> (graph or None on the CPU, forward, launches); one memory pool
        self.graphs: dict[tuple, tuple] = {}
        self.graph_pool: Any = None

    def capture(self, fn: Any) -> Any:
        """fn as a CUDA graph in the stack's one memory pool (run once first, so what is new compiles and the graph
        holds launches only): the graph's replay."""
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        if self.graph_pool is None:
            self.graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            fn()
        return graph.replay

    def rmsnorm(self, x: Any, w: Any) -> Any:
        xf = x.float()
        return (xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def ensure_pages(self, rid: int, tokens: int) -> list[int]:
        have = self.pages.setdefault(rid, [])
        need = -(-tokens // PAGE.page_size) - len(have)
        if need > len(self.free):
            raise RuntimeError(f"page pool exhausted: request {rid} needs {need} more pages, {len(self.free)} free "
                               "(the simulator's pool and the stack's disagree)")
        for _ in range(max(0, need)):
            have.append(self.free.pop())
        return have

    def release(self, rid: int) -> None:
        self.free.extend(self.pages.pop(rid, []))

    def release_except(self, running: set[int]) -> None:
        for rid in [r for r in self.pages if r not in running]:
            self.free.extend(self.pages.pop(rid))

    def block_table(self, rids: list[int]) -> Any:
        rows = [self.pages[r] for r in rids]
        width = max(len(r) for r in rows)
        return self.torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=self.torch.int32,
                                 device=self.device)

    def fill_graph_inputs(self, slots: list[int], rids: list[int], context: list[int], rows: int) -> None:
        """Write a decode step into the static buffers its graph reads: the first len(rids) rows are the step's
        sequences, the rest up to `rows` a one-token context on the scratch page."""
        torch, n = self.torch, len(rids)
        pad_slot = self.scratch_page * PAGE.page_size
        width = self.g_block_table.shape[1]
        table = torch.full((rows, width), self.scratch_page, dtype=torch.int32)
        for i, r in enumerate(rids):
            pages = self.pages[r]
            if len(pages) > width:
                raise RuntimeError(f"request {r} holds {len(pages)} pages, more than the graph's block table "
                                   f"({width}): raise max_context")
            table[i, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self.g_slots[:rows].copy_(torch.tensor(slots + [pad_slot] * (rows - n), dtype=torch.int64))
        self.g_block_table[:rows].copy_(table)
        self.g_context[:rows].copy_(torch.tensor(context + [1] * (rows - n), dtype=torch.int32))


# The dense pieces of a layer (everything but attention and the fused MoE), shared by the live steps and by
# dense_price_check.py, which times them to price the dense ops as this stack runs them.
def attn_in(st: Stack, layer: dict, t: int, slot_t: Any) -> None:
    """Norm, fused QKV projection, q into the q buffer, K/V into the paged cache at slot_t, over rows [0, t)."""
    m = st.m
    q_dim, kv_dim = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    qkv = st.rmsnorm(st.x_res[:t], layer["norm1"]) @ layer["wqkv"]
    st.q_buf[:t].copy_(qkv[:, :q_dim].view(t, m.num_heads, m.head_dim))
    layer["k_cache"].view(-1, m.num_kv_heads, m.head_dim)[slot_t] = \
        qkv[:, q_dim:q_dim + kv_dim].view(t, m.num_kv_heads, m.head_dim)
    layer["v_cache"].view(-1, m.num_kv_heads, m.head_dim)[slot_t] = \
        qkv[:, q_dim + kv_dim:].view(t, m.num_kv_heads, m.head_dim)


def attn_out(st: Stack, layer: dict, t: int, moe_wl: MoEWorkload) -> Any:
    """The output projection added to the residual, the second norm and the router: the MoE layer's inputs."""
    from kernel_gym.kernels import fused_moe as fm

    m, x = st.m, st.x_res[:t]
    x.add_(st.attn[:t].reshape(t, m.num_heads * m.head_dim) @ layer["wo"])
    h = st.rmsnorm(x, layer["norm2"])
    return fm.MoEInputs(moe_wl, h.contiguous(), (h @ layer["wr"]).float(), layer["w1"], layer["w2"])


def sample(st: Stack, t: int, n_logits: int) -> None:
    """The final norm, LM head and greedy pick on the last n_logits of rows [0, t)."""
    if n_logits:
        st.rmsnorm(st.x_res[t - n_logits:t], st.final_norm).matmul(st.lm_head).argmax(-1)


def prefix_launcher(stack: Stack, layer: dict, wl: PrefixPrefillWorkload, config: Config, bt: Any) -> Any:
    """prefix_prefill over the stack's cache for this layer (PrefixPrefillFamily.prepare_paged on the layer's pages;
    the step's chunks are the first T rows of the stack's q and attention buffers)."""
    from kernel_gym.kernels import prefix_prefill as pp

    t = wl.total_tokens
    paged = pp.PagedKV(layer["k_cache"], layer["v_cache"], bt, PAGE.page_size, PAGE.layout)
    return pp.FAMILY.prepare_paged(stack.q_buf[:t], paged, wl, config,
                                   1.0 / math.sqrt(stack.m.head_dim), out=stack.attn[:t])


def decode_launcher(stack: Stack, layer: dict, config: Config, bt: Any, ctx_t: Any, row0: int, batch: int) -> Any:
    """decode_attention over the stack's cache for this layer (decode_attention.paged_launch, the closure its family
    times), on rows [row0, row0 + batch) of the stack's q and attention buffers."""
    from kernel_gym.kernels import decode_attention as da

    cache = da.PagedCache(layer["k_cache"], layer["v_cache"], bt, PAGE.page_size, PAGE.layout)
    return da.paged_launch(stack.q_buf[row0:row0 + batch], cache, ctx_t, config, 1.0 / math.sqrt(stack.m.head_dim),
                           stack.m.num_kv_heads, out=stack.attn[row0:row0 + batch])


def check_attention(st: Stack, layer: dict, chunks: list, dec: list, ctx: list) -> int:
    """Dry-run check: the step's attention rows against torch attention over the tokens gathered back from the cache
    through the stack's page lists (catches wrong slots, block tables or prefixes). Returns the rows checked."""
    torch, m = st.torch, st.m
    group = m.num_heads // m.num_kv_heads
    kc = layer["k_cache"].view(-1, m.num_kv_heads, m.head_dim)
    vc = layer["v_cache"].view(-1, m.num_kv_heads, m.head_dim)
    row, checked = 0, 0
    spans = [(rid, c, o) for rid, c, o in chunks] + [(rid, 1, n - 1) for rid, n in zip(dec, ctx)]
    for rid, c, o in spans:
        pages = st.pages[rid]
        pos = torch.arange(o + c)
        slots = torch.tensor(pages, dtype=torch.int64)[pos // PAGE.page_size] * PAGE.page_size + pos % PAGE.page_size
        k = kc[slots].float().repeat_interleave(group, 1).transpose(0, 1)  # [H, n, D]
        v = vc[slots].float().repeat_interleave(group, 1).transpose(0, 1)
        q = st.q_buf[row:row + c].float().transpose(0, 1)  # [H, c, D]
        scores = q @ k.transpose(1, 2) / math.sqrt(m.head_dim)
        visible = torch.arange(o + c)[None, :] <= o + torch.arange(c)[:, None]
        ref = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1) @ v
        got = st.attn[row:row + c].float().transpose(0, 1)
        err = (got - ref).abs().max().item()
        if not err < 1e-3:
            raise AssertionError(f"attention of request {rid} (chunk {c} after {o}) is off by {err:.3g}")
        row, checked = row + c, checked + c
    return checked


class CompileCounter:
    """Counts Triton compiles through triton.knobs' post-compile hook (chained to a hook set before), so a step
    that compiled inside its timed run (an integer specialisation its untimed first run did not meet) is timed
    again. `available` is False on a Triton without the hook: such steps are then timed with their compile."""

    def __init__(self) -> None:
        self.count = 0
        try:
            from triton import knobs

            runtime = knobs.runtime
            prev = runtime.jit_post_compile_hook
        except (ImportError, AttributeError):
            self.available = False
            return

        def hook(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return prev(*args, **kwargs) if prev else None

        runtime.jit_post_compile_hook = hook
        self.available = True


# A profiled kernel's part of the step price (kernel_part), by its name: kernel_gym's Triton kernels by their JIT
# function names, the MoE routing's torch kernels (top-k, sorts, scans, softmax, scatter) by the words in theirs;
# everything else (cuBLAS projections, norms, copies, the KV writes, elementwise ops) is "dense". The routing's few
# elementwise kernels land in "dense" too: their names do not tell them apart.
KERNEL_PARTS = {
    "fused_moe": ("_gate_up_kernel", "_down_kernel", "_gate_up_tma_kernel", "_down_tma_kernel", "_silu_mul_kernel",
                  "_scale_rows_kernel", "_topk_sum_kernel", "_finalize_kernel"),
    "decode_attention": ("_decode_grouped_kernel", "_decode_per_head_kernel", "_combine_splits_kernel"),
    "prefix_prefill": ("_prefix_fwd", "_combine_splits"),
}
ROUTING_WORDS = ("topk", "sort", "scan", "softmax", "scatter")
ANNOTATION_PREFIX = "kg:"  # the scopes of the first profiled runs (tree b563b8d): GPU annotation spans, not kernels


def kernel_part(name: str) -> str | None:
    """The price part (priced_steps' keys) that charges a profiled GPU kernel; None for an annotation span."""
    if name.startswith(ANNOTATION_PREFIX):
        return None
    for part, names in KERNEL_PARTS.items():
        if name in names:
            return part
    low = name.lower()
    return "moe_routing" if any(w in low for w in ROUTING_WORDS) else "dense"


def parts_us(names_us: dict[str, float]) -> dict[str, float]:
    """Kernel time by name -> by price part (kernel_part), annotation spans dropped."""
    parts: dict[str, float] = {}
    for name, us in names_us.items():
        part = kernel_part(name)
        if part is not None:
            parts[part] = parts.get(part, 0.0) + us
    return parts


def profile_kernels(forward: Any) -> dict:
    """One eager run of a step under torch's profiler: its GPU kernels' summed durations (us) by name and by price
    part (kernel_part), and in total (`busy_us`). A graph replays the same kernels; what the step's measured seconds
    hold beyond `busy_us` is time the GPU sat idle (launch gaps, host work, the sync)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        forward()
        torch.cuda.synchronize()
    by_name: dict[str, float] = {}
    spans = []
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and not e.name.startswith(ANNOTATION_PREFIX):
            by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us()
            spans.append((e.time_range.start, e.time_range.end, e.name))
    by_part = parts_us(by_name)
    placed = call_parts(spans)  # once: its durations and its spans
    by_call: dict[str, float] = {}
    for start, stop, part in placed:
        if part is not None:
            by_call[part] = by_call.get(part, 0.0) + (stop - start)
    return {"busy_us": float(sum(by_part.values())), "by_part_us": {k: round(v, 2) for k, v in sorted(by_part.items())},
            "by_part_span_us": {k: round(v, 2) for k, v in sorted(part_spans_us(spans).items())},
            "by_call_us": {k: round(v, 2) for k, v in sorted(by_call.items())},
            "by_call_span_us": {k: round(v, 2) for k, v in sorted(_spans_by_part(placed).items())},
            "by_name_us": by_name}


def call_parts(kernels: list[tuple[float, float, str]]) -> list[tuple[float, float, str | None]]:
    """The kernels in start order, each with its part by its place in the step, not its name alone: between two
    attention launches, the kernels after a MoE call's first routing kernel and before its last fused-MoE kernel are
    the call's own (its routing and alignment run as torch elementwise, index, fill and copy ops whose names say
    nothing of routing), and so is the cast just before that first routing kernel. They go to "moe_routing"; every
    other kernel keeps kernel_part's part."""
    rows = [(start, stop, name, kernel_part(name)) for start, stop, name in sorted(kernels)]
    parts = [r[3] for r in rows]
    bounds = [i for i, p in enumerate(parts) if p in ("decode_attention", "prefix_prefill")]
    for lo, hi in zip([-1] + bounds, bounds + [len(rows)]):
        seg = range(lo + 1, hi)
        first = next((i for i in seg if parts[i] == "moe_routing"), None)
        last = next((i for i in reversed(seg) if parts[i] == "fused_moe"), None)
        if first is None or last is None or last < first:
            continue
        if first - 1 > lo and parts[first - 1] == "dense" and "copy" in rows[first - 1][2].lower():
            parts[first - 1] = "moe_routing"
        for i in range(first + 1, last):
            if parts[i] == "dense":
                parts[i] = "moe_routing"
    return [(r[0], r[1], part) for r, part in zip(rows, parts)]


def part_spans_us(kernels: list[tuple[float, float, str]], by_call: bool = False) -> dict[str, float]:
    """Per price part, its kernels' durations plus the idle time before each (since the previous kernel ended): in a
    graph replay, where nothing waits on the host, a part's share of the step's wall time. A table timed as a graph
    replays (the MoE graph table, the dense ops, the decode graph table) holds its own kernels' gaps, so this, not the
    summed durations, is what its price stands beside. (Of an eager launch the gaps are the host's.) by_call: parts
    by each kernel's place in the step (call_parts), else by its name (kernel_part)."""
    return _spans_by_part(call_parts(kernels) if by_call else [(a, b, kernel_part(n)) for a, b, n in sorted(kernels)])


def _spans_by_part(rows: list[tuple[float, float, str | None]]) -> dict[str, float]:
    """part_spans_us over kernels already in start order with their parts (None: not a kernel)."""
    out: dict[str, float] = {}
    end = None
    for start, stop, part in rows:
        if part is not None:
            out[part] = out.get(part, 0.0) + (stop - start) + (max(0.0, start - end) if end is not None else 0.0)
        end = stop if end is None else max(end, stop)
    return out


class LiveSimulator(Simulator):
    """The simulator's scheduler with each step executed on the GPU (module docstring). cuda_graphs: a decode-only
    step replays a CUDA graph of its capture size (captured, untimed, the first time a size and config pair comes);
    steps with prefill chunks run eagerly."""

    def __init__(self, model: ModelSpec, trace: Trace, chooser: Any, stack: Stack, dtype: str,
                 cuda_graphs: bool = False, **kw: Any) -> None:
        class _Zero:  # the predicted kernel times are not used: the step's measured seconds are
            def time_s(self, kernel: str, workload: Any, config: Config) -> float:
                return 1e-9

        super().__init__(model, trace, _Zero(), chooser, None, kv_layout=PAGE, prefix_caching=False,
                         chunk_attention="prefix", compile_s=lambda k, c: 0.0, step_overhead_s=0.0, dtype=dtype,
                         decode_waves=False, **kw)
        self.stack, self.dtype_name, self.record = stack, dtype, []
        self.check, self.checked, self.config_fallbacks = False, 0, 0
        self.compiled: set[tuple] = set()  # (kernel, config, specialisation) already run: compiled (module docstring)
        self.cuda_graphs = cuda_graphs
        self.compiles: CompileCounter | None = None  # run_live sets it on the GPU
        self._compiles_seen = 0
        self.profile_every = 0  # > 0: every that many timed steps, one more eager run under the profiler (GPU)
        self.profiled_names_us: dict[str, float] = {}  # the profiled runs' kernel time by kernel name, summed
        self.last_gpu_s: float | None = None  # _timed's CUDA-event span of the step just run (None on the CPU)
        self.last_issue_s = 0.0  # _timed's host seconds to issue the step (an eager step's launches), before the sync

    def _maybe_profile(self, record: dict, eager: Any, replay: Any = None) -> None:
        """Profile every profile_every-th step (not one that compiled or captured first): its eager forward's kernel
        times by part go into the step's record (`kernels`), by name into the policy's sum (profiled_names_us). A
        graphed step's replay is profiled too (`kernels_graph`: CUPTI times each kernel of the replay), so a price
        can be set beside the kernels as the graph runs them, not only as the eager launch does."""
        if (not self.profile_every or self.stack.device != "cuda" or record.get("ran_untimed_first")
                or len(self.record) % self.profile_every):
            return
        try:
            record["kernels"] = profile_kernels(eager)
            for name, us in record["kernels"].pop("by_name_us").items():
                self.profiled_names_us[name] = self.profiled_names_us.get(name, 0.0) + us
        except Exception as exc:  # noqa: BLE001 - a diagnostic: the replay goes on without it
            record["kernels"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        if replay is not None:
            try:
                record["kernels_graph"] = profile_kernels(replay)
                record["kernels_graph"].pop("by_name_us")
            except Exception as exc:  # noqa: BLE001 - likewise
                record["kernels_graph"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}

    def _preempt(self, rid: int) -> None:
        """The simulator's preemption (recompute: its KV is dropped) frees the request's pages in the stack too, at
        once: re-admitted in the same step, it would otherwise keep its stale pages while the simulator's pool counts
        them free (the page pool exhausted on a loaded window, tree 217cbde)."""
        super()._preempt(rid)
        if self.stack is not None:
            self.stack.release(rid)

    def _moe_config(self, t: int, rounded_t: int) -> tuple[Config, MoEWorkload]:
        """The MoE config the policy picks on the simulator's rounded token count, checked on the `t` rows the step
        runs (a fallback when the rules refuse it there, counted)."""
        from kernel_gym.kernels import fused_moe as fm

        m = self.model
        cfg = self.chooser.choose("fused_moe", self._workload(("fused_moe", round_count(rounded_t), 0.0)),
                                  self.kv_layout)
        wl = MoEWorkload(t, m.num_experts, m.top_k, m.hidden, m.intermediate, 0.0, self.dtype_name)
        space = fm.FAMILY.space  # the rules a policy's mask uses (TMA_LOADS configs included)
        if not space.is_valid(cfg, wl):
            cfg = self.chooser.choose("fused_moe", wl, self.kv_layout)
            if not space.is_valid(cfg, wl):
                cfg = fm.default_config(wl)
            self.config_fallbacks += 1
        return cfg, wl

    def _layer_pieces(self, t: int, slot_t: Any, moe_wl: MoEWorkload, cfg_m: Config) -> list[tuple[Any, Any]]:
        """Per layer, the work before and after its attention over rows [0, t) of the residual stream (the stack's
        x_res): before, attn_in; after, attn_out and the fused MoE layer (routed inside its launch, no host sync)
        added to the residual in place. The pieces a piecewise graph captures around the attention launches."""
        from kernel_gym.kernels import fused_moe as fm

        st = self.stack
        pieces = []
        for layer in st.layers:
            def before(layer: dict = layer) -> None:
                attn_in(st, layer, t, slot_t)

            def after(layer: dict = layer) -> None:
                moe_in = attn_out(st, layer, t, moe_wl)
                st.x_res[:t].add_(fm.prepare_layer(moe_in, cfg_m, route_in_launch=True)())

            pieces.append((before, after))
        return pieces

    def _forward(self, t: int, slot_t: Any, launches: list, moe_wl: MoEWorkload, cfg_m: Config, n_logits: int,
                 check: Any = None) -> Any:
        """One step's forward pass over t rows (a callable; what a decode graph captures): the embedded tokens into
        the residual, each layer's pieces around its attention launches, the final norm and LM head on the last
        n_logits rows."""
        return self._around_attention(t, t, self._layer_pieces(t, slot_t, moe_wl, cfg_m), launches, n_logits, check)

    def _around_attention(self, rows: int, t: int, pieces: list, launches: list, n_logits: int,
                          check: Any = None) -> Any:
        """The step as a callable: the embedded tokens into the residual's first `rows` rows, per layer its piece
        before attention, the step's attention launches, its piece after; the sample from the last real rows."""
        st = self.stack

        def forward() -> None:
            st.x_res[:rows].copy_(st.x0[:rows])
            for li, (before, after) in enumerate(pieces):
                before()
                for per_layer in launches:
                    per_layer[li]()
                if check is not None and li == 0:
                    check(st.layers[0])
                after()
            self._sample(t, n_logits)

        return forward

    def _sample(self, t: int, n_logits: int) -> None:
        sample(self.stack, t, n_logits)

    def _decode_choice(self, dec: list[int], ctx: list[int]) -> Config:
        key = ("decode_attention", round_count(len(dec)), round_log4(float(np.mean(ctx))))
        return self.chooser.choose("decode_attention", self._workload(key), self.kv_layout)

    def _graph_step(self, dec: list[int], ctx: list[int], slots: list[int]) -> tuple[float, dict]:
        """A decode-only step through the graph of its capture size: fill the static buffers (before the timer, as
        an engine prepares the next step's metadata), replay, time to the sync."""
        st, n = self.stack, len(dec)
        rows = capture_size(n)
        cfg_d = self._decode_choice(dec, ctx)
        cfg_m, moe_wl = self._moe_config(rows, n)
        st.fill_graph_inputs(slots, dec, ctx, rows)
        key = (rows, str(cfg_d), str(cfg_m))
        captured_first = key not in st.graphs
        if captured_first:
            bt, ctx_t = st.g_block_table[:rows], st.g_context[:rows]
            launches = [[decode_launcher(st, layer, cfg_d, bt, ctx_t, 0, rows) for layer in st.layers]]
            forward = self._forward(rows, st.g_slots[:rows], launches, moe_wl, cfg_m, rows)
            st.graphs[key] = (st.capture(forward) if st.device == "cuda" else None, forward, launches)
        graph, forward, launches = st.graphs[key]
        if self.check and graph is None:  # CPU dry run: the padded static-buffer pass, checked on its real rows
            self._forward(rows, st.g_slots[:rows], launches, moe_wl, cfg_m, rows,
                          functools.partial(self._count_checked, chunks=[], dec=dec, ctx=ctx))()
        return self._timed(graph if graph is not None else forward), {"graph_rows": rows,
                                                                       "captured_first": captured_first,
                                          "configs": {"decode_attention": str(cfg_d), "fused_moe": str(cfg_m)},
                                                                       "eager": forward, "replay": graph}

    def _count_checked(self, layer: dict, chunks: list, dec: list, ctx: list) -> None:
        self.checked += check_attention(self.stack, layer, chunks, dec, ctx)

    def _step_seconds(self, predicted_s: float, chunks: list[tuple[int, int, int]], dec: np.ndarray) -> float:
        import torch

        from kernel_gym.kernels import prefix_prefill as pp

        st, m, kv = self.stack, self.model, self.kv
        dec = [int(r) for r in dec]
        st.release_except(set(dec) | set(self.pref) | {r for r, _, _ in chunks})
        slots: list[int] = []
        for rid, c, o in chunks:
            pages = st.ensure_pages(rid, o + c)
            slots += [pages[p // PAGE.page_size] * PAGE.page_size + p % PAGE.page_size for p in range(o, o + c)]
        ctx = [int(kv[r]) + 1 for r in dec]
        for rid, n in zip(dec, ctx):
            pages = st.ensure_pages(rid, n)
            slots.append(pages[(n - 1) // PAGE.page_size] * PAGE.page_size + (n - 1) % PAGE.page_size)
        tc = sum(c for _, c, _ in chunks)
        t = tc + len(dec)
        if self.cuda_graphs and not chunks:
            seconds, extra = self._graph_step(dec, ctx, slots)
            eager, replay = extra.pop("eager"), extra.pop("replay")
            self.record.append({"t": self.clock, "chunks": [], "decode_batch": len(dec),
                                "mean_context": float(np.mean(ctx)), "max_context": max(ctx), "tokens": t,
                                "seconds": seconds, "gpu_s": self.last_gpu_s, "issue_s": self.last_issue_s,
                                "ran_untimed_first": extra["captured_first"], **extra})
            self._maybe_profile(self.record[-1], eager, replay)
            return seconds
        dev = st.device
        slot_t = torch.tensor(slots, dtype=torch.int64, device=dev)
        launches = []
        if chunks:
            wl = PrefixPrefillWorkload(m.num_heads, m.num_kv_heads, m.head_dim, tuple(c for _, c, _ in chunks),
                                       tuple(o for _, _, o in chunks), self.dtype_name)
            pairs = sorted(((round_up16(c), round_log4(o) if o > 0 else 0) for _, c, o in chunks), reverse=True)
            key = ("prefix_prefill", tuple(c for c, _ in pairs), tuple(o for _, o in pairs))
            cfg_p = self.chooser.choose("prefix_prefill", self._workload(key), self.kv_layout)
            if not pp.SPACE.is_valid(cfg_p, wl):
                cfg_p = pp.FAMILY.default_config(wl)
                self.config_fallbacks += 1
            bt_p = st.block_table([r for r, _, _ in chunks])
            launches.append([prefix_launcher(st, layer, wl, cfg_p, bt_p) for layer in st.layers])
        if dec:
            cfg_d = self._decode_choice(dec, ctx)
            bt_d = st.block_table(dec)
            ctx_t = torch.tensor(ctx, dtype=torch.int32, device=dev)
            launches.append([decode_launcher(st, layer, cfg_d, bt_d, ctx_t, tc, len(dec)) for layer in st.layers])
        piecewise = self.cuda_graphs and t <= PIECEWISE_MAX_TOKENS
        rows = capture_size(t) if piecewise else t
        cfg_m, moe_wl = self._moe_config(rows, t)
        n_logits = len(dec) + sum(1 for r, c, o in chunks if o + c >= self.target[r])
        if piecewise:
            st.g_slots[:rows].copy_(torch.tensor(slots + [st.scratch_page * PAGE.page_size] * (rows - t),
                                                 dtype=torch.int64))
            forward = self._piecewise(rows, t, launches, moe_wl, cfg_m, n_logits)
        else:
            forward = self._forward(t, slot_t, launches, moe_wl, cfg_m, n_logits)

        # A config's first launch compiles it (seconds): a step that uses a config not run before runs once untimed
        # first. Re-running a step is harmless: it writes the same K/V to the same slots and recomputes the rest.
        spec = (t == 1, t % 16 == 0)  # Triton specialises integer arguments on these: a new pair may compile again
        used = {("prefix_prefill", str(cfg_p), spec) if chunks else None,
                ("decode_attention", str(cfg_d), spec) if dec else None, ("fused_moe", str(cfg_m), spec)} - {None}
        compiled_first = bool(used - self.compiled)
        if compiled_first:
            forward()
            self.compiled |= used
        if self.check:
            check = functools.partial(self._count_checked, chunks=chunks, dec=dec, ctx=ctx)
            (self._piecewise(rows, t, launches, moe_wl, cfg_m, n_logits, check) if piecewise else
             self._forward(t, slot_t, launches, moe_wl, cfg_m, n_logits, check))()
        seconds, compiled_in_step = self._timed(forward), False
        if self.compiles is not None and self.compiles.count != self._compiles_seen:  # compiled while timed: again
            compiled_in_step = True
            seconds = self._timed(forward)
        self.record.append({"t": self.clock, "chunks": [[r, c, o] for r, c, o in chunks], "decode_batch": len(dec),
                            "mean_context": float(np.mean(ctx)) if ctx else 0.0, "max_context": max(ctx, default=0),
                            "tokens": t, "seconds": seconds, "gpu_s": self.last_gpu_s, "issue_s": self.last_issue_s,
                            "ran_untimed_first": compiled_first or compiled_in_step,
                            **({"compiled_in_timed_run": True} if compiled_in_step else {}),
                            **({"piecewise_rows": rows} if piecewise else {}),
                            "configs": {"prefix_prefill": str(cfg_p) if chunks else None,
                                        "decode_attention": str(cfg_d) if dec else None, "fused_moe": str(cfg_m)}})
        if piecewise:  # the same kernels as the step's graphs, launched eagerly
            eager = self._around_attention(rows, t, self.stack.graphs[("piecewise", rows, str(cfg_m))][1], launches,
                                           n_logits)
        else:
            eager = forward
        self._maybe_profile(self.record[-1], eager)
        return seconds

    def _timed(self, forward: Any) -> float:
        """Seconds of one run of the step, from a synchronised start to the sync after it (the compile count noted
        at the start)."""
        import torch

        cuda = self.stack.device == "cuda"
        torch.cuda.synchronize() if cuda else None
        self._compiles_seen = self.compiles.count if self.compiles is not None else 0
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record() if cuda else None
        forward()
        end.record() if cuda else None
        self.last_issue_s = time.perf_counter() - t0  # the host's time to launch the step's work (no sync yet)
        torch.cuda.synchronize() if cuda else None
        seconds = time.perf_counter() - t0
        # the GPU's span of the step (first to last work on the stream): seconds - gpu_s is the host's part, the
        # launch and the sync, which a graphed step's price holds as its step overhead
        self.last_gpu_s = start.elapsed_time(end) * 1e-3 if cuda else None
        return seconds

    def _piecewise(self, rows: int, t: int, launches: list, moe_wl: MoEWorkload, cfg_m: Config, n_logits: int,
                   check: Any = None) -> Any:
        """A step with prefill chunks through piecewise graphs (vLLM's design for mixed batches): each layer's work
        before and after attention replays a graph captured for `rows` rows (the step's t tokens, then padding on the
        scratch page; the slots in the static buffer), and the step's attention launches run eagerly between them on
        its t real rows. The graphs are captured, untimed, the first time a size and MoE config come."""
        st = self.stack
        key = ("piecewise", rows, str(cfg_m))
        if key not in st.graphs:
            pieces = self._layer_pieces(rows, st.g_slots[:rows], moe_wl, cfg_m)
            graphs = [(st.capture(b), st.capture(a)) for b, a in pieces] if st.device == "cuda" else None
            st.graphs[key] = (graphs, pieces)
        graphs, pieces = st.graphs[key]
        run = graphs if graphs is not None else pieces  # the CPU dry run calls the pieces themselves
        return self._around_attention(rows, t, run, launches, n_logits, check)


# ---- driving ---------------------------------------------------------------------------------------------------


def window_trace(name: str, start_s: float, seconds: float, rate: float, max_prompt: int, max_output: int) -> Trace:
    """The trace's requests arriving in [start, start + seconds x rate) compressed by rate, lengths capped."""
    tr = load_trace(name)
    w = tr.window(start_s, start_s + seconds * rate).scale_rate(rate)
    return Trace(w.name, w.arrival_s, np.minimum(w.prompt_tokens, max_prompt),
                 np.minimum(w.output_tokens, max_output), w.source)


def pool_memory(model: ModelSpec, kv_gb: float) -> float:
    """gpu_memory_bytes that leaves a KV pool of kv_gb GB at the simulator's default utilisation (0.9)."""
    return (model.weight_bytes + kv_gb * 1e9) / 0.9


def graph_kwargs(meta: dict) -> dict:
    """The prediction of a run with CUDA graphs charges graphed steps at their padded size, as they ran."""
    return {"cuda_graph_max_tokens": PIECEWISE_MAX_TOKENS if meta.get("cuda_graphs") else 0}


def waves_kwargs(args: Any) -> dict:
    """--decode-waves: the prediction prices each decode batch from its own contexts (Simulator's decode_waves)."""
    return {"decode_waves": getattr(args, "decode_waves", "on") == "on"}


def sim_kwargs(args: Any, model: ModelSpec) -> dict:
    return dict(gpu_memory_bytes=pool_memory(model, args.kv_gb), max_num_batched_tokens=args.max_batched_tokens,
                max_num_seqs=args.max_seqs)


def run_live(args: Any) -> int:
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    model = TINY if args.smoke else load_model(args.model)
    dtype_name = "float32" if device == "cpu" else "bfloat16"
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    trace = window_trace(args.trace, args.start_s, args.seconds, args.rate, args.max_prompt, args.max_output)
    if args.smoke:
        trace = trace.head(SMOKE_REQUESTS)
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    probe = Simulator(model, trace, _Unit(), DefaultChooser(), None, kv_layout=PAGE, **sim_kwargs(args, model))
    log(f"{model.name} on {device}: {len(trace)} requests over {trace.duration_s:.1f} s ({trace.name}); KV pool "
        f"{probe.num_pages} pages of {PAGE.page_size}; weights {model.weight_bytes / 1e9:.1f} GB")
    stack = Stack(model, probe.num_pages, args.max_batched_tokens, device, dtype, args.vocab, args.max_seqs,
                  args.max_prompt + args.max_output + 1)
    graphs = args.graphs == "on"
    compiles = CompileCounter() if device == "cuda" else None
    log(f"weights and cache allocated in {time.time() - t_start:.0f} s"
        + ("" if compiles is None or compiles.available else "; this Triton has no post-compile hook: a step that "
           "compiles inside its timed run is timed with its compile"))
    results = {}
    for spec in args.policies.split(","):
        chooser = make_chooser(spec, model)
        if time.time() - t_start > args.budget_s:
            log(f"budget spent: skipping {spec}")
            continue
        stack.release_except(set())
        sim = LiveSimulator(model, trace, chooser, stack, dtype_name, graphs, **sim_kwargs(args, model))
        sim.check = bool(args.smoke)
        sim.compiles = compiles if compiles is not None and compiles.available else None
        sim.profile_every = args.profile_every
        power_before = gpu_state(device)
        t0 = time.time()
        if args.warmup_steps:  # compile the first configs before the clock matters: a throwaway replay's first steps
            warm = LiveSimulator(model, trace, chooser, stack, dtype_name, graphs, **sim_kwargs(args, model))
            for _ in range(args.warmup_steps):
                if not warm.step():
                    break
            stack.release_except(set())
        issue_cal = calibrate_issue(model, chooser, stack, dtype_name, args)
        deadline = t0 + args.policy_budget_s
        while sim.step():
            if time.time() > deadline:
                log(f"{spec}: policy budget of {args.policy_budget_s:.0f} s spent at sim time {sim.clock:.1f} s")
                break
        res = sim.result()
        s = res.summary
        results[spec] = {k: s[k] for k in (*METRICS, "ttft_p99_s", "tpot_p99_s", "finished", "requests", "steps",
                                           "preemptions", "sim_time_s", "overloaded") if k in s}
        results[spec]["complete"] = bool(sim.done)
        results[spec]["attention_rows_checked"] = sim.checked
        results[spec]["config_fallbacks"] = sim.config_fallbacks
        results[spec]["steps_compiled_in_timed_run"] = sum(1 for r in sim.record if r.get("compiled_in_timed_run"))
        results[spec]["wall_s"] = time.time() - t0
        results[spec]["graph_steps"] = sum(1 for r in sim.record if "graph_rows" in r)
        results[spec]["graphs_held"] = len(stack.graphs)
        results[spec]["profiled_steps"] = sum(1 for r in sim.record if "kernels" in r)
        if sim.profiled_names_us:
            results[spec]["profiled_kernels_us"] = dict(sorted(sim.profiled_names_us.items(), key=lambda kv: -kv[1]))
        results[spec]["host_issue_calibration"] = issue_cal
        results[spec]["gpu_before"], results[spec]["gpu_after"] = power_before, gpu_state(device)
        # the replay's end on the local wall clock, as nvidia-smi's CSV stamps its samples: with the steps' seconds it
        # places each step beside the GPU's clocks (retrained/clock_check.py)
        results[spec]["ended_at"] = datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")
        steps_path(args.out, spec).write_text(json.dumps(sim.record))
        log(f"{spec}: {s['tokens_per_s']:.1f} tok/s, TTFT p50 {s['ttft_p50_s'] * 1e3:.1f} ms, TPOT p50 "
            f"{s['tpot_p50_s'] * 1e3:.2f} ms, {int(s['finished'])}/{len(trace)} finished, {len(sim.record)} steps")
        write_measured(args, model, trace, device, dtype_name, graphs, results)  # after each policy: a cut-off run
    print(json.dumps(results, indent=1))                                          # keeps the finished ones
    return 0


ISSUE_CALIBRATION_TOKENS = 1024  # the single-chunk step: one request's prompt, over PIECEWISE_MAX_TOKENS (eager)
ISSUE_CALIBRATION_STEPS = 8  # its repeats (after the mixed passes, which compiled its configs)
ISSUE_MIX_PROMPTS = 6  # the mixed calibration: prompts of sizes spread over the eager range, arriving together...
ISSUE_MIX_DECODES = 4  # ...while this many short requests decode, as a replay's eager steps mix chunks and decodes
ISSUE_MIX_REPEATS = 3  # its passes (the first compiles the sizes' configs; its steps that did are left out)


def calibrate_issue(model: ModelSpec, chooser: Any, stack: Stack, dtype: str, args: Any) -> dict:
    """The host's seconds per layer to issue an eager step with this policy's configs, measured before the replay on
    the host that serves it, through the replay's eager path (the one a step over PIECEWISE_MAX_TOKENS takes), so
    `--predict` floors the policy's eager steps with the serving host's figure (policy_issue_s), not another run's
    (1.10 to 2.27 ms per layer across the committed runs, host_issue.json). Two workloads, each on fresh state:
    - `single_chunk`: one request's chunk of ISSUE_CALIBRATION_TOKENS (or the budget), ISSUE_CALIBRATION_STEPS times;
    - the mixed one (`per_layer_s`, what --predict reads): a short replay of ISSUE_MIX_PROMPTS prompts of sizes
      spread over the eager range arriving while ISSUE_MIX_DECODES requests decode, ISSUE_MIX_REPEATS times: steps
      of varied sizes with chunks and decodes, as the replay's eager steps are (on OLMoE's vllm-table in
      heldout_bffac01 the single chunk read 1.74 ms per layer where the replay's host-bound eager steps took 2.10).
    The steps have no host sync inside, so issue_s is the host's time to launch them; `host_bound` counts the steps
    that waited on the host (issue_s >= HOST_BOUND_SHARE of the step)."""
    hi = min(args.max_batched_tokens, args.max_prompt)
    lo = min(PIECEWISE_MAX_TOKENS + 1, hi)
    single = min(ISSUE_CALIBRATION_TOKENS, hi)
    one = Trace("issue calibration", np.zeros(1), np.array([single]), np.array([2]), "calibrate_issue")
    sizes = np.unique(np.geomspace(lo, hi, ISSUE_MIX_PROMPTS).astype(int))
    n_dec = ISSUE_MIX_DECODES
    mixed = Trace("issue calibration, mixed", np.r_[np.zeros(n_dec), np.full(len(sizes), 1e-4)],
                  np.r_[np.full(n_dec, 16), sizes], np.r_[np.full(n_dec, args.max_output), np.full(len(sizes), 2)],
                  "calibrate_issue")
    compiled: set = set()  # shared by every pass: a config compiles once
    got = _issue_steps(model, chooser, stack, dtype, args, mixed, ISSUE_MIX_REPEATS, compiled, lo)
    got["single_chunk"] = _issue_steps(model, chooser, stack, dtype, args, one, ISSUE_CALIBRATION_STEPS, compiled,
                                       lo)
    got["single_chunk"]["tokens"] = single
    got["prompt_sizes"] = [int(x) for x in sizes]
    return got


def _issue_steps(model: ModelSpec, chooser: Any, stack: Stack, dtype: str, args: Any, trace: Trace, passes: int,
                 compiled: set, min_tokens: int) -> dict:
    """calibrate_issue's passes over one workload (eager, each on fresh state, ended once every prompt has been
    prefilled): the median issue time per layer of its timed steps with chunks of at least min_tokens (the replay
    runs smaller ones through piecewise graphs, not eagerly), its p10-p90 and counts."""
    issue, bound = [], 0
    prompt_total = int(trace.prompt_tokens.sum())
    for _ in range(passes):
        stack.release_except(set())
        cal = LiveSimulator(model, trace, chooser, stack, dtype, False, **sim_kwargs(args, model))  # every step eager
        cal.compiled = compiled
        prefilled = 0
        while prefilled < prompt_total and cal.step():
            r = cal.record[-1]
            prefilled += sum(c for _, c, _ in r["chunks"])
            if eager_issued(r) and not r["ran_untimed_first"] and r["tokens"] >= min_tokens:
                issue.append(r["issue_s"] / model.num_layers)
                bound += host_bound(r)
    stack.release_except(set())
    if not issue:
        return {"error": "no timed eager step with chunks came out of the calibration"}
    return {"per_layer_s": float(np.median(issue)), "p10_p90_s": [float(np.percentile(issue, 10)),
            float(np.percentile(issue, 90))], "steps": len(issue), "host_bound": bound}


def write_measured(args: Any, model: ModelSpec, trace: Trace, device: str, dtype_name: str, graphs: bool,
                   results: dict) -> None:
    import torch

    meta = {"model": model.name, "trace": args.trace, "window": [args.start_s, args.seconds, args.rate],
            "max_prompt": args.max_prompt, "max_output": args.max_output, "kv_gb": args.kv_gb,
            "max_batched_tokens": args.max_batched_tokens, "max_seqs": args.max_seqs, "page": [16, "NHD"],
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu-interpreter",
            "torch": torch.__version__, "triton": triton_version(), "commit": os.environ.get("KERNEL_GYM_COMMIT"),
            "cuda_graphs": graphs, "requests": len(trace), "smoke": bool(args.smoke), "dtype": dtype_name,
            "host": host_cpu()}
    (args.out / "measured.json").write_text(json.dumps({"meta": meta, "measured": results}, indent=1))


def host_cpu() -> dict:
    """The host CPU that issued the run's kernels: eager steps' issue time depends on it (host_issue.py)."""
    name = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": name or platform.processor() or None, "cores": os.cpu_count(), "python": platform.python_version()}


def gpu_state(device: str) -> dict | None:
    """The GPU's clocks, power and throttle reasons now (kernel_gym.measure.power), or None off the GPU."""
    if device != "cuda":
        return None
    from kernel_gym.measure.power import read_once

    sample = read_once()
    return None if sample is None else {k: v for k, v in vars(sample).items() if k != "t"}


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


class _Unit:
    def time_s(self, kernel: str, workload: Any, config: Config) -> float:
        return 1e-6


MIN_PREFILL_TOKENS = 128  # the dataset's smallest prefill shape (PREFILL_TOTALS) and decode context
MIN_DECODE_CONTEXT = 128


MOE_ROUTING_TABLE = Path(__file__).resolve().parent / "moe_price_check_run1" / "moe_routing.json"


class TokenTable:
    """Measured seconds by token count, linear in log2(tokens) between the points, clamped at the table's ends: the
    live stack's costs the dataset's rows leave out, per call (from_routing_table: the fused MoE's in-launch routing
    and alignment, `fused_moe._route_and_align(..., bounded=True)`; DenseOps: the dense ops)."""

    def __init__(self, points: dict[int, float], source: str = "") -> None:
        if not points:
            raise ValueError("TokenTable: no points")
        self.tokens = np.array(sorted(points), dtype=float)
        self.seconds = np.array([points[int(t)] for t in self.tokens], dtype=float)
        self._log2_tokens = np.log2(self.tokens)  # __call__ runs once per priced step
        self.source = source

    @classmethod
    def from_routing_table(cls, path: Path | str, model: str) -> TokenTable | None:
        """The model's entry of a moe_price_check routing table ({"models": {MODEL: {"ms": {BLOCK_M: {TOKENS:
        {"ms": ...}}}}}}), averaged over BLOCK_M (the routing does not depend on it); None if the model has none."""
        entry = json.loads(Path(path).read_text()).get("models", {}).get(model)
        if not entry or not entry.get("ms"):
            return None
        by_tokens: dict[int, list[float]] = {}
        for per_tokens in entry["ms"].values():
            for tokens, row in per_tokens.items():
                by_tokens.setdefault(int(tokens), []).append(float(row["ms"]) * 1e-3)
        return cls({t: float(np.mean(v)) for t, v in by_tokens.items()}, str(path))

    def __call__(self, tokens: int) -> float:
        x = math.log2(max(int(tokens), 1))
        return float(np.interp(x, self._log2_tokens, self.seconds))


# the graphed MoE tables --predict reads by default: the live policies' configs (session 42), then the retrained
# tables' (session 48, benchmarks/live_e2e/retrained/)
MOE_GRAPH_TABLES = tuple(Path(__file__).resolve().parent / run / "moe_graph" / "moe_graph.json"
                         for run in ("graph_5ebaec4", "retrained/run1_seed0_53398a4"))


class MoEGraphTable:
    """Seconds per layer of the live MoE call (its routing and alignment inside the launch) as a graph replays it,
    by config and rows (moe_graph_table.py): a config's time at a capture size between two rows it was timed at is
    linear in log2(rows) between them; None where the config was not timed on both sides (the caller falls back to
    the dataset's row plus the routing table)."""

    log_rows = True  # interpolate in log2(rows); MoEEagerTable: in rows

    def __init__(self, points: dict[str, dict[int, float]], source: str = "") -> None:
        self.raw = {cfg: dict(per) for cfg, per in points.items() if per}
        self.points = {cfg: (self._x(np.array(sorted(per), dtype=float)), np.array([per[t] for t in sorted(per)]))
                       for cfg, per in self.raw.items()}
        self.source = source

    def _x(self, rows: Any) -> Any:
        return np.log2(np.maximum(rows, 1)) if self.log_rows else rows

    @classmethod
    def union(cls, tables: list[MoEGraphTable]) -> MoEGraphTable:
        """One table from several GPU runs' (each timed the configs its policies chose); where two time the same
        config at the same rows, the first one's time holds."""
        points: dict[str, dict[int, float]] = {}
        for table in tables:
            for cfg, per in table.raw.items():
                for t, s in per.items():
                    points.setdefault(cfg, {}).setdefault(t, s)
        return cls(points, ",".join(t.source for t in tables))

    @classmethod
    def from_table(cls, path: Path | str, model: str) -> MoEGraphTable | None:
        entry = json.loads(Path(path).read_text()).get("models", {}).get(model)
        if not entry or not entry.get("ms"):
            return None
        return cls({cfg: {int(t): float(r["ms"]) * 1e-3 for t, r in per.items() if "ms" in r}
                    for cfg, per in entry["ms"].items()}, str(path))

    def __call__(self, config: str, rows: int) -> float | None:
        hit = self.points.get(config)
        if hit is None:
            return None
        xs, ys = hit
        x = float(self._x(float(rows)))
        if not xs[0] - 1e-9 <= x <= xs[-1] + 1e-9:
            return None
        return float(np.interp(x, xs, ys))


class MoEEagerTable(MoEGraphTable):
    """Seconds per layer of the live MoE call as an eager step runs it (moe_graph_table.py --eager: prepare_layer with
    the routing inside, launched per layer, no graph, the live router's logits), by config and tokens, linear in
    tokens between the two grid points a config was timed at: above 512 rows a layer costs about its experts' weights
    once plus a part that grows with the tokens, which linear interpolation follows and log2 would overstate."""

    log_rows = False


# the live stack's steps: seconds - gpu_s (the host's part outside the step's GPU span, the launch and the sync) per
# kind of step, measured on these runs' records (graph_session.sh); what --predict charges as the step overhead
STEP_HOST_RUNS = tuple(Path(__file__).resolve().parent / "graph_5ebaec4" / r for r in ("window1_g", "olmoe_g"))


# an eager step's host issue time per layer, measured on the host-bound eager steps of this run (issue_s: the host's
# seconds to launch the step, before its sync; host-bound: the GPU's span no longer than that)
EAGER_ISSUE_RUNS = (Path(__file__).resolve().parent / "window5_f269e69" / "olmoe_w5",)
HOST_BOUND_SHARE = 0.95  # an eager step whose issue time is at least this share of its seconds waited on the host


def eager_issued(r: dict) -> bool:
    """A step record of an eager step with prefill chunks that carries the host's issue time (tree f269e69 on)."""
    return bool(r["chunks"]) and "piecewise_rows" not in r and r.get("issue_s") is not None


def host_bound(r: dict) -> bool:
    """An eager_issued step the GPU waited on: its issue time is at least HOST_BOUND_SHARE of the step."""
    return r["issue_s"] >= HOST_BOUND_SHARE * r["seconds"]


def timed_records(runs: tuple[Path, ...] | list[Path]) -> Any:
    """(the run's meta, a step record) for every timed step (not run untimed first) of every policy in these live run
    folders."""
    for run in runs:
        data = json.loads((Path(run) / "measured.json").read_text())
        for spec in data["measured"]:
            for r in read_steps(Path(run), spec) or []:
                if not r["ran_untimed_first"]:
                    yield data.get("meta", {}), r


def measured_eager_issue(runs: tuple[Path, ...] | list[Path]) -> dict:
    """The host's seconds per layer to issue an eager step (the stack's Python and torch launches): the median of
    issue_s / the model's layers over the timed eager steps whose issue time is at least 0.95 of the step (the GPU
    waited on the host). On GPU-bound steps the issue time also holds the launch queue's back-pressure, so they are
    left out. {"per_layer_s": s, "steps": n, "of_eager_steps": m}."""
    per_layer, eager, layers = [], 0, {}
    for meta, r in timed_records(runs):
        if not eager_issued(r):
            continue
        eager += 1
        if host_bound(r):
            name = "smoke" if meta.get("smoke") else meta["model"]
            if name not in layers:
                layers[name] = (TINY if name == "smoke" else load_model(name)).num_layers
            per_layer.append(r["issue_s"] / layers[name])
    if not per_layer:
        raise SystemExit(f"--eager-issue: no host-bound eager steps with issue_s in {[str(r) for r in runs]}; give "
                         "runs made at tree f269e69 or later whose eager steps waited on the host, or none")
    return {"per_layer_s": float(np.median(per_layer)), "steps": len(per_layer), "of_eager_steps": eager}


def measured_step_host(runs: tuple[Path, ...] | list[Path]) -> dict:
    """Per kind of step (STEP_KINDS), the median over every policy's timed steps in these runs of the step's seconds
    minus its GPU span (records with `gpu_s`), with the step count: {"graph": {"overhead_s": s, "steps": n}, ...}."""
    host: dict[str, list[float]] = {k: [] for k in STEP_KINDS}
    for _, r in timed_records(runs):
        if r.get("gpu_s") is not None:
            kind = "graph" if "graph_rows" in r else "piecewise" if "piecewise_rows" in r else "eager"
            host[kind].append(r["seconds"] - r["gpu_s"])
    missing = [k for k, v in host.items() if not v]
    if missing:
        raise SystemExit(f"--step-host: no timed {missing} steps with a GPU span (gpu_s) in {[str(r) for r in runs]}; "
                         "give runs made at tree 5ebaec4 or later, or --step-host assumed")
    return {k: {"overhead_s": float(np.median(v)), "steps": len(v)} for k, v in host.items()}


DENSE_OPS_TABLE = Path(__file__).resolve().parent / "dense_217cbde" / "dense_ops.json"
# the eager steps' tables --predict reads by default (eager_session.sh, session 49, benchmarks/live_e2e/eager_ab2db7d)
EAGER_TABLES = Path(__file__).resolve().parent / "eager_ab2db7d"
MOE_EAGER_TABLE = EAGER_TABLES / "moe_eager" / "moe_eager.json"
DENSE_EAGER_TABLE = EAGER_TABLES / "dense_eager.json"
# the chunk-routed MoE tables --predict reads by default for steps with prefill chunks (chunk_session.sh, session 52,
# tree 17d3f2b): graphed (16-512 rows) and eager (512-4,096 tokens)
CHUNK_TABLES = Path(__file__).resolve().parent / "chunk_decode_17d3f2b" / "chunk" / "e2e" / "moe_chunk"
MOE_CHUNK_TABLES = (CHUNK_TABLES / "moe_chunk_graph.json", CHUNK_TABLES / "moe_chunk_eager.json")
# the decode graph table, timed in parts (decode_graph_table.py --plan ... --done ...): the default since session 54,
# when every graphed run predicted with it came within 5% of TPOT p50 on 52 of 75 (44 without; docs/live.md); session
# 67's H200 run added OLMoE's last point and the configs the fixed chooser serves on the held-out Mixtral windows
DECODE_GRAPH_TABLES = tuple(Path(__file__).resolve().parent / part / "decode_graph.json"
                            for part in ("chunk_decode_17d3f2b/decode/e2e/decode_graph",
                                         "decode_rest_2571e03/decode_graph", "decode_rest2_bffac01/decode_graph",
                                         "dispatch_h200_0d9f96c/decode_rest3", "dispatch_h200_0d9f96c/decode_graph"))


# the ragged launch factors of the live decode configs on the H200 (ragged_decode.py in dispatch_session.sh, session
# 67): the default since session 68, when every graphed run predicted with them came within 10% of TTFT p50 on 65 of
# 80 and within 5% of TPOT p50 on 61 (62 and 57 without; docs/live.md)
DECODE_RAGGED_TABLES = tuple(Path(__file__).resolve().parent / "dispatch_h200_0d9f96c" / part / "ragged_decode.json"
                             for part in ("ragged", "ragged_olmoe"))


class DenseOps:
    """Seconds of a step's dense ops as the live stack runs them (dense_price_check.py's table): per layer at the
    step's token count, x the layers, plus the final norm, LM head and pick over the rows that sample."""

    def __init__(self, layer: TokenTable, sample: TokenTable, source: str = "") -> None:
        self.layer, self.sample, self.source = layer, sample, source

    @classmethod
    def from_table(cls, path: Path | str, model: str) -> DenseOps | None:
        """The model's entry of a dense_price_check table; None if the model has none."""
        entry = json.loads(Path(path).read_text()).get("models", {}).get(model)
        if not entry or not entry.get("layer_ms") or not entry.get("sample_ms"):
            return None
        layer, sample = ({int(k): float(v["ms"]) * 1e-3 for k, v in entry[key].items()}
                         for key in ("layer_ms", "sample_ms"))
        return cls(TokenTable(layer, str(path)), TokenTable(sample, str(path)), str(path))

    def __call__(self, tokens: int, n_logits: int, num_layers: int) -> float:
        if tokens <= 0:
            return 0.0
        return self.layer(tokens) * num_layers + (self.sample(n_logits) if n_logits > 0 else 0.0)

    def covers(self, tokens: int) -> bool:
        """Whether the layer table was timed on both sides of `tokens` (it clamps outside)."""
        return bool(self.layer.tokens[0] <= tokens <= self.layer.tokens[-1])


class PredictSimulator(Simulator):
    """The plain simulator, with workloads below the dataset's smallest shapes raised to them (prefill steps of
    fewer than 128 tokens timed as one 128-token sequence, decode contexts below 128 as 128: upper bounds, counted in
    `clamped`), so a replay with short chunks can be predicted from the packaged data at all. `moe_routing_s`
    (tokens -> seconds per MoE call, e.g. a TokenTable): the live stack's in-launch routing, charged per step as
    kernel time (measured) at the step's MoE token count x the model's layers, summed in `moe_routing_charged_s`.
    `dense_ops` (a DenseOps): the dense ops priced from the stack's measured table instead of the roofline (both
    summed: `dense_charged_s`, `dense_roofline_s`). `moe_graph` (a MoEGraphTable): a graphed step's MoE, routing
    inside, from the live call timed as graphs run it, where it answers (`moe_graph_charged_s` beside the dataset's
    `moe_graph_replaced_s`). `moe_eager` (a MoEEagerTable): an eager step's MoE, routing inside, from the live call
    timed as an eager step runs it, where it answers (`moe_eager_charged_s` beside `moe_eager_replaced_s`; misses
    keep the dataset's row plus the routing, counted). `dense_eager` (a DenseOps timed eagerly): an eager step's dense
    ops within its table's tokens (else `dense_ops`, counted). `eager_issue_per_layer_s`: an eager step costs no less
    than that x layers (the host's issue time; `host_bound_s`)."""

    clamped = 0
    scaled_decode_s = 0.0
    moe_routing_s: Any = None
    moe_routing_charged_s = 0.0
    dense_ops: DenseOps | None = None
    dense_charged_s = 0.0
    dense_roofline_s = 0.0
    moe_graph: MoEGraphTable | None = None
    moe_graph_charged_s = 0.0  # the graph table's seconds charged (all layers), routing inside
    moe_graph_replaced_s = 0.0  # the dataset's seconds those calls would have cost (the routing charge left out too)
    moe_graph_steps = 0
    moe_graph_missed = 0  # graphed steps whose MoE config the table could not answer (dataset + routing charged)
    _graph_rows = 0  # the capture size of the step being priced (0: an eager step)
    _moe_routing_inside = False  # the step's MoE came from a table whose timed call routes inside (no routing charge)
    moe_chunk_graph: MoEGraphTable | None = None  # steps with prefill chunks: the chunk-routed tables (--moe-chunk),
    moe_chunk_eager: MoEGraphTable | None = None  # graphed (piecewise) and eager, asked before the two above
    moe_chunk_charged_s = 0.0
    moe_chunk_replaced_s = 0.0
    moe_chunk_steps = 0
    moe_chunk_missed = 0  # steps with chunks whose config and rows the chunk tables could not answer (the next table)
    _has_chunks = False  # the step being priced carries prefill chunks
    _chunk_tokens = 0  # and how many chunk tokens
    _chunk_table_hit = False  # the step's MoE came from a chunk-routed table (no --chunk-routing factor on it)
    chunk_routing: dict[int, list[float]] | None = None  # --chunk-routing: chunk length -> each layer's skew
    chunk_skew_s = 0.0  # seconds steps with chunks were charged over their even-routing price (all layers)
    chunk_skew_steps = 0
    chunk_skew_missed = 0  # steps with chunks whose config the dataset could not time at the chunk's skews
    moe_eager: MoEGraphTable | None = None
    moe_eager_charged_s = 0.0  # the eager table's seconds charged (all layers), routing inside
    moe_eager_replaced_s = 0.0  # the dataset's seconds those calls would have cost (the routing charge left out too)
    moe_eager_steps = 0
    moe_eager_missed = 0  # eager steps whose MoE config and tokens the table could not answer (dataset + routing)
    _eager_rows = 0  # the token count of the eager step being priced (0: a graphed one)
    dense_eager: DenseOps | None = None
    dense_eager_steps = 0
    dense_eager_missed = 0  # eager steps outside the eager dense table's tokens (dense_ops charged)
    eager_issue_per_layer_s = 0.0  # > 0: an eager step costs no less than this x layers (the host issues it)
    host_bound_s = 0.0  # seconds eager steps were charged above their kernels and dense ops for that

    def price_step(self, chunks: list[tuple[int, int, int]], batch: int, mean_ctx: float, n_logits: int,
                   stall: list, max_ctx: float | None = None, contexts: Any = None) -> tuple[float, float]:
        num_tokens = batch + sum(c for _, c, _ in chunks)  # the step's rows, as Simulator.price_step charges them
        eager = num_tokens > self.graph_max_tokens
        if not eager:
            num_tokens = capture_size(num_tokens)
            self._graph_rows = num_tokens
        else:
            self._eager_rows = num_tokens
        self._moe_routing_inside = False
        self._decode_scaled = False
        self._has_chunks = bool(chunks)
        self._chunk_tokens = sum(c for _, c, _ in chunks)
        try:
            kernel_s, dense = super().price_step(chunks, batch, mean_ctx, n_logits, stall, max_ctx, contexts)
        finally:
            self._graph_rows = self._eager_rows = 0
            self._has_chunks = False
        self.dense_roofline_s += dense
        ops = self.dense_ops
        if eager and self.dense_eager is not None:
            if self.dense_eager.covers(num_tokens):
                ops = self.dense_eager
                self.dense_eager_steps += 1
            else:
                self.dense_eager_missed += 1
        if ops is not None:
            dense = ops(num_tokens, n_logits, self.model.num_layers)
        self.dense_charged_s += dense
        if self.moe_routing_s is not None and not self._moe_routing_inside:  # a table's time holds the routing
            routing = float(self.moe_routing_s(num_tokens)) * self.model.num_layers
            self.moe_routing_charged_s += routing
            kernel_s += routing
        if num_tokens > self.graph_max_tokens and self.eager_issue_per_layer_s:  # an eager step: the host issues it
            floor = self.eager_issue_per_layer_s * self.model.num_layers
            if kernel_s + dense < floor:
                self.host_bound_s += floor - (kernel_s + dense)
                dense = floor - kernel_s  # the untuned part of the step is the host's wait
        return kernel_s, dense

    def _kernel_s(self, kernel: str, key: tuple, stall: list) -> float:
        """Decode at a batch the dataset has no row for (it stops at 64 below 2048 tokens of context): the time at
        the largest batch it answers (halving), scaled by the batch ratio (decode reads KV: time ~ batch x context).
        An estimate, summed in scaled_decode_s. The MoE of a graphed step: the graph table's time for the config
        chosen, where it answers (moe_graph); an eager step's from the eager table (moe_eager)."""
        try:
            t = super()._kernel_s(kernel, key, stall)
            if kernel != "fused_moe":
                return t
            t = self._table_moe(t)  # a chunk-routed table's time holds the chunk's routing: no skew factor on it
            return t if self._chunk_table_hit else self._chunk_skewed(t, key)
        except LookupError:
            if kernel != "decode_attention" or key[1] <= 1:
                raise
        batch, smaller = key[1], key[1]
        while smaller > 1:
            smaller //= 2
            try:
                t = super()._kernel_s(kernel, (key[0], smaller, key[2]), stall) * batch / smaller
            except LookupError:
                continue
            self.scaled_decode_s += t * self.model.num_layers
            self._decode_scaled = True  # the call just chosen was a smaller batch's: no wave price on it
            return t
        raise LookupError(f"no decode time at any batch <= {batch} for context {key[2]}")

    _decode_scaled = False  # the step's decode time is a smaller batch's scaled (_kernel_s): kept, no wave price
    decode_graph: dict | None = None  # --decode-graph: {config: {(batch, context): s}} timed as the graphs run them
    decode_graph_fits = 0  # configs whose wave model was fitted on that table's times

    decode_ragged: dict | None = None  # --decode-ragged: {config: {capture size: launch factor}} (ragged_factors)
    decode_ragged_s = 0.0  # seconds (all layers) the launch factor added over the wave model's price
    decode_ragged_steps = 0

    def _waves_s(self, cfg: Config, contexts: Any, untimed: bool = False) -> float | None:
        """The wave model's price; on a graphed decode-only step whose config --decode-ragged measured, no less than
        the longest sequence's price alone x the launch factor at the step's capture size (ragged_decode.py: in
        a launch with more programs than the GPU runs at once, the long sequence's programs share SMs and slow;
        the wave model's slots run at one rate)."""
        waves = None if self._decode_scaled else super()._waves_s(cfg, contexts, untimed)
        factors = (self.decode_ragged or {}).get(str(cfg))
        if waves is None or not factors or self._has_chunks or not self._graph_rows or len(contexts) < 2:
            return waves
        from benchmarks.live_e2e.ragged_decode import factor_at

        factor = factor_at(factors, self._graph_rows)
        alone = super()._waves_s(cfg, [max(contexts)], untimed)
        if factor is None or alone is None or factor * alone <= waves:
            return waves
        self.decode_ragged_s += (factor * alone - waves) * self.model.num_layers
        self.decode_ragged_steps += 1
        return factor * alone

    def _fit_waves(self, cfg: Config) -> Any:
        """The wave model of `cfg` fitted on --decode-graph's times where that table times the config (the launches
        as the stack's graphs replay them), else on the dataset's (Simulator._fit_waves)."""
        points = (self.decode_graph or {}).get(str(cfg))
        if points:
            from kernel_gym.kernels.decode_attention import program_rounds
            from kernel_gym.traffic import decode_waves

            m = self.model
            fit = decode_waves.fit(lambda b, c: points.get((b, c)), lambda b, c: program_rounds(
                self._workload(("decode_attention", b, c)).context_lens(), cfg, m.num_heads, m.num_kv_heads))
            if fit is not None:
                self.decode_graph_fits += 1
                return fit
        return super()._fit_waves(cfg)

    def _table_moe(self, t: float) -> float:
        """The dataset's MoE seconds `t` for the config just chosen, or the live call's measured time for it (noted in
        the counters) where a table answers: for a step with prefill chunks first the chunk-routed table's (graphed
        or eager), then the graph table's at a graphed step's capture size, the eager table's at an eager step's
        token count."""
        rows = self._graph_rows or self._eager_rows
        self._chunk_table_hit = False
        tables = [("chunk", self.moe_chunk_graph if self._graph_rows else self.moe_chunk_eager)] if self._has_chunks \
            else []
        tables.append(("graph", self.moe_graph) if self._graph_rows else ("eager", self.moe_eager))
        for kind, table in tables:
            if not rows or table is None:
                continue
            g = table(str(self._last_cfg["fused_moe"]), rows)
            if g is not None:
                self._chunk_table_hit = kind == "chunk"
                return self._charge_moe(kind, g, t)
            setattr(self, f"moe_{kind}_missed", getattr(self, f"moe_{kind}_missed") + 1)
        return t

    def _chunk_skewed(self, t: float, key: tuple) -> float:
        """A step with chunks routes as the live stack routes a chunk (--chunk-routing: each layer's matching skew
        at the chunk's length): its MoE seconds `t` (whichever table priced it, at the step's even routing) times the
        mean over layers of the chosen config's dataset time at that layer's skew over its time at the step's own."""
        if not (self._has_chunks and self.chunk_routing):
            return t
        lengths = sorted(self.chunk_routing)
        near = min(lengths, key=lambda n: abs(math.log2(n) - math.log2(max(self._chunk_tokens, 1))))
        cfg = self._last_cfg["fused_moe"]
        try:
            base = self._moe_time(key[1], key[2], cfg)
            factor = float(np.mean([self._moe_time(key[1], max(s, key[2]), cfg) / base
                                    for s in self.chunk_routing[near]]))
        except (LookupError, ValueError, RuntimeError):  # no measured row brackets the config there
            self.chunk_skew_missed += 1
            return t
        self.chunk_skew_steps += 1
        self.chunk_skew_s += t * (factor - 1.0) * self.model.num_layers
        return t * factor

    def _moe_time(self, tokens: int, skew: float, cfg: Any) -> float:
        """The timer's (the dataset's) seconds for this MoE config at these tokens and skew (on SKEW_GRID), memoised."""
        skew = round(round(skew / SKEW_GRID) * SKEW_GRID, 3)
        mk = (("fused_moe", tokens, skew), cfg)
        t = self._memo.get(mk)
        if t is None:
            t = float(self.timer.time_s("fused_moe", self._workload(mk[0]), cfg))
            if not t > 0 or not math.isfinite(t):
                raise ValueError(f"timer gave {t!r} s for fused_moe {mk[0]} {cfg}; kernel times must be finite, > 0")
            self._memo[mk] = t
        return t

    def _charge_moe(self, kind: str, g: float, t: float) -> float:
        """Book a table's seconds per layer `g` in place of the dataset's `t` under `kind`'s counters."""
        layers = self.model.num_layers
        setattr(self, f"moe_{kind}_charged_s", getattr(self, f"moe_{kind}_charged_s") + g * layers)
        setattr(self, f"moe_{kind}_replaced_s", getattr(self, f"moe_{kind}_replaced_s") + t * layers)
        setattr(self, f"moe_{kind}_steps", getattr(self, f"moe_{kind}_steps") + 1)
        self._moe_routing_inside = True
        return g

    def _workload(self, key: tuple) -> Any:
        if key[0] == "prefill_attention" and sum(key[1]) < MIN_PREFILL_TOKENS:
            self.clamped += 1
            key = (key[0], (MIN_PREFILL_TOKENS,))
        elif key[0] == "decode_attention" and key[2] < MIN_DECODE_CONTEXT:
            self.clamped += 1
            key = (key[0], key[1], MIN_DECODE_CONTEXT)
        return super()._workload(key)


def attach_tables(sim: Any, args: Any) -> None:
    """The measured tables predict_setup read (args.*_s) onto a PredictSimulator."""
    sim.moe_routing_s = getattr(args, "moe_routing_s", None)
    sim.dense_ops = getattr(args, "dense_ops_s", None)
    sim.moe_graph = getattr(args, "moe_graph_s", None)
    sim.moe_eager = getattr(args, "moe_eager_s", None)
    sim.moe_chunk_graph, sim.moe_chunk_eager = getattr(args, "moe_chunk_s", (None, None))
    sim.chunk_routing = getattr(args, "chunk_routing_s", None)
    sim.dense_eager = getattr(args, "dense_eager_s", None)
    sim.eager_issue_per_layer_s = getattr(args, "eager_issue_s", 0.0) or 0.0
    sim.decode_graph = getattr(args, "decode_graph_s", None)
    sim.decode_ragged = getattr(args, "decode_ragged_s", None)


def _predict_one(spec: str, model: ModelSpec, trace: Trace, timer: Any, backend: Any, args: Any, meta: dict,
                 overheads: dict[str, float] | None = None, issue_s: float | None = None) -> tuple[dict, Any, Any]:
    """The plain simulator's summary for one policy on the window (with these per-kind step overheads, where
    given: a calibration; with this eager issue time per layer, where given: the policy's host calibration)."""
    chooser: Any = make_chooser(spec, model)
    guard = None
    if backend is not None:  # as `kernel-gym replay`: a config the dataset cannot time falls back, counted
        from kernel_gym.evaluate.replay import GuardedChooser

        chooser = guard = GuardedChooser(chooser, backend, model.num_layers)
    plain = getattr(args, "step_host_s", None)  # the measured host part per kind of step; None: the assumption
    # compile_s 0: the live run compiles each config (and captures each graph) untimed, the first time it comes
    sim = PredictSimulator(model, trace, timer, chooser, None, kv_layout=PAGE, dtype=meta.get("dtype", "bfloat16"),
                           step_overheads=overheads if overheads is not None else plain, **sim_kwargs(args, model),
                           compile_s=lambda kernel, config: 0.0, **graph_kwargs(meta), **waves_kwargs(args))
    attach_tables(sim, args)
    if issue_s is not None:
        sim.eager_issue_per_layer_s = issue_s
    if guard is not None:
        guard.sim = sim
    return sim.run().summary, sim, guard


def policy_issue_s(args: Any, measured: dict) -> tuple[float | None, str]:
    """The eager issue time per layer --predict charges a measured policy: with `--eager-issue host` (the default),
    its own host calibration, measured before its replay on the serving host (calibrate_issue; runs from session 54
    on), else the runs' figure eager_issue_setup set (None: that one). `--eager-issue none` charges none."""
    cal = measured.get("host_issue_calibration") or {}
    if getattr(args, "eager_issue_s", 0.0) and getattr(args, "eager_issue_host", False) and cal.get("per_layer_s"):
        return float(cal["per_layer_s"]), "host calibration before the replay"
    return None, "--eager-issue runs" if getattr(args, "eager_issue_s", 0.0) else "none"


def fit_overheads(priced: list[tuple]) -> dict[str, dict]:
    """Per kind of step (Simulator.step_kind), the fixed cost the kernel table leaves out: the median of (measured
    seconds - the simulator's kernel and dense seconds for the same step) over one policy's timed steps, never below
    0. The host work of launching a step (a graph replay, the eager attention launches between piecewise graphs,
    every launch of an eager step) is what it holds; fitted on one policy, then held for the others and other runs."""
    out = {}
    for kind in STEP_KINDS:
        rest = [r[2] - r[3] for r in priced if r[0] == kind]
        if rest:
            out[kind] = {"overhead_s": max(0.0, float(np.median(rest))), "steps": len(rest)}
    return out


TABLE_OPTIONS = ("moe_routing", "dense_ops", "moe_graph", "moe_eager", "moe_chunk", "dense_eager", "decode_graph",
                 "decode_ragged")


def check_table_devices(args: Any, device: str | None) -> None:
    """Every --predict table that names the GPU it was timed on (meta.device) must name the live run's: a table from
    another GPU (an H100 lent where an H200 was asked for) would price the run with another chip's times."""
    if not device:
        return
    for option in TABLE_OPTIONS:
        for path in str(getattr(args, option, None) or "none").split(","):
            path = path.strip()
            if path in ("", "none") or not Path(path).is_file():
                continue
            try:
                timed_on = json.loads(Path(path).read_text()).get("meta", {}).get("device")
            except (json.JSONDecodeError, AttributeError):
                continue  # not a JSON object with meta: the option's own loader says what is wrong
            if timed_on and timed_on != device:
                raise SystemExit(f"--{option.replace('_', '-')} {path}: timed on {timed_on}, but the live run ran on "
                                 f"{device}: pass tables timed on the run's GPU (or none)")


def predict_setup(args: Any) -> tuple[dict, dict, ModelSpec, Trace, Any, Any, dict]:
    """What --predict prices a measured run's window with: measured.json's data and meta, the model, the window's
    trace, the recorded backend and its timer (the roofline for a smoke run), and the measured tables it reads
    (args.*_s set) with their notes, the code and the dataset hash (the summary's `prediction`)."""
    from kernel_gym.measure import make_backend
    from kernel_gym.traffic.simulator import BackendTimer

    path = args.out / "measured.json"
    if not path.exists():
        raise SystemExit(f"{path} is absent: run the live replay with --out {args.out} first")
    data = json.loads(path.read_text())
    meta = data["meta"]
    check_table_devices(args, None if meta["smoke"] else meta.get("device"))  # a smoke run: the CPU, no tables
    model = TINY if meta["smoke"] else load_model(meta["model"])
    start, seconds, rate = meta["window"]
    trace = window_trace(meta["trace"], start, seconds, rate, meta["max_prompt"], meta["max_output"])
    if meta["smoke"]:
        trace = trace.head(SMOKE_REQUESTS)
    args.kv_gb, args.max_batched_tokens, args.max_seqs = meta["kv_gb"], meta["max_batched_tokens"], meta["max_seqs"]
    backend: Any = None
    prediction: dict = {}
    if meta["smoke"]:  # the dataset has no tiny-model rows: the path only, with a roofline timer
        from kernel_gym.measure.roofline import RooflineTimer

        timer: Any = RooflineTimer(0.5)
    else:
        from kernel_gym.train.tracking import git_commit

        # as `kernel-gym replay` prices: rows too noisy to rank configs by still time the config deployed (an upper
        # bound: host delays only add), where leaving them out would put another config in its place
        backend = make_backend("recorded", max_spread=math.inf)
        timer = BackendTimer(backend)
        prediction = {"commit": git_commit(), "dataset_sha256_16": backend.dataset_hash}  # meta is the run's
    prediction |= {"moe_routing": moe_routing_setup(args, model), "dense_ops": dense_ops_setup(args, model),
                   "moe_graph": moe_graph_setup(args, model), "moe_eager": moe_eager_setup(args, model),
                   "moe_chunk": moe_chunk_setup(args, model), "chunk_routing": chunk_routing_setup(args, model),
                   "dense_eager": dense_eager_setup(args, model), "step_overheads": step_host_setup(args),
                   "eager_issue": eager_issue_setup(args),
                   "decode_waves": getattr(args, "decode_waves", "on"), "decode_graph": decode_graph_setup(args, model),
                   "decode_ragged": decode_ragged_setup(args, model)}
    return data, meta, model, trace, backend, timer, prediction


def predicted_row(pred: dict, sim: Any, guard: Any) -> dict:
    """One policy's prediction and what priced it (estimated share, fallbacks, the measured tables' charges)."""
    return {"predicted": {k: pred[k] for k in METRICS},
            "chunk_attention_estimated_s": pred["chunk_attention_estimated_s"],
            # the routing charge is measured time: in the denominator, not the estimated part
            # the wave model's prices of choices the data cannot time are estimates too (and it moved the total)
            "estimated_share": ((sum(guard.estimated_s.values()) + sim.decode_waves_untimed_s)
                                / max(sum(guard.kernel_s.values()) + sim.moe_routing_charged_s + sim.decode_waves_s,
                                      1e-12)
                                if guard is not None else None),
            "moe_routing_charged_s": sim.moe_routing_charged_s,
            "dense_charged_s": sim.dense_charged_s, "dense_roofline_s": sim.dense_roofline_s,
            "moe_graph": {"charged_s": sim.moe_graph_charged_s, "dataset_s": sim.moe_graph_replaced_s,
                          "steps": sim.moe_graph_steps, "missed_steps": sim.moe_graph_missed},
            "moe_eager": {"charged_s": sim.moe_eager_charged_s, "dataset_s": sim.moe_eager_replaced_s,
                          "steps": sim.moe_eager_steps, "missed_steps": sim.moe_eager_missed},
            "moe_chunk": {"charged_s": sim.moe_chunk_charged_s, "dataset_s": sim.moe_chunk_replaced_s,
                          "steps": sim.moe_chunk_steps, "missed_steps": sim.moe_chunk_missed},
            "chunk_routing": {"extra_s": sim.chunk_skew_s, "steps": sim.chunk_skew_steps,
                              "missed_steps": sim.chunk_skew_missed},
            "dense_eager": {"steps": sim.dense_eager_steps, "missed_steps": sim.dense_eager_missed},
            "fallbacks": guard.fallbacks if guard is not None else None,
            "clamped_workloads": sim.clamped,
            "decode_scaled_estimate_s": sim.scaled_decode_s,
            "decode_longest_s": sim.decode_longest_s,
            "decode_waves": {"extra_s": sim.decode_waves_s, "steps": sim.decode_waves_steps,
                             "untimed_choices_s": sim.decode_waves_untimed_s,
                             "untimed_priced_by_sibling": {str(c): str(s) for c, s in sim.decode_waves_siblings.items()
                                                           if s is not None},
                             "configs_fitted_on_graph_times": sim.decode_graph_fits,
                             "configs_fitted": sum(1 for f in sim._wave_fits.values() if f is not None),
                             "configs_unfitted": sum(1 for f in sim._wave_fits.values() if f is None),
                             "ragged_extra_s": sim.decode_ragged_s, "ragged_steps": sim.decode_ragged_steps},
            "host_bound_s": sim.host_bound_s,
            "predicted_busy_s": pred["busy_s"]}


def run_predict_policies(args: Any) -> int:
    """CPU: policies a measured run did not serve, priced on its window exactly as --predict prices the ones it did
    (--predict-policies SPECS): a prediction with nothing measured beside it, written to --predict-json (the run's
    summary.json is left as it is). The measured policies' errors on the same window say how far to trust it."""
    from kernel_gym.evaluate.replay_report import json_safe

    data, meta, model, trace, backend, timer, prediction = predict_setup(args)
    out: dict = {"run": str(args.out), "meta": meta, "prediction": prediction, "policies": {}}
    guards = []
    for spec in [s for s in args.predict_policies.split(",") if s]:
        try:  # a policy the run measured: its host calibration, as --predict charges it
            pred, sim, guard = _predict_one(spec, model, trace, timer, backend, args, meta,
                                            issue_s=policy_issue_s(args, data["measured"].get(spec, {}))[0])
        except (LookupError, RuntimeError) as exc:  # as --predict: say why, keep the others
            out["policies"][spec] = {"prediction_error": f"{type(exc).__name__}: {exc}"[:400]}
            log(f"{spec}: no prediction: {exc}")
            continue
        guards.append(guard)
        out["policies"][spec] = predicted_row(pred, sim, guard)
        log(f"{spec}: " + ", ".join(f"{k} predicted {pred[k]:.4g}" for k in METRICS)
            + f" ({out['policies'][spec]['fallbacks']} fallbacks for untimed choices)")
    if isinstance(prediction.get("moe_routing"), dict):  # what the routing charge came to, as --predict records it
        prediction["moe_routing"]["charged_s"] = {spec: row["moe_routing_charged_s"] for spec, row in
                                                  out["policies"].items() if "moe_routing_charged_s" in row}
    args.predict_json.parent.mkdir(parents=True, exist_ok=True)
    args.predict_json.write_text(json.dumps(json_safe(out), indent=1, allow_nan=False))
    if backend is not None:  # what to measure before these predictions can be trusted (a collect --plan)
        from kernel_gym.evaluate.replay import write_untimed_plan

        write_untimed_plan(guards, backend, args.predict_json.with_name(args.predict_json.stem + "_untimed_plan.json"))
    return 0


def run_predict(args: Any) -> int:
    """CPU: the plain simulator on the measured run's window with the packaged dataset, beside the measurements; with
    --calibrate POLICY also a second prediction whose step overheads per kind of step are fitted on that policy's
    step records (fit_overheads) and held for the others (their errors are out of sample), or with
    --calibration-from those of another run. The choices the data could not time go to untimed_plan.json."""
    data, meta, model, trace, backend, timer, prediction = predict_setup(args)
    routing_note = prediction["moe_routing"]
    if args.calibrate and not args.calibration_from and args.calibrate not in data["measured"]:
        raise SystemExit(f"--calibrate {args.calibrate!r}: not a measured policy; measured: {list(data['measured'])}")
    summary: dict = {"meta": meta, "policies": {}, "prediction": prediction}
    overheads = None
    if args.calibration_from:  # overheads fitted on another run: every policy here is out of sample
        fitted = json.loads(Path(args.calibration_from).read_text()).get("calibration")
        if not fitted or "step_overheads_s" not in fitted:
            raise SystemExit(f"--calibration-from {args.calibration_from}: no step-overhead calibration there (run "
                             "--predict --calibrate POLICY on that run first)")
        layers = int(fitted.get("num_layers") or model.num_layers)
        # the host work is per layer (launches, graph nodes): scaled by the depth
        overheads = {k: v * model.num_layers / layers for k, v in fitted["step_overheads_s"].items()}
        summary["calibration"] = {**fitted, "from": str(args.calibration_from), "applied_step_overheads_s": overheads,
                                  "scaled_by_layers": [layers, model.num_layers]}
        args.calibrate = args.calibrate or "(another run)"
    elif args.calibrate:
        fit = fit_overheads(priced_steps(args.out, args.calibrate, model, trace, timer, backend, args, meta,
                                         issue_s=policy_issue_s(args, data["measured"][args.calibrate])[0]))
        if not fit:
            raise SystemExit(f"--calibrate {args.calibrate}: no step records of that policy in {args.out}")
        overheads = {k: v["overhead_s"] for k, v in fit.items()}
        summary["calibration"] = {"policy": args.calibrate, "step_overheads_s": overheads,
                                  "num_layers": model.num_layers, "steps": {k: v["steps"] for k, v in fit.items()},
                                  "note": "per kind of step, the median of measured - priced seconds over this "
                                          "policy's steps; held for the other policies"}
        log(f"calibrated step overheads on {args.calibrate}: "
            + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in overheads.items()))
    guards: list = []  # every prediction's chooser: their untimed choices become untimed_plan.json
    for spec, measured in data["measured"].items():
        issue_s, issue_from = policy_issue_s(args, measured)
        try:
            pred, sim, guard = _predict_one(spec, model, trace, timer, backend, args, meta, issue_s=issue_s)
            guards.append(guard)
            cal = (_predict_one(spec, model, trace, timer, backend, args, meta, overheads, issue_s)[0] if overheads
                   else None)
        except (LookupError, RuntimeError) as exc:  # the dataset cannot time some step: say so, keep the others
            summary["policies"][spec] = {"measured": {k: measured[k] for k in METRICS},
                                         "prediction_error": f"{type(exc).__name__}: {exc}"[:400]}
            log(f"{spec}: no prediction: {exc}")
            continue
        row = {"measured": {k: measured[k] for k in METRICS}, **predicted_row(pred, sim, guard),
               "relative_error": {k: (pred[k] - measured[k]) / measured[k] for k in METRICS if measured[k]},
               "measured_run_complete": measured.get("complete"),
               # runs before tree e41f161 timed a step that compiled a config with its compile (a real engine
               # compiles while warming up): their measured TTFT holds those stalls, the prediction does not
               "measured_compiles_timed": "steps_compiled_in_timed_run" not in measured,
               # the GPU's clocks, power and throttle reasons around the measured policy (measure/power.py)
               "gpu_before": measured.get("gpu_before"), "gpu_after": measured.get("gpu_after"),
               "eager_issue": {"per_layer_s": sim.eager_issue_per_layer_s, "from": issue_from}}
        if cal is not None:
            row["calibrated"] = {"predicted": {k: cal[k] for k in METRICS},
                                 "relative_error": {k: (cal[k] - measured[k]) / measured[k] for k in METRICS
                                                    if measured[k]},
                                 "in_sample": spec == args.calibrate}
        summary["policies"][spec] = row
        log(f"{spec}: " + ", ".join(f"{k} measured {row['measured'][k]:.4g} predicted {row['predicted'][k]:.4g}"
                                     + (f" (calibrated {cal[k]:.4g})" if cal is not None else "") for k in METRICS))
    if isinstance(routing_note, dict):
        routing_note["charged_s"] = {spec: row["moe_routing_charged_s"] for spec, row in summary["policies"].items()
                                     if "moe_routing_charged_s" in row}
    summary["step_fit"] = step_fit(args.out, data["measured"])
    where = getattr(args, "summary_dir", None) or args.out  # --summary-dir: beside the committed prediction
    where.mkdir(parents=True, exist_ok=True)
    if backend is not None:
        plain = getattr(args, "step_host_s", None) or dict.fromkeys(STEP_KINDS, STEP_OVERHEAD_S)
        summary["step_check"] = {}
        for spec, measured in data["measured"].items():
            recovered: dict = {}
            priced = priced_steps(args.out, spec, model, trace, timer, backend, args, meta, guards, recovered,
                                  policy_issue_s(args, measured)[0])
            summary["step_check"][spec] = step_check(priced, plain)
            summary["step_check"][spec]["contexts_recovered"] = recovered.get(spec)
            if measured.get("profiled_kernels_us"):  # every profiled step, by kernel name
                summary["step_check"][spec]["profile"] = profile_check(priced, measured["profiled_kernels_us"])
        from kernel_gym.evaluate.replay import write_untimed_plan

        write_untimed_plan(guards, backend, where / "untimed_plan.json")
    (where / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["policies"], indent=1))
    return 0


def _measured_table(choice: str, flag: str, what: str, load: Any, model: ModelSpec) -> tuple[Any, str]:
    """A --predict table option (a path, or "none") -> (the model's entry, loaded by `load(path, model name)`, and
    the path as summary.json shows it) or (None, why nothing is charged)."""
    if choice == "none":
        return None, f"none: {flag} none"
    path = Path(choice)
    if not path.exists():
        raise SystemExit(f"{flag} {choice}: no such file ({what}, or none)")
    table = load(path, model.name)
    if table is None:
        return None, f"none: no measured table for {model.name} in {choice}"
    root = Path(__file__).resolve().parents[2]
    return table, path.resolve().relative_to(root).as_posix() if path.resolve().is_relative_to(root) else str(path)


def moe_routing_setup(args: Any, model: ModelSpec) -> dict | str:
    """args.moe_routing (a routing table's path, or "none") -> args.moe_routing_s (TokenTable or None) and the note
    summary.json's prediction carries: the table, the model's points; or why nothing is charged."""
    routing, shown = _measured_table(str(getattr(args, "moe_routing", None) or "none"), "--moe-routing",
                                     "a moe_price_check routing table", TokenTable.from_routing_table, model)
    args.moe_routing_s = routing
    if routing is None:
        return shown
    return {"table": shown, "model": model.name, "per_call_ms": {int(t): round(s * 1e3, 5) for t, s in
                                                                   zip(routing.tokens, routing.seconds)},
            "note": "the live fused MoE's in-launch routing and alignment, seconds per MoE call at the step's MoE "
                    "token count (linear in log2 tokens, clamped) x num_layers, charged as measured kernel time; "
                    "charged_s: the plain prediction's total per policy"}


def dense_ops_setup(args: Any, model: ModelSpec) -> dict | str:
    """args.dense_ops (a dense_price_check table's path, or "none") -> args.dense_ops_s (DenseOps or None, then the
    roofline prices the dense ops) and the note summary.json's prediction carries."""
    dense, shown = _measured_table(str(getattr(args, "dense_ops", None) or "none"), "--dense-ops",
                                   "a dense_price_check.py table", DenseOps.from_table, model)
    args.dense_ops_s = dense
    if dense is None:
        return f"{shown} (the roofline prices the dense ops)"
    return {"table": shown, "model": model.name,
            "note": "the stack's dense ops (norms, projections, KV writes, adds; LM head) timed per layer by token "
                    "count in CUDA graphs, x num_layers, plus the sample over the rows that sample, instead of the "
                    "roofline: dense_charged_s and dense_roofline_s per policy"}


def _moe_tables(choice: str, flag: str, what: str, cls: type, model: ModelSpec, routing: str = "even"
                ) -> tuple[Any, str]:
    """A comma list of MoE tables' paths (or "none") -> (their `cls.union` for the model, or None; the paths as
    summary.json shows them, or why nothing is charged). Each table's routing (meta.routing; "even" where unsaid)
    must be `routing`: a chunk-routed table prices only steps with chunks (--moe-chunk)."""
    found, where, shown = [], [], f"none: {flag} none"
    for path in choice.split(","):
        path = path.strip()
        if path not in ("", "none") and Path(path).is_file():
            has = json.loads(Path(path).read_text()).get("meta", {}).get("routing", "even")
            if has != routing:
                raise SystemExit(f"{flag} {path}: a table timed with {has} routing, where {flag} takes {routing} "
                                 "routing; pass a chunk-routed table (moe_graph_table.py --chunk) to --moe-chunk only")
        table, shown = _measured_table(path, flag, what, cls.from_table, model)
        if table is not None:
            found.append(table)
            where.append(shown)
    return (cls.union(found), ",".join(where)) if found else (None, shown)


def moe_graph_setup(args: Any, model: ModelSpec) -> dict | str:
    """args.moe_graph (moe_graph_table.py tables' paths, comma-separated, or "none") -> args.moe_graph_s (their
    MoEGraphTable.union for the model, or None) and the note summary.json's prediction carries."""
    table, shown = _moe_tables(str(getattr(args, "moe_graph", None) or "none"), "--moe-graph",
                               "a moe_graph_table.py table", MoEGraphTable, model)
    args.moe_graph_s = table
    if table is None:
        return f"{shown} (graphed steps' MoE priced by the dataset's row plus the routing table)"
    return {"table": shown, "model": model.name, "configs": len(table.points),
            "note": "the MoE of graphed steps (decode graphs, piecewise graphs) at the step's capture size from the "
                    "live call timed as a graph replays it, routing inside (no routing charge on those steps), "
                    "where the table times the config chosen on both sides of the capture size; else the dataset's "
                    "row plus the routing table (missed_steps per policy)"}


def moe_eager_setup(args: Any, model: ModelSpec) -> dict | str:
    """args.moe_eager (moe_graph_table.py --eager tables' paths, comma-separated, or "none") -> args.moe_eager_s
    (their MoEEagerTable.union for the model, or None) and the note summary.json's prediction carries."""
    table, shown = _moe_tables(str(getattr(args, "moe_eager", None) or "none"), "--moe-eager",
                               "a moe_graph_table.py --eager table", MoEEagerTable, model)
    args.moe_eager_s = table
    if table is None:
        return f"{shown} (eager steps' MoE priced by the dataset's row plus the routing table)"
    return {"table": shown, "model": model.name, "configs": len(table.points),
            "note": "the MoE of eager steps (over the piecewise graphs' largest size) at the step's token count from "
                    "the live call timed as an eager step runs it, routing inside (no routing charge on those "
                    "steps), where the table times the config chosen on both sides of the token count; else the "
                    "dataset's row plus the routing table (missed_steps per policy)"}


def moe_chunk_setup(args: Any, model: ModelSpec) -> dict | str:
    """args.moe_chunk (moe_graph_table.py --chunk tables' paths, graph and --eager ones mixed, comma-separated, or
    "none") -> args.moe_chunk_s (their graph tables' MoEGraphTable.union and eager tables' MoEEagerTable.union for
    the model, either None) and the note summary.json's prediction carries."""
    choice = str(getattr(args, "moe_chunk", None) or "none")
    paths = [p.strip() for p in choice.split(",") if p.strip() not in ("", "none")]
    by_mode: dict[str, list[str]] = {"graph": [], "eager": []}
    for path in paths:  # _moe_tables refuses a table of even routing
        if not Path(path).exists():
            raise SystemExit(f"--moe-chunk {path}: no such file (a moe_graph_table.py --chunk table, or none)")
        mode = json.loads(Path(path).read_text()).get("meta", {}).get("mode")
        by_mode["eager" if mode == "eager" else "graph"].append(path)
    found = [_moe_tables(",".join(by_mode[mode]) or "none", "--moe-chunk", "a moe_graph_table.py --chunk table",
                         cls, model, routing="chunk")
             for mode, cls in (("graph", MoEGraphTable), ("eager", MoEEagerTable))]
    args.moe_chunk_s = (found[0][0], found[1][0])
    if found[0][0] is None and found[1][0] is None:
        return "none: --moe-chunk none (steps with prefill chunks priced as the other steps)"
    return {"graph": found[0][1], "eager": found[1][1], "model": model.name,
            "note": "the MoE of steps with prefill chunks from the live call timed with every layer's inputs as the "
                    "live stack routes one sequence's chunk (its tokens go to few experts), graphed steps at their "
                    "capture size, eager ones at their token count; where a table misses, the graph / eager table "
                    "as for other steps (missed_steps per policy)"}


def chunk_routing_setup(args: Any, model: ModelSpec) -> dict | str:
    """args.chunk_routing (a chunk_routing.py table's path, or "none") -> args.chunk_routing_s (chunk length -> each
    layer's matching skew for the model, or None) and the note summary.json's prediction carries."""
    from benchmarks.live_e2e.chunk_routing import load_table

    path = str(getattr(args, "chunk_routing", None) or "none")
    args.chunk_routing_s = None
    if path == "none":
        return "none: --chunk-routing none (steps with chunks priced at the even routing the tables were timed with)"
    if not Path(path).exists():
        raise SystemExit(f"--chunk-routing {path}: no such file (write it with benchmarks/live_e2e/chunk_routing.py, "
                         "or pass none)")
    try:
        entry = load_table(path)["models"].get(model.name)
    except ValueError as exc:
        raise SystemExit(f"--chunk-routing: {exc}") from exc
    if not entry:
        return f"{path} has no {model.name} (steps with chunks priced at the even routing)"
    args.chunk_routing_s = {int(t): list(v["skew"]) for t, v in entry.items()}
    return {"table": path, "model": model.name,
            "note": "steps with prefill chunks priced at the live stack's routing of a chunk: each layer's skew "
                    "matching its busiest-expert balance (chunk_routing.py, at the chunk length nearest in log2), "
                    "their MoE price times the chosen config's dataset time at those skews over its time at even "
                    "routing, averaged over layers (chunk_routing.extra_s per policy)"}


def dense_eager_setup(args: Any, model: ModelSpec) -> dict | str:
    """args.dense_eager (a dense_price_check.py --eager table's path, or "none") -> args.dense_eager_s (DenseOps or
    None: eager steps' dense ops priced as the others') and the note summary.json's prediction carries."""
    dense, shown = _measured_table(str(getattr(args, "dense_eager", None) or "none"), "--dense-eager",
                                   "a dense_price_check.py --eager table", DenseOps.from_table, model)
    args.dense_eager_s = dense
    if dense is None:
        return f"{shown} (eager steps' dense ops priced as the other steps')"
    return {"table": shown, "model": model.name,
            "note": "an eager step's dense ops from the stack's ops timed eagerly (no graph) per layer by token count, "
                    "where the table spans the step's tokens; else --dense-ops (dense_eager missed_steps per policy)"}


def decode_ragged_setup(args: Any, model: ModelSpec) -> dict | str:
    """args.decode_ragged (ragged_decode.py tables' paths, comma-separated: one per model probed; or "none") ->
    args.decode_ragged_s ({config: {capture size: factor}} of the first table for this model, or None) and the note
    summary.json carries."""
    from benchmarks.live_e2e.ragged_decode import ragged_factors

    choices = [c.strip() for c in str(getattr(args, "decode_ragged", None) or "none").split(",") if c.strip()]
    factors, shown = None, "none: --decode-ragged none"
    for choice in choices:
        factors, shown = _measured_table(choice, "--decode-ragged", "a ragged_decode.py table", ragged_factors, model)
        if factors is not None:
            break
    else:
        if len(choices) > 1:  # name every table that was read, not only the last
            shown = f"none: no measured table for {model.name} in {', '.join(choices)}"
    args.decode_ragged_s = factors
    if factors is None:
        return f"{shown} (a ragged decode-only step priced by the wave model alone)"
    return {"table": shown, "model": model.name,
            "factors": {cfg: {str(b): round(f, 4) for b, f in per.items()} for cfg, per in factors.items()},
            "note": "a graphed decode-only step of these configs costs no less than its longest sequence's price "
                    "alone x the factor at its capture size (ragged launches timed against the long sequence alone); "
                    "the extra in each policy row's decode_waves.ragged_extra_s"}


def decode_graph_setup(args: Any, model: ModelSpec) -> dict | str:
    """args.decode_graph (decode_graph_table.py tables' paths, comma-separated: a plan timed in parts, or "none") ->
    args.decode_graph_s ({config: {(batch, context): seconds}} over all of them, or None: the wave model fitted on the
    dataset's rows) and the note summary.json carries."""
    from benchmarks.live_e2e.decode_graph_table import graph_times

    key = "flushed_ms" if getattr(args, "decode_graph_times", "unflushed") == "flushed" else "ms"
    times, shown = None, "none: --decode-graph none"
    for choice in (c.strip() for c in str(getattr(args, "decode_graph", None) or "none").split(",")):
        part, part_shown = _measured_table(choice, "--decode-graph", "a decode_graph_table.py table",
                                           lambda path, name: graph_times(path, name, key), model)
        if not part and key != "ms" and choice != "none":
            raise SystemExit(f"--decode-graph-times flushed: {choice} has no flushed times for {model.name} (time it "
                             "with decode_graph_table.py --also-flushed), or pass --decode-graph-times unflushed")
        if part is not None:
            times = times or {}
            for cfg, points in part.items():
                times.setdefault(cfg, {}).update(points)
            shown = part_shown if shown.startswith("none") else f"{shown},{part_shown}"
        elif times is None:
            shown = part_shown
    args.decode_graph_s = times
    if times is None:
        return f"{shown} (the decode wave model fitted on the dataset's rows)"
    return {"table": shown, "model": model.name, "configs": len(times),
            "times": "flushed" if key != "ms" else "unflushed",
            "note": "the decode wave model fitted, per config the table times, on the decode launches timed as the "
                    "stack's CUDA graphs replay them at the fit grid (" + ("after an L2 flush before each replay"
                                                                         if key != "ms" else "no flush")
                    + "); other configs on the dataset's rows"}


def _live_runs(choice: str, flag: str, off: str) -> tuple[list[Path], list[str]]:
    """A comma list of live run folders (each with its measured.json) -> (the paths, as summary.json shows them)."""
    runs = [Path(r) for r in choice.split(",")]
    for r in runs:
        if not (r / "measured.json").exists():
            raise SystemExit(f"{flag} {choice}: {r} holds no measured.json (a live run's folder), or '{off}'")
    root = Path(__file__).resolve().parents[2]
    return runs, [r.resolve().relative_to(root).as_posix() if r.resolve().is_relative_to(root) else str(r)
                  for r in runs]


def step_host_setup(args: Any) -> dict | str:
    """args.step_host ("assumed", or run folders with gpu_s in their step records) -> args.step_host_s (the step
    overhead per kind of step, or None: the simulator's assumed STEP_OVERHEAD_S) and the note for summary.json."""
    choice = str(getattr(args, "step_host", None) or "assumed")
    if choice == "assumed":
        args.step_host_s = None
        return f"assumed: {STEP_OVERHEAD_S * 1e3:g} ms per step (the simulator's STEP_OVERHEAD_S)"
    runs, shown = _live_runs(choice, "--step-host", "assumed")
    host = measured_step_host(runs)
    args.step_host_s = {k: v["overhead_s"] for k, v in host.items()}
    return {"runs": shown, "per_kind": host,
            "note": "median of a step's measured seconds minus its GPU span (CUDA events around the step) per kind "
                    "of step: the host's part the step's timer holds (the replay or launches, the sync)"}


def eager_issue_setup(args: Any) -> dict | str:
    """args.eager_issue -> args.eager_issue_s (the host's seconds per layer to issue an eager step, or 0.0: none),
    args.eager_issue_host (whether a policy's own host calibration comes first: policy_issue_s) and the note for
    summary.json. "host" (the default): each policy's calibration where its run measured one (calibrate_issue),
    else EAGER_ISSUE_RUNS'; run folders with issue_s in their step records: those runs' for every policy; "none"."""
    choice = str(getattr(args, "eager_issue", None) or "none")
    args.eager_issue_host = choice == "host"
    if choice == "none":
        args.eager_issue_s = 0.0
        return "none: eager steps cost their kernels and dense ops"
    runs, shown = _live_runs(",".join(str(r) for r in EAGER_ISSUE_RUNS) if choice == "host" else choice,
                             "--eager-issue", "host' or 'none")
    issue = measured_eager_issue(runs)
    args.eager_issue_s = issue["per_layer_s"]
    return {"runs": shown, **issue, "host_calibration_first": args.eager_issue_host,
            "note": "an eager step (over the graphs' largest size) costs no less than the host's time to issue it: "
                    "per_layer_s x layers, the median over the host-bound eager steps of those runs, or (with "
                    "host_calibration_first) the policy's own host calibration where its run measured one "
                    "(eager_issue per policy; host_bound_s: the seconds charged above the kernels and dense ops "
                    "for it)"}


def steps_path(out: Path, spec: str) -> Path:
    return out / f"{spec.replace(':', '_').replace('/', '_')}_steps.json"


def read_steps(out: Path, spec: str) -> list[dict] | None:
    """A policy's step records: <policy>_steps.json as the run wrote it, or gzipped as committed; None if neither."""
    import gzip

    path = steps_path(out, spec)
    if path.exists():
        return json.loads(path.read_text())
    packed = path.with_suffix(".json.gz")
    return json.loads(gzip.decompress(packed.read_bytes())) if packed.exists() else None


def step_decode_config(chooser: Any, model: ModelSpec, step: dict) -> str:
    """The decode config `chooser` serves at a recorded step with decode rows, asked as the live stack asks
    (LiveSimulator._decode_choice: the batch and the mean context on the memo grid, the stack's pages)."""
    from kernel_gym.kernels.workloads import DecodeWorkload

    wl = DecodeWorkload(model.num_heads, model.num_kv_heads, model.head_dim, round_count(step["decode_batch"]),
                        round_log4(step["mean_context"]), "bfloat16")
    return str(chooser.choose("decode_attention", wl, PAGE))


class _RecordedSchedule(Simulator):
    """The live run's own scheduling again, each step lasting its recorded seconds (LiveSimulator's settings), to
    recover what a step record leaves out: every decode sequence's context (the records keep the mean and longest)."""

    def __init__(self, model: ModelSpec, trace: Trace, steps: list[dict], dtype: str, **kw: Any) -> None:
        super().__init__(model, trace, _Unit(), DefaultChooser(), None, kv_layout=PAGE, prefix_caching=False,
                         chunk_attention="prefix", compile_s=lambda k, c: 0.0, step_overhead_s=0.0, dtype=dtype,
                         decode_waves=False, **kw)
        self.steps, self.contexts, self.matched = steps, [], True

    def price_step(self, *args: Any, **kw: Any) -> tuple[float, float]:
        return 0.0, 0.0  # the step lasts its recorded seconds (_step_seconds): nothing to price

    def _step_seconds(self, predicted_s: float, chunks: list[tuple[int, int, int]], dec: np.ndarray) -> float:
        r = self.steps[len(self.contexts)]
        ctx = [int(self.kv[i]) + 1 for i in dec]
        self.matched &= (len(ctx) == r["decode_batch"] and [list(c) for c in chunks] == r["chunks"]
                         and max(ctx, default=0) == r.get("max_context", max(ctx, default=0))
                         and abs((float(np.mean(ctx)) if ctx else 0.0) - r["mean_context"]) < 1e-6)
        self.contexts.append(ctx)
        return float(r["seconds"])


def step_contexts(steps: list[dict], model: ModelSpec, trace: Trace, args: Any, dtype: str) -> list[list[int]] | None:
    """Every recorded step's decode contexts, from _RecordedSchedule; None where its schedule does not match the
    records (a run whose scheduler differed: its decode is then priced from the mean and longest context alone)."""
    sim = _RecordedSchedule(model, trace, steps, dtype, **sim_kwargs(args, model))
    while len(sim.contexts) < len(steps) and sim.matched and sim.step():
        pass
    if sim.matched and len(sim.contexts) == len(steps):
        return sim.contexts
    log(f"the step records do not follow the simulator's schedule (step {len(sim.contexts)} of {len(steps)}): their "
        "decode is priced from the mean and longest context alone")
    return None


def priced_steps(out: Path, spec: str, model: ModelSpec, trace: Trace, timer: Any, backend: Any, args: Any,
                 meta: dict, guards: list | None = None, recovered: dict | None = None,
                 issue_s: float | None = None) -> list[tuple[str, bool, float, float, int, dict, Any]]:
    """A policy's measured steps, each as (its kind: Simulator.step_kind, whether it has prefill chunks, measured
    seconds, the simulator's kernel and dense seconds for the same step: its chunks, decode batch and context,
    tokens; the step's decode batch; those seconds by kernel family and "dense"; the step's kernel profile or None:
    --profile-every); [] without step records. issue_s: the eager issue time per layer (policy_issue_s). The
    pricing chooser goes to `guards` (its untimed choices are planned too); `recovered[spec]`: whether every step's
    decode contexts were recovered for the wave model (step_contexts; None with --decode-waves off)."""
    from kernel_gym.evaluate.replay import GuardedChooser

    steps = read_steps(out, spec)
    if steps is None:
        return []
    guard = GuardedChooser(make_chooser(spec, model), backend, model.num_layers)
    sim = PredictSimulator(model, trace, timer, guard, None, kv_layout=PAGE, dtype=meta.get("dtype", "bfloat16"),
                           **sim_kwargs(args, model), **graph_kwargs(meta), **waves_kwargs(args))
    attach_tables(sim, args)
    if issue_s is not None:
        sim.eager_issue_per_layer_s = issue_s
    guard.sim = sim
    if guards is not None:
        guards.append(guard)
    contexts = step_contexts(steps, model, trace, args, meta.get("dtype", "bfloat16")) if sim.decode_waves else None
    if recovered is not None:
        recovered[spec] = None if not sim.decode_waves else contexts is not None
    priced = []
    for i, r in enumerate(steps):
        chunks = [tuple(c) for c in r["chunks"]]
        completing = sum(1 for rid, c, o in chunks if o + c >= sim.target[rid])
        before = dict(guard.kernel_s)  # the guard books each family's seconds (all layers) as it is asked
        routed, graphed, replaced = sim.moe_routing_charged_s, sim.moe_graph_charged_s, sim.moe_graph_replaced_s
        eager_charged, eager_replaced = sim.moe_eager_charged_s, sim.moe_eager_replaced_s
        chunk_charged, chunk_replaced = sim.moe_chunk_charged_s, sim.moe_chunk_replaced_s
        skewed = sim.chunk_skew_s
        longest, waited, waves = sim.decode_longest_s, sim.host_bound_s, sim.decode_waves_s
        # records before tree 5ebaec4 carry no max_context: their decode is priced at the mean context alone
        kernel_s, dense = sim.price_step(chunks, r["decode_batch"], r["mean_context"], r["decode_batch"] + completing,
                                         [], r.get("max_context"), contexts[i] if contexts else None)
        parts = {k: v - before.get(k, 0.0) for k, v in guard.kernel_s.items() if v != before.get(k, 0.0)}
        if sim.moe_routing_charged_s != routed:
            parts["moe_routing"] = sim.moe_routing_charged_s - routed
        if sim.moe_graph_charged_s != graphed:  # the guard booked the dataset's row; the graph table's was charged
            parts["fused_moe"] += (sim.moe_graph_charged_s - graphed) - (sim.moe_graph_replaced_s - replaced)
        if sim.moe_eager_charged_s != eager_charged:  # likewise the eager table's
            parts["fused_moe"] += ((sim.moe_eager_charged_s - eager_charged)
                                   - (sim.moe_eager_replaced_s - eager_replaced))
        if sim.moe_chunk_charged_s != chunk_charged:  # and the chunk-routed tables'
            parts["fused_moe"] += ((sim.moe_chunk_charged_s - chunk_charged)
                                   - (sim.moe_chunk_replaced_s - chunk_replaced))
        parts["fused_moe"] = parts.get("fused_moe", 0.0) + (sim.chunk_skew_s - skewed)  # a chunk's routing
        if sim.decode_longest_s != longest:  # the guard booked the mean context's time; the longest sequence's too
            parts["decode_attention"] += sim.decode_longest_s - longest
        if sim.decode_waves_s != waves:  # ... and the wave model's price of the batch's contexts instead
            parts["decode_attention"] += sim.decode_waves_s - waves
        if sim.host_bound_s != waited:  # an eager step the host's issue time prices: that wait apart from the dense ops
            parts["host_bound"] = sim.host_bound_s - waited
        priced.append((sim.step_kind(bool(chunks), r["tokens"]), bool(chunks), r["seconds"], kernel_s + dense,
                       r["decode_batch"], {**parts, "dense": dense - parts.get("host_bound", 0.0)},
                       r.get("kernels")))
    return priced


BATCH_BANDS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 24), (25, 32), (33, 64), (65, 128), (129, 1 << 20))
"""step_check's decode batch bands: the live stack's graph capture sizes (1, 2, 4, 8, 16, 24, 32, ...; 0: a step of
prefill chunks alone), so each band's decode-only steps replay one graph size's MoE launch (a price that is off at one
capture size shows as one band)."""


def band_name(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}+" if hi == BATCH_BANDS[-1][1] else f"{lo}-{hi}"


def step_check(priced: list[tuple[str, bool, float, float, int, dict, Any]], overheads: dict[str, float]) -> dict:
    """Each measured step beside the simulator's price for it (priced_steps plus its kind's overhead), decode-only
    steps apart from steps with prefill chunks: where the prediction's error comes from, whatever the scheduling did
    with it afterwards. `residual_fit`: least squares of measured - price = fixed + per_sequence x decode batch, which
    tells a fixed cost per step (host work the table leaves out) from one that grows with the batch (a kernel price,
    or host work per sequence, that the data gets wrong). `price_shares`: each kernel family's and the dense ops'
    share of the price (overheads left out), so an error can be weighed against the part it can come from.
    `profile`: over the profiled steps (profile_check), each part's measured kernel time beside its price.
    `by_step_kind`: steps and sum_error per kind of step (graph, piecewise, eager). `by_decode_batch`: steps and
    sum_error per band of decode batch (BATCH_BANDS), where an error that the sums average away shows."""
    kinds: dict[str, list[tuple[float, float, int]]] = {"decode_only": [], "with_prefill": []}
    by_step_kind: dict[str, dict[str, list[float]]] = {"decode_only": {}, "with_prefill": {}}
    parts: dict[str, dict[str, float]] = {"decode_only": {}, "with_prefill": {}}
    for kind, has_chunks, measured, price, batch, step_parts, _ in priced:
        group = "with_prefill" if has_chunks else "decode_only"
        kinds[group].append((measured, price + overheads[kind], batch))
        sums = by_step_kind[group].setdefault(kind, [0, 0.0, 0.0])
        sums[0], sums[1], sums[2] = sums[0] + 1, sums[1] + measured, sums[2] + price + overheads[kind]
        for name, seconds in step_parts.items():
            parts[group][name] = parts[group].get(name, 0.0) + seconds
    check = {}
    for kind, rows in kinds.items():
        if rows:
            m, p, b = np.array(rows).T
            check[kind] = {"steps": len(rows), "measured_s": float(m.sum()), "predicted_s": float(p.sum()),
                           "sum_error": float(p.sum() / m.sum() - 1.0), "median_measured_over_predicted":
                           float(np.median(m / p)),
                           "by_step_kind": {k: {"steps": n, "sum_error": pk / mk - 1.0}
                                            for k, (n, mk, pk) in sorted(by_step_kind[kind].items())},
                           "by_decode_batch": {band_name(lo, hi): {
                               "steps": int(band.sum()), "sum_error": float(p[band].sum() / m[band].sum() - 1.0)}
                               for lo, hi in BATCH_BANDS if (band := (b >= lo) & (b <= hi)).any()}}
            if len(set(b.tolist())) > 1:
                (fixed, per_seq), *_ = np.linalg.lstsq(np.vstack([np.ones_like(b), b]).T, m - p, rcond=None)
                check[kind]["residual_fit"] = {"fixed_s": float(fixed), "per_sequence_s": float(per_seq)}
            total = sum(parts[kind].values())
            if total > 0:
                check[kind]["price_shares"] = {k: v / total for k, v in sorted(parts[kind].items())}
            profiled = profile_check([r for r in priced if ("with_prefill" if r[1] else "decode_only") == kind])
            if profiled:
                check[kind]["profile"] = profiled
    return check


PROFILE_PARTS = ("fused_moe", "moe_routing", "decode_attention", "prefix_prefill", "dense")  # kernel_part's
PRICE_ALIASES = {"prefix_prefill": ("prefix_prefill", "prefill_attention")}  # the price parts a profiled part meets


def profile_check(priced: list[tuple], names_us: dict[str, float] | None = None) -> dict:
    """Over the steps with a kernel profile: per part (kernel_part) the kernels' measured seconds (the eager run's
    durations) beside the price's, and the steps' measured seconds beside the kernels' busy seconds (the rest: GPU
    idle within the step). Which part of the price is off, and by how much, on the steps themselves. The measured
    parts come from each step's `by_part_us`, or, given `names_us` (a policy's profiled kernel time by name over all
    its profiled steps: `profiled_kernels_us`), from those names."""
    rows = [r for r in priced if r[6] and "busy_us" in r[6] and (names_us is not None or "by_part_us" in r[6])]
    if not rows:
        return {}
    if names_us is not None:
        measured = {p: us * 1e-6 for p, us in parts_us(names_us).items()}
    else:
        measured = {}
        for r in rows:
            for part, us in r[6]["by_part_us"].items():
                measured[part] = measured.get(part, 0.0) + us * 1e-6
    price = {p: sum(r[5].get(n, 0.0) for r in rows for n in PRICE_ALIASES.get(p, (p,))) for p in PROFILE_PARTS}
    step_s = sum(r[2] for r in rows)
    busy_s = sum(measured.values())
    return {"steps": len(rows), "measured_step_s": step_s, "kernel_busy_s": busy_s,
            "idle_share": 1.0 - busy_s / step_s if step_s else None,
            "parts": {p: {"measured_s": measured.get(p, 0.0), "priced_s": price[p],
                          "priced_over_measured": price[p] / measured[p] if measured.get(p) else None}
                      for p in PROFILE_PARTS if measured.get(p) or price[p]}}


LIVE_CHECK = Path(__file__).resolve().parents[2] / "kernel_gym" / "data" / "live_check.json"


def live_check(runs: list[Path]) -> dict:
    """The plain simulator's error against the live runs with CUDA graphs (their summary.json): per metric the range
    of relative errors over every policy of every run that finished its window, with the runs named. `kernel-gym
    replay` prints it under its table, so each simulated tokens/s, TTFT and TPOT figure comes with how far the
    simulator was from a real run."""
    root = LIVE_CHECK.parents[2]
    rows = []
    for run in runs:
        s = json.loads((run / "summary.json").read_text())
        name = run.resolve().relative_to(root).as_posix() if run.resolve().is_relative_to(root) else str(run)
        if not s["meta"].get("cuda_graphs"):
            raise SystemExit(f"{run}: not a CUDA-graph run (meta.cuda_graphs is false); the check compares engines "
                             "that graph their steps")
        for spec, row in s["policies"].items():
            # a policy its budget cut before the window ended served other requests than its prediction: left out
            if "relative_error" in row and row.get("measured_run_complete") is not False:
                rows.append({"run": name, "model": s["meta"]["model"], "trace": s["meta"].get("trace"),
                             "policy": spec, "commit": s["meta"].get("commit"), **row["relative_error"],
                             "measured_compiles_timed": bool(row.get("measured_compiles_timed"))})
    if not rows:
        raise SystemExit(f"no predicted policies in {[str(r) for r in runs]}: run --predict on each first")
    return {"source": "benchmarks/live_e2e/run.py --live-check (H200 runs with CUDA graphs, plain simulator)",
            "runs": sorted({r["run"] for r in rows}), "models": sorted({r["model"] for r in rows}),
            "rows": sorted(rows, key=lambda r: (r["run"], r["policy"])),
            "range": {k: [min(r[k] for r in rows), max(r[k] for r in rows)] for k in METRICS},
            "within_target": within_target(rows),
            # the same without the policy runs whose measured steps held Triton compiles (trees before e41f161)
            "without_compiles_timed": within_target([r for r in rows if not r["measured_compiles_timed"]]),
            # per trace: the traces nothing was fitted on (heldout_trace/) apart from the bundled one everything was
            "by_trace": {t: within_target([r for r in rows if r["trace"] == t])
                         for t in sorted({r["trace"] for r in rows})}}


def within_target(rows: list[dict]) -> dict:
    """Per metric: how many of these policy runs' errors are within issue 29's target (TARGETS), of how many, and
    their range."""
    return {k: {"within": sum(abs(r[k]) <= TARGETS[k] for r in rows), "of": len(rows),
                "range": [min(r[k] for r in rows), max(r[k] for r in rows)] if rows else None} for k in METRICS}


LIVE_CHECK_PLOT = Path(__file__).resolve().parent / "live_check.png"
TARGETS = {"tokens_per_s": 0.05, "ttft_p50_s": 0.10, "tpot_p50_s": 0.05}  # issue 29's error targets


def plot_live_check(check: dict, path: Path) -> Path:
    """One panel per metric: each policy run's relative error (%) of the plain simulator, runs in the check's order,
    coloured by model, the target band shaded; how far the simulator is from every live run, at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = check["rows"]
    colours = dict(zip(check["models"], ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    markers = {"default": "s", "vllm-table": "o"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), sharex=True)
    for ax, (metric, target) in zip(axes, TARGETS.items()):
        ax.axhspan(-100 * target, 100 * target, color="0.9", zorder=0, label=f"target +-{100 * target:g}%")
        ax.axhline(0.0, color="0.5", lw=0.8)
        for i, r in enumerate(rows):  # hollow: the measured run timed Triton compiles in its steps
            c = colours[r["model"]]
            ax.scatter(i, 100 * r[metric], marker=markers.get(r["policy"], "^"), s=28, edgecolors=c,
                       facecolors="none" if r.get("measured_compiles_timed") else c)
        name = {"tokens_per_s": "tokens/s", "ttft_p50_s": "TTFT p50", "tpot_p50_s": "TPOT p50"}[metric]
        clean = within_target([r for r in rows if not r.get("measured_compiles_timed")])[metric]
        ax.set_title(f"{name}: {within_target(rows)[metric]['within']} of {len(rows)} within target\n"
                     f"({clean['within']} of {clean['of']} without compiles timed, filled)", fontsize=10)
        ax.set_xlabel("policy run (check order)")
        ax.set_ylabel("simulator error, % (+ = predicts more)")
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=m) for m, c in colours.items()]
    handles += [plt.Line2D([], [], color="k", marker=mk, ls="", label=p) for p, mk in
                (("default configs", "s"), ("vllm-table", "o"), ("learned table", "^"))]
    handles.append(plt.Line2D([], [], color="k", marker="o", mfc="none", ls="", label="compiles timed (hollow)"))
    axes[0].legend(handles=handles, fontsize=8, loc="lower left")
    fig.suptitle(f"Plain simulator vs {len(rows)} live policy runs on one H200 (CUDA graphs)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def step_fit(out: Path, measured: dict) -> dict:
    """Per policy, least squares over its measured steps: decode-only seconds = a + b x batch, and steps with a
    prefill chunk seconds = a + c x tokens (a: the step's fixed cost on this stack)."""
    fits = {}
    for spec in measured:
        steps = read_steps(out, spec)
        if steps is None:
            continue
        fit = {}
        for kind, rows, x in (("decode_only", [r for r in steps if not r["chunks"]], "decode_batch"),
                              ("with_prefill", [r for r in steps if r["chunks"]], "tokens")):
            if len(rows) < 3:
                continue
            xs = np.array([r[x] for r in rows], dtype=float)
            ys = np.array([r["seconds"] for r in rows], dtype=float)
            a, b = np.linalg.lstsq(np.vstack([np.ones_like(xs), xs]).T, ys, rcond=None)[0]
            fit[kind] = {"steps": len(rows), "fixed_s": float(a), f"per_{x}_s": float(b),
                         "median_s": float(np.median(ys))}
        fits[spec] = fit
    return fits


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what an analysis of a run's priced steps parses: retrained/clock_check.py)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="the run's folder (required except with --live-check)")
    p.add_argument("--model", default="mixtral-8x7b", help="a zoo model that fits one GPU with its KV pool")
    p.add_argument("--trace", default="bundled", help="trace name or path (default: the bundled Azure excerpt)")
    p.add_argument("--start-s", type=float, default=0.0)
    p.add_argument("--seconds", type=float, default=30.0, help="replay seconds of arrivals per policy")
    p.add_argument("--rate", type=float, default=1.0, help="arrival-rate factor: trace seconds per replay second")
    p.add_argument("--max-prompt", type=int, default=4096)
    p.add_argument("--max-output", type=int, default=256)
    p.add_argument("--kv-gb", type=float, default=20.0, help="KV pool size (GB), the same in the prediction")
    p.add_argument("--max-batched-tokens", type=int, default=4096, help="chunk budget per step")
    p.add_argument("--max-seqs", type=int, default=256)
    p.add_argument("--vocab", type=int, default=32000, help="LM head rows (Mixtral 32000, OLMoE 50304)")
    p.add_argument("--policies", default="default", help="comma list: default, table:PATH")
    p.add_argument("--warmup-steps", type=int, default=40)
    p.add_argument("--graphs", choices=("on", "off"), default="on",
                   help="on: decode-only steps replay CUDA graphs (the CPU dry run runs the same padded path "
                        "uncaptured); off: every step eager")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting policies after this many seconds")
    p.add_argument("--policy-budget-s", type=float, default=150.0, help="wall seconds per policy's replay")
    p.add_argument("--profile-every", type=int, default=0, metavar="N",
                   help="GPU: every N-th timed step, run it once more eagerly under torch's profiler and keep its "
                        "kernel time by part in the step record (the timed run is untouched); 0: off")
    p.add_argument("--predict", action="store_true", help="CPU: the simulator's prediction beside measured.json")
    p.add_argument("--predict-policies", default="", metavar="SPECS",
                   help="CPU: price these policies (comma list: vllm-table, default, table:PATH) on the run's window "
                        "as --predict does, with nothing measured beside them; writes --predict-json")
    p.add_argument("--predict-json", type=Path, default=None, metavar="FILE",
                   help="with --predict-policies: the output file")
    p.add_argument("--live-check", nargs="+", type=Path, metavar="RUN",
                   help="CPU: the error ranges of these predicted runs into kernel_gym/data/live_check.json")
    p.add_argument("--calibrate", default="", metavar="POLICY",
                   help="with --predict: also fit the step overheads per kind of step (graph, piecewise, eager) on "
                        "this policy's step records, held for the others")
    p.add_argument("--summary-dir", type=Path, default=None, metavar="DIR",
                   help="with --predict: write summary.json and untimed_plan.json there instead of the run's folder "
                        "(a prediction by newer tables beside the one committed with the run)")
    p.add_argument("--calibration-from", default="", metavar="SUMMARY",
                   help="with --predict: hold the step overheads fitted in another run's summary.json (scaled by "
                        "the depth)")
    p.add_argument("--dense-ops", default=str(DENSE_OPS_TABLE), metavar="TABLE.json",
                   help="--predict: price the dense ops from this dense_price_check.py table (default: the committed "
                        "one); none: by the roofline")
    p.add_argument("--moe-routing", default=str(MOE_ROUTING_TABLE), metavar="TABLE.json",
                   help="with --predict: charge the live fused MoE's in-launch routing per MoE call from this "
                        "measured table (moe_price_check.py's moe_routing.json; default: the committed one) x layers; "
                        "'none': no charge")
    p.add_argument("--moe-graph", default=",".join(str(t) for t in MOE_GRAPH_TABLES), metavar="TABLE.json[,...]",
                   help="--predict: price graphed steps' MoE (routing inside) from these moe_graph_table.py tables "
                        "(default: the committed ones); none: the dataset's row plus --moe-routing")
    p.add_argument("--moe-eager", default=str(MOE_EAGER_TABLE), metavar="TABLE.json[,...]",
                   help="--predict: price eager steps' MoE (routing inside) from these moe_graph_table.py --eager "
                        "tables (default: the one timed in session 49); none: the dataset's row plus --moe-routing")
    p.add_argument("--decode-waves", choices=("on", "off"), default="on",
                   help="--predict: price each decode batch from its sequences' contexts as its programs fill the GPU "
                        "(on, default; kernel_gym.traffic.decode_waves); off: at its mean context, no less than its "
                        "longest sequence alone")
    p.add_argument("--decode-graph", default=",".join(str(t) for t in DECODE_GRAPH_TABLES), metavar="TABLE.json[,...]",
                   help="--predict: fit the decode wave model, per config these decode_graph_table.py tables time, on "
                        "the launches timed as the stack's CUDA graphs replay them (default: the three committed "
                        "parts); none: on the dataset's rows")
    p.add_argument("--decode-graph-times", choices=("unflushed", "flushed"), default="unflushed",
                   help="--predict: fit on the --decode-graph tables' times without a flush (default) or after an L2 "
                        "flush before each replay (tables timed with decode_graph_table.py --also-flushed: a live "
                        "step reads each layer's KV after the MoE streamed its weights through L2)")
    p.add_argument("--decode-ragged", default=",".join(str(t) for t in DECODE_RAGGED_TABLES),
                   metavar="TABLE.json[,...]",
                   help="--predict: ragged_decode.py tables (one per model, comma-separated): a graphed "
                        "decode-only step of the configs the run's model's table times costs no less than its "
                        "longest sequence alone x the ragged launch's factor at its capture size (default: the "
                        "H200's, Mixtral's and OLMoE's); none: the wave model alone")
    p.add_argument("--chunk-routing", default="none", metavar="TABLE.json",
                   help="--predict: price the MoE of steps with prefill chunks at the live stack's routing of a chunk "
                        "(a chunk_routing.py table: each layer's matching skew), from the dataset's rows at those "
                        "skews; none (default): at even routing")
    p.add_argument("--moe-chunk", default=",".join(str(t) for t in MOE_CHUNK_TABLES), metavar="TABLE.json[,...]",
                   help="--predict: price the MoE of steps with prefill chunks from these moe_graph_table.py --chunk "
                        "tables (graph and --eager ones; their tokens routed as the live stack routes a chunk; "
                        "default: the two timed in session 52); none: as the other steps")
    p.add_argument("--dense-eager", default=str(DENSE_EAGER_TABLE), metavar="TABLE.json",
                   help="--predict: price eager steps' dense ops from this dense_price_check.py --eager table "
                        "(default: the one timed in session 49); none: --dense-ops")
    p.add_argument("--step-host", default=",".join(str(r) for r in STEP_HOST_RUNS), metavar="RUN[,RUN]",
                   help="--predict: the step overhead per kind of step, measured on these live runs' records (seconds "
                        "minus the GPU span; default: the committed graph_5ebaec4 runs); assumed: the simulator's "
                        f"{STEP_OVERHEAD_S * 1e3:g} ms")
    p.add_argument("--eager-issue", default="host", metavar="host|RUN[,RUN]|none",
                   help="--predict: an eager step costs no less than the host's issue time per layer: host (default) "
                        "the one each policy's run measured before its replay (calibrate_issue), for runs without it "
                        "the committed window5_f269e69/olmoe_w5's; RUN[,RUN]: measured on these live runs' "
                        "host-bound eager steps; none: off")
    p.add_argument("--smoke", action="store_true", help="CPU dry run: a 2-layer tiny model, 6 requests, fp32")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.out is None and not args.live_check:
        p.error("--out is required: the folder the run writes (or --predict reads)")
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.max_batched_tokens, args.kv_gb, args.warmup_steps = 48, 0.002, 0
        args.max_prompt, args.max_output = 60, 3
    if args.live_check:
        check = live_check(args.live_check)
        LIVE_CHECK.write_text(json.dumps(check, indent=1) + "\n")
        log(f"wrote {LIVE_CHECK} and {plot_live_check(check, LIVE_CHECK_PLOT)}")
        return 0
    if args.predict_policies:
        if args.predict_json is None:
            p.error("--predict-policies needs --predict-json FILE (the run's summary.json is left as it is)")
        if args.predict or args.calibrate or args.calibration_from:
            p.error("--predict-policies prices policies with nothing measured beside them, without a calibration: "
                    "run --predict (with --calibrate / --calibration-from) as its own command")
        return run_predict_policies(args)
    if args.predict:
        return run_predict(args)
    return run_live(args)


if __name__ == "__main__":
    sys.exit(main())
