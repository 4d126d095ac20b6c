"""Workloads: the shape (and routing) of one kernel call, shared by kernels, measurement, traffic and environments.

A workload is a frozen dataclass with a canonical `key()` (what the measurement store keys on) and `features()`
(the numbers the recorded backend interpolates over and the agent observes). Grids per model spec list the shapes
that serving traffic produces; `grid="small"` gives CPU-interpreter test shapes.

Imports only the standard library: this module runs on the GPU machine too.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

DTYPES = ("bfloat16", "float16", "float32")


def _key(obj: Any) -> str:
    return json.dumps(asdict(obj), separators=(",", ":"), sort_keys=True)


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {DTYPES}")


MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256  # the attention kernels' head dims: tl.dot's smallest K; above 256 no tile fits


def padded_head_dim(d: int) -> int | None:
    """The head_dim the attention kernels run a head of `d` at: d itself when it is a power of two in [16, 256], else
    the next one (q, k and v zero-padded to it: attention.rule_head_dim's fix), None above 256 (no tile fits)."""
    if d > MAX_HEAD_DIM:
        return None
    return max(MIN_HEAD_DIM, 1 << (max(d, 1) - 1).bit_length())


def _check_heads(num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    """The attention workloads' head shape: positive counts, q heads in whole GQA groups of kv heads."""
    if min(num_heads, num_kv_heads, head_dim) < 1:
        raise ValueError(f"num_heads, num_kv_heads and head_dim must be >= 1, got {num_heads}, {num_kv_heads}, "
                         f"{head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")


@dataclass(frozen=True)
class PrefillWorkload:
    """Causal grouped-query attention over variable-length sequences packed in one batch (cu_seqlens)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    seq_lens: tuple[int, ...]
    dtype: str = "bfloat16"
    kernel: str = field(default="prefill_attention", init=False)

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)
        if not self.seq_lens or min(self.seq_lens) < 1:
            raise ValueError(f"seq_lens must be non-empty positive lengths, got {self.seq_lens}")
        _check_heads(self.num_heads, self.num_kv_heads, self.head_dim)
        object.__setattr__(self, "seq_lens", tuple(int(n) for n in self.seq_lens))

    def key(self) -> str:
        return _key(self)

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lens)

    def causal_pairs(self) -> int:
        """Number of (query, key) pairs attended under the causal mask, summed over sequences."""
        return sum(n * (n + 1) // 2 for n in self.seq_lens)

    def features(self) -> dict[str, float]:
        return {
            "log2_total_tokens": math.log2(self.total_tokens),
            "log2_max_len": math.log2(max(self.seq_lens)),
            "num_seqs": float(len(self.seq_lens)),
            "log2_causal_pairs": math.log2(self.causal_pairs()),
        }


@dataclass(frozen=True)
class DecodeWorkload:
    """One query token per sequence against a paged KV cache; contexts differ within the batch.

    `context_len` is the mean context; `context_lens()` spreads the batch deterministically over
    [0.5, 1.5] x context_len (a single sequence gets exactly context_len), so contexts end mid-page.
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    batch: int
    context_len: int
    dtype: str = "bfloat16"
    kernel: str = field(default="decode_attention", init=False)

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)
        if self.batch < 1 or self.context_len < 1:
            raise ValueError(f"batch and context_len must be >= 1, got {self.batch}, {self.context_len}")
        _check_heads(self.num_heads, self.num_kv_heads, self.head_dim)

    def key(self) -> str:
        return _key(self)

    def context_lens(self) -> list[int]:
        if self.batch == 1:
            return [self.context_len]
        return [
            max(1, round(self.context_len * (0.5 + i / (self.batch - 1)))) for i in range(self.batch)
        ]

    def kv_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes of K and V that one call must read."""
        return 2 * sum(self.context_lens()) * self.num_kv_heads * self.head_dim * dtype_bytes

    def features(self) -> dict[str, float]:
        return {
            "log2_batch": math.log2(self.batch),
            "log2_context": math.log2(self.context_len),
            "gqa_group": float(self.num_heads // self.num_kv_heads),
        }


@dataclass(frozen=True)
class MoEWorkload:
    """A fused MoE layer call: num_tokens tokens routed top-k over num_experts experts.

    `skew` is the Zipf exponent of expert popularity (0 = uniform): expert e is chosen with probability
    proportional to (e + 1) ** -skew. Inputs draw router logits as log-popularity plus Gumbel noise, so top-k picks
    follow that distribution (Gumbel-top-k) and are reproducible per seed.
    """

    num_tokens: int
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    skew: float = 0.0
    dtype: str = "bfloat16"
    kernel: str = field(default="fused_moe", init=False)

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)
        if self.num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {self.num_tokens}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k {self.top_k} must be in [1, num_experts={self.num_experts}]")
        if self.skew < 0:
            raise ValueError(f"skew (Zipf exponent) must be >= 0, got {self.skew}")
        object.__setattr__(self, "skew", round(float(self.skew), 3))

    def key(self) -> str:
        return _key(self)

    def expert_popularity(self) -> list[float]:
        w = [(e + 1) ** -self.skew for e in range(self.num_experts)]
        s = sum(w)
        return [x / s for x in w]

    def features(self) -> dict[str, float]:
        return {
            "log2_tokens": math.log2(self.num_tokens),
            "skew": self.skew,
            "log2_slots_per_expert": math.log2(self.num_tokens * self.top_k / self.num_experts),
        }


@dataclass(frozen=True)
class PrefixPrefillWorkload:
    """Chunked prefill over a paged KV prefix: request i prefills `chunk_lens[i]` new tokens after `prefix_lens[i]`
    tokens already in the KV cache (earlier chunks or a cached shared prefix; 0 = a fresh request). A chunk's queries
    attend causally within the chunk and fully to its prefix."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    chunk_lens: tuple[int, ...]
    prefix_lens: tuple[int, ...]
    dtype: str = "bfloat16"
    kernel: str = field(default="prefix_prefill", init=False)

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)
        object.__setattr__(self, "chunk_lens", tuple(int(n) for n in self.chunk_lens))
        object.__setattr__(self, "prefix_lens", tuple(int(n) for n in self.prefix_lens))
        if not self.chunk_lens or min(self.chunk_lens) < 1:
            raise ValueError(f"chunk_lens must be non-empty positive lengths, got {self.chunk_lens}")
        if len(self.prefix_lens) != len(self.chunk_lens) or min(self.prefix_lens) < 0:
            raise ValueError(f"prefix_lens {self.prefix_lens} must give one length >= 0 per chunk "
                             f"({len(self.chunk_lens)} chunks); use 0 for a request without a prefix")
        _check_heads(self.num_heads, self.num_kv_heads, self.head_dim)

    def key(self) -> str:
        return _key(self)

    @property
    def total_tokens(self) -> int:
        """Query tokens of the call (the chunks)."""
        return sum(self.chunk_lens)

    def context_lens(self) -> tuple[int, ...]:
        """KV length of each request after its chunk is written: prefix + chunk."""
        return tuple(p + c for p, c in zip(self.prefix_lens, self.chunk_lens))

    def causal_pairs(self) -> int:
        """(query, key) pairs attended: every chunk token sees the whole prefix and the chunk causally."""
        return sum(c * p + c * (c + 1) // 2 for c, p in zip(self.chunk_lens, self.prefix_lens))

    # Same shape as PrefillWorkload.features (duplicate scan): the same features of the chunks, named for this
    # workload's fields (log2_max_chunk), plus the prefix; each dict is its observation's own, name by name.
    def features(self) -> dict[str, float]:
        return {
            "log2_total_tokens": math.log2(self.total_tokens),
            "log2_max_chunk": math.log2(max(self.chunk_lens)),
            "num_seqs": float(len(self.chunk_lens)),
            "log2_causal_pairs": math.log2(self.causal_pairs()),
            "log2_mean_prefix": math.log2(1.0 + sum(self.prefix_lens) / len(self.prefix_lens)),
        }


Workload = PrefillWorkload | DecodeWorkload | MoEWorkload | PrefixPrefillWorkload
WORKLOAD_CLASSES = (PrefillWorkload, DecodeWorkload, MoEWorkload, PrefixPrefillWorkload)


def workload_type(kernel: str) -> type:
    """A kernel's workload dataclass: its profile's (kernels/profiles.py). Without kernel_gym (this file bundled
    beside a logged model as kernel_gym_workloads.py): the dataclass here whose `kernel` field names it."""
    try:
        from kernel_gym.kernels.profiles import profile
    except ImportError:
        for cls in WORKLOAD_CLASSES:
            if cls.kernel == kernel:
                return cls
        raise ValueError(f"unknown kernel {kernel!r}") from None
    return profile(kernel).workload_type()


def parse_key(cls: type, key: str) -> Workload:
    """Inverse of `workload.key()` for a workload dataclass (JSON lists become tuples): the one parser of workload
    keys (stores, the recorded backend, workers, policies)."""
    data = json.loads(key)
    data.pop("kernel", None)
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def workload_from_key(kernel: str, key: str) -> Workload:
    """Inverse of `workload.key()` for a kernel's workloads."""
    return parse_key(workload_type(kernel), key)


# ---- shape grids per model spec -------------------------------------------------------------------------------

MOE_TOKENS = (
    1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
)
MOE_SKEWS = (0.0, 0.6, 1.2)  # uniform, moderate, strong (max-expert share 0.37 at E=8)
DECODE_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)
DECODE_CONTEXTS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
DECODE_MAX_TOKENS = 64 * 32768  # batch x context cap: KV of one layer must fit comfortably and fill quickly
PREFILL_TOTALS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREFILL_MIXES = ("single", "equal4", "ragged")  # one long sequence; 4 equal; a geometric mix of lengths
PREFIX_CHUNKS = (128, 512, 1024, 2048, 4096)  # chunk tokens per call (a step's prefill budget)
PREFIX_LENS = (0, 512, 2048, 8192, 32768)  # KV already cached before the chunk
PREFIX_MIXES = ("single", "mixed4")  # one request; 4 requests of chunk/4 with prefixes (p, p/2, p/4, 0)


def prefix_batch(chunk: int, prefix: int, mix: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(chunk_lens, prefix_lens) of a named mix: "single" is one request; "mixed4" mixes requests with and without a
    prefix (a continuing long prompt, two shorter ones and a fresh request)."""
    if mix == "single":
        return (chunk,), (prefix,)
    if mix == "mixed4":
        base = max(1, chunk // 4)
        return (base,) * 3 + (max(1, chunk - 3 * base),), (prefix, prefix // 2, prefix // 4, 0)
    raise ValueError(f"unknown prefix mix {mix!r}; use one of {PREFIX_MIXES}")


def prefill_seq_lens(total: int, mix: str) -> tuple[int, ...]:
    """Sequence lengths summing to `total` for a named mix."""
    if mix == "single":
        return (total,)
    if mix == "equal4":
        base = total // 4
        return (base,) * 3 + (total - 3 * base,)
    if mix == "ragged":
        lens, rest, part = [], total, total // 2
        while rest > 0 and part >= 16:
            take = min(part + 7, rest)  # +7: lengths that are not multiples of the blocks
            lens.append(take)
            rest -= take
            part //= 2
        if rest > 0:
            lens.append(rest)
        return tuple(lens)
    raise ValueError(f"unknown prefill mix {mix!r}; use one of {PREFILL_MIXES}")


def model_workloads(kernel: str, model: Any, grid: str = "default", dtype: str = "bfloat16") -> list[Workload]:
    """The shape grid of one kernel for a model spec (kernel_gym.models.ModelSpec).

    grid="default": the shapes serving traffic produces (the collection grid); grid="eval": the evaluation subset
    measured exhaustively over the config space; grid="small": tiny CPU-interpreter shapes.
    """
    m = model
    if kernel in ("fused_moe", "vllm_fused_moe"):  # one workload type: the same shapes and routing
        tokens = {"default": MOE_TOKENS, "eval": (1, 16, 64, 256, 1024, 4096), "small": (1, 5, 33)}[grid]
        skews = MOE_SKEWS if grid != "small" else (0.0, 1.2)
        if grid == "small":
            return [MoEWorkload(t, 4, 2, 64, 96, s, dtype) for t in tokens for s in skews]
        return [
            MoEWorkload(t, m.num_experts, m.top_k, m.hidden, m.intermediate, s, dtype) for t in tokens for s in skews
        ]
    if kernel == "decode_attention":
        if grid == "small":
            return [DecodeWorkload(4, 2, 64, b, c, dtype) for b, c in ((1, 40), (3, 100), (5, 333))]
        batches = DECODE_BATCHES if grid == "default" else (1, 16, 64, 256)
        contexts = DECODE_CONTEXTS if grid == "default" else (512, 2048, 8192)
        return [
            DecodeWorkload(m.num_heads, m.num_kv_heads, m.head_dim, b, c, dtype)
            for b in batches for c in contexts if b * c <= DECODE_MAX_TOKENS
        ]
    if kernel == "prefill_attention":
        if grid == "small":
            return [PrefillWorkload(4, 2, 64, lens, dtype) for lens in ((1,), (70,), (33, 100, 5))]
        totals = PREFILL_TOTALS if grid == "default" else (512, 2048, 8192)
        return [
            PrefillWorkload(m.num_heads, m.num_kv_heads, m.head_dim, prefill_seq_lens(t, mix), dtype)
            for t in totals for mix in PREFILL_MIXES
        ]
    if kernel == "prefix_prefill":
        if grid == "small":
            return [PrefixPrefillWorkload(4, 2, 64, c, p, dtype)
                    for c, p in (((33,), (0,)), ((20, 5), (70, 0)), ((64, 17, 3), (16, 100, 1)))]
        chunks = PREFIX_CHUNKS if grid == "default" else (512, 2048)
        prefixes = PREFIX_LENS if grid == "default" else (0, 2048, 32768)
        return [
            PrefixPrefillWorkload(m.num_heads, m.num_kv_heads, m.head_dim, *prefix_batch(c, p, mix), dtype)
            for c in chunks for p in prefixes for mix in PREFIX_MIXES
        ]
    try:
        from kernel_gym.kernels.profiles import profile, resolve
    except ImportError:
        raise ValueError(f"unknown kernel {kernel!r}") from None
    p = profile(kernel)
    if not p.grid:
        raise ValueError(f"{kernel}: its profile names no shape grid (KernelProfile.grid)")
    return list(resolve(p.grid)(model, grid, dtype))
