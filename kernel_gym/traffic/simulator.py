"""A serving simulator: continuous batching with chunked prefill over a paged KV cache, step by step, with kernel
times from a backend and config choices from a policy. The model it simulates is written up in docs/simulator.md.

Per engine step: running decode requests each add one token; the rest of the token budget goes to prefill chunks
(partially prefilled requests first, then the waiting queue in arrival order). KV pages come from a pool sized from GPU
memory minus weights; a decode that needs a page when none is free preempts the most recently admitted running request
(recompute: its pages are freed, and on resume it prefills prompt + generated tokens again without re-emitting them).
Each step becomes three tuned-kernel workloads per layer (prefill attention, decode attention, fused MoE) timed by a
`KernelTimer` under configs picked by a `ConfigChooser`, plus the untuned ops from a roofline (measure/roofline.py),
plus a fixed per-step overhead, plus stalls (first-use compiles, KV re-layouts, ones charged by `add_stall`).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from kernel_gym.kernels.profiles import follows_kv, profile, reads_kv
from kernel_gym.kernels.space import Config
from kernel_gym.measure.roofline import COPY_BW, DEFAULT_VOCAB, dense_step_s
from kernel_gym.modelspec import window_pool_bytes
from kernel_gym.traffic.routing import entropy_norm
from kernel_gym.traffic.routing import uniform_for as _uniform_for

KERNELS = ("prefill_attention", "decode_attention", "fused_moe")
# The H200 SXM's memory as the device reports it: nvidia-smi's 143,771 MiB total (150.75e9 bytes, not the spec sheet's
# 141 GB), in the machine records of this project's H200 runs (benchmarks/live_e2e/machine.txt and the other runs');
# torch.cuda.mem_get_info reports the same total, and vLLM's --gpu-memory-utilization / SGLang's --mem-fraction-static
# take their share of it. Every KV pool (Simulator, parallel.layout.pool_memory_bytes, parallel.deploy.gpu_memory_for)
# and plan's weight check (parallel.layout.why_invalid) is sized from this one figure.
H200_MEMORY_BYTES = 143771 * 2**20
GPU_MEMORY_UTILIZATION = 0.9
COMPILE_S_DEFAULT = 0.27  # docs/architecture.md: Triton compile on first call, median 0.27 s per config on the H200
# Fixed host-side cost of one engine step (scheduling, input preparation, kernel launches, sampling bookkeeping).
# An assumption, not a measurement from this project: see docs/simulator.md; pass step_overhead_s= to change it.
STEP_OVERHEAD_S = 2e-3
# How an engine with CUDA graphs runs a step (vLLM's full-and-piecewise mode), the kinds `step_overheads` is keyed by:
# "graph" a decode-only step replayed as one graph; "piecewise" a step with prefill chunks within the graph size (the
# layers' work replays graphs, attention launches eagerly between them); "eager" a larger step, or every step of an
# engine without graphs (cuda_graph_max_tokens = 0).
STEP_KINDS = ("graph", "piecewise", "eager")
SKEW_GRID = 0.05  # effective skew is rounded to this grid before building MoEWorkload (memo hits)
CHUNK_ATTENTION_MODES = ("auto", "prefix", "equivalent")  # how prefill chunks are charged (see Simulator)
OVERLOAD_UTILISATION = 0.97  # busy fraction of the arrival window above which a growing queue means overload
OVERLOAD_GROWTH = 0.1  # ... growing by more than this fraction of the second half's arrivals (and 8 requests)


@dataclass(frozen=True)
class KVLayout:
    """The KV-cache layout in force: tokens per page and the page layout name (e.g. "NHD" = [pages, page, kv_heads,
    D], "HND" = [pages, kv_heads, page, D]). Decode configs carry it as knobs PAGE_SIZE and LAYOUT."""

    page_size: int
    layout: str

    def __post_init__(self) -> None:
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise ValueError(f"page_size must be a positive integer, got {self.page_size!r}")


DEFAULT_KV = KVLayout(16, "NHD")  # vLLM's default block size and layout: the one place it is named


class KernelTimer(Protocol):
    def time_s(self, kernel: str, workload: Any, config: Config) -> float:
        """Seconds per call of one layer's kernel."""
        ...


class ConfigChooser(Protocol):
    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        """The config for this step's call of `kernel` (the same for all layers)."""
        ...


class BackendTimer:
    """KernelTimer over a kernel_gym.measure.types.Backend, memoised per (kernel, workload.key(), config).

    The simulator rounds workloads to a fine grid before asking (see `round_*` below), so replays hit the memo."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._memo: dict[tuple[str, str, Config], float] = {}
        self.calls = 0

    def time_s(self, kernel: str, workload: Any, config: Config) -> float:
        key = (kernel, workload.key(), config)
        t = self._memo.get(key)
        if t is None:
            self.calls += 1
            m = self.backend.measure(kernel, workload, config)
            if not m.ok or m.median_ms is None:
                raise RuntimeError(
                    f"backend {getattr(self.backend, 'name', self.backend)!r} has no time for kernel {kernel!r}, "
                    f"workload {workload.key()}, config {config}: status {m.status!r} ({m.reason}). The chooser "
                    "picked an unavailable config; choose among backend.available_configs(kernel, workload)"
                )
            t = m.median_ms * 1e-3
            self._memo[key] = t
        return t

    def answers(self, kernel: str, workload: Any, config: Config | None = None) -> bool:
        """Whether the backend has a time for this call, or (config None) any config for the workload: the
        simulator's "auto" chunk mode asks before charging prefill chunks with the prefix_prefill kernel."""
        if config is None:
            try:
                return bool(self.backend.available_configs(kernel, workload))
            except (KeyError, ValueError):
                return False
        key = (kernel, workload.key(), config)
        if key in self._memo:
            return True
        m = self.backend.measure(kernel, workload, config)
        if m.ok and m.median_ms:
            self._memo[key] = m.median_ms * 1e-3
            return True
        return False


class StaticChooser:
    """One fixed config per kernel. With follow_kv=True the decode (and prefix_prefill) config's PAGE_SIZE and
    LAYOUT follow the layout in force (what a deployment that never re-tunes does)."""

    def __init__(self, configs: dict[str, Config], follow_kv: bool = True) -> None:
        self.configs = dict(configs)
        self.follow_kv = follow_kv
        self._kv_cache: dict[tuple[Config, KVLayout], Config] = {}

    def choose(self, kernel: str, workload: Any, kv: KVLayout) -> Config:
        cfg = self.configs[kernel]
        if reads_kv(kernel) and self.follow_kv:
            key = (cfg, kv)
            out = self._kv_cache.get(key)
            if out is None:
                out = cfg.replace(PAGE_SIZE=kv.page_size, LAYOUT=kv.layout)
                self._kv_cache[key] = out
            return out
        return cfg


# ---- rounding to the memo grid ------------------------------------------------------------------------------------

def round_log4(x: float) -> int:
    """Nearest point of the 2^(k/4) grid (as an integer, >= 1)."""
    if x <= 1:
        return 1
    return max(1, int(round(2.0 ** (round(4.0 * math.log2(x)) / 4.0))))


def round_count(n: int) -> int:
    """Exact up to 16, then the 2^(k/4) grid (decode batch, MoE tokens)."""
    return n if n <= 16 else round_log4(n)


def round_up16(n: float) -> int:
    return max(16, int(math.ceil(n / 16.0)) * 16)


def capture_size(num_tokens: int) -> int:
    """The rows a CUDA-graphed step of num_tokens runs (vLLM's default capture sizes: 1, 2, 4, then multiples of
    8); the rows past num_tokens are padding."""
    return num_tokens if num_tokens <= 2 else 4 if num_tokens <= 4 else -(-num_tokens // 8) * 8


def chunk_equivalent_len(chunk: int, offset: int) -> int:
    """Length of a fresh causal sequence with as many (query, key) pairs as a chunk of `chunk` tokens after `offset`
    tokens already in the cache (PrefillWorkload has no prior context), rounded up to a multiple of 16."""
    if offset <= 0:
        return round_up16(chunk)
    pairs = chunk * offset + chunk * (chunk + 1) / 2
    return round_up16((math.sqrt(1 + 8 * pairs) - 1) / 2)


# ---- results ------------------------------------------------------------------------------------------------------

STEP_COLUMNS = ("t_start", "duration_s", "decode_batch", "mean_context", "prefill_tokens", "num_tokens", "waiting",
                "running", "kv_occupancy", "stall_s", "tuned_kernel_s", "skew", "routing_entropy", "max_share")
_C = {name: i for i, name in enumerate(STEP_COLUMNS)}


@dataclass
class IntervalStats:
    """What happened between two run_until calls."""

    t_start: float
    t_end: float
    steps: int
    output_tokens: int
    prefill_tokens: int
    stall_s: float
    tuned_kernel_s: float
    finished: int
    stalls: list[tuple[float, float, str]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / max(self.t_end - self.t_start, 1e-12)


@dataclass
class SimResult:
    """Per-request arrays (index = request), the per-step log and a summary."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    generated_tokens: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    preemptions: np.ndarray
    steps: np.ndarray  # [num_steps, len(STEP_COLUMNS)]
    configs_used: dict[str, dict[str, int]]
    switch_log: list[tuple[float, str, str, str]]
    stalls: list[tuple[float, float, str]]
    summary: dict[str, float]
    warnings: list[str] = field(default_factory=list)  # e.g. the offered load exceeded what the server sustains

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """Mean time per output token after the first (NaN for one-token requests)."""
        n = self.output_tokens - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, (self.finish_s - self.first_token_s) / np.maximum(n, 1), np.nan)

    def step_column(self, name: str) -> np.ndarray:
        return self.steps[:, _C[name]]


# ---- the simulator ------------------------------------------------------------------------------------------------

WAVE_MEMO_MAX = 200_000  # decode batches whose wave price is kept (Simulator._waves_s)


class OverloadWarning(UserWarning):
    """The offered load exceeded what the simulated server sustains: latencies grow with the trace's length."""


class Simulator:
    """Replays requests through continuous batching with chunked prefill; see the module docstring.

    requests: a Trace (or anything with arrival_s, prompt_tokens, output_tokens arrays; `hash_ids` and
    `hash_block_tokens` when it carries prefix-cache blocks, as Mooncake traces do). routing_profile: a
    RoutingProfile (None = uniform). precompiled: (kernel, Config) pairs compiled before the replay (no stall);
    a chooser's own `precompiled` attribute is added. compile_s(kernel, config) -> seconds for the first use of a
    config (default COMPILE_S_DEFAULT).

    prefix_caching: with hash_ids, a request's full prompt blocks become cached blocks in the KV pool as soon as they
    are computed (shared by every request whose prompt starts with the same blocks, and kept after it finishes); a
    request's leading blocks found there are not prefilled again; cached blocks no running request uses are evicted
    least recently used first when pages run short (before any preemption).
    chunk_attention: how a step's prefill chunks are charged. "prefix": one prefix_prefill call over the chunks and
    their cached prefixes (the timer must answer); "equivalent": the old stand-in, one prefill_attention call over
    fresh sequences with as many (query, key) pairs (chunk_equivalent_len); "auto" (default): prefix_prefill where
    the timer has a time for it (a timer with an `answers` method, e.g. BackendTimer), else the stand-in, whose
    seconds for chunks with a prefix are summed as estimated in the summary (chunk_attention_estimated_s).
    cuda_graph_max_tokens: an engine that replays CUDA graphs for steps of up to this many tokens (vLLM's default
    capture sizes, `capture_size`) runs such a step at its capture size, its extra rows padding: the MoE layer and
    the dense ops are charged for the padded rows. 0 (default): eager steps, charged for their tokens.
    kv_block_tokens: the block the engine allocates the KV cache (and caches prefixes) in, where it is larger than the
    kernel's page (kv_layout.page_size): vLLM raises its block for models with a recurrent mixer state
    (deploy.engine_block_tokens). Requests take whole blocks; the kernels are priced at the kernel's page. 0: the page.
    state_pool_share: the share of the pool a separate pool for the mixer state takes (SGLang's mamba pool); the state
    then takes no KV pages, and the pool's slots, state_slots_per_request per running request, cap the running
    requests. 0: the state is held in the KV pool (vLLM's hybrid allocator).
    window_pool_ratio: a windowed mixer's KV (ModelSpec.window_tokens) in a pool of its own holding this many tokens
    per token of the full-attention layers' pool (SGLang's hybrid SWA pool, --swa-full-tokens-ratio); a request needs
    room in both. 0: one pool for both (vLLM's hybrid allocator).
    step_overheads: the fixed host cost per kind of step (STEP_KINDS: {"graph": s, "piecewise": s, "eager": s}), for
    an engine whose launches cost differently by how the step runs; a kind left out costs step_overhead_s.
    decode_waves: price a decode batch from its own contexts, as its programs fill the GPU (traffic.decode_waves,
    fitted per config on the timer's times); False, or a config the fit does not hold: the config's time at the
    batch's mean context, no less than the longest sequence's alone (_decode_s).
    """

    def __init__(
        self,
        model: Any,
        requests: Any,
        timer: KernelTimer,
        chooser: ConfigChooser,
        routing_profile: Any = None,
        *,
        kv_layout: KVLayout = DEFAULT_KV,
        gpu_memory_bytes: float = H200_MEMORY_BYTES,
        gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
        step_overhead_s: float = STEP_OVERHEAD_S,
        compile_s: Callable[[str, Config], float] | None = None,
        precompiled: Iterable[tuple[str, Config]] = (),
        vocab_size: int = DEFAULT_VOCAB,
        dtype: str = "bfloat16",
        prefix_caching: bool = True,
        chunk_attention: str = "auto",
        cuda_graph_max_tokens: int = 0,
        step_overheads: dict[str, float] | None = None,
        decode_waves: bool = False,
        kv_block_tokens: int = 0,
        state_pool_share: float = 0.0,
        state_slots_per_request: int = 1,
        window_pool_ratio: float = 0.0,
    ) -> None:
        if chunk_attention not in CHUNK_ATTENTION_MODES:
            raise ValueError(f"chunk_attention {chunk_attention!r} is not one of {CHUNK_ATTENTION_MODES}")
        self.chunk_mode = chunk_attention
        self.model = model
        self.timer = timer
        self.chooser = chooser
        self.routing = routing_profile if routing_profile is not None else _uniform_for(model)
        if self.routing.num_experts != model.num_experts or self.routing.top_k != model.top_k:
            raise ValueError(
                f"routing profile has {self.routing.num_experts} experts top-{self.routing.top_k}, model "
                f"{model.name} has {model.num_experts} top-{model.top_k}; build the profile for the model"
            )
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        self.max_tokens = int(max_num_batched_tokens)
        self.max_seqs = int(max_num_seqs)
        self.overhead_s = float(step_overhead_s)
        unknown = set(step_overheads or ()) - set(STEP_KINDS)
        if unknown:
            raise ValueError(f"step_overheads: unknown step kinds {sorted(unknown)}; the kinds are {STEP_KINDS}")
        self.overheads = {k: float((step_overheads or {}).get(k, self.overhead_s)) for k in STEP_KINDS}
        self.graph_max_tokens = int(cuda_graph_max_tokens)
        self.compile_fn = compile_s
        self.vocab = int(vocab_size)
        self.dtype = dtype
        self.pool_bytes = gpu_memory_bytes * gpu_memory_utilization - model.weight_bytes
        if not 0.0 <= float(state_pool_share) < 1.0:
            raise ValueError(f"state_pool_share must be in [0, 1), got {state_pool_share!r}")
        self.state_slots = 0  # slots of a separate state pool (0: none; the state is held in the KV pool)
        if state_pool_share and getattr(model, "mixer_state_bytes", 0) and self.pool_bytes > 0:
            self.state_slots = int(self.pool_bytes * state_pool_share // model.mixer_state_bytes)
            self.pool_bytes *= 1.0 - state_pool_share
            per = max(1, int(state_slots_per_request))
            if self.state_slots < per:
                raise ValueError(f"{model.name}: the mixer-state pool ({state_pool_share:.0%} of the memory left after "
                                 f"weights) holds {self.state_slots} states ({model.mixer_state_bytes / 2**20:.1f} MiB "
                                 f"each), fewer than one running request takes ({per}); give it more memory or use "
                                 "more GPUs")
            self.max_seqs = min(self.max_seqs, self.state_slots // per)
        if self.pool_bytes <= 0:
            raise ValueError(
                f"{model.name}: weights ({model.weight_bytes / 1e9:.1f} GB) exceed {gpu_memory_utilization} x "
                f"{gpu_memory_bytes / 1e9:.0f} GB of GPU memory; replay one GPU's tensor-parallel shard "
                "(--model NAME@tpN or SPEC.json@tpN, N GPUs), or a smaller model; `kernel-gym plan` chooses the "
                "parallelism"
            )

        self.arrival = np.asarray(requests.arrival_s, dtype=np.float64)
        self.prompt = np.asarray(requests.prompt_tokens, dtype=np.int64)
        self.out = np.asarray(requests.output_tokens, dtype=np.int64)
        n = len(self.arrival)
        if n == 0 or len(self.prompt) != n or len(self.out) != n:
            raise ValueError("requests need equally long, non-empty arrival_s, prompt_tokens, output_tokens")
        if np.any(np.diff(self.arrival) < 0) or self.prompt.min() < 1 or self.out.min() < 1:
            raise ValueError("requests must be sorted by arrival and have >= 1 prompt and output token each")
        self.n = n
        self._arrival_cumsum = np.concatenate([[0.0], np.cumsum(self.arrival)])
        self.in_system_integral = 0.0  # integral over time of the number of requests arrived and not finished
        self.gen = np.zeros(n, np.int64)
        self.kv = np.zeros(n, np.int64)
        self.target = self.prompt.copy()  # tokens to prefill before the next token is emitted
        self.pages = np.zeros(n, np.int64)
        self.state_held = np.zeros(n, np.int64)  # pages a running request's mixer state holds (_state_need)
        self.first_tok = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.preempts = np.zeros(n, np.int64)
        self.admit_seq = np.zeros(n, np.int64)
        self._admit_counter = 0

        self.kv_layout = kv_layout
        if isinstance(kv_block_tokens, bool) or not isinstance(kv_block_tokens, int) or kv_block_tokens < 0:
            raise ValueError(f"kv_block_tokens must be an integer >= 0 (0: the kernel's page), got {kv_block_tokens!r}")
        self.kv_block_tokens = kv_block_tokens
        self.window = int(getattr(model, "window_tokens", 0) or 0)  # a windowed mixer's window or chunk (ModelSpec)
        self.window_chunked = getattr(model, "mixer", "") == "chunked-local"
        if not 0.0 <= float(window_pool_ratio) <= 1.0:
            raise ValueError(f"window_pool_ratio must be in [0, 1] (SGLang's --swa-full-tokens-ratio), got "
                             f"{window_pool_ratio!r}")
        self.window_pool_ratio = float(window_pool_ratio)
        self.window_pool_bytes = 0.0  # the windowed layers' own pool (window_pool_ratio), in blocks: window_blocks
        if window_pool_ratio and self.window:
            self.window_pool_bytes = window_pool_bytes(model, self.pool_bytes, window_pool_ratio)
            self.pool_bytes -= self.window_pool_bytes
        self.window_blocks = self.free_window = 0
        self._init_prefix_cache(requests if prefix_caching else None, self._block(kv_layout.page_size))
        self._set_pool(kv_layout.page_size)
        why = self._why_too_long(kv_layout.page_size, np.ones(n, bool))
        if why:
            raise ValueError(f"{why} ({model.name} on {gpu_memory_bytes / 1e9:.0f} GB); drop requests that long from "
                             "the trace or use a GPU with more memory")
        self.free_pages, self.free_window = self.num_pages, self.window_blocks

        self.clock = 0.0 if n == 0 else min(0.0, float(self.arrival[0]))
        self._next = 0  # next request not yet arrived
        self.waiting: deque[int] = deque()
        self.dec = np.zeros(0, np.int64)  # running, prefill done: one token per step
        self.pref: list[int] = []  # running, prefill in progress, in admission order

        self.compiled: set[tuple[str, Config]] = set(precompiled) | set(getattr(chooser, "precompiled", ()) or ())
        self._pending_stalls: list[tuple[float, str]] = []
        self.stalls: list[tuple[float, float, str]] = []
        self.configs_used: dict[str, Counter] = {k: Counter() for k in KERNELS}
        self.switch_log: list[tuple[float, str, str, str]] = []
        self._last_cfg: dict[str, Config] = {}
        self._checked_decode: set[tuple[Config, KVLayout]] = set()

        self._memo: dict[tuple, float] = {}
        self._wl_cache: dict[tuple, Any] = {}
        self._dense_memo: dict[tuple[int, int], float] = {}
        self._route_shares: Any = None
        self._route_stats = (0.0, 1.0, 0.0)

        self._chunk_ok: dict[tuple, bool] = {}
        self.chunk_measured_s = 0.0  # prefill chunk seconds charged with prefix_prefill times
        self.chunk_estimated_s = 0.0  # ... with the equivalent fresh sequence, for chunks that have a prefix
        self._window_end = float(self.arrival[-1])
        self._window_mid = 0.5 * (float(self.arrival[0]) + self._window_end)
        self._backlog: dict[str, float] = {}
        self._busy_in_window = 0.0

        self._log = np.zeros((4096, len(STEP_COLUMNS)))
        self._nsteps = 0
        self.output_tokens_total = 0
        self.prefill_tokens_total = 0
        self.recomputed_tokens = 0
        self.tuned_kernel_total = 0.0
        self.decode_longest_s = 0.0  # decode seconds charged above the mean context's for the longest sequence
        self.decode_waves = bool(decode_waves)
        self.decode_waves_s = 0.0  # decode seconds the wave model charged beyond (or below) the mean context's time
        self.decode_waves_steps = 0  # decode batches the wave model priced
        self.decode_waves_untimed_s = 0.0  # ... of which for choices the data has no time for (estimates)
        self._wave_fits: dict[Config, Any] = {}
        self._wave_memo: dict[tuple, float] = {}
        self._sibling_fits: dict[Config, Any] = {}  # the fits of siblings tried for untimed choices (_sibling_fit)
        self.decode_waves_siblings: dict[Config, Config | None] = {}  # untimed choice -> the sibling that priced it
        self._last_wl: dict[str, Any] = {}  # per kernel, the workload of its last call (as the chooser saw it)
        self.stall_total = 0.0
        self.num_preemptions = 0
        self.state_ranks = 1  # data-parallel ranks the step's sequences (and their mixer state) spread over
        self.call_layers = model.n_attention_layers  # layers the attention call being priced runs in
        self.window_call = False  # ... and whether they are the windowed layers (_window_attention_s)

    # ---- pool and layout ----

    def _block(self, page_size: int) -> int:
        """Tokens per allocated block at the kernel page `page_size` (kv_block_tokens where larger)."""
        return max(int(page_size), self.kv_block_tokens)

    def _pool_pages(self, page_size: int) -> tuple[int, int]:
        """(blocks in the pool, blocks a running request's mixer state takes from it) at the kernel page `page_size`:
        vLLM's hybrid allocator holds the state beside the KV cache; 0 state blocks for a model whose every layer is
        attention, or whose state has a pool of its own (state_pool_share)."""
        page_bytes = self._block(page_size) * self.model.kv_bytes_per_token
        state = 0 if self.state_slots or self.window else int(getattr(self.model, "mixer_state_bytes", 0))
        return int(self.pool_bytes // page_bytes), -(-state // page_bytes)

    def _window_skipped(self, computed: Any) -> Any:
        """Tokens before the window of the token after `computed` ones (vLLM's get_num_skipped_tokens): their blocks
        are freed in the windowed layers. Chunked local attention: the earlier chunks; a sliding window: all but the
        last window - 1."""
        w = self.window
        return computed // w * w if self.window_chunked else np.maximum(0, computed - (w - 1))

    def _state_need(self, computed: Any, upto: Any, block: int = 0) -> Any:
        """Pages of mixer state a request holds while it computes tokens computed..upto (arrays or ints): a recurrent
        state's state_pages from its first token; a windowed mixer's KV in whole blocks from the window's first
        token to `upto`, in the windowed layers (their bytes per token over the attention layers' per page), as vLLM's
        hybrid allocator holds each layer group's blocks. `block`: the allocation block (default the one in force)."""
        if not self.window:
            return np.where(np.asarray(upto) > 0, self.state_pages, 0)
        ps = block or self.page_size
        blocks = np.maximum(-(-np.asarray(upto) // ps) - self._window_skipped(np.asarray(computed)) // ps, 0)
        if self.window_pool_bytes:  # blocks of the window's own pool
            return blocks
        per_token = self.model.mixer_state_bytes // self.window
        return -(-blocks * per_token // self.model.kv_bytes_per_token)

    def _window_pool_blocks(self, block: int) -> int:
        """Blocks of `block` tokens the windowed layers' own pool holds (window_pool_ratio; 0 without one)."""
        if not self.window_pool_bytes:
            return 0
        return int(self.window_pool_bytes // (block * (self.model.mixer_state_bytes // self.window)))

    def _fits(self, full: int, state: int) -> bool:
        """Whether `full` more KV pages and `state` more pages (or window blocks) of mixer state are free."""
        if self.window_pool_bytes:
            return full <= self.free_pages and state <= self.free_window
        return full + state <= self.free_pages

    def _take(self, full: int, state: int) -> None:
        """Allocate (or, negative, free) `full` KV pages and `state` of mixer state, from the pool that holds it."""
        self.free_pages -= full
        if self.window_pool_bytes:
            self.free_window -= state
        else:
            self.free_pages -= state

    def _why_too_long(self, page_size: int, which: np.ndarray) -> str:
        """'' when each of the `which` requests fits the pool at `page_size` beside its mixer state, else why not (a
        request that cannot fit would preempt itself forever)."""
        pages, state = self._pool_pages(page_size)
        need = np.where(which, self.prompt + self.out, 0)
        page_size = self._block(page_size)
        if self.window and need.size and int(need.max()) > 0:  # the window's blocks beside the longest one's last token
            state = int(self._state_need(int(need.max()) - 1, int(need.max()), page_size))
            if self.window_pool_bytes:  # in a pool of their own
                held = self._window_pool_blocks(page_size)
                if state > held:
                    return (f"one request's window ({state} blocks of {page_size} tokens) does not fit the window "
                            f"pool's {held} blocks (window_pool_ratio {self.window_pool_ratio:g}): raise the ratio or "
                            "use more GPUs")
                state = 0
        room = (pages - state) * page_size
        if not need.size or int(need.max()) <= room:
            return ""
        i = int(np.argmax(need))
        state_mib = state * page_size * self.model.kv_bytes_per_token / 2**20
        where = f"beside its mixer state ({state_mib:.1f} MiB a request)" if state else ""
        return (f"request {i} needs {int(need[i])} tokens of KV cache but the pool holds {max(room, 0)} at "
                f"{page_size}-token pages {where}").rstrip()

    def _set_pool(self, page_size: int) -> None:
        """The pool at kernel page `page_size`; self.page_size is the block requests are allocated in."""
        self.page_size = self._block(page_size)
        self.num_pages, self.state_pages = self._pool_pages(page_size)
        self.window_blocks = self._window_pool_blocks(self.page_size)
        if self.num_pages < 1:
            raise ValueError(f"KV pool of {self.pool_bytes / 1e9:.2f} GB holds no page of {self.page_size} tokens")

    # ---- prefix cache ----

    def _init_prefix_cache(self, requests: Any, page_size: int) -> None:
        """Cached prompt blocks (hash id -> references by running requests), the unreferenced ones in LRU order."""
        hashes = None if requests is None else getattr(requests, "hash_ids", None)
        self.hashes = hashes
        self.block_tokens = int(getattr(requests, "hash_block_tokens", 0) or 0) if hashes is not None else 0
        if hashes is not None:
            if len(hashes) != self.n:
                raise ValueError(f"requests carry {len(hashes)} hash_ids lists for {self.n} requests")
            if self.block_tokens < 1:
                raise ValueError("requests with hash_ids need hash_block_tokens >= 1 (tokens per cache block)")
            b = self.block_tokens
            if b < page_size and page_size % b == 0:
                # the engine caches whole pages: a page's prefix is its last block's id (ids are chained: equal ids,
                # equal prefixes), and a page the prompt does not fill is not cached (Bailian's 16-token blocks on
                # 64-token pages: every 4th id)
                self.hashes = hashes = tuple(tuple(ids[page_size // b - 1::page_size // b]) for ids in hashes)
                self.block_tokens = page_size
            elif page_size == self.kv_block_tokens and (b % page_size or b < page_size):
                # the engine chose its block, and the trace's blocks do not tile it (Mooncake's 512 tokens on vLLM's
                # 576- or 160-token blocks of a hybrid model): page k stands for the prefix up to the end of the
                # trace's block that ends at or past it (equal there, equal over the page: the hits counted are a
                # lower bound), and carries its own number, since one trace block may end past several pages
                self.hashes = hashes = tuple(tuple((ids[-(-k * page_size // b) - 1], k) for k in
                                                   range(1, len(ids) * b // page_size + 1)
                                                   if -(-k * page_size // b) <= len(ids)) for ids in hashes)
                self.block_tokens = page_size
            self._check_block(page_size)
        self.base = np.zeros(self.n, np.int64)  # tokens of a request's KV held in shared cached blocks
        self.shared: dict[int, tuple[int, ...]] = {}
        self.refs: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached blocks no running request uses, oldest first
        self.cache_pages = 0
        self.prefix_stats = Counter()

    def _check_block(self, page_size: int) -> None:
        if self.block_tokens % page_size:
            raise ValueError(f"prefix-cache blocks of {self.block_tokens} tokens do not fill pages of {page_size} "
                             "tokens (nor does a whole number of them fill a page); use a page size that divides the "
                             "block or a multiple of it (or prefix_caching=False)")

    def _evict(self, need_pages: int) -> None:
        """Evict unreferenced cached blocks, least recently used first, until need_pages pages are free."""
        bp = self.block_tokens // self.page_size if self.block_tokens else 0
        while self.free_pages < need_pages and self.lru:
            h, _ = self.lru.popitem(last=False)
            del self.refs[h]
            self.free_pages += bp
            self.cache_pages -= bp
            self.prefix_stats["evicted_blocks"] += 1

    def _apply_hits(self, rid: int) -> None:
        """Point a request being admitted at its leading prompt blocks found in the cache (at least one token is left
        to compute: the step that computes it emits the next token)."""
        ids, b = self.hashes[rid], self.block_tokens
        limit = min(len(ids), int(self.prompt[rid]) // b, (int(self.target[rid]) - 1) // b)
        k = 0
        while k < limit and ids[k] in self.refs:
            k += 1
        for h in ids[:k]:
            if self.refs[h] == 0:
                del self.lru[h]
            self.refs[h] += 1
        self.shared[rid] = tuple(ids[:k])
        self.base[rid] = self.kv[rid] = k * b
        first = self.preempts[rid] == 0
        self.prefix_stats["lookup_tokens" if first else "resume_lookup_tokens"] += int(self.target[rid])
        self.prefix_stats["hit_tokens" if first else "resume_hit_tokens"] += k * b

    def _drop_shared(self, rid: int) -> None:
        """Drop a request's references; blocks nobody uses join the LRU end, a chain's head last (most recent), so
        its tail is evicted first."""
        for h in reversed(self.shared.pop(rid, ())):
            self.refs[h] -= 1
            if self.refs[h] == 0:
                self.lru[h] = None
        self.base[rid] = 0

    def _unapply_hits(self, rid: int) -> None:
        """Undo _apply_hits for a request that could not be admitted after all."""
        first = self.preempts[rid] == 0
        self.prefix_stats["lookup_tokens" if first else "resume_lookup_tokens"] -= int(self.target[rid])
        self.prefix_stats["hit_tokens" if first else "resume_hit_tokens"] -= int(self.base[rid])
        self._drop_shared(rid)
        self.kv[rid] = 0

    def _promote(self, rid: int) -> None:
        """Full prompt blocks a request has just computed become cached blocks it references (vLLM caches a block as
        soon as it is full, so concurrent requests share it): their pages move from the request to the cache, or,
        when another request cached the same block meanwhile, the request points at that one and frees its copy."""
        ids, b = self.hashes[rid], self.block_tokens
        bp = b // self.page_size
        limit = min(len(ids), int(self.prompt[rid]) // b)
        shared = list(self.shared.get(rid, ()))
        while len(shared) < limit and self.kv[rid] >= (len(shared) + 1) * b and self.pages[rid] >= bp:
            h = ids[len(shared)]
            self.pages[rid] -= bp  # the block's pages are the first of the request's own (base is block-aligned)
            if h in self.refs:
                if self.refs[h] == 0:
                    del self.lru[h]
                self.refs[h] += 1
                self.free_pages += bp
            else:
                self.refs[h] = 1
                self.cache_pages += bp
                self.prefix_stats["inserted_blocks"] += 1
            shared.append(h)
            self.base[rid] += b
        self.shared[rid] = tuple(shared)
        self.prefix_stats["cached_blocks_max"] = max(self.prefix_stats["cached_blocks_max"], len(self.refs))

    def _release(self, rid: int) -> None:
        """Free a finished or preempted request's own pages and drop its references to cached blocks (which stay
        cached until evicted)."""
        if self.hashes is not None:
            self._drop_shared(rid)
        self._take(-int(self.pages[rid]), -int(self.state_held[rid]))
        self.pages[rid] = 0
        self.state_held[rid] = 0

    def _running(self) -> np.ndarray:
        return np.concatenate([self.dec, np.asarray(self.pref, dtype=np.int64)])

    def set_kv_layout(self, page_size: int, layout: str) -> float:
        """Switch the KV-cache layout; charges re-layout (read + write of the live KV bytes at copy bandwidth) as a
        stall on the next step. Returns the stall in seconds. Re-pages the live requests; if the bigger pages no
        longer fit, the most recently admitted are preempted."""
        new = KVLayout(int(page_size), str(layout))
        if new == self.kv_layout:
            return 0.0
        running = self._running()
        live_bytes = float(self.kv[running].sum()) * self.model.kv_bytes_per_token
        stall = 2.0 * live_bytes / COPY_BW
        if self.hashes is not None:
            self._check_block(self._block(new.page_size))
        why = self._why_too_long(new.page_size, np.isnan(self.finish))
        if why:  # its pages rounded up, the pool's down: a request that fitted may not fit the bigger pages
            raise ValueError(f"KV layout page_size={new.page_size}: {why}; keep page_size={self.page_size}")
        self.kv_layout = new
        self._set_pool(new.page_size)
        ps = self.page_size
        self.pages[running] = -(-(self.kv[running] - self.base[running]) // ps)
        self.cache_pages = len(self.refs) * (self.block_tokens // ps) if self.block_tokens else 0
        self.state_held[running] = self._state_need(self.kv[running], self.kv[running])
        self.free_pages = self.num_pages - int(self.pages[running].sum()) - self.cache_pages
        self.free_window = self.window_blocks
        self._take(0, int(self.state_held[running].sum()))
        self._evict(0)
        while self.free_pages < 0 or self.free_window < 0:
            self._preempt(self._latest_running())
        self.add_stall(stall, f"kv re-layout to page_size={ps} layout={layout}")
        return stall

    def add_stall(self, seconds: float, reason: str) -> None:
        """Charge `seconds` of stall (GPU busy, requests wait) to the next step."""
        if seconds < 0 or not math.isfinite(seconds):
            raise ValueError(f"stall must be a finite number of seconds >= 0, got {seconds}")
        self._pending_stalls.append((float(seconds), reason))

    def _latest_running(self) -> int:
        running = self._running()
        return int(running[np.argmax(self.admit_seq[running])])

    def _preempt(self, rid: int) -> None:
        if self.dec.size and np.any(self.dec == rid):
            self.dec = self.dec[self.dec != rid]
        else:
            self.pref.remove(rid)
        self._release(rid)
        self.recomputed_tokens += int(self.kv[rid])
        self.kv[rid] = 0
        self.target[rid] = self.prompt[rid] + self.gen[rid]
        self.preempts[rid] += 1
        self.num_preemptions += 1
        self.waiting.appendleft(rid)

    # ---- one step ----

    @property
    def done(self) -> bool:
        return self._next >= self.n and not self.waiting and not self.dec.size and not self.pref

    def _workload(self, key: tuple) -> Any:
        wl = self._wl_cache.get(key)
        if wl is None:  # a call's key: (kernel, its varying fields' values); the model fixes the rest (profile)
            p = profile(key[0])
            wl = p.workload_type()(**{f: getattr(self.model, f) for f in p.fixed_fields},
                                   **dict(zip(p.interpolation.varying, key[1:])), dtype=self.dtype)
            self._wl_cache[key] = wl
        return wl

    def _kernel_s(self, kernel: str, key: tuple, stall: list) -> float:
        wl = self._last_wl[kernel] = self._workload(key)
        cfg = self.chooser.choose(kernel, wl, self.kv_layout)
        if follows_kv(kernel) and (cfg, self.kv_layout) not in self._checked_decode:
            kv = self.kv_layout
            if cfg.get("PAGE_SIZE") != kv.page_size or cfg.get("LAYOUT") != kv.layout:
                raise ValueError(
                    f"decode config {cfg} does not match the KV layout in force (PAGE_SIZE={kv.page_size}, "
                    f"LAYOUT={kv.layout!r}); choose a config with that page size and layout, or call "
                    "set_kv_layout() first"
                )
            self._checked_decode.add((cfg, kv))
        if (kernel, cfg) not in self.compiled:
            self.compiled.add((kernel, cfg))
            c = COMPILE_S_DEFAULT if self.compile_fn is None else float(self.compile_fn(kernel, cfg))
            stall.append((c, f"compile {kernel} {cfg}"))
        self.configs_used.setdefault(kernel, Counter())[cfg] += 1
        slot = self._slot(kernel)
        last = self._last_cfg.get(slot)
        if last is not cfg and last != cfg:
            if last is not None:
                self.switch_log.append((self.clock, kernel, str(last), str(cfg)))
            self._last_cfg[slot] = cfg
        mk = (key, cfg)
        t = self._memo.get(mk)
        if t is None:
            t = float(self.timer.time_s(kernel, wl, cfg))
            if not t > 0 or not math.isfinite(t):
                raise ValueError(f"timer gave {t!r} s for {kernel} {wl} {cfg}; kernel times must be finite and > 0")
            self._memo[mk] = t
        return t

    def _decode_s(self, batch: int, mean_ctx: float, max_ctx: float | None, stall: list,
                  contexts: Any = None) -> float:
        """Seconds per layer of the decode batch. With its `contexts` and decode_waves: the wave model's price of
        those contexts for the chosen config (_waves_s; a ragged batch waits for the programs that start behind its
        long sequences'). Otherwise, or where the config's times do not fit the model: the config's time at the
        batch's mean context (its total KV read), but no less than its time for the longest sequence alone (batch 1
        at `max_ctx`; the data's rows spread contexts only over 0.5-1.5x their mean, DecodeWorkload.context_lens), the
        extra seconds summed in decode_longest_s (all layers).
        A config a guarding chooser served as a fallback (`last_fallback`: the policy's choice, `last_choice`, has no
        time in the data) keeps the fallback's time, unless the wave model prices the choice itself where the
        family's rules accept it: that is the config a deployment runs (an estimate, summed in
        decode_waves_untimed_s), fitted on the choice's own times where any source has them, else on its nearest
        timed sibling's (_sibling_fit)."""
        key = ("decode_attention", round_count(batch), round_log4(mean_ctx))
        t = self._kernel_s("decode_attention", key, stall)
        waves_on = self.decode_waves and contexts is not None and len(contexts) == batch
        if getattr(self.chooser, "last_fallback", {}).get("decode_attention"):
            choice = getattr(self.chooser, "last_choice", {}).get("decode_attention")
            if waves_on and choice is not None:
                from kernel_gym.kernels.decode_attention import SPACE

                wl = self._last_wl.get("decode_attention")
                if wl is not None and SPACE.is_valid(choice, wl):
                    waves = self._waves_s(choice, contexts, untimed=True)
                    if waves is not None:
                        self.decode_waves_s += (waves - t) * self.call_layers
                        self.decode_waves_untimed_s += waves * self.call_layers
                        self.decode_waves_steps += 1
                        return waves
            return t  # a fallback stands in for an untimed choice: its own longest-sequence time says nothing of it
        cfg = self._last_cfg.get(self._slot("decode_attention"))
        if cfg is None:  # a subclass that prices kernels its own way (parallel.ParallelSimulator's pricer)
            return t
        if waves_on:
            waves = self._waves_s(cfg, contexts)
            if waves is not None:
                self.decode_waves_s += (waves - t) * self.call_layers
                self.decode_waves_steps += 1
                return waves
        if batch == 1 or max_ctx is None or max_ctx <= 1.5 * mean_ctx:  # within the rows' own spread
            return t
        mk = (("decode_attention", 1, round_log4(max_ctx)), cfg)
        longest = self._memo.get(mk)
        if longest is None:
            try:
                longest = float(self.timer.time_s("decode_attention", self._workload(mk[0]), cfg))
            except (LookupError, RuntimeError, ValueError):
                longest = 0.0  # the data cannot time the config alone at that context: the mean's time stands
            self._memo[mk] = longest
        if longest > t:
            self.decode_longest_s += (longest - t) * self.call_layers
            return longest
        return t

    def _waves_s(self, cfg: Config, contexts: Any, untimed: bool = False) -> float | None:
        """The wave model's seconds for this batch's contexts under `cfg` (traffic.decode_waves), or None where the
        config's times do not fit it. For an `untimed` choice (the guard served a fallback for it) without a fit of
        its own, its nearest timed sibling's fit prices it; a config the data times keeps its own price or none.
        Contexts are rounded up to 16-token pages for the memo: a batch's price then changes once a page, not every
        step."""
        from kernel_gym.kernels.decode_attention import program_rounds

        fit = self._own_fit(cfg, self._wave_fits)
        if fit is None and untimed:
            fit = self._sibling_fit(cfg)
        if fit is None:
            return None
        ctx = tuple(int(-(-int(c) // 16) * 16) for c in contexts)
        mk = (cfg, ctx)
        t = self._wave_memo.get(mk)
        if t is None:
            if len(self._wave_memo) >= WAVE_MEMO_MAX:  # a long replay's batches rarely repeat after a while
                self._wave_memo.clear()
            m = self.model
            t = self._wave_memo[mk] = fit.seconds(program_rounds(list(ctx), cfg, m.num_heads, m.num_kv_heads))
        return t

    def _sibling_fit(self, cfg: Config) -> Any:
        """The wave fit of `cfg`'s nearest timed sibling (KnobSpace.later_knob_siblings: its later-added knobs set
        otherwise, which leave the grid of programs the wave model prices as it is; how close a sibling's price
        comes on the H200: benchmarks/live_e2e/sibling_check.py). None where no sibling has a fit; which sibling
        priced the choice is kept in decode_waves_siblings."""
        from kernel_gym.kernels.decode_attention import SPACE

        if cfg in self.decode_waves_siblings:
            sib = self.decode_waves_siblings[cfg]
            return None if sib is None else self._sibling_fits[sib]
        self.decode_waves_siblings[cfg] = None
        for sib in SPACE.later_knob_siblings(cfg):
            fit = self._own_fit(sib, self._sibling_fits)
            if fit is not None:
                self.decode_waves_siblings[cfg] = sib
                return fit
        return None

    def _own_fit(self, cfg: Config, memo: dict[Config, Any]) -> Any:
        """`cfg`'s wave fit on its own times (None where they do not fit), fitted once per memo."""
        if cfg not in memo:
            memo[cfg] = self._fit_waves(cfg)
        return memo[cfg]

    def _fit_waves(self, cfg: Config) -> Any:
        """decode_waves.fit over the timer's times of `cfg` at the fit grid (points where the config is invalid or
        the timer has no time are left out)."""
        from kernel_gym.kernels.decode_attention import SPACE, program_rounds
        from kernel_gym.traffic import decode_waves

        m = self.model

        def time_at(batch: int, context: int) -> float | None:
            wl = self._workload(("decode_attention", batch, context))
            if not SPACE.is_valid(cfg, wl):
                return None
            try:
                return float(self.timer.time_s("decode_attention", wl, cfg))
            except (LookupError, RuntimeError, ValueError):
                return None

        def rounds_at(batch: int, context: int) -> list[list[int]]:
            wl = self._workload(("decode_attention", batch, context))
            return program_rounds(wl.context_lens(), cfg, m.num_heads, m.num_kv_heads)

        return decode_waves.fit(time_at, rounds_at)

    def _chunks_s(self, chunks: list[tuple[int, int, int]], stall: list) -> float:
        """Seconds per layer of this step's prefill chunks [(request, chunk, offset)] (see chunk_attention)."""
        if self.chunk_mode != "equivalent":
            pairs = sorted(((round_up16(c), round_log4(o) if o > 0 else 0) for _, c, o in chunks), reverse=True)
            key = ("prefix_prefill", tuple(c for c, _ in pairs), tuple(o for _, o in pairs))
            if self.chunk_mode == "prefix" or self._prefix_answered(key):
                t = self._kernel_s("prefix_prefill", key, stall)
                self.chunk_measured_s += t * self.call_layers
                return t
        lens = tuple(sorted((chunk_equivalent_len(c, o) for _, c, o in chunks), reverse=True))
        key = ("prefill_attention", lens)
        t = self._kernel_s("prefill_attention", key, stall)
        if any(o > 0 for _, _, o in chunks):
            self.chunk_estimated_s += t * self.call_layers
            standin = getattr(self.chooser, "standin", None)  # a chooser that sums estimated time (replay's guard)
            if callable(standin):
                standin("prefill_attention", self._workload(key), self.kv_layout)
        return t

    def _prefix_answered(self, key: tuple) -> bool:
        """"auto" mode: whether the chooser has a prefix_prefill config and the timer a time for this call. A chooser
        with `peek` (replay's guard) is asked without being charged for the call."""
        ok = self._chunk_ok.get(key)
        if ok is None:
            answers = getattr(self.timer, "answers", None)
            ok = False
            wl = self._workload(key)
            if callable(answers) and answers("prefix_prefill", wl, None):
                ask = getattr(self.chooser, "peek", None)
                ask = ask if callable(ask) else self.chooser.choose
                try:
                    ok = bool(answers("prefix_prefill", wl, ask("prefix_prefill", wl, self.kv_layout)))
                except (LookupError, ValueError, AttributeError, NotImplementedError):
                    ok = False  # a chooser without prefix_prefill configs (policies built before the kernel), or
                    # none the data holds on the KV layout in force
            self._chunk_ok[key] = ok
        return ok

    def step_kind(self, has_chunks: bool, num_tokens: int) -> str:
        """How the engine runs a step of `num_tokens` tokens (STEP_KINDS)."""
        if num_tokens > self.graph_max_tokens:
            return "eager"
        return "piecewise" if has_chunks else "graph"

    def price_step(self, chunks: list[tuple[int, int, int]], batch: int, mean_ctx: float, n_logits: int,
                   stall: list, max_ctx: float | None = None, contexts: Any = None) -> tuple[float, float]:
        """(tuned-kernel seconds over all layers, untuned dense seconds) of one step: its prefill chunks
        [(request, chunk, offset)], `batch` decodes at mean context `mean_ctx` (the longest `max_ctx` and every
        sequence's `contexts`, where known: _decode_s), the MoE over all its tokens at the routing's skew now, and
        the dense ops with `n_logits` rows through the LM head, and each sequence's mixer state read and written once
        (ModelSpec.mixer_state_bytes; over state_ranks data-parallel ranks) (step() charges this, plus the step
        overhead and stalls). The attention kernels are charged once per attention layer, the MoE once per MoE layer
        (ModelSpec.n_attention_layers / n_moe_layers; all num_layers by default), the dense ops per layer kind
        (roofline.dense_step_s)."""
        num_tokens = batch + sum(c for _, c, _ in chunks)
        if num_tokens <= self.graph_max_tokens:
            num_tokens = capture_size(num_tokens)
        kernel_s = 0.0
        if chunks:
            kernel_s += self._chunks_s(chunks, stall)
        if batch:
            kernel_s += self._decode_s(batch, mean_ctx, max_ctx, stall, contexts)
        window_s = self._window_attention_s(chunks, batch, mean_ctx, max_ctx, contexts, stall) if self.window else 0.0
        shares = self.routing.load_shares(self.clock)
        if shares is not self._route_shares:
            self._route_shares = shares
            skew = round(round(self.routing.effective_skew(self.clock) / SKEW_GRID) * SKEW_GRID, 3)
            self._route_stats = (skew, entropy_norm(shares), float(np.max(shares)))
        moe_s = self._kernel_s("fused_moe", ("fused_moe", round_count(num_tokens), self._route_stats[0]), stall)
        dk = (num_tokens, n_logits)
        dense = self._dense_memo.get(dk)
        if dense is None:
            dense = dense_step_s(self.model, num_tokens, n_logits, self.vocab)
            self._dense_memo[dk] = dense
        m = self.model
        if getattr(m, "mixer_state_bytes", 0) and not self.window:  # each sequence reads and writes its state
            dense += 2.0 * m.mixer_state_bytes * -(-(batch + len(chunks)) // self.state_ranks) / COPY_BW
        if m.uniform_layers:  # every layer attention + MoE: one sum x layers, as it always was
            return (kernel_s + moe_s) * m.num_layers, dense
        return kernel_s * m.n_attention_layers + window_s * m.n_mixer_layers + moe_s * m.n_moe_layers, dense

    def _slot(self, kernel: str) -> str:
        """Where the last config of `kernel`'s calls is kept: a windowed layer's calls apart from the full layers', so
        that the two kinds of layer taking turns is not counted as config switches."""
        return kernel + "@window" if self.window_call else kernel

    def _window_attention_s(self, chunks: list[tuple[int, int, int]], batch: int, mean_ctx: float,
                            max_ctx: float | None, contexts: Any, stall: list) -> float:
        """Seconds per windowed layer (ModelSpec.window_tokens) of the step's attention: the same kernels as the full
        layers', over the keys each query sees there. A decode attends to the tokens from its window's start; a chunk
        is priced as the chunk over the prefix with as many (query, key) pairs (_window_chunk), a chunk longer than
        a sliding window as the fresh sequence with as many."""
        m = self.model
        self.call_layers, self.window_call = m.n_mixer_layers, True
        try:
            t = 0.0
            if chunks:
                t += self._chunks_s([(rid, *self._window_chunk(c, o)) for rid, c, o in chunks], stall)
            if batch and contexts is not None:
                ctx = np.asarray(contexts, np.int64)
                ctx = ctx - self._window_skipped(ctx - 1)  # keys from the window's start to the new token
                t += self._decode_s(batch, float(ctx.mean()), float(ctx.max()), stall, ctx)
            elif batch:  # a caller without the batch's contexts: its mean and longest, seen through the window
                seen = [int(c) - int(self._window_skipped(int(c) - 1)) for c in (mean_ctx, max_ctx or mean_ctx)]
                t += self._decode_s(batch, float(seen[0]), float(seen[1]), stall)
            return t
        finally:
            self.call_layers, self.window_call = m.n_attention_layers, False

    def _window_chunk(self, chunk: int, offset: int) -> tuple[int, int]:
        """(chunk, prefix) with the (query, key) pairs of `chunk` queries from position `offset` in a windowed layer,
        each query seeing the keys from its window's start: the prefix that gives the chunk as many pairs, or, where
        even no prefix gives more (a chunk longer than a sliding window), the fresh sequence with as many."""
        pos = np.arange(offset, offset + chunk, dtype=np.int64)
        pairs = int((pos + 1 - self._window_skipped(pos)).sum())
        causal = chunk * (chunk + 1) // 2
        if pairs >= causal:
            return chunk, int(round((pairs - causal) / chunk))
        return round_up16((math.sqrt(1 + 8 * pairs) - 1) / 2), 0

    def step(self) -> bool:
        """Run one engine step (or jump over an idle gap). False when everything is served."""
        arrival = self.arrival
        while self._next < self.n and arrival[self._next] <= self.clock:
            self.waiting.append(self._next)
            self._next += 1
        if not self.dec.size and not self.pref and not self.waiting:
            if self._next >= self.n:
                return False
            self.clock = float(arrival[self._next])
            return True

        kv, pages = self.kv, self.pages
        # decode: every running decode request writes one token; a request whose KV ends on a page boundary needs a page
        if self.dec.size:
            need, state, full, grow = self._decode_demand()
            if not self._fits(full, grow) and self.lru:
                self._evict(full + (0 if self.window_pool_bytes else grow))
            while not self._fits(full, grow):
                self._preempt(self._latest_running())
                need, state, full, grow = self._decode_demand()
            self._take(full, grow)
            pages[self.dec[need]] += 1
            if self.window:
                self.state_held[self.dec] = state
        dec = self.dec
        batch = int(dec.size)
        budget = self.max_tokens - batch
        chunks: list[tuple[int, int, int]] = []  # (request, chunk, offset)
        for rid in self.pref:
            if budget <= 0:
                break
            c = self._fit_chunk(rid, min(int(self.target[rid] - kv[rid]), budget))
            if c > 0:
                chunks.append((rid, c, int(kv[rid])))
                budget -= c
        slots = self.max_seqs - batch - len(self.pref)
        while self.waiting and budget > 0 and slots > 0:
            rid = self.waiting[0]
            if self.hashes is not None:
                self._apply_hits(rid)
            c = self._fit_chunk(rid, min(int(self.target[rid] - kv[rid]), budget))
            if c <= 0:
                if self.hashes is not None:
                    self._unapply_hits(rid)
                break
            self.waiting.popleft()
            self._admit_counter += 1
            self.admit_seq[rid] = self._admit_counter
            self.pref.append(rid)
            chunks.append((rid, c, int(kv[rid])))
            budget -= c
            slots -= 1
        if batch == 0 and not chunks:
            # every running request is a prefill that cannot get a page: free the latest one and retry
            if self.pref:
                self._preempt(self._latest_running())
                return True
            if self.waiting:  # nothing runs and the next request gets no page: it never will (a hang, not a wait)
                raise RuntimeError(f"request {self.waiting[0]} gets no KV page with the pool empty ({self.num_pages} "
                                   f"pages of {self.page_size} tokens beside its mixer state): a larger GPU memory, "
                                   "fewer max_num_batched_tokens or a shorter request")
            return True

        prefill_tokens = sum(c for _, c, _ in chunks)
        num_tokens = batch + prefill_tokens
        stall: list[tuple[float, str]] = self._pending_stalls
        self._pending_stalls = []
        mean_ctx = float(kv[dec].mean()) + 1.0 if batch else 0.0
        max_ctx = float(kv[dec].max()) + 1.0 if batch else 0.0
        completing = [rid for rid, c, _ in chunks if kv[rid] + c >= self.target[rid]]
        n_logits = batch + len(completing)
        kernel_s, dense = self.price_step(chunks, batch, mean_ctx, n_logits, stall, max_ctx,
                                          kv[dec] + 1 if batch else None)
        stall_s = 0.0
        for s, reason in stall:
            stall_s += s
            self.stalls.append((self.clock, s, reason))
        overhead = self.overheads[self.step_kind(bool(chunks), num_tokens)]
        duration = self._step_seconds(kernel_s + dense + overhead + stall_s, chunks, dec)
        t_start = self.clock
        waiting_n = len(self.waiting)
        running_n = batch + len(self.pref)
        occupancy = 1.0 - self.free_pages / self.num_pages
        self.clock = t_end = t_start + duration
        if t_start <= self._window_end:  # overload check: busy time and backlog over the arrival window
            self._busy_in_window += min(t_end, self._window_end) - t_start
            for name, at in (("mid", self._window_mid), ("end", self._window_end)):
                if name not in self._backlog and t_end >= at:
                    self._backlog[name] = float(waiting_n + running_n)
        # requests in the system: those present at the step's start for all of it, plus arrivals during it from their
        # arrival on (they join the waiting queue at the next step)
        lo = self._next
        hi = int(np.searchsorted(arrival, t_end, side="right")) if lo < self.n and arrival[lo] <= t_end else lo
        self.in_system_integral += (waiting_n + running_n) * duration + (
            (hi - lo) * t_end - (self._arrival_cumsum[hi] - self._arrival_cumsum[lo]))

        # effects at the end of the step
        emitted = 0
        if batch:
            kv[dec] += 1
            self.gen[dec] += 1
            emitted += batch
            fin = self.gen[dec] >= self.out[dec]
            if fin.any():
                done_ids = dec[fin]
                self.finish[done_ids] = t_end
                if self.hashes is not None:
                    for rid in done_ids.tolist():
                        self._release(rid)
                else:
                    self._take(-int(pages[done_ids].sum()), -int(self.state_held[done_ids].sum()))
                    pages[done_ids] = 0
                    self.state_held[done_ids] = 0
                self.dec = dec[~fin]
        new_dec = []
        for rid, c, _o in chunks:
            kv[rid] += c
            if self.hashes is not None:
                self._promote(rid)
            if kv[rid] >= self.target[rid]:
                self.pref.remove(rid)
                self.gen[rid] += 1
                emitted += 1
                if math.isnan(self.first_tok[rid]):
                    self.first_tok[rid] = t_end
                if self.gen[rid] >= self.out[rid]:
                    self.finish[rid] = t_end
                    self._release(rid)
                else:
                    new_dec.append(rid)
        if new_dec:
            self.dec = np.concatenate([self.dec, np.asarray(new_dec, dtype=np.int64)])
        self.output_tokens_total += emitted
        self.prefill_tokens_total += prefill_tokens
        tuned = kernel_s
        self.tuned_kernel_total += tuned
        self.stall_total += stall_s

        if self._nsteps >= len(self._log):
            self._log = np.concatenate([self._log, np.zeros_like(self._log)])
        self._log[self._nsteps] = (t_start, duration, batch, mean_ctx, prefill_tokens, num_tokens, waiting_n,
                                   running_n, occupancy, stall_s, tuned, *self._route_stats)
        self._nsteps += 1
        return True

    def _step_seconds(self, predicted_s: float, chunks: list[tuple[int, int, int]], dec: np.ndarray) -> float:
        """The step's duration: the prediction. A live replay (benchmarks/live_e2e/run.py) overrides this to execute the
        step, chunks [(request, chunk, offset)] and decodes `dec` (their KV before this step's token: self.kv), on a
        GPU and return the measured seconds, so the same scheduler serves the trace in real time."""
        return predicted_s

    def _fit_chunk(self, rid: int, want: int) -> int:
        """Shrink a prefill chunk to the pages that are free, allocate them, return the chunk (0 = no room)."""
        if want <= 0:
            return 0
        ps = self.page_size
        have = int(self.pages[rid])
        own = int(self.kv[rid] - self.base[rid])  # tokens in the request's own pages (past its shared blocks)
        kv, held = int(self.kv[rid]), int(self.state_held[rid])
        state = int(self._state_need(kv, kv + want)) - held  # the state's growth, if any
        if self.window_pool_bytes:  # the window's blocks come from a pool of their own
            if self.lru:
                self._evict(-(-(own + want) // ps) - have)
            room = min((have + self.free_pages) * ps - own,
                       (held + self.free_window + int(self._window_skipped(kv)) // ps) * ps - kv)
        else:
            if self.lru:
                self._evict(-(-(own + want) // ps) - have + state)
            room = (have + self.free_pages - state) * ps - own
            if self.window and room < want:  # the window's blocks grow with the chunk: the longest chunk that fits
                lo, hi = max(room, 0), want
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    cost = -(-(own + mid) // ps) - have + int(self._state_need(kv, kv + mid)) - held
                    lo, hi = (mid, hi) if cost <= self.free_pages else (lo, mid - 1)
                room = lo
        c = min(want, room)
        if c <= 0:
            return 0
        need = -(-(own + c) // ps) - have
        now = int(self._state_need(kv, kv + c))  # no more than for the whole `want` (the window grows with it)
        self.pages[rid] = have + need
        self._take(need, now - held)
        self.state_held[rid] = now
        return c

    def _decode_demand(self) -> tuple[np.ndarray, Any, int, int]:
        """(decodes whose token starts a new page, their mixer state after the token, KV pages the step takes, the
        state's growth, net): a windowed mixer's blocks grow with the token and fall as its window moves past one."""
        kv = self.kv[self.dec]
        need = kv % self.page_size == 0
        if not self.window:
            return need, None, int(np.count_nonzero(need)), 0
        state = self._state_need(kv, kv + 1)
        return need, state, int(np.count_nonzero(need)), int((state - self.state_held[self.dec]).sum())

    # ---- driving ----

    def run_until(self, t_s: float) -> IntervalStats:
        """Advance to simulated time t_s (the last step may end a little past it). Returns what the interval did."""
        t0 = self.clock
        steps0, out0, pre0 = self._nsteps, self.output_tokens_total, self.prefill_tokens_total
        stall0, tuned0, stalls0 = self.stall_total, self.tuned_kernel_total, len(self.stalls)
        fin0 = int(np.count_nonzero(~np.isnan(self.finish)))
        while self.clock < t_s:
            if self.done:
                break
            if not self.dec.size and not self.pref and not self.waiting and self._next < self.n \
                    and self.arrival[self._next] > t_s:
                self.clock = float(t_s)  # idle through the rest of the interval
                break
            self.step()
        return IntervalStats(
            t0, self.clock, self._nsteps - steps0, self.output_tokens_total - out0, self.prefill_tokens_total - pre0,
            self.stall_total - stall0, self.tuned_kernel_total - tuned0,
            int(np.count_nonzero(~np.isnan(self.finish))) - fin0, self.stalls[stalls0:],
        )

    def run(self) -> SimResult:
        """Replay every request to completion."""
        while self.step():
            pass
        return self.result()

    @property
    def step_log(self) -> np.ndarray:
        """[num_steps, len(STEP_COLUMNS)] so far (a view: copy before keeping)."""
        return self._log[: self._nsteps]

    def result(self) -> SimResult:
        log = self._log[: self._nsteps].copy()
        res = SimResult(
            self.arrival.copy(), self.prompt.copy(), self.out.copy(), self.gen.copy(), self.first_tok.copy(),
            self.finish.copy(), self.preempts.copy(), log,
            {k: {str(c): n for c, n in v.items()} for k, v in self.configs_used.items()},
            list(self.switch_log), list(self.stalls), {},
        )
        res.summary = self._summary(res)
        res.warnings = self._overload_warnings(res.summary)
        for text in res.warnings:
            warnings.warn(text, OverloadWarning, stacklevel=2)
        return res

    def _overload_warnings(self, summary: dict[str, float]) -> list[str]:
        """A warning when the server was busy nearly all of the arrival window and the requests in the system grew
        over its second half: the trace offers more load than the server sustains, so latencies depend on the
        window's length rather than on the configs."""
        span = self._window_end - float(self.arrival[0])
        summary["overloaded"] = 0.0
        if span <= 0 or "end" not in self._backlog:
            return []
        util = self._busy_in_window / span
        mid, end = self._backlog.get("mid", 0.0), self._backlog["end"]
        arrived = int(np.count_nonzero(self.arrival > self._window_mid))  # arrivals over the window's second half
        growth = end - mid
        summary["window_utilisation"] = util
        summary["backlog_at_last_arrival"] = end
        summary["offered_over_served"] = arrived / max(arrived - growth, 1.0) if growth > 0 else 1.0
        if util < OVERLOAD_UTILISATION or growth <= max(8.0, OVERLOAD_GROWTH * arrived):
            return []
        summary["overloaded"] = 1.0
        return [f"offered load exceeds what the server sustains: busy {util:.0%} of the {span:.1f} s arrival window; "
                f"over its second half {arrived} requests arrived and the requests in the system grew from {mid:.0f} "
                f"to {end:.0f} (requests offered / requests completed over that half ~ "
                f"{summary['offered_over_served']:.2f}); TTFT grows with the "
                "window's length: lower the arrival rate (--rate-scale; Trace.scale_rate in Python) or shorten the "
                "window (--window)"]

    def _summary(self, r: SimResult) -> dict[str, float]:
        done = ~np.isnan(r.finish_s)
        span_start = float(r.arrival_s[0])
        span_end = float(np.nanmax(r.finish_s)) if done.any() else self.clock
        span = max(span_end - span_start, 1e-12)
        dur = r.steps[:, _C["duration_s"]]
        busy = float(dur.sum()) if len(dur) else 0.0
        tw = lambda col: float((r.steps[:, _C[col]] * dur).sum() / busy) if busy > 0 else 0.0
        ttft, e2e, tpot = r.ttft_s[done], r.e2e_s[done], r.tpot_s[done]
        tpot = tpot[~np.isnan(tpot)]
        q = lambda x, p: float(np.percentile(x, p)) if len(x) else float("nan")
        in_sys = self.in_system_integral / span  # time-averaged number in system (idle gaps count as 0)
        return {
            "requests": float(len(r.arrival_s)),
            "finished": float(done.sum()),
            "sim_time_s": span,
            "steps": float(len(dur)),
            "output_tokens": float(r.generated_tokens.sum()),
            "tokens_per_s": float(r.generated_tokens.sum()) / span,
            "prefill_tokens": float(self.prefill_tokens_total),
            "recomputed_tokens": float(self.recomputed_tokens),
            "preemptions": float(self.num_preemptions),
            "ttft_p50_s": q(ttft, 50),
            "ttft_p99_s": q(ttft, 99),
            "tpot_p50_s": q(tpot, 50),
            "tpot_p99_s": q(tpot, 99),
            "e2e_p50_s": q(e2e, 50),
            "e2e_p99_s": q(e2e, 99),
            "e2e_mean_s": float(e2e.mean()) if len(e2e) else float("nan"),
            "tuned_kernel_s": float(self.tuned_kernel_total),
            "decode_longest_s": float(self.decode_longest_s),
            "decode_waves_s": float(self.decode_waves_s),
            "decode_waves_steps": float(self.decode_waves_steps),
            "decode_waves_untimed_s": float(self.decode_waves_untimed_s),
            "decode_waves_sibling_configs": float(sum(v is not None for v in self.decode_waves_siblings.values())),
            "stall_s": float(self.stall_total),
            "busy_s": busy,
            "configs_used": float(sum(len(v) for v in r.configs_used.values())),
            "config_switches": float(len(r.switch_log)),
            "kv_occupancy_mean": tw("kv_occupancy"),
            "kv_occupancy_max": float(r.steps[:, _C["kv_occupancy"]].max()) if len(dur) else 0.0,
            "queue_len_mean": tw("waiting"),
            "in_system_mean": in_sys,
            "kv_pages": float(self.num_pages),
            "page_size": float(self.page_size),
            "chunk_attention_measured_s": self.chunk_measured_s,
            "chunk_attention_estimated_s": self.chunk_estimated_s,
            **self._prefix_summary(),
        }

    def _prefix_summary(self) -> dict[str, float]:
        if self.hashes is None:
            return {}
        st = self.prefix_stats
        lookup = st["lookup_tokens"]
        return {
            "prefix_hit_rate": st["hit_tokens"] / lookup if lookup else 0.0,
            "prefix_hit_tokens": float(st["hit_tokens"]),
            "prefix_resume_hit_tokens": float(st["resume_hit_tokens"]),
            "prefix_cached_blocks_max": float(st["cached_blocks_max"]),
            "prefix_evicted_blocks": float(st["evicted_blocks"]),
            "prefix_block_tokens": float(self.block_tokens),
        }
