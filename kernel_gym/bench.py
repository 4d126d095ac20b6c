"""`kernel-gym bench`: each kernel's configs against anchors measured in the same run (GPU only).

For every benchmark case of every family: time the default config and a seeded sample of valid configs (each checked
against the torch reference first: a wrong result is recorded as a failure, never timed), take the best, and compare
it with the anchors the case names:
  sdpa            torch scaled_dot_product_attention on [B, H, N, D] (causal), TFLOP/s
  copy_bandwidth  device-to-device copy of 2 GiB, bytes read + written per second, TB/s
  torch_matmul    a dense bf16 matmul with the same FLOP count, TFLOP/s
  torch_loop      a plain torch MoE (loop over experts), TFLOP/s
Writes a JSON list of records (kernel, case, config, ms, metric, value, anchor, anchor_value, ratio_to_anchor,
default_ms) plus a markdown summary. Imports only torch, triton, numpy and the standard library.
"""

from __future__ import annotations

import importlib
import json
import math
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from kernel_gym.kernels import FAMILY_MODULES, get_family
from kernel_gym.kernels.space import Config

MOE_COPY_BOUND_MAX_TOKENS = 256  # below this, MoE is weight-streaming bound: compare with copy bandwidth


@dataclass
class Timed:
    ms: float
    spread: float
    repeats: int


def _time(fn: Callable[[], Any]) -> Timed:
    from kernel_gym.measure.timing import time_launch

    t = time_launch(fn)
    return Timed(t.median_ms, t.spread, t.repeats)


def _check(family: Any, out: Any, ref: Any, dtype: str) -> str | None:
    import torch

    atol, rtol = family.tolerance(dtype)
    out32, ref32 = out.float(), ref.float()
    if out32.shape != ref32.shape:
        return f"shape {tuple(out32.shape)} != reference {tuple(ref32.shape)}"
    if not torch.isfinite(out32).all():
        return "non-finite values in output"
    if not torch.allclose(out32, ref32, atol=atol, rtol=rtol):
        err = (out32 - ref32).abs().max().item()
        return f"max abs error {err:.3g} exceeds atol={atol} rtol={rtol}"
    return None


def copy_bandwidth_tbs() -> tuple[float, Timed]:
    import torch

    n = 1 << 30  # 1 Gi bf16 elements = 2 GiB each way
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t = _time(lambda: dst.copy_(src))
    return 2 * 2 * n / (t.ms * 1e-3) / 1e12, t


def sdpa_tflops(workload: Any, flops: float) -> tuple[float, Timed]:
    import torch
    import torch.nn.functional as F

    n = workload.seq_lens[0]
    if any(s != n for s in workload.seq_lens) or workload.num_heads != workload.num_kv_heads:
        raise ValueError("the sdpa anchor needs equal-length sequences and no GQA")
    b, h, d = len(workload.seq_lens), workload.num_heads, workload.head_dim
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    t = _time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    return flops / (t.ms * 1e-3) / 1e12, t


def matmul_tflops(flops: float, m: int, k: int) -> tuple[float, Timed]:
    """A dense bf16 matmul [m, k] x [k, n] with n chosen so that 2*m*k*n equals `flops`."""
    import torch

    n = max(16, int(round(flops / (2 * m * k) / 16)) * 16)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    t = _time(lambda: a @ b)
    return 2 * m * k * n / (t.ms * 1e-3) / 1e12, t


def _metric(family_name: str, workload: Any, family: Any, ms: float) -> tuple[str, float]:
    if family_name == "decode_attention" or (
        family_name == "fused_moe" and workload.num_tokens <= MOE_COPY_BOUND_MAX_TOKENS
    ):
        return "TB/s", family.bytes_moved(workload) / (ms * 1e-3) / 1e12
    return "TFLOP/s", family.flops(workload) / (ms * 1e-3) / 1e12


def bench_case(family_name: str, case: str, workload: Any, n_configs: int, seed: int, log: Callable) -> dict:
    """Time default + sampled configs on one case; returns the best config, its time, all tried configs."""
    import torch

    family = get_family(family_name)
    inputs = family.make_inputs(workload, "cuda", seed=seed)
    ref = family.reference(inputs)
    default = family.default_config(workload)
    configs = [default] + [c for c in family.space.sample(workload, n_configs, seed=seed) if c != default]
    tried: list[dict] = []
    for i, config in enumerate(configs):
        entry: dict[str, Any] = {"config": dict(config)}
        try:
            fn = family.prepare(inputs, config)
            out = fn()
            torch.cuda.synchronize()
            reason = _check(family, out, ref, workload.dtype)
            if reason:
                entry.update(status="wrong_result", reason=reason)
            else:
                t = _time(fn)
                entry.update(status="ok", ms=t.ms, spread=t.spread, repeats=t.repeats)
        except Exception as exc:  # noqa: BLE001 - every failure is recorded with its reason
            name = type(exc).__name__
            status = "out_of_resources" if "OutOfResources" in name else "compile_error"
            entry.update(status=status, reason=f"{name}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        tried.append(entry)
        if (i + 1) % 20 == 0:
            log(f"  {case}: {i + 1}/{len(configs)} configs")
    ok = [e for e in tried if e["status"] == "ok"]
    if not ok:
        raise RuntimeError(f"{case}: no config succeeded; first failure: {tried[0]}")
    # Re-measure the near-ties (within 3% of the best) before declaring a winner.
    best_ms = min(e["ms"] for e in ok)
    for e in ok:
        if e["ms"] <= 1.03 * best_ms:
            fn = family.prepare(inputs, Config(e["config"]))
            e["ms"] = min(e["ms"], _time(fn).ms)
    best = min(ok, key=lambda e: e["ms"])
    default_entry = tried[0]
    extra = {}
    if family_name == "fused_moe":
        extra["torch_loop_ms"] = _time(lambda: family.torch_loop_moe(inputs)).ms
    return {
        "best": best,
        "default_ms": default_entry.get("ms"),
        "tried": tried,
        **extra,
    }


def run_bench(kernels: list[str], n_configs: int, budget_s: float, seed: int = 0, log: Callable = print) -> dict:
    import torch
    import triton

    if not torch.cuda.is_available():
        raise ValueError("`kernel-gym bench` needs a CUDA GPU; run it on the GPU machine (README: The GPU parts)")
    start = time.time()
    copy_tbs, copy_t = copy_bandwidth_tbs()
    log(f"copy bandwidth: {copy_tbs:.2f} TB/s")
    records: list[dict] = []
    details: dict[str, Any] = {}
    for family_name in kernels:
        family = get_family(family_name)
        cases = importlib.import_module(FAMILY_MODULES[family_name]).bench_cases()
        for case, workload in cases:
            if time.time() - start > budget_s:
                log(f"budget of {budget_s:.0f} s spent: skipping {case}")
                continue
            log(f"{family_name} / {case}: timing up to {n_configs + 1} configs")
            res = bench_case(family_name, case, workload, n_configs, seed, log)
            details[case] = res
            best = res["best"]
            metric, value = _metric(family_name, workload, family, best["ms"])
            base = {
                "kernel": family_name, "case": case, "config": best["config"], "ms": best["ms"],
                "metric": metric, "value": value, "default_ms": res["default_ms"],
                "workload": json.loads(workload.key()),
            }
            anchors: list[tuple[str, float]] = []
            flops = family.flops(workload)
            if family_name == "prefill_attention":
                try:
                    anchors.append(("sdpa", sdpa_tflops(workload, flops)[0]))
                except ValueError:
                    pass
            elif family_name == "decode_attention":
                anchors.append(("copy_bandwidth", copy_tbs))
            elif family_name == "fused_moe":
                tflops = flops / (best["ms"] * 1e-3) / 1e12
                if workload.num_tokens <= MOE_COPY_BOUND_MAX_TOKENS:
                    anchors.append(("copy_bandwidth", copy_tbs))
                mm = matmul_tflops(flops, workload.num_tokens * workload.top_k, workload.hidden)[0]
                loop = flops / (res["torch_loop_ms"] * 1e-3) / 1e12
                for anchor, anchor_value in (("torch_matmul", mm), ("torch_loop", loop)):
                    records.append({**base, "metric": "TFLOP/s", "value": tflops, "anchor": anchor,
                                    "anchor_value": anchor_value, "ratio_to_anchor": tflops / anchor_value})
            for anchor, anchor_value in anchors:
                records.append({**base, "anchor": anchor, "anchor_value": anchor_value,
                                "ratio_to_anchor": value / anchor_value})
            log(f"  best {best['ms']:.4f} ms ({metric} {value:.1f}), default {res['default_ms']} ms")
    env = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "copy_bandwidth_tbs": copy_tbs, "copy_ms": copy_t.ms,
        "seconds": time.time() - start,
    }
    return {"records": records, "env": env, "details": details}


TARGETS = {  # (case, anchor) -> minimum ratio_to_anchor, from the kernels issue
    ("prefill_b4_h32_n2048_d128", "sdpa"): 0.90,
    ("prefill_b1_h32_n8192_d128", "sdpa"): 0.90,
    ("decode_b64_ctx8192_gqa4_d128", "copy_bandwidth"): 0.80,
    ("moe_mixtral_m1", "copy_bandwidth"): 0.85,
    ("moe_mixtral_m16", "copy_bandwidth"): 0.90,
    ("moe_mixtral_m64", "copy_bandwidth"): 0.90,
    ("moe_mixtral_m4096", "torch_matmul"): 0.65,
    **{(f"moe_mixtral_m{m}", "torch_loop"): 1.0 for m in (1, 16, 64, 256, 1024, 4096)},
}


def to_markdown(result: dict) -> str:
    env = result["env"]
    lines = [
        "# Kernel benchmarks on the H200",
        "",
        f"Device {env['device']}, torch {env['torch']}, triton {env['triton']}; copy bandwidth measured in the "
        f"same run: {env['copy_bandwidth_tbs']:.2f} TB/s. Raw data: `benchmarks/h200_kernels.json` "
        "(written by `kernel-gym bench`).",
        "Each case times the knob space's default config and a seeded sample of valid configs, each checked against "
        "the torch reference before it is timed; the best is compared with anchors measured in the same run.",
        "",
        "| kernel | case | anchor | best ms | metric | value | anchor value | ratio | target | default ms "
        "| best / default |",
        "|---|---|---|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in result["records"]:
        target = TARGETS.get((r["case"], r["anchor"]))
        verdict = "" if target is None else (f">= {target:.2f} met" if r["ratio_to_anchor"] >= target
                                              else f">= {target:.2f} MISSED by {target - r['ratio_to_anchor']:.2f}")
        speedup = "" if not r["default_ms"] else f"{r['default_ms'] / r['ms']:.2f}x"
        default_ms = "failed" if r["default_ms"] is None else f"{r['default_ms']:.4f}"
        lines.append(
            f"| {r['kernel']} | {r['case']} | {r['anchor']} | {r['ms']:.4f} | {r['metric']} | {r['value']:.2f} | "
            f"{r['anchor_value']:.2f} | {r['ratio_to_anchor']:.3f} | {verdict} | {default_ms} | {speedup} |"
        )
    return "\n".join(lines) + "\n"


def main(args: Any) -> int:
    kernels = [k for k in args.kernels.split(",") if k]
    for k in kernels:
        get_family(k)  # unknown names fail early with the list of families
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    result = run_bench(kernels, args.configs, args.budget_s, log=log)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result["records"], indent=1))
    details_path = args.out.with_name(args.out.stem + "_details.json")
    details_path.write_text(json.dumps({"env": result["env"], "details": result["details"]}, indent=1))
    md = to_markdown(result)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        prev = args.md.read_text() if args.md.exists() else ""
        marker = "\n## Analysis"
        args.md.write_text(md + (prev[prev.index(marker):] if marker in prev else ""))
    print(md)
    missed = [r for r in result["records"] if (r["case"], r["anchor"]) in TARGETS
              and r["ratio_to_anchor"] < TARGETS[(r["case"], r["anchor"])]]
    print(f"{len(result['records'])} records, {len(missed)} targets missed; wrote {args.out} and {details_path}")
    return 0 if math.isfinite(sum(r["ms"] for r in result["records"])) else 1
