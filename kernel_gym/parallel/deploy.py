"""A serving deployment on N GPUs: replicas x layout (TP / EP / DP) plus the engine knobs that decide goodput, its
memory check, its launch arguments for vLLM 0.34 or 0.33 / SGLang 0.5.23, and its goodput at a TTFT/TPOT SLO from
the layout-aware simulator (step_time.py).

Why these knobs: at a fixed GPU count, the split of the model (how many replicas, tensor vs expert parallelism
inside one), the KV block size, the chunked-prefill token budget per step, the number of running sequences and the
CUDA-graph sizes decide how many requests meet their SLO; a tile size moves it by a few percent.

Pricing (`DeploymentPricer.serve`): one replica's share of the requests (round-robin, every R-th request) through
`ParallelSimulator` under the deployment's layout and knobs, its goodput scaled to all the served requests (x R
where R divides them; identical replicas behind a round-robin balancer). Memory per GPU: weights of the layout +
activations of one max-size step + CUDA-graph buffers (ACTIVATION / GRAPH estimates below, labelled) must leave a
KV pool that holds the longest request served.

Engine facts used (read from the vLLM 0.33.0 / 0.34.0 and SGLang 0.5.23 wheels, 2026-12; `--engine-version` picks the
release, default the newest):
- vLLM on a >= 70 GiB GPU below 160 GiB (H200): --max-num-batched-tokens 8192 (OpenAI server), --max-num-seqs 1024,
  CUDA-graph capture sizes up to 512 tokens (piecewise graphs: mixed prefill + decode steps of up to that many tokens
  replay a graph; 0.34 deprecates --max-cudagraph-capture-size but still takes it, and on a Hopper GPU resolves the
  same sizes from it). MoE layouts: --tensor-parallel-size T (experts sliced T ways) or --data-parallel-size D
  --enable-expert-parallel (attention data-parallel, whole experts per GPU); experts sliced inside expert-parallel
  groups is not a vLLM layout, so mixed TPxEP is masked for vLLM.
- vLLM 0.33: --block-size 16 (CacheConfig.DEFAULT_BLOCK_SIZE); the KV cache takes --gpu-memory-utilization 0.92 of
  the GPU less weights and the profiled activations.
- vLLM 0.34: --block-size 64 (DEFAULT_BLOCK_SIZE, where the attention backend takes it, as FlashAttention does);
  the KV cache is sized from the memory free after warm-up (the "extensible" cache, default on CUDA): all of it less
  the activation peak and a margin of max(1 GiB, 0.75 x that peak) (v1/worker/extensible_kv_cache.py).
- SGLang on an H20 / H200 class GPU (90-160 GB): --chunked-prefill-size 8192, --cuda-graph-max-bs 256 below tp 4,
  else 512 (decode-only batches), --page-size 1, --max-running-requests derived from the KV pool.
  Layouts: --tp G [--ep E --dp E --enable-dp-attention] expresses every TP x EP split.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernel_gym.measure import resolve_backend
from kernel_gym.measure.coverage import cover
from kernel_gym.modelspec import WINDOWED_MIXERS, window_pool_bytes
from kernel_gym.parallel.collectives import resolve_table
from kernel_gym.parallel.layout import Layout, attention_spec, gpu_weight_bytes, layouts_for, why_invalid
from kernel_gym.parallel.step_time import ParallelSimulator, StepPricer, goodput
from kernel_gym.traffic.routing import uniform_for
from kernel_gym.traffic.simulator import GPU_MEMORY_UTILIZATION, H200_MEMORY_BYTES, KVLayout

ENGINES = ("vllm", "sglang")
ENGINE_VERSIONS = {"vllm": "0.34.0", "sglang": "0.5.23"}  # the default release of each engine
ENGINE_RELEASES = {"vllm": ("0.33.0", "0.34.0"), "sglang": ("0.5.23",)}  # the releases whose facts are modelled
# the knob grids the agent and the search choose from (engine defaults need not lie on them)
BLOCK_SIZES = (16, 32, 64, 128)  # decode kernels are measured at these page sizes
BATCHED_TOKENS = (2048, 4096, 8192, 16384)
MAX_SEQS = (64, 128, 256, 512, 1024)
GRAPH_MAX = (0, 256, 512)  # 0 = eager (vLLM --enforce-eager, SGLang --disable-cuda-graph)
KNOBS = {"block_size": BLOCK_SIZES, "max_batched_tokens": BATCHED_TOKENS, "max_seqs": MAX_SEQS,
         "graph_max": GRAPH_MAX}
MAX_MODEL_LEN = 32768  # requests longer than this (prompt + output) are refused by the engine, not served
# Memory the engines keep outside weights and KV (estimates, not measurements): activations of one step of
# max_batched_tokens tokens (hidden states, the top-k MoE intermediates of the GPU's shard, logits of the step's
# sequences are small) and CUDA-graph buffers (SGLang's own rule of thumb: about 2 MB per captured batch size).
GRAPH_BYTES_PER_BS = 2e6
VLLM_033_MEMORY_UTILIZATION = 0.92  # vLLM 0.33.0's --gpu-memory-utilization default (vllm/config/cache.py, CacheConfig)
VLLM_KV_MARGIN_FLOOR_BYTES, VLLM_KV_MARGIN_FRACTION = float(1 << 30), 0.75  # vLLM 0.34's extensible-cache margin
SGLANG_PAGE_PRICED = 16  # SGLang's default --page-size 1 is priced at the smallest measured decode page (16)
SGLANG_AUTO_RUNNING = 4096  # --max-running-requests left to SGLang: priced as this cap (the KV pool limits it too)
# SGLang 0.5.23's --mamba-full-memory-ratio default (arg_groups/fields/schedule.py): a hybrid model's mixer state gets
# a pool of its own, ratio / (1 + ratio) of the memory left after weights (mem_cache/kv_cache_configurator.py)
SGLANG_MAMBA_FULL_MEMORY_RATIO = 0.9
# ... and the state slots one running request takes there (kv_cache_configurator._calculate_mamba_ratio: 3, plus 2 for
# the "extra_buffer" radix-cache strategy of the Gated DeltaNet and Mamba-2 architectures: overrides.py
# _MAMBA_EXTRA_BUFFER_ARCHS, Qwen3-Next / 3.5, Kimi-Linear, Nemotron-H, Granite-4.0-H; keyed here by ModelSpec.mixer)
SGLANG_MAMBA_SLOTS_PER_REQUEST = 3
SGLANG_EXTRA_BUFFER_SLOTS = {"gated-deltanet": 2, "mamba2": 2}
# SGLang 0.5.23's --swa-full-tokens-ratio default (arg_groups/fields/schedule.py, fallback 0.8): a model with sliding
# or chunked local attention layers (model_config.is_hybrid_swa_model: Llama-4, gpt-oss) holds their KV in a pool of
# its own with this many tokens per token of the full-attention layers' pool (model_executor/pool_configurator.py)
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8


@dataclass(frozen=True, order=True)
class Deployment:
    """What an engine launch fixes: `replicas` identical servers, each a Layout(tp, ep) on tp x ep GPUs, and the
    engine knobs (block_size: vLLM --block-size / SGLang --page-size; max_batched_tokens: --max-num-batched-tokens /
    --chunked-prefill-size; max_seqs: --max-num-seqs / --max-running-requests; graph_max: the largest CUDA-graph
    size, tokens for vLLM, decode batch for SGLang, 0 = eager)."""

    engine: str  # "vllm" / "sglang"; given as a release ("vllm-0.33.0") it is split into engine and version
    replicas: int
    tp: int
    ep: int
    block_size: int
    max_batched_tokens: int
    max_seqs: int
    graph_max: int
    version: str = ""  # the engine release (ENGINE_RELEASES); "" = ENGINE_VERSIONS' default

    def __post_init__(self) -> None:
        name, version = split_engine(self.engine if not self.version else f"{self.engine}-{self.version}")
        object.__setattr__(self, "engine", name)
        object.__setattr__(self, "version", version)
        for f in ("replicas", "tp", "ep", "block_size", "max_batched_tokens", "max_seqs"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"Deployment.{f} must be a positive integer, got {getattr(self, f)!r}")
        if not isinstance(self.graph_max, int) or self.graph_max < 0:
            raise ValueError(f"Deployment.graph_max must be an integer >= 0, got {self.graph_max!r}")

    @property
    def layout(self) -> Layout:
        return Layout(self.tp, self.ep)

    @property
    def gpus(self) -> int:
        return self.replicas * self.tp * self.ep

    @property
    def layout_name(self) -> str:
        return f"{self.replicas}x{self.layout.name}" if self.replicas > 1 else self.layout.name

    @property
    def name(self) -> str:
        """The launch in one token, release included: the same knobs mean other defaults under another release."""
        return (f"{self.engine}-{self.version}:{self.layout_name}:bs{self.block_size}:mbt{self.max_batched_tokens}:"
                f"seqs{self.max_seqs}:graph{self.graph_max}")

    def knobs(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in KNOBS}

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "gpus": self.gpus, "layout": self.layout_name}


def split_engine(engine: str) -> tuple[str, str]:
    """'vllm' / 'vllm-0.33.0' / 'vllm==0.33.0' / 'sglang' -> (engine, version): the release's facts must be modelled
    (ENGINE_RELEASES)."""
    raw = str(engine).strip().lower().replace("==", "-")
    name, _, version = raw.partition("-")
    if name not in ENGINES:
        raise ValueError(f"engine {engine!r} is not one of {list(ENGINES)}")
    version = version or ENGINE_VERSIONS[name]
    if version not in ENGINE_RELEASES[name]:
        raise ValueError(f"engine {engine!r}: kernel_gym models the serving defaults of {name} "
                         f"{', '.join(ENGINE_RELEASES[name])}; pass --engine-version with one of them (the closest "
                         "to yours), and set the knobs whose defaults changed explicitly in your launch")
    return name, version


def _release(engine: str) -> tuple[int, ...]:
    return tuple(int(x) for x in split_engine(engine)[1].split("."))


def engine_knobs(engine: str, tp: int = 1) -> dict[str, int]:
    """The engine release's own defaults on an H200 (module docstring), as Deployment knobs."""
    name, _ = split_engine(engine)
    if name == "vllm":
        return {"block_size": 64 if _release(engine) >= (0, 34) else 16, "max_batched_tokens": 8192,
                "max_seqs": 1024, "graph_max": 512}
    return {"block_size": 1, "max_batched_tokens": 8192, "max_seqs": SGLANG_AUTO_RUNNING,
            "graph_max": 256 if tp < 4 else 512}


def layout_choices(gpus: int) -> list[tuple[int, Layout]]:
    """Every (replicas, layout) that uses all `gpus` GPUs: replicas R dividing gpus, layouts_for(gpus / R)."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    return [(r, lay) for r in range(1, gpus + 1) if gpus % r == 0 for lay in layouts_for(gpus // r)]


def engine_default(spec: Any, engine: str, gpus: int, max_model_len: int = MAX_MODEL_LEN) -> Deployment | None:
    """What a user gets launching the engine on all G GPUs without tuning: one server, --tensor-parallel-size G
    (--tp G), every knob at the engine's default; the smallest TP that divides the model when G does not. None when
    no tensor-parallel server launches (a model only expert parallelism fits)."""
    for r, lay in layout_choices(gpus):  # the first that launches under the release's own memory rule
        dep = Deployment(engine, r, lay.tp, 1, **engine_knobs(engine, lay.tp))
        if lay.ep == 1 and not why_invalid_deployment(spec, dep, max_model_len):
            return dep
    return None


def hand_picked(spec: Any, engine: str, gpus: int, max_model_len: int = MAX_MODEL_LEN) -> dict[str, Deployment]:
    """The layouts users pick by hand, engine-default knobs: TP = G, DP + EP = G, and as many replicas of the
    smallest tensor-parallel server that fits (e.g. 8 x TP1 for a model that fits one GPU)."""
    out: dict[str, Deployment] = {}
    cands = {"tp_all": (1, Layout(gpus, 1)), "ep_all": (1, Layout(1, gpus))}
    for r, lay in sorted(layout_choices(gpus), key=lambda x: -x[0]):  # judged by the release's own memory rule
        if lay.ep == 1 and not why_invalid_deployment(spec, Deployment(engine, r, lay.tp, 1,
                                                                       **engine_knobs(engine, lay.tp)), max_model_len):
            cands["replicas"] = (r, lay)
            break
    for name, (r, lay) in cands.items():
        d = Deployment(engine, r, lay.tp, lay.ep, **engine_knobs(engine, lay.tp))
        if not why_invalid_deployment(spec, d, max_model_len):
            out[name] = d
    return out


def reserve_bytes(spec: Any, dep: Deployment) -> float:
    """Per-GPU bytes outside weights and KV: one step's activations + CUDA-graph buffers (estimates), plus, for vLLM
    0.34's cache sized after warm-up, its margin of max(1 GiB, 0.75 x the activation peak)."""
    tokens = dep.max_batched_tokens
    act = tokens * (6 * spec.hidden + 3 * spec.top_k * spec.intermediate // dep.tp) * spec.activation_bytes
    margin = (max(VLLM_KV_MARGIN_FLOOR_BYTES, VLLM_KV_MARGIN_FRACTION * act)
              if dep.engine == "vllm" and _release(f"vllm-{dep.version}") >= (0, 34) else 0.0)
    return act + margin + GRAPH_BYTES_PER_BS * dep.graph_max


def memory_utilization(dep: Deployment) -> float:
    """The share of the GPU's memory the release gives weights, activations and KV: vLLM 0.33's
    --gpu-memory-utilization default, all of it for vLLM 0.34 (its margin is in reserve_bytes), SGLang as elsewhere
    (GPU_MEMORY_UTILIZATION)."""
    if dep.engine == "vllm":
        return 1.0 if _release(f"vllm-{dep.version}") >= (0, 34) else VLLM_033_MEMORY_UTILIZATION
    return GPU_MEMORY_UTILIZATION


def gpu_memory_for(spec: Any, dep: Deployment) -> float:
    """The `gpu_memory_bytes` the simulator gets (with `memory_utilization(dep)`): the H200's memory less the reserve,
    so that weights and KV share the rest."""
    return H200_MEMORY_BYTES - reserve_bytes(spec, dep) / memory_utilization(dep)


VLLM_KERNEL_BLOCK = 16  # the smallest block vLLM's FlashAttention and Triton backends take (MultipleOf(16))
VLLM_MLA_HYBRID_BLOCK = 128  # ... and what it raises that to for an MLA model with a mixer state
# Gated DeltaNet's prefill checkpoints (FlashInfer's GDN prefill, vLLM's choice on Hopper) in the "align" cache mode
# that prefix caching (on by default) puts hybrid models in: v1/attention/backends/gdn_attn.py
VLLM_GDN_CHECKPOINT_ALIGN = 64


def engine_block_tokens(spec: Any, dep: Deployment) -> int:
    """The KV-cache block the engine allocates, in tokens: `dep.block_size`, except where vLLM raises it. For a model
    with a recurrent mixer state (ModelSpec.mixer: Mamba, Gated DeltaNet, lightning attention), vLLM 0.33-0.34
    (platforms/interface.py, _align_hybrid_block_size) makes one layer's block of attention KV at least one layer's
    state, both at the GPU's shard: a = max(16, block_size) (at least 128 for MLA; for Gated DeltaNet a multiple of its
    64-token prefill checkpoints, as prefix caching is on), block = a x ceil(state bytes / (a x KV bytes per token));
    the state is padded to that block. Qwen3-Next on one GPU: 576 tokens. SGLang holds the state in a pool of its own,
    and its page is the knob."""
    per = attention_spec(spec, dep.layout)
    if dep.engine != "vllm" or not _recurrent_state(per):
        return dep.block_size
    align = max(VLLM_KERNEL_BLOCK, dep.block_size, VLLM_MLA_HYBRID_BLOCK if per.attention == "mla" else 0)
    if per.mixer == "gated-deltanet":
        align = math.lcm(align, VLLM_GDN_CHECKPOINT_ALIGN)
    per_token = per.kv_bytes_per_token // per.n_attention_layers  # one attention layer's KV of one token
    block = align * -(-per.mixer_page_bytes // (align * per_token))
    return max(dep.block_size, VLLM_KERNEL_BLOCK * -(-block // VLLM_KERNEL_BLOCK))


def _recurrent_state(spec: Any) -> bool:
    """A fixed-size state per request in layers without full attention, not a window's KV (WINDOWED_MIXERS)."""
    return bool(spec.mixer_state_bytes and spec.n_mixer_layers and spec.mixer not in WINDOWED_MIXERS)


def state_slots_per_request(spec: Any) -> int:
    """State slots of SGLang's mamba pool that one running request takes (SGLANG_MAMBA_SLOTS_PER_REQUEST)."""
    return SGLANG_MAMBA_SLOTS_PER_REQUEST + SGLANG_EXTRA_BUFFER_SLOTS.get(spec.mixer, 0)


def state_pool_share(spec: Any, dep: Deployment) -> float:
    """The share of the memory left after weights that holds the mixer state apart from the KV cache: SGLang's mamba
    pool for a model with a recurrent state (SGLANG_MAMBA_FULL_MEMORY_RATIO); 0 where the state shares the KV pool
    (vLLM's hybrid allocator, a sliding window's KV)."""
    if dep.engine != "sglang" or not _recurrent_state(spec):
        return 0.0
    return SGLANG_MAMBA_FULL_MEMORY_RATIO / (1.0 + SGLANG_MAMBA_FULL_MEMORY_RATIO)


def window_pool_ratio(spec: Any, dep: Deployment) -> float:
    """Tokens of a windowed mixer's own KV pool per token of the full layers' (SGLang's hybrid SWA pool,
    SGLANG_SWA_FULL_TOKENS_RATIO); 0 where one pool holds both (vLLM's hybrid allocator) or there is no window."""
    return SGLANG_SWA_FULL_TOKENS_RATIO if dep.engine == "sglang" and spec.window_tokens else 0.0


def kv_tokens_per_rank(spec: Any, dep: Deployment) -> int:
    """Tokens of KV cache one data-parallel rank holds for one request (a request lives on one rank), beside that
    request's mixer state (ModelSpec.mixer_state_bytes), both in whole blocks (engine_block_tokens); where the state
    has a pool of its own (SGLang: state_pool_share), the KV pool's share, and 0 where that pool holds no state; where
    a window's KV has one (SGLang: window_pool_ratio), the full layers' share, and 0 where the window's does not hold
    one window."""
    per_gpu = attention_spec(spec, dep.layout)
    block = engine_block_tokens(spec, dep)
    block_bytes = block * per_gpu.kv_bytes_per_token
    free = max(0.0, gpu_memory_for(spec, dep) * memory_utilization(dep) - gpu_weight_bytes(spec, dep.layout))
    share, ratio = state_pool_share(spec, dep), window_pool_ratio(spec, dep)
    if ratio:  # the window's KV has a pool of its own, ratio x as many tokens as the full layers', holding one window
        window_pool = window_pool_bytes(per_gpu, free, ratio)
        tokens = (free - window_pool) / per_gpu.kv_bytes_per_token
        return int(tokens // block) * block if ratio * tokens >= per_gpu.window_tokens + block else 0
    if share:  # the state has a pool of its own, which must hold one request's slots
        slots = state_slots_per_request(spec) * per_gpu.mixer_state_bytes
        return int(free * (1.0 - share) // block_bytes) * block if free * share >= slots else 0
    blocks = int(free // block_bytes) - -(-per_gpu.mixer_state_bytes // block_bytes)
    return max(0, blocks) * block


def why_invalid_deployment(spec: Any, dep: Deployment, max_model_len: int = MAX_MODEL_LEN) -> str:
    """'' when the deployment launches and holds a `max_model_len` request, else the reason (the action mask)."""
    lay = dep.layout
    why = why_invalid(spec, lay, lay.gpus)
    if why:
        return why
    if dep.engine == "vllm" and lay.tp > 1 and lay.ep > 1:
        return (f"{lay}: vLLM places experts expert-parallel over TP x DP (--enable-expert-parallel) or sliced "
                "over TP; experts sliced inside expert-parallel groups is SGLang's --tp/--ep layout")
    kv = kv_tokens_per_rank(spec, dep)
    if kv < max_model_len:
        return (f"{dep.layout_name}: {kv} KV tokens per rank after weights "
                f"({gpu_weight_bytes(spec, lay) / 1e9:.0f} GB) and a {dep.max_batched_tokens}-token step's "
                f"activations do not hold one {max_model_len}-token request")
    return ""


def launch_commands(dep: Deployment, model_id: str, max_model_len: int = MAX_MODEL_LEN, spec: Any = None) -> list[str]:
    """The engine launch per replica (flag names of vLLM 0.33-0.34 / SGLang 0.5.23); replicas on disjoint GPUs behind
    any round-robin balancer. The context limit the deployment was sized and replayed with is passed: without it the
    engine takes the model's own (often 128k-256k), and refuses to start where the KV cache holds less. With `spec`,
    the block size is the one the engine runs (engine_block_tokens): the replay's, and vLLM's own for a hybrid model."""
    g = dep.tp * dep.ep
    block = dep.block_size if spec is None else engine_block_tokens(spec, dep)
    out = []
    for r in range(dep.replicas):
        devs = ",".join(str(i) for i in range(r * g, (r + 1) * g))
        env = f"CUDA_VISIBLE_DEVICES={devs} " if dep.replicas > 1 or g > 1 else "CUDA_VISIBLE_DEVICES=0 "
        if dep.engine == "vllm":
            par = (f"--tensor-parallel-size {dep.tp}" if dep.ep == 1 else
                   f"--tensor-parallel-size 1 --data-parallel-size {dep.ep} --enable-expert-parallel")
            graph = "--enforce-eager" if dep.graph_max == 0 else f"--max-cudagraph-capture-size {dep.graph_max}"
            cmd = (f"vllm serve {model_id} {par} --block-size {block} --max-num-batched-tokens "
                   f"{dep.max_batched_tokens} --max-num-seqs {dep.max_seqs} --max-model-len {max_model_len} {graph} "
                   f"--port {8000 + r}")
        else:
            par = f"--tp {g}" if dep.ep == 1 else f"--tp {g} --ep {dep.ep} --dp {dep.ep} --enable-dp-attention"
            graph = "--disable-cuda-graph" if dep.graph_max == 0 else f"--cuda-graph-max-bs {dep.graph_max}"
            cmd = (f"python -m sglang.launch_server --model-path {model_id} {par} --page-size {dep.block_size} "
                   f"--chunked-prefill-size {dep.max_batched_tokens} --max-running-requests {dep.max_seqs} "
                   f"--context-length {max_model_len} {graph} --port {30000 + r}")
        out.append(env + cmd)
    return out


def moe_config_files(spec: Any, dep: Deployment, device: str = "NVIDIA H200") -> list[dict[str, Any]]:
    """The fused-MoE config files the engine reads for this layout: local experts E / ep, N = intermediate / tp
    (vLLM: E=..,N=..,device_name=...json in VLLM_TUNED_CONFIG_FOLDER; SGLang: the same name under
    SGLANG_MOE_CONFIG_DIR/configs/triton_X_Y_Z/)."""
    from kernel_gym.kernels.vllm_tables import config_file_name

    e_local, n = spec.num_experts // dep.ep, spec.intermediate // dep.tp
    # the engines' own naming (device name rules, the dtype part): an fp8 model's file is the fp8_w8a8 one, with the
    # checkpoint's weight blocks where it has them
    dtype = {4: "float32", 1: "fp8_w8a8"}.get(spec.dtype_bytes, "bfloat16")
    block = (spec.fp8_block_n, spec.fp8_block_k) if getattr(spec, "fp8_block_n", 0) else None
    name = config_file_name(e_local, n, device, dtype, block_shape=block, engine=dep.engine)
    if getattr(spec, "expert_quant", ""):  # another MoE kernel reads its own file, or none (plan says which)
        name = f"none for {spec.expert_quant} experts (not {name})"
    return [{"file": name, "local_experts": e_local, "N": n, "engine_env":
             "VLLM_TUNED_CONFIG_FOLDER" if dep.engine == "vllm" else "SGLANG_MOE_CONFIG_DIR"}]


class _Merged:
    """Per-request arrays of several replicas' results, enough for step_time.goodput."""

    def __init__(self, results: list[Any]) -> None:
        cat = lambda f: np.concatenate([getattr(r, f) for r in results])  # noqa: E731
        self.arrival_s, self.finish_s, self.generated_tokens = cat("arrival_s"), cat("finish_s"), \
            cat("generated_tokens")
        self.ttft_s, self.tpot_s = cat("ttft_s"), cat("tpot_s")
        order = np.argsort(self.arrival_s, kind="stable")
        for f in ("arrival_s", "finish_s", "generated_tokens", "ttft_s", "tpot_s"):
            setattr(self, f, getattr(self, f)[order])


class DeploymentPricer:
    """Goodput of deployments on one model's traffic, with the layouts' StepPricers memoised across knobs."""

    def __init__(self, spec: Any, backend: Any = "recorded", table: Any = None, routing: Any = None,
                 max_model_len: int = MAX_MODEL_LEN) -> None:
        self.spec = spec
        self.backend = cover(resolve_backend(backend))
        self._table_arg = table
        self._table = None
        self.routing = routing if routing is not None else uniform_for(spec)
        self.max_model_len = int(max_model_len)
        self._pricers: dict[Layout, StepPricer] = {}
        self.evaluations = 0

    @property
    def table(self) -> Any:
        if self._table is None:
            self._table = resolve_table(self._table_arg)
        return self._table

    def pricer(self, layout: Layout) -> StepPricer:
        p = self._pricers.get(layout)
        if p is None:
            table = None if layout.gpus == 1 else self.table
            p = self._pricers[layout] = StepPricer(self.spec, layout, self.backend, table, roofline_missing=True)
        return p

    def serve(self, requests: Any, dep: Deployment, ttft_slo_s: float, tpot_slo_s: float,
              span_s: float | None = None) -> dict[str, Any]:
        """Goodput at the SLO of `requests` under `dep` (module docstring), with the share of the step time resting
        on estimates (kernels and collectives interpolated or scaled) and on the collectives prior. span_s: the
        window's length, where known (step_time.goodput)."""
        why = why_invalid_deployment(self.spec, dep, self.max_model_len)
        if why:
            raise ValueError(f"{dep.name}: {why}")
        arr = np.asarray(requests.arrival_s)
        prompt, out = np.asarray(requests.prompt_tokens), np.asarray(requests.output_tokens)
        keep = prompt + out <= self.max_model_len
        idx = np.flatnonzero(keep)[:: dep.replicas]  # replica 0's share, round-robin over the served requests
        refused = int((~keep).sum())
        span_req = len(arr)
        if len(idx) == 0:
            need = int((prompt + out).min())
            raise ValueError(f"{dep.name}: none of the window's {len(arr)} requests fits max_model_len "
                             f"{self.max_model_len} (prompt + output tokens; the shortest has {need}): raise the "
                             f"limit to at least {need} (kernel-gym plan --max-model-len {need}) or replay a window "
                             "of shorter requests")
        from kernel_gym.traffic.traces import Trace

        sub = Trace("replica0", arr[idx], prompt[idx], out[idx])
        lay = dep.layout
        pricer = self.pricer(lay)
        pricer.reset_counts()
        page = max(dep.block_size, SGLANG_PAGE_PRICED) if dep.engine == "sglang" else dep.block_size
        graph = ("tokens" if dep.engine == "vllm" else "decode", dep.graph_max)
        block = engine_block_tokens(self.spec, dep)
        sim = ParallelSimulator(self.spec, sub, lay, pricer, self.routing, gpu_memory_bytes=gpu_memory_for(
            self.spec, dep), gpu_memory_utilization=memory_utilization(dep), graph=graph,
            kv_layout=KVLayout(page, "NHD"), kv_block_tokens=block,
            state_pool_share=state_pool_share(self.spec, dep),
            state_slots_per_request=state_slots_per_request(self.spec),
            window_pool_ratio=window_pool_ratio(self.spec, dep),
            max_num_batched_tokens=dep.max_batched_tokens, max_num_seqs=dep.max_seqs)
        res = sim.run()
        self.evaluations += 1
        g = goodput(_Merged([res]), ttft_slo_s, tpot_slo_s, span_s)
        rep = pricer.report_all_layers()  # each part over the layers that run it
        busy = res.summary["busy_s"]
        parts, prior_s = rep["step_parts_s"], rep["prior_s"]
        est_s = rep["estimated_share"] * parts
        r = int(keep.sum()) / len(idx)  # served requests per replayed one: R when R divides them, less otherwise
        # ... and output tokens per replayed token: one replica's share of a heavy-tailed window's tokens is not 1 / R
        # of them (scaling by r read 65.6 and 72.9 good tokens/s at 2 and 4 replicas where all 54.4 were served)
        r_tok = float(out[keep].sum()) / max(float(out[idx].sum()), 1.0)
        return {
            "deployment": dep.to_dict(), "requests": span_req, "refused_too_long": refused,
            "goodput_req_per_s": g["goodput_req_per_s"] * r, "goodput_tokens_per_s": g["goodput_tokens_per_s"] * r_tok,
            "goodput_tokens_per_s_per_gpu": g["goodput_tokens_per_s"] * r_tok / dep.gpus,
            "slo_attainment": g["slo_attainment"] * int(keep.sum()) / max(span_req, 1),
            # served tokens per second from the first arrival to the last finish (the simulator's throughput); the
            # goodput figures are per second of the window (step_time.goodput), so they may read higher
            "tokens_per_s": res.summary["tokens_per_s"] * r_tok, "ttft_p50_s": res.summary["ttft_p50_s"],
            "ttft_p99_s": res.summary["ttft_p99_s"], "tpot_p50_s": res.summary["tpot_p50_s"],
            "tpot_p99_s": res.summary["tpot_p99_s"], "preemptions": res.summary["preemptions"] * r,
            "kv_tokens_per_rank": kv_tokens_per_rank(self.spec, dep),
            "kv_block_tokens": block,
            "state_slots": sim.state_slots,  # a separate mixer-state pool's (SGLang's), and the running requests' cap
            "state_running_cap": sim.state_slots // state_slots_per_request(self.spec) if sim.state_slots else 0,
            # shares of all the step time (kernels, collectives, untuned ops, per-step overhead)
            "estimated_share": est_s / busy if busy > 0 else 0.0,
            "prior_share": prior_s / busy if busy > 0 else 0.0,
            "collective_share": rep["collective_share"] * parts / busy if busy > 0 else 0.0,
            "ep_imbalance_mean": rep["ep_imbalance_mean"], "roofline_priced": sorted(pricer.roofline_priced),
            "moe_configs": {str(k): v for k, v in sorted(sim.configs_used["fused_moe"].items(),
                                                         key=lambda kv: -kv[1])[:8]},
        }


def deployments(spec: Any, engine: str, gpus: int, max_model_len: int = MAX_MODEL_LEN) -> list[Deployment]:
    """Every valid deployment on the knob grids (the exhaustive search space)."""
    out = []
    for r, lay in layout_choices(gpus):
        for bs in BLOCK_SIZES:
            for mbt in BATCHED_TOKENS:
                for seqs in MAX_SEQS:
                    for gm in GRAPH_MAX:
                        d = Deployment(engine, r, lay.tp, lay.ep, bs, mbt, seqs, gm)
                        if not why_invalid_deployment(spec, d, max_model_len):
                            out.append(d)
    return out


def coordinate_search(score: Any, spec: Any, engine: str, gpus: int, start: Deployment | None = None,
                      rounds: int = 1, max_model_len: int = MAX_MODEL_LEN) -> tuple[Deployment, Any, list]:
    """Search over the same knobs as the agent: every (replicas, layout) at the current knobs, then each knob in turn
    over its grid (coordinate ascent, `rounds` passes). `score(deployment)`: anything ordered, higher is better (the
    plan's: mean goodput over training windows, then SLO headroom); an invalid deployment scores None, below all.
    Returns (best, its score, [(deployment, score), ...] in evaluation order)."""
    history: list[tuple[Deployment, Any]] = []
    memo: dict[Deployment, Any] = {}

    def f(d: Deployment) -> Any:
        if d not in memo:
            memo[d] = None if why_invalid_deployment(spec, d, max_model_len) else score(d)
            history.append((d, memo[d]))
        return memo[d]

    def better(a: Deployment, b: Deployment) -> bool:
        fa, fb = f(a), f(b)
        return fa is not None and (fb is None or fa > fb)

    best = start
    if best is None or why_invalid_deployment(spec, best, max_model_len):
        valid = deployments(spec, engine, gpus, max_model_len)
        if not valid:
            raise ValueError(f"{spec.name} has no valid deployment on {gpus} GPUs with {engine}")
        best = valid[0]
    for _ in range(rounds):
        for r, lay in layout_choices(gpus):
            cand = dataclasses.replace(best, replicas=r, tp=lay.tp, ep=lay.ep)
            if better(cand, best):
                best = cand
        for knob, grid in KNOBS.items():
            for v in grid:
                cand = dataclasses.replace(best, **{knob: v})
                if better(cand, best):
                    best = cand
    return best, f(best), history
