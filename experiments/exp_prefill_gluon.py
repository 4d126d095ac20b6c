"""Experiment: a Gluon (triton.experimental.gluon) flash-attention forward for Hopper, aimed at the prefill target.

The kernel is kernel_gym/kernels/prefill_gluon.py (its docstring describes the design); the prefill family launches
it for IMPL=gluon_* configs. This script sweeps more of its compile-time switches than the knob space exposes (WS,
NUM_WG, SPLIT, PINGPONG, OVERLAP, BLOCK_N, STAGES, maxnreg), to find which schedules deserve a knob value.

Commands:
  CPU (no GPU; needs triton 3.6, whose Gluon API this kernel is written for):
      python experiments/exp_prefill_gluon.py --compile-only
  GPU (H200):  python3 experiments/exp_prefill_gluon.py --out $OUT/exp_prefill_gluon.json --budget-s 300

The GPU run checks every variant config against a torch reference before timing it with
kernel_gym.measure.timing.time_launch (the benchmark's timer), and times torch SDPA and the Triton kernel ("ours") at
its fastest recorded config in the same process. Imports only torch, triton, numpy, the standard library and kernel_gym.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kernel_gym.kernels.prefill_gluon import GluonVariant, compile_sm90, prepare_gluon  # noqa: E402


def all_variants() -> list[GluonVariant]:
    """The sweep, most promising first (the GPU run's budget guard cuts from the end). First H200 run (--limit 10,
    before this order): BLOCK_N=64 x 3 stages was best: ws wg1 64x64 0.891 / 0.903 of SDPA (B4 N2048 / B1 N8192),
    ws_pingpong 128x64 0.825 / 0.911; BLOCK_N=128 was slower for every family."""
    v: list[GluonVariant] = []
    for bn, st in ((64, 3), (64, 2), (128, 2), (128, 3)):
        v.append(GluonVariant(ws=1, num_wg=2, block_n=bn, stages=st, overlap=1, split=1, pingpong=1, maxnreg=168))
        v.append(GluonVariant(ws=1, num_wg=2, block_n=bn, stages=st, overlap=1))
        v.append(GluonVariant(ws=0, num_wg=2, block_n=bn, stages=st, overlap=1))
        v.append(GluonVariant(ws=1, num_wg=1, block_n=bn, stages=st, overlap=1, maxnreg=128))
        v.append(GluonVariant(ws=0, num_wg=1, block_n=bn, stages=st, overlap=1))
    for bn, st in ((64, 3), (128, 2)):
        v.append(GluonVariant(ws=1, num_wg=2, block_n=bn, stages=st, overlap=1, split=1, pingpong=0, maxnreg=168))
        v.append(GluonVariant(ws=1, num_wg=2, block_n=bn, stages=st, overlap=0, split=1, pingpong=1, maxnreg=168))
        v.append(GluonVariant(ws=0, num_wg=2, block_n=bn, stages=st, overlap=0))
        v.append(GluonVariant(ws=1, num_wg=2, block_n=bn, stages=st, overlap=0))
        v.append(GluonVariant(ws=0, num_wg=1, block_n=bn, stages=st, overlap=0))
    return v


# ---- compile without a GPU --------------------------------------------------------------------------------------


def ptxas_stats(ptx: str) -> dict[str, int]:
    """Registers and spill bytes from ptxas -v on the kernel's PTX (what the driver would report as n_regs /
    n_spills)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=False)
    text = res.stdout + res.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill_st = re.search(r"(\d+) bytes spill stores", text)
    spill_ld = re.search(r"(\d+) bytes spill loads", text)
    return {"regs": int(regs.group(1)) if regs else -1,
            "spill_stores": int(spill_st.group(1)) if spill_st else -1,
            "spill_loads": int(spill_ld.group(1)) if spill_ld else -1}


def compile_report(var: GluonVariant, head_dim: int, dtype: str = "bfloat16") -> dict[str, Any]:
    row: dict[str, Any] = {"variant": var.label(), "head_dim": head_dim, "dtype": dtype, **asdict(var)}
    try:
        k = compile_sm90(var, head_dim, dtype)
        ptx = k.asm["ptx"]
        row.update(ptxas_stats(ptx))
        row["smem"] = int(k.metadata.shared)
        row["wgmma"] = ptx.count("wgmma.mma_async")
        row["tma"] = ptx.count("cp.async.bulk.tensor")
        row["setmaxnreg"] = ptx.count("setmaxnreg")
        row["status"] = "ok" if row["wgmma"] and row["tma"] else "ok_but_missing_wgmma_or_tma"
    except Exception as exc:  # noqa: BLE001 - recorded per variant
        row["status"] = "error"
        row["reason"] = f"{type(exc).__name__}: {str(exc).strip()[-600:]}"
        if os.environ.get("EXP_TRACEBACK"):
            traceback.print_exc()
    return row


def compile_only(variants: list[GluonVariant], head_dims: tuple[int, ...], dtypes: tuple[str, ...]) -> list[dict]:
    rows = []
    print(f"{'variant':36} {'D':>3} {'dtype':8} {'regs':>5} {'spill':>6} {'smem':>7} {'wgmma':>5} {'tma':>4} "
          f"{'maxnreg':>7}  status")
    for dtype in dtypes:
        for d in head_dims:
            for var in variants:
                r = compile_report(var, d, dtype)
                rows.append(r)
                print(f"{r['variant']:36} {d:3d} {dtype:8} {r.get('regs', '-')!s:>5} "
                      f"{r.get('spill_stores', '-')!s:>6} {r.get('smem', '-')!s:>7} {r.get('wgmma', '-')!s:>5} "
                      f"{r.get('tma', '-')!s:>4} {r.get('setmaxnreg', '-')!s:>7}  {r['status']} "
                      f"{r.get('reason', '')[:300]}", flush=True)
    return rows


# ---- GPU run ----------------------------------------------------------------------------------------------------


# The Triton kernel's fastest config per case, the baseline the Gluon variants are compared with ("ours"): 64x64 tiles,
# 3 stages, 4 warps at both (benchmarks/h200_run6/prefill_gluon/bench/h200_kernels_details.json, as in run 5).
TRITON_BEST = {
    "prefill_b4_h32_n2048_d128": dict(BLOCK_M=64, BLOCK_N=64, num_stages=3, num_warps=4),
    "prefill_b1_h32_n8192_d128": dict(BLOCK_M=64, BLOCK_N=64, num_stages=3, num_warps=4),
}


def prepare(inputs: Any, var: GluonVariant) -> Any:
    """Launch closure for one variant on family inputs (q [T, H, D], k/v [T, Hkv, D], cu_seqlens)."""
    import torch

    from kernel_gym.kernels import prefill_attention as pa

    w = inputs.workload
    items = pa.work_table(w.seq_lens, w.num_heads, w.num_kv_heads, var.block_m)
    table = torch.tensor(items, dtype=torch.int32).t().contiguous().to(inputs.q.device)
    return prepare_gluon(inputs, var, table, len(items))


def _classify(exc: BaseException) -> tuple[str, str]:
    name = type(exc).__name__
    msg = f"{name}: {str(exc).strip()[-500:]}"
    if "OutOfResources" in name or "out of resource" in str(exc).lower():
        return "out_of_resources", msg
    return "error", msg


def _check(out: Any, ref: Any, atol: float, rtol: float) -> tuple[bool, float, int]:
    err = (out.float() - ref.float()).abs()
    bad = err > atol + rtol * ref.float().abs()
    return not bool(bad.any()), float(err.max()), int(bad.sum())


def correctness_cases() -> list[tuple[str, Any]]:
    """Small ragged GQA workloads: lengths that are not multiples of the tiles, so sequence ends, the diagonal and
    tiles reaching into the next sequence are all exercised (D 128 and 64, bf16 and fp16)."""
    from kernel_gym.kernels.workloads import PrefillWorkload

    return [
        ("ragged_gqa_d128_bf16", PrefillWorkload(8, 2, 128, (37, 300, 129, 512), "bfloat16")),
        ("ragged_gqa_d64_fp16", PrefillWorkload(8, 2, 64, (200, 77, 384), "float16")),
    ]


class Watchdog:
    """A deadlocked kernel (a wrong mbarrier phase) would hang the process in a CUDA synchronise forever: if one
    variant's check or timing takes longer than limit_s, record it as a hang, write the JSON and exit the process."""

    def __init__(self, limit_s: float, on_hang: Any) -> None:
        self.limit_s, self.on_hang = limit_s, on_hang
        self._timer: threading.Timer | None = None

    def arm(self, what: str) -> None:
        self.disarm()
        self._timer = threading.Timer(self.limit_s, self._fire, args=(what,))
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self, what: str) -> None:
        print(f"WATCHDOG: {what} still running after {self.limit_s:.0f} s: treating it as a hang, exiting", flush=True)
        self.on_hang(what)
        os._exit(3)


def gpu_run(out_path: Path | None, budget_s: float, variants: list[GluonVariant], hang_s: float = 90.0) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from kernel_gym.kernels import prefill_attention as pa
    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.timing import time_launch

    t0 = time.monotonic()
    rows: list[dict] = []
    device = "cuda"

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    def flush() -> None:
        if out_path:
            meta = dict(torch=torch.__version__, triton=triton.__version__, budget_s=budget_s,
                        elapsed_s=time.monotonic() - t0, device=torch.cuda.get_device_name())
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    def on_hang(what: str) -> None:
        rows.append({"case": what, "variant": what, "status": "hang", "reason": f"no result after {hang_s} s"})
        flush()

    dog = Watchdog(hang_s, on_hang)
    # 1. Correctness on small ragged GQA batches (fp32 reference): a variant failing here is not timed.
    small_ok: dict[str, str] = {}
    for cname, wl in correctness_cases():
        inputs = pa.FAMILY.make_inputs(wl, device, seed=1)
        ref = pa.FAMILY.reference(inputs)
        atol, rtol = pa.FAMILY.tolerance(wl.dtype)
        for var in variants:
            row = {"case": cname, "variant": var.label(), **asdict(var), "status": "ok"}
            if time.monotonic() - t0 > budget_s:
                row.update(status="skipped_budget")
            else:
                try:
                    dog.arm(f"check {cname} {var.label()}")
                    out = prepare(inputs, var)()
                    torch.cuda.synchronize()
                    ok, row["max_err"], n_bad = _check(out, ref, atol, rtol)
                    if not ok:
                        row.update(status="wrong", reason=f"{n_bad} elements off, max abs err {row['max_err']:.3g}")
                except Exception as exc:  # noqa: BLE001
                    row["status"], row["reason"] = _classify(exc)
                dog.disarm()
            if row["status"] != "ok":
                small_ok.setdefault(var.label(), f"{cname}: {row['status']} {row.get('reason', '')[:200]}")
            rows.append(row)
            log(f"check {cname} {var.label()}: {row['status']} {row.get('reason', '')[:160]}")
        del inputs, ref
    flush()

    # 2. Bench cases: SDPA, our kernel at its best config, every variant that passed (checked again here).
    for case, wl in pa.bench_cases()[:2]:
        inputs = pa.FAMILY.make_inputs(wl, device, seed=0)
        b, n, h, d = len(wl.seq_lens), wl.seq_lens[0], wl.num_heads, wl.head_dim
        q4, k4, v4 = (x.view(b, n, x.shape[1], d).transpose(1, 2).contiguous() for x in (inputs.q, inputs.k, inputs.v))
        flops = pa.FAMILY.flops(wl)
        ref = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True).transpose(1, 2).reshape(b * n, h, d)
        ref = ref.contiguous()
        atol, rtol = pa.FAMILY.tolerance(wl.dtype)

        def sdpa(q4: Any = q4, k4: Any = k4, v4: Any = v4) -> Any:
            return F.scaled_dot_product_attention(q4, k4, v4, is_causal=True)

        sdpa()
        t_sdpa = time_launch(sdpa).median_ms
        sdpa_tf = flops / (t_sdpa * 1e-3) / 1e12
        rows.append({"case": case, "variant": "sdpa", "status": "ok", "ms": t_sdpa, "tflops": sdpa_tf,
                     "ratio_to_sdpa": 1.0})
        log(f"{case} sdpa: {t_sdpa:.4f} ms {sdpa_tf:.1f} TF")
        base_tf = None
        cfg = TRITON_BEST.get(case)
        if cfg:
            row = {"case": case, "variant": "ours", "config": cfg, "status": "ok"}
            try:
                fn = pa.FAMILY.prepare(inputs, Config(**cfg))
                ok, row["max_err"], n_bad = _check(fn(), ref, atol, rtol)
                ms = time_launch(fn).median_ms
                base_tf = flops / (ms * 1e-3) / 1e12
                row.update(ms=ms, tflops=base_tf, ratio_to_sdpa=base_tf / sdpa_tf, ratio_to_ours=1.0)
                if not ok:
                    row.update(status="wrong", reason=f"{n_bad} elements off")
            except Exception as exc:  # noqa: BLE001
                row["status"], row["reason"] = _classify(exc)
            rows.append(row)
            log(f"{case} ours {cfg}: {row['status']} {row.get('ratio_to_sdpa', 0):.3f}")
        for var in variants:
            row = {"case": case, "variant": var.label(), **asdict(var), "status": "ok"}
            if time.monotonic() - t0 > budget_s:
                row.update(status="skipped_budget", reason=f"budget of {budget_s:.0f} s spent")
            elif var.label() in small_ok:
                row.update(status="skipped", reason="failed the small check: " + small_ok[var.label()])
            else:
                try:
                    dog.arm(f"{case} {var.label()}")
                    fn = prepare(inputs, var)
                    ok, row["max_err"], n_bad = _check(fn(), ref, atol, rtol)
                    if ok:
                        ms = time_launch(fn).median_ms
                        tf = flops / (ms * 1e-3) / 1e12
                        row.update(ms=ms, tflops=tf, ratio_to_sdpa=tf / sdpa_tf,
                                   ratio_to_ours=tf / base_tf if base_tf else None)
                    else:
                        row.update(status="wrong", reason=f"{n_bad} elements off, max abs err {row['max_err']:.3g}")
                except Exception as exc:  # noqa: BLE001
                    row["status"], row["reason"] = _classify(exc)
                dog.disarm()
            rows.append(row)
            timing = f"{row['ms']:.4f} ms {row['tflops']:.1f} TF {row['ratio_to_sdpa']:.3f}" if "ms" in row else ""
            log(f"{case} {var.label()}: {row['status']} {timing} {row.get('reason', '')[:160]}")
            flush()
        del inputs, ref, q4, k4, v4
        torch.cuda.empty_cache()
    flush()
    return rows


def summary(rows: list[dict]) -> str:
    lines = [f"{'case':28} {'variant':36} {'ms':>8} {'TF':>7} {'/sdpa':>6} {'/ours':>6}  status"]
    for r in rows:
        if r["case"].startswith("prefill_") and (r.get("ms") is not None or r["variant"] in ("sdpa", "ours")):
            lines.append(f"{r['case']:28} {r['variant']:36} {r.get('ms') or 0:8.4f} {r.get('tflops') or 0:7.1f} "
                         f"{r.get('ratio_to_sdpa') or 0:6.3f} {r.get('ratio_to_ours') or 0:6.3f}  {r['status']}")
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    lines.append(f"statuses: {statuses}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-only", action="store_true", help="compile every variant for sm_90 (no GPU needed)")
    ap.add_argument("--out", type=Path, help="JSON file for all rows")
    ap.add_argument("--budget-s", type=float, default=300.0, help="skip remaining variants after this many seconds")
    ap.add_argument("--only", help="comma-separated variant families (plain, pipe, ws, ws_split, ws_pingpong)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N variants of the sweep (0: all)")
    args = ap.parse_args(argv)
    variants = all_variants()
    if args.only:
        keep = {s.strip() for s in args.only.split(",")}
        variants = [v for v in variants if v.family() in keep]
    if args.limit:
        variants = variants[:args.limit]
    if args.compile_only:
        rows = compile_only(variants, (128, 64), ("bfloat16",))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(rows, indent=1))
        n_ok = sum(r["status"] == "ok" for r in rows)
        print(f"{n_ok}/{len(rows)} compiled with wgmma and TMA")
        return 0 if n_ok else 1
    import torch

    if not torch.cuda.is_available():
        ap.error("the GPU run needs a CUDA GPU; on CPU use --compile-only")
    rows = gpu_run(args.out, args.budget_s, variants)
    if args.out:
        print(f"wrote {args.out}")
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
