"""How one MoE model is split over G GPUs: Layout(tp, ep), its validity, the shapes each GPU runs, and the EP load
imbalance of a step's routing.

The layouts are the ones serving engines launch with (vLLM `--tensor-parallel-size` / `--data-parallel-size` with
`--enable-expert-parallel`; SGLang `--tp`, `--ep`, `--enable-dp-attention`), written as MoE degrees with tp x ep = G:

- **TP** (tp = G, ep = 1): attention heads and every expert's intermediate size split G ways; all G GPUs hold all the
  step's tokens; an all-reduce of the hidden states after attention and after the MoE, every layer.
- **EP** (tp = 1, ep = G): each GPU holds E / G whole experts and runs attention data-parallel (its own 1/G of the
  requests, full heads, no attention collective); each layer dispatches every token's top-k copies to the GPUs of its
  experts (all-to-all), runs the local experts, and combines them back (all-to-all). The busiest GPU sets the pace.
- **mixed** (tp, ep both > 1): ep data-parallel groups of tp GPUs; attention TP within a group; experts split over
  the ep groups and sliced tp ways inside; all-to-all among the ep ranks, all-reduce among the tp ranks.

Experts sit contiguously (GPU r of the EP dimension owns experts [r E/ep, (r+1) E/ep)), the engines' default
placement: hot experts that share a GPU make it the straggler, which is what `ep_imbalance` measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload, PrefillWorkload
from kernel_gym.traffic.routing import effective_skew
from kernel_gym.traffic.simulator import (
    GPU_MEMORY_UTILIZATION,
    H200_MEMORY_BYTES,
    SKEW_GRID,
    round_count,
)
from kernel_gym.zoo import shard, tp_problem

MAX_GPUS = 8  # GPUs of one H200 host: what plan lays out and its layouts span


# A frozen record that checks itself in __post_init__ and derives sizes in properties, as prefill_gluon's
# GluonVariant does (duplicate scan: the same shape); nothing else in common.
@dataclass(frozen=True, order=True)
class Layout:
    """MoE tensor-parallel degree x expert-parallel degree; attention is TP within each of the ep data-parallel
    groups (module docstring)."""

    tp: int
    ep: int

    def __post_init__(self) -> None:
        if not (isinstance(self.tp, int) and isinstance(self.ep, int)) or self.tp < 1 or self.ep < 1:
            raise ValueError(f"Layout needs integer tp, ep >= 1, got tp={self.tp!r}, ep={self.ep!r}")

    @property
    def gpus(self) -> int:
        return self.tp * self.ep

    @property
    def name(self) -> str:
        if self.ep == 1:
            return f"TP{self.tp}"
        if self.tp == 1:
            return f"EP{self.ep}"
        return f"TP{self.tp}xEP{self.ep}"

    def __str__(self) -> str:
        return self.name


def layouts_for(gpus: int) -> list[Layout]:
    """Every (tp, ep) with tp x ep = gpus, pure TP first, pure EP last (the action space of a GPU count)."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    return [Layout(gpus // ep, ep) for ep in range(1, gpus + 1) if gpus % ep == 0]


def gpu_weight_bytes(spec: Any, layout: Layout) -> float:
    """Parameter bytes one GPU holds (ModelSpec.weight_parts, each part split over the GPUs that share it): the
    attention projections, shared experts (a dense MLP every token passes: whole on every EP rank) and dense MLP /
    tp, the router whole, the routed experts / (tp x ep)."""
    split = {"attention": layout.tp, "router": 1, "experts": layout.tp * layout.ep, "shared": layout.tp,
             "dense": layout.tp}
    return sum(layers * n / split[part] for part, (layers, n) in spec.weight_parts().items()) * spec.dtype_bytes


def why_invalid(spec: Any, layout: Layout, gpus: int, gpu_memory_bytes: float = H200_MEMORY_BYTES,
                gpu_memory_utilization: float = 1.0) -> str:
    """'' when the layout can serve the model on `gpus` GPUs, else the reason. The memory check defaults to the
    weights against the whole GPU: the share an engine gives weights and KV differs by release (vLLM 0.33: 0.92,
    0.34: all of it less a margin, SGLang 0.9; parallel.deploy.memory_utilization), so a deployment's own share is
    applied where its KV cache is sized (deploy.kv_tokens_per_rank); a caller that sizes a pool passes its share."""
    if layout.gpus != gpus:
        return f"{layout}: tp x ep = {layout.gpus}, not the {gpus} GPUs given"
    why = tp_problem(spec, layout.tp)
    if why:
        return f"{layout}: {why}"
    if spec.num_experts % layout.ep:
        return f"{layout}: {spec.num_experts} experts do not split evenly over ep={layout.ep}"
    if gpu_weight_bytes(spec, layout) >= gpu_memory_bytes * gpu_memory_utilization:
        room = (f"the GPU's {gpu_memory_bytes / 1e9:.1f} GB" if gpu_memory_utilization == 1 else
                f"{gpu_memory_utilization} x {gpu_memory_bytes / 1e9:.0f} GB")
        return f"{layout}: {gpu_weight_bytes(spec, layout) / 1e9:.0f} GB of weights per GPU leave no KV cache in {room}"
    return ""


def valid_layouts(spec: Any, gpus: int, **memory: float) -> list[Layout]:
    return [lay for lay in layouts_for(gpus) if not why_invalid(spec, lay, gpus, **memory)]


def attention_spec(spec: Any, layout: Layout) -> Any:
    """The attention shape one GPU runs: heads / tp (KV heads down to one per GPU)."""
    return shard(spec, layout.tp)


def pool_memory_bytes(spec: Any, layout: Layout, gpu_memory_bytes: float = H200_MEMORY_BYTES,
                      gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> float:
    """The `gpu_memory_bytes` to give a one-GPU Simulator of `attention_spec` so that its KV pool equals the
    layout's: ep data-parallel groups, each GPU holding its group's KV at heads / tp beside its own weights."""
    per_gpu = gpu_memory_bytes * gpu_memory_utilization - gpu_weight_bytes(spec, layout)
    if per_gpu <= 0:
        raise ValueError(why_invalid(spec, layout, layout.gpus, gpu_memory_bytes, gpu_memory_utilization))
    return (layout.ep * per_gpu + attention_spec(spec, layout).weight_bytes) / gpu_memory_utilization


# ---- the shapes one GPU runs in a step --------------------------------------------------------------------------

def split_prefill(seq_lens: tuple[int, ...], ranks: int) -> tuple[int, ...]:
    """The busiest data-parallel rank's chunks when a step's prefill chunks go to `ranks` ranks longest first, each
    to the rank with the least causal (query, key) pairs so far (a scheduler that balances work)."""
    if ranks == 1:
        return tuple(seq_lens)
    load = [0.0] * ranks
    parts: list[list[int]] = [[] for _ in range(ranks)]
    for n in sorted(seq_lens, reverse=True):
        r = min(range(ranks), key=load.__getitem__)
        parts[r].append(n)
        load[r] += n * (n + 1) / 2
    return tuple(parts[max(range(ranks), key=load.__getitem__)])


def prefill_shard(spec: Any, layout: Layout, seq_lens: tuple[int, ...], dtype: str = "bfloat16") -> PrefillWorkload:
    a = attention_spec(spec, layout)
    return PrefillWorkload(a.num_heads, a.num_kv_heads, a.head_dim, split_prefill(seq_lens, layout.ep), dtype)


def decode_shard(spec: Any, layout: Layout, batch: int, context_len: int, dtype: str = "bfloat16") -> DecodeWorkload:
    """The busiest rank's decode batch: ceil(batch / ep) requests at the step's mean context, heads / tp."""
    a = attention_spec(spec, layout)
    return DecodeWorkload(a.num_heads, a.num_kv_heads, a.head_dim, round_count(-(-batch // layout.ep)), context_len,
                          dtype)


def rank_loads(slot_counts: np.ndarray, ep: int) -> np.ndarray:
    """Token-slots each EP rank receives: the sum over its contiguous block of experts."""
    c = np.asarray(slot_counts, dtype=np.int64)
    if c.ndim != 1 or len(c) % ep:
        raise ValueError(f"{len(c)} expert loads do not split over ep={ep}")
    return c.reshape(ep, -1).sum(axis=1)


def ep_imbalance(slot_counts: np.ndarray, ep: int) -> float:
    """max over EP ranks of routed token-slots / their mean (1.0 = even; ep = everything on one rank)."""
    r = rank_loads(slot_counts, ep)
    mean = r.mean()
    return float(r.max() / mean) if mean > 0 else 1.0


def round_skew(skew: float) -> float:
    return round(round(skew / SKEW_GRID) * SKEW_GRID, 3)


@dataclass(frozen=True)
class MoEShard:
    """What the busiest GPU runs in one MoE layer of a step: its kernel workload (None: no token reached it), the
    token-slots it received, the EP imbalance, and the per-rank buffer of each collective."""

    workload: MoEWorkload | None
    busiest_slots: int
    imbalance: float
    all_reduce_bytes: int  # per tp-rank buffer (0: no all-reduce)
    all_to_all_bytes: int  # per ep-rank buffer (0: no all-to-all)


def moe_shard(spec: Any, layout: Layout, num_tokens: int, skew: float, slot_counts: np.ndarray | None,
              dtype: str = "bfloat16", dtype_bytes: int = 2) -> MoEShard:
    """The MoE layer of a step of `num_tokens` tokens under `layout`. TP: every GPU runs all tokens over all experts at
    intermediate / tp (skew: the step's effective skew, as the one-GPU simulator uses). EP: the GPU whose experts
    received the most token-slots (`slot_counts`, per expert, from the step's sampled routing) runs those slots, one
    local expert each (top_k = 1 over E / ep experts: each received row goes to one expert), with the skew of its
    local loads; its token count sets the busiest all-to-all buffer."""
    per_rank = -(-num_tokens // layout.ep)  # tokens of one data-parallel rank
    inter = spec.intermediate // layout.tp
    ar = per_rank * spec.hidden * dtype_bytes if layout.tp > 1 else 0
    if layout.ep == 1:
        wl = MoEWorkload(round_count(num_tokens), spec.num_experts, spec.top_k, spec.hidden, inter, skew, dtype)
        return MoEShard(wl, num_tokens * spec.top_k, 1.0, ar, 0)
    if slot_counts is None:
        raise ValueError("an EP layout needs the step's per-expert token-slot counts (routing.loads)")
    ranks = rank_loads(slot_counts, layout.ep)
    busiest = int(np.argmax(ranks))
    n = int(ranks[busiest])
    imbalance = float(ranks.max() / ranks.mean()) if ranks.mean() > 0 else 1.0
    a2a = max(per_rank * spec.top_k, n) * spec.hidden * dtype_bytes
    local = np.asarray(slot_counts).reshape(layout.ep, -1)[busiest]
    if n == 0:
        return MoEShard(None, 0, imbalance, ar, a2a)
    local_skew = round_skew(effective_skew(local, 1)) if len(local) > 1 else 0.0
    wl = MoEWorkload(round_count(n), len(local), 1, spec.hidden, inter, local_skew, dtype)
    return MoEShard(wl, n, imbalance, ar, a2a)


def ep_plan_workloads(spec: Any, layout: Layout, max_tokens: int = 8192, skews: tuple[float, ...] = (0.0, 1.2),
                      dtype: str = "bfloat16") -> list[MoEWorkload]:
    """The EP / TP expert shards to measure on one GPU so that layout's MoE times rest on measurements: slots on a
    factor-4 grid (the recorded backend interpolates across factor-4 gaps) up to every token's top-k landing on one
    GPU, at uniform and skewed local loads."""
    inter = spec.intermediate // layout.tp
    if layout.ep == 1:
        top = max_tokens
        experts, k = spec.num_experts, spec.top_k
    else:
        top = max_tokens * spec.top_k
        experts, k = spec.num_experts // layout.ep, 1
    grid = sorted({min(4 ** i, top) for i in range(int(math.log(top, 4)) + 2)})
    sk = skews if experts > 1 else (0.0,)
    return [MoEWorkload(n, experts, k, spec.hidden, inter, s, dtype) for n in grid for s in sk]

