"""One profile per kernel family: every per-kernel table the floors above read, in one record.

A family is its module (`kernels/<name>.py`, `FAMILY`), its profile here and its env line (`envs.KERNEL_ENVS`).
The floors look a kernel's facts up with `profile(name)` instead of comparing its name with a string: its store
version, workload type, observation features, interpolation, dispatch and export axes, jitter axes, step-log
columns, whether its configs live on the paged KV cache's layout.

Why this file is apart from the family modules: it is data about how the rest of kernel_gym treats a kernel, so it
changes without touching what is measured (the store keys on `version`, bumped by hand when a change to the family
module alters what is measured; tests/kernels/test_golden_outputs.py catches a forgotten bump).

Imports only the standard library, nothing from kernel_gym at module level: the MLflow pyfunc model bundles it
verbatim beside dispatch/observation.py (as kernel_gym_profiles.py). Workload classes and grids are named by import
path ("module:attribute") and resolved on use; the functions here only read workload fields.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

Feature = tuple[str, float, float]  # (name, lo, hi): a raw feature mapped linearly from [lo, hi] to [-1, 1]
Axes2 = tuple[tuple[str, str], tuple[bool, bool]]  # (axis names, whether each axis is log-scaled)


@dataclass(frozen=True)
class Interpolation:
    """How the recorded backend interpolates between measured shapes: the workload fields that vary, the axis
    coordinates of a workload, the largest gap between bracketing neighbours per axis, and (optional) extra fields
    of the fixed key (what must agree besides the dimensions left after the varying fields)."""

    varying: tuple[str, ...]
    coords: Callable[[Any], tuple[float, ...]]
    max_gap: tuple[float, ...]
    shape_key: Callable[[Any], dict[str, Any]] | None = None
    # the workload at given axis coordinates (coverage's clamped proxies); None where the axes do not determine one
    at_coords: Callable[[Any, Any], Any] | None = None


@dataclass(frozen=True)
class KernelProfile:
    """What kernel_gym knows about one family besides its module. Fields left at their defaults switch a use off
    (no dispatch axes: not in dispatch tables; no interpolation: exact hits only; no jitter axes: obs_jitter
    refused)."""

    name: str
    module: str  # import path of the family module (its FAMILY)
    version: int  # the store key: bump it by hand when a change alters what is measured
    workload: str  # "module:Class" of the workload dataclass
    features: tuple[Feature, ...]  # observation order; bump the env version when it changes
    extra_features: Callable[[Any], dict[str, float]]  # raw features beyond workload.features() (shape numbers)
    grid: str = ""  # "module:function" (model, grid, dtype) -> workloads: the shape grids per model spec
    # source hashes the store keyed this family's rows on before versions, and the version each one is
    legacy_hashes: Mapping[str, int] = field(default_factory=dict)
    # store keys of other launch paths of the module (vllm_fused_moe's small-batch path) -> their legacy hashes
    path_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    interpolation: Interpolation | None = None
    proxied: bool = False  # measure/coverage.py proxies it along its interpolation axes (it has a roofline)
    fixed_fields: tuple[str, ...] = ()  # the workload dimensions a model spec fixes
    dispatch_axes: Axes2 | None = None  # the dispatch table's two bucket axes
    axis_values: Callable[[Any], tuple[float, float]] | None = None  # a workload's two bucket coordinates
    cell_workload: Callable[[Mapping[str, Any], float, float], Any] | None = None  # a bucket's representative
    small_workload: Callable[[Mapping[str, Any]], Any] | None = None  # small inputs of a table's shape (precompile)
    export_grid: Callable[[], tuple[list[float], list[float]]] | None = None  # the exported bucket centers
    step_log_columns: tuple[str | None, str | None] = (None, None)  # per dispatch axis: the step-log column
    tuning_key: Callable[[Any], tuple] | None = None  # what an autotuner keys on (the search baselines)
    serving_bucket: Callable[[Any], tuple[float, ...]] | None = None  # Serving-v0 rule tables' half-octave bucket
    # an exported Serving-v0 rule table: bucket of grid cell (i, j) centred at (a, b) on the axes of serving_skews
    serving_cell: Callable[[int, int, float, float], tuple[float, ...]] | None = None
    serving_skews: bool = False  # its exported rule table's second axis is skew quarters (else a log axis)
    jitter_axes: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()  # obs_jitter: field, moved features
    jitter_mask: bool = False  # the action mask follows the jittered observation
    obs_jitter: float | None = None  # training's default obs_jitter (log2 units)
    reads_kv: bool = False  # its configs carry the paged KV cache's PAGE_SIZE and LAYOUT: run on the layout in force
    follows_kv: bool = False  # choosers move its configs onto the layout in force (dispatch.rules.on_layout)
    moe: bool = False  # a fused-MoE layer (MoEWorkload): routing skew, expert weights
    # the kernel whose time the serving simulator charges where the data cannot time this kernel's call (prefix
    # chunks: prefill attention); replay then never falls back to another of its configs (evaluate/replay.py)
    stand_in: str = ""
    bench_exhaustive: bool = False  # a small space (~120 configs): `kernel-gym bench` times every valid config
    # what `kernel-gym bench` compares the best config with (kernel_gym/bench.py): "sdpa", "sdpa_prefix",
    # "copy_bandwidth" or "moe_layer" (a dense matmul, the torch loop over experts, vLLM's design; copy bandwidth at
    # small M)
    bench_anchor: str = ""

    @property
    def store_key(self) -> str:
        """What the store's source_hash column holds for this family's rows."""
        return version_key(self.version)

    def workload_type(self) -> type:
        return resolve(self.workload)

    def legacy_key(self, stored: str) -> str:
        """The current store key of a stored key: a legacy source hash maps to its version, anything else stays."""
        if stored in self.legacy_hashes:
            return version_key(self.legacy_hashes[stored])
        for key, hashes in self.path_keys.items():
            if stored in hashes:
                return key
        return stored


def version_key(version: int) -> str:
    return f"v{int(version)}"


def resolve(path: str) -> Any:
    """'package.module:attribute' -> the attribute (imported on use)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


PROFILES: dict[str, KernelProfile] = {}


def register(p: KernelProfile) -> KernelProfile:
    """Add (or replace) a family's profile; kernels.FAMILY_MODULES and every floor's tables follow it."""
    PROFILES[p.name] = p
    return p


def profile(kernel: str) -> KernelProfile:
    p = PROFILES.get(kernel)
    if p is None:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {sorted(PROFILES)}")
    return p


def get(kernel: str) -> KernelProfile | None:
    return PROFILES.get(kernel)


def reads_kv(kernel: str) -> bool:
    """Whether a kernel's configs carry the paged KV cache's PAGE_SIZE and LAYOUT (decode, prefix_prefill)."""
    p = PROFILES.get(kernel)
    return p is not None and p.reads_kv


def follows_kv(kernel: str) -> bool:
    """Whether choosers move a kernel's configs onto the KV layout in force (decode: its table records the layout)."""
    p = PROFILES.get(kernel)
    return p is not None and p.follows_kv


def layers_of(kernel: str, spec: Any) -> int:
    """How many of a model's layers call `kernel`: its MoE layers for a fused-MoE family (`moe`), else (attention)
    its softmax-attention layers (ModelSpec.n_moe_layers / n_attention_layers; num_layers for a spec without them)."""
    p = PROFILES.get(kernel)
    name = "n_moe_layers" if p is not None and p.moe else "n_attention_layers"
    return int(getattr(spec, name, spec.num_layers))


def names_with(field_name: str) -> tuple[str, ...]:
    """The registered kernels, in registration order, whose profile sets `field_name` (not None, empty or False)."""
    return tuple(n for n, p in PROFILES.items() if getattr(p, field_name))


def canonical_key(kernel: str, stored: str) -> str:
    """A stored source_hash value as this checkout keys it (legacy hashes map to versions; unknown kernels stay)."""
    p = PROFILES.get(kernel)
    return p.legacy_key(stored) if p is not None else stored


# ---- shared pieces ------------------------------------------------------------------------------------------------

_WL = "kernel_gym.kernels.workloads"


def half_octave(x: float) -> float:
    """log2(x) rounded to half octaves (x < 1 counts as 1): Serving-v0's rule-table buckets."""
    return round(2.0 * math.log2(max(float(x), 1.0))) / 2.0


def _attention_extra(lens_field: str, prefix: bool) -> Callable[[Any], dict[str, float]]:
    def extra(w: Any) -> dict[str, float]:
        out = {"log2_num_seqs": math.log2(len(getattr(w, lens_field)))}
        if prefix:
            out["log2_max_prefix"] = math.log2(1.0 + max(w.prefix_lens))
        out.update(log2_num_heads=math.log2(w.num_heads), gqa_group=float(w.num_heads // w.num_kv_heads),
                   log2_head_dim=math.log2(w.head_dim))
        return out
    return extra


def _moe_extra(w: Any) -> dict[str, float]:
    return {"log2_num_experts": math.log2(w.num_experts), "log2_top_k": math.log2(w.top_k),
            "log2_hidden": math.log2(w.hidden), "log2_intermediate": math.log2(w.intermediate)}


def _decode_extra(w: Any) -> dict[str, float]:
    return {"log2_num_kv_heads": math.log2(w.num_kv_heads), "log2_head_dim": math.log2(w.head_dim)}


def packed_pairs(total: int, max_len: int) -> int:
    """Causal pairs of a prefill bucket's representative batch (prefill_lens), without building the batch."""
    m = max(1, min(int(max_len), int(total)))
    k, r = divmod(int(total), m)
    return k * m * (m + 1) // 2 + r * (r + 1) // 2


def prefill_lens(total: int, max_len: int) -> tuple[int, ...]:
    """Sequences of max_len tokens (capped at total) summing to total: a prefill bucket's representative batch."""
    m = max(1, min(int(max_len), int(total)))
    lens = (m,) * (int(total) // m)
    return lens + ((int(total) % m,) if total % m else ())


def _moe_cell(f: Mapping[str, Any], x0: float, x1: float) -> Any:
    return resolve(f"{_WL}:MoEWorkload")(int(x0), f["num_experts"], f["top_k"], f["hidden"], f["intermediate"],
                                         float(x1), f.get("dtype", "bfloat16"))


def _decode_cell(f: Mapping[str, Any], x0: float, x1: float) -> Any:
    return resolve(f"{_WL}:DecodeWorkload")(f["num_heads"], f["num_kv_heads"], f["head_dim"], int(x0), int(x1),
                                            f.get("dtype", "bfloat16"))


def _prefill_cell(f: Mapping[str, Any], x0: float, x1: float) -> Any:
    return resolve(f"{_WL}:PrefillWorkload")(f["num_heads"], f["num_kv_heads"], f["head_dim"],
                                             prefill_lens(int(x0), int(x1)), f.get("dtype", "bfloat16"))


def _grid(*names_: str) -> Callable[[], tuple[list[float], list[float]]]:
    """Export bucket centers from the collection grids of kernels/workloads.py (resolved on use)."""
    def centers() -> tuple[list[float], list[float]]:
        return tuple([float(x) for x in _grid_values(n)] for n in names_)  # type: ignore[return-value]
    return centers


EXPORT_SKEWS = (0.0, 0.3, 0.6, 0.9, 1.2, 1.6)


def _grid_values(name: str) -> tuple[float, ...]:
    wl = importlib.import_module(_WL)
    return {"moe_tokens": wl.MOE_TOKENS, "skews": EXPORT_SKEWS, "decode_batches": wl.DECODE_BATCHES,
            "decode_contexts": (32, 64) + wl.DECODE_CONTEXTS + (65536,),
            "prefill": (16, 32, 64) + wl.PREFILL_TOTALS + (32768,)}[name]


HEADS = ("num_heads", "num_kv_heads", "head_dim")
EXPERTS = ("num_experts", "top_k", "hidden", "intermediate")
# prefix_prefill's prefix axis: log2(p + PREFIX_OFFSET) puts p = 0 at 8 and the measured 512, 2048, 8192, 32768 at
# 9.6, 11.2, 13.0, 15.0 (gaps under the axis' max gap of 2), so a prefix between 0 and 512 is bracketed too.
PREFIX_OFFSET = 256


def _shares(values: tuple[int, ...], total: float) -> list[float]:
    return [round(v / total, 3) for v in values]


def _prefix_shape(w: Any) -> dict[str, Any]:
    """The batch shape that stays fixed along prefix_prefill's axes: chunk shares of the call's tokens, prefix shares
    of the longest prefix (None: no prefix at all, the p = 0 edge of every pattern)."""
    longest = max(w.prefix_lens)
    return {"chunk_shares": _shares(w.chunk_lens, w.total_tokens),
            "prefix_shares": _shares(w.prefix_lens, longest) if longest else None}


MOE_FEATURES: tuple[Feature, ...] = (
    ("log2_tokens", 0.0, 14.0),
    ("skew", 0.0, 2.0),
    ("log2_slots_per_expert", -6.0, 14.0),
    ("log2_num_experts", 0.0, 8.0),
    ("log2_top_k", 0.0, 4.0),
    ("log2_hidden", 8.0, 14.0),
    ("log2_intermediate", 8.0, 15.0),
    ("dtype_bytes", 1.0, 4.0),
)
MOE_INTERPOLATION = Interpolation(
    ("num_tokens", "skew"), lambda w: (math.log2(w.num_tokens), w.skew), (2.0, 1.25),
    at_coords=lambda w, c: replace(w, num_tokens=max(1, round(2 ** float(c[0]))), skew=float(c[1])))

# Registration order is the order tables list kernels in (dispatch tables: MoE, decode, prefill).
# The registrations below have the same shape (duplicate scan): one KernelProfile record per family, field by field;
# what they share is already factored out above (features, grids, interpolations), the values are each family's own.
register(KernelProfile(
    name="fused_moe",
    module="kernel_gym.kernels.fused_moe",
    # still 1 after the GEMM kernels learned to skip expert -1 row blocks: only the bounded alignment of a serving
    # step makes such blocks, the measured path never does (its outputs and work are the same: golden check)
    version=1,
    workload=f"{_WL}:MoEWorkload",
    features=MOE_FEATURES,
    extra_features=_moe_extra,
    # the pointer-load path's hash from before TMA_LOADS (its code unchanged; configs without TMA_LOADS), then
    # the hash with the TMA path
    legacy_hashes={"cccc58be1e48ac30": 1, "39fa995d3724b8c7": 1},
    interpolation=MOE_INTERPOLATION,
    proxied=True,
    fixed_fields=EXPERTS,
    dispatch_axes=(("num_tokens", "skew"), (True, False)),
    axis_values=lambda w: (float(w.num_tokens), float(w.skew)),
    cell_workload=_moe_cell,
    small_workload=lambda f: _moe_cell(f, 64, 0.0),
    export_grid=_grid("moe_tokens", "skews"),
    tuning_key=lambda w: (w.num_tokens,),  # routing is invisible to an autotuner's key
    serving_bucket=lambda w: (half_octave(w.num_tokens), round(float(w.skew) * 4.0) / 4.0),
    serving_cell=lambda i, j, a, b: (i / 2.0, b),
    serving_skews=True,
    step_log_columns=("num_tokens", "skew"),
    jitter_axes=(("num_tokens", (("log2_tokens", 1.0), ("log2_slots_per_expert", 1.0))),),
    jitter_mask=True,
    obs_jitter=0.5,
    moe=True,
    bench_anchor="moe_layer",
))

register(KernelProfile(
    name="decode_attention",
    module="kernel_gym.kernels.decode_attention",
    version=1,
    workload=f"{_WL}:DecodeWorkload",
    features=(
        ("log2_batch", 0.0, 9.0),
        ("log2_context", 0.0, 16.0),
        ("gqa_group", 1.0, 16.0),
        ("log2_num_kv_heads", 0.0, 7.0),
        ("log2_head_dim", 5.0, 9.0),
        ("dtype_bytes", 1.0, 4.0),
    ),
    extra_features=_decode_extra,
    legacy_hashes={"f4a4d42f7c009d00": 1},
    interpolation=Interpolation(
        ("batch", "context_len"), lambda w: (math.log2(w.batch), math.log2(w.context_len)), (2.0, 2.0),
        at_coords=lambda w, c: replace(w, batch=max(1, round(2 ** float(c[0]))),
                                       context_len=max(1, round(2 ** float(c[1]))))),
    proxied=True,
    fixed_fields=HEADS,
    dispatch_axes=(("batch", "context_len"), (True, True)),
    axis_values=lambda w: (float(w.batch), float(w.context_len)),
    cell_workload=_decode_cell,
    small_workload=lambda f: _decode_cell(f, 4, 512),
    export_grid=_grid("decode_batches", "decode_contexts"),
    tuning_key=lambda w: (w.batch, w.context_len),
    serving_bucket=lambda w: (half_octave(w.batch), half_octave(w.context_len)),
    serving_cell=lambda i, j, a, b: (i / 2.0, j / 2.0),
    step_log_columns=("decode_batch", "mean_context"),
    jitter_axes=(("batch", (("log2_batch", 1.0),)), ("context_len", (("log2_context", 1.0),))),
    obs_jitter=0.5,
    reads_kv=True,
    follows_kv=True,
    bench_anchor="copy_bandwidth",
))

register(KernelProfile(
    name="prefill_attention",
    module="kernel_gym.kernels.prefill_attention",
    version=1,
    workload=f"{_WL}:PrefillWorkload",
    features=(
        ("log2_total_tokens", 0.0, 15.0),
        ("log2_max_len", 0.0, 15.0),
        ("log2_num_seqs", 0.0, 8.0),
        ("log2_causal_pairs", 0.0, 28.0),
        ("log2_num_heads", 0.0, 7.0),
        ("gqa_group", 1.0, 16.0),
        ("log2_head_dim", 5.0, 9.0),
        ("dtype_bytes", 1.0, 4.0),
    ),
    extra_features=_attention_extra("seq_lens", prefix=False),
    # the Triton path's hash from before the IMPL knob (its code unchanged; configs without IMPL), then the hash
    # with the Gluon path
    legacy_hashes={"ec600ed06a102175": 1, "21529621dbb8d8dc": 1},
    # causal pairs is the work; the mix of lengths is not an axis
    interpolation=Interpolation(("seq_lens",), lambda w: (math.log2(w.causal_pairs()),), (3.0,)),
    proxied=True,
    fixed_fields=HEADS,
    dispatch_axes=(("total_tokens", "max_len"), (True, True)),
    axis_values=lambda w: (float(sum(w.seq_lens)), float(max(w.seq_lens))),
    cell_workload=_prefill_cell,
    small_workload=lambda f: resolve(f"{_WL}:PrefillWorkload")(f["num_heads"], f["num_kv_heads"], f["head_dim"],
                                                               (256,), f.get("dtype", "bfloat16")),
    export_grid=_grid("prefill", "prefill"),
    # next powers of two of (total, longest): varlen kernels key on maxima
    tuning_key=lambda w: (1 << (sum(w.seq_lens) - 1).bit_length(), 1 << (max(w.seq_lens) - 1).bit_length()),
    serving_bucket=lambda w: (half_octave(w.causal_pairs()),),
    serving_cell=lambda i, j, a, b: (half_octave(packed_pairs(round(a), round(b))),),
    step_log_columns=("prefill_tokens", None),
    # every length scaled by 2^d moves the causal pairs by 2^(2d)
    jitter_axes=(("seq_lens", (("log2_total_tokens", 1.0), ("log2_max_len", 1.0), ("log2_causal_pairs", 2.0))),),
    obs_jitter=1.0,
    bench_exhaustive=True,
    bench_anchor="sdpa",
))

register(KernelProfile(
    name="vllm_fused_moe",  # vLLM's kernel design and tunables (issue 15)
    module="kernel_gym.kernels.vllm_moe",
    version=1,
    workload=f"{_WL}:MoEWorkload",
    features=MOE_FEATURES,
    extra_features=_moe_extra,
    legacy_hashes={"e834f0fc0043fd75": 1},
    # rows timed on the engine's small-batch launch path (vllm_moe.prepare_small_batch)
    path_keys={"small-batch-v1": ("9e08dd3661002a2e",)},
    fixed_fields=EXPERTS,
    moe=True,
))

register(KernelProfile(
    name="prefix_prefill",  # chunked prefill over a paged KV prefix (issue 29)
    module="kernel_gym.kernels.prefix_prefill",
    version=1,
    workload=f"{_WL}:PrefixPrefillWorkload",
    # the prefill features plus the prefix axis (KV already cached per request)
    features=(
        ("log2_total_tokens", 0.0, 15.0),
        ("log2_max_chunk", 0.0, 15.0),
        ("log2_num_seqs", 0.0, 8.0),
        ("log2_causal_pairs", 0.0, 32.0),
        ("log2_mean_prefix", 0.0, 17.0),
        ("log2_max_prefix", 0.0, 17.0),
        ("log2_num_heads", 0.0, 7.0),
        ("gqa_group", 1.0, 16.0),
        ("log2_head_dim", 5.0, 9.0),
        ("dtype_bytes", 1.0, 4.0),
    ),
    extra_features=_attention_extra("chunk_lens", prefix=True),
    legacy_hashes={"1a15925c0fc65710": 1},
    # interpolated among workloads of one batch shape, never proxied (measure/roofline.py has no bound for it): a
    # chunk call outside its measured grid stays unanswered, and the simulator charges its stand-in
    interpolation=Interpolation(("chunk_lens", "prefix_lens"),
                                lambda w: (math.log2(w.total_tokens), math.log2(max(w.prefix_lens) + PREFIX_OFFSET)),
                                (2.0, 2.0), _prefix_shape),
    fixed_fields=HEADS,
    reads_kv=True,
    stand_in="prefill_attention",
    bench_anchor="sdpa_prefix",
))
