"""`kernel-gym bench`: each kernel's configs against anchors measured in the same run (GPU only).

For every benchmark case of every family: time the default config, the recorded dataset's fastest configs for the
case's workload and a seeded sample of valid configs (each checked against the torch reference first: a wrong result
is recorded as a failure, never timed), take the best, and compare it with the anchors the case names:
  sdpa            (prefill_attention) torch SDPA on the family's inputs as [B, H, N, D], is_causal, the fastest
                  correct backend variant (sdpa_anchor), TFLOP/s
  sdpa_prefix     (prefix_prefill) torch SDPA over a contiguous prefix + chunk, bottom-right causal mask, the fastest
                  correct backend variant (sdpa_prefix_anchor), TFLOP/s
  copy_bandwidth  device-to-device copy of 2 GiB, bytes read + written per second, TB/s
  torch_matmul    a dense bf16 matmul with the same FLOP count, TFLOP/s
  torch_loop      a plain torch MoE (loop over experts), TFLOP/s
  vllm_fused_moe  vLLM's fused-MoE kernel design (kernels/vllm_moe.py) with the config vLLM runs on the H200 (its
                  shipped table, else its default rule), TFLOP/s: ratio = anchor ms / kernel_gym's best ms
Writes a JSON list of records (kernel, case, config, ms, metric, value, anchor, anchor_value, ratio_to_anchor,
default_ms) plus a markdown summary. Imports only torch, triton, numpy and the standard library.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from kernel_gym.kernels import FAMILY_MODULES, get_family, profiles
from kernel_gym.kernels.space import Config
from kernel_gym.train.measurement_plans import with_new_knobs

MOE_COPY_BOUND_MAX_TOKENS = 256  # below this, MoE is weight-streaming bound: compare with copy bandwidth


@dataclass
class Timed:
    ms: float
    spread: float
    repeats: int


def _time(fn: Callable[[], Any]) -> Timed:
    """Benchmark-grade timing: more samples than collection (10 to 40, L2 flushed before each)."""
    from kernel_gym.measure.timing import TimingOptions, time_launch

    fn()  # warm
    t = time_launch(fn, TimingOptions(**BENCH_TIMING_KW))
    return Timed(t.median_ms, t.spread, t.repeats)


# small spaces (~120 configs): the benchmark times every valid config (each profile's bench_exhaustive)
EXHAUSTIVE = tuple(k for k, p in profiles.PROFILES.items() if p.bench_exhaustive)


@functools.lru_cache(maxsize=1)
def _recorded_backend() -> Any:
    from kernel_gym.measure import make_backend

    return make_backend("recorded")


def recorded_best(family: Any, workload: Any, n: int) -> list[Config]:
    """The n fastest valid configs the packaged H200 dataset recorded for this workload (none when it has no rows
    for it): the search kernel_gym exists for. They are timed again here, in the same run as the anchors."""
    if n <= 0:
        return []
    backend = _recorded_backend()
    timed = []
    for c in backend.available_configs(family.name, workload):
        if family.space.is_valid(c, workload):
            m = backend.measure(family.name, workload, c)
            if m.ok and m.median_ms:
                timed.append((m.median_ms, str(c), c))
    return [c for _, _, c in sorted(timed)[:n]]


def _candidates(family: Any, workload: Any, n_configs: int, seed: int, n_recorded: int = 0) -> list[Config]:
    """Default first, then the dataset's best for this workload and their variants at knob values added since, then
    a seeded sample of the valid space."""
    if family.name in EXHAUSTIVE:
        n_configs = len(family.space)
    default = family.default_config(workload)
    best = recorded_best(family, workload, n_recorded)
    sample = family.space.sample(workload, n_configs, seed=seed)
    picks = [default, *best, *with_new_knobs(family.space, best, workload), *sample]
    return list(dict.fromkeys(picks))


def copy_bandwidth_tbs() -> tuple[float, Timed]:
    import torch

    n = 1 << 30  # 1 Gi bf16 elements = 2 GiB each way
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t = _time(lambda: dst.copy_(src))
    return 2 * 2 * n / (t.ms * 1e-3) / 1e12, t


def sdpa_variants(q: Any, k: Any, v: Any, specs: dict[str, tuple[Any, dict]]) -> dict[str, Callable[[], Any]]:
    """SDPA callables on q [B, H, N, D] and k/v [B, Hkv, N, D], one per spec (name -> (SDPBackend, or None for the
    default dispatch; SDPA's keyword arguments)) and kv layout: the kv heads repeated (name_mha) and, when GQA,
    enable_gqa (name_gqa). Either can be the faster path, and a backend may accept only one of them."""
    h, hkv = q.shape[1], k.shape[1]
    layouts = {"mha": (k.repeat_interleave(h // hkv, dim=1), v.repeat_interleave(h // hkv, dim=1), {})}
    if hkv != h:
        layouts["gqa"] = (k, v, {"enable_gqa": True})
    variants: dict[str, Callable[[], Any]] = {}
    for heads, (kk, vv, gqa) in layouts.items():
        for name, (backend, extra) in specs.items():
            variants[f"{name}_{heads}"] = functools.partial(_sdpa_call, backend, q, kk, vv, {**extra, **gqa})
    return variants


def _sdpa_call(backend: Any, q: Any, k: Any, v: Any, kw: dict) -> Any:
    """One SDPA call restricted to `backend` (None: torch's own dispatch)."""
    import contextlib

    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
        return F.scaled_dot_product_attention(q, k, v, **kw)


def checked_variants(variants: dict[str, Callable[[], Any]],
                     check: Callable[[Any], str | None]) -> tuple[dict[str, Callable[[], Any]], dict[str, str]]:
    """Run every variant once and check its output (`check`: None when right, else why not): (the right ones, {name:
    why not} for the others). A variant that raises (a backend refusing the shape, mask or GQA) is recorded with the
    first line of its error, not fatal."""
    import torch

    ok: dict[str, Callable[[], Any]] = {}
    refused: dict[str, str] = {}
    for name, fn in variants.items():
        try:
            wrong = check(fn())
            if wrong:
                refused[name] = f"wrong result: {wrong}"
            else:
                ok[name] = fn
        except Exception as exc:  # noqa: BLE001 - a backend that refuses the shape or mask is recorded, not fatal
            refused[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # a variant's asynchronous error surfaces at that variant
    return ok, refused


def fastest_correct(variants: dict[str, Callable[[], Any]], check: Callable[[Any], str | None], flops: float,
                    what: str) -> dict:
    """Check every variant (checked_variants) and time the right ones; the anchor is the fastest, so a ratio is never
    against a slow or wrong path. Returns {"ms", "tflops", "variant", "variants": {name: ms or why not}};
    RuntimeError when none is right."""
    ok, refused = checked_variants(variants, check)
    results: dict[str, Any] = {name: refused[name] if name in refused else _time(ok[name]).ms for name in variants}
    timed = {k: v for k, v in results.items() if isinstance(v, float)}
    if not timed:
        raise RuntimeError(f"no SDPA variant ran correctly for {what}: {results}")
    best = min(timed, key=timed.get)
    return {"ms": timed[best], "tflops": flops / (timed[best] * 1e-3) / 1e12, "variant": best, "variants": results}


def _heads_first(x: Any, b: int, n: int) -> Any:
    """[B * N, heads, D] packed rows as SDPA's [B, heads, N, D]."""
    return x.view(b, n, x.shape[1], x.shape[2]).transpose(1, 2).contiguous()


def _reference_check(family: Any, inputs: Any) -> Callable[[Any], str | None]:
    """fastest_correct's check: an SDPA output [B, H, N, D] against the family's fp32 reference on its packed rows."""
    from kernel_gym.measure.worker import compare

    ref = family.reference(inputs)
    return lambda out: compare(family, out.transpose(1, 2).reshape(inputs.q.shape), ref, inputs.workload.dtype)


def sdpa_anchor(workload: Any, flops: float, seed: int = 0, device: str = "cuda") -> dict:
    """The sdpa anchor for prefill_attention: torch SDPA with is_causal on the family's own inputs as [B, H, N, D],
    every variant torch offers for plain causal attention (cuDNN, FlashAttention, memory-efficient, the default
    dispatch; kv heads repeated, and enable_gqa for GQA), each checked against the family's fp32 reference; the
    anchor is the fastest correct one (fastest_correct's dict). Raises ValueError for unequal sequence lengths
    (SDPA's [B, H, N, D] needs one length)."""
    from torch.nn.attention import SDPBackend

    n = workload.seq_lens[0]
    if any(s != n for s in workload.seq_lens):
        raise ValueError("the sdpa anchor needs equal-length sequences")
    family = get_family("prefill_attention")
    inputs = family.make_inputs(workload, device, seed)
    b = len(workload.seq_lens)
    q, k, v = (_heads_first(x, b, n) for x in (inputs.q, inputs.k, inputs.v))
    causal = {"is_causal": True}
    specs = {"cudnn_causal": (SDPBackend.CUDNN_ATTENTION, causal), "flash_causal": (SDPBackend.FLASH_ATTENTION, causal),
             "efficient_causal": (SDPBackend.EFFICIENT_ATTENTION, causal), "default_causal": (None, causal)}
    return fastest_correct(sdpa_variants(q, k, v, specs), _reference_check(family, inputs), flops, workload.key())


def bottom_right_mask(chunk: int, prefix: int, device: str) -> Any:
    """[chunk, prefix + chunk] bool, True = attend: chunk query i sees keys [0, prefix + i] (causal, bottom-right)."""
    import torch

    return torch.ones(chunk, prefix + chunk, dtype=torch.bool, device=device).tril(diagonal=prefix)


def sdpa_prefix_anchor(workload: Any, flops: float, seed: int = 0, device: str = "cuda") -> dict:
    """The sdpa_prefix anchor for prefix_prefill: torch SDPA over a contiguous prefix + chunk of the same sizes,
    [B, H, N, D] inputs, the chunk's queries under a bottom-right causal mask (query i sees keys [0, prefix + i]).
    Every variant torch offers for that mask is tried (cuDNN with a boolean mask, FlashAttention and
    memory-efficient attention through causal_lower_right, the default dispatch; with prefix 0 plain is_causal; MHA
    inputs with the kv heads repeated, and enable_gqa) on the family's own inputs, each checked against the family's
    fp32 reference; the anchor is the fastest correct one. Returns {"ms", "tflops", "variant", "variants": {name: ms
    or the error}}; raises ValueError for unequal requests (SDPA's [B, H, N, D] needs one chunk and prefix length)."""
    from torch.nn.attention import SDPBackend
    from torch.nn.attention.bias import causal_lower_right

    c, p = workload.chunk_lens[0], workload.prefix_lens[0]
    if any(x != c for x in workload.chunk_lens) or any(x != p for x in workload.prefix_lens):
        raise ValueError("the sdpa_prefix anchor needs equal chunk and prefix lengths across the batch")
    family = get_family("prefix_prefill")
    inputs = family.make_inputs(workload, device, seed)
    b, n = len(workload.chunk_lens), p + c
    q, k, v = _heads_first(inputs.q, b, c), _heads_first(inputs.k, b, n), _heads_first(inputs.v, b, n)
    if p == 0:
        causal = {"is_causal": True}
        specs = {"cudnn_causal": (SDPBackend.CUDNN_ATTENTION, causal),
                 "flash_causal": (SDPBackend.FLASH_ATTENTION, causal), "default_causal": (None, causal)}
    else:
        mask, lower_right = {"attn_mask": bottom_right_mask(c, p, device)}, {"attn_mask": causal_lower_right(c, n)}
        specs = {"cudnn_mask": (SDPBackend.CUDNN_ATTENTION, mask),
                 "flash_lower_right": (SDPBackend.FLASH_ATTENTION, lower_right),
                 "efficient_lower_right": (SDPBackend.EFFICIENT_ATTENTION, lower_right), "default_mask": (None, mask)}
    return fastest_correct(sdpa_variants(q, k, v, specs), _reference_check(family, inputs), flops, workload.key())


def sdpa_decode_variants(inputs: Any) -> dict[str, Callable[[], Any]]:
    """What torch offers for one decode step on the decode family's inputs (q [B, H, D]; k, v [sum(contexts), Hkv,
    D], the sequences concatenated, no pages), each returning [B, H, D]:
      flash_varlen       FlashAttention-2's varlen forward (cu_seqlens over the concatenated KV, native GQA): reads
                         each sequence's own keys, as a paged kernel does;
      efficient_varlen   the memory-efficient kernel's varlen forward (kv heads repeated: it has no GQA);
      sdpa_<backend>_*   F.scaled_dot_product_attention on [B, H, 1, D] against [B, Hkv, L, D]: at batch 1 plain,
                         past it padded to the longest context with a key mask (so it reads the padding too; the
                         name says `padded`), every backend (cuDNN, FlashAttention, memory-efficient, default),
                         kv heads repeated and enable_gqa.
    A backend may refuse a shape; checked_variants records why. Used by benchmarks/flush_mode/run.py to put the
    decode kernel beside what a torch user gets."""
    import torch
    from torch.nn.attention import SDPBackend

    w = inputs.workload
    q, k, v, scale = inputs.q, inputs.k, inputs.v, inputs.sm_scale
    b, h, d = q.shape
    lens = inputs.context_lens.tolist()
    cu_k = inputs.cu_context.to(torch.int32)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device=q.device)
    group = w.num_heads // w.num_kv_heads

    def flash_varlen() -> Any:
        return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, 1, max(lens), 0.0, False, False,
                                                       scale=scale)[0]

    k_mha, v_mha = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def efficient_varlen() -> Any:
        out = torch.ops.aten._efficient_attention_forward(q[None], k_mha[None], v_mha[None], None, cu_q, cu_k, 1,
                                                          max(lens), 0.0, 0, False, scale=scale)[0]
        return out[0]

    variants: dict[str, Callable[[], Any]] = {"flash_varlen": flash_varlen, "efficient_varlen": efficient_varlen}
    longest = max(lens)
    kp = torch.zeros(b, w.num_kv_heads, longest, d, dtype=k.dtype, device=k.device)
    vp = torch.zeros_like(kp)
    starts = inputs.cu_context.tolist()
    for i, n in enumerate(lens):
        kp[i, :, :n] = k[starts[i]: starts[i] + n].transpose(0, 1)
        vp[i, :, :n] = v[starts[i]: starts[i] + n].transpose(0, 1)
    padded = len(set(lens)) > 1
    extra: dict = {"scale": scale}
    if padded:
        key_in = torch.arange(longest, device=q.device)[None, :] < inputs.context_lens[:, None].long()
        extra["attn_mask"] = key_in[:, None, None, :]  # [B, 1, 1, L]: True = attend
    specs = {name: (backend, extra) for name, backend in (
        ("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("default", None))}
    for name, fn in sdpa_variants(q[:, :, None, :], kp, vp, specs).items():
        variants[f"sdpa_{name}{'_padded' if padded else ''}"] = (lambda f=fn: f()[:, :, 0, :])
    return variants


def matmul_tflops(flops: float, m: int, k: int) -> tuple[float, Timed]:
    """A dense bf16 matmul [m, k] x [k, n] with n chosen so that 2*m*k*n equals `flops`."""
    import torch

    n = max(16, int(round(flops / (2 * m * k) / 16)) * 16)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    t = _time(lambda: a @ b)
    return 2 * m * k * n / (t.ms * 1e-3) / 1e12, t


def _anchor(family_name: str) -> str:
    """What the benchmark compares a family's best config with (its profile's bench_anchor)."""
    p = profiles.get(family_name)
    return p.bench_anchor if p is not None else ""


def _metric(family_name: str, workload: Any, family: Any, ms: float) -> tuple[str, float]:
    anchor = _anchor(family_name)
    if anchor == "copy_bandwidth" or (anchor == "moe_layer" and workload.num_tokens <= MOE_COPY_BOUND_MAX_TOKENS):
        return "TB/s", family.bytes_moved(workload) / (ms * 1e-3) / 1e12
    return "TFLOP/s", family.flops(workload) / (ms * 1e-3) / 1e12


BENCH_TIMING_KW = dict(min_reps=10, max_reps=40, round_reps=10, target_spread=0.02, max_time_s=2.0)
BENCH_COMPILE_WORKERS = 8  # compile processes (see run_bench)


def bench_case(live: Any, family_name: str, case: str, workload: Any, configs: list[Config], log: Callable,
               seed: int = 0) -> dict:
    """Time `configs` (the default config first; run_bench passes _candidates' or a study's) on one case in the live
    backend's isolated worker (each checked against the reference first); near-ties are re-measured by pick_winner.
    Returns the best, the default's time, all tried."""
    from kernel_gym.measure.timing import TimingOptions

    family = get_family(family_name)
    winner, measurements = live.pick_winner(family_name, workload, configs,
                                            confirm=TimingOptions(**{**BENCH_TIMING_KW, "min_reps": 20}))
    by_config: dict[str, Any] = {}
    for m in measurements:  # later (confirming) measurements replace earlier ones
        by_config[m.config] = m
    tried = [m.to_dict() for m in by_config.values()]
    best = by_config[str(winner)]
    default = by_config[str(configs[0])]
    failures = sum(1 for m in by_config.values() if not m.ok)
    from kernel_gym.measure.power import monitor_summary_line

    log(f"  {case}: {len(by_config)} configs, {failures} failed; the best timed under "
        f"{monitor_summary_line(best.power)}")
    result = {"best": {"config": dict(winner), "ms": best.median_ms, "spread": best.spread, "power": best.power},
              "default_ms": default.median_ms if default.ok else None, "tried": tried}
    if _anchor(family_name) == "moe_layer":
        inputs = family.make_inputs(workload, "cuda", seed=seed)
        result["torch_loop_ms"] = _time(family.make_torch_loop(inputs)).ms  # routing done up front, as in ours
        result.update(vllm_anchor(inputs))
    return result


def vllm_anchor(inputs: Any) -> dict:
    """The vllm_fused_moe anchor: vLLM's kernel design with the config vLLM itself runs on the H200 (its shipped table's
    nearest-M entry, else its default rule), checked against the reference, then timed in this run."""
    from kernel_gym.kernels import vllm_moe
    from kernel_gym.measure.worker import compare

    wl = inputs.workload
    config = vllm_moe.FAMILY.default_config(wl)
    fn = vllm_moe.prepare(inputs, config)
    wrong = compare(vllm_moe.FAMILY, fn(), vllm_moe.FAMILY.reference(inputs), wl.dtype)
    if wrong:
        return {"vllm_fused_moe_error": wrong, "vllm_fused_moe_config": dict(config)}
    return {"vllm_fused_moe_ms": _time(fn).ms, "vllm_fused_moe_config": dict(config)}


def run_bench(kernels: list[str], n_configs: int, budget_s: float, seed: int = 0, log: Callable = print,
              on_case: Callable[[list[dict]], None] | None = None, n_recorded: int = 0,
              cases: Sequence[str] | None = None,
              candidates: Callable[[Any, Any], list[Config]] | None = None) -> dict:
    """Every case of every family (or only those named in `cases`); `on_case(records so far)` after each case, so a
    crash or timeout keeps what was measured. A case that raises (e.g. out of memory) is logged, kept in details with
    its error, and skipped. `candidates(family, workload)`, when given, replaces the configs timed per case (a study
    of some knob, benchmarks/short_prefill/knob_ab.py); the default config is always timed first."""
    import torch
    import triton

    if not torch.cuda.is_available():
        raise ValueError("`kernel-gym bench` needs a CUDA GPU; run it on the GPU machine (README: The GPU parts)")
    import os

    from kernel_gym.measure.engine_timing import gpu_state
    from kernel_gym.measure.live import LiveBackend
    from kernel_gym.measure.timing import TimingOptions

    start, gpu_before = time.time(), gpu_state()  # the anchors' times carry no power state of their own
    # Each compile process holds a CUDA context and one workload's inputs (2.8 GB for Mixtral's experts): a pool per
    # core filled the H200's memory (benchmarks/h200_run3/bench_full_attempt.txt), so it is capped.
    live = LiveBackend(timing=TimingOptions(**BENCH_TIMING_KW),
                       compile_workers=max(1, min(BENCH_COMPILE_WORKERS, (os.cpu_count() or 2) - 2)))
    copy_tbs, copy_t = copy_bandwidth_tbs()
    log(f"copy bandwidth: {copy_tbs:.2f} TB/s")
    records: list[dict] = []
    details: dict[str, Any] = {}
    for family_name in kernels:
        family = get_family(family_name)
        family_cases = importlib.import_module(FAMILY_MODULES[family_name]).bench_cases()
        if cases is not None:
            family_cases = [(c, w) for c, w in family_cases if c in cases]
        picks = {case: (list(dict.fromkeys([family.default_config(workload), *candidates(family, workload)]))
                        if candidates else _candidates(family, workload, n_configs, seed, n_recorded))
                 for case, workload in family_cases}
        for case, workload in family_cases:  # compile every case's candidates on CPU cores while the GPU times
            live.prefetch(family_name, workload, picks[case])
        for case, workload in family_cases:
            if time.time() - start > budget_s:
                log(f"budget of {budget_s:.0f} s spent: skipping {case}")
                continue
            log(f"{family_name} / {case}: timing {len(picks[case])} configs")
            try:
                res = bench_case(live, family_name, case, workload, picks[case], log, seed)
            except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
                details[case] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                log(f"  {case}: FAILED {details[case]['error']}")
                torch.cuda.empty_cache()
                continue
            details[case] = res
            best = res["best"]
            metric, value = _metric(family_name, workload, family, best["ms"])
            base = {
                "kernel": family_name, "case": case, "config": best["config"], "ms": best["ms"],
                "metric": metric, "value": value, "default_ms": res["default_ms"],
                "workload": json.loads(workload.key()), "power": best.get("power", ""),
            }
            anchors: list[tuple[str, float]] = []
            flops = family.flops(workload)
            anchor_kind = _anchor(family_name)
            if anchor_kind == "sdpa":
                try:
                    info = sdpa_anchor(workload, flops, seed)
                    res["sdpa"] = info
                    anchors.append(("sdpa", info["tflops"]))
                    log(f"  sdpa: {info['ms']:.4f} ms ({info['variant']}); variants {info['variants']}")
                except ValueError:
                    pass
            elif anchor_kind == "sdpa_prefix":
                try:
                    info = sdpa_prefix_anchor(workload, flops, seed)
                    res["sdpa_prefix"] = info
                    anchors.append(("sdpa_prefix", info["tflops"]))
                    log(f"  sdpa_prefix: {info['ms']:.4f} ms ({info['variant']}); variants {info['variants']}")
                except ValueError:
                    pass
            elif anchor_kind == "copy_bandwidth":
                anchors.append(("copy_bandwidth", copy_tbs))
            elif anchor_kind == "moe_layer":
                tflops = flops / (best["ms"] * 1e-3) / 1e12
                if workload.num_tokens <= MOE_COPY_BOUND_MAX_TOKENS:
                    anchors.append(("copy_bandwidth", copy_tbs))
                mm = matmul_tflops(flops, workload.num_tokens * workload.top_k, workload.hidden)[0]
                loop = flops / (res["torch_loop_ms"] * 1e-3) / 1e12
                vllm = [("vllm_fused_moe", flops / (res["vllm_fused_moe_ms"] * 1e-3) / 1e12)] if res.get(
                    "vllm_fused_moe_ms") else []  # ratio = vLLM-design anchor time / kernel_gym's best time
                for anchor, anchor_value in (("torch_matmul", mm), ("torch_loop", loop), *vllm):
                    records.append({**base, "metric": "TFLOP/s", "value": tflops, "anchor": anchor,
                                    "anchor_value": anchor_value, "ratio_to_anchor": tflops / anchor_value})
            for anchor, anchor_value in anchors:
                records.append({**base, "anchor": anchor, "anchor_value": anchor_value,
                                "ratio_to_anchor": value / anchor_value})
            log(f"  best {best['ms']:.4f} ms ({metric} {value:.1f}), default {res['default_ms']} ms")
            if on_case is not None:
                on_case(records)
    live.close()
    env = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "copy_bandwidth_tbs": copy_tbs, "copy_ms": copy_t.ms,
        "seconds": time.time() - start, "gpu_before": gpu_before, "gpu_after": gpu_state(),
    }
    return {"records": records, "env": env, "details": details}


@functools.lru_cache(maxsize=1)
def targets() -> dict[tuple[str, str], float]:
    """(case, anchor) -> minimum ratio_to_anchor, from the kernels issue. Built on first use: the prefill cases come
    from prefill_attention.bench_cases(), and that module imports torch and triton, which importing bench does not."""
    prefill = importlib.import_module(FAMILY_MODULES["prefill_attention"]).bench_cases()
    return {
        # issue 29: at least the fastest correct SDPA variant at every prefill shape, short prefills included
        **{(case, "sdpa"): 1.0 for case, _ in prefill},
        ("decode_b64_ctx8192_gqa4_d128", "copy_bandwidth"): 0.80,
        ("moe_mixtral_m1", "copy_bandwidth"): 0.85,
        ("moe_mixtral_m16", "copy_bandwidth"): 0.90,
        ("moe_mixtral_m64", "copy_bandwidth"): 0.90,
        ("moe_mixtral_m4096", "torch_matmul"): 0.65,
        **{(f"moe_mixtral_m{m}", "torch_loop"): 1.0 for m in (1, 16, 64, 256, 1024, 4096)},
        **{(case, "sdpa_prefix"): 0.90 for case in (  # issue 29: chunks of 512-2048 tokens, prefixes of 0-32k
            "prefix_c2048_p0", "prefix_c512_p0_b4", "prefix_c512_p2048_b4", "prefix_c1024_p4096", "prefix_c2048_p8192",
            "prefix_c512_p32768", "prefix_c2048_p32768")},
    }


def _clocks(state: str) -> str:
    """A short table cell of a row's power state: "1512 MHz 688 W 61 C sw_power_cap", or "-"."""
    from kernel_gym.measure.power import PowerSummary

    p = PowerSummary.from_compact(state) if state else None
    return "-" if p is None else p.short()


def to_markdown(result: dict) -> str:
    env = result["env"]
    lines = [
        "# Kernel benchmarks on the H200",
        "",
        f"Device {env['device']}, torch {env['torch']}, triton {env['triton']}; copy bandwidth measured in the "
        f"same run: {env['copy_bandwidth_tbs']:.2f} TB/s. Raw data: `benchmarks/h200_kernels.json` "
        "(written by `kernel-gym bench`).",
        "Each case times the knob space's default config, the packaged H200 dataset's fastest configs for the case's "
        "workload (when it has rows for it) and a seeded sample of valid configs (prefill: every valid config), each "
        "checked against the torch reference before it is timed; the best is compared with anchors "
        "measured in the same run.",
        "",
        "The last column is the state the best config was timed under (SM clock median, power median, throttle "
        "reasons; measure/power.py; `-` where it was not recorded).",
        "",
        "| kernel | case | anchor | best ms | metric | value | anchor value | ratio | target | default ms "
        "| best / default | clocks |",
        "|---|---|---|---:|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in result["records"]:
        target = targets().get((r["case"], r["anchor"]))
        verdict = "" if target is None else (f">= {target:.2f} met" if r["ratio_to_anchor"] >= target
                                              else f">= {target:.2f} MISSED by {target - r['ratio_to_anchor']:.2f}")
        speedup = "" if not r["default_ms"] else f"{r['default_ms'] / r['ms']:.2f}x"
        default_ms = "failed" if r["default_ms"] is None else f"{r['default_ms']:.4f}"
        lines.append(
            f"| {r['kernel']} | {r['case']} | {r['anchor']} | {r['ms']:.4f} | {r['metric']} | {r['value']:.2f} | "
            f"{r['anchor_value']:.2f} | {r['ratio_to_anchor']:.3f} | {verdict} | {default_ms} | {speedup} | "
            f"{_clocks(r.get('power', ''))} |"
        )
    return "\n".join(lines) + "\n"


def bench_and_write(*, out: Path, md: Path | None, kernels: list[str], configs: int, recorded: int,
                    budget_s: float) -> int:
    """`kernel-gym bench`: run_bench, the records to `out` (rewritten after each case, so a kill keeps the finished
    ones), the details beside it and the markdown summary to `md` (default beside `out`; its analysis section is kept).
    Exit code 1 when a record has no finite time."""
    for k in kernels:
        get_family(k)  # unknown names fail early with the list of families
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    def partial(records: list) -> None:  # the folder made with the first record, not before the GPU check
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(records, indent=1))

    result = run_bench(kernels, configs, budget_s, log=log, on_case=partial, n_recorded=recorded)
    partial(result["records"])
    details_path = out.with_name(out.stem + "_details.json")
    details_path.write_text(json.dumps({"env": result["env"], "details": result["details"]}, indent=1))
    text = to_markdown(result)
    md = md or out.with_suffix(".md")
    md.parent.mkdir(parents=True, exist_ok=True)
    prev = md.read_text() if md.exists() else ""
    marker = "\n## Analysis"
    md.write_text(text + (prev[prev.index(marker):] if marker in prev else ""))
    print(text)
    missed = [r for r in result["records"] if r["ratio_to_anchor"] < targets().get((r["case"], r["anchor"]), -math.inf)]
    print(f"{len(result['records'])} records, {len(missed)} targets missed; wrote {out} and {details_path}")
    return 0 if math.isfinite(sum(r["ms"] for r in result["records"])) else 1
