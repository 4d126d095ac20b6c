"""What the L2 flush before each sample adds to a kernel's time: every timing of a config, an anchor, a same-size copy
and an empty launch taken after a "write" flush (the buffer zeroed: the L2 starts full of dirty lines, what every
stored row was timed with) and after a "clean" one (the buffer read: the L2 starts cold and clean), interleaved.

A launch that reads more than the L2 holds evicts the flush's dirty lines and so also pays their write-back, which
is no work of its own; a bytes / copy-bandwidth floor assumes none. Cases:
- decode at batch 1, 2, 4 and 16, contexts 1k, 4k, 16k (Mixtral's GQA 32/8, D=128): from a decode_floor.json of a
  --grid run, its 4 fastest configs and the fastest with KV_TMA=0, beside the floor (bytes / COPY_BW + the empty launch
  timed the same way) and a device-to-device copy of the same bytes;
- the no-prefix prefill bench cases of prefill_attention and prefix_prefill: the config of their record in
  benchmarks/h200_kernels.json against every plain-causal SDPA variant (the anchor is the fastest correct one, per
  flush mode).
With --sdpa-decode, every decode workload also times what torch offers for the same step
(kernel_gym.bench.sdpa_decode_variants: FlashAttention-2 and memory-efficient varlen, SDPA's backends), the variants
that give the reference; --no-attention leaves out the prefill rows. Every closure is checked against its family's fp32
reference before it is timed.

    python3 benchmarks/flush_mode/run.py --floor benchmarks/decode_floor/run5_tma/decode_floor.json.gz \\
        --out $OUT/flush_mode.json  # GPU; imports torch, triton, numpy, kernel_gym
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MODES = ("write", "clean")
ATTENTION_CASES = {"prefill_attention": ("prefill_b16_h32kv8_n512_d128", "prefill_b64_h32kv8_n128_d128",
                                         "prefill_b16_h32kv4_n512_d128", "prefill_b64_h32kv4_n128_d128",
                                         "prefill_b4_h32kv8_n2048_d128"),
                   "prefix_prefill": ("prefix_c512_p0_b4", "prefix_c2048_p0")}


def interleaved_medians(fns: list, reps: int) -> dict[str, list[float]]:
    """Per flush mode, each closure's median (ms) over `reps` samples taken in blocks write, clean, clean, write, so a
    drift of the clocks falls on both modes alike."""
    from kernel_gym.measure.timing import DEFAULT_TIMING, keep_hot, time_interleaved

    keep_hot(DEFAULT_TIMING, "cuda")
    samples: dict[str, list[list[float]]] = {m: [[] for _ in fns] for m in MODES}
    for mode in ("write", "clean", "clean", "write"):
        for i, s in enumerate(time_interleaved(fns, reps // 2, heat=False, flush_mode=mode)):
            samples[mode][i].extend(s)
    return {m: [statistics.median(s) for s in per] for m, per in samples.items()}


def decode_rows(floor_path: Path, reps: int, log, sdpa: bool = False) -> list[dict]:
    import torch

    from benchmarks.decode_floor.run import _empty_kernel, floor_ms, read_floor
    from kernel_gym.bench import checked_variants, sdpa_decode_variants
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import DecodeWorkload
    from kernel_gym.measure.worker import compare

    empty = _empty_kernel()  # one launch's fixed cost: the floor's launch term, as decode_floor times it
    dummy = torch.empty(1, device="cuda")
    fam = get_family("decode_attention")
    rows = []
    for r in read_floor(floor_path)["rows"]:
        times = r.get("times") or {}
        if not times:
            continue
        ranked = sorted(times, key=times.get)
        picks = ranked[:4] + [min((c for c in ranked if not json.loads(c).get("KV_TMA")), key=times.get)]
        picks = list(dict.fromkeys(picks))
        w = DecodeWorkload(32, 8, 128, r["batch"], r["context"])
        inputs = fam.make_inputs(w, "cuda")
        ref = fam.reference(inputs)
        fns = []
        for c in picks:
            fn = fam.prepare(inputs, Config.parse(c))
            wrong = compare(fam, fn(), ref, w.dtype)
            if wrong is not None:
                raise SystemExit(f"decode {c} at batch {w.batch} context {w.context_len} is wrong: {wrong}")
            fns.append(fn)
        matches = functools.partial(_matches_reference, fam, ref, w.dtype)
        torch_fns, refused = checked_variants(sdpa_decode_variants(inputs), matches) if sdpa else ({}, {})
        nbytes = int(fam.bytes_moved(w))
        src = torch.randn(nbytes // 4, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        fns += [*torch_fns.values(), functools.partial(dst.copy_, src), functools.partial(empty[(1,)], dummy)]
        med = interleaved_medians(fns, reps)
        wrong_after = [c for c, fn in zip(picks, fns) if compare(fam, fn(), ref, w.dtype) is not None]
        row = {"batch": w.batch, "context": w.context_len, "bytes": nbytes, "configs": picks,
               "wrong_after_timing": wrong_after}
        if sdpa:
            row["torch_refused"] = refused
        for m in MODES:
            cfg_ms, torch_ms, (copy_ms, empty_ms) = (med[m][:len(picks)], med[m][len(picks):-2], med[m][-2:])
            floor = floor_ms(fam, w, empty_ms)
            best = min(cfg_ms)
            row[m] = {"config_ms": cfg_ms, "best_ms": best, "best_config": picks[cfg_ms.index(best)],
                      "copy_ms": copy_ms, "empty_ms": empty_ms, "floor_ms": floor, "ratio_to_floor": best / floor}
            if torch_ms:
                times = dict(zip(torch_fns, torch_ms))
                fastest = min(times, key=times.get)
                row[m]["torch"] = {"variants_ms": times, "best": fastest, "best_ms": times[fastest],
                                   "ratio_to_floor": times[fastest] / floor, "kernel_speedup": times[fastest] / best}
        torch_note = "".join(f"; torch {row[m]['torch']['best']} {row[m]['torch']['ratio_to_floor']:.2f} ({m})"
                             for m in MODES if "torch" in row[m])
        log(f"decode batch {w.batch} context {w.context_len}: best/floor write {row['write']['ratio_to_floor']:.2f} "
            f"({row['write']['best_ms'] * 1e3:.1f} us), clean {row['clean']['ratio_to_floor']:.2f} "
            f"({row['clean']['best_ms'] * 1e3:.1f} us); copy {row['write']['copy_ms'] * 1e3:.1f} / "
            f"{row['clean']['copy_ms'] * 1e3:.1f} us{torch_note}")
        rows.append(row)
        del inputs, ref, fns, src, dst, torch_fns
        torch.cuda.empty_cache()
    return rows


def _matches_reference(fam, ref, dtype: str, out) -> str | None:
    from kernel_gym.measure.worker import compare

    return compare(fam, out, ref, dtype)


def attention_rows(reps: int, log) -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend

    from kernel_gym import bench
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.worker import compare

    records = {(r["kernel"], r["case"]): r for r in
               json.loads((Path(__file__).resolve().parents[1] / "h200_kernels.json").read_text())}
    rows = []
    for kernel, names in ATTENTION_CASES.items():
        fam = get_family(kernel)
        cases = dict(__import__(f"kernel_gym.kernels.{kernel}", fromlist=["bench_cases"]).bench_cases())
        for name in names:
            w, rec = cases[name], records[(kernel, name)]
            inputs = fam.make_inputs(w, "cuda")
            ref = fam.reference(inputs)
            fn = fam.prepare(inputs, Config(**rec["config"]))
            wrong = compare(fam, fn(), ref, w.dtype)
            if wrong is not None:
                raise SystemExit(f"{kernel} {name} {rec['config']} is wrong: {wrong}")
            lens = w.seq_lens if kernel == "prefill_attention" else w.chunk_lens  # no prefix: keys = queries
            q, k, v = (bench._heads_first(x, len(lens), lens[0]) for x in (inputs.q, inputs.k, inputs.v))
            causal = {"is_causal": True}
            specs = {"cudnn_causal": (SDPBackend.CUDNN_ATTENTION, causal),
                     "flash_causal": (SDPBackend.FLASH_ATTENTION, causal), "default_causal": (None, causal)}
            variants, refused = bench.checked_variants(bench.sdpa_variants(q, k, v, specs),
                                                       bench._reference_check(fam, inputs))
            names_v = list(variants)
            med = interleaved_medians([fn, *variants.values()], reps)
            row = {"kernel": kernel, "case": name, "config": rec["config"], "stored_ratio": rec["ratio_to_anchor"],
                   "variants_refused": refused}
            for m in MODES:
                kern_ms, *anchor_ms = med[m]
                best = min(range(len(anchor_ms)), key=anchor_ms.__getitem__)
                row[m] = {"kernel_ms": kern_ms, "anchor_ms": anchor_ms[best], "anchor_variant": names_v[best],
                          "variants_ms": dict(zip(names_v, anchor_ms)), "ratio": anchor_ms[best] / kern_ms}
            log(f"{name}: kernel/anchor write {row['write']['ratio']:.3f} ({row['write']['kernel_ms'] * 1e3:.1f} / "
                f"{row['write']['anchor_ms'] * 1e3:.1f} us), clean {row['clean']['ratio']:.3f} "
                f"({row['clean']['kernel_ms'] * 1e3:.1f} / {row['clean']['anchor_ms'] * 1e3:.1f} us)")
            rows.append(row)
            del inputs, ref, fn, variants, q, k, v
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    import torch
    import triton

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--floor", type=Path, required=True, help="decode_floor.json of a --grid run (its `times`)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=24, help="samples per closure and flush mode")
    p.add_argument("--sdpa-decode", action="store_true",
                   help="also time what torch offers for each decode step (bench.sdpa_decode_variants) beside it")
    p.add_argument("--no-attention", action="store_true", help="skip the prefill / prefix_prefill rows")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/flush_mode/run.py times on a GPU; run it on the H200")
    from kernel_gym.measure.power import read_once

    def log(msg: str) -> None:
        print(msg, flush=True)

    t0 = time.time()
    res = {"commit": os.environ.get("KERNEL_GYM_COMMIT"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__, "reps": args.reps, "floor_file": str(args.floor)}
    state = read_once()
    res["power_before"] = state.__dict__ if state is not None else None
    res["decode"] = decode_rows(args.floor, args.reps, log, sdpa=args.sdpa_decode)
    res["attention"] = [] if args.no_attention else attention_rows(args.reps, log)
    state = read_once()
    res["power_after"] = state.__dict__ if state is not None else None
    res["wall_s"] = time.time() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    met = {m: sum(r[m]["ratio_to_floor"] <= 1.25 for r in res["decode"] if r["batch"] <= 4) for m in MODES}
    log(f"decode batch 1-4 within 1.25x of the floor: write flush {met['write']}, clean flush {met['clean']} of "
        f"{sum(r['batch'] <= 4 for r in res['decode'])}")
    if args.sdpa_decode:
        for m in MODES:
            met_t = sum(r[m]["torch"]["ratio_to_floor"] <= 1.25 for r in res["decode"] if r["batch"] <= 4
                        and "torch" in r[m])
            log(f"torch's fastest decode variant within 1.25x of the floor ({m} flush): {met_t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
